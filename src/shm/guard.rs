//! The SIGBUS guard: a process whose segment file is truncated under its mapping gets errors,
//! not a crash.
//!
//! Touching a page of a shared mapping that lies past the end of its file raises SIGBUS, which
//! kills the process by default. Every mapped segment registers its address range here. On
//! SIGBUS inside a registered range, the handler maps a private zero page over the faulting
//! page (`mmap(MAP_FIXED)`, async-signal-safe), marks the range faulted and returns, so the
//! access is retried and reads zeros. The ring's checks turn zeros into errors, and the
//! consumer and producer report `Corruption::Truncated` once they see the mark.
//!
//! Only a fault the kernel raised for an access past the end of the file is taken: `si_code`
//! `BUS_ADRERR`. Any other SIGBUS (misaligned access `BUS_ADRALN`, `BUS_OBJERR`, a hardware
//! memory error `BUS_MCEERR_AR`/`AO`, or one sent with `kill`/`sigqueue`, whose "address" is
//! really a pid and uid) and any SIGBUS outside the registered ranges goes to the previous
//! handler, or gets the default action (the process dies) as if the guard were not there.
//!
//! A range is unregistered before it is unmapped (see `Segment`'s field order): once unmapped,
//! its addresses may be given to another mapping, whose faults are not ours to swallow.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Segments that can be registered at once (more are simply not guarded).
const SLOTS: usize = 256;

/// `Range::start` of a slot being filled in by [`Guard::register`].
const CLAIMED: usize = usize::MAX;

struct Range {
    /// Start address; 0 while the slot is free, [`CLAIMED`] while it is being filled in. Any
    /// other value: `start..start + len` is mapped by the registering segment, which
    /// unregisters before it unmaps.
    start: AtomicUsize,
    /// Length in bytes; written before `start` is published.
    len: AtomicUsize,
    /// Set by the handler once it has mapped a zero page in the range.
    faulted: AtomicBool,
}

static RANGES: [Range; SLOTS] = [const {
    Range { start: AtomicUsize::new(0), len: AtomicUsize::new(0), faulted: AtomicBool::new(false) }
}; SLOTS];

/// The SIGBUS action before ours, to pass foreign faults on to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered range; unregisters on drop.
#[derive(Debug)]
pub struct Guard {
    /// `Some(i)`: `RANGES[i]` holds this guard's range until it drops. `None`: nothing is
    /// guarded (all slots taken, or no file backs the memory).
    slot: Option<usize>,
}

impl Guard {
    /// A guard that guards nothing (for memory that no file backs).
    pub fn none() -> Guard {
        Guard { slot: None }
    }

    /// Registers `len` bytes at `start`. Installs the handler the first time.
    ///
    /// # Safety
    ///
    /// `start..start + len` must be a shared file mapping of the caller's that stays mapped
    /// until the returned guard is dropped: on a SIGBUS past the end of the file there, the
    /// handler maps a zero page over the faulting page.
    pub unsafe fn register(start: *mut u8, len: usize) -> Guard {
        install();
        let start = start as usize;
        debug_assert!(start != 0 && start != CLAIMED && start.checked_add(len).is_some());
        for (i, r) in RANGES.iter().enumerate() {
            // Relaxed: claiming the slot publishes nothing; the CAS keeps two registrations
            // from filling in one slot.
            if r.start.compare_exchange(0, CLAIMED, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                continue;
            }
            r.len.store(len, Ordering::Relaxed);
            r.faulted.store(false, Ordering::Relaxed);
            // Release: a handler that Acquire-loads `start` sees `len` and `faulted`.
            r.start.store(start, Ordering::Release);
            return Guard { slot: Some(i) };
        }
        Guard { slot: None }
    }

    /// Whether a fault past the end of the file was caught in this range.
    pub fn faulted(&self) -> bool {
        // Acquire: pairs with the handler's Release store.
        self.slot.is_some_and(|i| RANGES[i].faulted.load(Ordering::Acquire))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            // Relaxed: our own slot, filled in by `register` before this guard existed.
            #[cfg(test)]
            let (start, len) =
                (RANGES[i].start.load(Ordering::Relaxed), RANGES[i].len.load(Ordering::Relaxed));
            // Release: the slot may be reused after this.
            RANGES[i].start.store(0, Ordering::Release);
            #[cfg(test)]
            test_hooks::unregistered(start, len);
        }
    }
}

