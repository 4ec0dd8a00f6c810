//! The tensor header (src/tensor.rs): element type and shape at the start of a message's user
//! header, so that consumers in any language see typed tensors.

use gpuring::tensor::{DType, TensorHeader};

use crate::gpuring_status::*;
use crate::producer::bytes;
use crate::{fail, gpuring_status};

/// The most dimensions a tensor header holds.
pub const GPURING_TENSOR_MAX_DIMS: usize = 8;
const _: () = assert!(GPURING_TENSOR_MAX_DIMS == TensorHeader::MAX_DIMS);

/// Writes the tensor header of a tensor of DLPack type (`code`, `bits`: 0 int, 1 uint, 2
/// float, 4 bfloat, 6 bool) and `ndim` dimensions `shape` into `buf` (`len` bytes, the start of
/// a user header). `*written` (may be NULL) receives its length.
#[no_mangle]
pub unsafe extern "C" fn gpuring_tensor_header_write(
    code: u8,
    bits: u8,
    shape: *const u64,
    ndim: usize,
    buf: *mut u8,
    len: usize,
    written: *mut usize,
) -> gpuring_status {
    let Some(dtype) = DType::from_dlpack(code, bits) else {
        return fail(GPURING_INVALID_ARGUMENT, format!("no dtype with code {code} bits {bits}"));
    };
    if ndim > GPURING_TENSOR_MAX_DIMS || (ndim > 0 && shape.is_null()) || (len > 0 && buf.is_null())
    {
        return fail(GPURING_INVALID_ARGUMENT, "shape or buffer is null, or ndim > 8");
    }
    // SAFETY: `shape` holds `ndim` values and `buf` `len` writable bytes (the contract).
    let (shape, out) = unsafe {
        let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(shape, ndim) };
        let out = if len == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(buf, len) };
        (shape, out)
    };
    match TensorHeader::new(dtype, shape).write(out) {
        Ok(n) => {
            // SAFETY: null or writable.
            if let Some(w) = unsafe { written.as_mut() } {
                *w = n;
            }
            GPURING_OK
        }
        Err(e) => fail(GPURING_INVALID_ARGUMENT, e),
    }
}

/// Reads the tensor header at the start of user header `buf` (`len` bytes): its DLPack type
/// into `*code` and `*bits`, its dimensions into `shape` (room for
/// `GPURING_TENSOR_MAX_DIMS`) and their number into `*ndim`. `GPURING_NO_TENSOR` if the header
/// carries none.
#[no_mangle]
pub unsafe extern "C" fn gpuring_tensor_header_read(
    buf: *const u8,
    len: usize,
    code: *mut u8,
    bits: *mut u8,
    shape: *mut u64,
    ndim: *mut usize,
) -> gpuring_status {
    // SAFETY: `buf` holds `len` readable bytes (the contract).
    let bytes = match unsafe { bytes(buf, len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    if code.is_null() || bits.is_null() || shape.is_null() || ndim.is_null() {
        return fail(GPURING_INVALID_ARGUMENT, "an out-pointer is null");
    }
    match TensorHeader::read(bytes) {
        Ok(Some(t)) => {
            // SAFETY: the out-pointers are writable, `shape` for MAX_DIMS values (contract).
            unsafe {
                *code = t.dtype.code();
                *bits = t.dtype.bits();
                std::ptr::copy_nonoverlapping(t.shape.as_ptr(), shape, t.shape.len());
                *ndim = t.shape.len();
            }
            GPURING_OK
        }
        Ok(None) => fail(GPURING_NO_TENSOR, "the user header carries no tensor header"),
        Err(e) => fail(GPURING_CORRUPT, e),
    }
}
