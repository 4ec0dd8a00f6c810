//! Faults of the OS layer (`src/shm/`), one regression test each: a /dev/shm too small for the
//! ring, a SIGBUS that is not a truncation, and producers racing to replace a dead producer's
//! ring.

mod common;

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::shm::{OpenOptions, RingDir, Segment, ShmName};
use gpuring::{CreateError, CreateErrorKind, Producer};

fn path(name: &str) -> String {
    format!("/dev/shm/gpuring.{name}")
}

/// Bytes of /dev/shm an unprivileged user may still fill, or `None` where the file system
/// reports no size limit.
fn shm_free() -> Option<u64> {
    let st = rustix::fs::statvfs("/dev/shm").expect("statvfs /dev/shm");
    (st.f_blocks != 0).then(|| st.f_bavail * st.f_frsize)
}

/// A ring larger than the free space of /dev/shm is refused by `create` with `NoSpace`, and no
/// half-made segment is left behind. (It used to be created, sparse, and the first write to a
/// page the file system could not back raised SIGBUS.)
#[test]
fn ring_larger_than_free_shm_is_refused() {
    let Some(free) = shm_free() else {
        eprintln!("skipped: /dev/shm reports no size limit");
        return;
    };
    const SLOT: u64 = 1 << 30;
    let capacity = (free / SLOT + 2).min(65536) as u32;
    let payload = capacity as u64 * SLOT;
    assert!(payload > free, "/dev/shm is too large for this test ({free} bytes free)");
    let name = unique_name("nospace");
    match (Producer::builder(&name).slot_size(SLOT as usize).capacity(capacity).create())
        .map_err(CreateError::into_kind)
    {
        Err(CreateErrorKind::NoSpace { needed, available }) => {
            assert!(needed > available, "NoSpace, but needed {needed} <= available {available}");
            assert!(needed >= payload, "needed {needed} is less than the payload, {payload}");
        }
        Ok(tx) => {
            let size = fs::metadata(path(&name)).map(|m| m.len());
            drop(tx);
            panic!("created a ring of {size:?} bytes on a /dev/shm with {free} bytes free");
        }
        Err(e) => panic!("expected NoSpace, got {e:?}"),
    }
    assert!(!Path::new(&path(&name)).exists(), "a half-made segment was left at {}", path(&name));
}

/// Every page of a new ring's segment is backed by the file system as soon as `create` returns:
/// a full /dev/shm shows up there, not as a SIGBUS at some later write.
#[test]
fn ring_pages_are_reserved_at_create() {
    let name = unique_name("reserved");
    let tx = Producer::builder(&name).slot_size(1 << 20).capacity(8).create().unwrap();
    let m = fs::metadata(path(&name)).unwrap();
    assert!(m.len() >= 8 << 20, "segment of {} bytes", m.len());
    let backed = m.blocks() * 512;
    assert!(backed >= m.len(), "only {backed} of the segment's {} bytes are backed", m.len());
    drop(tx);
}

/// Sends SIGBUS to this thread with a forged siginfo: `si_code` SI_QUEUE (a process may queue
/// any negative code to itself) and `addr` in the word where a fault's `si_addr` lies.
fn forged_sigbus(addr: usize) {
    // SAFETY: siginfo_t is plain data; all zeros is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = libc::SIGBUS;
    info.si_code = libc::SI_QUEUE;
    // The union follows si_signo, si_errno and si_code, aligned for a pointer; for SI_QUEUE its
    // first word holds si_pid and si_uid, for a fault si_addr.
    let offset =
        (3 * std::mem::size_of::<libc::c_int>()).next_multiple_of(std::mem::align_of::<usize>());
    // SAFETY: `offset` plus one word lies inside the 128-byte siginfo_t.
    unsafe {
        (&mut info as *mut libc::siginfo_t as *mut u8)
            .add(offset)
            .cast::<usize>()
            .write_unaligned(addr)
    };
    // SAFETY: reads the field just written, through libc's own accessor.
    assert_eq!(unsafe { info.si_addr() } as usize, addr, "si_addr is not where it was written");
    let tgid = rustix::process::getpid().as_raw_nonzero().get();
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    // SAFETY: rt_tgsigqueueinfo reads a siginfo_t that lives across the call.
    let r = unsafe {
        libc::syscall(libc::SYS_rt_tgsigqueueinfo, tgid, tid, libc::SIGBUS, &info as *const _)
    };
    assert_eq!(r, 0, "rt_tgsigqueueinfo: {}", std::io::Error::last_os_error());
}

