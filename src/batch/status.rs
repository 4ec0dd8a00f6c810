//! What a running batcher tells tools: its cameras and their states, in a file beside its
//! batch ring (`DIR/.gpuring.NAME.batch`), rewritten whole (written aside, then renamed) at
//! most four times a second and removed when it stops. `gpuring stat` prints it, the exporter
//! exports it (docs/metrics.md).
//!
//! Text, one record per line, fields separated by one space:
//!
//! ```text
//! gpuring-batch 1
//! batches N
//! updated_ns T                      (CLOCK_MONOTONIC)
//! camera K RING STATE EPOCH SEQ TIMESTAMP_NS PRESENT STALE ABSENT REFUSED
//! ```
//!
//! one `camera` line per camera, in order; `STATE` is a [`CameraState`] name.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use super::table::{CameraEntry, CameraState};

/// A batcher's cameras, as its status file says.
///
/// ```
/// use gpuring::batch::{BatchStatus, CameraState, InputStatus};
///
/// let dir = std::env::temp_dir().join(format!("doc-batch-status-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let input = InputStatus { ring: "cam0".into(), state: CameraState::Present, epoch: 7,
///     seq: 41, timestamp_ns: 1_000, counts: [40, 1, 0, 0] };
/// let status = BatchStatus { batches: 41, updated_ns: 2_000, inputs: vec![input] };
/// status.write(&dir, "cams")?;
/// assert_eq!(BatchStatus::read(&dir, "cams")?, Some(status));
/// BatchStatus::remove(&dir, "cams");
/// assert_eq!(BatchStatus::read(&dir, "cams")?, None);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchStatus {
    /// Batches published so far.
    pub batches: u64,
    /// When the file was written (CLOCK_MONOTONIC ns): tools tell a stale file from it.
    pub updated_ns: u64,
    /// One per camera, in the batch's order.
    pub inputs: Vec<InputStatus>,
}

/// One camera in a [`BatchStatus`].
///
/// ```
/// use gpuring::batch::{CameraState, InputStatus};
/// let i = InputStatus { ring: "cam0".into(), state: CameraState::Absent, epoch: 0, seq: 0,
///     timestamp_ns: 0, counts: [0, 0, 3, 0] };
/// assert_eq!(i.counts[2], 3); // absent in 3 batches
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputStatus {
    /// Its ring's name.
    pub ring: String,
    /// Its state in the last batch.
    pub state: CameraState,
    /// The epoch of its producer in the last batch (0 if none was ever seen).
    pub epoch: u64,
    /// The sequence number of its frame in the last batch.
    pub seq: u64,
    /// That frame's timestamp (0 if its place held none).
    pub timestamp_ns: u64,
    /// Batches it was present, stale, absent and refused in
    /// ([`Totals::index`](super::Totals::index) order).
    pub counts: [u64; 4],
}

impl InputStatus {
    /// Its status from its entry in the last batch and its counts.
    pub(super) fn new(ring: &str, e: &CameraEntry, counts: [u64; 4]) -> InputStatus {
        InputStatus {
            ring: ring.to_string(),
            state: e.state,
            epoch: e.epoch,
            seq: e.seq,
            timestamp_ns: e.timestamp_ns,
            counts,
        }
    }
}

const MAGIC: &str = "gpuring-batch 1";

