//! Floors measured in the same run as the ring: device copy bandwidth, the bench kernels' own
//! bandwidth, and a raw CUDA IPC handoff with no ring.
//!
//! The raw handoff (one buffer, one ready event, one ack event, two words in a /dev/shm file):
//! the producer makes its stream wait for the consumer's ack event, fills and stamps the buffer,
//! records the ready event, stores `i` in the ready word, and spins until the ack word is `i`.
//! The consumer spins on the ready word, makes its stream wait on the ready event, reads the
//! buffer (recording latency), records its ack event and stores `i` in the ack word.

use std::collections::HashMap;
use std::hint::spin_loop;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuring::cuda::driver::{self, CUdeviceptr};
use gpuring::cuda::{Context, DevicePool, IpcEvent, IpcMapping, Stream};

use crate::kernels::{percentiles, Kernels};
use crate::{child_result, Opts, ROLE};

/// Bytes read plus bytes written per second by `cuMemcpyDtoDAsync` of 256 MiB buffers.
pub fn d2d_bandwidth(ctx: &Arc<Context>, stream: &Stream) -> f64 {
    const LEN: usize = 256 << 20;
    let (a, b) = (DevicePool::new(ctx, LEN).unwrap(), DevicePool::new(ctx, LEN).unwrap());
    let _bound = ctx.bind().unwrap();
    let copy = |n: usize| {
        for i in 0..n {
            let (src, dst) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            // SAFETY: two distinct live allocations of LEN bytes; the stream is live.
            unsafe { driver::memcpy_dtod_async(dst.ptr(), src.ptr(), LEN, stream.raw()) }.unwrap();
        }
        stream.synchronize().unwrap();
    };
    copy(4);
    let t = Instant::now();
    copy(40);
    (2 * LEN * 40) as f64 / t.elapsed().as_secs_f64()
}

/// Bytes per second of `bench_fill` (written) and `bench_read` (read) over one 256 MiB buffer.
pub fn kernel_bandwidth(ctx: &Arc<Context>, stream: &Stream, k: &Kernels) -> (f64, f64) {
    const LEN: u64 = 256 << 20;
    let buf = DevicePool::new(ctx, LEN as usize).unwrap();
    let time = |f: &dyn Fn()| {
        f();
        stream.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..20 {
            f();
        }
        stream.synchronize().unwrap();
        (LEN * 20) as f64 / t.elapsed().as_secs_f64()
    };
    // SAFETY: `buf` is a live LEN-byte allocation used only on `stream`.
    let fill = time(&|| unsafe { k.fill(stream, buf.ptr(), LEN, 1) });
    // SAFETY: as above.
    let read = time(&|| unsafe { k.read(stream, buf.ptr(), LEN, None) });
    (fill, read)
}

/// The shared file of the raw handoff.
struct Shared {
    map: memmap2::MmapRaw,
    path: String,
    /// Whether this process registered the second page with CUDA (unregistered on drop).
    registered: std::cell::Cell<bool>,
}

const FLAG: usize = 0;
const READY: usize = 128;
const ACK: usize = 256;
const FIRST_MEASURED: usize = 384;
const MEM_HANDLE: usize = 512;
const READY_EVENT: usize = 576;
const ACK_EVENT: usize = 640;

impl Shared {
    fn create(name: &str) -> Shared {
        let path = format!("/dev/shm/{name}");
        let f =
            std::fs::File::options().create_new(true).read(true).write(true).open(&path).unwrap();
        f.set_len(8192).unwrap();
        Shared { map: memmap2::MmapRaw::map_raw(&f).unwrap(), path, registered: false.into() }
    }

    fn open(name: &str) -> Shared {
        let path = format!("/dev/shm/{name}");
        let f = std::fs::File::options().read(true).write(true).open(&path).unwrap();
        Shared {
            map: memmap2::MmapRaw::map_raw(&f).unwrap(),
            path: String::new(),
            registered: false.into(),
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= 4096);
        // SAFETY: an aligned u64 inside the 4096-byte map; only ever accessed atomically.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    fn put(&self, off: usize, bytes: &[u8; 64]) {
        assert!(off + 64 <= 4096);
        // SAFETY: in bounds; the reader reads it only after the flag store that follows.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.as_mut_ptr().add(off), 64) }
    }

