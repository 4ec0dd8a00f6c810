//! How an operation waits, chosen by its caller: blocking the thread (`shm::wait::wait_until`:
//! spin, yield, futex) or, with feature `tokio`, parked on a doorbell as a task
//! (`shm::wait_async`). An operation that can wait both ways is written once, as an `async`
//! fn over a [`Waiter`]; its blocking form runs that future to completion with [`block_on`],
//! which never suspends it (a blocking wait returns only when it is done), the way tokio writes
//! `blocking_send` over `send`.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use crate::ring::WakeLine;
use crate::shm::doorbell::Doorbell;
use crate::shm::wait::{self, Deadline, WaitConfig};

/// How a wait waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// On this thread, until the deadline.
    Blocking(Deadline),
    /// As a task, parked on its doorbell, without a deadline (feature `tokio`).
    #[cfg(feature = "tokio")]
    Parked,
}

/// What a waiter for a peer's action waits on: the wake line the peer bumps (blocking waits
/// sleep on its futex word) and the doorbell it knocks on (parked waits).
#[derive(Clone, Copy)]
pub(crate) struct WakeOn<'a> {
    pub line: &'a WakeLine,
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub bell: Option<&'a Doorbell>,
}

impl Waiter {
    /// Whether it gives up after the first look ([`Deadline::Now`]: a `try_` operation).
    pub(crate) fn gives_up_now(self) -> bool {
        self == Waiter::Blocking(Deadline::Now)
    }

    /// Waits until `step` returns `Some` (see `shm::wait::wait_until`), woken through `wake`,
    /// or without a waker for conditions nobody signals (a GPU's progress): `None` once a
    /// blocking wait's deadline passed.
    pub(crate) async fn wait<T>(
        self,
        wake: Option<WakeOn<'_>>,
        config: WaitConfig,
        step: impl FnMut(bool) -> Option<T>,
    ) -> Option<T> {
        match self {
            Waiter::Blocking(deadline) => {
                wait::wait_until(wake.map(|w| w.line), config, deadline, step)
            }
            #[cfg(feature = "tokio")]
            Waiter::Parked => {
                let wake = wake.map(|w| crate::shm::wait_async::Wake {
                    line: w.line,
                    flag: None,
                    bell: w.bell,
                    emptied: None,
                });
                Some(crate::shm::wait_async::wait_async(wake, config, step).await)
            }
        }
    }
}

/// Runs `fut`, an operation over [`Waiter::Blocking`], to its end on this thread. Such a future
/// never suspends (its waits block instead), so one poll finishes it.
pub(crate) fn block_on<T>(fut: impl Future<Output = T>) -> T {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("a blocking wait suspended"),
    }
}
