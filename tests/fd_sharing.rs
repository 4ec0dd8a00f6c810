//! The fd server that the VMM memory mode shares its pools through (src/shm/fdpass.rs): a
//! process of another uid is refused, or served, by the uid and groups the kernel reports for
//! it, not by anything it says. Needs root, to run the peer under another uid and groups (CI
//! and the GPU machine run as root).

mod common;

use std::process::{Command, Stdio};

use common::{role, ROLE};
use gpuring::shm::fdpass::{fd_address, fetch, FdServer, FetchError, PeerPolicy};
use gpuring::shm::unixsock::fd_file;
use gpuring::shm::RingDir;

/// The directory the test servers bind in: /dev/shm, which every uid may enter.
fn dir() -> RingDir {
    RingDir::open("/dev/shm").unwrap()
}

/// A ring mode that lets every user connect, so that the policy (not the file's mode) is what
/// admits or refuses the peers of other uids.
const OPEN_MODE: u32 = 0o666;

/// A uid no account has (not 65534, `nobody`: that is also the overflow uid an unmapped peer
/// reads as, which the server refuses whatever the policy).
const OTHER_UID: u32 = 4321;
/// A gid no group has.
const OTHER_GID: u32 = 4321;

#[test]
fn a_peer_of_another_uid_is_refused() {
    const TEST: &str = "a_peer_of_another_uid_is_refused";
    let name = std::env::var("RING").unwrap_or_else(|_| common::unique_name("fds"));
    let addr = fd_address(&dir(), &name, 1).unwrap();
    if let Some(role) = role() {
        if role == "other-uid" {
            // SAFETY: setuid is called before this process starts any other thread of its
            // own (the harness thread runs this test alone).
            assert_eq!(unsafe { libc::setuid(OTHER_UID) }, 0, "setuid");
        }
        match fetch(&addr) {
            Ok((payload, fds)) => println!("fds: received {}, payload {payload:?}", fds.len()),
            Err(FetchError::Refused(why)) => println!("fds: refused: {why}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    assert_eq!(rustix::process::getuid().as_raw(), 0, "this test needs root (to switch uid)");
    let memfd = rustix::fs::memfd_create("pool", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let file = fd_file(&name, 1);
    let _server = FdServer::start(
        &dir(),
        &file,
        OPEN_MODE,
        vec![memfd],
        b"pools".to_vec(),
        PeerPolicy::SameUid,
    )
    .unwrap();
    let run = |role: &str| run_child(TEST, role, &name);
    assert!(run("same-uid").contains("fds: received 1,"));
    let refused = run("other-uid");
    assert!(refused.contains(&format!("refused: uid {OTHER_UID} (gid")), "{refused}");
    assert!(refused.contains("peer policy: same uid as the producer"), "{refused}");
}

/// Runs this binary's `test` again as `role` on ring `name`, prints its `fds: ` line as
/// `ROLE: LINE`, and returns that line.
fn run_child(test: &str, role: &str, name: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("RING", name)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{role} child failed");
    // The harness's "test NAME ... " precedes our line on the same output line.
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let at = stdout.find("fds: ").unwrap_or(0);
    let line = stdout[at..].lines().next().unwrap_or_default().to_owned();
    println!("{role}: {line}");
    line
}

/// Becomes `uid` with primary group `gid` (if given) and exactly the supplementary `groups`.
/// Groups first: once we are not root, we may no longer change them.
fn become_user(uid: u32, gid: Option<u32>, groups: &[u32]) {
    // SAFETY: `groups` is a live slice of `groups.len()` gids; called before this process
    // starts any thread of its own (the harness thread runs this test alone).
    assert_eq!(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) }, 0, "setgroups");
    if let Some(gid) = gid {
        // SAFETY: as for setgroups; only this process's credentials change.
        assert_eq!(unsafe { libc::setgid(gid) }, 0, "setgid");
    }
    // SAFETY: as for setgroups; only this process's credentials change.
    assert_eq!(unsafe { libc::setuid(uid) }, 0, "setuid");
}

#[test]
fn peers_allowed_by_uid_or_group_are_served() {
    const TEST: &str = "peers_allowed_by_uid_or_group_are_served";
    let name = std::env::var("RING").unwrap_or_else(|_| common::unique_name("fds-allow"));
    // Instance 1 allows uid OTHER_UID; instance 2 allows group OTHER_GID.
    let by_uid = fd_address(&dir(), &name, 1).unwrap();
    let by_gid = fd_address(&dir(), &name, 2).unwrap();
    if let Some(role) = role() {
        let addr = match role.as_str() {
            // Our primary gid stays root's; the uid alone is what lets us in.
            "uid" => {
                become_user(OTHER_UID, None, &[]);
                &by_uid
            }
            "primary-gid" => {
                become_user(OTHER_UID, Some(OTHER_GID), &[]);
                &by_gid
            }
            // More groups than the server's first SO_PEERGROUPS buffer holds (64), so it
            // has to ask again with the size the kernel reports.
            "supplementary-gid" => {
                let groups: Vec<u32> = (70_000..70_100).chain([OTHER_GID]).collect();
                become_user(OTHER_UID, None, &groups);
                &by_gid
            }
            "no-gid" => {
                become_user(OTHER_UID, None, &[]);
                &by_gid
            }
            other => panic!("unknown role {other}"),
        };
        match fetch(addr) {
            Ok((payload, fds)) => println!("fds: received {}, payload {payload:?}", fds.len()),
            Err(FetchError::Refused(why)) => println!("fds: refused: {why}"),
            Err(e) => panic!("{e}"),
        }
        return;
    }
    assert_eq!(rustix::process::getuid().as_raw(), 0, "this test needs root (to switch uid)");
    let memfd = || rustix::fs::memfd_create("pool", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let start = |epoch, policy| {
        let file = fd_file(&name, epoch);
        FdServer::start(&dir(), &file, OPEN_MODE, vec![memfd()], b"pools".to_vec(), policy).unwrap()
    };
    let _uid_server = start(1, PeerPolicy::uids([OTHER_UID]));
    let _gid_server = start(2, PeerPolicy::gids([OTHER_GID]));
    let run = |role: &str| run_child(TEST, role, &name);
    for role in ["uid", "primary-gid", "supplementary-gid"] {
        let line = run(role);
        assert!(line.contains("fds: received 1,"), "{role}: {line}");
    }
    let refused = run("no-gid");
    assert!(refused.contains(&format!("refused: uid {OTHER_UID} (gid 0)")), "{refused}");
    assert!(refused.contains(&format!("or gids [{OTHER_GID}]")), "{refused}");
}