    fn get(&self, off: usize) -> [u8; 64] {
        assert!(off + 64 <= 4096);
        let mut out = [0u8; 64];
        // SAFETY: in bounds; written before the flag this reader saw (Acquire).
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), out.as_mut_ptr(), 64) };
        out
    }

    fn wait_flag(&self, bit: u64) {
        let t = Instant::now();
        // Acquire: the handles written before the flag's Release store are visible.
        while self.word(FLAG).load(Ordering::Acquire) & bit == 0 {
            assert!(t.elapsed() < Duration::from_secs(60), "raw IPC peer did not start");
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.registered.get() {
            // SAFETY: registered by `words`; the stream that used it was synchronized by the
            // owner of this `Shared` before it dropped it.
            let _ = unsafe { driver::mem_host_unregister(self.map.as_mut_ptr().add(4096)) };
        }
        if !self.path.is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What the raw handoff measured: round trips per second and stamp-to-read latency (ns).
#[derive(Clone, Debug, Default)]
pub struct RawIpc {
    pub size: usize,
    pub round_trips: f64,
    pub p50: u64,
    pub p99: u64,
    /// ns per `cuEventQuery` / `cuStreamWaitEvent` on the consumer's event, opened from its
    /// handle in this process (`Fence::Event` only).
    pub opened_query_ns: f64,
    pub opened_wait_ns: f64,
}

/// How the raw handoff orders the GPU work of its two processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fence {
    /// Interprocess events: record, then `cuStreamWaitEvent` on the opened handle (what the ring
    /// uses).
    #[default]
    Event,
    /// A sequence word in the shared device buffer: `cuStreamWriteValue64`, then
    /// `cuStreamWaitValue64` (GEQ).
    MemOp,
    /// The same with the words in the shared /dev/shm file, page-locked and mapped for the GPU
    /// (`cuMemHostRegister`) in each process, so the CPU can read them too.
    HostMemOp,
    /// Both: each fence writes its device word and a host word in one `cuStreamBatchMemOp`
    /// (the CPU can read the host word), and GPU waits poll the device word.
    DualMemOp,
}

impl Fence {
    pub fn from_index(i: &str) -> Fence {
        match i {
            "1" => Fence::MemOp,
            "2" => Fence::HostMemOp,
            "3" => Fence::DualMemOp,
            _ => Fence::Event,
        }
    }
}

/// The device addresses of the ready and ack words for a memory-op fence: after the payload
/// in the device buffer, or in the shared file's second page (registered here; unregister it
/// with [`Shared::unregister`]).
fn words(
    fence: Fence,
    sh: &Shared,
    ctx: &Arc<Context>,
    buf: CUdeviceptr,
    size: usize,
) -> (u64, u64) {
    match fence {
        Fence::Event => (0, 0),
        Fence::MemOp | Fence::DualMemOp => (buf + size as u64, buf + (size + 128) as u64),
        Fence::HostMemOp => {
            let _bound = ctx.bind().unwrap();
            // SAFETY: the second page of the map, page-aligned and mapped until `sh` drops,
            // which unregisters it first.
            let dev = unsafe { driver::mem_host_register(sh.map.as_mut_ptr().add(4096), 4096) }
                .expect("cuMemHostRegister of the shared page");
            sh.registered.set(true);
            (dev, dev + 128)
        }
    }
}

/// `Fence::DualMemOp`'s host words (ready, ack), in the shared file's second page (registered
/// here, as for `HostMemOp`); none for the other fences.
fn mirrors(fence: Fence, sh: &Shared, ctx: &Arc<Context>) -> Option<(u64, u64)> {
    (fence == Fence::DualMemOp).then(|| words(Fence::HostMemOp, sh, ctx, 0, 0))
}

/// Writes `value` to device word `word` on `stream`, and to host word `mirror` in the same
/// driver call when there is one.
///
/// # Safety
/// 1. Both words must stay writable from the stream's context until the writes have run.
unsafe fn write_word(stream: &Stream, word: u64, mirror: Option<u64>, value: u64) {
    match mirror {
        // SAFETY: by (1).
        None => unsafe { driver::stream_write_value64(stream.raw(), word, value) }.unwrap(),
        Some(m) => {
            // SAFETY: by (1).
            unsafe { driver::stream_write_values64(stream.raw(), [(word, value), (m, value)]) }
                .unwrap()
        }
    }
}

/// Bytes after a raw handoff buffer's payload that hold the two `Fence::MemOp` words.
const WORDS: usize = 256;

/// The producer side of the raw handoff, with a consumer process.
pub fn raw_ipc(o: &Opts, ctx: &Arc<Context>, k: &Kernels, size: usize, fence: Fence) -> RawIpc {
    let name = format!("gpubench-raw-{}-{size}-{fence:?}", std::process::id());
    let sh = Shared::create(&name);
    let stream = Stream::new(ctx).unwrap();
    let buf = DevicePool::new(ctx, size + WORDS).unwrap();
    let (ready_word, ack_word) = words(fence, &sh, ctx, buf.ptr(), size);
    let mirror = mirrors(fence, &sh, ctx);
    {
        let _bound = ctx.bind().unwrap();
        // SAFETY: `buf` holds size + WORDS bytes; the stream is live.
        unsafe { driver::memset_async(buf.ptr() + size as u64, 0, WORDS, stream.raw()) }.unwrap();
        stream.synchronize().unwrap();
    }
    let ready = IpcEvent::new(ctx).unwrap();
    sh.put(MEM_HANDLE, &driver::mem_handle_bytes(&buf.ipc_handle().unwrap()));
    sh.put(READY_EVENT, &driver::event_handle_bytes(&ready.ipc_handle().unwrap()));
    sh.word(FIRST_MEASURED).store(u64::MAX, Ordering::Relaxed);
    // Release: the handles are visible before the flag.
    sh.word(FLAG).fetch_or(1, Ordering::Release);
    let child = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, format!("raw-consumer:{name}:{size}:{}", fence as u8))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    sh.wait_flag(2);
    let ack = IpcEvent::open(ctx, driver::event_handle_from_bytes(&sh.get(ACK_EVENT))).unwrap();
    let mut i = 0u64;
    let mut step = || {
        i += 1;
        let _bound = ctx.bind().unwrap();
        if i > 1 {
            match fence {
                Fence::Event => ack.wait_on(&stream).unwrap(),
                // SAFETY: a word of `buf` or of the registered page; the consumer writes i - 1
                // there after its read.
                Fence::MemOp | Fence::HostMemOp | Fence::DualMemOp => unsafe {
                    driver::stream_wait_value64(stream.raw(), ack_word, i - 1).unwrap()
                },
            }
        }
        // SAFETY: `buf` holds `size` bytes; the ack wait orders this after the last read.
        unsafe { k.fill(&stream, buf.ptr(), size as u64, i) };
        match fence {
            Fence::Event => ready.record(&stream).unwrap(),
            // SAFETY: a word of `buf` or of the registered page, which outlive the stream's work
            // (synchronized below).
            Fence::MemOp | Fence::HostMemOp | Fence::DualMemOp => unsafe {
                write_word(&stream, ready_word, mirror.map(|m| m.0), i)
            },
        }
        // Release: the record is issued before the consumer can see `i`.
        sh.word(READY).store(i, Ordering::Release);
        // Acquire: pairs with the consumer's Release store after its ack record.
        while sh.word(ACK).load(Ordering::Acquire) != i {
            spin_loop();
        }
        i
    };
    let warm = Instant::now();
    while warm.elapsed() < o.warmup {
        step();
    }
    let t0 = Instant::now();
    let first = step();
    // Relaxed: the consumer reads it after it sees a later READY value (Release/Acquire).
    sh.word(FIRST_MEASURED).store(first, Ordering::Relaxed);
    let mut n = 1u64;
    while t0.elapsed() < o.seconds {
        step();
        n += 1;
    }
    let round_trips = n as f64 / t0.elapsed().as_secs_f64();
    // Release: nothing to publish; MAX stops the consumer.
    sh.word(READY).store(u64::MAX, Ordering::Release);
    let r = child_result(child);
    stream.synchronize().unwrap();
    let (opened_query_ns, opened_wait_ns) = if fence == Fence::Event {
        (
            per_call(&stream, || {
                std::hint::black_box(ack.is_complete().unwrap());
            }),
            per_call(&stream, || ack.wait_on(&stream).unwrap()),
        )
    } else {
        (0.0, 0.0)
    };
    RawIpc {
        size,
        round_trips,
        p50: r["p50"] as u64,
        p99: r["p99"] as u64,
        opened_query_ns,
        opened_wait_ns,
    }
}

