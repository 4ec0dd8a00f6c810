//! A consumer of a CUDA-memory ring.

use std::cell::RefCell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::GpuRecvError;
use super::fence::order_after;
use crate::cuda::driver::{self, CUdeviceptr, DriverError};
use crate::cuda::{Context, CudaError, IpcEvent, IpcMapping, Stream};
use crate::error::{Corruption, OpenError, RecvTimeoutError, TryRecvError};
use crate::format::gpu::{
    check_descriptor, fence_bytes, fence_kind, load_uuid, pool_state, ready_word, KnownPool,
    MAX_POOLS,
};
use crate::format::view::MappedRing;
use crate::format::{MemoryKind, Params};
use crate::ring::{Leave, Pinned};
use crate::wait;
use crate::{Consumer, ConsumerBuilder};

/// Largest pool a consumer accepts from a pool table (1 TiB, as for slot sizes).
const MAX_POOL_SIZE: u64 = Params::MAX_SLOT_SIZE;

/// How long a leaving consumer waits for the producer to drop its imports of the consumer's
/// release events before it gives up and leaves the events to process exit (docs/gpu.md,
/// "Leaving"). A producer that acquires, or is closing, answers within a liveness interval.
const LEAVE_PATIENCE: Duration = Duration::from_millis(500);

/// How long a dropped consumer waits for its own GPU work to finish while the producer lives,
/// before it leaves everything to process exit (its stream may wait on a fence the producer's
/// failed context will never write).
const IDLE_PATIENCE: Duration = Duration::from_secs(30);

impl ConsumerBuilder {
    /// Opens a CUDA-memory ring and joins it, on the device the producer uses (or on the
    /// device [`device`](ConsumerBuilder::device) names, which must be that one for now).
    /// Maps the producer's pools and opens the slots' ready events once, here.
    ///
    /// ```no_run
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let rx = gpuring::Consumer::builder("cam0").open_gpu()?;
    /// let frame = rx.recv()?; // frame.stream() already waits for the producer's writes
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu(self) -> Result<GpuConsumer, OpenError> {
        let (device, poll) = (self.device, self.gpu_poll);
        let (inner, side) = self.open_kind(MemoryKind::Cuda, |map, entry, generation| {
            driver::available().map_err(|why| OpenError::MemoryUnavailable {
                reason: format!("CUDA unavailable: {why}"),
            })?;
            GpuSide::join(map, entry, generation, device)
        })?;
        Ok(GpuConsumer { inner, side, poll })
    }

    /// `open_when_ready` for CUDA rings: waits up to `timeout` for an instance other than
    /// `not_epoch`, then `open_gpu`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // The producer may start after us: wait up to 10 s for it to create the ring.
    /// let builder = gpuring::Consumer::builder("cam0");
    /// let rx = builder.open_gpu_when_ready(None, Duration::from_secs(10))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_gpu_when_ready(
        self,
        not_epoch: Option<u64>,
        timeout: Duration,
    ) -> Result<GpuConsumer, OpenError> {
        self.retry_open(not_epoch, timeout, |b| b.open_gpu(), |c: &GpuConsumer| c.epoch())
    }

    /// The device to read on (CUDA rings). Default: the producer's device, found by UUID.
    ///
    /// ```no_run
    /// let rx = gpuring::Consumer::builder("cam0").device(0).open_gpu()?;
    /// assert_eq!(rx.context().ordinal(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(mut self, ordinal: i32) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// CUDA rings: how long `recv` polls a frame's ready event on the CPU (`cuEventQuery`)
    /// before it makes the stream wait for it on the GPU instead. A frame that completes within
    /// the window is read with no GPU-side wait at all. Default [`crate::DEFAULT_GPU_POLL`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// // Hand every pending wait to the GPU at once: lowest latency for a mostly idle ring.
    /// let rx = gpuring::Consumer::builder("cam0").gpu_poll(Duration::ZERO).open_gpu()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gpu_poll(mut self, window: Duration) -> Self {
        self.gpu_poll = window;
        self
    }
}

/// A pool this consumer mapped.
struct OpenPool {
    known: KnownPool,
    mapping: IpcMapping,
}

