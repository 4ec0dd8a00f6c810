//! The frames of the pipeline example: written by the producer, checked byte for byte by every
//! consumer, in host and in CUDA memory, with gpuring's public API only (and, on the GPU,
//! cudarc for NVRTC and the kernel launches: what an application that runs its own kernels on
//! a ring's buffers does).
//!
//! Byte `i` of frame `seq` is byte `i % 8` (little-endian) of the word
//! `seq * 0x9E3779B97F4A7C15 + i / 8`: every byte depends on the frame's sequence number, so a
//! torn, stale or misplaced frame shows up as mismatching bytes. On the GPU the same function
//! is `kernels/pattern.cu`: the producer fills a slot with a kernel on the slot's stream, and
//! each consumer counts a frame's mismatching bytes with a kernel on the frame's stream, which
//! the ring made wait for the producer's writes.
//!
//! [`stop`]: how the pipeline's processes end cleanly on SIGTERM (`docker stop`) and SIGINT.

pub mod stop;

use std::cell::Cell;

use gpuring::{Consumer, Host, Memory, Producer, ReadSlot, WriteSlot};

/// Why writing or checking frames failed (a CUDA error; host memory never fails).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// How frames are written and checked in one memory kind.
pub trait Frames: Memory {
    /// What a producer needs to write frames (CUDA: the fill kernel).
    type Writer;
    /// What a consumer needs to check frames, and the mismatching bytes counted so far.
    type Checker;

    /// The writer for `tx`'s ring.
    fn writer(tx: &Producer<Self>) -> Result<Self::Writer, Error>;

    /// Writes frame `seq` into the first `len` bytes of `slot` (CUDA: queued on the slot's
    /// stream, which the publish's ready event follows).
    fn fill(
        w: &Self::Writer,
        slot: &mut WriteSlot<'_, Self>,
        len: usize,
        seq: u64,
    ) -> Result<(), Error>;

    /// The checker for `rx`.
    fn checker(rx: &Consumer<Self>) -> Result<Self::Checker, Error>;

    /// Counts the bytes of `m` that differ from frame `m.seq()` (CUDA: queued on its stream,
    /// before its release).
    fn check(c: &Self::Checker, m: &ReadSlot<'_, Self>) -> Result<(), Error>;

    /// Mismatching bytes over every frame checked so far (CUDA: waits for the checks).
    fn mismatches(c: &Self::Checker) -> Result<u64, Error>;
}

/// Word `j` of frame `seq`.
fn word(seq: u64, j: usize) -> u64 {
    seq.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(j as u64)
}

impl Frames for Host {
    type Writer = ();
    type Checker = Cell<u64>;

    fn writer(_: &Producer) -> Result<(), Error> {
        Ok(())
    }

