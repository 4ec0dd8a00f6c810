//! The batch table: what a batch says about each camera, in the message's user header after
//! the tensor header.
//!
//! Little-endian. The tensor header ([`crate::tensor`], shape `[K, frame…]`) is at byte 0; the
//! table starts at byte [`BatchTable::OFFSET`] (128):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"GRBT"` |
//! | 4 | version, 1 |
//! | 5..8 | reserved, 0 |
//! | 8..12 | K, the number of cameras |
//! | 12..16 | reserved, 0 |
//! | 16..24 | the batch's number, from 0 for each batcher that starts |
//! | 24..32 | when the batch was closed (CLOCK_MONOTONIC ns, as message timestamps) |
//! | 32 + 40k .. | camera k's entry, 40 bytes: |
//! | +0..8 | the input sequence number of the frame in its place (0 if none) |
//! | +8..16 | that frame's producer timestamp (CLOCK_MONOTONIC ns; 0 if none) |
//! | +16..24 | frames of this camera the batcher did not put in any batch since the last one it did (its input's `lag`, summed) |
//! | +24..32 | the epoch of the camera's producer instance (0 if none was ever seen) |
//! | +32..36 | the state: 0 absent, 1 present, 2 stale, 3 refused |
//! | +36..40 | reserved, 0 |
//!
//! So a batch of K cameras needs a user header of `128 + 32 + 40 K` bytes
//! ([`BatchTable::header_size`]).

use std::fmt;

use crate::tensor::TensorHeader;

/// A camera's place in a batch.
///
/// ```
/// use gpuring::batch::CameraState;
/// assert_eq!(CameraState::Stale.to_string(), "stale");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CameraState {
    /// No producer: dead, not started yet, or gone. Its place holds zeros.
    Absent,
    /// A frame that no earlier batch carried.
    Present,
    /// Its producer lives but sent nothing new since the last batch: its place holds the
    /// frame it held in the last batch (or zeros, as the batcher was told).
    Stale,
    /// Its producer sends frames of another shape, element type or memory kind than the
    /// batch's: none of them is used. Its place holds zeros.
    Refused,
}

impl CameraState {
    /// Its code in the table.
    ///
    /// ```
    /// assert_eq!(gpuring::batch::CameraState::Present.code(), 1);
    /// ```
    pub fn code(self) -> u32 {
        match self {
            CameraState::Absent => 0,
            CameraState::Present => 1,
            CameraState::Stale => 2,
            CameraState::Refused => 3,
        }
    }

    /// The state of code `code`, if there is one.
    ///
    /// ```
    /// use gpuring::batch::CameraState;
    /// assert_eq!(CameraState::from_code(3), Some(CameraState::Refused));
    /// assert_eq!(CameraState::from_code(4), None);
    /// ```
    pub fn from_code(code: u32) -> Option<CameraState> {
        match code {
            0 => Some(CameraState::Absent),
            1 => Some(CameraState::Present),
            2 => Some(CameraState::Stale),
            3 => Some(CameraState::Refused),
            _ => None,
        }
    }

    /// Its name, as `gpuring stat` and the docs say it.
    ///
    /// ```
    /// assert_eq!(gpuring::batch::CameraState::Absent.name(), "absent");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            CameraState::Absent => "absent",
            CameraState::Present => "present",
            CameraState::Stale => "stale",
            CameraState::Refused => "refused",
        }
    }
}

impl fmt::Display for CameraState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One camera's entry in a batch.
///
/// ```
/// use gpuring::batch::{CameraEntry, CameraState};
/// let e = CameraEntry { seq: 9, timestamp_ns: 5, skipped: 1, epoch: 2, state: CameraState::Present };
/// assert!(e.has_frame());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CameraEntry {
    /// The input sequence number of the frame in its place (0 if none).
    pub seq: u64,
    /// That frame's producer timestamp, CLOCK_MONOTONIC ns (0 if none).
    pub timestamp_ns: u64,
    /// Frames of this camera that no batch carried, since the last batch that carried one.
    pub skipped: u64,
    /// The epoch of the camera's producer instance (0 if none was ever seen): it changes when
    /// the producer restarts.
    pub epoch: u64,
    /// What its place holds.
    pub state: CameraState,
}

