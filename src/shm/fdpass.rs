//! Handing file descriptors to peers: the producer owns a unix `SOCK_SEQPACKET` socket in the
//! abstract namespace, at `gpuring/EPOCH/HASH/f` ([`fd_address`]), and serves every peer that
//! connects one message: a payload and the fds it shares (`SCM_RIGHTS`). Before it sends
//! anything it asks the kernel who the peer is (`SO_PEERCRED` for its uid and gid and, when the
//! policy names groups, `SO_PEERGROUPS` for its supplementary groups; both are recorded at
//! `connect`, so a peer cannot forge them) and checks that against a [`PeerPolicy`]; a refused
//! peer gets a refusal and no fd. The CUDA VMM memory mode shares its pools this way, since
//! their shareable handles are fds (`docs/security.md`).
//!
//! One message per connection, on a seqpacket socket, so message boundaries hold and a peer
//! that connects and never reads costs the server one bounded send. The server runs on a
//! thread of its own, so peers are served while the producer's thread is busy. What it hands
//! out can be replaced while it runs ([`FdServer::set_offer`]): the producer adds pools after
//! it started.
//!
//! Abstract names are per network namespace, as for the doorbells: a peer in another one
//! cannot connect.

use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{
    accept_with, bind, connect, listen, recvmsg, sendmsg, shutdown, socket_with, sockopt,
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags,
    SocketType,
};

use super::doorbell::base;

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

/// The fd server's address for ring `name`, instance `epoch`.
///
/// ```
/// use gpuring::shm::fdpass::fd_address;
///
/// let addr = fd_address("cam0", 7)?;
/// // An abstract name: no file appears anywhere.
/// assert!(addr.abstract_name().is_some());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn fd_address(name: &str, epoch: u64) -> io::Result<SocketAddrUnix> {
    Ok(SocketAddrUnix::new_abstract_name(format!("{}/f", base(name, epoch)).as_bytes())?)
}

/// What the fd server learned about a peer from the kernel, as of the peer's `connect`.
///
/// ```
/// use gpuring::shm::fdpass::{Peer, PeerPolicy};
///
/// // uid 1001, primary group 1001, also in group 44 (`video` on many distributions).
/// let peer = Peer { uid: 1001, gid: 1001, groups: vec![44], pid: 4242 };
/// assert!(PeerPolicy::gids([44]).allows(&peer, 1000));
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
    /// Its process id, as seen from the server's pid namespace; for logs only.
    pub pid: i32,
}

/// Which peers may receive the fds, judged by the uid and groups the kernel reports for them.
/// The server's own uid is always allowed.
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
    /// let peer = Peer { uid: 1001, gid: 1001, groups: vec![44], pid: 4242 };
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

/// The serving side: a listening socket and the thread that answers it. Dropping it stops the
/// thread and closes the fds it holds.
///
/// ```
/// use std::os::fd::OwnedFd;
/// use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};
///
/// let addr = fd_address("doc-fdserver", std::process::id().into())?;
/// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
/// let server = FdServer::start(&addr, vec![fd], b"hello".to_vec(), PeerPolicy::SameUid)?;
/// let (payload, fds) = fetch(&addr)?; // we have the server's uid, so we are served
/// assert_eq!((payload.as_slice(), fds.len()), (&b"hello"[..], 1));
/// drop(server); // stops serving
/// assert!(fetch(&addr).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FdServer {
    listener: Arc<OwnedFd>,
    state: Arc<ServerState>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the serving thread shares with its [`FdServer`].
