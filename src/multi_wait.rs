//! Host waits on several timeline signals at once: [`wait_all`] and
//! [`wait_any`].
//!
//! # How a multi-wait blocks
//!
//! A multi-wait first checks whether the values are reached (for a CPU
//! signal, one atomic load each); when that settles it, it returns without
//! allocating or locking anything. Otherwise (unless the timeout is zero)
//! it spins briefly re-checking the values, as a single CPU signal's `wait`
//! does (bounded and adaptive: about 25 µs at most, shorter on a thread
//! where spinning stopped paying), so a value about to be set costs no
//! sleep and wake-up: `signal_wake_any` in `benches/signal.rs` measures
//! `wait_any` over 2 and 4 signals at the cost of one `wait`. Then it makes
//! a [`SignalWaker`] (a flag under a mutex, and a condvar) and asks each
//! signal to [`watch`](TimelineSignal::watch) it:
//!
//! - a signal that can notify (a [`CpuSignal`](crate::cpu::CpuSignal), an
//!   [`AnySignal`](crate::AnySignal) holding one) wakes the waker on every
//!   raise and every failure while watched, so the waiter sleeps until then:
//!   no polling, and a wake-up costs what a single `wait`'s does;
//! - a signal that cannot (the trait's default: CUDA signals, whose value
//!   moves when the GPU completes an event and no host thread is there to
//!   notify anyone, and signals of other crates that keep the default) is
//!   polled: the waiter sleeps on the waker at most 10 µs, then twice as long
//!   each time, up to 1 ms, and re-checks. A notifying signal of the same
//!   list still wakes it at once.
//!
//! No wake-up is lost: a signal that accepts a watch wakes the waker for
//! every change after the watch, and the waiter re-checks every signal after
//! watching and after each sleep; a wake that comes between its check and
//! its sleep leaves the waker's flag set, so the sleep returns at once.
//! The waiter un-watches every signal before it returns (also on a panic).
//!
//! A failure is checked with a zero-timeout [`wait`](TimelineSignal::wait),
//! so a multi-wait reports exactly the error the signal's own `wait` would.
//!
//! Where signals of the list have a device [`WaitTuning`]
//! ([`TimelineSignal::wait_tuning`]: CUDA signals), their
//! [`WaitPolicy`](crate::WaitPolicy) replaces the short spin above: the
//! wait spins for the longest budget among the signals not reached yet
//! (forever under [`Spin`](crate::WaitPolicy::Spin), not at all under
//! [`Sleep`](crate::WaitPolicy::Sleep)), reckoned again every 64 looks, so
//! a spinning device's signal reached mid-wait stops the spin; it looks at
//! every signal of the list, failures included, then sleeps and polls as
//! above. A multi-wait
//! does not count into a device's average wait length: its length is not
//! one signal's.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::signal::{
    PollBackoff, TimelineSignal, Timeout, check_value, spin_before_blocking, timed_start,
};
use crate::sync::{Arc, Condvar, Mutex};
use crate::wait_policy::{WaitTuning, spin_until};

/// What a multi-signal wait sleeps on; signals that can notify wake it.
///
/// [`wait_all`] and [`wait_any`] make one per blocking wait and hand it to
/// each signal's [`watch`](TimelineSignal::watch). A signal that accepts it
/// keeps a clone and calls [`wake`](Self::wake) after each change of its
/// value or failures until [`unwatch`](TimelineSignal::unwatch). Clones name
/// the same waker.
#[derive(Clone)]
pub struct SignalWaker {
    inner: Arc<WakerState>,
}

struct WakerState {
    /// Whether a wake came since the waiter last woke. Set by `wake`,
    /// cleared by the waiter when it wakes; both under the lock, so a wake
    /// between the waiter's checks and its sleep is never lost.
    woken: Mutex<bool>,
    parked: Condvar,
}

