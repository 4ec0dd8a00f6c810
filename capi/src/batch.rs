//! The batch table (src/batch/table.rs): what a batch of many cameras (`gpuring batch`) says
//! about each camera's place, read from the batch's user header.

use gpuring::batch::BatchTable;

use crate::gpuring_status::*;
use crate::producer::bytes;
use crate::{fail, gpuring_status};

/// One camera's place in a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gpuring_batch_camera {
    /// The input sequence number of the frame in its place (0 if none).
    pub seq: u64,
    /// That frame's producer timestamp, CLOCK_MONOTONIC nanoseconds (0 if none).
    pub timestamp_ns: u64,
    /// Frames of this camera that went into no batch since the last one that carried one.
    pub skipped: u64,
    /// The epoch of the camera's producer instance (0 if none was ever seen).
    pub epoch: u64,
    /// 0 absent (zeros), 1 present (a new frame), 2 stale (its previous frame, or zeros), 3
    /// refused (zeros: its frames do not fit the batch).
    pub state: u32,
    /// Whether its place holds a frame (present, or stale with the previous frame kept): 1 or 0.
    pub has_frame: u32,
}

/// Reads the batch table of a batch's user header `buf` (`len` bytes): the batch's number into
/// `*batch`, when it was closed into `*closed_ns` (CLOCK_MONOTONIC), the number of cameras K
/// into `*cameras`, and camera k's place into `entries[k]` for each k below K. `entries` has
/// room for `capacity` of them: with fewer than K, `*cameras` is still set and the call returns
/// `GPURING_INVALID_ARGUMENT` (call again with room for K). Camera k's frame is bytes
/// `k * len / K` to `(k + 1) * len / K` of the message. `GPURING_NO_BATCH` if the header
/// carries no batch table, `GPURING_CORRUPT` if it is damaged.
#[no_mangle]
pub unsafe extern "C" fn gpuring_batch_table_read(
    buf: *const u8,
    len: usize,
    batch: *mut u64,
    closed_ns: *mut u64,
    entries: *mut gpuring_batch_camera,
    capacity: usize,
    cameras: *mut usize,
) -> gpuring_status {
    // SAFETY: `buf` holds `len` readable bytes (the contract).
    let header = match unsafe { bytes(buf, len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    if batch.is_null() || closed_ns.is_null() || cameras.is_null() {
        return fail(GPURING_INVALID_ARGUMENT, "an out-pointer is null");
    }
    let table = match BatchTable::read(header) {
        Ok(Some(t)) => t,
        Ok(None) => return fail(GPURING_NO_BATCH, "the user header carries no batch table"),
        Err(e) => return fail(GPURING_CORRUPT, e),
    };
    let k = table.cameras.len();
    // SAFETY: the out-pointers are writable (the contract), checked non-null above.
    unsafe {
        *batch = table.batch;
        *closed_ns = table.closed_ns;
        *cameras = k;
    }
    if entries.is_null() {
        return fail(GPURING_INVALID_ARGUMENT, "entries is null");
    }
    if capacity < k {
        return fail(
            GPURING_INVALID_ARGUMENT,
            format!("the batch has {k} cameras; entries has room for {capacity}"),
        );
    }
    for (i, e) in table.cameras.iter().enumerate() {
        let out = gpuring_batch_camera {
            seq: e.seq,
            timestamp_ns: e.timestamp_ns,
            skipped: e.skipped,
            epoch: e.epoch,
            state: e.state.code(),
            has_frame: u32::from(e.has_frame()),
        };
        // SAFETY: `entries` has room for `capacity` >= K entries (the contract).
        unsafe { entries.add(i).write(out) };
    }
    GPURING_OK
}
