//! `gpuringsrc`: a consumer of a ring, as a live GStreamer source. Host-memory messages become
//! buffers over the slot itself (no copy), released when GStreamer frees them; CUDA messages
//! are copied on the GPU into GStreamer's CUDA memory (or to system memory if downstream wants
//! that), because GStreamer 1.22's CUDA library cannot wrap memory it did not allocate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use gpuring::any::AnyConsumer;
use gpuring::{Consumer, ConsumerBuilder, Mode, OpenErrorKind, RecvTimeoutError};
use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;
use gst_video::VideoInfo;

use crate::cudamem;
use crate::header::FrameHeader;
use crate::held::Shared;
use crate::planes::{Base, Layout};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new("gpuringsrc", gst::DebugColorFlags::empty(), Some("gpuring source"))
});

/// How long one wait lasts before the element looks at whether it is stopping.
const TICK: Duration = Duration::from_millis(20);
/// Host slots lent to GStreamer at once; beyond this, frames are copied out of the ring, so
/// that a downstream queue holding frames cannot hold the ring's buffers (and stall the
/// producer and every other consumer): at most 2, and at most half the ring's spares (with
/// fewer than 2 spares, every frame is copied).
fn max_lent(spares: u32) -> usize {
    (spares as usize / 2).min(2)
}

/// How often the producer's liveness is probed while a frame's GPU work is waited for.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How long a frame's GPU work may stay unfinished once its producer was found gone: work that
/// was about to complete when it died completes; after that, its GPU will never signal.
const DEAD_GRACE: Duration = Duration::from_secs(1);

/// Why a wait for GPU work ended before the work did.
#[derive(Debug, PartialEq, Eq)]
enum Unfinished<E> {
    /// The element is flushing (stopping, seeking).
    Flushing,
    /// The producer went away and the work did not finish within [`DEAD_GRACE`] (it waits on
    /// a fence the dead producer's GPU will never signal).
    ProducerGone,
    /// Polling the work failed.
    Failed(E),
}

/// Polls `idle` until the work is done, a little at a time; ends early when `flushing` says
/// so, or `grace` after `alive` (asked every [`LIVENESS_EVERY`]) first said the producer is
/// gone.
fn wait_done<E>(
    mut idle: impl FnMut() -> Result<bool, E>,
    mut alive: impl FnMut() -> bool,
    flushing: impl Fn() -> bool,
    grace: Duration,
) -> Result<(), Unfinished<E>> {
    let mut next_look = Instant::now();
    let mut gone_since: Option<Instant> = None;
    loop {
        match idle() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Unfinished::Failed(e)),
        }
        if flushing() {
            return Err(Unfinished::Flushing);
        }
        let now = Instant::now();
        if gone_since.is_none() && now >= next_look {
            next_look = now + LIVENESS_EVERY;
            if !alive() {
                gone_since = Some(now);
            }
        }
        if gone_since.is_some_and(|t| t.elapsed() >= grace) {
            return Err(Unfinished::ProducerGone);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const NO: fn() -> bool = || false;

    #[test]
    fn work_that_finishes_ends_the_wait() {
        let polls = Cell::new(0);
        let idle = || Ok::<_, ()>((polls.replace(polls.get() + 1)) >= 20);
        assert_eq!(wait_done(idle, || true, NO, DEAD_GRACE), Ok(()));
        assert_eq!(polls.get(), 21);
    }

    #[test]
    fn a_dead_producers_unfinished_work_is_given_up_after_the_grace() {
        let looks = Cell::new(0);
        let alive = || {
            looks.set(looks.get() + 1);
            looks.get() < 3 // found gone at the third look
        };
        let grace = Duration::from_millis(300);
        let t = Instant::now();
        let r = wait_done(|| Ok::<_, ()>(false), alive, NO, grace);
        assert_eq!(r, Err(Unfinished::ProducerGone));
        assert!(t.elapsed() >= 2 * LIVENESS_EVERY + grace, "{:?}", t.elapsed());
        assert_eq!(looks.get(), 3, "not asked again once gone");
    }

    #[test]
    fn a_live_producers_slow_work_is_waited_for_and_a_flush_or_error_ends_it() {
        let polls = Cell::new(0);
        let idle = || Ok::<_, ()>((polls.replace(polls.get() + 1)) >= 5_000);
        assert_eq!(wait_done(idle, || true, NO, Duration::ZERO), Ok(()));
        assert_eq!(
            wait_done(|| Ok::<_, ()>(false), || true, || true, DEAD_GRACE),
            Err(Unfinished::Flushing)
        );
        assert_eq!(
            wait_done(|| Err::<bool, _>(7), || true, NO, DEAD_GRACE),
            Err(Unfinished::Failed(7))
        );
    }
}

