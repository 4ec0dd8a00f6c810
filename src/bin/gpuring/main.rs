//! The `gpuring` command: list, inspect and remove rings, and a quick bench.
//!
//! ```text
//! gpuring list [--json]
//! gpuring stat NAME [--watch] [--json]
//! gpuring rm NAME [--force] [--json]
//! gpuring doctor [--json] [--quick]
//! gpuring bench [--memory auto|host|cuda] [--consumers N] [--size BYTES] [--seconds S]
//!               [--capacity N] [--policy block|overwrite] [--slow-hold-ms MS] [--json]
//! gpuring batch --inputs CAM0,CAM1,... --ring NAME [--max-wait-ms MS | --rate R]
//!               [--fill previous|zeros] [--mode latest|lossless] [--dtype T --shape D,D,...]
//! gpuring bridge export RING [--key K] [--mode M] [--connect E] [--listen E]   (feature zenoh)
//! gpuring bridge import KEY --ring NAME [--connect E] [--listen E]
//! ```

#[cfg(not(loom))]
mod batch;
#[cfg(not(loom))]
mod bench;
#[cfg(all(feature = "zenoh", not(loom)))]
mod bridge;
#[cfg(not(loom))]
mod cli;
#[cfg(not(loom))]
mod doctor;
#[cfg(not(loom))]
mod exporter;
#[cfg(not(loom))]
mod size;

#[cfg(not(loom))]
fn main() -> std::process::ExitCode {
    cli::main()
}

/// Under `--cfg loom` the library is only the ring protocol (for `tests/loom.rs`), but cargo
/// still builds this binary beside the integration tests: there it is an empty program.
#[cfg(loom)]
fn main() {}
