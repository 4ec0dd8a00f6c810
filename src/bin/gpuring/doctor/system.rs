//! The checks of `gpuring doctor` that look at the machine: the CUDA driver and GPUs, MPS,
//! /dev/shm, namespaces, the memlock limit, peer access and stale rings. Everything here reads
//! /proc, /dev/shm and the driver; nothing changes the system.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use gpuring::inspect;
use serde_json::json;

use super::{Check, Verdict};

/// How to turn MPS on (docs/gpu.md, "MPS").
pub const MPS_FIX: &str = "start the MPS control daemon before the ring's processes: \
    `export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps; nvidia-cuda-mps-control -d` (docs/gpu.md)";

/// A GPU the driver lists.
pub struct Gpu {
    ordinal: i32,
    uuid: String,
    compute_capability: Option<(i32, i32)>,
}

/// The kernel module's version from /proc/driver/nvidia/version ("580.95.05"), if loaded.
/// gpuring wraps no `cuDriverGetVersion`, and the module's version is the driver's. The line
/// reads "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for ]x86_64  580.95.05  Release
/// Build ...": the version is its first word of digits and dots.
fn kernel_module_version() -> Option<String> {
    let text = fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    line.split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_owned)
}

/// Check 1: is the driver there, and which version. Also returns the GPUs it lists.
pub fn cuda_driver() -> (Check, Vec<Gpu>) {
    let version = kernel_module_version();
    let shown = version.as_deref().map_or_else(String::new, |v| format!(", driver {v}"));
    let value = json!({ "driver_version": version });
    #[cfg(feature = "cuda")]
    {
        use gpuring::cuda::driver;
        if let Err(why) = driver::available() {
            // `available` words its error this way when dlopen finds no libcuda.so
            // (src/cuda/driver.rs); any other error came from a loaded driver.
            if why.contains("not installed") {
                let finding = "no CUDA driver (libcuda.so not installed): host memory only";
                return (Check::new("cuda-driver", Verdict::Skip, finding).value(value), vec![]);
            }
            let finding = format!("libcuda.so loads but CUDA is unusable ({why}){shown}");
            let fix = "rings use host memory here; for GPUs check `nvidia-smi`, and in a \
                       container run it with the GPUs (`--gpus all`)";
            return (
                Check::new("cuda-driver", Verdict::Warn, finding).fix(fix).value(value),
                vec![],
            );
        }
        let n = driver::device_count().unwrap_or(0);
        let gpus: Vec<Gpu> = (0..n)
            .map(|ordinal| Gpu {
                ordinal,
                uuid: driver::ordinal_uuid(ordinal)
                    .map_or_else(|e| e.to_string(), gpuring::cuda::uuid_string),
                compute_capability: driver::device(ordinal)
                    .and_then(driver::compute_capability)
                    .ok(),
            })
            .collect();
        let ver = match &version {
            Some(v) => format!("driver {v} (from /proc/driver/nvidia/version)"),
            None => "driver version unknown (no /proc/driver/nvidia/version; gpuring does not \
                     wrap cuDriverGetVersion)"
                .to_owned(),
        };
        let finding = format!("libcuda.so loaded, {ver}, {n} GPU(s)");
        (Check::new("cuda-driver", Verdict::Ok, finding).value(value), gpus)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let finding = format!("built without the `cuda` feature: host memory only{shown}");
        (Check::new("cuda-driver", Verdict::Skip, finding).value(value), vec![])
    }
}

/// The GPUs with their UUIDs (the names `CUDA_VISIBLE_DEVICES` and `nvidia-smi -L` use).
pub fn gpu_list(gpus: &[Gpu]) -> Check {
    if gpus.is_empty() {
        return Check::new("gpus", Verdict::Skip, "no GPU: rings use host memory");
    }
    let list: Vec<String> = gpus
        .iter()
        .map(|g| match g.compute_capability {
            Some((ma, mi)) => format!("{}: {} (sm_{ma}{mi})", g.ordinal, g.uuid),
            None => format!("{}: {}", g.ordinal, g.uuid),
        })
        .collect();
    let value: Vec<_> = gpus
        .iter()
        .map(|g| json!({ "ordinal": g.ordinal, "uuid": g.uuid, "compute_capability": g.compute_capability }))
        .collect();
    Check::new("gpus", Verdict::Ok, list.join("; ")).value(json!(value))
}

