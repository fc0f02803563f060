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
    /// The slots recorded for `value` keep their events (a waiter may hold
    /// them) but stand for no value any more: they are reused like done
    /// slots. A later [`record`](Self::record) of a value that failed up to
    /// `value` records nothing (it stays failed): the work before it came
    /// after the abandoned work, over what that left. That holds after the
    /// queue's owner was told too: signal a higher value (or `set` it from
    /// the host) rather than the failed one again.
    pub fn abandon(&self, value: u64, cause: Error) {
        let mut guard = self.state.lock();
        self.fold(&mut guard);
        let state = &mut *guard;
        if value <= state.completed {
            return;
        }
        state.abandoned = state.abandoned.max(value);
        // A slot of value 0 is a done slot: `completed` is never below 0,
        // and no target is 0 once it is not reached.
        let mut moved = false;
        let given_up = &mut state.given_up;
        given_up.retain(|(_, event)| !event.is_complete().unwrap_or(true));
        for slot in state.slots.iter_mut().filter(|slot| slot.value == value) {
            slot.value = 0;
            moved = true;
            // Held, so never re-recorded until it completed.
            given_up.push((value, slot.event.clone()));
        }
        // No slot stands for `value` now: what `fail` does for it.
        if !self.fail_unrecorded(state, value, cause) && moved {
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
    }

    /// The event of abandoned work that a settled wait for `target`, a
    /// value [`abandon`](Self::abandon) failed, must still order after on
    /// the device: the smallest abandoned value `>= target` whose event has
    /// not completed. The abandoned work may still run (until the abort
    /// that makes it exit, which can come later), so work let through by
    /// the failure would run beside it, over the memory it writes. `None`
    /// once it exited (those done are let go).
    pub fn given_up(&self, target: u64) -> Option<Arc<E>> {
        let mut state = self.state.lock();
        let given_up = &mut state.given_up;
        given_up.retain(|(_, event)| !event.is_complete().unwrap_or(true));
        let pending = given_up.iter().filter(|(value, _)| *value >= target);
        pending
            .min_by_key(|(value, _)| *value)
            .map(|(_, event)| event.clone())
    }
}
