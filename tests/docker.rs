//! gpuring in real containers: docker/compose.yaml, the file the docs show, run as it is with
//! the image docker/build-image.sh builds (the pipeline example and the `gpuring` command,
//! FROM scratch). A producer and two consumers each run in a container with Docker's defaults
//! (own pid, network, IPC and mount namespaces, own /dev/shm) and share only a tmpfs volume.
//! The run checks, on counts only (never on timings):
//!
//! 1. both consumers receive frames, and every byte of every frame is right (no bad byte, no
//!    bad frame, nothing dropped: the ring is lossless, `Block`);
//! 2. `docker kill` (SIGKILL) of consumer-a while the producer publishes: the producer reclaims
//!    it (`gpuring stat --json`, run in the producer's container, counts one reclaim), and
//!    consumer-b goes on receiving well past what the ring holds, which a lossless producer
//!    could not publish without that reclaim;
//! 3. `docker kill` of the producer: consumer-b ends by itself, saying that the producer died
//!    (exit code 3, `Ended::Died`), every byte it received right;
//! 4. consumer-b received with `recv_async`: frames came after its task parked (the producer
//!    is paused a moment in step 1 to make sure of one), woken by the producer's doorbell.
//!
//! A second test runs the same file with one variable added to the producer's environment
//! (an override made by the test): `GPURING_TEST_LOSE_CONTEXT`, with which the producer's GPU
//! context counts as lost after a few hundred ring operations, as after a GPU fault (under
//! MPS, any client's crash). It checks the whole way back, which the file's `restart: always`
//! makes:
//!
//! 1. the producer exits with status 75 (`gpuring::EXIT_CONTEXT_LOST`), each time, and the
//!    engine starts it again (its restart count, its start line printed again);
//! 2. each consumer ends with status 4 (the producer's context was lost) and is started again;
//! 3. each consumer receives frames, every byte right, from the rings of at least two
//!    producers in turn: the restarted producer replaced the dead ring under the same name,
//!    and the restarted consumers joined the new one.
//!
//! A third merges docker/compose.gpu.yaml over it (`config` only: no GPU here) and checks
//! that every service asks for a GPU and CUDA memory, and keeps the base file's restart policy
//! and stop grace period.
//!
//! They need Docker (the engine, and `docker compose` or `docker-compose`) and root, so they
//! are ignored by default; .ci/run runs them:
//! `cargo test --all-features --test docker -- --ignored --nocapture`. Without a reachable
//! engine they fail, saying so. The first two build the image with this test's own profile and
//! features (which reuses what cargo built for it), run the services as a compose project of
//! their own, and take the project down (containers, network, volume) however they end. The
//! restart test's hook is feature `test-support`, which `cli`, needed here, brings.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The compose file users copy, run as it is.
const COMPOSE_FILE: &str = "docker/compose.yaml";
/// Its GPU override.
const GPU_FILE: &str = "docker/compose.gpu.yaml";
/// The ring the compose file's services use.
const RING: &str = "cam0";
/// Buffers of that ring: 8 slots and 8 spares (the pipeline's defaults).
const BUFFERS: u64 = 16;
/// Frames consumer-b must receive after consumer-a was killed: three times what the ring
/// holds. Lossless, the producer can publish more than a ring's worth past a consumer that
/// receives nothing only once it has reclaimed that consumer.
const AFTER_KILL: u64 = 3 * BUFFERS;
/// Every wait on the containers: generous (a debug build on 2 cores), as nothing is timed.
const DEADLINE: Duration = Duration::from_secs(180);
/// A consumer's exit code when the producer died (examples/pipeline.rs).
const EXIT_PRODUCER_DIED: i32 = 3;
/// A consumer's exit code when the producer's GPU context was lost (examples/pipeline.rs).
const EXIT_PRODUCER_LOST: i32 = 4;
/// Ring operations after which the restart test's producer loses its GPU context: about 200
/// frames (an acquire and a publish each), a dozen rings' worth, and a few seconds at 60 fps.
const LOSE_AFTER: u64 = 400;
/// The exit code of a container killed with SIGKILL (128 + 9).
const EXIT_SIGKILL: i32 = 137;

