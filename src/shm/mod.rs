//! The OS layer: shared memory segments in a ring directory, their header, names, owner checks,
//! liveness locks (`presence`), namespace identities, replacing a dead producer's segment
//! (`stale`), the doorbells that wake async waiters, the socket that hands fds to peers, the
//! typed view of a mapped segment (`view`: where offsets of the segment format become
//! references) and the one blocking wait (`wait`: spin, yield, futex). Nothing here drives the
//! ring protocol; it places bytes, checks them and waits on them.

#[cfg(not(loom))]
pub(crate) mod clock;
pub mod dir;
pub mod doorbell;
#[cfg(not(loom))]
pub mod fdpass;
mod guard;
mod name;
pub mod ns;
pub mod presence;
pub mod process;
mod segment;
#[cfg(not(loom))]
pub(crate) mod stale;
pub mod unixsock;
#[cfg(not(loom))]
pub(crate) mod view;
#[cfg(not(loom))]
pub(crate) mod wait;
#[cfg(all(feature = "tokio", not(loom)))]
pub(crate) mod wait_async;
#[cfg(not(loom))]
pub(crate) mod waiter;

pub use dir::{default_dir, RingDir, DIR_ENV};
pub use name::{ShmName, MAX_NAME_LEN, SHM_PREFIX};
pub use segment::{OpenOptions, Segment};
