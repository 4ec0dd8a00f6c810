//! The `mps` check of `gpuring doctor`: whether this machine runs MPS for this process, and
//! what follows from that choice (docs/gpu.md, "MPS or not"). MPS makes a cross-process GPU
//! handoff about 15 times faster but takes away fault isolation between the processes on a
//! GPU; without it faults stay in their process but kernels of different processes
//! time-slice. Neither choice fails the doctor.
//!
//! Found without a GPU call: the control daemon and its servers in /proc, and the `control`
//! socket in the pipe directory this process's CUDA contexts would use. The GPUs' compute
//! modes come from the device attributes that the `cuda-driver` check reads anyway.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::system::Gpu;
use super::{Check, Verdict};

/// The MPS control daemon's program.
const DAEMON: &str = "nvidia-cuda-mps-control";
/// The MPS server's program, which the daemon starts when the first client connects.
const SERVER: &str = "nvidia-cuda-mps-server";
/// The pipe directory CUDA uses when `CUDA_MPS_PIPE_DIRECTORY` is not set.
const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// How to turn MPS on, and what it costs (docs/gpu.md, "MPS or not").
pub const MPS_FIX: &str = "for latency, start MPS before the ring's processes: `export \
    CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps; nvidia-cuda-mps-control -d` (in a checkout: \
    `. scripts/mps.sh; mps_start`); it costs fault isolation, so then run every gpuring \
    process under a supervisor that restarts it on exit (docs/gpu.md, \"MPS or not\")";

/// What MPS on means, with docs/performance.md's figures (H100).
const ON: &str = "Handoff fast (H100: publish to consumer kernel ~9-11 us a hop, against \
    ~145 us without; round trip 19 us against 283 us; consumers run concurrently), no fault \
    isolation: a crash of one client (a fatal fault, or a SIGKILL mid-kernel) faults all \
    clients of the GPU, and gpuring processes then exit with status 75";

/// What to do with MPS on.
const ON_FIX: &str = "run every gpuring process under a supervisor that restarts it on exit \
    (deploy/systemd/, docs/containers.md); stop them with SIGTERM, which lets GPU work \
    finish, never SIGKILL (docs/gpu.md, \"MPS or not\")";

/// What MPS off means, with the same figures.
const OFF: &str = "Kernels of different processes time-slice: handoff ~283 us a round trip \
    (~145 us a hop on an H100, against ~9 us with MPS); faults stay in their process";

/// A process found in /proc.
#[derive(Debug)]
struct Process {
    pid: u32,
    /// Its environment, empty where it is not readable (another user's process).
    env: Vec<String>,
}

/// The program of a `/proc/PID/cmdline` (NUL-separated arguments): the file name of argv[0].
/// Not `/proc/PID/comm`: it is truncated to 15 characters, which leaves both MPS programs
/// named `nvidia-cuda-mps`.
fn program(cmdline: &[u8]) -> Option<&str> {
    let argv0 = cmdline.split(|&b| b == 0).next()?;
    Path::new(std::str::from_utf8(argv0).ok()?).file_name()?.to_str()
}

/// The variables of a `/proc/PID/environ` (NUL-separated `KEY=value`).
fn environ(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|v| !v.is_empty())
        .filter_map(|v| std::str::from_utf8(v).ok().map(str::to_owned))
        .collect()
}

/// The value of `key` in an environment.
fn env_var<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter().find_map(|v| v.strip_prefix(key)?.strip_prefix('='))
}

/// The processes under `proc_root` (a procfs) whose program is `name`, by pid.
fn processes_in(proc_root: &Path, name: &str) -> Vec<Process> {
    let Ok(dir) = fs::read_dir(proc_root) else { return vec![] };
    let mut found: Vec<Process> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(proc_root.join(format!("{pid}/cmdline")))
                .is_ok_and(|c| program(&c) == Some(name))
        })
        .map(|pid| Process {
            pid,
            env: environ(&fs::read(proc_root.join(format!("{pid}/environ"))).unwrap_or_default()),
        })
        .collect();
    found.sort_unstable_by_key(|p| p.pid);
    found
}