fn install() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: zeroed sigaction structs are valid; `handler` has the SA_SIGINFO signature;
        // sigaction is called with valid pointers.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &action, &mut previous);
            previous
        }
    });
}

/// Whether the kernel raises SIGBUS with this `si_code` for the access of an instruction, which
/// raises it again if the handler returns without changing anything.
fn refaults(code: libc::c_int) -> bool {
    matches!(code, libc::BUS_ADRALN | libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR)
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let code = unsafe { (*info).si_code };
    // Only an access past the end of a file is ours: for other codes (and for signals sent by
    // a process, code <= 0) `si_addr` is no fault address, or the fault is no truncation.
    if code == libc::BUS_ADRERR {
        // SAFETY: as above; for BUS_ADRERR the kernel filled in si_addr.
        let addr = unsafe { (*info).si_addr() } as usize;
        if take(addr) {
            return;
        }
    }
    // Not ours: hand it to the previous action, or take the default one as if we were not here.
    match PREVIOUS.get() {
        Some(prev) if prev.sa_flags & libc::SA_SIGINFO != 0 && prev.sa_sigaction > 1 => {
            // SAFETY: a previous SA_SIGINFO handler has this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(prev) if prev.sa_sigaction > 1 => {
            // SAFETY: a previous plain handler has this signature.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig);
        }
        // Ignored before us: a sent or asynchronous SIGBUS stays ignored. (The kernel does not
        // let a fault be ignored: it resets the action to the default, as below.)
        Some(prev) if prev.sa_sigaction == libc::SIG_IGN && !refaults(code) => {}
        _ => {
            // SAFETY: sigaction with a zeroed (SIG_DFL) action and valid pointers; raise is
            // async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                // A fault repeats when we return and then kills the process with its own
                // siginfo. A sent or asynchronous one would not come back: raise it again.
                if !refaults(code) {
                    libc::raise(sig);
                }
            }
        }
    }
}

/// Maps a zero page over `addr` if it lies in a registered range, and marks the range
/// faulted. Returns whether it did.
fn take(addr: usize) -> bool {
    for r in RANGES.iter() {
        // Acquire: pairs with `register`'s Release store.
        let start = r.start.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Relaxed);
        if start == 0 || start == CLAIMED || addr.wrapping_sub(start) >= len {
            continue;
        }
        let page = addr & !(4096 - 1);
        // SAFETY: the page lies inside a live mapping of ours (registered, and unregistered
        // before it is unmapped); replacing it with a private zero page is what the module
        // docs describe. mmap is async-signal-safe.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // Release: the reader of `faulted` sees the zero page in place.
            r.faulted.store(true, Ordering::Release);
            return true;
        }
    }
    false
}

/// Whether `addr` lies in a registered range.
#[cfg(test)]
pub fn registered(addr: usize) -> bool {
    RANGES.iter().any(|r| {
        // Acquire: pairs with `register`'s Release store.
        let start = r.start.load(Ordering::Acquire);
        start != 0 && start != CLAIMED && addr.wrapping_sub(start) < r.len.load(Ordering::Relaxed)
    })
}

/// What a test can observe of an unregistration.
#[cfg(test)]
pub mod test_hooks {
    use std::cell::Cell;

    /// What [`last_unregistered`] returns.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Unregistered {
        /// The range's start.
        pub start: usize,
        /// Whether the range was still mapped just after it was unregistered.
        pub mapped: bool,
        /// Whether its start was still in a registered range then.
        pub registered: bool,
    }

    thread_local! {
        static LAST: Cell<Option<Unregistered>> = const { Cell::new(None) };
    }

    /// Records what [`last_unregistered`] returns, just after `start..start + len` was
    /// unregistered. While the range is still mapped, nobody else can register its addresses,
    /// so `registered` is exact then.
    pub(super) fn unregistered(start: usize, len: usize) {
        // SAFETY: msync only inspects the address range; ENOMEM means part of it is unmapped.
        let mapped = unsafe { libc::msync(start as *mut libc::c_void, len, libc::MS_ASYNC) } == 0;
        let registered = super::registered(start);
        LAST.with(|l| l.set(Some(Unregistered { start, mapped, registered })));
    }

    /// The last range this thread unregistered.
    pub fn last_unregistered() -> Option<Unregistered> {
        LAST.with(|l| l.get())
    }
}
