//! What a queue's owner and its engine share: the queue's identity and its
//! record of failures.

use std::collections::BTreeSet;
use std::fmt;
use std::num::NonZeroU64;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, panic_message};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

use super::FailureScope;
use super::batch::{Batch, Failed};
use crate::backend::Backend;

/// Identifies a queue for as long as it or its submitted work lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(NonZeroU64);

impl QueueId {
    /// The id as a number (never 0).
    #[inline]
    pub fn get(self) -> u64 {
        self.0.get()
    }

    pub(crate) fn from_raw(raw: u64) -> Option<Self> {
        NonZeroU64::new(raw).map(Self)
    }

    /// Whether the queue, or work it submitted, still exists.
    pub fn is_live(self) -> bool {
        live_queues().contains(&self.get())
    }

    /// A fresh id, registered live until [`Ledger`]'s last handle drops.
    fn register() -> Self {
        // Process-global and outside every loom model, like the registry's
        // statics: plain `std` primitives.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let raw = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        live_queues().insert(raw);
        Self(NonZeroU64::new(raw).unwrap_or(NonZeroU64::MIN))
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "queue #{}", self.0)
    }
}

/// The ids of live queues.
fn live_queues() -> std::sync::MutexGuard<'static, BTreeSet<u64>> {
    static LIVE: std::sync::Mutex<BTreeSet<u64>> = std::sync::Mutex::new(BTreeSet::new());
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A queue's identity and failure record, shared by its owner (the
/// [`Queue`](super::Queue)) and its engine. Clones are handles to one
/// ledger. The queue's id stays live until the engine says the queue is
/// gone and its submitted work drained ([`retire`](Self::retire)), or at
/// the latest until the last handle is dropped.
///
/// # The protocol
///
/// The owner stamps each batch with its *epoch*: how many failures it has
/// been told of. An engine, before it runs a batch, asks
/// [`admit`](Self::admit): a batch stamped with an epoch at or below that
/// of a failed batch was submitted before the owner knew of the failure,
/// and depends on the failed work by queue order, so it is not run: its
/// signals fail with [`Error::EarlierBatchFailed`]. That *cascade* is not a
/// new failure, and is never reported to the owner: one failure, one
/// report, however the owner's report and the engine's progress interleave.
/// A batch of a queue whose failures are scoped to the batch
/// ([`FailureScope::Batch`](super::FailureScope)) never cascades.
/// A batch that fails on its own is recorded ([`fail`](Self::fail),
/// [`complete`](Self::complete), [`settle`](Self::settle)) before its
/// signals fail, so an owner that sees a failed signal and then
/// submits finds the failure reported.
///
/// | field | meaning | written by | read by |
/// |-------|---------|------------|---------|
/// | `cascade_below` | batches stamped below this epoch cascade (0: none; `u64::MAX`: the engine refuses every batch, `refuse_all`) | the engine, under `state`, with `Release` | the engine's `admit` (`Acquire`), on every batch |
/// | `unreported` | a failure awaits the owner | set by the engine under `state` (`Release`); cleared by the owner under `state` | the owner's `submit` (`Acquire`) |
/// | `told` | the owner's epoch (failures reported to it) | the owner's report, under `state` | [`fail_out_of_order`](Ledger::fail_out_of_order), under `state`: a failure found after later batches ran cascades up to it |
/// | `state` | the unreported cause, and the cause of the last failed batch | both, under the lock | both |
///
/// Both flags are only hints for a lock-free fast path: a reader that sees
/// one set takes the lock, where the truth is.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<LedgerInner>,
}

struct LedgerInner {
    id: QueueId,
    cascade_below: AtomicU64,
    unreported: AtomicBool,
    /// The owner's epoch: how many failures it was told of (moved on by
    /// `report`, under `state`).
    told: AtomicU64,
    /// The queue's [`FailureScope`] is `Batch`: nothing cascades, and a
    /// failed batch drains.
    independent: AtomicBool,
    state: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    /// The failure the owner has not been told of.
    unreported: Option<std::sync::Arc<Error>>,
    /// The cause of the last batch that failed on its own.
    last: Option<std::sync::Arc<Error>>,
    /// Why the engine takes no more work (`Ledger::refuse_all`): every
    /// later batch skips with it, and every later report is of it.
    refused: Option<std::sync::Arc<Error>>,
}

impl Drop for LedgerInner {
    fn drop(&mut self) {
        live_queues().remove(&self.id.get());
    }
}

