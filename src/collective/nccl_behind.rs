//! What a CUDA stream enqueued *behind* an NCCL group still in flight, so
//! that the watchdog's abort fails it too (`nccl_watchdog.rs`).
//!
//! An abort makes NCCL's kernels exit: the stream moves on, and work the
//! queue put on it after the group runs over whatever the aborted
//! collective left in its views, then completes the events of its
//! signals. Under [`FailureScope::Queue`](crate::FailureScope) (the
//! default) a failure takes down every batch submitted before the owner
//! knew of it; for a failure found on the device after later batches were
//! already on the stream, that takes more than the ledger's cascade
//! (which stops batches not run yet): each group keeps a [`Behind`], the
//! stream's [`StreamWatch`] hands it the signals and downloads of every
//! batch it enqueues while the group is in flight, and a break fails them
//! with [`Error::RanBehindAbandoned`] (under `FailureScope::Batch`, whose
//! failures are their batch's own, it fails none). A signal value failed
//! so before its event is recorded (its batch waits at the worker, or is
//! still being enqueued) stays failed once it is recorded:
//! [`EventRing::abandon`](crate::ring::EventRing::abandon) makes the ring
//! record nothing for it.
//!
//! The cost where no group is in flight: one relaxed load per batch
//! enqueued (the signal-only fast path of `submit` included; that path
//! steps aside once more after the last group completed, until the next
//! batch's enqueue finds the stream's groups all done). Where groups are
//! in flight: the watch first forgets those whose event completed (one
//! stream's groups complete in its order, so it queries from the oldest
//! and stops at the first still running, or abandoned: one query per batch
//! in the steady state), then hands the batch to the ones left: those in
//! flight, and any behind an abandoned one or one whose query failed. (It
//! used to wait for the watchdog, which looks every 10 ms, to mark them
//! done: a queue issuing collectives faster than that handed each batch to
//! every group of the last 10 ms.) Forgetting a group leaves its `Behind`
//! as it was, for the watchdog to settle.

use std::collections::VecDeque;

use cudarc::driver::CudaEvent;

use super::nccl_watchdog::After;
use crate::cuda::Cuda;
use crate::error::Error;
use crate::queue::{Command, Ledger};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};

/// The work one stream enqueued behind one group: see the module docs.
/// Made by the group's watch, told of batches by the stream
/// ([`StreamWatch::follow`]), settled by the watchdog ([`Behind::done`] or
/// [`Behind::abandon`]).
#[derive(Default)]
pub(super) struct Behind {
    state: Mutex<BehindState>,
}

#[derive(Default)]
struct BehindState {
    phase: Phase,
    /// While `Open`: the signals and downloads the stream enqueued behind
    /// the group. Its memory is kept for the next group.
    list: Vec<After>,
}

#[derive(Default)]
enum Phase {
    /// The group is in flight; the highest epoch of the batches behind it
    /// (and of the group's own).
    Open(u64),
    /// The group completed, or none was opened yet: what comes after it
    /// runs after finished work.
    #[default]
    Done,
    /// The group's communicator broke: what batches of epochs up to this
    /// one (submitted before the owner knew) enqueue behind it fails with
    /// the cause.
    Abandoned(std::sync::Arc<Error>, u64),
}

impl Behind {
    /// Opens it for a group of a batch of `epoch`.
    pub(super) fn open(&self, epoch: u64) {
        let mut state = self.state.lock();
        state.list.clear();
        state.phase = Phase::Open(epoch);
    }

    /// Takes the signals and downloads of `commands` from `from` on, of a
    /// batch of `epoch` that the stream enqueues behind the group: the
    /// whole batch when `from` is 0 (its first enqueue, or a resume at its
    /// first command, which lists it again: failing a value twice is
    /// harmless), nothing more where the worker resumes it later. Fails
    /// them at once when the group's communicator broke (and the owner did
    /// not know yet): an [`abandon`](crate::ring::EventRing::abandon)ed
    /// value stays failed though it is recorded after. `false` once it
    /// needs nothing more: the stream forgets it.
    fn follow(&self, commands: &[Command<Cuda>], from: usize, epoch: u64) -> bool {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let rest = commands.get(from..).unwrap_or_default();
        match &mut state.phase {
            Phase::Open(highest) => {
                *highest = (*highest).max(epoch);
                if from == 0 {
                    state.list.extend(rest.iter().filter_map(After::of));
                }
                true
            }
            Phase::Abandoned(cause, upto) if epoch <= *upto => {
                let failure = Error::RanBehindAbandoned {
                    cause: cause.clone(),
                };
                for after in rest.iter().filter_map(After::of) {
                    after.fail(&failure);
                }
                true
            }
            Phase::Done | Phase::Abandoned(..) => false,
        }
    }

