//! Kernels from `kernels/*.cu`, embedded with `include_str!` and compiled at run time by NVRTC to
//! a CUBIN for the device's own compute capability (PTX from a newer NVRTC can be refused by an
//! older driver; a CUBIN for the exact `sm_XY` cannot). If NVRTC cannot emit a CUBIN for that
//! architecture, the PTX for `compute_XY` is loaded instead and the driver JIT-compiles it.

use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::cuda::driver::{CUdeviceptr, DriverError};
use crate::cuda::{Context, CudaError, Stream};

/// `kernels/pattern.cu`: `pattern_fill` and `pattern_check`.
pub const PATTERN_SRC: &str = include_str!("../../kernels/pattern.cu");

/// What NVRTC produced.
#[derive(Clone, Debug)]
pub enum Image {
    /// Machine code for one architecture.
    Cubin(Vec<u8>),
    /// PTX text (NUL-terminated), JIT-compiled by the driver on load.
    Ptx(Vec<u8>),
}

/// Compiles `src` for compute capability `cc`: a CUBIN for `sm_XY`, else PTX for `compute_XY`.
pub fn compile(src: &str, name: &str, cc: (i32, i32)) -> Result<Image, CudaError> {
    let arch = format!("{}{}", cc.0, cc.1);
    match compile_with(src, name, &format!("--gpu-architecture=sm_{arch}"), true) {
        Ok(img) => Ok(img),
        Err(_) => compile_with(src, name, &format!("--gpu-architecture=compute_{arch}"), false),
    }
}

fn compile_with(src: &str, name: &str, arch: &str, cubin: bool) -> Result<Image, CudaError> {
    let err = |what: &str, e: &dyn std::fmt::Debug| CudaError::Compile(format!("{what}: {e:?}"));
    let src_c = CString::new(src).map_err(|e| err("source", &e))?;
    let name_c = CString::new(name).map_err(|e| err("name", &e))?;
    let prog = nvrtc::create_program(&src_c, Some(&name_c)).map_err(|e| err("create", &e))?;
    let opts = [arch.to_string(), "--std=c++17".to_string()];
    // SAFETY: `prog` is a live program; the options are valid strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    let result = match compiled {
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { nvrtc::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log.iter().map(|&c| c as u8).collect();
            Err(CudaError::Compile(format!(
                "{e:?} ({arch}): {}",
                String::from_utf8_lossy(&log).trim_end_matches('\0')
            )))
        }
        Ok(()) if cubin => {
            let mut size = 0usize;
            // SAFETY: `prog` is live and compiled; valid out-pointer.
            let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
            if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(CudaError::Compile(format!("no CUBIN for {arch}: {r:?}")))
            } else {
                let mut buf = vec![0u8; size];
                // SAFETY: `buf` holds `size` bytes, as NVRTC asked.
                let r = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
                if r == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Ok(Image::Cubin(buf))
                } else {
                    Err(CudaError::Compile(format!("nvrtcGetCUBIN: {r:?}")))
                }
            }
        }
        Ok(()) => {
            // SAFETY: `prog` is live and compiled.
            let ptx = unsafe { nvrtc::get_ptx(prog) }.map_err(|e| err("ptx", &e))?;
            let mut ptx: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
            if ptx.last() != Some(&0) {
                ptx.push(0);
            }
            Ok(Image::Ptx(ptx))
        }
    };
    // SAFETY: `prog` is live and not used again.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// A CUDA module compiled from source by [`compile`] and loaded into one context.
///
/// Invariant: `module` is loaded in `ctx` and unloaded only by `Drop`.
pub struct Module {
    ctx: Arc<Context>,
    module: sys::CUmodule,
    /// Whether the module came from a CUBIN (true) or PTX.
    pub from_cubin: bool,
}

/// A kernel of a [`Module`]. Valid while its module is loaded.
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);

// SAFETY: module and function handles may be used from any thread with the context bound.
unsafe impl Send for Module {}
// SAFETY: launching is thread-safe in the driver.
unsafe impl Sync for Module {}
// SAFETY: as for `Module`.
unsafe impl Send for Function {}
// SAFETY: as for `Module`.
unsafe impl Sync for Function {}

