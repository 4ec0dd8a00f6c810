//! `gpuring bridge export|import` (feature `zenoh`): carries a ring to other hosts over Zenoh
//! ([`gpuring::bridge`], docs/bridge.md). Runs until SIGINT or SIGTERM; logs with `tracing`
//! (`RUST_LOG=gpuring=debug` for more). Both sides use the ring directory of the global
//! `--dir` (which sets `GPURING_DIR` for the process), else `$GPURING_DIR`, else /dev/shm.

use std::path::PathBuf;
use std::process::ExitCode;

use gpuring::bridge::{self, ExportOptions, ImportOptions, ZenohMode, ZenohOptions};
use gpuring::{MemoryKind, Mode, StartAt};

/// `gpuring bridge`'s subcommands.
#[derive(clap::Subcommand)]
pub enum Options {
    /// Join ring RING as a consumer and publish each message on a Zenoh key.
    Export {
        /// The ring.
        ring: String,
        /// The key (default: gpuring/HOST/RING).
        #[arg(long)]
        key: Option<String>,
        /// The exporter's delivery mode: latest (live streams), lossless (recordings: nothing
        /// is lost end to end) or queue.
        #[arg(long, default_value = "latest", value_parser = crate::cli::parse_mode)]
        mode: Mode,
        /// Where to start when joining: newest, next or oldest.
        #[arg(long, default_value = "newest", value_parser = parse_start)]
        start: StartAt,
        #[command(flatten)]
        zenoh: ZenohArgs,
    },
    /// Subscribe to a Zenoh key and produce what arrives into local ring --ring.
    Import {
        /// The key (as `export` printed it; wildcards allowed, for one source).
        key: String,
        /// The local ring to produce into.
        #[arg(long)]
        ring: String,
        /// Each time the ring is made, wait for N consumers before publishing into it.
        #[arg(long, default_value_t = 0)]
        wait_for_consumers: usize,
        /// The local ring's memory: host or cuda (whatever the source's is).
        #[arg(long, default_value = "host", value_parser = parse_memory)]
        memory: MemoryKind,
        /// The GPU of a CUDA local ring.
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// The most memory to allocate for the local ring, in bytes: its file, and a CUDA
        /// ring's device and staging buffers (the source's shape comes from the network); a
        /// source that needs more has its messages dropped with a warning.
        #[arg(long, default_value_t = bridge::DEFAULT_MAX_RING_BYTES)]
        max_ring_bytes: u64,
        /// How a CUDA local ring shares its memory: legacy or vmm (same-uid consumers).
        #[cfg(feature = "cuda")]
        #[arg(long, default_value = "legacy", value_parser = parse_sharing)]
        sharing: gpuring::Sharing,
        #[command(flatten)]
        zenoh: ZenohArgs,
    },
}

/// The Zenoh session's options, shared by both subcommands.
#[derive(clap::Args)]
pub struct ZenohArgs {
    /// An endpoint to connect to, e.g. tcp/10.0.0.5:7447 (repeatable).
    #[arg(long)]
    connect: Vec<String>,
    /// An endpoint to listen on, e.g. tcp/0.0.0.0:7447 (repeatable).
    #[arg(long)]
    listen: Vec<String>,
    /// peer (default) or client (through a Zenoh router).
    #[arg(long, default_value = "peer", value_parser = parse_zenoh_mode)]
    zenoh_mode: ZenohMode,
    /// A Zenoh configuration file (JSON5) to start from.
    #[arg(long)]
    zenoh_config: Option<PathBuf>,
    /// Do not look for peers by multicast: meet only through --connect/--listen.
    #[arg(long)]
    no_multicast_scouting: bool,
}

impl ZenohArgs {
    fn options(&self) -> ZenohOptions {
        ZenohOptions {
            mode: self.zenoh_mode,
            connect: self.connect.clone(),
            listen: self.listen.clone(),
            config_file: self.zenoh_config.clone(),
            no_multicast_scouting: self.no_multicast_scouting,
        }
    }
}

fn parse_start(s: &str) -> Result<StartAt, String> {
    match s {
        "newest" => Ok(StartAt::Newest),
        "next" => Ok(StartAt::Next),
        "oldest" => Ok(StartAt::Oldest),
        _ => Err(format!("{s}: expected newest, next or oldest")),
    }
}

fn parse_memory(s: &str) -> Result<MemoryKind, String> {
    match s {
        "host" => Ok(MemoryKind::Host),
        "cuda" => Ok(MemoryKind::Cuda),
        _ => Err(format!("{s}: expected host or cuda")),
    }
}

#[cfg(feature = "cuda")]
fn parse_sharing(s: &str) -> Result<gpuring::Sharing, String> {
    gpuring::Sharing::from_name(s).ok_or_else(|| format!("{s}: expected legacy or vmm"))
}

fn parse_zenoh_mode(s: &str) -> Result<ZenohMode, String> {
    match s {
        "peer" => Ok(ZenohMode::Peer),
        "client" => Ok(ZenohMode::Client),
        _ => Err(format!("{s}: expected peer or client")),
    }
}

/// Runs the bridge until SIGINT or SIGTERM.
pub fn run(o: &Options) -> ExitCode {
    // SIGINT and SIGTERM raise the flag: the bridge stops at its next tick and closes its ring
    // cleanly.
    let stop = match crate::cli::serve("gpuring bridge") {
        Ok(stop) => stop,
        Err(code) => return code,
    };
    let done = match o {
        Options::Export { ring, key, mode, start, zenoh } => {
            let mut e = ExportOptions::new(ring).mode(*mode).start_at(*start);
            if let Some(key) = key {
                e = e.key(key);
            }
            eprintln!(
                "gpuring bridge: exporting ring {ring:?} of {} on key {}",
                e.dir_or_default().display(),
                e.key_or_default()
            );
            bridge::export(&e, &zenoh.options(), stop).map(|n| format!("{n} messages sent"))
        }
        Options::Import {
            key,
            ring,
            wait_for_consumers,
            memory,
            device,
            max_ring_bytes,
            #[cfg(feature = "cuda")]
            sharing,
            zenoh,
        } => {
            let i = ImportOptions::new(key, ring);
            eprintln!(
                "gpuring bridge: importing key {key} into ring {ring:?} in {}",
                i.dir_or_default().display()
            );
            let i = i
                .wait_for_consumers(*wait_for_consumers)
                .memory(*memory)
                .device(*device)
                .max_ring_bytes(*max_ring_bytes);
            #[cfg(feature = "cuda")]
            let i = i.sharing(sharing.clone());
            bridge::import(&i, &zenoh.options(), stop).map(|n| format!("{n} messages published"))
        }
    };
    if let Ok(what) = &done {
        eprintln!("gpuring bridge: stopped, {what}");
    }
    gpuring::service::exit("gpuring bridge", done.map(|_| ()))
}
