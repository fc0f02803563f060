//! [`CollectiveError`]: what goes wrong with a communicator or a
//! collective, carried by [`Error::Collective`](crate::Error::Collective).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

/// A communicator's or a collective's failure. Each names the rank that
/// saw it (of the communicator's `size`) and ends with what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A collective recorded with views that do not fit it (checked on the
    /// recording rank, when it is recorded: the batch is rejected).
    #[error("rank {rank} of {size}: {op} cannot run: {reason}")]
    Invalid {
        /// The recording rank.
        rank: usize,
        /// The communicator's size.
        size: usize,
        /// The collective (`"all_reduce"`, ...).
        op: &'static str,
        /// What is wrong, and how to fix it.
        reason: String,
    },

    /// Ranks disagree on a collective: they ran different operations,
    /// element types or counts at the same place of the communicator's
    /// order. Found when the collective runs (each rank's description is
    /// exchanged before any data moves), on every rank involved.
    #[error(
        "rank {rank}: its {here} disagrees with rank {peer}'s {there}; every rank must record \
         the same collectives on a communicator, with the same element type and counts, in the \
         same order (order queues that share a communicator with signals)"
    )]
    Mismatch {
        /// The rank reporting.
        rank: usize,
        /// The first rank that disagrees with it.
        peer: usize,
        /// This rank's collective, described.
        here: String,
        /// The peer's, described.
        there: String,
    },

    /// A collective did not complete within the communicator's timeout: a
    /// peer exited, failed, or never ran its side. MPI cannot cancel a
    /// started collective, and NCCL's is ended by aborting the
    /// communicator (its watchdog calls `ncclCommAbort`), so the
    /// communicator is unusable afterwards ([`CollectiveError::Broken`]).
    #[error(
        "rank {rank}: {op} did not complete within {waited:?} (a peer exited, failed, or never \
         ran the matching collective); this communicator is unusable now: make a new one, or \
         raise the timeout (Communicator::set_timeout) if the peers are only slow"
    )]
    Timeout {
        /// The rank reporting.
        rank: usize,
        /// The collective, described.
        op: String,
        /// How long it waited.
        waited: Duration,
    },

    /// A collective on a communicator that failed before.
    #[error(
        "rank {rank}: the communicator failed earlier and runs no more collectives ({cause}); \
         make a new communicator"
    )]
    Broken {
        /// The rank reporting.
        rank: usize,
        /// The first failure.
        cause: Arc<Error>,
    },

    /// A collective (or send, or receive) over NCCL that this rank did not
    /// run (its batch was refused, or failed before it), where its peers
    /// run theirs. NCCL cannot tell them (an MPI communicator forfeits it,
    /// described failed, and stays usable), and their call would pair
    /// with this rank's next one: so the communicator runs no more
    /// collectives on this rank (each fails with
    /// [`CollectiveError::Broken`] naming this), and the peers' call times
    /// out.
    #[error(
        "rank {rank}: {op} was not run ({cause}) where its peers run theirs; NCCL cannot tell \
         them, and their call would pair with this rank's next one, so this communicator runs \
         no more collectives (the peers' call times out): make a new communicator"
    )]
    Skipped {
        /// The rank reporting.
        rank: usize,
        /// The collective, described.
        op: String,
        /// Why it was not run.
        cause: Arc<Error>,
    },

    /// A queue whose engine runs no collectives, or not over this
    /// communicator's engine.
    #[error("a `{backend}` queue cannot run collectives over a `{engine}` communicator: {remedy}")]
    Unsupported {
        /// The queue's backend.
        backend: &'static str,
        /// The communicator's engine (`"mpi"`).
        engine: &'static str,
        /// What to do instead.
        remedy: &'static str,
    },

    /// An MPI call returned an error code.
    #[error("rank {rank}: {call} failed with MPI error {code}: {message}")]
    Mpi {
        /// The rank reporting (`usize::MAX` before the rank is known).
        rank: usize,
        /// The MPI function.
        call: &'static str,
        /// Its error code.
        code: i32,
        /// MPI's text for it.
        message: String,
    },

    /// MPI's thread support is too low for queue workers to call it.
    #[error(
        "MPI provides thread support `{provided}`, but hwqueue's queue workers call MPI from \
         their own threads, which needs `multiple` (MPI_THREAD_MULTIPLE): use an MPI built \
         with it (Debian's OpenMPI is), and do not initialise MPI yourself with a lower level"
    )]
    Threading {
        /// The level MPI provides.
        provided: &'static str,
    },

    /// MPI was finalised: it cannot start again in the same process.
    #[error(
        "MPI was finalised (the `Mpi` handle was dropped, or the program finalised it), and \
         cannot start again in this process: keep the `Mpi` handle alive as long as any \
         communicator is used"
    )]
    Finalized,

    /// NCCL's library could not be loaded (the `nccl` feature loads it at
    /// run time, as the CUDA backend loads the driver).
    #[error(
        "NCCL was not found: {found}; install it (`apt-get install libnccl2 libnccl-dev` from \
         NVIDIA's CUDA repository, or `pip install nvidia-nccl-cu12` and add its `lib` directory \
         to LD_LIBRARY_PATH). cudarc opens `libnccl.so`, which only the development package \
         installs: where there is only `libnccl.so.2`, symlink it as `libnccl.so` in a directory \
         on LD_LIBRARY_PATH (`ln -s /usr/lib/x86_64-linux-gnu/libnccl.so.2 DIR/libnccl.so`)"
    )]
    NoNccl {
        /// What the probe found.
        found: &'static str,
    },

    /// An NCCL call returned an error code.
    #[error("rank {rank}: {call} ({what}) failed with NCCL's {name} ({code}): {remedy}")]
    Nccl {
        /// The rank reporting (`usize::MAX` before the rank is known).
        rank: usize,
        /// The NCCL function.
        call: &'static str,
        /// What it was for: the collective described, or the
        /// communicator's creation.
        what: String,
        /// Its `ncclResult_t` value.
        code: u32,
        /// The code's name (`ncclInvalidUsage`).
        name: String,
        /// What the code usually means, and what to do.
        remedy: &'static str,
    },
}

impl CollectiveError {
    /// [`CollectiveError::Unsupported`] for a queue of `backend` given a
    /// collective over `communicator`: what an engine that runs none (or
    /// not over this communicator's engine) says.
    pub fn unsupported(backend: &'static str, communicator: &super::Communicator) -> Self {
        let remedy = match (backend, communicator.on_host()) {
            ("cpu", false) => {
                "this communicator moves device memory: record its collectives on \
                               a queue of its device"
            }
            ("cuda", true) => {
                "MPI moves host memory: record its collectives on a CPU queue, with the data \
                 copied to CPU buffers, or make an NCCL communicator of this queue's device \
                 (`Communicator::nccl_single`, the `nccl` feature)"
            }
            _ => {
                "record collectives on a CPU queue over an MPI communicator (the `mpi` \
                  feature), with the data copied to CPU buffers"
            }
        };
        CollectiveError::Unsupported {
            backend,
            engine: communicator.engine(),
            remedy,
        }
    }
}
