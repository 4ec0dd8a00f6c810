//! The harness of the namespace tests (tests/namespaces.rs in host memory,
//! tests/gpu_namespaces.rs in CUDA memory): the matrix's rows and columns, a tmpfs ring
//! directory per cell, and peers started under `unshare` as containers run them, each
//! reporting where it is by marks on stderr. Included by both with `#[path]`.
#![allow(dead_code)]

use std::collections::HashSet;
use std::ffi::OsString;
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

use crate::common::{env, ROLE};

/// Every wait of a child, on anything: generous, since the assertions are on counts.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// Every wait of the test on a child: longer than the child's own, so that a child that
/// fails says why before the test gives up on it.
pub const TEST_DEADLINE: Duration = Duration::from_secs(90);

/// The environment variable that sets the default ring directory (of the library and the
/// `gpuring` command).
pub const DIR_ENV: &str = "GPURING_DIR";

/// The prefix of the lines a child writes on stderr to tell the test where it is.
pub const MARK: &str = "@gpuring-ns ";

/// The namespaces the isolated side has of its own: a row of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
    Pid,
    /// A pid namespace with a /proc of its own (so also a mount namespace, but the host's
    /// /dev/shm), as every container has: CUDA does not start in a pid namespace whose /proc
    /// is the host's.
    PidProc,
    Net,
    Ipc,
    Mount,
    All,
    /// Every namespace of its own, but the host's /dev/shm (bind-mounted, as NVIDIA's
    /// Kubernetes device plugin gives MPS clients the MPS server's).
    AllButShm,
}

impl Row {
    pub fn name(self) -> &'static str {
        match self {
            Row::Pid => "pid namespace",
            Row::PidProc => "pid namespace (own /proc)",
            Row::Net => "network namespace",
            Row::Ipc => "IPC namespace",
            Row::Mount => "mount namespace + private /dev/shm",
            Row::All => "all namespaces",
            Row::AllButShm => "all namespaces but the host's /dev/shm",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Row::Pid => "pid",
            Row::PidProc => "pid-proc",
            Row::Net => "net",
            Row::Ipc => "ipc",
            Row::Mount => "mnt",
            Row::All => "all",
            Row::AllButShm => "all-but-shm",
        }
    }

    pub fn from_key(key: &str) -> Row {
        [Row::Pid, Row::PidProc, Row::Net, Row::Ipc, Row::Mount, Row::All, Row::AllButShm]
            .into_iter()
            .find(|r| r.key() == key)
            .unwrap_or_else(|| panic!("no row {key}"))
    }

    /// Whether this row gives the isolated side namespace `ns` (as `/proc/self/ns` names it).
    pub fn has(self, ns: &str) -> bool {
        match self {
            Row::All | Row::AllButShm => true,
            Row::PidProc => ns == "pid" || ns == "mnt",
            row => row.key() == ns,
        }
    }

    /// Whether the isolated side gets a /dev/shm of its own.
    pub fn private_shm(self) -> bool {
        self.has("mnt") && !matches!(self, Row::AllButShm | Row::PidProc)
    }

    /// `unshare`'s options for this row. The pid namespace's first process (`--fork`) is
    /// killed with `unshare` (`--kill-child`), and with it the whole namespace.
    pub fn unshare_args(self) -> Vec<&'static str> {
        let mut args = Vec::new();
        if self.has("pid") {
            args.extend(["--pid", "--fork", "--kill-child"]);
        }
        if self.has("pid") && self.has("mnt") {
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
pub enum Column {
    Consumers,
    Producer,
    Both,
}

impl Column {
    pub const ALL: [Column; 3] = [Column::Consumers, Column::Producer, Column::Both];

    pub fn name(self) -> &'static str {
        match self {
            Column::Consumers => "consumers isolated",
            Column::Producer => "producer isolated",
            Column::Both => "both isolated",
        }
    }

    pub fn producer(self) -> bool {
        self != Column::Consumers
    }

    pub fn consumers(self) -> bool {
        self != Column::Producer
    }
}

/// The namespaces compared between the test and its children.
pub const NAMESPACES: [&str; 4] = ["pid", "net", "ipc", "mnt"];

/// The namespace `/proc/self/ns/{ns}` of this process, as `net:[4026531840]`.
pub fn namespace(ns: &str) -> String {
    let link = fs::read_link(format!("/proc/self/ns/{ns}")).expect("/proc/self/ns");
    link.to_string_lossy().into_owned()
}

/// A tmpfs mounted for one cell (the directory both sides share), and a marker file in the
/// host's /dev/shm that a private /dev/shm must not show. Unmounted and removed on drop, with
/// any file of the ring that went to the host's /dev/shm instead.
pub struct SharedDir {
    path: PathBuf,
    marker: PathBuf,
    ring: String,
}

