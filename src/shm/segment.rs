//! Creating, opening, mapping and unlinking a POSIX shm segment.
//!
//! A created segment's pages are reserved on the file system at once (`fallocate`), so a full
//! /dev/shm is a [`CreateErrorKind::NoSpace`] at create rather than a SIGBUS at some later write.
//! Its creator holds a `flock` on the file for as long as it lives: exclusive while it builds
//! the segment, shared from [`Segment::mark_ready`]. That lock is how `stale.rs` tells a live
//! ring from a dead producer's.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Once;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FallocateFlags, FileType, FlockOperation, Mode};
use rustix::io::Errno;
use rustix::shm;

use super::guard::Guard;
use super::name::ShmName;
use crate::error::{CreateErrorKind, OpenErrorKind};
use crate::format::Header;

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
    /// Catches SIGBUS if the file is truncated under the mapping. Declared before `map`, and
    /// fields drop in declaration order, so the range is unregistered while it is still mapped.
    /// The other way round, between the unmap and the unregistration another thread could map
    /// something else at those addresses (another segment, any mmap), and a SIGBUS there would
    /// be taken for a truncation of ours: a zero page mapped over that memory, the fault hidden.
    guard: Guard,
    /// The mapping; `guard` covers it until it drops.
    map: MmapRaw,
    /// The shm file (`None` for [`Segment::from_bytes`]). A segment made by
    /// [`Segment::create`] holds a `flock` on it (see [`Segment::mark_ready`]), released when
    /// this fd closes: when the segment drops or the process dies.
    fd: Option<OwnedFd>,
    name: ShmName,
    /// (st_dev, st_ino) of the file, to unlink only our own file.
    id: (u64, u64),
    /// The file's owner.
    owner: u32,
}

fn nofollow() -> shm::OFlags {
    shm::OFlags::from_bits_retain(rustix::fs::OFlags::NOFOLLOW.bits())
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<MmapRaw> {
    MmapOptions::new().len(len).map_raw(fd)
}

fn io_error(e: impl Into<io::Error>) -> CreateErrorKind {
    CreateErrorKind::Io(e.into())
}

/// Calls `f` again while it fails with EINTR.
pub(super) fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// Whether `name` refers to the file `id` (st_dev, st_ino) now.
pub(super) fn names(name: &ShmName, id: (u64, u64)) -> bool {
    rustix::fs::stat(name.path()).is_ok_and(|st| (st.st_dev, st.st_ino) == id)
}

/// Bytes that may still be allocated on `fd`'s file system (`f_bavail * f_frsize`), or `None`
/// if it reports no limit (`f_blocks` 0: a tmpfs mounted with `size=0`, for one).
fn free_bytes(fd: &OwnedFd) -> io::Result<Option<u64>> {
    let st = rustix::fs::fstatvfs(fd)?;
    Ok((st.f_blocks != 0).then(|| st.f_bavail.saturating_mul(st.f_frsize)))
}

/// Reserves `size` bytes of file `fd` on its file system, so that a full /dev/shm fails here
/// (`NoSpace`) and not as a SIGBUS at the first write to a page it cannot back.
///
/// The size is first checked against the free space: on tmpfs a `fallocate` that cannot
/// succeed first allocates all it can, so asking a large /dev/shm for more than it has would
/// take all of its free memory, from the machine's RAM, before failing. Where the file system
/// cannot `fallocate`, the file stays sparse, as it always was before, and a warning is logged
/// once per process.
fn reserve(fd: &OwnedFd, size: u64) -> Result<(), CreateErrorKind> {
    if let Some(available) = free_bytes(fd).map_err(io_error)? {
        if size > available {
            return Err(CreateErrorKind::NoSpace { needed: size, available });
        }
    }
    // EINTR: a signal came while tmpfs was allocating; the pages done stay done.
    match retry(|| rustix::fs::fallocate(fd, FallocateFlags::empty(), 0, size)) {
        Ok(()) => Ok(()),
        Err(Errno::NOSPC) => {
            let available = free_bytes(fd).ok().flatten().unwrap_or(0);
            Err(CreateErrorKind::NoSpace { needed: size, available })
        }
        Err(Errno::OPNOTSUPP | Errno::NOSYS) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "the shm file system cannot fallocate: ring segments stay sparse, and a \
                     full /dev/shm shows up as SIGBUS on write instead of an error at create"
                )
            });
            Ok(())
        }
        Err(e) => Err(io_error(e)),
    }
}

