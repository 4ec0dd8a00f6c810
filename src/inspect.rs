//! Looking at rings from outside, without joining them: what the `gpuring` command shows.
//!
//! Everything here reads the segment's counters (written by their owners, see
//! `docs/protocol.md`) and never touches the ring's protocol state, so inspecting a running ring
//! does not disturb it.

use std::io;
use std::sync::atomic::Ordering;

use crate::error::OpenError;
use crate::format::view::MappedRing;
use crate::format::{MemoryKind, Params};
use crate::ring::Policy;
use crate::shm::process::ProcessId;
use crate::shm::{OpenOptions, Segment, ShmName, SHM_PREFIX};
use crate::stats::{self, ConsumerInfo};

/// A ring's configuration and counters at one moment.
///
/// ```
/// # let _tx = gpuring::Producer::builder("doc-inspect-ring-status").capacity(4).create()?;
/// let s = gpuring::inspect::status("doc-inspect-ring-status")?;
/// assert_eq!((s.capacity, s.published), (4, 0));
/// println!("{}: {} consumers, producer pid {}", s.name, s.consumers.len(), s.producer_pid);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RingStatus {
    /// The ring's name.
    pub name: String,
    /// Host or CUDA memory.
    pub memory: MemoryKind,
    /// Slots: the messages the ring holds.
    pub capacity: u32,
    /// Spare buffers, swapped in for buffers that consumers hold when the producer laps them.
    pub spares: u32,
    /// Buffers (of `capacity + spares`) that some consumer holds now. When every candidate of
    /// the next claim is among them, the producer waits; `ConsumerInfo::oldest_held` says who
    /// holds what.
    pub held_buffers: usize,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Bytes of user header per slot.
    pub user_header_size: u32,
    /// Size of the consumer table.
    pub max_consumers: u32,
    /// The delivery mode of consumers that do not choose one.
    pub policy: Policy,
    /// The producer's pid.
    pub producer_pid: u32,
    /// Whether that process still runs (same pid and start time).
    pub producer_alive: bool,
    /// Whether the producer closed the ring.
    pub closed: bool,
    /// The producer instance's epoch.
    pub epoch: u64,
    /// Messages published so far.
    pub published: u64,
    /// Nanoseconds the producer has spent waiting: for a lossless consumer, or for a buffer when
    /// consumers hold every spare.
    pub blocked_ns: u64,
    /// Consumers the producer evicted (a failure attributable to one consumer's entry, such as
    /// a release event that cannot be opened).
    pub evictions: u64,
    /// Dead consumers whose entries and slots the producer took back.
    pub reclaims: u64,
    /// The joined consumers.
    pub consumers: Vec<ConsumerInfo>,
}

/// The names of the rings in `/dev/shm` (files named `gpuring.NAME`), sorted.
///
/// ```
/// # let _tx = gpuring::Producer::builder("doc-inspect-ring-names").create()?;
/// let names = gpuring::inspect::ring_names()?;
/// assert!(names.iter().any(|n| n == "doc-inspect-ring-names"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn ring_names() -> io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_prefix(SHM_PREFIX).map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// Reads ring `name`'s header and counters. The segment is checked like a consumer checks it
/// (`OpenError` says what is wrong); another user's ring is read as well, since only counters
/// are read.
///
/// ```
/// use gpuring::{inspect, MemoryKind, Producer};
///
/// let _tx = Producer::builder("doc-inspect-status").create()?;
/// let s = inspect::status("doc-inspect-status")?;
/// assert!(s.producer_alive && !s.closed);
/// assert_eq!(s.memory, MemoryKind::Host);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn status(name: &str) -> Result<RingStatus, OpenError> {
    let shm = ShmName::new(name).map_err(OpenError::InvalidName)?;
    let seg = Segment::open(&shm, OpenOptions { allow_foreign_owner: true })?;
    let (params, layout) = Params::read(seg.header(), seg.len() as u64)?;
    let map = MappedRing::new(seg, params, layout);
    let ring = map.ring();
    let producer = ProcessId { pid: params.producer_pid, start_time: params.producer_start_time };
    Ok(RingStatus {
        name: name.to_owned(),
        memory: params.memory_kind,
        capacity: params.capacity,
        spares: params.spares,
        held_buffers: stats::held_buffers(&ring),
        slot_size: params.slot_size,
        user_header_size: params.user_header_size,
        max_consumers: params.max_consumers,
        policy: map.policy(),
        producer_pid: params.producer_pid,
        producer_alive: producer.is_alive(),
        // Relaxed (all of them): a snapshot for display; nothing is read through them.
        closed: map.header().closed.load(Ordering::Relaxed) != 0,
        epoch: params.epoch,
        published: ring.producer.head.load(Ordering::Relaxed),
        blocked_ns: ring.producer.blocked_ns.load(Ordering::Relaxed),
        evictions: ring.producer.evictions.load(Ordering::Relaxed),
        reclaims: ring.producer.reclaims.load(Ordering::Relaxed),
        consumers: stats::consumers(&ring),
    })
}

/// Why [`remove`] did not remove a ring.
///
/// ```
/// use gpuring::inspect::{remove, RemoveError};
///
/// let _tx = gpuring::Producer::builder("doc-inspect-remove-error").create()?;
/// let err = remove("doc-inspect-remove-error", false).unwrap_err();
/// assert!(matches!(err, RemoveError::ProducerAlive { pid } if pid == std::process::id()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum RemoveError {
    /// No ring of that name.
    NotFound,
    /// Its producer still runs; pass `force` to remove the name anyway (the producer and its
    /// consumers keep their mappings; new consumers can no longer open it).
    ProducerAlive {
        /// The producer's pid.
        pid: u32,
    },
    /// The name is invalid, or the segment could not be read to check its producer.
    Open(OpenError),
    /// Unlinking failed (permissions).
    Io(io::Error),
}

impl std::fmt::Display for RemoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveError::NotFound => write!(f, "no such ring"),
            RemoveError::ProducerAlive { pid } => {
                write!(f, "its producer (pid {pid}) is alive; use --force to remove it anyway")
            }
            RemoveError::Open(e) => write!(f, "{e}"),
            RemoveError::Io(e) => write!(f, "unlink: {e}"),
        }
    }
}

impl std::error::Error for RemoveError {}

/// Removes ring `name` from `/dev/shm`: refused while its producer is alive unless `force`. A
/// segment too damaged to read is removed only with `force`.
///
/// ```
/// use gpuring::{inspect, OpenError};
///
/// let _tx = gpuring::Producer::builder("doc-inspect-remove").create()?;
/// inspect::remove("doc-inspect-remove", true)?; // `force`: its producer still runs
/// let r = gpuring::Consumer::open("doc-inspect-remove");
/// assert!(matches!(r.err(), Some(OpenError::NotFound)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove(name: &str, force: bool) -> Result<(), RemoveError> {
    let shm = ShmName::new(name).map_err(|e| RemoveError::Open(OpenError::InvalidName(e)))?;
    match status(name) {
        Err(OpenError::NotFound) => return Err(RemoveError::NotFound),
        Ok(s) if s.producer_alive && !s.closed && !force => {
            return Err(RemoveError::ProducerAlive { pid: s.producer_pid })
        }
        Err(e) if !force => return Err(RemoveError::Open(e)),
        _ => {}
    }
    Segment::unlink_name(&shm).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => RemoveError::NotFound,
        _ => RemoveError::Io(e),
    })
}
