//! The Zenoh bridge against its floor, in one run over loopback (docs/bridge.md):
//!
//! - **floor**: raw Zenoh pub/sub of the same payloads, a publisher session and a subscriber
//!   session meeting over TCP on 127.0.0.1, blocking congestion control (nothing dropped);
//! - **bridge**: a producer -> `export` (lossless) -> the same Zenoh TCP link -> `import` -> a
//!   consumer, in host memory, and with `--cuda` in CUDA memory on both sides.
//!
//! Each path moves `--count` messages (default: about 2 GiB, at least 200) of each size, after
//! one that warms it up; the time runs from the warm-up's arrival to the last one's. Prints frames/s, GB/s and the ratio
//! to the floor of the same size.
//!
//! Run: `cargo run --release --example bridge_bench --features zenoh -- [--cuda] [--sizes 65536,8388608]`

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gpuring::bridge::{self, ExportOptions, ImportOptions, ZenohOptions};
use gpuring::{Consumer, MemoryKind, Mode, Policy, Producer, StartAt};
use zenoh::qos::CongestionControl;
use zenoh::Wait;

#[derive(Parser)]
struct Args {
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [65536usize, 8 << 20])]
    sizes: Vec<usize>,
    /// Messages per path and size (default: about 2 GiB, at least 200).
    #[arg(long)]
    count: Option<u64>,
    /// Also bridge CUDA rings (a GPU is needed).
    #[arg(long)]
    cuda: bool,
}

const LONG: Duration = Duration::from_secs(120);

/// The bench runs both ends of the bridge in one process, so its CUDA rings share by VMM.
#[cfg(feature = "cuda")]
const VMM: gpuring::Sharing = gpuring::Sharing::Vmm(gpuring::PeerPolicy::SameUid);

fn endpoint() -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("tcp/127.0.0.1:{port}")
}

fn zenoh(listen: Option<&str>, connect: Option<&str>) -> ZenohOptions {
    ZenohOptions {
        listen: listen.map(str::to_owned).into_iter().collect(),
        connect: connect.map(str::to_owned).into_iter().collect(),
        no_multicast_scouting: true,
        ..ZenohOptions::default()
    }
}

/// Raw Zenoh pub/sub of `n` payloads of `size` bytes: the time from the first put to the last
/// sample received.
fn floor(size: usize, n: u64) -> Duration {
    let at = endpoint();
    let config = |o: ZenohOptions| {
        let mut c = zenoh::Config::default();
        c.insert_json5("scouting/multicast/enabled", "false").unwrap();
        if let Some(l) = o.listen.first() {
            c.insert_json5("listen/endpoints", &format!("[{l:?}]")).unwrap();
        }
        if let Some(l) = o.connect.first() {
            c.insert_json5("connect/endpoints", &format!("[{l:?}]")).unwrap();
        }
        c
    };
    let a = zenoh::open(config(zenoh(Some(&at), None))).wait().unwrap();
    let b = zenoh::open(config(zenoh(None, Some(&at)))).wait().unwrap();
    let key = format!("bench/floor/{size}");
    let sub = b.declare_subscriber(key.clone()).wait().unwrap();
    let publisher =
        a.declare_publisher(key).congestion_control(CongestionControl::Block).wait().unwrap();
    while !publisher.matching_status().wait().unwrap().matching() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let payload = vec![7u8; size];
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut first = None;
            for _ in 0..=n {
                let sample = sub.recv_timeout(LONG).unwrap().expect("a sample");
                assert_eq!(sample.payload().len(), size);
                first.get_or_insert_with(Instant::now);
            }
            Instant::now() - first.expect("received")
        });
        for _ in 0..=n {
            publisher.put(payload.clone()).wait().unwrap();
        }
        receiver.join().unwrap()
    })
}

