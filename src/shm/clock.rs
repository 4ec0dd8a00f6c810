//! The clock of the liveness ticks: `CLOCK_MONOTONIC_COARSE`, read on every `acquire` and
//! `recv` to see whether a liveness interval has passed.
//!
//! `Instant::now` (`CLOCK_MONOTONIC`) reads the time stamp counter and scales it: about a
//! quarter of a host message's CPU cost when producer and consumer share a thread. The coarse
//! clock is the kernel's last tick, a load in the vDSO, at the cost of resolution (one jiffy,
//! 1 to 10 ms: [`resolution`]). It may read up to that much behind the precise clock, which the
//! waits time their sleeps on, so [`due`] counts an interval within one resolution of passing
//! as passed: a check comes early by at most a jiffy, never late (an interval at or below the
//! resolution is due at every call).

use std::sync::OnceLock;
use std::time::Duration;

use rustix::time::{clock_getres, clock_gettime, ClockId, Timespec};

/// A moment on the coarse monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tick(Duration);

impl Tick {
    /// Now, to the clock's resolution.
    pub(crate) fn now() -> Tick {
        Tick(duration(clock_gettime(ClockId::MonotonicCoarse)))
    }

    /// How long since `self` (zero if the clock has not moved on).
    pub(crate) fn elapsed(self) -> Duration {
        Tick::now().0.saturating_sub(self.0)
    }

    /// Nanoseconds since `earlier` (zero if `earlier` is later).
    pub(crate) fn nanos_since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0).as_nanos() as u64
    }
}

/// The coarse clock's resolution, asked of the kernel once.
pub(crate) fn resolution() -> Duration {
    static RES: OnceLock<Duration> = OnceLock::new();
    *RES.get_or_init(|| duration(clock_getres(ClockId::MonotonicCoarse)))
}

/// Whether `interval` has passed when the coarse clock says `elapsed` has: also when it is
/// within one [`resolution`] of it, since the coarse clock may lag that much.
pub(crate) fn due(elapsed: Duration, interval: Duration) -> bool {
    elapsed + resolution() >= interval
}

/// A monotonic clock's reading as a duration since its epoch (boot; never negative).
fn duration(t: Timespec) -> Duration {
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_keeps_within_its_resolution_of_the_fine_one() {
        let res = resolution();
        assert!(res > Duration::ZERO && res <= Duration::from_millis(100), "{res:?}");
        // Fine first, then coarse: a pause between the two reads only shortens `coarse`'s
        // span against `fine`'s, which the lower bound allows for with the resolution.
        let (i0, t0) = (std::time::Instant::now(), Tick::now());
        std::thread::sleep(Duration::from_millis(30));
        let (coarse, fine) = (t0.elapsed(), i0.elapsed());
        assert!(coarse <= fine + res, "coarse {coarse:?} ran ahead of fine {fine:?}");
        assert!(due(coarse, Duration::from_millis(30)), "{coarse:?} of 30 ms, resolution {res:?}");
    }

    #[test]
    fn an_interval_is_due_within_one_resolution_and_never_before() {
        let res = resolution();
        let tick = Duration::from_secs(1);
        assert!(due(tick, tick));
        assert!(due(tick - res, tick), "a lagging clock still counts the interval as passed");
        assert!(!due(tick - res - Duration::from_nanos(1), tick));
        assert!(due(Duration::ZERO, res), "an interval at the resolution is always due");
    }
}
