//! Unix sockets at paths in the ring directory: the doorbells ([`super::doorbell`]) and the
//! fd server ([`super::fdpass`]).
//!
//! They used to be in the abstract namespace, which belongs to a network namespace: a
//! consumer in a container with its own network could neither knock on its producer's
//! doorbell nor fetch its memory. A socket file in a directory both sides share reaches
//! across network, pid, IPC and mount namespaces alike.
//!
//! The files of ring NAME's instance EPOCH are named by HASH, an FNV-1a hash of the name and
//! the epoch in 16 hex digits (names may be longer than a socket address holds):
//!
//! * `.gpuring.HASH.p`: the producer's doorbell ([`producer_file`]);
//! * `.gpuring.HASH.f`: the producer's fd server ([`fd_file`]);
//! * `.gpuring.HASH.cTOKEN`: the doorbell of the consumer whose token is TOKEN, in 16 hex
//!   digits ([`consumer_file`]).
//!
//! The leading dot and the `.gpuring.` prefix keep them from looking like rings, whose
//! segment files are named `gpuring.NAME`.
//!
//! A socket is bound under a random temporary name, given its mode, then renamed into place
//! ([`bind_in`]): the rename replaces atomically whatever was at the name (the file of a
//! killed peer's socket, or another process's socket squatting there), and the socket is never
//! reachable at its name with a mode other than the one asked for. Its owner removes the file
//! when done, unless it was replaced since ([`SocketFile`]).

use std::fmt::Write as _;
use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{bind, SocketAddrUnix};

use super::dir::{plain, RingDir};

/// The prefix of every socket file's name.
const PREFIX: &str = ".gpuring.";

