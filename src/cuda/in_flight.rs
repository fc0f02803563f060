//! The batches a CUDA queue's stream has not passed yet ([`InFlight`]):
//! each kept, with its buffers, programs, page-locked staging and replay
//! template, until the stream passed the event recorded after it (or a
//! wait for the stream did); then cleared and kept for reuse, with its
//! event. A batch whose values the worker could not fail yet
//! ([`Unsettled`]) fails them as it leaves.
//!
//! # When the event cannot tell
//!
//! A query of the front batch's event that fails without losing the
//! device leaves a wait on the event to decide. Where that fails too, the
//! batch stays in flight, and every batch after it, for a wait for the
//! stream (the owner is told once per front batch): the owner's
//! `synchronize`, the queue's drop, or, once more than
//! [`MAX_BEHIND_A_FAILED_WAIT`] batches are in flight behind it, the
//! retirement itself (on the thread that retires: the owner's `submit`,
//! or the worker), so that an owner that only submits does not pile up
//! batches, and what they hold, without bound. That wait, as
//! `synchronize`'s: where it succeeds, every batch it waited for goes;
//! where it fails with a sticky error, the device is marked lost and they
//! go; where it fails otherwise, the stream may still run them, and the
//! queue *stalls*: they are kept for the process ([`keep_for_the_process`],
//! their pending values failed), the owner is told
//! ([`Error::QueueStalled`]), and the queue takes no more work (the
//! ledger's `refuse_all`): every later batch is let go unrun, its values
//! failed at once, and every later `submit` and `synchronize` fails,
//! saying to drop the queue. A wait for the stream at the queue's drop
//! that fails so likewise keeps what it waited for for the process.
//!
//! Values kept [`Unsettled`] behind such a batch do not wait for the
//! bound: no event will prove them done, and a waiter (or the worker,
//! blocked on a value a thread sets only once they settled) would wait
//! for good; so the retirement that finds them there, or the worker that
//! finds the stream's query failing too while it drains a failed batch,
//! waits for the stream at once, and where that cannot tell either, the
//! queue stalls and they fail, in queue order.

use std::collections::VecDeque;
use std::mem;

use cudarc::driver::{CudaEvent, DriverError};

use crate::error::Error;
use crate::queue::{Batch, Command};
use crate::sync::Ordering;

use super::Cuda;
use super::repeat::Template;
use super::signal::EVENT_FLAGS;
use super::stream::Shared;
use super::transfer::Pinned;

/// Enqueued batches, kept (with their buffers and programs) until the
/// stream passed the event recorded after them.
#[derive(Default)]
pub(super) struct InFlight {
    /// Each with the page-locked staging of its transfers, how many of its
    /// commands were enqueued (all, unless one failed), and the replay
    /// template it keeps (`super::repeat`).
    pub(super) batches: VecDeque<InFlightBatch>,
    pub(super) spare_events: Vec<CudaEvent>,
    pub(super) spare_batches: Vec<Batch<Cuda>>,
    /// How many batches were put in `batches`, and how many left it, since
    /// the queue was made: a wait for the stream that succeeded passed
    /// those put before it ([`Shared::retire_waited`]).
    pushed: u64,
    popped: u64,
    /// The front batch's completion query failed (an error that is not
    /// sticky) and the owner was told: not again for that batch.
    told: bool,
    /// How many of `batches` hold [`Unsettled`] values: the worker polls
    /// while there are any ([`Shared::unsettled`], which reads its mirror
    /// `Shared::unsettled_batches`), since a waiter may wait for them with
    /// nothing else to move the retirement on. Changed only through
    /// `Shared::set_unsettled`, which keeps the mirror.
    unsettled: usize,
}

