//! Creating a segment under a name that a dead producer's segment still holds, without racing
//! other producers that found the same dead one.
//!
//! Every segment's creator holds the producer's liveness lock ([`presence::PRODUCER`], an OFD
//! lock on one byte of the file) from the moment the file exists for as long as it lives, and
//! the kernel drops it when the process dies, in whatever pid namespace it ran. So an existing
//! file whose producer byte is free belongs to nobody alive. Replacers serialise on a second
//! byte ([`presence::REPLACER`]):
//!
//! 1. `Segment::create` (`O_EXCL`); if the name is free, done.
//! 2. Open the existing file and take its replacer byte without waiting. Taken: another
//!    replacer is at work, so `AlreadyExists { pid: 0 }`.
//! 3. Take its producer byte without waiting. Taken: a live creator or producer holds it, so
//!    `AlreadyExists` (with the pid its header names, for display).
//! 4. With both: check that the name still refers to the locked file. If not, someone replaced
//!    it since we opened it: that segment is new, not ours to judge; try `Segment::create` once
//!    more (normally `AlreadyExists` from the new one).
//! 5. Remove the dead instance's sockets (named from its header), unlink the name, close the
//!    old file (releasing both locks), and create the new segment (once, with `O_EXCL`).
//!
//! Nobody unlinks a name without holding the producer byte of the file it refers to and having
//! checked, under that lock, that the name still refers to it. So a second replacer either
//! fails to take the old file's locks (steps 2 and 3), or takes them after step 5 and finds the
//! name gone or referring to a new file (step 4): it cannot remove the new segment. It may then
//! win the `O_EXCL` create itself, in which case the first gets `AlreadyExists`: one ring
//! either way. A creator whose empty file was taken for a dead creator's (between its `openat`
//! and its lock) waits for the lock, then notices in `Segment::create`, which checks the name
//! after locking, and fails with `AlreadyExists`.
//!
//! The locks are byte-range OFD locks, not `flock`: a `flock` that any other process takes on
//! the file (a backup tool, a user's script, a forked child of a consumer) does not touch them,
//! and so cannot keep a dead ring from being replaced. A forked child of the producer does not
//! keep them either (see `presence`). A ring of an older gpuring (an older layout version),
//! whose producer held a `flock` instead, is judged by that `flock`.
//!
//! The old file is closed before the new one is created, not after: its pages are freed only
//! once nothing holds it, and a directory with room for one ring (a container's 64 MiB
//! /dev/shm) must not refuse the new one for the dead one's memory. (Consumers of the dead ring
//! that still map it keep its pages until they drop it.)

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::dir::RingDir;
use super::name::ShmName;
use super::presence::{self, Holder};
use super::segment::{check_file, names, retry, unlink_at, OpenOptions, Segment};
use crate::error::{CreateErrorKind, OpenErrorKind};
use crate::format::header::LAYOUT_VERSION;
use crate::format::Header;

/// Creates segment `name` in `dir` as [`Segment::create`] does; if the name is taken by a
/// segment whose producer is dead, replaces it (see the module docs). Fails with
/// `AlreadyExists { pid }` if the segment there is alive, `pid` being what its header names
/// (display only: it may be another pid namespace's; 0 if not known, or while another process
/// is replacing it).
pub(crate) fn create(
    dir: &RingDir,
    name: &ShmName,
    size: usize,
    mode: u32,
) -> Result<Segment, CreateErrorKind> {
    match Segment::create(dir, name, size, mode) {
        Err(CreateErrorKind::AlreadyExists { .. }) => replace(dir, name, size, mode),
        made => made,
    }
}

/// Steps 2 to 5 of the module docs. Calls `Segment::create` at most once more, without looping.
fn replace(
    dir: &RingDir,
    name: &ShmName,
    size: usize,
    mode: u32,
) -> Result<Segment, CreateErrorKind> {
    let (old, st) = match open(dir, name) {
        Ok(opened) => opened,
        // Removed since our create found it: the name is free, unless another is faster.
        Err(OpenErrorKind::NotFound) => return Segment::create(dir, name, size, mode),
        Err(e) => return Err(open_to_create(e)),
    };
    let io = |e: std::io::Error| CreateErrorKind::Io(e);
    if !old.try_hold(presence::REPLACER).map_err(io)? {
        return Err(CreateErrorKind::AlreadyExists { pid: 0 });
    }
    let header = read_header(old.fd());
    if !old.try_hold(presence::PRODUCER).map_err(io)? || older_and_locked(old.fd(), header) {
        let pid = header.map_or(0, |h| h.pid);
        return Err(CreateErrorKind::AlreadyExists { pid });
    }
    if !names(dir, name, (st.st_dev, st.st_ino)) {
        // Replaced (or removed) since we opened it: not the segment we found dead.
        return Segment::create(dir, name, size, mode);
    }
    let dead_pid = header.map_or(0, |h| h.pid);
    tracing::info!(ring = %name.ring(), dir = %dir.path().display(), dead_pid, "replacing a dead producer's ring");
    match unlink_instance(dir, name, header) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(Errno::ACCESS | Errno::PERM) => return Err(CreateErrorKind::PermissionDenied),
        Err(e) => return Err(CreateErrorKind::Io(e.into())),
    }
    // Close the old file before creating: its pages are freed only when nothing holds it any
    // more, and a directory with room for one ring must have room for the new one.
    drop(old);
    Segment::create(dir, name, size, mode)
}

