//! The OS layer: POSIX shared memory segments, their header, names, owner checks, process
//! identity, replacing a dead producer's segment (`stale`), the doorbells that wake async
//! waiters, and the socket that hands fds to peers. Nothing here knows the ring protocol; it
//! places bytes and checks them.

pub mod doorbell;
#[cfg(not(loom))]
pub mod fdpass;
mod guard;
mod name;
pub mod process;
mod segment;
#[cfg(not(loom))]
pub(crate) mod stale;

pub use name::{ShmName, MAX_NAME_LEN, SHM_PREFIX};
pub use segment::{OpenOptions, Segment};
