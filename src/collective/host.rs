//! What a host engine's transfer is handed: a collective's data through
//! the communicator's staging memory, or its views' own memory (one
//! collective's, or a group of sends' and receives').

use crate::error::Result;

/// What a host engine moves a collective's data through.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) enum HostData<'a> {
    /// The communicator's staging memory: `read` fills the send staging
    /// from the send view before the ranks talk, `write` copies the result
    /// out to the receive view after.
    Staged {
        read: &'a mut dyn FnMut(&mut [u8]) -> Result<()>,
        write: &'a mut dyn FnMut(&[u8]) -> Result<()>,
    },
    /// The views' own memory, held while the data moves.
    Direct(&'a mut dyn HostViews),
}

/// A collective's views, handed to a host engine's transfer directly
/// (no staging copies): what a CPU queue gives a collective that does not
/// [`stage`](super::Communicator::stages).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) trait HostViews {
    /// Whether the views' memory can be reached, before the ranks talk (a
    /// rank that cannot still describes itself, marked failed).
    ///
    /// # Errors
    /// The buffers' refusal ([`Error::UseAfterDealloca`](crate::Error::UseAfterDealloca), ...).
    fn check(&mut self) -> Result<()>;

    /// Holds the views for the transfer, which reads the send view and
    /// writes the receive view until the engine returns: their first bytes
    /// (null where the collective has none), as long as the collective
    /// needs. `None` where other work (a kernel of another queue) still
    /// held a buffer at `deadline`: the peers, which started their part,
    /// time out by then.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    fn hold(&mut self, deadline: std::time::Instant) -> Result<Option<(*const u8, *mut u8)>>;

    /// Whether the send view is the receive view (an `all_reduce` in
    /// place): MPI is then given a copy of it to send (rsmpi has no
    /// `MPI_IN_PLACE`), and the result goes to the view directly.
    fn in_place(&self) -> bool;

    /// The transfer failed with the memory still the engine's (an MPI
    /// collective that timed out cannot be cancelled): the held views'
    /// memory must never be reached or reused again.
    fn lose(&mut self);
}

/// The views of a group of point-to-point commands, handed to a host
/// engine's transfer directly (as [`HostViews`] are for
/// one collective).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) trait HostGroupViews {
    /// Whether member `index`'s view can be reached, and its receive view
    /// (if it has one) overlaps no other member's view, before the ranks
    /// talk: a member that fails is described failed, so its peer fails
    /// it too, at once.
    ///
    /// # Errors
    /// The buffer's refusal ([`Error::UseAfterDealloca`](crate::Error::UseAfterDealloca), ...);
    /// [`CollectiveError::Invalid`](super::CollectiveError::Invalid) for
    /// an overlap.
    fn check(&mut self, index: usize) -> Result<()>;

    /// Holds member `index`'s buffer for its transfer, which reads its
    /// send view or writes its receive view until
    /// [`release`](Self::release), without waiting: the view's first byte
    /// (send, receive; null where it has none), or `None` while the buffer
    /// is held elsewhere (a kernel of another queue): the engine asks
    /// again. A buffer another member holds already is shared with it.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    fn try_hold(&mut self, index: usize) -> Result<Option<(*const u8, *mut u8)>>;

    /// Member `index`'s transfer completed: its hold goes (its buffer's
    /// lock with it, once no other member holds it).
    fn release(&mut self, index: usize);

    /// A transfer failed with the memory still the engine's: every held
    /// buffer's memory must never be reached or reused again (see
    /// [`HostViews::lose`]).
    fn lose(&mut self);
}