/// What an engine does with a batch it reached.
#[derive(Debug)]
pub enum Admission {
    /// Run it.
    Run,
    /// Do not run it: fail its signals with this cause. The batch was
    /// abandoned (rejected, discarded or dropped), or submitted before the
    /// owner knew of an earlier failure. Nothing is recorded for the owner.
    Skip(Error),
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    /// A ledger for a new queue, with a fresh [`QueueId`].
    pub fn new() -> Self {
        Self {
            inner: Arc::new(LedgerInner {
                id: QueueId::register(),
                cascade_below: AtomicU64::new(0),
                unreported: AtomicBool::new(false),
                told: AtomicU64::new(0),
                independent: AtomicBool::new(false),
                state: Mutex::new(LedgerState::default()),
            }),
        }
    }

    /// The queue's id.
    #[inline]
    pub fn id(&self) -> QueueId {
        self.inner.id
    }

    /// Says that the queue is dropped and its submitted work drained: its
    /// id is no longer live, so another queue may take over the signals it
    /// produced. Engines call it as soon as both hold (the CPU engine on
    /// drop when nothing is in flight, else its worker once drained);
    /// idempotent, and the last handle's drop does it anyway.
    pub fn retire(&self) {
        live_queues().remove(&self.inner.id.get());
    }

    /// Sets what a failed batch takes down with it, for every batch the
    /// engine reaches from now on ([`HardwareQueue::set_failure_scope`](super::HardwareQueue::set_failure_scope)).
    pub fn set_scope(&self, scope: FailureScope) {
        self.inner
            .independent
            .store(scope == FailureScope::Batch, Ordering::Relaxed);
    }

    /// Whether failures are scoped to their batch
    /// ([`FailureScope::Batch`]).
    pub fn independent(&self) -> bool {
        self.inner.independent.load(Ordering::Relaxed)
    }

    /// Whether a failure waits to be reported to the owner (by its next
    /// `submit` or `synchronize`). One atomic load; never blocks.
    #[inline]
    pub fn has_unreported(&self) -> bool {
        self.inner.unreported.load(Ordering::Acquire)
    }

    /// Whether an engine should run `batch`, which it reached in queue
    /// order. One atomic load when nothing failed.
    #[inline]
    pub fn admit<B: Backend>(&self, batch: &Batch<B>) -> Admission {
        if batch.abandoned().is_none()
            && batch.epoch() >= self.inner.cascade_below.load(Ordering::Acquire)
        {
            return Admission::Run;
        }
        self.admit_after_failure(batch)
    }

    /// [`admit`](Self::admit) of a batch abandoned, stamped before a
    /// failure that cascades, or reaching an engine that refuses all.
    #[inline(never)]
    fn admit_after_failure<B: Backend>(&self, batch: &Batch<B>) -> Admission {
        if let Some(cause) = batch.abandoned() {
            return Admission::Skip(cause.clone());
        }
        let below = self.inner.cascade_below.load(Ordering::Acquire);
        if below == u64::MAX
            && let Some(refused) = &self.inner.state.lock().refused
        {
            return Admission::Skip((**refused).clone());
        }
        // A batch whose failures are its own runs after a failure before it.
        if batch.epoch() < below && !self.independent() {
            let state = self.inner.state.lock();
            if let Some(cause) = &state.last {
                return Admission::Skip(Error::EarlierBatchFailed {
                    cause: cause.clone(),
                });
            }
        }
        Admission::Run
    }

    /// Records that `batch` failed at command `from` with `error`, then
    /// fails the signals of its commands from `from` on. Returns the cause
    /// as the signals carry it.
    pub fn fail<B: Backend>(
        &self,
        batch: &Batch<B>,
        from: usize,
        error: Error,
    ) -> std::sync::Arc<Error> {
        let cause = self.record(batch, error);
        // Only after the failure is recorded (see the type's docs).
        batch.fail_signals(from, &cause);
        cause
    }

    /// Records that `batch` failed with `error`, for the owner and for the
    /// cascade; returns the cause as its signals will carry it. The
    /// cascade takes every batch submitted so far: stamped up to the
    /// owner's epoch now, which is above `batch`'s where the owner was told
    /// of another failure since (the batches it submitted after that came
    /// after `batch`, before it knew of this failure), as
    /// [`fail_out_of_order`](Self::fail_out_of_order) counts.
    fn record<B: Backend>(&self, batch: &Batch<B>, error: Error) -> std::sync::Arc<Error> {
        let cause = std::sync::Arc::new(error);
        let mut state = self.inner.state.lock();
        // Under `state`, where a report moves the owner's epoch.
        let upto = batch.epoch().max(self.inner.told.load(Ordering::Relaxed));
        self.record_locked(&mut state, upto, cause.clone());
        cause
    }

