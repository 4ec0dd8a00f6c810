//! GStreamer's CUDA library (libgstcuda-1.0, from gst-plugins-bad), opened at run time.
//!
//! It has no Rust bindings, and Debian ships no headers for it outside its -dev package, so the
//! few calls the elements need are declared here from its headers (1.22, the oldest we support;
//! every call used keeps its signature in 1.24 and 1.26). Where the library is missing, CUDA
//! memory caps are simply not offered.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use gst::glib;
use gst::glib::translate::{FromGlibPtrNone, ToGlibPtr};

/// The caps feature of CUDA memory (`GST_CAPS_FEATURE_MEMORY_CUDA_MEMORY`).
pub const CAPS_FEATURE: &str = "memory:CUDAMemory";
/// `GST_MAP_CUDA`: map a CUDA memory for device access (`info.data` is its `CUdeviceptr`).
const MAP_CUDA: c_uint = gst::ffi::GST_MAP_FLAG_LAST << 1;

/// `GstCudaMemory` (gstcudamemory.h, the same in 1.22 to 1.26): the public fields only; it is
/// only ever read through a pointer GStreamer gave us.
#[repr(C)]
struct GstCudaMemory {
    mem: gst::ffi::GstMemory,
    context: *mut c_void,
    info: gst_video::ffi::GstVideoInfo,
}

type LoadLibrary = unsafe extern "C" fn() -> glib::ffi::gboolean;
type InitOnce = unsafe extern "C" fn();
type IsCudaMemory = unsafe extern "C" fn(*mut gst::ffi::GstMemory) -> glib::ffi::gboolean;
type GetHandle = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type EnsureContext =
    unsafe extern "C" fn(*mut gst::ffi::GstElement, c_int, *mut *mut c_void) -> glib::ffi::gboolean;
type HandleSetContext = unsafe extern "C" fn(
    *mut gst::ffi::GstElement,
    *mut gst::ffi::GstContext,
    c_int,
    *mut *mut c_void,
) -> glib::ffi::gboolean;
type HandleQuery = unsafe extern "C" fn(
    *mut gst::ffi::GstElement,
    *mut gst::ffi::GstQuery,
    *mut c_void,
) -> glib::ffi::gboolean;
type PoolNew = unsafe extern "C" fn(*mut c_void) -> *mut gst::ffi::GstBufferPool;
type MemorySync = unsafe extern "C" fn(*mut gst::ffi::GstMemory);

/// The library's entry points.
///
/// Invariant: every pointer was resolved from the library `_lib` keeps loaded, whose CUDA
/// loader (`gst_cuda_load_library`) and allocator (`gst_cuda_memory_init_once`) are set up.
pub struct GstCuda {
    _lib: libloading::Library,
    is_cuda_memory: IsCudaMemory,
    get_handle: GetHandle,
    ensure_context: EnsureContext,
    handle_set_context: HandleSetContext,
    handle_query: HandleQuery,
    pool_new: PoolNew,
    /// `gst_cuda_memory_sync` (1.24+): waits for the memory's stream. 1.22 memory has no
    /// stream (its writers synchronise before they push), so there is nothing to wait for.
    memory_sync: Option<MemorySync>,
}

/// The library, loaded once per process; `None` where it is not installed or finds no CUDA
/// driver.
pub fn get() -> Option<&'static GstCuda> {
    static LIB: OnceLock<Option<GstCuda>> = OnceLock::new();
    LIB.get_or_init(|| match GstCuda::load() {
        Ok(lib) => Some(lib),
        Err(e) => {
            gst::debug!(gst::CAT_DEFAULT, "no CUDA memory support: {e}");
            None
        }
    })
    .as_ref()
}

/// Entry point `name` of `lib`.
///
/// # Safety
/// `T` must be the function pointer type of that symbol's C signature.
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, String> {
    // SAFETY: by the caller's contract.
    unsafe { lib.get::<T>(name) }.map(|f| *f).map_err(|e| e.to_string())
}

