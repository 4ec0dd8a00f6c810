//! VMM sharing hands a ring's memory only to the peers its policy admits, by the uid and
//! groups the kernel reports for them: a consumer of another uid is refused with
//! `OpenError::PeerRefused` and receives no fd, while an allow-list admits it. Needs root (to
//! run the consumer under another uid) and a GPU.
#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant};

use common::{env, expect_success, role, spawn, unique_name};
use gpuring::testing::kernels::{MismatchCounter, PatternKernels};
use gpuring::{Consumer, OpenError, OpenErrorKind, PeerPolicy, Producer, Sharing};

/// A uid no account has (not 65534, `nobody`: that is also the overflow uid an unmapped peer
/// reads as, which the fd server refuses whatever its policy).
const OTHER_UID: u32 = 4321;
const FRAMES: u64 = 50;
const LEN: u64 = 1 << 20;

fn become_other_uid() {
    // SAFETY: setuid has no memory-safety preconditions; glibc applies it to every thread.
    assert_eq!(unsafe { libc::setuid(OTHER_UID) }, 0, "setuid");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_vmm_consumer_of_another_uid_is_refused() {
    const TEST: &str = "a_vmm_consumer_of_another_uid_is_refused";
    match role().as_deref() {
        Some("refused") => {
            become_other_uid();
            let opened =
                Consumer::builder(&env::<String>("RING")).allow_foreign_owner(true).open_gpu();
            // A refusal carries no fd: the server sends none with it, and `fetch` takes an
            // answer with fds for a protocol error, not a refusal (tests/fd_sharing.rs checks
            // the socket level without CUDA, whose own device fds would blur a count here).
            match opened.map_err(OpenError::into_kind) {
                Err(e @ OpenErrorKind::PeerRefused { .. }) => {
                    eprintln!("uid {OTHER_UID}, policy SameUid: {e}");
                    let text = e.to_string();
                    assert!(text.contains(&format!("uid {OTHER_UID}")), "{text}");
                    assert!(text.contains("peer policy"), "{text}");
                }
                Err(e) => panic!("expected a refusal, got: {e}"),
                Ok(_) => panic!("a consumer of another uid mapped a SameUid ring"),
            }
        }
        Some("allowed") => {
            become_other_uid();
            let rx = Consumer::builder(&env::<String>("RING"))
                .allow_foreign_owner(true)
                .open_gpu()
                .unwrap();
            let k = PatternKernels::get(rx.context()).unwrap();
            let bad = MismatchCounter::new(rx.stream()).unwrap();
            let mut n = 0;
            while let Ok(m) = rx.recv() {
                // SAFETY: the message's bytes stay readable on its stream until its release.
                unsafe { k.check(m.stream(), m.ptr(), m.len() as u64, m.seq(), bad.ptr(), 0) }
                    .unwrap();
                n += 1;
            }
            let bad = bad.read().unwrap();
            eprintln!("uid {OTHER_UID}, policy uids [{OTHER_UID}]: {n} frames, {bad} bad bytes");
            assert_eq!((n, bad), (FRAMES, 0));
        }
        _ => {
            assert_eq!(rustix::process::getuid().as_raw(), 0, "this test needs root");
            let refused = unique_name("vmm-refused");
            let vmm = |name: &str, policy| {
                Producer::builder(name)
                    .mode(0o666)
                    .capacity(4)
                    .slot_size(LEN as usize)
                    .sharing(Sharing::Vmm(policy))
                    .create_gpu(0)
                    .unwrap()
            };
            let same_uid = vmm(&refused, PeerPolicy::SameUid);
            expect_success(spawn(TEST, "refused", &[("RING", refused)]), "refused consumer");
            drop(same_uid);
            let allowed = unique_name("vmm-allowed");
            let mut tx = vmm(&allowed, PeerPolicy::uids([OTHER_UID]));
            let child = spawn(TEST, "allowed", &[("RING", allowed)]);
            let t = Instant::now();
            while tx.consumer_count() < 1 {
                assert!(t.elapsed() < Duration::from_secs(30), "the allowed consumer did not join");
                std::thread::sleep(Duration::from_millis(1));
            }
            let k = PatternKernels::get(tx.context()).unwrap();
            for seq in 0..FRAMES {
                let slot = tx.acquire().unwrap();
                // SAFETY: the slot holds LEN bytes and is ours until publish.
                unsafe { k.fill(slot.stream(), slot.ptr(), LEN, seq).unwrap() };
                slot.publish(LEN as usize, &[]).unwrap();
            }
            drop(tx);
            expect_success(child, "allowed consumer");
        }
    }
}