/// A failed batch's values, from the command that failed on, that the
/// worker could not fail yet: its wait for the work on the stream before
/// them failed without losing the device, so that work may still run, and
/// a waiter a failed value lets through (a settled wait, a plan's next
/// run) would race it. They fail with `cause` once the stream passed the
/// batch, the device is lost, the queue stalls (nothing can tell any
/// more: see the module's docs), or its drop decides for them
/// (`decide_once_dropped`, `shut_down`); the owner hears of the failure
/// as of any other batch's.
/// Without a drain of its later waits (`Batch::drain_failed`): that may
/// block, and the batch may leave on the owner's thread; under
/// `FailureScope::Batch` the worker honours them before it keeps the
/// batch (`worker::settle`), so every value still fails after them.
pub(super) struct Unsettled {
    pub(super) from: usize,
    pub(super) cause: std::sync::Arc<Error>,
}

impl Unsettled {
    fn settle(self, batch: &Batch<Cuda>) {
        batch.fail_signals(self.from, &self.cause);
    }
}

/// A batch the stream has not passed yet, and what it holds: see
/// [`InFlight::batches`].
pub(super) type InFlightBatch = (
    CudaEvent,
    Batch<Cuda>,
    Vec<Pinned>,
    usize,
    Option<std::sync::Arc<Template>>,
    Option<Unsettled>,
);

/// How many batches may be in flight behind a front batch whose event's
/// query and wait both failed (without losing the device) before the
/// retirement waits for the stream itself (see the module's docs): what
/// such a queue holds is bounded by this many batches' staging, buffers
/// and templates. Four times [`SPARE_EVENTS`]: far past what a queue that
/// submits and synchronizes keeps in flight, so that a wait the owner
/// would make anyway is not pre-empted, and small enough that the
/// page-locked staging held (the largest part) stays a few of its chunks
/// per batch.
pub(super) const MAX_BEHIND_A_FAILED_WAIT: usize = 4 * SPARE_EVENTS;

/// How many finished batches and completion events to keep for reuse.
pub(super) const SPARE_BATCHES: usize = 4;
pub(super) const SPARE_EVENTS: usize = 16;

impl Shared {
    /// Keeps `batch` (and the template its mark holds) until the stream
    /// passed what was enqueued of it; gives it back when the stream holds
    /// nothing of it (to be cleared and reused).
    #[must_use]
    pub(super) fn finish(
        &self,
        batch: Batch<Cuda>,
        enqueued: usize,
        template: Option<std::sync::Arc<Template>>,
    ) -> Option<Batch<Cuda>> {
        self.finish_unsettled(batch, enqueued, template, None)
    }

