//! The driver layer of VMM sharing: `cuMemCreate` pools exported as fds and imported in this
//! process and in another, sizes the driver refuses, and host memory registered for the GPU to
//! write and wait on. Needs a GPU.
#![cfg(feature = "cuda")]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{env, expect_success, role, unique_name};
use gpuring::cuda::driver::{self, IPC_EXPORTS, VMM_EXPORTS, VMM_IMPORTS};
use gpuring::cuda::{export_raw_fd, Context, DevicePool, HostRegistration, Stream};
use gpuring::cuda::{VmmImportError, VmmMapping, VmmPool};
use gpuring::shm::fdpass::{fd_address, fetch, FdServer, PeerPolicy};

/// The tests of this binary count the process's exports and imports: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// GPU 0's context, current on this thread for the raw driver calls of the test.
fn context() -> Arc<Context> {
    let ctx = Context::new(0).unwrap();
    ctx.make_current().unwrap();
    ctx
}

/// `len` device bytes at `src`.
fn read(src: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: callers pass `len` readable bytes of the current context.
    unsafe { driver::memcpy_dtoh(&mut out, src) }.unwrap();
    out
}

/// Sets `len` device bytes at `dst` to `value` and waits for it.
fn fill(s: &Stream, dst: u64, value: u8, len: usize) {
    // SAFETY: callers pass `len` writable bytes of the stream's context; synchronised below.
    unsafe { driver::memset_async(dst, value, len, s.raw()) }.unwrap();
    s.synchronize().unwrap();
}

