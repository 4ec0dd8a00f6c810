//! A lost GPU context (gpuring's `ContextLost`): a kernel of this process faulted, or, under
//! MPS, another client of the GPU crashed, and no GPU work can run in the process any more.
//! When a gpuring call of either element fails so, the element posts one error that says it,
//! with a details structure applications can tell it by, and returns a flow error: the
//! pipeline stops, and the application exits with [`gpuring::EXIT_CONTEXT_LOST`] (75) for its
//! supervisor to restart it (docs/gstreamer.md, "When the GPU context is lost").

use std::fmt::Display;

/// The name of the details structure of the error a gpuring element posts when this
/// process's GPU context is lost. Its `exit-status` field (an `i32`) is the status the
/// process should exit with, [`gpuring::EXIT_CONTEXT_LOST`] (75, `EX_TEMPFAIL`); its `call` and
/// `error` fields name the driver call that saw the loss first and its error.
pub const CONTEXT_LOST: &str = "gpuring-context-lost";

/// The status to exit with after error message `e` from a pipeline: `Some(75)` if a gpuring
/// element posted it because this process's GPU context is lost, `None` for any other error.
///
/// ```no_run
/// use gst::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// gst::init()?;
/// gstgpuring::plugin_register_static()?;
/// let pipeline = gst::parse::launch("gpuringsrc ring=cam0 ! fakesink")?;
/// pipeline.set_state(gst::State::Playing)?;
/// let bus = pipeline.bus().expect("a pipeline has a bus");
/// for msg in bus.iter_timed(gst::ClockTime::NONE) {
///     match msg.view() {
///         gst::MessageView::Eos(_) => break,
///         gst::MessageView::Error(e) => {
///             eprintln!("{}: {:?}", e.error(), e.debug());
///             let _ = pipeline.set_state(gst::State::Null);
///             std::process::exit(gstgpuring::exit_status(e).unwrap_or(1));
///         }
///         _ => {}
///     }
/// }
/// pipeline.set_state(gst::State::Null)?;
/// # Ok(())
/// # }
/// ```
pub fn exit_status(e: &gst::message::Error) -> Option<i32> {
    let details = e.details()?;
    if details.name() != CONTEXT_LOST {
        return None;
    }
    details.get::<i32>("exit-status").ok()
}

/// If this process's GPU context is lost, posts the error that says so on `element` and
/// returns the flow error that stops the pipeline; `None` if it is not lost (the caller
/// reports `failure` its own way). `failure` is the error of the gpuring call that failed: its
/// message is the posted error's debug text.
///
/// Any failure counts once the context is lost, not only a `ContextLost` one: a CUDA call that
/// fails after the loss most likely failed because of it, under another error's name.
pub(crate) fn post_if_lost(
    element: &gst::Element,
    failure: &dyn Display,
) -> Option<gst::FlowError> {
    let lost = gpuring::context_lost()?;
    let (failure, loss) = (failure.to_string(), lost.to_string());
    let debug = if failure.contains(&loss) { failure } else { format!("{failure} ({loss})") };
    let details = gst::Structure::builder(CONTEXT_LOST)
        .field("exit-status", gpuring::EXIT_CONTEXT_LOST)
        .field("call", lost.call())
        .field("error", lost.error())
        .build();
    gst::element_error!(
        element,
        gst::ResourceError::Failed,
        ("the GPU context of this process is lost: the process must exit and be restarted"),
        ["{debug}"],
        details: details
    );
    Some(gst::FlowError::Error)
}