impl GstCuda {
    fn load() -> Result<GstCuda, String> {
        // SAFETY: loading a GStreamer library runs only its (GLib) constructors.
        let lib = unsafe { libloading::Library::new("libgstcuda-1.0.so.0") }
            .map_err(|e| e.to_string())?;
        // SAFETY: each name is the libgstcuda function of exactly this signature (its header).
        unsafe {
            let load: LoadLibrary = sym(&lib, b"gst_cuda_load_library\0")?;
            let init: InitOnce = sym(&lib, b"gst_cuda_memory_init_once\0")?;
            if load() == glib::ffi::GFALSE {
                return Err("libgstcuda found no CUDA driver".into());
            }
            init();
            Ok(GstCuda {
                is_cuda_memory: sym(&lib, b"gst_is_cuda_memory\0")?,
                get_handle: sym(&lib, b"gst_cuda_context_get_handle\0")?,
                ensure_context: sym(&lib, b"gst_cuda_ensure_element_context\0")?,
                handle_set_context: sym(&lib, b"gst_cuda_handle_set_context\0")?,
                handle_query: sym(&lib, b"gst_cuda_handle_context_query\0")?,
                pool_new: sym(&lib, b"gst_cuda_buffer_pool_new\0")?,
                memory_sync: sym(&lib, b"gst_cuda_memory_sync\0").ok(),
                _lib: lib,
            })
        }
    }

    /// Whether `mem` is CUDA memory.
    pub fn is_cuda_memory(&self, mem: &gst::MemoryRef) -> bool {
        // SAFETY: a live GstMemory; the call only reads its allocator.
        unsafe { (self.is_cuda_memory)(mem.as_mut_ptr()) != glib::ffi::GFALSE }
    }

    /// Maps CUDA memory `mem` for device reads: its device address, its context's `CUcontext`
    /// and its video layout. `None` if it is not CUDA memory or cannot be mapped.
    pub fn map_read<'a>(&self, mem: &'a gst::MemoryRef) -> Option<DeviceMap<'a>> {
        if !self.is_cuda_memory(mem) {
            return None;
        }
        let raw = mem.as_mut_ptr();
        if let Some(sync) = self.memory_sync {
            // SAFETY: CUDA memory (checked above); waits for its stream's pending writes.
            unsafe { sync(raw) };
        }
        let mut info = std::mem::MaybeUninit::<gst::ffi::GstMapInfo>::zeroed();
        // SAFETY: a live memory and a map info to fill; the map is undone by DeviceMap's drop.
        let ok = unsafe {
            gst::ffi::gst_memory_map(raw, info.as_mut_ptr(), gst::ffi::GST_MAP_READ | MAP_CUDA)
        };
        if ok == glib::ffi::GFALSE {
            return None;
        }
        // SAFETY: filled by the successful map.
        let info = unsafe { info.assume_init() };
        let cmem = raw as *const GstCudaMemory;
        // SAFETY: CUDA memory is a GstCudaMemory, whose public fields are laid out as above;
        // its context lives as long as the memory.
        let (ctx, video) = unsafe {
            (
                (self.get_handle)((*cmem).context),
                gst_video::VideoInfo::from_glib_none(&(*cmem).info as *const _),
            )
        };
        Some(DeviceMap { mem, info, ptr: info.data as u64, ctx, video })
    }

    /// The element's CUDA context for device `device`: shared with its neighbours through
    /// GStreamer's context queries, or a new one, stored in `ctx`. The library may call the
    /// element's `set_context` meanwhile, which stores into the same `ctx`: hold no lock
    /// across this call.
    pub fn ensure_context(&self, element: &gst::Element, device: i32, ctx: &Context) -> bool {
        // SAFETY: a live element and a context slot that holds null or one owned reference,
        // which the library fills (as C elements' own fields are filled).
        unsafe {
            (self.ensure_context)(element.to_glib_none().0, device, ctx.slot()) != glib::ffi::GFALSE
        }
    }

    /// Takes a CUDA context a neighbour or the application set on the element (its
    /// `set_context`), for device `device` (-1: any), unless it has one.
    pub fn handle_set_context(
        &self,
        element: &gst::Element,
        context: &gst::Context,
        device: i32,
        ctx: &Context,
    ) {
        // SAFETY: live element and context; the slot holds null or one owned reference.
        unsafe {
            (self.handle_set_context)(
                element.to_glib_none().0,
                context.to_glib_none().0,
                device,
                ctx.slot(),
            );
        }
    }

    /// Answers a context query with the element's CUDA context, if it has one.
    pub fn handle_query(
        &self,
        element: &gst::Element,
        query: &mut gst::QueryRef,
        ctx: &Context,
    ) -> bool {
        let raw = ctx.get();
        if raw.is_null() {
            return false;
        }
        // SAFETY: live element, query and context.
        unsafe {
            (self.handle_query)(element.to_glib_none().0, query.as_mut_ptr(), raw)
                != glib::ffi::GFALSE
        }
    }

    /// A CUDA buffer pool in context `ctx` (not yet configured).
    pub fn pool(&self, ctx: &Context) -> Option<gst::BufferPool> {
        let raw = ctx.get();
        if raw.is_null() {
            return None;
        }
        // SAFETY: a live context; the pool comes back with one reference, ours.
        unsafe {
            let pool = (self.pool_new)(raw);
            (!pool.is_null()).then(|| glib::translate::from_glib_full(pool))
        }
    }

    /// The `CUcontext` of the element's CUDA context.
    pub fn handle(&self, ctx: &Context) -> *mut c_void {
        let raw = ctx.get();
        if raw.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: a live context (checked non-null, owned by `ctx`).
        unsafe { (self.get_handle)(raw) }
    }
}