/// The pipe directory CUDA uses, given `CUDA_MPS_PIPE_DIRECTORY`'s value.
fn pipe_directory(var: Option<&OsStr>) -> PathBuf {
    match var {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(DEFAULT_PIPE_DIR),
    }
}

/// Whether `dir` holds the control daemon's `control` socket, through which a CUDA context
/// joins MPS.
fn has_control_socket(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join("control")).is_ok_and(|m| m.file_type().is_socket())
}

/// The name of a `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE` value (`CUcomputemode`).
pub fn compute_mode_name(mode: i32) -> &'static str {
    match mode {
        0 => "default",
        2 => "prohibited",
        3 => "exclusive-process",
        _ => "unknown",
    }
}

/// Whether an MPS control daemon runs on this machine (in this pid namespace).
pub fn daemon_running() -> bool {
    !processes_in(Path::new("/proc"), DAEMON).is_empty()
}

/// What the check found.
#[derive(Debug)]
struct Mps {
    daemons: Vec<Process>,
    servers: Vec<Process>,
    /// The pipe directory of this process's CUDA contexts.
    pipe_dir: PathBuf,
    /// It holds a control socket: contexts made here go through MPS.
    control: bool,
    /// (ordinal, compute mode) of each GPU whose mode the driver gave.
    modes: Vec<(i32, i32)>,
}