/// Mean ns per call of `f` over 500 calls (the stream is synchronized after, untimed).
fn per_call(stream: &Stream, mut f: impl FnMut()) -> f64 {
    const N: u32 = 500;
    f();
    stream.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..N {
        f();
    }
    let ns = t.elapsed().as_nanos() as f64 / N as f64;
    stream.synchronize().unwrap();
    ns
}

/// Driver call costs in this process, ns per call: what the ring's per-frame work is made of.
pub fn call_costs(ctx: &Arc<Context>, stream: &Stream, k: &Kernels) -> Vec<(&'static str, f64)> {
    let ev = IpcEvent::new(ctx).unwrap();
    let word = DevicePool::new(ctx, 4096).unwrap();
    let _bound = ctx.bind().unwrap();
    // SAFETY: a live 4096-byte allocation; the stream is live.
    unsafe { driver::memset_async(word.ptr(), 0, 4096, stream.raw()) }.unwrap();
    ev.record(stream).unwrap();
    stream.synchronize().unwrap();
    // SAFETY: 16 readable bytes of `word`, alive past the synchronize in `per_call`.
    let launch = per_call(stream, || unsafe { k.read(stream, word.ptr(), 16, None) });
    let mut out = vec![
        ("cuLaunchKernel (bench_read, 16 B)", launch),
        ("cuEventRecord (interprocess event)", per_call(stream, || ev.record(stream).unwrap())),
        (
            "cuEventQuery (own, complete)",
            per_call(stream, || {
                std::hint::black_box(ev.is_complete().unwrap());
            }),
        ),
        ("cuStreamWaitEvent (own event)", per_call(stream, || ev.wait_on(stream).unwrap())),
    ];
    let dev = driver::device(ctx.ordinal()).unwrap();
    if driver::can_use_64_bit_stream_mem_ops(dev).unwrap_or(false) {
        // SAFETY: an aligned word of `word`, alive past the synchronize in `per_call`.
        let write = per_call(stream, || unsafe {
            driver::stream_write_value64(stream.raw(), word.ptr(), 1).unwrap()
        });
        // SAFETY: as above; the word holds 1 (written above), so the wait is satisfied.
        let wait = per_call(stream, || unsafe {
            driver::stream_wait_value64(stream.raw(), word.ptr(), 1).unwrap()
        });
        // SAFETY: two aligned words of `word`, alive past the synchronize in `per_call`.
        let both = per_call(stream, || unsafe {
            driver::stream_write_values64(stream.raw(), [(word.ptr(), 1), (word.ptr() + 8, 1)])
                .unwrap()
        });
        out.push(("cuStreamWriteValue64", write));
        out.push(("cuStreamBatchMemOp (two 64-bit writes)", both));
        out.push(("cuStreamWaitValue64 (GEQ)", wait));
    }
    out
}

