//! Error types, one per operation, written by hand in the style of `std::sync::mpsc`.

use std::fmt;
use std::io;

use crate::ring::RingCorrupt;

#[cfg(not(loom))]
mod fault;
mod lost;
#[cfg(not(loom))]
pub(crate) use fault::Fault;
#[cfg(feature = "test-support")]
pub use lost::lose_context_after;
#[cfg(not(loom))]
pub(crate) use lost::{check as check_context, or_lost};
pub use lost::{context_lost, exit_status, is_context_lost, ContextLost, EXIT_CONTEXT_LOST};

/// A value in a segment that a correct peer cannot have written.
///
/// The `Corrupt` variant of each operation's error carries one:
///
/// ```
/// # let _tx = gpuring::Producer::builder("doc-error-corruption").create()?;
/// let rx = gpuring::Consumer::open("doc-error-corruption")?;
/// match rx.try_recv() {
///     Err(gpuring::TryRecvError::Corrupt(c)) => eprintln!("ring damaged, stop reading: {c}"),
///     other => assert!(matches!(other, Err(gpuring::TryRecvError::Empty))),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// A header field is out of range or inconsistent.
    Field {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// The ring's shared state (stamps, counts) is damaged.
    Ring(RingCorrupt),
    /// The segment's file was truncated under its mapping (what was past the new end now
    /// reads as zeros).
    Truncated,
    /// A published message is longer than its slot.
    MessageLength {
        /// Length found.
        len: u64,
        /// Slot size.
        slot_size: u64,
    },
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::Field { field, value } => write!(f, "header field {field} = {value}"),
            Corruption::Ring(r) => r.fmt(f),
            Corruption::Truncated => f.write_str("the segment file was truncated while mapped"),
            Corruption::MessageLength { len, slot_size } => {
                write!(f, "message length {len} exceeds slot size {slot_size}")
            }
        }
    }
}

impl std::error::Error for Corruption {}

impl From<RingCorrupt> for Corruption {
    fn from(r: RingCorrupt) -> Self {
        Corruption::Ring(r)
    }
}

/// A ring name that cannot be used.
///
/// ```
/// use gpuring::{CreateErrorKind, NameError, Producer};
///
/// let err = Producer::builder("cams/0").create().unwrap_err();
/// assert!(matches!(err.kind(), CreateErrorKind::InvalidName(NameError::Slash)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameError {
    /// The name is empty.
    Empty,
    /// The name has more than [`crate::MAX_NAME_LEN`] bytes.
    TooLong {
        /// Its length.
        len: usize,
    },
    /// The name contains a `/`.
    Slash,
    /// The name contains a NUL byte.
    Nul,
    /// The name is `.` or `..`.
    Dots,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => f.write_str("ring name is empty"),
            NameError::TooLong { len } => {
                write!(f, "ring name is {len} bytes, more than {}", crate::MAX_NAME_LEN)
            }
            NameError::Slash => f.write_str("ring name contains '/'"),
            NameError::Nul => f.write_str("ring name contains a NUL byte"),
            NameError::Dots => f.write_str("ring name is '.' or '..'"),
        }
    }
}

impl std::error::Error for NameError {}

/// What went wrong creating a ring: the [`kind`](CreateError::kind) of a [`CreateError`].
///
/// A ring name can have only one live producer:
///
/// ```
/// use gpuring::{CreateErrorKind, Producer};
///
/// let _tx = Producer::builder("doc-error-create-error").create()?;
/// let err = Producer::builder("doc-error-create-error").create().unwrap_err();
/// assert!(matches!(err.kind(), CreateErrorKind::AlreadyExists { pid } if *pid == std::process::id()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub enum CreateErrorKind {
    /// The name is not valid.
    InvalidName(NameError),
    /// A configuration value is out of range.
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A ring with this name exists and its producer is alive.
    AlreadyExists {
        /// That producer's pid (0 if the segment was never initialised).
        pid: u32,
    },
    /// The OS refused to create the segment for lack of permission.
    PermissionDenied,
    /// The requested memory kind is not available on this machine.
    MemoryUnavailable {
        /// Why.
        reason: String,
    },
    /// The shared-memory file system (`/dev/shm`) has too little free space for the segment.
    /// Containers often get 64 MiB: give them more (`docker run --shm-size=1g`, or
    /// `--ipc=host`), or make the ring smaller.
    NoSpace {
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes free on the file system when it was tried.
        available: u64,
    },
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// Another OS error.
    Io(io::Error),
}

