//! CUDA rings across namespaces, as containers run them: part 1's matrix (tests/namespaces.rs,
//! host memory) for each way a CUDA ring shares its memory and fences: legacy IPC with event
//! fences, legacy IPC with memory fences, and VMM. Rows are the namespaces the isolated side
//! has of its own; columns are which side is isolated (the consumers, the producer, both);
//! sides share only the ring directory, a tmpfs made for each cell.
//!
//! Every cell has a producer (this binary, writing each message's pattern with a kernel), a
//! consumer that checks every byte with a kernel and is killed with SIGKILL while it holds a
//! message, and a PyTorch consumer (tests/ns_torch_reader.py, `torch.from_dlpack` of every
//! message compared on the GPU with its pattern):
//!
//! 1. both consumers read every byte of every message;
//! 2. the killed consumer is reclaimed: the producer (`Block`) sends a ring's worth more, and
//!    its stats count one reclaim;
//! 3. the producer killed with SIGKILL: the PyTorch consumer gets `Disconnected`, with
//!    `ended == "died"`.
//!
//! The last row is every namespace of its own but the host's /dev/shm, as MPS clients in
//! containers have it. Where legacy IPC cannot work (see `Mode::refusal`: the driver's use of
//! process ids across pid namespaces, and events that open only through the producer's
//! /dev/shm), both consumers' opens must fail at once with an error that names what is missing
//! and the modes that work. Those are the tested refusals of the table in docs/containers.md.
//!
//! They need a CUDA GPU, root, util-linux `unshare`, and Python with torch and the gpuring
//! package (`PYTHONPATH`), so they are ignored by default:
//! `cargo test --all-features --test gpu_namespaces -- --ignored --nocapture`. The three
//! columns of a row run at once.

mod common;
#[path = "common/ns.rs"]
mod ns;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{env, role, unique_name};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::{Consumer, Cuda, Fence, PeerPolicy, Policy, Producer, Sharing};
use ns::{
    await_command, await_one_reclaim, mark, until_stdin_ends, Cell, Column, Peer, Program, Row,
    SharedDir, DEADLINE,
};

/// Messages sent while both consumers read.
const MESSAGES: u64 = 200;
/// Bytes of each message: a multiple of 8 (the reader compares 64-bit words).
const SIZE: usize = 256 * 1024;
/// Slots of the ring.
const CAPACITY: u32 = 8;
/// Messages sent after the killed consumer died: more than the ring holds.
const AFTER_KILL: u64 = 2 * CAPACITY as u64;
/// Every message the PyTorch consumer receives.
const TOTAL: u64 = MESSAGES + AFTER_KILL;

/// How a cell's ring shares its memory and fences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    LegacyEvents,
    LegacyMemory,
    Vmm,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::LegacyEvents => "legacy-events",
            Mode::LegacyMemory => "legacy-memory",
            Mode::Vmm => "vmm",
        }
    }

    fn from_key(key: &str) -> Mode {
        [Mode::LegacyEvents, Mode::LegacyMemory, Mode::Vmm]
            .into_iter()
            .find(|m| m.key() == key)
            .unwrap_or_else(|| panic!("no mode {key}"))
    }

    /// If this mode cannot work in `row` and `column`, what the consumers' refusal must say
    /// (every one of these). Legacy IPC goes by process ids, which mean nothing across pid
    /// namespaces: the driver takes a handle whose exporter has our pid for our own (every
    /// process isolated: each is pid 1), and names an event's memory in /dev/shm after its
    /// creator's pid (equal pids of other namespaces would share it). And events open only
    /// through the producer's /dev/shm, which a private one hides.
    fn refusal(self, row: Row, column: Column) -> Option<&'static [&'static str]> {
        let pids = row.has("pid");
        match self {
            Mode::Vmm => None,
            _ if pids && column == Column::Both => Some(&["same pid", "VMM"][..]),
            Mode::LegacyMemory => None,
            Mode::LegacyEvents if pids => Some(&["pid namespace", "Fence::Memory", "VMM"][..]),
            Mode::LegacyEvents if row.private_shm() => {
                Some(&["/dev/shm", "Fence::Memory", "VMM"][..])
            }
            Mode::LegacyEvents => None,
        }
    }
}

/// A bare pid namespace (`Row::Pid`) is left out: its /proc is the host's, where CUDA does
/// not start (the error says so); containers always mount their own.
const ROWS: [Row; 6] = [Row::PidProc, Row::Net, Row::Ipc, Row::Mount, Row::All, Row::AllButShm];

#[test]
#[ignore = "needs a CUDA GPU, root, unshare and Python with torch"]
fn gpu_legacy_events_across_namespaces() {
    matrix(Mode::LegacyEvents, "gpu_legacy_events_across_namespaces");
}

