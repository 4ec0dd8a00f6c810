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
//!
//! The table of ranges grows with the number of segments mapped at once, without bound: a
//! fixed table once left every segment past its 256th unguarded, so truncating it killed the
//! process. It is a list of chunks of [`CHUNK`] slots. The first chunk is a static; the others
//! are allocated by [`Guard::register`] when every slot is taken, linked in with a CAS on the
//! last chunk's `next`, and never freed (a slot is reused once its segment drops, so the table
//! is as long as the most segments ever mapped at once). The handler only walks it with atomic
//! loads: it allocates nothing, takes no lock, and a chunk it has reached is never freed under
//! it.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Slots per chunk of the table.
const CHUNK: usize = 256;

/// `Range::start` of a slot being filled in by [`Guard::register`].
const CLAIMED: usize = usize::MAX;

#[derive(Debug)]
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

impl Range {
    /// A free slot.
    const fn free() -> Range {
        Range {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }
}

/// A piece of the table.
struct Chunk {
    slots: [Range; CHUNK],
    /// The next chunk: null until one is linked in, then that chunk for ever (it is leaked,
    /// never freed, never replaced).
    next: AtomicPtr<Chunk>,
}

/// The first chunk; the rest hang off its `next`.
static TABLE: Chunk =
    Chunk { slots: [const { Range::free() }; CHUNK], next: AtomicPtr::new(std::ptr::null_mut()) };

/// The chunk after `chunk`, if one is linked in.
fn next(chunk: &Chunk) -> Option<&'static Chunk> {
    // Acquire: pairs with the Release CAS in `grow`, so the chunk's slots are seen initialised
    // (all free) or as filled in since.
    let p = chunk.next.load(Ordering::Acquire);
    // SAFETY: a non-null `next` points to a chunk leaked by `grow`: valid and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Every slot of the table, in order. Only atomic loads: safe in the signal handler.
fn slots() -> impl Iterator<Item = &'static Range> {
    std::iter::successors(Some(&TABLE), |c| next(c)).flat_map(|c| c.slots.iter())
}

/// Links a new chunk after `last` (whose `next` was seen null), unless another thread just did.
/// Allocates: never called from the handler.
fn grow(last: &'static Chunk) {
    let new = Box::into_raw(Box::new(Chunk {
        slots: [const { Range::free() }; CHUNK],
        next: AtomicPtr::new(std::ptr::null_mut()),
    }));
    // Release on success: whoever Acquire-loads `next` (`next()`) sees the chunk initialised.
    // Relaxed on failure: we only drop our chunk then, and the walk that follows loads the
    // winner's with Acquire.
    let linked =
        last.next.compare_exchange(std::ptr::null_mut(), new, Ordering::Release, Ordering::Relaxed);
    if linked.is_err() {
        // SAFETY: `new` came from `Box::into_raw` above and was never published.
        drop(unsafe { Box::from_raw(new) });
    }
}

/// The SIGBUS action before ours, to pass foreign faults on to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered range; unregisters on drop.
#[derive(Debug)]
pub struct Guard {
    /// `Some(r)`: the table slot that holds this guard's range until it drops. `None`: nothing
    /// is guarded (no file backs the memory).
    slot: Option<&'static Range>,
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
        let mut chunk: &'static Chunk = &TABLE;
        loop {
            for r in chunk.slots.iter() {
                // Relaxed: claiming the slot publishes nothing; the CAS keeps two registrations
                // from filling in one slot.
                if r.start
                    .compare_exchange(0, CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                r.len.store(len, Ordering::Relaxed);
                r.faulted.store(false, Ordering::Relaxed);
                // Release: a handler that Acquire-loads `start` sees `len` and `faulted`.
                r.start.store(start, Ordering::Release);
                return Guard { slot: Some(r) };
            }
            chunk = match next(chunk) {
                Some(c) => c,
                None => {
                    // Every slot is taken: add a chunk (or find the one another thread added).
                    grow(chunk);
                    next(chunk).expect("a chunk was just linked in")
                }
            };
        }
    }

    /// Whether a fault past the end of the file was caught in this range.
    pub fn faulted(&self) -> bool {
        // Acquire: pairs with the handler's Release store.
        self.slot.is_some_and(|r| r.faulted.load(Ordering::Acquire))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(r) = self.slot {
            // Relaxed: our own slot, filled in by `register` before this guard existed.
            #[cfg(test)]
            let (start, len) = (r.start.load(Ordering::Relaxed), r.len.load(Ordering::Relaxed));
            // Release: the slot may be reused after this.
            r.start.store(0, Ordering::Release);
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
    for r in slots() {
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
    slots().any(|r| {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// More segments than one chunk holds, registered from several threads at once, are all
    /// guarded, and all unregistered when they drop. (The table used to be one fixed array of
    /// 256 slots: a registration past it guarded nothing.)
    #[test]
    fn the_table_grows_past_one_chunk() {
        const THREADS: usize = 4;
        const EACH: usize = CHUNK * 3 / 4;
        let fd = rustix::fs::memfd_create("guard-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let ranges = std::thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        (0..EACH)
                            .map(|_| {
                                let map = memmap2::MmapOptions::new().len(4096).map_raw(&fd);
                                let map = map.unwrap();
                                // SAFETY: a shared mapping of the memfd, which is never
                                // truncated; the guard drops before the map below.
                                let guard = unsafe { Guard::register(map.as_mut_ptr(), 4096) };
                                (guard, map)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect::<Vec<_>>()
        });
        assert_eq!(ranges.len(), THREADS * EACH);
        for (guard, map) in &ranges {
            let base = map.as_mut_ptr() as usize;
            assert!(guard.slot.is_some(), "the range at {base:#x} got no slot");
            assert!(registered(base) && registered(base + 4095), "{base:#x} is not guarded");
            assert!(!guard.faulted());
        }
        for (guard, map) in ranges {
            let base = map.as_mut_ptr() as usize;
            drop(guard);
            // Still mapped, so nobody else can have registered these addresses.
            assert!(!registered(base), "{base:#x} is still registered after its guard dropped");
            drop(map);
        }
    }
}