/// A SIGBUS that is not a fault past the end of a file (here one queued with a forged address
/// inside a ring's mapping) is not swallowed by the guard: the process dies of it, as it would
/// without gpuring. (The guard used to take it for a truncation, map a zero page over live
/// shared memory and carry on.)
#[test]
fn foreign_sigbus_in_a_ring_kills() {
    const TEST: &str = "foreign_sigbus_in_a_ring_kills";
    if role().is_some() {
        // The Rust runtime's own SIGBUS handler (stack overflow detection) restores the default
        // action and returns on a SIGBUS that is not in a stack guard page: a *sent* SIGBUS is
        // survived once, with or without gpuring. Restore the default before the first ring,
        // so that it is the action the guard passes foreign signals on to.
        // SAFETY: SIG_DFL is a valid disposition for SIGBUS.
        assert_ne!(unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) }, libc::SIG_ERR);
        // No core file for the death we expect.
        let core = rustix::process::Resource::Core;
        let maximum = rustix::process::getrlimit(core).maximum;
        rustix::process::setrlimit(core, rustix::process::Rlimit { current: Some(0), maximum })
            .ok();
        let name = env::<String>("RING");
        let _tx = Producer::builder(&name).create().unwrap();
        let seg = Segment::open(
            &RingDir::open_default().unwrap(),
            &ShmName::new(&name).unwrap(),
            OpenOptions::default(),
        )
        .unwrap();
        let addr = seg.base() as usize + 64;
        forged_sigbus(addr);
        eprintln!(
            "survived a forged SIGBUS at {addr:#x}; segment marked faulted: {}",
            seg.faulted()
        );
        return;
    }
    let name = unique_name("sigbus");
    let mut child = spawn(TEST, "child", &[("RING", name.clone())]);
    let status = child.wait().unwrap();
    let _ = fs::remove_file(path(&name));
    assert_eq!(
        status.signal(),
        Some(libc::SIGBUS),
        "the child should have died of SIGBUS, but ended with {status}"
    );
}

/// Children of [`racing_producers_replace_a_stale_ring_once`] that are killed if the test
/// ends before they do.
struct Racers(Vec<Child>);

impl Drop for Racers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The FIFO of round `round`, phase `phase`, that racers wait on.
fn gate(dir: &Path, round: usize, phase: usize) -> PathBuf {
    dir.join(format!("gate-{round}-{phase}"))
}

/// Racer side of a barrier: announce, then wait until the parent closes the gate. Opening the
/// FIFO blocks until the parent has opened it; reading it returns end-of-file once the parent
/// closed it.
fn pass(dir: &Path, round: usize, phase: usize, ready: &mut File) {
    let mut g = File::open(gate(dir, round, phase)).expect("open gate");
    ready.write_all(&[1]).expect("announce");
    let mut b = [0u8; 1];
    assert_eq!(g.read(&mut b).expect("wait at gate"), 0, "the parent writes nothing");
}

/// Parent side of a barrier: open the gate, wait until every racer waits at it, close it.
fn release(dir: &Path, round: usize, phase: usize, ready: &mut File, racers: &mut Racers) {
    let g = fs::OpenOptions::new().read(true).write(true).open(gate(dir, round, phase)).unwrap();
    let mut seen = 0;
    let t = Instant::now();
    while seen < racers.0.len() {
        let mut b = [0u8; 16];
        match ready.read(&mut b) {
            Ok(n) => seen += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                for c in &mut racers.0 {
                    if let Some(status) = c.try_wait().unwrap() {
                        panic!("a racer ended early, in round {round}: {status}");
                    }
                }
                assert!(t.elapsed() < Duration::from_secs(60), "racers stuck in round {round}");
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => panic!("reading the ready FIFO: {e}"),
        }
    }
    assert_eq!(seen, racers.0.len(), "more announcements than racers in round {round}");
    drop(g);
}

/// Small rings, so that thousands of rounds fit in /dev/shm.
fn small(name: &str) -> gpuring::ProducerBuilder {
    Producer::builder(name).capacity(1).slot_size(64).max_consumers(1).user_header_size(0)
}