    /// [`finish`](Self::finish), with values of the batch to fail once the
    /// stream passed it (see [`Unsettled`]): such a batch is kept in
    /// flight, with a completion event, even where it holds nothing else.
    #[must_use]
    pub(super) fn finish_unsettled(
        &self,
        batch: Batch<Cuda>,
        enqueued: usize,
        template: Option<std::sync::Arc<Template>>,
        unsettled: Option<Unsettled>,
    ) -> Option<Batch<Cuda>> {
        let staging = mem::take(&mut *self.staging.lock());
        // A batch of signals and waits only (a queue's `signal` + `submit`)
        // holds nothing the stream uses: no buffer, program, staging or
        // `dealloca`. Its signals' own events are kept by their rings, so
        // it needs no completion event of its own: one event record per
        // signal, as raw CUDA does (the cuda_signal bench). Nor does a
        // repeat of graphs (`Command::Replay`): their template is kept
        // (`super::replay::Mark`).
        if staging.is_empty()
            && template.is_none()
            && unsettled.is_none()
            && batch.commands()[..enqueued].iter().all(|command| {
                command.only_synchronises() || matches!(command, Command::Replay { .. })
            })
        {
            return Some(batch);
        }
        let mut in_flight = self.in_flight.lock();
        let event = match in_flight.spare_events.pop() {
            Some(event) => Ok(event),
            None => self.stream.context().new_event(Some(EVENT_FLAGS)),
        };
        match event.and_then(|event| event.record(&self.stream).map(|()| event)) {
            Ok(event) => {
                let count = in_flight.unsettled + usize::from(unsettled.is_some());
                self.set_unsettled(&mut in_flight, count);
                in_flight
                    .batches
                    .push_back((event, batch, staging, enqueued, template, unsettled));
                in_flight.pushed += 1;
                self.holding.store(true, Ordering::Relaxed);
            }
            Err(error) => {
                // No event to tell when the stream is done with the batch:
                // wait for it here (the stream only holds work that
                // completes on its own). A sticky error marks the device
                // lost *before* the staging goes back, so the cache keeps
                // memory the driver may still copy to (issue 24, defect 8).
                drop(in_flight);
                let _ = self.fault("recording a batch's completion event", error);
                let before = self.put_in_flight();
                if let Err(error) = self.stream.synchronize() {
                    match self.fault("waiting for a batch's stream", error) {
                        Error::DeviceLost { .. } => {}
                        // Not sticky: the stream may still run the batch.
                        // It is kept for the process, and the owner told.
                        // Its unsettled values fail all the same: with no
                        // event, nothing could prove them done later, and
                        // a waiter must not hang on them (as a download's
                        // does not).
                        error => {
                            keep_for_the_process((batch, staging, template), unsettled, &error);
                            self.ledger.fail_unbatched(error);
                            return None;
                        }
                    }
                }
                // The stream passed the batch, or the device is lost: and
                // every batch in flight before it, whose values kept
                // unsettled fail first (queue order; helper-72).
                self.retire_waited(before);
                if let Some(unsettled) = unsettled {
                    unsettled.settle(&batch);
                }
                drop(staging);
                batch.complete_deallocas(enqueued);
                return Some(batch);
            }
        }
        None
    }

    /// Drops the buffers and programs of batches the stream has passed.
    pub(super) fn retire(&self) {
        self.retire_waited(0);
    }

    /// How many batches were put in flight so far: taken before a wait for
    /// the stream, for [`retire_waited`](Self::retire_waited) after it.
    pub(super) fn put_in_flight(&self) -> u64 {
        self.in_flight.lock().pushed
    }

    /// [`retire`](Self::retire), after a wait for the stream that
    /// succeeded and began once `waited` batches ([`put_in_flight`]
    /// then) were in flight: those passed, even one whose event's query
    /// fails with an error that is not sticky (still told to the owner).
    ///
    /// [`put_in_flight`]: Self::put_in_flight
    pub(super) fn retire_waited(&self, waited: u64) {
        (self.ledger).letting_go(LETTING_GO, || {
            if self.retire_passed(waited) {
                self.retire_behind_a_failed_wait(
                    "behind one whose completion event could be neither queried nor waited for",
                );
            }
        });
    }

    /// For the worker, where neither an event nor the stream's query can
    /// prove the work before values kept [`Unsettled`] done (`why`): what
    /// [`retire_waited`](Self::retire_waited) does past its bound.
    pub(super) fn ask_the_stream_or_stall(&self, why: &str) {
        (self.ledger).letting_go(LETTING_GO, || self.retire_behind_a_failed_wait(why));
    }

    /// Waits for the stream, as the queue's `synchronize` does: how many
    /// batches were put in flight before the wait (what it passed, where
    /// it succeeded: for [`retire_waited`](Self::retire_waited)), and the
    /// driver's error, with the fault it makes (`what` failed: a sticky
    /// one marks the device lost, before any staging goes back: see
    /// `finish`).
    pub(super) fn wait_for_the_stream(
        &self,
        what: &str,
    ) -> (u64, Result<(), (DriverError, Error)>) {
        let before = self.put_in_flight();
        let synced = (self.stream.synchronize()).map_err(|e| (e, self.fault(what, e)));
        (before, synced)
    }

