//! The worker thread of a CUDA queue: it takes over a batch at a wait
//! the stream cannot express (a value not recorded yet, another backend's
//! signal), blocks on the host until it can be enqueued, and enqueues it
//! and every batch submitted behind it, in order, until the queue is
//! dropped and drained. `super::stream` is what it shares with the owner.

use crate::error::Result;
use crate::profile::now_ns;
use crate::queue::Command;
use crate::sync::Ordering;

use super::Cuda;
use super::stream::{Outcome, Pending, Shared};

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
            loop {
                if let Some(next) = state.pending.pop_front() {
                    break next;
                }
                state.worker_busy = false;
                shared.busy.store(false, Ordering::Release);
                if state.sync_waiters > 0 {
                    shared.idle.notify_all();
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
        if from == 0 && failed.is_none() && !shared.admit(&batch, 0) {
            shared.hold(mark.held());
            shared.recycle(batch, None);
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
                        let blocked = block_on(command);
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
        let enqueued = match outcome {
            // Its later waits honoured first under `FailureScope::Batch`.
            Outcome::Failed(at, error) => {
                // The values from the failure on settle in queue order:
                // once the work enqueued before it (the batch's own, and
                // earlier batches') completed (the stream holds only work
                // that completes on its own), so a waiter a failure lets
                // through (a plan's next run) comes after it. An error is
                // the stream's, reported as usual.
                if let Err(sync) = shared.stream.synchronize() {
                    let _ = shared.fault("waiting for a failed batch's earlier work", sync);
                }
                shared.ledger.complete(&batch, Err((at, error)));
                at
            }
            _ => batch.commands().len(),
        };
        if let Some(batch) = shared.finish(batch, enqueued, mark.held()) {
            shared.recycle(batch, None);
        }
        shared.retire();
    }
}

/// Blocks on the host until the wait `command` can be enqueued.
fn block_on(command: &Command<Cuda>) -> Result<()> {
    match command {
        Command::Wait { signal, value } => signal.wait_dependency(*value).map(drop),
        Command::WaitSettled { signal, value } => {
            crate::queue::settled(signal.wait_dependency(*value).map(drop))
        }
        Command::WaitForeign { signal, value } => signal.wait_forever(*value),
        _ => Ok(()),
    }
}
