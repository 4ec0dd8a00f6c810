//! Handing file descriptors to peers: the producer owns a unix `SOCK_SEQPACKET` socket at
//! `.gpuring.HASH.f` in the ring directory ([`fd_address`]; HASH names the ring and its
//! instance, see [`super::unixsock`]), and serves every peer that connects one message: a
//! payload and the fds it shares (`SCM_RIGHTS`). Before it sends anything it asks the kernel
//! who the peer is (`SO_PEERCRED` for its uid and gid and, when the policy names groups,
//! `SO_PEERGROUPS` for its supplementary groups; both are recorded at `connect`, so a peer
//! cannot forge them) and checks that against a [`PeerPolicy`]; a refused peer gets a refusal
//! and no fd. The CUDA VMM memory mode shares its pools this way, since their shareable
//! handles are fds (`docs/security.md`).
//!
//! The socket is a file, not an abstract name, because an abstract name belongs to its network
//! namespace: a consumer in a container with a network of its own, sharing only the ring
//! directory, could not connect. The file's mode follows the ring's
//! ([`super::unixsock::socket_mode`]): `connect` needs write permission on it.
//!
//! What the kernel says about a peer is translated into the reader's namespaces. A pid from a
//! pid namespace the reader cannot see reads as 0, so [`Peer::pid`] is an `Option` and no
//! decision rests on it. A uid not mapped into the reader's user namespace reads as the
//! overflow uid (`/proc/sys/kernel/overflowuid`, 65534), which stands for every unmapped user
//! at once: the server refuses it, and a client refuses a server that has it.
//!
//! One message per connection, on a seqpacket socket, so message boundaries hold and a peer
//! that connects and never reads costs the server one bounded send. The server runs on a
//! thread of its own, so peers are served while the producer's thread is busy. What it hands
//! out can be replaced while it runs ([`FdServer::set_offer`]): the producer adds pools after
//! it started.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{
    accept_with, connect, listen, recvmsg, sendmsg, shutdown, socket_with, sockopt, AddressFamily,
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType,
};

use super::dir::RingDir;
use super::unixsock::{self, bind_in, fd_file, socket_mode, SocketFile};

/// The most fds one message carries: one per pool-table entry.
///
/// ```
/// use gpuring::shm::fdpass::MAX_FDS;
///
/// assert!(MAX_FDS >= 1);
/// ```
pub const MAX_FDS: usize = crate::format::GPU_POOLS;

/// The largest message, in bytes: a payload is at most `MAX_PAYLOAD - 1` bytes (one byte of
/// every message says whether it is an offer or a refusal).
///
/// ```
/// use gpuring::shm::fdpass::MAX_PAYLOAD;
///
/// assert_eq!(MAX_PAYLOAD, 4096);
/// ```
pub const MAX_PAYLOAD: usize = 4096;

/// How long a send to, or a receive from, a peer may block.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// The overflow uid where `/proc/sys/kernel/overflowuid` cannot be read: the kernel's
/// default.
const DEFAULT_OVERFLOW_UID: u32 = 65534;

/// At most one warning about refused peers per this long, per server.
const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(1);

/// First byte of an accepting message.
const ACCEPTED: u8 = b'A';
/// First byte of a refusal; the rest is the reason, in UTF-8.
const REFUSED: u8 = b'R';

/// `SO_PEERGROUPS` (Linux 4.13): the supplementary groups of a unix socket's peer. Neither
/// rustix nor libc exports it yet. It is 59 on the architectures listed here; parisc and sparc
/// use other numbers, and there (and on any architecture not listed) we do without groups.
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv32",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "mips",
        target_arch = "mips64",
    )
))]
const SO_PEERGROUPS: Option<libc::c_int> = Some(59);
/// `SO_PEERGROUPS` is not known to be 59 here: peers are judged by their primary gid only.
#[cfg(not(all(
    any(target_os = "linux", target_os = "android"),
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv32",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "mips",
        target_arch = "mips64",
    )
)))]
const SO_PEERGROUPS: Option<libc::c_int> = None;

/// How many supplementary groups the first `SO_PEERGROUPS` call makes room for; a peer in more
/// is asked again with the size the kernel reports.
const FIRST_GROUPS: usize = 64;

/// The fd server's address for ring `name`, instance `epoch`, in `dir`: a path in the
/// directory ([`fd_file`] names the file). Good while `dir` is open (see
/// [`unixsock::address`]).
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::fdpass::fd_address;
///
/// let dir = RingDir::open("/dev/shm")?;
/// let addr = fd_address(&dir, "cam0", 7)?;
/// let path = addr.path().unwrap();
/// assert!(path.to_str()?.starts_with("/dev/shm/.gpuring.") && path.to_str()?.ends_with(".f"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fd_address(dir: &RingDir, name: &str, epoch: u64) -> io::Result<SocketAddrUnix> {
    unixsock::address(dir, &fd_file(name, epoch))
}

/// The overflow uid: what the kernel reports for a user not mapped into the reader's user
/// namespace (read once from `/proc/sys/kernel/overflowuid`).
///
/// ```
/// let set = std::fs::read_to_string("/proc/sys/kernel/overflowuid");
/// let want = set.map_or(65534, |s| s.trim().parse().unwrap());
/// assert_eq!(gpuring::shm::fdpass::overflow_uid(), want);
/// ```
pub fn overflow_uid() -> u32 {
    static UID: OnceLock<u32> = OnceLock::new();
    *UID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/overflowuid")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_OVERFLOW_UID)
    })
}

/// The reason a peer whose uid is the overflow uid is refused, by a server and by a client.
fn unmapped(uid: u32) -> String {
    format!(
        "uid {uid} is the overflow uid: the peer's user is not mapped into this user namespace; \
         run both sides with the same host uid mapping"
    )
}

