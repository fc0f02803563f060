//! The worker thread of a CUDA queue: it takes over a batch at a wait
//! the stream cannot express (a value not recorded yet, another backend's
//! signal), blocks on the host until it can be enqueued, and enqueues it
//! and every batch submitted behind it, in order, until the queue is
//! dropped and drained. `super::stream` is what it shares with the owner.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::profile::now_ns;
use crate::queue::{Admission, Batch, Command};
use crate::signal::TimelineSignal;
use crate::sync::Ordering;

use super::Cuda;
use super::in_flight::Unsettled;
use super::repeat::Template;
use super::stream::{Outcome, Pending, Shared, StreamQuery};

/// How long the idle worker first sleeps between retirements while a batch
/// in flight holds values it could not fail yet, and at most (doubling):
/// their waiters may have nothing else to move the retirement on.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(100);

/// The worker: enqueues handed-over batches in order, blocking on the host
/// for the waits that stopped them, until the queue is dropped and drained.
pub(super) fn run_worker(shared: &Shared) {
    loop {
        let Pending {
            batch,
            mut from,
            failed,
            mark,
        } = {
            let mut state = shared.state.lock();
            let mut poll = POLL_FIRST;
            loop {
                if let Some(next) = state.pending.pop_front() {
                    break next;
                }
                state.worker_busy = false;
                shared.busy.store(false, Ordering::Release);
                if state.sync_waiters > 0 {
                    shared.idle.notify_all();
                }
                // Values failed only once the stream passed their batch
                // (`Unsettled`): retired by this thread too while the
                // queue lives (the owner's `synchronize` does not wait for
                // them). A stream that never proves them done keeps this
                // thread polling, at most ten times a second, rather than
                // failing them early; once the queue is dropped (its drop
                // returns at once), `shut_down`'s wait for the stream
                // decides for them, as for every batch in flight, so the
                // thread ends.
                if shared.unsettled() && !state.closed {
                    let deadline = Instant::now() + poll;
                    state = shared.work.wait_until(state, Some(deadline));
                    poll = (poll * 2).min(POLL_MAX);
                    drop(state);
                    shared.retire();
                    state = shared.state.lock();
                    continue;
                }
                if state.closed {
                    drop(state);
                    shared.shut_down();
                    shared.ledger.retire();
                    return;
                }
                state = shared.work.wait(state);
            }
        };
        // A batch handed over part-enqueued (`from > 0`) was admitted when
        // its first command went on the stream: it must finish, so the
        // buffers it already uses stay alive until the stream passes it.
        if from == 0
            && failed.is_none()
            && let Admission::Skip(cause) = shared.ledger.admit(&batch)
        {
            // Its values fail as a failed batch's do: once the work on
            // the stream before them completed.
            let proven = shared.earlier_work_done("waiting for the work before a skipped batch");
            let unsettled = Unsettled {
                from: 0,
                cause: std::sync::Arc::new(cause),
            };
            let proven = proven.map_err(Some);
            settle(shared, batch, 0, mark.held(), unsettled, proven, false);
            continue;
        }
        let outcome = match failed {
            // Failed on the owner's thread, to drain here.
            Some(error) => Outcome::Failed(from, error),
            None => loop {
                match shared.enqueue_caught(&batch, from, &mark) {
                    Outcome::Blocked(at) => {
                        let command = &batch.commands()[at];
                        let start = now_ns();
                        let blocked = block_on(shared, command);
                        if shared.profiling.load(Ordering::Relaxed)
                            && let Some(profiler) = shared.profiler.lock().as_mut()
                        {
                            profiler.push_host(command, batch.sequence(), at, start);
                        }
                        match blocked {
                            // The value is recorded, reached, or the foreign
                            // signal is reached: the command now enqueues.
                            Ok(()) => from = at,
                            Err(error) => break Outcome::Failed(at, error),
                        }
                    }
                    other => break other,
                }
            },
        };
        match outcome {
            Outcome::Failed(at, error) => {
                // The values from the failure on settle in queue order:
                // once the work enqueued before it (the batch's own, and
                // earlier batches') completed (the stream holds only work
                // that completes on its own), so a waiter a failure lets
                // through (a plan's next run) comes after it. The failure
                // is recorded first (the owner's next call reports it,
                // later batches cascade), whether or not they can fail now.
                let proven = shared.earlier_work_done("waiting for a failed batch's earlier work");
                let cause = shared.ledger.record_failure(&batch, error);
                let unsettled = Unsettled { from: at, cause };
                // The wait's own error, if any, is the stream's: the
                // owner's `synchronize` meets it too.
                let drain = shared.ledger.independent();
                let proven = proven.map_err(|_| None);
                settle(shared, batch, at, mark.held(), unsettled, proven, drain);
            }
            _ => {
                let all = batch.commands().len();
                if let Some(batch) = shared.finish(batch, all, mark.held()) {
                    shared.recycle(batch, None);
                }
            }
        }
        shared.retire();
    }
}

