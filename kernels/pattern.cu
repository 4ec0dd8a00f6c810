// The test pattern of src/testing/pattern.rs (and examples/common/), on the GPU.
//
// Byte i of message `seq` is byte (i % 8), little-endian, of the 64-bit word
// seq * 0x9E3779B97F4A7C15 + i / 8. Compiled at run time by NVRTC (src/testing/kernels.rs) to a
// CUBIN for the device's compute capability.

typedef unsigned long long u64;
typedef unsigned char u8;

__device__ __forceinline__ u64 pattern_word(u64 seq, u64 j) {
    return seq * 0x9E3779B97F4A7C15ull + j;
}

// Fills `len` bytes at `dst` with message `seq`'s pattern. Grid-stride over 8-byte words;
// `dst` must be 8-byte aligned.
extern "C" __global__ void pattern_fill(u8 *dst, u64 len, u64 seq) {
    u64 words = len / 8;
    u64 *w = (u64 *)dst;
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < words;
         j += (u64)gridDim.x * blockDim.x) {
        w[j] = pattern_word(seq, j);
    }
    if (blockIdx.x == 0 && threadIdx.x < (len & 7)) {
        u64 v = pattern_word(seq, words);
        dst[words * 8 + threadIdx.x] = (u8)(v >> (8 * threadIdx.x));
    }
}

// Adds to `*bad` the number of bytes at `src` that differ from message `seq`'s pattern.
// If `spin_ns` > 0, every block first spins that long (a deliberately slow reader, for the
// release-fence test).
extern "C" __global__ void pattern_check(const u8 *src, u64 len, u64 seq,
                                         unsigned long long *bad, u64 spin_ns) {
    if (spin_ns > 0) {
        u64 t0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        u64 t = t0;
        while (t - t0 < spin_ns) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        }
    }
    u64 words = len / 8;
    const u64 *w = (const u64 *)src;
    unsigned long long local = 0;
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < words;
         j += (u64)gridDim.x * blockDim.x) {
        u64 diff = w[j] ^ pattern_word(seq, j);
        if (diff) {
            for (int b = 0; b < 8; b++) local += ((diff >> (8 * b)) & 0xff) != 0;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < (len & 7)) {
        u64 v = pattern_word(seq, words);
        local += src[words * 8 + threadIdx.x] != (u8)(v >> (8 * threadIdx.x));
    }
    if (local) atomicAdd(bad, local);
}