/// The consumer's CUDA state.
///
/// Invariants: `ready[i]` is slot `i`'s ready event, opened from the segment; `release[i]` is
/// our release event for slot `i`, whose handle is in our release line `i`; each `pools[p]`
/// maps pool table entry `p` in generation `known.generation`, and its mapping is at least
/// `known.size` bytes. Field order is drop order: the stream before the events and mappings.
struct GpuSide {
    stream: Stream,
    release: Vec<IpcEvent>,
    ready: Vec<IpcEvent>,
    pools: RefCell<Vec<Option<OpenPool>>>,
    ctx: Arc<Context>,
    /// With `Fence::Memory`: the device address of the ring's fence words, inside the mapping
    /// of the fence pool in `pools` (checked at join to hold `fence_bytes`).
    words: Option<CUdeviceptr>,
}

fn cuda_err(e: impl Into<CudaError>) -> OpenError {
    OpenError::MemoryUnavailable { reason: e.into().to_string() }
}

fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

impl GpuSide {
    /// Sets up consumer table entry `entry` (claimed, not active yet): picks the device,
    /// creates and publishes our release events, opens the ready events and the live pools.
    fn join(
        map: &MappedRing,
        entry: usize,
        generation: u32,
        device: Option<i32>,
    ) -> Result<GpuSide, OpenError> {
        let tables = map.gpu();
        let ring_uuid = load_uuid(&tables.header.device_uuid);
        let ordinal = match device {
            Some(d) => {
                let uuid = driver::ordinal_uuid(d).map_err(cuda_err)?;
                if uuid != ring_uuid {
                    return Err(OpenError::MemoryUnavailable {
                        reason: format!(
                            "the ring's memory is on GPU {}, not on device {d} ({}); consumers \
                             on another GPU are not supported yet",
                            uuid_hex(&ring_uuid),
                            uuid_hex(&uuid)
                        ),
                    });
                }
                d
            }
            None => {
                let n = driver::device_count().map_err(cuda_err)?;
                (0..n).find(|&d| driver::ordinal_uuid(d).is_ok_and(|u| u == ring_uuid)).ok_or_else(
                    || OpenError::MemoryUnavailable {
                        reason: format!(
                            "the ring's memory is on GPU {}, which this process cannot see",
                            uuid_hex(&ring_uuid)
                        ),
                    },
                )?
            }
        };
        if map.params().producer_pid == std::process::id() {
            // The driver would refuse with CUDA_ERROR_INVALID_CONTEXT: say why instead.
            return Err(OpenError::MemoryUnavailable {
                reason: "CUDA IPC handles cannot be opened in the process that made them: \
                         consume a CUDA ring from another process than its producer's"
                    .into(),
            });
        }
        let ctx = Context::new(ordinal).map_err(cuda_err)?;
        // Our entry is JOINING. SeqCst, against the fence of the producer's close: either the
        // closing producer sees our entry taken (and waits for us), or we see `closed` (and
        // give up, as its memory is about to go).
        fence(Ordering::SeqCst);
        // Acquire: pairs with the producer's Release store of `closed`.
        if map.header().closed.load(Ordering::Acquire) != 0 {
            return Err(OpenError::Disconnected);
        }
        // Our release lines: the producer reads them only once our entry is ACTIVE in this
        // generation, so nobody reads them while we write.
        let mut release = Vec::with_capacity(tables.capacity);
        for line in tables.releases_of(entry) {
            let ev = IpcEvent::new(&ctx).map_err(cuda_err)?;
            let handle = ev.ipc_handle().map_err(cuda_err)?;
            line.release_event.store(&driver::event_handle_bytes(&handle));
            // Relaxed: published by the Release CAS to ACTIVE when we join.
            line.released.store(0, Ordering::Relaxed);
            // Release: a producer that Acquire-loads this generation sees the handle above.
            line.generation.store(generation, Ordering::Release);
            release.push(ev);
        }
        let ready = tables
            .slots
            .iter()
            .map(|line| {
                let h = driver::event_handle_from_bytes(&line.ready_event.load());
                IpcEvent::open(&ctx, h)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda_err)?;
        let mut side = GpuSide {
            stream: Stream::new(&ctx).map_err(cuda_err)?,
            release,
            ready,
            pools: RefCell::new((0..MAX_POOLS).map(|_| None).collect()),
            ctx,
            words: None,
        };
        for p in 0..MAX_POOLS {
            // Acquire: pairs with the producer's Release store of LIVE.
            if tables.pools[p].state.load(Ordering::Acquire) == pool_state::LIVE {
                side.open_pool(map, p).map_err(|e| match e {
                    GpuRecvError::Corrupt(c) => OpenError::Corrupt(c),
                    other => OpenError::MemoryUnavailable { reason: other.to_string() },
                })?;
            }
        }
        side.words = side.fence_words(map)?;
        Ok(side)
    }

    /// The fence words, if the segment says `Fence::Memory`: checks the kind, that the named
    /// pool is one we mapped, and that it is large enough for every word we may touch.
    fn fence_words(&self, map: &MappedRing) -> Result<Option<CUdeviceptr>, OpenError> {
        let header = &map.gpu().header;
        let bad = |field, value| OpenError::Corrupt(Corruption::Field { field, value });
        // Relaxed (both): written before `magic`, which the open acquired.
        match header.fence.load(Ordering::Relaxed) {
            fence_kind::EVENTS => Ok(None),
            fence_kind::MEMORY => {
                let p = header.fence_pool.load(Ordering::Relaxed) as usize;
                let pools = self.pools.borrow();
                let Some(Some(pool)) = pools.get(p) else {
                    return Err(bad("gpu.fence_pool", p as u64));
                };
                let params = map.params();
                let need = fence_bytes(params.capacity as usize);
                if (pool.known.size as usize) < need {
                    return Err(bad("gpu.fence_pool size", pool.known.size));
                }
                Ok(Some(pool.mapping.ptr()))
            }
            other => Err(bad("gpu.fence", other as u64)),
        }
    }

    /// Maps pool table entry `p` after checking it: live, on our device, of a sane size, and
    /// no larger than what the driver maps.
    fn open_pool(&self, map: &MappedRing, p: usize) -> Result<(), GpuRecvError> {
        let entry = &map.gpu().pools[p];
        let bad = |field, value| GpuRecvError::Corrupt(Corruption::Field { field, value });
        // Acquire: pairs with the producer's Release store of LIVE.
        let state = entry.state.load(Ordering::Acquire);
        if state != pool_state::LIVE {
            return Err(bad("pool.state", state as u64));
        }
        // Relaxed: written before LIVE, which we acquired.
        let generation = entry.generation.load(Ordering::Relaxed);
        let size = entry.size.load(Ordering::Relaxed);
        if size == 0 || size > MAX_POOL_SIZE {
            return Err(bad("pool.size", size));
        }
        let ring_uuid = load_uuid(&map.gpu().header.device_uuid);
        if load_uuid(&entry.device_uuid) != ring_uuid {
            return Err(bad("pool.device_uuid", p as u64));
        }
        let handle = driver::mem_handle_from_bytes(&entry.handle.load());
        let mapping = IpcMapping::open(&self.ctx, handle, size as usize)?;
        if (mapping.mapped_size()? as u64) < size {
            return Err(bad("pool.size", size));
        }
        let known = KnownPool { generation, size };
        self.pools.borrow_mut()[p] = Some(OpenPool { known, mapping });
        Ok(())
    }

    /// The device address of pinned message `m`, after checking its descriptor. Maps a pool
    /// the producer registered after we joined (once).
    fn locate(&self, map: &MappedRing, m: &Pinned) -> Result<CUdeviceptr, GpuRecvError> {
        let line = &map.gpu().slots[m.slot];
        // Relaxed: written before the publish stamp store, which our pin acquired.
        let pool = line.pool.load(Ordering::Relaxed);
        let generation = line.pool_generation.load(Ordering::Relaxed);
        let offset = line.offset.load(Ordering::Relaxed);
        let known = |pools: &Vec<Option<OpenPool>>| -> Vec<Option<KnownPool>> {
            pools.iter().map(|o| o.as_ref().map(|o| o.known)).collect()
        };
        let unmapped = (pool as usize) < MAX_POOLS && self.pools.borrow()[pool as usize].is_none();
        if unmapped {
            self.open_pool(map, pool as usize)?;
        }
        let pools = self.pools.borrow();
        let d = check_descriptor(pool, generation, offset, m.len, &known(&pools))
            .map_err(GpuRecvError::Corrupt)?;
        let base = pools[d.pool].as_ref().expect("checked: mapped").mapping.ptr();
        Ok(base + d.offset)
    }
}

/// One consumer of a CUDA-memory ring. Open it with [`ConsumerBuilder::open_gpu`].
///
/// [`recv`](Self::recv) returns a message whose stream already waits (on the GPU) for the
/// producer's writes; launch your kernels on [`GpuReadSlot::stream`]. Dropping the slot records
/// this consumer's release event on that stream, so the producer's next write to the slot waits
/// for your kernels, not for the CPU.
///
/// ```no_run
/// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
/// let rx = gpuring::GpuConsumer::open("cam0")?;
/// while let Ok(frame) = rx.recv() {
///     infer(frame.ptr(), frame.len(), frame.stream()); // your kernels, on the frame's stream
/// } // each `frame` drops here: released once those kernels are done
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuConsumer {
    inner: Consumer,
    side: GpuSide,
    /// How long to poll a ready event before a GPU-side wait.
    poll: Duration,
}

impl GpuConsumer {
    /// Opens CUDA ring `name` with default settings.
    ///
    /// ```no_run
    /// let rx = gpuring::GpuConsumer::open("cam0")?;
    /// println!("{} slots of {} bytes", rx.capacity(), rx.slot_size());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(name: &str) -> Result<GpuConsumer, OpenError> {
        Consumer::builder(name).open_gpu()
    }

