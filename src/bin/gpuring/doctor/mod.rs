//! `gpuring doctor [--json] [--quick]`: why a setup is slow or broken. Each check gives a
//! verdict (ok, warn, fail, skip), what it found and the fix in plain words. The exit status is
//! 1 if a check failed; a machine without a GPU is not a failure (host memory works there).
//!
//! The checks are in [`system`] (driver, /dev/shm, namespaces, memlock, peers, stale rings),
//! [`mps`] (whether MPS runs, and what that choice means for latency and for fault isolation)
//! and [`handoff`] (a measured round trip through two real rings between two processes).

mod handoff;
mod mps;
mod system;

use std::process::ExitCode;

use serde::Serialize;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, but slower or more fragile than it could be; the fix says how.
    Warn,
    /// Broken: rings will not work (exit status 1).
    Fail,
    /// Does not apply here (no GPU, one GPU, `--quick`), or could not be checked.
    Skip,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
            Verdict::Skip => "skip",
        }
    }
}

/// One check's result, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Check {
    /// Its name: cuda-driver, gpus, mps, handoff, shm, namespaces, memlock, peer-access,
    /// stale-rings.
    pub check: &'static str,
    pub verdict: Verdict,
    /// What was found.
    pub finding: String,
    /// What to do about it (empty when nothing).
    pub fix: String,
    /// The figures behind the finding, for scripts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl Check {
    fn new(check: &'static str, verdict: Verdict, finding: impl Into<String>) -> Check {
        Check { check, verdict, finding: finding.into(), fix: String::new(), value: None }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }

    fn value(mut self, value: serde_json::Value) -> Check {
        self.value = Some(value);
        self
    }
}

/// The options of `gpuring doctor`.
#[derive(clap::Args)]
pub struct Options {
    /// Print a JSON array of {check, verdict, finding, fix, value} instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the measured handoff round trip (and the CUDA context it creates).
    #[arg(long)]
    pub quick: bool,
}

/// The options of `gpuring doctor-echo` (the other process of the handoff measurement).
#[derive(clap::Args)]
pub struct EchoOptions {
    /// The ring this process receives on.
    pub ping: String,
    /// The ring this process creates and sends back on.
    pub pong: String,
    /// host or cuda.
    #[arg(long)]
    pub memory: String,
}

/// Round trips measured (after a warm-up).
const FRAMES: u64 = 300;

/// Runs every check, prints them, and returns 1 if one failed.
pub fn run(o: &Options) -> ExitCode {
    let (driver, gpus) = system::cuda_driver();
    let mut checks = vec![driver, system::gpu_list(&gpus)];
    // The handoff runs before the MPS check: its CUDA context is what makes an MPS server
    // start, which the MPS check looks for.
    let handoff = handoff_check(!gpus.is_empty(), o.quick);
    checks.push(mps::check(&gpus, !o.quick));
    checks.push(handoff);
    checks.push(system::shm());
    checks.push(system::namespaces());
    checks.push(system::memlock());
    checks.push(system::peer_access(&gpus));
    checks.push(system::stale_rings());
    if o.json {
        match serde_json::to_string_pretty(&checks) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("gpuring: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print_table(&checks);
    }
    if checks.iter().any(|c| c.verdict == Verdict::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_table(checks: &[Check]) {
    println!("{:<12} {:<7} FINDING", "CHECK", "VERDICT");
    for c in checks {
        println!("{:<12} {:<7} {}", c.check, c.verdict.name(), c.finding);
        if !c.fix.is_empty() {
            println!("{:<12} {:<7} fix: {}", "", "", c.fix);
        }
    }
}

/// The measured round trip, against docs/performance.md's per-hop figures on an H100.
fn handoff_check(gpu: bool, quick: bool) -> Check {
    if quick {
        return Check::new("handoff", Verdict::Skip, "not measured (--quick)")
            .fix("run `gpuring doctor` without --quick to measure it");
    }
    let kind = if gpu { "CUDA" } else { "host" };
    let p50 = match handoff::measure(gpu, FRAMES) {
        Ok(p50) => p50,
        Err(e) => return Check::new(
            "handoff",
            Verdict::Fail,
            format!("{kind} round trip failed: {e}"),
        )
        .fix("the error says which step failed; `gpuring bench --consumers 1` tries a ring alone"),
    };
    let hop_us = p50 as f64 / 2e3;
    let value = serde_json::json!({
        "memory": kind.to_lowercase(), "frames": FRAMES, "round_trip_p50_ns": p50,
        "hop_p50_us": hop_us,
    });
    let measured = format!(
        "{kind} memory, {FRAMES} round trips between two processes: p50 {:.1} us ({hop_us:.1} us \
         per hop)",
        p50 as f64 / 1e3
    );
    if !gpu {
        let finding = format!("{measured}; a sanity figure, no GPU in the loop");
        return Check::new("handoff", Verdict::Ok, finding).value(value);
    }
    // Not the quantity docs/performance.md measures (publish to consumer-kernel start): here
    // each hop also fills, checks and waits for the check on the CPU. This measurement on an
    // H100, driver 580.159.04 (2026-11-24, three runs each): release build 35-38 us per hop
    // with MPS, 181-199 us without; debug build 69-87 us and 193-266 us. 115 us tells the two
    // apart in either build.
    let reference = "reference, H100, release build: this measurement 35-38 us per hop with MPS, \
                     181-199 us without; docs/performance.md's publish-to-kernel-start hop ~10 us \
                     with MPS, ~145 us without";
    if hop_us < 115.0 {
        let finding = format!("{measured}; looks like MPS on; {reference}");
        return Check::new("handoff", Verdict::Ok, finding).value(value);
    }
    let finding = format!("{measured}; looks like time-slicing (MPS off); {reference}");
    let fix = if mps::daemon_running() {
        "MPS runs, yet hops wait: other processes may keep the GPU busy, or the contexts did not \
         go through MPS (see the mps check)"
    } else {
        mps::MPS_FIX
    };
    Check::new("handoff", Verdict::Warn, finding).fix(fix).value(value)
}

/// `gpuring doctor-echo`.
pub fn echo(o: &EchoOptions) -> Result<(), String> {
    handoff::echo(&o.ping, &o.pong, &o.memory)
}