    /// Whole words through a `u64` view of the buffer (fast even in a debug build, where byte
    /// by byte is several times slower), what is left byte by byte.
    fn fill(_: &(), slot: &mut WriteSlot<'_>, len: usize, seq: u64) -> Result<(), Error> {
        let bytes = &mut slot[..len];
        // SAFETY: every bit pattern is a valid `u64`, and `align_to_mut` hands out only aligned
        // words of the slice.
        let (head, words, _) = unsafe { bytes.align_to_mut::<u64>() };
        // Word `j` starts at byte `8 * j` only in a buffer aligned to 8 (they all are).
        let whole = if head.is_empty() { words.len() } else { 0 };
        for (j, w) in words[..whole].iter_mut().enumerate() {
            *w = word(seq, j).to_le();
        }
        for (j, chunk) in bytes.chunks_mut(8).enumerate().skip(whole) {
            chunk.copy_from_slice(&word(seq, j).to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }

    fn checker(_: &Consumer) -> Result<Cell<u64>, Error> {
        Ok(Cell::new(0))
    }

    /// Word by word as [`fill`](Self::fill) writes them.
    fn check(bad: &Cell<u64>, m: &ReadSlot<'_>) -> Result<(), Error> {
        let (bytes, seq, mut n) = (&m[..], m.seq(), 0);
        // SAFETY: as in `fill`: any bits are a `u64`, and the words are aligned.
        let (head, words, _) = unsafe { bytes.align_to::<u64>() };
        let whole = if head.is_empty() { words.len() } else { 0 };
        for (j, w) in words[..whole].iter().enumerate() {
            let differ = u64::from_le(*w) ^ word(seq, j);
            if differ != 0 {
                n += differ.to_le_bytes().iter().filter(|b| **b != 0).count() as u64;
            }
        }
        for (j, chunk) in bytes.chunks(8).enumerate().skip(whole) {
            let want = word(seq, j).to_le_bytes();
            n += chunk.iter().zip(want).filter(|(a, b)| **a != *b).count() as u64;
        }
        bad.set(bad.get() + n);
        Ok(())
    }

    fn mismatches(bad: &Cell<u64>) -> Result<u64, Error> {
        Ok(bad.get())
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ffi::{c_void, CStr, CString};
    use std::sync::Arc;

    use cudarc::driver::sys;
    use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
    use gpuring::cuda::{Context, DevicePool, Stream};
    use gpuring::{Consumer, Cuda, Producer, ReadSlot, WriteSlot};

    use super::{Error, Frames};

    /// `pattern_fill(u8 *dst, u64 len, u64 seq)` and
    /// `pattern_check(const u8 *src, u64 len, u64 seq, u64 *bad, u64 spin_ns)`.
    const SOURCE: &str = include_str!("../../kernels/pattern.cu");

    fn ok(call: &str, r: sys::CUresult) -> Result<(), Error> {
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(format!("{call} failed: {e:?}").into()),
        }
    }

    /// Compiles [`SOURCE`] for compute capability `cc`: a CUBIN for exactly `sm_XY` (PTX from
    /// an NVRTC newer than the driver would be refused), else PTX for `compute_XY`.
    fn compile((major, minor): (i32, i32)) -> Result<Vec<u8>, Error> {
        let source = CString::new(SOURCE)?;
        let cubin = compile_one(&source, &format!("--gpu-architecture=sm_{major}{minor}"), true);
        cubin.or_else(|_| {
            compile_one(&source, &format!("--gpu-architecture=compute_{major}{minor}"), false)
        })
    }

    /// One NVRTC compilation: the CUBIN, or the PTX (NUL-terminated, as the driver loads it).
    fn compile_one(source: &CStr, arch: &str, cubin: bool) -> Result<Vec<u8>, Error> {
        let prog = nvrtc::create_program(source, None)?;
        // SAFETY: `prog` is a live program, and the options are valid strings.
        let image = match unsafe { nvrtc::compile_program(prog, &[arch, "--std=c++17"]) } {
            Err(e) => {
                // SAFETY: `prog` is live.
                let log = unsafe { nvrtc::get_program_log(prog) }.unwrap_or_default();
                let log: Vec<u8> = log.iter().map(|&c| c as u8).collect();
                let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_string();
                Err(format!("NVRTC ({arch}): {e}: {log}").into())
            }
            Ok(()) if cubin => {
                let mut size = 0;
                // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
                let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
                let mut image = vec![0u8; size];
                if r == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS && size > 0 {
                    // SAFETY: `image` holds the `size` bytes NVRTC asked for.
                    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) }
                        .result()
                        .map(|()| image)
                        .map_err(Error::from)
                } else {
                    Err(format!("NVRTC made no CUBIN for {arch}: {r:?}").into())
                }
            }
            Ok(()) => {
                // SAFETY: `prog` is live and compiled.
                let ptx = unsafe { nvrtc::get_ptx(prog) }?;
                let mut ptx: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
                if ptx.last() != Some(&0) {
                    ptx.push(0);
                }
                Ok(ptx)
            }
        };
        // SAFETY: `prog` is live and not used again.
        let _ = unsafe { nvrtc::destroy_program(prog) };
        image
    }

    /// The two kernels of [`SOURCE`], loaded in one context.
    ///
    /// Invariant: `module` is loaded in `ctx` until `Drop`, and `fill` and `check` are its
    /// functions.
    pub struct Kernels {
        ctx: Arc<Context>,
        module: sys::CUmodule,
        fill: sys::CUfunction,
        check: sys::CUfunction,
    }

    impl Kernels {
        fn load(ctx: &Arc<Context>) -> Result<Kernels, Error> {
            let image = compile(ctx.compute_capability()?)?;
            let _bound = ctx.bind()?;
            let mut module = std::ptr::null_mut();
            // SAFETY: the context is current; `image` is a CUBIN or NUL-terminated PTX.
            ok("cuModuleLoadData", unsafe {
                sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
            })?;
            let (fill, check) = (std::ptr::null_mut(), std::ptr::null_mut());
            let mut k = Kernels { ctx: ctx.clone(), module, fill, check };
            k.fill = k.function(c"pattern_fill")?;
            k.check = k.function(c"pattern_check")?;
            Ok(k)
        }

        fn function(&self, name: &CStr) -> Result<sys::CUfunction, Error> {
            let mut f = std::ptr::null_mut();
            // SAFETY: `module` is loaded (the invariant); `f` is a valid out-pointer.
            ok("cuModuleGetFunction", unsafe {
                sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr())
            })?;
            Ok(f)
        }

