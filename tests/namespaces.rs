//! Peers in other namespaces, as containers run them: the producer and the consumers each in
//! their own pid, network, IPC or mount namespace (with a private /dev/shm), sharing only the
//! ring directory, a tmpfs made for each cell of the matrix.
//!
//! Rows are the namespaces the isolated side has of its own (one test each); columns are which
//! side is isolated: the consumers, the producer, or both (each process in namespaces of its
//! own, as separate containers are). Every cell checks, with one producer and two consumers:
//!
//! 1. every byte of every message (a pattern that depends on the sequence number);
//! 2. a consumer killed with SIGKILL while holding a message is reclaimed by the producer,
//!    which could not send a ring's worth more without that (`Block`), and the ring's stats
//!    count one reclaim;
//! 3. a producer killed with SIGKILL turns into `Disconnected` for the other consumer, with
//!    `ended() == Some(Ended::Died)`;
//! 4. that consumer receives with `recv_async` on a current-thread runtime while the producer
//!    paces its sends, and its doorbell woke it (`testing::async_wakes`): doorbell wakes, and
//!    no wait that its timer ended found a message;
//! 5. from inside the isolated namespaces, `gpuring stat` and `gpuring list` show the ring,
//!    `gpuring rm` is refused while the producer lives, and `gpuring exporter` serves the
//!    ring's metrics to an HTTP client in the same namespaces.
//!
//! They need root and util-linux `unshare` (CI has both), so they are ignored by default:
//! `cargo test --all-features --test namespaces -- --ignored`. Each child is started under
//! `unshare` as this test binary again, with a role; every process, mount and file of a cell
//! is taken down when the cell ends, however it ends.

mod common;

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{env, gpuring_bin, role, unique_name, ROLE};
use gpuring::testing::pattern;
use gpuring::{Consumer, Ended, Policy, Producer, RecvError};
use prometheus_parse::{Scrape, Value};

/// Messages sent while both consumers read.
const MESSAGES: u64 = 300;
/// Bytes of each message.
const SIZE: usize = 64 * 1024;
/// Slots of the ring.
const CAPACITY: u32 = 8;
/// Messages sent after the killed consumer died: more than the ring holds, so the producer
/// (`Block`) gets through them only once it has reclaimed that consumer.
const AFTER_KILL: u64 = 2 * CAPACITY as u64;
/// Every message the surviving consumer receives.
const TOTAL: u64 = MESSAGES + AFTER_KILL;
/// The producer's pause between sends, so that the async consumer runs dry and parks.
const PACE: Duration = Duration::from_millis(2);
/// The async consumer's liveness interval: the timer of each of its waits, and how soon it
/// finds the producer dead. A wait that a message ends well before it was woken by a knock.
const CONSUMER_LIVENESS: Duration = Duration::from_secs(1);
/// Every wait of a child, on anything: generous, since the assertions are on counts.
const DEADLINE: Duration = Duration::from_secs(30);
/// Every wait of the test on a child: longer than the child's own, so that a child that
/// fails says why before the test gives up on it.
const TEST_DEADLINE: Duration = Duration::from_secs(90);

/// The environment variable that sets the default ring directory (of the library and the
/// `gpuring` command).
const DIR_ENV: &str = "GPURING_DIR";

/// The prefix of the lines a child writes on stderr to tell the test where it is.
const MARK: &str = "@gpuring-ns ";