#[derive(Debug)]
struct ServerState {
    policy: PeerPolicy,
    /// The uid the server runs as; always allowed.
    own_uid: u32,
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
    /// Binds `addr` and serves `fds` (at most [`MAX_FDS`]) with `payload` (at most
    /// [`MAX_PAYLOAD`] - 1 bytes) to every peer `policy` allows. Fails with `InvalidInput` past
    /// those limits, and with `AddrInUse` if another socket has the address.
    ///
    /// ```
    /// use std::os::fd::OwnedFd;
    /// use gpuring::shm::fdpass::{fd_address, FdServer, PeerPolicy, MAX_PAYLOAD};
    ///
    /// let addr = fd_address("doc-start", std::process::id().into())?;
    /// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
    /// let _server = FdServer::start(&addr, vec![fd], b"pools".to_vec(), PeerPolicy::gids([44]))?;
    /// // One address, one server.
    /// let again = FdServer::start(&addr, vec![], vec![], PeerPolicy::SameUid);
    /// assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    /// // Too large a payload.
    /// let other = fd_address("doc-start-2", std::process::id().into())?;
    /// let big = FdServer::start(&other, vec![], vec![0; MAX_PAYLOAD], PeerPolicy::SameUid);
    /// assert_eq!(big.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(
        addr: &SocketAddrUnix,
        fds: Vec<OwnedFd>,
        payload: Vec<u8>,
        policy: PeerPolicy,
    ) -> io::Result<FdServer> {
        let offer = Offer::new(fds, payload)?;
        let listener =
            socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        bind(&listener, addr)?;
        listen(&listener, 64)?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(ServerState {
            policy,
            own_uid: rustix::process::getuid().as_raw(),
            offer: Mutex::new(Arc::new(offer)),
        });
        let thread = std::thread::Builder::new().name("gpuring-fds".into()).spawn({
            let (listener, stop, state) = (listener.clone(), stop.clone(), state.clone());
            move || serve(&listener, &stop, &state)
        })?;
        Ok(FdServer { listener, state, stop, thread: Some(thread) })
    }

    /// Replaces what accepted peers get: from when this returns, every peer that connects gets
    /// `fds` and `payload` (peers already being answered may still get the old offer). Same
    /// limits as [`FdServer::start`]; past them it fails with `InvalidInput` and the old offer
    /// stays. The producer calls this before it marks a new pool live in shared memory, so a
    /// consumer that sees the pool and connects afterwards receives its fd.
    ///
    /// ```
    /// use std::os::fd::OwnedFd;
    /// use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};
    ///
    /// let addr = fd_address("doc-set-offer", std::process::id().into())?;
    /// let server = FdServer::start(&addr, vec![], b"no pools yet".to_vec(), PeerPolicy::SameUid)?;
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
    loop {
        match accept_with(listener, SocketFlags::CLOEXEC) {
            Ok(peer) => {
                if let Err(e) = answer(&peer, state) {
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

/// Checks who `peer` is and sends it the offer, or a refusal.
fn answer(peer: &OwnedFd, state: &ServerState) -> io::Result<()> {
    sockopt::set_socket_timeout(peer, sockopt::Timeout::Send, Some(PEER_TIMEOUT))?;
    let who = peer_of(peer, state.policy.needs_groups())?;
    if !state.policy.allows(&who, state.own_uid) {
        tracing::warn!(uid = who.uid, gid = who.gid, pid = who.pid, "fd server: refused a peer");
        let reason = refusal(&who, &state.policy, state.own_uid);
        let mut msg = vec![REFUSED];
        msg.extend_from_slice(reason.as_bytes());
        send(peer, &msg, &[])?;
        return Ok(());
    }
    // Taken after the peer was accepted, so a peer that connected after `set_offer` returned
    // gets the new offer.
    let offer = state.offer();
    let mut msg = Vec::with_capacity(1 + offer.payload.len());
    msg.push(ACCEPTED);
    msg.extend_from_slice(&offer.payload);
    let fds: Vec<BorrowedFd<'_>> = offer.fds.iter().map(|f| f.as_fd()).collect();
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
    let cred = sockopt::socket_peercred(peer)?;
    let (uid, gid) = (cred.uid.as_raw(), cred.gid.as_raw());
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
    Ok(Peer { uid, gid, groups, pid: cred.pid.as_raw_nonzero().get() })
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
/// use gpuring::shm::fdpass::{fd_address, fetch, FetchError};
///
/// // Nobody serves this address.
/// let addr = fd_address("doc-no-such-ring", std::process::id().into())?;
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
/// use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};
///
/// let addr = fd_address("doc-fetch", std::process::id().into())?;
/// let fd = OwnedFd::from(std::fs::File::open("/dev/null")?);
/// let _server = FdServer::start(&addr, vec![fd], b"v1".to_vec(), PeerPolicy::SameUid)?;
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

/// [`fetch`] from the server of process `pid`, running as `uid`, only: the kernel's record of
/// who listens (`SO_PEERCRED` of a connected client socket names the process that called
/// `listen`, and its uid) must say both. A consumer passes the producer's pid and the uid that
/// owns the segment, so that a process that bound a dead producer's address, or that rewrote
/// the pid in a segment it can write, cannot hand its own memory to the producer's consumers
/// unless it runs as the segment's owner.
///
/// ```
/// use gpuring::shm::fdpass::{fd_address, fetch_from, FdServer, FetchError, PeerPolicy};
///
/// let addr = fd_address("doc-fetch-from", 1)?;
/// let _server = FdServer::start(&addr, vec![], b"v1".to_vec(), PeerPolicy::SameUid)?;
/// let uid = rustix::process::getuid().as_raw();
/// assert!(fetch_from(&addr, std::process::id(), uid).is_ok());
/// assert!(matches!(fetch_from(&addr, 1, uid), Err(FetchError::Protocol(_))));
/// assert!(matches!(fetch_from(&addr, std::process::id(), uid + 1), Err(FetchError::Protocol(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fetch_from(
    addr: &SocketAddrUnix,
    pid: u32,
    uid: u32,
) -> Result<(Vec<u8>, Vec<OwnedFd>), FetchError> {
    fetch_checked(addr, Some((pid, uid)))
}

fn fetch_checked(
    addr: &SocketAddrUnix,
    server: Option<(u32, u32)>,
) -> Result<(Vec<u8>, Vec<OwnedFd>), FetchError> {
    let socket =
        socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| FetchError::Io(e.into()))?;
    // Bounds the connect too: a stopped server's full backlog must not block an open for ever.
    sockopt::set_socket_timeout(&socket, sockopt::Timeout::Send, Some(PEER_TIMEOUT))
        .map_err(|e| FetchError::Io(e.into()))?;
    connect(&socket, addr).map_err(|e| FetchError::Unreachable(e.into()))?;
    if let Some((pid, uid)) = server {
        let cred = sockopt::socket_peercred(&socket).map_err(|e| FetchError::Io(e.into()))?;
        if cred.pid.as_raw_nonzero().get() as u32 != pid || cred.uid.as_raw() != uid {
            return Err(FetchError::Protocol("the fd socket is not the producer's"));
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

    fn addr(tag: &str) -> SocketAddrUnix {
        fd_address(&format!("fdpass-{tag}"), std::process::id() as u64).unwrap()
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
        rustix::process::getuid().as_raw()
    }

    fn our_gid() -> u32 {
        rustix::process::getgid().as_raw()
    }

    /// Serves one peer at `a`, from a server that believes it runs as `own_uid`: a policy that
    /// leaves out our own uid cannot be written (the server's own uid is always allowed), so
    /// refusals of us are tested through a server whose recorded uid is not ours.
    fn serve_one(
        a: &SocketAddrUnix,
        policy: PeerPolicy,
        own_uid: u32,
    ) -> std::thread::JoinHandle<()> {
        let listener =
            socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .unwrap();
        bind(&listener, a).unwrap();
        listen(&listener, 4).unwrap();
        let state = ServerState {
            policy,
            own_uid,
            offer: Mutex::new(Arc::new(Offer::new(vec![memfd(b"secret")], b"p".to_vec()).unwrap())),
        };
        std::thread::spawn(move || {
            let peer = accept_with(&listener, SocketFlags::CLOEXEC).unwrap();
            answer(&peer, &state).unwrap();
        })
    }

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer { uid, gid, groups: groups.to_vec(), pid: 1 }
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
        assert!(peer_of(&a, false).unwrap().groups.is_empty(), "not asked for");
    }

    #[test]
    fn a_peer_of_our_uid_receives_every_fd_and_the_payload() {
        let a = addr("same");
        let server = FdServer::start(
            &a,
            vec![memfd(b"pool 0"), memfd(b"pool 1")],
            b"hello".to_vec(),
            PeerPolicy::SameUid,
        )
        .unwrap();
        for _ in 0..3 {
            // Each peer gets its own copies of the fds.
            let (payload, fds) = fetch(&a).unwrap();
            assert_eq!(payload, b"hello");
            assert_eq!(
                fds.iter().map(contents).collect::<Vec<_>>(),
                [b"pool 0".to_vec(), b"pool 1".to_vec()]
            );
        }
        drop(server);
        assert!(matches!(fetch(&a), Err(FetchError::Unreachable(_))), "stopped on drop");
    }

    #[test]
    fn set_offer_changes_what_later_peers_get() {
        let a = addr("set-offer");
        let server =
            FdServer::start(&a, vec![memfd(b"pool 0")], b"v1".to_vec(), PeerPolicy::SameUid)
                .unwrap();
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
        let t = serve_one(&a, PeerPolicy::SameUid, own.wrapping_add(1));
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
        t.join().unwrap();
    }

    #[test]
    fn a_peer_in_an_allowed_group_is_served_and_one_outside_refused() {
        let (other_uid, gid) = (our_uid().wrapping_add(1), our_gid());
        let a = addr("gid-in");
        let t = serve_one(&a, PeerPolicy::gids([gid]), other_uid);
        let (payload, fds) = fetch(&a).unwrap();
        assert_eq!(
            (payload, fds.iter().map(contents).collect::<Vec<_>>()),
            (b"p".to_vec(), vec![b"secret".to_vec()])
        );
        t.join().unwrap();

        // By a supplementary group, when we have one besides the primary gid.
        let groups: Vec<u32> =
            rustix::process::getgroups().unwrap().into_iter().map(|g| g.as_raw()).collect();
        if let Some(&extra) = groups.iter().find(|g| **g != gid) {
            if SO_PEERGROUPS.is_some() {
                let a = addr("gid-supplementary");
                let t = serve_one(&a, PeerPolicy::gids([extra]), other_uid);
                assert_eq!(fetch(&a).unwrap().1.len(), 1, "by supplementary group {extra}");
                t.join().unwrap();
            }
        }

        let not_ours = (1..).map(|n| u32::MAX - n).find(|g| *g != gid && !groups.contains(g));
        let not_ours = not_ours.unwrap();
        let a = addr("gid-out");
        let t = serve_one(&a, PeerPolicy::gids([not_ours]), other_uid);
        match fetch(&a) {
            Err(FetchError::Refused(why)) => {
                assert!(why.contains(&format!("(gid {gid})")), "{why}");
                assert!(why.contains(&format!("or gids [{not_ours}]")), "{why}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        t.join().unwrap();
    }

    #[test]
    fn nobody_listening_is_unreachable() {
        assert!(matches!(fetch(&addr("absent")), Err(FetchError::Unreachable(_))));
    }
}
