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
#[path = "common/ns.rs"]
mod ns;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{gpuring_bin, role, unique_name};
use gpuring::testing::pattern;
use gpuring::{Consumer, Ended, Policy, Producer, RecvError};
use ns::{
    await_command, await_one_reclaim, die_with_parent, mark, until_stdin_ends, Cell, Column, Peer,
    Program, Row, SharedDir, DEADLINE, DIR_ENV,
};
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

#[test]
#[ignore = "needs root and unshare"]
fn pid_namespace_with_its_own_proc() {
    row(Row::PidProc, "pid_namespace_with_its_own_proc");
}

#[test]
#[ignore = "needs root and unshare"]
fn all_namespaces_but_the_hosts_dev_shm() {
    row(Row::AllButShm, "all_namespaces_but_the_hosts_dev_shm");
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
        Peer::spawn(&Program::Test(test), (cell, role), isolated.then_some(row), (&name, &dir), &[])
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

// ---------------------------------------------------------------------------------------------
// The children.

const PRODUCER: &str = "producer";
const ASYNC_CONSUMER: &str = "async consumer";
const KILLED_CONSUMER: &str = "consumer to kill";

fn child(role: &str) {
    let me = Cell::enter(role);
    match role {
        PRODUCER => producer(&me),
        ASYNC_CONSUMER => async_consumer(&me),
        KILLED_CONSUMER => killed_consumer(&me),
        other => panic!("no role {other}"),
    }
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
    await_one_reclaim(me);
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
