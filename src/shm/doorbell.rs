//! Doorbells: waking, from another process, a waiter that awaits a file descriptor (an async
//! task) rather than sleeping on a futex.
//!
//! * A ring instance has one unix datagram socket, the producer's [`Inbox`], bound in the
//!   abstract namespace under a name made from the instance's epoch and name
//!   ([`inbox_address`]). Nothing is left in the file system; the name dies with the producer.
//! * A consumer that waits asynchronously makes an eventfd ([`Bell`]) and sends it to the inbox
//!   with SCM_RIGHTS, together with its consumer table entry and generation
//!   ([`Outbox::register`]). The inbox has SO_PASSCRED set, so the kernel attaches the sender's
//!   pid, which the producer checks against the entry before it keeps the fd.
//! * The producer rings a consumer by adding 1 to its eventfd ([`ring`]); a consumer rings the
//!   producer by sending a datagram to the inbox ([`Outbox::knock`]), which the producer awaits.
//!
//! Abstract socket names are per network namespace: a consumer in another one (a container with
//! its own network but the host's /dev/shm) cannot reach the inbox. Its async waits then fall
//! back to a timer (see `docs/guide.md`).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{eventfd, EventfdFlags};
use rustix::io::Errno;
use rustix::net::{
    bind, recvmsg, sendmsg_addr, sendto, socket_with, sockopt, AddressFamily, RecvAncillaryBuffer,
    RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// First word of every datagram: `b"GRDB"`.
const MAGIC: u32 = u32::from_le_bytes(*b"GRDB");
/// Datagram kinds.
const REGISTER: u32 = 1;
const KNOCK: u32 = 2;
/// Every datagram is four little-endian u32s: magic, kind, entry, generation.
const LETTER_LEN: usize = 16;

/// The inbox address of ring `name`'s instance `epoch`: `gpuring/EPOCH/HASH` in the abstract
/// namespace (the ring name is hashed: names may be longer than a socket address).
pub fn inbox_address(name: &str, epoch: u64) -> io::Result<SocketAddrUnix> {
    // FNV-1a: a stable, dependency-free hash; the epoch already makes the name unique.
    let hash = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let path = format!("gpuring/{epoch:016x}/{hash:016x}");
    Ok(SocketAddrUnix::new_abstract_name(path.as_bytes())?)
}

/// A consumer's doorbell: a non-blocking eventfd.
#[derive(Debug)]
pub struct Bell {
    fd: OwnedFd,
}

impl Bell {
    /// A new, unrung bell.
    pub fn new() -> io::Result<Bell> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Bell { fd })
    }

    /// Takes the rings so far. Returns whether it had been rung.
    pub fn take(&self) -> bool {
        let mut count = [0u8; 8];
        rustix::io::read(&self.fd, &mut count).is_ok()
    }
}

impl AsFd for Bell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Bell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Rings the eventfd `bell`. Errors are ignored: a full counter is rung already, and a peer that
/// sent something else only hurts itself.
pub fn ring(bell: BorrowedFd<'_>) {
    let _ = rustix::io::write(bell, &1u64.to_ne_bytes());
}

/// What the inbox receives.
#[derive(Debug)]
pub enum Letter {
    /// A consumer's bell, for entry `entry` at `generation`, sent by process `pid` (as the kernel
    /// saw it, not as the sender claims).
    Register {
        /// Consumer table entry the sender says it owns.
        entry: u32,
        /// That entry's generation when the sender joined.
        generation: u32,
        /// Sender's pid from SCM_CREDENTIALS.
        pid: u32,
        /// The eventfd.
        bell: OwnedFd,
    },
    /// A consumer released or left while the producer was parked.
    Knock,
}

/// The producer's socket.
#[derive(Debug)]
pub struct Inbox {
    socket: OwnedFd,
}

impl Inbox {
    /// Binds the inbox at `addr`. Fails with `AddrInUse` if another instance has it.
    pub fn bind(addr: &SocketAddrUnix) -> io::Result<Inbox> {
        let socket = datagram_socket()?;
        sockopt::set_socket_passcred(&socket, true)?;
        bind(&socket, addr)?;
        Ok(Inbox { socket })
    }