/// Fails `batch`'s values from `unsettled.from` on, of which the first
/// `enqueued` commands are on the stream, where `proven` says the work
/// before them is done (or the device lost; `Ok` holds how many batches
/// were in flight when the wait for the stream that proved it began): at
/// once, after the values of earlier batches kept unsettled (retired
/// first: queue order, and a drain may wait for one of them, which
/// nothing else would settle while it blocks this thread), draining the
/// batch's later waits first where `drain` (a failure of its own under
/// `FailureScope::Batch`); else, with the
/// error of the wait that could not tell (for the owner, where nothing
/// else is to be reported), once the stream passed the batch
/// ([`Unsettled`]): kept in flight until then, with all it holds, its
/// later waits honoured here first where `drain` (unless the stream is
/// found idle meanwhile: the batch then drains as where `proven`).
fn settle(
    shared: &Shared,
    batch: Batch<Cuda>,
    enqueued: usize,
    template: Option<std::sync::Arc<Template>>,
    unsettled: Unsettled,
    proven: std::result::Result<u64, Option<Error>>,
    drain: bool,
) {
    let unsettled = match proven {
        Ok(waited) => {
            shared.retire_waited(waited);
            let Unsettled { from, cause } = unsettled;
            if drain {
                batch.drain_failed(from, &cause);
            } else {
                batch.fail_signals(from, &cause);
            }
            None
        }
        Err(error) => {
            if let Some(error) = error {
                shared.ledger.fail_unbatched(error);
            }
            // A collective this rank skips breaks its communicator now, not
            // as the batch retires: a later batch (admitted under
            // `FailureScope::Batch`, or once the owner was told) would
            // launch one on it meanwhile, out of step with the peers. The
            // retirement's own `skipped` then finds it broken already.
            #[cfg(feature = "nccl")]
            for command in batch.commands().iter().skip(unsettled.from) {
                if let Command::Collective(collective) = command
                    && collective.numbered
                    && let Some(nccl) = collective.communicator.as_nccl()
                {
                    nccl.skipped(collective, &unsettled.cause);
                }
            }
            // The drain's waits, honoured here (the values fail later, on
            // whichever thread retires the batch, after every one of them),
            // unless the stream is found idle meanwhile: the batch then
            // drains in queue order, each value failing before the waits
            // after it are honoured (a thread may set what a later wait
            // waits for only once an earlier value settled).
            let proven = if drain {
                (batch.commands().iter().skip(unsettled.from + 1))
                    .find_map(|command| honour(shared, command))
            } else {
                None
            };
            match proven {
                Some(waited) => {
                    shared.retire_waited(waited);
                    batch.drain_failed(unsettled.from, &unsettled.cause);
                    None
                }
                None => Some(unsettled),
            }
        }
    };
    if let Some(batch) = shared.finish_unsettled(batch, enqueued, template, unsettled) {
        shared.recycle(batch, None);
    }
}

