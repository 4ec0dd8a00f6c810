//! iceoryx2 side by side with gpuring and the raw shared-memory spin floor, in one criterion run:
//! cross-process round-trip latency and throughput, 1→1 and 1→4, for 64 B, 4 KiB and 1 MiB
//! messages. The floor and gpuring cases are the shared ones in `benches/handoff/mod.rs` (the
//! same loops as the root crate's `benches/host.rs`); the iceoryx2 cases below follow the same
//! semantics: same messages, same copies, same fan-out.
//!
//! Run: `cargo bench` in this directory (add `-- --quick` for a short run). At the end it prints
//! a markdown table from criterion's medians.

#[path = "../../../handoff/mod.rs"]
mod handoff;

use std::hint::spin_loop;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use criterion::Throughput;
use handoff::{bench, Case, FloorRoundTrip, RingRoundTrip, RingThroughput, FANOUTS, SIZES};
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::port::update_connections::UpdateConnections;
use iceoryx2::prelude::*;
use iceoryx2::sample::Sample;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

fn main() {
    if let Some(args) = handoff::child_args() {
        if !handoff::run_child(&args) {
            iox_child(&args);
        }
        return;
    }
    // Declared first, dropped last: after every case (and so every child) is gone.
    let _domain = IoxDomain;
    // Criterion writes `target/criterion` under the working directory, which `cargo bench` sets
    // to this crate's root; `median_ns` reads it back from there (or from CARGO_TARGET_DIR).
    let mut c = handoff::criterion();
    for n in FANOUTS {
        let mut g = c.benchmark_group(format!("roundtrip_1to{n}"));
        g.throughput(Throughput::Elements(1));
        for size in SIZES {
            let label = handoff::size_label(size);
            bench(&mut g, "floor", &label, FloorRoundTrip::new(n, size));
            bench(&mut g, "gpuring", &label, RingRoundTrip::new(n, size));
            bench(&mut g, "iceoryx2", &label, IoxRoundTrip::new(n, size));
        }
        g.finish();
        let mut g = c.benchmark_group(format!("throughput_1to{n}"));
        g.throughput(Throughput::Elements(1));
        for size in SIZES {
            let label = handoff::size_label(size);
            bench(&mut g, "gpuring", &label, RingThroughput::new(n, size));
            bench(&mut g, "iceoryx2", &label, IoxThroughput::new(n, size));
        }
        g.finish();
    }
    c.final_summary();
    report();
}

fn report() {
    let ns = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} ns"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    // Criterion's throughput median is ns per message; as messages per second per consumer:
    let rate = |t: Option<f64>| match t.map(|t| 1e9 / t) {
        Some(r) if r >= 1e6 => format!("{:.2} M", r / 1e6),
        Some(r) => format!("{:.1} k", r / 1e3),
        None => "-".into(),
    };

    println!("\n== host round trip: floor vs gpuring vs iceoryx2 (criterion medians, same run) ==");
    println!("(time ratios: below 1x means gpuring is faster)");
    println!("| fan-out | size | floor | gpuring | iceoryx2 | gpuring/floor | gpuring/iceoryx2 |");
    println!("|---|---|---|---|---|---|---|");
    for n in FANOUTS {
        for size in SIZES {
            let l = handoff::size_label(size);
            let floor = handoff::median_ns(&format!("roundtrip_1to{n}/floor/{l}"));
            let ours = handoff::median_ns(&format!("roundtrip_1to{n}/gpuring/{l}"));
            let iox = handoff::median_ns(&format!("roundtrip_1to{n}/iceoryx2/{l}"));
            println!(
                "| 1->{n} | {l} | {} | {} | {} | {} | {} |",
                ns(floor),
                ns(ours),
                ns(iox),
                ratio(ours, floor),
                ratio(ours, iox)
            );
        }
    }

    println!("\n== host throughput, msgs/s per consumer (criterion medians, same run) ==");
    println!("(rate ratio: above 1x means gpuring is faster)");
    println!("| fan-out | size | gpuring | iceoryx2 | gpuring/iceoryx2 |");
    println!("|---|---|---|---|---|");
    for n in FANOUTS {
        for size in SIZES {
            let l = handoff::size_label(size);
            let ours = handoff::median_ns(&format!("throughput_1to{n}/gpuring/{l}"));
            let iox = handoff::median_ns(&format!("throughput_1to{n}/iceoryx2/{l}"));
            // Rates are inverse times, so the rate ratio is iceoryx2's time over gpuring's.
            println!("| 1->{n} | {l} | {} | {} | {} |", rate(ours), rate(iox), ratio(iox, ours));
        }
    }
    if handoff::median_ns(&format!("roundtrip_1to{}/floor/64B", FANOUTS[0])).is_none() {
        println!(
            "\n(no medians found under {}/criterion: run from this crate's directory, or set \
             CARGO_TARGET_DIR to the target directory criterion wrote to)",
            std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into())
        );
    }
}

