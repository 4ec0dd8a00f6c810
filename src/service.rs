//! Running a producer or a consumer as a service: stopping on SIGTERM and SIGINT without
//! faulting anyone, and exiting with a status that tells a supervisor what happened.
//!
//! `docker stop`, Kubernetes and systemd stop a service with SIGTERM; its default action ends
//! the process at once, kernels still running. Under MPS that faults every other process on
//! the GPU (docs/gpu.md, "MPS or not"). A service stops gracefully instead:
//!
//! 1. [`Shutdown::install`] at start: SIGTERM and SIGINT only raise a flag;
//! 2. its loop waits in bounded steps (`recv_timeout`, `acquire_timeout`) and ends when
//!    [`Shutdown::requested`];
//! 3. its rings are dropped (a consumer's drop waits for the GPU's reads of what it held; a
//!    producer's closes the ring), then [`exit`] waits for the process's remaining GPU work and
//!    gives the exit status: 0, [`EXIT_CONTEXT_LOST`] (75) when the GPU context is lost (a
//!    supervisor restarts it: the MPS server takes no new client until every faulted one has
//!    exited), 1 for another error.
//!
//! ```no_run
//! use std::process::ExitCode;
//! use std::time::Duration;
//! use gpuring::{service::Shutdown, Consumer, RecvTimeoutError};
//!
//! fn run(stop: &Shutdown) -> Result<(), Box<dyn std::error::Error>> {
//!     let rx = Consumer::open("cam0")?;
//!     while !stop.requested() {
//!         match rx.recv_timeout(Duration::from_millis(100)) {
//!             Ok(frame) => { /* ... launch work on the frame ... */ }
//!             Err(RecvTimeoutError::Timeout) => {}
//!             Err(e) => return Err(e.into()), // a lost context too: exit 75
//!         }
//!     }
//!     Ok(()) // `rx` drops here, after the GPU is done with what it held
//! }
//!
//! fn main() -> ExitCode {
//!     let stop = Shutdown::install().expect("signal handlers");
//!     gpuring::service::exit("consumer", run(&stop))
//! }
//! ```
//!
//! [`EXIT_CONTEXT_LOST`]: crate::EXIT_CONTEXT_LOST

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Raised by the handler.
static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that raised it (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Relaxed: flags read by polling; nothing else is published through them. Atomic stores
    // are async-signal-safe.
    SIGNAL.store(signal, Ordering::Relaxed);
    STOP.store(true, Ordering::Relaxed);
}

/// SIGTERM and SIGINT, turned into a flag that a service's loop looks at between bounded
/// waits. One per process (the handlers are process-wide); installing it again returns the
/// same flag.
///
/// ```
/// let stop = gpuring::service::Shutdown::install()?;
/// assert!(!stop.requested());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Shutdown {
    _private: (),
}

impl Shutdown {
    /// Installs the handlers for SIGTERM and SIGINT, with `SA_RESTART` (gpuring's waits go on
    /// after the handler, until their own timeout, so loops wait with a timeout).
    ///
    /// ```
    /// let stop = gpuring::service::Shutdown::install()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn install() -> io::Result<Shutdown> {
        for signal in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: an all-zero `sigaction` is a valid value (no flags, an empty mask).
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: `action` is initialised, and its handler only stores to atomics, which
            // is async-signal-safe; the old action is not asked for (null).
            if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Shutdown { _private: () })
    }

    /// Whether SIGTERM or SIGINT came (or [`request`](Self::request) was called).
    ///
    /// ```
    /// let stop = gpuring::service::Shutdown::install()?;
    /// assert!(!stop.requested());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn requested(&self) -> bool {
        // Relaxed: see `on_signal`.
        STOP.load(Ordering::Relaxed)
    }

    /// The signal that asked for the stop (`libc::SIGTERM`, `libc::SIGINT`), if one did.
    ///
    /// ```
    /// let stop = gpuring::service::Shutdown::install()?;
    /// assert_eq!(stop.signal(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn signal(&self) -> Option<i32> {
        // Relaxed: see `on_signal`.
        Some(SIGNAL.load(Ordering::Relaxed)).filter(|&s| s != 0)
    }

    /// Asks for the stop from inside the program, as a signal would.
    ///
    /// ```
    /// let stop = gpuring::service::Shutdown::install()?;
    /// stop.request();
    /// assert!(stop.requested() && stop.signal().is_none());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn request(&self) {
        // Relaxed: see `on_signal`.
        STOP.store(true, Ordering::Relaxed);
    }

    /// The flag itself, for APIs that take one (`gpuring::bridge::export`).
    ///
    /// ```
    /// let stop = gpuring::service::Shutdown::install()?;
    /// assert!(!stop.flag().load(std::sync::atomic::Ordering::Relaxed));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn flag(&self) -> &'static AtomicBool {
        &STOP
    }
}

/// The last step of a service: waits for the GPU work this process queued (see
/// [`finish_gpu_work`](crate::cuda::finish_gpu_work); nothing to do without CUDA), prints an
/// error as `who: message` on stderr, and gives the exit status: success, 75
/// ([`EXIT_CONTEXT_LOST`](crate::EXIT_CONTEXT_LOST)) when this process's GPU context is lost,
/// 1 for another error. Drop the rings before calling it.
///
/// ```
/// use std::process::ExitCode;
/// let ok: Result<(), Box<dyn std::error::Error>> = Ok(());
/// assert_eq!(gpuring::service::exit("doc", ok), ExitCode::SUCCESS);
/// let failed: Result<(), Box<dyn std::error::Error>> = Err("bad input".into());
/// assert_eq!(gpuring::service::exit("doc", failed), ExitCode::from(1));
/// ```
pub fn exit<E: Into<Box<dyn std::error::Error>>>(who: &str, result: Result<(), E>) -> ExitCode {
    #[cfg(feature = "cuda")]
    if let Err(e) = crate::cuda::finish_gpu_work() {
        if crate::context_lost().is_none() {
            eprintln!("{who}: waiting for the GPU work before exit: {e}");
        }
    }
    match result {
        Ok(()) if crate::context_lost().is_none() => ExitCode::SUCCESS,
        Ok(()) => ExitCode::from(crate::EXIT_CONTEXT_LOST as u8),
        Err(e) => {
            let e = e.into();
            eprintln!("{who}: {e}");
            ExitCode::from(crate::exit_status(&*e) as u8)
        }
    }
}
