//! Faults of CUDA rings: consumers killed with their GPU work queued right after a release,
//! the order of teardown across processes, the caller's CUDA context, and a consumer whose
//! release-event handle is damaged. Every test needs a GPU and is ignored without one.
#![cfg(feature = "cuda")]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::cuda::driver;
use gpuring::format::Params;
use gpuring::shm::{OpenOptions, RingDir, Segment, ShmName};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::RecvError;
use gpuring::{Consumer, Fence, GpuConsumer, GpuProducer, Policy, Producer, StartAt};

const LEN: u64 = 1 << 20;

fn open_when_created(name: &str) -> GpuConsumer {
    let b = Consumer::builder(name).start_at(StartAt::Next);
    b.open_in_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"))
}

fn wait_for_consumers(tx: &GpuProducer, n: usize) {
    let t = Instant::now();
    while tx.consumer_count() < n {
        assert!(t.elapsed() < Duration::from_secs(60), "consumers did not join");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks every message on the GPU until disconnected (or `until` messages); asserts that none
/// was lost (Block) and no byte differed. Returns the messages checked.
fn check_all(rx: &GpuConsumer, until: Option<u64>) -> u64 {
    let k = PatternKernels::get(rx.context()).unwrap();
    let bad = MismatchCounter::new(rx.stream()).unwrap();
    let (mut n, mut next) = (0, None);
    loop {
        let m = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => break,
            Err(e) => panic!("recv: {e}"),
        };
        if let Some(next) = next {
            assert_eq!(m.seq(), next, "a steady consumer lost messages");
        }
        next = Some(m.seq() + 1);
        // SAFETY: the bytes stay readable on the message's stream until the release that
        // dropping `m` records after this kernel.
        unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }.unwrap();
        n += 1;
        if until.is_some_and(|u| n >= u) {
            break;
        }
    }
    assert_eq!(bad.read().unwrap(), 0, "mismatching bytes");
    n
}

/// Publishes `seq` with the test pattern, waiting at most 20 s for a slot.
fn publish(tx: &mut GpuProducer, k: &PatternKernels, seq: u64) {
    let slot = match tx.acquire_timeout(Duration::from_secs(20)) {
        Ok(slot) => slot,
        Err(e) => panic!("the producer is stuck at message {seq}: {e}; {:?}", tx.consumers()),
    };
    // SAFETY: the slot holds LEN bytes and is ours until publish.
    unsafe { k.fill(slot.stream(), slot.ptr(), LEN, seq) }.unwrap();
    slot.publish(LEN as usize, b"").unwrap();
}

