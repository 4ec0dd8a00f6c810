//! Doorbells: waking, from another process, a waiter that awaits a file descriptor (an async
//! task) rather than sleeping on a futex.
//!
//! A doorbell is a unix datagram socket bound at a path in the ring directory ([`Doorbell`]).
//! Ringing it is one `sendto` with `MSG_DONTWAIT` ([`Knocker::knock`]); what the datagram holds
//! does not matter, and nobody parses it. The waiter awaits the socket becoming readable, then
//! empties it.
//!
//! * The producer's doorbell is `.gpuring.HASH.p` ([`producer_address`]): consumers knock
//!   after a release while the producer is parked.
//! * A consumer's doorbell is `.gpuring.HASH.cTOKEN` ([`consumer_address`]), where TOKEN is a
//!   random 64-bit number it writes into its consumer table entry before it first parks. The
//!   producer knocks after a publish while that consumer is parked.
//!
//! HASH names the ring and its instance (see [`super::unixsock`], which binds them). The
//! sockets are files rather than abstract names because an abstract name belongs to its
//! network namespace: a consumer in a container with a network namespace of its own, sharing
//! only the ring directory with its producer, could neither knock nor be knocked on. A file
//! reaches whoever sees the directory and may write the file, whose mode follows the ring's
//! ([`super::unixsock::socket_mode`]).
//!
//! Why sockets rather than eventfds passed with SCM_RIGHTS: a `write` to an fd received from a
//! peer blocks if the peer clears `O_NONBLOCK` on the shared file description, and the
//! producer must never block on a consumer. `MSG_DONTWAIT` is per call, so a knock can only
//! fail (the queue is full: the bell is rung already). No fd crosses processes, and nothing
//! received is trusted: a datagram from anyone only causes a spurious wake-up.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::net::{
    connect, getpeername, getsockname, recv, send, sendto, socket_with, AddressFamily, RecvFlags,
    SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::dir::RingDir;
use super::unixsock::{address, bind_in, consumer_file, producer_file, socket_mode, SocketFile};

/// The most datagrams one [`Doorbell::quiet`] reads, so that a flood cannot hold its caller.
pub const QUIET_MAX: usize = 64;

/// The producer's doorbell address for ring `name`, instance `epoch`, in `dir`. Good while
/// `dir` is open (see [`super::unixsock::address`]).
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::doorbell::producer_address;
///
/// let dir = RingDir::open("/dev/shm")?;
/// let at = producer_address(&dir, "cam0", 7)?;
/// let path = at.path().unwrap();
/// assert!(path.to_str()?.starts_with("/dev/shm/.gpuring."));
/// assert!(at.abstract_name().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn producer_address(dir: &RingDir, name: &str, epoch: u64) -> io::Result<SocketAddrUnix> {
    address(dir, &producer_file(name, epoch))
}

/// The address of the consumer doorbell named by `token` in ring `name`, instance `epoch`, in
/// `dir`.
pub fn consumer_address(
    dir: &RingDir,
    name: &str,
    epoch: u64,
    token: u64,
) -> io::Result<SocketAddrUnix> {
    address(dir, &consumer_file(name, epoch, token))
}

/// A fresh random doorbell token (never 0, which means "none").
pub fn new_token() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(u64::from_ne_bytes(bytes).max(1))
}

/// A bound, non-blocking datagram socket: someone's doorbell. Dropping it removes its file,
/// unless another doorbell was bound at the same name since.
#[derive(Debug)]
pub struct Doorbell {
    socket: OwnedFd,
    /// A second socket, connected to `socket` when it was bound: [`ring`](Self::ring) sends on
    /// it. A connected datagram socket holds its peer, not the path, so it still rings after
    /// the file is removed (the producer's drop removes every consumer's doorbell file while
    /// tasks sharing a consumer may still relay a wake to each other). `None` if it could not
    /// be connected to `socket` (a mode without owner bits, no fd left, the file taken over
    /// before the connect): `ring` then sends by path, as a knock does.
    ringer: Option<OwnedFd>,
    /// Where it is bound.
    at: SocketAddrUnix,
    /// Its file, removed on drop; holds the directory open, which `at` may need (a
    /// `/proc/self/fd` path).
    file: SocketFile,
}

