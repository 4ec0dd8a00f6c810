//! The facade against the typed API it wraps: host rings here, CUDA rings on a GPU.

use std::time::Duration;

use super::{AnyConsumer, AnyProducer};
use crate::{Consumer, MemoryKind, OpenErrorKind, Producer, RecvTimeoutError};

/// A ring name of this process, so that parallel test runs do not meet.
fn name(what: &str) -> String {
    format!("any-{what}-{}", std::process::id())
}

#[test]
fn host_messages_go_through_both_facades() {
    let ring = name("host");
    let mut tx = AnyProducer::from(Producer::builder(&ring).slot_size(64).create().unwrap());
    let rx = AnyConsumer::open(Consumer::builder(&ring)).unwrap();
    assert_eq!((tx.memory(), rx.memory()), (MemoryKind::Host, MemoryKind::Host));
    assert_eq!((tx.device(), rx.device()), (None, None));
    assert_eq!(tx.consumer_count(), 1);
    for (i, text) in [&b"one"[..], b"two", b""].into_iter().enumerate() {
        let mut slot = tx.acquire().unwrap();
        assert_eq!((slot.capacity(), slot.seq()), (64, i as u64));
        slot.bytes_mut().unwrap()[..text.len()].copy_from_slice(text);
        assert_eq!(slot.publish(text.len(), b"h").unwrap(), i as u64);
        let msg = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((msg.bytes(), msg.len(), msg.seq()), (Some(text), text.len(), i as u64));
        assert_eq!(
            (&msg.header()[..2], msg.lag(), msg.is_empty()),
            (&b"h\0"[..], 0, text.is_empty())
        );
    }
    assert_eq!(tx.published(), 3);
}

#[test]
fn an_unpublished_slot_is_given_back() {
    let ring = name("cancel");
    let mut tx = AnyProducer::from(Producer::builder(&ring).create().unwrap());
    let rx = AnyConsumer::open(Consumer::builder(&ring)).unwrap();
    {
        let _unpublished = tx.acquire().unwrap();
    }
    assert_eq!(tx.acquire().unwrap().seq(), 0);
    assert_eq!(rx.try_recv().err(), Some(crate::TryRecvError::Empty));
}

#[test]
fn a_closed_ring_ends_the_stream() {
    let ring = name("closed");
    let tx = AnyProducer::from(Producer::builder(&ring).create().unwrap());
    let rx = AnyConsumer::open(Consumer::builder(&ring)).unwrap();
    tx.abort();
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).err(), Some(RecvTimeoutError::Disconnected));
    assert_eq!(rx.ended(), Some(crate::Ended::Died));
}

#[test]
fn opening_a_missing_ring_fails_as_the_typed_open_does() {
    let ring = name("missing");
    let e = AnyConsumer::open(Consumer::builder(&ring)).unwrap_err();
    assert!(matches!(e.kind(), OpenErrorKind::NotFound));
    let b = Consumer::builder(&ring);
    let e = AnyConsumer::open_when_ready(b, None, Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e.kind(), OpenErrorKind::NotFound | OpenErrorKind::TimedOut));
}

#[cfg(feature = "cuda")]
#[test]
fn a_kind_asked_for_is_the_kind_opened() {
    let ring = name("open-in");
    let tx = AnyProducer::create(Producer::builder(&ring), MemoryKind::Host).unwrap();
    assert!(tx.cuda().is_none() && tx.context().is_none() && tx.stream().is_none());
    let b = Consumer::builder(&ring);
    let e = AnyConsumer::open_in(b.clone(), MemoryKind::Cuda).unwrap_err();
    assert!(matches!(e.kind(), OpenErrorKind::WrongMemory { found: MemoryKind::Host }));
    let rx = AnyConsumer::open_in(b, MemoryKind::Host).unwrap();
    assert!(rx.host().is_some() && rx.cuda().is_none() && rx.stream().is_none());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_messages_go_through_both_facades() {
    let ring = name("cuda");
    // VMM: one process may consume its own ring (legacy IPC handles cannot be opened in the
    // process that made them).
    let vmm = crate::Sharing::Vmm(crate::PeerPolicy::SameUid);
    let b = Producer::builder(&ring).slot_size(4096).device(0).sharing(vmm);
    let mut tx = AnyProducer::create(b, MemoryKind::Cuda).unwrap();
    let rx = AnyConsumer::open(Consumer::builder(&ring)).unwrap();
    assert_eq!((tx.memory(), rx.memory()), (MemoryKind::Cuda, MemoryKind::Cuda));
    assert_eq!((tx.device(), rx.device()), (Some(0), Some(0)));
    let data = [7u8; 100];
    let mut slot = tx.acquire().unwrap();
    assert!(slot.bytes_mut().is_none());
    assert_eq!(slot.capacity(), 4096);
    let stream = slot.stream().unwrap();
    let _bound = stream.context().bind().unwrap();
    // SAFETY: the slot holds 4096 bytes and is ours until publish; the copy is waited for.
    unsafe { crate::cuda::driver::memcpy_htod_async(slot.ptr(), &data, stream.raw()) }.unwrap();
    stream.synchronize().unwrap();
    slot.publish(data.len(), b"h").unwrap();
    let msg = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((msg.len(), msg.header()[0], msg.bytes()), (100, b'h', None));
    let mut back = [0u8; 100];
    // The producer's writes are there once the message's stream is done.
    msg.stream().unwrap().synchronize().unwrap();
    // SAFETY: the message holds 100 bytes, readable until released below.
    unsafe { crate::cuda::driver::memcpy_dtoh(&mut back, msg.ptr()) }.unwrap();
    assert_eq!(back, data);
    msg.release().unwrap();
}