/// Consumers that queue a long kernel on a message (50 ms), release it, and are SIGKILLed at
/// once (they kill themselves right after the release, before their stream has run the release
/// record). The producer must notice them dead and stop depending on their fences: it keeps
/// publishing, and two steady consumers receive every message intact. `KILLS` per fence kind;
/// run it with MPS on and off (scripts/gpu-faults.sh).
fn killed_after_release(test: &str, fence: Fence) {
    const KILLS: u64 = 100;
    const WAVE: u64 = 8;
    match role().as_deref() {
        Some("steady") => {
            let rx = open_when_created(&env::<String>("RING"));
            let n = check_all(&rx, None);
            eprintln!("steady consumer: {n} messages checked");
            return;
        }
        Some("killed") => {
            let rx = open_when_created(&env::<String>("RING"));
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = MismatchCounter::new(rx.stream()).unwrap();
            let m = rx.recv().unwrap();
            // SAFETY: as in `check_all`; the kernel spins 50 ms before it reads.
            unsafe { k.check(m.stream(), m.ptr(), LEN, m.seq(), bad.ptr(), 50_000_000) }.unwrap();
            m.release().unwrap();
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            unreachable!("killed");
        }
        _ => {}
    }
    let name = unique_name("killed");
    let mut tx = Producer::builder(&name)
        .capacity(4)
        .slot_size(LEN as usize)
        .policy(Policy::Block)
        .fence(fence)
        .liveness_interval(Duration::from_millis(20))
        .create_gpu(0)
        .unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let env = [("RING", name.clone())];
    let steady: Vec<_> = (0..2).map(|_| spawn(test, "steady", &env)).collect();
    wait_for_consumers(&tx, 2);
    let (mut seq, mut killed) = (0, 0);
    let started = Instant::now();
    while killed < KILLS {
        let wave: Vec<_> = (0..WAVE).map(|_| spawn(test, "killed", &env)).collect();
        // Keep publishing while they join, read, release and die.
        let mut wave: Vec<_> = wave.into_iter().map(Some).collect();
        while wave.iter().any(Option::is_some) {
            publish(&mut tx, &k, seq);
            seq += 1;
            for w in wave.iter_mut() {
                if let Some(status) = w.as_mut().and_then(|c| c.try_wait().unwrap()) {
                    use std::os::unix::process::ExitStatusExt;
                    assert_eq!(status.signal(), Some(9), "a killed consumer ended otherwise");
                    killed += 1;
                    *w = None;
                }
            }
        }
    }
    // A few more laps after the last death: nothing may be wedged.
    for _ in 0..64 {
        publish(&mut tx, &k, seq);
        seq += 1;
    }
    let t = Instant::now();
    while tx.consumer_count() > 2 || tx.held_buffers() > 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "left behind: {:?}", tx.consumers());
        tx.reap().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{fence:?}: {killed} consumers killed right after release, {seq} messages in {secs:.1} s"
    );
    eprintln!(
        "{fence:?}: {killed} consumers killed right after release, {seq} messages in {secs:.1} s"
    );
    drop(tx);
    for c in steady {
        expect_success(c, "a steady consumer");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn consumers_killed_right_after_release_do_not_stall_the_producer_events() {
    let test = "consumers_killed_right_after_release_do_not_stall_the_producer_events";
    killed_after_release(test, Fence::Events);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn consumers_killed_right_after_release_do_not_stall_the_producer_memory() {
    let test = "consumers_killed_right_after_release_do_not_stall_the_producer_memory";
    killed_after_release(test, Fence::Memory);
}

/// One line of the lifecycle log: monotonic ns, pid, message, and the entry and ring fields.
#[derive(Debug, Clone)]
struct Event {
    ns: u64,
    pid: u32,
    what: String,
    entry: Option<u64>,
    ring: Option<String>,
}

/// Logs gpuring's lifecycle events (target `gpuring::lifecycle`) of this process to `path`,
/// one line each: `<monotonic ns> <pid> <fields>`.
fn log_lifecycle_to(path: &str) {
    log_to(path, "gpuring::lifecycle=debug");
}

/// Logs gpuring's events that `filter` admits (an `EnvFilter` directive) as
/// [`log_lifecycle_to`] does.
fn log_to(path: &str, filter: &str) {
    struct Mono;
    impl tracing_subscriber::fmt::time::FormatTime for Mono {
        fn format_time(
            &self,
            w: &mut tracing_subscriber::fmt::format::Writer<'_>,
        ) -> std::fmt::Result {
            write!(w, "{} {}", gpuring::monotonic_ns(), std::process::id())
        }
    }
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_timer(Mono)
        .with_ansi(false)
        .with_level(false)
        .with_target(false)
        .with_writer(std::sync::Mutex::new(file))
        .init();
}

fn read_log(path: &str) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let mut w = line.split_whitespace();
            let ns = w.next().unwrap().parse().unwrap();
            let pid = w.next().unwrap().parse().unwrap();
            let rest: Vec<&str> = w.collect();
            let entry = rest.iter().find_map(|f| f.strip_prefix("entry=")?.parse().ok());
            let ring = rest.iter().find_map(|f| Some(f.strip_prefix("ring=")?.to_owned()));
            let what = rest.iter().filter(|f| !f.contains('=')).copied().collect::<Vec<_>>();
            Event { ns, pid, what: what.join(" "), entry, ring }
        })
        .collect()
}

