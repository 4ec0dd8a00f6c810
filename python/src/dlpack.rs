//! DLPack (the legacy, unversioned `DLManagedTensor` that every DLPack consumer accepts):
//! the C structures, and the `"dltensor"` capsule that `__dlpack__` returns.
//!
//! Ownership: the capsule owns a boxed [`Export`] until a consumer (PyTorch, numpy) takes it,
//! renaming the capsule `"used_dltensor"`; from then on the consumer calls the deleter when
//! its tensor is freed. An export keeps its slot held (`keep`), so a tensor never outlives
//! the bytes it points to. A capsule nobody took is deleted by its destructor.
//!
//! A capsule is single-use, so every `__dlpack__` makes one: a single allocation (the box,
//! with the shape and strides in fixed arrays from the slot's cached layout) besides the
//! capsule object itself.
//!
//! Read-only: the legacy form has no read-only flag (DLPack 1.0's versioned form has one),
//! so nothing here can say that the memory is shared and must not be written. torch and CuPy
//! make writable tensors of it, numpy read-only arrays. The rule is on `Slot`'s doc and in
//! docs/python.md.

use std::ffi::c_void;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::{ffi, Bound};

use crate::layout::{Layout, MAX_DIMS};

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

/// One export, in one allocation. `repr(C)` with `managed` first, so a pointer to it is a
/// pointer to `managed`.
#[repr(C)]
struct Export<K> {
    /// Invariant: `dl_tensor.shape` and `.strides` point into `shape` and `strides` below
    /// (the box never moves).
    managed: DLManagedTensor,
    shape: [i64; MAX_DIMS],
    strides: [i64; MAX_DIMS],
    /// What keeps the bytes valid: never read, held for its `Drop`, which runs on whichever
    /// thread frees the tensor (hence `Send`).
    keep: K,
}

const NAME: &std::ffi::CStr = c"dltensor";

/// A `"dltensor"` capsule of `layout` at `data` on device (`device_type`, `device_id`),
/// keeping `keep` until the tensor is freed.
pub fn capsule<'py, K: Send + 'static>(
    py: Python<'py>,
    data: u64,
    device: (i32, i32),
    layout: &Layout,
    keep: K,
) -> PyResult<Bound<'py, PyAny>> {
    let (shape, strides) = layout.arrays();
    let raw = Box::into_raw(Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device: DLDevice { device_type: device.0, device_id: device.1 },
                ndim: layout.shape().len() as i32,
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
            deleter: Some(delete::<K>),
        },
        shape,
        strides,
        keep,
    }));
    // SAFETY: `raw` is the allocation just made, which nothing else refers to yet; its arrays
    // stay where they are until the box is freed.
    unsafe {
        (*raw).managed.dl_tensor.shape = (&raw mut (*raw).shape).cast();
        (*raw).managed.dl_tensor.strides = (&raw mut (*raw).strides).cast();
    }
    // SAFETY: `raw` is a live `Export` whose first field is the `DLManagedTensor` (repr(C));
    // the name is a static C string; `destroy` matches the capsule destructor signature.
    let capsule = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(destroy::<K>)) };
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
/// `m` must be a `DLManagedTensor` made by [`capsule`] with this `K`, not deleted before.
unsafe extern "C" fn delete<K: Send>(m: *mut DLManagedTensor) {
    // SAFETY: by the contract, `m` is the first field of a boxed `Export<K>` we leaked.
    // Dropping it on any thread is fine: `keep` is `Send`.
    drop(unsafe { Box::from_raw(m.cast::<Export<K>>()) });
}

/// The capsule destructor: deletes the tensor unless a consumer took it.
///
/// # Safety
/// Called by Python with a capsule made by [`capsule`] with this `K`.
unsafe extern "C" fn destroy<K: Send>(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule; a taken one was renamed "used_dltensor", which
    // makes IsValid false without setting an error.
    if unsafe { ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) } != 1 {
        return;
    }
    // SAFETY: valid with this name, so the pointer is the `DLManagedTensor` we stored.
    let m = unsafe { ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) }.cast::<DLManagedTensor>();
    // SAFETY: nobody took it, so nobody deleted it: we do, once.
    unsafe { delete::<K>(m) };
}
