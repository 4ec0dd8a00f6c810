//! CUDA-memory behaviour that host memory does not share: the release fence, the steady state's
//! zero handle opens and CPU syncs, registered allocations, and the memory-kind checks. The
//! scenarios both kinds share are in `conformance.rs`.
#![cfg(feature = "cuda")]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::cuda::driver::{
    self, CPU_SYNCS, IPC_EVENT_OPENS, IPC_EXPORTS, IPC_MEM_CLOSES, IPC_MEM_OPENS, VMM_IMPORTS,
};
use gpuring::cuda::DevicePool;
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::{
    Consumer, GpuConsumer, GpuProducer, MemoryKind, OpenError, OpenErrorKind, Policy, Producer,
};
use gpuring::{PeerPolicy, ProducerBuilder, RecvError, RegisterError, Sharing};

/// Process-wide handle and sync counters.
fn counters() -> [u64; 4] {
    [&IPC_MEM_OPENS, &IPC_EVENT_OPENS, &IPC_MEM_CLOSES, &CPU_SYNCS].map(|c| c.load(Relaxed))
}

/// A mismatch counter for the check kernels on `rx`'s stream.
fn counter(rx: &GpuConsumer) -> MismatchCounter {
    MismatchCounter::new(rx.stream()).unwrap()
}

fn open_when_created(name: &str) -> GpuConsumer {
    open_polling(name, gpuring::DEFAULT_GPU_POLL)
}

fn open_polling(name: &str, poll: Duration) -> GpuConsumer {
    let b = Consumer::builder(name).start_at(gpuring::StartAt::Next).gpu_poll(poll);
    b.open_in_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
}

fn wait_for_consumers(tx: &GpuProducer, n: usize) {
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed() < Duration::from_secs(30), "consumers did not join");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks every message on the GPU until disconnected, each kernel first spinning `spin_ns`.
/// Returns (messages, mismatching bytes).
fn consume(rx: &GpuConsumer, spin_ns: u64) -> (u64, u64) {
    let k = PatternKernels::get(rx.context()).unwrap();
    let bad = counter(rx);
    let mut n = 0;
    loop {
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("recv: {e}"),
        };
        // SAFETY: the message's bytes stay readable on its stream until its release, which
        // dropping `m` records after this kernel.
        unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), spin_ns) }
            .unwrap();
        n += 1;
    }
    (n, bad.read().unwrap())
}

/// Producer writing `frames` frames of `len` bytes as fast as the ring lets it.
fn produce(tx: &mut GpuProducer, frames: u64, len: u64) {
    let k = PatternKernels::get(tx.context()).unwrap();
    for seq in 0..frames {
        let slot = tx.acquire().unwrap();
        // SAFETY: the slot holds slot_size >= len bytes and is ours until publish.
        unsafe { k.fill(slot.stream(), slot.ptr(), len, seq).unwrap() };
        slot.publish(len as usize, &[]).unwrap();
    }
}

/// A consumer whose kernel is slow (it spins before reading) against a producer that writes
/// as fast as it can, in Block mode with 2 slots. With the release fence no frame is torn; with
/// the fence disabled (test-only switch) the same run must tear frames, which shows the check
/// can see it. `poll` is both sides' `gpu_poll`: 0 puts every wait on the GPU; a window longer
/// than the reader's kernel makes the producer see the release complete on the CPU instead.
/// [`fence_run_with`] on interprocess events.
fn fence_run(test: &str, unfenced: bool, poll: Duration) {
    fence_run_with(test, unfenced, poll, |b| b.fence(gpuring::Fence::Events))
}

/// A producer builder set for VMM sharing (fds, memory-word fences, no IPC handle).
fn vmm(b: ProducerBuilder) -> ProducerBuilder {
    b.sharing(Sharing::Vmm(PeerPolicy::SameUid))
}

/// The exit code of a consumer that saw no torn frame where the fence was off.
const NO_TEARING: i32 = 3;

/// How many runs the unfenced control gets to show tearing: it is a race the GPU usually loses
/// within a run (10^7 to 10^9 torn bytes), but not always.
const UNFENCED_TRIES: u32 = 3;