glib::wrapper! {
    /// The `gpuringsrc` element.
    pub struct RingSrc(ObjectSubclass<imp::RingSrc>) @extends gst_base::PushSrc, gst_base::BaseSrc, gst::Element, gst::Object;
}

/// Registers `gpuringsrc` with `plugin`.
pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(Some(plugin), "gpuringsrc", gst::Rank::NONE, RingSrc::static_type())
}

/// The properties.
#[derive(Clone, Debug)]
struct Settings {
    ring: Option<String>,
    /// The ring directory; empty: the library's default (`GPURING_DIR`, else /dev/shm).
    dir: String,
    /// None: the ring's policy decides (lossless on a block ring, queue on an overwrite ring).
    mode: Option<Mode>,
    /// -1: the ring's own GPU.
    device: i32,
    wait: bool,
    reconnect: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ring: None,
            dir: String::new(),
            mode: None,
            device: -1,
            wait: true,
            reconnect: false,
        }
    }
}

/// What the source pushes, for the current caps.
struct Output {
    header: FrameHeader,
    info: VideoInfo,
    /// CUDA memory (a CUDA ring, and downstream takes it).
    cuda: Option<gst::BufferPool>,
    /// Downstream reads `GstVideoMeta`, so frames keep the producer's strides.
    video_meta: bool,
}

struct State {
    /// The ring's consumer, in the memory kind the ring has. Host memory: slots stay held
    /// while GStreamer buffers wrap them. CUDA: each message is copied out and released at
    /// once.
    reader: Arc<Shared>,
    out: Option<Output>,
    /// Messages lost so far (sum of each message's lag).
    lost: u64,
}

mod imp {
    use super::*;

    #[derive(Default)]
    pub struct RingSrc {
        settings: Mutex<Settings>,
        state: Mutex<Option<State>>,
        /// The CUDA context shared with neighbours (CUDA output only).
        cuda_ctx: cudamem::Context,
        /// Set by `unlock`: waits give up. Relaxed: a hint polled every `TICK`.
        flushing: AtomicBool,
    }

    #[glib::object_subclass]
    impl ObjectSubclass for RingSrc {
        const NAME: &'static str = "GpuringSrc";
        type Type = super::RingSrc;
        type ParentType = gst_base::PushSrc;
    }

    impl ObjectImpl for RingSrc {
        fn constructed(&self) {
            self.parent_constructed();
            let obj = self.obj();
            obj.set_live(true);
            obj.set_format(gst::Format::Time);
        }

        fn properties() -> &'static [glib::ParamSpec] {
            static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
                vec![
                    glib::ParamSpecString::builder("ring")
                        .blurb("Name of the ring to read (DIR/gpuring.NAME, DIR the dir property)")
                        .build(),
                    glib::ParamSpecString::builder("dir")
                        .nick("Ring directory")
                        .blurb("Directory to find the ring in, the producer's as this process sees it; empty: $GPURING_DIR if set, else /dev/shm")
                        .default_value(Some(""))
                        .build(),
                    glib::ParamSpecString::builder("mode")
                        .blurb("lossless, queue or latest; default: the ring's policy decides")
                        .default_value(Some("default"))
                        .build(),
                    glib::ParamSpecInt::builder("device")
                        .blurb("CUDA device to read on (CUDA rings); -1: the ring's own")
                        .minimum(-1)
                        .default_value(-1)
                        .build(),
                    glib::ParamSpecBoolean::builder("wait")
                        .blurb("Wait for the ring to be created, rather than fail")
                        .default_value(true)
                        .build(),
                    glib::ParamSpecBoolean::builder("reconnect")
                        .blurb("When the producer goes away, wait for a new one instead of ending the stream")
                        .default_value(false)
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
                "mode" => {
                    let name: Option<String> = value.get().expect("type checked");
                    match name.as_deref() {
                        None | Some("default") => s.mode = None,
                        Some(n) => match Mode::from_name(n) {
                            Some(m) => s.mode = Some(m),
                            None => gst::error!(
                                CAT,
                                imp = self,
                                "mode must be lossless, queue, latest or default, not {n}"
                            ),
                        },
                    }
                }
                "device" => s.device = value.get().expect("type checked"),
                "wait" => s.wait = value.get().expect("type checked"),
                "reconnect" => s.reconnect = value.get().expect("type checked"),
                _ => unreachable!("no property {}", pspec.name()),
            }
        }

        fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
            let s = self.settings.lock().unwrap();
            match pspec.name() {
                "ring" => s.ring.to_value(),
                "dir" => s.dir.to_value(),
                "mode" => s.mode.map_or("default", |m| m.name()).to_value(),
                "device" => s.device.to_value(),
                "wait" => s.wait.to_value(),
                "reconnect" => s.reconnect.to_value(),
                _ => unreachable!("no property {}", pspec.name()),
            }
        }
    }

    impl GstObjectImpl for RingSrc {}

    impl ElementImpl for RingSrc {
        fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
            static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
                gst::subclass::ElementMetadata::new(
                    "gpuring source",
                    "Source/Video",
                    "Receives video frames from a gpuring ring written by another process, in host or CUDA memory",
                    "gpuring",
                )
            });
            Some(&*META)
        }

        fn pad_templates() -> &'static [gst::PadTemplate] {
            static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> =
                LazyLock::new(|| vec![crate::video_pad_template("src", gst::PadDirection::Src)]);
            TEMPLATES.as_ref()
        }

        fn set_context(&self, context: &gst::Context) {
            if let Some(lib) = cudamem::get() {
                let device = self.settings.lock().unwrap().device;
                lib.handle_set_context(self.obj().upcast_ref(), context, device, &self.cuda_ctx);
            }
            self.parent_set_context(context)
        }
    }

    impl BaseSrcImpl for RingSrc {
        fn start(&self) -> Result<(), gst::ErrorMessage> {
            if self.settings.lock().unwrap().ring.is_none() {
                return Err(gst::error_msg!(
                    gst::ResourceError::Settings,
                    ["the ring property is not set"]
                ));
            }
            Ok(())
        }

        fn stop(&self) -> Result<(), gst::ErrorMessage> {
            // Buffers still downstream keep their slots (and the consumer) alive until freed.
            *self.state.lock().unwrap() = None;
            Ok(())
        }

        fn negotiate(&self) -> Result<(), gst::LoggableError> {
            // The caps come with the first message (its frame header): `create` sets them.
            Ok(())
        }

        fn query(&self, query: &mut gst::QueryRef) -> bool {
            if let gst::QueryViewMut::Context(_) = query.view_mut() {
                if let Some(lib) = cudamem::get() {
                    if lib.handle_query(self.obj().upcast_ref(), query, &self.cuda_ctx) {
                        return true;
                    }
                }
            }
            BaseSrcImplExt::parent_query(self, query)
        }

        fn unlock(&self) -> Result<(), gst::ErrorMessage> {
            self.flushing.store(true, Ordering::Relaxed);
            Ok(())
        }

        fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
            self.flushing.store(false, Ordering::Relaxed);
            Ok(())
        }
    }

    impl PushSrcImpl for RingSrc {
        fn create(
            &self,
            _buffer: Option<&mut gst::BufferRef>,
        ) -> Result<CreateSuccess, gst::FlowError> {
            let mut guard = self.state.lock().unwrap();
            loop {
                if guard.is_none() {
                    let reader = self.open(None)?;
                    *guard = Some(State { reader, out: None, lost: 0 });
                }
                let state = guard.as_mut().expect("opened above");
                match self.receive(state) {
                    Ok(buffer) => return Ok(CreateSuccess::NewBuffer(buffer)),
                    Err(Ended::Flow(e)) => return Err(e),
                    Err(Ended::Disconnected) => {
                        // Leave the ring now (buffers still downstream keep their slots), so
                        // a closing producer is not kept waiting for us.
                        let epoch = state.reader.epoch();
                        // How the producer ended: closed, died, or lost its own GPU context (a
                        // loss of this process's fails the receive instead, and is no end).
                        let how = state.reader.consumer().ended();
                        let how =
                            how.map_or_else(|| "the producer is gone".into(), |e| e.to_string());
                        *guard = None;
                        let s = self.settings.lock().unwrap().clone();
                        if !s.reconnect {
                            gst::info!(
                                CAT,
                                imp = self,
                                "{how} and the ring is drained: end of stream"
                            );
                            return Err(gst::FlowError::Eos);
                        }
                        gst::info!(CAT, imp = self, "{how}: waiting for a new one");
                        let reader = self.open(Some(epoch))?;
                        *guard = Some(State { reader, out: None, lost: 0 });
                    }
                }
            }
        }
    }

    /// Why `receive` returned no buffer.
    enum Ended {
        Flow(gst::FlowError),
        /// The producer is gone and everything it published has been read.
        Disconnected,
    }

    impl From<gst::FlowError> for Ended {
        fn from(e: gst::FlowError) -> Ended {
            Ended::Flow(e)
        }
    }

    impl RingSrc {
        fn builder(&self, s: &Settings) -> ConsumerBuilder {
            let mut b = Consumer::builder(s.ring.as_deref().unwrap_or_default());
            if !s.dir.is_empty() {
                b = b.dir(&s.dir);
            }
            match s.mode {
                Some(m) => b.mode(m),
                None => b,
            }
        }

        /// Opens the ring (one of epoch other than `not_epoch`), in whichever memory it has,
        /// waiting for it while `wait` is set.
        fn open(&self, not_epoch: Option<u64>) -> Result<Arc<Shared>, gst::FlowError> {
            let s = self.settings.lock().unwrap().clone();
            let name = s.ring.clone().unwrap_or_default();
            loop {
                if self.flushing.load(Ordering::Relaxed) {
                    return Err(gst::FlowError::Flushing);
                }
                let b = self.builder(&s);
                // The device is read by CUDA rings only.
                let b = if s.device >= 0 { b.device(s.device) } else { b };
                let opened = AnyConsumer::open_when_ready(b, not_epoch, TICK).map(Shared::new);
                match opened {
                    Ok(reader) => {
                        gst::info!(
                            CAT,
                            imp = self,
                            "joined ring {name} (epoch {})",
                            reader.epoch()
                        );
                        return Ok(reader);
                    }
                    // Not there (yet), or a new producer is still setting it up.
                    Err(e)
                        if matches!(
                            e.kind(),
                            OpenErrorKind::Disconnected
                                | OpenErrorKind::NotFound
                                | OpenErrorKind::TimedOut
                        ) && (s.wait || not_epoch.is_some()) => {}
                    // A lost GPU context is no ring to wait for: this process must exit.
                    Err(e) => {
                        if let Some(lost) = crate::lost::post_if_lost(self.obj().upcast_ref(), &e) {
                            return Err(lost);
                        }
                        gst::element_imp_error!(self, gst::ResourceError::OpenRead, ["{e}"]);
                        return Err(gst::FlowError::Error);
                    }
                }
            }
        }

        /// Receives the next message and turns it into a buffer.
        fn receive(&self, state: &mut State) -> Result<gst::Buffer, Ended> {
            let State { reader, out, lost } = state;
            let rx = reader.consumer();
            match rx.context() {
                None => {
                    let shared = reader.clone();
                    let got = self.next(|| shared.recv(TICK))?;
                    let header = self.frame_header(got.header())?;
                    self.lost(lost, got.seq(), got.lag());
                    let out = self.output(out, &header, None)?;
                    let layout = Layout::of_header(&out.info, &header, got.as_ref().len())
                        .map_err(|e| self.fail(&format!("message {}: {e}", got.seq())))?;
                    let packed = Layout::of_info(&out.info);
                    let mut buffer = if !out.video_meta && layout != packed {
                        // Downstream cannot read the producer's strides: repack on the CPU.
                        let mut frame = vec![0u8; out.info.size()];
                        layout
                            .copy_cpu(got.as_ref(), &packed, &mut frame)
                            .ok_or(gst::FlowError::Error)?;
                        gst::Buffer::from_mut_slice(frame)
                    } else if shared.lent() > max_lent(shared.spares()) {
                        // Downstream holds many frames (a queue, an unpulled appsink): copy,
                        // so the ring's buffers stay free for the producer.
                        let copy = got.as_ref().to_vec();
                        drop(got);
                        self.wrap(copy, &out.info, &layout)?
                    } else {
                        self.wrap(got, &out.info, &layout)?
                    };
                    stamp(buffer.get_mut().expect("ours"), &header);
                    Ok(buffer)
                }
                Some(ctx) => {
                    let slot = self.next(|| rx.recv_timeout(TICK))?;
                    let header = self.frame_header(slot.header())?;
                    let (seq, lag) = (slot.seq(), slot.lag());
                    let ctx = ctx.clone();
                    let info = self.peek_info(&header)?;
                    let src = Layout::of_header(&info, &header, slot.len())
                        .map_err(|e| self.fail(&format!("message {seq}: {e}")))?;
                    let out = self.output(out, &header, Some(ctx.ordinal()))?;
                    let stream = slot.stream().expect("a CUDA message has a stream");
                    let _bound = ctx.bind().map_err(|e| self.fail(&e))?;
                    let mut buffer = match &out.cuda {
                        Some(pool) => {
                            let mut buffer = pool.acquire_buffer(None)?;
                            let b = buffer.get_mut().expect("a pool buffer is ours");
                            let meta =
                                b.meta::<gst_video::VideoMeta>().ok_or(gst::FlowError::Error)?;
                            let dst = Layout::new(&out.info, meta.offset(), meta.stride());
                            let lib = cudamem::get().expect("CUDA output needs the library");
                            let dst_ctx = lib.handle(&self.cuda_ctx);
                            let mem = b.peek_memory(0);
                            let (ptr, info) =
                                cudamem::map_write(mem).ok_or(gst::FlowError::Error)?;
                            // SAFETY: `src` was checked against the slot's length, which stays
                            // held until released below, after the stream has run the copy;
                            // the pool memory holds `dst`'s layout (its own video meta) and is
                            // mapped until `unmap_write`; the stream is the slot's, in our
                            // current context.
                            let copied = unsafe {
                                src.copy_cuda(
                                    Base::Device(slot.ptr(), ctx.raw()),
                                    &dst,
                                    Base::Device(ptr, dst_ctx.cast()),
                                    stream.raw(),
                                )
                            };
                            let done = copied
                                .map_err(|e| Ended::from(self.fail(&e)))
                                .and_then(|()| self.wait_idle(rx, stream));
                            cudamem::unmap_write(mem, info);
                            done?;
                            buffer
                        }
                        None => {
                            // Wait for the frame on the stream first (interruptibly): a copy
                            // into pageable memory would block in the driver until then.
                            self.wait_idle(rx, stream)?;
                            let dst = Layout::of_info(&out.info);
                            let mut frame = vec![0u8; out.info.size()];
                            // SAFETY: as above, into a host buffer of the format's own layout,
                            // alive until the stream has run the copy (`wait_idle`).
                            let copied = unsafe {
                                src.copy_cuda(
                                    Base::Device(slot.ptr(), ctx.raw()),
                                    &dst,
                                    Base::Host(frame.as_mut_ptr()),
                                    stream.raw(),
                                )
                            };
                            copied.map_err(|e| self.fail(&e))?;
                            self.wait_idle(rx, stream)?;
                            gst::Buffer::from_mut_slice(frame)
                        }
                    };
                    slot.release().map_err(|e| self.fail(&e))?;
                    self.lost(lost, seq, lag);
                    stamp(buffer.get_mut().expect("ours"), &header);
                    Ok(buffer)
                }
            }
        }

        /// The next message from `recv` (one bounded wait per call), looking between waits at
        /// whether the element is stopping.
        fn next<T>(
            &self,
            mut recv: impl FnMut() -> Result<T, RecvTimeoutError>,
        ) -> Result<T, Ended> {
            loop {
                if self.flushing.load(Ordering::Relaxed) {
                    return Err(gst::FlowError::Flushing.into());
                }
                match recv() {
                    Ok(got) => return Ok(got),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return Err(Ended::Disconnected),
                    Err(e) => return Err(self.fail(&e).into()),
                }
            }
        }

        /// Waits for `stream`'s copies on the CPU, a little at a time, so that neither a flush
        /// nor a producer killed before its GPU signalled the frame ready can hang the element:
        /// the latter ends the ring as `Disconnected` (a new producer is waited for, or the
        /// stream ends), [`DEAD_GRACE`] after `rx` finds its producer gone.
        fn wait_idle(&self, rx: &AnyConsumer, stream: &gpuring::cuda::Stream) -> Result<(), Ended> {
            // Relaxed: a hint polled each time round.
            let flushing = || self.flushing.load(Ordering::Relaxed);
            match wait_done(|| stream.is_idle(), || rx.producer_alive(), flushing, DEAD_GRACE) {
                Ok(()) => Ok(()),
                Err(Unfinished::Flushing) => Err(gst::FlowError::Flushing.into()),
                Err(Unfinished::ProducerGone) => {
                    gst::warning!(
                        CAT,
                        imp = self,
                        "the producer died before its GPU signalled the frame: leaving the ring"
                    );
                    Err(Ended::Disconnected)
                }
                Err(Unfinished::Failed(e)) => Err(self.fail(&e).into()),
            }
        }

        /// Posts a failure to read a message (a lost GPU context as such); the flow error to
        /// return.
        fn fail(&self, e: &dyn std::fmt::Display) -> gst::FlowError {
            if let Some(lost) = crate::lost::post_if_lost(self.obj().upcast_ref(), e) {
                return lost;
            }
            gst::element_imp_error!(self, gst::ResourceError::Read, ["{e}"]);
            gst::FlowError::Error
        }

        fn frame_header(&self, user_header: &[u8]) -> Result<FrameHeader, gst::FlowError> {
            FrameHeader::read(user_header).map_err(|e| {
                gst::element_imp_error!(self, gst::StreamError::Format, ["{e}"]);
                gst::FlowError::Error
            })
        }

        fn peek_info(&self, h: &FrameHeader) -> Result<VideoInfo, gst::FlowError> {
            video_info(h).ok_or_else(|| {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    ["unknown video format in the frame header: {h:?}"]
                );
                gst::FlowError::NotNegotiated
            })
        }

        /// Counts and reports messages lost before this one.
        fn lost(&self, total: &mut u64, seq: u64, lag: u64) {
            if lag == 0 {
                return;
            }
            *total += lag;
            gst::debug!(CAT, imp = self, "lost {lag} messages before {seq}");
            let s = gst::Structure::builder("gpuring-lag")
                .field("seq", seq)
                .field("lost", lag)
                .field("lost-total", *total)
                .build();
            let _ = self
                .obj()
                .post_message(gst::message::Element::builder(s).src(&*self.obj()).build());
        }

        /// The output for `header`'s format: unchanged, or new caps set downstream.
        fn output<'s>(
            &self,
            out: &'s mut Option<Output>,
            header: &FrameHeader,
            cuda_device: Option<i32>,
        ) -> Result<&'s Output, gst::FlowError> {
            let same = out.as_ref().is_some_and(|o| same_format(&o.header, header));
            if !same {
                *out = Some(self.negotiate_for(header, cuda_device)?);
            }
            Ok(out.as_ref().expect("set above"))
        }

        /// Sets caps for `header`'s format: CUDA memory where the ring is on GPU `cuda_device`
        /// and downstream takes it, else system memory.
        fn negotiate_for(
            &self,
            header: &FrameHeader,
            cuda_device: Option<i32>,
        ) -> Result<Output, gst::FlowError> {
            let info = self.peek_info(header)?;
            let system = info.to_caps().map_err(|_| gst::FlowError::NotNegotiated)?;
            let pad = self.obj().static_pad("src").expect("always");
            let lib = cudamem::get().filter(|_| cuda_device.is_some());
            let cuda_caps = lib.map(|_| {
                // A copy, not a clone: a clone shares (and so cannot change) the caps.
                let mut c = system.copy();
                c.get_mut()
                    .expect("a copy is ours")
                    .set_features_simple(Some(gst::CapsFeatures::new([cudamem::CAPS_FEATURE])));
                c
            });
            let wants = |caps: &gst::Caps| pad.peer_query_accept_caps(caps);
            let (caps, cuda) = match cuda_caps {
                Some(c) if wants(&c) => (c, true),
                _ if wants(&system) => (system, false),
                _ => {
                    gst::element_imp_error!(
                        self,
                        gst::CoreError::Negotiation,
                        ["downstream accepts neither {system} nor its CUDA memory form"]
                    );
                    return Err(gst::FlowError::NotNegotiated);
                }
            };
            self.obj().set_caps(&caps).map_err(|_| gst::FlowError::NotNegotiated)?;
            gst::info!(CAT, imp = self, "caps {caps}");
            let pool = match cuda_device {
                // The consumer's own GPU, so the copy into GStreamer's memory stays on it.
                Some(device) if cuda => Some(self.cuda_pool(&caps, &info, device)?),
                _ => None,
            };
            // Does downstream read video metas (frames at the producer's strides)?
            let mut q = gst::query::Allocation::new(Some(&caps), false);
            let video_meta = pad.peer_query(&mut q)
                && q.find_allocation_meta::<gst_video::VideoMeta>().is_some();
            Ok(Output { header: header.clone(), info, cuda: pool, video_meta })
        }

        /// A pool of GStreamer CUDA buffers for `caps`, in the context shared with neighbours.
        fn cuda_pool(
            &self,
            caps: &gst::Caps,
            info: &VideoInfo,
            device: i32,
        ) -> Result<gst::BufferPool, gst::FlowError> {
            let lib = cudamem::get().expect("CUDA caps come only with the library");
            // No lock is held here: finding the context calls back into `set_context`.
            let ctx = &self.cuda_ctx;
            if !ctx.is_set() && !lib.ensure_context(self.obj().upcast_ref(), device, ctx) {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::Failed,
                    ["no GStreamer CUDA context for device {device}"]
                );
                return Err(gst::FlowError::Error);
            }
            let pool = lib.pool(ctx).ok_or(gst::FlowError::Error)?;
            let mut config = pool.config();
            config.add_option(gst_video::BUFFER_POOL_OPTION_VIDEO_META);
            config.set_params(Some(caps), info.size() as u32, 0, 0);
            pool.set_config(config).map_err(|_| gst::FlowError::NotNegotiated)?;
            pool.set_active(true).map_err(|_| gst::FlowError::Error)?;
            Ok(pool)
        }

        /// A buffer over `bytes` (a held slot, or a copy of one), with the producer's plane
        /// layout (checked by `Layout::of_header`) as its video meta.
        fn wrap<T: AsRef<[u8]> + Send + 'static>(
            &self,
            bytes: T,
            info: &VideoInfo,
            layout: &Layout,
        ) -> Result<gst::Buffer, gst::FlowError> {
            let mut buffer = gst::Buffer::from_slice(bytes);
            let offsets: Vec<usize> = layout.planes.iter().map(|p| p.offset).collect();
            // Checked to fit an i32 by `Layout::of_header`.
            let strides: Vec<i32> = layout.planes.iter().map(|p| p.stride as i32).collect();
            gst_video::VideoMeta::add_full(
                buffer.get_mut().expect("new buffer"),
                gst_video::VideoFrameFlags::empty(),
                info.format(),
                info.width(),
                info.height(),
                &offsets,
                &strides,
            )
            .map_err(|_| gst::FlowError::Error)?;
            Ok(buffer)
        }
    }
}

