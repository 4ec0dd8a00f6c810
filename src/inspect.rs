//! Looking at rings from outside, without joining them: what the `gpuring` command shows.
//!
//! Everything here reads the segment's counters (written by their owners, see
//! `docs/protocol.md`) and never touches the ring's protocol state, so inspecting a running ring
//! does not disturb it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::error::{OpenError, OpenErrorKind};
use crate::format::{MemoryKind, Params};
use crate::ring::layout::{BLOCKED_ON_CONSUMERS, BLOCKED_ON_HELD};
use crate::ring::Policy;
use crate::shm::ns::{self, Namespaces};
use crate::shm::stale::Refused;
use crate::shm::view::MappedRing;
use crate::shm::{default_dir, presence, OpenOptions, RingDir, Segment, ShmName, SHM_PREFIX};
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
    /// The ring directory it was read from, as this process sees it.
    pub dir: PathBuf,
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
    /// The producer's pid, as its own pid namespace numbers it (for display: from another
    /// container it names another process, or none).
    pub producer_pid: u32,
    /// Whether the producer still runs: it holds the ring's producer lock (`shm::presence`),
    /// in whatever pid namespace it runs.
    pub producer_alive: bool,
    /// The producer's namespaces, as it recorded them (all 0 if it could not tell).
    pub producer_namespaces: Namespaces,
    /// Whether the producer closed the ring.
    pub closed: bool,
    /// Whether it closed the ring because its GPU context was lost (a fault of its own, or
    /// under MPS another client's crash: docs/gpu.md): the ring keeps its name until a
    /// restarted producer replaces it.
    pub context_lost: bool,
    /// The producer instance's epoch.
    pub epoch: u64,
    /// Messages published so far.
    pub published: u64,
    /// Nanoseconds the producer has spent waiting: for a lossless consumer, or for a buffer when
    /// consumers hold every spare. A wait going on is counted as it passes (at least once per
    /// liveness interval), so the total never goes back.
    pub blocked_ns: u64,
    /// The wait going on now, if the producer is waiting.
    pub blocked_now: Option<BlockedNow>,
    /// Consumers the producer evicted (a failure attributable to one consumer's entry, such as
    /// a release event that cannot be opened).
    pub evictions: u64,
    /// Dead consumers whose entries and slots the producer took back.
    pub reclaims: u64,
    /// CUDA rings (read by a build with feature `cuda`): how memory and fences reach the
    /// consumers, which decides where they may run (docs/containers.md).
    pub cuda: Option<CudaSharing>,
    /// The joined consumers.
    pub consumers: Vec<ConsumerInfo>,
}

/// A producer's wait going on now: what [`RingStatus::blocked_now`] shows.
///
/// ```
/// let _tx = gpuring::Producer::builder("doc-inspect-blocked-now").create()?;
/// let s = gpuring::inspect::status("doc-inspect-blocked-now")?;
/// assert!(s.blocked_now.is_none()); // a producer with free buffers does not wait
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedNow {
    /// How long it has waited so far, in nanoseconds.
    pub for_ns: u64,
    /// What it waits for.
    pub on: BlockedOn,
    /// The consumer it waits on: the lossless consumer furthest behind, or the one holding
    /// the most buffers, with its pid (None if the table shows none: it changes meanwhile).
    pub waiting_on: Option<(usize, u32)>,
}

/// What a waiting producer waits for.
///
/// ```
/// use gpuring::inspect::BlockedOn;
/// assert_eq!(BlockedOn::Consumers.name(), "a lossless consumer");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedOn {
    /// A lossless consumer to receive the message its next write would overwrite.
    Consumers,
    /// Consumers to release buffers: they hold the next one and every spare.
    Held,
}

impl BlockedOn {
    /// "a lossless consumer" or "held buffers".
    ///
    /// ```
    /// assert_eq!(gpuring::inspect::BlockedOn::Held.name(), "held buffers");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            BlockedOn::Consumers => "a lossless consumer",
            BlockedOn::Held => "held buffers",
        }
    }
}

/// The wait going on now, from the producer's marks (read from shared memory: any values)
/// and the consumer table. A stall whose waiter has not accounted for [`STALE_NS`] (it gave
/// up, or its wait was dropped) is not shown.
fn blocked_now(since: u64, on: u64, seen: u64, consumers: &[ConsumerInfo]) -> Option<BlockedNow> {
    let now = crate::monotonic_ns();
    if since == 0 || now.saturating_sub(seen) > STALE_NS {
        return None;
    }
    let for_ns = now.saturating_sub(since);
    let on = match on {
        BLOCKED_ON_CONSUMERS => BlockedOn::Consumers,
        BLOCKED_ON_HELD => BlockedOn::Held,
        _ => return None,
    };
    let live = consumers.iter().filter(|c| c.alive && !c.evicted);
    let who = match on {
        BlockedOn::Consumers => {
            live.filter(|c| c.mode == Some(crate::Mode::Lossless)).min_by_key(|c| c.cursor)
        }
        BlockedOn::Held => live.filter(|c| c.holding > 0).max_by_key(|c| c.holding),
    };
    Some(BlockedNow { for_ns, on, waiting_on: who.map(|c| (c.index, c.pid)) })
}