/// The namespaces the isolated side has of its own: a row of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Pid,
    Net,
    Ipc,
    Mount,
    All,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Pid => "pid namespace",
            Row::Net => "network namespace",
            Row::Ipc => "IPC namespace",
            Row::Mount => "mount namespace + private /dev/shm",
            Row::All => "all namespaces",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Row::Pid => "pid",
            Row::Net => "net",
            Row::Ipc => "ipc",
            Row::Mount => "mnt",
            Row::All => "all",
        }
    }

    fn from_key(key: &str) -> Row {
        [Row::Pid, Row::Net, Row::Ipc, Row::Mount, Row::All]
            .into_iter()
            .find(|r| r.key() == key)
            .unwrap_or_else(|| panic!("no row {key}"))
    }

    /// Whether this row gives the isolated side namespace `ns` (as `/proc/self/ns` names it).
    fn has(self, ns: &str) -> bool {
        match self {
            Row::All => true,
            row => row.key() == ns,
        }
    }

    /// `unshare`'s options for this row. The pid namespace's first process (`--fork`) is
    /// killed with `unshare` (`--kill-child`), and with it the whole namespace.
    fn unshare_args(self) -> Vec<&'static str> {
        let mut args = Vec::new();
        if self.has("pid") {
            args.extend(["--pid", "--fork", "--kill-child"]);
        }
        if self == Row::All {
            // A /proc of the namespace, as a container has.
            args.push("--mount-proc");
        }
        if self.has("net") {
            args.push("--net");
        }
        if self.has("ipc") {
            args.push("--ipc");
        }
        if self.has("mnt") {
            args.push("--mount");
        }
        args
    }
}

/// Which side is isolated: a column of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Consumers,
    Producer,
    Both,
}

impl Column {
    const ALL: [Column; 3] = [Column::Consumers, Column::Producer, Column::Both];

    fn name(self) -> &'static str {
        match self {
            Column::Consumers => "consumers isolated",
            Column::Producer => "producer isolated",
            Column::Both => "both isolated",
        }
    }

    fn producer(self) -> bool {
        self != Column::Consumers
    }

    fn consumers(self) -> bool {
        self != Column::Producer
    }
}

/// The namespaces compared between the test and its children.
const NAMESPACES: [&str; 4] = ["pid", "net", "ipc", "mnt"];

