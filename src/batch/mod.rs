//! Many cameras, one batch: a batcher that reads K input rings and publishes into one output
//! ring whose every message is a batch, a `[K, frame…]` tensor (docs/batching.md).
//!
//! Each input is an ordinary consumer ([`Mode::Latest`] by default, or [`Mode::Lossless`]) of a
//! ring whose producer is its own process. Each batch is one loan of the output ring
//! ([`Producer::lend`](crate::Producer::lend)): a camera's frame is copied into its place as it
//! arrives, then released, so the batch costs one copy per frame and holds no input buffer. The batch goes out as
//! [`Timing`] says; a camera with nothing new by then keeps its previous frame or zeros
//! ([`Fill`]), and the batch's user header says, camera by camera, what its place holds
//! ([`BatchTable`]).
//!
//! A camera whose producer dies is marked absent once its consumer learns it (within the
//! liveness interval) and the batches go on; a restarted producer (a new epoch) is joined again.
//! Consumers of the batches are ordinary consumers in any delivery mode: the tensor header
//! gives the batch's shape (Python: `torch.from_dlpack(slot)` is a `[K, H, W, C]` tensor).
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use gpuring::batch::{Batcher, Timing};
//!
//! let stop = AtomicBool::new(false);
//! let batcher = Batcher::builder("cams", &["cam0", "cam1", "cam2", "cam3"])
//!     .timing(Timing::AllFresh { max_wait: Duration::from_millis(20) })
//!     .build()?;
//! let totals = batcher.run(&stop)?; // until `stop` is set
//! println!("{} batches", totals.batches);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Host rings ([`Batcher::run`]) and CUDA rings ([`Batcher::run_in`]`::<Cuda>`): in CUDA memory
//! each camera's frames are copied on a stream of its own that waits for the frame's ready
//! fence, each release is recorded after the copy, and the batch's ready fence after every
//! copy and fill; no thread waits for the GPU. A camera whose ring holds the other kind of
//! memory is refused (its camera shows `refused`).

mod camera;
mod error;
mod frame;
mod gather;
mod memory;
mod publish;
mod status;
mod table;
#[cfg(test)]
mod tests;

pub use error::{BuildError, RunError};
pub use memory::BatchMemory;
pub use status::{BatchStatus, InputStatus};
pub use table::{BatchTable, CameraEntry, CameraState, TableReadError, TableWriteError};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::tensor::TensorHeader;
use crate::{Consumer, Host, Mode, Policy};

/// When a batch goes out.
///
/// ```
/// use std::time::Duration;
/// use gpuring::batch::{Batcher, Timing};
/// let thirty_a_second = Timing::Rate { period: Duration::from_secs(1) / 30 };
/// let b = Batcher::builder("cams", &["cam0", "cam1"]).timing(thirty_a_second);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// When every live camera has a new frame in it, or `max_wait` after its first new frame,
    /// whichever comes first: a slow camera delays a batch by `max_wait` at most. No batch
    /// goes out while no camera sends.
    AllFresh {
        /// The longest a batch waits for its last camera, from its first frame.
        max_wait: Duration,
    },
    /// Every `period`, whatever came (a batch with no new frame at all, too).
    Rate {
        /// The time between two batches.
        period: Duration,
    },
}

/// What the place of a camera with no new frame holds.
///
/// ```
/// use gpuring::batch::{Batcher, Fill};
/// let b = Batcher::builder("cams", &["cam0", "cam1"]).fill(Fill::Zeros);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// The frame it held in the previous batch, copied from that batch (a stale camera), or
    /// zeros if there is none. Absent and refused cameras' places hold zeros.
    Previous,
    /// Zeros.
    Zeros,
}