/// What the fd server learned about a peer from the kernel, as of the peer's `connect`.
///
/// ```
/// use gpuring::shm::fdpass::{Peer, PeerPolicy};
///
/// // uid 1001, primary group 1001, also in group 44 (`video` on many distributions).
/// let peer = Peer { uid: 1001, gid: 1001, groups: vec![44], pid: Some(4242) };
/// assert!(PeerPolicy::gids([44]).allows(&peer, 1000));
/// assert_eq!(peer.to_string(), "uid 1001, gid 1001, pid 4242");
/// // A peer in a pid namespace we cannot see:
/// let hidden = Peer { pid: None, ..peer };
/// assert_eq!(hidden.to_string(), "uid 1001, gid 1001, pid not visible from here");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// Its effective uid.
    pub uid: u32,
    /// Its effective (primary) gid.
    pub gid: u32,
    /// Its supplementary groups. Empty when the policy names no gids (they are not asked
    /// for then), or when the kernel could not say (before Linux 4.13).
    pub groups: Vec<u32>,
    /// Its process id as seen from the server's pid namespace, for logs only: `None` when the
    /// peer is in a pid namespace the server cannot see (the kernel reports 0 then).
    pub pid: Option<u32>,
}

/// `uid U, gid G, pid P`, or `pid not visible from here`.
impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {}, gid {}, ", self.uid, self.gid)?;
        match self.pid {
            Some(pid) => write!(f, "pid {pid}"),
            None => f.write_str("pid not visible from here"),
        }
    }
}

/// Which peers may receive the fds, judged by the uid and groups the kernel reports for them.
/// The server's own uid is always allowed. Under every policy but [`PeerPolicy::AnyUid`], a
/// peer whose uid reads as the overflow uid ([`overflow_uid`]: its user is not mapped into the
/// server's user namespace) is refused before the policy is asked, even if the policy, or the
/// server's own uid, names that uid: it stands for every unmapped user.
///
/// ```
/// use gpuring::shm::fdpass::PeerPolicy;
///
/// // Only our own uid, the default:
/// assert_eq!(PeerPolicy::default(), PeerPolicy::SameUid);
/// // Also uid 1001, and anyone in group 44:
/// let policy = PeerPolicy::Allow { uids: vec![1001], gids: vec![44] };
/// assert_eq!(policy.to_string(), "the producer's uid, uids [1001] or gids [44]");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PeerPolicy {
    /// Only processes of the server's own uid (the default).
    #[default]
    SameUid,
    /// Processes of the server's own uid, of one of `uids`, or in one of `gids` (the peer's
    /// primary group or one of its supplementary groups).
    Allow {
        /// Uids allowed besides the server's own.
        uids: Vec<u32>,
        /// Groups whose members are allowed.
        gids: Vec<u32>,
    },
    /// Any process that can reach the socket. Only for machines where every local user is
    /// trusted with the ring's memory.
    AnyUid,
}

impl PeerPolicy {
    /// Our own uid and `uids`: [`PeerPolicy::Allow`] with no gids.
    ///
    /// ```
    /// use gpuring::shm::fdpass::PeerPolicy;
    ///
    /// assert_eq!(
    ///     PeerPolicy::uids([1001, 1002]),
    ///     PeerPolicy::Allow { uids: vec![1001, 1002], gids: vec![] }
    /// );
    /// ```
    pub fn uids(uids: impl IntoIterator<Item = u32>) -> PeerPolicy {
        PeerPolicy::Allow { uids: uids.into_iter().collect(), gids: Vec::new() }
    }

    /// Our own uid and members of `gids`: [`PeerPolicy::Allow`] with no extra uids.
    ///
    /// ```
    /// use gpuring::shm::fdpass::PeerPolicy;
    ///
    /// assert_eq!(PeerPolicy::gids([44]), PeerPolicy::Allow { uids: vec![], gids: vec![44] });
    /// ```
    pub fn gids(gids: impl IntoIterator<Item = u32>) -> PeerPolicy {
        PeerPolicy::Allow { uids: Vec::new(), gids: gids.into_iter().collect() }
    }

    /// Whether `peer` is served by a server running as `own_uid`. A gid matches the peer's
    /// primary gid or any of its supplementary groups.
    ///
    /// ```
    /// use gpuring::shm::fdpass::{Peer, PeerPolicy};
    ///
    /// let peer = Peer { uid: 1001, gid: 1001, groups: vec![44], pid: Some(4242) };
    /// assert!(!PeerPolicy::SameUid.allows(&peer, 1000));
    /// assert!(PeerPolicy::SameUid.allows(&peer, 1001)); // our own uid, always
    /// assert!(PeerPolicy::uids([1001]).allows(&peer, 1000));
    /// assert!(PeerPolicy::gids([44]).allows(&peer, 1000)); // a supplementary group
    /// assert!(!PeerPolicy::gids([27]).allows(&peer, 1000));
    /// assert!(PeerPolicy::AnyUid.allows(&peer, 1000));
    /// ```
    pub fn allows(&self, peer: &Peer, own_uid: u32) -> bool {
        if peer.uid == own_uid {
            return true;
        }
        match self {
            PeerPolicy::SameUid => false,
            PeerPolicy::Allow { uids, gids } => {
                uids.contains(&peer.uid)
                    || gids.iter().any(|g| *g == peer.gid || peer.groups.contains(g))
            }
            PeerPolicy::AnyUid => true,
        }
    }

    /// Whether deciding needs the peer's supplementary groups: only then are they asked for.
    fn needs_groups(&self) -> bool {
        matches!(self, PeerPolicy::Allow { gids, .. } if !gids.is_empty())
    }
}

/// Names the policy for people: `same uid as the producer`, `the producer's uid, uids [1000,
/// 1001] or gids [44]`, `any uid`.
impl fmt::Display for PeerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerPolicy::SameUid => f.write_str("same uid as the producer"),
            PeerPolicy::Allow { uids, gids } => {
                f.write_str("the producer's uid")?;
                match (uids.is_empty(), gids.is_empty()) {
                    (true, true) => Ok(()),
                    (false, true) => write!(f, " or uids {uids:?}"),
                    (true, false) => write!(f, " or gids {gids:?}"),
                    (false, false) => write!(f, ", uids {uids:?} or gids {gids:?}"),
                }
            }
            PeerPolicy::AnyUid => f.write_str("any uid"),
        }
    }
}