impl Segment {
    /// Creates a new segment of `size` bytes with permission bits `mode` (exactly: the umask is
    /// not applied), every page reserved on the file system, and an exclusive `flock` on it,
    /// held until [`Segment::mark_ready`] makes it shared.
    ///
    /// Fails with
    /// - `AlreadyExists { pid: 0 }` if the name is taken (use `stale::create` to replace a dead
    ///   producer's segment), or if our file was replaced before we could lock it: between
    ///   `shm_open` and `flock` it is empty and unlocked, as a creator that died there leaves
    ///   it, and `stale::create` may take it for one;
    /// - `NoSpace` if the file system has less free space than `size`;
    /// - `PermissionDenied`, or `Io`.
    ///
    /// Once the file is locked, every failure unlinks it again. (If the `flock` itself fails,
    /// the empty, unlocked file stays, and the next create replaces it.)
    pub fn create(name: &ShmName, size: usize, mode: u32) -> Result<Segment, CreateErrorKind> {
        let flags = shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR | nofollow();
        let mode = Mode::from_bits_truncate(mode);
        let fd = shm::open(name.shm(), flags, mode).map_err(|e| match e {
            Errno::EXIST => CreateErrorKind::AlreadyExists { pid: 0 },
            Errno::ACCESS | Errno::PERM => CreateErrorKind::PermissionDenied,
            e => io_error(e),
        })?;
        // Blocks only while a replacer that took our empty file for a dead creator's holds it:
        // until it has made its own segment.
        retry(|| rustix::fs::flock(&fd, FlockOperation::LockExclusive)).map_err(io_error)?;
        let st = rustix::fs::fstat(&fd).map_err(io_error)?;
        let id = (st.st_dev, st.st_ino);
        if !names(name, id) {
            return Err(CreateErrorKind::AlreadyExists { pid: 0 });
        }
        // From here the name stays ours: a replacer unlinks only a file whose lock it holds.
        let made = (|| {
            rustix::fs::fchmod(&fd, mode).map_err(io_error)?;
            rustix::fs::ftruncate(&fd, size as u64).map_err(io_error)?;
            reserve(&fd, size as u64)?;
            map(&fd, size).map_err(CreateErrorKind::Io)
        })();
        match made {
            Ok(map) => {
                // SAFETY: `map` is a shared mapping of the file, and the guard is declared
                // before it in `Segment`, so it unregisters before the unmap.
                let guard = unsafe { Guard::register(map.as_mut_ptr(), map.len()) };
                let owner = st.st_uid;
                Ok(Segment { guard, map, fd: Some(fd), name: name.clone(), id, owner })
            }
            Err(e) => {
                let _ = shm::unlink(name.shm());
                Err(e)
            }
        }
    }

    /// Marks a segment made by [`Segment::create`] as built: its exclusive `flock` becomes a
    /// shared one, held until the segment drops or the process dies. Call it once the header
    /// is published (`magic` stored). Either lock keeps `stale::create` from replacing the
    /// segment; the shared one also tells a built segment from one being built (a
    /// `LOCK_SH | LOCK_NB` succeeds on it).
    ///
    /// Linux converts a `flock` by dropping the old lock and then taking the new one, so the
    /// file is unlocked for a moment. A replacer that takes its exclusive lock then finds the
    /// header naming a live producer and leaves the segment alone (which is why
    /// `stale::create` checks the pid as well as the lock); meanwhile this call waits for the
    /// shared lock. If the lock cannot be had, a warning is logged: the pid check alone still
    /// protects the ring.
    pub fn mark_ready(&self) {
        let Some(fd) = &self.fd else { return };
        if let Err(e) = retry(|| rustix::fs::flock(fd, FlockOperation::LockShared)) {
            tracing::warn!(ring = %self.name.ring(), error = %e, "cannot lock the segment");
        }
    }

