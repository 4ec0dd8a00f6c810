//! Which GPU a consumer reads on, and whether it can reach the ring's memory from there.
//!
//! The segment names the ring's GPU by UUID, since ordinals differ between processes
//! (`CUDA_VISIBLE_DEVICES`). A consumer reads on that GPU unless it asks for another
//! ([`ConsumerBuilder::device`](crate::ConsumerBuilder::device)); another GPU must have peer
//! access to the ring's (`cuDeviceCanAccessPeer`), or the open is refused with
//! [`OpenErrorKind::NoPeerAccess`], naming both. What then enables the access is the mapping
//! itself: legacy IPC opens with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` (the driver enables it
//! once per pair of contexts, as `cuCtxEnablePeerAccess` would), VMM grants the consumer's
//! device access to each imported pool (`cuMemSetAccess`).

use crate::cuda::driver::{self, DriverError};
use crate::cuda::uuid_string;
use crate::error::OpenErrorKind;

/// Where a consumer reads: on device `own`, memory of device `ring` (ordinals of this
/// process). Invariant: `own == ring`, or `own` has peer access to `ring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    pub(super) own: i32,
    pub(super) ring: i32,
}

/// What placing a consumer needs to know of the GPUs this process sees: the driver's answers
/// in a consumer, a table in the unit tests below.
pub(super) trait Gpus {
    fn count(&self) -> Result<i32, DriverError>;
    fn uuid(&self, ordinal: i32) -> Result<[u8; 16], DriverError>;
    /// Whether device `reader` can map and read memory of device `owner` (two distinct ones).
    fn can_access_peer(&self, reader: i32, owner: i32) -> Result<bool, DriverError>;
}

/// The CUDA driver's view.
pub(super) struct Driver;

impl Gpus for Driver {
    fn count(&self) -> Result<i32, DriverError> {
        driver::device_count()
    }

    fn uuid(&self, ordinal: i32) -> Result<[u8; 16], DriverError> {
        driver::ordinal_uuid(ordinal)
    }

    fn can_access_peer(&self, reader: i32, owner: i32) -> Result<bool, DriverError> {
        driver::can_access_peer(driver::device(reader)?, driver::device(owner)?)
    }
}

fn driver_err(e: DriverError) -> OpenErrorKind {
    OpenErrorKind::MemoryUnavailable { reason: e.to_string() }
}

/// Places a consumer that asked for device `wanted` (`None`: the ring's) on a ring whose
/// memory is on the GPU with UUID `ring_uuid`.
pub(super) fn place(
    wanted: Option<i32>,
    ring_uuid: [u8; 16],
    gpus: &impl Gpus,
) -> Result<Placement, OpenErrorKind> {
    let count = gpus.count().map_err(driver_err)?;
    if let Some(own) = wanted {
        if !(0..count).contains(&own) {
            return Err(OpenErrorKind::MemoryUnavailable {
                reason: format!(
                    "there is no device {own}: this process sees {count} GPU{}",
                    if count == 1 { "" } else { "s" }
                ),
            });
        }
    }
    // A device whose UUID cannot be read is not the ring's; the search goes on.
    let ring =
        (0..count).find(|&d| gpus.uuid(d).is_ok_and(|u| u == ring_uuid)).ok_or_else(|| {
            OpenErrorKind::MemoryUnavailable {
                reason: format!(
                    "the ring's memory is on {}, which this process cannot see (check \
                 CUDA_VISIBLE_DEVICES)",
                    uuid_string(ring_uuid)
                ),
            }
        })?;
    let own = wanted.unwrap_or(ring);
    if own != ring && !gpus.can_access_peer(own, ring).map_err(driver_err)? {
        return Err(OpenErrorKind::NoPeerAccess {
            device: own,
            device_uuid: gpus.uuid(own).map_or_else(|e| e.to_string(), uuid_string),
            ring_device: ring,
            ring_uuid: uuid_string(ring_uuid),
        });
    }
    Ok(Placement { own, ring })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::driver::CUresult;

    /// GPUs by UUID (`None`: its UUID cannot be read), and the ordered pairs (reader, owner)
    /// with peer access.
    struct Table {
        uuids: Vec<Option<[u8; 16]>>,
        peers: Vec<(i32, i32)>,
    }

    fn fail(call: &'static str) -> DriverError {
        DriverError { call, code: CUresult::CUDA_ERROR_INVALID_DEVICE }
    }

    impl Gpus for Table {
        fn count(&self) -> Result<i32, DriverError> {
            Ok(self.uuids.len() as i32)
        }

        fn uuid(&self, ordinal: i32) -> Result<[u8; 16], DriverError> {
            self.uuids[ordinal as usize].ok_or(fail("cuDeviceGetUuid"))
        }

        fn can_access_peer(&self, reader: i32, owner: i32) -> Result<bool, DriverError> {
            assert_ne!(reader, owner, "a device is never asked about itself");
            Ok(self.peers.contains(&(reader, owner)))
        }
    }

    fn uuid(n: u8) -> [u8; 16] {
        [n; 16]
    }

    #[test]
    fn a_consumer_reads_on_the_rings_gpu_unless_it_asks_for_another() {
        let gpus = Table { uuids: vec![Some(uuid(7)), Some(uuid(9))], peers: vec![] };
        assert_eq!(place(None, uuid(9), &gpus).unwrap(), Placement { own: 1, ring: 1 });
        assert_eq!(place(Some(1), uuid(9), &gpus).unwrap(), Placement { own: 1, ring: 1 });
        // The ring's GPU is found by UUID even where an earlier one's cannot be read.
        let gpus = Table { uuids: vec![None, Some(uuid(9))], peers: vec![] };
        assert_eq!(place(None, uuid(9), &gpus).unwrap(), Placement { own: 1, ring: 1 });
    }

    #[test]
    fn another_gpu_needs_peer_access_to_the_rings_and_the_refusal_names_both() {
        let gpus = Table { uuids: vec![Some(uuid(7)), Some(uuid(9))], peers: vec![(0, 1)] };
        assert_eq!(place(Some(0), uuid(9), &gpus).unwrap(), Placement { own: 0, ring: 1 });
        // Peer access is one-way in the driver's answers: 1 reading 0's memory is not 0 reading 1's.
        let e = place(Some(1), uuid(7), &gpus).unwrap_err();
        let OpenErrorKind::NoPeerAccess { device: 1, ring_device: 0, .. } = &e else {
            panic!("{e:?}")
        };
        let text = e.to_string();
        assert!(text.contains("GPU 1 (GPU-09090909-0909-0909-0909-090909090909)"), "{text}");
        assert!(text.contains("GPU 0 (GPU-07070707-0707-0707-0707-070707070707)"), "{text}");
    }

    #[test]
    fn a_ring_on_an_unseen_gpu_or_an_unknown_device_is_unavailable() {
        let gpus = Table { uuids: vec![Some(uuid(7))], peers: vec![] };
        let e = place(None, uuid(3), &gpus).unwrap_err();
        assert!(matches!(e, OpenErrorKind::MemoryUnavailable { .. }), "{e:?}");
        assert!(e.to_string().contains("GPU-03030303-"), "{e}");
        for wanted in [-1, 1, 5] {
            let e = place(Some(wanted), uuid(7), &gpus).unwrap_err();
            assert!(e.to_string().contains(&format!("no device {wanted}")), "{e}");
        }
    }
}
