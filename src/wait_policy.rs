//! `WaitPolicy`: how a host thread waits for a device event: spin, sleep,
//! or spin for a short, adaptive time and then sleep.
//!
//! # Why spin
//!
//! A GPU cannot wake a host thread cheaply. A thread that sleeps on a
//! blocking-sync CUDA event (`cuEventSynchronize` on a
//! `CU_EVENT_BLOCKING_SYNC` event) is woken by the driver's interrupt path:
//! on an H200 that costs about 40 µs, so a one-kernel round trip (exec,
//! signal, submit, wait) took 27.3 µs against 8.8 µs for cudarc's
//! `synchronize` on a spinning event. A thread that polls the event instead
//! sees the completion within a query (well under a microsecond), but holds
//! a core for as long as it polls. CUDA's own default
//! (`cudaDeviceScheduleAuto`) spins while there are spare cores and yields
//! otherwise; hwqueue spins for a bounded time and then sleeps.
//!
//! # The policies
//!
//! | [`WaitPolicy`] | a host wait on a device event |
//! |---|---|
//! | [`Adaptive`](WaitPolicy::Adaptive) (default) | polls for the device's adaptive budget (below), then sleeps as `Sleep` does |
//! | [`Spin`](WaitPolicy::Spin) | polls until the event completes, the value fails or the timeout passes: never sleeps (lowest latency; holds a core for the whole wait) |
//! | [`Sleep`](WaitPolicy::Sleep) | sleeps at once: an unbounded wait blocks in the driver (`cuEventSynchronize`), a bounded one polls with a back-off of 10 µs doubling to 1 ms (frees the core; each wake-up costs the driver's latency) |
//!
//! While it polls, a waiter also watches the signal's own state, so a
//! value that the host [`set`](crate::TimelineSignal::set)s or
//! [`fail`](crate::TimelineSignal::fail)s ends the spin at once. Polling
//! uses [`std::hint::spin_loop`] between looks and never yields the core
//! (a yield on a busy machine can cost a whole time slice).
//!
//! # The adaptive budget
//!
//! Each device keeps one [`WaitTuning`]: its policy and an exponential
//! moving average of how long its host waits took (from the moment the
//! wait found the event to wait on, so not time spent parked until a value
//! was recorded, to the moment it saw the completion; waits that returned
//! at once, and zero-timeout looks, are not counted; one that timed out
//! first counts only where its length raises the average). A wait under `Adaptive` spins for
//! [`adaptive_budget`]`(average)`:
//!
//! - while the average is at most [`MAX_SPIN`] (200 µs), twice the
//!   average, at least [`MIN_SPIN`] (20 µs) and at most `MAX_SPIN`: waits
//!   as long as the recent ones end while spinning, with room for
//!   variation, and none spins longer than 200 µs (5 wake-ups' worth; a
//!   wait longer than that pays at most 20% for its wake-up);
//! - once the average is above `MAX_SPIN`, `MIN_SPIN` only: this device's
//!   waits are long, spinning would rarely catch one, so a wait spins only
//!   about half a wake-up's cost (catching the odd short one) and sleeps.
//!
//! The average moves by 1/8 of the difference each wait (as TCP's
//! smoothed round-trip time does), from [`INITIAL_AVERAGE`] (100 µs, so
//! the first waits spin the full 200 µs), and each wait counts as at most
//! [`LONGEST_COUNTED`] (1 ms): one 10 ms outlier among short waits raises
//! the average by at most 125 µs instead of 1.25 ms, so it costs the next
//! few waits some spin, not a dozen waits their spin. A wait that had to
//! sleep counts its wake-up too, which only errs towards sleeping. Under
//! steady long waits the average settles near 1 ms; after that, about a
//! dozen short waits bring it back under 200 µs.
//!
//! So a long wait still frees its core: under the default policy a 10 ms
//! wait spins at most 200 µs (20 µs once the device's waits are known to be
//! long), then sleeps. The average is a hint, shared by every thread
//! waiting on the device: two waits that end together may each overwrite
//! the other's update (relaxed atomics; a lost update loses one sample).

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::hint::{AtomicU8, AtomicU64, Ordering};

/// The shortest spin of an adaptive wait: about half a wake-up of a thread
/// sleeping on a blocking-sync CUDA event on an H200 (40 µs).
pub const MIN_SPIN: Duration = Duration::from_micros(20);
/// The longest spin of an adaptive wait, and the average wait length up to
/// which it spins more than [`MIN_SPIN`].
pub const MAX_SPIN: Duration = Duration::from_micros(200);
/// A device's average wait length before any wait was measured: half of
/// [`MAX_SPIN`], so the first waits spin the whole of it.
pub const INITIAL_AVERAGE: Duration = Duration::from_micros(100);
/// The most one wait adds to the average, however long it took.
pub const LONGEST_COUNTED: Duration = Duration::from_millis(1);

