//! The SIGBUS guard: a process whose segment file is truncated under its mapping gets errors,
//! not a crash.
//!
//! Touching a page of a shared mapping that lies past the end of its file raises SIGBUS, which
//! kills the process by default. Every mapped segment registers its address range here. On
//! SIGBUS inside a registered range, the handler maps a private zero page over the faulting
//! page (`mmap(MAP_FIXED)`, async-signal-safe), marks the range faulted and returns, so the
//! access is retried and reads zeros. The ring's checks turn zeros into errors, and the
//! consumer and producer report `Corruption::Truncated` once they see the mark. A SIGBUS
//! anywhere else goes to the previous handler (by default: the process dies as before).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Segments that can be registered at once (more are simply not guarded).
const SLOTS: usize = 256;

struct Range {
    /// Start address; 0 while the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
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
    slot: Option<usize>,
}

impl Guard {
    /// A guard that guards nothing (for memory that no file backs).
    pub fn none() -> Guard {
        Guard { slot: None }
    }

    /// Registers `len` bytes at `start`. Installs the handler the first time.
    pub fn register(start: *mut u8, len: usize) -> Guard {
        install();
        for (i, r) in RANGES.iter().enumerate() {
            // Relaxed: `len` and `faulted` are set before `start` is published with Release.
            if r.start.load(Ordering::Relaxed) != 0 {
                continue;
            }
            r.len.store(len, Ordering::Relaxed);
            r.faulted.store(false, Ordering::Relaxed);
            // Release: a handler that Acquire-loads `start` sees `len`. The CAS keeps two
            // registrations from taking one slot.
            if r.start
                .compare_exchange(0, start as usize, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return Guard { slot: Some(i) };
            }
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
            // Release: the slot may be reused after this.
            RANGES[i].start.store(0, Ordering::Release);
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

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in RANGES.iter() {
        // Acquire: pairs with `register`'s Release store.
        let start = r.start.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Relaxed);
        if start == 0 || addr < start || addr >= start + len {
            continue;
        }
        let page = addr & !(4096 - 1);
        // SAFETY: the page lies inside a live mapping of ours (registered, not yet dropped);
        // replacing it with a private zero page is what the module docs describe. mmap is
        // async-signal-safe.
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
            return;
        }
    }
    // Not ours: hand it to the previous action, or die as SIGBUS would have killed us.
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
        _ => {
            // SAFETY: restoring the default action and returning re-executes the faulting
            // access, which then kills the process with SIGBUS as if we were not here.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}
