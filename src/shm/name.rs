//! Ring names and the file names they map to in a ring directory.

use crate::error::NameError;

/// Every ring's file is `DIR/gpuring.NAME` (`DIR` is its ring directory, `/dev/shm` by
/// default), so rings are easy to find and never collide with other programs' files.
pub const SHM_PREFIX: &str = "gpuring.";

/// Longest ring name, in bytes. Leaves room under the 255-byte `NAME_MAX` for the prefix and a
/// suffix that later layers add for side files.
pub const MAX_NAME_LEN: usize = 200;

/// A validated ring name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShmName {
    ring: String,
    /// `gpuring.NAME`.
    file: String,
}

impl ShmName {
    /// Checks `name`: not empty, at most [`MAX_NAME_LEN`] bytes, no `/`, no NUL, not `.`/`..`.
    pub fn new(name: &str) -> Result<ShmName, NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong { len: name.len() });
        }
        if name.contains('/') {
            return Err(NameError::Slash);
        }
        if name.contains('\0') {
            return Err(NameError::Nul);
        }
        if name == "." || name == ".." {
            return Err(NameError::Dots);
        }
        Ok(ShmName { ring: name.to_owned(), file: format!("{SHM_PREFIX}{name}") })
    }

    /// The ring name as the user gave it.
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// The file's name in its ring directory: `gpuring.NAME`.
    pub fn file(&self) -> &str {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(ShmName::new(""), Err(NameError::Empty));
        assert_eq!(ShmName::new("a/b"), Err(NameError::Slash));
        assert_eq!(ShmName::new("a\0b"), Err(NameError::Nul));
        assert_eq!(ShmName::new(".."), Err(NameError::Dots));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(ShmName::new(&long), Err(NameError::TooLong { len: MAX_NAME_LEN + 1 }));
        let n = ShmName::new("cam0.rgba").unwrap();
        assert_eq!(n.file(), "gpuring.cam0.rgba");
        assert!(ShmName::new(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }
}
