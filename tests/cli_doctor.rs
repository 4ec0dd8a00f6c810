//! `gpuring doctor`: every check is there with a verdict, a machine without a GPU is told so
//! and passes, /dev/shm is measured, and a ring left by a killed producer is reported with the
//! command that removes it.
#![cfg(feature = "cli")]

mod common;

use std::time::{Duration, Instant};

use common::{role, run_cli, spawn, unique_name};
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
    let checks: Vec<serde_json::Value> = serde_json::from_str(&out).expect(&out);
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
