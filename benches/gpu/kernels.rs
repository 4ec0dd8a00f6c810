//! The bench kernels (`kernels/bench.cu`) and the device buffers they use.

use std::ffi::c_void;
use std::sync::Arc;

use gpuring::cuda::driver::{self, CUdeviceptr};
use gpuring::cuda::{Context, DevicePool, Stream};
use gpuring::testing::kernels::{Function, Module};

const SRC: &str = include_str!("../../kernels/bench.cu");

/// Latency samples kept per consumer (a ring of `u64` ns on the device).
pub const LAT_CAP: u64 = 1 << 20;

/// Frames a trace keeps: `TRACE_CAP` in kernels/bench.cu.
pub const TRACE_CAP: u64 = 1 << 17;

/// Set to a folder, the ring cells trace every frame there (benches/gpu/trace.rs).
pub const TRACE_ENV: &str = "GPURING_GPU_BENCH_TRACE";

/// Threads per block of every bench kernel.
const THREADS: u32 = 256;

/// Blocks for `bytes`: about four 16-byte words per thread, at most 8 blocks per SM of an H100.
fn blocks(bytes: u64) -> u32 {
    (bytes / 16).div_ceil(THREADS as u64 * 4).clamp(1, 132 * 8) as u32
}

/// Loaded bench kernels plus a fill ticket, a read sum and a latency ring, in one context.
pub struct Kernels {
    ctx: Arc<Context>,
    module: Module,
    fill: Function,
    read: Function,
    step: Function,
    clock: Function,
    ticket: DevicePool,
    sum: DevicePool,
    lat: DevicePool,
    /// The (start, end) pairs of traced kernels, and the read kernel's ticket.
    trace: (DevicePool, DevicePool),
    /// Whether [`TRACE_ENV`] is set: fills are traced, and ring cells write traces.
    tracing: bool,
}

impl Kernels {
    pub fn load(ctx: &Arc<Context>, stream: &Stream) -> Kernels {
        let module = Module::load(ctx, SRC, "bench.cu").expect("compile kernels/bench.cu");
        let f = |n: &str| module.function(n).expect("bench kernel");
        let (fill, read, step) = (f("bench_fill"), f("bench_read"), f("bench_timer_step"));
        let clock = f("bench_clock");
        let ticket = DevicePool::new(ctx, 8).unwrap();
        let sum = DevicePool::new(ctx, 8).unwrap();
        let lat = DevicePool::new(ctx, (LAT_CAP * 8) as usize).unwrap();
        let trace = (
            DevicePool::new(ctx, (TRACE_CAP * 16) as usize).unwrap(),
            DevicePool::new(ctx, 8).unwrap(),
        );
        let tracing = std::env::var_os(TRACE_ENV).is_some();
        let _bound = ctx.bind().unwrap();
        for p in [&ticket, &sum, &trace.1] {
            // SAFETY: a live allocation of at least 8 bytes; the stream is live in `ctx`.
            unsafe { driver::memset_async(p.ptr(), 0, 8, stream.raw()) }.unwrap();
        }
        Kernels {
            ctx: ctx.clone(),
            module,
            fill,
            read,
            step,
            clock,
            ticket,
            sum,
            lat,
            trace,
            tracing,
        }
    }

    /// The context the kernels are loaded in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Whether this process traces (see [`TRACE_ENV`]).
    pub fn tracing(&self) -> bool {
        self.tracing
    }

    /// Copies back the trace's (start, end) pairs for `indices` (waits for `stream`).
    pub fn trace_pairs(
        &self,
        stream: &Stream,
        indices: impl Iterator<Item = u64>,
    ) -> Vec<(u64, u64)> {
        let pairs = &self.trace.0;
        stream.synchronize().unwrap();
        let mut bytes = vec![0u8; (TRACE_CAP * 16) as usize];
        let _bound = stream.context().bind().unwrap();
        // SAFETY: the trace holds TRACE_CAP pairs; its writers on `stream` are finished.
        unsafe { driver::memcpy_dtoh(&mut bytes, pairs.ptr()) }.unwrap();
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        indices
            .map(|i| {
                let j = (i % TRACE_CAP) as usize * 2;
                (word(j), word(j + 1))
            })
            .collect()
    }

    /// The GPU clock minus the CPU's `CLOCK_REALTIME`, in ns: a kernel spins on a page-locked
    /// host word until the CPU sets it, then reads %globaltimer; the smallest difference of
    /// five tries (each within about a PCIe read of the truth).
    pub fn clock_offset(&self, stream: &Stream) -> i64 {
        let page = memmap2::MmapMut::map_anon(4096).unwrap();
        let out = DevicePool::new(stream.context(), 8).unwrap();
        let _bound = stream.context().bind().unwrap();
        // SAFETY: a page-aligned anonymous mapping, unregistered below before it is unmapped.
        let dev = unsafe { driver::mem_host_register(page.as_ptr() as *mut u8, 4096) }.unwrap();
        // SAFETY: the page is mapped and 8-byte aligned; only read by the kernel and this thread.
        let flag = unsafe { &*(page.as_ptr() as *const std::sync::atomic::AtomicU64) };
        let mut best = i64::MAX;
        for _ in 0..5 {
            flag.store(0, std::sync::atomic::Ordering::SeqCst);
            let (mut f, mut o) = (dev, out.ptr());
            let mut p: [*mut c_void; 2] =
                [(&mut f as *mut u64).cast(), (&mut o as *mut u64).cast()];
            // SAFETY: `p` matches bench_clock(volatile u64*, u64*); both words live until the
            // synchronize below.
            unsafe { self.module.launch(self.clock, 1, 1, stream, &mut p) }.unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
            let cpu = realtime_ns();
            flag.store(1, std::sync::atomic::Ordering::SeqCst);
            stream.synchronize().unwrap();
            let mut b = [0u8; 8];
            // SAFETY: `out` holds 8 bytes, written by the finished kernel.
            unsafe { driver::memcpy_dtoh(&mut b, out.ptr()) }.unwrap();
            best = best.min(u64::from_le_bytes(b) as i64 - cpu as i64);
        }
        // SAFETY: registered above; the kernels that read it are finished.
        unsafe { driver::mem_host_unregister(page.as_ptr() as *mut u8) }.unwrap();
        best
    }