impl fmt::Display for CreateErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateErrorKind::InvalidName(e) => e.fmt(f),
            CreateErrorKind::InvalidConfig { field, reason } => {
                write!(f, "invalid {field}: {reason}")
            }
            CreateErrorKind::AlreadyExists { pid: 0 } => f.write_str(
                "the ring exists and its producer is alive (or another is replacing it)",
            ),
            CreateErrorKind::AlreadyExists { pid } => {
                write!(f, "the ring exists and its producer (pid {pid}) is alive")
            }
            CreateErrorKind::PermissionDenied => {
                f.write_str("permission denied creating the segment")
            }
            CreateErrorKind::MemoryUnavailable { reason } => {
                write!(f, "memory kind unavailable: {reason}")
            }
            CreateErrorKind::NoSpace { needed, available } => write!(
                f,
                "/dev/shm has {available} bytes free but the ring needs {needed}: enlarge it \
                 (docker: --shm-size or --ipc=host) or make the ring smaller"
            ),
            CreateErrorKind::ContextLost(e) => e.fmt(f),
            CreateErrorKind::Io(e) => write!(f, "creating the segment: {e}"),
        }
    }
}

/// [`Producer::wait_for_consumers`](crate::Producer::wait_for_consumers) ran out of time.
///
/// ```
/// # use gpuring::{ConsumersTimeout, Producer, WaitForConsumersError};
/// # use std::time::Duration;
/// let mut tx = Producer::builder("doc-consumers-timeout").create()?;
/// let e = tx.wait_for_consumers(1, Duration::from_millis(10)).unwrap_err();
/// assert_eq!(e, WaitForConsumersError::Timeout(ConsumersTimeout { joined: 0, wanted: 1 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumersTimeout {
    /// Consumers joined when the time ran out.
    pub joined: usize,
    /// Consumers waited for.
    pub wanted: usize,
}

impl fmt::Display for ConsumersTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of the {} consumers waited for joined before the timeout",
            self.joined, self.wanted
        )
    }
}

impl std::error::Error for ConsumersTimeout {}

/// Why [`Producer::wait_for_consumers`](crate::Producer::wait_for_consumers) returned without
/// the consumers it waited for.
///
/// ```
/// # use gpuring::{Producer, WaitForConsumersError};
/// # use std::time::Duration;
/// let mut tx = Producer::builder("doc-wait-for-consumers-error").create()?;
/// match tx.wait_for_consumers(1, Duration::from_millis(10)) {
///     Ok(joined) => println!("{joined} joined"),
///     Err(WaitForConsumersError::Timeout(t)) => assert_eq!((t.joined, t.wanted), (0, 1)),
///     Err(WaitForConsumersError::ContextLost(lost)) => return Err(lost.into()), // exit 75
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitForConsumersError {
    /// The time ran out first.
    Timeout(ConsumersTimeout),
    /// This process's GPU context was lost while it waited: it must exit and be restarted
    /// (under MPS a faulted process that waits on keeps every other from starting).
    ContextLost(ContextLost),
}

impl fmt::Display for WaitForConsumersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitForConsumersError::Timeout(t) => t.fmt(f),
            WaitForConsumersError::ContextLost(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for WaitForConsumersError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitForConsumersError::Timeout(t) => Some(t),
            WaitForConsumersError::ContextLost(e) => Some(e),
        }
    }
}

