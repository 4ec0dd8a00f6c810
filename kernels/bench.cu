// Kernels of the GPU bench (benches/gpu.rs), compiled at run time by NVRTC.
//
// Latency is measured on the device with %globaltimer, one nanosecond clock for every context on
// the GPU: the producer's fill stamps the frame when its last block finishes; the consumer's read
// compares that stamp with the timer when its kernel starts.

typedef unsigned long long u64;

__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Frames a trace keeps (the bench's --trace): a ring of (start, end) %globaltimer pairs.
#define TRACE_CAP (1ull << 17)

// Writes all `n2` 16-byte words at `dst`; then the last block to finish (a ticket taken after a
// fence) stores %globaltimer in the frame's first 8 bytes and resets the ticket for the next
// launch on the same stream. If `trace` is not null, block 0's start and that last block's end
// are also stored as pair `seq % TRACE_CAP` of it.
extern "C" __global__ void bench_fill(ulonglong2 *dst, u64 n2, u64 seq, unsigned int *ticket,
                                      u64 *trace) {
    if (trace != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        trace[2 * (seq % TRACE_CAP)] = globaltimer();
    }
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n2;
         j += (u64)gridDim.x * blockDim.x) {
        dst[j] = make_ulonglong2(seq + 2 * j, seq + 2 * j + 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned int t = atomicAdd(ticket, 1u);
        if (t == gridDim.x - 1) {
            u64 now = globaltimer();
            ((volatile u64 *)dst)[0] = now;
            if (trace != 0) trace[2 * (seq % TRACE_CAP) + 1] = now;
            *ticket = 0;
            __threadfence();
        }
    }
}

// Reads all `n2` 16-byte words at `src` (a sum, added to `*sum` so it cannot be optimised away).
// If `lat` is not null, block 0 first stores at `lat[idx]` the time from the frame's stamp to
// this kernel's start, in ns. If `trace` is not null, block 0's start and the last block's end
// (a ticket, as in bench_fill) are stored as pair `tidx % TRACE_CAP` of it.
extern "C" __global__ void bench_read(const ulonglong2 *src, u64 n2, u64 *sum, u64 *lat, u64 idx,
                                      u64 *trace, u64 tidx, unsigned int *ticket) {
    if (trace != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        trace[2 * (tidx % TRACE_CAP)] = globaltimer();
    }
    if (lat != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        u64 now = globaltimer();
        u64 stamp = ((const volatile u64 *)src)[0];
        lat[idx] = now - stamp;
    }
    u64 acc = 0;
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n2;
         j += (u64)gridDim.x * blockDim.x) {
        ulonglong2 v = src[j];
        acc += v.x ^ v.y;
    }
    // One atomic per block, not per warp: thousands of atomics on one word serialise in L2 and
    // took longer than the reads of an 8 MiB frame.
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ u64 warp_sums[32];
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 block = 0;
        for (unsigned w = 0; w < (blockDim.x + 31) / 32; w++) block += warp_sums[w];
        if (block != 0) atomicAdd(sum, block);
    }
    if (trace != 0) {
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned int t = atomicAdd(ticket, 1u);
            if (t == gridDim.x - 1) {
                trace[2 * (tidx % TRACE_CAP) + 1] = globaltimer();
                *ticket = 0;
                __threadfence();
            }
        }
    }
}

// Spins until the host word `*flag` is not 0, then stores %globaltimer at `*out`: the GPU's
// clock at (about a PCIe read after) the moment the CPU set the flag, to align the two clocks.
extern "C" __global__ void bench_clock(volatile u64 *flag, u64 *out) {
    while (*flag == 0) {
    }
    *out = globaltimer();
}

// The timer's resolution: the smallest step of %globaltimer seen over 64 changes.
extern "C" __global__ void bench_timer_step(u64 *out) {
    u64 best = ~0ull;
    u64 t = globaltimer();
    for (int k = 0; k < 64; k++) {
        u64 n;
        do { n = globaltimer(); } while (n == t);
        if (n - t < best) best = n - t;
        t = n;
    }
    *out = best;
}
