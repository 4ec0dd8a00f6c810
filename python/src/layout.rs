//! How a message's bytes are viewed: element type and C-order shape. From the slot's `view`,
//! else the consumer's `dtype`/`shape` arguments, else the tensor header at the start of the
//! user header (`gpuring::tensor`), else a 1-D `uint8` array of the message's bytes.
//!
//! A resolved [`Layout`] holds its shape and strides in fixed arrays, ready for DLPack and the
//! buffer protocol, and a consumer keeps the last one it resolved ([`LayoutCache`]): a ring's
//! messages mostly share one layout, so an export neither parses the tensor header nor
//! computes strides again.

use std::cell::RefCell;
use std::ffi::CStr;

use gpuring::tensor::{DType, TensorHeader};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The most dimensions a layout has (the tensor header's limit, which `Wanted` keeps too).
pub const MAX_DIMS: usize = TensorHeader::MAX_DIMS;

/// What the user asked for: either part may be left to the header or to the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub dtype: Option<DType>,
    shape: Option<Dims>,
}

/// A requested shape, in place (a slot copies its consumer's `Wanted`: no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims {
    /// Invariant: at most `MAX_DIMS`.
    ndim: u8,
    /// Invariant: of the first `ndim`, at most one `-1` (inferred), every other entry >= 0;
    /// the rest are 0.
    dims: [i64; MAX_DIMS],
}

impl Dims {
    fn get(&self) -> &[i64] {
        &self.dims[..self.ndim as usize]
    }
}

/// A resolved layout: element type, C-order shape and strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dtype: DType,
    /// Invariant: at most `MAX_DIMS`.
    ndim: u8,
    /// Invariant: the first `ndim` entries are >= 0, and their product times the element size
    /// is the message's length and fits in an i64; the rest are 0.
    shape: [i64; MAX_DIMS],
    /// C-order strides of `shape`, in elements (each fits: it divides the product above, or
    /// is 0).
    strides: [i64; MAX_DIMS],
}

impl Wanted {
    /// From Python arguments: `dtype` a name (`"uint8"`), a torch or numpy dtype (their `str`),
    /// or None; `shape` a sequence of ints, one of which may be -1, or None.
    pub fn from_args(dtype: Option<&Bound<'_, PyAny>>, shape: Option<Vec<i64>>) -> PyResult<Self> {
        let dtype = dtype.filter(|d| !d.is_none()).map(parse_dtype).transpose()?;
        let shape = match shape {
            None => None,
            Some(shape) => {
                if shape.iter().filter(|d| **d == -1).count() > 1 || shape.iter().any(|d| *d < -1) {
                    return Err(PyValueError::new_err(format!(
                        "shape {shape:?}: dimensions must be >= 0, with at most one -1"
                    )));
                }
                if shape.len() > MAX_DIMS {
                    return Err(PyValueError::new_err(format!(
                        "shape {shape:?}: at most {MAX_DIMS} dimensions"
                    )));
                }
                let mut dims = [0; MAX_DIMS];
                dims[..shape.len()].copy_from_slice(&shape);
                Some(Dims { ndim: shape.len() as u8, dims })
            }
        };
        Ok(Wanted { dtype, shape })
    }

