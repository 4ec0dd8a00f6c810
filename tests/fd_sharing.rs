//! The fd server that the VMM memory mode shares its pools through (src/shm/fdpass.rs): a
//! process of another uid is refused by the kernel-reported uid, not by anything it says.
//! Needs root, to run the peer under another uid (CI and the GPU machine run as root).

mod common;

use std::process::{Command, Stdio};

use common::{role, ROLE};
use gpuring::shm::fdpass::{fd_address, fetch, FdServer, FetchError, PeerPolicy};

/// `nobody`.
const OTHER_UID: u32 = 65534;

#[test]
fn a_peer_of_another_uid_is_refused() {
    const TEST: &str = "a_peer_of_another_uid_is_refused";
    let name = std::env::var("RING").unwrap_or_else(|_| common::unique_name("fds"));
    let addr = fd_address(&name, 1).unwrap();
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
    let _server =
        FdServer::start(&addr, vec![memfd], b"pools".to_vec(), PeerPolicy::SameUid).unwrap();
    let run = |role: &str| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("RING", &name)
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
    };
    assert!(run("same-uid").contains("fds: received 1,"));
    let refused = run("other-uid");
    assert!(refused.contains(&format!("refused: uid {OTHER_UID} is not allowed")), "{refused}");
}