    /// The next well-formed letter, or `None` once the queue is empty. Malformed datagrams
    /// (wrong size, magic or kind, a register without exactly one fd or without credentials)
    /// are dropped, and any fds they carried closed.
    pub fn next(&self) -> io::Result<Option<Letter>> {
        loop {
            let mut buf = [0u8; LETTER_LEN];
            let mut space =
                [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2), ScmCredentials(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
            let got = match recvmsg(
                &self.socket,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                flags,
            ) {
                Ok(got) => got,
                Err(Errno::AGAIN) => return Ok(None),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut fds = Vec::new();
            let mut pid = None;
            for msg in control.drain() {
                match msg {
                    RecvAncillaryMessage::ScmRights(received) => fds.extend(received),
                    RecvAncillaryMessage::ScmCredentials(cred) => {
                        pid = Some(cred.pid.as_raw_nonzero().get() as u32)
                    }
                    _ => {}
                }
            }
            let truncated = got.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
            if truncated || got.bytes != LETTER_LEN {
                continue;
            }
            let word = |i: usize| u32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap());
            if word(0) != MAGIC {
                continue;
            }
            match (word(1), fds.len(), pid) {
                (KNOCK, 0, _) => return Ok(Some(Letter::Knock)),
                (REGISTER, 1, Some(pid)) => {
                    let bell = fds.pop().expect("one fd");
                    return Ok(Some(Letter::Register {
                        entry: word(2),
                        generation: word(3),
                        pid,
                        bell,
                    }));
                }
                _ => continue,
            }
        }
    }
}

impl AsFd for Inbox {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for Inbox {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// A consumer's unbound socket for writing to the producer's inbox.
#[derive(Debug)]
pub struct Outbox {
    socket: OwnedFd,
    to: SocketAddrUnix,
}

impl Outbox {
    /// A socket that sends to `inbox`.
    pub fn new(inbox: SocketAddrUnix) -> io::Result<Outbox> {
        Ok(Outbox { socket: datagram_socket()?, to: inbox })
    }

    /// Sends `bell` for consumer table entry `entry` at `generation`. `WouldBlock` when the inbox's
    /// queue is full, `ConnectionRefused` when no producer has it bound (try again later).
    pub fn register(&self, entry: u32, generation: u32, bell: BorrowedFd<'_>) -> io::Result<()> {
        let letter = letter(REGISTER, entry, generation);
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [bell];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)), "cmsg space for one fd");
        let iov = [IoSlice::new(&letter)];
        sendmsg_addr(&self.socket, &self.to, &iov, &mut control, SendFlags::DONTWAIT)?;
        Ok(())
    }

    /// Rings the producer. Errors are ignored: a full queue has rung it already, and a producer
    /// that is gone needs no waking.
    pub fn knock(&self) {
        let _ = sendto(&self.socket, &letter(KNOCK, 0, 0), SendFlags::DONTWAIT, &self.to);
    }
}

fn letter(kind: u32, entry: u32, generation: u32) -> [u8; LETTER_LEN] {
    let mut out = [0u8; LETTER_LEN];
    for (i, w) in [MAGIC, kind, entry, generation].into_iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

fn datagram_socket() -> io::Result<OwnedFd> {
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    Ok(socket_with(AddressFamily::UNIX, SocketType::DGRAM, flags, None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(tag: &str) -> SocketAddrUnix {
        inbox_address(tag, std::process::id() as u64).unwrap()
    }

    #[test]
    fn a_registered_bell_reaches_the_inbox_with_the_senders_pid() {
        let at = addr("doorbell-register");
        let inbox = Inbox::bind(&at).unwrap();
        let outbox = Outbox::new(at).unwrap();
        let bell = Bell::new().unwrap();
        outbox.register(3, 7, bell.as_fd()).unwrap();
        outbox.knock();
        let Some(Letter::Register { entry, generation, pid, bell: received }) =
            inbox.next().unwrap()
        else {
            panic!("expected a registration");
        };
        assert_eq!((entry, generation, pid), (3, 7, std::process::id()));
        // The received fd is the same eventfd: ringing it rings ours.
        assert!(!bell.take());
        ring(received.as_fd());
        assert!(bell.take());
        assert!(matches!(inbox.next().unwrap(), Some(Letter::Knock)));
        assert!(inbox.next().unwrap().is_none());
    }

    #[test]
    fn malformed_datagrams_are_dropped() {
        let at = addr("doorbell-malformed");
        let inbox = Inbox::bind(&at).unwrap();
        let outbox = Outbox::new(at.clone()).unwrap();
        let send = |bytes: &[u8]| sendto(&outbox.socket, bytes, SendFlags::DONTWAIT, &at).unwrap();
        send(b"short");
        send(&[0u8; LETTER_LEN]);
        // A register without an fd.
        send(&letter(REGISTER, 1, 1));
        send(&letter(99, 1, 1));
        assert!(inbox.next().unwrap().is_none());
    }

    #[test]
    fn a_second_inbox_at_the_same_address_is_refused() {
        let at = addr("doorbell-twice");
        let _first = Inbox::bind(&at).unwrap();
        let err = Inbox::bind(&at).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn knocking_with_no_inbox_is_harmless() {
        Outbox::new(addr("doorbell-nobody")).unwrap().knock();
    }
}