    /// The layout of a message of `len` bytes whose user header is `header`.
    pub fn resolve(&self, header: &[u8], len: usize) -> PyResult<Layout> {
        // The header matters only for what the caller left open; a broken one is an error only
        // when it is relied on.
        let from_header = || {
            TensorHeader::read(header)
                .map_err(|e| PyValueError::new_err(format!("the message's tensor header: {e}")))
        };
        if self.dtype.is_none() && self.shape.is_none() {
            if let Some(h) = from_header()? {
                if h.nbytes() != Some(len as u64) {
                    return Err(PyValueError::new_err(format!(
                        "the tensor header says {}{:?} ({:?} bytes) but the message has {len} bytes",
                        h.dtype, h.shape, h.nbytes()
                    )));
                }
                return Layout::new(h.dtype, &h.shape);
            }
        }
        let dtype = match self.dtype {
            Some(t) => t,
            None => from_header()?.map_or(DType::U8, |h| h.dtype),
        };
        let size = dtype.size();
        if len % size != 0 {
            return Err(PyValueError::new_err(format!(
                "{len} bytes are not a whole number of {dtype} elements"
            )));
        }
        let elements = (len / size) as u64;
        match &self.shape {
            None => Layout::new(dtype, &[elements]),
            Some(dims) => {
                let dims = dims.get();
                let shape = infer(dims, elements).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "shape {dims:?} of {dtype} does not fit a message of {len} bytes"
                    ))
                })?;
                Layout::new(dtype, &shape)
            }
        }
    }

    /// The bytes of a user header that resolving this depends on: none when a dtype is given
    /// (the header is not read), else the tensor header that starts it (or the bytes that say
    /// there is none). The frame number or whatever else follows does not count.
    fn header_key<'h>(&self, header: &'h [u8]) -> &'h [u8] {
        if self.dtype.is_some() {
            return &[];
        }
        let end = if header.starts_with(&TensorHeader::MAGIC) {
            // Past MAX_DIMS the header is refused for its first 8 bytes alone.
            8 + 8 * header.get(7).map_or(0, |n| (*n as usize).min(MAX_DIMS))
        } else {
            TensorHeader::MAGIC.len()
        };
        &header[..end.min(header.len())]
    }
}

/// The longest [`Wanted::header_key`]: a tensor header of `MAX_DIMS` dimensions.
const KEY_MAX: usize = 8 + 8 * MAX_DIMS;

/// The layout a consumer resolved last, with what it was resolved from. Bound to the
/// consumer's thread, as the consumer is.
#[derive(Default)]
pub struct LayoutCache(RefCell<Option<Cached>>);

struct Cached {
    wanted: Wanted,
    len: usize,
    /// Invariant: at most `KEY_MAX`.
    key_len: u8,
    key: [u8; KEY_MAX],
    layout: Layout,
}

impl LayoutCache {
    /// `wanted.resolve(header, len)`, from the cache when the last resolve was of the same
    /// request, length and tensor header. Errors are not kept: they are reported each time.
    pub fn resolve(&self, wanted: &Wanted, header: &[u8], len: usize) -> PyResult<Layout> {
        let key = wanted.header_key(header);
        if let Some(c) = &*self.0.borrow() {
            if c.len == len && c.wanted == *wanted && &c.key[..c.key_len as usize] == key {
                return Ok(c.layout);
            }
        }
        let layout = wanted.resolve(header, len)?;
        let mut cached =
            Cached { wanted: *wanted, len, key_len: key.len() as u8, key: [0; KEY_MAX], layout };
        cached.key[..key.len()].copy_from_slice(key);
        *self.0.borrow_mut() = Some(cached);
        Ok(layout)
    }
}

/// `dims` with its -1 (if any) replaced so that the product is `elements`.
fn infer(dims: &[i64], elements: u64) -> Option<Vec<u64>> {
    let known = dims.iter().filter(|d| **d >= 0).try_fold(1u64, |n, d| n.checked_mul(*d as u64))?;
    let shape: Vec<u64> = match dims.iter().position(|d| *d == -1) {
        Some(_) if known == 0 => return None,
        Some(_) if elements % known != 0 => return None,
        Some(_) => {
            dims.iter().map(|d| if *d == -1 { elements / known } else { *d as u64 }).collect()
        }
        None => dims.iter().map(|d| *d as u64).collect(),
    };
    (shape.iter().product::<u64>() == elements).then_some(shape)
}

/// A dtype by name: numpy's and torch's names, torch's aliases (`half`, `double`, `long`...),
/// array-interface type strings (`"<f4"`, `"u1"`) and buffer-protocol formats (`"B"`, `"f"`).
pub fn dtype_named(name: &str) -> Option<DType> {
    let name = name.strip_prefix("torch.").unwrap_or(name);
    DType::from_name(name).or_else(|| {
        Some(match name.trim_start_matches(['<', '|', '=', '@']) {
            "b1" | "?" => DType::BOOL,
            "u1" | "B" => DType::U8,
            "i1" | "b" => DType::I8,
            "u2" | "H" => DType::U16,
            "i2" | "h" | "short" => DType::I16,
            "u4" | "I" => DType::U32,
            "i4" | "i" => DType::I32,
            "u8" | "Q" | "L" => DType::U64,
            "i8" | "q" | "l" | "long" => DType::I64,
            "f2" | "e" | "half" => DType::F16,
            "f4" | "f" => DType::F32,
            "f8" | "d" | "double" => DType::F64,
            _ => return None,
        })
    })
}

