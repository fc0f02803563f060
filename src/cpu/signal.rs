//! `CpuSignal`: a timeline signal in one atomic word, with no lost wake-up.

use std::fmt;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::multi_wait::SignalWaker;
use crate::signal::{
    Failures, MAX_SIGNAL_VALUE, Producer, TimelineSignal, Timeout, spin_before_blocking,
    timed_start, value_out_of_range,
};
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering};

/// The low bit of [`Inner::state`]: a waiter may be parked, or a
/// multi-wait watches.
const WAITING: u64 = 1;

/// A timeline signal for the CPU backend; also usable from any host thread.
///
/// - `set` with nobody waiting is one `fetch_max` (no lock, no fence);
/// - `wait` on a reached value is one atomic load;
/// - a waiter is never lost: the protocol is documented on the state word
///   in this file's source, and checked by the loom models;
/// - it notifies [`wait_all`](crate::wait_all) and
///   [`wait_any`](crate::wait_any): they sleep until a `set` or `fail` of
///   one of their signals wakes them, without polling.
#[derive(Clone)]
pub struct CpuSignal {
    inner: Arc<Inner>,
}

struct Inner {
    /// `value << 1 | WAITING`.
    ///
    /// | bits  | meaning | written by | how |
    /// |-------|---------|------------|-----|
    /// | 63..1 | the value: highest completed | `set` | `fetch_max(v << 1, AcqRel)` |
    /// | 0     | `WAITING`: a waiter may be parked | a waiter, holding `lock` | `compare_exchange(s, s \| 1, AcqRel)` |
    /// | 0     | `WAITING`: a multi-wait watches | `watch`, and a raising `set` that finds watchers; both holding `lock` | `fetch_or(1, AcqRel)` |
    ///
    /// A raising `fetch_max` writes the flag as 0 and returns the old word.
    /// If the old word had the flag, the setter takes `lock` and
    /// `notify_all`s; every woken waiter re-checks and re-flags if it still
    /// needs to wait. A `fetch_max` that does not raise changes nothing, so it
    /// keeps the flag.
    ///
    /// Why no wake-up is lost: a waiter sets the flag with a
    /// compare-exchange against the word it checked, while holding `lock`,
    /// then parks, releasing `lock` atomically. All writes to this one word
    /// are totally ordered. If a raise comes after the flag in that order, the
    /// setter sees the flag and takes `lock`, which it can only get once the
    /// waiter is parked, so its notify reaches it. If a raise comes before,
    /// the waiter's compare-exchange fails on the changed word and it
    /// re-checks the new value instead of parking. One location, so no fence
    /// is needed, and loom checks the protocol exactly.
    ///
    /// Watchers (the wakers of [`wait_all`](crate::wait_all) and
    /// [`wait_any`](crate::wait_any), see [`TimelineSignal::watch`]) count
    /// as waiters for as long as they are registered: `watch` sets the flag
    /// after adding its waker, and a raising `set` whose slow path finds
    /// watchers sets it again before waking them, so every raise while one
    /// is registered takes the slow path. Why none is missed: a raise after
    /// `watch`'s `fetch_or` in the word's order sees the flag and takes
    /// `lock`, by then holding the new waker, and wakes it. A raise before it
    /// is read by the multi-wait's look after `watch` (that look reads the
    /// word after the `fetch_or`). A raise between another setter's flag-
    /// clearing `fetch_max` and its re-flagging `fetch_or` finds no flag and
    /// wakes nobody, but that `fetch_or` reads the word after it, and the
    /// wake that follows makes the multi-wait look again, after the
    /// `fetch_or`: it sees the raise. After the last `unwatch` the flag
    /// stays until the next raise, which takes the slow path once for
    /// nothing.
    ///
    /// Orderings: `set` is `Release` (with `Acquire` for the flag it reads)
    /// so the work it stands for happens-before any waiter that `Acquire`s
    /// the raised value.
    state: AtomicU64,
    /// The waiters' lock; guards the failures and the watchers. `fail`
    /// records under it and waiters check under it, so a failure cannot
    /// slip between a waiter's check and its park.
    lock: Mutex<Waiters>,
    parked: Condvar,
    producer: Producer,
}

/// What [`Inner::lock`] guards.
#[derive(Default)]
struct Waiters {
    failures: Failures,
    /// The wakers of the multi-waits watching this signal, one entry per
    /// `watch`; each is woken after every raise and recorded failure.
    watchers: Vec<SignalWaker>,
}

impl Waiters {
    fn wake_watchers(&self) {
        for waker in &self.watchers {
            waker.wake();
        }
    }
}

