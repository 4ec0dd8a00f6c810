//! The C API's error paths, called as C would (through the `extern "C"` functions), in host
//! memory: null arguments, bad enum values, one slot at a time, a failed publish ending its
//! slot, a consumer freed with a message out, the tensor header, the batch table, and option
//! flags read as "nonzero = true". Where a GPU is usable, also that `fence` reaches a CUDA ring.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use gpuring_c::gpuring_status::*;
use gpuring_c::*;

fn name(tag: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("capi-{tag}-{}", std::process::id())).unwrap()
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string valid until the next call on this thread.
    unsafe { CStr::from_ptr(gpuring_last_error()) }.to_string_lossy().into_owned()
}

fn host_producer(tag: &str) -> (*mut gpuring_producer, std::ffi::CString) {
    let n = name(tag);
    let mut o = gpuring_producer_options_default();
    o.memory = gpuring_memory::GPURING_MEMORY_HOST as u32;
    o.capacity = 4;
    o.slot_size = 256;
    let mut p = null_mut();
    // SAFETY: valid name, options and out-pointer.
    assert_eq!(unsafe { gpuring_producer_create(n.as_ptr(), &o, &mut p) }, GPURING_OK);
    (p, n)
}

#[test]
fn nulls_and_bad_values_are_invalid_arguments() {
    let mut p = null_mut();
    // SAFETY: the calls take nulls and report them.
    unsafe {
        assert_eq!(gpuring_producer_create(null(), null(), &mut p), GPURING_INVALID_ARGUMENT);
        let n = name("nulls");
        assert_eq!(
            gpuring_producer_create(n.as_ptr(), null(), null_mut()),
            GPURING_INVALID_ARGUMENT
        );
        let mut o = gpuring_producer_options_default();
        o.memory = 7;
        assert_eq!(gpuring_producer_create(n.as_ptr(), &o, &mut p), GPURING_INVALID_ARGUMENT);
        assert!(last_error().contains("memory 7"), "{}", last_error());
        assert_eq!(
            gpuring_producer_acquire(null_mut(), 0, null_mut(), null_mut(), null_mut()),
            GPURING_INVALID_ARGUMENT
        );
        let mut c = null_mut();
        let missing = name("missing");
        assert_eq!(gpuring_consumer_open(missing.as_ptr(), null(), &mut c), GPURING_NOT_FOUND);
        assert!(last_error().contains("capi-missing"), "{}", last_error());
        gpuring_producer_free(null_mut());
        gpuring_consumer_free(null_mut());
        assert_eq!(gpuring_message_release(null_mut()), GPURING_OK);
    }
}

#[test]
fn one_slot_at_a_time_and_a_failed_publish_ends_it() {
    let (p, _n) = host_producer("slot");
    // SAFETY: `p` is live; out-pointers are locals or null.
    unsafe {
        let (mut ptr, mut cap) = (0u64, 0usize);
        assert_eq!(gpuring_producer_acquire(p, 0, null_mut(), &mut ptr, &mut cap), GPURING_OK);
        assert_eq!(cap, 256);
        assert_eq!(
            gpuring_producer_acquire(p, 0, null_mut(), &mut ptr, &mut cap),
            GPURING_INVALID_ARGUMENT,
            "a second slot while one is out"
        );
        assert_eq!(gpuring_producer_consumer_count(p), -1, "refused while a slot is out");
        assert_eq!(gpuring_producer_memory(p), gpuring_memory::GPURING_MEMORY_HOST);
        // A null header with a length: refused, and the slot is given back.
        assert_eq!(gpuring_producer_publish(p, 8, null(), 4, null_mut()), GPURING_INVALID_ARGUMENT);
        assert_eq!(gpuring_producer_consumer_count(p), 0, "the slot was ended");
        // `send` checks its header before it takes a slot.
        let data = [1u8; 8];
        let s = gpuring_producer_send(p, data.as_ptr(), 8, null(), 4, 0, null_mut());
        assert_eq!(s, GPURING_INVALID_ARGUMENT);
        let mut seq = u64::MAX;
        assert_eq!(gpuring_producer_send(p, data.as_ptr(), 8, null(), 0, 0, &mut seq), GPURING_OK);
        assert_eq!(seq, 0);
        let big = [0u8; 300];
        assert_eq!(
            gpuring_producer_send(p, big.as_ptr(), big.len(), null(), 0, 0, null_mut()),
            GPURING_INVALID_ARGUMENT,
            "longer than the slot"
        );
        assert_eq!(gpuring_producer_consumer_count(p), 0, "the too-long send gave its slot back");
        gpuring_producer_free(p);
    }
}

