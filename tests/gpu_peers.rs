//! Consumers on another GPU than their ring's: they map its memory across the link between the
//! two GPUs (peer access), in both sharing modes and both fences, beside consumers on the ring's
//! own GPU, and read every byte; dead consumers and a dead producer behave as on one GPU; a VMM
//! consumer of another uid is refused on the other GPU too.
//!
//! The tests named `two_gpus_*` need two CUDA GPUs with peer access and fail on fewer (they say
//! so): on a one-GPU machine run the suite with `--skip two_gpus_`. The refusal of a GPU without
//! peer access is checked without GPUs, in `src/memory/cuda/placement.rs`.
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::cuda::driver::{self, CPU_SYNCS};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::{
    Consumer, Fence, GpuConsumer, GpuProducer, OpenError, OpenErrorKind, PeerPolicy, Policy,
    Producer, ProducerBuilder, RecvError, Sharing, StartAt,
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
            Mode::Legacy => b,
            Mode::LegacyMemoryFence => b.fence(Fence::Memory),
            Mode::Vmm => b.sharing(Sharing::Vmm(PeerPolicy::SameUid)),
        }
    }
}

/// Panics unless this machine has two GPUs that can read each other's memory.
fn need_two_gpus() {
    driver::available().expect("a CUDA driver");
    let n = driver::device_count().unwrap();
    assert!(n >= 2, "this test needs two GPUs with peer access; this machine has {n} (run with --skip two_gpus_)");
    let (d0, d1) = (driver::device(0).unwrap(), driver::device(1).unwrap());
    assert!(
        driver::can_access_peer(d0, d1).unwrap() && driver::can_access_peer(d1, d0).unwrap(),
        "GPUs 0 and 1 have no peer access to each other"
    );
}

/// Frame `seq`'s length: from 1 byte to the slot, so that partial frames cross the link too.
fn frame_len(seq: u64, slot: u64) -> u64 {
    [slot, 1, slot / 2 + 3, 4096, slot - 8][(seq % 5) as usize]
}

fn wait_for_consumers(tx: &GpuProducer, n: usize) {
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed() < Duration::from_secs(60), "consumers did not join");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn open_on(name: &str, device: Option<i32>) -> GpuConsumer {
    let b = Consumer::builder(name).start_at(StartAt::Next);
    let b = match device {
        Some(d) => b.device(d),
        None => b,
    };
    b.open_in_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"))
}

/// What a reader saw: messages, mismatching bytes, CPU syncs between its first and last
/// message, and whether it ended with `Disconnected`.
struct Read {
    messages: u64,
    bad: u64,
    syncs: u64,
}

/// Checks every byte of every message on the GPU until disconnected, each kernel spinning
/// `spin_ns` first (a slow reader holds the buffer long after the CPU released it).
fn read_all(rx: &GpuConsumer, spin_ns: u64) -> Read {
    let k = PatternKernels::get(rx.context()).unwrap();
    let bad = MismatchCounter::new(rx.stream()).unwrap();
    rx.stream().synchronize().unwrap();
    let (mut messages, mut first_syncs, mut last_syncs) = (0, None, 0);
    loop {
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("recv: {e}"),
        };
        first_syncs.get_or_insert(CPU_SYNCS.load(Relaxed));
        // SAFETY: the message's bytes stay readable on its stream until its release, which
        // dropping `m` records after this kernel.
        unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), spin_ns) }
            .unwrap();
        drop(m);
        last_syncs = CPU_SYNCS.load(Relaxed);
        messages += 1;
    }
    let syncs = last_syncs - first_syncs.unwrap_or(last_syncs);
    Read { messages, bad: bad.read().unwrap(), syncs }
}

/// Producer writing `frames` frames into slots of `slot` bytes as fast as the ring lets it.
fn produce(tx: &mut GpuProducer, frames: u64, slot: u64) {
    let k = PatternKernels::get(tx.context()).unwrap();
    for seq in 0..frames {
        let s = tx.acquire().unwrap();
        let len = frame_len(seq, slot);
        // SAFETY: the slot holds `slot` >= len bytes and is ours until publish.
        unsafe { k.fill(s.stream(), s.ptr(), len, seq).unwrap() };
        s.publish(len as usize, &[]).unwrap();
    }
}

const SLOT: u64 = 1 << 20;

