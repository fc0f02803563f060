//! Host data for a plan's uploads and downloads, staged per run.
//!
//! A schedule's [`upload`](Schedule::upload) and
//! [`download`](Schedule::download) operations name device bytes only: the
//! host side changes every run (the next batch of inputs, a fresh place for
//! the outputs). [`Plan::upload`], [`Plan::upload_vec`] and
//! [`Plan::download`] stage it for the next [`Plan::run`], which consumes
//! it: a run never repeats the last run's input by accident, and a run with
//! an operation left unstaged is refused before anything is recorded
//! ([`Error::TransferNotStaged`]).

use super::plan::Plan;
use super::schedule::Work;
use super::staged::Staged;
use super::*;
use crate::transfer::{Download, check_transfer_len, owned_bytes};

impl<B: Backend> Plan<B> {
    /// Stages `data` for upload operation `op` of the next [`run`](Self::run),
    /// copying it now (the caller's memory is free at once); to hand over
    /// memory without that copy, [`upload_vec`](Self::upload_vec). Staging
    /// again before the run replaces it.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] when `op` is not an upload of this plan;
    /// [`Error::TransferSizeMismatch`] when `data` is not exactly the
    /// destination's length.
    pub fn upload<T: Pod>(&mut self, op: OpId, data: &[T]) -> Result<()> {
        self.check_upload(op, size_of_val(data))?;
        // As bytes: a `Pod` type need not be `Send`, its bytes are.
        let bytes = crate::buffer::bytes_of(data).to_vec();
        self.staged[op.0] = Some(Staged::Upload(owned_bytes::<u8, _>(bytes)));
        Ok(())
    }

    /// Stages `data` for upload operation `op` of the next
    /// [`run`](Self::run), taking ownership instead of copying: a `Vec<T>`,
    /// a `Box<[T]>`, or an `Arc<[T]>`, which the host keeps sharing, so an
    /// input that stays the same goes up every run without a copy.
    ///
    /// # Errors
    /// As [`upload`](Self::upload).
    pub fn upload_vec<T, O>(&mut self, op: OpId, data: O) -> Result<()>
    where
        T: Pod,
        O: AsRef<[T]> + Send + Sync + 'static,
    {
        self.check_upload(op, size_of_val(data.as_ref()))?;
        self.staged[op.0] = Some(Staged::Upload(owned_bytes::<T, _>(data)));
        Ok(())
    }

    /// Stages where download operation `op` of the next [`run`](Self::run)
    /// lands: `into` is ready once that run's download ran (after
    /// [`Run::wait`] returned, or [`Download::wait`] on it). A run that
    /// does not get to it fails `into` with the reason.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] when `op` is not a download of this
    /// plan; [`Error::TransferSizeMismatch`] when `into` is not exactly the
    /// source's length; [`Error::DownloadReused`] when `into` was recorded
    /// before.
    pub fn download<T: Pod + Send>(&mut self, op: OpId, into: &Download<T>) -> Result<()> {
        let len = self.transfer_len(op, "download")?;
        // Reuse first: a download whose result was taken has length 0, and
        // would otherwise be reported as a size mismatch.
        if !into.is_idle() {
            return Err(Error::DownloadReused);
        }
        check_transfer_len("download", into.len() * size_of::<T>(), len)?;
        self.staged[op.0] = Some(Staged::Download(Box::new(into.handle())));
        Ok(())
    }

    fn check_upload(&self, op: OpId, host: usize) -> Result<()> {
        check_transfer_len("upload", host, self.transfer_len(op, "upload")?)
    }

    /// The device length of `op`, an operation made by `Schedule::{what}`.
    fn transfer_len(&self, op: OpId, what: &'static str) -> Result<usize> {
        let work = self.schedule.ops.get(op.0).map(|o| &o.work);
        let buffer = match (work, what) {
            (Some(Work::Upload { dst }), "upload") => dst,
            (Some(Work::Download { src }), "download") => src,
            _ => {
                let described = match self.schedule.ops.get(op.0) {
                    Some(o) => format!("operation `{}` is not an {what}", o.name),
                    None => format!("operation {} is not in this plan", op.0),
                };
                return Err(Error::InvalidSchedule {
                    reason: format!(
                        "`Plan::{what}` stages host data for an operation made by \
                         `Schedule::{what}`, but {described}"
                    ),
                });
            }
        };
        Ok(self.schedule.buffers[buffer.0].len)
    }

    /// Takes what was staged for one run, or refuses the run (nothing
    /// taken) when a transfer has nothing staged.
    pub(super) fn take_staged(&mut self) -> Result<Vec<Option<Staged<B>>>> {
        if self.transfers.is_empty() {
            // No transfers: nothing to look at or take, nothing allocated.
            return Ok(Vec::new());
        }
        for &at in &self.transfers {
            let op = &self.schedule.ops[at];
            let what = match op.work {
                Work::Upload { .. } => "upload",
                _ => "download",
            };
            if self.staged[at].is_none() {
                return Err(Error::TransferNotStaged {
                    operation: op.name.clone(),
                    what,
                });
            }
        }
        Ok(self.staged.iter_mut().map(Option::take).collect())
    }
}