#[test]
fn a_consumer_freed_with_a_message_out_goes_at_its_release() {
    let (p, n) = host_producer("deferred");
    // SAFETY: live handles; out-pointers are locals.
    unsafe {
        let mut c = null_mut();
        assert_eq!(gpuring_consumer_open(n.as_ptr(), null(), &mut c), GPURING_OK);
        assert_eq!(gpuring_consumer_memory(c), gpuring_memory::GPURING_MEMORY_HOST);
        let data = *b"hello";
        let mut hdr = [0u8; 64];
        let mut used = 0;
        let shape = [5u64];
        assert_eq!(
            gpuring_tensor_header_write(1, 8, shape.as_ptr(), 1, hdr.as_mut_ptr(), 64, &mut used),
            GPURING_OK
        );
        assert_eq!(
            gpuring_producer_send(p, data.as_ptr(), 5, hdr.as_ptr(), used, -1, null_mut()),
            GPURING_OK
        );
        let mut m = null_mut();
        let mut info = std::mem::zeroed::<gpuring_message_info>();
        assert_eq!(gpuring_consumer_recv(c, 1000, null_mut(), &mut m, &mut info), GPURING_OK);
        assert_eq!(std::slice::from_raw_parts(info.ptr as *const u8, info.len), b"hello");
        let (mut code, mut bits, mut ndim) = (0u8, 0u8, 0usize);
        let mut dims = [0u64; GPURING_TENSOR_MAX_DIMS];
        let s = gpuring_tensor_header_read(
            info.header,
            info.header_len,
            &mut code,
            &mut bits,
            dims.as_mut_ptr(),
            &mut ndim,
        );
        assert_eq!((s, code, bits, ndim, dims[0]), (GPURING_OK, 1, 8, 1, 5));
        gpuring_consumer_free(c); // deferred: `m` still borrows it
        let mut m2 = null_mut();
        assert_eq!(
            gpuring_consumer_recv(c, 0, null_mut(), &mut m2, null_mut()),
            GPURING_INVALID_ARGUMENT,
            "a freed consumer takes no new receive"
        );
        assert_eq!(std::slice::from_raw_parts(info.ptr as *const u8, info.len), b"hello");
        assert_eq!(gpuring_message_release(m), GPURING_OK); // frees the consumer too
        let empty = [0u8; 16];
        let s = gpuring_tensor_header_read(
            empty.as_ptr(),
            16,
            &mut code,
            &mut bits,
            dims.as_mut_ptr(),
            &mut ndim,
        );
        assert_eq!(s, GPURING_NO_TENSOR);
        gpuring_producer_free(p);
    }
}