/// The serving side: a listening socket, its file in the ring directory, and the thread that
/// answers it. Dropping it stops the thread, closes the fds it holds and removes the socket
/// file (unless another server was bound at the same name since).
///
/// ```
/// use std::os::fd::OwnedFd;
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};
/// use gpuring::shm::unixsock::fd_file;
///
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let (name, epoch) = ("doc-fdserver", u64::from(std::process::id()));
/// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
/// let server = FdServer::start(
///     &dir, &fd_file(name, epoch), 0o600, vec![fd], b"hello".to_vec(), PeerPolicy::SameUid,
/// )?;
/// let addr = fd_address(&dir, name, epoch)?;
/// let (payload, fds) = fetch(&addr)?; // we have the server's uid, so we are served
/// assert_eq!((payload.as_slice(), fds.len()), (&b"hello"[..], 1));
/// drop(server); // stops serving, removes the file
/// assert!(fetch(&addr).is_err());
/// assert!(!dir.display(&fd_file(name, epoch)).exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FdServer {
    listener: Arc<OwnedFd>,
    state: Arc<ServerState>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The socket's file, removed on drop (after the thread stopped: fields drop after `drop`).
    file: SocketFile,
}

/// How many peers an [`FdServer`] answered, and how: see [`FdServer::counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounts {
    /// Peers it decided to send the offer (counted before the send, so a peer that has its
    /// answer finds itself counted).
    pub served: u64,
    /// Peers it decided to refuse (counted before the refusal is sent).
    pub refused: u64,
    /// Peers (served or refused) whose pid the kernel could not give: they are in a pid
    /// namespace the server cannot see.
    pub pid_not_visible: u64,
}

/// The counters behind [`PeerCounts`]. Relaxed (every access): plain statistics, ordered with
/// nothing else.
#[derive(Debug, Default)]
struct Counters {
    served: AtomicU64,
    refused: AtomicU64,
    pid_not_visible: AtomicU64,
}

/// The rate limit of refusal warnings: at most one per [`REFUSAL_WARN_EVERY`], saying how many
/// were left out since the last. Only the serving thread uses it.
#[derive(Debug, Default)]
struct RefusalLog {
    /// When the last warning was written.
    last: Option<Instant>,
    /// Refusals not warned about since then.
    suppressed: u64,
}

impl RefusalLog {
    /// Notes a refusal at `now`. `Some(n)`: warn now, `n` refusals were left out since the last
    /// warning. `None`: stay quiet (counted).
    fn note(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.duration_since(last) < REFUSAL_WARN_EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// What the serving thread shares with its [`FdServer`].
#[derive(Debug)]
struct ServerState {
    policy: PeerPolicy,
    /// The effective uid the server runs as (what the kernel reports to its peers); always
    /// allowed.
    own_uid: u32,
    /// The uid an unmapped peer reads as ([`overflow_uid`]); refused.
    overflow_uid: u32,
    counters: Counters,
    /// What an accepted peer gets; [`FdServer::set_offer`] replaces it.
    ///
    /// The serving thread clones the `Arc` under the lock and sends outside it, rather than
    /// holding the lock for the whole answer: so `set_offer` (on the producer's `register`
    /// path) never waits on a slow peer, which could take up to `PEER_TIMEOUT`, and no fd is
    /// dup'd per peer. The fds of a replaced offer close when the last answer still sending
    /// them drops its `Arc`.
    offer: Mutex<Arc<Offer>>,
}

/// The fds and payload an accepted peer gets.
#[derive(Debug)]
struct Offer {
    fds: Vec<OwnedFd>,
    payload: Vec<u8>,
}

impl Offer {
    /// Checks the limits a message has room for.
    fn new(fds: Vec<OwnedFd>, payload: Vec<u8>) -> io::Result<Offer> {
        if fds.len() > MAX_FDS || payload.len() >= MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "an fd offer holds at most {MAX_FDS} fds and {} payload bytes, not {} and {}",
                    MAX_PAYLOAD - 1,
                    fds.len(),
                    payload.len()
                ),
            ));
        }
        Ok(Offer { fds, payload })
    }
}

impl ServerState {
    /// A server's state, as `own_uid`, offering `offer` to the peers `policy` allows.
    fn new(policy: PeerPolicy, own_uid: u32, offer: Offer) -> ServerState {
        ServerState {
            policy,
            own_uid,
            overflow_uid: overflow_uid(),
            counters: Counters::default(),
            offer: Mutex::new(Arc::new(offer)),
        }
    }

    /// The offer as it is now.
    fn offer(&self) -> Arc<Offer> {
        // A poisoned lock still holds a whole value (the only write is one `Arc` swap), so
        // take it.
        self.offer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the offer, returning the old one (dropped by the caller, outside the lock).
    fn replace_offer(&self, offer: Offer) -> Arc<Offer> {
        let mut current = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *current, Arc::new(offer))
    }
}

