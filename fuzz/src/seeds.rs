//! Writes the seed corpus of fuzz target TARGET into directory DIR: `seeds TARGET DIR`.
//!
//! * `segment`: valid empty segments of both memory kinds, and a live host segment with
//!   messages published, one held and a consumer in the table.
//! * `bridge_message`: valid messages of both memory kinds and policies (user headers of 0, 16
//!   and 256 bytes, payloads of 0 bytes up to the slot size, geometry at the format's limits)
//!   and an acknowledgement, laid out as src/bridge/wire.rs says, after the payload's length.
//! * `vmm_offer`: valid offers of 0, 2 and every pool, after their fd count and epoch.
//! * `frame_header`: user headers with valid frame headers of 1 to 4 planes, every field set.
use gpuring::format::offer::{self, OfferedPool};
use gpuring::format::{Params, GPU_POOLS};
use gpuring::testing::fuzzing;
use gpuring::{Consumer, MemoryKind, Producer, StartAt};

use gpuring::frame as header;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(target), Some(dir)) = (args.next(), args.next()) else {
        panic!("usage: seeds TARGET DIR");
    };
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(format!("{dir}/{name}"), bytes).unwrap();
    match target.as_str() {
        "segment" => segment(&write),
        "bridge_message" => bridge_message(&write),
        "vmm_offer" => vmm_offer(&write),
        "frame_header" => frame_header(&write),
        other => panic!("no fuzz target {other}"),
    }
}

fn segment(write: &dyn Fn(&str, &[u8])) {
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

/// A bridge message as the target reads it: the payload's length, then the attachment (wire
/// format version 2, src/bridge/wire.rs: a format change needs these seeds changed too).
struct Message {
    payload_len: u32,
    memory: u8,
    policy: u8,
    epoch: u64,
    seq: u64,
    timestamp_ns: u64,
    capacity: u32,
    slot_size: u64,
    exporter: u64,
    index: u64,
    user_header: Vec<u8>,
}

impl Message {
    fn bytes(&self) -> Vec<u8> {
        let mut out = self.payload_len.to_le_bytes().to_vec();
        out.extend_from_slice(b"GRZ1");
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&[self.memory, self.policy]);
        for v in [self.epoch, self.seq, self.timestamp_ns] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.capacity.to_le_bytes());
        out.extend_from_slice(&(self.user_header.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.slot_size.to_le_bytes());
        out.extend_from_slice(&self.exporter.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.user_header);
        out
    }
}

fn bridge_message(write: &dyn Fn(&str, &[u8])) {
    let base = Message {
        payload_len: 100,
        memory: 0,
        policy: 0,
        epoch: 0x1234_5678_9abc_def0,
        seq: 41,
        timestamp_ns: 1_000_000_007,
        capacity: 8,
        slot_size: 4096,
        exporter: 0xfeed_f00d,
        index: 1,
        user_header: Vec::new(),
    };
    write("host-block", &base.bytes());
    let cuda = Message {
        memory: 1,
        policy: 1,
        payload_len: 1 << 20,
        slot_size: 1 << 20,
        user_header: (1..=16).collect(),
        ..base
    };
    write("cuda-overwrite-full-slot", &cuda.bytes());
    let gst = Message { payload_len: 0, capacity: 3, user_header: vec![0x5a; 256], ..cuda };
    write("empty-payload-256-byte-header", &gst.bytes());
    let limits = Message {
        payload_len: u32::MAX,
        capacity: Params::MAX_CAPACITY,
        slot_size: Params::MAX_SLOT_SIZE,
        seq: u64::MAX - 1,
        index: u64::MAX,
        user_header: Vec::new(),
        ..gst
    };
    write("cuda-largest-geometry", &limits.bytes());
    let mut ack = 0u32.to_le_bytes().to_vec();
    // exporter, importer, handled, flags (src/bridge/flow.rs).
    for word in [0xfeed_f00du64, 0xabcd, 12345, 0] {
        ack.extend_from_slice(&word.to_le_bytes());
    }
    write("acknowledgement", &ack);
}

fn vmm_offer(write: &dyn Fn(&str, &[u8])) {
    let input = |epoch: u64, pools: &[OfferedPool]| {
        let mut out = vec![pools.len() as u8];
        out.extend_from_slice(&epoch.to_le_bytes());
        out.extend_from_slice(&offer::encode(epoch, pools));
        out
    };
    write("none", &input(7, &[]));
    let two = [
        OfferedPool { pool: 0, generation: 1, size: 2 << 20 },
        OfferedPool { pool: 3, generation: 2, size: 64 << 20 },
    ];
    write("two-pools", &input(0x0123_4567_89ab_cdef, &two));
    let every: Vec<OfferedPool> = (0..GPU_POOLS as u32)
        .rev()
        .map(|pool| OfferedPool { pool, generation: pool * 3 + 1, size: (pool as u64 + 1) << 21 })
        .collect();
    write("every-pool", &input(u64::MAX, &every));
}

fn frame_header(write: &dyn Fn(&str, &[u8])) {
    use header::{FrameHeader, USER_HEADER_SIZE};
    let mut rgba = FrameHeader::new("RGBA", 320, 240);
    rgba.strides[0] = 320 * 4;
    rgba.pts = Some(40_000_000);
    let mut nv12 = FrameHeader::new("NV12", 1920, 1080);
    nv12.fps = (30000, 1001);
    nv12.par = (4, 3);
    nv12.colorimetry = "bt709".into();
    nv12.planes = 2;
    nv12.offsets = [0, 2_088_960, 0, 0];
    nv12.strides = [2048, 2048, 0, 0];
    nv12.pts = Some(1);
    nv12.dts = Some(0);
    nv12.duration = Some(33_366_666);
    nv12.offset = Some(7);
    nv12.flags = 0x2000;
    let mut i420 = FrameHeader::new("I420_10LE_LONGER", 7, 5);
    i420.planes = 3;
    i420.colorimetry = "2:4:5:4_with_a_32_byte_long_name".into();
    i420.offsets = [0, 64, 96, 0];
    i420.strides = [8, 4, 4, 0];
    i420.fps = (-1, i32::MAX);
    let mut four = FrameHeader::new("A420", u32::MAX, u32::MAX);
    four.planes = 4;
    four.offsets = [u64::MAX - 1, 1, 2, 3];
    four.strides = [u32::MAX; 4];
    four.pts = Some(u64::MAX - 1);
    four.flags = u32::MAX;
    for (name, frame, len, fill) in [
        ("rgba", &rgba, USER_HEADER_SIZE, 0),
        ("nv12-every-field", &nv12, USER_HEADER_SIZE, 0xaa),
        ("i420-longest-names", &i420, USER_HEADER_SIZE, 0),
        ("four-planes-longer-header", &four, USER_HEADER_SIZE + 64, 0x11),
    ] {
        let mut bytes = vec![fill; len];
        frame.write(&mut bytes);
        assert_eq!(FrameHeader::read(&bytes).as_ref(), Ok(frame), "seed {name} reads");
        write(name, &bytes);
    }
}
