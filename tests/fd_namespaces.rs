//! The fd server (src/shm/fdpass.rs) across pid namespaces, as between containers: a peer in a
//! pid namespace the server cannot see reads as pid 0 in `SO_PEERCRED`, which must neither
//! break the server nor the client's check of the server. Each test runs one side, or both,
//! in a new pid namespace (`unshare --pid --fork`, which needs root), re-executing this test
//! binary with a role; they are ignored by default:
//! `cargo test --all-features --test fd_namespaces -- --ignored`.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::os::fd::OwnedFd;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{env, role, ROLE};
use gpuring::shm::dir::RingDir;
use gpuring::shm::fdpass::{fd_address, fetch_from, FdServer, PeerPolicy};
use gpuring::shm::unixsock::fd_file;

/// The ring instance every test serves.
const EPOCH: u64 = 1;
/// How long a server child waits for its peer before it gives up.
const PEER_WAIT: Duration = Duration::from_secs(30);

fn our_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn memfd(contents: &[u8]) -> OwnedFd {
    let fd = rustix::fs::memfd_create("pool", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::io::write(&fd, contents).unwrap();
    fd
}

fn contents(fd: &OwnedFd) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let n = rustix::io::pread(fd, &mut buf, 0).unwrap();
    buf[..n].to_vec()
}

/// Starts the server of ring `name` in `dir`, offering one memfd.
fn serve(dir: &RingDir, name: &str) -> FdServer {
    let file = fd_file(name, EPOCH);
    FdServer::start(dir, &file, 0o600, vec![memfd(b"pool")], b"pools".to_vec(), PeerPolicy::SameUid)
        .unwrap()
}

/// Fetches from ring `name`'s server in `dir`, checking that it runs as our uid (the ring's
/// owner), and returns the line a client prints: what it got, and its own pid.
fn fetch_line(dir: &RingDir, name: &str) -> String {
    let addr = fd_address(dir, name, EPOCH).unwrap();
    let (payload, fds) = fetch_from(&addr, our_uid()).unwrap();
    let got: Vec<Vec<u8>> = fds.iter().map(contents).collect();
    format!(
        "client: payload {:?} fds {:?} pid {}",
        String::from_utf8_lossy(&payload),
        got.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>(),
        std::process::id()
    )
}

/// What a client that fetched the one memfd prints, in a pid namespace of its own (pid 1).
const CLIENT_IN_NEW_NAMESPACE: &str = r#"client: payload "pools" fds ["pool"] pid 1"#;

/// The child roles. Returns whether this process is a child (and has done its part).
fn child() -> bool {
    let Some(role) = role() else { return false };
    let dir = RingDir::open(env::<String>("DIR")).unwrap();
    let name: String = env("RING");
    match role.as_str() {
        "client" => println!("{}", fetch_line(&dir, &name)),
        "server" => {
            let server = serve(&dir, &name);
            println!("server: ready, pid {}", std::process::id());
            // Serve one peer, then say what the kernel told us about it.
            let deadline = Instant::now() + PEER_WAIT;
            let counts = loop {
                let counts = server.counts();
                if counts.served + counts.refused > 0 || Instant::now() > deadline {
                    break counts;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            println!(
                "server: served {} refused {} pid_not_visible {}",
                counts.served, counts.refused, counts.pid_not_visible
            );
        }
        other => panic!("unknown role {other}"),
    }
    true
}

/// This test binary running only `test`, as `role` on ring `name` in `dir`, in a new pid
/// namespace, its stdout piped.
fn unshared(test: &str, role: &str, dir: &RingDir, name: &str) -> Child {
    assert_eq!(our_uid(), 0, "these tests need root (for unshare --pid)");
    Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env(ROLE, role)
        .env("DIR", dir.path())
        .env("RING", name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run unshare")
}

/// The next line of `lines` that has `start` in it, from there on. The harness's
/// "test NAME ... " may precede it on the same line.
fn line_with(lines: &mut Lines<BufReader<ChildStdout>>, start: &str) -> String {
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(at) = line.find(start) {
            println!("{}", &line[at..]);
            return line[at..].to_owned();
        }
    }
    panic!("the child ended without a line starting {start:?}");
}

fn expect_success(mut child: Child, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} failed: {status}");
}

fn temp() -> RingDir {
    RingDir::open(std::env::temp_dir()).unwrap()
}

#[test]
#[ignore = "needs root and unshare"]
fn a_client_in_another_pid_namespace_is_served() {
    const TEST: &str = "a_client_in_another_pid_namespace_is_served";
    if child() {
        return;
    }
    let (dir, name) = (temp(), common::unique_name("ns-client"));
    let server = serve(&dir, &name);
    let mut client = unshared(TEST, "client", &dir, &name);
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(line_with(&mut lines, "client: "), CLIENT_IN_NEW_NAMESPACE);
    expect_success(client, "the client");
    // A pid namespace below ours: the kernel gives us the client's pid in ours.
    let counts = server.counts();
    assert_eq!((counts.served, counts.refused, counts.pid_not_visible), (1, 0, 0));
}

#[test]
#[ignore = "needs root and unshare"]
fn a_server_in_another_pid_namespace_serves_us() {
    const TEST: &str = "a_server_in_another_pid_namespace_serves_us";
    if child() {
        return;
    }
    let (dir, name) = (temp(), common::unique_name("ns-server"));
    let mut server = unshared(TEST, "server", &dir, &name);
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(line_with(&mut lines, "server: "), "server: ready, pid 1");
    let got = fetch_line(&dir, &name);
    assert_eq!(got, format!(r#"client: payload "pools" fds ["pool"] pid {}"#, std::process::id()));
    // We are outside the server's pid namespace: it cannot see our pid.
    let seen = line_with(&mut lines, "server: ");
    assert_eq!(seen, "server: served 1 refused 0 pid_not_visible 1");
    expect_success(server, "the server");
}

/// Two containers' layout: server and client each in a pid namespace of its own.
#[test]
#[ignore = "needs root and unshare"]
fn a_server_and_a_client_in_sibling_pid_namespaces() {
    const TEST: &str = "a_server_and_a_client_in_sibling_pid_namespaces";
    if child() {
        return;
    }
    let (dir, name) = (temp(), common::unique_name("ns-siblings"));
    let mut server = unshared(TEST, "server", &dir, &name);
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(line_with(&mut lines, "server: "), "server: ready, pid 1");
    let mut client = unshared(TEST, "client", &dir, &name);
    let mut client_lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(line_with(&mut client_lines, "client: "), CLIENT_IN_NEW_NAMESPACE);
    expect_success(client, "the client");
    let seen = line_with(&mut lines, "server: ");
    assert_eq!(seen, "server: served 1 refused 0 pid_not_visible 1");
    expect_success(server, "the server");
}