    /// Enqueues: write every byte of the `len`-byte frame at `dst`, then stamp its first 8 bytes
    /// with %globaltimer. Every fill of one `Kernels` must go on one stream (the ticket).
    ///
    /// # Safety
    /// `dst` must point to `len` writable device bytes (16-byte aligned, `len` a multiple of 16)
    /// until the kernel has run.
    pub unsafe fn fill(&self, stream: &Stream, dst: CUdeviceptr, len: u64, seq: u64) {
        let (mut dst, mut n2, mut seq, mut ticket) = (dst, len / 16, seq, self.ticket.ptr());
        let mut trace = if self.tracing { self.trace.0.ptr() } else { 0 };
        let mut p: [*mut c_void; 5] = [
            (&mut dst as *mut u64).cast(),
            (&mut n2 as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
            (&mut ticket as *mut u64).cast(),
            (&mut trace as *mut u64).cast(),
        ];
        // SAFETY: `p` matches bench_fill(ulonglong2*, u64, u64, unsigned*, u64*); `dst` by the
        // caller; the ticket and the trace are ours, used from one stream.
        unsafe { self.module.launch(self.fill, blocks(len), THREADS, stream, &mut p) }.unwrap();
    }

    /// Enqueues: read every byte of the frame at `src`; if `sample` is `Some(i)`, store the
    /// stamp-to-start latency as sample `i`.
    ///
    /// # Safety
    /// `src` must point to `len` readable device bytes (16-byte aligned, `len` a multiple of 16)
    /// until the kernel has run.
    pub unsafe fn read(&self, stream: &Stream, src: CUdeviceptr, len: u64, sample: Option<u64>) {
        // SAFETY: by the caller.
        unsafe { self.read_traced(stream, src, len, sample, None) }
    }

    /// [`read`](Self::read), which also stores its start and end as trace pair `frame`, if
    /// any. Every traced read of one `Kernels` must go on one stream (the ticket).
    ///
    /// # Safety
    /// As for [`read`](Self::read).
    pub unsafe fn read_traced(
        &self,
        stream: &Stream,
        src: CUdeviceptr,
        len: u64,
        sample: Option<u64>,
        frame: Option<u64>,
    ) {
        let (mut src, mut n2, mut sum) = (src, len / 16, self.sum.ptr());
        let (mut trace, mut tidx, mut rticket) = match frame {
            Some(f) => (self.trace.0.ptr(), f % TRACE_CAP, self.trace.1.ptr()),
            None => (0, 0, 0),
        };
        let (mut lat, mut idx) = match sample {
            Some(i) => (self.lat.ptr(), i % LAT_CAP),
            None => (0, 0),
        };
        let mut p: [*mut c_void; 8] = [
            (&mut src as *mut u64).cast(),
            (&mut n2 as *mut u64).cast(),
            (&mut sum as *mut u64).cast(),
            (&mut lat as *mut u64).cast(),
            (&mut idx as *mut u64).cast(),
            (&mut trace as *mut u64).cast(),
            (&mut tidx as *mut u64).cast(),
            (&mut rticket as *mut u64).cast(),
        ];
        // SAFETY: `p` matches bench_read(const ulonglong2*, u64, u64*, u64*, u64, u64*, u64,
        // unsigned*); `src` by the caller; `sum`, `lat[idx]` and the trace are ours (idx <
        // LAT_CAP, tidx < TRACE_CAP).
        unsafe { self.module.launch(self.read, blocks(len), THREADS, stream, &mut p) }.unwrap();
    }

    /// Copies back the first `n` latency samples (waits for `stream`).
    pub fn latencies(&self, stream: &Stream, n: u64) -> Vec<u64> {
        stream.synchronize().unwrap();
        let n = n.min(LAT_CAP) as usize;
        let mut bytes = vec![0u8; n * 8];
        let _bound = stream.context().bind().unwrap();
        // SAFETY: the ring holds LAT_CAP u64s; its writers on `stream` are finished.
        unsafe { driver::memcpy_dtoh(&mut bytes, self.lat.ptr()) }.unwrap();
        bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    /// The smallest step of %globaltimer, in ns.
    pub fn timer_step(&self, stream: &Stream) -> u64 {
        let mut out = self.lat.ptr();
        let mut p: [*mut c_void; 1] = [(&mut out as *mut u64).cast()];
        // SAFETY: `p` matches bench_timer_step(u64*); the latency ring holds at least 8 bytes.
        unsafe { self.module.launch(self.step, 1, 1, stream, &mut p) }.unwrap();
        self.latencies(stream, 1)[0]
    }
}

/// `(p50, p99)` of `v`, in ns (0, 0 when empty).
pub fn percentiles(mut v: Vec<u64>) -> (u64, u64) {
    if v.is_empty() {
        return (0, 0);
    }
    v.sort_unstable();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// `CLOCK_REALTIME` in ns: the CPU clock the trace aligns with the GPU's.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}