/// The repository: compose and the build script run from there.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command to its end: its output, or a panic that says what could not be started.
fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (is Docker installed?)"))
}

/// A command's stdout and stderr, for messages.
fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs a command that must succeed: its stdout.
fn ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}", out.status, text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `docker ARGS`.
fn engine(args: &[&str]) -> Command {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    cmd
}

/// The Docker engine, checked reachable, and the compose command that works here.
struct Docker {
    /// `docker compose` (the v2 plugin) if it works, else `docker-compose` (v1).
    compose: Vec<&'static str>,
}

impl Docker {
    /// Fails the test, saying why, if there is no engine to talk to or no compose.
    fn new() -> Docker {
        let info = output(&mut engine(&["info", "--format", "{{.ServerVersion}}"]));
        assert!(
            info.status.success(),
            "these tests need a Docker engine, and `docker info` failed ({}):\n{}",
            info.status,
            text(&info)
        );
        let v2 = Command::new("docker").args(["compose", "version"]).output();
        let compose = match v2 {
            Ok(out) if out.status.success() => vec!["docker", "compose"],
            _ => vec!["docker-compose"],
        };
        let version = output(Command::new(compose[0]).args(&compose[1..]).arg("version"));
        assert!(
            version.status.success(),
            "these tests need `docker compose` or `docker-compose`, and neither works:\n{}",
            text(&version)
        );
        progress!(
            "docker: engine {}, compose: {} ({})",
            String::from_utf8_lossy(&info.stdout).trim(),
            compose.join(" "),
            text(&version).lines().next().unwrap_or("").trim()
        );
        Docker { compose }
    }

    /// The compose command with `args`, run in the repository.
    fn compose(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.compose[0]);
        cmd.args(&self.compose[1..]).args(args).current_dir(repo());
        cmd
    }
}

/// Builds the image the compose file names with this test's profile and features, so that
/// cargo reuses what it built for the test (docker/build-image.sh). Once per run of this
/// binary: the tests that need it wait for the first to build it (two builds at once would
/// share the script's context directory).
fn build_image() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_image_now);
}

/// [`build_image`], every time.
fn build_image_now() {
    let all = ["cuda", "cli", "tokio", "metrics", "zenoh", "test-support"];
    let on = [
        cfg!(feature = "cuda"),
        cfg!(feature = "cli"),
        cfg!(feature = "tokio"),
        cfg!(feature = "metrics"),
        cfg!(feature = "zenoh"),
        cfg!(feature = "test-support"),
    ];
    let features: Vec<&str> = all.iter().zip(on).filter(|(_, on)| *on).map(|(f, _)| *f).collect();
    let features = features.join(",");
    let mut cmd = Command::new(repo().join("docker/build-image.sh"));
    if cfg!(debug_assertions) {
        cmd.arg("--debug");
    }
    cmd.args(["--", "--no-default-features", "--features", &features]);
    let started = Instant::now();
    let out = output(&mut cmd);
    assert!(out.status.success(), "docker/build-image.sh failed ({}):\n{}", out.status, text(&out));
    progress!("docker: built gpuring-example:local in {:.0?}", started.elapsed());
}

/// Seconds since the epoch, as `docker events` takes them.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A compose project of its own, from the compose file (and overrides): `down -v
/// --remove-orphans` on drop takes down its containers, its network and its volume, however
/// the test ends.
struct Project<'d> {
    docker: &'d Docker,
    name: String,
    /// Overrides merged over the compose file, in order.
    overrides: Vec<String>,
    /// When it was started (seconds since the epoch, a second early): its containers' events
    /// are the engine's events since then.
    since: u64,
}

