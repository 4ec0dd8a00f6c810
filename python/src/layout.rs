//! How a message's bytes are viewed: element type and C-order shape. From the slot's `view`,
//! else the consumer's `dtype`/`shape` arguments, else the tensor header at the start of the
//! user header (`gpuring::tensor`), else a 1-D `uint8` array of the message's bytes.

use std::ffi::CStr;

use gpuring::tensor::{DType, TensorHeader};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// What the user asked for: either part may be left to the header or to the default.
#[derive(Clone, Debug, Default)]
pub struct Wanted {
    pub dtype: Option<DType>,
    /// Invariant: at most one `-1` (inferred), every other entry >= 0.
    pub shape: Option<Vec<i64>>,
}

/// A resolved layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dtype: DType,
    /// Invariant: the product of the dims times the element size is the message's length.
    pub shape: Vec<u64>,
}

impl Wanted {
    /// From Python arguments: `dtype` a name (`"uint8"`), a torch or numpy dtype (their `str`),
    /// or None; `shape` a sequence of ints, one of which may be -1, or None.
    pub fn from_args(dtype: Option<&Bound<'_, PyAny>>, shape: Option<Vec<i64>>) -> PyResult<Self> {
        let dtype = dtype.filter(|d| !d.is_none()).map(parse_dtype).transpose()?;
        if let Some(shape) = &shape {
            if shape.iter().filter(|d| **d == -1).count() > 1 || shape.iter().any(|d| *d < -1) {
                return Err(PyValueError::new_err(format!(
                    "shape {shape:?}: dimensions must be >= 0, with at most one -1"
                )));
            }
            if shape.len() > TensorHeader::MAX_DIMS {
                return Err(PyValueError::new_err(format!(
                    "shape {shape:?}: at most {} dimensions",
                    TensorHeader::MAX_DIMS
                )));
            }
        }
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
                return Layout { dtype: h.dtype, shape: h.shape }.checked();
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
        let shape = match &self.shape {
            None => vec![elements],
            Some(dims) => infer(dims, elements).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "shape {dims:?} of {dtype} does not fit a message of {len} bytes"
                ))
            })?,
        };
        Layout { dtype, shape }.checked()
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
    /// Refuses shapes whose strides would not fit in the i64 that DLPack and Python use (a
    /// header may say `(0, 2**63, 4)` of an empty message).
    fn checked(self) -> PyResult<Layout> {
        let fits = self
            .shape
            .iter()
            .filter(|d| **d > 0)
            .try_fold(self.dtype.size() as i64, |n, d| n.checked_mul(i64::try_from(*d).ok()?));
        match fits {
            Some(_) => Ok(self),
            None => Err(PyValueError::new_err(format!("shape {:?} is too large", self.shape))),
        }
    }

    /// `len` bytes, as a 1-D `uint8` array.
    pub fn bytes(len: usize) -> Layout {
        Layout { dtype: DType::U8, shape: vec![len as u64] }
    }

    /// C-order strides, in elements.
    pub fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.shape[i + 1] as i64;
        }
        strides
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
        let l = Layout { dtype: DType::U8, shape: vec![1080, 1920, 4] };
        assert_eq!(l.strides(), vec![1920 * 4, 4, 1]);
    }
}
