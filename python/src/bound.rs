//! Objects bound to the thread (and process) that made them.
//!
//! A consumer, the messages it holds and a producer belong to one thread: the objects count
//! references with `Rc`, and a producer is not `Sync`. The Python objects that hold them
//! wrap them in [`ThreadBound`]:
//!
//! - **used** on another thread they raise `RuntimeError`;
//! - **freed** on another thread (a tensor, array or slot dropped in a worker thread) the value
//!   is queued, untouched, and dropped on its own thread at that thread's next gpuring call
//!   ([`drain`]); while such frees happen, blocking calls wake every millisecond ([`tick`]) so
//!   the queue does not wait long;
//! - once their thread has **ended**, any thread may drop them, one at a time under a global
//!   lock (nothing can use them any more, so the lock is all that touches their counts);
//! - in a **forked child** they are never dropped nor used: the parent's consumer entries and
//!   ring belong to the parent. The child opens its own. Nor does the child drop what the
//!   parent's threads had queued for each other, and it starts with this module's locks free
//!   ([`register_fork_handlers`]).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

/// The longest a GIL-free wait lasts before signals (and queued drops) are checked.
const SLOW_TICK: Duration = Duration::from_millis(100);
/// The same while other threads free this thread's objects.
const FAST_TICK: Duration = Duration::from_millis(1);

/// Who may touch a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Owner {
    thread: ThreadId,
    pid: u32,
}

impl Owner {
    fn current() -> Owner {
        Owner { thread: std::thread::current().id(), pid: pid() }
    }
}

/// This process's id, remembered once the fork handlers are in place (0: not remembered).
/// `after_fork_in_child` forgets it, so a forked child asks again.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's id: a `getpid` system call the first time after start or fork, then a load.
/// Every slot and tensor asks, several times per message.
fn pid() -> u32 {
    // Relaxed (both): a plain cache of a value that only changes across fork(), whose child
    // handler clears it before the child returns from fork().
    match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            // Remembered only if the child handler will clear it: without the handlers a
            // forked child would take the parent's id for its own.
            if HANDLERS.get() == Some(&0) {
                PID.store(pid, Ordering::Relaxed);
            }
            pid
        }
        pid => pid,
    }
}

/// What `pthread_atfork` returned, once called (0: the handlers are registered).
static HANDLERS: OnceLock<c_int> = OnceLock::new();

/// A value to drop on another thread than the one that let go of it.
struct Owed(Box<dyn FnOnce()>);

// SAFETY: an `Owed` value is moved (never touched) by the thread that queues it, and run only
// by its owner thread (`drain`, `ExitGuard`) or, once that thread ended, under `DEAD_DROPS`.
unsafe impl Send for Owed {}

#[derive(Default)]
struct State {
    /// Values owed to live threads.
    owed: Vec<(ThreadId, Owed)>,
    /// Threads that ended after binding values.
    dead: Option<HashSet<ThreadId>>,
}

// Lock order: `DEAD_DROPS`, then `STATE` (a drop under `DEAD_DROPS` may queue more under
// `STATE`); never the other way round. `STATE` is held only to edit the queue and the set,
// never while dropping or calling out, so no thread (a forking one included) holds it while
// it runs anything else.
static STATE: Mutex<State> = Mutex::new(State { owed: Vec::new(), dead: None });
/// Serialises every drop of a value whose thread ended.
static DEAD_DROPS: Mutex<()> = Mutex::new(());

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// Registered by the first `ThreadBound` of a thread: its destructor runs at thread exit.
    static EXIT: ExitGuard = const { ExitGuard };
    /// Whether this thread holds `DEAD_DROPS` (a drop under it may drop more).
    static IN_DEAD_DROP: Cell<bool> = const { Cell::new(false) };
    /// When `drain` last found values that other threads freed.
    static FOREIGN_SEEN: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The locks `before_fork` took, until `after_fork_in_parent` or `after_fork_in_child`
    /// releases them. The three handlers run on the thread that calls fork() (in the child,
    /// on its only thread: a copy of that one, with a copy of its thread-locals), so a
    /// thread-local slot carries the guards from one handler to the next in both processes,
    /// and the guards (which are not `Send`) never leave their thread.
    static FORK_LOCKS: RefCell<Option<ForkLocks>> = const { RefCell::new(None) };
}

/// This module's locks, held across a fork().
struct ForkLocks {
    /// Fields drop in order: `STATE` is released first, then `DEAD_DROPS`.
    state: MutexGuard<'static, State>,
    /// None when the forking thread already held `DEAD_DROPS` (`IN_DEAD_DROP`: fork() from
    /// within a drop under it): that thread's own guard, up its stack, releases it in each
    /// process, and locking it again here would deadlock.
    _dead_drops: Option<MutexGuard<'static, ()>>,
}