impl SignalWaker {
    /// A waker nobody woke yet.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(WakerState {
                woken: Mutex::new(false),
                parked: Condvar::new(),
            }),
        }
    }

    /// Wakes the waiter sleeping on this waker, or makes its next sleep
    /// return at once. Cheap enough to call on every change of a signal.
    pub fn wake(&self) {
        let mut woken = self.inner.woken.lock();
        *woken = true;
        self.inner.parked.notify_one();
    }

    /// Whether two handles name the same waker.
    pub fn same_as(&self, other: &SignalWaker) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Sleeps until woken (since the last sleep) or `deadline` passes
    /// (`None`: no deadline); may return early. Clears the wake.
    fn sleep(&self, deadline: Option<Instant>) {
        let mut woken = self.inner.woken.lock();
        if !*woken {
            woken = self.inner.parked.wait_until(woken, deadline);
        }
        *woken = false;
    }
}

impl Default for SignalWaker {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SignalWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalWaker")
            .field("woken", &*self.inner.woken.lock())
            .finish()
    }
}

/// Blocks until every signal reached its value: `waits` are
/// `(signal, value)` pairs.
///
/// An empty list returns `Ok` at once. A signal may appear more than once.
/// Works with signals of mixed backends through [`AnySignal`](crate::AnySignal);
/// see the [module docs](self) for how it blocks.
///
/// # Errors
/// - [`Error::SignalValueOutOfRange`] for a value past
///   [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE) (the first such), before
///   anything waits;
/// - as soon as any signal's work for its value failed, that signal's
///   [`Error::SignalFailed`] (the lowest such index), even while others are
///   still pending;
/// - [`Error::Timeout`] when `timeout` passes first, naming the first pair
///   (lowest index) still not reached: its value as `target`, the signal's
///   value as `current`. [`is_reached`](TimelineSignal::is_reached) tells
///   which others were.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use hwqueue::cpu::CpuSignal;
/// use hwqueue::{AnySignal, TimelineSignal, wait_all};
///
/// # fn main() -> hwqueue::Result<()> {
/// // Any backends' signals in one list: here two CPU signals; a CUDA
/// // signal (`--features cuda`) goes in the same list as an `AnySignal`.
/// let compute: AnySignal = CpuSignal::new(0).into();
/// let upload: AnySignal = CpuSignal::new(0).into();
/// std::thread::scope(|scope| {
///     scope.spawn(|| compute.set(3));
///     scope.spawn(|| upload.set(1));
///     wait_all(&[(&compute, 3), (&upload, 1)], Duration::from_secs(10))
/// })?;
/// assert!(compute.is_reached(3) && upload.is_reached(1));
/// # Ok(())
/// # }
/// ```
pub fn wait_all<S: TimelineSignal>(waits: &[(&S, u64)], timeout: impl Into<Timeout>) -> Result<()> {
    check_values(waits)?;
    let all_reached = || {
        waits
            .iter()
            .all(|&(signal, target)| signal.is_reached(target))
            .then_some(())
    };
    if all_reached().is_some() {
        return Ok(());
    }
    let timeout = timeout.into();
    // A finite timeout counts from here, spin included.
    let start = timed_start(timeout);
    let spin = tuned_spin(waits);
    if spin.is_none() && spin_before_blocking(timeout, start, all_reached).is_some() {
        return Ok(());
    }
    let start = start.unwrap_or_else(Instant::now);
    block_until(waits, (timeout, start), true, spin, || {
        let mut first_pending = None;
        for (index, &(signal, target)) in waits.iter().enumerate() {
            if !reached(signal, target)? && first_pending.is_none() {
                first_pending = Some(index);
            }
        }
        Ok(match first_pending {
            None => Progress::Done(()),
            Some(index) => Progress::Pending(index),
        })
    })
}