    /// Opens file `name` with `flags` (and never through a symlink), after checking that it is a
    /// regular file owned by this user (unless `opts` allows otherwise). Returns it and its status.
    pub(super) fn open_file(
        name: &ShmName,
        flags: shm::OFlags,
        opts: OpenOptions,
    ) -> Result<(OwnedFd, rustix::fs::Stat), OpenErrorKind> {
        let fd = shm::open(name.shm(), flags | nofollow(), Mode::empty()).map_err(|e| match e {
            Errno::NOENT => OpenErrorKind::NotFound,
            Errno::ACCESS | Errno::PERM => OpenErrorKind::PermissionDenied,
            Errno::LOOP => OpenErrorKind::NotASegment,
            e => OpenErrorKind::Io(e.into()),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| OpenErrorKind::Io(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(OpenErrorKind::NotASegment);
        }
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me && !opts.allow_foreign_owner {
            return Err(OpenErrorKind::ForeignOwner { uid: st.st_uid });
        }
        Ok((fd, st))
    }

    /// Opens and maps an existing segment, after checking that it is a regular file owned by
    /// this user (unless allowed otherwise) and large enough for a header. The header itself is
    /// not checked here.
    pub fn open(name: &ShmName, opts: OpenOptions) -> Result<Segment, OpenErrorKind> {
        let (fd, st) = Segment::open_file(name, shm::OFlags::RDWR, opts)?;
        let size = st.st_size.max(0) as u64;
        let needed = std::mem::size_of::<Header>() as u64;
        // Empty: a producer between its `shm_open` and `ftruncate` (or one that died there).
        if size == 0 {
            return Err(OpenErrorKind::NotInitialized);
        }
        if size < needed {
            return Err(OpenErrorKind::Truncated { needed, actual: size });
        }
        let len =
            usize::try_from(size).map_err(|_| OpenErrorKind::Truncated { needed, actual: 0 })?;
        let map = map(&fd, len).map_err(OpenErrorKind::Io)?;
        // SAFETY: `map` is a shared mapping of the file, and the guard is declared before it
        // in `Segment`, so it unregisters before the unmap.
        let guard = unsafe { Guard::register(map.as_mut_ptr(), map.len()) };
        let id = (st.st_dev, st.st_ino);
        Ok(Segment { guard, map, fd: Some(fd), name: name.clone(), id, owner: st.st_uid })
    }

    /// The uid that owns the segment's file.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// A second shared mapping of the whole file, at another address: for a registration with
    /// the CUDA driver that must be able to outlive this mapping (it is leaked with it). Fails
    /// for a segment of [`from_bytes`](Self::from_bytes), which has no file.
    pub fn map_again(&self) -> io::Result<MmapRaw> {
        let fd = self.fd.as_ref().ok_or_else(|| io::Error::other("a segment without a file"))?;
        map(fd, self.map.len())
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
        let owner = rustix::process::geteuid().as_raw();
        Ok(Segment { guard: Guard::none(), map, fd: None, name, id: (u64::MAX, u64::MAX), owner })
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

    /// Unlinks the name if it still refers to this segment's file (not to a newer ring that
    /// reused the name). The mapping stays valid.
    pub fn unlink(&self) {
        if names(&self.name, self.id) {
            let _ = shm::unlink(self.name.shm());
        }
    }

    /// The shm file.
    #[cfg(test)]
    pub(super) fn fd_for_tests(&self) -> &OwnedFd {
        self.fd.as_ref().expect("a file-backed segment")
    }

    /// Unlinks the name whatever file it refers to.
    pub fn unlink_name(name: &ShmName) -> io::Result<()> {
        shm::unlink(name.shm()).map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::super::guard;
    use super::*;

    fn name(tag: &str) -> ShmName {
        ShmName::new(&format!("unit-{tag}-{}", std::process::id())).unwrap()
    }

    #[test]
    fn guard_unregisters_before_the_unmap() {
        let seg = Segment::create(&name("guard"), 3 * 4096, 0o600).unwrap();
        seg.unlink();
        let base = seg.base() as usize;
        assert!(guard::registered(base) && guard::registered(base + 3 * 4096 - 1));
        drop(seg);
        // Whether the range was still mapped just after it was unregistered: fields drop in
        // declaration order, so this is what tells `guard` before `map` from the reverse.
        let last = guard::test_hooks::last_unregistered();
        let expected =
            guard::test_hooks::Unregistered { start: base, mapped: true, registered: false };
        assert_eq!(last, Some(expected), "unregistered after the unmap, or not at all");
    }

    #[test]
    fn create_locks_and_mark_ready_shares() {
        let n = name("lock");
        let seg = Segment::create(&n, 4096, 0o600).unwrap();
        let other = shm::open(n.shm(), shm::OFlags::RDONLY, Mode::empty()).unwrap();
        let shared = FlockOperation::NonBlockingLockShared;
        assert_eq!(
            rustix::fs::flock(&other, shared),
            Err(Errno::WOULDBLOCK),
            "not locked while built"
        );
        seg.mark_ready();
        rustix::fs::flock(&other, shared).expect("shared lock once ready");
        let exclusive = FlockOperation::NonBlockingLockExclusive;
        rustix::fs::flock(&other, FlockOperation::Unlock).unwrap();
        assert_eq!(rustix::fs::flock(&other, exclusive), Err(Errno::WOULDBLOCK));
        seg.unlink();
        drop(seg);
        // A child that another test forks shares every open file description until it execs,
        // and with it our lock: give such a child a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match rustix::fs::flock(&other, exclusive) {
                Ok(()) => break,
                Err(Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("not released with the segment: {e}"),
            }
        }
    }

    #[test]
    fn create_reserves_and_checks_free_space() {
        let n = name("reserve");
        let seg = Segment::create(&n, 64 * 4096, 0o600).unwrap();
        let st = rustix::fs::stat(n.path()).unwrap();
        assert!(st.st_blocks as u64 * 512 >= 64 * 4096, "{} blocks", st.st_blocks);
        seg.unlink();
        let fd = seg.fd.as_ref().unwrap();
        if let Some(free) = free_bytes(fd).unwrap() {
            let n = name("too-big");
            let size = usize::try_from(free + (1 << 20)).unwrap();
            match Segment::create(&n, size, 0o600) {
                Err(CreateErrorKind::NoSpace { needed, available }) => {
                    assert_eq!(needed, size as u64);
                    assert!(available < needed);
                }
                Ok(seg) => {
                    seg.unlink();
                    panic!("created a segment of {size} bytes with {free} bytes free");
                }
                Err(e) => panic!("expected NoSpace, got {e:?}"),
            }
            assert!(rustix::fs::stat(n.path()).is_err(), "left behind");
        }
    }
}
