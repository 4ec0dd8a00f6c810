//! Consumers on another GPU than their ring's: they map its memory across the link between the
//! two GPUs (peer access), in both sharing modes and both fences, beside consumers on the ring's
//! own GPU, and read every byte; dead consumers and a dead producer behave as on one GPU; a VMM
//! consumer of another uid is refused on the other GPU too.
//!
//! The tests named `two_gpus_*` need two CUDA GPUs with peer access and fail on fewer (they say
//! so): on a one-GPU machine run the suite with `--skip two_gpus_`. The refusal of a GPU without
//! peer access is checked without GPUs, in `src/memory/cuda/placement.rs`.
//!
//! Every wait on a child or on the ring has a deadline, and children still running when a test
//! fails are killed, so that a fence that never completes fails the test instead of hanging it.
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{env, role, spawn, unique_name};
use gpuring::cuda::driver::{self, CPU_SYNCS, GPU_WAITS};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::{
    AcquireTimeoutError, Consumer, Fence, GpuConsumer, GpuProducer, OpenError, OpenErrorKind,
    PeerPolicy, Policy, Producer, ProducerBuilder, RecvError, Sharing, StartAt,
};

/// How a test ring shares its memory and fences its buffers.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Legacy,
    LegacyMemoryFence,
    Vmm,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::LegacyMemoryFence => "legacy-memory",
            Mode::Vmm => "vmm",
        }
    }

    fn setup(self, b: ProducerBuilder) -> ProducerBuilder {
        match self {
            Mode::Legacy => b.fence(Fence::Events),
            Mode::LegacyMemoryFence => b.fence(Fence::Memory),
            Mode::Vmm => b.sharing(Sharing::Vmm(PeerPolicy::SameUid)),
        }
    }
}

/// `GPURING_PEERS_DRY_RUN=1`: one GPU stands for both, to check these tests' own logic (roles,
/// pauses, kills, counts) on a one-GPU machine. It proves nothing about peer access, and says so.
fn dry_run() -> bool {
    std::env::var("GPURING_PEERS_DRY_RUN").is_ok_and(|v| v == "1")
}

/// GPU `n` of the test: itself, or GPU 0 in a dry run.
fn gpu(n: i32) -> i32 {
    if dry_run() {
        0
    } else {
        n
    }
}

/// Taken by the parent side of every test here: they run one at a time, so that the process's
/// counters (CPU syncs, GPU-side waits) count one test's work, not a neighbour's.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Panics unless this machine has two GPUs that can read each other's memory. Called first by
/// the parent side of each two-GPU test, it returns the guard of [`one_at_a_time`].
fn need_two_gpus() -> std::sync::MutexGuard<'static, ()> {
    let serial = one_at_a_time();
    driver::available().expect("a CUDA driver");
    if dry_run() {
        eprintln!("DRY RUN: GPU 0 stands for both GPUs; nothing here crosses a link");
        return serial;
    }
    let n = driver::device_count().unwrap();
    assert!(n >= 2, "this test needs two GPUs with peer access; this machine has {n} (run with --skip two_gpus_)");
    let (d0, d1) = (driver::device(0).unwrap(), driver::device(1).unwrap());
    assert!(
        driver::can_access_peer(d0, d1).unwrap() && driver::can_access_peer(d1, d0).unwrap(),
        "GPUs 0 and 1 have no peer access to each other"
    );
    serial
}

/// Frame `seq`'s length: from 1 byte to the slot, so that partial frames cross the link too.
fn frame_len(seq: u64, slot: u64) -> u64 {
    [slot, 1, slot / 2 + 3, 4096, slot - 8][(seq % 5) as usize]
}

/// How long any one wait of these tests may take before it fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// Children of a test, killed if it fails before it waited for them.
struct Children(Vec<(String, Child)>);

impl Children {
    fn new() -> Children {
        Children(Vec::new())
    }

    fn add(&mut self, what: impl Into<String>, child: Child) {
        self.0.push((what.into(), child));
    }