#[test]
#[ignore = "needs a CUDA GPU, root, unshare and Python with torch"]
fn gpu_legacy_memory_fences_across_namespaces() {
    matrix(Mode::LegacyMemory, "gpu_legacy_memory_fences_across_namespaces");
}

#[test]
#[ignore = "needs a CUDA GPU, root, unshare and Python with torch"]
fn gpu_vmm_across_namespaces() {
    matrix(Mode::Vmm, "gpu_vmm_across_namespaces");
}

/// Every cell of `mode`'s matrix (or, in a child, its role); fails naming every cell that
/// failed.
fn matrix(mode: Mode, test: &str) {
    if let Some(role) = role() {
        child(&role);
        return;
    }
    let reader = reader_script();
    let probe = Command::new("python3").args(["-c", "import gpuring, torch"]).output();
    let ok = probe.as_ref().is_ok_and(|o| o.status.success());
    let why = probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(ok, "python3 cannot import gpuring and torch (set PYTHONPATH): {why:?}");
    let mut failed = Vec::new();
    for row in ROWS {
        let results = std::thread::scope(|s| {
            let cells: Vec<_> = Column::ALL
                .into_iter()
                .map(|column| {
                    let cell = format!("{}: {}, {}", mode.key(), row.name(), column.name());
                    let reader = &reader;
                    s.spawn(move || {
                        let t = Instant::now();
                        let result = run_cell(mode, row, column, test, &cell, reader);
                        (cell, result, t.elapsed().as_secs_f64())
                    })
                })
                .collect();
            cells.into_iter().map(|c| c.join().expect("a cell's thread")).collect::<Vec<_>>()
        });
        for (cell, result, secs) in results {
            match result {
                Ok(what) => eprintln!("gpu namespaces: [{cell}] {what} ({secs:.1} s)"),
                Err(e) => {
                    eprintln!("gpu namespaces: [{cell}] FAILED ({secs:.1} s): {e}");
                    failed.push(format!("[{cell}] {e}"));
                }
            }
        }
    }
    let cells = ROWS.len() * Column::ALL.len();
    assert!(failed.is_empty(), "{} of {cells} cells failed:\n{}", failed.len(), failed.join("\n"));
}

/// tests/ns_torch_reader.py, from the current directory (the repository root, as the test
/// runner starts us) or from the crate's.
fn reader_script() -> PathBuf {
    let rel = PathBuf::from("tests/ns_torch_reader.py");
    let candidates = [rel.clone(), PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(&rel)];
    let found = candidates.into_iter().find(|p| p.exists()).expect("tests/ns_torch_reader.py");
    found.canonicalize().expect("the reader script's path")
}

/// One cell: "passed" or "refused as expected", or why it failed.
fn run_cell(
    mode: Mode,
    row: Row,
    column: Column,
    test: &str,
    cell: &str,
    reader: &std::path::Path,
) -> Result<&'static str, String> {
    let name = unique_name("gns");
    let dir = SharedDir::mount(&name)?;
    let refusal = mode.refusal(row, column);
    let refused = refusal.is_some();
    let extra = [
        ("NS_MODE", mode.key().to_owned()),
        ("NS_REFUSAL", refusal.map_or_else(String::new, |r| r.join("|"))),
        ("NS_TOTAL", TOTAL.to_string()),
        ("NS_SIZE", SIZE.to_string()),
    ];
    let peer = |program: &Program<'_>, role: &str, isolated: bool| {
        Peer::spawn(program, (cell, role), isolated.then_some(row), (&name, &dir), &extra)
    };
    let rust = Program::Test(test);
    let mut producer = peer(&rust, PRODUCER, column.producer())?;
    let mut victim = peer(&rust, VICTIM, column.consumers())?;
    let mut torch = peer(&Program::Python(reader), "torch consumer", column.consumers())?;
    let steps = |producer: &mut Peer, victim: &mut Peer, torch: &mut Peer| {
        producer.expect("created")?;
        if refused {
            victim.expect("refused")?;
            torch.expect("refused")?;
            victim.expect_success()?;
            return torch.expect_success();
        }
        victim.expect("holding")?;
        victim.sigkill()?;
        producer.tell("victim-killed")?;
        producer.expect("reclaimed")?;
        torch.expect("received")?;
        producer.sigkill()?;
        torch.expect_success()
    };
    if let Err(mut e) = steps(&mut producer, &mut victim, &mut torch) {
        for p in [&mut producer, &mut victim, &mut torch] {
            if !e.starts_with(&format!("the {} ", p.label)) {
                if let Some(why) = p.failure() {
                    e.push_str(&format!("\n    also: {why}"));
                }
            }
        }
        return Err(e);
    }
    Ok(if refused { "refused as expected" } else { "passed" })
}

