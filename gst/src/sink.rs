//! `gpuringsink`: the producer of a ring. Each buffer becomes one message, with the tensor and
//! frame headers (`header`) in its user header. Into a host ring, upstream writes frames
//! straight into ring buffers from the pool the sink offers (`pool`), which are published where
//! they are; any other frame is copied once into a slot (on the CPU for system memory into a
//! host ring, on the GPU otherwise).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use gpuring::any::{AnyProducer, AnyWriteSlot};
use gpuring::cuda::driver::{self, Rows};
use gpuring::tensor::{DType, TensorHeader};
use gpuring::{AcquireTimeoutError, MemoryKind, Policy, Producer};
use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::prelude::*;
use gst_video::VideoInfo;

use crate::cudamem;
use crate::header::{FrameHeader, USER_HEADER_SIZE};
use crate::pool::{Lender, LoanPool, MakeLender};
use crate::Memory;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new("gpuringsink", gst::DebugColorFlags::empty(), Some("gpuring sink"))
});

/// How often a blocked wait looks at whether the element is stopping.
const TICK: Duration = Duration::from_millis(20);
/// Upstream CUDA buffers kept alive until the GPU copies out of them have run.
const MAX_IN_FLIGHT: usize = 4;

glib::wrapper! {
    /// The `gpuringsink` element.
    pub struct RingSink(ObjectSubclass<imp::RingSink>) @extends gst_base::BaseSink, gst::Element, gst::Object;
}

/// Registers `gpuringsink` with `plugin`.
pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(Some(plugin), "gpuringsink", gst::Rank::NONE, RingSink::static_type())
}

/// The properties.
#[derive(Clone, Debug)]
struct Settings {
    ring: Option<String>,
    /// The ring directory; empty: the library's default (`GPURING_DIR`, else /dev/shm).
    dir: String,
    capacity: u32,
    spare_buffers: u32,
    policy: Policy,
    memory: Memory,
    device: i32,
    slot_size: u64,
    wait_for_consumers: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ring: None,
            dir: String::new(),
            capacity: 8,
            spare_buffers: gpuring::DEFAULT_SPARES,
            policy: Policy::Block,
            memory: Memory::Auto,
            device: 0,
            slot_size: 0,
            wait_for_consumers: 0,
        }
    }
}

/// What a running sink holds.
struct State {
    /// The ring's producer, in the memory kind it was created in, shared with the buffers of
    /// the pool offered upstream (host rings).
    lender: Arc<Lender>,
    /// The negotiated format (system-memory input's default layout comes from it).
    info: VideoInfo,
    /// Upstream CUDA buffers whose GPU copy into a slot may not have run yet: kept alive (so
    /// upstream's pool cannot reuse them) until the producer's stream has passed the copy.
    in_flight: VecDeque<gst::Buffer>,
    /// `wait-for-consumers` is satisfied (checked before the first frame only).
    waited: bool,
}

/// Where a frame's bytes are.
enum Frame<'a> {
    /// Mapped for CPU reads.
    Cpu(&'a [u8]),
    /// CUDA memory, mapped for device reads.
    Device(&'a cudamem::DeviceMap<'a>),
}

mod imp {
    use super::*;

    #[derive(Default)]
    pub struct RingSink {
        settings: Mutex<Settings>,
        caps_info: Mutex<Option<VideoInfo>>,
        state: Mutex<Option<State>>,
        /// Set by `unlock` (flushing, stopping): waits give up. Relaxed: only a hint that is
        /// polled every `TICK`; the state it guards is under `state`'s mutex.
        flushing: AtomicBool,
        /// Frames published in place (pool buffers) and copied into a slot. Relaxed:
        /// statistics.
        in_place: AtomicU64,
        copied: AtomicU64,
        /// Between `start` and `stop`: only then may the pool make the ring.
        started: AtomicBool,
    }

    #[glib::object_subclass]
    impl ObjectSubclass for RingSink {
        const NAME: &'static str = "GpuringSink";
        type Type = super::RingSink;
        type ParentType = gst_base::BaseSink;
    }