/// Registers, once per process, `pthread_atfork` handlers that take this module's locks
/// before every fork() and release them after it, in the parent and in the child.
///
/// Without them, a fork() while another thread holds `STATE` or `DEAD_DROPS` (a thread
/// ending, which drops its values without the GIL) copies the lock as held into a child that
/// has no thread to release it: the child's first gpuring call (`drain`) would wait for ever.
/// With them, fork() waits for those threads to let go, and the child starts with both locks
/// free. The holders drop Rust values only and never wait for the GIL, which the forking
/// thread holds; the longest hold is a thread ending while values freed for it are queued (a
/// CUDA producer among them waits up to 5 s for its consumers).
pub fn register_fork_handlers() -> std::io::Result<()> {
    let rc = *HANDLERS.get_or_init(|| {
        // SAFETY: the handlers are plain functions that take no arguments, never unwind, and
        // live as long as the process (CPython never unloads an extension module).
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        }
    });
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// The prepare handler: takes `DEAD_DROPS` (unless this thread holds it), then `STATE`, the
/// order every other path uses, so that no other thread holds either while fork() copies
/// the process. They stay held until the fork is done (`FORK_LOCKS`).
extern "C" fn before_fork() {
    // A thread-local without destructor is always there; "holds it" is the safe guess
    // otherwise (not locking it cannot deadlock).
    let holds_dead_drops = IN_DEAD_DROP.try_with(Cell::get).unwrap_or(true);
    // `try_with`: a fork() from a thread-local destructor (after `FORK_LOCKS` is gone)
    // takes no lock, as before these handlers existed.
    let _ = FORK_LOCKS.try_with(|slot| {
        let dead_drops =
            (!holds_dead_drops).then(|| DEAD_DROPS.lock().unwrap_or_else(|p| p.into_inner()));
        *slot.borrow_mut() = Some(ForkLocks { state: state(), _dead_drops: dead_drops });
    });
}

/// The parent handler: releases what `before_fork` took.
extern "C" fn after_fork_in_parent() {
    drop(FORK_LOCKS.try_with(|slot| slot.borrow_mut().take()).ok().flatten());
}

/// The child handler: forgets the values queued for the parent's threads, then releases what
/// `before_fork` took (its copy: nothing else in the child holds them).
///
/// Every queued value is the parent's: dropping or running it would release the parent's
/// messages or leave its rings from here, so it is leaked, as `drop_on` leaks the parent's
/// objects in a child. That includes values queued for the forking thread, whose copy in the
/// child has the same `ThreadId` and would otherwise drop them at its first `drain`. `dead`
/// is kept: it names the parent's threads, which own nothing the child may drop.
extern "C" fn after_fork_in_child() {
    // Relaxed: the child has this one thread until the handler returns.
    PID.store(0, Ordering::Relaxed);
    if let Some(mut locks) = FORK_LOCKS.try_with(|slot| slot.borrow_mut().take()).ok().flatten() {
        std::mem::forget(std::mem::take(&mut locks.state.owed));
        drop(locks);
    }
}

struct ExitGuard;

impl Drop for ExitGuard {
    /// The thread is ending: from now on its values are anyone's to drop (under the lock);
    /// what was queued for it is dropped now.
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let mine = {
            let mut st = state();
            st.dead.get_or_insert_with(HashSet::new).insert(me);
            take_owed(&mut st, me)
        };
        under_dead_lock(|| mine.into_iter().for_each(|Owed(f)| f()));
    }
}

fn take_owed(st: &mut State, thread: ThreadId) -> Vec<Owed> {
    let (mine, others) = std::mem::take(&mut st.owed).into_iter().partition(|(t, _)| *t == thread);
    st.owed = others;
    mine.into_iter().map(|(_, o)| o).collect()
}

fn under_dead_lock(f: impl FnOnce()) {
    if IN_DEAD_DROP.with(Cell::get) {
        return f();
    }
    let _guard = DEAD_DROPS.lock().unwrap_or_else(|p| p.into_inner());
    IN_DEAD_DROP.with(|c| c.set(true));
    f();
    IN_DEAD_DROP.with(|c| c.set(false));
}

/// Drops `value`, which `owner` may touch: now on its thread, queued from another thread,
/// under the lock once its thread ended, never in a forked child.
fn drop_on<T: 'static>(owner: Owner, value: T) {
    // The system call, not the cache: a child forked without the fork handlers (a raw
    // `_Fork()`, say) must not drop the parent's values. Once per value, not per use.
    if owner.pid != std::process::id() {
        std::mem::forget(value); // the parent's: leave its entries and rings alone
        return;
    }
    let me = std::thread::current().id();
    let dead = {
        let mut st = state();
        let dead = st.dead.as_ref().is_some_and(|d| d.contains(&owner.thread));
        if !dead && me != owner.thread {
            st.owed.push((owner.thread, Owed(Box::new(move || drop(value)))));
            return;
        }
        dead
    };
    if dead {
        under_dead_lock(|| drop(value));
    } else {
        drop(value);
    }
}

/// Drops what other threads freed on this thread's behalf. Every checked use of a
/// [`ThreadBound`] runs it first.
pub fn drain() {
    let me = std::thread::current().id();
    let mine = {
        let mut st = state();
        if st.owed.is_empty() {
            return;
        }
        take_owed(&mut st, me)
    };
    if !mine.is_empty() {
        FOREIGN_SEEN.with(|c| c.set(Some(Instant::now())));
    }
    for Owed(drop_it) in mine {
        drop_it();
    }
}