/// Whether `ctx`'s device supports the `Fence::MemOp` floor.
pub fn mem_ops_supported(ctx: &Arc<Context>) -> bool {
    driver::device(ctx.ordinal()).and_then(driver::can_use_64_bit_stream_mem_ops).unwrap_or(false)
}

/// The consumer process of the raw handoff.
pub fn raw_consumer(
    name: &str,
    size: usize,
    fence: Fence,
    device: i32,
) -> HashMap<&'static str, f64> {
    let sh = Shared::open(name);
    let ctx = Context::new(device).unwrap();
    ctx.make_current().unwrap(); // the raw driver calls below run in it
    let stream = Stream::new(&ctx).unwrap();
    let k = Kernels::load(&ctx, &stream);
    sh.wait_flag(1);
    let map =
        IpcMapping::open(&ctx, driver::mem_handle_from_bytes(&sh.get(MEM_HANDLE)), size + WORDS)
            .unwrap();
    let ready =
        IpcEvent::open(&ctx, driver::event_handle_from_bytes(&sh.get(READY_EVENT))).unwrap();
    let ack = IpcEvent::new(&ctx).unwrap();
    sh.put(ACK_EVENT, &driver::event_handle_bytes(&ack.ipc_handle().unwrap()));
    // Release: the ack handle is visible before the flag.
    sh.word(FLAG).fetch_or(2, Ordering::Release);
    let (mut last, mut samples) = (0u64, 0u64);
    let src: CUdeviceptr = map.ptr();
    let (ready_word, ack_word) = words(fence, &sh, &ctx, src, size);
    let mirror = mirrors(fence, &sh, &ctx);
    loop {
        let i = loop {
            // Acquire: pairs with the producer's Release store after its ready record.
            let v = sh.word(READY).load(Ordering::Acquire);
            if v != last {
                break v;
            }
            spin_loop();
        };
        if i == u64::MAX {
            break;
        }
        last = i;
        let _bound = ctx.bind().unwrap();
        match fence {
            Fence::Event => ready.wait_on(&stream).unwrap(),
            // SAFETY: a word of the mapping or the registered page; the producer writes i there
            // after its fill.
            Fence::MemOp | Fence::HostMemOp | Fence::DualMemOp => unsafe {
                driver::stream_wait_value64(stream.raw(), ready_word, i).unwrap()
            },
        }
        let measured = i >= sh.word(FIRST_MEASURED).load(Ordering::Relaxed);
        // SAFETY: the mapping holds `size` bytes; the ready wait orders the read after the fill.
        unsafe { k.read(&stream, src, size as u64, measured.then_some(samples)) };
        samples += measured as u64;
        match fence {
            Fence::Event => ack.record(&stream).unwrap(),
            // SAFETY: a word of the mapping or the registered page, which outlive the stream's
            // work (synchronized before they are closed).
            Fence::MemOp | Fence::HostMemOp | Fence::DualMemOp => unsafe {
                write_word(&stream, ack_word, mirror.map(|m| m.1), i)
            },
        }
        // Release: the ack record is issued before the producer sees `i`.
        sh.word(ACK).store(i, Ordering::Release);
    }
    let (p50, p99) = percentiles(k.latencies(&stream, samples));
    HashMap::from([("p50", p50 as f64), ("p99", p99 as f64), ("frames", samples as f64)])
}