/// Parses a dtype given as a name or a torch/numpy dtype object.
pub fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let name: String = match obj.extract::<String>() {
        Ok(s) => s,
        Err(_) => obj.str()?.extract()?,
    };
    // numpy's scalar types (numpy.float32) print as classes: take their name.
    let class_name = || obj.getattr("__name__").ok()?.extract::<String>().ok();
    let found = dtype_named(&name).or_else(|| class_name().and_then(|n| dtype_named(&n)));
    found.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "unsupported dtype {name:?}: use bool, (u)int8/16/32/64, float16, bfloat16, float32 or float64"
        ))
    })
}

impl Layout {
    /// `dtype` elements in C-order `shape`. Refuses more than `MAX_DIMS` dimensions, and
    /// shapes whose strides would not fit in the i64 that DLPack and Python use (a header may
    /// say `(0, 2**63, 4)` of an empty message).
    pub fn new(dtype: DType, shape: &[u64]) -> PyResult<Layout> {
        let fits = shape
            .iter()
            .filter(|d| **d > 0)
            .try_fold(dtype.size() as i64, |n, d| n.checked_mul(i64::try_from(*d).ok()?));
        if fits.is_none() || shape.len() > MAX_DIMS {
            return Err(PyValueError::new_err(format!("shape {shape:?} is too large")));
        }
        let mut layout =
            Layout { dtype, ndim: shape.len() as u8, shape: [0; MAX_DIMS], strides: [0; MAX_DIMS] };
        let mut stride = 1i64;
        for (i, d) in shape.iter().enumerate().rev() {
            // Fits (checked above): every dim, and every suffix product, is at most the
            // product of the positive dims, or 0.
            layout.shape[i] = *d as i64;
            layout.strides[i] = stride;
            stride *= *d as i64;
        }
        Ok(layout)
    }

    /// `len` bytes, as a 1-D `uint8` array.
    pub fn bytes(len: usize) -> Layout {
        let mut layout =
            Layout { dtype: DType::U8, ndim: 1, shape: [0; MAX_DIMS], strides: [0; MAX_DIMS] };
        // A length in memory is at most isize::MAX.
        layout.shape[0] = len as i64;
        layout.strides[0] = 1;
        layout
    }

    /// The shape, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.ndim as usize]
    }

    /// C-order strides, in elements.
    pub fn strides(&self) -> &[i64] {
        &self.strides[..self.ndim as usize]
    }

    /// The shape and strides arrays whole (entries past `shape().len()` are 0), for DLPack.
    pub fn arrays(&self) -> ([i64; MAX_DIMS], [i64; MAX_DIMS]) {
        (self.shape, self.strides)
    }

    /// The `__cuda_array_interface__` typestr; bfloat16 has none.
    pub fn typestr(&self) -> PyResult<&'static str> {
        let t = match self.dtype {
            DType::BOOL => "|b1",
            DType::U8 => "|u1",
            DType::I8 => "|i1",
            DType::U16 => "<u2",
            DType::I16 => "<i2",
            DType::U32 => "<u4",
            DType::I32 => "<i4",
            DType::U64 => "<u8",
            DType::I64 => "<i8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            other => {
                return Err(PyTypeError::new_err(format!(
                    "{other} has no __cuda_array_interface__ type: use DLPack (torch.from_dlpack)"
                )))
            }
        };
        Ok(t)
    }

    /// The buffer protocol's struct format; bfloat16 has none.
    pub fn format(&self) -> PyResult<&'static CStr> {
        let f = match self.dtype {
            DType::BOOL => c"?",
            DType::U8 => c"B",
            DType::I8 => c"b",
            DType::U16 => c"H",
            DType::I16 => c"h",
            DType::U32 => c"I",
            DType::I32 => c"i",
            DType::U64 => c"Q",
            DType::I64 => c"q",
            DType::F16 => c"e",
            DType::F32 => c"f",
            DType::F64 => c"d",
            other => {
                return Err(PyTypeError::new_err(format!(
                    "{other} has no buffer-protocol format: use DLPack (numpy.from_dlpack)"
                )))
            }
        };
        Ok(f)
    }
}

