//! A lost GPU context: the one error every gpuring call of a process returns once its CUDA
//! context is gone for good (docs/gpu.md, "When the GPU context is lost").
//!
//! The driver layer remembers the first sticky error it saw (`cuda::driver::lost`); here that
//! becomes [`ContextLost`], and every operation of either memory kind checks it first, so a
//! process whose context is lost gets the same answer from every call, in any binding, and
//! exits (the MPS server takes no new client until every faulted one is gone).
//!
//! Feature `test-support` adds a hook that makes a process's context count as lost after a
//! number of operations ([`lose_context_after`], or `GPURING_TEST_LOSE_CONTEXT=N` in the
//! environment), so that the error's way through Rust, Python, C and GStreamer, and the exits
//! and restarts that follow, are tested on machines without a GPU.

use std::fmt;

/// The exit status with which gpuring's command and examples end, and which [`exit_status`]
/// gives (and the GStreamer elements' error carries), when the GPU context is lost:
/// `EX_TEMPFAIL` (75), "try again later", for a supervisor that restarts the process (systemd
/// `Restart=always`, Docker `restart: always`).
///
/// ```
/// assert_eq!(gpuring::EXIT_CONTEXT_LOST, 75);
/// ```
pub const EXIT_CONTEXT_LOST: i32 = 75;

/// This process's GPU context is lost for good: a kernel of it faulted (illegal address,
/// launch failure, hardware stack error, illegal instruction, misaligned address, invalid PC),
/// or its MPS server failed, which under MPS is what another client's crash does to every
/// client of the GPU. No CUDA work runs in the process any more: it must exit and be
/// restarted. Every operation's error has a `ContextLost` variant carrying one.
///
/// ```
/// use gpuring::{Consumer, ContextLost, RecvTimeoutError};
/// use std::time::Duration;
///
/// fn step(rx: &Consumer) -> Result<(), ContextLost> {
///     match rx.recv_timeout(Duration::from_millis(100)) {
///         Err(RecvTimeoutError::ContextLost(lost)) => Err(lost), // exit, and be restarted
///         _ => Ok(()),
///     }
/// }
/// # let _tx = gpuring::Producer::builder("doc-context-lost").create()?;
/// # step(&Consumer::open("doc-context-lost")?)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextLost {
    /// The driver call that failed first, or `"test hook"`.
    call: &'static str,
    /// Its error's name (`CUDA_ERROR_ILLEGAL_ADDRESS`...).
    error: String,
}

impl ContextLost {
    /// The driver call that first reported the loss (`"test hook"` for one made by the
    /// `test-support` hook).
    ///
    /// ```
    /// # #[cfg(feature = "cuda")] {
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    /// let e = DriverError { call: "cuStreamQuery", code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS };
    /// assert_eq!(gpuring::ContextLost::from(e).call(), "cuStreamQuery");
    /// # }
    /// ```
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The driver's name of the error (`CUDA_ERROR_ILLEGAL_ADDRESS`...).
    ///
    /// ```
    /// # #[cfg(feature = "cuda")] {
    /// use gpuring::cuda::driver::{CUresult, DriverError};
    /// let e = DriverError { call: "cuLaunchKernel", code: CUresult::CUDA_ERROR_LAUNCH_FAILED };
    /// assert_eq!(gpuring::ContextLost::from(e).error(), "CUDA_ERROR_LAUNCH_FAILED");
    /// # }
    /// ```
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl fmt::Display for ContextLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the GPU context of this process is lost ({} failed: {}): a kernel of this process \
             faulted, or, under MPS, another client of the GPU crashed; no GPU work can run in \
             this process any more: it must exit (status {EXIT_CONTEXT_LOST}) and be restarted",
            self.call, self.error
        )
    }
}

impl std::error::Error for ContextLost {}

#[cfg(all(feature = "cuda", not(loom)))]
impl From<crate::cuda::DriverError> for ContextLost {
    fn from(e: crate::cuda::DriverError) -> Self {
        ContextLost { call: e.call, error: e.name() }
    }
}

/// Whether this process's GPU context is lost, and how: once a sticky error was seen (or the
/// `test-support` hook fired), for good. Asks the driver too (at most once per
/// `cuda::PROBE_EVERY`, see `cuda::probe`), so a service's loop that may sit idle, making no
/// CUDA call, asks it once per iteration: under MPS a faulted process that lingers keeps every
/// other one from starting. gpuring's own waits ask it at each liveness tick.
///
/// ```
/// assert!(gpuring::context_lost().is_none());
/// ```
pub fn context_lost() -> Option<ContextLost> {
    #[cfg(feature = "test-support")]
    if let Some(l) = hook::fired() {
        return Some(l);
    }
    #[cfg(all(feature = "cuda", not(loom)))]
    if crate::cuda::probe().is_some() {
        return Some(from_driver());
    }
    None
}

/// `Ok` while this process's GPU context is not known to be lost; what every operation asks
/// first. A relaxed load when nothing was lost (and, with `test-support`, a hook's countdown).
#[inline]
#[cfg_attr(loom, allow(dead_code))] // its callers, the public ends, are not built under loom
pub(crate) fn check() -> Result<(), ContextLost> {
    #[cfg(feature = "test-support")]
    hook::step()?;
    #[cfg(all(feature = "cuda", not(loom)))]
    if crate::cuda::driver::lost().is_some() {
        return Err(from_driver());
    }
    Ok(())
}