/// A batcher's settings. See [`Batcher::builder`].
///
/// ```
/// use gpuring::batch::Batcher;
/// let batcher = Batcher::builder("cams", &["cam0", "cam1"]).capacity(8).build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct BatcherBuilder {
    output: String,
    inputs: Vec<String>,
    timing: Timing,
    fill: Fill,
    mode: Mode,
    frame: Option<TensorHeader>,
    capacity: u32,
    spares: u32,
    policy: Option<Policy>,
    dir: Option<PathBuf>,
    liveness: Option<Duration>,
    device: i32,
}

impl BatcherBuilder {
    /// When a batch goes out. Default: [`Timing::AllFresh`] with a `max_wait` of 50 ms.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpuring::batch::{Batcher, Timing};
    /// let fresh = Timing::AllFresh { max_wait: Duration::from_millis(20) };
    /// let b = Batcher::builder("cams", &["cam0"]).timing(fresh);
    /// ```
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// What a camera with no new frame gets in its place. Default: [`Fill::Previous`].
    ///
    /// ```
    /// use gpuring::batch::{Batcher, Fill};
    /// let b = Batcher::builder("cams", &["cam0"]).fill(Fill::Previous);
    /// ```
    pub fn fill(mut self, fill: Fill) -> Self {
        self.fill = fill;
        self
    }

    /// The inputs' delivery mode: [`Mode::Latest`] (default: each batch takes a camera's
    /// newest frame) or [`Mode::Lossless`] (every frame goes into a batch, in order; a camera
    /// faster than the batches slows its producer down). `Queue` is taken as `Lossless`: a queue
    /// that loses a lapping camera's oldest frames fits no batch.
    ///
    /// ```
    /// use gpuring::{batch::Batcher, Mode};
    /// let every_frame = Batcher::builder("cams", &["cam0"]).mode(Mode::Lossless);
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Every camera's frame: its element type and shape. Default: the first frame's tensor
    /// header says it (the output ring is made once one arrives). Frames that differ, or
    /// that carry no tensor header and have another length, are refused.
    ///
    /// ```
    /// use gpuring::batch::Batcher;
    /// use gpuring::tensor::{DType, TensorHeader};
    /// let rgb720p = TensorHeader::new(DType::U8, &[720, 1280, 3]);
    /// let b = Batcher::builder("cams", &["cam0"]).frame(rgb720p);
    /// ```
    pub fn frame(mut self, frame: TensorHeader) -> Self {
        self.frame = Some(frame);
        self
    }

    /// Messages the output ring holds. Default 4.
    ///
    /// ```
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0"]).capacity(8);
    /// ```
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// The output ring's spare buffers. Default 4, at least 2: the batch being gathered and the
    /// previous one, which [`Fill::Previous`] copies from, are each one. More let consumers
    /// hold batches without the batcher waiting for them.
    ///
    /// ```
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0"]).spare_buffers(6);
    /// ```
    pub fn spare_buffers(mut self, spares: u32) -> Self {
        self.spares = spares;
        self
    }

    /// The output ring's policy (default: the ring's default, [`Policy::Block`]).
    ///
    /// ```
    /// use gpuring::{batch::Batcher, Policy};
    /// let b = Batcher::builder("cams", &["cam0"]).policy(Policy::Overwrite);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The folder of the rings, inputs and output (default: the rings' default).
    ///
    /// ```
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0"]).dir("/dev/shm");
    /// ```
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// How often each input checks that its producer lives (the consumer's
    /// [`liveness_interval`](crate::ConsumerBuilder::liveness_interval)), and the output ring's.
    ///
    /// ```
    /// use std::time::Duration;
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0"]);
    /// let b = b.liveness_interval(Duration::from_millis(50));
    /// ```
    pub fn liveness_interval(mut self, every: Duration) -> Self {
        self.liveness = Some(every);
        self
    }

