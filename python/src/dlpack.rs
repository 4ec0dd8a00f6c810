//! DLPack (the legacy, unversioned `DLManagedTensor` that every DLPack consumer accepts):
//! the C structures, and the `"dltensor"` capsule that `__dlpack__` returns.
//!
//! Ownership: the capsule owns a boxed [`Export`] until a consumer (PyTorch, numpy) takes it,
//! renaming the capsule `"used_dltensor"`; from then on the consumer calls the deleter when
//! its tensor is freed. An export keeps its slot held (`keep`), so a tensor never outlives
//! the bytes it points to. A capsule nobody took is deleted by its destructor.
//!
//! Read-only: the legacy form has no read-only flag (DLPack 1.0's versioned form has one),
//! so nothing here can say that the memory is shared and must not be written. torch and CuPy
//! make writable tensors of it, numpy read-only arrays. The rule is on `Slot`'s doc and in
//! docs/python.md.

use std::any::Any;
use std::ffi::c_void;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::{ffi, Bound};

use crate::bound::ThreadBound;
use crate::layout::Layout;

/// `kDLCPU`.
pub const CPU: i32 = 1;
/// `kDLCUDA`.
pub const CUDA: i32 = 2;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What keeps an export's bytes valid: dropped when the tensor is freed, on the consumer's
/// thread whichever thread frees the tensor. Never read; held for its `Drop`.
pub type Keep = ThreadBound<Box<dyn Any>>;

/// One export. `repr(C)` with `managed` first, so a pointer to it is a pointer to `managed`.
#[repr(C)]
struct Export {
    /// Invariant: `dl_tensor.shape` and `.strides` point into `shape` and `strides` below,
    /// which are never resized.
    managed: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    keep: Keep,
}

const NAME: &std::ffi::CStr = c"dltensor";

/// A `"dltensor"` capsule of `layout` at `data` on device (`device_type`, `device_id`),
/// keeping `keep` until the tensor is freed.
pub fn capsule<'py>(
    py: Python<'py>,
    data: u64,
    device: (i32, i32),
    layout: &Layout,
    keep: Keep,
) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<i64> = layout.shape.iter().map(|d| *d as i64).collect();
    let strides = layout.strides();
    let mut export = Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device: DLDevice { device_type: device.0, device_id: device.1 },
                ndim: shape.len() as i32,
                dtype: DLDataType {
                    code: layout.dtype.code(),
                    bits: layout.dtype.bits(),
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete),
        },
        shape,
        strides,
        keep,
    });
    // The vectors' buffers do not move when the box does, and are never resized.
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a live `Export` whose first field is the `DLManagedTensor` (repr(C));
    // the name is a static C string; `destroy` matches the capsule destructor signature.
    let capsule = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(destroy)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not created, so we still own `raw`.
        drop(unsafe { Box::from_raw(raw) });
        return Err(PyErr::take(py).unwrap_or_else(|| PyMemoryError::new_err("PyCapsule_New")));
    }
    // SAFETY: `capsule` is a new reference we own.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// The DLPack deleter: called once, by the consumer that took the tensor (or by `destroy`).
///
/// # Safety
/// `m` must be a `DLManagedTensor` made by [`capsule`], not deleted before.
unsafe extern "C" fn delete(m: *mut DLManagedTensor) {
    // SAFETY: by the contract, `m` is the first field of a boxed `Export` we leaked. Dropping
    // it on any thread is fine: `keep` defers its value to the consumer's thread.
    drop(unsafe { Box::from_raw(m.cast::<Export>()) });
}

/// The capsule destructor: deletes the tensor unless a consumer took it.
///
/// # Safety
/// Called by Python with a capsule made by [`capsule`].
unsafe extern "C" fn destroy(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule; a taken one was renamed "used_dltensor", which
    // makes IsValid false without setting an error.
    if unsafe { ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) } != 1 {
        return;
    }
    // SAFETY: valid with this name, so the pointer is the `DLManagedTensor` we stored.
    let m = unsafe { ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) }.cast::<DLManagedTensor>();
    // SAFETY: nobody took it, so nobody deleted it: we do, once.
    unsafe { delete(m) };
}
