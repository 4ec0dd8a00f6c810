//! Errors of the CUDA-memory producer and consumer, one per operation family.

use std::fmt;

use crate::cuda::CudaError;
use crate::error::Corruption;

/// Why [`GpuProducer`](super::GpuProducer)'s `try_acquire`, `acquire`, `acquire_on` or
/// `acquire_timeout` returned no slot.
///
/// ```no_run
/// use gpuring::gpu::GpuAcquireError;
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// # fn render(_dst: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
/// match tx.try_acquire() {
///     Ok(slot) => { render(slot.ptr(), 4096, slot.stream()); slot.publish(4096, b"")?; }
///     Err(GpuAcquireError::Full) => {} // the consumers are behind: skip this frame
///     Err(GpuAcquireError::Cuda(e)) => eprintln!("GPU error: {e}"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum GpuAcquireError {
    /// `try_acquire` only: no slot is free now.
    Full,
    /// `acquire_timeout` only: no slot became free in time.
    Timeout,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// Making the stream wait for the slot's readers failed.
    Cuda(CudaError),
}

/// Why [`GpuWriteSlot::publish`](super::GpuWriteSlot::publish) (or `publish_region`) failed.
/// The slot stays claimed; acquire it again.
///
/// ```no_run
/// use gpuring::gpu::GpuPublishError;
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let slot = tx.acquire()?;
/// match slot.publish(4096, b"rgba") {
///     Ok(seq) => println!("published message {seq}"),
///     Err(GpuPublishError::TooLong { len, slot_size }) => eprintln!("{len} > {slot_size} bytes"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum GpuPublishError {
    /// The message is longer than the ring's slot size.
    TooLong {
        /// Requested length.
        len: u64,
        /// Slot size.
        slot_size: u64,
    },
    /// The user header is longer than the ring's user-header size.
    HeaderTooLong {
        /// Its length.
        len: usize,
        /// The ring's user-header size.
        max: usize,
    },
    /// `publish_region`: the pool id is not one this producer registered.
    UnknownPool,
    /// `publish_region`: the region does not lie inside the registered allocation.
    OutsidePool {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The allocation's size.
        size: u64,
    },
    /// Recording the slot's ready event failed.
    Cuda(CudaError),
}

/// Why [`GpuConsumer`](super::GpuConsumer)'s `try_recv`, `recv`, `recv_on` or `recv_timeout`
/// returned no message.
///
/// ```no_run
/// use gpuring::gpu::GpuRecvError;
/// # let rx = gpuring::GpuConsumer::open("cam0")?;
/// # fn infer(_src: u64, _len: usize, _stream: &gpuring::cuda::Stream) {}
/// loop {
///     match rx.recv() {
///         Ok(frame) => infer(frame.ptr(), frame.len(), frame.stream()),
///         Err(GpuRecvError::Disconnected) => break, // the producer is gone, the ring drained
///         Err(e) => return Err(e.into()),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum GpuRecvError {
    /// `try_recv` only: nothing is waiting.
    Empty,
    /// `recv_timeout` only: nothing arrived in time.
    Timeout,
    /// The producer closed (or died) and every message it published was received.
    Disconnected,
    /// The segment is damaged (a descriptor outside its pool, a stamp...).
    Corrupt(Corruption),
    /// Mapping a pool or making the stream wait for the message failed.
    Cuda(CudaError),
}

/// Why [`GpuProducer::register`](super::GpuProducer::register) refused an allocation.
///
/// ```no_run
/// use gpuring::cuda::DevicePool;
/// use gpuring::gpu::RegisterError;
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let surfaces = DevicePool::new(tx.context(), 64 << 20)?;
/// match tx.register(surfaces) {
///     Ok(id) => println!("registered as {id:?}"),
///     Err(RegisterError::TableFull) => eprintln!("too many pools: reuse a registered one"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum RegisterError {
    /// All pool table entries are used.
    TableFull,
    /// The allocation is not on the ring's device.
    OtherDevice,
    /// The driver refused (for example an allocation from a stream-ordered pool, which legacy
    /// IPC cannot share).
    Cuda(CudaError),
}

impl fmt::Display for GpuAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuAcquireError::Full => f.write_str("no free slot"),
            GpuAcquireError::Timeout => f.write_str("timed out waiting for a free slot"),
            GpuAcquireError::Corrupt(c) => write!(f, "corrupt segment: {c}"),
            GpuAcquireError::Cuda(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for GpuPublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuPublishError::TooLong { len, slot_size } => {
                write!(f, "message of {len} bytes exceeds the slot size {slot_size}")
            }
            GpuPublishError::HeaderTooLong { len, max } => {
                write!(f, "user header of {len} bytes exceeds the ring's {max}")
            }
            GpuPublishError::UnknownPool => f.write_str("no such pool in this producer"),
            GpuPublishError::OutsidePool { offset, len, size } => {
                write!(f, "region {offset}+{len} lies outside the {size}-byte allocation")
            }
            GpuPublishError::Cuda(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for GpuRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuRecvError::Empty => f.write_str("no message waiting"),
            GpuRecvError::Timeout => f.write_str("timed out waiting for a message"),
            GpuRecvError::Disconnected => f.write_str("the producer closed"),
            GpuRecvError::Corrupt(c) => write!(f, "corrupt segment: {c}"),
            GpuRecvError::Cuda(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::TableFull => f.write_str("the ring's pool table is full"),
            RegisterError::OtherDevice => f.write_str("the allocation is on another device"),
            RegisterError::Cuda(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GpuAcquireError {}
impl std::error::Error for GpuPublishError {}
impl std::error::Error for GpuRecvError {}
impl std::error::Error for RegisterError {}

impl From<crate::cuda::DriverError> for GpuAcquireError {
    fn from(e: crate::cuda::DriverError) -> Self {
        GpuAcquireError::Cuda(e.into())
    }
}

impl From<crate::cuda::DriverError> for GpuPublishError {
    fn from(e: crate::cuda::DriverError) -> Self {
        GpuPublishError::Cuda(e.into())
    }
}

impl From<crate::cuda::DriverError> for GpuRecvError {
    fn from(e: crate::cuda::DriverError) -> Self {
        GpuRecvError::Cuda(e.into())
    }
}