/// `n` messages of `size` bytes through the bridge, rings in `memory` on both sides: the time
/// from the first publish to the last message received.
fn through_bridge(size: usize, n: u64, memory: MemoryKind) -> Duration {
    let src = format!("bench-bridge-{}-{size}", std::process::id());
    let dst = format!("{src}-imported");
    let key = format!("bench/bridge/{src}");
    let at = endpoint();
    let stop = Arc::new(AtomicBool::new(false));
    let b = Producer::builder(&src).capacity(8).slot_size(size).policy(Policy::Block);
    // The exporter waits for the ring to appear; the producer, for the exporter to join.
    let (exporter, importer) = start(&src, &dst, &key, &at, memory, &stop);
    // One message: a host slot gets a byte written; a CUDA slot is published as it is (the
    // bridge moves it all the same).
    let mut send: Box<dyn FnMut()> = match memory {
        MemoryKind::Host => {
            let mut tx = b.create().unwrap();
            tx.wait_for_consumers(1, LONG).expect("the exporter joins");
            Box::new(move || {
                let mut slot = tx.acquire_timeout(LONG).unwrap();
                slot[0] = 1;
                slot.publish(size, b"").unwrap();
            })
        }
        #[cfg(feature = "cuda")]
        MemoryKind::Cuda => {
            // VMM sharing: the exporter reads it in this process (legacy IPC handles cannot
            // be opened by the process that made them).
            let mut tx = b.sharing(VMM).create_gpu(0).unwrap();
            tx.wait_for_consumers(1, LONG).expect("the exporter joins");
            Box::new(move || {
                let slot = tx.acquire_timeout(LONG).unwrap();
                slot.publish(size, b"").unwrap();
            })
        }
        #[cfg(not(feature = "cuda"))]
        MemoryKind::Cuda => panic!("CUDA needs the `cuda` feature"),
    };
    let elapsed = std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            let b = Consumer::builder(&dst).mode(Mode::Lossless).start_at(StartAt::Oldest);
            let mut first = None;
            match memory {
                MemoryKind::Host => {
                    let rx = b.open_timeout(LONG).unwrap();
                    for _ in 0..=n {
                        assert_eq!(rx.recv_timeout(LONG).unwrap().len(), size);
                        first.get_or_insert_with(Instant::now);
                    }
                }
                MemoryKind::Cuda => {
                    #[cfg(feature = "cuda")]
                    {
                        let rx = b.open_in_timeout::<gpuring::Cuda>(LONG).unwrap();
                        for _ in 0..=n {
                            assert_eq!(rx.recv_timeout(LONG).unwrap().len(), size);
                            first.get_or_insert_with(Instant::now);
                        }
                        rx.stream().synchronize().unwrap();
                    }
                }
            }
            Instant::now() - first.expect("received")
        });
        // The importer waits for the consumer before it publishes anything.
        // Message 0 warms the chain up (a lossless export takes nothing until the importer
        // listens, the importer publishes nothing until the consumer joined): the time runs
        // from its arrival to the arrival of message n.
        for _ in 0..=n {
            send();
        }
        consumer.join().unwrap()
    });
    stop.store(true, Ordering::Relaxed);
    drop(send);
    exporter.join().unwrap();
    importer.join().unwrap();
    elapsed
}

/// Starts the exporter and the importer threads of one bridge.
fn start(
    src: &str,
    dst: &str,
    key: &str,
    at: &str,
    memory: MemoryKind,
    stop: &Arc<AtomicBool>,
) -> (std::thread::JoinHandle<()>, std::thread::JoinHandle<()>) {
    let e = ExportOptions::new(src).key(key).mode(Mode::Lossless).start_at(StartAt::Oldest);
    let i = ImportOptions::new(key, dst).wait_for_consumers(1).memory(memory);
    #[cfg(feature = "cuda")]
    let i = i.sharing(VMM);
    let (ez, iz) = (zenoh(Some(at), None), zenoh(None, Some(at)));
    let (s1, s2) = (stop.clone(), stop.clone());
    let exporter = std::thread::spawn(move || {
        bridge::export(&e, &ez, &s1).unwrap();
    });
    let importer = std::thread::spawn(move || {
        bridge::import(&i, &iz, &s2).unwrap();
    });
    (exporter, importer)
}

fn main() {
    let args = Args::parse();
    println!(
        "{:>9} | {:<22} | {:>9} | {:>7} | {:>8}",
        "size", "path", "frames/s", "GB/s", "vs floor"
    );
    println!("{}", "-".repeat(68));
    for &size in &args.sizes {
        let n = args.count.unwrap_or(((2u64 << 30) / size as u64).max(200));
        let base = floor(size, n);
        let row = |path: &str, d: Duration| {
            let fps = n as f64 / d.as_secs_f64();
            let gbs = fps * size as f64 / 1e9;
            let ratio = base.as_secs_f64() / d.as_secs_f64();
            println!("{size:>9} | {path:<22} | {fps:>9.0} | {gbs:>7.2} | {ratio:>8.2}");
        };
        row("raw zenoh (floor)", base);
        row("bridge, host rings", through_bridge(size, n, MemoryKind::Host));
        if args.cuda {
            row("bridge, CUDA rings", through_bridge(size, n, MemoryKind::Cuda));
        }
    }
}
