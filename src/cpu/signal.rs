//! `CpuSignal`: a timeline signal in one atomic word, with no lost wake-up.

use std::fmt;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::signal::{
    Failures, MAX_SIGNAL_VALUE, Producer, TimelineSignal, Timeout, value_out_of_range,
};
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering};

/// The low bit of [`Inner::state`]: a waiter may be parked.
const WAITING: u64 = 1;

/// A timeline signal for the CPU backend; also usable from any host thread.
///
/// - `set` with nobody waiting is one `fetch_max` (no lock, no fence);
/// - `wait` on a reached value is one atomic load;
/// - a waiter is never lost: the protocol is documented on the state word
///   in this file's source, and checked by the loom models.
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
    /// Orderings: `set` is `Release` (with `Acquire` for the flag it reads)
    /// so the work it stands for happens-before any waiter that `Acquire`s
    /// the raised value.
    state: AtomicU64,
    /// The waiters' lock; guards the failures. `fail` records under it and
    /// waiters check under it, so a failure cannot slip between a waiter's
    /// check and its park.
    lock: Mutex<Failures>,
    parked: Condvar,
    producer: Producer,
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
                lock: Mutex::new(Failures::default()),
                parked: Condvar::new(),
                producer: Producer::new(),
            }),
        }
    }

    /// Whether two handles name the same signal.
    pub fn same_as(&self, other: &CpuSignal) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    #[cold]
    fn wait_slow(&self, target: u64, timeout: Timeout) -> Result<()> {
        let start = Instant::now();
        let deadline = timeout.deadline_from(start);
        let inner = &*self.inner;
        let mut failures = inner.lock.lock();
        loop {
            let word = inner.state.load(Ordering::Acquire);
            if word >> 1 >= target {
                return Ok(());
            }
            failures.check(target, word >> 1)?;
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
            failures = inner.parked.wait_until(failures, deadline);
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
            // This raise cleared the flag: wake every parked waiter. Taking
            // the lock is the hand-off that makes a waiter between its check
            // and its park impossible (see `Inner::state`).
            let _guard = self.inner.lock.lock();
            self.inner.parked.notify_all();
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
        self.wait_slow(target, timeout.into())
    }

    fn fail(&self, upto: u64, cause: Error) {
        let inner = &*self.inner;
        let mut failures = inner.lock.lock();
        let value = inner.state.load(Ordering::Acquire) >> 1;
        if failures.record(value, upto, cause, value) {
            inner.parked.notify_all();
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