        /// Queues kernel `f` over `len` bytes on `stream`.
        ///
        /// # Safety
        /// `f` is `self.fill` or `self.check`, `stream` is a stream of this context, and
        /// `params` point at one value of each of the kernel's parameters; the device memory
        /// those name must stay valid for what the kernel does with it until it has run.
        unsafe fn launch(
            &self,
            f: sys::CUfunction,
            stream: &Stream,
            len: u64,
            params: &mut [*mut c_void],
        ) -> Result<(), Error> {
            let threads = 256;
            let blocks = (len / 8 / threads as u64).clamp(1, 4096) as u32;
            let _bound = self.ctx.bind()?;
            // SAFETY: the caller's, and the context is current.
            ok("cuLaunchKernel", unsafe {
                sys::cuLaunchKernel(
                    f,
                    blocks,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    stream.raw(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        }
    }

    impl Drop for Kernels {
        fn drop(&mut self) {
            if let Ok(_bound) = self.ctx.bind() {
                // SAFETY: loaded by `load`; its functions are not used after this.
                let _ = unsafe { sys::cuModuleUnload(self.module) };
            }
        }
    }

    /// A consumer's check kernel and the device counter it adds mismatching bytes to.
    pub struct Checker {
        kernels: Kernels,
        /// The counter: one `u64` at the start of a (2 MiB) allocation.
        bad: DevicePool,
    }

    impl Checker {
        /// Waits for the context's work, every check queued so far included.
        fn synchronize(&self) -> Result<(), Error> {
            let _bound = self.kernels.ctx.bind()?;
            // SAFETY: the context is current.
            ok("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
        }
    }

    impl Drop for Checker {
        /// The checks still queued add to `bad`: they finish before it is freed.
        fn drop(&mut self) {
            let _ = self.synchronize();
        }
    }

    impl Frames for Cuda {
        type Writer = Kernels;
        type Checker = Checker;

        fn writer(tx: &Producer<Cuda>) -> Result<Kernels, Error> {
            Kernels::load(tx.context())
        }

        fn fill(
            k: &Kernels,
            slot: &mut WriteSlot<'_, Cuda>,
            len: usize,
            seq: u64,
        ) -> Result<(), Error> {
            if len > slot.capacity() {
                return Err(format!("{len} bytes do not fit a slot of {}", slot.capacity()).into());
            }
            let (mut dst, mut len, mut seq) = (slot.ptr(), len as u64, seq);
            let mut params: [*mut c_void; 3] =
                [(&raw mut dst).cast(), (&raw mut len).cast(), (&raw mut seq).cast()];
            // SAFETY: the slot's `capacity() >= len` bytes at `dst` (aligned to 8) are ours
            // until the publish, whose ready event follows the fill on the slot's stream; the
            // parameters are `pattern_fill`'s.
            unsafe { k.launch(k.fill, slot.stream(), len, &mut params) }
        }

        fn checker(rx: &Consumer<Cuda>) -> Result<Checker, Error> {
            let kernels = Kernels::load(rx.context())?;
            let bad = DevicePool::new(rx.context(), 8)?;
            let _bound = rx.context().bind()?;
            // SAFETY: `bad` holds at least 8 bytes in the current context, whose stream
            // `rx.stream()` is; every check is queued after this, on the same stream.
            ok("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(bad.ptr(), 0, 8, rx.stream().raw())
            })?;
            Ok(Checker { kernels, bad })
        }

        fn check(c: &Checker, m: &ReadSlot<'_, Cuda>) -> Result<(), Error> {
            let (mut src, mut len, mut seq) = (m.ptr(), m.len() as u64, m.seq());
            let (mut bad, mut spin_ns) = (c.bad.ptr(), 0u64);
            let mut params: [*mut c_void; 5] = [
                (&raw mut src).cast(),
                (&raw mut len).cast(),
                (&raw mut seq).cast(),
                (&raw mut bad).cast(),
                (&raw mut spin_ns).cast(),
            ];
            // SAFETY: the message's `len` bytes at `src` stay readable on its stream until the
            // release that dropping `m` queues after this kernel; `bad` is a device `u64` of
            // this context; the parameters are `pattern_check`'s.
            unsafe { c.kernels.launch(c.kernels.check, m.stream(), len, &mut params) }
        }

        fn mismatches(c: &Checker) -> Result<u64, Error> {
            c.synchronize()?;
            let mut out = [0u8; 8];
            let _bound = c.kernels.ctx.bind()?;
            // SAFETY: `bad` holds 8 bytes, and the work that writes it is done.
            ok("cuMemcpyDtoH", unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), c.bad.ptr(), 8)
            })?;
            Ok(u64::from_le_bytes(out))
        }
    }
}

/// The exit code of a process that failed: 75 (`gpuring::EXIT_CONTEXT_LOST`) if its GPU
/// context is lost, so that a supervisor restarts it, 1 otherwise.
pub fn failure() -> std::process::ExitCode {
    match gpuring::context_lost() {
        Some(_) => std::process::ExitCode::from(gpuring::EXIT_CONTEXT_LOST as u8),
        None => std::process::ExitCode::FAILURE,
    }
}
