//! How a recorded batch reaches its [`Engine`]: `submit` past its fast
//! path, a rejected batch abandoned in queue order, and the hand-over
//! (in place where the engine takes a batch so, else whole).

use std::mem;

use crate::error::{Error, Result};
use crate::profile::now_ns;

use super::Command;
use super::engine::Engine;
use super::{HardwareQueue, Queue};
use crate::signal::TimelineSignal;

impl<E: Engine> Queue<E> {
    /// `submit`'s work past the checks: a rejected batch abandoned (its
    /// collectives numbered), a failure reported (the batch abandoned too
    /// where the engine takes no more work), an empty batch dropped, else
    /// the batch numbered and handed over.
    pub(super) fn submit_recorded(&mut self) -> Result<()> {
        if let Some(error) = self.rejected.take() {
            let cause = std::sync::Arc::new(*error);
            // A signal recorded unclaimed (refused by the engine: another
            // device handle's) that another live queue has claimed since
            // is that queue's to set: failing it here would fail its
            // values up to this one (see `signal_checked`).
            let queue = self.id();
            self.batch.commands.retain(|command| match command {
                Command::Signal { signal, .. } => (signal.producer().queue())
                    .is_none_or(|producer| producer == queue || !producer.is_live()),
                _ => true,
            });
            // Submitted on this rank all the same: its collectives take
            // their places, which the engine forfeits (see there).
            if self.batch.collectives {
                self.stamp_collectives();
            }
            self.abandon_recorded(Error::BatchRejected {
                cause: cause.clone(),
            });
            return Err(Error::BatchRejected { cause });
        }
        if let Err(error) = self.engine.ledger().report(&mut self.epoch) {
            // An engine that takes no more work (`Ledger::refuse_all`)
            // reports at every call: the batch recorded is let go unrun,
            // or an owner that goes on recording and submitting would grow
            // it without bound.
            if self.engine.ledger().refuses() {
                // Let go on this rank all the same: its collectives take
                // their places, which the engine forfeits (as a rejected
                // batch's), or the communicator's next collective would
                // meet the peers' one this rank skipped (helper-78).
                if self.batch.collectives {
                    self.stamp_collectives();
                }
                self.abandon_recorded(error.clone());
            }
            return Err(error);
        }
        if self.batch.is_empty() {
            // A replay key given for it must not reach the next batch.
            self.engine.replay_next(None);
            return Ok(());
        }
        self.batch.epoch = self.epoch;
        if let Some(profile) = self.profile.as_deref_mut() {
            profile.submitted += 1;
            self.batch.sequence = profile.submitted;
        }
        if self.batch.collectives {
            self.stamp_collectives();
        }
        self.hand_over();
        Ok(())
    }

    /// Hands the recorded batch, which will not run, to the engine to fail
    /// its signals with `cause` in queue order: after the batches submitted
    /// before it, since failing at once would fail a value an earlier batch
    /// is about to set (`fail(upto)` covers every unreached value up to
    /// `upto`), and its waiters would wake with an error although their
    /// work completes. With no unreached signal, this hands nothing over.
    pub(super) fn abandon_recorded(&mut self, cause: Error) {
        // An abandoned batch is never replayed, nor is the next one by its key.
        self.engine.replay_next(None);
        // A numbered collective goes to the engine too (to forfeit).
        if !self.batch.has_something_to_fail() && !self.batch.collectives_numbered() {
            self.batch.clear();
            return;
        }
        self.batch.abandoned = Some(Box::new(cause));
        self.batch.epoch = self.epoch;
        self.hand_over();
    }

    /// `submit` past its fast path (see [`HardwareQueue::submit`]): a
    /// batch rejected or empty, a failure to report, or a queue that has
    /// profiled (timed here while profiling is on).
    #[inline(never)]
    pub(super) fn submit_general(&mut self) -> Result<()> {
        if !self.profiling() {
            return self.submit_recorded();
        }
        let start = now_ns();
        let before = self.profile.as_deref().map_or(0, |p| p.submitted);
        let outcome = self.submit_recorded();
        // The batch this call submitted; 0 when it submitted none (an
        // empty batch, an earlier failure reported).
        let after = self.profile.as_deref().map_or(0, |p| p.submitted);
        let batch = if after > before { after } else { 0 };
        self.host_event("submit", batch, start, &outcome);
        outcome
    }

    #[inline]
    pub(super) fn hand_over(&mut self) {
        if self.engine.submit_in_place(&mut self.batch) {
            self.batch.clear();
            return;
        }
        self.submit_whole();
    }

    /// The end of [`hand_over`](Self::hand_over) once the engine did not
    /// take the batch in place: the batch goes to the engine whole.
    #[inline(never)]
    fn submit_whole(&mut self) {
        let batch = mem::take(&mut self.batch);
        // What the engine hands back is only memory to record into: emptied
        // here, whatever the engine left in it.
        self.batch = self.engine.submit(batch);
        self.batch.clear();
    }
}