impl CreateErrorKind {
    /// The error below this one, for [`std::error::Error::source`].
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CreateErrorKind::InvalidName(e) => Some(e),
            CreateErrorKind::ContextLost(e) => Some(e),
            CreateErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Why [`crate::ProducerBuilder::create`] failed: the ring's name and what went wrong
/// ([`kind`](Self::kind)). Its message names the ring:
///
/// ```
/// use gpuring::{CreateErrorKind, Producer};
///
/// let _tx = Producer::builder("doc-error-create").create()?;
/// let err = Producer::builder("doc-error-create").create().unwrap_err();
/// assert_eq!(err.ring(), "doc-error-create");
/// assert!(matches!(err.kind(), CreateErrorKind::AlreadyExists { .. }));
/// assert_eq!(
///     err.to_string(),
///     format!("ring \"doc-error-create\": the ring exists and its producer (pid {}) is alive", std::process::id())
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CreateError {
    ring: String,
    /// The ring directory it was to be made in.
    dir: std::path::PathBuf,
    kind: CreateErrorKind,
}

impl CreateError {
    /// Ring `ring` could not be created in ring directory `dir`, for reason `kind`.
    ///
    /// ```
    /// use gpuring::{CreateError, CreateErrorKind};
    /// let e = CreateError::in_dir("cam0", "/rings".as_ref(), CreateErrorKind::PermissionDenied);
    /// assert_eq!(e.dir(), std::path::Path::new("/rings"));
    /// ```
    pub fn in_dir(ring: &str, dir: &std::path::Path, kind: CreateErrorKind) -> CreateError {
        CreateError { ring: ring.to_owned(), dir: dir.to_owned(), kind }
    }

    /// The ring directory the ring was to be made in.
    ///
    /// ```
    /// let err = gpuring::Producer::builder("a/b").dir("/rings").create().unwrap_err();
    /// assert_eq!(err.dir(), std::path::Path::new("/rings"));
    /// ```
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The ring's name.
    ///
    /// ```
    /// let err = gpuring::Producer::builder("a/b").create().unwrap_err();
    /// assert_eq!(err.ring(), "a/b");
    /// ```
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// What went wrong.
    ///
    /// ```
    /// use gpuring::{CreateErrorKind, NameError};
    /// let err = gpuring::Producer::builder("a/b").create().unwrap_err();
    /// assert!(matches!(err.kind(), CreateErrorKind::InvalidName(NameError::Slash)));
    /// ```
    pub fn kind(&self) -> &CreateErrorKind {
        &self.kind
    }

    /// What went wrong, by value.
    ///
    /// ```
    /// use gpuring::CreateErrorKind;
    /// let err = gpuring::Producer::builder("").create().unwrap_err();
    /// assert!(matches!(err.into_kind(), CreateErrorKind::InvalidName(_)));
    /// ```
    pub fn into_kind(self) -> CreateErrorKind {
        self.kind
    }
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            CreateErrorKind::NoSpace { needed, available } => write!(
                f,
                "ring {:?}: {} has {available} bytes free but the ring needs {needed}: enlarge \
                 it (docker: --shm-size, or a larger tmpfs volume) or make the ring smaller",
                self.ring,
                self.dir.display()
            ),
            kind => write!(f, "ring {:?}: {kind}", self.ring),
        }
    }
}