impl Doorbell {
    /// Binds a doorbell at `file` in `dir`, for the users that ring mode `ring_mode` lets use
    /// the ring ([`socket_mode`]). Replaces whatever socket was at `file` (one a killed
    /// process left, or another's), as [`bind_in`] does.
    ///
    /// ```
    /// use gpuring::shm::dir::RingDir;
    /// use gpuring::shm::doorbell::{producer_address, Doorbell, Knocker};
    /// use gpuring::shm::unixsock::producer_file;
    ///
    /// let dir = RingDir::open(std::env::temp_dir())?;
    /// let (name, epoch) = ("doc-doorbell", u64::from(std::process::id()));
    /// let bell = Doorbell::bind(&dir, &producer_file(name, epoch), 0o600)?;
    /// Knocker::new()?.knock(&producer_address(&dir, name, epoch)?);
    /// assert_eq!(bell.quiet(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(dir: &RingDir, file: &str, ring_mode: u32) -> io::Result<Doorbell> {
        let socket = datagram_socket()?;
        let file = bind_in(dir, file, &socket, socket_mode(ring_mode))?;
        let at = file.address()?;
        let ringer = match connected_to(&socket, &at) {
            Ok(ringer) => Some(ringer),
            Err(e) => {
                tracing::debug!(file = %file.file(), error = %e, "a doorbell rings itself by path");
                None
            }
        };
        Ok(Doorbell { socket, ringer, at, file })
    }

    /// Its file's name in the ring directory.
    pub fn file(&self) -> &str {
        self.file.file()
    }

    /// Rings itself, as [`Knocker::knock`] would, even once its file is gone. Never blocks;
    /// a full queue has rung it already.
    pub fn ring(&self) {
        let sent = match &self.ringer {
            Some(ringer) => send(ringer, &[1], SendFlags::DONTWAIT),
            None => sendto(&self.socket, &[1], SendFlags::DONTWAIT, &self.at),
        };
        match sent {
            Ok(_) | Err(Errno::AGAIN) => {}
            Err(e) => tracing::debug!(file = %self.file(), error = %e, "cannot ring a doorbell"),
        }
    }

    /// Reads and drops up to [`QUIET_MAX`] waiting datagrams. Returns how many there were.
    pub fn quiet(&self) -> usize {
        let mut buf = [0u8; 16];
        let mut n = 0;
        while n < QUIET_MAX {
            match recv(&self.socket, &mut buf, RecvFlags::DONTWAIT) {
                Ok(_) => n += 1,
                Err(Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        n
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// An unbound datagram socket to ring doorbells with.
#[derive(Debug)]
pub struct Knocker {
    socket: OwnedFd,
}

impl Knocker {
    /// A new knocker.
    pub fn new() -> io::Result<Knocker> {
        Ok(Knocker { socket: datagram_socket()? })
    }

    /// Rings the doorbell at `at`; never blocks. Errors are ignored: a full queue has rung it
    /// already, and a doorbell that is gone has nobody to wake.
    pub fn knock(&self, at: &SocketAddrUnix) {
        let _ = sendto(&self.socket, &[1], SendFlags::DONTWAIT, at);
    }
}

/// A new datagram socket connected to `socket`, bound at `at`. Fails if `at` names another
/// socket by the time of the connect (a later bind at the same name replaced the file): both
/// sockets keep the unique temporary name `socket` was bound at, so the peer's name says whose
/// it is.
fn connected_to(socket: &OwnedFd, at: &SocketAddrUnix) -> io::Result<OwnedFd> {
    let ringer = datagram_socket()?;
    connect(&ringer, at)?;
    if getpeername(&ringer)? != Some(getsockname(socket)?) {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "doorbell file taken over"));
    }
    Ok(ringer)
}

fn datagram_socket() -> io::Result<OwnedFd> {
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    Ok(socket_with(AddressFamily::UNIX, SocketType::DGRAM, flags, None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch() -> u64 {
        std::process::id() as u64
    }

    fn temp() -> RingDir {
        RingDir::open(std::env::temp_dir()).unwrap()
    }

    #[test]
    fn a_knock_rings_the_doorbell_and_quiet_empties_it() {
        let (dir, token) = (temp(), new_token().unwrap());
        let bell =
            Doorbell::bind(&dir, &consumer_file("doorbell-knock", epoch(), token), 0o600).unwrap();
        let at = consumer_address(&dir, "doorbell-knock", epoch(), token).unwrap();
        let knocker = Knocker::new().unwrap();
        assert_eq!(bell.quiet(), 0);
        knocker.knock(&at);
        knocker.knock(&at);
        assert_eq!(bell.quiet(), 2);
        assert_eq!(bell.quiet(), 0);
        bell.ring();
        assert_eq!(bell.quiet(), 1, "a doorbell rings itself");
    }

    #[test]
    fn a_doorbell_rings_itself_after_its_file_is_removed() {
        let (dir, token) = (temp(), new_token().unwrap());
        let file = consumer_file("doorbell-unlinked", epoch(), token);
        let bell = Doorbell::bind(&dir, &file, 0o600).unwrap();
        std::fs::remove_file(dir.display(&file)).unwrap();
        bell.ring();
        assert_eq!(bell.quiet(), 1, "the ring reaches the socket without its file");
    }

    #[test]
    fn a_second_doorbell_at_the_same_name_takes_it_over() {
        let dir = temp();
        let file = producer_file("doorbell-twice", epoch());
        let first = Doorbell::bind(&dir, &file, 0o600).unwrap();
        let second = Doorbell::bind(&dir, &file, 0o600).unwrap();
        let at = producer_address(&dir, "doorbell-twice", epoch()).unwrap();
        Knocker::new().unwrap().knock(&at);
        assert_eq!((first.quiet(), second.quiet()), (0, 1));
        // The first one's drop leaves the second's file.
        drop(first);
        Knocker::new().unwrap().knock(&at);
        assert_eq!(second.quiet(), 1);
        drop(second);
        assert!(!dir.display(&file).exists(), "the last one's drop removes it");
    }

    #[test]
    fn a_doorbell_has_the_rings_mode_with_write_bits() {
        let dir = temp();
        let file = producer_file("doorbell-mode", epoch());
        let bell = Doorbell::bind(&dir, &file, 0o640).unwrap();
        assert_eq!(bell.file(), file);
        let st = rustix::fs::stat(dir.display(&file)).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o660);
    }

    #[test]
    fn knocking_on_nobody_is_harmless_and_tokens_differ() {
        let at = consumer_address(&temp(), "doorbell-nobody", epoch(), 7).unwrap();
        Knocker::new().unwrap().knock(&at);
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }
}