    /// The ring's name.
    ///
    /// ```no_run
    /// let rx = gpuring::GpuConsumer::open("cam0")?;
    /// assert_eq!(rx.name(), "cam0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Number of slots.
    ///
    /// ```no_run
    /// let rx = gpuring::GpuConsumer::open("cam0")?;
    /// println!("the ring has {} slots", rx.capacity());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    /// Largest message.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let frame = 1920 * 1080 * 4;
    /// assert!(rx.slot_size() >= frame, "the ring's slots are too small for a 1080p frame");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.inner.slot_size()
    }

    /// User header bytes per message.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// // This pipeline puts a u64 frame id in each message's user header.
    /// assert!(rx.user_header_size() >= 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn user_header_size(&self) -> usize {
        self.inner.user_header_size()
    }

    /// The producer's policy.
    ///
    /// ```no_run
    /// use gpuring::Policy;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// if rx.policy() == Policy::Overwrite {
    ///     println!("a slow reader loses frames: watch frame.lag()");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> crate::Policy {
        self.inner.policy()
    }

    /// The ring instance's epoch.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let old = rx.epoch();
    /// let rx = rx.reconnect(Duration::from_secs(30))?; // a new instance of the ring
    /// assert_ne!(rx.epoch(), old);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        self.inner.epoch()
    }

    /// After `Disconnected`: waits up to `timeout` for a new instance of the ring and opens it
    /// (see [`Consumer::reconnect`]). Its pools and events are mapped afresh: nothing cached
    /// for this instance is used again.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let mut rx = gpuring::GpuConsumer::open("cam0")?;
    /// loop {
    ///     while let Ok(frame) = rx.recv() {
    ///         infer(frame.ptr(), frame.len(), frame.stream());
    ///     }
    ///     // The producer is gone (or the ring is damaged): wait up to 30 s for a new one.
    ///     rx = rx.reconnect(Duration::from_secs(30))?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconnect(&self, timeout: Duration) -> Result<GpuConsumer, OpenError> {
        tracing::info!(ring = %self.name(), old_epoch = self.epoch(), "reconnecting");
        self.inner.settings().open_gpu_when_ready(Some(self.epoch()), timeout)
    }

    /// The device context this consumer reads in.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// // A stream of your own on the ring's device, for `recv_on`.
    /// let infer_stream = Stream::new(rx.context())?;
    /// let frame = rx.recv_on(&infer_stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self) -> &Arc<Context> {
        &self.side.ctx
    }

    /// The consumer's own stream, the one [`recv`](Self::recv) makes wait.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn my_model<S>(_stream: S) {}
    /// // Hand the raw stream to other CUDA code (cudarc, an inference runtime...).
    /// my_model(rx.stream().raw());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        &self.side.stream
    }

    /// Receives the next message if one is waiting.
    ///
    /// ```no_run
    /// use gpuring::gpu::GpuRecvError;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// match rx.try_recv() {
    ///     Ok(frame) => infer(frame.ptr(), frame.len(), frame.stream()),
    ///     Err(GpuRecvError::Empty) => {} // nothing new: do other work
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv(&self) -> Result<GpuReadSlot<'_>, GpuRecvError> {
        self.try_recv_on(&self.side.stream)
    }

    /// Receives the next message, waiting as long as it takes; its stream is the consumer's.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let frame = rx.recv()?;
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// drop(frame); // records the release on frame.stream(), after infer's kernels
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv(&self) -> Result<GpuReadSlot<'_>, GpuRecvError> {
        self.recv_on(&self.side.stream)
    }

    /// Receives the next message, waiting at most `timeout`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::gpu::GpuRecvError;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// match rx.recv_timeout(Duration::from_millis(100)) {
    ///     Ok(frame) => infer(frame.ptr(), frame.len(), frame.stream()),
    ///     Err(GpuRecvError::Timeout) => eprintln!("no frame for 100 ms"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<GpuReadSlot<'_>, GpuRecvError> {
        self.recv_on_timeout(&self.side.stream, timeout)
    }

    /// Receives the next message, awaiting it without blocking the thread (feature `tokio`; see
    /// [`Consumer::recv_async`](crate::Consumer::recv_async)); then as [`recv`](Self::recv).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let rx = gpuring::GpuConsumer::open("frames")?;
    /// while let Ok(frame) = rx.recv_async().await {
    ///     // Launch kernels on frame.stream() that read frame.ptr()..+frame.len().
    ///     let _ = (frame.ptr(), frame.len());
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&self) -> Result<GpuReadSlot<'_>, GpuRecvError> {
        let m = self.inner.pin_async().await.map_err(|e| match e {
            crate::RecvError::Disconnected => GpuRecvError::Disconnected,
            crate::RecvError::Corrupt(c) => GpuRecvError::Corrupt(c),
        })?;
        self.ready(m, &self.side.stream)
    }

    /// Receives the next message and makes `stream` (yours, of this consumer's device) wait
    /// for it; its release is recorded on `stream` too.
    ///
    /// ```no_run
    /// use gpuring::cuda::Stream;
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let infer_stream = Stream::new(rx.context())?;
    /// let frame = rx.recv_on(&infer_stream)?; // `infer_stream` waits for the producer's writes
    /// infer(frame.ptr(), frame.len(), &infer_stream);
    /// drop(frame); // the release is recorded on `infer_stream`, after infer's kernels
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_on<'a>(&'a self, stream: &'a Stream) -> Result<GpuReadSlot<'a>, GpuRecvError> {
        self.check_stream(stream)?;
        let m = self.pin(None)?;
        self.ready(m, stream)
    }

    /// [`recv_on`](Self::recv_on), waiting at most `timeout`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use gpuring::{cuda::Stream, gpu::GpuRecvError};
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let infer_stream = Stream::new(rx.context())?;
    /// match rx.recv_on_timeout(&infer_stream, Duration::from_millis(100)) {
    ///     Ok(frame) => println!("message {} on my stream", frame.seq()),
    ///     Err(GpuRecvError::Timeout) => eprintln!("no frame for 100 ms"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_on_timeout<'a>(
        &'a self,
        stream: &'a Stream,
        timeout: Duration,
    ) -> Result<GpuReadSlot<'a>, GpuRecvError> {
        self.check_stream(stream)?;
        let m = self.pin(Some(Instant::now() + timeout))?;
        self.ready(m, stream)
    }

    /// [`recv_on`](Self::recv_on) if a message is waiting, else `Empty`.
    ///
    /// ```no_run
    /// use gpuring::{cuda::Stream, gpu::GpuRecvError};
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let infer_stream = Stream::new(rx.context())?;
    /// match rx.try_recv_on(&infer_stream) {
    ///     Ok(frame) => println!("message {} on my stream", frame.seq()),
    ///     Err(GpuRecvError::Empty) => {} // nothing new
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv_on<'a>(&'a self, stream: &'a Stream) -> Result<GpuReadSlot<'a>, GpuRecvError> {
        self.check_stream(stream)?;
        let m = self.inner.try_pin().map_err(|e| match e {
            TryRecvError::Empty => GpuRecvError::Empty,
            TryRecvError::Disconnected => GpuRecvError::Disconnected,
            TryRecvError::Corrupt(c) => GpuRecvError::Corrupt(c),
        })?;
        self.ready(m, stream)
    }

    /// Refuses a stream of another device than the consumer's.
    fn check_stream(&self, stream: &Stream) -> Result<(), GpuRecvError> {
        let (theirs, ours) = (stream.context().ordinal(), self.side.ctx.ordinal());
        if theirs != ours {
            return Err(GpuRecvError::Cuda(CudaError::ForeignStream {
                stream: theirs,
                ring: ours,
            }));
        }
        Ok(())
    }

    fn pin(&self, deadline: Option<Instant>) -> Result<Pinned, GpuRecvError> {
        self.inner.pin_until(deadline).map_err(|e| match e {
            RecvTimeoutError::Timeout => GpuRecvError::Timeout,
            RecvTimeoutError::Disconnected => GpuRecvError::Disconnected,
            RecvTimeoutError::Corrupt(c) => GpuRecvError::Corrupt(c),
        })
    }

    /// Checks pinned `m`'s descriptor and makes `stream` wait for its ready event. On failure
    /// the slot is released again (nothing of ours read it).
    fn ready<'a>(&'a self, m: Pinned, stream: &'a Stream) -> Result<GpuReadSlot<'a>, GpuRecvError> {
        let located = self.side.locate(self.inner.map(), &m).and_then(|ptr| {
            self.order_after_write(&m, stream)?;
            Ok(ptr)
        });
        match located {
            Ok(ptr) => Ok(GpuReadSlot { consumer: self, m, ptr, stream }),
            Err(e) => {
                self.inner.release(m.slot);
                Err(e)
            }
        }
    }

    /// Makes work queued on `stream` from now on run after the producer's writes of `m`:
    /// nothing if they completed (seen within the `gpu_poll` window), else a GPU-side wait on
    /// the ready event or, with `Fence::Memory`, on the slot's ready word.
    fn order_after_write(&self, m: &Pinned, stream: &Stream) -> Result<(), DriverError> {
        let word = self.side.words.map(|w| (w + ready_word(m.slot), m.seq + 1));
        // SAFETY: the ready word lies in the fence pool we mapped (size checked at join), kept
        // mapped while we live; the producer writes seq + 1 there after message `seq`.
        unsafe { order_after(&self.side.ready[m.slot], word, self.poll, &self.side.ctx, stream) }
    }

    /// Records the release event of `m`'s slot on `stream`, then releases the slot. The
    /// producer polls that event before it rewrites the slot.
    fn release(&self, m: &Pinned, stream: &Stream) -> Result<(), CudaError> {
        let recorded = self.side.release[m.slot].record(stream);
        if recorded.is_err() {
            // Without the event the producer could overwrite what our stream still reads: wait
            // here instead (an error path, not the steady state). If even that fails the
            // context is broken and nothing of ours reads any more; release all the same, or
            // the slot would stay held for ever.
            let _ = stream.synchronize();
        }
        let line = &self.inner.map().gpu().releases_of(self.inner.entry())[m.slot];
        // Release: pairs with the producer's Acquire load; it waits for the event recorded
        // above only when it sees this value.
        line.released.store(m.seq + 1, Ordering::Release);
        self.inner.release(m.slot);
        recorded.map_err(Into::into)
    }
}