/// How long the reader's kernel spins before it reads, in the fence runs: 2 ms, longer than the
/// GPU's time slice between contexts. Without MPS, two processes' kernels never run at once:
/// the writer's kernel can only overwrite a frame under a reader that the GPU switched away
/// from mid-kernel. A reader whose kernel ends within its slice (200 us did) is never switched
/// out while it reads, so the unfenced control then shows no tearing when it runs alone (it
/// did only when other tests' contexts shared the GPU).
const FENCE_SPIN_NS: u64 = 2_000_000;

fn fence_run_with(
    test: &str,
    unfenced: bool,
    poll: Duration,
    setup: fn(ProducerBuilder) -> ProducerBuilder,
) {
    const FRAMES: u64 = 300;
    const LEN: u64 = 4 << 20;
    if role().is_some() {
        let rx = open_polling(&env::<String>("RING"), poll);
        let (n, bad) = consume(&rx, FENCE_SPIN_NS);
        println!("fence unfenced={unfenced}: {n} frames, {bad} mismatching bytes");
        eprintln!("fence unfenced={unfenced}: {n} frames, {bad} mismatching bytes");
        assert_eq!(n, FRAMES);
        if !unfenced {
            assert_eq!(bad, 0, "torn frames despite the release fence");
        } else if bad == 0 {
            drop(rx);
            std::process::exit(NO_TEARING);
        }
        return;
    }
    let tries = if unfenced { UNFENCED_TRIES } else { 1 };
    for attempt in 1..=tries {
        let name = unique_name("fence");
        let b = Producer::builder(&name).capacity(2).slot_size(LEN as usize).policy(Policy::Block);
        let b = setup(b.unfenced_for_tests(unfenced).gpu_poll(poll));
        let mut tx = b.create_gpu(0).unwrap();
        let mut child = spawn(test, "consumer", &[("RING", name)]);
        wait_for_consumers(&tx, 1);
        produce(&mut tx, FRAMES, LEN);
        drop(tx);
        let status = child.wait().expect("wait child");
        if status.success() {
            return;
        }
        assert_eq!(status.code(), Some(NO_TEARING), "consumer failed: {status}");
        eprintln!("fence unfenced: no tearing in run {attempt} of {tries}");
    }
    panic!("no tearing without the fence in {tries} runs: the test cannot see it");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn release_fence_prevents_torn_frames() {
    fence_run("release_fence_prevents_torn_frames", false, Duration::ZERO);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn release_fence_holds_when_completion_is_seen_on_the_cpu() {
    let test = "release_fence_holds_when_completion_is_seen_on_the_cpu";
    fence_run(test, false, Duration::from_millis(10));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_fence_prevents_torn_frames() {
    let test = "memory_fence_prevents_torn_frames";
    fence_run_with(test, false, Duration::ZERO, |b| b.fence(gpuring::Fence::Memory));
}

/// The default fence and polling (`Fence::Auto`, `DEFAULT_GPU_POLL`): memory words on a device
/// with 64-bit stream memory operations, and every frame whole.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_default_fence_is_memory_words_where_the_device_has_them() {
    let test = "the_default_fence_is_memory_words_where_the_device_has_them";
    if role().is_none() {
        let tx = Producer::builder(&unique_name("auto-fence")).create_gpu(0).unwrap();
        let dev = gpuring::cuda::driver::device(0).unwrap();
        let memops = gpuring::cuda::driver::can_use_64_bit_stream_mem_ops(dev).unwrap();
        let want = if memops { gpuring::Fence::Memory } else { gpuring::Fence::Events };
        assert_eq!(tx.fence(), want, "64-bit stream memory operations: {memops}");
    }
    fence_run_with(test, false, gpuring::DEFAULT_GPU_POLL, |b| b);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_fences_prevent_torn_frames() {
    fence_run_with("vmm_fences_prevent_torn_frames", false, Duration::ZERO, vmm);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_fences_hold_when_completion_is_seen_on_the_cpu() {
    let test = "vmm_fences_hold_when_completion_is_seen_on_the_cpu";
    fence_run_with(test, false, Duration::from_millis(10), vmm);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn without_release_fence_vmm_frames_tear() {
    fence_run_with("without_release_fence_vmm_frames_tear", true, Duration::ZERO, vmm);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn without_release_fence_frames_tear() {
    fence_run("without_release_fence_frames_tear", true, Duration::ZERO);
}

/// After joining, neither side opens or closes a handle or makes the CPU wait for the GPU:
/// counted in every process between warm-up and the end. Producer and consumers each run in a
/// process of their own, because the counters are per process and the test harness runs other
/// tests in this one.
#[test]
#[ignore = "needs a CUDA GPU"]
fn steady_state_opens_nothing_and_never_syncs() {
    let test = "steady_state_opens_nothing_and_never_syncs";
    steady_state(test, |b| b.fence(gpuring::Fence::Events));
}

/// The same with memory fences: no event is ever opened, nothing else either.
#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_fenced_steady_state_opens_nothing_and_never_syncs() {
    let test = "memory_fenced_steady_state_opens_nothing_and_never_syncs";
    steady_state(test, |b| b.fence(gpuring::Fence::Memory));
}

/// The same in VMM sharing, where no process makes any legacy IPC call at all (no handle
/// exported or opened, ever), and a consumer imports each pool once, at join.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_steady_state_imports_once_and_makes_no_ipc_call() {
    steady_state("vmm_steady_state_imports_once_and_makes_no_ipc_call", vmm);
}

/// Legacy IPC calls this process made: handles exported, memory and event handles opened.
fn ipc_calls() -> [u64; 3] {
    [&IPC_EXPORTS, &IPC_MEM_OPENS, &IPC_EVENT_OPENS].map(|c| c.load(Relaxed))
}

fn steady_state(test: &str, setup: fn(ProducerBuilder) -> ProducerBuilder) {
    const FRAMES: u64 = 5000;
    const LEN: u64 = 1 << 20;
    const CAP: u32 = 8;
    const CONSUMERS: usize = 3;
    match role().as_deref() {
        Some("consumer") => {
            let rx = open_when_created(&env::<String>("RING"));
            let vmm = rx.sharing_name() == "vmm";
            let imports = VMM_IMPORTS.load(Relaxed);
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = counter(&rx);
            let mut at_first = None;
            let mut n = 0;
            while let Ok(m) = rx.recv() {
                // SAFETY: as in `consume`.
                unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }
                    .unwrap();
                drop(m);
                n += 1;
                at_first.get_or_insert_with(counters);
            }
            let at_end = counters();
            assert_eq!(at_first.unwrap(), at_end, "[mem opens, event opens, closes, syncs]");
            assert_eq!(bad.read().unwrap(), 0);
            assert_eq!(n, FRAMES);
            assert_eq!(VMM_IMPORTS.load(Relaxed), imports, "imports after join");
            if vmm {
                assert_eq!(ipc_calls(), [0; 3], "[IPC exports, mem opens, event opens]");
            }
            let ipc = ipc_calls();
            eprintln!(
                "consumer ({}): counters {at_end:?} unchanged over {n} frames, IPC calls {ipc:?}",
                rx.sharing_name()
            );
        }
        Some("producer") => {
            let b = Producer::builder(&env::<String>("RING")).capacity(CAP);
            let mut tx = setup(b.slot_size(LEN as usize)).create_gpu(0).unwrap();
            wait_for_consumers(&tx, CONSUMERS);
            // Warm-up: the first two laps open each consumer's release events, once.
            produce(&mut tx, 2 * CAP as u64, LEN);
            let warm = counters();
            let k = PatternKernels::get(tx.context()).unwrap();
            for seq in 2 * CAP as u64..FRAMES {
                let slot = tx.acquire().unwrap();
                // SAFETY: as in `produce`.
                unsafe { k.fill(slot.stream(), slot.ptr(), LEN, seq).unwrap() };
                slot.publish(LEN as usize, &[]).unwrap();
            }
            let end = counters();
            // Each consumer's release event of a buffer is opened once, when the producer first
            // reuses a buffer that consumer read: at warm-up, or later for a buffer that came
            // into use only then (a spare, taken when a consumer still held the message the
            // producer lapped). So at most one open per consumer and buffer, ever. Nothing else
            // is opened, closed or synchronised.
            let buffers = u64::from(CAP + tx.spare_buffers());
            assert_eq!((warm[0], warm[2], warm[3]), (end[0], end[2], end[3]), "{warm:?} {end:?}");
            assert!(end[1] <= CONSUMERS as u64 * buffers, "event opens {warm:?} -> {end:?}");
            if tx.sharing_name() == "vmm" {
                assert_eq!(ipc_calls(), [0; 3], "[IPC exports, mem opens, event opens]");
            }
            let n = FRAMES - 2 * CAP as u64;
            let ipc = ipc_calls();
            eprintln!(
                "producer ({}): counters {end:?} unchanged over {n} frames, IPC calls {ipc:?}",
                tx.sharing_name()
            );
        }
        _ => {
            let vars = [("RING", unique_name("steady"))];
            let producer = spawn(test, "producer", &vars);
            let consumers: Vec<_> =
                (0..CONSUMERS).map(|_| spawn(test, "consumer", &vars)).collect();
            expect_success(producer, "producer");
            for c in consumers {
                expect_success(c, "consumer");
            }
        }
    }
}

/// A producer publishes regions of an allocation it registered (as a decoder would publish its
/// output surfaces); the consumer maps it on first use and checks every byte.
#[test]
#[ignore = "needs a CUDA GPU"]
fn publish_from_registered_allocation() {
    registered_run("publish_from_registered_allocation", false);
}

/// The same with VMM sharing: the pool comes from `alloc_pool`, and the consumer fetches its
/// fd from the producer's server when the first message names it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_publish_from_an_allocated_pool() {
    registered_run("vmm_publish_from_an_allocated_pool", true);
}

fn registered_run(test: &str, vmm_sharing: bool) {
    const FRAMES: u64 = 400;
    const REGION: u64 = 1 << 20;
    if role().is_some() {
        let rx = open_when_created(&env::<String>("RING"));
        let opens = [IPC_MEM_OPENS.load(Relaxed), VMM_IMPORTS.load(Relaxed)];
        let (n, bad) = consume(&rx, 0);
        assert_eq!((n, bad), (FRAMES, 0));
        // The registered pool was mapped once, at join or at its first message.
        let now = [IPC_MEM_OPENS.load(Relaxed), VMM_IMPORTS.load(Relaxed)];
        assert!(now[0] - opens[0] + now[1] - opens[1] <= 1, "{opens:?} -> {now:?}");
        eprintln!("consumer ({}): IPC opens, VMM imports {opens:?} -> {now:?}", rx.sharing_name());
        return;
    }
    let name = unique_name("reg");
    let b = Producer::builder(&name).capacity(4).slot_size(REGION as usize);
    let mut tx = if vmm_sharing { vmm(b) } else { b }.create_gpu(0).unwrap();
    let child = spawn(test, "consumer", &[("RING", name)]);
    wait_for_consumers(&tx, 1);
    // Registered after the consumer joined: it maps the pool when the first message names it.
    // One surface per buffer (4 slots and the spares): a surface is written again only when
    // an acquire hands out its buffer again, after its readers are done. (With spares, the
    // buffer of message `seq` is not always the one of `seq - 4`: a held message keeps its own.)
    let surfaces_n = (4 + tx.spare_buffers()) as u64;
    let bytes = (surfaces_n * REGION) as usize;
    let id = if vmm_sharing {
        tx.alloc_pool(bytes).unwrap()
    } else {
        tx.register(DevicePool::new(tx.context(), bytes).unwrap()).unwrap()
    };
    let (base, size) = tx.pool(id).unwrap();
    assert!(size as u64 >= surfaces_n * REGION);
    let k = PatternKernels::get(tx.context()).unwrap();
    for seq in 0..FRAMES {
        let slot = tx.acquire().unwrap();
        let offset = slot.buffer() as u64 * REGION;
        let len = REGION - (seq % 8) * 8;
        // SAFETY: base + offset .. + len lies in the registered pool; written on the slot's
        // stream, which publish fences.
        unsafe { k.fill(slot.stream(), base + offset, len, seq).unwrap() };
        slot.publish_region(id, offset, len, &[]).unwrap();
    }
    let slot = tx.acquire().unwrap();
    let past = size as u64 - 8;
    assert!(slot.publish_region(id, past, 16, &[]).is_err(), "region past the end");
    drop(tx);
    expect_success(child, "consumer");
}

/// In VMM sharing a consumer may live in its producer's process (fd imports have no "not in
/// the exporter" rule), and every byte checks out; allocations the ring cannot share by fd are
/// refused with errors that say why; `Fence::Memory` with VMM is what VMM does anyway.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_consumer_in_the_producers_process() {
    const LEN: u64 = 1 << 20;
    let name = unique_name("vmm-same");
    let b = Producer::builder(&name).capacity(4).slot_size(LEN as usize).policy(Policy::Block);
    let mut tx = vmm(b).create_gpu(0).unwrap();
    assert_eq!(tx.sharing_name(), "vmm");
    let rx = Consumer::builder(&name).open_gpu().unwrap();
    assert_eq!(rx.sharing_name(), "vmm");
    let (kt, kr) =
        (PatternKernels::get(tx.context()).unwrap(), PatternKernels::get(rx.context()).unwrap());
    let bad = counter(&rx);
    for seq in 0..200u64 {
        let slot = tx.acquire().unwrap();
        // SAFETY: as in `produce`.
        unsafe { kt.fill(slot.stream(), slot.ptr(), LEN, seq).unwrap() };
        slot.publish(LEN as usize, &[]).unwrap();
        let m = rx.recv().unwrap();
        assert_eq!(m.seq(), seq);
        // SAFETY: as in `consume`.
        unsafe { kr.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }.unwrap();
    }
    assert_eq!(bad.read().unwrap(), 0);
    let legacy_pool = DevicePool::new(tx.context(), 2 << 20).unwrap();
    let raw = legacy_pool.ptr();
    match tx.register(legacy_pool) {
        Err(e @ RegisterError::WrongSharing { ring: "vmm" }) => eprintln!("register: {e}"),
        other => panic!("a cuMemAlloc pool registered on a VMM ring: {other:?}"),
    }
    let keep = DevicePool::new(tx.context(), 2 << 20).unwrap();
    // SAFETY: `keep` outlives `tx`... and the call is refused before anything is shared.
    match unsafe { tx.register_raw(keep.ptr(), keep.size()) } {
        Err(RegisterError::WrongSharing { .. }) => {}
        other => panic!("register_raw of cuMemAlloc memory on a VMM ring: {other:?} ({raw:#x})"),
    }
    // A VMM allocation of the caller's own is accepted by `register_raw`, and read through.
    let own = gpuring::cuda::VmmPool::new(tx.context(), 2 << 20).unwrap();
    // SAFETY: `own` is a POSIX-fd `cuMemCreate` allocation mapped at its base in the ring's
    // context, dropped after `tx` below.
    let id = unsafe { tx.register_raw(own.ptr(), own.size()) }.unwrap();
    let slot = tx.acquire().unwrap();
    // SAFETY: `own` holds LEN bytes; written on the slot's stream, which publish fences.
    unsafe { kt.fill(slot.stream(), own.ptr(), LEN, 1000).unwrap() };
    slot.publish_region(id, 0, LEN, &[]).unwrap();
    let m = rx.recv().unwrap();
    // SAFETY: as in `consume`.
    unsafe { kr.check(m.stream(), m.ptr(), m.len() as u64, 1000, bad.ptr(), 0) }.unwrap();
    drop(m);
    assert_eq!(bad.read().unwrap(), 0, "a frame from a registered VMM allocation");
    let both = vmm(Producer::builder(&unique_name("vmm-fence"))).fence(gpuring::Fence::Memory);
    let both = both.create_gpu(0).expect("Fence::Memory with VMM");
    assert_eq!(both.sharing_name(), "vmm");
    drop(both);
    drop(rx);
    drop(tx);
    drop((keep, own));
}

/// VMM memory belongs to every process that imported it: a consumer still reads a held frame,
/// byte for byte, after its producer's process has exited (its side of the memory gone with
/// it), even once new allocations (which would reuse freed memory) have been written all over
/// the device.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_memory_outlives_the_producer() {
    const TEST: &str = "vmm_memory_outlives_the_producer";
    const LEN: u64 = 4 << 20;
    if role().is_some() {
        let b = Producer::builder(&env::<String>("RING")).capacity(2).slot_size(LEN as usize);
        let mut tx = vmm(b).create_gpu(0).unwrap();
        tx.set_linger(Duration::from_millis(50));
        wait_for_consumers(&tx, 1);
        produce(&mut tx, 1, LEN);
        let t = Instant::now();
        while tx.consumers().iter().any(|c| c.cursor < 1) {
            assert!(t.elapsed() < Duration::from_secs(30), "the consumer did not take the frame");
            std::thread::sleep(Duration::from_millis(1));
        }
        return; // the process exits: everything of the producer's goes with it
    }
    let name = unique_name("vmm-outlive");
    let child = spawn(TEST, "producer", &[("RING", name.clone())]);
    let rx = open_when_created(&name);
    let m = rx.recv().unwrap();
    expect_success(child, "producer");
    // Freed memory would be handed out again: fill 64 new allocations of the frame's size.
    let ctx = rx.context().clone();
    let scratch: Vec<_> = (0..64).map(|_| DevicePool::new(&ctx, LEN as usize).unwrap()).collect();
    let stream = gpuring::cuda::Stream::new(&ctx).unwrap();
    for pool in &scratch {
        let _bound = ctx.bind().unwrap();
        // SAFETY: `pool` holds LEN bytes; the stream is live and synchronised below.
        unsafe { driver::memset_async(pool.ptr(), 0xA5, LEN as usize, stream.raw()) }.unwrap();
    }
    stream.synchronize().unwrap();
    let (k, bad) = (PatternKernels::get(rx.context()).unwrap(), counter(&rx));
    // SAFETY: `m` is held: its bytes stay readable on its stream until released.
    unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }.unwrap();
    assert_eq!(bad.read().unwrap(), 0, "the frame changed after the producer exited");
    eprintln!("frame {} read intact after the producer's exit", m.seq());
    drop(m);
    assert!(matches!(rx.recv(), Err(RecvError::Disconnected)));
    drop(scratch);
}