/// Kernels per second the GPU runs when `procs` processes each launch `bench_read` on their own
/// `size`-byte buffer as fast as they can, with no ring and no dependencies between them: the
/// ceiling for a ring that runs one kernel per frame in each of `procs` processes. `fenced`:
/// each kernel is followed by a `cuStreamWriteValue64` to a device word, as each frame of a
/// ring is by one fence (a write costs the stream about what an event record does).
pub fn launch_ceiling(o: &Opts, procs: usize, size: usize, fenced: bool) -> f64 {
    let start = std::time::SystemTime::now() + Duration::from_secs(3);
    let start_ns = start.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let children: Vec<_> = (0..procs)
        .map(|i| {
            Command::new(std::env::current_exe().unwrap())
                .env(ROLE, format!("launcher:{start_ns}:{size}:{i}"))
                .env("GPURING_GPU_BENCH_SECONDS", o.seconds.as_secs_f64().to_string())
                .env("GPURING_GPU_BENCH_FENCED", if fenced { "1" } else { "0" })
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children.into_iter().map(|c| child_result(c)["kernels_per_s"]).sum()
}

/// A launcher process of [`launch_ceiling`]: waits for the common start time, launches for
/// `seconds`, then waits for its GPU work.
pub fn launcher(start_ns: u128, size: usize, device: i32) -> HashMap<&'static str, f64> {
    let seconds: f64 = std::env::var("GPURING_GPU_BENCH_SECONDS").unwrap().parse().unwrap();
    let ctx = Context::new(device).unwrap();
    ctx.make_current().unwrap(); // the raw driver calls below run in it
    let stream = Stream::new(&ctx).unwrap();
    let k = Kernels::load(&ctx, &stream);
    let fenced = std::env::var("GPURING_GPU_BENCH_FENCED").is_ok_and(|v| v == "1");
    let buf = DevicePool::new(&ctx, size + 256).unwrap();
    stream.synchronize().unwrap();
    let start = std::time::UNIX_EPOCH + Duration::from_nanos(start_ns as u64);
    if let Ok(d) = start.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(d);
    }
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < seconds {
        // SAFETY: `buf` holds `size` readable bytes and outlives the synchronize below.
        unsafe { k.read(&stream, buf.ptr(), size as u64, None) };
        if fenced {
            // SAFETY: a word of `buf` (after the `size` bytes read), alive past the
            // synchronize below; the stream is live in the current context.
            unsafe { driver::stream_write_value64(stream.raw(), buf.ptr() + size as u64, n) }
                .unwrap();
        }
        n += 1;
    }
    stream.synchronize().unwrap();
    HashMap::from([("kernels_per_s", n as f64 / t.elapsed().as_secs_f64())])
}

/// Frames queued per case of [`stream_op_costs`]: few enough that the driver's queue never
/// fills while the stream is held back.
const BACKLOG: u64 = 200;