/// A waiting producer accounts at least once per liveness interval (100 ms by default):
/// marks older than this belong to a wait that ended without clearing them.
const STALE_NS: u64 = 2_000_000_000;

/// The names of the rings in the default ring directory (`/dev/shm`, or `GPURING_DIR`),
/// sorted: [`ring_names_in`] that directory.
///
/// ```
/// # let _tx = gpuring::Producer::builder("doc-inspect-ring-names").create()?;
/// let names = gpuring::inspect::ring_names()?;
/// assert!(names.iter().any(|n| n == "doc-inspect-ring-names"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn ring_names() -> io::Result<Vec<String>> {
    ring_names_in(&default_dir())
}

/// The names of the rings in ring directory `dir` (regular files named `gpuring.NAME`),
/// sorted.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("doc-inspect-names-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let _tx = gpuring::Producer::builder("in-dir").dir(&dir).create()?;
/// assert_eq!(gpuring::inspect::ring_names_in(&dir)?, ["in-dir"]);
/// # drop(_tx); std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn ring_names_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_prefix(SHM_PREFIX).map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// Reads ring `name`'s header and counters. The segment is checked like a consumer checks it
/// (the error's [`kind`](OpenError::kind) says what is wrong); another user's ring is read as
/// well, since only counters are read.
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
    status_in(&default_dir(), name)
}

/// [`status`] of ring `name` in ring directory `dir`.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("doc-inspect-status-in-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let _tx = gpuring::Producer::builder("cam").dir(&dir).create()?;
/// let s = gpuring::inspect::status_in(&dir, "cam")?;
/// assert!(s.producer_alive && s.dir == dir);
/// assert!(s.producer_elsewhere().is_empty(), "same namespaces as ours");
/// # drop(_tx); std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn status_in(dir: &Path, name: &str) -> Result<RingStatus, OpenError> {
    read_status(dir, name).map_err(|e| OpenError::in_dir(name, dir, e))
}

impl RingStatus {
    /// The kinds of namespace in which the producer runs elsewhere than this process (pid,
    /// network, IPC, mount): empty when it shares ours, or when either side could not tell.
    ///
    /// ```
    /// # let _tx = gpuring::Producer::builder("doc-inspect-elsewhere").create()?;
    /// let s = gpuring::inspect::status("doc-inspect-elsewhere")?;
    /// let kinds = s.producer_elsewhere();
    /// if !kinds.is_empty() {
    ///     println!("the producer runs {}", gpuring::shm::ns::describe(&kinds));
    /// }
    /// # assert!(kinds.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn producer_elsewhere(&self) -> Vec<ns::Kind> {
        Namespaces::current().differ(&self.producer_namespaces)
    }
}

/// How a CUDA ring shares its memory and fences, as its segment says.
///
/// ```no_run
/// let s = gpuring::inspect::status("cam0")?;
/// if let Some(c) = s.cuda {
///     println!("{} sharing, {} fences", c.sharing, c.fence);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaSharing {
    /// `"legacy"` (IPC handles) or `"vmm"` (file descriptors); `"invalid"` for a value no
    /// producer writes.
    pub sharing: &'static str,
    /// `"events"` (interprocess events) or `"memory"` (words in the segment); `"invalid"` as
    /// above.
    pub fence: &'static str,
}

/// The CUDA ring `map`'s sharing and fences (None for host rings, or without feature `cuda`).
fn cuda_sharing(map: &MappedRing) -> Option<CudaSharing> {
    #[cfg(feature = "cuda")]
    if map.params().memory_kind == MemoryKind::Cuda {
        use crate::format::gpu::{fence_kind, sharing_kind};
        let header = &map.gpu().header;
        // Relaxed (both): written before `magic`, which the open acquired.
        let sharing = match header.sharing.load(Ordering::Relaxed) {
            sharing_kind::LEGACY => "legacy",
            sharing_kind::VMM => "vmm",
            _ => "invalid",
        };
        let fence = match header.fence.load(Ordering::Relaxed) {
            fence_kind::EVENTS => "events",
            fence_kind::MEMORY => "memory",
            _ => "invalid",
        };
        return Some(CudaSharing { sharing, fence });
    }
    let _ = map;
    None
}

