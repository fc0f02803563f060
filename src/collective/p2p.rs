//! Point-to-point commands run as a group: the `send`s and `recv`s of a
//! batch over one communicator, recorded one after another with nothing
//! between them, start together, as NCCL runs such a run in one
//! `ncclGroupStart`/`ncclGroupEnd`. So a rank may send to and receive from
//! its peers in any order within the group (a ring's send to the next rank
//! and receive from the one before, two ranks' exchange, each sending
//! first) without each transfer waiting for the one before it, and such a
//! recording runs alike on a CPU queue over MPI and on a CUDA queue over
//! NCCL. (NCCL groups the other collectives of such a run too; MPI runs
//! them alone, so a collective between a send and its receive ends the
//! group there.) Across groups the order is the communicator's, as for
//! every collective.
//!
//! A member that fails (on its rank, or refused by its peer) fails the
//! batch from there, but the members whose peers agreed still move their
//! data, on both ranks: their receive views are written though the batch
//! failed before them.

#[cfg(feature = "nccl")]
use super::CollectiveError;
use super::{Communicator, HostCollective, HostGroupViews};
use crate::error::Error;

impl Communicator {
    /// Runs a group of point-to-point commands over this communicator on
    /// the calling thread (a CPU queue's worker), `plans[i]` over member
    /// `i` of `views`, returning once every transfer completed, or a
    /// member failed or timed out. Members whose peer agreed move their
    /// data even where another member failed.
    ///
    /// # Errors
    /// The first member that failed, and why: as
    /// [`run_on_host`](Self::run_on_host).
    pub(crate) fn run_p2p_on_host(
        &self,
        plans: &[HostCollective],
        views: &mut dyn HostGroupViews,
    ) -> std::result::Result<(), (usize, Error)> {
        let _ = (&plans, &views);
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            super::Transport::Mpi(ref comm) => comm.run_p2p(self, plans, views),
            // CPU queues refuse device communicators when recording.
            #[cfg(feature = "nccl")]
            super::Transport::Nccl(_) => Err((0, CollectiveError::unsupported("cpu", self).into())),
        }
    }
}