// ---- iceoryx2 ---------------------------------------------------------------------------------
//
// Every process (parent and children) has one iceoryx2 node over `ipc::Service` (cross-process
// shared memory). Payloads are `[u8]` slices. A zero-length message tells a child to stop.

type Pub = Publisher<ipc::Service, [u8], ()>;
type Sub = Subscriber<ipc::Service, [u8], ()>;
type Svc = PubSub<ipc::Service, [u8], ()>;
type Msg = Sample<ipc::Service, [u8], ()>;

/// The bench's private iceoryx2 domain, named after the criterion (parent) process: its own
/// root directory for node and service files and its own prefix for the shared-memory files, so
/// that the run can remove everything it made (see [`IoxDomain`]) without touching any other
/// iceoryx2 user. Built in code, so iceoryx2 reads no config file. Dead-node cleanup is off: it
/// only matters after a crash (which [`IoxDomain`] covers), and when it races a node that is
/// just exiting it falls back to the default global config, i.e. it would look into the default
/// domain, /tmp/iceoryx2, which may belong to someone else.
fn iox_config(parent_pid: u32) -> Config {
    let mut cfg = Config::default();
    cfg.global.node.cleanup_dead_nodes_on_creation = false;
    cfg.global.node.cleanup_dead_nodes_on_destruction = false;
    cfg.global.service.cleanup_dead_nodes_on_open = false;
    let root = format!("/tmp/iceoryx2-gpuring-bench-{parent_pid}/");
    cfg.global.set_root_path(
        &Path::new(root.as_bytes()).unwrap_or_else(|e| panic!("iceoryx2 root {root}: {e:?}")),
    );
    let prefix = format!("iox2_gpuring_bench_{parent_pid}_");
    cfg.global.prefix = FileName::new(prefix.as_bytes())
        .unwrap_or_else(|e| panic!("iceoryx2 prefix {prefix}: {e:?}"));
    cfg
}

/// The parent's pid, which names the domain: this process's own in the parent, its parent's in
/// a child (children are spawned directly by the criterion process).
fn domain_pid() -> u32 {
    match handoff::child_args() {
        Some(_) => std::os::unix::process::parent_id(),
        None => std::process::id(),
    }
}

/// Removes the domain when the parent ends. Nodes and services remove their own files when
/// dropped; what stays is iceoryx2's persistent per-domain node counter in /dev/shm and the
/// (by then empty) directories under the root path. Anything else with the domain's prefix in
/// /dev/shm was left by a process that died, and is removed too (and reported).
struct IoxDomain;

impl Drop for IoxDomain {
    fn drop(&mut self) {
        let cfg = iox_config(std::process::id());
        // SAFETY: the domain is private to this run (named by this pid) and every process of it
        // has exited: each case reaps its children on drop, and the cases are dropped before this.
        if let Err(e) =
            unsafe { iceoryx2::testing::remove_global_mgmt_segment::<ipc::Service>(&cfg) }
        {
            eprintln!("iceoryx2 domain cleanup: {e:?}");
        }
        let prefix = cfg.global.prefix.to_string();
        if let Ok(dir) = std::fs::read_dir("/dev/shm") {
            for f in dir.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    eprintln!("iceoryx2 domain cleanup: removing stale /dev/shm/{name}");
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        let root = cfg.global.root_path().to_string();
        if let Err(e) = std::fs::remove_dir_all(&root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("iceoryx2 domain cleanup: {root}: {e}");
            }
        }
    }
}

/// A node with signal handling off: iceoryx2 must not take SIGINT/SIGTERM from criterion.
fn iox_node() -> Node<ipc::Service> {
    NodeBuilder::new()
        .config(&iox_config(domain_pid()))
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .unwrap_or_else(|e| panic!("iceoryx2 node: {e:?}"))
}

fn service_name(name: &str) -> ServiceName {
    name.try_into().unwrap_or_else(|e| panic!("iceoryx2 service name {name:?}: {e:?}"))
}

