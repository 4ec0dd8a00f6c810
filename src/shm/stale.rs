//! Creating a segment under a name that a dead producer's segment still holds, without racing
//! other producers that found the same dead one.
//!
//! Every segment's creator holds a `flock` on its file for as long as it lives (exclusive while
//! it builds the segment, shared once it is built: see [`Segment::create`] and
//! [`Segment::mark_ready`]), and the kernel drops it when the process dies. So an existing
//! file whose lock is free belongs to nobody alive, and whoever takes its exclusive lock owns
//! the right to replace it:
//!
//! 1. `Segment::create` (`O_EXCL`); if the name is free, done.
//! 2. Open the existing file and try `flock(LOCK_EX | LOCK_NB)`. Taken: a live creator or
//!    producer holds it (or another replacer, for a moment), so `AlreadyExists`.
//! 3. With the lock: check that the name still refers to the locked file. If not, someone
//!    replaced it since we opened it: that segment is new, not ours to judge; try
//!    `Segment::create` once more (normally `AlreadyExists` from the new one).
//! 4. Check the header: if it names a live producer, `AlreadyExists`. (Its lock can be free
//!    for a moment while `mark_ready` converts it, or for good in a producer of an older
//!    gpuring that took none.) A file too small for a header, or whose pid is 0, with its lock
//!    free, was left by a creator that died.
//! 5. Unlink the name, close the old file (releasing its lock), and create the new segment
//!    (once, with `O_EXCL`).
//!
//! Nobody unlinks a name without holding the lock of the file it refers to and having checked,
//! under that lock, that the name still refers to it. So a second replacer either fails to
//! take the old file's lock (step 2), or takes it after step 5 and finds the name gone or
//! referring to a new file (step 3): it cannot remove the new segment. It may then win the
//! `O_EXCL` create itself, in which case the first gets `AlreadyExists`: one ring either way.
//! A creator whose empty file was taken for a dead creator's (between its `shm_open` and its
//! `flock`) notices in `Segment::create`, which checks the name after locking, and fails with
//! `AlreadyExists`.
//!
//! The old file is closed before the new one is created, not after: its pages are freed only
//! once nothing holds it, and a /dev/shm with room for one ring (a container's 64 MiB) must
//! not refuse the new one for the dead one's memory. (Consumers of the dead ring that still map
//! it keep its pages until they drop it.)
//!
//! The lock is on the open file description: a process that `fork`s without `exec` shares its
//! producer's, and keeps the ring's lock held after the producer dies, until it exits too.
//! (Segment fds are close-on-exec, so `exec`ed children do not.)

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::FlockOperation;
use rustix::io::Errno;
use rustix::shm;

use super::name::ShmName;
use super::process::ProcessId;
use super::segment::{names, retry, OpenOptions, Segment};
use crate::error::{CreateErrorKind, OpenErrorKind};
use crate::format::Header;

/// Creates segment `name` as [`Segment::create`] does; if the name is taken by a segment whose
/// producer is dead, replaces it (see the module docs). Fails with `AlreadyExists { pid }` if
/// the segment there is alive, `pid` being its producer's (0 if it is not known, or not alive:
/// another process is replacing it right now).
pub(crate) fn create(name: &ShmName, size: usize, mode: u32) -> Result<Segment, CreateErrorKind> {
    match Segment::create(name, size, mode) {
        Err(CreateErrorKind::AlreadyExists { .. }) => replace(name, size, mode),
        made => made,
    }
}