impl Drop for GpuConsumer {
    /// Leaves in the order that keeps every CUDA object valid while someone uses it
    /// (docs/gpu.md, "Leaving"): our GPU work ends; we close what we opened of the producer
    /// (mappings, ready events); we give back what we hold and retire the entry; the producer
    /// drops its imports of our release events and frees the entry; only then do we destroy
    /// those events.
    fn drop(&mut self) {
        if !self.wait_idle() {
            // Our stream waits on a fence that will never complete (its producer died, or its
            // context failed): nothing it queued may be closed or destroyed under it. Leave it
            // all to process exit.
            tracing::warn!(ring = %self.name(), "our GPU work did not finish: leaving it to exit");
            if self.inner.producer_alive() {
                // Keep the entry (EVICTED) until we exit: a producer that saw it free would free
                // the memory our unfinished work reads.
                self.inner.step_aside();
            } else {
                self.inner.leave(Leave::Free);
            }
            let side = std::mem::replace(&mut self.side.pools, RefCell::new(Vec::new()));
            std::mem::forget(side);
            std::mem::forget(std::mem::take(&mut self.side.ready));
            std::mem::forget(std::mem::take(&mut self.side.release));
            return;
        }
        let (entry, generation) = (self.inner.entry(), self.inner.generation());
        self.side.pools.borrow_mut().clear();
        self.side.ready.clear();
        tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer mappings closed");
        let left = self.inner.leave(Leave::Retire);
        tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer retiring");
        let Some(retiring) = left.and_then(|l| l.retiring) else {
            // The entry was not ours any more: nobody acknowledges it. Keep the events alive
            // in case the producer still has them open.
            std::mem::forget(std::mem::take(&mut self.side.release));
            return;
        };
        if self.wait_retired(retiring) {
            self.side.release.clear();
            tracing::debug!(target: "gpuring::lifecycle", entry, generation, "consumer release events destroyed");
        } else {
            let ring = self.inner.map().ring();
            crate::ring::consumer::give_up_retiring(&ring, entry, retiring);
            tracing::info!(
                ring = %self.name(), entry,
                "the producer did not let go of our release events in time: they stay until exit"
            );
            std::mem::forget(std::mem::take(&mut self.side.release));
        }
    }
}