/// Creates a `[u8]` publish-subscribe service for one publisher and `subs` subscribers, each
/// with a queue of `buffer`. No safe overflow: a full queue makes the publisher wait
/// (`RetryUntilDelivered`), so no message is lost or overwritten, as with gpuring's Block.
fn iox_create(node: &Node<ipc::Service>, name: &str, subs: usize, buffer: usize) -> Svc {
    node.service_builder(&service_name(name))
        .publish_subscribe::<[u8]>()
        .max_publishers(1)
        .max_subscribers(subs)
        .subscriber_max_buffer_size(buffer)
        .history_size(0)
        .enable_safe_overflow(false)
        .create()
        .unwrap_or_else(|e| panic!("iceoryx2 create {name}: {e:?}"))
}

/// Opens service `name`, retrying while its creator is still starting.
fn iox_open(node: &Node<ipc::Service>, name: &str) -> Svc {
    let t = Instant::now();
    loop {
        match node.service_builder(&service_name(name)).publish_subscribe::<[u8]>().open() {
            Ok(s) => return s,
            Err(e) if t.elapsed().as_secs() >= 10 => panic!("iceoryx2 open {name}: {e:?}"),
            Err(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn iox_publisher(svc: &Svc, size: usize) -> Pub {
    svc.publisher_builder()
        .initial_max_slice_len(size)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .unwrap_or_else(|e| panic!("iceoryx2 publisher: {e:?}"))
}

fn iox_subscriber(svc: &Svc, buffer: usize) -> Sub {
    svc.subscriber_builder()
        .buffer_size(buffer)
        .create()
        .unwrap_or_else(|e| panic!("iceoryx2 subscriber: {e:?}"))
}

/// Publishes a copy of `payload` (one copy into the loaned sample, as gpuring's `send`), with
/// its first byte replaced by `first` when given.
fn iox_send(tx: &Pub, payload: &[u8], first: Option<u8>) {
    let mut s = tx
        .loan_slice_uninit(payload.len())
        .unwrap_or_else(|e| panic!("iceoryx2 loan: {e:?}"))
        .write_from_slice(payload);
    if let Some(b) = first {
        s.payload_mut()[0] = b;
    }
    s.send().unwrap_or_else(|e| panic!("iceoryx2 send: {e:?}"));
}

/// Busy-polls `rx` (iceoryx2's `receive` never blocks): `spin_loop` first, then `yield_now`,
/// like gpuring's spin-then-yield phase (gpuring then sleeps on a futex; this never sleeps).
/// Every 2^16 empty polls `gone(waited)` is asked whether to give up (`waited` is counted from
/// the first such check, so the fast path reads no clock); its message is the panic.
fn iox_recv(rx: &Sub, gone: &dyn Fn(Duration) -> Option<String>) -> Msg {
    let mut polls = 0u64;
    let mut since: Option<Instant> = None;
    loop {
        match rx.receive() {
            Ok(Some(m)) => return m,
            Ok(None) => {}
            Err(e) => panic!("iceoryx2 receive: {e:?}"),
        }
        polls += 1;
        if polls < 128 {
            spin_loop();
        } else {
            thread::yield_now();
        }
        if polls % (1 << 16) == 0 {
            if let Some(why) = gone(since.get_or_insert_with(Instant::now).elapsed()) {
                panic!("{why}");
            }
        }
    }
}

/// Waits until `svc` has `n` subscribers and `tx` is connected to them.
fn iox_wait_subscribers(svc: &Svc, tx: &Pub, n: usize) {
    let t = Instant::now();
    while svc.dynamic_config().number_of_subscribers() < n {
        assert!(t.elapsed().as_secs() < 10, "iceoryx2 bench children did not subscribe");
        thread::sleep(Duration::from_millis(1));
    }
    tx.update_connections().unwrap_or_else(|e| panic!("iceoryx2 connect: {e:?}"));
}

/// The iceoryx2 child roles: `iox-echo` (round trip) and `iox-sink` (throughput).
fn iox_child(a: &handoff::ChildArgs) {
    let parent = std::os::unix::process::parent_id();
    let orphaned = move |_: Duration| {
        (std::os::unix::process::parent_id() != parent)
            .then(|| "iceoryx2 bench child: the parent exited".to_string())
    };
    let node = iox_node();
    match a.role.as_str() {
        "iox-echo" => {
            let ping = iox_open(&node, &format!("{}/ping", a.name));
            let depth = handoff::roundtrip_depth() as usize;
            let rx = iox_subscriber(&ping, depth);
            let pong = iox_create(&node, &format!("{}/pong{}", a.name, a.index), 1, depth);
            let tx = iox_publisher(&pong, a.size);
            loop {
                let m = iox_recv(&rx, &orphaned);
                let len = m.payload().len();
                if len == 0 {
                    break;
                }
                // One copy, received sample → loaned reply, as gpuring's echo.
                let out = tx
                    .loan_slice_uninit(len)
                    .unwrap_or_else(|e| panic!("iceoryx2 loan: {e:?}"))
                    .write_from_slice(m.payload());
                drop(m);
                out.send().unwrap_or_else(|e| panic!("iceoryx2 send: {e:?}"));
            }
        }
        "iox-sink" => {
            let svc = iox_open(&node, &a.name);
            // Each subscriber's queue: the same depth as gpuring's ring in this case.
            let rx = iox_subscriber(&svc, handoff::throughput_capacity(a.size) as usize);
            let mut sum = 0u64;
            loop {
                let m = iox_recv(&rx, &orphaned);
                let p = m.payload();
                if p.is_empty() {
                    break;
                }
                sum = sum.wrapping_add(p[0] as u64 + p[p.len() - 1] as u64);
            }
            std::hint::black_box(sum);
        }
        r => panic!("unknown bench role {r}"),
    }
}

/// iceoryx2 round trip: a ping service to `n` echo children, each answering on its own pong
/// service; the parent waits for all `n` replies.
pub struct IoxRoundTrip {
    // Fields drop in order: ports, then services, then the node.
    ping: Pub,
    pongs: Vec<Sub>,
    children: Vec<Child>,
    payload: Vec<u8>,
    _ping_svc: Svc,
    _pong_svcs: Vec<Svc>,
    _node: Node<ipc::Service>,
}

impl IoxRoundTrip {
    pub fn new(n: usize, size: usize) -> IoxRoundTrip {
        let node = iox_node();
        let name = handoff::unique(&format!("iox-rt{n}-{size}"));
        let depth = handoff::roundtrip_depth() as usize;
        let ping_svc = iox_create(&node, &format!("{name}/ping"), n, depth);
        let ping = iox_publisher(&ping_svc, size);
        let children: Vec<Child> =
            (0..n).map(|i| handoff::spawn("iox-echo", &name, size, i)).collect();
        let pong_svcs: Vec<Svc> =
            (0..n).map(|i| iox_open(&node, &format!("{name}/pong{i}"))).collect();
        let pongs = pong_svcs.iter().map(|s| iox_subscriber(s, depth)).collect();
        iox_wait_subscribers(&ping_svc, &ping, n);
        IoxRoundTrip {
            ping,
            pongs,
            children,
            payload: vec![7u8; size],
            _ping_svc: ping_svc,
            _pong_svcs: pong_svcs,
            _node: node,
        }
    }
}

impl Case for IoxRoundTrip {
    fn run(&mut self, iters: u64) -> Duration {
        let stuck = |waited: Duration| {
            (waited.as_secs() >= 10)
                .then(|| "iceoryx2 round trip: an echo child did not answer for 10 s".to_string())
        };
        let t = Instant::now();
        for _ in 0..iters {
            iox_send(&self.ping, &self.payload, None);
            for rx in &self.pongs {
                let m = iox_recv(rx, &stuck);
                std::hint::black_box(m.payload()[0]);
            }
        }
        t.elapsed()
    }
}

impl Drop for IoxRoundTrip {
    fn drop(&mut self) {
        iox_send(&self.ping, &[], None); // zero length: stop
        self.children.drain(..).for_each(handoff::reap);
    }
}

/// iceoryx2 throughput: `n` sink children on one service, queues as deep as gpuring's ring
/// (`handoff::throughput_capacity`), no loss.
pub struct IoxThroughput {
    tx: Pub,
    children: Vec<Child>,
    payload: Vec<u8>,
    _svc: Svc,
    _node: Node<ipc::Service>,
}

impl IoxThroughput {
    pub fn new(n: usize, size: usize) -> IoxThroughput {
        let node = iox_node();
        let name = handoff::unique(&format!("iox-tp{n}-{size}"));
        let svc = iox_create(&node, &name, n, handoff::throughput_capacity(size) as usize);
        let tx = iox_publisher(&svc, size);
        let children = (0..n).map(|i| handoff::spawn("iox-sink", &name, size, i)).collect();
        iox_wait_subscribers(&svc, &tx, n);
        IoxThroughput { tx, children, payload: vec![7u8; size], _svc: svc, _node: node }
    }
}

impl Case for IoxThroughput {
    fn run(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        for i in 0..iters {
            iox_send(&self.tx, &self.payload, Some(i as u8));
        }
        t.elapsed()
    }
}

impl Drop for IoxThroughput {
    fn drop(&mut self) {
        iox_send(&self.tx, &[], None); // zero length: stop (delivered in order, after the rest)
        self.children.drain(..).for_each(handoff::reap);
    }
}
