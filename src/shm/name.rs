//! Ring names and the POSIX shm names they map to.

use crate::error::NameError;

/// Every ring's shm object is `/dev/shm/gpuring.NAME`, so rings are easy to find and never
/// collide with other programs' segments.
pub const SHM_PREFIX: &str = "gpuring.";

/// Longest ring name, in bytes. Leaves room under the 255-byte `NAME_MAX` for the prefix and a
/// suffix that later layers add for side files.
pub const MAX_NAME_LEN: usize = 200;

/// A validated ring name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShmName {
    ring: String,
    shm: String,
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
        Ok(ShmName { ring: name.to_owned(), shm: format!("/{SHM_PREFIX}{name}") })
    }

    /// The ring name as the user gave it.
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// The name passed to `shm_open`: `/gpuring.NAME`.
    pub fn shm(&self) -> &str {
        &self.shm
    }

    /// The file under /dev/shm.
    pub fn path(&self) -> String {
        format!("/dev/shm{}", self.shm)
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
        assert_eq!(n.shm(), "/gpuring.cam0.rgba");
        assert_eq!(n.path(), "/dev/shm/gpuring.cam0.rgba");
        assert!(ShmName::new(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }
}