    /// Once more than [`MAX_BEHIND_A_FAILED_WAIT`] batches are in flight
    /// behind one whose event cannot tell, or values kept [`Unsettled`]
    /// wait for a proof that neither an event nor the stream's query can
    /// give (`why`, for the error): waits for the stream and lets go of
    /// what it passed; or, where that fails without losing the device,
    /// stalls the queue (see the module's docs).
    #[cold]
    #[inline(never)]
    fn retire_behind_a_failed_wait(&self, why: &str) {
        let (before, synced) =
            self.wait_for_the_stream("waiting for the stream behind a batch whose event failed");
        // Where the stream passed them, or the device is lost (its stream
        // runs nothing again), the batches waited for go, past the front
        // batch: not over the bound again (a batch the other thread put in
        // flight meanwhile is not waited for).
        let (driver, error) = match synced {
            Ok(()) => {
                let _ = self.retire_passed(before);
                return;
            }
            Err((_, error @ Error::DeviceLost { .. })) => {
                let _ = self.retire_passed(before);
                return self.ledger.fail_unbatched(error);
            }
            Err(failed) => failed,
        };
        // The stream may still run every batch in flight, on what they
        // hold: kept for the process, as at a failed wait at the drop.
        let mut in_flight = self.in_flight.lock();
        let batches = mem::take(&mut in_flight.batches);
        in_flight.popped += batches.len() as u64;
        self.set_unsettled(&mut in_flight, 0);
        in_flight.told = false;
        self.holding.store(false, Ordering::Relaxed);
        drop(in_flight);
        let count = batches.len();
        for (_, batch, pinned, _, template, unsettled) in batches {
            keep_for_the_process((batch, pinned, template), unsettled, &error);
        }
        // A batch the other thread puts in flight meanwhile (one, at
        // most: every batch reaching either thread from now on is let go
        // unrun) stays, for a later retirement or the drop.
        self.ledger.refuse_all(Error::QueueStalled {
            backend: <Cuda as crate::backend::Backend>::ID,
            what: format!("waiting for the queue's stream, with {count} batches in flight {why}"),
            detail: driver.to_string(),
        });
    }

    /// [`retire_waited`](Self::retire_waited)'s work: `true` where more
    /// than [`MAX_BEHIND_A_FAILED_WAIT`] batches are left in flight behind
    /// a front batch whose event's query and wait both failed (not
    /// sticky).
    fn retire_passed(&self, waited: u64) -> bool {
        let mut over = false;
        let mut in_flight = self.in_flight.lock();
        while let Some((event, ..)) = in_flight.batches.front() {
            // Queried even where a wait passed it: a sticky fault only
            // its query reports must still mark the device lost first.
            let query = event.try_is_complete();
            let waited_for = in_flight.popped < waited;
            let passed = match query {
                Ok(complete) => complete || waited_for,
                Err(error) => match self.fault("querying a batch's completion event", error) {
                    // Sticky: the device is marked lost (before the
                    // staging goes back: see `finish`), and its stream
                    // runs nothing again.
                    Error::DeviceLost { .. } => true,
                    // Not sticky: the stream may still run the batch, on
                    // what it holds. A wait on its event decides (the
                    // stream holds only work that completes on its own),
                    // so that batches do not pile up behind a query that
                    // keeps failing. Where that wait fails too, it stays,
                    // and every batch after it, until a wait for the
                    // stream lets it go (the queue's `synchronize`,
                    // through `retire_waited`, its drop, `shut_down`, or,
                    // past `MAX_BEHIND_A_FAILED_WAIT` batches behind it,
                    // `retire_behind_a_failed_wait`). The owner hears of
                    // the error, once for the batch.
                    error => {
                        // A sticky error of the wait marks the device
                        // lost, as the query's would.
                        let passed = waited_for
                            || event.synchronize().map_or_else(
                                |error| {
                                    let fault = self.fault("waiting for a batch's event", error);
                                    matches!(fault, Error::DeviceLost { .. })
                                },
                                |()| true,
                            );
                        if !mem::replace(&mut in_flight.told, true) {
                            self.ledger.fail_unbatched(error);
                        }
                        // Only here, on this failure: the common path
                        // pays nothing for the bound. Values kept
                        // unsettled behind an event that cannot tell wait
                        // for a proof only the stream can give now: a
                        // waiter (or the worker, blocked on a value a
                        // thread sets once they settled) would wait for
                        // it for good, so the stream is asked at once,
                        // and where it cannot tell either, the queue
                        // stalls and they fail (helper-73, finding 3).
                        over = !passed
                            && (in_flight.batches.len() > MAX_BEHIND_A_FAILED_WAIT + 1
                                || in_flight.unsettled > 0);
                        passed
                    }
                },
            };
            if !passed {
                break;
            }
            if let Some((event, batch, staging, enqueued, template, unsettled)) =
                in_flight.batches.pop_front()
            {
                in_flight.popped += 1;
                in_flight.told = false;
                // Its values from the failure on fail now: the work
                // before them is done (or the device lost).
                if let Some(unsettled) = unsettled {
                    let count = in_flight.unsettled - 1;
                    self.set_unsettled(&mut in_flight, count);
                    unsettled.settle(&batch);
                }
                drop((staging, template));
                // Every command enqueued completed: the `dealloca`s among
                // them too.
                batch.complete_deallocas(enqueued);
                in_flight.keep(batch, Some(event));
            }
        }
        self.holding
            .store(!in_flight.batches.is_empty(), Ordering::Relaxed);
        over
    }

