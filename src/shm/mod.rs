//! The OS layer: POSIX shared memory segments, their header, names, owner checks, process
//! identity and the doorbells that wake async waiters. Nothing here knows the ring protocol; it
//! places bytes and checks them.

pub mod doorbell;
mod guard;
mod header;
mod name;
pub mod process;
mod segment;

pub use header::{Header, Layout, MemoryKind, Params, GPU_POOLS, LAYOUT_VERSION, MAGIC};
pub use name::{ShmName, MAX_NAME_LEN, SHM_PREFIX};
pub use segment::{OpenOptions, Segment};
