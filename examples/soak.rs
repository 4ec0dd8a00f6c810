// Run: cargo run --release --features test-support --example soak --
//          [--minutes 10] [--memory host|cuda] [--consumers 3]
//          [--stop-signal kill|term] [--supervise]
//
// A soak test of dead-peer handling. One producer process streams checked frames while
// steady consumer processes verify every byte. Meanwhile this process keeps SIGKILLing
// victim consumers that hold slots, half the victims instead SIGKILL themselves right after a
// release whose GPU work (a 20 ms kernel by default, on CUDA rings) is still queued, now and then a steady
// consumer dies too (and is restarted), and the producer is restarted under the same name,
// whose consumers reconnect. At the end it prints
// the kills survived, the slots leaked (must be 0), the frames verified, the mismatches (must be
// 0) and the time from each producer kill to its consumers' `Disconnected`.
//
// `--stop-signal term` stops the victims with SIGTERM instead (and the releasers send it to
// themselves while their kernel runs): they stop gracefully (`gpuring::service`), so no
// other process may see its GPU context lost, even under MPS. `--supervise` restarts whatever
// exits, as systemd or Docker would: under MPS a SIGKILL mid-kernel loses every client's
// context (each exits with status 75), and the soak reports each such fault and the time
// from the kill to frames reaching every steady consumer again.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gpuring::testing::pattern;
use gpuring::testing::payload::Payload;
use gpuring::{
    monotonic_ns, AcquireTimeoutError, Consumer, Host, Policy, Producer, PublishError, ReadSlot,
    RecvTimeoutError, StartAt,
};