    /// For the worker blocked on a wait (`worker::block_on`, or
    /// `worker::honour` draining a failed batch) while values are kept
    /// [`Unsettled`]: once the queue is dropped, what `shut_down` would
    /// decide for them, now, since the worker reaches `shut_down` only
    /// past that wait, which may be for a value a thread sets only once
    /// they settled. A wait for the stream: where it proves the work in
    /// flight done (or the device lost), `Some` of how many batches it
    /// passed, for [`retire_waited`](Self::retire_waited); where it fails
    /// otherwise (or the queue is stalled), nothing will prove them done
    /// any more: the values kept unsettled fail, in queue order
    /// (`Some(0)`), their batches staying in flight with all they hold.
    /// `None` while the queue lives.
    pub(super) fn decide_once_dropped(&self) -> Option<u64> {
        if !self.state.lock().closed {
            return None;
        }
        // A stalled queue's answer (`Ok(0)`) proves nothing.
        let what = "waiting for the stream behind values kept unsettled, the queue dropped";
        if !self.ledger.refuses()
            && let Ok(waited) = self.earlier_work_done(what)
        {
            return Some(waited);
        }
        let mut in_flight = self.in_flight.lock();
        self.set_unsettled(&mut in_flight, 0);
        for (_, batch, _, _, _, unsettled) in &mut in_flight.batches {
            if let Some(unsettled) = unsettled.take() {
                unsettled.settle(batch);
            }
        }
        Some(0)
    }

    /// Whether a batch in flight holds [`Unsettled`] values: read without
    /// the lock, from its mirror (see `Shared::unsettled_batches`).
    pub(super) fn unsettled(&self) -> bool {
        self.unsettled_batches.load(Ordering::Relaxed) > 0
    }

    /// Sets how many batches in flight hold [`Unsettled`] values, and its
    /// mirror, under the lock (`in_flight` is its guard's).
    fn set_unsettled(&self, in_flight: &mut InFlight, count: usize) {
        in_flight.unsettled = count;
        self.unsettled_batches.store(count, Ordering::Relaxed);
    }

    /// Keeps `template` (where there is one) until the stream passed
    /// everything enqueued so far: for a batch whose mark holds one but
    /// that never runs (see `super::replay::Mark`).
    pub(super) fn hold(&self, template: Option<std::sync::Arc<Template>>) {
        if template.is_some() {
            drop(self.finish(Batch::default(), 0, template));
        }
    }