/// The namespace `/proc/self/ns/{ns}` of this process, as `net:[4026531840]`.
fn namespace(ns: &str) -> String {
    let link = fs::read_link(format!("/proc/self/ns/{ns}")).expect("/proc/self/ns");
    link.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------------------------
// The test side: one cell at a time.

#[test]
#[ignore = "needs root and unshare"]
fn pid_namespace() {
    row(Row::Pid, "pid_namespace");
}

#[test]
#[ignore = "needs root and unshare"]
fn network_namespace() {
    row(Row::Net, "network_namespace");
}

#[test]
#[ignore = "needs root and unshare"]
fn ipc_namespace() {
    row(Row::Ipc, "ipc_namespace");
}

#[test]
#[ignore = "needs root and unshare"]
fn mount_namespace_with_a_private_dev_shm() {
    row(Row::Mount, "mount_namespace_with_a_private_dev_shm");
}

#[test]
#[ignore = "needs root and unshare"]
fn all_namespaces_at_once() {
    row(Row::All, "all_namespaces_at_once");
}

/// Runs the three cells of `row` one after another (or, in a child, its role), and fails
/// naming every cell that failed.
fn row(row: Row, test: &str) {
    if let Some(role) = role() {
        child(&role);
        return;
    }
    let mut failed = Vec::new();
    for column in Column::ALL {
        let cell = format!("{}, {}", row.name(), column.name());
        let t = Instant::now();
        let result = run_cell(row, column, test, &cell);
        let secs = t.elapsed().as_secs_f64();
        match result {
            Ok(wakes) => eprintln!("namespaces: [{cell}] passed ({secs:.1} s; {wakes})"),
            Err(e) => {
                eprintln!("namespaces: [{cell}] FAILED ({secs:.1} s): {e}");
                failed.push(format!("[{cell}] {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "{} of 3 cells failed:\n{}", failed.len(), failed.join("\n"));
}

/// One cell: a producer and two consumers, one of which is killed, then the producer.
/// Returns what woke the async consumer's waits.
fn run_cell(row: Row, column: Column, test: &str, cell: &str) -> Result<String, String> {
    let name = unique_name("ns");
    let dir = SharedDir::mount(&name)?;
    let peer = |role: &str, isolated: bool| {
        Peer::spawn(test, cell, role, isolated.then_some(row), &name, &dir)
    };
    // The consumers may start first, as containers do: they wait for the ring to appear.
    let mut peers = [
        peer(PRODUCER, column.producer())?,
        peer(ASYNC_CONSUMER, column.consumers())?,
        peer(KILLED_CONSUMER, column.consumers())?,
    ];
    if let Err(mut e) = cell_steps(column, &mut peers) {
        // One failure often brings another: name every child that failed, not only the one
        // the test was waiting for.
        for p in &mut peers {
            if e.starts_with(&format!("the {} ", p.label)) {
                continue; // the error is this child's already
            }
            if let Some(why) = p.failure() {
                e.push_str(&format!("\n    also: {why}"));
            }
        }
        return Err(e);
    }
    // Nothing of the ring went to the host's /dev/shm: the directory named is the only one.
    let strays = dir.strays();
    if !strays.is_empty() {
        return Err(format!("files of the ring in the host's /dev/shm: {strays:?}"));
    }
    Ok(peers[1].wakes())
}

/// The cell's steps, from the test's side.
fn cell_steps(column: Column, [producer, reader, victim]: &mut [Peer; 3]) -> Result<(), String> {
    producer.expect("created")?;
    // (2) The victim holds the last message of the first run when it is killed.
    victim.expect("holding")?;
    victim.sigkill()?;
    producer.tell("victim-killed")?;
    producer.expect("reclaimed")?;
    if column.producer() {
        producer.expect("cli-ok")?;
    }
    // (1) and (4) checked.
    reader.expect("received")?;
    if column.consumers() {
        reader.expect("cli-ok")?;
    }
    // (3) The reader finds the producer dead, then exits.
    producer.sigkill()?;
    reader.expect_success()
}

/// A tmpfs mounted for one cell (the directory both sides share), and a marker file in the
/// host's /dev/shm that a private /dev/shm must not show. Unmounted and removed on drop, with
/// any file of the ring that went to the host's /dev/shm instead.
struct SharedDir {
    path: PathBuf,
    marker: PathBuf,
    ring: String,
}

impl SharedDir {
    fn mount(ring: &str) -> Result<SharedDir, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag =
            format!("gpuring-ns-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let path = std::env::temp_dir().join(&tag);
        fs::create_dir(&path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        let marker = Path::new("/dev/shm").join(format!("{tag}-marker"));
        // From here on, drop cleans up whatever was made.
        let dir = SharedDir { path, marker, ring: ring.to_owned() };
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m,mode=0700", "gpuring-ns"])
            .arg(&dir.path)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            return Err(format!("mount -t tmpfs on {}: {why}", dir.path.display()));
        }
        fs::write(&dir.marker, b"").map_err(|e| format!("{}: {e}", dir.marker.display()))?;
        Ok(dir)
    }

    /// Files in the host's /dev/shm whose names contain the ring's.
    fn strays(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir("/dev/shm") else { return Vec::new() };
        entries
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|f| f.contains(&self.ring))
            .collect()
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.marker);
        for f in self.strays() {
            let _ = fs::remove_file(Path::new("/dev/shm").join(f));
        }
        let umount = |lazy: bool| {
            let mut cmd = Command::new("umount");
            if lazy {
                cmd.arg("--lazy");
            }
            cmd.arg(&self.path).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
        };
        if !umount(false) && !umount(true) {
            eprintln!("namespaces: could not unmount {}", self.path.display());
        }
        let _ = fs::remove_dir(&self.path);
    }
}

/// One child of a cell: this test binary again with a role, under `unshare` if isolated.
/// Killed (and with it its pid namespace) on drop.
struct Peer {
    label: String,
    row: Option<Row>,
    child: Child,
    stdin: Option<ChildStdin>,
    marks: Receiver<String>,
    seen: HashSet<String>,
    /// Whether the test killed it.
    killed: bool,
    /// Its stderr lines other than marks: the last ones go into failure messages.
    log: Arc<Mutex<Vec<String>>>,
}

impl Peer {
    fn spawn(
        test: &str,
        cell: &str,
        role: &str,
        row: Option<Row>,
        name: &str,
        dir: &SharedDir,
    ) -> Result<Peer, String> {
        let label = format!("{role}{}", if row.is_some() { " (isolated)" } else { "" });
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = match row {
            None => Command::new(&exe),
            Some(row) => {
                let mut cmd = Command::new("unshare");
                cmd.args(row.unshare_args());
                if row.has("mnt") {
                    // A /dev/shm of its own, as a container has; the ring directory stays.
                    let shm = "mount -t tmpfs -o size=64m gpuring-ns-shm /dev/shm";
                    cmd.args(["sh", "-c", &format!("{shm} && exec \"$0\" \"$@\"")]);
                }
                cmd.arg(&exe);
                cmd
            }
        };
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
            .env(ROLE, role)
            .env("NS_CELL", cell)
            .env("NS_RING", name)
            .env("NS_DIR", &dir.path)
            .env("NS_SHM_MARKER", &dir.marker)
            .env("NS_ROW", row.map_or("", Row::key))
            // A failure's message, not a backtrace, is what the test reports.
            .env("RUST_BACKTRACE", "0")
            .env_remove(DIR_ENV)
            .stdin(Stdio::piped())
            // The child's harness chatter; what it has to say goes to stderr.
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for ns in NAMESPACES {
            cmd.env(format!("NS_HOST_{ns}"), namespace(ns));
        }
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| format!("starting the {label}: {e}"))?;
        let stdin = child.stdin.take();
        let stderr = child.stderr.take().unwrap();
        let (tx, marks) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let (log, prefix) = (log.clone(), format!("[{cell}] {label}: "));
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    match line.strip_prefix(MARK) {
                        Some(mark) => drop(tx.send(mark.to_owned())),
                        // util-linux's unshare when the process it forked was killed: it
                        // cannot pass SIGKILL on by re-raising it, and says so.
                        None if line.starts_with("unshare: sigprocmask unblock failed") => {}
                        None => {
                            eprintln!("{prefix}{line}");
                            log.lock().unwrap().push(line);
                        }
                    }
                }
            });
        }
        Ok(Peer { label, row, child, stdin, marks, seen: HashSet::new(), killed: false, log })
    }

    /// The last lines it wrote, for a failure message.
    fn tail(&self) -> String {
        let log = self.log.lock().unwrap();
        let from = log.len().saturating_sub(12);
        if log.is_empty() {
            String::from(" (no output)")
        } else {
            format!("; its last output:\n    {}", log[from..].join("\n    "))
        }
    }

    /// Why it failed, if it has ended unsuccessfully without being killed: its status and
    /// its panic message.
    fn failure(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        if status.success() || self.killed {
            return None;
        }
        let log = self.log.lock().unwrap();
        let message = log
            .iter()
            .skip_while(|l| !l.contains("panicked at"))
            .skip(1)
            .take_while(|l| !l.starts_with("note:"))
            .take(3)
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join(" / ");
        Some(format!("the {} failed ({status}): {message}", self.label))
    }

    /// Waits until it writes mark `what`.
    fn expect(&mut self, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + TEST_DEADLINE;
        while !self.seen.contains(what) {
            match self.marks.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(mark) => {
                    self.seen.insert(mark);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let tail = self.tail();
                    return Err(format!(
                        "the {}: no {what:?} within {TEST_DEADLINE:?}{tail}",
                        self.label
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.wait()?;
                    return Err(format!(
                        "the {} ended ({status}) before {what:?}{}",
                        self.label,
                        self.tail()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The async consumer's wake counts, from the mark it wrote before it ended.
    fn wakes(&mut self) -> String {
        self.seen.extend(self.marks.try_iter());
        let wakes = self.seen.iter().find_map(|m| m.strip_prefix("wakes "));
        wakes.map_or_else(|| String::from("no wake counts"), |w| format!("async wakes: {w}"))
    }

    /// Writes a command line on its stdin.
    fn tell(&mut self, what: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{what}").map_err(|e| format!("telling the {} {what:?}: {e}", self.label))
    }

    /// The pid (in the test's namespace) of the process that runs the role: the child itself,
    /// or, in a pid namespace, the first process there (unshare's child, pid 1 inside).
    fn role_pid(&self) -> Result<u32, String> {
        let id = self.child.id();
        if !self.row.is_some_and(|r| r.has("pid")) {
            return Ok(id);
        }
        let children = fs::read_to_string(format!("/proc/{id}/task/{id}/children"))
            .map_err(|e| format!("the children of unshare ({id}): {e}"))?;
        let first = children.split_whitespace().next();
        first.and_then(|p| p.parse().ok()).ok_or_else(|| format!("unshare ({id}) has no child"))
    }

    /// Kills the role's process with SIGKILL, as `docker kill` does, and waits for its end.
    fn sigkill(&mut self) -> Result<(), String> {
        let pid = self.role_pid()?;
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL)
            .map_err(|e| format!("kill -9 the {}: {e}", self.label))?;
        self.killed = true;
        self.wait().map(drop)
    }

    /// Waits (within the deadline) for the child to end.
    fn wait(&mut self) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + TEST_DEADLINE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => {
                    return Err(format!("the {} did not end in {TEST_DEADLINE:?}", self.label))
                }
                Err(e) => return Err(format!("waiting for the {}: {e}", self.label)),
            }
        }
    }

    /// Waits for the child to end and checks that it succeeded.
    fn expect_success(&mut self) -> Result<(), String> {
        let status = self.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the {} failed ({status}){}", self.label, self.tail()))
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // The role first (a pid namespace's first process ignores signals from inside, not
            // this one), then unshare, whose --kill-child takes down what is left.
            if let Ok(pid) = self.role_pid() {
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Makes `cmd`'s process get SIGKILL when the thread that started it ends, so that no child
/// outlives a test that was itself killed.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only prctl, which is
    // async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The children.

const PRODUCER: &str = "producer";
const ASYNC_CONSUMER: &str = "async consumer";
const KILLED_CONSUMER: &str = "consumer to kill";

/// Where a child is: one line on stderr that the test waits for.
fn mark(what: &str) {
    eprintln!("{MARK}{what}");
}

/// What a child knows of its cell.
struct Cell {
    name: String,
    ring: String,
    dir: PathBuf,
    row: Option<Row>,
}

fn child(role: &str) {
    let row: String = env("NS_ROW");
    let me = Cell {
        name: env("NS_CELL"),
        ring: env("NS_RING"),
        dir: env("NS_DIR"),
        row: (!row.is_empty()).then(|| Row::from_key(&row)),
    };
    check_namespaces(&me, role);
    if me.row.is_some_and(|r| r.has("net")) {
        // A new network namespace has its loopback down; a container's is up.
        loopback_up();
    }
    match role {
        PRODUCER => producer(&me),
        ASYNC_CONSUMER => async_consumer(&me),
        KILLED_CONSUMER => killed_consumer(&me),
        other => panic!("no role {other}"),
    }
}

/// Checks that this process has its own namespaces where its row says so, and shares the
/// test's everywhere else: the cell is what it claims to be.
fn check_namespaces(me: &Cell, role: &str) {
    for ns in NAMESPACES {
        let host: String = env(&format!("NS_HOST_{ns}"));
        let own = me.row.is_some_and(|r| r.has(ns));
        assert_eq!(
            namespace(ns) != host,
            own,
            "[{}] {role}: expected {} {ns} namespace",
            me.name,
            if own { "its own" } else { "the test's" }
        );
    }
    if me.row.is_some_and(|r| r.has("pid")) {
        assert_eq!(std::process::id(), 1, "[{}] {role}: not pid 1 in its namespace", me.name);
    }
    let marker: PathBuf = env("NS_SHM_MARKER");
    let private = me.row.is_some_and(|r| r.has("mnt"));
    assert_eq!(
        !marker.exists(),
        private,
        "[{}] {role}: the host's /dev/shm is {}",
        me.name,
        if private { "visible in a private /dev/shm" } else { "not visible" }
    );
}

/// Sets the loopback interface up (`ip link set lo up`, without needing iproute2).
fn loopback_up() {
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain data, for which all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the interface name from `req` and writes its flags there.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) };
    assert_eq!(r, 0, "SIOCGIFFLAGS lo: {}", std::io::Error::last_os_error());
    // SAFETY: SIOCGIFFLAGS filled the union's `ifru_flags` member.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the name and flags from `req`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) };
    assert_eq!(r, 0, "SIOCSIFFLAGS lo: {}", std::io::Error::last_os_error());
}

/// Waits for command `what` on stdin (from the test).
fn await_command(me: &Cell, what: &str) {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), what, "[{}] expected the command {what:?}", me.name);
}

/// Waits until stdin ends (the test let go of this child without killing it), then leaves.
fn until_stdin_ends() -> ! {
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut sink);
    std::process::exit(0);
}

