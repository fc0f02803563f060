//! Timeline signals: monotonically increasing `u64` values that stand for
//! completed work.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

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
    /// `upto`, and values already reached, are not affected.
    fn fail(&self, upto: u64, cause: Error);
}

/// The failures of one signal, as `(upto, cause)` sorted by `upto`: every
/// unreached value `<= upto` of an entry failed with its cause (the first
/// cause recorded for that `upto`). Causes at or below the signal's value
/// are dropped, since a reached value is never reported failed. Kept under
/// the signal's lock by each backend's signal.
#[derive(Debug, Default)]
pub(crate) struct Failures(Vec<(u64, std::sync::Arc<Error>)>);

impl Failures {
    /// Records that values up to `upto` failed with `cause`, given the
    /// signal's value `reached`. Whether anything was recorded (nothing is
    /// when `upto` is already reached): the caller then wakes its waiters.
    pub(crate) fn record(&mut self, upto: u64, cause: Error, reached: u64) -> bool {
        if upto <= reached {
            return false;
        }
        self.forget_reached(reached);
        let at = self.0.partition_point(|(old, _)| *old < upto);
        if self.0.get(at).is_none_or(|(old, _)| *old != upto) {
            self.0.insert(at, (upto, std::sync::Arc::new(cause)));
        }
        true
    }

    /// Drops the causes of values now reached.
    pub(crate) fn forget_reached(&mut self, reached: u64) {
        self.0.retain(|(upto, _)| *upto > reached);
    }

    /// For a waiter on `target`, not reached (the signal is at `current`):
    /// [`Error::SignalFailed`] if the work that would set it failed.
    pub(crate) fn check(&self, target: u64, current: u64) -> Result<()> {
        match self.0.iter().find(|(upto, _)| *upto >= target) {
            Some((_, cause)) => Err(Error::SignalFailed {
                target,
                current,
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The highest failed value (0: none), for debugging output.
    pub(crate) fn highest(&self) -> u64 {
        self.0.last().map_or(0, |(upto, _)| *upto)
    }
}

/// Checks a timeline value given to `set` or `signal`.
pub(crate) fn check_value(value: u64) -> Result<()> {
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
