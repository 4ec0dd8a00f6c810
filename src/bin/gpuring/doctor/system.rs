//! The checks of `gpuring doctor` that look at the machine: the CUDA driver and GPUs,
//! /dev/shm, namespaces, the memlock limit, peer access and stale rings (MPS is in
//! [`super::mps`]). Everything here reads /proc, /dev/shm and the driver; nothing changes the
//! system.

use std::fs;

use gpuring::inspect;
use serde_json::json;

use super::{Check, Verdict};

/// A GPU the driver lists.
pub struct Gpu {
    pub ordinal: i32,
    uuid: String,
    compute_capability: Option<(i32, i32)>,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE` (see [`super::mps::compute_mode_name`]), if read.
    pub compute_mode: Option<i32>,
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
                compute_mode: driver::device(ordinal).ok().and_then(compute_mode),
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

/// The device's compute mode, `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE` (0 default, 2 prohibited, 3
/// exclusive-process), read like its compute capability: no context is made. gpuring's driver
/// layer has no wrapper for it, so this calls the driver directly.
#[cfg(feature = "cuda")]
fn compute_mode(dev: gpuring::cuda::driver::CUdevice) -> Option<i32> {
    use cudarc::driver::sys;
    let mut mode = 0;
    // SAFETY: called only after `driver::available` succeeded (the library is loaded and
    // initialised); `dev` came from `driver::device`; `mode` is a valid out-pointer.
    let r = unsafe {
        sys::cuDeviceGetAttribute(
            &mut mode,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE,
            dev,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(mode)
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
        "memlock limit {} (hard {}); it bounds page-locked host memory: gpuring pins only the \
         segments of CUDA rings with memory fences (descriptors and fence words, well under \
         1 MiB each), pinned frame buffers (cuMemHostRegister, torch \
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
            Ok(s) if !s.producer_alive => dead.push((name.clone(), s.producer_pid, s.context_lost)),
            Ok(_) => {}
            Err(e) => unreadable.push((name.clone(), e.to_string())),
        }
    }
    let value = json!({
        "rings": names.len(),
        "dead_producer": dead.iter().map(|d| &d.0).collect::<Vec<_>>(),
        "context_lost": dead.iter().filter(|d| d.2).map(|d| &d.0).collect::<Vec<_>>(),
        "unreadable": unreadable.iter().map(|u| &u.0).collect::<Vec<_>>(),
    });
    if dead.is_empty() && unreadable.is_empty() {
        let finding = format!("{} ring(s), none left by a dead producer", names.len());
        return Check::new("stale-rings", Verdict::Ok, finding).value(value);
    }
    // A producer that lost its GPU context keeps its ring for its restart, which replaces it
    // (docs/gpu.md, "When the GPU context is lost").
    let mut found: Vec<String> = dead
        .iter()
        .map(|(n, pid, lost)| match lost {
            true => format!(
                "{n} (its producer, pid {pid}, lost its GPU context and exited: a restarted \
                 producer replaces the ring)"
            ),
            false => format!("{n} (its producer, pid {pid}, is gone)"),
        })
        .collect();
    found.extend(unreadable.iter().map(|(n, why)| format!("{n} (unreadable: {why})")));
    let mut fixes: Vec<String> = dead
        .iter()
        .map(|(n, _, lost)| match lost {
            true => format!("restart {n}'s producer (or gpuring rm {n})"),
            false => format!("gpuring rm {n}"),
        })
        .collect();
    fixes.extend(unreadable.iter().map(|(n, _)| format!("gpuring rm --force {n}")));
    let dir = gpuring::shm::default_dir();
    let finding = format!("stale rings hold {} space: {}", dir.display(), found.join(", "));
    Check::new("stale-rings", Verdict::Warn, finding)
        .fix(match dead.iter().any(|d| d.2) {
            true => fixes.join("; "),
            false => format!("remove them: {}", fixes.join("; ")),
        })
        .value(value)
}
