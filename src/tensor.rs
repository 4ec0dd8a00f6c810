//! The tensor header: an optional convention for the first bytes of a message's user header
//! that says how to view the message as an n-dimensional array (its element type and shape).
//!
//! gpuring itself moves bytes and never reads it. Producers that write it let consumers build
//! typed tensors without being told the layout out of band: the Python package's slots
//! (docs/python.md) read it, so `torch.from_dlpack(slot)` of a 1080p RGBA frame is a
//! `uint8[1080, 1920, 4]` tensor.
//!
//! Encoding, little-endian, `8 + 8 * ndim` bytes at the start of the user header:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"GRTN"` |
//! | 4 | version, 1 |
//! | 5 | element type code, as DLPack's `DLDataTypeCode` (0 int, 1 uint, 2 float, 4 bfloat, 6 bool) |
//! | 6 | element bits (8, 16, 32 or 64) |
//! | 7 | ndim, 0..=8 |
//! | 8.. | ndim dimensions, u64 each, outermost first (C order) |
//!
//! The rest of the user header stays the application's.
//!
//! ```
//! use gpuring::tensor::{DType, TensorHeader};
//!
//! let frame = TensorHeader::new(DType::U8, &[1080, 1920, 4]);
//! let mut header = [0u8; 64];
//! let used = frame.write(&mut header)?;
//! header[used..used + 8].copy_from_slice(&7u64.to_le_bytes()); // the application's own field
//! assert_eq!(TensorHeader::read(&header)?, Some(frame));
//! # Ok::<(), gpuring::tensor::TensorHeaderError>(())
//! ```

use std::fmt;

/// An element type: DLPack's type code and bit width.
///
/// ```
/// use gpuring::tensor::DType;
/// assert_eq!(DType::from_name("float16"), Some(DType::F16));
/// assert_eq!(DType::F16.size(), 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    /// Invariant: one of the pairs in `NAMES`.
    code: u8,
    bits: u8,
}

/// Every supported type with its name (numpy's and PyTorch's spelling).
const NAMES: [(DType, &str); 13] = [
    (DType::BOOL, "bool"),
    (DType::U8, "uint8"),
    (DType::I8, "int8"),
    (DType::U16, "uint16"),
    (DType::I16, "int16"),
    (DType::U32, "uint32"),
    (DType::I32, "int32"),
    (DType::U64, "uint64"),
    (DType::I64, "int64"),
    (DType::F16, "float16"),
    (DType::BF16, "bfloat16"),
    (DType::F32, "float32"),
    (DType::F64, "float64"),
];

impl DType {
    /// `bool`, one byte per element.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::BOOL.name(), "bool");
    /// ```
    pub const BOOL: DType = DType { code: 6, bits: 8 };
    /// `uint8`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::U8.name(), "uint8");
    /// ```
    pub const U8: DType = DType { code: 1, bits: 8 };
    /// `int8`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::I8.name(), "int8");
    /// ```
    pub const I8: DType = DType { code: 0, bits: 8 };
    /// `uint16`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::U16.name(), "uint16");
    /// ```
    pub const U16: DType = DType { code: 1, bits: 16 };
    /// `int16`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::I16.name(), "int16");
    /// ```
    pub const I16: DType = DType { code: 0, bits: 16 };
    /// `uint32`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::U32.name(), "uint32");
    /// ```
    pub const U32: DType = DType { code: 1, bits: 32 };
    /// `int32`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::I32.name(), "int32");
    /// ```
    pub const I32: DType = DType { code: 0, bits: 32 };
    /// `uint64`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::U64.name(), "uint64");
    /// ```
    pub const U64: DType = DType { code: 1, bits: 64 };
    /// `int64`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::I64.name(), "int64");
    /// ```
    pub const I64: DType = DType { code: 0, bits: 64 };
    /// `float16` (IEEE half).
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::F16.name(), "float16");
    /// ```
    pub const F16: DType = DType { code: 2, bits: 16 };
    /// `bfloat16`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::BF16.name(), "bfloat16");
    /// ```
    pub const BF16: DType = DType { code: 4, bits: 16 };
    /// `float32`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::F32.name(), "float32");
    /// ```
    pub const F32: DType = DType { code: 2, bits: 32 };
    /// `float64`.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::F64.name(), "float64");
    /// ```
    pub const F64: DType = DType { code: 2, bits: 64 };

    /// The type with DLPack type code `code` and `bits` bits, if supported.
    ///
    /// ```
    /// use gpuring::tensor::DType;
    /// assert_eq!(DType::from_dlpack(2, 32), Some(DType::F32));
    /// assert_eq!(DType::from_dlpack(5, 64), None); // complex: not supported
    /// ```
    pub fn from_dlpack(code: u8, bits: u8) -> Option<DType> {
        NAMES.iter().map(|(t, _)| *t).find(|t| t.code == code && t.bits == bits)
    }

    /// The type named `name` (`"uint8"`, `"float32"`, ...; a `torch.` prefix is ignored).
    ///
    /// ```
    /// use gpuring::tensor::DType;
    /// assert_eq!(DType::from_name("torch.bfloat16"), Some(DType::BF16));
    /// assert_eq!(DType::from_name("complex64"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<DType> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        NAMES.iter().find(|(_, n)| *n == name).map(|(t, _)| *t)
    }

    /// The type's name, as numpy and PyTorch spell it.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::U8.name(), "uint8");
    /// ```
    pub fn name(self) -> &'static str {
        NAMES.iter().find(|(t, _)| *t == self).map_or("?", |(_, n)| n)
    }

    /// DLPack's type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4, `kDLBool` 6).
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::BF16.code(), 4);
    /// ```
    pub fn code(self) -> u8 {
        self.code
    }

    /// Bits per element.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::F32.bits(), 32);
    /// ```
    pub fn bits(self) -> u8 {
        self.bits
    }

    /// Bytes per element.
    ///
    /// ```
    /// assert_eq!(gpuring::tensor::DType::I64.size(), 8);
    /// ```
    pub fn size(self) -> usize {
        self.bits as usize / 8
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type and a C-order shape, as written at the start of a user header.
///
/// ```
/// use gpuring::tensor::{DType, TensorHeader};
/// let t = TensorHeader::new(DType::F32, &[2, 3]);
/// assert_eq!(t.nbytes(), Some(24));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorHeader {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first; at most [`MAX_DIMS`](TensorHeader::MAX_DIMS) of them.
    pub shape: Vec<u64>,
}