impl std::error::Error for CreateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// What went wrong opening a ring: the [`kind`](OpenError::kind) of an [`OpenError`].
///
/// ```
/// use gpuring::{Consumer, OpenErrorKind};
///
/// match Consumer::open("doc-error-open-error-no-such-ring") {
///     Err(e) if matches!(e.kind(), OpenErrorKind::NotFound) => {
///         println!("no ring yet: start the producer first")
///     }
///     other => panic!("expected NotFound, got {:?}", other.err()),
/// }
/// ```
#[derive(Debug)]
pub enum OpenErrorKind {
    /// The name is not valid.
    InvalidName(NameError),
    /// No ring has this name.
    NotFound,
    /// The OS refused access to the segment.
    PermissionDenied,
    /// The segment belongs to another user and the caller did not allow that.
    ForeignOwner {
        /// The owner's uid.
        uid: u32,
    },
    /// The segment is a symlink or not a regular file.
    NotASegment,
    /// The producer has not finished building the segment (or died while building it).
    NotInitialized,
    /// The segment does not start with gpuring's magic number.
    BadMagic {
        /// What was found.
        found: u64,
    },
    /// The segment has another layout version.
    VersionMismatch {
        /// The segment's version.
        found: u32,
        /// This library's version.
        expected: u32,
    },
    /// The segment is smaller than its header says.
    Truncated {
        /// Bytes the header needs.
        needed: u64,
        /// Bytes the file has.
        actual: u64,
    },
    /// A header field is out of range.
    Corrupt(Corruption),
    /// The ring's memory kind cannot be used in this process (no CUDA driver, another GPU...).
    MemoryUnavailable {
        /// Why.
        reason: String,
    },
    /// The consumer asked to read on a GPU that cannot reach the memory of the ring's GPU: the
    /// driver reports no peer access from the one to the other (`cuDeviceCanAccessPeer`).
    /// Read on the ring's GPU, or copy each message once to this one and fan out there
    /// (docs/scaling.md).
    NoPeerAccess {
        /// The device the consumer asked for, as this process numbers devices.
        device: i32,
        /// Its UUID (`GPU-…`, as `nvidia-smi -L` prints it).
        device_uuid: String,
        /// The ring's device, as this process numbers devices.
        ring_device: i32,
        /// Its UUID.
        ring_uuid: String,
    },
    /// The ring holds another kind of memory than this call reads: open a CUDA ring with
    /// `open_gpu`, a host ring with `open`.
    WrongMemory {
        /// The ring's memory kind.
        found: crate::MemoryKind,
    },
    /// Every consumer table entry is taken.
    TooManyConsumers {
        /// The table size.
        max: u32,
    },
    /// The producer of this ring is closed or dead.
    Disconnected,
    /// The producer shares its memory by file descriptor (CUDA VMM sharing) and its peer
    /// policy does not admit this process: no memory was handed over. Run the consumer as the
    /// producer's user, or have the producer allow this uid or one of its groups
    /// ([`PeerPolicy`](crate::PeerPolicy)).
    PeerRefused {
        /// The producer's answer: this process's uid and gid and the policy that refused them.
        reason: String,
    },
    /// A wait for the ring to be ready ran out: it exists, but its producer had not finished
    /// setting it up (a ring that never appeared is [`NotFound`](Self::NotFound)).
    TimedOut,
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// Another OS error.
    Io(io::Error),
}

impl fmt::Display for OpenErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenErrorKind::InvalidName(e) => e.fmt(f),
            OpenErrorKind::NotFound => f.write_str("no ring by this name"),
            OpenErrorKind::PermissionDenied => f.write_str("permission denied opening the segment"),
            OpenErrorKind::ForeignOwner { uid } => {
                write!(f, "segment is owned by uid {uid}, not by this user")
            }
            OpenErrorKind::NotASegment => f.write_str("not a regular shared memory file"),
            OpenErrorKind::NotInitialized => f.write_str("segment is not initialised (half-built)"),
            OpenErrorKind::BadMagic { found } => {
                write!(f, "not a gpuring segment (magic {found:#x})")
            }
            OpenErrorKind::VersionMismatch { found, expected } => {
                write!(f, "segment layout version {found}, this library reads {expected}")
            }
            OpenErrorKind::Truncated { needed, actual } => {
                write!(f, "segment is {actual} bytes, its header needs {needed}")
            }
            OpenErrorKind::Corrupt(c) => write!(f, "corrupt segment: {c}"),
            OpenErrorKind::MemoryUnavailable { reason } => {
                write!(f, "memory kind unavailable: {reason}")
            }
            OpenErrorKind::NoPeerAccess { device, device_uuid, ring_device, ring_uuid } => {
                write!(
                    f,
                    "GPU {device} ({device_uuid}) cannot read the memory of GPU {ring_device} \
                     ({ring_uuid}), where the ring is: the driver reports no peer access between \
                     them; read on GPU {ring_device}, or copy each message once to GPU {device} \
                     (docs/scaling.md)"
                )
            }
            OpenErrorKind::WrongMemory { found } => write!(
                f,
                "the ring holds {} memory; open it with {}",
                found.name(),
                if *found == crate::MemoryKind::Cuda { "open_gpu" } else { "open" }
            ),
            OpenErrorKind::TooManyConsumers { max } => {
                write!(f, "ring already has its maximum of {max} consumers")
            }
            OpenErrorKind::Disconnected => f.write_str(DISCONNECTED),
            OpenErrorKind::PeerRefused { reason } => {
                write!(f, "the producer refused to share its memory with this process: {reason}")
            }
            OpenErrorKind::TimedOut => f.write_str("the ring was not ready within the timeout"),
            OpenErrorKind::ContextLost(e) => e.fmt(f),
            OpenErrorKind::Io(e) => write!(f, "opening the segment: {e}"),
        }
    }
}

