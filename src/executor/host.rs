//! The host stage: copies between devices that cannot see each other's
//! memory, staged through host memory on a thread of the plan's own.

use crate::sync::mpsc;

use super::*;

/// One run's work for the host stage.
pub(super) struct HostBatch<B: Backend> {
    pub(super) jobs: Vec<HostJob<B>>,
    /// For a run that was refused: the host stage's signal, the run's last
    /// value on it, and why, to fail in order after the earlier runs' jobs.
    pub(super) fail: Option<(B::Signal, u64, Error)>,
}

pub(super) struct HostJob<B: Backend> {
    /// What the copy waits for; `true` where the wait is settled (on an
    /// earlier run: its failure passes it).
    pub(super) waits: Vec<(B::Signal, u64, bool)>,
    pub(super) dst: View<B>,
    pub(super) src: View<B>,
    pub(super) signal: B::Signal,
    pub(super) value: u64,
}

/// The host stage's thread: runs each batch's copies in order. A copy
/// that fails (or whose input failed) fails its value; the copies after it
/// in the run still honour their waits, in order, before failing theirs,
/// as a device queue drains (`FailureScope::Batch`), so a value this
/// stage fails settles only after what it waited for.
pub(super) fn run_host_stage<B: Backend>(batches: mpsc::Receiver<HostBatch<B>>) {
    let mut staging: Vec<u8> = Vec::new();
    while let Ok(batch) = batches.recv() {
        if let Some((signal, last, error)) = &batch.fail {
            signal.fail(*last, error.clone());
        }
        let mut failed: Option<std::sync::Arc<Error>> = None;
        for job in &batch.jobs {
            let waited = job.waits.iter().try_for_each(|(signal, value, settled)| {
                let outcome = signal.wait(*value, Timeout::Forever);
                if *settled || failed.is_some() {
                    crate::queue::settled(outcome)
                } else {
                    outcome
                }
            });
            if let Some(cause) = &failed {
                // Draining: the waits were honoured; the copy does not run.
                job.signal.fail(
                    job.value,
                    Error::EarlierBatchFailed {
                        cause: cause.clone(),
                    },
                );
                continue;
            }
            let outcome = waited.and_then(|()| {
                staging.resize(job.src.len(), 0);
                job.src.read_into(&mut staging)?;
                job.dst.write_from(&staging)
            });
            match outcome {
                Ok(()) => job.signal.set(job.value),
                Err(error) => {
                    let cause = std::sync::Arc::new(error);
                    job.signal.fail(job.value, (*cause).clone());
                    failed = Some(cause);
                }
            }
        }
    }
}