/// The driver's loss as a [`ContextLost`], made once.
#[cfg(all(feature = "cuda", not(loom)))]
#[cold]
fn from_driver() -> ContextLost {
    static MADE: std::sync::OnceLock<ContextLost> = std::sync::OnceLock::new();
    MADE.get_or_init(|| crate::cuda::driver::lost().expect("lost").into()).clone()
}

/// `kind`, or [`ContextLost`] in its place if the context was lost meanwhile (the failure was
/// most likely the loss itself, seen by a driver call under another name).
#[cfg_attr(loom, allow(dead_code))] // as `check`
pub(crate) fn or_lost<E>(kind: E, lost: impl FnOnce(ContextLost) -> E) -> E {
    match context_lost() {
        None => kind,
        Some(l) => lost(l),
    }
}

/// Which error code (a C status, an exit status) an error maps to: whether `e`, or an error in
/// its `source` chain, is [`ContextLost`].
///
/// ```
/// let e: Box<dyn std::error::Error> = "unrelated".into();
/// assert!(!gpuring::is_context_lost(&*e));
/// ```
pub fn is_context_lost(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<ContextLost>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The exit status for a process that ends with error `e`: [`EXIT_CONTEXT_LOST`] if its GPU
/// context is lost (by `e`'s chain, or as this process knows), 1 otherwise.
///
/// ```
/// let e: Box<dyn std::error::Error> = "bad input".into();
/// assert_eq!(gpuring::exit_status(&*e), 1);
/// ```
pub fn exit_status(e: &(dyn std::error::Error + 'static)) -> i32 {
    if is_context_lost(e) || context_lost().is_some() {
        EXIT_CONTEXT_LOST
    } else {
        1
    }
}

/// The `test-support` hook: after `n` more operations pass, the context counts as lost.
#[cfg(feature = "test-support")]
mod hook {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::ContextLost;

    /// Operations left before the loss; `u64::MAX`: not armed. Read from
    /// `GPURING_TEST_LOSE_CONTEXT` at the first operation.
    static LEFT: AtomicU64 = AtomicU64::new(u64::MAX);
    /// Whether the environment was read.
    static FROM_ENV: OnceLock<()> = OnceLock::new();
    /// Set once the hook fired: the loss is for good, as a sticky error's.
    static FIRED: OnceLock<ContextLost> = OnceLock::new();

    /// The loss the hook made, if it fired (without counting a step): what a probe of the
    /// driver would find (`cuda::probe`).
    pub(super) fn fired() -> Option<ContextLost> {
        read_env();
        FIRED.get().cloned()
    }

    /// Armed with 0, the loss is there at once (a wait that makes no operation finds it).
    pub(super) fn arm(n: u64) {
        FROM_ENV.get_or_init(|| ());
        LEFT.store(n, Ordering::Relaxed);
        if n == 0 {
            fire();
        }
    }

    /// Arms the countdown from `GPURING_TEST_LOSE_CONTEXT`, once.
    fn read_env() {
        FROM_ENV.get_or_init(|| {
            if let Some(n) =
                std::env::var("GPURING_TEST_LOSE_CONTEXT").ok().and_then(|v| v.parse().ok())
            {
                LEFT.store(n, Ordering::Relaxed);
                if n == 0 {
                    fire();
                }
            }
        });
    }

    /// The loss, made once.
    fn fire() -> ContextLost {
        let lost = ContextLost {
            call: "test hook",
            error: "CUDA_ERROR_ILLEGAL_ADDRESS (GPURING_TEST_LOSE_CONTEXT)".into(),
        };
        FIRED.get_or_init(|| lost).clone()
    }

    #[inline]
    pub(super) fn step() -> Result<(), ContextLost> {
        read_env();
        if let Some(l) = FIRED.get() {
            return Err(l.clone());
        }
        // Relaxed: a countdown of this process's own calls; the call that finds it at zero
        // fires, and `FIRED` (a OnceLock) publishes the loss to every thread.
        let counted = LEFT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            (left != u64::MAX && left > 0).then(|| left - 1)
        });
        match counted {
            Ok(_) | Err(u64::MAX) => return Ok(()),
            Err(_) => {}
        }
        Err(fire())
    }
}

/// Feature `test-support`: after `n` more gpuring operations succeed (each step of one
/// counts: `send` is an acquire and a publish), this process's GPU
/// context counts as lost, as after a sticky CUDA error: every later operation returns
/// [`ContextLost`]. With `n` 0 the loss is there at once: [`context_lost`] (which gpuring's
/// waits ask at each liveness tick) reports it, as it reports a real loss that its probe of the
/// driver finds. `GPURING_TEST_LOSE_CONTEXT=N` in the environment does the same from the
/// process's start. For tests of what follows a loss, on machines without a GPU.
///
/// ```
/// # // The loss is for good in this process: a doctest runs in a process of its own.
/// let mut tx = gpuring::Producer::builder("doc-lose-context-after").create()?;
/// tx.send(b"passes", b"")?;
/// gpuring::lose_context_after(0);
/// assert!(matches!(tx.send(b"lost", b""), Err(gpuring::SendError::ContextLost(_))));
/// assert!(gpuring::context_lost().is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "test-support")]
pub fn lose_context_after(n: u64) {
    hook::arm(n);
}
