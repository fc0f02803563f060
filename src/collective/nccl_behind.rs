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
//! failures are their batch's own, it fails none).
//!
//! The cost where no group is in flight: one relaxed load per batch
//! enqueued (the signal-only fast path of `submit` included).

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
enum BehindState {
    /// Not opened for a group.
    #[default]
    Idle,
    /// The group is in flight: what the stream enqueued since, and the
    /// highest epoch of those batches (and of the group's own).
    Open(Vec<After>, u64),
    /// The group completed: what came after it ran after finished work.
    Done,
    /// The group's communicator broke: batches of epochs up to this one
    /// (submitted before the owner knew) fail with the cause.
    Abandoned(std::sync::Arc<Error>, u64),
}

impl Behind {
    /// Opens it for a group of a batch of `epoch`, keeping the list's
    /// memory from an earlier group.
    pub(super) fn open(&self, epoch: u64) {
        let mut state = self.state.lock();
        let list = match std::mem::take(&mut *state) {
            BehindState::Open(mut list, _) => {
                list.clear();
                list
            }
            _ => Vec::new(),
        };
        *state = BehindState::Open(list, epoch);
    }

    /// Takes the signals and downloads of `commands`, part of a batch of
    /// `epoch` that the stream enqueues behind the group; fails them at
    /// once when the group's communicator broke before they came (and the
    /// owner did not know yet). `false` once it needs nothing more: the
    /// stream forgets it.
    fn follow(&self, commands: &[Command<Cuda>], epoch: u64) -> bool {
        let mut state = self.state.lock();
        match &mut *state {
            BehindState::Open(list, highest) => {
                *highest = (*highest).max(epoch);
                list.extend(commands.iter().filter_map(After::of));
                true
            }
            BehindState::Abandoned(cause, upto) if epoch <= *upto => {
                let failure = Error::RanBehindAbandoned {
                    cause: cause.clone(),
                };
                for after in commands.iter().filter_map(After::of) {
                    after.fail(&failure);
                }
                true
            }
            BehindState::Idle | BehindState::Done | BehindState::Abandoned(..) => false,
        }
    }

    /// The group completed (or is forgotten): nothing behind it is failed
    /// any more. A `Behind` already abandoned stays so.
    pub(super) fn done(&self) {
        let mut state = self.state.lock();
        if matches!(*state, BehindState::Open(..)) {
            *state = BehindState::Done;
        }
    }

    /// The group's communicator broke with `cause` (as the group's own
    /// signals carry it): under the cascade of `ledger` (the queue's),
    /// records the failure against every batch submitted before the owner
    /// learns of it, and fails what the stream enqueued behind the group
    /// with [`Error::RanBehindAbandoned`]; under `FailureScope::Batch`,
    /// only reports it.
    pub(super) fn abandon(&self, ledger: &Ledger, cause: &Error) {
        let mut state = self.state.lock();
        let BehindState::Open(list, epoch) = std::mem::take(&mut *state) else {
            return;
        };
        if ledger.independent() {
            ledger.fail_unbatched(cause.clone());
            *state = BehindState::Done;
            return;
        }
        let cause = ledger.fail_epoch(epoch, cause.clone());
        let failure = Error::RanBehindAbandoned {
            cause: cause.clone(),
        };
        for after in &list {
            after.fail(&failure);
        }
        *state = BehindState::Abandoned(cause, epoch);
    }
}

/// A CUDA stream's groups in flight ([`Behind`] each), for the batches it
/// enqueues after them. Its queue's stream side holds one.
#[derive(Default)]
pub(crate) struct StreamWatch {
    groups: Mutex<Vec<Arc<Behind>>>,
    /// Whether `groups` holds one (stored under its lock; read without):
    /// only the thread enqueueing, in queue order, pushes and reads it.
    any: AtomicBool,
}

impl StreamWatch {
    /// Whether a group may be in flight on the stream: then batches go
    /// through [`follow`](Self::follow). One relaxed load.
    #[inline]
    pub(crate) fn watching(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Hands `commands`, of a batch of `epoch` the stream is about to
    /// enqueue, to the groups in flight before it.
    #[inline]
    pub(crate) fn follow(&self, commands: &[Command<Cuda>], epoch: u64) {
        if self.watching() {
            self.follow_groups(commands, epoch);
        }
    }

    fn follow_groups(&self, commands: &[Command<Cuda>], epoch: u64) {
        let mut groups = self.groups.lock();
        groups.retain(|behind| behind.follow(commands, epoch));
        self.any.store(!groups.is_empty(), Ordering::Relaxed);
    }

    /// A group just put on the stream.
    pub(super) fn push(&self, behind: Arc<Behind>) {
        let mut groups = self.groups.lock();
        groups.push(behind);
        self.any.store(true, Ordering::Relaxed);
    }
}
