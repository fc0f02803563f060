//! Timeline signals: monotonically increasing `u64` values that stand for
//! completed work.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::multi_wait::SignalWaker;
use crate::queue::QueueId;
use crate::sync::{AtomicU64, Ordering};
use crate::wait_policy::WaitTuning;

/// The largest value a timeline signal holds: `2^63 - 1`.
///
/// Signals keep one bit of their word for bookkeeping (the CPU signal's
/// "somebody is waiting" flag). A compiler counting one value per batch at a
/// billion batches a second needs three centuries to get there.
pub const MAX_SIGNAL_VALUE: u64 = u64::MAX >> 1;

/// How long a `wait` may block.
///
/// There is no magic `0`: a zero [`Duration`] means "do not block at all", and
/// [`Timeout::Forever`] means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// Give up after this long.
    After(Duration),
    /// Block until the target is reached or the work fails.
    Forever,
}

impl Timeout {
    /// The instant a wait starting at `start` gives up, or `None` for never.
    /// A duration too large to represent counts as forever.
    pub fn deadline_from(self, start: Instant) -> Option<Instant> {
        match self {
            Timeout::After(duration) => start.checked_add(duration),
            Timeout::Forever => None,
        }
    }
}

impl From<Duration> for Timeout {
    fn from(duration: Duration) -> Self {
        Timeout::After(duration)
    }
}

impl From<Option<Duration>> for Timeout {
    fn from(duration: Option<Duration>) -> Self {
        duration.map_or(Timeout::Forever, Timeout::After)
    }
}

/// A monotonically increasing `u64` standing for completed work.
///
/// `value()` is the highest value whose work has **completed**: a queue's
/// `signal(s, v)` raises `s` to `v` only after every earlier command of that
/// queue finished. Values only rise: a lower `set` is ignored.
///
/// When the work that would have raised a signal fails, the signal is *failed
/// up to* the values that work would have set: waiters for those values wake
/// with [`Error::SignalFailed`] instead of blocking forever. Values above stay
/// usable, so a later batch with fresh values works as usual.
///
/// # One producing queue per signal
///
/// A failure covers every unreached value up to the failed one, because a
/// timeline's values are set in order: a value below the failed one that
/// is not reached yet would only have been reached by the same stream of
/// work. That holds only while one queue produces the signal. So the first
/// queue that records `signal(s, v)` becomes `s`'s producer (its
/// [`Producer`]), and another queue's `signal` on `s` rejects that queue's
/// batch with [`Error::SignalProducerConflict`] for as long as the producer
/// or work it submitted lives; after that, another queue may take it over.
/// The host may [`set`](Self::set) any signal: a set value is reached, even
/// one a failure covered. Give each queue its own signal and let other
/// queues and the host wait on it; that is what the executor does.
///
/// Handles are cheap to clone and all clones name the same signal.
pub trait TimelineSignal: Clone + Send + Sync + 'static {
    /// The highest value whose work has completed. Never blocks.
    fn value(&self) -> u64;

    /// Raises the value to `value` from the host; a lower value is ignored.
    ///
    /// # Panics
    /// If `value` exceeds [`MAX_SIGNAL_VALUE`]: that is a programming error
    /// (queues report it as an error at `submit` instead).
    fn set(&self, value: u64);

    /// Whether `value() >= target`. Never blocks.
    fn is_reached(&self, target: u64) -> bool {
        self.value() >= target
    }

    /// Whether `target` is settled: reached, or the work that would set it
    /// failed (a wait for it would not block). Never blocks.
    fn is_settled(&self, target: u64) -> bool {
        !matches!(
            self.wait(target, Duration::ZERO),
            Err(Error::Timeout { .. })
        )
    }

    /// Blocks until `value() >= target`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` passes first (with the target, the
    /// value reached and the time waited); [`Error::SignalFailed`] when the
    /// work that would have set `target` failed;
    /// [`Error::SignalValueOutOfRange`] for a target past
    /// [`MAX_SIGNAL_VALUE`], which no signal can reach.
    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()>;

    /// Marks every value up to `upto` that is not reached yet as failed with
    /// `cause`, and wakes their waiters with [`Error::SignalFailed`].
    ///
    /// Queues call this for the signals of a batch that failed. Values above
    /// `upto`, and values already reached, are not affected; neither are
    /// values that work already handed to a device stands for (a GPU
    /// signal's recorded events): their work decides them.
    fn fail(&self, upto: u64, cause: Error);

    /// Which queue produces this signal (see the rule above).
    fn producer(&self) -> &Producer;

    /// Asks the signal to [`wake`](SignalWaker::wake) `waker` after every
    /// change that may settle a wait on it, until
    /// [`unwatch`](Self::unwatch); returns whether it will.
    ///
    /// [`wait_all`](crate::wait_all) and [`wait_any`](crate::wait_any)
    /// sleep on a waker that every signal of their list watches, so they
    /// block without polling. A signal that returns `true` must wake
    /// `waker` after each raise of its value and each [`fail`](Self::fail)
    /// that records a failure, once the change is visible to `value`,
    /// `is_reached` and `wait`; extra wakes are harmless. The default
    /// returns `false` and the waiter polls this signal with a bounded
    /// back-off instead (10 µs doubling to 1 ms): the CUDA signal does so,
    /// since its value moves when the GPU completes an event and no host
    /// thread is there to wake anyone.
    fn watch(&self, _waker: &SignalWaker) -> bool {
        false
    }

    /// Ends one [`watch`](Self::watch) of `waker` (a waker watched twice
    /// stays watched until unwatched twice); nothing if `waker` is not
    /// watched.
    fn unwatch(&self, _waker: &SignalWaker) {}

    /// For [`wait_all`](crate::wait_all) (`all`) and
    /// [`wait_any`](crate::wait_any) over signals that all declined
    /// [`watch`](Self::watch): blocks for at most `timeout` until every
    /// value of `waits` is reached (`all`), or one is, by the backend's own
    /// multi-wait where all of `waits` can take it together (the Vulkan
    /// signal: `vkWaitSemaphores` on one device, with
    /// `VK_SEMAPHORE_WAIT_ANY_BIT` for any). Returns whether it waited so;
    /// the caller then looks at the signals again, failures included (this
    /// only replaces a sleep of the polling back-off). The default returns
    /// `false` at once, and the caller sleeps its back-off.
    fn wait_native(waits: &[(&Self, u64)], all: bool, timeout: Duration) -> bool {
        let _ = (waits, all, timeout);
        false
    }

    /// The device [`WaitTuning`] by which a host wait for `target` spins
    /// before it sleeps (see [`crate::wait_policy`]), for
    /// [`wait_all`](crate::wait_all) and [`wait_any`](crate::wait_any),
    /// which spin for the longest budget among the tunings of their
    /// signals not reached yet (looking at every signal, failures
    /// included) and then sleep as
    /// usual. The CUDA signal answers its event's device's. The default,
    /// `None`, leaves the signal to the short spin every multi-wait takes
    /// (the thread's adaptive spin, about 25 µs at most). Never blocks.
    fn wait_tuning(&self, target: u64) -> Option<&'static WaitTuning> {
        let _ = target;
        None
    }
}