/// Several producers that find the same stale ring (its producer dead) at the same instant:
/// exactly one of them replaces it, and its ring keeps the name while the others give up.
/// (Each used to stat the name and then unlink it, so a slow one could unlink the winner's
/// brand-new segment and create a second ring: two live producers, one of them unreachable.)
///
/// Each round's stale ring is a copy of a ring whose producer process exited without closing
/// it, under a name of its own. `GPURING_RACERS` processes (default 4) wait at a barrier (a
/// FIFO), call `create` together, wait at a second barrier so that every racer has tried, and
/// then each winner checks that the ring at the name is its own (by epoch). The old code went
/// wrong in about one round of 800 here, so `GPURING_RACE_ROUNDS` defaults to 5000 (a few
/// seconds: the racers live through all rounds).
#[test]
fn racing_producers_replace_a_stale_ring_once() {
    const TEST: &str = "racing_producers_replace_a_stale_ring_once";
    match role().as_deref() {
        Some("stale") => {
            let tx = small(&env::<String>("RING")).create().unwrap();
            // Exit without closing: the segment stays, naming a dead producer.
            std::mem::forget(tx);
            std::process::exit(0);
        }
        Some("racer") => {
            let dir = PathBuf::from(env::<String>("DIR"));
            let base: String = env("BASE");
            let index: usize = env("INDEX");
            let mut ready = fs::OpenOptions::new().write(true).open(dir.join("ready")).unwrap();
            let mut log = File::create(dir.join(format!("log-{index}"))).unwrap();
            for round in 0..env::<usize>("ROUNDS") {
                let name = format!("{base}-{round}");
                pass(&dir, round, 0, &mut ready);
                let made = small(&name).create();
                pass(&dir, round, 1, &mut ready);
                // Every racer has tried: a winner's ring must still be the one at the name.
                let line = match made.as_ref().map_err(CreateError::kind) {
                    Ok(tx) => {
                        let at_name = gpuring::inspect::status(&name).map(|s| s.epoch);
                        let intact = at_name.as_ref().is_ok_and(|&e| e == tx.epoch());
                        format!("{round} created {intact} {at_name:?}")
                    }
                    Err(CreateErrorKind::AlreadyExists { .. }) => format!("{round} exists"),
                    Err(e) => format!("{round} error {e}"),
                };
                writeln!(log, "{line}").unwrap();
                drop(made);
            }
            return;
        }
        _ => {}
    }
    let var = |key, default| std::env::var(key).map_or(default, |v| v.parse().expect(key));
    let racers = var("GPURING_RACERS", 4);
    let rounds = var("GPURING_RACE_ROUNDS", 5000);
    let base = unique_name("race");
    let dir = std::env::temp_dir().join(&base);
    fs::create_dir_all(&dir).unwrap();

    // One dead producer's ring, copied once per round.
    let template = format!("{base}-template");
    expect_success(spawn(TEST, "stale", &[("RING", template.clone())]), "stale producer");
    let bytes = fs::read(path(&template)).unwrap();
    fs::remove_file(path(&template)).unwrap();
    for round in 0..rounds {
        let p = path(&format!("{base}-{round}"));
        fs::write(&p, &bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        for phase in 0..2 {
            let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
            let fifo = gate(&dir, round, phase);
            rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0)
                .unwrap();
        }
    }
    let ready_path = dir.join("ready");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &ready_path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .unwrap();
    // Read and write, so that it never reads end-of-file, and non-blocking, so that a dead
    // racer is noticed.
    let mut ready = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&ready_path)
        .unwrap();

    let mut kids = Racers(Vec::new());
    for index in 0..racers {
        let vars = [
            ("DIR", dir.display().to_string()),
            ("BASE", base.clone()),
            ("INDEX", index.to_string()),
            ("ROUNDS", rounds.to_string()),
        ];
        kids.0.push(spawn(TEST, "racer", &vars));
    }
    let t = Instant::now();
    for round in 0..rounds {
        release(&dir, round, 0, &mut ready, &mut kids);
        release(&dir, round, 1, &mut ready, &mut kids);
    }
    for (i, c) in kids.0.iter_mut().enumerate() {
        let status = c.wait().unwrap();
        assert!(status.success(), "racer {i} failed: {status}");
    }
    eprintln!("{rounds} rounds of {racers} racers in {:?}", t.elapsed());

    // Per round: who created the ring, and whether it was still at the name.
    let mut created: Vec<Vec<(usize, String)>> = vec![Vec::new(); rounds];
    let mut bad = Vec::new();
    for index in 0..racers {
        let log = fs::read_to_string(dir.join(format!("log-{index}"))).unwrap();
        assert_eq!(log.lines().count(), rounds, "racer {index} logged a round twice or not at all");
        for line in log.lines() {
            let (round, rest) = line.split_once(' ').unwrap();
            let round: usize = round.parse().unwrap();
            if rest.starts_with("created") {
                created[round].push((index, rest.to_owned()));
            } else if rest != "exists" {
                bad.push(format!("round {round}: racer {index}: {rest}"));
            }
        }
    }
    for (round, winners) in created.iter().enumerate() {
        let lost = winners.iter().filter(|(_, w)| !w.starts_with("created true")).count();
        if winners.len() != 1 || lost > 0 {
            bad.push(format!(
                "round {round}: {} racers created the ring: {winners:?}",
                winners.len()
            ));
        }
    }
    for round in 0..rounds {
        let _ = fs::remove_file(path(&format!("{base}-{round}")));
    }
    let _ = fs::remove_dir_all(&dir);
    assert!(
        bad.is_empty(),
        "{} of {rounds} rounds went wrong; the first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}