/// Why a tensor header could not be written or read.
///
/// ```
/// use gpuring::tensor::{DType, TensorHeader, TensorHeaderError};
/// let t = TensorHeader::new(DType::U8, &[1080, 1920, 4]);
/// assert_eq!(t.write(&mut [0u8; 16]), Err(TensorHeaderError::TooSmall { need: 32, have: 16 }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorHeaderError {
    /// The user header is shorter than the encoding.
    TooSmall {
        /// Bytes the encoding takes.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// More dimensions than [`TensorHeader::MAX_DIMS`].
    TooManyDims(usize),
    /// A version other than 1.
    Version(u8),
    /// A type code and bit width this version does not know.
    UnknownDType {
        /// DLPack type code.
        code: u8,
        /// Bits.
        bits: u8,
    },
}

impl fmt::Display for TensorHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorHeaderError::TooSmall { need, have } => {
                write!(f, "the tensor header needs {need} bytes of user header, there are {have}")
            }
            TensorHeaderError::TooManyDims(n) => {
                write!(
                    f,
                    "{n} dimensions; a tensor header holds at most {}",
                    TensorHeader::MAX_DIMS
                )
            }
            TensorHeaderError::Version(v) => write!(f, "tensor header version {v}, expected 1"),
            TensorHeaderError::UnknownDType { code, bits } => {
                write!(f, "unknown element type (DLPack code {code}, {bits} bits)")
            }
        }
    }
}

impl std::error::Error for TensorHeaderError {}

impl TensorHeader {
    /// The first four bytes of an encoded header.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let mut buf = [0u8; 8];
    /// TensorHeader::new(DType::U8, &[]).write(&mut buf)?;
    /// assert_eq!(buf[..4], TensorHeader::MAGIC);
    /// # Ok::<(), gpuring::tensor::TensorHeaderError>(())
    /// ```
    pub const MAGIC: [u8; 4] = *b"GRTN";
    /// The most dimensions a header holds.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let too_many = TensorHeader::new(DType::U8, &[1; TensorHeader::MAX_DIMS + 1]);
    /// assert!(too_many.write(&mut [0u8; 128]).is_err());
    /// ```
    pub const MAX_DIMS: usize = 8;
    const VERSION: u8 = 1;

    /// A header for a tensor of `dtype` and `shape`.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let frame = TensorHeader::new(DType::U8, &[1080, 1920, 4]);
    /// assert_eq!(frame.encoded_len(), 32);
    /// ```
    pub fn new(dtype: DType, shape: &[u64]) -> TensorHeader {
        TensorHeader { dtype, shape: shape.to_vec() }
    }

    /// Bytes the encoding takes: `8 + 8 * ndim`.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// assert_eq!(TensorHeader::new(DType::F32, &[]).encoded_len(), 8);
    /// ```
    pub fn encoded_len(&self) -> usize {
        8 + 8 * self.shape.len()
    }

