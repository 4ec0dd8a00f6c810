//! The directory that holds rings: their segments and every socket of theirs.
//!
//! The default is `/dev/shm`, or what the environment variable [`DIR_ENV`] names. Any tmpfs
//! directory works, and one shared between containers (a Docker volume, a Kubernetes
//! `emptyDir` with `medium: Memory`) is how peers without a shared IPC or mount namespace
//! find each other's rings. Files are always opened relative to a descriptor of the directory
//! (`openat`), never by a path built from strings, so a directory renamed or replaced after it
//! was opened cannot redirect a ring's file.
//!
//! [`RingDir::check`] says what a user should know about a directory: a file system that is not
//! tmpfs (rings there may be written back to disk), a directory that another user may write and
//! that has no sticky bit (that user could replace a ring's file or socket).

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use crate::error::{CreateError, CreateErrorKind, OpenError, OpenErrorKind};

/// The environment variable that sets the default ring directory for every ring of the
/// process (the library, the `gpuring` command, the Python and C bindings, the GStreamer
/// elements and the bridge): `GPURING_DIR=/rings`.
pub const DIR_ENV: &str = "GPURING_DIR";

/// The ring directory when neither a builder nor [`DIR_ENV`] names one.
pub const DEFAULT_DIR: &str = "/dev/shm";

/// `TMPFS_MAGIC` from `linux/magic.h`: the `f_type` of a tmpfs (and of /dev/shm).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The directory a builder uses when it names none: [`DIR_ENV`] if set and not empty, else
/// [`DEFAULT_DIR`].
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

// The errors' constructors for the default directory: here, beside it, so that the error
// module needs nothing of the OS layer.
impl CreateError {
    /// Ring `ring` could not be created, for reason `kind` (for wrappers that report their own
    /// failures the library's way).
    ///
    /// ```
    /// use gpuring::{CreateError, CreateErrorKind};
    /// let e = CreateError::new("cam0", CreateErrorKind::PermissionDenied);
    /// assert_eq!(e.to_string(), "ring \"cam0\": permission denied creating the segment");
    /// ```
    pub fn new(ring: &str, kind: CreateErrorKind) -> CreateError {
        CreateError::in_dir(ring, &default_dir(), kind)
    }
}

impl OpenError {
    /// Ring `ring` could not be opened, for reason `kind` (for wrappers that report their own
    /// failures the library's way).
    ///
    /// ```
    /// use gpuring::{OpenError, OpenErrorKind};
    /// let e = OpenError::new("cam0", OpenErrorKind::TimedOut);
    /// assert_eq!(e.to_string(), "ring \"cam0\": the ring was not ready within the timeout");
    /// ```
    pub fn new(ring: &str, kind: OpenErrorKind) -> OpenError {
        OpenError::in_dir(ring, &default_dir(), kind)
    }
}

/// An open ring directory: its path (for messages and tools) and a descriptor every file of
/// the ring is opened relative to. Cheap to clone.
///
/// Invariant: `fd` is an `O_PATH | O_DIRECTORY` descriptor of the directory `path` named when
/// it was opened.
#[derive(Clone)]
pub struct RingDir {
    path: Arc<Path>,
    fd: Arc<OwnedFd>,
}

/// What [`RingDir::check`] found worth saying about a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirConcern {
    /// Not a tmpfs: ring pages may be written back to a disk, and sizes are not memory.
    NotTmpfs,
    /// Writable by other users without the sticky bit: any of them may remove or replace a
    /// ring's file or socket. `mode` is the directory's permission bits.
    OthersMayReplace {
        /// The directory's mode bits.
        mode: u32,
    },
}

impl fmt::Display for DirConcern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirConcern::NotTmpfs => f.write_str(
                "it is not a tmpfs: ring pages may be written back to disk (mount a tmpfs there, \
                 or a Kubernetes emptyDir with medium: Memory)",
            ),
            DirConcern::OthersMayReplace { mode } => write!(
                f,
                "other users may write it (mode {mode:o}) and it has no sticky bit: any of them \
                 could replace a ring's file or socket (chmod 0700 or 1777, or give it to one \
                 user)"
            ),
        }
    }
}

impl RingDir {
    /// Opens directory `path`, resolved once to its canonical path (symlinks and `..`
    /// followed, relative to the current directory now): files are then opened relative to the
    /// descriptor, and sockets, which are addressed by path, by the canonical path, so a later
    /// `chdir` or a symlink changed meanwhile cannot split a ring's files between directories.
    pub fn open(path: impl AsRef<Path>) -> io::Result<RingDir> {
        let path = std::fs::canonicalize(path.as_ref())?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&path, flags, Mode::empty())?;
        Ok(RingDir { path: Arc::from(path.as_path()), fd: Arc::new(fd) })
    }

    /// The default directory ([`default_dir`]).
    pub fn open_default() -> io::Result<RingDir> {
        RingDir::open(default_dir())
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor, for `openat` and its kin.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `(st_dev, st_ino)` of the directory.
    pub fn id(&self) -> io::Result<(u64, u64)> {
        let st = rustix::fs::fstat(&*self.fd)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// The path of `file` in it, for messages.
    pub fn display(&self, file: &str) -> PathBuf {
        self.path.join(file)
    }

    /// A path to `file` in this directory that fits a unix socket address (`sun_path`, 108
    /// bytes with its NUL): the plain path where it fits, else the same file through this
    /// process's descriptor of the directory (`/proc/self/fd/N/FILE`), which the kernel
    /// resolves like any other path.
    pub fn socket_path(&self, file: &str) -> PathBuf {
        const SUN_PATH: usize = 108;
        let plain = self.path.join(file);
        if plain.as_os_str().len() < SUN_PATH {
            return plain;
        }
        PathBuf::from(format!("/proc/self/fd/{}/{file}", self.fd.as_raw_fd()))
    }

    /// What a user should know about this directory (see [`DirConcern`]): nothing for
    /// `/dev/shm` as systems set it up (a tmpfs, mode 1777).
    pub fn check(&self) -> io::Result<Vec<DirConcern>> {
        let mut out = Vec::new();
        let vfs = rustix::fs::fstatfs(&*self.fd)?;
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        if vfs.f_type as i64 != TMPFS_MAGIC {
            out.push(DirConcern::NotTmpfs);
        }
        let st = rustix::fs::fstat(&*self.fd)?;
        let mode = st.st_mode & 0o7777;
        let me = rustix::process::geteuid().as_raw();
        // Another user may write it: through the group or world bits, or as its owner.
        let others_write =
            mode & 0o022 != 0 || (st.st_uid != me && st.st_uid != 0 && mode & 0o200 != 0);
        // The sticky bit keeps other users from removing or renaming files they do not own.
        if others_write && mode & 0o1000 == 0 {
            out.push(DirConcern::OthersMayReplace { mode });
        }
        Ok(out)
    }
}

impl PartialEq for RingDir {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for RingDir {}

impl std::hash::Hash for RingDir {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.path.hash(state)
    }
}

impl fmt::Debug for RingDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RingDir").field(&self.path).finish()
    }
}

/// Whether `name` (a file name in a ring directory) is a plain name: no `/`, not empty.
pub(crate) fn plain(name: &str) -> bool {
    !name.is_empty() && !OsStr::new(name).as_bytes().contains(&b'/')
}
