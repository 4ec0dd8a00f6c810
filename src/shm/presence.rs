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
//! holds such a lock is registered here ([`Holder`]); a `pthread_atfork` child handler
//! points each of them, in the child only, at an empty file (`dup3` over the descriptor, which
//! drops the child's reference to the description without unlocking it: an unlock would free
//! the parent's lock). The child therefore cannot use its parent's rings: it opens its own.
//! Descriptors are opened `O_CLOEXEC`, so an `exec`ed child never has them. A holder opened
//! while a fork began is opened again before any lock is taken on it, and a holder unlocks
//! everything before it unregisters and closes, so no fork between those steps leaves a child
//! holding a lock. No lock is held around any of it: a fork handler of another library never
//! waits on ours. A process with more than
//! [`MAX_REGISTERED`] of them at once leaves the rest unregistered (with a warning). A
//! participant that leaves its entry for its death to release ([`Holder::keep_until_exit`])
//! keeps its lock until then.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicI32, AtomicU64, Ordering};
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
            WARNED.call_once(
                || tracing::warn!(error = %e, "cannot probe ring locks: peers are taken for alive"),
            );
            true
        }
    }
}

/// One `fcntl` lock command on the byte `byte`; returns the `flock` the kernel wrote back.
fn lock(fd: BorrowedFd<'_>, byte: u64, kind: i32, cmd: i32) -> io::Result<libc::flock> {
    lock_range(fd, byte, 1, kind, cmd)
}

/// One `fcntl` lock command on `len` bytes from `start` (0: to the end of any file).
fn lock_range(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    kind: i32,
    cmd: i32,
) -> io::Result<libc::flock> {
    let bad = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let (start, len) =
        (libc::off_t::try_from(start).map_err(bad)?, libc::off_t::try_from(len).map_err(bad)?);
    // SAFETY: `flock` is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
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
    /// The registry slot of `fd`, if one was free.
    slot: Option<usize>,
    /// `None` only after [`Holder::keep_until_exit`].
    fd: Option<OwnedFd>,
    /// The process that opened it. A forked child that drops a copy it inherited (one the
    /// fork handler could not replace) only closes it: an unlock would free the parent's locks
    /// through the shared description.
    opener: u32,
}

/// This process's id.
fn my_pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

impl Holder {
    /// Opens file `file` of `dir` once more, read-write (write locks need a writable
    /// description), never through a symlink. `Ok(None)` if the name no longer refers to the
    /// file `id` (st_dev, st_ino): it was replaced or removed meanwhile.
    pub fn open(dir: &RingDir, file: &str, id: (u64, u64)) -> io::Result<Option<Holder>> {
        match Holder::open_any(dir, file)? {
            Some((h, st)) if (st.st_dev, st.st_ino) == id => Ok(Some(h)),
            _ => Ok(None),
        }
    }

    /// Opens file `file` of `dir` read-write, never through a symlink and never waiting (a
    /// lease or a slow file system fails the open rather than stalling it), whatever file it
    /// is (the caller checks the returned status). `Ok(None)` if there is none.
    ///
    /// A child forked between the open and the registration would keep an unregistered copy
    /// of the description, and with it every lock taken on it later. So the fork state
    /// ([`FORKS`]: forks begun, and forks under way) is read before the open, when no fork is
    /// under way, and again after the registration; if a fork began meanwhile, this
    /// description (on which no lock was taken yet) is closed and another opened. No lock is
    /// held across any of it, so no fork handler of another library can wait on us. Forks
    /// that never end within [`FORK_PATIENCE`] (a fork storm) leave the holder unprotected,
    /// with a warning.
    pub fn open_any(dir: &RingDir, file: &str) -> io::Result<Option<(Holder, rustix::fs::Stat)>> {
        install();
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let deadline = std::time::Instant::now() + FORK_PATIENCE;
        let mut nap = std::time::Duration::from_micros(50);
        loop {
            // Relaxed: ordered by the SeqCst fences here and in `before_fork` (below).
            let before = FORKS.load(Ordering::Relaxed);
            let calm = before & IN_FLIGHT == 0;
            let late = std::time::Instant::now() >= deadline;
            if calm || late {
                let fd = match rustix::fs::openat(dir.fd(), file, flags, Mode::empty()) {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::NOENT) => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                let st = rustix::fs::fstat(&fd)?;
                let holder =
                    Holder { slot: register(fd.as_raw_fd(), &st), fd: Some(fd), opener: my_pid() };
                // SeqCst: pairs with the fence after `before_fork`'s increment. Our open (a
                // write to the descriptor table) and that increment, each followed by a full
                // fence, cannot both miss the other: either the fork's copy of the table comes
                // after the increment we load here, or it does not hold our descriptor.
                fence(Ordering::SeqCst);
                if FORKS.load(Ordering::Relaxed) == before && calm {
                    return Ok(Some((holder, st)));
                }
                if late {
                    tracing::warn!(
                        "forks kept coming while a ring lock was opened: a child forked now may \
                         keep it held until it exits or execs"
                    );
                    return Ok(Some((holder, st)));
                }
                drop(holder);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(5));
        }
    }