/// An element's `GstCudaContext`, or null; one reference, released on drop. GStreamer's CUDA
/// library fills it in place (`ensure_context`, `handle_set_context`), the way a C element's
/// field is filled; it only ever goes from null to set, once.
#[derive(Default)]
pub struct Context(AtomicPtr<c_void>);

// SAFETY: a GstCudaContext is a GObject, reference-counted atomically and usable from any
// thread (GStreamer's CUDA elements share one across their streaming threads).
unsafe impl Send for Context {}
// SAFETY: as above; the pointer itself is an atomic.
unsafe impl Sync for Context {}

impl Context {
    /// Whether the element has one yet.
    pub fn is_set(&self) -> bool {
        !self.get().is_null()
    }

    /// The context. Acquire: pairs with the library's write of the slot on another thread
    /// (through `slot`, then the GstContext handoff, which itself synchronises).
    fn get(&self) -> *mut c_void {
        self.0.load(Ordering::Acquire)
    }

    /// Where the library stores the context.
    fn slot(&self) -> *mut *mut c_void {
        self.0.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let raw = *self.0.get_mut();
        if !raw.is_null() {
            // SAFETY: the one reference this value owns.
            unsafe { gst::glib::gobject_ffi::g_object_unref(raw.cast()) };
        }
    }
}

/// A CUDA memory mapped for device reads; unmapped on drop.
pub struct DeviceMap<'a> {
    mem: &'a gst::MemoryRef,
    info: gst::ffi::GstMapInfo,
    /// The memory's device address.
    pub ptr: u64,
    /// The `CUcontext` it belongs to.
    pub ctx: *mut c_void,
    /// Its layout (planes at pitched strides).
    pub video: gst_video::VideoInfo,
}

impl Drop for DeviceMap<'_> {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_read` with this info, unmapped once.
        unsafe { gst::ffi::gst_memory_unmap(self.mem.as_mut_ptr(), &mut self.info) };
    }
}

/// Maps CUDA memory `mem` for device writes (a pool buffer the source fills): its address.
/// Unmapped by [`unmap_write`]. `None` if it cannot be mapped.
pub fn map_write(mem: &gst::MemoryRef) -> Option<(u64, gst::ffi::GstMapInfo)> {
    let mut info = std::mem::MaybeUninit::<gst::ffi::GstMapInfo>::zeroed();
    // SAFETY: a live memory and a map info to fill.
    let ok = unsafe {
        gst::ffi::gst_memory_map(
            mem.as_mut_ptr(),
            info.as_mut_ptr(),
            gst::ffi::GST_MAP_WRITE | MAP_CUDA,
        )
    };
    // SAFETY: filled by the successful map.
    (ok != glib::ffi::GFALSE).then(|| {
        let info = unsafe { info.assume_init() };
        (info.data as u64, info)
    })
}

/// Undoes [`map_write`].
pub fn unmap_write(mem: &gst::MemoryRef, mut info: gst::ffi::GstMapInfo) {
    // SAFETY: mapped by `map_write` with this info, unmapped once.
    unsafe { gst::ffi::gst_memory_unmap(mem.as_mut_ptr(), &mut info) };
}