impl SharedDir {
    pub fn mount(ring: &str) -> Result<SharedDir, String> {
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
    pub fn strays(&self) -> Vec<String> {
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

/// What a peer runs.
pub enum Program<'a> {
    /// This test binary again, running test `.0` (which dispatches on the role).
    Test(&'a str),
    /// A Python script (`python3 SCRIPT`), with the environment's `PYTHONPATH`.
    Python(&'a Path),
}

/// One child of a cell: a [`Program`] with a role, under `unshare` if isolated. Killed (and
/// with it its pid namespace) on drop.
pub struct Peer {
    pub label: String,
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
    /// Starts `program` as `role` of cell `cell` (ring `name` in `dir`), isolated in `row`'s
    /// namespaces if any, with `extra` environment variables besides the cell's.
    pub fn spawn(
        program: &Program<'_>,
        (cell, role): (&str, &str),
        row: Option<Row>,
        (name, dir): (&str, &SharedDir),
        extra: &[(&str, String)],
    ) -> Result<Peer, String> {
        let label = format!("{role}{}", if row.is_some() { " (isolated)" } else { "" });
        let exe: OsString = match program {
            Program::Test(_) => std::env::current_exe().map_err(|e| e.to_string())?.into(),
            Program::Python(_) => "python3".into(),
        };
        let mut cmd = match row {
            None => Command::new(&exe),
            Some(row) => {
                let mut cmd = Command::new("unshare");
                cmd.args(row.unshare_args());
                if row.private_shm() {
                    // A /dev/shm of its own, as a container has; the ring directory stays.
                    let shm = "mount -t tmpfs -o size=64m gpuring-ns-shm /dev/shm";
                    cmd.args(["sh", "-c", &format!("{shm} && exec \"$0\" \"$@\"")]);
                }
                cmd.arg(&exe);
                cmd
            }
        };
        match program {
            Program::Test(test) => {
                cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
            }
            Program::Python(script) => cmd.arg("-u").arg(script),
        };
        cmd.envs(extra.iter().map(|(k, v)| (k, v)))
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
    pub fn tail(&self) -> String {
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
    pub fn failure(&mut self) -> Option<String> {
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
    pub fn expect(&mut self, what: &str) -> Result<(), String> {
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
    pub fn wakes(&mut self) -> String {
        self.seen.extend(self.marks.try_iter());
        let wakes = self.seen.iter().find_map(|m| m.strip_prefix("wakes "));
        wakes.map_or_else(|| String::from("no wake counts"), |w| format!("async wakes: {w}"))
    }

    /// Writes a command line on its stdin.
    pub fn tell(&mut self, what: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{what}").map_err(|e| format!("telling the {} {what:?}: {e}", self.label))
    }

    /// The pid (in the test's namespace) of the process that runs the role: the child itself,
    /// or, in a pid namespace, the first process there (unshare's child, pid 1 inside).
    pub fn role_pid(&self) -> Result<u32, String> {
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
    pub fn sigkill(&mut self) -> Result<(), String> {
        let pid = self.role_pid()?;
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL)
            .map_err(|e| format!("kill -9 the {}: {e}", self.label))?;
        self.killed = true;
        self.wait().map(drop)
    }

    /// Waits (within the deadline) for the child to end.
    pub fn wait(&mut self) -> Result<ExitStatus, String> {
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
    pub fn expect_success(&mut self) -> Result<(), String> {
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
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only prctl, which is
    // async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

/// Where a child is: one line on stderr that the test waits for.
pub fn mark(what: &str) {
    eprintln!("{MARK}{what}");
}

/// What a child knows of its cell.
pub struct Cell {
    pub name: String,
    pub ring: String,
    pub dir: PathBuf,
    pub row: Option<Row>,
}

/// Checks that this process has its own namespaces where its row says so, and shares the
impl Cell {
    /// This child's cell, from the environment its [`Peer`] was started with, after checking
    /// that it runs in the namespaces its row says (and with its loopback up in a network
    /// namespace of its own, as a container's is).
    pub fn enter(role: &str) -> Cell {
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
        me
    }
}

/// Waits until the producer's stats (what `gpuring stat` shows) count exactly one reclaim of
/// a dead consumer, failing after [`DEADLINE`] or on any other count.
pub fn await_one_reclaim(me: &Cell) {
    let t = Instant::now();
    loop {
        let s = gpuring::inspect::status_in(&me.dir, &me.ring)
            .unwrap_or_else(|e| panic!("[{}] producer: inspect: {e}", me.name));
        if s.reclaims == 1 {
            return;
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
}

/// test's everywhere else: the cell is what it claims to be.
pub fn check_namespaces(me: &Cell, role: &str) {
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
    let private = me.row.is_some_and(Row::private_shm);
    assert_eq!(
        !marker.exists(),
        private,
        "[{}] {role}: the host's /dev/shm is {}",
        me.name,
        if private { "visible in a private /dev/shm" } else { "not visible" }
    );
}

/// Sets the loopback interface up (`ip link set lo up`, without needing iproute2).
pub fn loopback_up() {
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
pub fn await_command(me: &Cell, what: &str) {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), what, "[{}] expected the command {what:?}", me.name);
}

/// Waits until stdin ends (the test let go of this child without killing it), then leaves.
pub fn until_stdin_ends() -> ! {
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut sink);
    std::process::exit(0);
}