/// GPU time per frame of a stream that is never short of work: `BACKLOG` frames of
/// `bench_read` (64 KiB) with one fence operation after each, queued while the stream waits
/// on a host word, then let go at once; from the first read's start to the last one's, over
/// the frames (%globaltimer, the reads' trace). This is what a ring's stream pays per frame
/// on the GPU besides its kernels when it runs behind, whatever the CPU does.
pub fn stream_op_costs(ctx: &Arc<Context>, k: &Kernels) -> Vec<(&'static str, f64)> {
    const LEN: u64 = 64 << 10;
    let stream = Stream::new(ctx).unwrap();
    let buf = DevicePool::new(ctx, LEN as usize + 4096).unwrap();
    let page = memmap2::MmapMut::map_anon(4096).unwrap();
    let _bound = ctx.bind().unwrap();
    // SAFETY: a page-aligned anonymous mapping, unregistered below before it is unmapped.
    let host = unsafe { driver::mem_host_register(page.as_ptr() as *mut u8, 4096) }.unwrap();
    // SAFETY: the page is mapped, 8-byte aligned, and outlives every use below.
    let gate = unsafe { &*(page.as_ptr() as *const AtomicU64) };
    let (hold, host_word, dev_word) = (host, host + 64, buf.ptr() + LEN);
    // SAFETY: words of `buf` and of the registered page; the stream is live. Both words hold 1
    // from here on, so waits for 1 on them are met.
    unsafe {
        driver::memset_async(buf.ptr(), 0, LEN as usize + 4096, stream.raw()).unwrap();
        driver::stream_write_values64(stream.raw(), [(dev_word, 1), (host_word, 1)]).unwrap();
    }
    stream.synchronize().unwrap();
    let ipc = IpcEvent::new(ctx).unwrap();
    // SAFETY: a context is current (bound above); destroyed below.
    let plain = unsafe { driver::event_create() }.unwrap();
    ipc.record(&stream).unwrap();
    stream.synchronize().unwrap();
    type Op<'a> = Box<dyn Fn() + 'a>;
    let s = stream.raw();
    let cases: Vec<(&'static str, Op)> = vec![
        ("kernel alone", Box::new(|| {})),
        ("+ cuEventRecord (interprocess event)", Box::new(|| ipc.record(&stream).unwrap())),
        (
            "+ cuEventRecord (plain event, no timing)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe { driver::event_record(plain, s).unwrap() }),
        ),
        (
            "+ cuStreamWriteValue64 (device word)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe { driver::stream_write_value64(s, dev_word, 1).unwrap() }),
        ),
        (
            "+ cuStreamWriteValue64 (host word)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe { driver::stream_write_value64(s, host_word, 1).unwrap() }),
        ),
        (
            "+ cuStreamBatchMemOp (device and host word)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe {
                driver::stream_write_values64(s, [(dev_word, 1), (host_word, 1)]).unwrap()
            }),
        ),
        (
            "+ cuStreamWaitValue64, met (device word)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe { driver::stream_wait_value64(s, dev_word, 1).unwrap() }),
        ),
        (
            "+ cuStreamWaitValue64, met (host word)",
            // SAFETY: the words and events live until the stream is synchronized below.
            Box::new(|| unsafe { driver::stream_wait_value64(s, host_word, 1).unwrap() }),
        ),
        (
            "+ cuStreamWaitEvent (completed interprocess event)",
            Box::new(|| ipc.wait_on(&stream).unwrap()),
        ),
    ];
    let mut out = Vec::new();
    for (round, (name, op)) in cases.iter().enumerate() {
        let round = round as u64 + 1;
        // SAFETY: the registered page's first word; the CPU sets it to `round` below.
        unsafe { driver::stream_wait_value64(s, hold, round) }.unwrap();
        let t = Instant::now();
        for i in 0..BACKLOG {
            // SAFETY: `buf` holds LEN readable bytes until the synchronize below.
            unsafe { k.read_traced(&stream, buf.ptr(), LEN, None, Some(i)) };
            op();
        }
        let queued_in = t.elapsed();
        gate.store(round, Ordering::SeqCst);
        let pairs = k.trace_pairs(&stream, 0..BACKLOG);
        let per = (pairs[BACKLOG as usize - 1].0 - pairs[0].0) as f64 / (BACKLOG - 1) as f64;
        let kernel = pairs.iter().map(|p| (p.1 - p.0) as f64).sum::<f64>() / BACKLOG as f64;
        eprintln!(
            "stream op {name}: {per:.0} ns per frame on the GPU (kernel {kernel:.0} ns; queued in \
             {queued_in:?})"
        );
        out.push((*name, per));
    }
    // SAFETY: the stream is idle (synchronized in `trace_pairs`); made above.
    unsafe {
        driver::event_destroy(plain).unwrap();
        driver::mem_host_unregister(page.as_ptr() as *mut u8).unwrap();
    }
    out
}
