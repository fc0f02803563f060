//! [`EventRing::abandon`]: failing a value whose event is recorded, for
//! work that was given up on the device (an aborted NCCL collective), so
//! that its event completing no longer means its work was done.

use super::{EventRing, RingEvent};
use crate::error::Error;
use crate::sync::{Arc, Ordering};

impl<E: RingEvent> EventRing<E> {
    /// Fails `value` even where an event recorded for it will complete:
    /// the work before that event was abandoned on the device (hwqueue's
    /// NCCL watchdog aborts a communicator whose collective timed out, and
    /// the aborted kernels then exit, which completes the events behind
    /// them). Values from just above the highest other recorded value
    /// below `value` (or the completed value) up to `value` fail with
    /// `cause`, and their waiters wake with [`Error::SignalFailed`]; a
    /// waiter already blocked on the event sees the failure once the event
    /// completes. A value already reached is not affected, nor are other
    /// recorded values: a later one whose event completes reaches the
    /// value as usual (a timeline only rises).
    ///
    /// The slots recorded for `value` stand for no value any more, and
    /// are replaced like done slots; their events are kept (not recorded
    /// again) until they complete, for a settled wait on a value this
    /// abandon failed to order after on the device
    /// ([`given_up`](Self::given_up)). A later [`record`](Self::record) of
    /// a value that failed up to `value` records nothing (it stays
    /// failed): the work before it came after the abandoned work, over
    /// what that left. That holds after the queue's owner was told too:
    /// signal a higher value (or `set` it from the host) rather than the
    /// failed one again.
    pub fn abandon(&self, value: u64, cause: Error) {
        let mut guard = self.state.lock();
        self.fold(&mut guard);
        let state = &mut *guard;
        if value <= state.completed {
            return;
        }
        state.abandoned = state.abandoned.max(value);
        let done = take_done(&mut state.given_up);
        // A slot of value 0 is a done slot: `completed` is never below 0,
        // and no target is 0 once it is not reached.
        let mut events = Vec::new();
        for slot in state.slots.iter_mut().filter(|slot| slot.value == value) {
            slot.value = 0;
            events.push(slot.event.clone());
        }
        // No slot stands for `value` now: what `fail` does for it.
        if let Some(above) = self.fail_unrecorded(state, value, cause) {
            // The values this failed: `above` to `value`, but for those
            // failed already (the ranges recorded before this one).
            let earlier: Vec<(u64, u64)> = (state.failures.ranges())
                .filter(|&(low, high)| low < value && high > above && (low, high) != (above, value))
                .collect();
            // Held, so never recorded again until they completed.
            let kept = events.drain(..).map(|event| GivenUp {
                above,
                value,
                earlier: earlier.clone(),
                event,
            });
            state.given_up.extend(kept);
        } else if !events.is_empty() {
            // The range had failed before (a `fail` of `value` before it
            // was recorded), so nothing new was recorded. Every waiter for
            // a value in it fails at its look, so none should be spinning
            // on a moved slot's event; should one be, it must learn that
            // the event stands for nothing now, or it would raise the
            // value once the event completes. (A rare path: the wake is
            // free.)
            self.failed.fetch_add(1, Ordering::Release);
            self.changed.notify_all();
        }
        drop(guard);
        // Destroying an event calls the driver: outside the lock.
        drop((done, events));
    }

    /// The event of abandoned work that a settled wait for `target`, a
    /// value [`abandon`](Self::abandon) failed, must still order after on
    /// the device, until it completes: the abandoned work may still run
    /// (until the abort that makes it exit, which can come later), and
    /// work let through by the failure would run beside it, over the
    /// memory it writes. `None` for a value no abandon failed (one failed
    /// before it, by a batch's failure, say, whatever failed it after),
    /// and once the work exited (those done are let go here and by the
    /// next abandon; until then they stay, with the contexts they hold).
    pub fn given_up(&self, target: u64) -> Option<Arc<E>> {
        let mut state = self.state.lock();
        let done = take_done(&mut state.given_up);
        let failed = (state.given_up.iter()).find(|given_up| given_up.failed(target));
        let event = failed.map(|given_up| given_up.event.clone());
        drop(state);
        drop(done);
        event
    }
}

/// An abandoned record whose work may still run on the device: the
/// values its abandon failed (`above`, exclusive, to `value`, but for the
/// ranges that had failed before it, `earlier`), and its event, held
/// until it completes.
pub(super) struct GivenUp<E> {
    above: u64,
    value: u64,
    earlier: Vec<(u64, u64)>,
    event: Arc<E>,
}

impl<E> GivenUp<E> {
    /// Whether its abandon failed `target`.
    fn failed(&self, target: u64) -> bool {
        let within = |(low, high): (u64, u64)| low < target && target <= high;
        within((self.above, self.value)) && !self.earlier.iter().any(|&range| within(range))
    }
}

/// Takes the entries of `given_up` whose work completed (or whose event
/// reports a fault), for the caller to drop outside the ring's lock.
fn take_done<E: RingEvent>(given_up: &mut Vec<GivenUp<E>>) -> Vec<GivenUp<E>> {
    let mut done = Vec::new();
    let mut index = 0;
    while index < given_up.len() {
        if given_up[index].event.is_complete().unwrap_or(true) {
            done.push(given_up.swap_remove(index));
        } else {
            index += 1;
        }
    }
    done
}
