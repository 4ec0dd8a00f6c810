//! Helpers shared by the integration tests: unique ring names and re-executing this test
//! binary as a child process with a role.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Environment variable naming the role a re-executed test binary plays.
pub const ROLE: &str = "GPURING_TEST_ROLE";

/// A ring name no other test (or test run) uses.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("t-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The role this process was started with, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Set in a child by [`spawn`] when the run shows the output of passing tests: see
/// [`verbose`].
pub const VERBOSE: &str = "GPURING_TEST_VERBOSE";

/// Whether this run shows what passing tests say: it was started with `--nocapture` (or
/// `RUST_TEST_NOCAPTURE`), and in a child, whether its parent's was. A child's stderr is not
/// the harness's to capture, so its [`progress!`] lines show only then; its panics always do.
pub fn verbose() -> bool {
    if role().is_some() {
        return std::env::var_os(VERBOSE).is_some();
    }
    std::env::args().any(|a| a == "--nocapture")
        || std::env::var_os("RUST_TEST_NOCAPTURE").is_some_and(|v| v != "0")
}

/// `eprintln!` for a child's progress and results (what it received, the errors it was meant to
/// get): shown in a `--nocapture` run only ([`verbose`]), so that passing runs stay quiet.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => {
        if $crate::common::verbose() {
            eprintln!($($arg)*);
        }
    };
}

/// Starts this test binary again running only `test` (which must check [`role`] first), with
/// `role` and extra environment variables.
pub fn spawn(test: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        // The child's harness chatter would interleave with ours; its panics go to stderr.
        .stdout(Stdio::null());
    if verbose() {
        cmd.env(VERBOSE, "1");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Waits for a child and asserts that it succeeded.
pub fn expect_success(mut child: Child, what: &str) {
    let status = child.wait().expect("wait child");
    assert!(status.success(), "{what} failed: {status}");
}

/// An environment variable of a child, parsed.
pub fn env<T: std::str::FromStr>(key: &str) -> T {
    std::env::var(key)
        .unwrap_or_else(|_| panic!("{key} not set"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} not parseable"))
}

/// The `gpuring` binary next to this test: `target/<profile>/gpuring` for cargo, `bin/gpuring`
/// beside `tests/` in the GPU bundle (where cargo's `CARGO_BIN_EXE_*` paths do not exist).
pub fn gpuring_bin() -> PathBuf {
    beside(["../gpuring", "../bin/gpuring"], "the gpuring binary is built beside the tests")
}

/// Example `name` next to this test: `target/<profile>/examples/NAME` for cargo (`cargo test`
/// builds the examples), `bin/NAME` in the GPU bundle.
pub fn example_bin(name: &str) -> PathBuf {
    let at = [format!("../examples/{name}"), format!("../bin/{name}")];
    beside(at, &format!("example {name} is built beside the tests"))
}

/// The first of `paths` (relative to this test binary's folder) that exists.
fn beside(paths: [impl AsRef<std::path::Path>; 2], what: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    paths.iter().map(|p| dir.join(p)).find(|p| p.exists()).expect(what)
}

/// Runs `gpuring ARGS`: (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(gpuring_bin()).args(args).output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}