impl Mps {
    fn detect(gpus: &[Gpu]) -> Mps {
        let pipe_dir = pipe_directory(std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").as_deref());
        Mps {
            daemons: processes_in(Path::new("/proc"), DAEMON),
            servers: processes_in(Path::new("/proc"), SERVER),
            control: has_control_socket(&pipe_dir),
            pipe_dir,
            modes: gpus.iter().filter_map(|g| Some((g.ordinal, g.compute_mode?))).collect(),
        }
    }

    /// The GPUs in compute mode `mode`, as "GPU 0, GPU 1".
    fn gpus_in(&self, mode: i32) -> Option<String> {
        let list: Vec<String> = self
            .modes
            .iter()
            .filter(|m| m.1 == mode)
            .map(|(ordinal, _)| format!("GPU {ordinal}"))
            .collect();
        (!list.is_empty()).then(|| list.join(", "))
    }
}

/// Check 2: MPS, and what follows from it (docs/gpu.md, "MPS or not"). `context_made`: the
/// handoff ran on the GPU before this check, so that an MPS server would have started for it.
pub fn check(gpus: &[Gpu], context_made: bool) -> Check {
    judge(&Mps::detect(gpus), !gpus.is_empty(), context_made)
}

/// The verdict on what [`Mps::detect`] found. Each step is reliable on its own:
/// - this process's contexts go through MPS exactly if the pipe directory CUDA reads for it
///   (`CUDA_MPS_PIPE_DIRECTORY`, or /tmp/nvidia-mps) holds the daemon's `control` socket;
/// - the daemon runs here: a process whose argv[0] is `nvidia-cuda-mps-control`; its pipe
///   directory is `CUDA_MPS_PIPE_DIRECTORY` in its environment (if readable), else the default;
/// - contexts went through it: an `nvidia-cuda-mps-server` runs. The daemon starts one when
///   the first client context connects, so after the handoff measurement (which makes
///   contexts in this process and its child) its presence means they went through MPS.
fn judge(m: &Mps, gpu: bool, context_made: bool) -> Check {
    let on = m.control;
    let value = json!({
        "mps_on": on,
        "fault_isolation": !on,
        "control_daemon_pids": m.daemons.iter().map(|d| d.pid).collect::<Vec<_>>(),
        "server_pids": m.servers.iter().map(|s| s.pid).collect::<Vec<_>>(),
        "pipe_directory": m.pipe_dir,
        "control_socket": m.control,
        "compute_modes": m.modes.iter().map(|&(ordinal, mode)| {
            json!({ "ordinal": ordinal, "mode": compute_mode_name(mode) })
        }).collect::<Vec<_>>(),
    });
    let dir = m.pipe_dir.display();
    if !gpu {
        let finding = match (on, m.daemons.is_empty()) {
            (false, true) => "no GPU: MPS does not apply (no control daemon runs)".to_owned(),
            (false, false) => "no GPU usable here, though an MPS control daemon runs".to_owned(),
            (true, _) => format!("no GPU usable here, though {dir} has an MPS control socket"),
        };
        return Check::new("mps", Verdict::Skip, finding).value(value);
    }
    let modes = m
        .modes
        .iter()
        .map(|&(ordinal, mode)| format!("GPU {ordinal} {}", compute_mode_name(mode)))
        .collect::<Vec<_>>()
        .join(", ");
    let modes = if modes.is_empty() { modes } else { format!("; compute mode: {modes}") };
    // A GPU no process may use: worth a warning whatever the choice.
    let (prohibited, unprohibit) = match m.gpus_in(2) {
        Some(g) => (
            format!("; {g} in prohibited mode: no process can use it"),
            "; to use a GPU in prohibited mode: `nvidia-smi -i N -c DEFAULT`, as root",
        ),
        None => (String::new(), ""),
    };

    if !on {
        let (why, mut fix) = match m.daemons.first() {
            None => (
                format!("MPS off (no control daemon runs, {dir} has no control socket)"),
                MPS_FIX.to_owned(),
            ),
            Some(daemon) => {
                let theirs =
                    env_var(&daemon.env, "CUDA_MPS_PIPE_DIRECTORY").unwrap_or(DEFAULT_PIPE_DIR);
                (
                    format!(
                        "MPS off for this process: a control daemon runs (pipe directory \
                         {theirs}), but {dir} has no control socket, so contexts made here do \
                         not use it"
                    ),
                    format!(
                        "for latency, export CUDA_MPS_PIPE_DIRECTORY={theirs} in every ring \
                         process; that costs fault isolation, so then run each under a \
                         supervisor that restarts it on exit (docs/gpu.md, \"MPS or not\")"
                    ),
                )
            }
        };
        let mut finding = format!("{why}{modes}. {OFF}{prohibited}");
        if let Some(g) = m.gpus_in(3) {
            finding.push_str(&format!(
                "; {g} in exclusive-process mode, the usual MPS setup: without MPS only one \
                 process at a time can use it, so CUDA rings between processes fail there"
            ));
            fix.push_str(
                "; or leave exclusive-process mode: `nvidia-smi -i N -c DEFAULT`, as root",
            );
        }
        fix.push_str(unprohibit);
        return Check::new("mps", Verdict::Warn, finding).fix(fix).value(value);
    }

    let how = if m.daemons.is_empty() {
        // A container: the daemon runs outside our pid namespace, its pipe directory is
        // mounted in. Neither it nor its server can be seen from here.
        format!(
            "MPS on: control socket in {dir}, its daemon outside this pid namespace (a \
             container; contexts made here go through MPS if this container also has the MPS \
             server's /dev/shm at /dev/shm, docs/containers.md, \"MPS\"; event-fenced CUDA \
             rings still need producer and consumers in one pid namespace)"
        )
    } else {
        let pids: Vec<String> = m.daemons.iter().map(|d| d.pid.to_string()).collect();
        let through = match (context_made, m.servers.is_empty()) {
            (false, _) => "contexts not checked (--quick creates none)",
            (true, false) => "an MPS server runs, so this process's contexts went through MPS",
            (true, true) => "yet no MPS server started for this process's contexts",
        };
        format!(
            "MPS on: control daemon runs (pid {}), control socket in {dir}; {through}",
            pids.join(", ")
        )
    };
    let finding = format!("{how}{modes}. {ON}{prohibited}");
    if context_made && !m.daemons.is_empty() && m.servers.is_empty() {
        let fix = format!(
            "check the daemon's log (CUDA_MPS_LOG_DIRECTORY, default /var/log/nvidia-mps){unprohibit}"
        );
        return Check::new("mps", Verdict::Warn, finding).fix(fix).value(value);
    }
    let verdict = if prohibited.is_empty() { Verdict::Ok } else { Verdict::Warn };
    Check::new("mps", verdict, finding).fix(format!("{ON_FIX}{unprohibit}")).value(value)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A directory of its own under the temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("gpuring-doctor-mps-{}-{n}", std::process::id()));
            fs::create_dir(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn program_is_argv0s_file_name() {
        assert_eq!(program(b"/usr/bin/nvidia-cuda-mps-control\0-d\0"), Some(DAEMON));
        assert_eq!(program(b"nvidia-cuda-mps-server\0"), Some(SERVER));
        assert_eq!(program(b"bash\0-c\0nvidia-cuda-mps-control -d\0"), Some("bash"));
        assert_eq!(program(b""), None, "a kernel thread or a zombie");
    }

    #[test]
    fn environment_and_its_variables() {
        let env = environ(b"HOME=/root\0CUDA_MPS_PIPE_DIRECTORY=/run/mps\0\0");
        assert_eq!(env, ["HOME=/root", "CUDA_MPS_PIPE_DIRECTORY=/run/mps"]);
        assert_eq!(env_var(&env, "CUDA_MPS_PIPE_DIRECTORY"), Some("/run/mps"));
        assert_eq!(env_var(&env, "CUDA_MPS_PIPE"), None, "a whole name, not a prefix");
        assert_eq!(env_var(&env, "PATH"), None);
    }

    #[test]
    fn processes_are_found_by_program_in_a_procfs() {
        let root = TempDir::new();
        let add = |pid: &str, cmdline: &[u8], environ: Option<&[u8]>| {
            let dir = root.0.join(pid);
            fs::create_dir(&dir).unwrap();
            fs::write(dir.join("cmdline"), cmdline).unwrap();
            if let Some(e) = environ {
                fs::write(dir.join("environ"), e).unwrap();
            }
        };
        add("4242", b"nvidia-cuda-mps-control\0-d\0", Some(b"CUDA_MPS_PIPE_DIRECTORY=/run/mps\0"));
        add("77", b"/usr/bin/nvidia-cuda-mps-server\0", None);
        add("78", b"nvidia-cuda-mps-control\0", Some(b""));
        add("100", b"/bin/bash\0", Some(b""));
        add("self", b"nvidia-cuda-mps-control\0", None); // not a pid
        fs::create_dir(root.0.join("101")).unwrap(); // exited: no cmdline

        let daemons = processes_in(&root.0, DAEMON);
        assert_eq!(daemons.iter().map(|p| p.pid).collect::<Vec<_>>(), [78, 4242]);
        assert!(daemons[0].env.is_empty());
        assert_eq!(env_var(&daemons[1].env, "CUDA_MPS_PIPE_DIRECTORY"), Some("/run/mps"));
        let servers = processes_in(&root.0, SERVER);
        assert_eq!(servers.iter().map(|p| p.pid).collect::<Vec<_>>(), [77]);
        assert!(servers[0].env.is_empty(), "environ not readable");
        assert!(processes_in(&root.0.join("absent"), DAEMON).is_empty());
    }

    #[test]
    fn the_pipe_directory_defaults_to_tmp_nvidia_mps() {
        assert_eq!(pipe_directory(None), Path::new(DEFAULT_PIPE_DIR));
        assert_eq!(pipe_directory(Some(OsStr::new(""))), Path::new(DEFAULT_PIPE_DIR));
        assert_eq!(pipe_directory(Some(OsStr::new("/run/mps"))), Path::new("/run/mps"));
    }

    #[test]
    fn only_a_socket_named_control_counts() {
        let dir = TempDir::new();
        assert!(!has_control_socket(&dir.0));
        fs::write(dir.0.join("control"), b"").unwrap();
        assert!(!has_control_socket(&dir.0), "a plain file");
        fs::remove_file(dir.0.join("control")).unwrap();
        let _listener = UnixListener::bind(dir.0.join("control")).unwrap();
        assert!(has_control_socket(&dir.0));
        assert!(!has_control_socket(&dir.0.join("absent")));
    }

    #[test]
    fn compute_modes_are_named() {
        assert_eq!(compute_mode_name(0), "default");
        assert_eq!(compute_mode_name(2), "prohibited");
        assert_eq!(compute_mode_name(3), "exclusive-process");
        assert_eq!(compute_mode_name(1), "unknown");
    }

    fn mps(daemon: bool, server: bool, control: bool, modes: &[(i32, i32)]) -> Mps {
        let proc = |pid| Process { pid, env: vec!["CUDA_MPS_PIPE_DIRECTORY=/run/mps".into()] };
        Mps {
            daemons: if daemon { vec![proc(10)] } else { vec![] },
            servers: if server { vec![proc(11)] } else { vec![] },
            pipe_dir: PathBuf::from("/tmp/nvidia-mps"),
            control,
            modes: modes.to_vec(),
        }
    }

    #[test]
    fn mps_on_says_fast_and_no_isolation_and_names_a_supervisor() {
        for (daemon, server) in [(true, true), (true, false), (false, false)] {
            let c = judge(&mps(daemon, server, true, &[(0, 3)]), true, false);
            assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
            assert!(c.finding.starts_with("MPS on"), "{c:?}");
            assert!(c.finding.contains("Handoff fast") && c.finding.contains("no fault isolation"));
            assert!(c.finding.contains("GPU 0 exclusive-process"), "{c:?}");
            assert!(c.fix.contains("supervisor") && c.fix.contains("deploy/systemd/"), "{c:?}");
            let v = c.value.unwrap();
            assert_eq!(
                (v["mps_on"].as_bool(), v["fault_isolation"].as_bool()),
                (Some(true), Some(false))
            );
            assert_eq!(v["compute_modes"][0]["mode"], "exclusive-process");
        }
        let c = judge(&mps(true, true, true, &[]), true, true);
        assert!(c.finding.contains("went through MPS"), "{c:?}");
        let c = judge(&mps(true, false, true, &[]), true, true);
        assert_eq!(c.verdict, Verdict::Warn, "no server started for our contexts: {c:?}");
        assert!(c.fix.contains("log"), "{c:?}");
    }

    #[test]
    fn mps_off_says_time_slicing_and_isolation_and_how_to_start_it() {
        let c = judge(&mps(false, false, false, &[(0, 0)]), true, false);
        assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
        assert!(c.finding.starts_with("MPS off"), "{c:?}");
        assert!(c.finding.contains("time-slice") && c.finding.contains("283 us"), "{c:?}");
        assert!(c.finding.contains("faults stay in their process"), "{c:?}");
        assert!(c.fix.contains("nvidia-cuda-mps-control -d") && c.fix.contains("supervisor"));
        let v = c.value.unwrap();
        assert_eq!(
            (v["mps_on"].as_bool(), v["fault_isolation"].as_bool()),
            (Some(false), Some(true))
        );

        let c = judge(&mps(true, false, false, &[]), true, false);
        assert!(c.finding.contains("pipe directory /run/mps"), "{c:?}");
        assert!(c.fix.contains("CUDA_MPS_PIPE_DIRECTORY=/run/mps"), "{c:?}");

        let c = judge(&mps(false, false, false, &[(0, 0), (1, 3)]), true, false);
        assert!(c.finding.contains("GPU 1 in exclusive-process mode"), "{c:?}");
        assert!(c.fix.contains("-c DEFAULT"), "{c:?}");
    }

    #[test]
    fn no_choice_fails_and_without_a_gpu_it_is_skipped() {
        for bits in 0..16u8 {
            let (daemon, server, control, made) =
                (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
            for modes in [&[][..], &[(0, 0)], &[(0, 2)], &[(0, 3)]] {
                let m = mps(daemon, server, control, modes);
                let c = judge(&m, true, made);
                assert_ne!(c.verdict, Verdict::Fail, "{c:?}");
                assert!(!c.fix.is_empty(), "{c:?}");
                let c = judge(&m, false, made);
                assert_eq!(c.verdict, Verdict::Skip, "{c:?}");
            }
        }
    }
}