impl OpenErrorKind {
    /// The error below this one, for [`std::error::Error::source`].
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenErrorKind::InvalidName(e) => Some(e),
            OpenErrorKind::ContextLost(e) => Some(e),
            OpenErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Why opening a ring failed ([`crate::Consumer::open`] and the other opens): the ring's
/// name and what went wrong ([`kind`](Self::kind)). Its message names the ring:
///
/// ```
/// use gpuring::{Consumer, OpenErrorKind};
///
/// let err = Consumer::open("doc-error-open-missing").unwrap_err();
/// assert!(matches!(err.kind(), OpenErrorKind::NotFound));
/// assert_eq!(err.to_string(), "no ring named \"doc-error-open-missing\" in /dev/shm");
/// ```
///
/// Its `Debug`, which `?` in a `main` that returns `Result<(), Box<dyn Error>>` prints, holds
/// the message too, as `io::Error`'s does:
///
/// ```
/// let err = gpuring::Consumer::open("doc-error-open-debug").unwrap_err();
/// assert_eq!(
///     format!("{err:?}"),
///     r#"OpenError { ring: "doc-error-open-debug", kind: NotFound, message: "no ring named \"doc-error-open-debug\" in /dev/shm" }"#
/// );
/// ```
pub struct OpenError {
    ring: String,
    /// The ring directory it was looked for in.
    dir: std::path::PathBuf,
    kind: OpenErrorKind,
}

impl OpenError {
    /// Ring `ring` could not be opened in ring directory `dir`, for reason `kind`.
    ///
    /// ```
    /// use gpuring::{OpenError, OpenErrorKind};
    /// let e = OpenError::in_dir("cam0", "/rings".as_ref(), OpenErrorKind::NotFound);
    /// assert_eq!(e.to_string(), "no ring named \"cam0\" in /rings");
    /// ```
    pub fn in_dir(ring: &str, dir: &std::path::Path, kind: OpenErrorKind) -> OpenError {
        OpenError { ring: ring.to_owned(), dir: dir.to_owned(), kind }
    }

    /// The ring directory the ring was looked for in.
    ///
    /// ```
    /// let err = gpuring::Consumer::builder("doc-error-open-dir").dir("/tmp").open().unwrap_err();
    /// assert_eq!(err.dir(), std::path::Path::new("/tmp"));
    /// ```
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The ring's name.
    ///
    /// ```
    /// let err = gpuring::Consumer::open("doc-error-open-ring").unwrap_err();
    /// assert_eq!(err.ring(), "doc-error-open-ring");
    /// ```
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// What went wrong.
    ///
    /// ```
    /// use gpuring::OpenErrorKind;
    /// let err = gpuring::Consumer::open("doc-error-open-kind").unwrap_err();
    /// assert!(matches!(err.kind(), OpenErrorKind::NotFound));
    /// ```
    pub fn kind(&self) -> &OpenErrorKind {
        &self.kind
    }