// ---------------------------------------------------------------------------------------------
// The Rust children.

const PRODUCER: &str = "producer";
const VICTIM: &str = "consumer to kill";

fn child(role: &str) {
    let me = Cell::enter(role);
    let mode = Mode::from_key(&env::<String>("NS_MODE"));
    let refusal: String = env("NS_REFUSAL");
    let refusal: Vec<&str> = refusal.split('|').filter(|s| !s.is_empty()).collect();
    match role {
        PRODUCER => producer(&me, mode, !refusal.is_empty()),
        VICTIM => victim(&me, &refusal),
        other => panic!("no role {other}"),
    }
}

fn producer(me: &Cell, mode: Mode, refused: bool) {
    let b = Producer::builder(&me.ring)
        .dir(&me.dir)
        .capacity(CAPACITY)
        .slot_size(SIZE)
        .policy(Policy::Block);
    let b = match mode {
        Mode::LegacyEvents => b.fence(Fence::Events),
        Mode::LegacyMemory => b.fence(Fence::Memory),
        Mode::Vmm => b.sharing(Sharing::Vmm(PeerPolicy::SameUid)),
    };
    let mut tx = b.create_gpu(0).unwrap_or_else(|e| panic!("[{}] producer: create: {e}", me.name));
    mark("created");
    if refused {
        until_stdin_ends();
    }
    if let Err(e) = tx.wait_for_consumers(2, DEADLINE) {
        panic!("[{}] producer: the consumers did not join: {e}", me.name);
    }
    let k = PatternKernels::get(tx.context()).unwrap();
    let mut send = |seq: u64, why: &str| {
        let slot = match tx.acquire_timeout(DEADLINE) {
            Ok(slot) => slot,
            Err(e) => panic!("[{}] producer: message {seq}: {e} ({why})", me.name),
        };
        assert_eq!(slot.seq(), seq, "[{}] producer: sequence numbers", me.name);
        // SAFETY: the slot holds SIZE bytes, written on its stream, which publish fences.
        unsafe { k.fill(slot.stream(), slot.ptr(), SIZE as u64, seq) }.unwrap();
        slot.publish(SIZE, b"").unwrap_or_else(|e| panic!("[{}] publish: {e}", me.name));
    };
    for seq in 0..MESSAGES {
        send(seq, "both consumers live");
    }
    await_command(me, "victim-killed");
    for seq in MESSAGES..TOTAL {
        send(seq, "is the killed consumer still gating the producer?");
    }
    await_one_reclaim(me);
    mark("reclaimed");
    until_stdin_ends();
}

fn victim(me: &Cell, refusal: &[&str]) {
    let who = VICTIM;
    let t = Instant::now();
    // No CPU poll of a pending fence: every message not written yet when it is received is
    // waited for on the GPU (`cuStreamWaitValue64` on the word, or the event).
    let b = Consumer::builder(&me.ring).dir(&me.dir).gpu_poll(Duration::ZERO);
    let opened = b.open_in_timeout::<Cuda>(DEADLINE);
    if !refusal.is_empty() {
        let e = match opened {
            Ok(_) => panic!("[{}] {who}: opened a ring it was to be refused", me.name),
            Err(e) => e.to_string(),
        };
        let named = refusal.iter().all(|s| e.contains(s));
        assert!(named, "[{}] {who}: the refusal does not say {refusal:?}: {e}", me.name);
        // At once: not after the open's wait for a ring to appear.
        assert!(t.elapsed() < DEADLINE / 2, "[{}] {who}: refused only after a wait", me.name);
        mark("refused");
        return;
    }
    let rx = opened.unwrap_or_else(|e| panic!("[{}] {who}: open: {e}", me.name));
    let k = PatternKernels::get(rx.context()).unwrap();
    let bad = MismatchCounter::new(rx.stream()).unwrap();
    let mut held = None;
    for seq in 0..MESSAGES {
        let m = rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("[{}] {who}: message {seq}: {e}", me.name));
        assert_eq!((m.seq(), m.len()), (seq, SIZE), "[{}] {who}: message {seq}", me.name);
        // SAFETY: the message's SIZE bytes are readable on its stream until its release.
        unsafe { k.check(m.stream(), m.ptr(), SIZE as u64, seq, bad.ptr(), 0) }.unwrap();
        held = Some(m);
    }
    let wrong = bad.read().unwrap();
    assert_eq!(wrong, 0, "[{}] {who}: {wrong} bytes were wrong", me.name);
    mark("holding");
    let _held = held;
    until_stdin_ends();
}
