//! Hardware command queues: record a batch, then hand it over on `submit`.

use std::fmt;

use crate::backend::{Backend, BufferOf, ProgramOf, SignalOf};
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};
use crate::program::Scalar;
use crate::signal::{TimelineSignal, Timeout};

/// What a queue may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// Every command.
    Compute,
    /// Everything but `exec`.
    Copy,
}

impl fmt::Display for QueueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueKind::Compute => "compute",
            QueueKind::Copy => "copy",
        })
    }
}

/// A builder of command batches for one hardware queue.
///
/// Recording calls chain (`q.wait(&a, 1).exec(..).signal(&b, 2)`) and never
/// fail on their own: a command that cannot run (bad sizes, a value out of
/// range, a copy-queue `exec`) rejects the whole batch, reported by the next
/// [`submit`](Self::submit), and nothing of that batch runs. Commands run in
/// the order recorded, batch after batch; `submit` returns without waiting
/// for them.
///
/// When a command fails while running (a kernel panics, a waited-on signal
/// fails), the rest of its batch is abandoned, every signal the batch would
/// have set is [failed](TimelineSignal::fail) so its waiters wake with an
/// error, and the failure is reported to the owner by the next `submit` or
/// `synchronize`. Batches submitted before the owner was told are not run
/// either (their signals fail too); after it, the queue works again.
pub trait HardwareQueue: Send + Sized {
    /// The backend this queue runs on.
    type Backend: Backend<Queue = Self>;

    /// The queue's kind.
    fn kind(&self) -> QueueKind;

    /// Records: block later commands until `signal` reaches `value`.
    fn wait(&mut self, signal: &SignalOf<Self::Backend>, value: u64) -> &mut Self;

    /// Records: once every earlier command completed, raise `signal` to `value`.
    fn signal(&mut self, signal: &SignalOf<Self::Backend>, value: u64) -> &mut Self;

    /// Records: run `program` over the grid of `params`, with `buffers` then
    /// `scalars` as its arguments.
    fn exec(
        &mut self,
        program: &ProgramOf<Self::Backend>,
        buffers: &[&BufferOf<Self::Backend>],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self;

    /// Records: copy all of `src` into `dst`. Sizes must be equal; a
    /// mismatch rejects the batch and copies nothing.
    fn copy(&mut self, dst: &BufferOf<Self::Backend>, src: &BufferOf<Self::Backend>) -> &mut Self;

    /// Records: make the memory writes of earlier commands visible to later
    /// commands and to other queues.
    fn memory_barrier(&mut self) -> &mut Self;

    /// Records: block later commands until a signal of *another* backend
    /// reaches `value`. The backend waits for it by whatever means it has
    /// (the CPU blocks its worker on it; a GPU may poll from the host): see
    /// each backend's docs for the cost. Same-backend signals take
    /// [`wait`](Self::wait), which is native.
    fn wait_foreign<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self;

    /// Records a failure: the batch is rejected at `submit` with `error`.
    /// For callers (like the Any* enums) that find a problem while recording.
    fn reject(&mut self, error: Error) -> &mut Self;

    /// Hands the recorded batch to the hardware and starts a new one. Does
    /// not wait for the work to complete.
    ///
    /// # Errors
    /// [`Error::BatchRejected`] when a recorded command was invalid (nothing
    /// ran; the recorded batch is discarded and its signals failed);
    /// [`Error::QueueFailed`] when earlier submitted work failed (the batch
    /// is kept: call `submit` again to send it).
    fn submit(&mut self) -> Result<()>;

    /// Blocks until every submitted batch completed.
    ///
    /// # Errors
    /// [`Error::QueueFailed`] when submitted work failed since the last report.
    fn synchronize(&mut self) -> Result<()>;
}

/// The checks every backend makes when an `exec` is recorded: the queue's
/// kind, the work sizes against `limits`, and the argument counts (`takes`
/// is what the program declares, `given` what the `exec` passes; each is
/// `(buffers, scalars)`).
pub(crate) fn check_exec(
    kind: QueueKind,
    limits: &Limits,
    program: &str,
    takes: (usize, usize),
    given: (usize, usize),
    params: &ExecParams,
) -> Result<()> {
    if kind == QueueKind::Copy {
        return Err(Error::UnsupportedCommand {
            kind,
            command: "exec",
        });
    }
    params.validate(limits)?;
    let bad = |reason: String| {
        Err(Error::InvalidArguments {
            program: program.to_owned(),
            reason,
        })
    };
    if given.0 != takes.0 {
        return bad(format!(
            "it takes {} buffer(s) but {} were given",
            takes.0, given.0
        ));
    }
    if given.1 != takes.1 {
        return bad(format!(
            "it takes {} scalar(s) but {} were given",
            takes.1, given.1
        ));
    }
    if given.0 > limits.max_buffers {
        return bad(format!(
            "{} buffers exceed the limit of {}",
            given.0, limits.max_buffers
        ));
    }
    Ok(())
}

/// A signal of any backend that a queue's worker can block on: how queues
/// store the signal of a `wait_foreign` (a boxed command, off every
/// same-backend path).
pub(crate) trait ForeignSignal: Send + Sync {
    /// Used by the CUDA worker, to skip a wait already met.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn is_reached(&self, value: u64) -> bool;
    fn wait_forever(&self, value: u64) -> Result<()>;
}

impl<S: TimelineSignal> ForeignSignal for S {
    fn is_reached(&self, value: u64) -> bool {
        TimelineSignal::is_reached(self, value)
    }

    fn wait_forever(&self, value: u64) -> Result<()> {
        self.wait(value, Timeout::Forever)
    }
}

/// Tells a queue's owner of a failure the worker recorded, once: takes it
/// and starts a new epoch, so batches submitted from now on run again.
pub(crate) fn report_failure(
    failure: &mut Option<std::sync::Arc<Error>>,
    epoch: &mut u64,
) -> Result<()> {
    match failure.take() {
        Some(cause) => {
            *epoch += 1;
            Err(Error::QueueFailed { cause })
        }
        None => Ok(()),
    }
}
