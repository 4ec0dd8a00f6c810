//! GStreamer elements for gpuring rings: `gpuringsink` publishes video frames into a ring,
//! `gpuringsrc` receives them in another process. Both work in system memory (a host ring)
//! and, where GStreamer's CUDA library is installed, in CUDA memory (a CUDA ring). See
//! docs/gstreamer.md in the repository.
//!
//! The plugin loads as `libgstgpuring.so` from `GST_PLUGIN_PATH`; applications that link this
//! crate can register it without a file instead:
//!
//! ```no_run
//! gst::init()?;
//! gstgpuring::plugin_register_static()?;
//! let pipeline = gst::parse::launch("videotestsrc ! gpuringsink ring=cam0")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use gst::glib;

mod cudamem;
pub mod header;
mod held;
mod lost;
pub mod planes;
mod pool;
pub mod sink;
pub mod source;

pub use lost::{exit_status, CONTEXT_LOST};

/// `gpuringsink`'s `memory` property.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    /// A CUDA ring for CUDA-memory input, a host ring otherwise.
    Auto,
    Cuda,
    Host,
}

impl Memory {
    fn name(self) -> &'static str {
        match self {
            Memory::Auto => "auto",
            Memory::Cuda => "cuda",
            Memory::Host => "host",
        }
    }

    fn from_name(name: &str) -> Option<Memory> {
        [Memory::Auto, Memory::Cuda, Memory::Host].into_iter().find(|m| m.name() == name)
    }
}

/// Raw video in any format, in system memory and (where GStreamer's CUDA library is
/// installed) in CUDA memory.
fn video_caps() -> gst::Caps {
    let mut caps = gst_video::VideoCapsBuilder::new().build();
    if cudamem::get().is_some() {
        let cuda = gst_video::VideoCapsBuilder::new().features([cudamem::CAPS_FEATURE]).build();
        caps.merge(cuda);
    }
    caps
}

/// The one always-present pad of an element, for [`video_caps`].
fn video_pad_template(name: &str, direction: gst::PadDirection) -> gst::PadTemplate {
    gst::PadTemplate::new(name, direction, gst::PadPresence::Always, &video_caps())
        .expect("valid template")
}

fn plugin_init(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    sink::register(plugin)?;
    source::register(plugin)?;
    Ok(())
}

gst::plugin_define!(
    gpuring,
    env!("CARGO_PKG_DESCRIPTION"),
    plugin_init,
    env!("CARGO_PKG_VERSION"),
    "MIT/X11",
    env!("CARGO_PKG_NAME"),
    env!("CARGO_PKG_NAME"),
    "https://github.com/gpuring/gpuring"
);