/// How long the next GIL-free wait of this thread may last: short while other threads have
/// been freeing its objects in the last second, so their releases are not held up.
pub fn tick() -> Duration {
    let recent = FOREIGN_SEEN.with(Cell::get).is_some_and(|t| t.elapsed() < Duration::from_secs(1));
    if recent {
        FAST_TICK
    } else {
        SLOW_TICK
    }
}

/// The deadline `secs` seconds from now: None for None, infinity or a time too far to
/// represent (wait as long as it takes); `ValueError` for NaN.
pub fn deadline(secs: Option<f64>) -> PyResult<Option<Instant>> {
    match secs {
        None => Ok(None),
        Some(s) if s.is_nan() => Err(pyo3::exceptions::PyValueError::new_err("timeout is NaN")),
        Some(s) => Ok(Duration::try_from_secs_f64(s.max(0.0))
            .ok()
            .and_then(|d| Instant::now().checked_add(d))),
    }
}

/// A value usable only on the thread (and in the process) that made it; dropped there, or as
/// the module doc says.
pub struct ThreadBound<T: 'static> {
    /// Invariant: only touched on `owner`'s thread, except to be moved into `drop_on`.
    value: ManuallyDrop<T>,
    owner: Owner,
}

// SAFETY: other threads never reach `value`: `get`/`get_mut` check the thread and process,
// and `clear` and `Drop` move it to `drop_on` without touching it.
unsafe impl<T: 'static> Send for ThreadBound<T> {}
// SAFETY: as above; `&ThreadBound` gives other threads nothing but `owner`.
unsafe impl<T: 'static> Sync for ThreadBound<T> {}

impl<T: 'static> ThreadBound<T> {
    /// Binds `value` to this thread.
    pub fn new(value: T) -> Self {
        EXIT.with(|_| {});
        ThreadBound { value: ManuallyDrop::new(value), owner: Owner::current() }
    }

    /// The value, on its own thread; `RuntimeError` elsewhere.
    pub fn get(&self) -> PyResult<&T> {
        self.check()?;
        Ok(&self.value)
    }

    /// The value, on its own thread; `RuntimeError` elsewhere.
    pub fn get_mut(&mut self) -> PyResult<&mut T> {
        self.check()?;
        Ok(&mut self.value)
    }

    /// Replaces the value with its default, from any thread; the old one is dropped as
    /// `drop_on` says.
    pub fn clear(&mut self)
    where
        T: Default,
    {
        let old = std::mem::take(&mut *self.value);
        drop_on(self.owner, old);
    }

    fn check(&self) -> PyResult<()> {
        check_owner(self.owner)
    }
}

/// Ok on `owner`'s thread (after dropping what was queued for it); `RuntimeError` elsewhere.
fn check_owner(owner: Owner) -> PyResult<()> {
    let me = Owner::current();
    if me == owner {
        drain();
        return Ok(());
    }
    let why = if me.pid != owner.pid {
        "this gpuring object was made before fork(): open a new one in this process"
    } else {
        "gpuring consumers, producers and their slots are used on the thread that made them"
    };
    Err(PyRuntimeError::new_err(why))
}

/// The thread (and process) that made an object, to check it is used there even after the
/// object's bound values are gone (a released slot).
#[derive(Clone, Copy)]
pub struct Here(Owner);

impl Here {
    /// This thread.
    pub fn new() -> Here {
        Here(Owner::current())
    }

    /// Ok on that thread; `RuntimeError` elsewhere, as [`ThreadBound::get`].
    pub fn check(&self) -> PyResult<()> {
        check_owner(self.0)
    }
}

impl<T: 'static> ThreadBound<Option<T>> {
    /// Drops the value now, on this thread, without holding the GIL (closing a consumer or
    /// producer may wait for the GPU or for peers).
    pub fn close(&mut self, py: pyo3::Python<'_>) -> PyResult<()> {
        // SAFETY: the closure runs on this thread, and the value is bound to it.
        let value = unsafe { SameThread::new(self.get_mut()?.take()) };
        py.detach(move || drop(value.into_inner()));
        drain();
        Ok(())
    }
}

impl<T: 'static> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        drop_on(self.owner, value);
    }
}

/// Carries a value into `Python::detach` and back.
///
/// `detach` wants `Send` closures, since other threads run Python meanwhile. What we carry is
/// thread-bound (`Rc`s of a consumer's graph, a producer): the closure runs on this same
/// thread, and other threads cannot touch those values meanwhile ([`ThreadBound`]).
pub struct SameThread<T>(T);

// SAFETY: by `new`'s contract, the value never leaves the thread it was made on.
unsafe impl<T> Send for SameThread<T> {}

impl<T> SameThread<T> {
    /// # Safety
    /// The wrapper must only cross into a closure that runs on this thread (`detach`) and come
    /// back, and nothing else may touch what `value` refers to meanwhile.
    pub unsafe fn new(value: T) -> Self {
        SameThread(value)
    }

    /// The value.
    pub fn into_inner(self) -> T {
        self.0
    }
}