impl GpuConsumer {
    /// Waits until our GPU work is done: the stream and every release event complete. Polls,
    /// checking the producer's liveness once per liveness interval; false if the producer died
    /// and our work still waits (on a fence of its that will never complete), or if it is not
    /// done after [`IDLE_PATIENCE`] (a producer whose context failed never writes its fences).
    fn wait_idle(&self) -> bool {
        let idle = || {
            self.side.stream.is_idle().unwrap_or(true)
                && self.side.release.iter().all(|ev| ev.is_complete().unwrap_or(true))
        };
        let mut producer_dead_since = None;
        let config = self.inner.wait_config();
        let deadline = Some(Instant::now() + IDLE_PATIENCE);
        wait::poll_until(config, deadline, |tick| {
            if idle() {
                return Some(true);
            }
            if tick && producer_dead_since.is_none() && !self.inner.producer_alive() {
                producer_dead_since = Some(Instant::now());
            }
            // Grace for work that was about to complete when the producer died.
            let gone = producer_dead_since.is_some_and(|t| t.elapsed() > Duration::from_secs(1));
            gone.then_some(false)
        })
        .unwrap_or(false)
    }

    /// After retiring our entry as `retiring`: waits until the producer has let go of it (it
    /// dropped its imports of our release events), or is closed and gone, or is dead; false
    /// after [`LEAVE_PATIENCE`] without that.
    fn wait_retired(&self, retiring: u64) -> bool {
        let ring = self.inner.map().ring();
        let entry = self.inner.entry();
        let config = self.inner.wait_config();
        let deadline = Some(Instant::now() + LEAVE_PATIENCE);
        let mut first = true;
        wait::poll_until(config, deadline, |tick| {
            if crate::ring::consumer::retire_done(&ring, entry, retiring) {
                return Some(());
            }
            let look = std::mem::replace(&mut first, false) || tick;
            (look && !self.inner.producer_alive()).then_some(())
        })
        .is_some()
    }
}