/// The queue that produces a signal: the first to record a `signal` on it,
/// until that queue and its submitted work are gone. Every signal type
/// holds one and hands it out through [`TimelineSignal::producer`].
///
/// | value | meaning | written by | how |
/// |-------|---------|------------|-----|
/// | 0 | no producer yet | `new` | |
/// | a [`QueueId`] | that queue produces the signal | `claim`, on recording a `signal` | `compare_exchange(AcqRel)` from 0 or from a queue no longer live |
///
/// A claim by the producer itself is one `Relaxed` load. The id orders
/// nothing else (the signal's own value and lock do), so `Relaxed` loads
/// suffice; the compare-exchange makes two claimers agree on one winner.
#[derive(Debug)]
pub struct Producer {
    queue: AtomicU64,
}

impl Default for Producer {
    fn default() -> Self {
        Self::new()
    }
}

impl Producer {
    /// No producer yet.
    pub fn new() -> Self {
        Self {
            queue: AtomicU64::new(0),
        }
    }

    /// Makes `queue` the producer, unless another live queue is.
    ///
    /// # Errors
    /// The producing queue, when it is another one and still live.
    #[inline]
    pub fn claim(&self, queue: QueueId) -> std::result::Result<(), QueueId> {
        let me = queue.get();
        let mut current = self.queue.load(Ordering::Relaxed);
        loop {
            if current == me {
                return Ok(());
            }
            if let Some(other) = QueueId::from_raw(current)
                && other.is_live()
            {
                return Err(other);
            }
            match self
                .queue
                .compare_exchange(current, me, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => current = now,
            }
        }
    }

    /// Whether `queue` claimed the signal (one load): what
    /// [`claim`](Self::claim) by `queue` answers first.
    #[inline]
    pub fn is_claimed_by(&self, queue: QueueId) -> bool {
        self.queue.load(Ordering::Relaxed) == queue.get()
    }

    /// The producing queue, if any queue claimed the signal.
    pub fn queue(&self) -> Option<QueueId> {
        QueueId::from_raw(self.queue.load(Ordering::Relaxed))
    }
}

/// The failures of one signal, as `(above, upto, cause)` sorted by `upto`:
/// every unreached value in `above + 1 ..= upto` of an entry failed with its
/// cause (the first cause recorded for that range). `above` is the signal's
/// value when the failure was recorded, or higher where values up to it are
/// promised by work already handed to a device. Causes at or below the
/// signal's value are dropped, since a reached value is never reported
/// failed. Kept under the signal's lock by each backend's signal.
///
/// For a backend's own [`TimelineSignal`]: its `fail(upto, cause)` records
/// here (`record(value, upto, cause, value)`), its `set` calls
/// [`forget_reached`](Self::forget_reached), and a waiter on an unreached
/// target asks [`check`](Self::check) each time it wakes, so a failure
/// wakes every waiter with [`Error::SignalFailed`] once and a later `set`
/// past the range still satisfies a waiter (the conformance suite checks
/// both).
#[derive(Debug, Default)]
pub struct Failures(Vec<(u64, u64, std::sync::Arc<Error>)>);