/// How a host thread waits for a device event. See the [module
/// docs](self); picked per CUDA device with
/// `CudaDevice::set_wait_policy` (feature `cuda`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WaitPolicy {
    /// Spin for a short budget that adapts to how long the device's recent
    /// waits took (20–200 µs), then sleep.
    #[default]
    Adaptive,
    /// Never sleep: poll until the wait is over or its timeout passes.
    Spin,
    /// Sleep at once (in the driver, or between polls with a back-off).
    Sleep,
}

impl WaitPolicy {
    fn to_bits(self) -> u8 {
        match self {
            WaitPolicy::Adaptive => 0,
            WaitPolicy::Spin => 1,
            WaitPolicy::Sleep => 2,
        }
    }

    fn from_bits(bits: u8) -> Self {
        match bits {
            1 => WaitPolicy::Spin,
            2 => WaitPolicy::Sleep,
            _ => WaitPolicy::Adaptive,
        }
    }
}

/// One device's wait policy and the average length of its host waits (see
/// the [module docs](self)).
///
/// | field | meaning | written by | how |
/// |-------|---------|------------|-----|
/// | `policy` | a [`WaitPolicy`] (0 adaptive, 1 spin, 2 sleep) | [`set_policy`](Self::set_policy) | `store(Relaxed)` |
/// | `average_ns` | the moving average of the device's wait lengths, in ns | every wait that waited ([`record`](Self::record)) | `load`, then `store(Relaxed)` |
///
/// Both are hints that order nothing: a waiter that reads a stale policy
/// or average spins a little more or less, never waits wrongly (every wait
/// re-checks the signal itself). So `Relaxed` suffices, and these are
/// plain `std` atomics even under loom (a process-wide table of them is a
/// `static`, which loom's atomics cannot be).
pub struct WaitTuning {
    policy: AtomicU8,
    average_ns: AtomicU64,
}

impl WaitTuning {
    /// [`WaitPolicy::Adaptive`] at [`INITIAL_AVERAGE`].
    pub const fn new() -> Self {
        Self {
            policy: AtomicU8::new(0),
            average_ns: AtomicU64::new(INITIAL_AVERAGE.as_nanos() as u64),
        }
    }

    /// The policy waits use.
    pub fn policy(&self) -> WaitPolicy {
        WaitPolicy::from_bits(self.policy.load(Ordering::Relaxed))
    }

    /// Sets the policy for the waits that start from now on.
    pub fn set_policy(&self, policy: WaitPolicy) {
        self.policy.store(policy.to_bits(), Ordering::Relaxed);
    }

    /// The average length of the waits [`record`](Self::record)ed.
    pub fn average(&self) -> Duration {
        Duration::from_nanos(self.average_ns.load(Ordering::Relaxed))
    }

    /// How long a wait that starts now polls before it sleeps:
    /// [`Duration::ZERO`] under [`WaitPolicy::Sleep`], [`Duration::MAX`]
    /// (never sleeps) under [`WaitPolicy::Spin`], [`adaptive_budget`] of
    /// the average under [`WaitPolicy::Adaptive`].
    pub fn spin_budget(&self) -> Duration {
        match self.policy() {
            WaitPolicy::Adaptive => adaptive_budget(self.average()),
            WaitPolicy::Spin => Duration::MAX,
            WaitPolicy::Sleep => Duration::ZERO,
        }
    }

    /// Counts a wait that took `waited` into the average.
    pub fn record(&self, waited: Duration) {
        let average = next_average(self.average(), waited);
        self.average_ns.store(nanos(average), Ordering::Relaxed);
    }

    /// Counts a wait that took at least `waited` (it timed out before its
    /// event completed): only where that raises the average, since its
    /// real length is unknown. A caller polling with short timeouts work
    /// that takes milliseconds would otherwise teach the device that its
    /// waits are short.
    pub fn record_at_least(&self, waited: Duration) {
        if waited > self.average() {
            self.record(waited);
        }
    }
}