    /// What went wrong, by value.
    ///
    /// ```
    /// use gpuring::OpenErrorKind;
    /// let err = gpuring::Consumer::open("doc-error-open-into-kind").unwrap_err();
    /// assert!(matches!(err.into_kind(), OpenErrorKind::NotFound));
    /// ```
    pub fn into_kind(self) -> OpenErrorKind {
        self.kind
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            OpenErrorKind::NotFound => {
                write!(f, "no ring named {:?} in {}", self.ring, self.dir.display())
            }
            kind => write!(f, "ring {:?}: {kind}", self.ring),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// `Debug` of the errors that name a ring ([`CreateError`], [`OpenError`]): the ring, the kind
/// and, as `io::Error` does for OS errors, the message. A `main` that returns
/// `Result<(), Box<dyn Error>>` prints an error it gets from `?` with `Debug`, and the kind
/// alone would leave out what the message says (the directory looked in, the wording that
/// Rust, the CLI, C and Python share).
macro_rules! debug_with_message {
    ($($ty:ident),+) => {$(
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("ring", &self.ring)
                    .field("kind", &self.kind)
                    .field("message", &self.to_string())
                    .finish()
            }
        }
    )+};
}

debug_with_message!(CreateError, OpenError);

/// Why [`crate::Consumer::try_recv`] returned no message.
///
/// ```
/// use gpuring::{Consumer, TryRecvError};
/// # let _tx = gpuring::Producer::builder("doc-error-try-recv-error").create()?;
///
/// let rx = Consumer::open("doc-error-try-recv-error")?;
/// match rx.try_recv() {
///     Ok(msg) => println!("{} bytes", msg.len()),
///     Err(TryRecvError::Empty) => println!("nothing yet: do other work"),
///     Err(e) => return Err(e.into()),
/// }
/// # assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TryRecvError {
    /// No message is waiting.
    Empty,
    /// The producer closed or died and every message was received.
    Disconnected,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// How a ring's stream ended, once a consumer is [`Disconnected`](RecvError::Disconnected):
/// [`Consumer::ended`](crate::Consumer::ended). A recording or batch job can tell a complete
/// stream from a cut one.
///
/// ```
/// use gpuring::{Consumer, Ended, Producer};
///
/// let tx = Producer::builder("doc-error-ended").create()?;
/// let rx = Consumer::open("doc-error-ended")?;
/// assert_eq!(rx.ended(), None); // the producer is live
/// drop(tx);
/// assert_eq!(rx.ended(), Some(Ended::Closed));
/// assert_eq!(Ended::Died.to_string(), "the producer died");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    /// The producer closed the ring (dropped its `Producer`, or `close`d it in Python or C):
    /// everything it published was delivered.
    Closed,
    /// The producer's process ended without closing the ring (killed, crashed): the stream
    /// was cut; messages it had not published are lost.
    Died,
    /// The producer's GPU context was lost ([`ContextLost`]: a fault of its own, or under MPS
    /// another client's crash): the stream was cut. A restarted producer makes the ring anew.
    ContextLost,
}

impl Ended {
    /// "closed" or "died".
    ///
    /// ```
    /// assert_eq!(gpuring::Ended::Closed.name(), "closed");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Ended::Closed => "closed",
            Ended::Died => "died",
            Ended::ContextLost => "context lost",
        }
    }
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ended::Closed => "the producer closed the ring",
            Ended::Died => "the producer died",
            Ended::ContextLost => "the producer's GPU context was lost",
        })
    }
}