impl<'d> Project<'d> {
    /// `up -d`: the services start in the background.
    fn up(docker: &'d Docker) -> Project<'d> {
        Project::up_with(docker, &[])
    }

    /// `up -d` of the compose file with `overrides` merged over it.
    fn up_with(docker: &'d Docker, overrides: &[&str]) -> Project<'d> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("gpuring-test-{}-{nanos}", std::process::id());
        let overrides = overrides.iter().map(|f| f.to_string()).collect();
        let project = Project { docker, name, overrides, since: unix_now() - 1 };
        ok(&mut project.compose(&["up", "-d"]));
        progress!("docker: project {} is up", project.name);
        project
    }

    /// The compose command with `args`, for this project and its files.
    fn compose(&self, args: &[&str]) -> Command {
        let mut cmd = self.docker.compose(&["-p", &self.name, "-f", COMPOSE_FILE]);
        for file in &self.overrides {
            cmd.args(["-f", file]);
        }
        cmd.args(args);
        cmd
    }

    /// The exit codes of the container `id`'s program so far, oldest first, from the engine's
    /// `die` events: one per run, where `docker inspect` shows only the latest, and none while
    /// a restarted container runs.
    fn exits(&self, id: &str) -> Vec<i32> {
        let (since, until) = (self.since.to_string(), unix_now().to_string());
        let filter = format!("container={id}");
        let mut cmd = engine(&["events", "--since", &since, "--until", &until]);
        cmd.args(["--filter", &filter, "--filter", "event=die"]);
        let out = ok(cmd.args(["--format", "{{.Actor.Attributes.exitCode}}"]));
        out.lines().map(|l| l.trim().parse().expect("an exit code")).collect()
    }

    /// The id of `service`'s container.
    fn container(&self, service: &str) -> String {
        let id = ok(&mut self.compose(&["ps", "-q", service])).trim().to_string();
        assert!(!id.is_empty(), "no container for {service}");
        id
    }

    /// Every service's output so far, for failure messages.
    fn all_logs(&self) -> String {
        let out = output(&mut self.compose(&["logs", "--no-color"]));
        text(&out)
    }
}

impl Drop for Project<'_> {
    fn drop(&mut self) {
        let out = output(&mut self.compose(&["down", "-v", "--remove-orphans", "-t", "2"]));
        if !out.status.success() {
            eprintln!("docker: `down` of project {} failed:\n{}", self.name, text(&out));
        }
    }
}

/// A container's output so far (its stdout and stderr).
fn logs(id: &str) -> String {
    text(&output(&mut engine(&["logs", id])))
}

/// How many times the engine has started the container `id` again (its restart policy).
fn restarts(id: &str) -> u64 {
    let out = ok(&mut engine(&["inspect", "-f", "{{.RestartCount}}", id]));
    out.trim().parse().expect("a restart count")
}

/// The number written just before `key` in `line` (`12 frames`, `0 bad bytes`): the first
/// occurrence of `key` that follows a number.
fn count(line: &str, key: &str) -> Option<u64> {
    line.match_indices(key).find_map(|(at, _)| {
        let before = line[..at].trim_end();
        let word = before.rsplit(|c: char| c.is_whitespace() || c == '(').next()?;
        word.trim_start_matches('+').parse().ok()
    })
}

/// The number written just after `key` in `line` (`reclaims 1`).
fn count_after(line: &str, key: &str) -> Option<u64> {
    let (_, rest) = line.split_once(key)?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// What a consumer's latest line per second says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    frames: u64,
    dropped: u64,
    bad_frames: u64,
    bad_bytes: u64,
}

impl Progress {
    /// From a consumer's line per second or its summary.
    fn parse(line: &str) -> Option<Progress> {
        Some(Progress {
            frames: count(line, "frames")?,
            dropped: count(line, "dropped")?,
            bad_frames: count(line, "bad frames")?,
            bad_bytes: count(line, "bad bytes")?,
        })
    }

    /// Each finished run in a consumer's log (a restarted container's log holds every run's),
    /// oldest first: its summary's counts and how its stream ended (`died`, `context lost`...).
    fn runs(log: &str) -> Vec<(Progress, String)> {
        let mut runs = Vec::new();
        let mut summary = None;
        for line in log.lines() {
            if line.starts_with("consumer (pid ") {
                summary = Progress::parse(line);
            } else if let Some(how) = line.strip_prefix("consumer: ended: ") {
                let p = summary.take().unwrap_or_else(|| panic!("no summary before {line}"));
                runs.push((p, how.to_string()));
            }
        }
        runs
    }

    /// The latest line per second in a consumer's log.
    fn latest(log: &str) -> Option<Progress> {
        log.lines().rev().filter(|l| l.starts_with("consumer: t=")).find_map(Progress::parse)
    }

