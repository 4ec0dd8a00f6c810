//! Loans through the public API, host memory: several buffers out at once, numbered when
//! published, kept until ended, given back unpublished; and what a loan refuses.

use std::time::Duration;

use gpuring::{
    Consumer, EndLoanError, LendError, Policy, Producer, PublishError, PublishLoanError,
};

fn name(test: &str) -> String {
    format!("loans-{test}-{}", std::process::id())
}

#[test]
fn loans_written_out_of_order_arrive_in_publish_order() {
    let n = name("order");
    let mut tx = Producer::builder(&n).capacity(4).spare_buffers(3).slot_size(64).create().unwrap();
    let rx = Consumer::open(&n).unwrap();
    let mut loans: Vec<_> = (0..3).map(|_| tx.lend().unwrap()).collect();
    let buffers: Vec<usize> = loans.iter().map(|l| l.buffer()).collect();
    assert_eq!(buffers.len(), 3);
    for (i, loan) in loans.iter().enumerate() {
        tx.loan_bytes(loan)[..3].copy_from_slice(format!("L{i}.").as_bytes());
    }
    // A plain send between them takes the next number too.
    tx.send(b"plain", b"").unwrap();
    for i in [2, 0, 1] {
        let seq = tx.publish_loan(&mut loans[i], 3, &[i as u8]).unwrap();
        assert_eq!(loans[i].seq(), Some(seq));
    }
    let got: Vec<(u64, Vec<u8>, u8)> = (0..4)
        .map(|_| {
            let m = rx.recv().unwrap();
            (m.seq(), m.to_vec(), m.header()[0])
        })
        .collect();
    assert_eq!(got[0], (0, b"plain".to_vec(), 0));
    assert_eq!(got[1], (1, b"L2.".to_vec(), 2));
    assert_eq!(got[2], (2, b"L0.".to_vec(), 0));
    assert_eq!(got[3], (3, b"L1.".to_vec(), 1));
    for loan in loans {
        tx.end_loan(loan).unwrap();
    }
}

#[test]
fn a_kept_loan_is_not_written_again_until_it_ends() {
    let n = name("kept");
    let mut tx = Producer::builder(&n)
        .capacity(2)
        .spare_buffers(2)
        .slot_size(16)
        .policy(Policy::Overwrite)
        .create()
        .unwrap();
    let rx = Consumer::open(&n).unwrap();
    let mut loan = tx.lend().unwrap();
    tx.loan_bytes(&loan)[..4].copy_from_slice(b"kept");
    tx.publish_loan(&mut loan, 4, b"").unwrap();
    assert_eq!(&*rx.recv().unwrap(), b"kept");
    let ptr = tx.loan_ptr(&loan) as *const u8;
    for i in 0..20u8 {
        tx.send(&[i; 16], b"").unwrap();
        assert_eq!(rx.recv().unwrap()[0], i);
        // SAFETY: the loan is kept, so the producer does not write its buffer; 4 bytes of it.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, 4) };
        assert_eq!(bytes, b"kept", "a kept buffer was written after {i} sends");
    }
    tx.end_loan(loan).unwrap();
    // Ended, it is a spare again: four more loans-worth of traffic may use it.
    let again: Vec<_> = (0..2).map(|_| tx.lend().unwrap()).collect();
    assert!(again.iter().any(|l| tx.loan_ptr(l) as *const u8 == ptr), "the ended loan's buffer");
    for l in again {
        tx.end_loan(l).unwrap();
    }
}

#[test]
fn an_unpublished_loan_goes_back_and_is_lent_again() {
    let n = name("back");
    let mut tx = Producer::builder(&n).spare_buffers(1).create().unwrap();
    let first = tx.lend().unwrap();
    let buffer = first.buffer();
    // The only spare is out: only ending the loan frees it, so a lend fails at once rather
    // than wait for ever.
    assert_eq!(tx.lend().err(), Some(LendError::AllLent));
    tx.end_loan(first).unwrap();
    let again = tx.lend_timeout(Duration::ZERO).unwrap();
    assert_eq!(again.buffer(), buffer);
    tx.end_loan(again).unwrap();
}