    /// The GPU of a CUDA batcher ([`Batcher::run_in`]): the batch ring is made there and every
    /// camera's ring is read there (a camera on another GPU across the link between them,
    /// as any consumer on another device). Default 0. Host batchers ignore it.
    ///
    /// ```
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0"]).device(1);
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.device = ordinal;
        self
    }

    /// Checks the settings.
    ///
    /// ```
    /// use gpuring::batch::{Batcher, BuildError};
    /// let e = Batcher::builder("cams", &["cam0", "cam0"]).build().unwrap_err();
    /// assert!(matches!(e, BuildError::DuplicateInput(_)));
    /// ```
    pub fn build(self) -> Result<Batcher, BuildError> {
        let k = self.inputs.len();
        if k == 0 {
            return Err(BuildError::NoInputs);
        }
        if k > BatchTable::MAX_CAMERAS {
            return Err(BuildError::TooManyCameras(k));
        }
        if let Some(dup) = (1..k).find(|&i| self.inputs[..i].contains(&self.inputs[i])) {
            return Err(BuildError::DuplicateInput(self.inputs[dup].clone()));
        }
        if self.spares < 2 {
            return Err(BuildError::TooFewSpares(self.spares));
        }
        if self.capacity == 0 {
            return Err(BuildError::Capacity);
        }
        let hour = Duration::from_secs(3600);
        let timing_ok = match self.timing {
            Timing::AllFresh { max_wait } => max_wait <= hour,
            Timing::Rate { period } => !period.is_zero() && period <= hour,
        };
        if !timing_ok {
            return Err(BuildError::Timing);
        }
        if let Some(f) = &self.frame {
            check_frame_fits(f, k)?;
        }
        let mode = match self.mode {
            Mode::Queue => Mode::Lossless,
            m => m,
        };
        Ok(Batcher { b: BatcherBuilder { mode, ..self } })
    }
}

/// Whether a batch of `k` frames `f` has a shape and size a tensor header and a ring hold.
fn check_frame_fits(f: &TensorHeader, k: usize) -> Result<(), BuildError> {
    if f.shape.len() + 1 > TensorHeader::MAX_DIMS {
        return Err(BuildError::FrameDims(f.shape.len()));
    }
    match f.nbytes().and_then(|n| n.checked_mul(k as u64)) {
        Some(n) if n > 0 && n <= isize::MAX as u64 => Ok(()),
        _ => Err(BuildError::FrameSize),
    }
}

/// A batcher, ready to run. See the [module docs](self).
///
/// ```no_run
/// use std::sync::atomic::AtomicBool;
/// let stop = AtomicBool::new(false);
/// let batcher = gpuring::batch::Batcher::builder("cams", &["cam0", "cam1"]).build()?;
/// let totals = batcher.run(&stop)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Batcher {
    b: BatcherBuilder,
}

impl Batcher {
    /// A batcher from rings `inputs` (camera `k` is `inputs[k]`, the batch tensor's index `k`)
    /// into ring `output`.
    ///
    /// ```
    /// let b = gpuring::batch::Batcher::builder("cams", &["cam0", "cam1", "cam2"]);
    /// ```
    pub fn builder<S: AsRef<str>>(output: &str, inputs: &[S]) -> BatcherBuilder {
        BatcherBuilder {
            output: output.to_string(),
            inputs: inputs.iter().map(|s| s.as_ref().to_string()).collect(),
            timing: Timing::AllFresh { max_wait: Duration::from_millis(50) },
            fill: Fill::Previous,
            mode: Mode::Latest,
            frame: None,
            capacity: 4,
            spares: 4,
            policy: None,
            dir: None,
            liveness: None,
            device: 0,
        }
    }

