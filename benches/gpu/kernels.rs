//! The bench kernels (`kernels/bench.cu`) and the device buffers they use.

use std::ffi::c_void;
use std::sync::Arc;

use gpuring::cuda::driver::{self, CUdeviceptr};
use gpuring::cuda::{Context, DevicePool, Stream};
use gpuring::testing::kernels::{Function, Module};

const SRC: &str = include_str!("../../kernels/bench.cu");

/// Latency samples kept per consumer (a ring of `u64` ns on the device).
pub const LAT_CAP: u64 = 1 << 20;

/// Threads per block of every bench kernel.
const THREADS: u32 = 256;

/// Blocks for `bytes`: about four 16-byte words per thread, at most 8 blocks per SM of an H100.
fn blocks(bytes: u64) -> u32 {
    (bytes / 16).div_ceil(THREADS as u64 * 4).clamp(1, 132 * 8) as u32
}

/// Loaded bench kernels plus a fill ticket, a read sum and a latency ring, in one context.
pub struct Kernels {
    module: Module,
    fill: Function,
    read: Function,
    step: Function,
    ticket: DevicePool,
    sum: DevicePool,
    lat: DevicePool,
}

impl Kernels {
    pub fn load(ctx: &Arc<Context>, stream: &Stream) -> Kernels {
        let module = Module::load(ctx, SRC, "bench.cu").expect("compile kernels/bench.cu");
        let f = |n: &str| module.function(n).expect("bench kernel");
        let (fill, read, step) = (f("bench_fill"), f("bench_read"), f("bench_timer_step"));
        let ticket = DevicePool::new(ctx, 8).unwrap();
        let sum = DevicePool::new(ctx, 8).unwrap();
        let lat = DevicePool::new(ctx, (LAT_CAP * 8) as usize).unwrap();
        let _bound = ctx.bind().unwrap();
        for p in [&ticket, &sum] {
            // SAFETY: a live allocation of at least 8 bytes; the stream is live in `ctx`.
            unsafe { driver::memset_async(p.ptr(), 0, 8, stream.raw()) }.unwrap();
        }
        Kernels { module, fill, read, step, ticket, sum, lat }
    }

    /// Enqueues: write every byte of the `len`-byte frame at `dst`, then stamp its first 8 bytes
    /// with %globaltimer. Every fill of one `Kernels` must go on one stream (the ticket).
    ///
    /// # Safety
    /// `dst` must point to `len` writable device bytes (16-byte aligned, `len` a multiple of 16)
    /// until the kernel has run.
    pub unsafe fn fill(&self, stream: &Stream, dst: CUdeviceptr, len: u64, seq: u64) {
        let (mut dst, mut n2, mut seq, mut ticket) = (dst, len / 16, seq, self.ticket.ptr());
        let mut p: [*mut c_void; 4] = [
            (&mut dst as *mut u64).cast(),
            (&mut n2 as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
            (&mut ticket as *mut u64).cast(),
        ];
        // SAFETY: `p` matches bench_fill(ulonglong2*, u64, u64, unsigned*); `dst` by the
        // caller; the ticket is ours and used from one stream.
        unsafe { self.module.launch(self.fill, blocks(len), THREADS, stream, &mut p) }.unwrap();
    }

    /// Enqueues: read every byte of the frame at `src`; if `sample` is `Some(i)`, store the
    /// stamp-to-start latency as sample `i`.
    ///
    /// # Safety
    /// `src` must point to `len` readable device bytes (16-byte aligned, `len` a multiple of 16)
    /// until the kernel has run.
    pub unsafe fn read(&self, stream: &Stream, src: CUdeviceptr, len: u64, sample: Option<u64>) {
        let (mut src, mut n2, mut sum) = (src, len / 16, self.sum.ptr());
        let (mut lat, mut idx) = match sample {
            Some(i) => (self.lat.ptr(), i % LAT_CAP),
            None => (0, 0),
        };
        let mut p: [*mut c_void; 5] = [
            (&mut src as *mut u64).cast(),
            (&mut n2 as *mut u64).cast(),
            (&mut sum as *mut u64).cast(),
            (&mut lat as *mut u64).cast(),
            (&mut idx as *mut u64).cast(),
        ];
        // SAFETY: `p` matches bench_read(const ulonglong2*, u64, u64*, u64*, u64); `src` by the
        // caller; `sum` and `lat[idx]` are ours (idx < LAT_CAP).
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