/// HASH of ring `name`'s instance `epoch`: FNV-1a (stable, no dependency) over the name's
/// bytes, then the epoch's eight little-endian bytes.
fn hash(name: &str, epoch: u64) -> u64 {
    name.bytes()
        .chain(epoch.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// `.gpuring.HASH.`: the start of every socket file of ring `name`'s instance `epoch`.
fn instance_prefix(name: &str, epoch: u64) -> String {
    format!("{PREFIX}{:016x}.", hash(name, epoch))
}

/// The file name of the producer's doorbell of ring `name`, instance `epoch`.
///
/// ```
/// use gpuring::shm::unixsock::producer_file;
///
/// let file = producer_file("cam0", 7);
/// assert!(file.starts_with(".gpuring.") && file.ends_with(".p"));
/// assert_eq!(file.len(), ".gpuring.".len() + 16 + 2);
/// assert_ne!(file, producer_file("cam0", 8), "each instance has its own");
/// ```
pub fn producer_file(name: &str, epoch: u64) -> String {
    instance_prefix(name, epoch) + "p"
}

/// The file name of the producer's fd server of ring `name`, instance `epoch`.
///
/// ```
/// use gpuring::shm::unixsock::{fd_file, producer_file};
///
/// assert_eq!(fd_file("cam0", 7).trim_end_matches('f'), producer_file("cam0", 7).trim_end_matches('p'));
/// ```
pub fn fd_file(name: &str, epoch: u64) -> String {
    instance_prefix(name, epoch) + "f"
}

/// The file name of the doorbell of the consumer whose token is `token`, in ring `name`,
/// instance `epoch`.
///
/// ```
/// use gpuring::shm::unixsock::consumer_file;
///
/// assert!(consumer_file("cam0", 7, 0xab).ends_with(".c00000000000000ab"));
/// ```
pub fn consumer_file(name: &str, epoch: u64, token: u64) -> String {
    let mut file = instance_prefix(name, epoch);
    let _ = write!(file, "c{token:016x}");
    file
}

/// Whether `rest` (what follows `.gpuring.HASH.`) names a socket file of an instance: `p`,
/// `f`, or `c` and 16 hex digits.
fn instance_suffix(rest: &str) -> bool {
    match rest.strip_prefix('c') {
        Some(token) => token.len() == 16 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        None => rest == "p" || rest == "f",
    }
}

/// The address of socket file `file` in `dir`, for `connect` and `sendto`. A directory whose
/// path is too long for a socket address is reached through this process's descriptor of it
/// ([`RingDir::socket_path`]), so the address is good only while `dir` (or a clone) is open.
pub fn address(dir: &RingDir, file: &str) -> io::Result<SocketAddrUnix> {
    Ok(SocketAddrUnix::new(dir.socket_path(file))?)
}

/// The mode of the sockets of a ring whose segment has permission bits `ring_mode`: read and
/// write for each class (owner, group, others) that may read or write the ring, since
/// `connect` and `sendto` on a unix socket need write permission on its file.
///
/// ```
/// use gpuring::shm::unixsock::socket_mode;
///
/// assert_eq!(socket_mode(0o600), 0o600);
/// assert_eq!(socket_mode(0o640), 0o660); // group readers knock and fetch too
/// assert_eq!(socket_mode(0o444), 0o666);
/// assert_eq!(socket_mode(0o700), 0o600); // no execute bits on a socket
/// ```
pub fn socket_mode(ring_mode: u32) -> u32 {
    [0o700, 0o070, 0o007]
        .into_iter()
        .filter(|class| ring_mode & class & 0o666 != 0)
        .map(|class| class & 0o666)
        .sum()
}

/// A socket file that [`bind_in`] put in place. Dropping it removes the file, if it is still
/// the one we bound: a socket bound at the same name since (and its file) is left alone.
///
/// Invariant: `id` is `(st_dev, st_ino)` of the file our socket was bound to.
#[derive(Debug)]
pub struct SocketFile {
    dir: RingDir,
    file: String,
    id: (u64, u64),
}

impl SocketFile {
    /// Its name in its directory.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Its address (see [`address`]).
    pub fn address(&self) -> io::Result<SocketAddrUnix> {
        address(&self.dir, &self.file)
    }

    /// Whether the name still refers to our file.
    pub fn is_ours(&self) -> bool {
        file_id(&self.dir, &self.file).is_ok_and(|(id, _)| id == self.id)
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Between this look and the unlink another binder could put its socket here; it
        // would then lose its file. Only a process that may write the directory can do that,
        // and its socket still works for whoever connected before.
        if self.is_ours() {
            let _ = rustix::fs::unlinkat(self.dir.fd(), self.file.as_str(), AtFlags::empty());
        }
    }
}

/// `(st_dev, st_ino)` and the type of `file` in `dir`, without following a symlink.
fn file_id(dir: &RingDir, file: &str) -> io::Result<((u64, u64), FileType)> {
    let st = rustix::fs::statat(dir.fd(), file, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(((st.st_dev, st.st_ino), FileType::from_raw_mode(st.st_mode)))
}

/// `.gpuring.tmp.RANDOM`: a name to bind under before the rename.
fn temporary_name() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(format!("{PREFIX}tmp.{:016x}", u64::from_ne_bytes(bytes)))
}

/// Binds `socket` (an unbound unix socket) at `file` in `dir` with permission bits `mode`
/// exactly (the umask does not apply): under a temporary name, then `chmod`, then renamed to
/// `file`, which replaces any file there (a stale socket, or another's). If a step fails, the
/// temporary file is removed. Fails with `InvalidInput` if `file` is not a plain file name.
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::unixsock::bind_in;
/// use rustix::net::{socket, AddressFamily, SocketType};
///
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let file = format!(".gpuring.doc-bind-in.{}", std::process::id());
/// let socket = socket(AddressFamily::UNIX, SocketType::DGRAM, None)?;
/// let bound = bind_in(&dir, &file, &socket, 0o600)?;
/// assert!(bound.is_ours());
/// drop(bound); // removes the file
/// assert!(!dir.display(&file).exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn bind_in(dir: &RingDir, file: &str, socket: &OwnedFd, mode: u32) -> io::Result<SocketFile> {
    if !plain(file) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{file:?} is not a file name"),
        ));
    }
    let tmp = temporary_name()?;
    bind(socket, &address(dir, &tmp)?)?;
    let placed = (|| {
        let (id, kind) = file_id(dir, &tmp)?;
        if kind != FileType::Socket {
            // Someone who may write the directory replaced it already.
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "socket file replaced"));
        }
        rustix::fs::chmodat(
            dir.fd(),
            tmp.as_str(),
            Mode::from_bits_truncate(mode),
            AtFlags::empty(),
        )?;
        rustix::fs::renameat(dir.fd(), tmp.as_str(), dir.fd(), file)?;
        Ok(id)
    })();
    match placed {
        Ok(id) => Ok(SocketFile { dir: dir.clone(), file: file.to_owned(), id }),
        Err(e) => {
            let _ = unlink_in(dir, &tmp);
            Err(e)
        }
    }
}