impl CameraEntry {
    /// An entry of a camera never seen: absent, nothing in its place.
    ///
    /// ```
    /// use gpuring::batch::{CameraEntry, CameraState};
    /// assert_eq!(CameraEntry::NONE.state, CameraState::Absent);
    /// ```
    pub const NONE: CameraEntry =
        CameraEntry { seq: 0, timestamp_ns: 0, skipped: 0, epoch: 0, state: CameraState::Absent };

    /// Whether its place holds one of its frames (the one `seq` names).
    ///
    /// ```
    /// assert!(!gpuring::batch::CameraEntry::NONE.has_frame()); // its place holds zeros
    /// ```
    pub fn has_frame(&self) -> bool {
        self.timestamp_ns != 0
    }
}

/// The table of one batch.
///
/// ```
/// use gpuring::batch::{BatchTable, CameraEntry, CameraState};
/// use gpuring::tensor::{DType, TensorHeader};
///
/// let mut cams = vec![CameraEntry::NONE; 2];
/// cams[1] = CameraEntry { seq: 7, timestamp_ns: 1_000, skipped: 0, epoch: 3, state: CameraState::Present };
/// let table = BatchTable { batch: 5, closed_ns: 2_000, cameras: cams };
/// let mut header = vec![0u8; BatchTable::header_size(2)];
/// TensorHeader::new(DType::U8, &[2, 720, 1280, 3]).write(&mut header)?; // [K, frame...]
/// table.write(&mut header)?;
/// assert_eq!(BatchTable::read(&header)?, Some(table));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchTable {
    /// The batch's number, from 0 for each batcher that starts.
    pub batch: u64,
    /// When the batch was closed, CLOCK_MONOTONIC ns.
    pub closed_ns: u64,
    /// One entry per camera, in the order of the batcher's inputs (the tensor's first index).
    pub cameras: Vec<CameraEntry>,
}

/// Why [`BatchTable::write`] could not write a table.
///
/// ```
/// use gpuring::batch::{BatchTable, TableWriteError};
/// let t = BatchTable { batch: 0, closed_ns: 0, cameras: vec![] };
/// assert!(matches!(t.write(&mut [0u8; 16]), Err(TableWriteError::TooSmall { need: 160, have: 16 })));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableWriteError {
    /// The user header is shorter than the table.
    TooSmall {
        /// Bytes the table takes, from the start of the user header.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// More cameras than [`BatchTable::MAX_CAMERAS`].
    TooManyCameras(usize),
}

impl fmt::Display for TableWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableWriteError::TooSmall { need, have } => {
                write!(f, "the batch table needs {need} bytes of user header, there are {have}")
            }
            TableWriteError::TooManyCameras(k) => {
                write!(f, "{k} cameras; a batch holds at most {}", BatchTable::MAX_CAMERAS)
            }
        }
    }
}

impl std::error::Error for TableWriteError {}