    /// Records `cause` for the owner, and for the cascade of batches
    /// stamped `epoch` or lower.
    fn record_locked(&self, state: &mut LedgerState, epoch: u64, cause: std::sync::Arc<Error>) {
        state.last = Some(cause.clone());
        if state.unreported.is_none() {
            state.unreported = Some(cause);
        }
        self.inner.unreported.store(true, Ordering::Release);
        self.inner
            .cascade_below
            .fetch_max(epoch + 1, Ordering::Release);
    }

    /// Says that the engine takes no more work, because of `cause` (a
    /// CUDA stream that can no longer prove its work done): every batch it
    /// reaches from now on is skipped, its signals failing with `cause`,
    /// and every report to the owner from now on (each `submit` and
    /// `synchronize`; a failure unreported before goes first) is `cause`,
    /// with the batch recorded then let go unrun, so that an owner that
    /// goes on recording and submitting grows nothing. For good: the queue
    /// is to be dropped. The first cause stays.
    #[cfg(feature = "cuda")]
    pub(crate) fn refuse_all(&self, cause: Error) {
        let mut state = self.inner.state.lock();
        if state.refused.is_none() {
            state.refused = Some(std::sync::Arc::new(cause));
        }
        self.inner.unreported.store(true, Ordering::Release);
        // Every batch takes `admit`'s slow path, which finds `refused`.
        self.inner.cascade_below.store(u64::MAX, Ordering::Release);
    }

    /// Whether the engine takes no more work (`refuse_all`).
    pub(crate) fn refuses(&self) -> bool {
        self.inner.cascade_below.load(Ordering::Acquire) == u64::MAX
    }

    /// Records that `batch` failed with `error`, as [`complete`](Self::complete)
    /// does, but leaves its signals to the caller: for an engine that
    /// cannot fail them yet (the work before them may still run), which
    /// fails them with the returned cause once it can. The owner hears of
    /// the failure, and later batches cascade, from now on.
    #[cfg(feature = "cuda")]
    pub(crate) fn record_failure<B: Backend>(
        &self,
        batch: &Batch<B>,
        error: Error,
    ) -> std::sync::Arc<Error> {
        self.record(batch, error)
    }

    /// Records a failure found out of queue order, after later batches ran
    /// (an NCCL group aborted on the device, behind which the stream went
    /// on), of work of a batch stamped `epoch`: reported to the owner and,
    /// under the cascade, taking down every batch the owner submitted
    /// before it learns of it: those stamped up to `epoch` or the owner's
    /// epoch now, whichever is higher. Returns the cause as their signals
    /// will carry it, and that epoch.
    pub fn fail_out_of_order(&self, epoch: u64, error: Error) -> (std::sync::Arc<Error>, u64) {
        let cause = std::sync::Arc::new(error);
        let mut state = self.inner.state.lock();
        // Under `state`, where a report moves the owner's epoch.
        let upto = epoch.max(self.inner.told.load(Ordering::Relaxed));
        self.record_locked(&mut state, upto, cause.clone());
        (cause, upto)
    }

    /// Runs `let_go`, where an engine lets finished batches go on this
    /// thread (clears or drops them), and tells the owner, as a failure
    /// of no batch, of a panic that dropping a value of the caller's (an
    /// `upload_vec`'s owner) raised meanwhile, contained where it ran
    /// ([`Batch::clear_caught`], the owner's own wrapper), named `what`
    /// (which engine, doing what).
    pub fn letting_go<R>(&self, what: &str, let_go: impl FnOnce() -> R) -> R {
        // One left by other work on this thread is not this queue's.
        let _ = crate::transfer::take_contained_panic();
        let result = let_go();
        if let Some(message) = crate::transfer::take_contained_panic() {
            self.fail_unbatched(Error::EnginePanicked {
                message: format!("{what}: {message}"),
            });
        }
        result
    }

    /// Records a failure that belongs to no batch (a device error found
    /// while synchronising): reported to the owner, cascading nothing.
    /// Not once the engine refuses all (`refuse_all`):
    /// the refusal is what the owner hears from then on.
    pub fn fail_unbatched(&self, error: Error) {
        let mut state = self.inner.state.lock();
        if state.unreported.is_none() && state.refused.is_none() {
            state.unreported = Some(std::sync::Arc::new(error));
            self.inner.unreported.store(true, Ordering::Release);
        }
    }