/// Teardown order across processes, read from the lifecycle log of a producer and two
/// consumers (docs/gpu.md, "Leaving"): each consumer closes its mappings of the producer's
/// memory and its ready-event imports before it retires its entry; the producer drops its
/// imports of a consumer's release events before that consumer destroys them; the producer
/// frees its memory only after every consumer closed its mappings.
#[test]
#[ignore = "needs a CUDA GPU"]
fn teardown_closes_before_it_leaves_and_frees_after_everyone() {
    const TEST: &str = "teardown_closes_before_it_leaves_and_frees_after_everyone";
    let log: String = std::env::var("LOG").unwrap_or_default();
    if role().is_some() {
        log_lifecycle_to(&log);
        let rx = open_when_created(&env::<String>("RING"));
        // Read for a while, so the producer has opened our release events, then leave while
        // it still publishes.
        check_all(&rx, Some(64));
        return;
    }
    let name = unique_name("teardown");
    let log = std::env::temp_dir().join(format!("{name}.log")).display().to_string();
    let _ = std::fs::remove_file(&log);
    log_lifecycle_to(&log);
    // Block: `check_all` asserts that no message is lost. Events: the steps logged below are
    // the release events' (memory words have no imports to drop).
    let mut tx = Producer::builder(&name)
        .capacity(4)
        .slot_size(LEN as usize)
        .policy(Policy::Block)
        .fence(Fence::Events)
        .create_gpu(0)
        .unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let env = [("RING", name.clone()), ("LOG", log.clone())];
    let mut children: Vec<_> = (0..2).map(|_| Some(spawn(TEST, "consumer", &env))).collect();
    wait_for_consumers(&tx, 2);
    let mut seq = 0;
    while children.iter().any(Option::is_some) {
        publish(&mut tx, &k, seq);
        seq += 1;
        std::thread::sleep(Duration::from_micros(500));
        for c in children.iter_mut() {
            if let Some(status) = c.as_mut().and_then(|ch| ch.try_wait().unwrap()) {
                assert!(status.success(), "a consumer failed: {status}");
                *c = None;
            }
        }
    }
    drop(tx);
    // Other tests in this process log too (the subscriber is process-wide): of this process's
    // events keep only this ring's.
    let me = std::process::id();
    let events: Vec<Event> = read_log(&log)
        .into_iter()
        .filter(|e| e.pid != me || e.ring.as_deref() == Some(name.as_str()))
        .collect();
    let at = |pid: u32, what: &str, entry: Option<u64>| -> Option<u64> {
        events
            .iter()
            .find(|e| {
                e.pid == pid && e.what.contains(what) && (entry.is_none() || e.entry == entry)
            })
            .map(|e| e.ns)
    };
    let freed = at(me, "producer pools freed", None).expect("the producer freed its pools");
    let consumers: std::collections::BTreeSet<u32> =
        events.iter().filter(|e| e.pid != me).map(|e| e.pid).collect();
    assert_eq!(consumers.len(), 2, "events: {events:?}");
    for pid in consumers {
        let entry = events.iter().find(|e| e.pid == pid).and_then(|e| e.entry);
        let closed = at(pid, "consumer mappings closed", None).expect("closed");
        let retiring = at(pid, "consumer retiring", None).expect("retiring");
        let destroyed = at(pid, "consumer release events destroyed", None)
            .expect("the consumer destroyed its release events (the producer let go in time)");
        let dropped = at(me, "producer imports dropped", entry).expect("the producer dropped");
        println!(
            "consumer {pid} (entry {entry:?}): closed {closed}, retiring +{} ns, producer \
             dropped imports +{} ns, events destroyed +{} ns; pools freed +{} ns",
            retiring - closed,
            dropped - closed,
            destroyed - closed,
            freed - closed
        );
        assert!(closed < retiring, "consumer {pid} retired before closing its mappings");
        assert!(dropped < destroyed, "consumer {pid} destroyed events the producer had open");
        assert!(closed < freed, "the producer freed memory consumer {pid} still mapped");
    }
}