impl Default for WaitTuning {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for WaitTuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitTuning")
            .field("policy", &self.policy())
            .field("average", &self.average())
            .field("spin_budget", &self.spin_budget())
            .finish()
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The average after a wait that took `waited`: 7/8 of `average` and 1/8 of
/// `waited`, which counts as at most [`LONGEST_COUNTED`].
pub fn next_average(average: Duration, waited: Duration) -> Duration {
    let (average, waited) = (nanos(average), nanos(waited.min(LONGEST_COUNTED)));
    Duration::from_nanos(average - average / 8 + waited / 8)
}

/// How long an [`Adaptive`](WaitPolicy::Adaptive) wait polls, given the
/// average length of the device's recent waits: `2 * average` within
/// [`MIN_SPIN`]`..=`[`MAX_SPIN`] while the average is at most `MAX_SPIN`,
/// `MIN_SPIN` above it.
pub fn adaptive_budget(average: Duration) -> Duration {
    if average > MAX_SPIN {
        MIN_SPIN
    } else {
        (average * 2).clamp(MIN_SPIN, MAX_SPIN)
    }
}

/// Polls `look` until it finds something, `budget` has passed (measured
/// from `start`) or `deadline` has; `None` when it gave up. Looks at least
/// once when `budget` is not zero; never when it is. Between looks: a few
/// [`std::hint::spin_loop`]s, never a yield or a sleep.
///
/// Under loom each round is a yield, so a model explores the other
/// threads acting while the waiter spins.
pub(crate) fn spin_until<R>(
    start: Instant,
    budget: Duration,
    deadline: Option<Instant>,
    mut look: impl FnMut() -> Option<R>,
) -> Option<R> {
    if budget.is_zero() {
        return None;
    }
    let until = match (start.checked_add(budget), deadline) {
        (Some(end), Some(deadline)) => Some(end.min(deadline)),
        (end, deadline) => end.or(deadline),
    };
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if until.is_some_and(|until| Instant::now() >= until) {
            return None;
        }
        crate::sync::spin_hint();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    #[test]
    fn the_budget_is_twice_the_average_within_its_bounds() {
        assert_eq!(adaptive_budget(US(1)), MIN_SPIN);
        assert_eq!(adaptive_budget(US(10)), MIN_SPIN);
        assert_eq!(adaptive_budget(US(30)), US(60));
        assert_eq!(adaptive_budget(US(100)), MAX_SPIN);
        assert_eq!(adaptive_budget(MAX_SPIN), MAX_SPIN);
    }

    #[test]
    fn long_waits_leave_only_the_shortest_spin() {
        assert_eq!(adaptive_budget(MAX_SPIN + US(1)), MIN_SPIN);
        assert_eq!(adaptive_budget(Duration::from_secs(1)), MIN_SPIN);
        assert_eq!(adaptive_budget(Duration::MAX), MIN_SPIN);
    }

    #[test]
    fn the_average_moves_an_eighth_of_the_way() {
        assert_eq!(next_average(US(80), US(80)), US(80));
        assert_eq!(next_average(US(80), US(160)), US(90));
        assert_eq!(next_average(US(80), Duration::ZERO), US(70));
    }

    #[test]
    fn one_outlier_moves_the_average_by_at_most_an_eighth_of_the_cap() {
        let after = next_average(US(20), Duration::from_secs(10));
        assert_eq!(after, US(20) - US(20) / 8 + LONGEST_COUNTED / 8);
        // Still short enough to spin (the cap keeps it under MAX_SPIN).
        assert!(after <= MAX_SPIN, "{after:?}");
        assert!(adaptive_budget(after) > MIN_SPIN);
        // No overflow at the extremes.
        assert!(next_average(Duration::MAX, Duration::MAX) > LONGEST_COUNTED);
    }

    #[test]
    fn steady_long_waits_shrink_the_spin_and_short_ones_bring_it_back() {
        let tuning = WaitTuning::new();
        assert_eq!(tuning.policy(), WaitPolicy::Adaptive);
        assert_eq!(
            tuning.spin_budget(),
            MAX_SPIN,
            "the first waits spin in full"
        );
        let mut waits = 0;
        while tuning.spin_budget() != MIN_SPIN {
            tuning.record(Duration::from_millis(10));
            waits += 1;
            assert!(waits < 20, "{tuning:?}");
        }
        // Then waits that end within 10 µs (seen 40 µs late: they slept).
        let mut short = 0;
        while tuning.spin_budget() == MIN_SPIN {
            tuning.record(US(50));
            short += 1;
            assert!(short < 20, "{tuning:?}");
        }
        assert!(tuning.spin_budget() >= MAX_SPIN / 2, "{tuning:?}");
        // And once they end while spinning, the budget follows them down.
        for _ in 0..40 {
            tuning.record(US(10));
        }
        assert!(tuning.spin_budget() < US(25), "{tuning:?}");
    }

    #[test]
    fn spin_and_sleep_policies_ignore_the_average() {
        let tuning = WaitTuning::new();
        tuning.set_policy(WaitPolicy::Spin);
        assert_eq!(tuning.policy(), WaitPolicy::Spin);
        assert_eq!(tuning.spin_budget(), Duration::MAX);
        tuning.set_policy(WaitPolicy::Sleep);
        assert_eq!(tuning.spin_budget(), Duration::ZERO);
        tuning.record(US(1));
        assert_eq!(tuning.spin_budget(), Duration::ZERO);
        tuning.set_policy(WaitPolicy::Adaptive);
        assert!(tuning.spin_budget() >= MIN_SPIN);
    }

    #[test]
    fn a_spin_looks_until_found_and_a_zero_budget_never_looks() {
        let start = Instant::now();
        let mut looks = 0;
        let found = spin_until(start, Duration::MAX, None, || {
            looks += 1;
            (looks == 1000).then_some(looks)
        });
        assert_eq!(found, Some(1000));
        let mut looked = false;
        assert_eq!(
            spin_until(start, Duration::ZERO, None, || {
                looked = true;
                Some(())
            }),
            None
        );
        assert!(!looked);
        // A passed deadline: one look, then give up.
        let mut looks = 0;
        let passed = spin_until(start, Duration::MAX, Some(start), || {
            looks += 1;
            None::<()>
        });
        assert_eq!((passed, looks), (None, 1));
    }
}