#[test]
fn what_a_loan_refuses() {
    let n = name("refuses");
    let mut tx = Producer::builder(&n).slot_size(8).user_header_size(8).create().unwrap();
    let mut other = Producer::builder(&name("refuses-other")).create().unwrap();
    assert_eq!(
        Producer::builder(&name("refuses-none")).spare_buffers(0).create().unwrap().lend().err(),
        Some(LendError::NoSpares)
    );
    let mut loan = tx.lend().unwrap();
    let too_long = PublishError::TooLong { len: 9, slot_size: 8 };
    assert_eq!(tx.publish_loan(&mut loan, 9, b""), Err(PublishLoanError::Publish(too_long)));
    let header = PublishError::HeaderTooLong { len: 9, max: 8 };
    assert_eq!(tx.publish_loan(&mut loan, 1, &[0; 9]), Err(PublishLoanError::Publish(header)));
    assert_eq!(other.publish_loan(&mut loan, 1, b""), Err(PublishLoanError::Foreign));
    // A slot dropped unpublished holds the next message: publish it first.
    let _ = tx.acquire().unwrap();
    assert_eq!(tx.publish_loan(&mut loan, 1, b""), Err(PublishLoanError::SlotClaimed));
    tx.acquire().unwrap().publish(0, b"").unwrap();
    assert_eq!(tx.publish_loan(&mut loan, 1, b""), Ok(1));
    assert_eq!(tx.publish_loan(&mut loan, 1, b""), Err(PublishLoanError::Published { seq: 1 }));
    let foreign = other.lend().unwrap();
    assert_eq!(tx.end_loan(foreign), Err(EndLoanError::Foreign));
    tx.end_loan(loan).unwrap();
}

#[test]
fn a_loan_waits_for_lossless_consumers_before_it_overwrites() {
    let n = name("gate");
    let mut tx = Producer::builder(&n).capacity(1).spare_buffers(1).create().unwrap();
    let rx = Consumer::open(&n).unwrap();
    tx.send(b"zero", b"").unwrap();
    let mut loan = tx.lend().unwrap();
    tx.loan_bytes(&loan)[..3].copy_from_slice(b"one");
    let r = tx.publish_loan_timeout(&mut loan, 3, b"", Duration::from_millis(20));
    assert_eq!(r, Err(PublishLoanError::Timeout));
    assert_eq!(loan.seq(), None);
    let zero = rx.recv().unwrap();
    assert_eq!(&*zero, b"zero");
    drop(zero);
    assert_eq!(tx.publish_loan(&mut loan, 3, b""), Ok(1));
    assert_eq!(&*rx.recv().unwrap(), b"one");
    tx.end_loan(loan).unwrap();
}

/// A consumer in another thread blocked on an empty ring is woken by a loan's publish.
#[test]
fn a_published_loan_wakes_a_sleeping_consumer() {
    let n = name("wake");
    let mut tx = Producer::builder(&n).create().unwrap();
    let rx = Consumer::open(&n).unwrap();
    let reader =
        std::thread::spawn(move || rx.recv_timeout(Duration::from_secs(20)).map(|m| m.to_vec()));
    std::thread::sleep(Duration::from_millis(50));
    let mut loan = tx.lend().unwrap();
    tx.loan_bytes(&loan)[..2].copy_from_slice(b"hi");
    tx.publish_loan(&mut loan, 2, b"").unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), b"hi");
    tx.end_loan(loan).unwrap();
}

#[test]
fn a_lend_waits_only_for_buffers_consumers_hold() {
    let n = name("held");
    let mut tx = Producer::builder(&n).capacity(1).spare_buffers(1).create().unwrap();
    let rx = Consumer::open(&n).unwrap();
    tx.send(b"zero", b"").unwrap();
    let zero = rx.recv().unwrap();
    // Message 1 swaps the spare in for the held buffer, which becomes the spare: held by the
    // consumer, not by a loan, so a lend waits for it (and times out here).
    tx.send(b"one", b"").unwrap();
    assert_eq!(tx.lend_timeout(Duration::from_millis(5)).err(), Some(LendError::Timeout));
    drop(zero);
    let loan = tx.lend_timeout(Duration::ZERO).unwrap();
    tx.end_loan(loan).unwrap();
}
