//! [`EventRing::wait`]: a host thread waiting for a value of a ring,
//! spinning on the event that stands for it, then sleeping.

use std::time::Instant;

use super::{EventRing, RingEvent, Step};
use crate::error::{Error, Result};
use crate::signal::{PollBackoff, Timeout, check_value};
use crate::sync::Ordering;
use crate::wait_policy::{WaitTuning, spin_until};

/// Whether `nap` has passed. Never under loom, whose condvar ignores
/// deadlines: a model's nap ends by a notification only, and a branch on
/// the real clock would make its executions differ.
fn passed(nap: Instant) -> bool {
    !cfg!(loom) && Instant::now() >= nap
}

impl<E: RingEvent> EventRing<E> {
    /// Blocks until `value() >= target`: waits for the event of the
    /// smallest recorded value `>= target`, or, while none is recorded,
    /// waits on the host for a record, a `set` or a failure.
    ///
    /// On an event, the wait first polls it for the spin budget of the
    /// event's [`WaitTuning`] ([`RingEvent::wait_tuning`]; see
    /// [`crate::wait_policy`]), watching the ring meanwhile: a host `set`
    /// that reaches `target` or a `fail` that settles it ends the spin at
    /// once. Then it sleeps: with [`Timeout::Forever`] it blocks on the
    /// event itself (a `set` or `fail` arriving meanwhile is seen once that
    /// event completes, which recorded work always does); with a finite
    /// timeout it polls the event with back-off from 10 µs to 1 ms,
    /// asleep on the ring between polls, so that a `set`, `fail` or
    /// `abandon` ends the sleep at once. Under
    /// [`WaitPolicy::Spin`](crate::WaitPolicy::Spin) the spin lasts until
    /// the wait is over or the timeout passes. A wait that waited on an
    /// event (with a timeout that is not zero) counts its length into the
    /// tuning's average (one that timed out, only where it raises it: it
    /// never saw how long its event took).
    ///
    /// # Errors
    /// [`Error::Timeout`] with the target, the value reached and the time
    /// waited; [`Error::SignalFailed`] when the work that would have set
    /// `target` failed, or its event reports a device failure;
    /// [`Error::SignalValueOutOfRange`].
    pub fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        if self.reached.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        check_value(target)?;
        let start = Instant::now();
        let deadline = timeout.into().deadline_from(start);
        // A wait with a finite timeout polls the event after its spin (an
        // event cannot be waited on with a timeout); an unbounded one
        // blocks instead.
        let mut poll = PollBackoff::new();
        // Since when this wait waits on an event, and that event's device
        // tuning: counted into the average once the wait is over.
        let mut on_event: Option<(Instant, Option<&'static WaitTuning>)> = None;
        let counts = deadline.is_none_or(|deadline| deadline > start);
        // `record`, or for a wait that timed out `record_at_least`.
        let count = |on_event: Option<(Instant, Option<&'static WaitTuning>)>,
                     how: fn(&WaitTuning, std::time::Duration)| {
            if let Some((since, Some(tuning))) = on_event
                && counts
            {
                how(tuning, since.elapsed());
            }
        };
        let mut state = self.state.lock();
        loop {
            let step = self.step(&mut state, target);
            let (value, event) = match step {
                Ok(Step::Reached) => {
                    drop(state);
                    count(on_event, WaitTuning::record);
                    return Ok(());
                }
                Err(error) => return Err(error),
                Ok(Step::Unrecorded) => {
                    state = self.park(state, target, start, deadline)?;
                    continue;
                }
                Ok(Step::Recorded(value, event)) => (value, event),
            };
            // Under the lock, with the failures `step` checked.
            let failed = self.failed.load(Ordering::Acquire);
            drop(state);
            let tuning = event.wait_tuning();
            let since = on_event.map_or_else(Instant::now, |(since, _)| since);
            on_event = Some((since, tuning));
            let budget = tuning.map_or(std::time::Duration::ZERO, WaitTuning::spin_budget);
            // The spin's budget runs from when the wait first found an
            // event to wait on (a wait that comes back here after a change
            // spins only what is left; time parked for a record before
            // that is neither spun nor counted).
            let spun = spin_until(since, budget, deadline, || {
                if self.reached.load(Ordering::Acquire) >= target
                    || self.failed.load(Ordering::Acquire) != failed
                {
                    return Some(None);
                }
                match event.is_complete() {
                    Ok(false) => None,
                    done => Some(Some(done)),
                }
            });
            let complete = match spun {
                // The ring changed: look again under the lock.
                Some(None) => {
                    drop(event);
                    state = self.state.lock();
                    continue;
                }
                Some(Some(done)) => done,
                None => match deadline {
                    None => event.synchronize().map(|()| true),
                    Some(_) => event.is_complete(),
                },
            };
            // Our clone goes before the lock is taken again: if the ring
            // replaced the slot meanwhile, this is the last handle.
            drop(event);
            match complete {
                Ok(true) => {
                    let mut guard = self.state.lock();
                    if self.failed.load(Ordering::Acquire) != failed {
                        // A failure since: it may have abandoned `value`
                        // (`abandon`), whose event then says nothing.
                        state = guard;
                        continue;
                    }
                    self.raise(&mut guard, value);
                    drop(guard);
                    count(on_event, WaitTuning::record);
                    return Ok(());
                }
                Ok(false) => {}
                Err(cause) => {
                    // The event broke, but the host may have set the value
                    // meanwhile, or a later record's event (of another
                    // context, which did not break) completed: a reached
                    // value is never reported failed. The fold queries the
                    // broken event again, on this failure's path only.
                    let mut guard = self.state.lock();
                    self.fold(&mut guard);
                    let current = guard.completed;
                    drop(guard);
                    if current >= target {
                        count(on_event, WaitTuning::record);
                        return Ok(());
                    }
                    return Err(Error::SignalFailed {
                        target,
                        current,
                        cause: std::sync::Arc::new(cause),
                    });
                }
            }
            // Only a finite deadline gets here.
            let now = Instant::now();
            match deadline {
                Some(deadline) if now < deadline => {
                    // Asleep on `changed`, not `thread::sleep`: a `set`, a
                    // `fail` or an `abandon` (each notifies under the
                    // lock) ends the nap at once instead of up to 1 ms
                    // later. Checked under the lock first, so none is
                    // missed between the look above and the sleep. A
                    // record or a raise short of `target` notifies too:
                    // the nap goes on to its end through those.
                    let nap = now + poll.step().min(deadline - now);
                    let mut guard = self.state.lock();
                    while self.reached.load(Ordering::Acquire) < target
                        && self.failed.load(Ordering::Acquire) == failed
                        && !passed(nap)
                    {
                        guard = self.changed.wait_until(guard, Some(nap));
                    }
                    state = guard;
                    continue;
                }
                _ => {
                    // Ran out before its event completed: the wait was at
                    // least this long, which only raises the average.
                    count(on_event, WaitTuning::record_at_least);
                    return Err(Error::Timeout {
                        target,
                        current: self.value(),
                        waited: start.elapsed(),
                    });
                }
            }
        }
    }
}
