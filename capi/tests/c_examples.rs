//! The C examples (capi/examples/), compiled with the system C compiler against the shared
//! library and run as real processes in host memory: one producer and two consumers that check
//! every byte, header and sequence number. (CUDA mode: docs/c.md shows the build; it runs on the
//! GPU machine.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// target/<profile>: where cargo put this crate's shared library.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf() // .../deps/.. = target/<profile>
}

fn compile(example: &str, out: &Path) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let lib = lib_dir();
    assert!(
        lib.join("libgpuring_c.so").exists(),
        "no {}/libgpuring_c.so: `cargo test` does not build the shared library; run \
         `cargo build -p gpuring-c` first (.ci/run does)",
        lib.display()
    );
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(format!("-I{dir}/include"))
        .arg(format!("{dir}/examples/{example}.c"))
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        .arg("-lgpuring_c")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .expect("run the C compiler (cc)");
    assert!(status.success(), "compiling {example}.c failed");
}

#[test]
fn c_producer_and_consumers_exchange_every_byte_in_host_memory() {
    let tmp = std::env::temp_dir().join(format!("gpuring-c-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (producer, consumer) = (tmp.join("producer"), tmp.join("consumer"));
    compile("producer", &producer);
    compile("consumer", &consumer);
    let name = format!("c-example-{}", std::process::id());
    let tx = Command::new(&producer)
        .args([&name, "2", "3000", "host"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rxs: Vec<_> = (0..2)
        .map(|_| Command::new(&consumer).arg(&name).stdout(Stdio::piped()).spawn().unwrap())
        .collect();
    for (what, child) in
        std::iter::once(("producer", tx)).chain(rxs.into_iter().map(|c| ("consumer", c)))
    {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        assert!(out.status.success(), "{what} failed: {}", out.status);
        if what == "consumer" {
            assert!(text.contains("3000 messages, 0 bad, 0 lost"), "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