/// Removes `file` from `dir` if it is a socket (not following a symlink). Returns whether it
/// removed one: `false` if there is no such file, or it is not a socket.
pub fn unlink_in(dir: &RingDir, file: &str) -> io::Result<bool> {
    match file_id(dir, file) {
        Ok((_, FileType::Socket)) => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    match rustix::fs::unlinkat(dir.fd(), file, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Removes every socket file of ring `name`'s instance `epoch` from `dir`: the producer's
/// doorbell and fd server, and every consumer's doorbell. Files this process may not remove
/// (another user's, in a directory with the sticky bit) are left. Returns how many it removed;
/// fails only if the directory cannot be read.
///
/// ```
/// use gpuring::shm::dir::RingDir;
/// use gpuring::shm::unixsock::{bind_in, consumer_file, producer_file, remove_instance};
/// use rustix::net::{socket, AddressFamily, SocketType};
///
/// let dir = RingDir::open(std::env::temp_dir())?;
/// let (name, epoch) = ("doc-remove-instance", u64::from(std::process::id()));
/// let sockets = [socket(AddressFamily::UNIX, SocketType::DGRAM, None)?, socket(AddressFamily::UNIX, SocketType::DGRAM, None)?];
/// let p = bind_in(&dir, &producer_file(name, epoch), &sockets[0], 0o600)?;
/// let c = bind_in(&dir, &consumer_file(name, epoch, 9), &sockets[1], 0o600)?;
/// assert_eq!(remove_instance(&dir, name, epoch)?, 2);
/// assert!(!p.is_ours() && !c.is_ours());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove_instance(dir: &RingDir, name: &str, epoch: u64) -> io::Result<usize> {
    let prefix = instance_prefix(name, epoch);
    // The ring directory's descriptor is `O_PATH`, which cannot list: open it for reading.
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let listing = rustix::fs::openat(dir.fd(), ".", flags, Mode::empty())?;
    let mut removed = 0;
    for entry in rustix::fs::Dir::new(listing)? {
        let entry = entry?;
        let Ok(file) = entry.file_name().to_str() else { continue };
        if !file.strip_prefix(prefix.as_str()).is_some_and(instance_suffix) {
            continue;
        }
        match unlink_in(dir, file) {
            Ok(true) => removed += 1,
            Ok(false) => {}
            Err(e) => tracing::debug!(
                file = %dir.display(file).display(),
                error = %e,
                "cannot remove a ring's socket file"
            ),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{recv, sendto, socket_with, AddressFamily, RecvFlags, SendFlags};
    use rustix::net::{SocketFlags, SocketType};
    use std::sync::atomic::{AtomicU32, Ordering};

    fn temp() -> RingDir {
        RingDir::open(std::env::temp_dir()).unwrap()
    }

    /// A file name no other test (or run) uses.
    fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{PREFIX}test-{tag}-{}-{n}", std::process::id())
    }

    fn datagram() -> OwnedFd {
        let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
        socket_with(AddressFamily::UNIX, SocketType::DGRAM, flags, None).unwrap()
    }

    /// Sends one datagram to `file` in `dir`.
    fn knock(dir: &RingDir, file: &str) {
        sendto(datagram(), b"k", SendFlags::DONTWAIT, &address(dir, file).unwrap()).unwrap();
    }

    /// How many datagrams wait on `socket`.
    fn drain(socket: &OwnedFd) -> usize {
        let mut buf = [0u8; 8];
        std::iter::from_fn(|| recv(socket, &mut buf, RecvFlags::DONTWAIT).ok()).count()
    }

    fn mode_of(dir: &RingDir, file: &str) -> u32 {
        rustix::fs::statat(dir.fd(), file, AtFlags::SYMLINK_NOFOLLOW).unwrap().st_mode & 0o7777
    }

    #[test]
    fn names_follow_the_ring_and_instance() {
        let p = producer_file("cam0", 7);
        assert_eq!(&p[..PREFIX.len()], PREFIX);
        let hash = &p[PREFIX.len()..PREFIX.len() + 16];
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{p}");
        assert_eq!(fd_file("cam0", 7), format!("{PREFIX}{hash}.f"));
        assert_eq!(consumer_file("cam0", 7, 1), format!("{PREFIX}{hash}.c0000000000000001"));
        assert_ne!(producer_file("cam1", 7), p);
        assert!(!p.starts_with(super::super::SHM_PREFIX), "never taken for a ring");
        assert!(instance_suffix("c00000000000000ab") && instance_suffix("p"));
        assert!(!instance_suffix("c1") && !instance_suffix("x") && !instance_suffix("pp"));
    }

    #[test]
    fn a_bound_socket_is_reachable_and_its_drop_removes_it() {
        let (dir, file) = (temp(), unique("bound"));
        let socket = datagram();
        let bound = bind_in(&dir, &file, &socket, 0o600).unwrap();
        assert_eq!(bound.file(), file);
        knock(&dir, &file);
        assert_eq!(drain(&socket), 1);
        drop(bound);
        assert!(!dir.display(&file).exists());
    }

    #[test]
    fn a_stale_socket_file_is_replaced() {
        let (dir, file) = (temp(), unique("stale"));
        {
            // A socket bound at the path whose process then closed it: its file stays.
            let dead = datagram();
            bind(&dead, &address(&dir, &file).unwrap()).unwrap();
        }
        let socket = datagram();
        let again = bind(&socket, &address(&dir, &file).unwrap());
        assert_eq!(again, Err(Errno::ADDRINUSE), "a plain bind would fail");
        let bound = bind_in(&dir, &file, &socket, 0o600).unwrap();
        knock(&dir, &file);
        assert_eq!(drain(&socket), 1);
        drop(bound);
        assert!(!dir.display(&file).exists());
    }

    #[test]
    fn a_squatter_is_replaced_and_knocks_reach_us() {
        let (dir, file) = (temp(), unique("squat"));
        let squatter = datagram();
        bind(&squatter, &address(&dir, &file).unwrap()).unwrap();
        let ours = datagram();
        let bound = bind_in(&dir, &file, &ours, 0o600).unwrap();
        knock(&dir, &file);
        knock(&dir, &file);
        assert_eq!((drain(&ours), drain(&squatter)), (2, 0));
        // A squatter that comes back after us takes the name: our drop leaves its file.
        let second = datagram();
        let theirs = bind_in(&dir, &file, &second, 0o600).unwrap();
        assert!(!bound.is_ours() && theirs.is_ours());
        drop(bound);
        knock(&dir, &file);
        assert_eq!(drain(&second), 1, "their file survived our drop");
    }

    #[test]
    fn a_directory_too_long_for_a_socket_address_works() {
        let mut deep = std::env::temp_dir();
        deep.push(format!("gpuring-long-{}", std::process::id()));
        let top = deep.clone();
        for part in ["a", "b", "c"] {
            deep.push(part.repeat(40));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let dir = RingDir::open(&deep).unwrap();
        let file = producer_file("long", 1);
        assert!(dir.display(&file).as_os_str().len() > 108);
        let at = address(&dir, &file).unwrap();
        assert!(at.path().unwrap().to_bytes().starts_with(b"/proc/self/fd/"), "{at:?}");
        let socket = datagram();
        let bound = bind_in(&dir, &file, &socket, 0o600).unwrap();
        assert!(deep.join(&file).exists(), "the file is in the deep directory");
        knock(&dir, &file);
        assert_eq!(drain(&socket), 1);
        assert_eq!(remove_instance(&dir, "long", 1).unwrap(), 1);
        assert!(!bound.is_ours());
        drop(bound);
        std::fs::remove_dir_all(top).unwrap();
    }

    /// Run as a child (the umask is the whole process's): sets a umask that would take bits
    /// away, then binds with modes it would change.
    #[test]
    fn the_mode_is_exact_despite_a_umask() {
        const CHILD: &str = "GPURING_UNIXSOCK_UMASK_CHILD";
        if std::env::var_os(CHILD).is_some() {
            rustix::process::umask(Mode::from_bits_truncate(0o077));
            let dir = temp();
            for mode in [0o666, 0o660, 0o600, 0o640] {
                let (file, socket) = (unique("mode"), datagram());
                let _bound = bind_in(&dir, &file, &socket, mode).unwrap();
                assert_eq!(mode_of(&dir, &file), mode, "{mode:o}");
            }
            println!("modes exact");
            return;
        }
        let test = "shm::unixsock::tests::the_mode_is_exact_despite_a_umask";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("modes exact"), "the child ran the test: {stdout}");
    }

    #[test]
    fn a_file_that_is_not_a_name_is_refused() {
        let dir = temp();
        for file in ["", "a/b", "../x"] {
            let err = bind_in(&dir, file, &datagram(), 0o600).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{file:?}");
        }
    }

    #[test]
    fn remove_instance_removes_that_instances_sockets_only() {
        let dir = temp();
        let (name, epoch) = ("unixsock-remove", u64::from(std::process::id()));
        let sockets: Vec<OwnedFd> = (0..5).map(|_| datagram()).collect();
        let files = [
            producer_file(name, epoch),
            fd_file(name, epoch),
            consumer_file(name, epoch, 1),
            consumer_file(name, epoch, u64::MAX),
            producer_file(name, epoch + 1), // another instance
        ];
        let bound: Vec<SocketFile> =
            files.iter().zip(&sockets).map(|(f, s)| bind_in(&dir, f, s, 0o600).unwrap()).collect();
        // A regular file with a socket's name is not a socket: left alone.
        let regular = consumer_file(name, epoch, 2);
        std::fs::write(dir.display(&regular), b"").unwrap();
        assert_eq!(remove_instance(&dir, name, epoch).unwrap(), 4);
        let left: Vec<bool> = bound.iter().map(SocketFile::is_ours).collect();
        assert_eq!(left, [false, false, false, false, true]);
        assert!(dir.display(&regular).exists());
        assert!(!unlink_in(&dir, &regular).unwrap(), "not a socket");
        std::fs::remove_file(dir.display(&regular)).unwrap();
        assert!(unlink_in(&dir, &files[4]).unwrap());
        assert!(!unlink_in(&dir, &files[4]).unwrap(), "gone already");
        assert_eq!(remove_instance(&dir, name, epoch).unwrap(), 0);
    }

    #[test]
    fn socket_modes_give_rw_to_each_class_that_may_use_the_ring() {
        let cases = [(0o600, 0o600), (0o400, 0o600), (0o640, 0o660), (0o604, 0o606)];
        for (ring, socket) in cases {
            assert_eq!(socket_mode(ring), socket, "{ring:o}");
        }
        assert_eq!(socket_mode(0o1777), 0o666);
    }
}