/// A CUDA ring is not opened as host memory (and vice versa), and a consumer naming another
/// device than the ring's is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_kind_and_device_are_checked() {
    let name = unique_name("kind");
    let tx = Producer::builder(&name).create_gpu(0).unwrap();
    assert!(matches!(
        Consumer::open(&name).map_err(OpenError::into_kind),
        Err(OpenErrorKind::WrongMemory { found: MemoryKind::Cuda })
    ));
    let n = driver::device_count().unwrap();
    match Consumer::builder(&name).device(n).open_gpu().map_err(OpenError::into_kind) {
        Err(OpenErrorKind::MemoryUnavailable { reason }) => eprintln!("device {n}: {reason}"),
        Err(e) => panic!("unexpected error for a missing device: {e}"),
        Ok(_) => panic!("opened on a device that does not exist"),
    }
    // CUDA IPC does not open handles in the process that made them: a clear error says so.
    match Consumer::builder(&name).open_gpu().map_err(OpenError::into_kind) {
        Err(OpenErrorKind::MemoryUnavailable { reason }) => {
            assert!(reason.contains("another process"), "{reason}")
        }
        Err(e) => panic!("unexpected error in the producer's process: {e}"),
        Ok(_) => panic!("opened a CUDA ring in its producer's process"),
    }
    drop(tx);
}