/// Acquires a slot (failing after the deadline, naming `why`), writes message `seq`'s
/// pattern and publishes it.
fn send(me: &Cell, tx: &mut Producer, seq: u64, why: &str) {
    let mut slot = match tx.acquire_timeout(DEADLINE) {
        Ok(slot) => slot,
        Err(e) => panic!("[{}] producer: message {seq}: {e} ({why})", me.name),
    };
    assert_eq!(slot.seq(), seq, "[{}] producer: sequence numbers", me.name);
    pattern::fill(&mut slot[..SIZE], seq);
    slot.publish(SIZE, b"").unwrap_or_else(|e| panic!("[{}] producer: publish: {e}", me.name));
    std::thread::sleep(PACE);
}

/// Checks that message `m` is message `seq`, every byte of it.
fn check_message(me: &Cell, who: &str, m: &[u8], got: u64, seq: u64) {
    assert_eq!(got, seq, "[{}] {who}: sequence numbers", me.name);
    assert_eq!(m.len(), SIZE, "[{}] {who}: length of message {seq}", me.name);
    let bad = pattern::mismatches(m, seq);
    assert_eq!(bad, 0, "[{}] {who}: {bad} bytes of message {seq} are wrong", me.name);
}

fn producer(me: &Cell) {
    let mut tx = Producer::builder(&me.ring)
        .dir(&me.dir)
        .capacity(CAPACITY)
        .slot_size(SIZE)
        .policy(Policy::Block)
        .create()
        .unwrap_or_else(|e| panic!("[{}] producer: create: {e}", me.name));
    mark("created");
    match tx.wait_for_consumers(2, DEADLINE) {
        Ok(_) => {}
        Err(e) => panic!("[{}] producer: the consumers did not join: {e}", me.name),
    }
    for seq in 0..MESSAGES {
        send(me, &mut tx, seq, "both consumers live");
    }
    await_command(me, "victim-killed");
    // (2) A ring's worth more than the ring holds: the dead consumer has to go first.
    for seq in MESSAGES..TOTAL {
        send(me, &mut tx, seq, "is the killed consumer still gating the producer?");
    }
    // Counted by the producer's stats, as `gpuring stat` shows them.
    let t = Instant::now();
    loop {
        let s = gpuring::inspect::status_in(&me.dir, &me.ring)
            .unwrap_or_else(|e| panic!("[{}] producer: inspect: {e}", me.name));
        if s.reclaims == 1 {
            break;
        }
        assert!(
            s.reclaims == 0 && t.elapsed() < DEADLINE,
            "[{}] producer: the killed consumer was not reclaimed once: {} reclaims, consumers \
             {:?}",
            me.name,
            s.reclaims,
            s.consumers
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    mark("reclaimed");
    if me.row.is_some() {
        cli_checks(me, "producer");
        mark("cli-ok");
    }
    // Alive until the test kills it.
    until_stdin_ends();
}

fn open_consumer(me: &Cell, who: &str, liveness: Option<Duration>) -> Consumer {
    let mut b = Consumer::builder(&me.ring).dir(&me.dir);
    if let Some(every) = liveness {
        b = b.liveness_interval(every);
    }
    b.open_timeout(DEADLINE).unwrap_or_else(|e| panic!("[{}] {who}: open: {e}", me.name))
}

fn killed_consumer(me: &Cell) {
    let who = KILLED_CONSUMER;
    let rx = open_consumer(me, who, None);
    let mut held = None;
    for seq in 0..MESSAGES {
        let m = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("[{}] {who}: message {seq}: {e}", me.name));
        check_message(me, who, &m, m.seq(), seq);
        held = Some(m);
    }
    // Killed holding the last message, as a crashed inference server holds its frame.
    mark("holding");
    let _held = held;
    until_stdin_ends();
}

fn async_consumer(me: &Cell) {
    let who = ASYNC_CONSUMER;
    let rx = open_consumer(me, who, Some(CONSUMER_LIVENESS));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // (1) and (4): every message, awaited.
    rt.block_on(async {
        for seq in 0..TOTAL {
            let m = match tokio::time::timeout(DEADLINE, rx.recv_async()).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => panic!("[{}] {who}: message {seq}: {e}", me.name),
                Err(_) => panic!("[{}] {who}: message {seq} not in {DEADLINE:?}", me.name),
            };
            check_message(me, who, &m, m.seq(), seq);
        }
    });
    // (4) Doorbells, not timers, woke the waits that delivered. Counted now: the wait that
    // finds the producer dead below ends by its timer (a liveness tick), as it should.
    let wakes = gpuring::testing::async_wakes();
    mark(&format!("wakes doorbell {}, timer {}", wakes.doorbell, wakes.timer));
    assert_eq!(
        wakes.timer, 0,
        "[{}] {who}: {} waits found a message when their timer ended: the doorbell did not \
         ring ({wakes:?})",
        me.name, wakes.timer
    );
    assert!(wakes.doorbell > 0, "[{}] {who}: no doorbell woke a wait ({wakes:?})", me.name);
    mark("received");
    if me.row.is_some() {
        cli_checks(me, who);
        mark("cli-ok");
    }
    // (3) The test kills the producer now.
    rt.block_on(async {
        match tokio::time::timeout(DEADLINE, rx.recv_async()).await {
            Ok(Err(RecvError::Disconnected)) => {}
            Ok(Ok(m)) => panic!("[{}] {who}: message {} after the last", me.name, m.seq()),
            Ok(Err(e)) => panic!("[{}] {who}: {e} instead of Disconnected", me.name),
            Err(_) => panic!("[{}] {who}: the producer's death not seen in {DEADLINE:?}", me.name),
        }
    });
    assert_eq!(rx.ended(), Some(Ended::Died), "[{}] {who}: how the stream ended", me.name);
}

