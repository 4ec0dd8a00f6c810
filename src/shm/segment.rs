//! Creating, opening, mapping and unlinking a POSIX shm segment.

use std::io;
use std::os::fd::OwnedFd;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use rustix::shm;

use super::guard::Guard;
use super::header::Header;
use super::name::ShmName;
use crate::error::{CreateError, OpenError};

/// How to open an existing segment.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Accept a segment owned by another uid. Off by default: another user's producer could
    /// feed us anything, and could have laid a trap in the name.
    pub allow_foreign_owner: bool,
}

/// A mapped segment.
///
/// Invariant: `map` covers the whole file as it was when mapped (`len` bytes, at least one
/// [`Header`]), at a page-aligned address.
pub struct Segment {
    map: MmapRaw,
    /// The shm file (`None` for [`Segment::from_bytes`]).
    fd: Option<OwnedFd>,
    name: ShmName,
    /// (st_dev, st_ino) of the file, to unlink only our own file.
    id: (u64, u64),
    /// Catches SIGBUS if the file is truncated under the mapping. Declared after `map`, so it
    /// unregisters after the unmap... which is harmless: nothing touches the range by then.
    guard: Guard,
}

fn nofollow() -> shm::OFlags {
    shm::OFlags::from_bits_retain(rustix::fs::OFlags::NOFOLLOW.bits())
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<MmapRaw> {
    MmapOptions::new().len(len).map_raw(fd)
}

impl Segment {
    /// Creates a new segment of `size` bytes with permission bits `mode` (exactly: the umask is
    /// not applied). Fails with `AlreadyExists { pid: 0 }` if the name is taken; the caller
    /// decides whether the old one is stale.
    pub fn create(name: &ShmName, size: usize, mode: u32) -> Result<Segment, CreateError> {
        let flags = shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR | nofollow();
        let mode = Mode::from_bits_truncate(mode);
        let fd = shm::open(name.shm(), flags, mode).map_err(|e| match e {
            Errno::EXIST => CreateError::AlreadyExists { pid: 0 },
            Errno::ACCESS | Errno::PERM => CreateError::PermissionDenied,
            e => CreateError::Io(e.into()),
        })?;
        let made = (|| {
            rustix::fs::fchmod(&fd, mode)?;
            rustix::fs::ftruncate(&fd, size as u64)?;
            let st = rustix::fs::fstat(&fd)?;
            let map = map(&fd, size)?;
            Ok::<_, io::Error>((map, (st.st_dev, st.st_ino)))
        })();
        match made {
            Ok((map, id)) => {
                let guard = Guard::register(map.as_mut_ptr(), map.len());
                Ok(Segment { map, fd: Some(fd), name: name.clone(), id, guard })
            }
            Err(e) => {
                let _ = shm::unlink(name.shm());
                Err(CreateError::Io(e))
            }
        }
    }

    /// Opens and maps an existing segment, after checking that it is a regular file owned by
    /// this user (unless allowed otherwise) and large enough for a header. The header itself is
    /// not checked here.
    pub fn open(name: &ShmName, opts: OpenOptions) -> Result<Segment, OpenError> {
        let flags = shm::OFlags::RDWR | nofollow();
        let fd = shm::open(name.shm(), flags, Mode::empty()).map_err(|e| match e {
            Errno::NOENT => OpenError::NotFound,
            Errno::ACCESS | Errno::PERM => OpenError::PermissionDenied,
            Errno::LOOP => OpenError::NotASegment,
            e => OpenError::Io(e.into()),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| OpenError::Io(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(OpenError::NotASegment);
        }
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me && !opts.allow_foreign_owner {
            return Err(OpenError::ForeignOwner { uid: st.st_uid });
        }
        let size = st.st_size.max(0) as u64;
        let needed = std::mem::size_of::<Header>() as u64;
        if size < needed {
            return Err(OpenError::Truncated { needed, actual: size });
        }
        let len = usize::try_from(size).map_err(|_| OpenError::Truncated { needed, actual: 0 })?;
        let map = map(&fd, len).map_err(OpenError::Io)?;
        let guard = Guard::register(map.as_mut_ptr(), map.len());
        let id = (st.st_dev, st.st_ino);
        Ok(Segment { map, fd: Some(fd), name: name.clone(), id, guard })
    }

    /// A segment holding a copy of `bytes` in anonymous memory that no other process can
    /// open: for fuzzing the readers of a segment without touching /dev/shm. Fails if `bytes` is
    /// shorter than a header.
    #[doc(hidden)]
    pub fn from_bytes(bytes: &[u8]) -> io::Result<Segment> {
        if bytes.len() < std::mem::size_of::<Header>() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let mut anon = memmap2::MmapMut::map_anon(bytes.len())?;
        anon.copy_from_slice(bytes);
        let map = MmapRaw::from(anon);
        let name = ShmName::new("fuzz").expect("valid name");
        Ok(Segment { map, fd: None, name, id: (u64::MAX, u64::MAX), guard: Guard::none() })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least one Header long (checked or sized at
        // creation), and Header is all atomics, valid for any bytes.
        unsafe { &*(self.map.as_mut_ptr() as *const Header) }
    }

    /// Start of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never: a segment holds at least a header).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The segment's name.
    pub fn name(&self) -> &ShmName {
        &self.name
    }

    /// Whether the file was truncated under the mapping: an access past its end was caught (see
    /// `guard.rs`), or the file is now shorter than the mapping.
    pub fn truncated(&self) -> bool {
        self.guard.faulted() || self.file_size().is_ok_and(|n| n < self.len() as u64)
    }

    /// Whether an access past the end of the file was caught (no system call).
    pub fn faulted(&self) -> bool {
        self.guard.faulted()
    }

    /// The file's current size (it may have been truncated by someone since it was mapped).
    pub fn file_size(&self) -> io::Result<u64> {
        let fd = self.fd.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        Ok(rustix::fs::fstat(fd)?.st_size.max(0) as u64)
    }

    /// Age of the file's last status change, in seconds (for telling a half-built segment from
    /// one abandoned by a creator that crashed).
    pub fn age_secs(&self) -> io::Result<i64> {
        let fd = self.fd.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        let st = rustix::fs::fstat(fd)?;
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
        Ok(now.tv_sec - st.st_ctime)
    }

    /// Unlinks the name if it still refers to this segment's file (not to a newer ring that
    /// reused the name). The mapping stays valid.
    pub fn unlink(&self) {
        if let Ok(st) = rustix::fs::stat(self.name.path()) {
            if (st.st_dev, st.st_ino) == self.id {
                let _ = shm::unlink(self.name.shm());
            }
        }
    }

    /// Unlinks the name whatever file it refers to.
    pub fn unlink_name(name: &ShmName) -> io::Result<()> {
        shm::unlink(name.shm()).map_err(Into::into)
    }
}
