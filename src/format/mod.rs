//! The segment format, in one place: what a ring's shared-memory file holds and how it is laid
//! out. Pure data (every field an atomic), no system calls:
//!
//! * [`header`]: the header, the parameters it carries and the layout of the regions that follow;
//! * [`gpu`]: the tables a CUDA ring adds (device, pools, slot descriptors, release events) and
//!   the checks a consumer makes on them before it forms a device pointer;
//! * [`offer`]: what a VMM producer sends with its pools' file descriptors;
//!
//! The ring's own lines (`ProducerLine`, `ConsumerEntry`, `BufferLine`, `WakeLine`) live in
//! [`crate::ring::layout`] beside the protocol that uses them; this module places them. The
//! typed view of a mapped segment (`MappedRing`) is the OS layer's (`crate::shm::view`): it holds
//! the mapping.

#[cfg(all(feature = "cuda", not(loom)))]
pub mod gpu;
pub mod header;
#[cfg(all(feature = "cuda", not(loom)))]
pub mod offer;

pub use header::{Header, Layout, MemoryKind, Params, GPU_POOLS, LAYOUT_VERSION, MAGIC};