    /// Bytes of a message of this type and shape; `None` if that overflows.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// assert_eq!(TensorHeader::new(DType::U8, &[1080, 1920, 4]).nbytes(), Some(8_294_400));
    /// assert_eq!(TensorHeader::new(DType::F64, &[u64::MAX]).nbytes(), None);
    /// ```
    pub fn nbytes(&self) -> Option<u64> {
        self.shape.iter().try_fold(self.dtype.size() as u64, |n, d| n.checked_mul(*d))
    }

    /// Encodes the header at the start of `buf`, returning the bytes used.
    ///
    /// ```
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let mut header = [0u8; 32];
    /// assert_eq!(TensorHeader::new(DType::U8, &[1080, 1920, 4]).write(&mut header), Ok(32));
    /// assert_eq!(&header[..4], b"GRTN");
    /// ```
    pub fn write(&self, buf: &mut [u8]) -> Result<usize, TensorHeaderError> {
        let ndim = self.shape.len();
        if ndim > Self::MAX_DIMS {
            return Err(TensorHeaderError::TooManyDims(ndim));
        }
        let need = self.encoded_len();
        let Some(out) = buf.get_mut(..need) else {
            return Err(TensorHeaderError::TooSmall { need, have: buf.len() });
        };
        out[..4].copy_from_slice(&Self::MAGIC);
        out[4..8].copy_from_slice(&[Self::VERSION, self.dtype.code, self.dtype.bits, ndim as u8]);
        for (d, chunk) in self.shape.iter().zip(out[8..].chunks_exact_mut(8)) {
            chunk.copy_from_slice(&d.to_le_bytes());
        }
        Ok(need)
    }

    /// Decodes a header from the start of `buf` (a message's user header, which is untrusted
    /// and checked here): `Ok(None)` if it does not start with the magic.
    ///
    /// ```
    /// use gpuring::tensor::TensorHeader;
    /// assert_eq!(TensorHeader::read(&[0u8; 32]), Ok(None)); // no tensor header
    /// ```
    pub fn read(buf: &[u8]) -> Result<Option<TensorHeader>, TensorHeaderError> {
        if buf.get(..4) != Some(&Self::MAGIC[..]) {
            return Ok(None);
        }
        let Some(&[version, code, bits, ndim]) = buf.get(4..8) else {
            return Err(TensorHeaderError::TooSmall { need: 8, have: buf.len() });
        };
        if version != Self::VERSION {
            return Err(TensorHeaderError::Version(version));
        }
        let dtype =
            DType::from_dlpack(code, bits).ok_or(TensorHeaderError::UnknownDType { code, bits })?;
        let ndim = ndim as usize;
        if ndim > Self::MAX_DIMS {
            return Err(TensorHeaderError::TooManyDims(ndim));
        }
        let need = 8 + 8 * ndim;
        let dims = buf.get(8..need).ok_or(TensorHeaderError::TooSmall { need, have: buf.len() })?;
        let shape = dims
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
        Ok(Some(TensorHeader { dtype, shape }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_by_name_and_code() {
        for (t, name) in NAMES {
            assert_eq!(DType::from_name(name), Some(t));
            assert_eq!(DType::from_dlpack(t.code(), t.bits()), Some(t));
            assert_eq!(t.name(), name);
        }
    }

    #[test]
    fn headers_round_trip_for_every_rank() {
        for ndim in 0..=TensorHeader::MAX_DIMS {
            let shape: Vec<u64> = (1..=ndim as u64).map(|d| d * 1000 + 7).collect();
            let t = TensorHeader::new(DType::BF16, &shape);
            let mut buf = vec![0xAA; t.encoded_len()];
            assert_eq!(t.write(&mut buf), Ok(buf.len()));
            assert_eq!(TensorHeader::read(&buf), Ok(Some(t.clone())));
            // Any truncation is refused, never read past the end.
            for cut in 4..buf.len() {
                assert!(TensorHeader::read(&buf[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn hostile_headers_are_refused() {
        let mut buf = [0u8; 128];
        TensorHeader::new(DType::U8, &[4]).write(&mut buf).unwrap();
        let mut bad = buf;
        bad[4] = 2;
        assert_eq!(TensorHeader::read(&bad), Err(TensorHeaderError::Version(2)));
        let mut bad = buf;
        bad[5] = 9;
        assert_eq!(
            TensorHeader::read(&bad),
            Err(TensorHeaderError::UnknownDType { code: 9, bits: 8 })
        );
        let mut bad = buf;
        bad[7] = 200;
        assert_eq!(TensorHeader::read(&bad), Err(TensorHeaderError::TooManyDims(200)));
        let nine = TensorHeader::new(DType::U8, &[1; 9]);
        assert_eq!(nine.write(&mut buf), Err(TensorHeaderError::TooManyDims(9)));
    }
}