/// Blocks until one signal reached its value, and returns its index in
/// `waits` (`(signal, value)` pairs): the lowest index among those found
/// reached when it looked.
///
/// Works with signals of mixed backends through [`AnySignal`](crate::AnySignal);
/// see the [module docs](self) for how it blocks.
///
/// # Errors
/// - [`Error::EmptyWaitList`] for an empty list: there is no index to
///   return;
/// - [`Error::SignalValueOutOfRange`] for a value past
///   [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE) (the first such), before
///   anything waits;
/// - when no signal reached its value and one's work for it failed, that
///   signal's [`Error::SignalFailed`] (the lowest such index);
/// - [`Error::Timeout`] when `timeout` passes first, naming the first pair:
///   its value as `target`, that signal's value as `current`.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use hwqueue::cpu::CpuSignal;
/// use hwqueue::{AnySignal, TimelineSignal, wait_any};
///
/// # fn main() -> hwqueue::Result<()> {
/// let left: AnySignal = CpuSignal::new(0).into();
/// let right: AnySignal = CpuSignal::new(0).into();
/// let first = std::thread::scope(|scope| {
///     scope.spawn(|| right.set(2));
///     wait_any(&[(&left, 1), (&right, 2)], Duration::from_secs(10))
/// })?;
/// assert_eq!(first, 1);
/// # Ok(())
/// # }
/// ```
pub fn wait_any<S: TimelineSignal>(
    waits: &[(&S, u64)],
    timeout: impl Into<Timeout>,
) -> Result<usize> {
    if waits.is_empty() {
        return Err(Error::EmptyWaitList);
    }
    check_values(waits)?;
    let first_reached = || {
        waits
            .iter()
            .position(|&(signal, target)| signal.is_reached(target))
    };
    // Reached values first: one load each for most signals, no lock.
    if let Some(index) = first_reached() {
        return Ok(index);
    }
    let timeout = timeout.into();
    // A finite timeout counts from here, spin included.
    let start = timed_start(timeout);
    let spin = tuned_spin(waits);
    if spin.is_none()
        && let Some(index) = spin_before_blocking(timeout, start, first_reached)
    {
        return Ok(index);
    }
    let start = start.unwrap_or_else(Instant::now);
    block_until(waits, (timeout, start), false, spin, || {
        // The lowest index reached wins over an earlier one's failure.
        let mut failure = None;
        for (index, &(signal, target)) in waits.iter().enumerate() {
            match reached(signal, target) {
                Ok(true) => return Ok(Progress::Done(index)),
                Ok(false) => {}
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(Progress::Pending(0)),
        }
    })
}

/// Where a multi-wait stands after one look at its signals.
enum Progress<R> {
    /// It is over, with this result.
    Done(R),
    /// Not yet; the index of the pair a timeout names.
    Pending(usize),
}

/// The first value past the range, as an error.
fn check_values<S: TimelineSignal>(waits: &[(&S, u64)]) -> Result<()> {
    waits
        .iter()
        .try_for_each(|&(_, target)| check_value(target))
}

/// How many looks of a multi-wait's spin pass between two reckonings of
/// its budget (`tuned_spin`, which asks each signal's device).
const RECHECK_SPIN: u32 = 64;

/// The longest spin budget among the device tunings of the unreached
/// signals of `waits`; `None` when none has a tuning.
fn tuned_spin<S: TimelineSignal>(waits: &[(&S, u64)]) -> Option<Duration> {
    waits
        .iter()
        // A reached signal's device is not waited on: its policy (a
        // `Spin` device's endless budget) must not make the wait for the
        // others spin.
        .filter(|&&(signal, target)| !signal.is_reached(target))
        .filter_map(|&(signal, target)| signal.wait_tuning(target))
        .map(WaitTuning::spin_budget)
        .max()
}

/// Whether `signal` reached `target`; its error if the work for `target`
/// failed. Never blocks.
fn reached<S: TimelineSignal>(signal: &S, target: u64) -> Result<bool> {
    if signal.is_reached(target) {
        return Ok(true);
    }
    match signal.wait(target, Duration::ZERO) {
        Ok(()) => Ok(true),
        Err(Error::Timeout { .. }) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Looks at the signals with `look` (failures included) until it says done,
/// it fails, or the timeout (counted from `start`, when the wait began)
/// passes; sleeps on a [`SignalWaker`] that the
/// signals watch between looks, or, where none watches, in the signals'
/// own multi-wait ([`TimelineSignal::wait_native`], for every value when
/// `all`) where they have one. First, with a `spin` budget (from the
/// signals' device tunings), it looks without sleeping for that long. The
/// caller found the values not reached.
fn block_until<S: TimelineSignal, R>(
    waits: &[(&S, u64)],
    (timeout, start): (Timeout, Instant),
    all: bool,
    spin: Option<Duration>,
    mut look: impl FnMut() -> Result<Progress<R>>,
) -> Result<R> {
    let deadline = timeout.deadline_from(start);
    let timed_out = |pending: usize| {
        let (signal, target) = waits[pending];
        Error::Timeout {
            target,
            current: signal.value(),
            waited: start.elapsed(),
        }
    };
    // A wait that may not block (a zero timeout) looks once and gives up.
    let watching = match deadline {
        Some(deadline) if start >= deadline => None,
        _ => Some(Watching::new(waits)),
    };
    if let Some(budget) = spin {
        let mut looks = 0u32;
        let spun = spin_until(start, budget, deadline, || match look() {
            Ok(Progress::Done(result)) => Some(Some(Ok(result))),
            Ok(Progress::Pending(_)) => {
                // Every so often, the budget again: once the signals whose
                // devices spin are reached, the others' budgets decide (a
                // `Spin` device's signal reached mid-wait must not keep it
                // spinning for the rest).
                looks = looks.wrapping_add(1);
                let stop = looks.is_multiple_of(RECHECK_SPIN)
                    && tuned_spin(waits).is_none_or(|budget| start.elapsed() >= budget);
                stop.then_some(None)
            }
            Err(error) => Some(Some(Err(error))),
        });
        if let Some(Some(result)) = spun {
            return result;
        }
    }
    let mut poll = PollBackoff::new();
    loop {
        // After the watch, or after a sleep: a change before this look is
        // seen by it, one after it wakes the waker.
        let pending = match look()? {
            Progress::Done(result) => return Ok(result),
            Progress::Pending(index) => index,
        };
        let now = Instant::now();
        let watching = match &watching {
            Some(watching) if deadline.is_none_or(|deadline| now < deadline) => watching,
            _ => return Err(timed_out(pending)),
        };
        // One step of the back-off a round: the signals' own multi-wait
        // sleeps it, or else the waker does.
        let step = watching.polls.then(|| poll.step());
        if let Some(step) = step
            && !watching.watched
        {
            let slice = deadline.map_or(step, |deadline| step.min(deadline - now));
            if S::wait_native(waits, all, slice) {
                continue;
            }
        }
        let wake_by = if let Some(step) = step {
            let until = now.checked_add(step);
            match (deadline, until) {
                (Some(deadline), Some(until)) => Some(deadline.min(until)),
                (deadline, until) => deadline.or(until),
            }
        } else {
            deadline
        };
        watching.waker.sleep(wake_by);
    }
}

/// A waker watched by every signal of a wait list, un-watched on drop.
struct Watching<'a, S: TimelineSignal> {
    waits: &'a [(&'a S, u64)],
    waker: SignalWaker,
    /// Whether some signal declined the watch and must be polled.
    polls: bool,
    /// Whether some signal took the watch (and wakes the waker).
    watched: bool,
}

impl<'a, S: TimelineSignal> Watching<'a, S> {
    /// Watches every signal whose value is not reached yet (a reached one
    /// has nothing left to tell). Built before the first `watch`, so a
    /// `watch` that panics still un-watches the ones before it.
    fn new(waits: &'a [(&'a S, u64)]) -> Self {
        let mut watching = Self {
            waits,
            waker: SignalWaker::new(),
            polls: false,
            watched: false,
        };
        for &(signal, target) in waits {
            if !signal.is_reached(target) {
                let watches = signal.watch(&watching.waker);
                watching.polls |= !watches;
                watching.watched |= watches;
            }
        }
        watching
    }
}

impl<S: TimelineSignal> Drop for Watching<'_, S> {
    fn drop(&mut self) {
        // Every signal: one not watched (declined, or reached when the
        // wait began) ignores it, as the trait requires.
        for &(signal, _) in self.waits {
            signal.unwatch(&self.waker);
        }
    }
}