impl Failures {
    /// Records that values in `above + 1 ..= upto` failed with `cause`, the
    /// signal being at `reached <= above`. Whether anything new was
    /// recorded: the caller then wakes its waiters. Nothing is when the
    /// range is empty, or an entry already covers it (a device fault that
    /// every fold finds again): waking the waiters for it would only have
    /// them look, find the same failure, and wake each other again.
    pub fn record(&mut self, above: u64, upto: u64, cause: Error, reached: u64) -> bool {
        if upto <= above {
            return false;
        }
        self.forget_reached(reached);
        // An entry for the same `upto` that covers the new range already
        // names the first cause; keep it.
        let covered = self
            .0
            .iter()
            .any(|(old_above, old, _)| *old == upto && *old_above <= above);
        if !covered {
            // After the entries with the same `upto`: the first recorded
            // cause wins among them.
            let at = self.0.partition_point(|(_, old, _)| *old <= upto);
            self.0.insert(at, (above, upto, std::sync::Arc::new(cause)));
        }
        !covered
    }

    /// Drops the causes of values now reached.
    pub fn forget_reached(&mut self, reached: u64) {
        // Most signals never failed: no call into `retain` for them (it was
        // a tenth of hwqueue's own cost of a CUDA `signal` + `submit`).
        if !self.0.is_empty() {
            self.0.retain(|(_, upto, _)| *upto > reached);
        }
    }

    /// For a waiter on `target`, not reached (the signal is at `current`):
    /// [`Error::SignalFailed`] if the work that would set it failed.
    ///
    /// # Errors
    /// [`Error::SignalFailed`] with the range's first cause.
    pub fn check(&self, target: u64, current: u64) -> Result<()> {
        match self
            .0
            .iter()
            .find(|(above, upto, _)| *above < target && target <= *upto)
        {
            Some((_, _, cause)) => Err(Error::SignalFailed {
                target,
                current,
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The failed ranges, `(above, upto)`: values `above + 1 ..= upto`.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|&(above, upto, _)| (above, upto))
    }

    /// The highest failed value (0: none), for debugging output.
    pub fn highest(&self) -> u64 {
        self.0.last().map_or(0, |(_, upto, _)| *upto)
    }
}

/// The spin a host wait takes before it blocks (bounded and adaptive: see
/// `SpinWait`), looking with `look` until it finds something; `None` when
/// the spin ran out or a finite `timeout`, counted from `start` (when the
/// wait began: [`timed_start`]), passed, and at once for a zero `timeout`
/// (which asks not to wait at all). Only values are read while spinning: a failure is seen once
/// the wait blocks. `CpuSignal::wait`, `wait_all` and `wait_any` share it.
pub(crate) fn spin_before_blocking<R>(
    timeout: Timeout,
    start: Option<Instant>,
    look: impl Fn() -> Option<R>,
) -> Option<R> {
    if timeout == Timeout::After(Duration::ZERO) {
        return None;
    }
    let spin = crate::sync::SpinWait::new();
    if !spin.has_budget() {
        return None;
    }
    let found = std::cell::Cell::new(None);
    let deadline = start.and_then(|start| timeout.deadline_from(start));
    spin.until_before(deadline, || {
        let seen = look();
        let done = seen.is_some();
        found.set(seen);
        done
    });
    found.into_inner()
}

/// When a wait with `timeout` began, for its deadline: now where the
/// timeout is finite; `None` for [`Timeout::Forever`], which has no
/// deadline to count, so that its spin reads no clock.
pub(crate) fn timed_start(timeout: Timeout) -> Option<Instant> {
    matches!(timeout, Timeout::After(_)).then(Instant::now)
}

/// Checks a timeline value given to `set` or `signal`: at most
/// [`MAX_SIGNAL_VALUE`].
///
/// # Errors
/// [`Error::SignalValueOutOfRange`].
pub fn check_value(value: u64) -> Result<()> {
    if value > MAX_SIGNAL_VALUE {
        Err(Error::SignalValueOutOfRange {
            value,
            max: MAX_SIGNAL_VALUE,
        })
    } else {
        Ok(())
    }
}

/// The one panic of a signal `set` past the range: a programming error.
#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn value_out_of_range(value: u64) -> ! {
    panic!(
        "{}",
        Error::SignalValueOutOfRange {
            value,
            max: MAX_SIGNAL_VALUE
        }
    )
}

/// Sleeps between polls of a signal that cannot notify: 10 µs first, then
/// twice as long each time, up to 1 ms (the event ring's timed waits and
/// the multi-waits over such signals).
#[derive(Debug)]
pub(crate) struct PollBackoff {
    next: Duration,
}

impl PollBackoff {
    const FIRST: Duration = Duration::from_micros(10);
    const LONGEST: Duration = Duration::from_millis(1);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The next sleep; the one after is twice as long, up to the longest.
    pub(crate) fn step(&mut self) -> Duration {
        let sleep = self.next;
        self.next = (sleep * 2).min(Self::LONGEST);
        sleep
    }
}
