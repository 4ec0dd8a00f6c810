//! Doorbells: waking, from another process, a waiter that awaits a file descriptor (an async
//! task) rather than sleeping on a futex.
//!
//! A doorbell is a unix datagram socket bound in the abstract namespace ([`Doorbell`]). Ringing
//! it is one `sendto` with `MSG_DONTWAIT` ([`Knocker::knock`]); what the datagram holds does not
//! matter, and nobody parses it. The waiter awaits the socket becoming readable, then empties it.
//!
//! * The producer's doorbell is at `gpuring/EPOCH/HASH/p` ([`producer_address`]): consumers
//!   knock after a release while the producer is parked.
//! * A consumer's doorbell is at `gpuring/EPOCH/HASH/c/TOKEN` ([`consumer_address`]), where
//!   TOKEN is a random 64-bit number it writes into its consumer table entry before it first
//!   parks. The producer knocks after a publish while that consumer is parked.
//!
//! Why sockets rather than eventfds passed with SCM_RIGHTS: a `write` to an fd received from a
//! peer blocks if the peer clears `O_NONBLOCK` on the shared file description, and the
//! producer must never block on a consumer. `MSG_DONTWAIT` is per call, so a knock can only
//! fail (the queue is full: the bell is rung already). No fd crosses processes, and nothing
//! received is trusted: a datagram from anyone only causes a spurious wake-up.
//!
//! Abstract socket names are per network namespace: a consumer in another one (a container with
//! its own network but the host's /dev/shm) cannot reach the producer's doorbell nor be reached;
//! its async waits then fall back to a timer (see `docs/guide.md`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::net::{
    bind, recv, sendto, socket_with, AddressFamily, RecvFlags, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};

/// The most datagrams one [`Doorbell::quiet`] reads, so that a flood cannot hold its caller.
pub const QUIET_MAX: usize = 64;

/// `gpuring/EPOCH/HASH` of ring `name`'s instance `epoch` (the name is hashed: names may be
/// longer than a socket address).
pub(crate) fn base(name: &str, epoch: u64) -> String {
    // FNV-1a: a stable, dependency-free hash; the epoch already makes the name unique.
    let hash = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("gpuring/{epoch:016x}/{hash:016x}")
}

/// The producer's doorbell address for ring `name`, instance `epoch`.
pub fn producer_address(name: &str, epoch: u64) -> io::Result<SocketAddrUnix> {
    Ok(SocketAddrUnix::new_abstract_name(format!("{}/p", base(name, epoch)).as_bytes())?)
}

/// The address of the consumer doorbell named by `token` in ring `name`, instance `epoch`.
pub fn consumer_address(name: &str, epoch: u64, token: u64) -> io::Result<SocketAddrUnix> {
    let path = format!("{}/c/{token:016x}", base(name, epoch));
    Ok(SocketAddrUnix::new_abstract_name(path.as_bytes())?)
}

/// A fresh random doorbell token (never 0, which means "none").
pub fn new_token() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(u64::from_ne_bytes(bytes).max(1))
}

/// A bound, non-blocking datagram socket: someone's doorbell.
#[derive(Debug)]
pub struct Doorbell {
    socket: OwnedFd,
    /// Where it is bound.
    at: SocketAddrUnix,
}

impl Doorbell {
    /// Binds a doorbell at `addr`. Fails with `AddrInUse` if another socket has it.
    pub fn bind(addr: &SocketAddrUnix) -> io::Result<Doorbell> {
        let socket = datagram_socket()?;
        bind(&socket, addr)?;
        Ok(Doorbell { socket, at: addr.clone() })
    }

    /// Rings itself (from its own socket), as [`Knocker::knock`] would.
    pub fn ring(&self) {
        let _ = sendto(&self.socket, &[1], SendFlags::DONTWAIT, &self.at);
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

    #[test]
    fn a_knock_rings_the_doorbell_and_quiet_empties_it() {
        let at = consumer_address("doorbell-knock", epoch(), new_token().unwrap()).unwrap();
        let bell = Doorbell::bind(&at).unwrap();
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
    fn a_second_doorbell_at_the_same_address_is_refused() {
        let at = producer_address("doorbell-twice", epoch()).unwrap();
        let _first = Doorbell::bind(&at).unwrap();
        let err = Doorbell::bind(&at).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn knocking_on_nobody_is_harmless_and_tokens_differ() {
        let at = consumer_address("doorbell-nobody", epoch(), 7).unwrap();
        Knocker::new().unwrap().knock(&at);
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }
}