/// Consumers that keep joining and leaving while frames flow: each occupant of a table entry
/// exports new release events, which the producer must wait on (and not confuse with the last
/// occupant's). Two steady consumers and the churning one all check every byte they get.
#[test]
#[ignore = "needs a CUDA GPU"]
fn consumers_join_and_leave_mid_stream() {
    churn("consumers_join_and_leave_mid_stream", gpuring::Fence::Events);
}

/// The same with memory fences: each occupant writes the release words of its generation's
/// bank, which the producer must not confuse with the last occupant's late writes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_fenced_consumers_join_and_leave_mid_stream() {
    churn("memory_fenced_consumers_join_and_leave_mid_stream", gpuring::Fence::Memory);
}

fn churn(test: &str, fence: gpuring::Fence) {
    const FRAMES: u64 = 20_000;
    const LEN: u64 = 1 << 20;
    match role().as_deref() {
        Some("steady") => {
            let rx = open_when_created(&env::<String>("RING"));
            let (n, bad) = consume(&rx, 0);
            assert_eq!((n, bad), (FRAMES, 0));
        }
        Some("churn") => {
            let name = env::<String>("RING");
            let mut rounds = 0;
            let mut frames = 0;
            'rounds: for _ in 0..40 {
                let rx = match Consumer::builder(&name).open_gpu().map_err(OpenError::into_kind) {
                    Ok(rx) => rx,
                    Err(OpenErrorKind::Disconnected | OpenErrorKind::NotFound) => break,
                    Err(e) => panic!("open: {e}"),
                };
                let k = PatternKernels::get(rx.context()).unwrap();
                let bad = counter(&rx);
                for _ in 0..50 {
                    let m = match rx.recv() {
                        Ok(m) => m,
                        Err(RecvError::Disconnected) => break 'rounds,
                        Err(e) => panic!("recv: {e}"),
                    };
                    // SAFETY: as in `consume`; slow enough that the producer must wait for us.
                    unsafe {
                        k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 20_000)
                    }
                    .unwrap();
                    frames += 1;
                }
                assert_eq!(bad.read().unwrap(), 0, "round {rounds}");
                rounds += 1;
            }
            eprintln!("churn: {rounds} rounds, {frames} frames checked");
            assert!(rounds >= 10, "only {rounds} rounds before the producer finished");
        }
        _ => {
            let name = unique_name("churn");
            let b = Producer::builder(&name).capacity(4).slot_size(LEN as usize).fence(fence);
            let mut tx = b.create_gpu(0).unwrap();
            let vars = [("RING", name)];
            let steady: Vec<_> = (0..2).map(|_| spawn(test, "steady", &vars)).collect();
            wait_for_consumers(&tx, 2);
            let churn = spawn(test, "churn", &vars);
            produce(&mut tx, FRAMES, LEN);
            drop(tx);
            for c in steady {
                expect_success(c, "steady consumer");
            }
            expect_success(churn, "churning consumer");
        }
    }
}