/// Processes whose program (argv[0], not `comm`: both MPS programs are truncated to the same
/// 15-character `comm`) is `program`, as (pid, environment) pairs; the environment is empty
/// where it is not readable (another user's process).
fn processes(program: &str) -> Vec<(u32, Vec<String>)> {
    let Ok(dir) = fs::read_dir("/proc") else { return vec![] };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let argv0 = cmdline.split(|&b| b == 0).next()?;
            let base = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?;
            (base == program).then_some(pid)
        })
        .map(|pid| {
            let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env = env
                .split(|&b| b == 0)
                .filter_map(|v| std::str::from_utf8(v).ok().map(str::to_owned))
                .collect();
            (pid, env)
        })
        .collect()
}

/// Whether an MPS control daemon runs on this machine (in this pid namespace).
pub fn mps_daemon_running() -> bool {
    !processes("nvidia-cuda-mps-control").is_empty()
}

/// Check 2: MPS. The method, each step reliable on its own:
/// - the control daemon runs: a process whose argv[0] is `nvidia-cuda-mps-control`;
/// - its pipe directory: `CUDA_MPS_PIPE_DIRECTORY` in its environment (if readable), else
///   the default /tmp/nvidia-mps;
/// - this process would use it: the directory CUDA reads for this process
///   (`CUDA_MPS_PIPE_DIRECTORY` or /tmp/nvidia-mps) holds the daemon's `control` socket;
/// - contexts go through it: an `nvidia-cuda-mps-server` runs. The daemon starts it when the
///   first client context connects, so after the handoff measurement (which creates contexts
///   in this process and its child) its presence means they went through MPS.
///
/// `context_made`: the handoff ran on the GPU before this check.
pub fn mps(gpu: bool, context_made: bool) -> Check {
    let daemons = processes("nvidia-cuda-mps-control");
    let servers = processes("nvidia-cuda-mps-server");
    let mine = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from);
    let control = mine.join("control");
    let has_control = fs::symlink_metadata(&control).is_ok_and(|m| m.file_type().is_socket());
    let daemon_dir = daemons.first().map(|(_, env)| {
        env.iter()
            .find_map(|v| v.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
            .unwrap_or("/tmp/nvidia-mps")
            .to_owned()
    });
    let value = json!({
        "control_daemon_pids": daemons.iter().map(|d| d.0).collect::<Vec<_>>(),
        "server_pids": servers.iter().map(|s| s.0).collect::<Vec<_>>(),
        "pipe_directory": mine, "control_socket": has_control,
    });
    let dir = mine.display();
    if !gpu {
        let finding = if daemons.is_empty() {
            "no GPU: MPS does not apply (no control daemon runs)".to_owned()
        } else {
            "no GPU usable here, though an MPS control daemon runs".to_owned()
        };
        return Check::new("mps", Verdict::Skip, finding).value(value);
    }
    if daemons.is_empty() && has_control {
        // A container: the daemon runs outside our pid namespace, its pipe directory is
        // mounted in. Neither it nor its server can be seen from here.
        let finding = format!(
            "MPS control socket in {dir}, its daemon outside this pid namespace (a container): \
             contexts made here go through MPS if this container also has the MPS server's \
             /dev/shm at /dev/shm (docs/containers.md, \"MPS\"); event-fenced CUDA rings still \
             need producer and consumers in one pid namespace"
        );
        return Check::new("mps", Verdict::Ok, finding).value(value);
    }
    if daemons.is_empty() {
        let finding = "the MPS control daemon (nvidia-cuda-mps-control) is not running: kernels \
                       of different processes are time-sliced, each cross-process hop waits \
                       for a slice (~145 us on an H100)";
        return Check::new("mps", Verdict::Warn, finding).fix(MPS_FIX).value(value);
    }
    if !has_control {
        let theirs = daemon_dir.unwrap_or_default();
        let finding = format!(
            "an MPS control daemon runs (pipe directory {theirs}), but {dir} has no `control` \
             socket: this process's contexts will not use it"
        );
        let fix = format!("export CUDA_MPS_PIPE_DIRECTORY={theirs} in every ring process");
        return Check::new("mps", Verdict::Warn, finding).fix(fix).value(value);
    }
    let through = match (context_made, servers.is_empty()) {
        (false, _) => "contexts not checked (--quick creates none)",
        (true, false) => "an MPS server runs, so this process's contexts went through MPS",
        (true, true) => "yet no MPS server started for this process's context",
    };
    let finding = format!("MPS control daemon runs, control socket in {dir}; {through}");
    if context_made && servers.is_empty() {
        let fix = "check the daemon's log (CUDA_MPS_LOG_DIRECTORY, default /var/log/nvidia-mps)";
        return Check::new("mps", Verdict::Warn, finding).fix(fix).value(value);
    }
    Check::new("mps", Verdict::Ok, finding).value(value)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Check 3: the ring directory's size and free space, against the rings there and against a
/// default host ring of 1080p RGBA frames; and what its file system and permissions allow.
pub fn shm() -> Check {
    let dir = gpuring::shm::default_dir();
    let shown = dir.display().to_string();
    let st = match rustix::fs::statvfs(&dir) {
        Ok(st) => st,
        Err(e) => {
            let finding =
                format!("ring directory {shown}: cannot stat it ({e}): rings cannot be created");
            return Check::new("shm", Verdict::Fail, finding).fix(
                "create it, or point GPURING_DIR (or --dir) at a tmpfs directory every ring \
                 process shares; for /dev/shm in Docker: --shm-size=1g",
            );
        }
    };
    let size = st.f_blocks * st.f_frsize;
    let free = st.f_bavail * st.f_frsize;
    let rings = inspect::ring_names().unwrap_or_default();
    let used: u64 = rings
        .iter()
        .filter_map(|n| fs::metadata(dir.join(format!("{}{n}", gpuring::shm::SHM_PREFIX))).ok())
        .map(|m| m.len())
        .sum();
    let concerns: Vec<String> = gpuring::shm::RingDir::open(&dir)
        .and_then(|d| d.check())
        .map(|c| c.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    // A default host ring (8 slots + DEFAULT_SPARES spare buffers) of 1920x1080 RGBA frames
    // (7.9 MiB, slots of 8 MiB). A CUDA ring keeps its frames on the GPU: its segment is
    // descriptors and handles, well under a MiB.
    let frame: u64 = 8 << 20;
    let need = (8 + u64::from(gpuring::DEFAULT_SPARES)) * frame;
    let value = json!({
        "dir": shown, "size_bytes": size, "free_bytes": free, "rings": rings.len(),
        "rings_bytes": used, "host_1080p_ring_bytes": need, "concerns": concerns,
    });
    let mut finding = format!(
        "ring directory {shown}: {} size, {} free; {} ring(s) use {}; a default host ring of \
         1080p RGBA frames needs ~{}",
        mib(size),
        mib(free),
        rings.len(),
        mib(used),
        mib(need)
    );
    for c in &concerns {
        finding.push_str(&format!("; {c}"));
    }
    let fix = "give the ring directory more room: Docker `--shm-size=1g` for /dev/shm (its \
               default, 64 MiB, fits no default host ring of 1080p frames), a larger tmpfs \
               volume; Kubernetes: an emptyDir with medium Memory; or use CUDA rings (frames on \
               the GPU)";
    let verdict = match free {
        0 => Verdict::Fail,
        f if f < need => Verdict::Warn,
        _ if !concerns.is_empty() => Verdict::Warn,
        _ => Verdict::Ok,
    };
    let check = Check::new("shm", verdict, finding).value(value);
    match verdict {
        Verdict::Ok => check,
        _ if free >= need => check.fix("see the concerns above"),
        _ => check.fix(fix),
    }
}

/// The kernel's initial namespaces' inodes (PROC_IPC_INIT_INO, PROC_PID_INIT_INO in
/// include/linux/proc_ns.h, fixed since Linux 3.8): a process outside them is in a container.
const INIT_IPC: u64 = 0xEFFF_FFFF;
const INIT_PID: u64 = 0xEFFF_FFFC;

/// Check 4: namespaces. Rings need no shared pid, network, IPC or mount namespace: liveness is
/// a lock on the ring's file and sockets are files in the ring directory. What peers in other
/// containers must share is that directory. This compares our namespaces with each ring's
/// producer's and says what that means.
pub fn namespaces() -> Check {
    use gpuring::shm::ns::{describe, Kind, Namespaces};
    let me = Namespaces::current();
    let dir = gpuring::shm::default_dir();
    let value_of = |elsewhere: &[(String, Vec<Kind>)]| {
        json!({
            "pid": me.pid, "net": me.net, "ipc": me.ipc, "mnt": me.mnt,
            "dir": dir.display().to_string(),
            "rings_elsewhere": elsewhere.iter().map(|(n, k)| {
                json!({ "ring": n, "kinds": k.iter().map(ToString::to_string).collect::<Vec<_>>() })
            }).collect::<Vec<_>>(),
        })
    };
    if !me.known() {
        return Check::new("namespaces", Verdict::Skip, "/proc/self/ns is not readable")
            .value(value_of(&[]));
    }
    let host = me.ipc == INIT_IPC && me.pid == INIT_PID;
    let names = inspect::ring_names().unwrap_or_default();
    let mut elsewhere = Vec::new();
    let mut cuda_elsewhere = Vec::new();
    for name in &names {
        let Ok(s) = inspect::status(name) else { continue };
        let kinds = s.producer_elsewhere();
        if kinds.is_empty() {
            continue;
        }
        // Legacy sharing goes by pids, which mean nothing across pid namespaces, and event
        // fences open only through the producer's /dev/shm (docs/containers.md).
        let events = s.cuda.is_some_and(|c| c.fence == "events");
        let legacy = s.cuda.is_some_and(|c| c.sharing == "legacy");
        if events && (kinds.contains(&Kind::Mnt) || kinds.contains(&Kind::Pid))
            || legacy && kinds.contains(&Kind::Pid) && s.producer_pid == std::process::id()
        {
            cuda_elsewhere.push(name.clone());
        }
        elsewhere.push((name.clone(), kinds));
    }
    let mut finding = format!(
        "{}; ring directory {}",
        if host {
            "the host's namespaces"
        } else {
            "in a container (not the host's pid or IPC namespace)"
        },
        dir.display()
    );
    for (name, kinds) in &elsewhere {
        finding.push_str(&format!(
            "; ring {name}'s producer runs {}: fine, liveness is a lock on the ring's file and \
             its sockets are in the ring directory",
            describe(kinds)
        ));
    }
    let value = value_of(&elsewhere);
    if !cuda_elsewhere.is_empty() {
        finding.push_str(&format!(
            "; CUDA ring(s) {} cannot be read from here: their event fences need the \
             producer's pid namespace and /dev/shm, or (legacy sharing) its pid equals ours in \
             another pid namespace",
            cuda_elsewhere.join(", ")
        ));
        return Check::new("namespaces", Verdict::Warn, finding)
            .fix(
                "create those rings with VMM sharing (works in every layout), or with memory \
                 fences (--fence memory: all but a producer with our pid in another pid \
                 namespace); docs/containers.md",
            )
            .value(value);
    }
    if !host && names.is_empty() {
        finding.push_str(": no rings here");
        return Check::new("namespaces", Verdict::Warn, finding)
            .fix(
                "if the producer runs in another container, this one cannot see its /dev/shm: \
                 share a directory (a volume; Kubernetes: an emptyDir with medium Memory) and \
                 set GPURING_DIR (or --dir) to it on both sides",
            )
            .value(value);
    }
    Check::new("namespaces", Verdict::Ok, finding).value(value)
}

/// Check 5: RLIMIT_MEMLOCK.
pub fn memlock() -> Check {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), mib);
    let value = json!({ "soft_bytes": lim.current, "hard_bytes": lim.maximum });
    let finding = format!(
        "memlock limit {} (hard {}); it bounds page-locked host memory: gpuring pins only a VMM \
         ring's fence words (a few pages), pinned frame buffers (cuMemHostRegister, torch \
         pin_memory) count more",
        show(lim.current),
        show(lim.maximum)
    );
    match lim.current {
        Some(soft) if soft < 1 << 20 => Check::new("memlock", Verdict::Warn, finding)
            .fix(
                "raise it if pinning host memory fails: `ulimit -l unlimited`, Docker \
                 `--ulimit memlock=-1`, systemd LimitMEMLOCK=infinity",
            )
            .value(value),
        _ => Check::new("memlock", Verdict::Ok, finding).value(value),
    }
}

