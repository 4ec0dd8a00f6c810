//! `gpuring doctor`: every check is there with a verdict, a machine without a GPU is told so
//! and passes, /dev/shm is measured, MPS is found through the pipe directory, a ring left by
//! a killed producer is reported with the command that removes it, and one whose producer lost
//! its GPU context as waiting for that producer's restart.
#![cfg(feature = "cli")]

mod common;

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{gpuring_bin, role, run_cli, spawn, unique_name};
use gpuring::{inspect, Producer};

const CHECKS: [&str; 9] = [
    "cuda-driver",
    "gpus",
    "mps",
    "handoff",
    "shm",
    "namespaces",
    "memlock",
    "peer-access",
    "stale-rings",
];

/// `gpuring doctor --json --quick`, parsed; its exit status is 1 exactly if a check failed.
fn doctor_json() -> Vec<serde_json::Value> {
    let (code, out, err) = run_cli(&["doctor", "--json", "--quick"]);
    parse(code, &out, &err)
}

/// `gpuring doctor --json --quick` with `CUDA_MPS_PIPE_DIRECTORY` set to `pipe_dir`, parsed.
fn doctor_json_with_pipe_dir(pipe_dir: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(gpuring_bin())
        .args(["doctor", "--json", "--quick"])
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    parse(out.status.code().unwrap_or(-1), &text(out.stdout), &text(out.stderr))
}

fn parse(code: i32, out: &str, err: &str) -> Vec<serde_json::Value> {
    let checks: Vec<serde_json::Value> = serde_json::from_str(out).expect(out);
    let failed = checks.iter().any(|c| c["verdict"] == "fail");
    assert_eq!(code, i32::from(failed), "{out}\n{err}");
    checks
}

fn find<'a>(checks: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    checks.iter().find(|c| c["check"] == name).unwrap_or_else(|| panic!("no {name} check"))
}

fn gpu_here() -> bool {
    #[cfg(feature = "cuda")]
    return gpuring::cuda::driver::available().is_ok();
    #[cfg(not(feature = "cuda"))]
    false
}

#[test]
fn json_has_every_check_and_passes_without_a_gpu() {
    let checks = doctor_json();
    let names: Vec<&str> = checks.iter().map(|c| c["check"].as_str().unwrap()).collect();
    assert_eq!(names, CHECKS);
    for c in &checks {
        let verdict = c["verdict"].as_str().unwrap();
        assert!(["ok", "warn", "fail", "skip"].contains(&verdict), "{c}");
        assert!(!c["finding"].as_str().unwrap().is_empty(), "{c}");
        assert!(c["fix"].is_string(), "{c}");
        if verdict == "warn" || verdict == "fail" {
            assert!(!c["fix"].as_str().unwrap().is_empty(), "a {verdict} says what to do: {c}");
        }
    }
    assert!(checks.iter().all(|c| c["verdict"] != "fail"), "{checks:?}");
    let driver = find(&checks, "cuda-driver");
    if gpu_here() {
        assert_eq!(driver["verdict"], "ok", "{driver}");
        assert!(find(&checks, "gpus")["finding"].as_str().unwrap().contains("GPU-"));
    } else {
        let finding = driver["finding"].as_str().unwrap();
        assert!(finding.contains("host memory only"), "{finding}");
        assert_eq!(find(&checks, "gpus")["verdict"], "skip");
        assert_eq!(find(&checks, "mps")["verdict"], "skip");
        assert!(find(&checks, "peer-access")["finding"].as_str().unwrap().contains("no GPU"));
    }
    let mps = &find(&checks, "mps")["value"];
    assert!(mps["mps_on"].is_boolean() && mps["control_socket"].is_boolean(), "{mps}");
    assert_eq!(mps["fault_isolation"], !mps["mps_on"].as_bool().unwrap(), "{mps}");
    assert_eq!(find(&checks, "handoff")["verdict"], "skip", "--quick measures nothing");
    let shm = &find(&checks, "shm")["value"];
    assert!(shm["size_bytes"].as_u64().unwrap() > 0, "{shm}");
    assert!(shm["free_bytes"].as_u64().unwrap() <= shm["size_bytes"].as_u64().unwrap());
    let soft = &find(&checks, "memlock")["value"]["soft_bytes"];
    assert!(soft.is_u64() || soft.is_null(), "bytes, or null for unlimited: {soft}");
}

#[test]
fn table_has_the_shm_line_and_a_measured_handoff() {
    let (code, out, err) = run_cli(&["doctor"]);
    assert!(!out.contains("\nhandoff      fail"), "{out}\n{err}");
    assert_eq!(code, 0, "{out}\n{err}");
    let shm = out.lines().find(|l| l.starts_with("shm ")).expect(&out);
    assert!(shm.contains("/dev/shm: ") && shm.contains(" free"), "{shm}");
    let handoff = out.lines().find(|l| l.starts_with("handoff ")).expect(&out);
    let memory = if gpu_here() { "CUDA memory" } else { "host memory" };
    assert!(handoff.contains(memory) && handoff.contains("round trips"), "{handoff}");
}