    /// Runs what an engine does with a batch it reached, start to end: a
    /// batch [`admit`](Self::admit) refuses has its signals failed; one it
    /// admits is `run`, and a failure (`Err((command index, error))`) is
    /// [recorded](Self::fail) (a batch of
    /// [`FailureScope::Batch`](super::FailureScope) then
    /// [drains](Batch::drain_failed), on this thread). A panic out of `run` (a bug; kernels'
    /// panics are the engine's to catch) fails the batch too, rather than
    /// the engine's thread.
    pub fn settle<B: Backend>(
        &self,
        batch: &Batch<B>,
        run: impl FnOnce(&Batch<B>) -> std::result::Result<(), (usize, Error)>,
    ) {
        self.settle_with(batch, run, &mut |_| {});
    }

    /// [`settle`](Self::settle), handing each numbered collective that
    /// `batch` will not run (all of a skipped batch's, those after a
    /// failed command) to `forfeit` at its place among the signals it
    /// fails and the waits it honours (`Batch::fail_from`): as it would
    /// have run, after what comes before it and before what follows. None
    /// after a panic, which leaves how far the batch got unknown.
    pub(crate) fn settle_with<B: Backend>(
        &self,
        batch: &Batch<B>,
        run: impl FnOnce(&Batch<B>) -> std::result::Result<(), (usize, Error)>,
        forfeit: &mut impl FnMut(&[&crate::collective::Collective<B>]),
    ) {
        match self.admit(batch) {
            Admission::Skip(cause) => batch.fail_from(0, &cause, Failed::Skipped, forfeit),
            Admission::Run => {
                let mut panicked = false;
                let outcome =
                    catch_unwind(AssertUnwindSafe(|| run(batch))).unwrap_or_else(|payload| {
                        panicked = true;
                        Err((
                            0,
                            Error::EnginePanicked {
                                message: panic_message(payload),
                            },
                        ))
                    });
                match panicked {
                    false => self.complete_with(batch, outcome, forfeit),
                    true => self.complete(batch, outcome),
                }
            }
        }
    }

    /// For an engine that runs a batch asynchronously (it hands the work
    /// to a device and learns of its end later): settles `batch`, which
    /// [`admit`](Self::admit) said to run, with how it ended. `Ok` needs
    /// nothing more (the engine set each signal as its command completed);
    /// `Err((command index, error))` is [recorded](Self::fail). Under
    /// [`FailureScope::Queue`](super::FailureScope) the signals from that
    /// command on fail at once; under `Batch` the failure is the batch's
    /// own, and it still honours its later waits, in order, before failing
    /// the signals after each ([`drain_failed`](Batch::drain_failed)), so
    /// call it where the engine may block (its own thread). The engine owns
    /// the batch (and so its commands' buffers and programs) from `submit`
    /// until it calls this.
    pub fn complete<B: Backend>(
        &self,
        batch: &Batch<B>,
        outcome: std::result::Result<(), (usize, Error)>,
    ) {
        self.complete_with(batch, outcome, &mut |_| {});
    }

    /// [`complete`](Self::complete), handing each numbered collective
    /// after the failed command to `forfeit` (see
    /// [`settle_with`](Self::settle_with)).
    fn complete_with<B: Backend>(
        &self,
        batch: &Batch<B>,
        outcome: std::result::Result<(), (usize, Error)>,
        forfeit: &mut impl FnMut(&[&crate::collective::Collective<B>]),
    ) {
        if let Err((from, error)) = outcome {
            // Recorded before any signal fails (see the type's docs).
            let cause = self.record(batch, error);
            let how = match self.independent() {
                true => Failed::Draining,
                false => Failed::At,
            };
            batch.fail_from(from, &cause, how, forfeit);
        }
    }

    /// For the owner: the unreported failure, once, as
    /// [`Error::QueueFailed`], moving `epoch` on so batches stamped from
    /// now on run. One atomic load when nothing failed.
    #[inline]
    pub(crate) fn report(&self, epoch: &mut u64) -> crate::Result<()> {
        if !self.inner.unreported.load(Ordering::Acquire) {
            return Ok(());
        }
        self.report_failure(epoch)
    }

    /// [`report`](Self::report) once a failure is unreported.
    #[cold]
    #[inline(never)]
    fn report_failure(&self, epoch: &mut u64) -> crate::Result<()> {
        let mut state = self.inner.state.lock();
        // A refusal is reported again and again (see `refuse_all`).
        (self.inner.unreported).store(state.refused.is_some(), Ordering::Relaxed);
        match state.unreported.take() {
            Some(cause) => {
                *epoch += 1;
                self.inner.told.fetch_max(*epoch, Ordering::Relaxed);
                Err(Error::QueueFailed { cause })
            }
            None => match &state.refused {
                Some(cause) => Err(Error::QueueFailed {
                    cause: cause.clone(),
                }),
                None => Ok(()),
            },
        }
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("id", &self.inner.id)
            .field("unreported", &self.inner.unreported.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