    /// Kills child `what` (SIGKILL) and forgets it.
    fn kill(&mut self, what: &str) {
        let i = self.0.iter().position(|(w, _)| w == what).expect("a child of that name");
        let (_, mut child) = self.0.remove(i);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Waits until `done`, for at most `timeout`; fails at once if a child has exited, since
    /// each is meant to run until waited for or killed.
    fn wait_until(&mut self, what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
        let t = Instant::now();
        while !done() {
            for (who, child) in &mut self.0 {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("{who} exited ({status}) while waiting for {what}");
                }
            }
            assert!(t.elapsed() < timeout, "{what} did not happen within {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for each child in turn, at most [`PATIENCE`] in all, and asserts that it succeeded.
    fn expect_success(mut self) {
        let t = Instant::now();
        for (what, child) in &mut self.0 {
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                assert!(t.elapsed() < PATIENCE, "{what} did not finish within {PATIENCE:?}");
                std::thread::sleep(Duration::from_millis(10));
            };
            assert!(status.success(), "{what} failed: {status}");
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Opens ring `name` on `device` (`None`: the ring's), checks that it reads there, and with
/// `poll_on_cpu` false hands every pending ready fence to the GPU at once (`gpu_poll` 0), so
/// that the cross-device GPU-side waits really run.
fn open_on(name: &str, device: Option<i32>, poll_on_cpu: bool) -> GpuConsumer {
    let b = Consumer::builder(name).start_at(StartAt::Next);
    let b = match device {
        Some(d) => b.device(d),
        None => b,
    };
    let b = if poll_on_cpu { b } else { b.gpu_poll(Duration::ZERO) };
    let rx = b.open_in_timeout(PATIENCE).unwrap_or_else(|e| panic!("{e}"));
    let on = rx.context().ordinal();
    assert_eq!(on, device.unwrap_or(rx.memory_device()), "the consumer reads on another device");
    rx
}

/// What a reader saw: messages (and how many after a pause), mismatching bytes, and the CPU
/// syncs and GPU-side waits it made between its first and last message.
struct Read {
    messages: u64,
    after_pause: u64,
    bad: u64,
    syncs: u64,
    gpu_waits: u64,
}

/// Checks every byte of every message on the GPU until disconnected, each kernel spinning
/// `spin_ns` first (a slow reader holds the buffer long after the CPU released it).
/// With `pause`: while that file exists, stop receiving (after saying so in `PAUSE.paused`).
fn read_all(rx: &GpuConsumer, spin_ns: u64, pause: Option<&Path>) -> Read {
    let k = PatternKernels::get(rx.context()).unwrap();
    let bad = MismatchCounter::new(rx.stream()).unwrap();
    rx.stream().synchronize().unwrap();
    let counts = || (CPU_SYNCS.load(Relaxed), GPU_WAITS.load(Relaxed));
    let (mut messages, mut paused_at, first) = (0, None, counts());
    let mut last = first;
    loop {
        if let Some(pause) = pause.filter(|p| p.exists() && paused_at.is_none()) {
            std::fs::write(pause.with_extension("paused"), b"1").unwrap();
            while pause.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            paused_at = Some(messages);
        }
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("recv: {e}"),
        };
        // SAFETY: the message's bytes stay readable on its stream until its release, which
        // dropping `m` records after this kernel.
        unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), spin_ns) }
            .unwrap();
        drop(m);
        last = counts();
        messages += 1;
    }
    Read {
        messages,
        after_pause: messages - paused_at.unwrap_or(messages),
        bad: bad.read().unwrap(),
        syncs: last.0 - first.0,
        gpu_waits: last.1 - first.1,
    }
}

/// How long the producer's stream spins before each fill, so that its ready fences are still
/// pending when consumers place the message, and their GPUs must wait on them.
const PRODUCER_SPIN_NS: u64 = 30_000;

/// Writes frame `seq` into a slot of `slot` bytes (after a [`PRODUCER_SPIN_NS`] spin) and
/// publishes it; fails after [`PATIENCE`] without a free slot rather than hang.
fn publish(tx: &mut GpuProducer, k: &PatternKernels, spin: &MismatchCounter, seq: u64, slot: u64) {
    assert!(publish_within(tx, k, spin, seq, slot, PATIENCE), "no free slot for frame {seq}");
}

/// [`publish`], or false if no slot came free within `timeout`.
fn publish_within(
    tx: &mut GpuProducer,
    k: &PatternKernels,
    spin: &MismatchCounter,
    seq: u64,
    slot: u64,
    timeout: Duration,
) -> bool {
    let s = match tx.acquire_timeout(timeout) {
        Ok(s) => s,
        Err(AcquireTimeoutError::Timeout) => return false,
        Err(e) => panic!("acquire frame {seq}: {e}"),
    };
    let len = frame_len(seq, slot);
    // SAFETY: the spin reads no byte (length 0); the slot holds `slot` >= len bytes and is
    // ours until publish.
    unsafe {
        k.check(s.stream(), s.ptr(), 0, seq, spin.ptr(), PRODUCER_SPIN_NS).unwrap();
        k.fill(s.stream(), s.ptr(), len, seq).unwrap();
    }
    s.publish(len as usize, &[]).unwrap();
    true
}

const SLOT: u64 = 1 << 20;

/// A consumer child of [`both_gpus`]: reads on `DEVICE` (-1: the default) and checks every byte.
fn both_gpus_consumer(mode: Mode, frames: u64) {
    let device = env::<i32>("DEVICE");
    let poll_on_cpu = env::<u32>("POLL_ON_CPU") == 1;
    let rx = open_on(&env::<String>("RING"), (device >= 0).then_some(device), poll_on_cpu);
    assert_eq!(rx.memory_device(), env::<i32>("RING_DEVICE"));
    let spin = env::<u64>("SPIN_NS");
    let r = read_all(&rx, spin, None);
    let on = rx.context().ordinal();
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    eprintln!(
        "{} consumer on device {on} (CUDA_VISIBLE_DEVICES={visible:?}), ring on device {}, \
         gpu_poll {}, spin {spin} ns: {} messages, {} bad bytes, {} CPU syncs, {} GPU-side \
         waits in the steady state",
        mode.name(),
        rx.memory_device(),
        if poll_on_cpu { "default" } else { "0" },
        r.messages,
        r.bad,
        r.syncs,
        r.gpu_waits
    );
    assert_eq!((r.messages, r.bad, r.syncs), (frames, 0, 0));
    if !poll_on_cpu && on != rx.memory_device() {
        assert!(
            r.gpu_waits > 0,
            "no ready fence was waited on by GPU {on}: the test proves nothing"
        );
    }
}

/// A producer on GPU `ring` and six consumer processes at once, every byte checked: two on the
/// ring's GPU (one with the default device), four on the other. Of those, one is slow (so the
/// producer's rewrites wait on release fences recorded there), one hands every ready fence to
/// its GPU (`gpu_poll` 0) and must have waited on the GPU, and one sees the GPUs in the other
/// order (`CUDA_VISIBLE_DEVICES` reversed), which ordinals must survive.
fn both_gpus(test: &str, mode: Mode, ring: i32) {
    const FRAMES: u64 = 600;
    if role().is_some() {
        return both_gpus_consumer(mode, FRAMES);
    }
    let _serial = need_two_gpus();
    let (ring, other) = (gpu(ring), gpu(1 - ring));
    let name = unique_name("peers");
    let b = Producer::builder(&name).capacity(4).slot_size(SLOT as usize).policy(Policy::Block);
    let mut tx = mode.setup(b).create_gpu(ring).unwrap();
    // (device to ask for, -1 for the default; poll fences on the CPU; kernel spin; GPUs
    // reversed). A reversed child numbers the physical GPU `d` as `1 - d`.
    let readers = [
        (-1, true, 0, false),
        (ring, false, 20_000, false),
        (other, true, 0, false),
        (other, true, 200_000, false),
        (other, false, 0, false),
        // (A dry run has no second GPU to reverse with.)
        if dry_run() { (other, true, 0, false) } else { (1 - other, true, 0, true) },
    ];
    let mut children = Children::new();
    for &(device, poll_on_cpu, spin, reversed) in &readers {
        let mut env = vec![
            ("RING", name.clone()),
            ("DEVICE", device.to_string()),
            ("RING_DEVICE", if reversed { 1 - ring } else { ring }.to_string()),
            ("POLL_ON_CPU", u32::from(poll_on_cpu).to_string()),
            ("SPIN_NS", spin.to_string()),
        ];
        if reversed {
            env.push(("CUDA_VISIBLE_DEVICES", reversed_devices()));
        }
        children
            .add(format!("the consumer asking for device {device}"), spawn(test, "consumer", &env));
    }
    tx.wait_for_consumers(readers.len(), PATIENCE).expect("consumers join");
    let k = PatternKernels::get(tx.context()).unwrap();
    let spin = MismatchCounter::new(tx.stream()).unwrap();
    tx.stream().synchronize().unwrap();
    let syncs = CPU_SYNCS.load(Relaxed);
    for seq in 0..FRAMES {
        publish(&mut tx, &k, &spin, seq, SLOT);
    }
    assert_eq!(CPU_SYNCS.load(Relaxed) - syncs, 0, "the producer synced with the GPU");
    drop(tx);
    children.expect_success();
}

/// `CUDA_VISIBLE_DEVICES` for a child that sees this process's GPUs 0 and 1 the other way
/// round: this process's own list with its first two entries swapped, or "1,0".
fn reversed_devices() -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) if list.split(',').count() >= 2 => {
            let mut v: Vec<&str> = list.split(',').collect();
            v.swap(0, 1);
            v.join(",")
        }
        _ => "1,0".to_owned(),
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_legacy_consumers_on_both_gpus_read_every_byte() {
    both_gpus("two_gpus_legacy_consumers_on_both_gpus_read_every_byte", Mode::Legacy, 0);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_memory_fenced_consumers_on_both_gpus_read_every_byte() {
    const TEST: &str = "two_gpus_memory_fenced_consumers_on_both_gpus_read_every_byte";
    both_gpus(TEST, Mode::LegacyMemoryFence, 0);
}

/// The ring on GPU 1 this time: the other direction across the link.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_vmm_consumers_on_both_gpus_read_every_byte() {
    both_gpus("two_gpus_vmm_consumers_on_both_gpus_read_every_byte", Mode::Vmm, 1);
}

/// One consumer process with a consumer on each GPU, sharing the process's mappings of the
/// ring (legacy IPC opens one handle in two contexts; VMM imports each fd twice).
fn one_process(test: &str, mode: Mode) {
    const FRAMES: u64 = 400;
    if role().is_some() {
        let name = env::<String>("RING");
        let readers: Vec<_> = [0, 1]
            .into_iter()
            .map(|device| {
                let rx = open_on(&name, Some(gpu(device)), device == 0);
                std::thread::spawn(move || (device, read_all(&rx, 0, None)))
            })
            .collect();
        for r in readers {
            let (device, r) = r.join().unwrap();
            eprintln!(
                "{} one process, consumer on GPU {device}: {} messages, {} bad bytes",
                mode.name(),
                r.messages,
                r.bad
            );
            assert_eq!((r.messages, r.bad), (FRAMES, 0));
        }
        return;
    }
    let _serial = need_two_gpus();
    let name = unique_name("peers-one");
    let b = Producer::builder(&name).capacity(4).slot_size(SLOT as usize).policy(Policy::Block);
    let mut tx = mode.setup(b).create_gpu(0).unwrap();
    let mut children = Children::new();
    children.add("the consumer process", spawn(test, "consumers", &[("RING", name)]));
    tx.wait_for_consumers(2, PATIENCE).expect("consumers join");
    let k = PatternKernels::get(tx.context()).unwrap();
    let spin = MismatchCounter::new(tx.stream()).unwrap();
    for seq in 0..FRAMES {
        publish(&mut tx, &k, &spin, seq, SLOT);
    }
    drop(tx);
    children.expect_success();
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_legacy_one_process_reads_on_both_gpus() {
    one_process("two_gpus_legacy_one_process_reads_on_both_gpus", Mode::Legacy);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_vmm_one_process_reads_on_both_gpus() {
    one_process("two_gpus_vmm_one_process_reads_on_both_gpus", Mode::Vmm);
}

/// The count of frames published so far, which the producer child writes to a file.
fn progress(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Kills on two GPUs: a ring on GPU 0, a reader and a victim on GPU 1. The victim is killed
/// with a release still queued behind a 50 ms kernel and another message held; the producer
/// (Block, 4 slots) must go on, so the dead consumer's slots and fences were reclaimed across
/// the GPUs, and no buffer stays held. Then the reader pauses, and the producer is killed with
/// messages unread (its GPU work done): the reader on GPU 1 must still receive them, every
/// byte right, then end with `Disconnected` and leave.
fn kills(test: &str, mode: Mode) {
    const AFTER_VICTIM: u64 = 500;
    let file = |var: &str| PathBuf::from(env::<String>(var));
    match role().as_deref() {
        Some("producer") => {
            let b = Producer::builder(&env::<String>("RING"))
                .capacity(4)
                .slot_size(SLOT as usize)
                .policy(Policy::Block);
            let mut tx = mode.setup(b).create_gpu(0).unwrap();
            tx.wait_for_consumers(2, PATIENCE).expect("consumers join");
            let k = PatternKernels::get(tx.context()).unwrap();
            let spin = MismatchCounter::new(tx.stream()).unwrap();
            let (progress, stop) = (file("PROGRESS"), file("STOP"));
            let mut seq = 0;
            // Short acquires, so that a stop is seen while the paused reader fills the ring.
            while !stop.exists() {
                if publish_within(&mut tx, &k, &spin, seq, SLOT, Duration::from_millis(50)) {
                    seq += 1;
                    if seq % 16 == 0 {
                        std::fs::write(&progress, seq.to_string()).unwrap();
                    }
                }
            }
            // The victim is dead and reaped, and the paused reader holds nothing: no buffer
            // may stay held.
            tx.reap().unwrap();
            let t = Instant::now();
            while tx.consumers().len() != 1 || tx.consumers()[0].holding != 0 {
                assert!(t.elapsed() < PATIENCE, "consumers: {:?}", tx.consumers());
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(tx.held_buffers(), 0, "a buffer is still held after the victim's death");
            // Leave messages unread for the paused reader.
            if tx.consumers()[0].lag == 0 {
                for _ in 0..2 {
                    publish(&mut tx, &k, &spin, seq, SLOT);
                    seq += 1;
                }
            }
            // Killed with unread messages in the ring, but with its GPU work done, so that the
            // reader may still sync with its own stream to count what it read.
            tx.stream().synchronize().unwrap();
            std::fs::write(file("TOTAL"), seq.to_string()).unwrap();
            std::fs::write(stop.with_extension("stopped"), b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            panic!("the producer was not killed");
        }
        Some("reader") => {
            let rx = open_on(&env::<String>("RING"), Some(gpu(1)), false);
            let r = read_all(&rx, 0, Some(&file("PAUSE")));
            let total: u64 = std::fs::read_to_string(file("TOTAL")).unwrap().parse().unwrap();
            eprintln!(
                "{} reader on GPU 1: {} messages of {total} published, {} of them after the \
                 producer's kill, {} bad bytes",
                mode.name(),
                r.messages,
                r.after_pause,
                r.bad
            );
            assert_eq!((r.messages, r.bad), (total, 0));
            assert!(r.after_pause > 0, "no message was left unread at the kill");
            drop(rx); // must return, with the producer dead
            eprintln!("{} reader left", mode.name());
        }
        Some("victim") => {
            let rx = open_on(&env::<String>("RING"), Some(gpu(1)), false);
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = MismatchCounter::new(rx.stream()).unwrap();
            let check = |m: &gpuring::GpuReadSlot<'_>, spin_ns| {
                // SAFETY: as in `read_all`: the bytes stay readable on the message's stream
                // until its release, queued after this kernel (or never, for the held one).
                unsafe {
                    k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), spin_ns)
                }
                .unwrap();
            };
            for _ in 0..20 {
                check(&rx.recv().unwrap(), 0);
            }
            // A release queued behind a 50 ms kernel, then a message held: killed with both.
            check(&rx.recv().unwrap(), 50_000_000);
            let held = rx.recv().unwrap();
            check(&held, 0);
            std::fs::write(file("HOLDING"), b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            panic!("the victim was not killed");
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            let _serial = need_two_gpus();
            let name = unique_name("peer-kills");
            let path = |what: &str| std::env::temp_dir().join(format!("{name}.{what}"));
            let files = ["progress", "holding", "stop", "stopped", "pause", "paused", "total"]
                .map(|w| (w, path(w)));
            let at = |w: &str| files.iter().find(|(k, _)| *k == w).unwrap().1.clone();
            let mut env = vec![("RING", name.clone())];
            for (var, w) in [
                ("PROGRESS", "progress"),
                ("HOLDING", "holding"),
                ("STOP", "stop"),
                ("PAUSE", "pause"),
                ("TOTAL", "total"),
            ] {
                env.push((var, at(w).display().to_string()));
            }
            let mut children = Children::new();
            children.add("the producer", spawn(test, "producer", &env));
            children.add("the reader on GPU 1", spawn(test, "reader", &env));
            children.add("the victim", spawn(test, "victim", &env));
            // Longer than the children's own waits, so that theirs fail first.
            let patience = 2 * PATIENCE;
            children
                .wait_until("the victim holding a message", patience, || at("holding").exists());
            children.kill("the victim");
            let at_kill = progress(&at("progress"));
            eprintln!("{}: victim killed at frame {at_kill}", mode.name());
            children.wait_until(
                "the producer going on past the dead consumer's slots",
                patience,
                || progress(&at("progress")) >= at_kill + AFTER_VICTIM,
            );
            std::fs::write(at("pause"), b"1").unwrap();
            children.wait_until("the reader pausing", patience, || at("paused").exists());
            std::fs::write(at("stop"), b"1").unwrap();
            children.wait_until("the producer stopping", patience, || at("stopped").exists());
            children.kill("the producer");
            eprintln!("{}: producer killed at frame {}", mode.name(), progress(&at("progress")));
            let t = Instant::now();
            std::fs::remove_file(at("pause")).unwrap();
            children.expect_success();
            eprintln!(
                "{}: the reader ended {:?} after the producer's kill",
                mode.name(),
                t.elapsed()
            );
            for (_, f) in files {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_legacy_kills_of_a_peer_consumer_and_of_the_producer() {
    kills("two_gpus_legacy_kills_of_a_peer_consumer_and_of_the_producer", Mode::Legacy);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_memory_fenced_kills_of_a_peer_consumer_and_of_the_producer() {
    const TEST: &str = "two_gpus_memory_fenced_kills_of_a_peer_consumer_and_of_the_producer";
    kills(TEST, Mode::LegacyMemoryFence);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_vmm_kills_of_a_peer_consumer_and_of_the_producer() {
    kills("two_gpus_vmm_kills_of_a_peer_consumer_and_of_the_producer", Mode::Vmm);
}

/// A uid no account has (not 65534, `nobody`: that is also the overflow uid an unmapped peer
/// reads as, which the fd server refuses whatever its policy).
const OTHER_UID: u32 = 4321;

/// A VMM ring on GPU 0 with the default policy (its producer's uid only): a consumer of another
/// uid asking for GPU 1 is refused before any memory is mapped, and gets no fd. Needs root.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_a_vmm_consumer_of_another_uid_on_the_other_gpu_is_refused() {
    const TEST: &str = "two_gpus_a_vmm_consumer_of_another_uid_on_the_other_gpu_is_refused";
    if role().is_some() {
        // SAFETY: setuid has no memory-safety preconditions; glibc applies it to every thread.
        assert_eq!(unsafe { libc::setuid(OTHER_UID) }, 0, "setuid");
        let opened = Consumer::builder(&env::<String>("RING"))
            .allow_foreign_owner(true)
            .device(gpu(1))
            .open_gpu();
        match opened.map_err(OpenError::into_kind) {
            Err(e @ OpenErrorKind::PeerRefused { .. }) => {
                eprintln!("uid {OTHER_UID} on GPU 1, ring on GPU 0, policy SameUid: {e}");
                let text = e.to_string();
                assert!(text.contains(&format!("uid {OTHER_UID}")), "{text}");
            }
            Err(e) => panic!("expected a refusal, got: {e}"),
            Ok(_) => panic!("a consumer of another uid mapped a SameUid ring from GPU 1"),
        }
        return;
    }
    let _serial = need_two_gpus();
    assert_eq!(rustix::process::getuid().as_raw(), 0, "this test needs root");
    let name = unique_name("peer-refused");
    let tx = Producer::builder(&name)
        .mode(0o666)
        .capacity(4)
        .slot_size(SLOT as usize)
        .sharing(Sharing::Vmm(PeerPolicy::SameUid))
        .create_gpu(gpu(0))
        .unwrap();
    let mut child = Children::new();
    child.add("the refused consumer", spawn(TEST, "refused", &[("RING", name)]));
    child.expect_success();
    assert_eq!(tx.consumer_count(), 0);
}

/// Runs on one GPU too: a device this process does not have is refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_on_a_device_that_does_not_exist_is_refused() {
    let _serial = one_at_a_time();
    let name = unique_name("no-device");
    let _tx = Producer::builder(&name).capacity(2).slot_size(4096).create_gpu(0).unwrap();
    let n = driver::device_count().unwrap();
    let e = Consumer::builder(&name).device(n).open_gpu().unwrap_err();
    eprintln!("{e}");
    assert!(matches!(e.kind(), OpenErrorKind::MemoryUnavailable { .. }), "{e}");
    assert!(e.to_string().contains(&format!("there is no device {n}")), "{e}");
}
