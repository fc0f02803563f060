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
    pub(super) waits: Vec<(B::Signal, u64)>,
    pub(super) dst: View<B>,
    pub(super) src: View<B>,
    pub(super) signal: B::Signal,
    pub(super) value: u64,
    /// The last value of this run on the host's timeline, to fail on error.
    pub(super) last: u64,
}

/// The host stage's thread: runs each batch's copies in order.
pub(super) fn run_host_stage<B: Backend>(batches: mpsc::Receiver<HostBatch<B>>) {
    let mut staging: Vec<u8> = Vec::new();
    while let Ok(batch) = batches.recv() {
        if let Some((signal, last, error)) = &batch.fail {
            signal.fail(*last, error.clone());
        }
        for (index, job) in batch.jobs.iter().enumerate() {
            let outcome = job
                .waits
                .iter()
                .try_for_each(|(signal, value)| signal.wait(*value, Timeout::Forever))
                .and_then(|()| {
                    staging.resize(job.src.len(), 0);
                    job.src.read_into(&mut staging)?;
                    job.dst.write_from(&staging)
                });
            match outcome {
                Ok(()) => job.signal.set(job.value),
                Err(error) => {
                    // Fail the rest of this batch's values, with the
                    // failure as their cause: nobody hangs.
                    let cause = std::sync::Arc::new(error);
                    job.signal.fail(job.last, (*cause).clone());
                    for later in &batch.jobs[index + 1..] {
                        later.signal.fail(
                            later.last,
                            Error::EarlierBatchFailed {
                                cause: cause.clone(),
                            },
                        );
                    }
                    break;
                }
            }
        }
    }
}