/// The caller's current CUDA context is left as it was by creating a producer and opening a
/// consumer: none on a fresh thread, and a context of the caller's own (as PyTorch has) where
/// one is current.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_callers_context_stays_current() {
    const TEST: &str = "the_callers_context_stays_current";
    if role().is_some() {
        let mut tx = Producer::builder(&env::<String>("RING"))
            .slot_size(LEN as usize)
            .create_gpu(0)
            .unwrap();
        let k = PatternKernels::get(tx.context()).unwrap();
        let mut seq = 0;
        // Publish until the parent is done (it removes the flag file).
        while std::path::Path::new(&env::<String>("FLAG")).exists() {
            publish(&mut tx, &k, seq);
            seq += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        return;
    }
    driver::available().expect("a CUDA driver"); // cuInit, before any other driver call
    let current = || driver::ctx_get_current().unwrap() as usize;
    // A producer made on a thread with no current context.
    std::thread::spawn(move || {
        assert_eq!(current(), 0);
        let tx = Producer::builder(&unique_name("ctx-tx")).create_gpu(0).unwrap();
        assert_eq!(current(), 0, "create_gpu left a context current");
        drop(tx);
        assert_eq!(current(), 0, "dropping a producer left a context current");
    })
    .join()
    .unwrap();
    // Consumers of a ring in another process, opened with no context and with one of ours.
    let name = unique_name("ctx");
    let flag = std::env::temp_dir().join(format!("{name}.flag")).display().to_string();
    std::fs::write(&flag, b"").unwrap();
    let child = spawn(TEST, "producer", &[("RING", name.clone()), ("FLAG", flag.clone())]);
    std::thread::spawn(move || {
        assert_eq!(current(), 0);
        let rx = open_when_created(&name);
        assert_eq!(current(), 0, "open_gpu left a context current");
        check_all(&rx, Some(8));
        assert_eq!(current(), 0, "receiving left a context current");
        drop(rx);
        let dev = driver::device(0).unwrap();
        // SAFETY: a fresh context of device 0, destroyed below after the last use.
        let mine = unsafe { driver::ctx_create(dev) }.unwrap();
        assert_eq!(current(), mine as usize);
        let rx = open_when_created(&name);
        assert_eq!(current(), mine as usize, "open_gpu replaced the caller's context");
        check_all(&rx, Some(8));
        drop(rx);
        assert_eq!(current(), mine as usize, "dropping a consumer replaced the caller's context");
        // SAFETY: ours, current on this thread, not used after.
        unsafe { driver::ctx_destroy(mine) }.unwrap();
    })
    .join()
    .unwrap();
    std::fs::remove_file(&flag).unwrap();
    expect_success(child, "producer");
}

/// One consumer's release-event handles are overwritten with random bytes (a buggy or hostile
/// process of the same user). The producer's open of them fails: it must evict that consumer
/// (counted, visible in its consumer list) and go on serving the two others, which receive
/// every message intact.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_with_a_damaged_release_event_is_evicted() {
    const TEST: &str = "a_consumer_with_a_damaged_release_event_is_evicted";
    const MESSAGES: u64 = 400;
    match role().as_deref() {
        Some("steady") => {
            let rx = open_when_created(&env::<String>("RING"));
            assert_eq!(check_all(&rx, Some(MESSAGES)), MESSAGES);
            return;
        }
        Some("victim") => {
            let rx = open_when_created(&env::<String>("RING"));
            loop {
                match rx.recv() {
                    Ok(m) => drop(m),
                    Err(RecvError::Corrupt(c)) => {
                        eprintln!("victim: {c}");
                        assert!(c.to_string().contains("evicted"), "victim: {c}");
                        return;
                    }
                    Err(e) => panic!("victim: {e}"),
                }
            }
        }
        _ => {}
    }
    let name = unique_name("evict");
    // Events: the damage is to the victim's release event handles.
    let mut tx = Producer::builder(&name)
        .capacity(4)
        .slot_size(LEN as usize)
        .policy(Policy::Block)
        .fence(Fence::Events)
        .create_gpu(0)
        .unwrap();
    let k = PatternKernels::get(tx.context()).unwrap();
    let env = [("RING", name.clone())];
    let steady: Vec<_> = (0..2).map(|_| spawn(TEST, "steady", &env)).collect();
    let victim = spawn(TEST, "victim", &env);
    wait_for_consumers(&tx, 3);
    let entry = tx.consumers().iter().find(|c| c.pid == victim.id()).unwrap().index;
    // Its release lines' handles: 16 bytes into each 128-byte line (see cuda::layout).
    let seg = Segment::open(
        &RingDir::open_default().unwrap(),
        &ShmName::new(&name).unwrap(),
        OpenOptions::default(),
    )
    .unwrap();
    let (params, layout) = Params::read(seg.header(), seg.len() as u64).unwrap();
    // One release line per buffer (slots and spares), `buffers` lines per entry.
    let buffers = params.buffers() as usize;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for buffer in 0..buffers {
        let line = layout.release_slots + (entry * buffers + buffer) * 128;
        for w in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // SAFETY: an 8-byte-aligned word of the victim's release line, inside the mapping
            // (the layout was checked against the file size); shared words are atomics.
            let word = unsafe {
                &*(seg.base().add(line + 16 + 8 * w) as *const std::sync::atomic::AtomicU64)
            };
            word.store(x, Relaxed);
        }
    }
    for seq in 0..MESSAGES {
        publish(&mut tx, &k, seq);
    }
    let evicted: Vec<_> = tx.consumers().into_iter().filter(|c| c.evicted).collect();
    println!("evicted: {evicted:?}");
    for c in steady {
        expect_success(c, "a steady consumer");
    }
    expect_success(victim, "the victim");
    let status = gpuring::inspect::status(&name).unwrap();
    assert_eq!(status.evictions, 1, "evictions counted: {}", status.evictions);
    drop(tx);
}

