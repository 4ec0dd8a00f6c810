//! gpuring: a broadcast ring of buffers from one producer process to many consumer processes.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod ring;