impl BatchStatus {
    /// The status file of batch ring `name` in ring directory `dir`.
    ///
    /// ```
    /// use std::path::Path;
    /// let p = gpuring::batch::BatchStatus::path(Path::new("/dev/shm"), "cams");
    /// assert_eq!(p, Path::new("/dev/shm/.gpuring.cams.batch"));
    /// ```
    pub fn path(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!(".gpuring.{name}.batch"))
    }

    /// Writes it, whole: to a file beside it, then renamed over it.
    ///
    /// ```
    /// # let dir = std::env::temp_dir();
    /// let s = gpuring::batch::BatchStatus { batches: 0, updated_ns: 1, inputs: vec![] };
    /// s.write(&dir, "doc-batch-status-write")?;
    /// # gpuring::batch::BatchStatus::remove(&dir, "doc-batch-status-write");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<()> {
        let mut t = format!("{MAGIC}\nbatches {}\nupdated_ns {}\n", self.batches, self.updated_ns);
        for (k, i) in self.inputs.iter().enumerate() {
            let [p, s, a, r] = i.counts;
            let _ = writeln!(
                t,
                "camera {k} {} {} {} {} {} {p} {s} {a} {r}",
                i.ring,
                i.state.name(),
                i.epoch,
                i.seq,
                i.timestamp_ns
            );
        }
        let path = Self::path(dir, name);
        let aside = dir.join(format!(".gpuring.{name}.batch.{}", std::process::id()));
        std::fs::write(&aside, t)?;
        std::fs::rename(&aside, &path)
    }

    /// Reads batch ring `name`'s status file in `dir`: `Ok(None)` if there is none. A file
    /// that is not one (or is damaged) is `InvalidData`.
    ///
    /// ```
    /// let none = gpuring::batch::BatchStatus::read(&std::env::temp_dir(), "doc-no-batcher")?;
    /// assert_eq!(none, None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(dir: &Path, name: &str) -> io::Result<Option<BatchStatus>> {
        let text = match std::fs::read_to_string(Self::path(dir, name)) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse(&text).map(Some).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "not a gpuring batch status file")
        })
    }

    /// Removes batch ring `name`'s status file in `dir`, if there is one.
    ///
    /// ```
    /// gpuring::batch::BatchStatus::remove(&std::env::temp_dir(), "doc-no-batcher");
    /// ```
    pub fn remove(dir: &Path, name: &str) {
        let _ = std::fs::remove_file(Self::path(dir, name));
    }
}

/// The status in `text`, if it is a whole, well-formed one.
fn parse(text: &str) -> Option<BatchStatus> {
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let field = |line: Option<&str>, key: &str| -> Option<u64> {
        line?.strip_prefix(key)?.strip_prefix(' ')?.parse().ok()
    };
    let batches = field(lines.next(), "batches")?;
    let updated_ns = field(lines.next(), "updated_ns")?;
    let mut inputs = Vec::new();
    for (k, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 11 || f[0] != "camera" || f[1].parse::<usize>().ok()? != k {
            return None;
        }
        let state =
            [CameraState::Present, CameraState::Stale, CameraState::Absent, CameraState::Refused]
                .into_iter()
                .find(|s| s.name() == f[3])?;
        let n = |i: usize| f[i].parse::<u64>().ok();
        inputs.push(InputStatus {
            ring: f[2].to_string(),
            state,
            epoch: n(4)?,
            seq: n(5)?,
            timestamp_ns: n(6)?,
            counts: [n(7)?, n(8)?, n(9)?, n(10)?],
        });
    }
    Some(BatchStatus { batches, updated_ns, inputs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_files_are_refused() {
        let good = "gpuring-batch 1\nbatches 3\nupdated_ns 9\ncamera 0 cam0 stale 1 2 3 0 3 0 0\n";
        let s = parse(good).unwrap();
        assert_eq!(s.inputs[0].state, CameraState::Stale);
        assert_eq!(s.inputs[0].counts, [0, 3, 0, 0]);
        for bad in [
            "",
            "gpuring-batch 2\nbatches 3\nupdated_ns 9\n",
            "gpuring-batch 1\nbatches x\nupdated_ns 9\n",
            "gpuring-batch 1\nbatches 3\nupdated_ns 9\ncamera 1 cam0 stale 1 2 3 0 3 0 0\n",
            "gpuring-batch 1\nbatches 3\nupdated_ns 9\ncamera 0 cam0 gone 1 2 3 0 3 0 0\n",
            "gpuring-batch 1\nbatches 3\nupdated_ns 9\ncamera 0 cam0 stale 1 2 3 0 3 0\n",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