/// A process whose context a kernel of its own faults, while its consumer only waits (its
/// producer is alive and idle): the wait probes the driver at its liveness tick and ends with
/// `ContextLost`, the real sticky error, so that under MPS such a process exits rather than
/// lingering and keeping every other client from starting. The fault is the child's own (with
/// MPS off it stays there); the producer is the parent's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn an_idle_consumer_learns_that_its_context_was_lost() {
    const TEST: &str = "an_idle_consumer_learns_that_its_context_was_lost";
    if role().as_deref() == Some("faulting") {
        // The producer is the parent's: alive, and sending nothing.
        let rx = Consumer::builder(&env::<String>("RING"))
            .liveness_interval(Duration::from_millis(50))
            .open_in::<gpuring::Cuda>()
            .unwrap();
        let ctx = rx.context().clone();
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = rx.recv().map(|m| m.seq());
            let _ = done.send(format!("{r:?}"));
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(gpuring::context_lost().is_none(), "lost before the fault");
        let src = r#"extern "C" __global__ void store(unsigned* p) { *p = 1; }"#;
        let module = gpuring::testing::kernels::Module::load(&ctx, src, "store.cu").unwrap();
        let store = module.function("store").unwrap();
        let stream = gpuring::cuda::Stream::new(&ctx).unwrap();
        let mut bad: u64 = 0x10;
        let mut params = [(&mut bad as *mut u64).cast::<std::ffi::c_void>()];
        // SAFETY: `store` is this module's and `stream` its context's; the parameter is a
        // pointer, and the fault it makes is the point of the test (this process only).
        unsafe { module.launch(store, 1, 1, &stream, &mut params) }.unwrap();
        let r = ended.recv_timeout(Duration::from_secs(30)).expect("recv still waits");
        assert!(r.contains("ContextLost"), "recv ended with {r}");
        let lost = gpuring::context_lost().expect("the loss is latched");
        assert!(lost.error().starts_with("CUDA_ERROR_"), "{lost}");
        assert_ne!(lost.call(), "test hook");
        progress!("child: recv ended with {lost}");
        // Ends without waiting for GPU work: the process is done for.
        std::mem::forget((module, stream));
        return;
    }
    if role().is_some() {
        return;
    }
    let name = unique_name("faulting");
    let tx = Producer::builder(&name).create_gpu(0).unwrap();
    let child = spawn(TEST, "faulting", &[("RING", name)]);
    expect_success(child, "the faulting process");
    // The fault stayed in the child (MPS off): this process's context is fine.
    assert!(gpuring::context_lost().is_none());
    drop(tx);
}