    impl ObjectImpl for RingSink {
        fn properties() -> &'static [glib::ParamSpec] {
            static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
                let d = Settings::default();
                vec![
                    glib::ParamSpecString::builder("ring")
                        .nick("Ring")
                        .blurb("Name of the ring to create (DIR/gpuring.NAME, DIR the dir property)")
                        .build(),
                    glib::ParamSpecString::builder("dir")
                        .nick("Ring directory")
                        .blurb("Directory of the ring's file and sockets, shared with its consumers; empty: $GPURING_DIR if set, else /dev/shm")
                        .default_value(Some(""))
                        .build(),
                    glib::ParamSpecUInt::builder("capacity")
                        .blurb("Slots in the ring (messages in flight)")
                        .minimum(1)
                        .default_value(d.capacity)
                        .build(),
                    glib::ParamSpecUInt::builder("spare-buffers")
                        .blurb("Extra buffers that let consumers hold frames without stalling the ring")
                        .default_value(d.spare_buffers)
                        .build(),
                    glib::ParamSpecString::builder("policy")
                        .blurb("block: consumers are lossless unless they choose; overwrite: they queue and lose the oldest")
                        .default_value(Some(d.policy.name()))
                        .build(),
                    glib::ParamSpecString::builder("memory")
                        .blurb("auto (CUDA for CUDA-memory input, else host), cuda or host")
                        .default_value(Some(d.memory.name()))
                        .build(),
                    glib::ParamSpecInt::builder("device")
                        .blurb("CUDA device ordinal of the ring (CUDA memory)")
                        .minimum(0)
                        .default_value(d.device)
                        .build(),
                    glib::ParamSpecUInt64::builder("slot-size")
                        .blurb("Bytes per slot; 0: the first frame's size")
                        .default_value(d.slot_size)
                        .build(),
                    glib::ParamSpecUInt::builder("wait-for-consumers")
                        .blurb("Hold the first frame until this many consumers have joined")
                        .default_value(d.wait_for_consumers)
                        .build(),
                    glib::ParamSpecUInt64::builder("frames-in-place")
                        .blurb("Frames published where upstream wrote them (buffers of the pool the sink offers)")
                        .read_only()
                        .build(),
                    glib::ParamSpecUInt64::builder("frames-copied")
                        .blurb("Frames copied into a slot")
                        .read_only()
                        .build(),
                ]
            });
            PROPS.as_ref()
        }

        fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
            let mut s = self.settings.lock().unwrap();
            match pspec.name() {
                "ring" => s.ring = value.get().expect("type checked"),
                "dir" => {
                    let dir: Option<String> = value.get().expect("type checked");
                    s.dir = dir.unwrap_or_default();
                }
                "capacity" => s.capacity = value.get().expect("type checked"),
                "spare-buffers" => s.spare_buffers = value.get().expect("type checked"),
                "policy" => {
                    let name: Option<String> = value.get().expect("type checked");
                    match name.as_deref().and_then(Policy::from_name) {
                        Some(p) => s.policy = p,
                        None => gst::error!(
                            CAT,
                            imp = self,
                            "policy must be block or overwrite, not {name:?}"
                        ),
                    }
                }
                "memory" => {
                    let name: Option<String> = value.get().expect("type checked");
                    match name.as_deref().and_then(Memory::from_name) {
                        Some(m) => s.memory = m,
                        None => gst::error!(
                            CAT,
                            imp = self,
                            "memory must be auto, cuda or host, not {name:?}"
                        ),
                    }
                }
                "device" => s.device = value.get().expect("type checked"),
                "slot-size" => s.slot_size = value.get().expect("type checked"),
                "wait-for-consumers" => s.wait_for_consumers = value.get().expect("type checked"),
                _ => unreachable!("no property {}", pspec.name()),
            }
        }

        fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
            let s = self.settings.lock().unwrap();
            match pspec.name() {
                "ring" => s.ring.to_value(),
                "dir" => s.dir.to_value(),
                "capacity" => s.capacity.to_value(),
                "spare-buffers" => s.spare_buffers.to_value(),
                "policy" => s.policy.name().to_value(),
                "memory" => s.memory.name().to_value(),
                "device" => s.device.to_value(),
                "slot-size" => s.slot_size.to_value(),
                "wait-for-consumers" => s.wait_for_consumers.to_value(),
                "frames-in-place" => self.in_place.load(Ordering::Relaxed).to_value(),
                "frames-copied" => self.copied.load(Ordering::Relaxed).to_value(),
                _ => unreachable!("no property {}", pspec.name()),
            }
        }

        fn constructed(&self) {
            self.parent_constructed();
            // A last sample would hold the last frame's buffer at render time, so a pool
            // buffer would look shared and be copied (and its ring buffer kept meanwhile).
            self.obj().set_property("enable-last-sample", false);
        }
    }

    impl GstObjectImpl for RingSink {}

    impl ElementImpl for RingSink {
        fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
            static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
                gst::subclass::ElementMetadata::new(
                    "gpuring sink",
                    "Sink/Video",
                    "Publishes video frames into a gpuring ring, in host or CUDA memory, for consumers in other processes",
                    "gpuring",
                )
            });
            Some(&*META)
        }

        fn pad_templates() -> &'static [gst::PadTemplate] {
            static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> =
                LazyLock::new(|| vec![crate::video_pad_template("sink", gst::PadDirection::Sink)]);
            TEMPLATES.as_ref()
        }
    }

    impl BaseSinkImpl for RingSink {
        fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
            let info = VideoInfo::from_caps(caps)
                .map_err(|_| gst::loggable_error!(CAT, "not video caps: {caps}"))?;
            *self.caps_info.lock().unwrap() = Some(info);
            Ok(())
        }

        fn start(&self) -> Result<(), gst::ErrorMessage> {
            let _state = self.state.lock().unwrap();
            // Relaxed: read under the same mutex.
            self.started.store(true, Ordering::Relaxed);
            Ok(())
        }

        fn stop(&self) -> Result<(), gst::ErrorMessage> {
            let mut guard = self.state.lock().unwrap();
            // Relaxed: read under the same mutex.
            self.started.store(false, Ordering::Relaxed);
            // Dropping the producer closes the ring: consumers drain it, then see it closed.
            if let Some(mut state) = guard.take() {
                if let Some(stream) = state.lender.lock().stream() {
                    let _ = stream.synchronize();
                }
                state.in_flight.clear();
            }
            Ok(())
        }

        fn propose_allocation(
            &self,
            query: &mut gst::query::Allocation,
        ) -> Result<(), gst::LoggableError> {
            let (Some(caps), true) = query.get_owned() else { return Ok(()) };
            let Ok(info) = VideoInfo::from_caps(&caps) else { return Ok(()) };
            let cuda_caps = caps.features(0).is_some_and(|f| f.contains(cudamem::CAPS_FEATURE));
            if cuda_caps || self.settings.lock().unwrap().memory == Memory::Cuda {
                // CUDA rings take upstream's CUDA memory as it is (docs/gstreamer.md).
                return Ok(());
            }
            let mut spares = self.settings.lock().unwrap().spare_buffers;
            if let Some(state) = self.state.lock().unwrap().as_ref() {
                // A ring made earlier (by a first frame, or other caps) must be able to lend.
                let tx = state.lender.lock();
                if tx.is_cuda() || info.size() > tx.slot_size() {
                    return Ok(());
                }
                spares = tx.spare_buffers();
            }
            if spares == 0 {
                return Ok(());
            }
            let sink = self.obj().downgrade();
            let make_info = info.clone();
            let make: MakeLender = Box::new(move |size| {
                let sink = sink.upgrade().ok_or(gst::FlowError::Flushing)?;
                sink.imp().lender_for_pool(&make_info, size)
            });
            let pool = LoanPool::new(make, self.obj().upcast_ref(), spares);
            let mut config = pool.config();
            // At most one buffer per spare is out: a lend waits for the next.
            config.set_params(Some(&caps), info.size() as u32, 0, spares);
            pool.set_config(config).map_err(|_| gst::loggable_error!(CAT, "pool config"))?;
            query.add_allocation_pool(Some(&pool), info.size() as u32, 0, spares);
            gst::debug!(CAT, imp = self, "offered a pool of {spares} ring buffers");
            Ok(())
        }

        fn unlock(&self) -> Result<(), gst::ErrorMessage> {
            self.flushing.store(true, Ordering::Relaxed);
            Ok(())
        }

        fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
            self.flushing.store(false, Ordering::Relaxed);
            Ok(())
        }

        fn render(&self, buffer: &gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
            let info =
                self.caps_info.lock().unwrap().clone().ok_or(gst::FlowError::NotNegotiated)?;
            if buffer.n_memory() == 0 {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    ["a buffer with no memory"]
                );
                return Err(gst::FlowError::Error);
            }
            let mem = buffer.peek_memory(0);
            let unshared = sole_holder(buffer);
            let cuda_lib =
                cudamem::get().filter(|lib| buffer.n_memory() == 1 && lib.is_cuda_memory(mem));
            let mut guard = self.state.lock().unwrap();
            if guard.is_none() {
                // A CUDA buffer's pitched size can exceed the caps' frame size.
                let size = match cuda_lib.and_then(|lib| lib.map_read(mem)) {
                    Some(map) => map.video.size().max(buffer.size()),
                    None => buffer.size(),
                };
                *guard = Some(self.create(&info, cuda_lib.is_some(), size)?);
            }
            let state = guard.as_mut().expect("created above");
            state.info = info;
            if !state.waited {
                // After the ring is stored: a flush meanwhile keeps it (and its consumers).
                let wanted = self.settings.lock().unwrap().wait_for_consumers as usize;
                while state.consumer_count() < wanted {
                    // A sink that only waits makes no GPU call: it must still learn that its
                    // context was lost, and stop (under MPS a faulted process that lingers
                    // keeps every other from starting).
                    if let Some(lost) =
                        crate::lost::post_if_lost(self.obj().upcast_ref(), &"waiting for consumers")
                    {
                        return Err(lost);
                    }
                    self.wait_if_unlocked()?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                state.waited = true;
            }
            // Let go of upstream buffers whose copies have run, before queuing this one's.
            self.let_go_of_copied(state)?;
            // A CUDA-memory buffer into a CUDA ring is copied on the GPU; everything else is
            // read on the CPU (GStreamer downloads CUDA memory for a host ring).
            let is_cuda = state.lender.lock().is_cuda();
            let device_map = match cuda_lib.filter(|_| is_cuda) {
                Some(lib) => Some(lib.map_read(mem).ok_or(gst::FlowError::Error)?),
                None => None,
            };
            let cpu_map;
            let frame = match &device_map {
                Some(map) => Frame::Device(map),
                None => {
                    cpu_map = buffer.map_readable().map_err(|_| gst::FlowError::Error)?;
                    Frame::Cpu(cpu_map.as_slice())
                }
            };
            let header = self.header(buffer, &state.info, &frame)?;
            if let Frame::Cpu(bytes) = frame {
                if self.publish_in_place(state, unshared, bytes, &header)? {
                    return Ok(gst::FlowSuccess::Ok);
                }
            }
            self.publish(state, frame, &header)?;
            self.copied.fetch_add(1, Ordering::Relaxed);
            // A copy to the GPU reads the buffer after this returns (from page-locked memory,
            // or GStreamer's CUDA memory): keep it until then.
            self.keep_until_copied(state, buffer.clone())?;
            Ok(gst::FlowSuccess::Ok)
        }
    }

    impl RingSink {
        /// The producer the pool offered upstream lends from: the ring, created now for frames
        /// of `info` in buffers of `size` bytes if the first frame has not created it;
        /// `NotSupported` if it cannot lend such buffers (a CUDA ring, slots too small);
        /// `Flushing` if the sink is stopped (a stopped sink makes no ring).
        pub(crate) fn lender_for_pool(
            &self,
            info: &VideoInfo,
            size: usize,
        ) -> Result<Arc<Lender>, gst::FlowError> {
            let mut guard = self.state.lock().unwrap();
            if guard.is_none() {
                // Relaxed: written under the same mutex (start and stop hold it).
                if !self.started.load(Ordering::Relaxed) {
                    return Err(gst::FlowError::Flushing);
                }
                *guard = Some(self.create(info, false, size.max(info.size()))?);
            }
            let lender = guard.as_ref().expect("created above").lender.clone();
            let tx = lender.lock();
            if tx.is_cuda() || size > tx.slot_size() || tx.spare_buffers() == 0 {
                return Err(gst::FlowError::NotSupported);
            }
            drop(tx);
            Ok(lender)
        }

        /// Creates the ring for frames of `size` bytes, and waits for the consumers asked for.
        fn create(
            &self,
            info: &VideoInfo,
            cuda_input: bool,
            size: usize,
        ) -> Result<State, gst::FlowError> {
            let s = self.settings.lock().unwrap().clone();
            let Some(name) = s.ring.clone() else {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::Settings,
                    ["the ring property is not set"]
                );
                return Err(gst::FlowError::Error);
            };
            let slot = if s.slot_size > 0 { s.slot_size as usize } else { size };
            let mut builder = Producer::builder(&name)
                .capacity(s.capacity)
                .spare_buffers(s.spare_buffers)
                .policy(s.policy)
                .slot_size(slot)
                .user_header_size(USER_HEADER_SIZE as u32);
            if !s.dir.is_empty() {
                builder = builder.dir(&s.dir);
            }
            let cuda = match s.memory {
                Memory::Cuda => true,
                Memory::Host => false,
                Memory::Auto => cuda_input,
            };
            let kind = if cuda { MemoryKind::Cuda } else { MemoryKind::Host };
            let tx = AnyProducer::create(builder.device(s.device), kind).map_err(|e| {
                if let Some(lost) = crate::lost::post_if_lost(self.obj().upcast_ref(), &e) {
                    return lost;
                }
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::OpenWrite,
                    ["cannot create ring {name}: {e}"]
                );
                gst::FlowError::Error
            })?;
            gst::info!(
                CAT,
                imp = self,
                "created ring {name}: {} memory, {} slots of {slot} bytes",
                if cuda { "CUDA" } else { "host" },
                s.capacity
            );
            let lender = Lender::new(tx);
            Ok(State { lender, info: info.clone(), in_flight: VecDeque::new(), waited: false })
        }

        /// The message's user header: the tensor header (packed single-plane formats get
        /// `[height, width, channels]`, others their bytes) and the frame header.
        fn header(
            &self,
            buffer: &gst::Buffer,
            info: &VideoInfo,
            frame: &Frame,
        ) -> Result<[u8; USER_HEADER_SIZE], gst::FlowError> {
            let (offsets, strides): (Vec<usize>, Vec<i32>) =
                match (buffer.meta::<gst_video::VideoMeta>(), frame) {
                    (Some(meta), _) => (meta.offset().to_vec(), meta.stride().to_vec()),
                    (None, Frame::Device(map)) => {
                        (map.video.offset().to_vec(), map.video.stride().to_vec())
                    }
                    (None, Frame::Cpu(_)) => (info.offset().to_vec(), info.stride().to_vec()),
                };
            let mut h = FrameHeader::new(info.format().to_str(), info.width(), info.height());
            h.fps = (info.fps().numer(), info.fps().denom());
            h.par = (info.par().numer(), info.par().denom());
            h.colorimetry = info.colorimetry().to_string();
            h.planes = info.n_planes();
            if offsets.len() < h.planes as usize || strides.iter().any(|&s| s < 0) {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    ["unsupported frame layout (offsets {offsets:?}, strides {strides:?})"]
                );
                return Err(gst::FlowError::Error);
            }
            for p in 0..h.planes as usize {
                h.offsets[p] = offsets[p] as u64;
                h.strides[p] = strides[p].unsigned_abs();
            }
            h.pts = buffer.pts().map(|t| t.nseconds());
            h.dts = buffer.dts().map(|t| t.nseconds());
            h.duration = buffer.duration().map(|t| t.nseconds());
            h.offset = Some(buffer.offset()).filter(|&o| o != gst::ffi::GST_BUFFER_OFFSET_NONE);
            h.flags = buffer.flags().bits();
            let mut out = [0u8; USER_HEADER_SIZE];
            let finfo = info.format_info();
            // The message's length: what the tensor header must cover.
            let len = match frame {
                Frame::Cpu(b) => b.len(),
                Frame::Device(m) => m.video.size(),
            };
            let packed = h.planes == 1 && !finfo.is_yuv() && finfo.bits() == 8;
            let width_bytes = info.width() as usize * finfo.pixel_stride()[0] as usize;
            let tensor = if packed
                && strides[0].unsigned_abs() as usize == width_bytes
                && offsets[0] == 0
                && len == width_bytes * info.height() as usize
            {
                TensorHeader::new(
                    DType::U8,
                    &[info.height() as u64, info.width() as u64, finfo.pixel_stride()[0] as u64],
                )
            } else {
                // Planes, padded rows: the message's bytes (the frame header has the layout).
                TensorHeader::new(DType::U8, &[len as u64])
            };
            // The tensor header of at most 3 dimensions fits the 64 bytes before the frame header.
            let _ = tensor.write(&mut out);
            h.write(&mut out);
            Ok(out)
        }

        /// Publishes a buffer of the pool the sink offered where upstream wrote it, if it is
        /// one: `memory` is its one memory if nothing else holds it (`sole_holder`), `bytes`
        /// their CPU map. Waits (a tick at a time, so that a flush can end it) while a
        /// `Lossless` consumer has not received the message it overwrites. Returns whether it
        /// published; if not, the caller copies the frame.
        fn publish_in_place(
            &self,
            state: &mut State,
            memory: Option<usize>,
            bytes: &[u8],
            header: &[u8],
        ) -> Result<bool, gst::FlowError> {
            let Some(memory) = memory else { return Ok(false) };
            let addr = bytes.as_ptr() as usize;
            let Some(mut loan) = state.lender.take_unpublished(addr, memory) else {
                return Ok(false);
            };
            let published = loop {
                let mut tx = state.lender.lock();
                let host = tx.host_mut().expect("only a host ring's pool lends");
                match host.publish_loan_timeout(&mut loan, bytes.len(), header, TICK) {
                    Err(gpuring::PublishLoanError::Timeout) => {
                        drop(tx);
                        if let Err(flow) = self.wait_if_unlocked() {
                            break Err(flow);
                        }
                    }
                    r => break Ok(r),
                }
            };
            // Published or not, the loan is the pool memory's again (it ends when freed).
            state.lender.put_back(addr, memory, loan);
            match published? {
                Ok(_) => {
                    self.in_place.fetch_add(1, Ordering::Relaxed);
                    Ok(true)
                }
                // A slot from an interrupted copy holds the next message: the copy path
                // publishes it with this frame.
                Err(gpuring::PublishLoanError::SlotClaimed) => Ok(false),
                Err(e) => Err(self.refuse(&e)),
            }
        }

        /// Copies `frame` into a slot and publishes it, waiting (a tick at a time, so a flush
        /// can end it) while the ring is full.
        fn publish(
            &self,
            state: &mut State,
            frame: Frame,
            header: &[u8],
        ) -> Result<(), gst::FlowError> {
            let len = match &frame {
                Frame::Cpu(b) => b.len(),
                Frame::Device(m) => m.video.size(),
            };
            let too_long = |slot: usize| {
                gst::element_imp_error!(self, gst::StreamError::Format,
                    ["a frame of {len} bytes does not fit the ring's {slot}-byte slots (set slot-size)"]);
                gst::FlowError::Error
            };
            let slot_size = state.lender.lock().slot_size();
            if len > slot_size {
                return Err(too_long(slot_size));
            }
            self.with_slot(&state.lender, |mut slot| {
                if let Some(bytes) = slot.bytes_mut() {
                    let Frame::Cpu(src) = frame else {
                        unreachable!("a host ring reads frames on the CPU")
                    };
                    bytes[..len].copy_from_slice(src);
                } else {
                    self.copy_to_device(&slot, frame, len)?;
                }
                slot.publish(len, header).map(drop).map_err(|e| self.refuse(&e))
            })?;
            Ok(())
        }

        /// Copies `frame` (`len` bytes) into CUDA slot `slot`, on its stream.
        fn copy_to_device(
            &self,
            slot: &AnyWriteSlot<'_>,
            frame: Frame,
            len: usize,
        ) -> Result<(), gst::FlowError> {
            let stream = slot.stream().expect("a slot without host bytes is a CUDA slot");
            let ctx = stream.context();
            let _bound = ctx.bind().map_err(|e| self.refuse(&e))?;
            let copied = match frame {
                // SAFETY: the slot holds `len` bytes and is ours until publish; `bytes` stays
                // mapped until the call returns, and a copy from pageable memory has staged it
                // by then; our context is current.
                Frame::Cpu(bytes) => unsafe {
                    driver::memcpy_htod_async(slot.ptr(), bytes, stream.raw())
                },
                // SAFETY: the map covers `len` bytes of device memory in its own context, kept
                // alive after this call by `keep_until_copied`; upstream wrote it before
                // pushing (1.22) or `map_read` waited for its stream. One row of `len` bytes:
                // the whole buffer.
                Frame::Device(map) => unsafe {
                    driver::memcpy_2d_peer_async(
                        Rows::Device { ptr: slot.ptr(), pitch: len, ctx: ctx.raw() },
                        Rows::Device { ptr: map.ptr, pitch: len, ctx: map.ctx.cast() },
                        len,
                        1,
                        stream.raw(),
                    )
                },
            };
            copied.map_err(|e| self.refuse(&e))
        }

        /// Waits for a free slot, a tick at a time so that a pause or a flush can end the
        /// wait (with the producer unlocked, for the pool's lends), and hands it to `fill`
        /// (which writes and publishes it).
        fn with_slot(
            &self,
            lender: &Lender,
            fill: impl FnOnce(AnyWriteSlot<'_>) -> Result<(), gst::FlowError>,
        ) -> Result<(), gst::FlowError> {
            loop {
                let mut tx = lender.lock();
                match tx.acquire_timeout(TICK) {
                    Ok(slot) => return fill(slot),
                    Err(AcquireTimeoutError::Timeout) => {}
                    Err(e) => return Err(self.refuse(&e)),
                }
                drop(tx);
                self.wait_if_unlocked()?;
            }
        }

        /// Posts a publish failure (a lost GPU context as such); the flow error to return.
        fn refuse(&self, e: &dyn std::fmt::Display) -> gst::FlowError {
            if let Some(lost) = crate::lost::post_if_lost(self.obj().upcast_ref(), e) {
                return lost;
            }
            gst::element_imp_error!(
                self,
                gst::ResourceError::Write,
                ["cannot publish a frame: {e}"]
            );
            gst::FlowError::Error
        }

        /// After `unlock` (a pause or a flush), waits as a base sink must: until playing again
        /// (then the wait goes on), or the flush (then `Flushing` ends the render).
        fn wait_if_unlocked(&self) -> Result<(), gst::FlowError> {
            if self.flushing.load(Ordering::Relaxed) {
                self.obj().wait_preroll()?;
            }
            Ok(())
        }

        /// Lets go of the upstream buffers kept for copies that have run: all of them once the
        /// producer's stream is idle (checked before the next frame's copy is queued).
        fn let_go_of_copied(&self, state: &mut State) -> Result<(), gst::FlowError> {
            if let Some(stream) = state.lender.lock().stream() {
                if !state.in_flight.is_empty() && stream.is_idle().map_err(|e| self.refuse(&e))? {
                    state.in_flight.clear();
                }
            }
            Ok(())
        }

        /// Keeps an upstream buffer until the producer's stream has copied out of it, waiting
        /// for the stream when too many are kept.
        fn keep_until_copied(
            &self,
            state: &mut State,
            buffer: gst::Buffer,
        ) -> Result<(), gst::FlowError> {
            let tx = state.lender.lock();
            let Some(stream) = tx.stream() else { return Ok(()) };
            state.in_flight.push_back(buffer);
            if state.in_flight.len() > MAX_IN_FLIGHT {
                stream.synchronize().map_err(|e| self.refuse(&e))?;
                state.in_flight.clear();
            }
            Ok(())
        }
    }
}