/// A received device message. The producer cannot overwrite it until it is released (dropped
/// or [`release`](Self::release)d), and then only after the work queued on its stream so far.
///
/// ```no_run
/// # let rx = gpuring::GpuConsumer::open("cam0")?;
/// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
/// let frame = rx.recv()?;
/// println!("message {}: {} bytes", frame.seq(), frame.len());
/// infer(frame.ptr(), frame.len(), frame.stream());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A message borrows its consumer: it cannot outlive it.
///
/// ```compile_fail,E0597
/// let frame = {
///     let rx = gpuring::GpuConsumer::open("cam0")?;
///     rx.recv()?
/// }; // error: `rx` is dropped here while `frame` still borrows it
/// println!("{} bytes", frame.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuReadSlot<'a> {
    consumer: &'a GpuConsumer,
    /// Invariant: pinned by `consumer`; `ptr..ptr + len` lies in a pool it mapped.
    m: Pinned,
    ptr: CUdeviceptr,
    stream: &'a Stream,
}

impl GpuReadSlot<'_> {
    /// Device address of the message, valid on [`stream`](Self::stream) until released.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let frame = rx.recv()?;
    /// // Launch your kernel on the frame's stream, reading the frame's device memory.
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Length in bytes.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let frame = rx.recv()?;
    /// infer(frame.ptr(), frame.len(), frame.stream()); // read only the bytes published
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.m.len as usize
    }

    /// Whether the message is empty.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// while let Ok(frame) = rx.recv() {
    ///     if frame.is_empty() {
    ///         continue; // a keep-alive with no payload
    ///     }
    ///     infer(frame.ptr(), frame.len(), frame.stream());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.m.len == 0
    }

    /// The stream that waits for the message: launch kernels that read it here.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn my_model<S>(_src: u64, _len: usize, _stream: S) {}
    /// let frame = rx.recv()?;
    /// // Hand the raw stream to other CUDA code (cudarc, an inference runtime...).
    /// my_model(frame.ptr(), frame.len(), frame.stream().raw());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        self.stream
    }

    /// Sequence number.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let mut next = 0;
    /// while let Ok(frame) = rx.recv() {
    ///     assert!(frame.seq() >= next); // gaps only where messages were lost (see `lag`)
    ///     next = frame.seq() + 1;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seq(&self) -> u64 {
        self.m.seq
    }

    /// CLOCK_MONOTONIC nanoseconds when the producer published it.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let frame = rx.recv()?;
    /// let age_us = (gpuring::monotonic_ns() - frame.timestamp_ns()) / 1000;
    /// println!("frame {} was published {age_us} µs ago", frame.seq());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timestamp_ns(&self) -> u64 {
        self.m.timestamp_ns
    }

    /// Messages lost (overwritten unread) just before this one.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let frame = rx.recv()?;
    /// if frame.lag() > 0 {
    ///     eprintln!("too slow: {} frames were overwritten before we read them", frame.lag());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lag(&self) -> u64 {
        self.m.lag
    }

    /// Slot index (for diagnostics).
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let frame = rx.recv()?;
    /// eprintln!("message {} is in slot {}", frame.seq(), frame.slot());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot(&self) -> usize {
        self.m.slot
    }

    /// The user header, `user_header_size` bytes.
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// let frame = rx.recv()?;
    /// // The producer published with `slot.publish(len, b"rgba")`; the rest is zero.
    /// if frame.header().starts_with(b"rgba") {
    ///     println!("an RGBA frame of {} bytes", frame.len());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header(&self) -> &[u8] {
        let map = self.consumer.inner.map();
        // SAFETY: the slot is pinned, so no correct producer writes its user header until we
        // release it; the region is `user_header_size` bytes inside the mapping.
        unsafe { std::slice::from_raw_parts(map.user_header(self.m.slot), map.user_header_size()) }
    }

    /// Releases the message after the work queued on its stream so far, reporting a failure
    /// to record the release event (dropping does the same and ignores it).
    ///
    /// ```no_run
    /// # let rx = gpuring::GpuConsumer::open("cam0")?;
    /// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
    /// let frame = rx.recv()?;
    /// infer(frame.ptr(), frame.len(), frame.stream());
    /// frame.release()?; // like drop(frame), but reports a failed event record
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release(self) -> Result<(), CudaError> {
        let this = std::mem::ManuallyDrop::new(self);
        this.consumer.release(&this.m, this.stream)
    }
}

impl Drop for GpuReadSlot<'_> {
    fn drop(&mut self) {
        let _ = self.consumer.release(&self.m, self.stream);
    }
}