/// Why [`crate::Consumer::recv`] returned no message.
///
/// Once the producer is gone, a consumer still receives what was published, then
/// `Disconnected`:
///
/// ```
/// use gpuring::{Consumer, Producer, RecvError};
///
/// let mut tx = Producer::builder("doc-error-recv-error").create()?;
/// let rx = Consumer::open("doc-error-recv-error")?;
/// tx.send(b"last", b"")?;
/// drop(tx); // closes the ring
/// assert_eq!(&*rx.recv()?, b"last");
/// assert_eq!(rx.recv().err(), Some(RecvError::Disconnected));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// The producer closed or died and every message was received.
    Disconnected,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::Consumer::recv_timeout`] returned no message.
///
/// ```
/// use gpuring::{Consumer, RecvTimeoutError};
/// use std::time::Duration;
/// # let _tx = gpuring::Producer::builder("doc-error-recv-timeout-error").create()?;
///
/// let rx = Consumer::open("doc-error-recv-timeout-error")?; // nothing was sent
/// let r = rx.recv_timeout(Duration::from_millis(10));
/// assert_eq!(r.err(), Some(RecvTimeoutError::Timeout));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvTimeoutError {
    /// No message came in time.
    Timeout,
    /// The producer closed or died and every message was received.
    Disconnected,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::Producer::try_acquire`] returned no slot.
///
/// ```
/// use gpuring::{Consumer, Producer, TryAcquireError};
///
/// let mut tx = Producer::builder("doc-error-try-acquire-error").capacity(1).create()?;
/// let _rx = Consumer::open("doc-error-try-acquire-error")?; // joins, but reads nothing
/// tx.send(b"one", b"")?; // fills the only slot
/// assert_eq!(tx.try_acquire().err(), Some(TryAcquireError::Full));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TryAcquireError {
    /// The next slot is not free: a `Block` consumer is a full ring behind, or a consumer holds
    /// it (or, in a CUDA ring, its readers' GPUs are still reading it).
    Full,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::Producer::acquire`] returned no slot.
///
/// ```
/// use gpuring::{AcquireError, Producer};
///
/// let mut tx = Producer::builder("doc-error-acquire-error").create()?;
/// match tx.acquire() {
///     Ok(slot) => println!("writing message {}", slot.seq()),
///     Err(AcquireError::Corrupt(c)) => eprintln!("ring damaged: {c}"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::Producer::acquire_timeout`] returned no slot.
///
/// ```
/// use gpuring::{AcquireTimeoutError, Consumer, Producer};
/// use std::time::Duration;
///
/// let mut tx = Producer::builder("doc-error-acquire-timeout-error").capacity(1).create()?;
/// let _rx = Consumer::open("doc-error-acquire-timeout-error")?; // joins, but reads nothing
/// tx.send(b"one", b"")?; // fills the only slot
/// let r = tx.acquire_timeout(Duration::from_millis(10));
/// assert_eq!(r.err(), Some(AcquireTimeoutError::Timeout));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireTimeoutError {
    /// No slot came free in time.
    Timeout,
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::WriteSlot::publish`] refused a message.
///
/// ```
/// use gpuring::{Producer, PublishError};
///
/// let mut tx = Producer::builder("doc-error-publish-error").slot_size(16).create()?;
/// let slot = tx.acquire()?;
/// let err = slot.publish(17, b"").unwrap_err();
/// assert_eq!(err, PublishError::TooLong { len: 17, slot_size: 16 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishError {
    /// The length exceeds the slot size.
    TooLong {
        /// Requested length.
        len: usize,
        /// Slot size.
        slot_size: usize,
    },
    /// The user header exceeds the ring's user-header size.
    HeaderTooLong {
        /// Requested length.
        len: usize,
        /// The ring's user-header size.
        max: usize,
    },
    /// CUDA rings, `publish_region`: the pool id is not one of this producer's.
    UnknownPool,
    /// CUDA rings, `publish_region`: the region does not lie inside its pool.
    OutsidePool {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The pool's size.
        size: u64,
    },
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`crate::Producer::send`] failed.
///
/// ```
/// use gpuring::{Producer, PublishError, SendError};
///
/// let mut tx = Producer::builder("doc-error-send-error").user_header_size(8).create()?;
/// let err = tx.send(b"frame", &[0; 9]).unwrap_err();
/// assert_eq!(err, SendError::Publish(PublishError::HeaderTooLong { len: 9, max: 8 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The message or header does not fit.
    Publish(PublishError),
    /// The segment is damaged.
    Corrupt(Corruption),
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// A CUDA call failed (CUDA rings).
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
}

/// Why [`Producer::register`](crate::Producer::register) (CUDA rings) refused an allocation.
///
/// ```no_run
/// use gpuring::cuda::DevicePool;
/// use gpuring::RegisterError;
/// # let mut tx = gpuring::Producer::builder("cam0").create_gpu(0)?;
/// let surfaces = DevicePool::new(tx.context(), 64 << 20)?;
/// match tx.register(surfaces) {
///     Ok(id) => println!("registered as {id:?}"),
///     Err(RegisterError::TableFull) => eprintln!("too many pools: reuse a registered one"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(all(feature = "cuda", not(loom)))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterError {
    /// All pool table entries are used.
    TableFull,
    /// The allocation is not on the ring's device.
    OtherDevice,
    /// The allocation cannot be shared the way the ring shares memory: a legacy `cuMemAlloc`
    /// pool on a VMM ring (use [`Producer::alloc_pool`](crate::Producer::alloc_pool)), or a
    /// VMM one on a legacy ring.
    WrongSharing {
        /// How the ring shares its memory: `"legacy"` or `"vmm"`.
        ring: &'static str,
    },
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// The driver refused (for example an allocation from a stream-ordered pool, which legacy
    /// IPC cannot share).
    Cuda(crate::cuda::CudaError),
}

/// Why [`ReadSlot::release`](crate::ReadSlot) (CUDA rings) could not record the release: the
/// message is released all the same.
///
/// ```no_run
/// use gpuring::ReleaseError;
/// # let rx = gpuring::Consumer::open_gpu("cam0")?;
/// let frame = rx.recv()?;
/// match frame.release() {
///     Ok(()) => {}
///     Err(ReleaseError::ContextLost(lost)) => return Err(lost.into()), // exit 75
///     Err(e) => eprintln!("{e}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(all(feature = "cuda", not(loom)))]
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseError {
    /// This process's GPU context is lost: it must exit and be restarted.
    ContextLost(ContextLost),
    /// Recording the release failed.
    Cuda(crate::cuda::CudaError),
}