    /// The description, for reads and probes (never for mapping: see the module docs).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_ref().expect("a holder kept until exit is not used again").as_fd()
    }

    /// [`try_hold`] on this description.
    pub fn try_hold(&self, byte: u64) -> io::Result<bool> {
        try_hold(self.fd(), byte)
    }

    /// [`release`] on this description.
    pub fn release(&self, byte: u64) {
        release(self.fd(), byte)
    }

    /// Keeps this description, and every lock it holds, until the process exits: for a
    /// participant that leaves its entry to be reclaimed at its death (its GPU work may still
    /// run), so that nobody takes it for dead before then. It stays registered, so a child
    /// forked later still drops its copy.
    pub fn keep_until_exit(mut self) {
        if let Some(fd) = self.fd.take() {
            std::mem::forget(fd);
        }
        self.slot = None;
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let Some(fd) = self.fd.take() else { return };
        // Unlock first: a child forked between the unregistration and the close keeps a copy
        // of the description, but then one that holds nothing. Only in the process that opened
        // it (see `opener`).
        if self.opener == my_pid() {
            let _ = lock_range(fd.as_fd(), 0, 0, libc::F_UNLCK, libc::F_OFD_SETLK);
            let _ = rustix::fs::flock(&fd, rustix::fs::FlockOperation::Unlock);
        }
        if let Some(slot) = self.slot {
            // Release: pairs with the next registration's CAS of this slot.
            REGISTRY[slot].store(-1, Ordering::Release);
        }
        drop(fd);
    }
}

/// How long [`Holder::open_any`] waits for a moment without a fork under way.
pub const FORK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Most descriptors registered for the fork handler at once.
pub const MAX_REGISTERED: usize = 1024;

/// The registered descriptors; -1 marks a free slot.
static REGISTRY: [AtomicI32; MAX_REGISTERED] = [const { AtomicI32::new(-1) }; MAX_REGISTERED];

/// An empty file the child handler points registered descriptors at (-1: none could be made),
/// and its inode, which the handler checks first: if the program closed our placeholder and
/// the number now names another file, the handler leaves the descriptors alone rather than
/// dup3 a stranger over them.
static PLACEHOLDER: AtomicI32 = AtomicI32::new(-1);
static PLACEHOLDER_INO: AtomicU64 = AtomicU64::new(0);
static PLACEHOLDER_DEV: AtomicU64 = AtomicU64::new(0);

/// The fork state, read around a holder's open (see [`Holder::open_any`]): forks begun in the
/// high 32 bits (the prepare handler adds one), forks under way in the low 32 ([`IN_FLIGHT`]:
/// the prepare handler adds one, the parent handler takes it away, the child handler clears
/// them, since none is under way in a new child).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The low half of [`FORKS`]: forks under way.
const IN_FLIGHT: u64 = (1 << 32) - 1;

/// The file each registered descriptor names (st_dev, st_ino), so that the child handler
/// replaces only descriptors that still name it in the child (a number closed and reused by
/// another thread while the fork copied the table names something else there).
static SLOT_DEV: [AtomicU64; MAX_REGISTERED] = [const { AtomicU64::new(0) }; MAX_REGISTERED];
static SLOT_INO: [AtomicU64; MAX_REGISTERED] = [const { AtomicU64::new(0) }; MAX_REGISTERED];