/// [`status_in`], failing with what went wrong only.
fn read_status(dir: &Path, name: &str) -> Result<RingStatus, OpenErrorKind> {
    let shm = ShmName::new(name).map_err(OpenErrorKind::InvalidName)?;
    let ring_dir = RingDir::open(dir).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => OpenErrorKind::NotFound,
        _ => OpenErrorKind::Io(e),
    })?;
    let seg = Segment::open(&ring_dir, &shm, OpenOptions { allow_foreign_owner: true })?;
    let (params, layout) = Params::read(seg.header(), seg.len() as u64)?;
    let map = MappedRing::new(seg, params, layout);
    let ring = map.ring();
    let consumers = stats::consumers(map.segment(), &ring);
    // Relaxed: a snapshot for display. A producer that died mid-wait leaves its mark: shown
    // only while it runs.
    let since = ring.producer.blocked_since.load(Ordering::Relaxed);
    let on = ring.producer.blocked_on.load(Ordering::Relaxed);
    let seen = ring.producer.blocked_seen.load(Ordering::Relaxed);
    let alive = map.segment().held(presence::PRODUCER);
    let closed = map.header().closed.load(Ordering::Relaxed);
    let blocked = blocked_now(if alive { since } else { 0 }, on, seen, &consumers);
    Ok(RingStatus {
        name: name.to_owned(),
        dir: dir.to_owned(),
        memory: params.memory_kind,
        capacity: params.capacity,
        spares: params.spares,
        held_buffers: stats::held_buffers(&ring),
        slot_size: params.slot_size,
        user_header_size: params.user_header_size,
        max_consumers: params.max_consumers,
        policy: map.policy(),
        producer_pid: params.producer_pid,
        producer_alive: alive,
        producer_namespaces: Namespaces::from_words(params.producer_ns),
        // Relaxed (all of them): a snapshot for display; nothing is read through them.
        closed: closed != 0,
        context_lost: closed == crate::format::header::CLOSED_LOST,
        epoch: params.epoch,
        published: ring.producer.head.load(Ordering::Relaxed),
        blocked_ns: ring.producer.blocked_ns.load(Ordering::Relaxed),
        blocked_now: blocked,
        evictions: ring.producer.evictions.load(Ordering::Relaxed),
        reclaims: ring.producer.reclaims.load(Ordering::Relaxed),
        cuda: cuda_sharing(&map),
        consumers,
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
            RemoveError::NotFound => write!(f, "no ring by this name"),
            RemoveError::ProducerAlive { pid } => write!(
                f,
                "its producer (pid {pid} in its own pid namespace) is alive; use --force to \
                 remove it anyway"
            ),
            RemoveError::Open(e) => write!(f, "{e}"),
            RemoveError::Io(e) => write!(f, "unlink: {e}"),
        }
    }
}

impl std::error::Error for RemoveError {}

/// Removes ring `name` from the default ring directory: [`remove_in`] that directory.
///
/// ```
/// use gpuring::{inspect, OpenErrorKind};
///
/// let _tx = gpuring::Producer::builder("doc-inspect-remove").create()?;
/// inspect::remove("doc-inspect-remove", true)?; // `force`: its producer still runs
/// let r = gpuring::Consumer::open("doc-inspect-remove");
/// assert!(matches!(r.err().unwrap().kind(), OpenErrorKind::NotFound));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove(name: &str, force: bool) -> Result<(), RemoveError> {
    remove_in(&default_dir(), name, force)
}

/// Removes ring `name` from ring directory `dir`, with the sockets of its instance: refused
/// while its producer is alive unless `force`. The producer's liveness is its lock on the file,
/// so a producer in another pid namespace (another container) is seen alive too. A segment too
/// damaged to read is removed only with `force`.
///
/// ```
/// use gpuring::inspect::{remove_in, RemoveError};
///
/// let dir = std::env::temp_dir().join(format!("doc-inspect-remove-in-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let tx = gpuring::Producer::builder("cam").dir(&dir).create()?;
/// assert!(matches!(remove_in(&dir, "cam", false), Err(RemoveError::ProducerAlive { .. })));
/// assert!(remove_in(&dir, "cam", true).is_ok()); // `force`: removed while it runs
/// assert!(gpuring::inspect::ring_names_in(&dir)?.is_empty());
/// # drop(tx); std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove_in(dir: &Path, name: &str, force: bool) -> Result<(), RemoveError> {
    let shm = ShmName::new(name).map_err(|e| {
        RemoveError::Open(OpenError::in_dir(name, dir, OpenErrorKind::InvalidName(e)))
    })?;
    let status = status_in(dir, name);
    match status {
        Err(e) if matches!(e.kind(), OpenErrorKind::NotFound) => {
            // A killed batcher's status file may outlive its ring.
            crate::batch::BatchStatus::remove(dir, name);
            return Err(RemoveError::NotFound);
        }
        Ok(s) if s.producer_alive && !s.closed && !force => {
            return Err(RemoveError::ProducerAlive { pid: s.producer_pid })
        }
        Err(e) if !force => return Err(RemoveError::Open(e)),
        _ => {}
    }
    let ring_dir = RingDir::open(dir).map_err(RemoveError::Io)?;
    // Checked again under the ring's locks: its producer may have started since.
    crate::shm::stale::remove(&ring_dir, &shm, force).map_err(|e| match e {
        Refused::NotFound => RemoveError::NotFound,
        Refused::Alive { pid } => RemoveError::ProducerAlive { pid },
        Refused::Busy => RemoveError::Io(io::Error::new(
            io::ErrorKind::WouldBlock,
            "another process is replacing or removing it",
        )),
        Refused::Io(e) => RemoveError::Io(e),
    })?;
    // A batch ring's status file (`gpuring stat`'s camera table), left by a batcher that was
    // killed: it goes with the ring.
    crate::batch::BatchStatus::remove(dir, name);
    Ok(())
}