/// Opens the file at `name` read-write as a lock holder (registered with the fork handler, so
/// that a child forked meanwhile does not keep the locks taken on it), with `Segment::open`'s
/// checks: a regular file of this user, never through a symlink. Never mapped.
fn open(dir: &RingDir, name: &ShmName) -> Result<(Holder, rustix::fs::Stat), OpenErrorKind> {
    let opened = Holder::open_any(dir, name.file()).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => OpenErrorKind::PermissionDenied,
        Some(libc::ELOOP) => OpenErrorKind::NotASegment,
        _ => OpenErrorKind::Io(e),
    })?;
    let (holder, st) = opened.ok_or(OpenErrorKind::NotFound)?;
    check_file(&st, OpenOptions::default())?;
    Ok((holder, st))
}

/// Why [`remove`] did not remove a ring.
#[derive(Debug)]
pub(crate) enum Refused {
    /// No ring of that name.
    NotFound,
    /// Its producer holds its lock (`pid` as its header names it).
    Alive { pid: u32 },
    /// Another replacer or remover is at work on it.
    Busy,
    /// The file could not be opened or unlinked.
    Io(std::io::Error),
}

/// Removes ring `name` from `dir`, with the sockets of its instance, the way a replacement
/// does: holding its replacer and producer locks while it checks that the name still refers
/// to the file and unlinks it, so that it never removes a ring created meanwhile. Refused while
/// the producer holds its lock and has not closed the ring (read under the locks, from the
/// file it removes), unless `force`.
pub(crate) fn remove(dir: &RingDir, name: &ShmName, force: bool) -> Result<(), Refused> {
    let (old, st) = match open(dir, name) {
        Ok(opened) => opened,
        Err(OpenErrorKind::NotFound) => return Err(Refused::NotFound),
        Err(OpenErrorKind::Io(e)) => return Err(Refused::Io(e)),
        // Another user's or not a regular file: removed by name only when forced.
        Err(_) if force => return unlink_at(dir, name).map_err(|e| Refused::Io(e.into())),
        Err(e) => return Err(Refused::Io(std::io::Error::other(e.to_string()))),
    };
    if !old.try_hold(presence::REPLACER).map_err(Refused::Io)? && !force {
        return Err(Refused::Busy);
    }
    let header = read_header(old.fd());
    let closed = header.is_some_and(|h| h.closed != 0);
    if !old.try_hold(presence::PRODUCER).map_err(Refused::Io)? && !force && !closed {
        return Err(Refused::Alive { pid: header.map_or(0, |h| h.pid) });
    }
    if !names(dir, name, (st.st_dev, st.st_ino)) {
        return Err(Refused::NotFound);
    }
    match unlink_instance(dir, name, header) {
        Ok(()) => Ok(()),
        Err(Errno::NOENT) => Err(Refused::NotFound),
        Err(e) => Err(Refused::Io(e.into())),
    }
}

/// Removes the sockets of the instance `header` names (best effort: one left behind is
/// replaced by the next bind there), then unlinks `name`. The caller holds the file's replacer
/// and producer locks and has checked that `name` still refers to it.
fn unlink_instance(
    dir: &RingDir,
    name: &ShmName,
    header: Option<OldHeader>,
) -> rustix::io::Result<()> {
    if let Some(h) = header.filter(|h| h.epoch != 0) {
        if let Err(e) = crate::shm::unixsock::remove_instance(dir, name.ring(), h.epoch) {
            tracing::debug!(error = %e, "cannot remove the instance's sockets");
        }
    }
    unlink_at(dir, name)
}

/// What the replacement reads of an old header.
#[derive(Clone, Copy, Debug)]
struct OldHeader {
    version: u32,
    pid: u32,
    epoch: u64,
    closed: u32,
}

/// The old file's header fields that matter here, or `None` if the file is too small for a
/// header. Read with `pread`, not through a mapping, so that a file truncated meanwhile gives a
/// short read rather than a SIGBUS.
fn read_header(fd: BorrowedFd<'_>) -> Option<OldHeader> {
    let mut h = [0u8; std::mem::size_of::<Header>()];
    let n = retry(|| rustix::io::pread(fd, &mut h[..], 0)).ok()?;
    if n < h.len() {
        return None;
    }
    let u32_at = |offset: usize| {
        let b = &h[offset..offset + size_of::<AtomicU32>()];
        u32::from_ne_bytes(b.try_into().expect("4 bytes"))
    };
    let u64_at = |offset: usize| {
        let b = &h[offset..offset + size_of::<AtomicU64>()];
        u64::from_ne_bytes(b.try_into().expect("8 bytes"))
    };
    Some(OldHeader {
        version: u32_at(std::mem::offset_of!(Header, version)),
        pid: u32_at(std::mem::offset_of!(Header, producer_pid)),
        epoch: u64_at(std::mem::offset_of!(Header, epoch)),
        closed: u32_at(std::mem::offset_of!(Header, closed)),
    })
}