fn check_rc(call: &'static str, code: sys::CUresult) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError { call, code })
    }
}

impl Module {
    /// Compiles `src` (file name `name`, for messages) for `ctx`'s device and loads it.
    pub fn load(ctx: &Arc<Context>, src: &str, name: &str) -> Result<Module, CudaError> {
        let image = compile(src, name, ctx.compute_capability()?)?;
        let (bytes, from_cubin) = match &image {
            Image::Cubin(b) => (b, true),
            Image::Ptx(b) => (b, false),
        };
        let _bound = ctx.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the context is current; `bytes` is a CUBIN or NUL-terminated PTX image.
        check_rc("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, bytes.as_ptr().cast())
        })?;
        Ok(Module { ctx: ctx.clone(), module, from_cubin })
    }

    /// The kernel `name` (an `extern "C"` function of the source).
    pub fn function(&self, name: &str) -> Result<Function, DriverError> {
        let name = CString::new(name).expect("kernel names have no NUL");
        let mut f = std::ptr::null_mut();
        // SAFETY: `module` is loaded; `name` is NUL-terminated; valid out-pointer.
        check_rc("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr())
        })?;
        Ok(Function(f))
    }

    /// Enqueues `f` on `stream` with `blocks` x `threads` (1-D).
    ///
    /// # Safety
    /// 1. `f` must come from this module, and `stream` must belong to this module's context.
    /// 2. `params` must point at one value per kernel parameter, of the parameter's type, alive
    ///    for the call; every pointer among them must be valid for what the kernel does with it
    ///    until the kernel has run.
    pub unsafe fn launch(
        &self,
        f: Function,
        blocks: u32,
        threads: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: (1) and (2) are the caller's; the stream is live while borrowed.
        check_rc("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f.0,
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

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: loaded by `load`; its functions are not used after the module is dropped
            // (they are only reachable through borrows of it or its owners).
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// The pattern kernels (`kernels/pattern.cu`), loaded in one context.
///
/// Invariant: `fill` and `check` are functions of `module`.
pub struct PatternKernels {
    module: Module,
    fill: Function,
    check: Function,
    /// Whether the module came from a CUBIN (true) or PTX.
    pub from_cubin: bool,
}

impl PatternKernels {
    /// The pattern kernels for `ctx`, compiled once per process and device and cached.
    pub fn get(ctx: &Arc<Context>) -> Result<Arc<PatternKernels>, CudaError> {
        type Cache = Mutex<Vec<(i32, Arc<PatternKernels>)>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, k)) = cache.iter().find(|(o, _)| *o == ctx.ordinal()) {
            return Ok(k.clone());
        }
        let module = Module::load(ctx, PATTERN_SRC, "pattern.cu")?;
        let (fill, check) = (module.function("pattern_fill")?, module.function("pattern_check")?);
        let from_cubin = module.from_cubin;
        let k = Arc::new(PatternKernels { module, fill, check, from_cubin });
        cache.push((ctx.ordinal(), k.clone()));
        Ok(k)
    }

    /// # Safety
    /// As [`Module::launch`] (2), for the kernel's parameters; `stream` in the kernels' context.
    unsafe fn launch(
        &self,
        f: Function,
        stream: &Stream,
        len: u64,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        let threads = 256u32;
        let blocks = (len / 8 / threads as u64).clamp(1, 4096) as u32;
        // SAFETY: `f` is ours (the invariant); the rest is the caller's.
        unsafe { self.module.launch(f, blocks, threads, stream, params) }
    }

    /// Enqueues on `stream`: fill `len` bytes at `dst` with message `seq`'s pattern.
    ///
    /// # Safety
    /// 1. `dst` must be 8-byte aligned and point to `len` device bytes writable from this
    ///    context until the kernel has run.
    pub unsafe fn fill(
        &self,
        stream: &Stream,
        dst: CUdeviceptr,
        len: u64,
        seq: u64,
    ) -> Result<(), DriverError> {
        let (mut dst, mut len_v, mut seq) = (dst, len, seq);
        let mut params: [*mut c_void; 3] = [
            (&mut dst as *mut CUdeviceptr).cast(),
            (&mut len_v as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
        ];
        // SAFETY: `params` match `pattern_fill(u8*, u64, u64)`; (1) covers `dst`.
        unsafe { self.launch(self.fill, stream, len, &mut params) }
    }

    /// Enqueues on `stream`: add to the `u64` at `bad` the number of the `len` bytes at `src`
    /// that differ from message `seq`'s pattern, after spinning `spin_ns` in every block.
    ///
    /// # Safety
    /// 1. `src` must be 8-byte aligned and point to `len` device bytes readable from this
    ///    context until the kernel has run; `bad` must point to a device `u64`.
    pub unsafe fn check(
        &self,
        stream: &Stream,
        src: CUdeviceptr,
        len: u64,
        seq: u64,
        bad: CUdeviceptr,
        spin_ns: u64,
    ) -> Result<(), DriverError> {
        let (mut src, mut len_v, mut seq, mut bad, mut spin) = (src, len, seq, bad, spin_ns);
        let mut params: [*mut c_void; 5] = [
            (&mut src as *mut CUdeviceptr).cast(),
            (&mut len_v as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
            (&mut bad as *mut CUdeviceptr).cast(),
            (&mut spin as *mut u64).cast(),
        ];
        // SAFETY: `params` match `pattern_check(const u8*, u64, u64, u64*, u64)`; (1) covers
        // `src` and `bad`.
        unsafe { self.launch(self.check, stream, len, &mut params) }
    }
}

/// A device `u64` that [`PatternKernels::check`] adds mismatching bytes to: the one counter
/// tests, examples and benches keep per consumer. Checks may be queued on any stream of its
/// context: reading it and dropping it wait for all of them.
pub struct MismatchCounter {
    cell: crate::cuda::DevicePool,
    /// The context `cell` lives in.
    ctx: std::sync::Arc<crate::cuda::Context>,
}

impl MismatchCounter {
    /// A zeroed counter in `stream`'s context (the zeroing is queued on `stream`).
    pub fn new(stream: &Stream) -> Result<MismatchCounter, DriverError> {
        let cell = crate::cuda::DevicePool::new(stream.context(), 8)?;
        let _bound = stream.context().bind()?;
        // SAFETY: `cell` is a live allocation of at least 8 bytes; `stream` is live.
        unsafe { crate::cuda::driver::memset_async(cell.ptr(), 0, 8, stream.raw()) }?;
        Ok(MismatchCounter { cell, ctx: stream.context().clone() })
    }

    /// Its device address, for [`PatternKernels::check`].
    pub fn ptr(&self) -> CUdeviceptr {
        self.cell.ptr()
    }

    /// Waits for the context's work (every check that adds to it, on whichever stream), then
    /// reads it. A CPU sync: for the end of a run, never per frame.
    pub fn read(&self) -> Result<u64, DriverError> {
        let _bound = self.ctx.bind()?;
        // SAFETY: the context is bound on this thread just above.
        unsafe { crate::cuda::driver::ctx_synchronize() }?;
        let mut out = [0u8; 8];
        // SAFETY: the cell holds 8 bytes, and the work that wrote it is synchronised.
        unsafe { crate::cuda::driver::memcpy_dtoh(&mut out, self.cell.ptr()) }?;
        Ok(u64::from_le_bytes(out))
    }
}

impl Drop for MismatchCounter {
    /// Waits for the checks still queued before the cell is freed (`DevicePool`'s owners
    /// synchronise first).
    fn drop(&mut self) {
        if let Ok(_bound) = self.ctx.bind() {
            // SAFETY: the context is bound on this thread just above.
            let _ = unsafe { crate::cuda::driver::ctx_synchronize() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_source_is_embedded() {
        assert!(PATTERN_SRC.contains("extern \"C\" __global__ void pattern_fill"));
        assert!(PATTERN_SRC.contains("extern \"C\" __global__ void pattern_check"));
        // The same multiplier as the host pattern.
        assert!(PATTERN_SRC.contains("0x9E3779B97F4A7C15"));
    }
}