/// Registers `fd` in a free slot, or none if all are taken (with a warning once).
fn register(fd: RawFd, st: &rustix::fs::Stat) -> Option<usize> {
    for (slot, cell) in REGISTRY.iter().enumerate() {
        // Relaxed: only decides whether to try; the CAS below claims the slot.
        if cell.load(Ordering::Relaxed) != -1 {
            continue;
        }
        // Claim with a value no descriptor has, fill in the identity, then publish the fd.
        // Relaxed: the Release store below publishes the slot.
        if cell.compare_exchange(-1, -2, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            SLOT_DEV[slot].store(st.st_dev, Ordering::Relaxed);
            SLOT_INO[slot].store(st.st_ino, Ordering::Relaxed);
            // Release: a fork's child handler that loads this fd (Acquire) sees its identity.
            cell.store(fd, Ordering::Release);
            return Some(slot);
        }
    }
    static WARNED: Once = Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "more than {MAX_REGISTERED} ring locks in one process: a child forked now keeps the \
             rest held until it exits or execs"
        )
    });
    None
}

/// Installs the fork handlers once, with the placeholder file.
fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let flags = rustix::fs::MemfdFlags::CLOEXEC;
        let placeholder = rustix::fs::memfd_create("gpuring-forked", flags).or_else(|_| {
            rustix::fs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        });
        match placeholder.and_then(|fd| Ok((rustix::fs::fstat(&fd)?, fd))) {
            Ok((st, fd)) => {
                PLACEHOLDER_INO.store(st.st_ino, Ordering::Relaxed);
                PLACEHOLDER_DEV.store(st.st_dev, Ordering::Relaxed);
                // Kept open for the life of the process. Release: the handler's Acquire load
                // sees the inode stored above and an open descriptor.
                PLACEHOLDER.store(std::os::fd::IntoRawFd::into_raw_fd(fd), Ordering::Release);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "no placeholder file: a forked child keeps ring locks held until it exits or execs"
            ),
        }
        // SAFETY: the handlers are `extern "C"` functions that only make async-signal-safe
        // system calls (fstat, dup3) and atomic operations, as handlers around fork must.
        let r =
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(in_child)) };
        if r != 0 {
            tracing::warn!(
                error = r,
                "pthread_atfork failed: forked children keep ring locks held"
            );
        }
    });
}

/// Before a fork, in the parent: counts it begun. Never waits.
extern "C" fn before_fork() {
    // Relaxed, then a SeqCst fence: pairs with the fence in `Holder::open_any` (see there).
    FORKS.fetch_add((1 << 32) + 1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// After a fork, in the parent: counts it ended.
extern "C" fn after_fork() {
    // Relaxed: only ends the "under way" a holder's open waits out; nothing is published.
    FORKS.fetch_sub(1, Ordering::Relaxed);
}

/// The fork handler, run in the child: drops the child's references to every registered
/// description (see the module docs).
extern "C" fn in_child() {
    // Acquire (all loads): pair with the Release stores that registered each descriptor.
    let placeholder: RawFd = PLACEHOLDER.load(Ordering::Acquire);
    let ino = PLACEHOLDER_INO.load(Ordering::Relaxed);
    let dev = PLACEHOLDER_DEV.load(Ordering::Relaxed);
    // SAFETY: `stat` is plain data, all-zero valid; `fstat` is async-signal-safe and writes
    // only into it.
    let ours = placeholder >= 0
        && unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(placeholder, &mut st) == 0 && st.st_ino == ino && st.st_dev == dev
        };
    if ours {
        for (slot, cell) in REGISTRY.iter().enumerate() {
            let fd = cell.load(Ordering::Acquire);
            if fd < 0 {
                continue;
            }
            let (dev, ino) =
                (SLOT_DEV[slot].load(Ordering::Relaxed), SLOT_INO[slot].load(Ordering::Relaxed));
            // SAFETY: as above: plain data, and an async-signal-safe call writing only into it.
            let same = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                libc::fstat(fd, &mut st) == 0 && st.st_dev == dev && st.st_ino == ino
            };
            if same {
                // SAFETY: plain system call on descriptor numbers; `fd` is open in the child
                // and names the registered file, and replacing it leaves the number open, so
                // the owner's later close closes the placeholder copy, never an unrelated file.
                unsafe { libc::dup3(placeholder, fd, libc::O_CLOEXEC) };
            }
        }
    }
    // Relaxed: a new child has no fork of its own under way.
    FORKS.fetch_and(!IN_FLIGHT, Ordering::Relaxed);
}