impl CpuSignal {
    /// A new signal at `initial`.
    ///
    /// # Panics
    /// If `initial` exceeds [`MAX_SIGNAL_VALUE`].
    pub fn new(initial: u64) -> Self {
        if initial > MAX_SIGNAL_VALUE {
            value_out_of_range(initial);
        }
        Self {
            inner: Arc::new(Inner {
                state: AtomicU64::new(initial << 1),
                lock: Mutex::new(Waiters::default()),
                parked: Condvar::new(),
                producer: Producer::new(),
            }),
        }
    }

    /// Whether two handles name the same signal.
    pub fn same_as(&self, other: &CpuSignal) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The slow path of a raising `set` that cleared the flag: wakes every
    /// parked waiter and every watcher. Taking the lock is the hand-off that
    /// makes a waiter between its check and its park impossible (see
    /// `Inner::state`).
    #[cold]
    #[inline(never)]
    fn wake_all(&self) {
        let inner = &*self.inner;
        let waiters = inner.lock.lock();
        inner.parked.notify_all();
        if !waiters.watchers.is_empty() {
            // Watchers stay waiters: the next raise must come here too.
            inner.state.fetch_or(WAITING, Ordering::AcqRel);
            waiters.wake_watchers();
        }
    }

    #[cold]
    fn wait_slow(&self, target: u64, timeout: Timeout, start: Option<Instant>) -> Result<()> {
        let start = start.unwrap_or_else(Instant::now);
        let deadline = timeout.deadline_from(start);
        let inner = &*self.inner;
        let mut waiters = inner.lock.lock();
        loop {
            let word = inner.state.load(Ordering::Acquire);
            if word >> 1 >= target {
                return Ok(());
            }
            waiters.failures.check(target, word >> 1)?;
            if let Some(deadline) = deadline
                && Instant::now() >= deadline
            {
                return Err(Error::Timeout {
                    target,
                    current: word >> 1,
                    waited: start.elapsed(),
                });
            }
            if word & WAITING == 0
                && inner
                    .state
                    .compare_exchange(word, word | WAITING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                // The word changed since we read it: re-check the new value.
                continue;
            }
            waiters = inner.parked.wait_until(waiters, deadline);
        }
    }
}

impl TimelineSignal for CpuSignal {
    #[inline]
    fn value(&self) -> u64 {
        self.inner.state.load(Ordering::Acquire) >> 1
    }

    #[inline]
    fn set(&self, value: u64) {
        if value > MAX_SIGNAL_VALUE {
            value_out_of_range(value);
        }
        let new = value << 1;
        let old = self.inner.state.fetch_max(new, Ordering::AcqRel);
        if old & WAITING != 0 && old < new {
            self.wake_all();
        }
    }

    #[inline]
    fn is_reached(&self, target: u64) -> bool {
        self.value() >= target
    }

    #[inline]
    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        if self.inner.state.load(Ordering::Acquire) >> 1 >= target {
            return Ok(());
        }
        if target > MAX_SIGNAL_VALUE {
            return Err(Error::SignalValueOutOfRange {
                value: target,
                max: MAX_SIGNAL_VALUE,
            });
        }
        let timeout = timeout.into();
        // A finite timeout counts from here, spin included.
        let start = timed_start(timeout);
        // A queue about to finish the work waited for then costs no sleep
        // and wake-up.
        let reached = || self.is_reached(target).then_some(());
        if spin_before_blocking(timeout, start, reached).is_some() {
            return Ok(());
        }
        self.wait_slow(target, timeout, start)
    }

    fn fail(&self, upto: u64, cause: Error) {
        let inner = &*self.inner;
        let mut waiters = inner.lock.lock();
        let value = inner.state.load(Ordering::Acquire) >> 1;
        if waiters.failures.record(value, upto, cause, value) {
            inner.parked.notify_all();
            waiters.wake_watchers();
        }
    }

    /// Always `true`: a CPU signal wakes its watchers on every raise and
    /// every recorded failure (see `Inner::state` in the source).
    fn watch(&self, waker: &SignalWaker) -> bool {
        let inner = &*self.inner;
        let mut waiters = inner.lock.lock();
        waiters.watchers.push(waker.clone());
        // Under the lock, after the push: a raise that sees the flag finds
        // the waker once it gets the lock.
        inner.state.fetch_or(WAITING, Ordering::AcqRel);
        true
    }

    fn unwatch(&self, waker: &SignalWaker) {
        let mut waiters = self.inner.lock.lock();
        if let Some(at) = waiters.watchers.iter().position(|w| w.same_as(waker)) {
            waiters.watchers.swap_remove(at);
        }
    }

    fn producer(&self) -> &Producer {
        &self.inner.producer
    }
}

impl Default for CpuSignal {
    fn default() -> Self {
        Self::new(0)
    }
}

impl fmt::Debug for CpuSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuSignal")
            .field("value", &self.value())
            .finish()
    }
}