// ---------------------------------------------------------------------------------------------
// The command line, run from a child (inside its namespaces).

/// Runs `gpuring ARGS` with extra environment: (exit code, stdout, stderr).
fn cli(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut cmd = Command::new(gpuring_bin());
    cmd.args(args).env_remove(DIR_ENV).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run gpuring");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

/// `gpuring stat NAME --dir DIR --json`, parsed.
fn stat_json(me: &Cell, who: &str) -> serde_json::Value {
    let dir = me.dir.to_str().unwrap();
    let (code, out, err) = cli(&["stat", &me.ring, "--dir", dir, "--json"], &[]);
    assert_eq!(code, 0, "[{}] {who}: gpuring stat --dir failed: {err}", me.name);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("[{}] {who}: {e}: {out}", me.name))
}

/// (5) What an operator inside the isolated namespaces sees and may do: the producer is
/// alive, has published everything and reclaimed the killed consumer; the one consumer left
/// is alive; `rm` is refused; the exporter serves it.
fn cli_checks(me: &Cell, who: &str) {
    let ring = me.ring.as_str();
    let dir = me.dir.to_str().unwrap();
    let file = me.dir.join(format!("{}{ring}", gpuring::shm::SHM_PREFIX));

    let s = stat_json(me, who);
    let consumers = s["consumers"].as_array().cloned().unwrap_or_default();
    let ok = s["name"] == ring
        && s["producer_alive"] == true
        && s["published"] == TOTAL
        && s["reclaims"] == 1
        && consumers.len() == 1
        && consumers[0]["alive"] == true;
    assert!(ok, "[{}] {who}: gpuring stat --dir shows {s}", me.name);

    // The same through the environment variable, and in the list.
    let (code, out, err) = cli(&["stat", ring, "--json"], &[(DIR_ENV, &me.dir)]);
    assert_eq!(code, 0, "[{}] {who}: gpuring stat with GPURING_DIR: {err}", me.name);
    assert!(out.contains(ring), "[{}] {who}: gpuring stat with GPURING_DIR: {out}", me.name);
    let (code, out, err) = cli(&["list", "--dir", dir, "--json"], &[]);
    assert_eq!(code, 0, "[{}] {who}: gpuring list --dir: {err}", me.name);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let listed = list.as_array().is_some_and(|l| l.iter().any(|r| r["name"] == ring));
    assert!(listed, "[{}] {who}: gpuring list --dir does not list {ring}: {out}", me.name);

    let (code, out, err) = cli(&["rm", ring, "--dir", dir], &[]);
    assert_ne!(code, 0, "[{}] {who}: gpuring rm removed a live ring: {out}", me.name);
    assert!(
        file.exists(),
        "[{}] {who}: {} is gone after a refused gpuring rm ({err})",
        me.name,
        file.display()
    );
    assert_eq!(stat_json(me, who)["producer_alive"], true, "[{}] {who}: after rm", me.name);

    exporter_check(me, who);
}