/// Check 6: peer access between GPUs: which ordered pairs can read each other's memory
/// (`cuDeviceCanAccessPeer`), as a consumer on one GPU of a ring on another needs.
pub fn peer_access(gpus: &[Gpu]) -> Check {
    match gpus.len() {
        0 => return Check::new("peer-access", Verdict::Skip, "no GPU"),
        1 => {
            return Check::new("peer-access", Verdict::Skip, "one GPU: peer access does not apply")
        }
        _ => {}
    }
    #[cfg(feature = "cuda")]
    {
        use gpuring::cuda::driver;
        let (mut yes, mut no, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
        for a in gpus {
            for b in gpus.iter().filter(|b| b.ordinal != a.ordinal) {
                let can = driver::device(a.ordinal)
                    .and_then(|da| driver::can_access_peer(da, driver::device(b.ordinal)?));
                let pair = format!("{}→{}", a.ordinal, b.ordinal);
                match can {
                    Ok(true) => yes.push(pair.clone()),
                    Ok(false) => no.push(pair.clone()),
                    Err(e) => no.push(format!("{pair} ({e})")),
                }
                pairs.push(
                    json!({ "reader": a.ordinal, "memory": b.ordinal, "can": can == Ok(true) }),
                );
            }
        }
        let value = json!({ "pairs": pairs });
        if no.is_empty() {
            let finding = format!(
                "{} GPUs, every pair can read the other's memory ({}): a consumer may read on \
                 another GPU than its ring's",
                gpus.len(),
                yes.join(", ")
            );
            return Check::new("peer-access", Verdict::Ok, finding).value(value);
        }
        let finding = format!(
            "no peer access for reader→memory {}; a consumer on the first GPU of such a pair \
             cannot open a ring on the second",
            no.join(", ")
        );
        Check::new("peer-access", Verdict::Warn, finding)
            .fix(
                "read on the ring's GPU, or copy each message once to the other GPU and fan out \
                 there (docs/scaling.md); `nvidia-smi topo -p2p r` shows the pairs",
            )
            .value(value)
    }
    #[cfg(not(feature = "cuda"))]
    Check::new("peer-access", Verdict::Skip, "built without the `cuda` feature")
}

/// Check 7: rings whose producer is dead (their files stay in the ring directory until
/// removed), and segments too damaged to read. A producer in another container is judged by
/// its lock on the ring's file, never by its pid, so it is never called dead here.
pub fn stale_rings() -> Check {
    let names = match inspect::ring_names() {
        Ok(n) => n,
        Err(e) => {
            let dir = gpuring::shm::default_dir();
            let finding = format!("cannot read {}: {e}", dir.display());
            return Check::new("stale-rings", Verdict::Skip, finding);
        }
    };
    let (mut dead, mut unreadable) = (Vec::new(), Vec::new());
    for name in &names {
        match inspect::status(name) {
            Ok(s) if !s.producer_alive => dead.push((name.clone(), s.producer_pid)),
            Ok(_) => {}
            Err(e) => unreadable.push((name.clone(), e.to_string())),
        }
    }
    let value = json!({
        "rings": names.len(),
        "dead_producer": dead.iter().map(|d| &d.0).collect::<Vec<_>>(),
        "unreadable": unreadable.iter().map(|u| &u.0).collect::<Vec<_>>(),
    });
    if dead.is_empty() && unreadable.is_empty() {
        let finding = format!("{} ring(s), none left by a dead producer", names.len());
        return Check::new("stale-rings", Verdict::Ok, finding).value(value);
    }
    let mut found: Vec<String> =
        dead.iter().map(|(n, pid)| format!("{n} (its producer, pid {pid}, is gone)")).collect();
    found.extend(unreadable.iter().map(|(n, why)| format!("{n} (unreadable: {why})")));
    let mut fixes: Vec<String> = dead.iter().map(|(n, _)| format!("gpuring rm {n}")).collect();
    fixes.extend(unreadable.iter().map(|(n, _)| format!("gpuring rm --force {n}")));
    let dir = gpuring::shm::default_dir();
    let finding = format!("stale rings hold {} space: {}", dir.display(), found.join(", "));
    Check::new("stale-rings", Verdict::Warn, finding)
        .fix(format!("remove them: {}", fixes.join("; ")))
        .value(value)
}
