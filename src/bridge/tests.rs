//! The bridge between rings of chosen directories, in one process over loopback: the exporter
//! reads a ring of one directory, the importer makes its ring in another, and neither ring is
//! in the default directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{export, import, ExportOptions, ImportOptions, ZenohOptions};
use crate::{Consumer, Mode, OpenErrorKind, Producer, StartAt};

/// A fresh directory under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("gpuring-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Zenoh sessions that meet only through the endpoints given.
fn zenoh(listen: Option<&str>, connect: Option<&str>) -> ZenohOptions {
    ZenohOptions {
        listen: listen.into_iter().map(str::to_owned).collect(),
        connect: connect.into_iter().map(str::to_owned).collect(),
        no_multicast_scouting: true,
        ..ZenohOptions::default()
    }
}

#[test]
fn export_and_import_rings_of_their_own_directories() {
    const N: u64 = 20;
    let (src_dir, dst_dir) = (TempDir::new("bridge-src"), TempDir::new("bridge-dst"));
    let (src, dst) = (
        format!("bridge-src-{}", std::process::id()),
        format!("bridge-dst-{}", std::process::id()),
    );
    let key = format!("gpuring-test/dir/{}", std::process::id());
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("tcp/127.0.0.1:{port}");

    let mut tx = Producer::builder(&src).dir(src_dir.path()).slot_size(64).create().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let exporter = s.spawn(|| {
            let o = ExportOptions::new(&src)
                .dir(src_dir.path())
                .key(&key)
                .mode(Mode::Lossless)
                .start_at(StartAt::Oldest);
            export(&o, &zenoh(Some(&endpoint), None), &stop)
        });
        let importer = s.spawn(|| {
            let o = ImportOptions::new(&key, &dst).dir(dst_dir.path()).wait_for_consumers(1);
            import(&o, &zenoh(None, Some(&endpoint)), &stop)
        });
        let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tx.wait_for_consumers(1, Duration::from_secs(60)).expect("the exporter joins");
            for seq in 0..N {
                tx.send(&[seq as u8; 48], &[]).unwrap();
            }
            // The importer makes its ring at the first message, in its directory only.
            let rx = Consumer::builder(&dst)
                .dir(dst_dir.path())
                .start_at(StartAt::Oldest)
                .open_timeout(Duration::from_secs(60))
                .expect("the imported ring");
            assert!(dst_dir.path().join(format!("gpuring.{dst}")).exists());
            let elsewhere = Consumer::builder(&dst).dir(src_dir.path()).open().unwrap_err();
            assert!(matches!(elsewhere.kind(), OpenErrorKind::NotFound), "{elsewhere}");
            for ring in [&src, &dst] {
                let default = Consumer::open(ring).unwrap_err();
                assert!(matches!(default.kind(), OpenErrorKind::NotFound), "{default}");
            }
            for seq in 0..N {
                let m = rx.recv_timeout(Duration::from_secs(60)).expect("every message");
                assert_eq!((m.seq(), &m[..]), (seq, &[seq as u8; 48][..]));
            }
        }));
        stop.store(true, Ordering::Relaxed);
        let exported = exporter.join().unwrap().expect("the export");
        let imported = importer.join().unwrap().expect("the import");
        if let Err(panic) = sent {
            std::panic::resume_unwind(panic);
        }
        assert_eq!((exported, imported), (N, N));
    });
}

/// A source's geometry comes from the network: the bound counts everything the import would
/// allocate for it (every table and user header of the shared file; a CUDA ring's device
/// buffers and page-locked staging too), and a ring over the bound is never made. Before, the
/// bound counted `slot_size x (capacity + 8)` only: this source passed as 16 KiB and got a
/// 1 GiB file.
#[test]
fn a_hostile_geometry_is_bounded_by_all_it_would_allocate() {
    use super::import::{allocation, try_make};
    use super::wire::{Geometry, Header};
    use crate::{MemoryKind, Policy};

    let headers = Geometry {
        memory: MemoryKind::Host,
        policy: Policy::Block,
        capacity: 16_376,
        user_header_size: 1 << 16,
        slot_size: 1,
    };
    let host = allocation(&headers, MemoryKind::Host).unwrap();
    assert!(host >= 1 << 30, "16 384 user headers of 64 KiB: {host} bytes");
    let gpu = Geometry { capacity: 8, user_header_size: 0, slot_size: 1 << 20, ..headers };
    let cuda = allocation(&gpu, MemoryKind::Cuda).unwrap();
    assert!(cuda >= 19 << 20, "16 device buffers and 3 staging buffers of 1 MiB: {cuda}");

    let dir = TempDir::new("bridge-hostile");
    let name = format!("hostile-{}", std::process::id());
    let o = ImportOptions::new("k", &name).dir(dir.path()).max_ring_bytes(64 << 20);
    let h = Header {
        geometry: headers,
        exporter: 1,
        index: 1,
        epoch: 1,
        seq: 0,
        timestamp_ns: 0,
        user_header: vec![0; 1 << 16],
    };
    let refused = try_make(&o, &h).expect_err("refused");
    assert!(refused.to_string().contains("more than the 67108864 allowed"), "{refused}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was made");
}