/// A producer on GPU `ring` and four consumer processes at once, two reading on each GPU (one
/// of those on the ring's GPU takes the default device), every byte checked; one consumer on
/// the other GPU is slow, so the producer's rewrites wait on release fences recorded there.
fn both_gpus(test: &str, mode: Mode, ring: i32) {
    const FRAMES: u64 = 600;
    if role().is_some() {
        let device = env::<i32>("DEVICE");
        let rx = open_on(&env::<String>("RING"), (device >= 0).then_some(device));
        assert_eq!(rx.memory_device(), env::<i32>("RING_DEVICE"));
        let spin = env::<u64>("SPIN_NS");
        let r = read_all(&rx, spin);
        let on = rx.context().ordinal();
        eprintln!(
            "{} consumer on GPU {on}, ring on GPU {}, spin {spin} ns: {} messages, {} bad \
             bytes, {} CPU syncs in the steady state",
            mode.name(),
            rx.memory_device(),
            r.messages,
            r.bad,
            r.syncs
        );
        assert_eq!((r.messages, r.bad, r.syncs), (FRAMES, 0, 0));
        return;
    }
    need_two_gpus();
    let other = 1 - ring;
    let name = unique_name("peers");
    let b = Producer::builder(&name).capacity(4).slot_size(SLOT as usize).policy(Policy::Block);
    let mut tx = mode.setup(b).create_gpu(ring).unwrap();
    // (device to ask for, -1 for the default; kernel spin)
    let readers = [(-1, 0), (ring, 20_000), (other, 0), (other, 200_000)];
    let children: Vec<Child> = readers
        .iter()
        .map(|&(device, spin)| {
            let env = [
                ("RING", name.clone()),
                ("DEVICE", device.to_string()),
                ("RING_DEVICE", ring.to_string()),
                ("SPIN_NS", spin.to_string()),
            ];
            spawn(test, "consumer", &env)
        })
        .collect();
    wait_for_consumers(&tx, readers.len());
    let syncs = CPU_SYNCS.load(Relaxed);
    produce(&mut tx, FRAMES, SLOT);
    assert_eq!(CPU_SYNCS.load(Relaxed) - syncs, 0, "the producer synced with the GPU");
    drop(tx);
    for (child, (device, _)) in children.into_iter().zip(readers) {
        expect_success(child, &format!("the consumer on device {device}"));
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

/// The count of frames published so far, which the producer child writes to a file.
fn progress(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0, "kill");
    child.wait().unwrap();
}

/// Kills on two GPUs: a ring on GPU 0, a reader and a victim on GPU 1. The victim is killed
/// while it holds a message; the producer (Block, 4 slots) must go on, so the dead consumer's
/// slots and fences were reclaimed across the GPUs. Then the producer is killed mid-stream (with
/// messages unread, its GPU work done): the reader on GPU 1 must end with `Disconnected`,
/// having read every byte of what it got, and leave.
fn kills(test: &str, mode: Mode) {
    const AFTER_VICTIM: u64 = 500;
    match role().as_deref() {
        Some("producer") => {
            let b = Producer::builder(&env::<String>("RING"))
                .capacity(4)
                .slot_size(SLOT as usize)
                .policy(Policy::Block);
            let mut tx = mode.setup(b).create_gpu(0).unwrap();
            wait_for_consumers(&tx, 2);
            let k = PatternKernels::get(tx.context()).unwrap();
            let path = PathBuf::from(env::<String>("PROGRESS"));
            let stop = PathBuf::from(env::<String>("STOP"));
            for seq in 0.. {
                let s = tx.acquire().unwrap();
                let len = frame_len(seq, SLOT);
                // SAFETY: the slot holds SLOT >= len bytes and is ours until publish.
                unsafe { k.fill(s.stream(), s.ptr(), len, seq).unwrap() };
                s.publish(len as usize, &[]).unwrap();
                if seq % 16 == 0 {
                    std::fs::write(&path, seq.to_string()).unwrap();
                    if stop.exists() {
                        break;
                    }
                }
            }
            // Killed with unread messages in the ring, but with its GPU work done, so that the
            // reader may still sync with its own stream to count what it read.
            tx.stream().synchronize().unwrap();
            std::fs::write(stop.with_extension("stopped"), b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            panic!("the producer was not killed");
        }
        Some("reader") => {
            let rx = open_on(&env::<String>("RING"), Some(1));
            let r = read_all(&rx, 0);
            eprintln!(
                "{} reader on GPU 1 after the producer's kill: {} messages, {} bad bytes",
                mode.name(),
                r.messages,
                r.bad
            );
            assert_eq!(r.bad, 0);
            assert!(r.messages >= AFTER_VICTIM, "{} messages", r.messages);
            drop(rx); // must return, even with the producer dead mid-frame
            eprintln!("{} reader left", mode.name());
        }
        Some("victim") => {
            let rx = open_on(&env::<String>("RING"), Some(1));
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = MismatchCounter::new(rx.stream()).unwrap();
            for _ in 0..20 {
                let m = rx.recv().unwrap();
                // SAFETY: as in `read_all`.
                unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }
                    .unwrap();
            }
            // Hold one message, its read queued, and wait to be killed.
            let m = rx.recv().unwrap();
            // SAFETY: as above; the message is never released.
            unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }.unwrap();
            std::fs::write(env::<String>("HOLDING"), b"1").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            panic!("the victim was not killed");
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            need_two_gpus();
            let name = unique_name("peer-kills");
            let dir = std::env::temp_dir();
            let progress_file = dir.join(format!("{name}.progress"));
            let holding = dir.join(format!("{name}.holding"));
            let stop = dir.join(format!("{name}.stop"));
            let env = |extra: &[(&'static str, String)]| {
                let mut v = vec![("RING", name.clone())];
                v.extend(extra.iter().cloned());
                v
            };
            let mut producer = spawn(
                test,
                "producer",
                &env(&[
                    ("PROGRESS", progress_file.display().to_string()),
                    ("STOP", stop.display().to_string()),
                ]),
            );
            let reader = spawn(test, "reader", &env(&[]));
            let mut victim =
                spawn(test, "victim", &env(&[("HOLDING", holding.display().to_string())]));
            wait_until("the victim holding a message", Duration::from_secs(60), || {
                holding.exists()
            });
            kill(&mut victim);
            let at_kill = progress(&progress_file);
            eprintln!("{}: victim killed at frame {at_kill}", mode.name());
            wait_until(
                "the producer going on past the dead consumer's slots",
                Duration::from_secs(60),
                || progress(&progress_file) >= at_kill + AFTER_VICTIM + 16,
            );
            std::fs::write(&stop, b"1").unwrap();
            let stopped = stop.with_extension("stopped");
            wait_until("the producer stopping", Duration::from_secs(60), || stopped.exists());
            kill(&mut producer);
            eprintln!("{}: producer killed at frame {}", mode.name(), progress(&progress_file));
            let t = Instant::now();
            expect_success(reader, "the reader on GPU 1");
            eprintln!(
                "{}: the reader ended {:?} after the producer's kill",
                mode.name(),
                t.elapsed()
            );
            for f in [progress_file, holding, stop, stopped] {
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
fn two_gpus_vmm_kills_of_a_peer_consumer_and_of_the_producer() {
    kills("two_gpus_vmm_kills_of_a_peer_consumer_and_of_the_producer", Mode::Vmm);
}

/// `nobody`.
const OTHER_UID: u32 = 65534;

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
            .device(1)
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
    need_two_gpus();
    assert_eq!(rustix::process::getuid().as_raw(), 0, "this test needs root");
    let name = unique_name("peer-refused");
    let tx = Producer::builder(&name)
        .mode(0o666)
        .capacity(4)
        .slot_size(SLOT as usize)
        .sharing(Sharing::Vmm(PeerPolicy::SameUid))
        .create_gpu(0)
        .unwrap();
    expect_success(spawn(TEST, "refused", &[("RING", name)]), "the refused consumer");
    assert_eq!(tx.consumer_count(), 0);
}

/// Runs on one GPU too: a device this process does not have is refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_on_a_device_that_does_not_exist_is_refused() {
    let name = unique_name("no-device");
    let _tx = Producer::builder(&name).capacity(2).slot_size(4096).create_gpu(0).unwrap();
    let n = driver::device_count().unwrap();
    let e = Consumer::builder(&name).device(n).open_gpu().unwrap_err();
    eprintln!("{e}");
    assert!(matches!(e.kind(), OpenErrorKind::MemoryUnavailable { .. }), "{e}");
    assert!(e.to_string().contains(&format!("there is no device {n}")), "{e}");
}