/// A producer killed while its consumer's stream waits on a ready fence it will never write
/// (memory fences): the consumer is told `Disconnected`, and on leaving it raises the dead
/// producer's ready words itself, so that its stream's waits end and it closes its mappings
/// cleanly (its lifecycle log says so) instead of leaving its GPU work to process exit
/// (docs/gpu.md, "A dead producer's ready words"). The producer's stream is held back by a
/// wait on a host word nobody sets, not by a running kernel: under MPS, killing a process
/// while its kernel runs can take the other clients down with it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_producer_killed_with_waits_posted_leaves_its_consumer_free() {
    const TEST: &str = "a_producer_killed_with_waits_posted_leaves_its_consumer_free";
    match role().as_deref() {
        Some("producer") => {
            let mut tx = Producer::builder(&env::<String>("RING"))
                .capacity(2)
                .slot_size(LEN as usize)
                .fence(Fence::Memory)
                .liveness_interval(Duration::from_millis(20))
                .create_gpu(0)
                .unwrap();
            let k = PatternKernels::get(tx.context()).unwrap();
            wait_for_consumers(&tx, 1);
            let ctx = tx.context().clone();
            let slot = tx.acquire().unwrap();
            let page = memmap2::MmapMut::map_anon(4096).unwrap();
            let _bound = ctx.bind().unwrap();
            // SAFETY: a page-aligned mapping that outlives this process's GPU work (the
            // process is killed below with the page still mapped and registered).
            let gate = unsafe { driver::mem_host_register(page.as_ptr() as *mut u8, 4096) };
            // SAFETY: the gate word is registered above and never set, so the stream stops
            // here; the slot holds LEN bytes and is ours until publish.
            unsafe {
                driver::stream_wait_value64(slot.stream().raw(), gate.unwrap(), 1).unwrap();
                k.fill(slot.stream(), slot.ptr(), LEN, 0).unwrap();
            }
            slot.publish(LEN as usize, b"").unwrap();
            // The consumer takes the message and posts its wait meanwhile; then we die with
            // the fill and the ready write still queued behind the gate.
            std::thread::sleep(Duration::from_secs(1));
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            unreachable!("killed");
        }
        Some("consumer") => {
            // Info too: the line that says the dead producer's ready words were raised.
            log_to(&env::<String>("LOG"), "gpuring=info,gpuring::lifecycle=debug");
            let b = Consumer::builder(&env::<String>("RING")).gpu_poll(Duration::ZERO);
            let rx: GpuConsumer = b.open_in_timeout(Duration::from_secs(60)).unwrap();
            // Before the wait is posted: loading a module or allocating may wait for the
            // context's work, which would then wait for ever.
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = MismatchCounter::new(rx.stream()).unwrap();
            let m = rx.recv().unwrap();
            // SAFETY: the bytes stay mapped until we leave; our stream reads them after the
            // ready wait (which only our leaving ends, since the producer dies).
            unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, 0, bad.ptr(), 0) }.unwrap();
            assert!(!rx.stream().is_idle().unwrap(), "our stream should wait on the ready fence");
            drop(m);
            match rx.recv_timeout(Duration::from_secs(20)) {
                Err(gpuring::RecvTimeoutError::Disconnected) => {}
                Err(e) => panic!("after the producer died: {e}"),
                Ok(m) => panic!("message {} after the producer died", m.seq()),
            }
            std::mem::forget(bad); // its read would wait for the stream we leave
            drop(rx);
            return;
        }
        _ => {}
    }
    let name = unique_name("waits-posted");
    let log = std::env::temp_dir().join(format!("{name}.log")).display().to_string();
    let _ = std::fs::remove_file(&log);
    let env = [("RING", name.clone()), ("LOG", log.clone())];
    let mut producer = spawn(TEST, "producer", &env);
    let consumer = spawn(TEST, "consumer", &env);
    {
        use std::os::unix::process::ExitStatusExt;
        let status = producer.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "the producer ended otherwise: {status}");
    }
    expect_success(consumer, "the consumer");
    let events = read_log(&log);
    let closed = events.iter().any(|e| e.what.contains("consumer mappings closed"));
    assert!(closed, "the consumer left its GPU work to exit instead: {events:?}");
}