/// Display and `Error` for one of the operation errors above; every one of them also has the
/// `ContextLost` variant and, for CUDA rings, the `Cuda` variant, each shown as the error it
/// carries and given as its source. A CUDA error that lost the context becomes `ContextLost`.
macro_rules! display {
    ($ty:ident { $($pat:pat => $($fmt:expr),+;)* }) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $($pat => write!(f, $($fmt),+),)*
                    $ty::ContextLost(e) => e.fmt(f),
                    #[cfg(all(feature = "cuda", not(loom)))]
                    $ty::Cuda(e) => e.fmt(f),
                }
            }
        }
        impl std::error::Error for $ty {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                match self {
                    $ty::ContextLost(e) => Some(e),
                    #[cfg(all(feature = "cuda", not(loom)))]
                    $ty::Cuda(e) => Some(e),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
        impl From<ContextLost> for $ty {
            fn from(e: ContextLost) -> Self {
                $ty::ContextLost(e)
            }
        }
        #[cfg(all(feature = "cuda", not(loom)))]
        impl From<crate::cuda::CudaError> for $ty {
            fn from(e: crate::cuda::CudaError) -> Self {
                match e {
                    crate::cuda::CudaError::Driver(d) if d.loses_process_context() => $ty::ContextLost(d.into()),
                    e => $ty::Cuda(e),
                }
            }
        }
        #[cfg(all(feature = "cuda", not(loom)))]
        impl From<crate::cuda::DriverError> for $ty {
            fn from(e: crate::cuda::DriverError) -> Self {
                crate::cuda::CudaError::from(e).into()
            }
        }
    };
}

// After `display!`, which it uses.
mod loan;
pub use loan::{EndLoanError, LendError, PublishLoanError};

/// What every `Disconnected` says, in Rust, the CLI, C and Python. Where the cause is known,
/// [`Ended`]'s message says which ("the producer closed the ring" / "the producer died").
pub(crate) const DISCONNECTED: &str = "the producer closed the ring or died";

display!(TryRecvError {
    TryRecvError::Empty => "no message waiting";
    TryRecvError::Disconnected => "{}", DISCONNECTED;
    TryRecvError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(RecvError {
    RecvError::Disconnected => "{}", DISCONNECTED;
    RecvError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(RecvTimeoutError {
    RecvTimeoutError::Timeout => "timed out waiting for a message";
    RecvTimeoutError::Disconnected => "{}", DISCONNECTED;
    RecvTimeoutError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(TryAcquireError {
    TryAcquireError::Full => "no free slot";
    TryAcquireError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(AcquireError {
    AcquireError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(AcquireTimeoutError {
    AcquireTimeoutError::Timeout => "timed out waiting for a free slot";
    AcquireTimeoutError::Corrupt(c) => "corrupt segment: {}", c;
});
display!(PublishError {
    PublishError::TooLong { len, slot_size } => "message of {} bytes exceeds slot size {}", len, slot_size;
    PublishError::HeaderTooLong { len, max } => "user header of {} bytes exceeds {}", len, max;
    PublishError::UnknownPool => "no such pool in this producer";
    PublishError::OutsidePool { offset, len, size } => "region {}+{} lies outside the {}-byte pool", offset, len, size;
});
#[cfg(all(feature = "cuda", not(loom)))]
display!(ReleaseError {});
#[cfg(all(feature = "cuda", not(loom)))]
display!(RegisterError {
    RegisterError::TableFull => "the ring's pool table is full";
    RegisterError::OtherDevice => "the allocation is on another device";
    RegisterError::WrongSharing { ring } => "the allocation cannot be shared by this ring's {} sharing: allocate it with Producer::alloc_pool", ring;
});
display!(SendError {
    SendError::Publish(e) => "{}", e;
    SendError::Corrupt(c) => "corrupt segment: {}", c;
});

/// A publish's error as `send`'s: a lost context is `send`'s own `ContextLost`, the rest is
/// `Publish`.
impl From<PublishError> for SendError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::ContextLost(l) => SendError::ContextLost(l),
            e => SendError::Publish(e),
        }
    }
}