    /// Every frame right so far, and none lost.
    fn all_right(&self) -> bool {
        self.dropped == 0 && self.bad_frames == 0 && self.bad_bytes == 0
    }
}

/// Waits, polling, until `done` gives a value; panics with `what` and every service's output
/// at [`DEADLINE`].
fn wait_for<T>(project: &Project<'_>, what: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = done() {
            return v;
        }
        if start.elapsed() > DEADLINE {
            panic!("timed out waiting until {what}; the services said:\n{}", project.all_logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The consumer's latest line per second once it has received at least `frames`, each of
/// them right.
fn progress_past(project: &Project<'_>, id: &str, who: &str, frames: u64) -> Progress {
    let what = format!("{who} received {frames} frames");
    let p = wait_for(project, &what, || Progress::latest(&logs(id)).filter(|p| p.frames >= frames));
    assert!(p.all_right(), "{who}: a frame was wrong or lost: {p:?}\n{}", logs(id));
    p
}

/// The containers run with Docker's defaults: nothing shared with the host or each other but
/// the volume, no privilege, no added capability, the default seccomp profile.
fn assert_defaults(id: &str, service: &str) {
    let json = ok(&mut engine(&["inspect", "-f", "{{json .HostConfig}}", id]));
    let host: serde_json::Value = serde_json::from_str(&json).expect("HostConfig as JSON");
    let field = |k: &str| host[k].as_str().unwrap_or("").to_string();
    assert!(["", "private", "shareable"].contains(&field("IpcMode").as_str()), "{service}: {json}");
    assert_eq!(field("PidMode"), "", "{service}: its own pid namespace");
    let net = field("NetworkMode");
    assert!(net != "host" && !net.starts_with("container:"), "{service}: network {net}");
    assert_eq!(host["Privileged"], false, "{service}");
    assert!(host["CapAdd"].is_null(), "{service}: CapAdd {}", host["CapAdd"]);
    assert!(host["SecurityOpt"].is_null(), "{service}: SecurityOpt {}", host["SecurityOpt"]);
    assert!(host["Tmpfs"].is_null(), "{service}: a private tmpfs cannot hold a shared ring");
    let mounts = ok(&mut engine(&["inspect", "-f", "{{json .Mounts}}", id]));
    let mounts: serde_json::Value = serde_json::from_str(&mounts).expect("Mounts as JSON");
    let mounts = mounts.as_array().expect("a list of mounts");
    assert_eq!(mounts.len(), 1, "{service}: only the ring's volume: {mounts:?}");
    assert_eq!(mounts[0]["Type"], "volume", "{service}");
    assert_eq!(mounts[0]["Destination"], "/run/gpuring", "{service}");
}

/// The memlock limit the container's pid 1 got (Docker's default), for the log.
fn memlock(id: &str) -> String {
    let pid = ok(&mut engine(&["inspect", "-f", "{{.State.Pid}}", id])).trim().to_string();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let line = limits.lines().find(|l| l.starts_with("Max locked memory")).unwrap_or("?");
    line.split_whitespace().skip(3).take(2).collect::<Vec<_>>().join(" soft, ") + " hard"
}

#[test]
#[ignore = "needs Docker (docker-compose) and root"]
fn compose_pipeline_reclaims_a_killed_consumer_and_reports_a_dead_producer() {
    let docker = Docker::new();
    build_image();
    let project = Project::up(&docker);
    let (producer, a, b) = (
        project.container("producer"),
        project.container("consumer-a"),
        project.container("consumer-b"),
    );
    for (id, service) in [(&producer, "producer"), (&a, "consumer-a"), (&b, "consumer-b")] {
        assert_defaults(id, service);
    }
    progress!("docker: memlock limit in the producer's container: {}", memlock(&producer));

    // 1. Both consumers receive, every byte right.
    let pa = progress_past(&project, &a, "consumer-a", 2 * BUFFERS);
    let pb = progress_past(&project, &b, "consumer-b", 2 * BUFFERS);
    progress!("docker: consumer-a {pa:?}, consumer-b {pb:?}");
    // The producer frozen a moment (`docker pause`): consumer-b, having received everything,
    // parks in `recv_async` until the producer, thawed, publishes again and knocks on its
    // doorbell. However busy the machine, that makes at least one wake to count in step 4.
    ok(&mut engine(&["pause", &producer]));
    std::thread::sleep(Duration::from_secs(2));
    ok(&mut engine(&["unpause", &producer]));

    // 2. consumer-a killed: reclaimed, and consumer-b goes on past what the ring holds.
    let before = Progress::latest(&logs(&b)).expect("consumer-b's line").frames;
    ok(&mut engine(&["kill", &a]));
    let code = wait_for(&project, "consumer-a ended", || project.exits(&a).first().copied());
    assert_eq!(code, EXIT_SIGKILL, "consumer-a's exit code after SIGKILL");
    let line = wait_for(&project, "the producer reclaimed consumer-a", || {
        let log = logs(&producer);
        let line = log.lines().rev().find(|l| l.contains(" reclaims "))?.to_string();
        (count_after(&line, " reclaims ")? >= 1).then_some(line)
    });
    progress!("docker: producer: {line}");
    let after = progress_past(&project, &b, "consumer-b", before + AFTER_KILL);
    progress!("docker: consumer-b after the kill: {after:?} (from {before} frames)");
    let stat =
        ok(&mut project.compose(&["exec", "-T", "producer", "gpuring", "stat", RING, "--json"]));
    let stat: serde_json::Value = serde_json::from_str(&stat).expect("gpuring stat --json");
    assert_eq!(stat["reclaims"], 1, "gpuring stat in the producer's container: {stat}");
    assert_eq!(stat["producer_alive"], true, "{stat}");

    // 3. The producer killed: consumer-b ends by itself, saying that the producer died.
    ok(&mut engine(&["kill", &producer]));
    // Its first exit: with `restart: always` the engine starts it again, to wait for a ring.
    let code = wait_for(&project, "consumer-b ended", || project.exits(&b).first().copied());
    let log = logs(&b);
    progress!(
        "docker: consumer-b's end:\n{}",
        log.lines().rev().take(3).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(code, EXIT_PRODUCER_DIED, "consumer-b's exit code:\n{log}");
    assert!(log.contains("consumer: ended: died"), "consumer-b's end:\n{log}");
    let summary = log.lines().find(|l| l.starts_with("consumer (pid ")).expect("a summary");
    let total = Progress::parse(summary).expect("the summary's counts");
    assert!(total.all_right(), "consumer-b: {summary}");
    assert!(total.frames >= before + AFTER_KILL, "consumer-b: {summary}");

    // 4. consumer-b received with recv_async: its task parked, and the doorbell woke it.
    let line = log.lines().find(|l| l.starts_with("consumer: recv_async: ")).expect("recv_async");
    assert_eq!(count(line, "frames"), Some(total.frames), "{line}");
    assert!(count(line, "of them after the task parked").is_some_and(|n| n > 0), "{line}");
    if cfg!(feature = "test-support") {
        assert!(count(line, "times by the doorbell").is_some_and(|n| n > 0), "{line}");
    }
    progress!("docker: {line}");
}

#[test]
#[ignore = "needs Docker (docker-compose) and root"]
fn compose_restarts_a_producer_whose_gpu_context_was_lost() {
    let docker = Docker::new();
    build_image();
    // The compose file as it is, and one variable more in the producer's environment (an
    // override's environment adds to the file's): every run of the producer loses its GPU
    // context after LOSE_AFTER ring operations.
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compose.lose-context.yaml");
    let text = format!(
        "services:\n  producer:\n    environment:\n      GPURING_TEST_LOSE_CONTEXT: \"{LOSE_AFTER}\"\n"
    );
    std::fs::write(&file, text).expect("the override");
    let project = Project::up_with(&docker, &[file.to_str().expect("a UTF-8 path")]);
    let (producer, a, b) = (
        project.container("producer"),
        project.container("consumer-a"),
        project.container("consumer-b"),
    );

    // 1. The producer loses its context, exits with 75, and is started again.
    let restarted = wait_for(&project, "the producer exited with 75 and was restarted", || {
        let exits = project.exits(&producer);
        (!exits.is_empty() && restarts(&producer) >= 1).then_some(exits)
    });
    progress!("docker: producer's exit codes so far: {restarted:?}");
    let log = logs(&producer);
    assert!(
        restarted.iter().all(|&c| c == gpuring::EXIT_CONTEXT_LOST),
        "the producer's exit codes: {restarted:?}\n{log}"
    );
    assert!(log.contains("GPURING_TEST_LOSE_CONTEXT"), "the producer's loss:\n{log}");

    // 2 and 3. Each consumer: runs that ended with the producer's lost context, the latest of
    // them on a restarted producer's ring, every byte of every frame right.
    for (id, who) in [(&a, "consumer-a"), (&b, "consumer-b")] {
        let what = format!("{who} received frames from two producers in turn");
        let runs = wait_for(&project, &what, || {
            let runs = Progress::runs(&logs(id));
            (runs.iter().filter(|(p, _)| p.frames > 0).count() >= 2).then_some(runs)
        });
        let log = logs(id);
        for (p, how) in &runs {
            assert!(p.all_right(), "{who}: a frame was wrong or lost: {p:?}\n{log}");
            assert!(how.starts_with("context lost"), "{who}'s run ended: {how}\n{log}");
        }
        // Its exits so far (one per run ended; the latest run may still be ending).
        let exits = project.exits(id);
        assert!(!exits.is_empty(), "{who} never exited:\n{log}");
        assert!(exits.iter().all(|&c| c == EXIT_PRODUCER_LOST), "{who}'s exit codes: {exits:?}");
        assert!(restarts(id) >= 1, "{who} was not restarted");
        let frames: Vec<u64> = runs.iter().map(|(p, _)| p.frames).collect();
        progress!("docker: {who}: runs' frames {frames:?}, exit codes {exits:?}, all right");
    }

    // The producer's log: a start line per run, at least one after its first exit.
    let log = logs(&producer);
    let starts = log.lines().filter(|l| l.starts_with("pipeline: ring 'cam0'")).count();
    let exits = project.exits(&producer);
    assert!(starts >= 2, "the producer started {starts} times:\n{log}");
    assert!(exits.iter().all(|&c| c == gpuring::EXIT_CONTEXT_LOST), "{exits:?}\n{log}");
    progress!(
        "docker: producer: {starts} runs, exit codes {exits:?}, restarted {} times",
        restarts(&producer)
    );
}

#[test]
#[ignore = "needs Docker (docker-compose) and root"]
fn compose_gpu_override_asks_for_a_gpu_and_cuda_memory() {
    let docker = Docker::new();
    let merged = ok(&mut docker.compose(&["-f", COMPOSE_FILE, "-f", GPU_FILE, "config"]));
    let lines: Vec<&str> = merged.lines().map(str::trim).collect();
    let pairs = |a: &str, b: &str| lines.windows(2).filter(|w| w[0] == a && w[1] == b).count();
    let all = |l: &str| lines.iter().filter(|x| **x == l).count();
    // Each of the three services: a GPU device request and CUDA memory.
    assert_eq!(all("driver: nvidia"), 3, "{merged}");
    assert_eq!(all("- gpu"), 3, "{merged}");
    assert_eq!(pairs("- --memory", "- cuda"), 3, "{merged}");
    assert_eq!(pairs("- --sharing", "- vmm"), 1, "the producer shares by fd:\n{merged}");
    // The base file's restart policy and stop grace period stay.
    assert_eq!(all("restart: always"), 3, "{merged}");
    assert_eq!(all("stop_grace_period: 30s"), 3, "{merged}");
    // The base file alone asks for no GPU.
    let base = ok(&mut docker.compose(&["-f", COMPOSE_FILE, "config"]));
    assert!(!base.contains("nvidia") && !base.contains("cuda"), "{base}");
    progress!("docker: the merged GPU config asks for a GPU and CUDA memory in every service");
}

/// docs/containers.md shows both compose files as they are: CI runs the very file a reader
/// copies, so the docs cannot drift from what is tested.
#[test]
fn the_docs_show_the_compose_files_ci_runs() {
    let docs = std::fs::read_to_string(repo().join("docs/containers.md")).unwrap();
    for file in [COMPOSE_FILE, GPU_FILE] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        let shown = format!("```yaml\n{text}```");
        assert!(docs.contains(&shown), "docs/containers.md does not show {file} as it is");
    }
}