    /// Runs on host rings until `stop` is set (checked every 50 ms) or something fails that is
    /// not a camera's: one thread per camera and this thread publishing. Dropping the output
    /// producer at the end closes the output ring. [`run_in`](Self::run_in) for other memory.
    ///
    /// ```no_run
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use gpuring::batch::Batcher;
    /// let stop = AtomicBool::new(false);
    /// let batcher = Batcher::builder("cams", &["cam0", "cam1"]).build()?;
    /// std::thread::scope(|s| {
    ///     let run = s.spawn(|| batcher.run(&stop));
    ///     std::thread::sleep(std::time::Duration::from_secs(10));
    ///     stop.store(true, Ordering::Relaxed);
    ///     println!("{} batches", run.join().unwrap()?.batches);
    ///     Ok::<(), gpuring::batch::RunError>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run(&self, stop: &AtomicBool) -> Result<Totals, RunError> {
        self.run_in::<Host>(stop)
    }

    /// [`run`](Self::run) on rings of memory kind `M`: the cameras' rings and the batch ring
    /// ([`Cuda`](crate::Cuda): all read and written on the builder's
    /// [`device`](BatcherBuilder::device), each camera's frames copied on a stream of its own,
    /// with no CPU wait for the GPU). A camera whose ring holds another kind is refused.
    ///
    /// ```no_run
    /// use std::sync::atomic::AtomicBool;
    /// let stop = AtomicBool::new(false);
    /// let batcher = gpuring::batch::Batcher::builder("cams", &["cam0", "cam1"]).build()?;
    /// batcher.run_in::<gpuring::Cuda>(&stop)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_in<M: BatchMemory>(&self, stop: &AtomicBool) -> Result<Totals, RunError> {
        let b = &self.b;
        let layout = b.frame.clone().map(|tensor| frame::Layout { tensor, video: None });
        let gather = gather::Gather::<M>::new(b.inputs.len(), layout);
        let inputs: Vec<_> = (0..b.inputs.len())
            .map(|k| {
                let mut builder = Consumer::builder(&b.inputs[k]);
                if let Some(d) = &b.dir {
                    builder = builder.dir(d);
                }
                if let Some(l) = b.liveness {
                    builder = builder.liveness_interval(l);
                }
                camera::Input::<M> {
                    index: k,
                    name: &b.inputs[k],
                    builder,
                    mode: b.mode,
                    device: b.device,
                    gather: &gather,
                }
            })
            .collect();
        std::thread::scope(|scope| {
            // Whatever happens below, a panic included, the camera threads are told to stop
            // (the scope joins them) once no copy runs into a batch buffer (`Stopping`).
            let _stopping = gather::Stopping(&gather);
            let mut threads = Vec::with_capacity(inputs.len());
            for input in &inputs {
                let t = std::thread::Builder::new()
                    .name(format!("batch-cam{}", input.index))
                    .spawn_scoped(scope, || input.run())
                    .map_err(RunError::Thread)?;
                threads.push(t);
            }
            publish::Publisher::<M>::new(b, &gather).run(stop)
        })
    }
}

/// What a run did.
///
/// ```no_run
/// # use std::sync::atomic::AtomicBool;
/// # let stop = AtomicBool::new(false);
/// let t = gpuring::batch::Batcher::builder("cams", &["cam0"]).build()?.run(&stop)?;
/// let [present, stale, absent, refused] = t.cameras[0];
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Batches published.
    pub batches: u64,
    /// Per camera, how many batches it was present, stale, absent and refused in (in that
    /// order: [`Totals::index`]).
    pub cameras: Vec<[u64; 4]>,
}

impl Totals {
    /// Where state `s` is counted in each camera's `[u64; 4]`: present 0, stale 1, absent 2,
    /// refused 3.
    ///
    /// ```
    /// use gpuring::batch::{CameraState, Totals};
    /// assert_eq!(Totals::index(CameraState::Absent), 2);
    /// ```
    pub fn index(s: CameraState) -> usize {
        match s {
            CameraState::Present => 0,
            CameraState::Stale => 1,
            CameraState::Absent => 2,
            CameraState::Refused => 3,
        }
    }
}

/// Whether `stop` is set. Relaxed: a flag; nothing is published with it.
fn stopped(stop: &AtomicBool) -> bool {
    stop.load(Ordering::Relaxed)
}
