//! Who is alive, told by locks the kernel drops when a process dies: no pid of the other side
//! is read, so peers in other pid namespaces (containers) see each other come and go.
//!
//! Every participant of a ring holds an open file description (OFD) lock, `F_OFD_SETLK` with
//! `F_WRLCK`, on a byte of the ring's file that is its own:
//!
//! | byte | held by |
//! |---|---|
//! | [`PRODUCER`] | the producer, from the moment it creates the file until it drops it |
//! | [`REPLACER`] | whoever is replacing a dead producer's file (`stale.rs`), while it does |
//! | [`consumer`]`(i)` | the owner of consumer table entry `i`, from before its claim until after it let go |
//!
//! Anyone may ask whether a byte is held (`F_OFD_GETLK`, [`held`]) from a description of the
//! same file that does not hold it.
//!
//! Locks are held on a description of their own ([`Holder`]), never on the one the segment is
//! mapped from: a mapping keeps the description it was made from alive, and with it any OFD
//! lock on it, for as long as the mapping lasts (in a forked child too, which inherits the
//! mappings; or where a mapping is kept on purpose past the segment, for the CUDA driver). The lock belongs to the open file description, not to the
//! process: unlike a classic `F_SETLK` lock, closing some other descriptor of the file does
//! not drop it, and two participants in one process (two consumers, a producer and its
//! consumer in a test) hold and see each other's locks. The kernel releases it when the last
//! descriptor of the description closes: when the participant drops it, or when its process
//! exits, is killed or becomes a zombie. The locks are advisory and beside the data: they do
//! not touch the segment's bytes.
//!
//! # fork
//!
//! A child made by `fork()` shares its parent's descriptions, so it would keep a dead parent's
//! locks held, and the parent looking alive, for as long as it runs. Every descriptor that
//! holds such a lock is registered here ([`Registered`]); a `pthread_atfork` child handler
//! points each of them, in the child only, at an empty file (`dup3` over the descriptor, which
//! drops the child's reference to the description without unlocking it: an unlock would free
//! the parent's lock). The child therefore cannot use its parent's rings: it opens its own.
//! Descriptors are opened `O_CLOEXEC`, so an `exec`ed child never has them. A process with more
//! than [`MAX_REGISTERED`] of them at once leaves the rest unregistered (with a warning).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use rustix::fs::{Mode, OFlags};

use super::dir::RingDir;

/// The producer's byte.
pub const PRODUCER: u64 = 0;
/// The byte a replacer of a dead producer's file holds while it replaces it.
pub const REPLACER: u64 = 1;

/// The byte of consumer table entry `entry`.
pub fn consumer(entry: usize) -> u64 {
    2 + entry as u64
}

/// Takes the write lock on `byte` of `fd`'s file for `fd`'s open file description, without
/// waiting. `Ok(false)`: another description holds it.
pub fn try_hold(fd: BorrowedFd<'_>, byte: u64) -> io::Result<bool> {
    match lock(fd, byte, libc::F_WRLCK, libc::F_OFD_SETLK) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes the write lock on `byte`, waiting while another description holds it.
pub fn hold(fd: BorrowedFd<'_>, byte: u64) -> io::Result<()> {
    loop {
        match lock(fd, byte, libc::F_WRLCK, libc::F_OFD_SETLKW) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// Releases `fd`'s lock on `byte` (nothing if it holds none).
pub fn release(fd: BorrowedFd<'_>, byte: u64) {
    let _ = lock(fd, byte, libc::F_UNLCK, libc::F_OFD_SETLK);
}

/// Whether a description other than `fd`'s holds a lock on `byte`: its holder is alive.
///
/// An error (a file system without OFD locks, which tmpfs is not) reads as "held": taking a
/// live peer for dead frees what it still uses, while the reverse only delays a reclaim.
pub fn held(fd: BorrowedFd<'_>, byte: u64) -> bool {
    match lock(fd, byte, libc::F_WRLCK, libc::F_OFD_GETLK) {
        Ok(found) => found.l_type != libc::F_UNLCK as libc::c_short,
        Err(e) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                tracing::warn!(error = %e, "cannot probe ring locks: peers are taken for alive")
            });
            true
        }
    }
}