/// Blocks on the host until the wait `command` of a failed batch whose
/// values are kept unsettled is over (its value reached or failed), as
/// `Batch::drain_failed` honours it; in slices (see [`block_on`]),
/// retiring batches between them, and querying the stream: `Some` (how
/// many batches were in flight before the query, for `retire_waited`) as
/// soon as the stream is found idle (or the device lost), the work before
/// the batch's values done, whether or not the wait is over; or once the
/// queue is dropped, as `Shared::decide_once_dropped` decides for them.
fn honour(shared: &Shared, command: &Command<Cuda>) -> Option<u64> {
    if !matches!(
        command,
        Command::Wait { .. } | Command::WaitSettled { .. } | Command::WaitForeign { .. }
    ) {
        return None;
    }
    let mut poll = POLL_FIRST;
    loop {
        // Once the queue is dropped, the drop decides for the values, as
        // `shut_down` would (the wait may be for a value a thread sets
        // only once they settled).
        if let Some(waited) = stream_passed(shared).or_else(|| shared.decide_once_dropped()) {
            return Some(waited);
        }
        let over = match command {
            Command::Wait { signal, value } | Command::WaitSettled { signal, value } => {
                !matches!(signal.wait(*value, poll), Err(Error::Timeout { .. }))
            }
            Command::WaitForeign { signal, value } => {
                let reached = signal.is_reached(*value);
                if !reached {
                    std::thread::sleep(poll);
                }
                reached
            }
            _ => true,
        };
        if over {
            return None;
        }
        shared.retire();
        poll = (poll * 2).min(POLL_MAX);
    }
}

/// Whether the stream passed all the work put on it, by a query that
/// blocks for nothing: `Some` of how many batches were in flight before
/// it (what it passed, for `retire_waited`) where it is idle or the
/// device is lost (a sticky error; its stream runs nothing again); `Some(0)`
/// on a stalled queue, whose values fail at once (see
/// `Shared::earlier_work_done`), and where the query fails without losing
/// the device: the stream's wait failed so already (the caller keeps the
/// values for want of a proof), so nothing can tell any more, and the
/// queue asks the stream once more, then stalls (helper-73, finding 3: a
/// worker honouring a wait for a value a thread sets only once they
/// settled waited for good); `None` where work may still run.
fn stream_passed(shared: &Shared) -> Option<u64> {
    const WHY: &str = "behind a failed batch whose stream could be neither waited for nor queried";
    let (before, error) = match shared.query_stream() {
        StreamQuery::Stalled => return Some(0),
        StreamQuery::Idle(before) => return Some(before),
        StreamQuery::Busy => return None,
        StreamQuery::Failed(before, error) => (before, error),
    };
    match shared.fault("querying the stream behind a failed batch", error) {
        Error::DeviceLost { .. } => Some(before),
        _ => {
            shared.ask_the_stream_or_stall(WHY);
            Some(0)
        }
    }
}

/// Blocks on the host until the wait `command` can be enqueued. While a
/// batch in flight holds values it could not fail yet ([`Unsettled`]), in
/// slices (1 ms doubling to 100 ms, as the idle worker polls), retiring
/// batches between them: the wait may be for a value that a thread sets
/// only once those values settled, and nothing else retires them while
/// the owner submits nothing; once the queue is dropped, the drop decides
/// for them (`Shared::decide_once_dropped`), as `shut_down` would. (A
/// foreign signal, which can only be waited for without end, is polled
/// meanwhile.)
fn block_on(shared: &Shared, command: &Command<Cuda>) -> Result<()> {
    let mut poll = POLL_FIRST;
    while shared.unsettled() {
        // `None`: not over within the slice.
        let within = |waited: Result<()>| match waited {
            Err(Error::Timeout { .. }) => None,
            waited => Some(waited),
        };
        let slice = match command {
            Command::Wait { signal, value } => {
                within(signal.wait_dependency_for(*value, poll).map(drop))
            }
            Command::WaitSettled { signal, value } => within(crate::queue::settled(
                signal.wait_dependency_for(*value, poll).map(drop),
            )),
            Command::WaitForeign { signal, value } if signal.is_reached(*value) => Some(Ok(())),
            Command::WaitForeign { .. } => {
                std::thread::sleep(poll);
                None
            }
            _ => Some(Ok(())),
        };
        if let Some(over) = slice {
            return over;
        }
        // Once the queue is dropped, the drop decides for them, as
        // `shut_down` would: the worker reaches it only past this wait.
        match shared.decide_once_dropped() {
            Some(waited) => shared.retire_waited(waited),
            None => shared.retire(),
        }
        poll = (poll * 2).min(POLL_MAX);
    }
    match command {
        Command::Wait { signal, value } => signal.wait_dependency(*value).map(drop),
        Command::WaitSettled { signal, value } => {
            crate::queue::settled(signal.wait_dependency(*value).map(drop))
        }
        Command::WaitForeign { signal, value } => signal.wait_forever(*value),
        _ => Ok(()),
    }
}