/// Whether two headers describe the same caps (format, size, rate, aspect, colorimetry).
fn same_format(a: &FrameHeader, b: &FrameHeader) -> bool {
    (&a.format, a.width, a.height, a.fps, a.par, &a.colorimetry)
        == (&b.format, b.width, b.height, b.fps, b.par, &b.colorimetry)
}

/// The video info a frame header describes.
fn video_info(h: &FrameHeader) -> Option<VideoInfo> {
    let format = gst_video::VideoFormat::from_string(&h.format);
    if format == gst_video::VideoFormat::Unknown {
        return None;
    }
    let mut b = VideoInfo::builder(format, h.width, h.height)
        .fps(gst::Fraction::new(h.fps.0, h.fps.1.max(1)))
        .par(gst::Fraction::new(h.par.0.max(1), h.par.1.max(1)));
    let colorimetry = h.colorimetry.parse::<gst_video::VideoColorimetry>().ok();
    if let Some(c) = &colorimetry {
        b = b.colorimetry(c);
    }
    b.build().ok()
}

/// The producer's timestamps, offset and flags, on the buffer.
fn stamp(b: &mut gst::BufferRef, h: &FrameHeader) {
    b.set_pts(h.pts.map(gst::ClockTime::from_nseconds));
    b.set_dts(h.dts.map(gst::ClockTime::from_nseconds));
    b.set_duration(h.duration.map(gst::ClockTime::from_nseconds));
    if let Some(o) = h.offset {
        b.set_offset(o);
    }
    b.set_flags(gst::BufferFlags::from_bits_truncate(h.flags) - gst::BufferFlags::TAG_MEMORY);
}