fn all(bytes: &[u8], value: u8) -> bool {
    bytes.iter().all(|&b| b == value)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_pool_round_trip_in_one_process() {
    let _serial = serial();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    let granularity = driver::mem_granularity(0).unwrap();
    let pool = VmmPool::new(&ctx, 3 << 20).unwrap();
    eprintln!("granularity {granularity}, pool of {} bytes", pool.size());
    assert_eq!(pool.size() % granularity, 0);
    assert!(pool.size() >= 3 << 20);
    fill(&s, pool.ptr(), 0x5a, pool.size());

    let ipc = IPC_EXPORTS.load(Relaxed);
    let (exports, imports) = (VMM_EXPORTS.load(Relaxed), VMM_IMPORTS.load(Relaxed));
    let fd = pool.export_fd().unwrap();
    assert_eq!(VMM_EXPORTS.load(Relaxed), exports + 1);
    let map = VmmMapping::import(&ctx, fd.as_fd(), pool.size()).unwrap();
    assert_eq!(VMM_IMPORTS.load(Relaxed), imports + 1);
    drop(fd); // the import holds the allocation, not the fd
    assert_eq!(map.size(), pool.size());
    assert_ne!(map.ptr(), pool.ptr(), "a second mapping of the same memory");
    assert!(all(&read(map.ptr(), map.size()), 0x5a), "the mapping sees the pool's bytes");
    // And the pool sees writes through the mapping.
    fill(&s, map.ptr() + 100, 0xa5, 10);
    let head = read(pool.ptr(), 128);
    assert!(all(&head[100..110], 0xa5) && all(&head[..100], 0x5a) && all(&head[110..], 0x5a));

    // Any address inside the mapping exports the allocation; `cuMemAlloc` memory does not.
    // SAFETY: `pool.ptr() + 4096` lies in the pool's live mapping in `ctx`.
    let again = unsafe { export_raw_fd(&ctx, pool.ptr() + 4096) }.unwrap();
    assert_eq!(VMM_EXPORTS.load(Relaxed), exports + 2);
    let other = VmmMapping::import(&ctx, again.as_fd(), pool.size()).unwrap();
    assert!(all(&read(other.ptr() + 100, 10), 0xa5));
    let legacy = DevicePool::new(&ctx, 1).unwrap();
    // SAFETY: `legacy.ptr()` is a live allocation of `ctx` (not a `cuMemMap` one: refused).
    let refused = unsafe { export_raw_fd(&ctx, legacy.ptr()) };
    eprintln!("export_raw_fd of cuMemAlloc memory: {refused:?}");
    assert!(refused.is_err());

    assert_eq!(IPC_EXPORTS.load(Relaxed), ipc, "a VMM pool makes no legacy IPC call");
    drop((map, other));
    // The pool still works after its imports are gone.
    assert!(all(&read(pool.ptr(), 100), 0x5a));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_import_refuses_a_size_larger_than_the_allocation() {
    let _serial = serial();
    let ctx = context();
    let granularity = driver::mem_granularity(0).unwrap();
    let pool = VmmPool::new(&ctx, 1).unwrap();
    assert_eq!(pool.size(), granularity);
    let fd = pool.export_fd().unwrap();
    match VmmMapping::import(&ctx, fd.as_fd(), pool.size() + granularity) {
        Err(e @ VmmImportError::Size(_)) => eprintln!("{e}"),
        Err(e) => panic!("expected a size error, got: {e}"),
        Ok(_) => panic!("mapped more than the allocation"),
    }
    // The failed import undid itself; the right size maps.
    let map = VmmMapping::import(&ctx, fd.as_fd(), pool.size()).unwrap();
    assert_eq!(map.size(), pool.size());
}

/// Starts this test binary again running only `test` with `role`, its stdin and stdout piped:
/// the child prints tagged lines, the parent answers on its stdin.
fn spawn_piped(test: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env(common::ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Reads the child's stdout up to a line that ends with `tag` (the harness prints
/// `test NAME ... ` before the test's own output, on the same line, and other lines).
fn expect_line(out: &mut impl BufRead, tag: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before saying {tag:?}");
        if line.trim_end().ends_with(tag) {
            return;
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_pool_crosses_processes() {
    const TEST: &str = "vmm_pool_crosses_processes";
    if role().is_some() {
        let ctx = context();
        let s = Stream::new(&ctx).unwrap();
        let size: usize = env("SIZE");
        let dir = gpuring::shm::RingDir::open_default().unwrap();
        let addr = fd_address(&dir, &env::<String>("NAME"), 1).unwrap();
        let (payload, fds) = fetch(&addr).unwrap();
        assert_eq!((payload.as_slice(), fds.len()), (&b"pool"[..], 1));
        let map = VmmMapping::import(&ctx, fds[0].as_fd(), size).unwrap();
        drop(fds); // the import holds the allocation, not the fd
        assert!(all(&read(map.ptr(), size), 0x3c), "the producer's bytes");
        fill(&s, map.ptr(), 0xc3, size);
        assert_eq!(VMM_IMPORTS.load(Relaxed), 1);
        assert_eq!(IPC_EXPORTS.load(Relaxed), 0);
        println!("vmm-importer: written");
        // Wait until the parent has dropped its pool, its server and so its fd.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), "dropped");
        assert!(all(&read(map.ptr(), size), 0xc3), "our import kept the memory");
        fill(&s, map.ptr(), 0x77, size);
        assert!(all(&read(map.ptr(), size), 0x77), "and it is still writable");
        return;
    }
    let _serial = serial();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    let pool = VmmPool::new(&ctx, 4 << 20).unwrap();
    fill(&s, pool.ptr(), 0x3c, pool.size());
    let name = unique_name("vmm-driver");
    let dir = gpuring::shm::RingDir::open_default().unwrap();
    let file = gpuring::shm::unixsock::fd_file(&name, 1);
    let fd = pool.export_fd().unwrap();
    let server =
        FdServer::start(&dir, &file, 0o600, vec![fd], b"pool".to_vec(), PeerPolicy::SameUid)
            .unwrap();
    let vars = [("NAME", name), ("SIZE", pool.size().to_string())];
    let mut child = spawn_piped(TEST, "importer", &vars);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    expect_line(&mut out, "vmm-importer: written");
    assert!(all(&read(pool.ptr(), pool.size()), 0xc3), "the importer's bytes");
    // The importer's mapping is now the only reference to the memory.
    drop(server);
    drop(pool);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "dropped").unwrap();
    drop(stdin);
    // Read the child's output to its end: a closed pipe would fail its harness's last lines.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    expect_success(child, "importer process");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn host_registration_takes_gpu_writes_and_waits() {
    const LEN: usize = 4096;
    let _serial = serial();
    let ctx = context();
    let dev = driver::device(0).unwrap();
    assert!(driver::can_use_64_bit_stream_mem_ops(dev).unwrap(), "64-bit stream memory ops");
    let s = Stream::new(&ctx).unwrap();
    let memfd =
        rustix::fs::memfd_create("gpuring-vmm-driver", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, LEN as u64).unwrap();
    let file = std::fs::File::from(memfd);
    // SAFETY: a memfd of ours that nothing else resizes or maps.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
    let base = map.as_mut_ptr();
    // SAFETY: `base` starts a page-aligned shared mapping of LEN bytes that outlives `reg`
    // (dropped first, below), and nothing else registers it.
    let reg = unsafe { HostRegistration::new(&ctx, base, LEN) }.unwrap();
    // SAFETY: word `i` (< LEN / 8) of the mapping: 8-byte aligned, zero-initialised, live as
    // long as `map`, and only ever accessed atomically (here and by the GPU).
    let word = |i: usize| unsafe { &*base.add(8 * i).cast::<AtomicU64>() };

    // SAFETY: word 8 is an aligned word of the registration; the stream is synchronised below.
    unsafe { driver::stream_write_value64(s.raw(), reg.device_ptr(64), 7) }.unwrap();
    s.synchronize().unwrap();
    assert_eq!(word(8).load(Acquire), 7, "the GPU's write");

    // The stream waits for word 16 to reach 9, then writes word 24.
    // SAFETY: aligned words of the registration; the CPU stores 9 below, so the wait ends.
    unsafe {
        driver::stream_wait_value64(s.raw(), reg.device_ptr(128), 9).unwrap();
        driver::stream_write_value64(s.raw(), reg.device_ptr(192), 11).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(!s.is_idle().unwrap(), "the stream should be waiting");
    assert_eq!(word(24).load(Acquire), 0);
    word(16).store(8, Release);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!s.is_idle().unwrap(), "8 is not enough");
    word(16).store(9, Release);
    let t = Instant::now();
    while !s.is_idle().unwrap() {
        assert!(t.elapsed() < Duration::from_secs(5), "the stream did not see the CPU's 9");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(word(24).load(Acquire), 11, "the write after the wait");
    assert_eq!(reg.device_ptr(LEN - 1), reg.device_ptr(0) + (LEN - 1) as u64);
    drop(reg);
    drop(map);
}