/// tensor_header(dtype, shape) -> bytes
///
/// The tensor header for `dtype` and `shape`: put it at the start of a message's user header
/// so that consumers' slots take that type and shape (docs/python.md).
#[pyfunction]
pub fn tensor_header<'py>(
    py: Python<'py>,
    dtype: &Bound<'py, PyAny>,
    shape: Vec<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let h = TensorHeader::new(parse_dtype(dtype)?, &shape);
    let mut buf = vec![0u8; h.encoded_len()];
    h.write(&mut buf).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inference() {
        assert_eq!(infer(&[1080, -1, 4], 1080 * 1920 * 4), Some(vec![1080, 1920, 4]));
        assert_eq!(infer(&[2, 3], 6), Some(vec![2, 3]));
        assert_eq!(infer(&[2, 3], 7), None);
        assert_eq!(infer(&[0, -1], 0), None);
        assert_eq!(infer(&[-1], 5), Some(vec![5]));
        assert_eq!(infer(&[4, -1], 6), None);
    }

    #[test]
    fn strides_are_c_order() {
        Python::initialize();
        let l = Layout::new(DType::U8, &[1080, 1920, 4]).unwrap();
        assert_eq!(l.shape(), [1080, 1920, 4]);
        assert_eq!(l.strides(), [1920 * 4, 4, 1]);
        assert_eq!(Layout::new(DType::U8, &[]).unwrap().strides(), [0i64; 0]);
        assert!(Layout::new(DType::U8, &[0, 1 << 63, 4]).is_err());
        assert!(Layout::new(DType::U8, &[1; MAX_DIMS + 1]).is_err());
        assert_eq!(Layout::bytes(7), Layout::new(DType::U8, &[7]).unwrap());
    }

    /// The cache answers for the same request, length and tensor header whatever follows
    /// that header, and resolves again when any of them changes.
    #[test]
    fn the_cache_keys_on_what_the_layout_depends_on() {
        Python::initialize();
        let frame = |n: u64, dims: &[u64]| {
            let mut header = [0u8; 64];
            let used = TensorHeader::new(DType::U8, dims).write(&mut header).unwrap();
            header[used..used + 8].copy_from_slice(&n.to_le_bytes());
            header
        };
        let cache = LayoutCache::default();
        let any = Wanted::default();
        let l = cache.resolve(&any, &frame(1, &[2, 3, 4]), 24).unwrap();
        assert_eq!(l.shape(), [2, 3, 4]);
        // The frame number after the tensor header is not part of the key.
        assert_eq!(any.header_key(&frame(1, &[2, 3, 4])), any.header_key(&frame(2, &[2, 3, 4])));
        assert_eq!(cache.resolve(&any, &frame(2, &[2, 3, 4]), 24).unwrap(), l);
        // Another tensor header, length or request: resolved anew.
        assert_eq!(cache.resolve(&any, &frame(3, &[6, 4]), 24).unwrap().shape(), [6, 4]);
        assert!(cache.resolve(&any, &frame(3, &[6, 4]), 25).is_err());
        let flat = Wanted { dtype: Some(DType::U8), shape: None };
        assert_eq!(flat.header_key(&frame(3, &[6, 4])), [0u8; 0]);
        assert_eq!(cache.resolve(&flat, &frame(3, &[6, 4]), 24).unwrap().shape(), [24]);
        // No tensor header: the bytes.
        assert_eq!(cache.resolve(&any, &[0u8; 64], 24).unwrap(), Layout::bytes(24));
    }
}
