//! Point-to-point commands run as a group: the `send`s and `recv`s of a
//! batch over one communicator, recorded one after another with nothing
//! between them, start together, as NCCL runs such a run in one
//! `ncclGroupStart`/`ncclGroupEnd`. So a rank may send to and receive from
//! its peers in any order within the group (a ring's send to the next rank
//! and receive from the one before, two ranks' exchange, each sending
//! first) without each transfer waiting for the one before it, and the
//! same recording runs on a CPU queue over MPI and on a CUDA queue over
//! NCCL. Across groups the order is the communicator's, as for every
//! collective.

#[cfg(feature = "nccl")]
use super::CollectiveError;
use super::{Communicator, HostCollective};
use crate::error::{Error, Result};

/// The views of a group of point-to-point commands, handed to a host
/// engine's transfer directly (as [`HostViews`](super::HostViews) are for
/// one collective).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) trait HostGroupViews {
    /// Whether member `index`'s view can be reached, and its receive view
    /// (if it has one) overlaps no other member's view, before the ranks
    /// talk: a member that fails is described failed, so its peer fails
    /// it too, at once.
    ///
    /// # Errors
    /// The buffer's refusal ([`Error::UseAfterDealloca`], ...);
    /// [`CollectiveError::Invalid`](super::CollectiveError::Invalid) for
    /// an overlap.
    fn check(&mut self, index: usize) -> Result<()>;

    /// Holds every member's buffer for the transfers, which read the send
    /// views and write the receive views until the engine returns: each
    /// member's first bytes (send, receive; null where it has none).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    fn hold(&mut self) -> Result<Vec<(*const u8, *mut u8)>>;

    /// A transfer failed with the memory still the engine's: every held
    /// buffer's memory must never be reached or reused again (see
    /// [`HostViews::lose`](super::HostViews::lose)).
    fn lose(&mut self);
}

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