impl FdServer {
    /// Binds a socket at `file` in `dir` (normally [`fd_file`] of the ring), for the users
    /// that ring mode `ring_mode` lets use the ring ([`socket_mode`]), and serves `fds` (at
    /// most [`MAX_FDS`]) with `payload` (at most [`MAX_PAYLOAD`] - 1 bytes) to every peer
    /// `policy` allows. A socket file already at `file` (a killed producer's, or another's) is
    /// replaced ([`bind_in`]). Fails with `InvalidInput` past those limits.
    ///
    /// ```
    /// use std::os::fd::OwnedFd;
    /// use gpuring::shm::dir::RingDir;
    /// use gpuring::shm::fdpass::{FdServer, PeerPolicy, MAX_PAYLOAD};
    /// use gpuring::shm::unixsock::fd_file;
    ///
    /// let dir = RingDir::open(std::env::temp_dir())?;
    /// let file = fd_file("doc-start", std::process::id().into());
    /// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
    /// let _server = FdServer::start(&dir, &file, 0o660, vec![fd], b"pools".to_vec(), PeerPolicy::gids([44]))?;
    /// // The group may connect too.
    /// assert_eq!(std::fs::metadata(dir.display(&file))?.permissions().mode() & 0o777, 0o660);
    /// # use std::os::unix::fs::PermissionsExt;
    /// // Too large a payload.
    /// let other = fd_file("doc-start-2", std::process::id().into());
    /// let big = FdServer::start(&dir, &other, 0o600, vec![], vec![0; MAX_PAYLOAD], PeerPolicy::SameUid);
    /// assert_eq!(big.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(
        dir: &RingDir,
        file: &str,
        ring_mode: u32,
        fds: Vec<OwnedFd>,
        payload: Vec<u8>,
        policy: PeerPolicy,
    ) -> io::Result<FdServer> {
        let offer = Offer::new(fds, payload)?;
        let listener =
            socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        let file = bind_in(dir, file, &listener, socket_mode(ring_mode))?;
        listen(&listener, 64)?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let own_uid = rustix::process::geteuid().as_raw();
        let state = Arc::new(ServerState::new(policy, own_uid, offer));
        let thread = std::thread::Builder::new().name("gpuring-fds".into()).spawn({
            let (listener, stop, state) = (listener.clone(), stop.clone(), state.clone());
            move || serve(&listener, &stop, &state)
        })?;
        Ok(FdServer { listener, state, stop, thread: Some(thread), file })
    }

    /// Its socket file's name in the ring directory.
    pub fn file(&self) -> &str {
        self.file.file()
    }

    /// How many peers it has served and refused so far, and of how many the kernel could not
    /// give the pid (peers in a pid namespace this process cannot see, as in another
    /// container).
    pub fn counts(&self) -> PeerCounts {
        let c = &self.state.counters;
        PeerCounts {
            served: c.served.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            pid_not_visible: c.pid_not_visible.load(Ordering::Relaxed),
        }
    }

    /// Replaces what accepted peers get: from when this returns, every peer that connects gets
    /// `fds` and `payload` (peers already being answered may still get the old offer). Same
    /// limits as [`FdServer::start`]; past them it fails with `InvalidInput` and the old offer
    /// stays. The producer calls this before it marks a new pool live in shared memory, so a
    /// consumer that sees the pool and connects afterwards receives its fd.
    ///
    /// ```
    /// use std::os::fd::OwnedFd;
    /// use gpuring::shm::dir::RingDir;
    /// use gpuring::shm::fdpass::{fetch, FdServer, PeerPolicy};
    /// use gpuring::shm::unixsock::fd_file;
    ///
    /// let dir = RingDir::open(std::env::temp_dir())?;
    /// let file = fd_file("doc-set-offer", std::process::id().into());
    /// let server =
    ///     FdServer::start(&dir, &file, 0o600, vec![], b"no pools yet".to_vec(), PeerPolicy::SameUid)?;
    /// let addr = gpuring::shm::unixsock::address(&dir, &file)?;
    /// let null = || std::fs::File::open("/dev/null").map(OwnedFd::from);
    /// server.set_offer(vec![null()?, null()?], b"two pools".to_vec())?;
    /// let (payload, fds) = fetch(&addr)?;
    /// assert_eq!((payload.as_slice(), fds.len()), (&b"two pools"[..], 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_offer(&self, fds: Vec<OwnedFd>, payload: Vec<u8>) -> io::Result<()> {
        let old = self.state.replace_offer(Offer::new(fds, payload)?);
        // Closes the old fds, unless an answer in flight still holds them.
        drop(old);
        Ok(())
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        // Relaxed: the join below orders everything; the flag only tells the thread that the
        // accept error it is about to see is the end, not a hiccup.
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the thread's blocked accept (Linux returns EINVAL from then on).
        let _ = shutdown(&*self.listener, Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &OwnedFd, stop: &AtomicBool, state: &ServerState) {
    let mut log = RefusalLog::default();
    loop {
        match accept_with(listener, SocketFlags::CLOEXEC) {
            Ok(peer) => {
                if let Err(e) = answer(&peer, state, &mut log) {
                    tracing::debug!(error = %e, "fd server: a peer went away mid-answer");
                }
            }
            Err(Errno::INTR) | Err(Errno::CONNABORTED) => {}
            Err(_) if stop.load(Ordering::Relaxed) => return,
            Err(e) => {
                // Out of fds or memory: try again shortly rather than spin.
                tracing::warn!(error = %e, "fd server: accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Checks who `peer` is and sends it the offer, or a refusal (warned about through `log`).
fn answer(peer: &OwnedFd, state: &ServerState, log: &mut RefusalLog) -> io::Result<()> {
    sockopt::set_socket_timeout(peer, sockopt::Timeout::Send, Some(PEER_TIMEOUT))?;
    let who = peer_of(peer, state.policy.needs_groups())?;
    let counters = &state.counters;
    if who.pid.is_none() {
        counters.pid_not_visible.fetch_add(1, Ordering::Relaxed);
    }
    let unmapped_peer = who.uid == state.overflow_uid && state.policy != PeerPolicy::AnyUid;
    if unmapped_peer || !state.policy.allows(&who, state.own_uid) {
        let reason = if unmapped_peer {
            unmapped(who.uid)
        } else {
            refusal(&who, &state.policy, state.own_uid)
        };
        if let Some(suppressed) = log.note(Instant::now()) {
            tracing::warn!(peer = %who, suppressed, %reason, "fd server: refused a peer");
        }
        counters.refused.fetch_add(1, Ordering::Relaxed);
        let mut msg = vec![REFUSED];
        msg.extend_from_slice(reason.as_bytes());
        return send(peer, &msg, &[]);
    }
    // Taken after the peer was accepted, so a peer that connected after `set_offer` returned
    // gets the new offer.
    let offer = state.offer();
    let mut msg = Vec::with_capacity(1 + offer.payload.len());
    msg.push(ACCEPTED);
    msg.extend_from_slice(&offer.payload);
    let fds: Vec<BorrowedFd<'_>> = offer.fds.iter().map(|f| f.as_fd()).collect();
    counters.served.fetch_add(1, Ordering::Relaxed);
    send(peer, &msg, &fds)
}

/// The reason a refused peer is sent.
fn refusal(peer: &Peer, policy: &PeerPolicy, own_uid: u32) -> String {
    format!(
        "uid {} (gid {}) is not allowed by the producer's peer policy: {policy} (producer uid \
         {own_uid})",
        peer.uid, peer.gid
    )
}

/// What the kernel says about the process at the other end of `peer`, with its supplementary
/// groups if `with_groups`.
fn peer_of(peer: &OwnedFd, with_groups: bool) -> io::Result<Peer> {
    let cred = peer_cred(peer.as_fd())?;
    let (uid, gid) = (cred.uid, cred.gid);
    let groups = if with_groups {
        peer_groups(peer.as_fd()).unwrap_or_else(|e| {
            tracing::debug!(
                error = %e,
                uid,
                "fd server: cannot read a peer's supplementary groups; judging it by its \
                 primary gid only"
            );
            Vec::new()
        })
    } else {
        Vec::new()
    };
    Ok(Peer { uid, gid, groups, pid: u32::try_from(cred.pid).ok().filter(|p| *p != 0) })
}

/// `SO_PEERCRED` of the connected unix socket `socket`: the pid, uid and gid of its peer as of
/// `connect` (or, for a client's socket, of the server's `listen`), translated into our
/// namespaces. The pid is 0 when the peer is in a pid namespace we cannot see, so this reads
/// into `libc::ucred` (plain integers), never into a type that forbids 0.
fn peer_cred(socket: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let size = std::mem::size_of::<libc::ucred>();
    let mut len = size as libc::socklen_t;
    // SAFETY: `socket` is open throughout; the kernel writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short SO_PEERCRED"));
    }
    Ok(cred)
}

/// The supplementary groups of the peer of the connected unix socket `socket`
/// (`SO_PEERGROUPS`). `Unsupported` where we do not know the option's number; the kernel's
/// error (`ENOPROTOOPT` before Linux 4.13) otherwise.
fn peer_groups(socket: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let Some(option) = SO_PEERGROUPS else {
        return Err(io::ErrorKind::Unsupported.into());
    };
    const GID: usize = std::mem::size_of::<libc::gid_t>();
    let mut groups: Vec<libc::gid_t> = vec![0; FIRST_GROUPS];
    // The groups were fixed at `connect`, so the size the kernel reports after a first
    // ERANGE fits the second call.
    for _ in 0..2 {
        let mut len = libc::socklen_t::try_from(groups.len() * GID)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "too many groups"))?;
        // SAFETY: `socket` is an open fd for the whole call; `groups` is a writable buffer of
        // `len` bytes, the kernel writes at most `len` bytes to it and the size to `len`.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let len = len as usize;
        if rc == 0 {
            groups.truncate(len / GID);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) || len <= groups.len() * GID {
            return Err(err);
        }
        groups.resize(len.div_ceil(GID), 0);
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "the peer's group list kept growing"))
}

fn send(peer: &OwnedFd, msg: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let sent = sendmsg(peer, &[io::IoSlice::new(msg)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != msg.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Why [`fetch`] got no fds.
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::fdpass::{fd_address, fetch, FetchError};
///
/// // Nobody serves this address.
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let addr = fd_address(&dir, "doc-no-such-ring", std::process::id().into())?;
/// match fetch(&addr) {
///     Err(FetchError::Unreachable(e)) => println!("no producer: {e}"),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub enum FetchError {
    /// Nothing listens at the address: no such producer, it has no fd server, or it is in
    /// another network namespace.
    Unreachable(io::Error),
    /// The producer refused us; its reason.
    Refused(String),
    /// The answer is not what a gpuring fd server sends.
    Protocol(&'static str),
    /// The server does not run as the ring's owner ([`fetch_from`]): the kernel says it runs
    /// as `uid`, the segment belongs to `owner`. Also when `uid` is the overflow uid, which
    /// stands for every user not mapped into our user namespace.
    NotOwner {
        /// The server's uid, as the kernel reports it to us.
        uid: u32,
        /// The uid that owns the ring's segment.
        owner: u32,
    },
    /// The connection failed or timed out.
    Io(io::Error),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Unreachable(e) => write!(f, "cannot reach the producer's fd socket: {e}"),
            FetchError::Refused(why) => {
                write!(f, "the producer refused to share its memory: {why}")
            }
            FetchError::Protocol(what) => write!(f, "unexpected answer from the fd socket: {what}"),
            FetchError::NotOwner { uid, .. } if *uid == overflow_uid() => {
                write!(f, "the fd socket is not the producer's: {}", unmapped(*uid))
            }
            FetchError::NotOwner { uid, owner } => write!(
                f,
                "the fd socket is not the producer's: it runs as uid {uid}, the ring belongs to \
                 uid {owner}"
            ),
            FetchError::Io(e) => write!(f, "fetching the producer's fds: {e}"),
        }
    }
}

impl std::error::Error for FetchError {}

/// Connects to the fd server at `addr` and receives its payload and fds. The fds are
/// close-on-exec. Nothing received is trusted: the caller checks the payload, and what each
/// fd is, before use. A refused peer gets [`FetchError::Refused`] with the server's reason.
///
/// ```
/// use std::os::fd::OwnedFd;
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};
/// use gpuring::shm::unixsock::fd_file;
///
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let (name, epoch) = ("doc-fetch", u64::from(std::process::id()));
/// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
/// let _server =
///     FdServer::start(&dir, &fd_file(name, epoch), 0o600, vec![fd], b"v1".to_vec(), PeerPolicy::SameUid)?;
/// let addr = fd_address(&dir, name, epoch)?;
/// // Each fetch gets its own copies of the fds.
/// for _ in 0..2 {
///     let (payload, fds) = fetch(&addr)?;
///     assert_eq!((payload.as_slice(), fds.len()), (&b"v1"[..], 1));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fetch(addr: &SocketAddrUnix) -> Result<(Vec<u8>, Vec<OwnedFd>), FetchError> {
    fetch_checked(addr, None)
}