/// `GpuConsumer::recv_async` and `GpuProducer::acquire_async` (feature `tokio`): two consumer
/// processes receive on a current-thread runtime, each checking every byte with a kernel,
/// while the producer writes as fast as a 2-slot Block ring allows. Both sides' waits park on
/// doorbells: a lost wake-up would stall a side for its minute-long liveness interval and fail
/// the deadline.
#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn async_gpu_consumers_read_every_byte() {
    const FRAMES: u64 = 2_000;
    const LEN: u64 = 1 << 20;
    let test = "async_gpu_consumers_read_every_byte";
    if role().is_some() {
        let rx = Consumer::builder(&env::<String>("RING"))
            .start_at(gpuring::StartAt::Next)
            .liveness_interval(Duration::from_secs(60))
            .open_gpu()
            .unwrap();
        let k = PatternKernels::get(rx.context()).unwrap();
        let bad = counter(&rx);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let n = rt.block_on(async {
            let mut n = 0;
            loop {
                let wait = tokio::time::timeout(Duration::from_secs(20), rx.recv_async());
                let m = match wait.await.expect("not woken within 20 s") {
                    Ok(m) => m,
                    Err(RecvError::Disconnected) => break n,
                    Err(e) => panic!("recv_async: {e}"),
                };
                // SAFETY: the message's bytes stay readable on its stream until its release,
                // which dropping `m` records after this kernel.
                unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }
                    .unwrap();
                n += 1;
            }
        });
        let bad = bad.read().unwrap();
        eprintln!("async gpu consumer: {n} frames, {bad} mismatching bytes");
        assert_eq!((n, bad), (FRAMES, 0));
        return;
    }
    let name = unique_name("gpu-async");
    let b = Producer::builder(&name).capacity(2).slot_size(LEN as usize).policy(Policy::Block);
    let mut tx = b.liveness_interval(Duration::from_secs(60)).create_gpu(0).unwrap();
    let children: Vec<_> =
        (0..2).map(|_| spawn(test, "consumer", &[("RING", name.clone())])).collect();
    wait_for_consumers(&tx, 2);
    let k = PatternKernels::get(tx.context()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for seq in 0..FRAMES {
            let wait = tokio::time::timeout(Duration::from_secs(20), tx.acquire_async());
            let slot = wait.await.expect("not woken within 20 s").unwrap();
            // SAFETY: the slot holds slot_size >= LEN bytes and is ours until publish.
            unsafe { k.fill(slot.stream(), slot.ptr(), LEN, seq).unwrap() };
            slot.publish(LEN as usize, &[]).unwrap();
        }
    });
    drop(tx);
    for child in children {
        expect_success(child, "async GPU consumer");
    }
}

