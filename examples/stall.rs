//! A stall to watch: one producer and one lossless consumer (threads of this process) that
//! stops reading for a while, so the producer waits. In another terminal,
//! `gpuring stat stall --watch` shows the wait while it happens: "producer blocked now, for
//! ... s, on a lossless consumer, waiting on entry 0 (pid ...)".
//!
//! ```text
//! cargo run --example stall -- [SECONDS]     (default 4)
//! ```

use std::time::Duration;

use gpuring::{Consumer, Mode, Producer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let mut tx = Producer::builder("stall").capacity(4).spare_buffers(0).create()?;
    let rx = Consumer::builder("stall").mode(Mode::Lossless).open()?;
    let reader = std::thread::spawn(move || {
        for i in 0u64.. {
            if i == 50 {
                eprintln!("consumer: not reading for {secs} s");
                std::thread::sleep(Duration::from_secs(secs));
                eprintln!("consumer: reading again");
            }
            if rx.recv().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    for i in 0u64..150 {
        tx.send(&i.to_le_bytes(), b"")?;
    }
    drop(tx);
    reader.join().expect("reader");
    Ok(())
}
