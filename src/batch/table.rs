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

/// A camera's place in a batch.
///
/// ```
/// use gpuring::batch::CameraState;
/// assert_eq!(CameraState::Stale.to_string(), "stale");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CameraState {
    /// No producer: dead, not started yet, or gone. Its place holds zeros, or its last frame
    /// if the batcher fills with the previous batch and one was ever seen.
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
///
/// let mut cams = vec![CameraEntry::NONE; 2];
/// cams[1] = CameraEntry { seq: 7, timestamp_ns: 1_000, skipped: 0, epoch: 3, state: CameraState::Present };
/// let table = BatchTable { batch: 5, closed_ns: 2_000, cameras: cams };
/// let mut header = vec![0u8; BatchTable::header_size(2)];
/// table.write(&mut header)?;
/// assert_eq!(BatchTable::read(&header)?, Some(table));
/// # Ok::<(), gpuring::batch::BatchTableError>(())
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

/// Why a batch table could not be written or read.
///
/// ```
/// use gpuring::batch::{BatchTable, BatchTableError};
/// let t = BatchTable { batch: 0, closed_ns: 0, cameras: vec![] };
/// assert!(matches!(t.write(&mut [0u8; 16]), Err(BatchTableError::TooSmall { need: 160, have: 16 })));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchTableError {
    /// The user header is shorter than the table.
    TooSmall {
        /// Bytes the table takes, from the start of the user header.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A version other than 1.
    Version(u8),
    /// A camera count over [`BatchTable::MAX_CAMERAS`].
    TooManyCameras(u32),
    /// A camera's state code that no version 1 writer writes.
    State {
        /// The camera.
        camera: usize,
        /// The code found.
        code: u32,
    },
}

impl fmt::Display for BatchTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchTableError::TooSmall { need, have } => {
                write!(f, "the batch table needs {need} bytes of user header, there are {have}")
            }
            BatchTableError::Version(v) => write!(f, "batch table version {v}, expected 1"),
            BatchTableError::TooManyCameras(k) => {
                write!(f, "{k} cameras; a batch holds at most {}", BatchTable::MAX_CAMERAS)
            }
            BatchTableError::State { camera, code } => {
                write!(f, "camera {camera} has state code {code}, which is none of 0..=3")
            }
        }
    }
}

impl std::error::Error for BatchTableError {}

impl BatchTable {
    /// The first four bytes of the table.
    ///
    /// ```
    /// use gpuring::batch::BatchTable;
    /// let mut h = vec![0u8; BatchTable::header_size(1)];
    /// BatchTable { batch: 0, closed_ns: 0, cameras: vec![gpuring::batch::CameraEntry::NONE] }.write(&mut h)?;
    /// assert_eq!(h[BatchTable::OFFSET..BatchTable::OFFSET + 4], BatchTable::MAGIC);
    /// # Ok::<(), gpuring::batch::BatchTableError>(())
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
    /// # Ok::<(), gpuring::batch::BatchTableError>(())
    /// ```
    pub fn write(&self, header: &mut [u8]) -> Result<(), BatchTableError> {
        let k = self.cameras.len();
        if k > Self::MAX_CAMERAS {
            return Err(BatchTableError::TooManyCameras(k as u32));
        }
        let need = Self::header_size(k);
        let Some(t) = header.get_mut(Self::OFFSET..need) else {
            return Err(BatchTableError::TooSmall { need, have: header.len() });
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
    /// [`OFFSET`](Self::OFFSET)). Everything is checked: a header from shared memory may hold
    /// anything.
    ///
    /// ```
    /// use gpuring::batch::BatchTable;
    /// assert_eq!(BatchTable::read(&[0u8; 256]), Ok(None)); // a message that is not a batch
    /// ```
    pub fn read(header: &[u8]) -> Result<Option<BatchTable>, BatchTableError> {
        let Some(t) = header.get(Self::OFFSET..) else { return Ok(None) };
        if t.len() < 4 || t[0..4] != Self::MAGIC {
            return Ok(None);
        }
        let have = header.len();
        if t.len() < Self::HEAD {
            return Err(BatchTableError::TooSmall { need: Self::header_size(0), have });
        }
        if t[4] != Self::VERSION {
            return Err(BatchTableError::Version(t[4]));
        }
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let k = u32::from_le_bytes(t[8..12].try_into().unwrap());
        if k as usize > Self::MAX_CAMERAS {
            return Err(BatchTableError::TooManyCameras(k));
        }
        let need = Self::header_size(k as usize);
        if have < need {
            return Err(BatchTableError::TooSmall { need, have });
        }
        let mut cameras = Vec::with_capacity(k as usize);
        for c in 0..k as usize {
            let at = Self::HEAD + Self::ENTRY * c;
            let w = &t[at..at + Self::ENTRY];
            let code = u32::from_le_bytes(w[32..36].try_into().unwrap());
            let state =
                CameraState::from_code(code).ok_or(BatchTableError::State { camera: c, code })?;
            cameras.push(CameraEntry {
                seq: u64_at(w, 0),
                timestamp_ns: u64_at(w, 8),
                skipped: u64_at(w, 16),
                epoch: u64_at(w, 24),
                state,
            });
        }
        Ok(Some(BatchTable { batch: u64_at(t, 16), closed_ns: u64_at(t, 24), cameras }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(k: usize) -> BatchTable {
        let states =
            [CameraState::Absent, CameraState::Present, CameraState::Stale, CameraState::Refused];
        let cameras = (0..k)
            .map(|c| CameraEntry {
                seq: c as u64 * 11,
                timestamp_ns: 1 + c as u64,
                skipped: c as u64 % 3,
                epoch: 100 + c as u64,
                state: states[c % 4],
            })
            .collect();
        BatchTable { batch: 42, closed_ns: 77, cameras }
    }

    #[test]
    fn tables_round_trip() {
        for k in [0, 1, 4, 9] {
            let t = sample(k);
            let mut h = vec![0xAAu8; BatchTable::header_size(k)];
            t.write(&mut h).unwrap();
            assert_eq!(BatchTable::read(&h).unwrap(), Some(t));
        }
    }

    #[test]
    fn damaged_tables_are_refused() {
        let t = sample(4);
        let mut h = vec![0u8; BatchTable::header_size(4)];
        assert_eq!(
            t.write(&mut h[..200]),
            Err(BatchTableError::TooSmall { need: BatchTable::header_size(4), have: 200 })
        );
        t.write(&mut h).unwrap();
        assert_eq!(BatchTable::read(&h[..100]), Ok(None));
        assert!(matches!(BatchTable::read(&h[..200]), Err(BatchTableError::TooSmall { .. })));
        let mut bad = h.clone();
        bad[BatchTable::OFFSET + 4] = 2;
        assert_eq!(BatchTable::read(&bad), Err(BatchTableError::Version(2)));
        let mut bad = h.clone();
        bad[BatchTable::OFFSET + 8..BatchTable::OFFSET + 12]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(BatchTable::read(&bad), Err(BatchTableError::TooManyCameras(u32::MAX)));
        let mut bad = h.clone();
        let state = BatchTable::OFFSET + 32 + 40 + 32;
        bad[state..state + 4].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(BatchTable::read(&bad), Err(BatchTableError::State { camera: 1, code: 9 }));
        assert_eq!(BatchTable::read(&vec![0u8; 400]), Ok(None));
    }
}