/// The one memory of `buffer` (its `GstMemory` address) if the render's reference is the only
/// one to the buffer and to that memory, which is no share of another: only then is a pool
/// buffer published in place. Another holder (a tee's other branch, an element that kept the
/// memory or a bigger share of it) could write it after the ring took it, or keep it for ever.
/// Checked before the buffer is mapped (a map takes a reference to the memory).
fn sole_holder(buffer: &gst::Buffer) -> Option<usize> {
    if buffer.n_memory() != 1 || !buffer.is_writable() {
        return None;
    }
    let mem = buffer.peek_memory(0).as_ptr();
    // SAFETY: `mem` is a memory the buffer holds, alive as long as `buffer`; its reference
    // count is only ever changed atomically, so it is read as an atomic; `parent` is set when
    // the memory is made and never changes.
    let (refs, parent, writable) = unsafe {
        let refcount = &(*mem).mini_object.refcount as *const i32 as *const AtomicI32;
        let writable = gst::ffi::gst_mini_object_is_writable(mem as *const gst::ffi::GstMiniObject);
        // Acquire: a holder whose unref we see is done with the memory before we publish it.
        ((*refcount).load(Ordering::Acquire), (*mem).parent, writable != 0)
    };
    (refs == 1 && parent.is_null() && writable).then_some(mem as usize)
}

impl State {
    fn consumer_count(&self) -> usize {
        self.lender.lock().consumer_count()
    }
}
