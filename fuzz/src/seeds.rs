//! Writes the seed corpus for the `segment` target into the directory given as argument:
//! valid empty segments of both memory kinds, and a live host segment with messages published,
//! one held and a consumer in the table.
use gpuring::testing::fuzzing;
use gpuring::{Consumer, MemoryKind, Producer, StartAt};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: seeds DIR");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(format!("{dir}/{name}"), bytes).unwrap();
    write("host-empty", &fuzzing::sample_segment(MemoryKind::Host, 2, 2, 64));
    write("host-wide", &fuzzing::sample_segment(MemoryKind::Host, 4, 3, 200));
    write("cuda-empty", &fuzzing::sample_segment(MemoryKind::Cuda, 2, 2, 4096));
    let name = format!("fuzz-seed-{}", std::process::id());
    let mut tx =
        Producer::builder(&name).capacity(4).slot_size(64).max_consumers(2).create().unwrap();
    let rx = Consumer::builder(&name).start_at(StartAt::Next).open().unwrap();
    for i in 0..6u64 {
        tx.send(&i.to_le_bytes(), b"hdr").unwrap();
        drop(rx.recv().unwrap());
    }
    tx.send(&[7; 40], b"held").unwrap();
    let held = rx.recv().unwrap();
    let bytes = std::fs::read(format!("/dev/shm/gpuring.{name}")).unwrap();
    write("host-live", &bytes);
    drop(held);
}
