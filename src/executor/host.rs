//! The host stage: copies between devices that cannot see each other's
//! memory, staged through host memory on a thread of the plan's own.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::buffer::Buffer;
use crate::error::panic_message;
use crate::sync::mpsc;

use super::*;

/// One run's work for the host stage.
pub(super) struct HostBatch<B: Backend> {
    pub(super) jobs: Vec<HostJob<B>>,
    /// For a run that was refused: the host stage's signal, the run's last
    /// value on it, and why, to fail in order after the earlier runs' jobs.
    pub(super) fail: Option<(B::Signal, u64, Error)>,
}

impl<B: Backend> HostBatch<B> {
    /// Hands it to the host stage's thread; where that thread has exited
    /// (a bug: a copy that panics fails its value, not the thread), fails
    /// the values it would have set or failed, which nothing else will,
    /// and says so.
    pub(super) fn send(self, host: &mpsc::Sender<HostBatch<B>>) -> Result<()> {
        let Err(refused) = host.send(self) else {
            return Ok(());
        };
        let error = Error::System {
            what: "handing copies to the executor's host stage",
            detail: "its thread has exited".into(),
        };
        let batch = refused.0;
        if let Some((signal, last, cause)) = &batch.fail {
            signal.fail(*last, cause.clone());
        }
        for mut job in batch.jobs {
            job.let_go();
            job.signal.fail(job.value, error.clone());
        }
        Err(error)
    }
}

pub(super) struct HostJob<B: Backend> {
    /// What the copy waits for; `true` where the wait is settled (on an
    /// earlier run: its failure passes it).
    pub(super) waits: Vec<(B::Signal, u64, bool)>,
    pub(super) dst: View<B>,
    pub(super) src: View<B>,
    pub(super) signal: B::Signal,
    pub(super) value: u64,
    /// The uses the job holds of `dst` and `src` where `alloca` made them,
    /// from when the run was recorded until the job's copy is done (let go
    /// just before its value is set or failed).
    pub(super) uses: [Option<HeldUse<B>>; 2],
}

impl<B: Backend> HostJob<B> {
    /// Lets the job's uses go: before its value is set or failed.
    fn let_go(&mut self) {
        self.uses = [None, None];
    }

    /// The uses a copy from `src` into `dst` holds, taken now.
    ///
    /// # Errors
    /// [`Error::UseAfterDealloca`] once a `dealloca` of either is recorded.
    pub(super) fn take_uses(dst: &View<B>, src: &View<B>) -> Result<[Option<HeldUse<B>>; 2]> {
        Ok([
            HeldUse::take(dst, "the host stage's copy destination")?,
            HeldUse::take(src, "the host stage's copy source")?,
        ])
    }
}

/// A use of a buffer made by `alloca` ([`QueueOrdered`](crate::memory::QueueOrdered)),
/// let go when dropped: its range goes back to the pool then if its
/// `dealloca` ran and this was the last use.
pub(super) struct HeldUse<B: Backend>(B::Buffer);

impl<B: Backend> HeldUse<B> {
    fn take(view: &View<B>, what: &'static str) -> Result<Option<Self>> {
        let buffer = view.buffer();
        match buffer.queue_ordered() {
            None => Ok(None),
            Some(ordered) => {
                ordered.begin_use(|| what.into())?;
                Ok(Some(Self(buffer.clone())))
            }
        }
    }
}

impl<B: Backend> Drop for HeldUse<B> {
    fn drop(&mut self) {
        crate::memory::end_use(&self.0);
    }
}

/// The host stage's thread: runs each batch's copies in order. A copy
/// that fails (or whose input failed) fails its value; the copies after it
/// in the run still honour their waits, in order, before failing theirs,
/// as a device queue drains (`FailureScope::Batch`), so a value this
/// stage fails settles only after what it waited for. A job that panics
/// (a bug: a backend's read or write, a signal's wait) fails its value
/// with [`Error::EnginePanicked`], as a failed copy does, and the thread
/// goes on: the later runs' values are its alone to set or fail.
pub(super) fn run_host_stage<B: Backend>(batches: mpsc::Receiver<HostBatch<B>>) {
    let mut staging: Vec<u8> = Vec::new();
    while let Ok(batch) = batches.recv() {
        if let Some((signal, last, error)) = batch.fail {
            let _ = catch_unwind(AssertUnwindSafe(|| signal.fail(last, error)));
        }
        let mut failed: Option<std::sync::Arc<Error>> = None;
        // By value: each job lets its uses go once it settled.
        for job in batch.jobs {
            let (signal, value) = (job.signal.clone(), job.value);
            let ran = catch_unwind(AssertUnwindSafe(|| run_job(job, &mut failed, &mut staging)));
            if let Err(payload) = ran {
                let cause = std::sync::Arc::new(Error::EnginePanicked {
                    message: panic_message(payload),
                });
                let _ = catch_unwind(AssertUnwindSafe(|| signal.fail(value, (*cause).clone())));
                failed = Some(cause);
            }
        }
    }
}

/// One job of [`run_host_stage`]: its waits, then its copy (where nothing
/// before it in the run failed, else `failed` fails it), then its value.
fn run_job<B: Backend>(
    mut job: HostJob<B>,
    failed: &mut Option<std::sync::Arc<Error>>,
    staging: &mut Vec<u8>,
) {
    // Every wait is honoured, the first error kept: a value this stage
    // fails settles only after all its job waited for (the planner leaves
    // out a later operation's wait that one on this value implies).
    let mut waited = Ok(());
    for (signal, value, settled) in &job.waits {
        let outcome = signal.wait(*value, Timeout::Forever);
        let outcome = if *settled || failed.is_some() {
            crate::queue::settled(outcome)
        } else {
            outcome
        };
        if waited.is_ok() {
            waited = outcome;
        }
    }
    if let Some(cause) = failed {
        // Draining: the waits were honoured; the copy does not run.
        job.let_go();
        job.signal.fail(
            job.value,
            Error::EarlierBatchFailed {
                cause: cause.clone(),
            },
        );
        return;
    }
    // As queue work: the job holds a use of each buffer, so a `dealloca`
    // recorded after the run does not refuse it.
    let outcome = waited.and_then(|()| {
        staging.resize(job.src.len(), 0);
        let (src, dst) = (&job.src, &job.dst);
        src.buffer().queue_read_at(src.offset(), staging)?;
        dst.buffer().queue_write_at(dst.offset(), staging)
    });
    // Done with the bytes: whoever sees the value sees the uses gone (a
    // range whose `dealloca` ran is back in the pool).
    job.let_go();
    match outcome {
        Ok(()) => job.signal.set(job.value),
        Err(error) => {
            let cause = std::sync::Arc::new(error);
            job.signal.fail(job.value, (*cause).clone());
            *failed = Some(cause);
        }
    }
}