/// Why [`BatchTable::read`] found a table it cannot trust (a user header comes from shared
/// memory: anything may be there).
///
/// ```
/// use gpuring::batch::{BatchTable, CameraEntry, TableReadError};
/// let mut h = vec![0u8; BatchTable::header_size(1)];
/// BatchTable { batch: 0, closed_ns: 0, cameras: vec![CameraEntry::NONE] }.write(&mut h)?;
/// h[BatchTable::OFFSET + 4] = 9; // a version this reader does not know
/// assert_eq!(BatchTable::read(&h), Err(TableReadError::Version(9)));
/// # Ok::<(), gpuring::batch::TableWriteError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableReadError {
    /// The user header is shorter than the table it announces.
    TooSmall {
        /// Bytes the table takes, from the start of the user header.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A version other than 1.
    Version(u8),
    /// A camera count of 0, or over [`BatchTable::MAX_CAMERAS`].
    Cameras(u32),
    /// The tensor header's first dimension is not the camera count.
    Shape {
        /// The tensor header's first dimension (0 if it has none).
        tensor: u64,
        /// The table's camera count.
        cameras: u32,
    },
    /// A reserved byte is not 0 (at this offset in the user header).
    Reserved(usize),
    /// A camera's entry no version 1 writer writes: an unknown state code, or a frame's
    /// timestamp in the place of an absent or refused camera.
    Entry {
        /// The camera.
        camera: usize,
    },
}

impl fmt::Display for TableReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableReadError::TooSmall { need, have } => {
                write!(f, "the batch table needs {need} bytes of user header, there are {have}")
            }
            TableReadError::Version(v) => write!(f, "batch table version {v}, expected 1"),
            TableReadError::Cameras(k) => {
                write!(f, "{k} cameras; a batch holds 1 to {}", BatchTable::MAX_CAMERAS)
            }
            TableReadError::Shape { tensor, cameras } => {
                write!(f, "the tensor is {tensor} frames long, the table names {cameras} cameras")
            }
            TableReadError::Reserved(at) => write!(f, "reserved byte {at} is not 0"),
            TableReadError::Entry { camera } => {
                write!(f, "camera {camera}'s entry is none a version 1 batcher writes")
            }
        }
    }
}

impl std::error::Error for TableReadError {}

impl BatchTable {
    /// The first four bytes of the table.
    ///
    /// ```
    /// use gpuring::batch::BatchTable;
    /// let mut h = vec![0u8; BatchTable::header_size(1)];
    /// BatchTable { batch: 0, closed_ns: 0, cameras: vec![gpuring::batch::CameraEntry::NONE] }.write(&mut h)?;
    /// assert_eq!(h[BatchTable::OFFSET..BatchTable::OFFSET + 4], BatchTable::MAGIC);
    /// # Ok::<(), gpuring::batch::TableWriteError>(())
    /// ```
    pub const MAGIC: [u8; 4] = *b"GRBT";
    /// Where the table starts in the user header (the tensor header comes first).
    ///
    /// ```
    /// assert_eq!(gpuring::batch::BatchTable::OFFSET, 128);
    /// ```
    pub const OFFSET: usize = 128;
    /// The most cameras a batch holds.
    ///
    /// ```
    /// use gpuring::batch::{BatchTable, CameraEntry};
    /// let t = BatchTable { batch: 0, closed_ns: 0, cameras: vec![CameraEntry::NONE; BatchTable::MAX_CAMERAS + 1] };
    /// assert!(t.write(&mut vec![0u8; 1 << 20]).is_err());
    /// ```
    pub const MAX_CAMERAS: usize = 1024;
    const VERSION: u8 = 1;
    const HEAD: usize = 32;
    const ENTRY: usize = 40;

    /// The user header size a batch of `cameras` cameras needs: the tensor header's 128 bytes,
    /// then the table.
    ///
    /// ```
    /// assert_eq!(gpuring::batch::BatchTable::header_size(8), 480);
    /// ```
    pub fn header_size(cameras: usize) -> usize {
        Self::OFFSET + Self::HEAD + Self::ENTRY * cameras
    }

