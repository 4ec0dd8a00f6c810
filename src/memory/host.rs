//! Host memory: the payload lives in the segment, and the memory kind adds nothing to the ring.

use super::{ConsumerSide, Member, Memory, ProducerSide, RxSettings, TxSettings};
use crate::error::{CreateErrorKind, Fault, OpenErrorKind, PublishError};
use crate::format::MemoryKind;
use crate::ring::Pinned;
use crate::shm::view::MappedRing;

/// Host memory: the payload lives in the shared-memory segment itself. Runs on any Linux
/// machine.
///
/// ```
/// use gpuring::{Consumer, Host, Producer};
///
/// let mut tx: Producer<Host> = Producer::builder("doc-memory-host").create()?;
/// let rx: Consumer<Host> = Consumer::open("doc-memory-host")?;
/// tx.send(b"bytes in shared memory", b"")?;
/// assert_eq!(&*rx.recv()?, b"bytes in shared memory");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Host;

impl super::sealed::Sealed for Host {}

impl Memory for Host {
    const KIND: MemoryKind = MemoryKind::Host;
    type Tx = HostTx;
    type Rx = HostRx;
}

/// The host side of a producer: nothing beside the segment. Its writes are done when the
/// producer publishes, and its consumers' reads when they release: the trait's defaults.
pub struct HostTx;

impl ProducerSide for HostTx {
    type Stream = ();

    type Prepared = ();

    fn prepare(settings: &TxSettings) -> Result<(), CreateErrorKind> {
        if settings.vmm.is_some() {
            return Err(CreateErrorKind::InvalidConfig {
                field: "sharing",
                reason: "VMM sharing is for CUDA memory; a host ring shares its segment",
            });
        }
        Ok(())
    }

    fn create(_: (), _: &TxSettings, _: &MappedRing) -> Result<Self, CreateErrorKind> {
        Ok(HostTx)
    }

    fn publish(
        &mut self,
        _: &MappedRing,
        _: usize,
        _: u64,
        _: Option<(u32, u64)>,
        _: Option<&()>,
    ) -> Result<(), PublishError> {
        Ok(())
    }

    fn buffer_addr(&self, map: &MappedRing, buffer: usize) -> u64 {
        map.payload(buffer) as u64
    }
}

/// The host side of a consumer: nothing beside the segment. A release is the ring's alone, and
/// the entry is freed at once when the consumer leaves: the trait's defaults.
pub struct HostRx;

impl ConsumerSide for HostRx {
    type Stream = ();

    /// The payload is in the segment, which a close leaves mapped.
    const MAPS_PRODUCER_MEMORY: bool = false;

    fn join(_: &RxSettings, _: &MappedRing, _: Member) -> Result<Self, OpenErrorKind> {
        Ok(HostRx)
    }

    fn place(&self, map: &MappedRing, m: &Pinned, _: Option<&()>) -> Result<u64, Fault> {
        Ok(map.payload(m.buffer) as u64)
    }
}