/// One `fcntl` lock command on the byte `byte`; returns the `flock` the kernel wrote back.
fn lock(fd: BorrowedFd<'_>, byte: u64, kind: i32, cmd: i32) -> io::Result<libc::flock> {
    let start = libc::off_t::try_from(byte).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `flock` is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    // SAFETY: `fd` is an open descriptor for the duration of the call, and `fl` is a valid,
    // exclusively borrowed `struct flock`, which every one of these commands takes.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// A description of a ring's file that holds this process's liveness locks on it: never
/// mapped, registered with the fork handler, released (with every lock) when dropped.
#[derive(Debug)]
pub struct Holder {
    /// Declared before `fd`, so it unregisters before the descriptor closes.
    _registered: Registered,
    fd: OwnedFd,
}

impl Holder {
    /// Opens file `file` of `dir` once more, read-write (write locks need a writable
    /// description), never through a symlink. `Ok(None)` if the name no longer refers to the
    /// file `id` (st_dev, st_ino): it was replaced meanwhile.
    pub fn open(dir: &RingDir, file: &str, id: (u64, u64)) -> io::Result<Option<Holder>> {
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir.fd(), file, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_dev, st.st_ino) != id {
            return Ok(None);
        }
        Ok(Some(Holder { _registered: Registered::new(fd.as_fd()), fd }))
    }

    /// [`try_hold`] on this description.
    pub fn try_hold(&self, byte: u64) -> io::Result<bool> {
        try_hold(self.fd.as_fd(), byte)
    }

    /// [`hold`] on this description.
    pub fn hold(&self, byte: u64) -> io::Result<()> {
        hold(self.fd.as_fd(), byte)
    }

    /// [`release`] on this description.
    pub fn release(&self, byte: u64) {
        release(self.fd.as_fd(), byte)
    }
}

/// Most descriptors registered for the fork handler at once.
pub const MAX_REGISTERED: usize = 1024;

/// The registered descriptors; -1 marks a free slot.
static REGISTRY: [AtomicI32; MAX_REGISTERED] = [const { AtomicI32::new(-1) }; MAX_REGISTERED];

/// An empty file the child handler points registered descriptors at (-1: none could be made).
static PLACEHOLDER: AtomicI32 = AtomicI32::new(-1);

/// A registration of a lock-holding descriptor with the fork handler, undone on drop. Drop it
/// before the descriptor closes, so that the number is never reused while registered.
#[derive(Debug)]
pub struct Registered {
    /// The slot in `REGISTRY`, if one was free.
    slot: Option<usize>,
}

impl Registered {
    /// Registers `fd` (see the module docs).
    pub fn new(fd: BorrowedFd<'_>) -> Registered {
        install();
        let raw = fd.as_raw_fd();
        for (slot, cell) in REGISTRY.iter().enumerate() {
            // Release: a fork's child handler that loads this slot (Acquire) sees an open fd.
            if cell.compare_exchange(-1, raw, Ordering::Release, Ordering::Relaxed).is_ok() {
                return Registered { slot: Some(slot) };
            }
        }
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "more than {MAX_REGISTERED} ring locks in one process: a child forked now keeps \
                 the rest held until it exits or execs"
            )
        });
        Registered { slot: None }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            // Release: pairs with the next registration's CAS of this slot.
            REGISTRY[slot].store(-1, Ordering::Release);
        }
    }
}

/// Installs the fork handler once, with its placeholder file.
fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let placeholder = rustix::fs::memfd_create("gpuring-forked", rustix::fs::MemfdFlags::CLOEXEC);
        match placeholder {
            Ok(fd) => {
                // Kept open for the life of the process.
                let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
                // Release: the handler's Acquire load sees an open descriptor.
                PLACEHOLDER.store(raw, Ordering::Release);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "no placeholder file: a forked child keeps ring locks held until it exits or execs"
            ),
        }
        // SAFETY: `in_child` is an `extern "C"` function that only makes async-signal-safe
        // system calls (dup3, close) and atomic loads, as a handler run after fork must.
        let r = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if r != 0 {
            tracing::warn!(error = r, "pthread_atfork failed: forked children keep ring locks held");
        }
    });
}

/// The fork handler, run in the child: drops the child's references to every registered
/// description (see the module docs).
extern "C" fn in_child() {
    // Acquire (all loads): pair with the Release stores that registered each descriptor.
    let placeholder: RawFd = PLACEHOLDER.load(Ordering::Acquire);
    for cell in REGISTRY.iter() {
        let fd = cell.load(Ordering::Acquire);
        if fd < 0 {
            continue;
        }
        if placeholder >= 0 {
            // SAFETY: plain system call on descriptor numbers; `fd` is open in the child
            // (inherited), and replacing it leaves the number open, so the owner's later close
            // closes the placeholder copy, never an unrelated file.
            unsafe { libc::dup3(placeholder, fd, libc::O_CLOEXEC) };
        }
    }
}