    /// Writes the table into user header `header` (at [`OFFSET`](Self::OFFSET)).
    ///
    /// ```
    /// use gpuring::batch::{BatchTable, CameraEntry};
    /// let mut h = vec![0u8; BatchTable::header_size(2)];
    /// BatchTable { batch: 1, closed_ns: 10, cameras: vec![CameraEntry::NONE; 2] }.write(&mut h)?;
    /// # Ok::<(), gpuring::batch::TableWriteError>(())
    /// ```
    pub fn write(&self, header: &mut [u8]) -> Result<(), TableWriteError> {
        let k = self.cameras.len();
        if k > Self::MAX_CAMERAS {
            return Err(TableWriteError::TooManyCameras(k));
        }
        let need = Self::header_size(k);
        let Some(t) = header.get_mut(Self::OFFSET..need) else {
            return Err(TableWriteError::TooSmall { need, have: header.len() });
        };
        t.fill(0);
        t[0..4].copy_from_slice(&Self::MAGIC);
        t[4] = Self::VERSION;
        t[8..12].copy_from_slice(&(k as u32).to_le_bytes());
        t[16..24].copy_from_slice(&self.batch.to_le_bytes());
        t[24..32].copy_from_slice(&self.closed_ns.to_le_bytes());
        for (c, e) in self.cameras.iter().enumerate() {
            let at = Self::HEAD + Self::ENTRY * c;
            let w = &mut t[at..at + Self::ENTRY];
            w[0..8].copy_from_slice(&e.seq.to_le_bytes());
            w[8..16].copy_from_slice(&e.timestamp_ns.to_le_bytes());
            w[16..24].copy_from_slice(&e.skipped.to_le_bytes());
            w[24..32].copy_from_slice(&e.epoch.to_le_bytes());
            w[32..36].copy_from_slice(&e.state.code().to_le_bytes());
        }
        Ok(())
    }