/// Steps 2 to 5 of the module docs. Calls `Segment::create` at most once more, without looping.
fn replace(name: &ShmName, size: usize, mode: u32) -> Result<Segment, CreateErrorKind> {
    let old = match open(name) {
        Ok(fd) => fd,
        // Removed since our create found it: the name is free, unless another is faster.
        Err(OpenErrorKind::NotFound) => return Segment::create(name, size, mode),
        Err(e) => return Err(open_to_create(e)),
    };
    match retry(|| rustix::fs::flock(&old, FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => {
            let pid = owner(&old).filter(ProcessId::is_alive).map_or(0, |p| p.pid);
            return Err(CreateErrorKind::AlreadyExists { pid });
        }
        Err(e) => return Err(CreateErrorKind::Io(e.into())),
    }
    let st = rustix::fs::fstat(&old).map_err(|e| CreateErrorKind::Io(e.into()))?;
    if !names(name, (st.st_dev, st.st_ino)) {
        // Replaced (or removed) since we opened it: not the segment we found dead.
        return Segment::create(name, size, mode);
    }
    // Read under the lock: whoever held it before wrote the header before releasing it.
    let dead = owner(&old);
    if let Some(p) = dead.filter(|p| p.pid != 0 && p.is_alive()) {
        return Err(CreateErrorKind::AlreadyExists { pid: p.pid });
    }
    let dead_pid = dead.map_or(0, |p| p.pid);
    tracing::info!(ring = %name.ring(), dead_pid, "replacing a dead producer's ring");
    match shm::unlink(name.shm()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(Errno::ACCESS | Errno::PERM) => return Err(CreateErrorKind::PermissionDenied),
        Err(e) => return Err(CreateErrorKind::Io(e.into())),
    }
    // Close the old file before creating: its pages are freed only when nothing holds it any
    // more, and a /dev/shm with room for one ring must have room for the new one.
    drop(old);
    Segment::create(name, size, mode)
}

/// Opens the file at `name` read-only, with `Segment::open`'s checks (a regular file of this
/// user, never through a symlink), without mapping it.
fn open(name: &ShmName) -> Result<OwnedFd, OpenErrorKind> {
    let flags = shm::OFlags::from_bits_retain(rustix::fs::OFlags::RDONLY.bits());
    Ok(Segment::open_file(name, flags, OpenOptions::default())?.0)
}

/// The producer the header of file `fd` names (pid 0: none written yet), or `None` if the file
/// is too small for a header. Read with `pread`, not through a mapping, so that a file
/// truncated meanwhile gives a short read rather than a SIGBUS.
fn owner(fd: &OwnedFd) -> Option<ProcessId> {
    let mut h = [0u8; std::mem::size_of::<Header>()];
    let n = retry(|| rustix::io::pread(fd, &mut h[..], 0)).ok()?;
    if n < h.len() {
        return None;
    }
    let field = |offset: usize, len: usize| &h[offset..offset + len];
    let pid = field(std::mem::offset_of!(Header, producer_pid), size_of::<AtomicU32>());
    let start = field(std::mem::offset_of!(Header, producer_start_time), size_of::<AtomicU64>());
    Some(ProcessId {
        pid: u32::from_ne_bytes(pid.try_into().ok()?),
        start_time: u64::from_ne_bytes(start.try_into().ok()?),
    })
}

/// What an error opening the existing segment means for the create that found it.
fn open_to_create(e: OpenErrorKind) -> CreateErrorKind {
    match e {
        OpenErrorKind::PermissionDenied | OpenErrorKind::ForeignOwner { .. } => {
            CreateErrorKind::PermissionDenied
        }
        OpenErrorKind::Io(e) => CreateErrorKind::Io(e),
        _ => CreateErrorKind::AlreadyExists { pid: 0 },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use rustix::fs::Mode;

    use super::*;

    fn name(tag: &str) -> ShmName {
        ShmName::new(&format!("unit-stale-{tag}-{}", std::process::id())).unwrap()
    }

    fn ino(name: &ShmName) -> u64 {
        rustix::fs::stat(name.path()).unwrap().st_ino
    }

    /// `create`, once a child that another test forked has let go of our lock: until it execs,
    /// it shares every open file description, and with it the lock of a segment we dropped
    /// (`AlreadyExists { pid: 0 }`: locked, by nobody alive that the header names).
    fn create_after_forks(n: &ShmName) -> Result<Segment, CreateErrorKind> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match create(n, 4096, 0o600) {
                Err(CreateErrorKind::AlreadyExists { pid: 0 })
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                made => return made,
            }
        }
    }

    /// A header naming process `p`, as a producer writes it.
    fn claim(seg: &Segment, p: ProcessId) {
        // Relaxed: read by other processes only through the file, after the lock.
        seg.header().producer_pid.store(p.pid, Ordering::Relaxed);
        seg.header().producer_start_time.store(p.start_time, Ordering::Relaxed);
    }

    #[test]
    fn live_segment_is_kept() {
        let n = name("live");
        let seg = create(&n, 4096, 0o600).unwrap();
        let me = ProcessId::current();
        claim(&seg, me);
        // Locked while built, and after.
        assert!(
            matches!(create(&n, 4096, 0o600), Err(CreateErrorKind::AlreadyExists { pid }) if pid == me.pid)
        );
        seg.mark_ready();
        assert!(
            matches!(create(&n, 4096, 0o600), Err(CreateErrorKind::AlreadyExists { pid }) if pid == me.pid)
        );
        assert_eq!(ino(&n), rustix::fs::fstat(seg.fd_for_tests()).unwrap().st_ino);
        seg.unlink();
    }

    #[test]
    fn dead_or_unlocked_segments_are_replaced() {
        let n = name("dead");
        // A forged segment: its lock is free and its header names a process that is gone.
        let seg = create(&n, 4096, 0o600).unwrap();
        let me = ProcessId::current();
        claim(&seg, ProcessId { start_time: me.start_time + 1, ..me });
        let old = ino(&n);
        drop(seg); // Its lock goes with it; the name stays (no unlink).
        let new = create_after_forks(&n).unwrap();
        assert_ne!(ino(&n), old, "a dead producer's segment is replaced");
        new.unlink();
        // An empty file with no lock: a creator that died before its ftruncate.
        let n = name("empty");
        let flags = shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR;
        drop(shm::open(n.shm(), flags, Mode::RUSR | Mode::WUSR).unwrap());
        let old = ino(&n);
        let new = create(&n, 4096, 0o600).unwrap();
        assert_ne!(ino(&n), old, "an empty, unlocked file is replaced");
        new.unlink();
    }

    #[test]
    fn unlocked_segment_of_a_live_producer_is_kept() {
        // A producer that took no lock (an older gpuring), alive: the pid decides.
        let n = name("nolock");
        let seg = create(&n, 4096, 0o600).unwrap();
        claim(&seg, ProcessId::current());
        rustix::fs::flock(seg.fd_for_tests(), FlockOperation::Unlock).unwrap();
        let me = std::process::id();
        assert!(
            matches!(create(&n, 4096, 0o600), Err(CreateErrorKind::AlreadyExists { pid }) if pid == me)
        );
        seg.unlink();
    }
}