#[derive(Parser, Debug, Clone)]
#[command(about = "Soak test: random consumer kills and producer restarts")]
struct Args {
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Where frames live.
    #[arg(long, value_enum, default_value_t = MemoryArg::Host)]
    memory: MemoryArg,
    /// Steady consumers (each verifies every frame it gets).
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Mean time between victim kills.
    #[arg(long, default_value_t = 200)]
    kill_every_ms: u64,
    /// Mean time between producer restarts.
    #[arg(long, default_value_t = 30.0)]
    restart_every_s: f64,
    /// Policy of the ring.
    #[arg(long, value_enum, default_value_t = PolicyArg::Block)]
    policy: PolicyArg,
    /// CUDA rings: how long the kernel that a victim killed right after a release leaves
    /// queued spins before it reads the slot (its work is still running when it dies).
    #[arg(long, default_value_t = 20_000)]
    release_spin_us: u64,
    /// How victims, the steady consumers that die now and then, and the producer at its
    /// restarts are stopped: `kill` (SIGKILL, a crash) or `term` (SIGTERM, a graceful stop;
    /// releasers send it to themselves while their kernel runs).
    #[arg(long, value_enum, default_value_t = StopArg::Kill)]
    stop_signal: StopArg,
    /// Restart whatever exits (the producer and steady consumers too), as a supervisor does,
    /// and report the faults (processes that exit because their GPU context was lost) and
    /// the recovery after each.
    #[arg(long)]
    supervise: bool,
    /// Internal (steady consumers): its place among them.
    #[arg(long, hide = true)]
    slot: Option<usize>,
    /// Internal: this process's role (producer, consumer, victim, releaser) and ring name.
    #[arg(long, hide = true)]
    role: Option<String>,
    #[arg(long, hide = true)]
    name: Option<String>,
    /// Internal (producer): run this long, then settle and report.
    #[arg(long, hide = true)]
    run_s: Option<f64>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum MemoryArg {
    Host,
    Cuda,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StopArg {
    Kill,
    Term,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PolicyArg {
    Block,
    Overwrite,
}

const SLOT: usize = 64 << 10;
const LIVENESS: Duration = Duration::from_millis(20);
/// Seconds at the end of a `--supervise` run with no kills (see `orchestrate`).
const QUIET_TAIL: f64 = 20.0;

fn main() -> ExitCode {
    // The library's lifecycle events (joins, leaves, dead peers, reclaims) on stderr, filtered
    // by RUST_LOG (for example RUST_LOG=gpuring=info).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.role.is_some() && args.stop_signal == StopArg::Term {
        if let Err(e) = gpuring::service::Shutdown::install() {
            eprintln!("soak: cannot handle SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    }
    let code = match args.role.as_deref() {
        Some("producer") => producer(&args),
        Some("consumer") => consumer(&args, Kind::Steady),
        Some("victim") => consumer(&args, Kind::Holder),
        Some("releaser") => consumer(&args, Kind::Releaser),
        _ => return orchestrate(&args),
    };
    // The rings are dropped: no kernel of ours may still run when the process exits.
    #[cfg(feature = "cuda")]
    let _ = gpuring::cuda::finish_gpu_work();
    if args.stop_signal == StopArg::Term {
        // To tell an exit status set after `main` (by a library's teardown) from ours.
        eprintln!(
            "soak: {} pid {} returns {code:?}",
            args.role.as_deref().unwrap_or("?"),
            std::process::id()
        );
    }
    code
}

/// The exit code of a role that failed: 75 if its GPU context is lost.
fn failure() -> ExitCode {
    match gpuring::context_lost() {
        Some(_) => ExitCode::from(gpuring::EXIT_CONTEXT_LOST as u8),
        None => ExitCode::FAILURE,
    }
}

/// Whether a stop was asked for (SIGTERM, under `--stop-signal term`).
fn stop_requested() -> bool {
    static STOP: std::sync::OnceLock<Option<gpuring::service::Shutdown>> =
        std::sync::OnceLock::new();
    STOP.get_or_init(|| gpuring::service::Shutdown::install().ok()).is_some_and(|s| s.requested())
}

/// A tiny xorshift generator: the soak needs variety, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Roughly exponential around `mean`.
    fn around(&mut self, mean: Duration) -> Duration {
        mean.mul_f64(0.25 + (self.next() % 1000) as f64 / 666.0)
    }
}

/// What a consumer process does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Verifies every frame, reconnects across producer restarts, reports.
    Steady,
    /// Holds slots until it is killed.
    Holder,
    /// Reads one frame (on the GPU, with a slow kernel), releases it and kills itself at once.
    Releaser,
}

fn spawn(
    args: &Args,
    role: &str,
    name: &str,
    extra: &[String],
    lines: &mpsc::Sender<String>,
) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--role", role, "--name", name, "--memory"])
        .arg(if args.memory == MemoryArg::Cuda { "cuda" } else { "host" })
        .args(["--policy", if args.policy == PolicyArg::Block { "block" } else { "overwrite" }])
        .args(["--release-spin-us", &args.release_spin_us.to_string()])
        .args(["--stop-signal", if args.stop_signal == StopArg::Term { "term" } else { "kill" }])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    if args.supervise {
        // To match the MPS daemon's log of clients (pids) with the soak's processes.
        println!("soak: started {role} pid {}", child.id());
    }
    let out = child.stdout.take().expect("piped");
    let tx = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    child
}

fn kill(child: &mut Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    let _ = child.wait();
}

/// Waits up to `patience` for `child` to exit (then kills it); whether it succeeded.
fn wait_for(child: &mut Child, what: &str, patience: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < patience {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("soak: {what} did not exit within {} s: killed", patience.as_secs());
    kill(child);
    false
}

/// How a child process ended, as the soak counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Status 0: stopped gracefully (or done).
    Graceful,
    /// SIGKILL.
    Killed,
    /// Status 75: its GPU context was lost.
    Lost,
    /// SIGTERM's default action: the signal came before the process installed its handler,
    /// the first thing it does (so before it made any GPU work).
    Early,
    /// Anything else: a failure.
    Other,
}

fn outcome(status: std::process::ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Outcome::Graceful,
        (Some(gpuring::EXIT_CONTEXT_LOST), _) => Outcome::Lost,
        (_, Some(9)) => Outcome::Killed,
        (_, Some(15)) => Outcome::Early,
        (code, signal) => {
            eprintln!("soak: exit status {code:?}, signal {signal:?}");
            Outcome::Other
        }
    }
}

/// Stops `child` as `--stop-signal` says. With SIGTERM it is given 30 s to stop by itself
/// (then killed); returns how it ended.
fn stop(args: &Args, child: &mut Child) -> Outcome {
    if args.stop_signal == StopArg::Kill {
        kill(child);
        return Outcome::Killed;
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(status)) = child.try_wait() {
            return outcome(status);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    kill(child);
    Outcome::Killed
}

/// The soak's counts of how processes ended.
#[derive(Default)]
struct Ends {
    /// Stopped gracefully after a SIGTERM.
    graceful: u64,
    /// Ended by a SIGTERM that came before their handler (and any GPU work).
    early: u64,
    /// Exits with status 75, and when (monotonic ns) and which steady slot (the producer:
    /// `usize::MAX`), if one.
    faults: Vec<(u64, Option<usize>)>,
    /// Exits that are a failure: neither 0, 75 nor our SIGKILL.
    unexpected: u64,
}

impl Ends {
    /// Counts `what` (a steady slot, the producer, or another: `who`) ending as `o`; returns
    /// whether it was killed.
    fn count(&mut self, o: Outcome, who: Option<usize>, what: &str) -> bool {
        match o {
            Outcome::Graceful => self.graceful += 1,
            Outcome::Early => self.early += 1,
            Outcome::Lost => self.faults.push((monotonic_ns(), who)),
            Outcome::Other => {
                eprintln!("soak: {what} ended with an unexpected status");
                self.unexpected += 1;
            }
            Outcome::Killed => return true,
        }
        false
    }
}

fn orchestrate(args: &Args) -> ExitCode {
    let name = format!("soak-{}", std::process::id());
    let (lines_tx, lines) = mpsc::channel::<String>();
    let end = Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64);
    let (mut victim_kills, mut steady_kills, mut restarts) = (0u64, 0u64, 0u64);
    let mut release_kills = 0u64;
    // How processes ended; monotonic times of the SIGKILLs (sent, or a releaser's own seen).
    let (mut ends, mut kills_ns) = (Ends::default(), Vec::<u64>::new());
    let steady_args = |k: usize| vec!["--slot".to_string(), k.to_string()];
    // Whether each steady consumer, and the producer, exited and was looked at (not restarted
    // yet).
    let (mut exited, mut producer_exited) = (vec![false; args.consumers], false);
    let mut releasers: Vec<(Child, Instant)> = Vec::new();
    let mut producer_kills_ns = Vec::new();
    let remaining = |now: Instant| end.saturating_duration_since(now).as_secs_f64();
    // A producer instance that runs until the soak's end.
    let new_producer = || {
        let run_s = remaining(Instant::now()).to_string();
        spawn(args, "producer", &name, &["--run-s".into(), run_s], &lines_tx)
    };
    let mut producer = new_producer();
    let mut steady: Vec<Child> = (0..args.consumers)
        .map(|k| spawn(args, "consumer", &name, &steady_args(k), &lines_tx))
        .collect();
    let mut next_kill = Instant::now() + rng.around(Duration::from_millis(args.kill_every_ms));
    let mut next_restart =
        Instant::now() + rng.around(Duration::from_secs_f64(args.restart_every_s));
    let mut victims: Vec<(Child, Instant)> = Vec::new();
    let mut stopping: Vec<(Child, Instant)> = Vec::new();
    println!(
        "soak: ring '{name}', {:?} memory, {:?}, {} steady consumers, {:.1} min",
        args.memory, args.policy, args.consumers, args.minutes
    );
    let mut next_report = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let now = Instant::now();
        // Victims: join, hold slots, get killed a little later. Under `--supervise`, none in
        // the last QUIET_TAIL: the pipeline, back after the last fault, runs to the end and
        // reports (frames verified after it, slots leaked).
        let quiet = if args.supervise { QUIET_TAIL } else { 0.0 };
        if now >= next_kill && remaining(now) > quiet {
            if rng.next() % 2 == 0 {
                // Long enough to have joined (a CUDA context takes a while) and hold slots.
                let hold = if args.memory == MemoryArg::Cuda { 400 } else { 40 };
                victims.push((
                    spawn(args, "victim", &name, &[], &lines_tx),
                    now + rng.around(Duration::from_millis(hold)),
                ));
            } else {
                // It kills itself; give it up to 30 s to get there before we do.
                releasers.push((
                    spawn(args, "releaser", &name, &[], &lines_tx),
                    now + Duration::from_secs(30),
                ));
            }
            next_kill = now + rng.around(Duration::from_millis(args.kill_every_ms));
        }
        releasers.retain_mut(|(r, at)| match r.try_wait() {
            Ok(Some(status)) => {
                if ends.count(outcome(status), None, "a releaser") {
                    release_kills += 1;
                    kills_ns.push(monotonic_ns());
                }
                false
            }
            Ok(None) if Instant::now() >= *at => {
                kills_ns.push(monotonic_ns());
                kill(r);
                victim_kills += 1;
                false
            }
            _ => true,
        });
        let mut i = 0;
        while i < victims.len() {
            if Instant::now() < victims[i].1 {
                i += 1;
                continue;
            }
            let (mut v, _) = victims.swap_remove(i);
            if let Ok(Some(status)) = v.try_wait() {
                // It ended by itself: its context was lost (under MPS, another's fault), or it
                // came too late to join (0).
                ends.count(outcome(status), None, "a victim");
                continue;
            }
            if args.stop_signal == StopArg::Kill {
                kills_ns.push(monotonic_ns());
                kill(&mut v);
                victim_kills += 1;
                continue;
            }
            // SIGTERM: it stops by itself (looked at below), or is killed after 30 s.
            let pid = rustix::process::Pid::from_raw(v.id() as i32).expect("pid");
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            stopping.push((v, Instant::now() + Duration::from_secs(30)));
        }
        // Victims told to stop.
        stopping.retain_mut(|(v, deadline)| match v.try_wait() {
            Ok(Some(status)) => {
                let what = format!("a victim stopped (pid {})", v.id());
                victim_kills += ends.count(outcome(status), None, &what) as u64;
                false
            }
            _ if Instant::now() >= *deadline => {
                kill(v);
                victim_kills += 1;
                false
            }
            _ => true,
        });
        // Steady consumers and the producer that exited by themselves: faults, and under
        // `--supervise` restarted at once. Each exit is looked at once (`exited`).
        for (k, c) in steady.iter_mut().enumerate() {
            if exited[k] {
                continue;
            }
            if let Ok(Some(status)) = c.try_wait() {
                exited[k] = true;
                let o = outcome(status);
                steady_kills += ends.count(o, Some(k), &format!("steady consumer {k}")) as u64;
                if args.supervise {
                    *c = spawn(args, "consumer", &name, &steady_args(k), &lines_tx);
                    exited[k] = false;
                }
            }
        }
        if !producer_exited {
            if let Ok(Some(status)) = producer.try_wait() {
                producer_exited = true;
                match outcome(status) {
                    // The last instance ends by itself when its time is up.
                    Outcome::Graceful if remaining(now) <= 5.0 => {}
                    Outcome::Graceful => {
                        ends.count(Outcome::Other, None, "the producer");
                    }
                    o => {
                        ends.count(o, Some(usize::MAX), "the producer");
                    }
                }
                if args.supervise && remaining(now) > 5.0 {
                    producer = new_producer();
                    producer_exited = false;
                }
            }
        }
        // Now and then a steady consumer dies too (or is stopped, under `--stop-signal
        // term`); a new one takes its place.
        if rng.next() % 4000 == 0 && !steady.is_empty() && remaining(now) > quiet {
            let k = (rng.next() as usize) % steady.len();
            if !exited[k] {
                if args.stop_signal == StopArg::Kill {
                    kills_ns.push(monotonic_ns());
                }
                let o = stop(args, &mut steady[k]);
                steady_kills += ends.count(o, Some(k), &format!("steady consumer {k}")) as u64;
            }
            exited[k] = false;
            steady[k] = spawn(args, "consumer", &name, &steady_args(k), &lines_tx);
        }
        // Producer restarts: kill (or stop) it, start a new instance under the same name.
        if now >= next_restart && remaining(now) > quiet.max(5.0) {
            if !producer_exited {
                if args.stop_signal == StopArg::Kill {
                    producer_kills_ns.push(monotonic_ns());
                    kills_ns.push(monotonic_ns());
                }
                let o = stop(args, &mut producer);
                ends.count(o, Some(usize::MAX), "the producer");
            }
            producer_exited = false;
            restarts += 1;
            producer = new_producer();
            next_restart = now + rng.around(Duration::from_secs_f64(args.restart_every_s));
        }
        if now >= next_report {
            println!(
                "soak: {:.0} s left, {victim_kills} victim kills, {steady_kills} steady kills, {restarts} producer restarts, {} exits with status 75",
                remaining(now),
                ends.faults.len()
            );
            next_report += Duration::from_secs(30);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (mut v, _) in victims.into_iter().chain(stopping) {
        victim_kills += ends.count(stop(args, &mut v), None, "a victim") as u64;
    }
    for (mut r, _) in releasers {
        let o = match r.try_wait().ok().flatten() {
            Some(status) => outcome(status),
            None => stop(args, &mut r),
        };
        release_kills += ends.count(o, None, "a releaser") as u64;
    }
    // The last producer settles, reports and exits; the steady consumers then time out.
    // Bounded: a process that hangs is killed, and fails the soak.
    let producer_ok = wait_for(&mut producer, "the producer", Duration::from_secs(60));
    // Every one is waited for (or killed), not only those before the first failure.
    let steady_ends: Vec<bool> = steady
        .iter_mut()
        .enumerate()
        .map(|(k, c)| wait_for(c, &format!("steady consumer {k}"), Duration::from_secs(30)))
        .collect();
    let steady_ok = steady_ends.into_iter().all(|ok| ok);
    drop(lines_tx);
    let (mut frames, mut mismatches, mut leaked, mut published) = (0u64, 0u64, None, 0u64);
    let (mut unconfirmed, mut frames_after_faults) = (0u64, 0u64);
    let Ends { graceful, early, faults, unexpected } = ends;
    let last_fault = faults.last().map(|f| f.0);
    // Per steady slot, when frames reached it (its first frame of each connection).
    let mut flowing: Vec<Vec<u64>> = vec![Vec::new(); args.consumers];
    let mut disconnects = Vec::new();
    let mut closings = Vec::new();
    for line in lines.iter() {
        let field = |key: &str| -> Option<u64> {
            line.split_whitespace().find_map(|w| w.strip_prefix(key)?.parse().ok())
        };
        if let Some(n) = field("verified=") {
            frames += n;
            if last_fault.is_some_and(|f| field("since=").is_some_and(|s| s > f)) {
                frames_after_faults += n;
            }
        }
        if let Some(n) = field("unconfirmed=") {
            unconfirmed += n;
        }
        if let (Some(at), Some(k)) = (field("flowing_at="), field("slot=")) {
            if let Some(f) = flowing.get_mut(k as usize) {
                f.push(at);
            }
        }
        if let Some(n) = field("mismatches=") {
            mismatches += n;
        }
        if let Some(n) = field("leaked=") {
            leaked = Some(n);
        }
        if let Some(n) = field("published=") {
            published += n;
        }
        if let Some(at) = field("disconnected_at=") {
            disconnects.push(at);
        }
        if let Some(at) = field("closing_at=") {
            closings.push(at);
        }
    }
    // Each Disconnected that follows a producer kill (not the last producer's orderly close):
    // the time since that kill.
    let mut waits: Vec<f64> = disconnects
        .iter()
        .filter_map(|&at| {
            let kill = *producer_kills_ns.iter().rev().find(|&&k| k <= at)?;
            if closings.iter().any(|&c| c >= kill && c <= at) {
                return None;
            }
            Some((at - kill) as f64 / 1e6)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| waits.get(((waits.len() as f64 - 1.0) * p).round() as usize).copied();
    println!(
        "soak: kills survived {} ({victim_kills} victims holding slots, {release_kills} killed right after a release with GPU work queued, {steady_kills} steady consumers), producer restarts {restarts}",
        victim_kills + release_kills + steady_kills
    );
    println!(
        "soak: slots leaked {}, frames published {published}, frames verified {frames}, mismatches {mismatches}",
        leaked.map_or("unknown".into(), |n| n.to_string())
    );
    println!(
        "soak: producer kill -> consumer Disconnected over {} disconnects: p50 {:.1} ms, max {:.1} ms",
        waits.len(),
        pct(0.5).unwrap_or(f64::NAN),
        pct(1.0).unwrap_or(f64::NAN)
    );
    // Faults: exits with status 75 within 5 s of the first make one. Each one's recovery: from
    // the SIGKILL before it to the moment every steady consumer had a frame again.
    let mut recoveries = Vec::new();
    let mut unrecovered = 0;
    let mut fault_events = 0;
    let mut i = 0;
    while i < faults.len() {
        let t0 = faults[i].0;
        fault_events += 1;
        // The steady consumers the fault ended (all of them if it ended the producer): each
        // must get frames again.
        let mut hit = vec![false; args.consumers];
        while i < faults.len() && faults[i].0 < t0 + 5_000_000_000 {
            match faults[i].1 {
                Some(usize::MAX) => hit.iter_mut().for_each(|h| *h = true),
                Some(k) => hit[k] = true,
                None => {}
            }
            i += 1;
        }
        let cause = kills_ns.iter().rev().find(|&&k| k <= t0).copied().unwrap_or(t0);
        // When each steady consumer had frames again: the ended ones at their restart, the
        // others at their reconnection, if the fault made them reconnect.
        let back: Vec<Option<u64>> =
            flowing.iter().map(|f| f.iter().copied().find(|&at| at > t0)).collect();
        if back.iter().zip(&hit).any(|(b, &hit)| hit && b.is_none()) {
            unrecovered += 1;
        } else if let Some(end) = back.into_iter().flatten().max() {
            recoveries.push((end - cause) as f64 / 1e6);
        }
    }
    recoveries.sort_by(f64::total_cmp);
    let rpct =
        |p: f64| recoveries.get(((recoveries.len() as f64 - 1.0) * p).round() as usize).copied();
    println!(
        "soak: stops: {graceful} graceful (SIGTERM; {early} more before their handler), faults: {fault_events} ({} processes exited with status 75, {unconfirmed} frames received before a fault left unconfirmed)",
        faults.len()
    );
    if fault_events > 0 {
        println!(
            "soak: recovery (SIGKILL -> frames at every steady consumer) over {} faults: p50 {:.0} ms, max {:.0} ms, {unrecovered} not recovered; frames verified after the last fault {frames_after_faults}",
            recoveries.len(),
            rpct(0.5).unwrap_or(f64::NAN),
            rpct(1.0).unwrap_or(f64::NAN)
        );
    }
    // Under `--supervise` a fault is survived when frames flow again after it; without it, a
    // fault fails the soak (the steady consumers stay down).
    let faults_ok = match args.supervise {
        true => unrecovered == 0 && (fault_events == 0 || frames_after_faults > 0),
        false => fault_events == 0,
    };
    if unexpected > 0 {
        println!("soak: {unexpected} processes exited with an unexpected status");
    }
    let ok = unexpected == 0
        && producer_ok
        && steady_ok
        && faults_ok
        && leaked == Some(0)
        && mismatches == 0
        && frames > 0;
    println!("soak: {}", if ok { "PASS" } else { "FAIL" });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs a producer instance in the memory `--memory` names.
fn producer(args: &Args) -> ExitCode {
    let made = match args.memory {
        MemoryArg::Host => producer_in::<Host>(args),
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => producer_in::<gpuring::Cuda>(args),
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err("built without the cuda feature".into()),
    };
    match made {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak producer: {e}");
            failure()
        }
    }
}

/// A producer instance for memory kind `M`: publishes checked frames for `--run-s`, then
/// settles and reports what is still held.
fn producer_in<M: Soaked>(args: &Args) -> Result<(), String> {
    let name = args.name.as_deref().expect("--name");
    let policy = if args.policy == PolicyArg::Block { Policy::Block } else { Policy::Overwrite };
    let mut tx = Producer::builder(name)
        .capacity(16)
        .slot_size(SLOT)
        .policy(policy)
        .liveness_interval(LIVENESS)
        .create_in::<M>()
        .map_err(|e| e.to_string())?;
    let writer = M::writer(&tx).map_err(|e| e.to_string())?;
    let run = Duration::from_secs_f64(args.run_s.unwrap_or(10.0));
    let start = Instant::now();
    let mut seq = 0u64;
    while start.elapsed() < run {
        if stop_requested() {
            // SIGTERM: close the ring (dropping `tx`) and let the GPU finish, then exit.
            println!("published={seq} closing_at={}", monotonic_ns());
            return Ok(());
        }
        match tx.acquire_timeout(Duration::from_millis(50)) {
            Ok(mut slot) => {
                let len = pattern::len_for(seq, 1, SLOT);
                M::fill(&writer, &mut slot, len, seq).map_err(|e| format!("fill: {e}"))?;
                match slot.publish(len, &seq.to_le_bytes()) {
                    Ok(_) => seq += 1,
                    Err(PublishError::ContextLost(e)) => return Err(e.to_string()),
                    Err(_) => {}
                }
            }
            Err(AcquireTimeoutError::ContextLost(e)) => return Err(e.to_string()),
            Err(_) => {}
        }
        // Pace to about 2000 frames/s so the victims get to hold slots.
        std::thread::sleep(Duration::from_micros(300));
    }
    // Settle: every live consumer caught up, the dead reaped; then nothing may still be held.
    let t = Instant::now();
    loop {
        let _ = tx.reap();
        let cs = tx.consumers();
        if cs.iter().all(|c| c.lag == 0 && c.holding == 0) || t.elapsed() > Duration::from_secs(20)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("published={seq} leaked={} closing_at={}", tx.held_buffers(), monotonic_ns());
    Ok(())
}

/// Kills this process with SIGKILL, as a crash would.
fn die() -> ! {
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    unreachable!("SIGKILL")
}

/// A consumer of `kind` (see [`Kind`]), in the memory `--memory` names.
fn consumer(args: &Args, kind: Kind) -> ExitCode {
    let done = match args.memory {
        MemoryArg::Host => consumer_in::<Host>(args, kind),
        #[cfg(feature = "cuda")]
        MemoryArg::Cuda => consumer_in::<gpuring::Cuda>(args, kind),
        #[cfg(not(feature = "cuda"))]
        MemoryArg::Cuda => Err("built without the cuda feature".into()),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak consumer: {e}");
            failure()
        }
    }
}

/// A consumer of `kind` for memory kind `M`. Every frame is checked (on the GPU, by a kernel
/// on the message's stream, in CUDA memory); holders keep four and sleep until killed (or, under
/// `--stop-signal term`, until SIGTERM, then stop gracefully).
fn consumer_in<M: Soaked>(args: &Args, kind: Kind) -> Result<(), String> {
    let name = args.name.as_deref().expect("--name");
    let started = monotonic_ns();
    let slot = args.slot.unwrap_or(0);
    let builder = Consumer::builder(name).start_at(StartAt::Next).liveness_interval(LIVENESS);
    let mut rx = match builder.open_in_when_ready::<M>(None, Duration::from_secs(10)) {
        Ok(rx) => rx,
        Err(e) if gpuring::is_context_lost(&e) => return Err(e.to_string()),
        Err(_) => return Ok(()), // the soak ended before we got in
    };
    let victim = kind != Kind::Steady;
    let (mut verified, mut mismatches) = (0u64, 0u64);
    // Frames received whose GPU checks were not read back yet: unconfirmed if the context is
    // lost before they are.
    let mut unchecked = 0u64;
    let lost = |e: String, (verified, mismatches, unchecked): (u64, u64, u64)| {
        if !victim {
            println!("verified={verified} mismatches={mismatches} unconfirmed={unchecked} since={started}");
        }
        Err(e)
    };
    loop {
        let checker = match M::checker(&rx) {
            Ok(c) => c,
            Err(e) => return lost(e.to_string(), (verified, mismatches, unchecked)),
        };
        if kind == Kind::Releaser {
            // Bounded waits, so that a SIGTERM before the message ends it too.
            let m = loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => break m,
                    Err(RecvTimeoutError::Timeout) if !stop_requested() => {}
                    Err(RecvTimeoutError::ContextLost(e)) => return Err(e.to_string()),
                    Err(_) => return Ok(()),
                }
            };
            M::check_then_release(&checker, m, args.release_spin_us)?;
            if args.stop_signal == StopArg::Kill {
                die();
            }
            // SIGTERM while the kernel runs: the drop of `rx` below waits for its read.
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::TERM,
            );
            while !stop_requested() {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Ok(());
        }
        let mut held = Vec::new();
        let mut first = true;
        // Bounded waits: a SIGTERM (`--stop-signal term`) ends the loop as a disconnection
        // does, holding nothing.
        let disconnected = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Err(RecvTimeoutError::Timeout) if stop_requested() => break false,
                Err(RecvTimeoutError::Timeout) => {}
                Ok(m) => {
                    if let Err(e) = M::check(&checker, &m) {
                        return lost(e.to_string(), (verified, mismatches, unchecked));
                    }
                    unchecked += 1;
                    if std::mem::take(&mut first) && !victim {
                        println!("flowing_at={} slot={slot}", monotonic_ns());
                    }
                    if victim {
                        held.push(m);
                        if held.len() == 4 {
                            let t = Instant::now();
                            while !stop_requested() && t.elapsed() < Duration::from_secs(3600) {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            return Ok(()); // SIGTERM: `held`, then `rx`, drop gracefully
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break true,
                Err(RecvTimeoutError::ContextLost(e)) => {
                    return lost(e.to_string(), (verified, mismatches, unchecked))
                }
                Err(e) => {
                    eprintln!("consumer: {e}");
                    mismatches += 1;
                    break false;
                }
            }
        };
        drop(held);
        match M::mismatches(&checker, &rx) {
            Ok(n) => mismatches += n,
            Err(e) => return lost(e.to_string(), (verified, mismatches, unchecked)),
        }
        verified += std::mem::take(&mut unchecked);
        if !disconnected || victim {
            break;
        }
        println!("disconnected_at={}", monotonic_ns());
        match rx.reconnect(Duration::from_secs(5)) {
            Ok(next) => rx = next,
            Err(e) if gpuring::is_context_lost(&e) => {
                return lost(e.to_string(), (verified, mismatches, 0))
            }
            Err(_) => break,
        }
    }
    if !victim {
        println!("verified={verified} mismatches={mismatches} since={started}");
    }
    Ok(())
}

/// What the releaser does per memory kind, before it kills itself.
trait Soaked: Payload {
    /// Checks `m`, then releases it; in CUDA memory the check is a kernel that spins
    /// `spin_us` before it reads, so that it is still running when the process dies.
    fn check_then_release(
        c: &Self::Checker,
        m: ReadSlot<'_, Self>,
        spin_us: u64,
    ) -> Result<(), String>;
}

impl Soaked for Host {
    fn check_then_release(c: &Self::Checker, m: ReadSlot<'_, Host>, _: u64) -> Result<(), String> {
        Host::check(c, &m).map_err(|e| e.to_string())?;
        drop(m);
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl Soaked for gpuring::Cuda {
    fn check_then_release(
        c: &Self::Checker,
        m: ReadSlot<'_, gpuring::Cuda>,
        spin_us: u64,
    ) -> Result<(), String> {
        c.check_spinning(&m, spin_us * 1000).map_err(|e| e.to_string())?;
        m.release().map_err(|e| e.to_string())
    }
}