    /// Reads the table of user header `header`: `Ok(None)` if it has none (no magic at
    /// [`OFFSET`](Self::OFFSET)). Everything is checked, the tensor header's first dimension
    /// against the camera count too: a header from shared memory may hold anything.
    ///
    /// ```
    /// use gpuring::batch::BatchTable;
    /// assert_eq!(BatchTable::read(&[0u8; 256]), Ok(None)); // a message that is not a batch
    /// ```
    pub fn read(header: &[u8]) -> Result<Option<BatchTable>, TableReadError> {
        let Some(t) = header.get(Self::OFFSET..) else { return Ok(None) };
        if t.len() < 4 || t[0..4] != Self::MAGIC {
            return Ok(None);
        }
        let have = header.len();
        if t.len() < Self::HEAD {
            return Err(TableReadError::TooSmall { need: Self::header_size(0), have });
        }
        if t[4] != Self::VERSION {
            return Err(TableReadError::Version(t[4]));
        }
        let zeros = |at: std::ops::Range<usize>| match t[at.clone()].iter().position(|&b| b != 0) {
            Some(i) => Err(TableReadError::Reserved(Self::OFFSET + at.start + i)),
            None => Ok(()),
        };
        zeros(5..8)?;
        zeros(12..16)?;
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let k = u32::from_le_bytes(t[8..12].try_into().unwrap());
        if k == 0 || k as usize > Self::MAX_CAMERAS {
            return Err(TableReadError::Cameras(k));
        }
        let need = Self::header_size(k as usize);
        if have < need {
            return Err(TableReadError::TooSmall { need, have });
        }
        let tensor = match TensorHeader::read(header) {
            Ok(Some(th)) => th.shape.first().copied().unwrap_or(0),
            _ => 0,
        };
        if tensor != k as u64 {
            return Err(TableReadError::Shape { tensor, cameras: k });
        }
        let mut cameras = Vec::with_capacity(k as usize);
        for c in 0..k as usize {
            let at = Self::HEAD + Self::ENTRY * c;
            let w = &t[at..at + Self::ENTRY];
            zeros(at + 36..at + 40)?;
            let code = u32::from_le_bytes(w[32..36].try_into().unwrap());
            let bad = TableReadError::Entry { camera: c };
            let state = CameraState::from_code(code).ok_or(bad.clone())?;
            let e = CameraEntry {
                seq: u64_at(w, 0),
                timestamp_ns: u64_at(w, 8),
                skipped: u64_at(w, 16),
                epoch: u64_at(w, 24),
                state,
            };
            let no_frame = matches!(state, CameraState::Absent | CameraState::Refused);
            if (no_frame && e.has_frame()) || (state == CameraState::Present && !e.has_frame()) {
                return Err(bad);
            }
            cameras.push(e);
        }
        Ok(Some(BatchTable { batch: u64_at(t, 16), closed_ns: u64_at(t, 24), cameras }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn sample(k: usize) -> BatchTable {
        let states =
            [CameraState::Absent, CameraState::Present, CameraState::Stale, CameraState::Refused];
        let cameras = (0..k)
            .map(|c| {
                let state = states[c % 4];
                let frame = matches!(state, CameraState::Present | CameraState::Stale);
                CameraEntry {
                    seq: c as u64 * 11,
                    timestamp_ns: if frame { 1 + c as u64 } else { 0 },
                    skipped: c as u64 % 3,
                    epoch: 100 + c as u64,
                    state,
                }
            })
            .collect();
        BatchTable { batch: 42, closed_ns: 77, cameras }
    }

    /// A user header with a `[k, 2, 2]` tensor header and `t` written after it.
    fn header(t: &BatchTable) -> Vec<u8> {
        let k = t.cameras.len();
        let mut h = vec![0u8; BatchTable::header_size(k)];
        TensorHeader::new(DType::U8, &[k as u64, 2, 2]).write(&mut h).unwrap();
        t.write(&mut h).unwrap();
        h
    }

    #[test]
    fn tables_round_trip() {
        for k in [1, 4, 9] {
            let t = sample(k);
            assert_eq!(BatchTable::read(&header(&t)).unwrap(), Some(t));
        }
    }

    #[test]
    fn damaged_tables_are_refused() {
        let t = sample(4);
        let mut short = vec![0u8; 200];
        let need = BatchTable::header_size(4);
        assert_eq!(t.write(&mut short), Err(TableWriteError::TooSmall { need, have: 200 }));
        let h = header(&t);
        assert_eq!(BatchTable::read(&h[..100]), Ok(None));
        assert!(matches!(BatchTable::read(&h[..200]), Err(TableReadError::TooSmall { .. })));
        let o = BatchTable::OFFSET;
        let damaged = |at: usize, bytes: &[u8]| {
            let mut bad = h.clone();
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            BatchTable::read(&bad)
        };
        assert_eq!(damaged(o + 4, &[2]), Err(TableReadError::Version(2)));
        assert_eq!(damaged(o + 8, &u32::MAX.to_le_bytes()), Err(TableReadError::Cameras(u32::MAX)));
        assert_eq!(damaged(o + 8, &0u32.to_le_bytes()), Err(TableReadError::Cameras(0)));
        let three = damaged(o + 8, &3u32.to_le_bytes());
        assert_eq!(three, Err(TableReadError::Shape { tensor: 4, cameras: 3 }));
        assert_eq!(damaged(o + 6, &[1]), Err(TableReadError::Reserved(o + 6)));
        assert_eq!(
            damaged(o + 32 + 40 + 37, &[1]),
            Err(TableReadError::Reserved(o + 32 + 40 + 37))
        );
        let state = o + 32 + 40 + 32;
        assert_eq!(damaged(state, &9u32.to_le_bytes()), Err(TableReadError::Entry { camera: 1 }));
        // Camera 0 is absent: a frame's timestamp in its place is not a version 1 table.
        assert_eq!(damaged(o + 32 + 8, &[5]), Err(TableReadError::Entry { camera: 0 }));
        // Camera 1 is present: it must have one.
        assert_eq!(damaged(o + 32 + 40 + 8, &[0; 8]), Err(TableReadError::Entry { camera: 1 }));
        assert_eq!(BatchTable::read(&[0u8; 400]), Ok(None));
    }
}