    /// Whether the stream may forget it, its group's event having
    /// completed: not once abandoned (what the stream enqueues may still
    /// have to fail). Its phase stays as it is, for the watchdog to settle:
    /// should the communicator break before the watchdog saw the group
    /// complete (a group blamed for a timeout that ended meanwhile),
    /// [`abandon`](Self::abandon) must still cascade from its epoch.
    fn forgettable(&self) -> bool {
        !matches!(self.state.lock().phase, Phase::Abandoned(..))
    }

    /// The group completed (or is forgotten): nothing behind it is failed
    /// any more. A `Behind` already abandoned stays so.
    pub(super) fn done(&self) {
        let mut state = self.state.lock();
        if matches!(state.phase, Phase::Open(_)) {
            state.phase = Phase::Done;
            state.list.clear();
        }
    }

    /// The group's communicator broke with `cause` (as the group's own
    /// signals carry it): under the cascade of `ledger` (the queue's),
    /// records the failure against every batch submitted before the owner
    /// learns of it, and fails what the stream enqueued behind the group
    /// with [`Error::RanBehindAbandoned`]; under `FailureScope::Batch`,
    /// only reports it. `false` (nothing reported) when the group is not
    /// in flight.
    pub(super) fn abandon(&self, ledger: &Ledger, cause: &Error) -> bool {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Phase::Open(epoch) = state.phase else {
            return false;
        };
        if ledger.independent() {
            ledger.fail_unbatched(cause.clone());
            state.phase = Phase::Done;
            state.list.clear();
            return true;
        }
        let (cause, upto) = ledger.fail_out_of_order(epoch, cause.clone());
        let failure = Error::RanBehindAbandoned {
            cause: cause.clone(),
        };
        for after in state.list.drain(..) {
            after.fail(&failure);
        }
        state.phase = Phase::Abandoned(cause, upto);
        true
    }
}

/// A CUDA stream's groups in flight ([`Behind`] each), for the batches it
/// enqueues after them. Its queue's stream side holds one.
#[derive(Default)]
pub(crate) struct StreamWatch {
    /// Oldest first, each with the event recorded right after its group.
    groups: Mutex<VecDeque<(Arc<Behind>, Arc<CudaEvent>)>>,
    /// Whether `groups` holds one: stored under its lock by the thread
    /// enqueueing (in queue order); read without it by that thread, and by
    /// the owner's signal-only fast path once it read the queue's `busy`
    /// as false (`Acquire`, after the worker's last enqueue).
    any: AtomicBool,
}

impl StreamWatch {
    /// Whether a group may be in flight on the stream: then batches go
    /// through [`follow`](Self::follow). One relaxed load.
    #[inline]
    pub(crate) fn watching(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Hands `commands` from `from` on, of a batch of `epoch` the stream
    /// is about to enqueue, to the groups in flight before it (see
    /// [`Behind::follow`]).
    #[inline]
    pub(crate) fn follow(&self, commands: &[Command<Cuda>], from: usize, epoch: u64) {
        if self.watching() {
            self.follow_groups(commands, from, epoch);
        }
    }

    fn follow_groups(&self, commands: &[Command<Cuda>], from: usize, epoch: u64) {
        let mut groups = self.groups.lock();
        // The groups that completed lead (one stream runs in order). A
        // query error (a device fault, which the stream's queue reports)
        // stops the pruning: the group stays followed, as before its end.
        while let Some((behind, event)) = groups.front()
            && matches!(event.try_is_complete(), Ok(true))
            && behind.forgettable()
        {
            groups.pop_front();
        }
        groups.retain(|(behind, _)| behind.follow(commands, from, epoch));
        self.any.store(!groups.is_empty(), Ordering::Relaxed);
    }

    /// How many groups it still follows (some may have completed since
    /// the last batch looked).
    pub(crate) fn followed(&self) -> usize {
        self.groups.lock().len()
    }

    /// A group just put on the stream, and the event recorded after it.
    pub(super) fn push(&self, behind: Arc<Behind>, event: Arc<CudaEvent>) {
        let mut groups = self.groups.lock();
        groups.push_back((behind, event));
        self.any.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::CollectiveError;

    /// The stream forgets a group once its event completed; should the
    /// watchdog then blame that group for its communicator's break (it
    /// timed out, and ended meanwhile), its `Behind` still cascades from
    /// the group's epoch: the stream left it as it was. (When forgetting
    /// marked it done, `abandon` found nothing in flight and the queue's
    /// earlier batches ran on.)
    #[test]
    fn a_group_the_stream_forgot_still_cascades_when_its_communicator_breaks() {
        let behind = Behind::default();
        behind.open(3);
        assert!(behind.forgettable());
        let ledger = Ledger::new();
        let cause: Error = CollectiveError::Timeout {
            rank: 0,
            op: "all_reduce".to_owned(),
            waited: std::time::Duration::ZERO,
        }
        .into();
        assert!(behind.abandon(&ledger, &cause), "nothing cascaded");
        assert!(ledger.has_unreported());
        // Abandoned: the stream keeps it for the batches still to fail.
        assert!(!behind.forgettable());
    }
}