/// Loans on a CUDA ring: the producer lends two spares at a time, fills each on its stream
/// with the pattern of the number it will be published as, and publishes them in the reverse
/// order of their lending, while a consumer in another process checks every frame on its GPU
/// after a slow spin (capacity 2, Block, so buffers are reused under its reads). The fences
/// are the same as a slot's: 0 mismatching bytes, every frame delivered. Both fence kinds.
#[test]
#[ignore = "needs a CUDA GPU"]
fn loans_on_a_cuda_ring_are_fenced() {
    const FRAMES: u64 = 200;
    const LEN: u64 = 1 << 20;
    let test = "loans_on_a_cuda_ring_are_fenced";
    if role().is_some() {
        let rx = open_when_created(&env::<String>("RING"));
        let (n, bad) = consume(&rx, 100_000);
        eprintln!("loans: {n} frames, {bad} mismatching bytes");
        assert_eq!((n, bad), (FRAMES, 0));
        return;
    }
    for fence in [gpuring::Fence::Events, gpuring::Fence::Memory] {
        let name = unique_name("loans");
        let b = Producer::builder(&name).capacity(2).spare_buffers(2).slot_size(LEN as usize);
        let mut tx = match b.policy(Policy::Block).fence(fence).create_gpu(0) {
            Ok(tx) => tx,
            // Memory fences need 64-bit stream memory operations.
            Err(e) if fence == gpuring::Fence::Memory => {
                eprintln!("skipping {fence:?}: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let child = spawn(test, "consumer", &[("RING", name)]);
        wait_for_consumers(&tx, 1);
        let k = PatternKernels::get(tx.context()).unwrap();
        let mut seq = 0;
        while seq < FRAMES {
            let mut loans = vec![tx.lend().unwrap(), tx.lend().unwrap()];
            loans.reverse();
            for (i, loan) in loans.iter().enumerate() {
                // SAFETY: the loan is ours, `LEN` bytes long, until it is published.
                unsafe { k.fill(tx.stream(), tx.loan_ptr(loan), LEN, seq + i as u64).unwrap() };
            }
            for mut loan in loans {
                assert_eq!(tx.publish_loan(&mut loan, LEN as usize, &[]).unwrap(), seq);
                tx.end_loan(loan).unwrap();
                seq += 1;
            }
        }
        drop(tx);
        expect_success(child, &format!("consumer ({fence:?})"));
    }
}
