//! Creating, opening, mapping and unlinking a segment: a file in a ring directory, always
//! opened relative to the directory's descriptor, never through a symlink.
//!
//! A created segment's pages are reserved on the file system at once (`fallocate`), so a full
//! directory is a [`CreateErrorKind::NoSpace`] at create rather than a SIGBUS at some later
//! write. Its creator holds the producer's liveness lock ([`presence::PRODUCER`]) on the file
//! from the moment the file exists until the segment drops or the process dies. That lock is
//! how consumers, tools and `stale.rs` tell a live ring from a dead producer's, in any pid
//! namespace.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Once;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{AtFlags, FallocateFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::dir::RingDir;
use super::guard::Guard;
use super::name::ShmName;
use super::presence::{self, Holder};
use crate::error::{CreateErrorKind, OpenErrorKind};
use crate::format::Header;

/// How long a creator waits for its new file's producer lock, which only a replacer that took
/// the empty file for a dead creator's can hold (for a moment).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

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
    /// The description of the file that holds this participant's liveness locks (see
    /// `presence`): the producer's from its create, a consumer's from its first
    /// [`Segment::try_hold`]. The kernel releases them when it drops or the process dies.
    holder: std::sync::OnceLock<Holder>,
    /// The file (`None` for [`Segment::from_bytes`]): the description it is mapped from, which
    /// holds no lock, and which lock probes ([`Segment::held`]) ask from.
    fd: Option<OwnedFd>,
    /// The directory the file is in.
    dir: RingDir,
    name: ShmName,
    /// (st_dev, st_ino) of the file, to unlink only our own file.
    id: (u64, u64),
    /// The file's owner.
    owner: u32,
    /// The file's permission bits (`st_mode & 0o777`) when it was created or opened.
    mode: u32,
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

/// Whether `name` in `dir` refers to the file `id` (st_dev, st_ino) now.
pub(super) fn names(dir: &RingDir, name: &ShmName, id: (u64, u64)) -> bool {
    rustix::fs::statat(dir.fd(), name.file(), AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| (st.st_dev, st.st_ino) == id)
}

/// The checks every open of a ring's file makes of what it opened: a regular file, owned by
/// this user unless `opts` allows otherwise.
pub(super) fn check_file(st: &rustix::fs::Stat, opts: OpenOptions) -> Result<(), OpenErrorKind> {
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(OpenErrorKind::NotASegment);
    }
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me && !opts.allow_foreign_owner {
        return Err(OpenErrorKind::ForeignOwner { uid: st.st_uid });
    }
    Ok(())
}