/// The first layout version whose participants hold OFD locks (and no `flock`).
const LOCKS_SINCE: u32 = 8;

/// Whether the file may be an older gpuring's ring (a layout version before the liveness
/// locks, or a header not written yet, as an older builder leaves it) whose producer still
/// holds the `flock` those took: such a producer holds no OFD lock. A ring of this layout has
/// its version written and is judged by its lock alone, so a stray `flock` cannot keep it.
fn older_and_locked(fd: BorrowedFd<'_>, header: Option<OldHeader>) -> bool {
    if header.is_some_and(|h| (LOCKS_SINCE..=LAYOUT_VERSION).contains(&h.version)) {
        return false;
    }
    match retry(|| rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
            false
        }
        Err(_) => true,
    }
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
    use rustix::fs::{AtFlags, Mode};

    use super::*;

    fn name(tag: &str) -> ShmName {
        ShmName::new(&format!("unit-stale-{tag}-{}", std::process::id())).unwrap()
    }

    fn dir() -> RingDir {
        RingDir::open("/dev/shm").unwrap()
    }

    fn ino(d: &RingDir, name: &ShmName) -> u64 {
        rustix::fs::statat(d.fd(), name.file(), AtFlags::empty()).unwrap().st_ino
    }

    #[test]
    fn live_segment_is_kept() {
        let (d, n) = (dir(), name("live"));
        let seg = create(&d, &n, 4096, 0o600).unwrap();
        assert!(matches!(create(&d, &n, 4096, 0o600), Err(CreateErrorKind::AlreadyExists { .. })));
        assert_eq!(ino(&d, &n), rustix::fs::fstat(seg.fd_for_tests()).unwrap().st_ino);
        seg.unlink();
    }

    #[test]
    fn dead_or_unlocked_segments_are_replaced() {
        let (d, n) = (dir(), name("dead"));
        let seg = create(&d, &n, 4096, 0o600).unwrap();
        let old = ino(&d, &n);
        drop(seg); // Its lock goes with it; the name stays (no unlink).
        let new = create(&d, &n, 4096, 0o600).unwrap();
        assert_ne!(ino(&d, &n), old, "a dead producer's segment is replaced");
        new.unlink();
        // An empty file with no lock: a creator that died before its lock.
        let n = name("empty");
        let flags =
            rustix::fs::OFlags::CREATE | rustix::fs::OFlags::EXCL | rustix::fs::OFlags::RDWR;
        drop(rustix::fs::openat(d.fd(), n.file(), flags, Mode::RUSR | Mode::WUSR).unwrap());
        let old = ino(&d, &n);
        let new = create(&d, &n, 4096, 0o600).unwrap();
        assert_ne!(ino(&d, &n), old, "an empty, unlocked file is replaced");
        new.unlink();
    }

    #[test]
    fn a_stray_flock_does_not_keep_a_dead_ring() {
        let (d, n) = (dir(), name("flock"));
        let seg = create(&d, &n, 4096, 0o600).unwrap();
        // A ring of this layout (an older one, or a header not yet written, is judged by its
        // flock as well).
        seg.header().version.store(LAYOUT_VERSION, std::sync::atomic::Ordering::Relaxed);
        let old = ino(&d, &n);
        let (stray, _) = open(&d, &n).unwrap();
        rustix::fs::flock(stray.fd(), FlockOperation::LockShared).unwrap();
        drop(seg);
        let new = create(&d, &n, 4096, 0o600).expect("replaced despite another's flock");
        assert_ne!(ino(&d, &n), old);
        new.unlink();
    }

    #[test]
    fn an_older_rings_flock_still_keeps_it() {
        let (d, n) = (dir(), name("older"));
        let seg = create(&d, &n, 4096, 0o600).unwrap();
        seg.header().version.store(LOCKS_SINCE - 1, std::sync::atomic::Ordering::Relaxed);
        // An older producer: no OFD lock, a flock held.
        let (older, _) = open(&d, &n).unwrap();
        rustix::fs::flock(older.fd(), FlockOperation::LockShared).unwrap();
        drop(seg);
        assert!(matches!(create(&d, &n, 4096, 0o600), Err(CreateErrorKind::AlreadyExists { .. })));
        drop(older);
        create(&d, &n, 4096, 0o600).expect("replaced once its flock is gone").unlink();
    }

    #[test]
    fn a_replacer_at_work_blocks_another() {
        let (d, n) = (dir(), name("replacer"));
        let seg = create(&d, &n, 4096, 0o600).unwrap();
        drop(seg);
        let (busy, _) = open(&d, &n).unwrap();
        assert!(busy.try_hold(presence::REPLACER).unwrap());
        assert!(matches!(
            create(&d, &n, 4096, 0o600),
            Err(CreateErrorKind::AlreadyExists { pid: 0 })
        ));
        drop(busy);
        create(&d, &n, 4096, 0o600).unwrap().unlink();
    }
}