/// [`fetch`] from a server running as `uid` only: the kernel's record of who listens
/// (`SO_PEERCRED` of a connected client socket names the process that called `listen`, and
/// its effective uid) must say it, and it must not be the overflow uid ([`overflow_uid`]),
/// which any user not mapped into our user namespace reads as. A consumer passes the uid that
/// owns the segment, so that a process that bound the socket's name cannot hand its own memory
/// to the producer's consumers unless it runs as the segment's owner. (The pid is not
/// compared: across pid namespaces, as between containers, the kernel cannot give it.)
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::fdpass::{fd_address, fetch_from, FdServer, FetchError, PeerPolicy};
/// use gpuring::shm::unixsock::fd_file;
///
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let (name, epoch) = ("doc-fetch-from", u64::from(std::process::id()));
/// let _server =
///     FdServer::start(&dir, &fd_file(name, epoch), 0o600, vec![], b"v1".to_vec(), PeerPolicy::SameUid)?;
/// let addr = fd_address(&dir, name, epoch)?;
/// let uid = rustix::process::geteuid().as_raw();
/// assert!(fetch_from(&addr, uid).is_ok());
/// let other = uid.wrapping_add(1);
/// assert!(matches!(fetch_from(&addr, other), Err(FetchError::NotOwner { owner, .. }) if owner == other));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fetch_from(addr: &SocketAddrUnix, uid: u32) -> Result<(Vec<u8>, Vec<OwnedFd>), FetchError> {
    fetch_checked(addr, Some(uid))
}

