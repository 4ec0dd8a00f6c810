//! The CUDA layer across two processes: a pool filled by a kernel in one process, fenced by an
//! IPC event, mapped and checked by a kernel in another. Needs a GPU.
#![cfg(feature = "cuda")]

mod common;

use common::{env, expect_success, role, spawn};
use gpuring::cuda::driver::{self, IPC_EVENT_OPENS, IPC_MEM_CLOSES, IPC_MEM_OPENS};
use gpuring::cuda::{Context, DevicePool, IpcEvent, IpcMapping, Stream, POOL_ALIGN};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};

/// 8 MiB plus 5 bytes, so the kernels' tail path runs too.
const LEN: u64 = (8 << 20) + 5;
const SEQ: u64 = 42;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// Runs the check kernel over `len` bytes at `src` for `seq` and returns the mismatch count.
fn gpu_mismatches(k: &PatternKernels, s: &Stream, src: u64, seq: u64) -> u64 {
    let counter = MismatchCounter::new(s).unwrap();
    // SAFETY: `src` holds LEN bytes; the counter is a device u64.
    unsafe { k.check(s, src, LEN, seq, counter.ptr(), 0).unwrap() };
    counter.read().unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_pool_and_event_across_processes() {
    if role().is_some() {
        let ctx = Context::new(0).unwrap();
        ctx.make_current().unwrap(); // the raw driver calls below run in it
        let k = PatternKernels::get(&ctx).unwrap();
        let s = Stream::new(&ctx).unwrap();
        let size: usize = env("SIZE");
        let mem = driver::mem_handle_from_bytes(&unhex(&env::<String>("MEM")));
        let ev = driver::event_handle_from_bytes(&unhex(&env::<String>("EVENT")));
        let map = IpcMapping::open(&ctx, mem, size).unwrap();
        let ready = IpcEvent::open(&ctx, ev).unwrap();
        // The GPU-side fence: our kernel starts only after the producer's fill.
        ready.wait_on(&s).unwrap();
        assert_eq!(gpu_mismatches(&k, &s, map.ptr(), SEQ), 0, "mapped pool differs");
        // The checker can fail: the same bytes are wrong for another message.
        assert!(gpu_mismatches(&k, &s, map.ptr(), SEQ + 1) > LEN / 2);
        assert_eq!(IPC_MEM_OPENS.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(IPC_EVENT_OPENS.load(std::sync::atomic::Ordering::Relaxed), 1);
        drop(map);
        assert_eq!(IPC_MEM_CLOSES.load(std::sync::atomic::Ordering::Relaxed), 1);
        eprintln!("consumer: compiled from {}", if k.from_cubin { "CUBIN" } else { "PTX" });
        return;
    }
    let ctx = Context::new(0).unwrap();
    ctx.make_current().unwrap(); // the raw driver calls below run in it
    let k = PatternKernels::get(&ctx).unwrap();
    let s = Stream::new(&ctx).unwrap();
    let pool = DevicePool::new(&ctx, LEN as usize).unwrap();
    assert_eq!(pool.size() % POOL_ALIGN, 0);
    assert!(pool.size() as u64 >= LEN);
    let ready = IpcEvent::new(&ctx).unwrap();
    // SAFETY: the pool holds LEN bytes and outlives the child.
    unsafe { k.fill(&s, pool.ptr(), LEN, SEQ).unwrap() };
    ready.record(&s).unwrap();
    // No synchronize: the child's stream waits on the event.
    let vars = [
        ("SIZE", pool.size().to_string()),
        ("MEM", hex(&driver::mem_handle_bytes(&pool.ipc_handle().unwrap()))),
        ("EVENT", hex(&driver::event_handle_bytes(&ready.ipc_handle().unwrap()))),
    ];
    let child = spawn("ipc_pool_and_event_across_processes", "consumer", &vars);
    expect_success(child, "consumer process");
    assert_eq!(gpu_mismatches(&k, &s, pool.ptr(), SEQ), 0);
}

#[test]
fn without_a_gpu_cuda_is_reported_unavailable_not_a_panic() {
    // On CI (no GPU) this is an error with a reason; on a GPU machine it is Ok. Either way no
    // panic, and Context::new agrees with it.
    match driver::available() {
        Ok(()) => assert!(Context::new(0).is_ok()),
        Err(why) => {
            assert!(!why.is_empty());
            assert!(matches!(Context::new(0), Err(gpuring::cuda::CudaError::Unavailable(_))));
        }
    }
}
