//! What a run takes from the host for its uploads and downloads, staged
//! by `Plan::upload`/`download` (`transfer.rs`) and consumed by the run.

use super::*;
use crate::transfer::{Download, OwnedBytes};

/// What one run's upload or download operation takes from the host.
pub(super) enum Staged<B: Backend> {
    /// The data, of any element type and owner, as bytes.
    Upload(Box<dyn OwnedBytes>),
    Download(Box<dyn StagedDownload<B>>),
}

/// The host end of one download, of any element type.
pub(super) trait StagedDownload<B: Backend>: Send + Sync {
    /// Records the download of `src`.
    fn record(&self, queue: &mut B::Queue, src: &View<B>);
    /// Fails it: its run was refused before recording it.
    fn fail(&self, cause: &Error);
}

impl<B: Backend, T: Pod + Send> StagedDownload<B> for Download<T> {
    fn record(&self, queue: &mut B::Queue, src: &View<B>) {
        queue.download(src, self);
    }

    fn fail(&self, cause: &Error) {
        self.fail_unrecorded(cause);
    }
}

impl<B: Backend> Staged<B> {
    /// Fails what was staged: a download's waiter learns why its run never
    /// recorded it (an upload's data is just dropped).
    pub(super) fn fail(self, cause: &Error) {
        if let Staged::Download(download) = self {
            download.fail(cause);
        }
    }
}