fn fetch_checked(
    addr: &SocketAddrUnix,
    owner: Option<u32>,
) -> Result<(Vec<u8>, Vec<OwnedFd>), FetchError> {
    let socket =
        socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| FetchError::Io(e.into()))?;
    // Bounds the connect too: a stopped server's full backlog must not block an open for ever.
    sockopt::set_socket_timeout(&socket, sockopt::Timeout::Send, Some(PEER_TIMEOUT))
        .map_err(|e| FetchError::Io(e.into()))?;
    connect(&socket, addr).map_err(|e| FetchError::Unreachable(e.into()))?;
    if let Some(owner) = owner {
        let uid = peer_cred(socket.as_fd()).map_err(FetchError::Io)?.uid;
        if uid != owner || uid == overflow_uid() {
            return Err(FetchError::NotOwner { uid, owner });
        }
    }
    sockopt::set_socket_timeout(&socket, sockopt::Timeout::Recv, Some(PEER_TIMEOUT))
        .map_err(|e| FetchError::Io(e.into()))?;
    let mut buf = vec![0u8; MAX_PAYLOAD];
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        &socket,
        &mut [io::IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| FetchError::Io(e.into()))?;
    // Take ownership of whatever fds arrived, so they are closed on every error path.
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got.flags.contains(ReturnFlags::CTRUNC) || got.flags.contains(ReturnFlags::TRUNC) {
        return Err(FetchError::Protocol("more fds or bytes than a gpuring server sends"));
    }
    let msg = &buf[..got.bytes];
    match msg.split_first() {
        Some((&ACCEPTED, payload)) => Ok((payload.to_vec(), fds)),
        Some((&REFUSED, reason)) if fds.is_empty() => {
            Err(FetchError::Refused(String::from_utf8_lossy(reason).into_owned()))
        }
        _ => Err(FetchError::Protocol("no accept or refusal")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{memfd_create, MemfdFlags};
    use rustix::net::socketpair;

    fn temp() -> RingDir {
        RingDir::open(std::env::temp_dir()).unwrap()
    }

    /// The socket file of test `tag`.
    fn file(tag: &str) -> String {
        fd_file(&format!("fdpass-{tag}"), std::process::id() as u64)
    }

    fn addr(tag: &str) -> SocketAddrUnix {
        fd_address(&temp(), &format!("fdpass-{tag}"), std::process::id() as u64).unwrap()
    }

    /// A server for test `tag`.
    fn start(tag: &str, fds: Vec<OwnedFd>, payload: &[u8], policy: PeerPolicy) -> FdServer {
        FdServer::start(&temp(), &file(tag), 0o600, fds, payload.to_vec(), policy).unwrap()
    }

    fn memfd(contents: &[u8]) -> OwnedFd {
        let fd = memfd_create("gpuring-test", MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&fd, contents).unwrap();
        fd
    }

    fn contents(fd: &OwnedFd) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let n = rustix::io::pread(fd, &mut buf, 0).unwrap();
        buf[..n].to_vec()
    }

    fn our_uid() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn our_gid() -> u32 {
        rustix::process::getegid().as_raw()
    }

    /// One answer of a test server: joined to see it done; its counts.
    struct One {
        thread: std::thread::JoinHandle<PeerCounts>,
        _file: SocketFile,
    }

    impl One {
        fn join(self) -> PeerCounts {
            self.thread.join().unwrap()
        }
    }

    /// Serves one peer at test `tag`'s file, from a server that believes it runs as `own_uid`
    /// and that unmapped users read as `overflow`: a policy that leaves out our own uid cannot
    /// be written (the server's own uid is always allowed), so refusals of us are tested
    /// through a server whose recorded uid is not ours, and the overflow uid's refusal through
    /// one that takes ours for it.
    fn serve_as(tag: &str, policy: PeerPolicy, own_uid: u32, overflow: u32) -> One {
        let listener =
            socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .unwrap();
        let bound = bind_in(&temp(), &file(tag), &listener, 0o600).unwrap();
        listen(&listener, 4).unwrap();
        let offer = Offer::new(vec![memfd(b"secret")], b"p".to_vec()).unwrap();
        let mut state = ServerState::new(policy, own_uid, offer);
        state.overflow_uid = overflow;
        let thread = std::thread::spawn(move || {
            let peer = accept_with(&listener, SocketFlags::CLOEXEC).unwrap();
            answer(&peer, &state, &mut RefusalLog::default()).unwrap();
            let c = &state.counters;
            PeerCounts {
                served: c.served.load(Ordering::Relaxed),
                refused: c.refused.load(Ordering::Relaxed),
                pid_not_visible: c.pid_not_visible.load(Ordering::Relaxed),
            }
        });
        One { thread, _file: bound }
    }

    /// [`serve_as`] with the real overflow uid.
    fn serve_one(tag: &str, policy: PeerPolicy, own_uid: u32) -> One {
        serve_as(tag, policy, own_uid, overflow_uid())
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer { uid, gid, groups: groups.to_vec(), pid: Some(1) }
    }

    #[test]
    fn same_uid_allows_only_the_servers_uid() {
        assert!(PeerPolicy::SameUid.allows(&peer(1000, 1000, &[]), 1000));
        assert!(!PeerPolicy::SameUid.allows(&peer(1001, 1000, &[1000]), 1000));
    }

    #[test]
    fn allow_admits_listed_uids_and_members_of_listed_gids() {
        let uids = PeerPolicy::uids([1001, 1002]);
        assert_eq!(uids, PeerPolicy::Allow { uids: vec![1001, 1002], gids: vec![] });
        assert!(uids.allows(&peer(1002, 5, &[]), 1000));
        assert!(!uids.allows(&peer(1003, 5, &[]), 1000));

        let gids = PeerPolicy::gids([44]);
        assert_eq!(gids, PeerPolicy::Allow { uids: vec![], gids: vec![44] });
        assert!(gids.allows(&peer(1003, 44, &[]), 1000), "by primary gid");
        assert!(gids.allows(&peer(1003, 1003, &[27, 44]), 1000), "by a supplementary group");
        assert!(!gids.allows(&peer(1003, 1003, &[27]), 1000));

        let both = PeerPolicy::Allow { uids: vec![1001], gids: vec![44] };
        assert!(both.allows(&peer(1001, 1001, &[]), 1000));
        assert!(both.allows(&peer(1005, 1005, &[44]), 1000));
        assert!(!both.allows(&peer(1005, 1005, &[]), 1000));
    }

    #[test]
    fn the_servers_own_uid_is_always_allowed() {
        let own = peer(1000, 1000, &[]);
        for policy in [
            PeerPolicy::SameUid,
            PeerPolicy::uids([]),
            PeerPolicy::uids([7]),
            PeerPolicy::gids([7]),
            PeerPolicy::AnyUid,
        ] {
            assert!(policy.allows(&own, 1000), "{policy:?}");
        }
        assert!(PeerPolicy::AnyUid.allows(&peer(12345, 12345, &[]), 1000));
    }

    #[test]
    fn policies_display_plainly() {
        let shown = |p: PeerPolicy| p.to_string();
        assert_eq!(shown(PeerPolicy::SameUid), "same uid as the producer");
        assert_eq!(shown(PeerPolicy::AnyUid), "any uid");
        assert_eq!(
            shown(PeerPolicy::Allow { uids: vec![1000, 1001], gids: vec![44] }),
            "the producer's uid, uids [1000, 1001] or gids [44]"
        );
        assert_eq!(shown(PeerPolicy::uids([1000])), "the producer's uid or uids [1000]");
        assert_eq!(shown(PeerPolicy::gids([44, 45])), "the producer's uid or gids [44, 45]");
        assert_eq!(shown(PeerPolicy::uids([])), "the producer's uid");
    }

    #[test]
    fn only_a_policy_with_gids_asks_for_groups() {
        assert!(!PeerPolicy::SameUid.needs_groups());
        assert!(!PeerPolicy::AnyUid.needs_groups());
        assert!(!PeerPolicy::uids([1]).needs_groups());
        assert!(PeerPolicy::gids([1]).needs_groups());
    }

    #[test]
    fn peer_groups_are_our_supplementary_groups() {
        if SO_PEERGROUPS.is_none() {
            return;
        }
        let (a, _b) =
            socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .unwrap();
        let mut got = peer_groups(a.as_fd()).unwrap();
        let mut want: Vec<u32> =
            rustix::process::getgroups().unwrap().into_iter().map(|g| g.as_raw()).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        let who = peer_of(&a, true).unwrap();
        assert_eq!((who.uid, who.gid, who.groups.len()), (our_uid(), our_gid(), want.len()));
        assert_eq!(who.pid, Some(std::process::id()), "our own pid namespace");
        assert!(peer_of(&a, false).unwrap().groups.is_empty(), "not asked for");
    }

    #[test]
    fn a_peer_of_our_uid_receives_every_fd_and_the_payload() {
        let a = addr("same");
        let fds = vec![memfd(b"pool 0"), memfd(b"pool 1")];
        let server = start("same", fds, b"hello", PeerPolicy::SameUid);
        assert_eq!(server.file(), file("same"));
        for _ in 0..3 {
            // Each peer gets its own copies of the fds.
            let (payload, fds) = fetch(&a).unwrap();
            assert_eq!(payload, b"hello");
            assert_eq!(
                fds.iter().map(contents).collect::<Vec<_>>(),
                [b"pool 0".to_vec(), b"pool 1".to_vec()]
            );
        }
        let counts = server.counts();
        assert_eq!(counts, PeerCounts { served: 3, refused: 0, pid_not_visible: 0 });
        // The server's uid is ours, and the owner's: fetch_from takes it.
        assert_eq!(fetch_from(&a, our_uid()).unwrap().1.len(), 2);
        match fetch_from(&a, our_uid().wrapping_add(1)) {
            Err(e @ FetchError::NotOwner { .. }) => assert_eq!(
                e.to_string(),
                format!(
                    "the fd socket is not the producer's: it runs as uid {}, the ring belongs \
                     to uid {}",
                    our_uid(),
                    our_uid().wrapping_add(1)
                )
            ),
            other => panic!("expected NotOwner, got {other:?}"),
        }
        drop(server);
        assert!(matches!(fetch(&a), Err(FetchError::Unreachable(_))), "stopped on drop");
        assert!(!temp().display(&file("same")).exists(), "its file removed on drop");
    }

    #[test]
    fn a_server_replaces_a_killed_servers_socket_file() {
        let a = addr("stale");
        {
            // A socket bound at the name whose process is gone: its file stays.
            let dead =
                socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                    .unwrap();
            rustix::net::bind(&dead, &a).unwrap();
        }
        assert!(matches!(fetch(&a), Err(FetchError::Unreachable(_))));
        let _server = start("stale", vec![memfd(b"x")], b"new", PeerPolicy::SameUid);
        assert_eq!(fetch(&a).unwrap().0, b"new");
    }

    #[test]
    fn set_offer_changes_what_later_peers_get() {
        let a = addr("set-offer");
        let server = start("set-offer", vec![memfd(b"pool 0")], b"v1", PeerPolicy::SameUid);
        let (payload, fds) = fetch(&a).unwrap();
        assert_eq!(
            (payload, fds.iter().map(contents).collect::<Vec<_>>()),
            (b"v1".to_vec(), vec![b"pool 0".to_vec()])
        );
        server.set_offer(vec![memfd(b"pool 0"), memfd(b"pool 1")], b"v2".to_vec()).unwrap();
        let (payload, fds) = fetch(&a).unwrap();
        assert_eq!(payload, b"v2");
        assert_eq!(
            fds.iter().map(contents).collect::<Vec<_>>(),
            [b"pool 0".to_vec(), b"pool 1".to_vec()]
        );
        // A fd received before the change stays usable: it is the peer's own.
        drop(fds);

        let too_many = (0..=MAX_FDS).map(|_| memfd(b"x")).collect();
        let err = server.set_offer(too_many, b"v3".to_vec()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = server.set_offer(vec![], vec![0; MAX_PAYLOAD]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        // The largest payload fits.
        server.set_offer(vec![], vec![7; MAX_PAYLOAD - 1]).unwrap();
        let (payload, fds) = fetch(&a).unwrap();
        assert_eq!((payload.len(), fds.len()), (MAX_PAYLOAD - 1, 0));
    }

    #[test]
    fn a_peer_the_policy_excludes_gets_a_refusal_and_no_fd() {
        let a = addr("refused");
        let (own, gid) = (our_uid(), our_gid());
        let t = serve_one("refused", PeerPolicy::SameUid, own.wrapping_add(1));
        match fetch(&a) {
            Err(FetchError::Refused(why)) => assert_eq!(
                why,
                format!(
                    "uid {own} (gid {gid}) is not allowed by the producer's peer policy: same \
                     uid as the producer (producer uid {})",
                    own.wrapping_add(1)
                )
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let counts = t.join();
        assert_eq!(counts, PeerCounts { served: 0, refused: 1, pid_not_visible: 0 });
    }

    #[test]
    fn a_peer_with_the_overflow_uid_is_refused_unless_any_uid_is_allowed() {
        // A server that takes our uid for the overflow uid, as it would read an unmapped
        // peer's; even its own uid (ours) does not let that peer in.
        let own = our_uid();
        for policy in [PeerPolicy::SameUid, PeerPolicy::uids([own]), PeerPolicy::gids([our_gid()])]
        {
            let a = addr("overflow");
            let t = serve_as("overflow", policy.clone(), own, own);
            match fetch(&a) {
                Err(FetchError::Refused(why)) => assert_eq!(
                    why,
                    format!(
                        "uid {own} is the overflow uid: the peer's user is not mapped into this \
                         user namespace; run both sides with the same host uid mapping"
                    ),
                    "{policy:?}"
                ),
                other => panic!("{policy:?}: expected a refusal, got {other:?}"),
            }
            assert_eq!(t.join().refused, 1);
        }
        let a = addr("overflow-any");
        let t = serve_as("overflow-any", PeerPolicy::AnyUid, own.wrapping_add(1), own);
        assert_eq!(fetch(&a).unwrap().1.len(), 1, "any uid means any");
        assert_eq!(t.join().served, 1);
    }

    #[test]
    fn refusal_warnings_are_one_a_second_with_a_count_of_the_rest() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(log.note(t0), Some(0), "the first is warned about");
        for ms in [1, 500, 999] {
            assert_eq!(log.note(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(log.note(t0 + Duration::from_millis(1000)), Some(3), "three left out");
        assert_eq!(log.note(t0 + Duration::from_millis(1500)), None);
        assert_eq!(log.note(t0 + Duration::from_millis(2001)), Some(1));
        assert_eq!(log.note(t0 + Duration::from_secs(60)), Some(0));
    }

    #[test]
    fn not_owner_names_the_overflow_uid() {
        let uid = overflow_uid();
        let e = FetchError::NotOwner { uid, owner: uid };
        assert_eq!(
            e.to_string(),
            format!(
                "the fd socket is not the producer's: uid {uid} is the overflow uid: the peer's \
                 user is not mapped into this user namespace; run both sides with the same host \
                 uid mapping"
            )
        );
    }

    #[test]
    fn a_peer_in_an_allowed_group_is_served_and_one_outside_refused() {
        let (other_uid, gid) = (our_uid().wrapping_add(1), our_gid());
        let a = addr("gid-in");
        let t = serve_one("gid-in", PeerPolicy::gids([gid]), other_uid);
        let (payload, fds) = fetch(&a).unwrap();
        assert_eq!(
            (payload, fds.iter().map(contents).collect::<Vec<_>>()),
            (b"p".to_vec(), vec![b"secret".to_vec()])
        );
        assert_eq!(t.join().served, 1);

        // By a supplementary group, when we have one besides the primary gid.
        let groups: Vec<u32> =
            rustix::process::getgroups().unwrap().into_iter().map(|g| g.as_raw()).collect();
        if let Some(&extra) = groups.iter().find(|g| **g != gid) {
            if SO_PEERGROUPS.is_some() {
                let a = addr("gid-supplementary");
                let t = serve_one("gid-supplementary", PeerPolicy::gids([extra]), other_uid);
                assert_eq!(fetch(&a).unwrap().1.len(), 1, "by supplementary group {extra}");
                assert_eq!(t.join().served, 1);
            }
        }

        let not_ours = (1..).map(|n| u32::MAX - n).find(|g| *g != gid && !groups.contains(g));
        let not_ours = not_ours.unwrap();
        let a = addr("gid-out");
        let t = serve_one("gid-out", PeerPolicy::gids([not_ours]), other_uid);
        match fetch(&a) {
            Err(FetchError::Refused(why)) => {
                assert!(why.contains(&format!("(gid {gid})")), "{why}");
                assert!(why.contains(&format!("or gids [{not_ours}]")), "{why}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(t.join().refused, 1);
    }

    #[test]
    fn nobody_listening_is_unreachable() {
        assert!(matches!(fetch(&addr("absent")), Err(FetchError::Unreachable(_))));
    }
}