#[test]
fn a_ring_in_another_directory_is_found_there_only() {
    let dir = std::env::temp_dir().join(format!("capi-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let n = name("dir");
    let mut o = gpuring_producer_options_default();
    o.memory = gpuring_memory::GPURING_MEMORY_HOST as u32;
    o.slot_size = 64;
    o.dir = dir_c.as_ptr();
    // SAFETY: valid names, options (their `dir` outlives the calls) and out-pointers; live
    // handles.
    unsafe {
        let mut p = null_mut();
        assert_eq!(gpuring_producer_create(n.as_ptr(), &o, &mut p), GPURING_OK);
        let file = dir.join(format!("gpuring.{}", n.to_str().unwrap()));
        assert!(file.exists(), "the ring's file is in the directory");

        // Not in the default directory: NULL and "" both mean it.
        let mut c = null_mut();
        assert_eq!(gpuring_consumer_open(n.as_ptr(), null(), &mut c), GPURING_NOT_FOUND);
        let default = gpuring::shm::default_dir();
        let wanted = format!("no ring named {:?} in {}", n.to_str().unwrap(), default.display());
        assert_eq!(last_error(), wanted);
        let mut co = gpuring_consumer_options_default();
        co.dir = c"".as_ptr();
        assert_eq!(gpuring_consumer_open(n.as_ptr(), &co, &mut c), GPURING_NOT_FOUND);

        co.dir = dir_c.as_ptr();
        co.start = gpuring_start::GPURING_START_NEXT as u32;
        assert_eq!(gpuring_consumer_open(n.as_ptr(), &co, &mut c), GPURING_OK);
        let data = *b"elsewhere";
        assert_eq!(
            gpuring_producer_send(p, data.as_ptr(), data.len(), null(), 0, -1, null_mut()),
            GPURING_OK
        );
        let mut m = null_mut();
        let mut info = std::mem::zeroed::<gpuring_message_info>();
        assert_eq!(gpuring_consumer_recv(c, 1000, null_mut(), &mut m, &mut info), GPURING_OK);
        assert_eq!(std::slice::from_raw_parts(info.ptr as *const u8, info.len), b"elsewhere");
        assert_eq!(gpuring_message_release(m), GPURING_OK);
        gpuring_consumer_free(c);
        gpuring_producer_free(p);
        assert!(!file.exists(), "closing removes the ring's file");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The options' flags are `uint32_t`s read as "nonzero = true": a caller in another language
/// (ctypes, Go, Zig) that writes 2 or 0xFF, or a whole word of ones, into one passes a valid
/// value that means yes. (They were `bool`s, for which any byte but 0 or 1 is undefined
/// behaviour in Rust.)
#[test]
fn nonzero_flags_are_true() {
    // `vmm` on a host ring is refused, so a create that fails says the flag was read as set.
    let n = name("flags");
    for (vmm, refused) in [(0, false), (1, true), (2, true), (0xFF, true), (u32::MAX, true)] {
        let mut o = gpuring_producer_options_default();
        o.memory = gpuring_memory::GPURING_MEMORY_HOST as u32;
        o.slot_size = 64;
        o.vmm = vmm;
        let mut p = null_mut();
        // SAFETY: valid name, options and out-pointer.
        let s = unsafe { gpuring_producer_create(n.as_ptr(), &o, &mut p) };
        if refused {
            assert_eq!(s, GPURING_INVALID_ARGUMENT, "vmm = {vmm:#x}");
            assert!(last_error().contains("VMM sharing is for CUDA memory"), "{}", last_error());
        } else {
            assert_eq!(s, GPURING_OK, "vmm = 0: {}", last_error());
            // SAFETY: made above.
            unsafe { gpuring_producer_free(p) };
        }
    }
    // `fence` is an enum: AUTO and EVENTS make a host ring, MEMORY is refused for one, and a
    // value that names no fence is refused as such.
    let cases = [(0, None), (1, Some("orders CUDA work")), (2, None), (3, Some("fence 3"))];
    for (fence, refused) in cases.into_iter().chain([(u32::MAX, Some("fence 4294967295"))]) {
        let mut o = gpuring_producer_options_default();
        o.memory = gpuring_memory::GPURING_MEMORY_HOST as u32;
        o.slot_size = 64;
        o.fence = fence;
        let mut p = null_mut();
        // SAFETY: valid name, options and out-pointer.
        let s = unsafe { gpuring_producer_create(n.as_ptr(), &o, &mut p) };
        if let Some(why) = refused {
            assert_eq!(s, GPURING_INVALID_ARGUMENT, "fence = {fence:#x}");
            assert!(last_error().contains(why), "{}", last_error());
        } else {
            assert_eq!(s, GPURING_OK, "fence = {fence}: {}", last_error());
            // SAFETY: made above.
            unsafe { gpuring_producer_free(p) };
        }
    }

    // `allow_foreign_owner`, written as a foreign caller would: one byte of the field set to 2,
    // or all of it to ones. It takes a ring file of another uid, which only root can make.
    let (p, n) = host_producer("foreign");
    let file = gpuring::shm::default_dir().join(format!("gpuring.{}", n.to_str().unwrap()));
    if let Err(e) = std::os::unix::fs::chown(&file, Some(65534), Some(65534)) {
        eprintln!("allow_foreign_owner: skipped (cannot give the ring to another uid: {e})");
        // SAFETY: made by `host_producer`.
        unsafe { gpuring_producer_free(p) };
        return;
    }
    let field = std::mem::offset_of!(gpuring_consumer_options, allow_foreign_owner);
    for (bytes, allowed) in [([0u8; 4], false), ([2, 0, 0, 0], true), ([0xFF; 4], true)] {
        let mut o = gpuring_consumer_options_default();
        // SAFETY: the field's 4 bytes lie inside `o`, and any bytes are a valid `u32`.
        unsafe {
            let at = (&mut o as *mut gpuring_consumer_options).cast::<u8>().add(field);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, 4);
        }
        let mut c = null_mut();
        // SAFETY: valid name, options and out-pointer; `c` is freed below.
        unsafe {
            let s = gpuring_consumer_open(n.as_ptr(), &o, &mut c);
            if allowed {
                assert_eq!(s, GPURING_OK, "{bytes:x?}: {}", last_error());
                gpuring_consumer_free(c);
            } else {
                assert_eq!(s, GPURING_PERMISSION_DENIED, "{bytes:x?}: {}", last_error());
            }
        }
    }
    // SAFETY: made by `host_producer`.
    unsafe { gpuring_producer_free(p) };
}

/// `fence` reaches a CUDA ring: MEMORY fences with memory words, EVENTS with events, and the
/// default, AUTO, with memory words where the device can use 64-bit stream memory operations,
/// as the segment records them. Skipped without a usable CUDA GPU.
#[test]
fn the_fence_reaches_a_cuda_ring() {
    if let Err(why) = gpuring::cuda::available() {
        eprintln!("the_fence_reaches_a_cuda_ring: skipped (no usable CUDA GPU: {why})");
        return;
    }
    let dev = gpuring::cuda::driver::device(0).unwrap();
    let memops = gpuring::cuda::driver::can_use_64_bit_stream_mem_ops(dev).unwrap();
    let auto = if memops { "memory" } else { "events" };
    let default = gpuring_producer_options_default().fence;
    for (fence, recorded) in [(default, auto), (1, "memory"), (2, "events")] {
        let n = name(&format!("fence{fence}"));
        let mut o = gpuring_producer_options_default();
        o.memory = gpuring_memory::GPURING_MEMORY_CUDA as u32;
        o.fence = fence;
        let mut p = null_mut();
        // SAFETY: valid name, options and out-pointer.
        let s = unsafe { gpuring_producer_create(n.as_ptr(), &o, &mut p) };
        assert_eq!(s, GPURING_OK, "{}", last_error());
        let status = gpuring::inspect::status(n.to_str().unwrap()).unwrap();
        let cuda = status.cuda.expect("a CUDA ring");
        assert_eq!((cuda.sharing, cuda.fence), ("legacy", recorded));
        // SAFETY: made above.
        unsafe { gpuring_producer_free(p) };
    }
}

#[test]
fn the_batch_table_reads_camera_by_camera() {
    use gpuring::batch::{BatchTable, CameraEntry, CameraState};
    let present =
        CameraEntry { seq: 41, timestamp_ns: 7, skipped: 2, epoch: 9, state: CameraState::Present };
    let absent = CameraEntry::NONE;
    let table = BatchTable { batch: 5, closed_ns: 123, cameras: vec![present, absent] };
    let mut header = vec![0u8; BatchTable::header_size(2)];
    // A batch's tensor header says its K too (the table is checked against it).
    gpuring::tensor::TensorHeader::new(gpuring::tensor::DType::U8, &[2, 16])
        .write(&mut header)
        .unwrap();
    table.write(&mut header).unwrap();
    let (mut batch, mut closed, mut k) = (0u64, 0u64, 0usize);
    let mut cams = [gpuring_batch_camera::default(); 2];
    // Reads `header` into the locals above, with room for `room` entries: the status and K.
    let mut read = |header: &[u8], room: usize| {
        // SAFETY: `header` holds its length; the out-pointers are locals, `cams` room for 2.
        let s = unsafe {
            gpuring_batch_table_read(
                header.as_ptr(),
                header.len(),
                &mut batch,
                &mut closed,
                cams.as_mut_ptr(),
                room,
                &mut k,
            )
        };
        (s, k)
    };
    assert_eq!(read(&header, 1), (GPURING_INVALID_ARGUMENT, 2), "room for 1 of 2: K told");
    assert_eq!(read(&[0u8; 256], 2).0, GPURING_NO_BATCH);
    let mut damaged = header.clone();
    damaged[128 + 4] = 9; // a version this build does not read
    assert_eq!(read(&damaged, 2).0, GPURING_CORRUPT, "{}", last_error());
    assert_eq!(read(&header, 2).0, GPURING_OK);
    assert_eq!((batch, closed, k), (5, 123, 2));
    assert_eq!((cams[0].seq, cams[0].timestamp_ns, cams[0].skipped), (41, 7, 2));
    assert_eq!((cams[0].epoch, cams[0].state, cams[0].has_frame), (9, 1, 1));
    assert_eq!((cams[1].state, cams[1].has_frame), (0, 0));
}