    pub(super) fn recycle(&self, batch: Batch<Cuda>, event: Option<CudaEvent>) {
        (self.ledger).letting_go(LETTING_GO, || self.in_flight.lock().keep(batch, event));
    }

    /// After the owner dropped the queue and the worker drained it: wait for
    /// the stream, then release everything; or, where the wait failed with
    /// an error that is not sticky, nothing the stream may still use.
    pub(super) fn shut_down(&self) {
        // A sticky error marks the device lost before the staging goes
        // back (see `finish`).
        if let Err(error) = self.stream.synchronize() {
            let error = self.fault("waiting for the stream at shutdown", error);
            if !matches!(error, Error::DeviceLost { .. }) {
                // The stream may still launch the graphs and run the
                // batches in flight: kept for the process (nobody is left
                // to tell but a download's waiter). Their completion
                // events go (the driver lets an event recorded on a
                // stream go once the stream passed it), and the spare
                // batches with the queue.
                let replays = mem::take(&mut *self.replays.lock());
                let batches = mem::take(&mut self.in_flight.lock().batches);
                let staging = mem::take(&mut *self.staging.lock());
                for (_, batch, pinned, _, template, unsettled) in batches {
                    keep_for_the_process((batch, pinned, template), unsettled, &error);
                }
                mem::forget((replays, staging));
                return;
            }
        }
        // The stream passed every graph launch: none is used again.
        self.replays.lock().clear();
        let mut in_flight = self.in_flight.lock();
        let batches = mem::take(&mut in_flight.batches);
        self.set_unsettled(&mut in_flight, 0);
        in_flight.spare_events.clear();
        in_flight.spare_batches.clear();
        drop(in_flight);
        // The stream is synchronised: what was enqueued completed (or the
        // context is lost, and no stream runs again).
        for (_, batch, _, enqueued, _, unsettled) in batches {
            batch.complete_deallocas(enqueued);
            if let Some(unsettled) = unsettled {
                unsettled.settle(&batch);
            }
        }
    }
}

/// Keeps for the process what the stream may still use after a wait for
/// it failed with `error`, an error that is not sticky (the device is not
/// lost): a batch (its buffers, programs and `dealloca`s, which are never
/// completed, so their ranges never go back to the pool), its page-locked
/// staging and its replay template; as Vulkan's `retire_one` does. Its
/// downloads still pending fail with `error` (a stream callback that still
/// lands finds them settled), so that no waiter hangs on them, and so do
/// its `unsettled` values, with their cause: nothing is left to prove them
/// done later.
fn keep_for_the_process(
    (batch, staging, template): (Batch<Cuda>, Vec<Pinned>, Option<std::sync::Arc<Template>>),
    unsettled: Option<Unsettled>,
    error: &Error,
) {
    if let Some(unsettled) = unsettled {
        unsettled.settle(&batch);
    }
    for command in batch.commands() {
        if let Command::Download { sink, .. } = command {
            sink.fail(error);
        }
    }
    mem::forget((batch, staging, template));
}

/// What a panic met letting a finished batch go is told as.
const LETTING_GO: &str = "a CUDA queue, letting a finished batch go";

impl InFlight {
    /// Clears a finished batch and keeps it, and its event, for reuse.
    fn keep(&mut self, mut batch: Batch<Cuda>, event: Option<CudaEvent>) {
        // A drop of a value of the caller's that panics (on the worker,
        // it would end it) loses the batch instead; `letting_go`, around
        // every call, tells the owner.
        if batch.clear_caught() && self.spare_batches.len() < SPARE_BATCHES {
            self.spare_batches.push(batch);
        }
        if let Some(event) = event
            && self.spare_events.len() < SPARE_EVENTS
        {
            self.spare_events.push(event);
        }
    }
}
