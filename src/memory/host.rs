//! Host memory: the payload lives in the segment, and the memory kind adds nothing to the ring.

use std::time::Duration;

use super::{ConsumerSide, Fault, Memory, ProducerSide, RxSettings, TxSettings};
use crate::consumer::ConsumerRing;
use crate::error::{CreateErrorKind, OpenErrorKind, PublishError};
use crate::format::view::MappedRing;
use crate::format::MemoryKind;
use crate::producer::ProducerRing;
use crate::ring::{Leave, Pinned};

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

/// The host side of a producer: nothing beside the segment.
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

    fn spin(&self) -> Duration {
        Duration::ZERO
    }

    fn written(&mut self, _: &ProducerRing, _: usize) -> Result<bool, Fault> {
        Ok(true)
    }

    fn readers_done(&mut self, _: &mut ProducerRing, _: usize, _: u64) -> Result<bool, Fault> {
        // A host consumer's reads end with its release: the ring's claim already waited.
        Ok(true)
    }

    fn forget(&mut self, _: usize, _: u32) {}

    fn publish(
        &mut self,
        _: &ProducerRing,
        _: usize,
        _: (u32, u64),
        _: Option<&()>,
    ) -> Result<(), PublishError> {
        Ok(())
    }

    fn slot_region(&self, _: usize) -> (u32, u64) {
        (0, 0)
    }

    fn slot_addr(&self, ring: &ProducerRing, slot: usize) -> u64 {
        ring.map().payload(slot) as u64
    }

    fn close(&mut self, ring: &mut ProducerRing) {
        ring.close();
    }
}

/// The host side of a consumer: nothing beside the segment.
pub struct HostRx;

impl ConsumerSide for HostRx {
    type Stream = ();

    fn join(_: &RxSettings, _: &MappedRing, _: usize, _: u32) -> Result<Self, OpenErrorKind> {
        Ok(HostRx)
    }

    fn place(&self, ring: &ConsumerRing, m: &Pinned, _: Option<&()>) -> Result<u64, Fault> {
        Ok(ring.map().payload(m.buffer) as u64)
    }

    fn release(&self, _: &ConsumerRing, _: &Pinned, _: Option<&()>) -> Result<(), Fault> {
        Ok(())
    }

    fn leave(&mut self, ring: &mut ConsumerRing) {
        ring.leave(Leave::Free);
    }
}