/// The mps check goes by the pipe directory of this process's contexts: with a `control`
/// socket there MPS is on (fast handoff, no fault isolation, a supervisor named), without one
/// it is off (time-slicing, faults stay in their process); either way the doctor passes.
#[test]
fn mps_is_found_through_the_pipe_directory() {
    let dir = std::env::temp_dir().join(unique_name("doctor-mps"));
    std::fs::create_dir(&dir).unwrap();
    let off = doctor_json_with_pipe_dir(&dir);
    // A socket whose listener is gone: a CUDA context made with it (on a GPU machine) is
    // refused at once and runs without MPS, so the doctor's driver calls cannot wait on it.
    drop(UnixListener::bind(dir.join("control")).unwrap());
    let on = doctor_json_with_pipe_dir(&dir);
    std::fs::remove_dir_all(&dir).unwrap();

    for (checks, mps_on) in [(&off, false), (&on, true)] {
        let mps = find(checks, "mps");
        assert_ne!(mps["verdict"], "fail", "{mps}");
        let value = &mps["value"];
        assert_eq!(value["pipe_directory"], dir.to_str().unwrap(), "{mps}");
        assert_eq!(value["control_socket"], mps_on, "{mps}");
        assert_eq!(value["mps_on"], mps_on, "{mps}");
        assert_eq!(value["fault_isolation"], !mps_on, "{mps}");
        let finding = mps["finding"].as_str().unwrap();
        if !gpu_here() {
            assert_eq!(mps["verdict"], "skip", "{mps}");
        } else if mps_on {
            assert!(finding.contains("MPS on") && finding.contains("no fault isolation"), "{mps}");
            assert!(mps["fix"].as_str().unwrap().contains("supervisor"), "{mps}");
        } else {
            assert!(finding.contains("MPS off") && finding.contains("time-slice"), "{mps}");
            assert!(finding.contains("faults stay in their process"), "{mps}");
        }
    }
}

/// The role of the child in [`a_dead_producers_ring_is_a_warning_naming_it`]: creates the ring
/// and waits to be killed.
const STALE_PRODUCER: &str = "stale-producer";

#[test]
fn a_dead_producers_ring_is_a_warning_naming_it() {
    if role().as_deref() == Some(STALE_PRODUCER) {
        let name = std::env::var("GPURING_TEST_RING").unwrap();
        let _tx = Producer::builder(&name).capacity(2).slot_size(64).create().unwrap();
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let name = unique_name("doctor-stale");
    let mut child = spawn(
        "a_dead_producers_ring_is_a_warning_naming_it",
        STALE_PRODUCER,
        &[("GPURING_TEST_RING", name.clone())],
    );
    let t = Instant::now();
    while !inspect::status(&name).is_ok_and(|s| s.producer_alive) {
        assert!(t.elapsed() < Duration::from_secs(10), "the child did not create {name}");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL: the ring stays behind
    child.wait().unwrap();

    let checks = doctor_json();
    let stale = find(&checks, "stale-rings");
    assert_eq!(stale["verdict"], "warn", "{stale}");
    assert!(stale["finding"].as_str().unwrap().contains(&name), "{stale}");
    assert!(stale["fix"].as_str().unwrap().contains(&format!("gpuring rm {name}")), "{stale}");
    assert!(stale["value"]["dead_producer"].as_array().unwrap().iter().any(|n| n == &name[..]));

    inspect::remove(&name, false).unwrap();
    let checks = doctor_json();
    let stale = find(&checks, "stale-rings");
    assert!(!stale["finding"].as_str().unwrap().contains(&name), "{stale}");
}

/// The role of the child in [`a_ring_closed_by_a_lost_context_says_so`]: creates the ring,
/// loses its GPU context (the `test-support` hook) and exits, as a supervised producer does.
#[cfg(feature = "test-support")]
const LOST_PRODUCER: &str = "lost-producer";

#[cfg(feature = "test-support")]
#[test]
fn a_ring_closed_by_a_lost_context_says_so() {
    if role().as_deref() == Some(LOST_PRODUCER) {
        let name = std::env::var("GPURING_TEST_RING").unwrap();
        let mut tx = Producer::builder(&name).capacity(2).slot_size(64).create().unwrap();
        gpuring::lose_context_after(0);
        assert!(matches!(tx.send(b"lost", b""), Err(gpuring::SendError::ContextLost(_))));
        return; // the drop closes the ring as lost and keeps it for a restart
    }
    let name = unique_name("doctor-lost");
    let child = spawn(
        "a_ring_closed_by_a_lost_context_says_so",
        LOST_PRODUCER,
        &[("GPURING_TEST_RING", name.clone())],
    );
    common::expect_success(child, "the producer that loses its context");
    assert!(inspect::status(&name).is_ok_and(|s| s.context_lost), "{name} is kept, marked");

    let checks = doctor_json();
    let stale = find(&checks, "stale-rings");
    assert_eq!(stale["verdict"], "warn", "{stale}");
    let finding = stale["finding"].as_str().unwrap();
    assert!(finding.contains(&format!("{name} (its producer")), "{stale}");
    assert!(finding.contains("lost its GPU context"), "{stale}");
    assert!(stale["fix"].as_str().unwrap().contains(&format!("restart {name}'s producer")));
    assert!(stale["value"]["context_lost"].as_array().unwrap().iter().any(|n| n == &name[..]));
    inspect::remove(&name, false).unwrap();
}