/// Unlinks `name` in `dir`, whatever file it refers to.
pub(super) fn unlink_at(dir: &RingDir, name: &ShmName) -> rustix::io::Result<()> {
    rustix::fs::unlinkat(dir.fd(), name.file(), AtFlags::empty())
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
    /// Creates a new segment `name` in `dir` of `size` bytes with permission bits `mode`
    /// (exactly: the umask is not applied), every page reserved on the file system, holding
    /// the producer's liveness lock ([`presence::PRODUCER`]) from before anyone can judge it.
    ///
    /// Fails with
    /// - `AlreadyExists { pid: 0 }` if the name is taken (use `stale::create` to replace a dead
    ///   producer's segment), or if our file was replaced before we could lock it: between
    ///   `openat` and the lock it is empty and unlocked, as a creator that died there leaves
    ///   it, and `stale::create` may take it for one;
    /// - `NoSpace` if the file system has less free space than `size`;
    /// - `PermissionDenied`, or `Io`.
    ///
    /// Once the file is locked, every failure unlinks it again. (If the lock itself fails, the
    /// empty, unlocked file stays, and the next create replaces it.)
    pub fn create(
        dir: &RingDir,
        name: &ShmName,
        size: usize,
        mode: u32,
    ) -> Result<Segment, CreateErrorKind> {
        let flags =
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mode = Mode::from_bits_truncate(mode);
        // The ring's mode, and owner read-write at least until the lock is taken (a second
        // description opens it read-write); the exact mode is set below.
        let first = mode | Mode::RUSR | Mode::WUSR;
        let fd = rustix::fs::openat(dir.fd(), name.file(), flags, first).map_err(|e| match e {
            Errno::EXIST => CreateErrorKind::AlreadyExists { pid: 0 },
            Errno::ACCESS | Errno::PERM => CreateErrorKind::PermissionDenied,
            e => io_error(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io_error)?;
        let id = (st.st_dev, st.st_ino);
        // The lock goes on a description of its own (see `presence`). None: our file was
        // replaced already.
        let holder = Holder::open(dir, name.file(), id)
            .map_err(CreateErrorKind::Io)?
            .ok_or(CreateErrorKind::AlreadyExists { pid: 0 })?;
        // Taken at once unless a replacer took our empty file for a dead creator's: it then
        // unlinks it and lets go within moments, and our name check below fails. A replacer
        // stopped (SIGSTOP, a paused container) is not waited for past a deadline.
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        while !holder.try_hold(presence::PRODUCER).map_err(CreateErrorKind::Io)? {
            if std::time::Instant::now() >= deadline {
                return Err(CreateErrorKind::AlreadyExists { pid: 0 });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // A shared `flock` as well, which an older gpuring's replacer takes for a live
        // producer (ours judge by the lock above only). On the holder's description, so that
        // it goes with the producer, not with a child it forked. An older replacer holds its
        // exclusive one for a moment at most; the name check below then sees what it did.
        let shared = rustix::fs::FlockOperation::NonBlockingLockShared;
        while rustix::fs::flock(holder.fd(), shared).is_err()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if !names(dir, name, id) {
            return Err(CreateErrorKind::AlreadyExists { pid: 0 });
        }
        let holder = std::sync::OnceLock::from(holder);
        // From here the name stays ours: a replacer unlinks only a file whose producer's lock
        // it holds.
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
                Ok(Segment {
                    guard,
                    map,
                    holder,
                    fd: Some(fd),
                    dir: dir.clone(),
                    name: name.clone(),
                    id,
                    owner,
                    mode: mode.bits() & 0o777,
                })
            }
            Err(e) => {
                if names(dir, name, id) {
                    let _ = unlink_at(dir, name);
                }
                Err(e)
            }
        }
    }

    /// Opens file `name` in `dir` with `flags` (and never through a symlink), after checking
    /// that it is a regular file owned by this user (unless `opts` allows otherwise). Returns it
    /// and its status.
    pub(super) fn open_file(
        dir: &RingDir,
        name: &ShmName,
        flags: OFlags,
        opts: OpenOptions,
    ) -> Result<(OwnedFd, rustix::fs::Stat), OpenErrorKind> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = rustix::fs::openat(dir.fd(), name.file(), flags, Mode::empty());
        let fd = opened.map_err(|e| match e {
            Errno::NOENT => OpenErrorKind::NotFound,
            // A file being created is its creator's alone for a moment: empty, it is not ready
            // rather than forbidden.
            Errno::ACCESS | Errno::PERM
                if rustix::fs::statat(dir.fd(), name.file(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_size == 0) =>
            {
                OpenErrorKind::NotInitialized
            }
            Errno::ACCESS | Errno::PERM => OpenErrorKind::PermissionDenied,
            Errno::LOOP => OpenErrorKind::NotASegment,
            e => OpenErrorKind::Io(e.into()),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| OpenErrorKind::Io(e.into()))?;
        check_file(&st, opts)?;
        Ok((fd, st))
    }

    /// Opens and maps an existing segment, after checking that it is a regular file owned by
    /// this user (unless allowed otherwise) and large enough for a header. The header itself is
    /// not checked here.
    pub fn open(
        dir: &RingDir,
        name: &ShmName,
        opts: OpenOptions,
    ) -> Result<Segment, OpenErrorKind> {
        let (fd, st) = Segment::open_file(dir, name, OFlags::RDWR, opts)?;
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
        Ok(Segment {
            guard,
            map,
            holder: std::sync::OnceLock::new(),
            fd: Some(fd),
            dir: dir.clone(),
            name: name.clone(),
            id,
            owner: st.st_uid,
            mode: st.st_mode & 0o777,
        })
    }

    /// Takes the liveness lock on `byte` of the file, without waiting (see `presence`), on
    /// this segment's lock description (opened on first use). `Ok(false)`: someone else holds
    /// it. Fails for a segment without a file, or whose name now names another file.
    pub fn try_hold(&self, byte: u64) -> io::Result<bool> {
        self.open_holder()?;
        self.holder.get().expect("opened above").try_hold(byte)
    }

    /// Opens the description that holds this segment's liveness locks, if not yet open: a
    /// consumer does so before it claims an entry, so that no claim can go without its lock.
    /// Fails with `NotFound` if the ring's name no longer refers to this segment's file.
    pub fn open_holder(&self) -> io::Result<()> {
        if self.fd.is_none() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        if self.holder.get().is_none() {
            let opened = Holder::open(&self.dir, self.name.file(), self.id)?;
            let opened = opened.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "the ring's file was removed or replaced")
            })?;
            // Another thread may have set one meanwhile: then ours is dropped unused.
            let _ = self.holder.set(opened);
        }
        Ok(())
    }

    /// Keeps this segment's liveness locks until the process exits (see
    /// `presence::Holder::keep_until_exit`): for a participant that leaves its entry for its
    /// death to release, while its GPU work may still run.
    pub fn keep_presence_until_exit(&mut self) {
        if let Some(h) = self.holder.take() {
            h.keep_until_exit();
        }
    }

    /// Releases this segment's lock on `byte` (nothing if it holds none).
    pub fn release(&self, byte: u64) {
        if let Some(h) = self.holder.get() {
            h.release(byte);
        }
    }

    /// Whether another description of the file holds a lock on `byte`: that participant is
    /// alive (see `presence::held`). A segment without a file has no peers: false.
    pub fn held(&self, byte: u64) -> bool {
        self.fd.as_ref().is_some_and(|fd| presence::held(fd.as_fd(), byte))
    }

    /// The file's permission bits, as when it was created or opened: the ring's mode, which its
    /// sockets take too.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// The directory the segment's file is in.
    pub fn dir(&self) -> &RingDir {
        &self.dir
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
        let dir = RingDir::open("/")?;
        Ok(Segment {
            guard: Guard::none(),
            map,
            holder: std::sync::OnceLock::new(),
            fd: None,
            dir,
            name,
            id: (u64::MAX, u64::MAX),
            owner,
            mode: 0o600,
        })
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
        if names(&self.dir, &self.name, self.id) {
            let _ = unlink_at(&self.dir, &self.name);
        }
    }

    /// The shm file.
    #[cfg(test)]
    pub(super) fn fd_for_tests(&self) -> &OwnedFd {
        self.fd.as_ref().expect("a file-backed segment")
    }

    /// Unlinks `name` in `dir` whatever file it refers to.
    pub fn unlink_name(dir: &RingDir, name: &ShmName) -> io::Result<()> {
        unlink_at(dir, name).map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::super::guard;
    use super::*;

    fn name(tag: &str) -> ShmName {
        ShmName::new(&format!("unit-{tag}-{}", std::process::id())).unwrap()
    }

    fn dir() -> RingDir {
        RingDir::open("/dev/shm").unwrap()
    }

    #[test]
    fn guard_unregisters_before_the_unmap() {
        let seg = Segment::create(&dir(), &name("guard"), 3 * 4096, 0o600).unwrap();
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
    fn a_mapping_kept_past_the_segment_does_not_keep_its_lock() {
        let (d, n) = (dir(), name("mapped"));
        let seg = Segment::create(&d, &n, 4096, 0o600).unwrap();
        let kept = seg.map_again().unwrap();
        let other = Segment::open(&d, &n, OpenOptions::default()).unwrap();
        seg.unlink();
        drop(seg);
        assert!(!other.held(presence::PRODUCER), "a mapping kept the producer's lock");
        drop(kept);
    }

    #[test]
    fn create_holds_the_producer_lock_until_dropped() {
        let (d, n) = (dir(), name("lock"));
        let seg = Segment::create(&d, &n, 4096, 0o600).unwrap();
        let other = Segment::open(&d, &n, OpenOptions::default()).unwrap();
        assert!(other.held(presence::PRODUCER), "held from create");
        assert!(!other.try_hold(presence::PRODUCER).unwrap(), "and not to be taken");
        assert!(seg.held(presence::PRODUCER), "the mapped description is not the lock's");
        // An unrelated flock, as any process may take, changes nothing.
        rustix::fs::flock(other.fd_for_tests(), rustix::fs::FlockOperation::LockShared).unwrap();
        assert!(other.held(presence::PRODUCER));
        seg.unlink();
        drop(seg);
        // A child that another test forks without exec'ing does not keep it: the fork handler
        // points the child's copy elsewhere.
        assert!(!other.held(presence::PRODUCER), "released with the segment");
        assert!(other.try_hold(presence::PRODUCER).unwrap());
    }

    #[test]
    fn a_forked_child_does_not_keep_the_lock() {
        let (d, n) = (dir(), name("fork"));
        let seg = Segment::create(&d, &n, 4096, 0o600).unwrap();
        seg.unlink();
        // A second description of the (unlinked) file, made from our own descriptor.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(seg.fd_for_tests()));
        let other = OwnedFd::from(std::fs::File::open(path).unwrap());
        // SAFETY: fork in a test; the child only sleeps (async-signal-safe) and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: async-signal-safe calls only, in the child.
            unsafe {
                libc::sleep(5);
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "fork failed");
        assert!(presence::held(other.as_fd(), presence::PRODUCER), "the parent holds it");
        drop(seg);
        // The child's fork handler runs in the child after `fork` returned here: give it a
        // moment (a generous deadline; the child sleeps far longer).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut freed = false;
        while !freed && std::time::Instant::now() < deadline {
            freed = !presence::held(other.as_fd(), presence::PRODUCER);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: plain system calls on the child we made.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(freed, "a forked child kept the dropped producer's lock");
    }

    #[test]
    fn create_reserves_and_checks_free_space() {
        let (d, n) = (dir(), name("reserve"));
        let seg = Segment::create(&d, &n, 64 * 4096, 0o600).unwrap();
        let st = rustix::fs::statat(d.fd(), n.file(), AtFlags::empty()).unwrap();
        assert!(st.st_blocks as u64 * 512 >= 64 * 4096, "{} blocks", st.st_blocks);
        seg.unlink();
        let fd = seg.fd.as_ref().unwrap();
        if let Some(free) = free_bytes(fd).unwrap() {
            let n = name("too-big");
            let size = usize::try_from(free + (1 << 20)).unwrap();
            match Segment::create(&d, &n, size, 0o600) {
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
            assert!(rustix::fs::statat(d.fd(), n.file(), AtFlags::empty()).is_err(), "left behind");
        }
    }
}