/// Kills the exporter however the check ends.
struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpuring exporter` (its directory from GPURING_DIR) on a free loopback port, fetched over
/// HTTP in the same namespaces.
fn exporter_check(me: &Cell, who: &str) {
    let ring = me.ring.as_str();
    let mut cmd = Command::new(gpuring_bin());
    cmd.args(["exporter", "--listen", "127.0.0.1:0", ring])
        .env(DIR_ENV, &me.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().expect("start gpuring exporter");
    let stderr = child.stderr.take().unwrap();
    let _exporter = Exporter(child);
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).unwrap();
    let base = line
        .trim()
        .split_once("http://")
        .and_then(|(_, rest)| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("[{}] {who}: gpuring exporter says {line:?}", me.name));
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(DEADLINE)).build().into();
    let url = format!("http://{base}/metrics");
    let mut response =
        agent.get(&url).call().unwrap_or_else(|e| panic!("[{}] {who}: GET {url}: {e}", me.name));
    let body = response.body_mut().read_to_string().unwrap();
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |metric: &str| {
        let mut found = scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric && s.labels.get("ring") == Some(ring))
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => f64::NAN,
            });
        let v = found.next();
        assert!(found.next().is_none(), "[{}] {who}: two samples of {metric}", me.name);
        v
    };
    let seen = [
        ("gpuring_up", value("gpuring_up"), 1.0),
        ("gpuring_producer_alive", value("gpuring_producer_alive"), 1.0),
        ("gpuring_published_total", value("gpuring_published_total"), TOTAL as f64),
        ("gpuring_consumer_alive", value("gpuring_consumer_alive"), 1.0),
    ];
    for (metric, got, want) in seen {
        assert_eq!(got, Some(want), "[{}] {who}: exporter's {metric}:\n{body}", me.name);
    }
}
