//! [`Engine`]: what a backend supplies to run the batches a
//! [`Queue`](super::Queue) records; everything else of a queue is the core's.

use crate::backend::{Backend, BufferOf, ProgramOf, SignalOf};
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};
use crate::profile::ProfileEvent;
use crate::program::Scalar;
use crate::view::View;

use super::batch::Batch;
use super::ledger::Ledger;
use super::{Queue, QueueKind};

/// How a backend runs the batches a [`Queue`] records.
///
/// An engine receives batches in submission order through
/// [`submit`](Self::submit) and must run them in that order, each command
/// after the one before it. For each batch it reaches it asks the
/// [`Ledger`] what to do ([`Ledger::settle`] does it all for an engine
/// that runs a batch in one go): run it, or only fail its signals (an
/// abandoned batch, or one submitted before the owner was told of an
/// earlier failure). A command that fails ends its batch: the engine
/// reports it with [`Ledger::fail`], which fails the signals the rest of
/// the batch would have set. Nothing an engine does may hang a waiter or
/// be dropped silently.
///
/// Dropping the engine (after the queue abandoned its recorded batch) must
/// let the work already submitted finish, and keep the [`Ledger`] alive
/// until it has.
pub trait Engine: Send + Sized + 'static {
    /// The backend whose queue this engine runs.
    type Backend: Backend<Queue = Queue<Self>>;

    /// The queue's kind.
    fn kind(&self) -> QueueKind;

    /// What one `exec` may ask for.
    fn limits(&self) -> &Limits;

    /// The ledger this engine shares with its queue.
    fn ledger(&self) -> &Ledger;

    /// Checks, when an `exec` is recorded, what the core cannot: that the
    /// program and buffers belong to this queue's device, the backend's
    /// own argument limits, and what the kernel itself allows of `params`
    /// (CUDA: its block size and shared memory). The core already checked
    /// the queue's kind, the work sizes against [`limits`](Self::limits)
    /// and the argument counts, and each view's alignment.
    ///
    /// It must be a function of the program, the views, the scalars'
    /// types (not their values) and `params` alone: an `exec` repeating
    /// the last one on all four (the program by
    /// [`Program::same_as`](crate::Program::same_as)) is recorded without
    /// it. What can change between two `exec`s (a device
    /// lost) is checked when the batch is submitted.
    ///
    /// # Errors
    /// Why the `exec` cannot run; it rejects the batch.
    fn check_exec(
        &self,
        program: &ProgramOf<Self::Backend>,
        buffers: &[View<Self::Backend>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        let _ = (program, buffers, scalars, params);
        Ok(())
    }

    /// Checks, when a command other than `exec` is recorded, that `buffer`
    /// (named `what` in errors: "the copy source") belongs to this queue's
    /// device. (Ranges, lengths and overlaps the core checked.)
    ///
    /// # Errors
    /// Why the command cannot run; it rejects the batch.
    fn check_buffer(&self, what: &'static str, buffer: &BufferOf<Self::Backend>) -> Result<()> {
        let _ = (what, buffer);
        Ok(())
    }

    /// Checks, when a `signal` of `signal` to `value` is recorded, that
    /// this queue can signal it: that it was made by this queue's device
    /// (a queue signals its own device's signals; other devices' queues,
    /// and other backends', may wait on them). The core checked the value
    /// and the producer.
    ///
    /// Whether it refuses must not depend on `value` (only its message
    /// may): `signal` asks [`accepts_signal`](Self::accepts_signal) first,
    /// and calls this only when that says no.
    ///
    /// # Errors
    /// Why the queue cannot signal it; it rejects the batch (and the
    /// value fails, as every signal of a rejected batch does).
    fn check_signal(&self, signal: &SignalOf<Self::Backend>, value: u64) -> Result<()> {
        let _ = (signal, value);
        Ok(())
    }

    /// Whether [`check_signal`](Self::check_signal) passes for `signal`,
    /// without building its error: `signal`'s fast path asks this, and
    /// calls `check_signal` only when it says no. Its verdict must not
    /// depend on the value (only its message may). The default asks
    /// `check_signal`; an engine whose check can fail answers directly.
    #[inline]
    fn accepts_signal(&self, signal: &SignalOf<Self::Backend>) -> bool {
        self.check_signal(signal, 1).is_ok()
    }

    /// Checks, when a collective is recorded, that this engine runs
    /// collectives over `communicator` (its engine: MPI moves host memory,
    /// which CPU queues run). The core checked the views' lengths, the
    /// ranks and the buffers ([`check_buffer`](Self::check_buffer)).
    ///
    /// The default: the engine runs no collectives.
    ///
    /// # Errors
    /// [`CollectiveError::Unsupported`](crate::collective::CollectiveError::Unsupported);
    /// it rejects the batch.
    fn check_collective(&self, communicator: &crate::collective::Communicator) -> Result<()> {
        Err(crate::collective::CollectiveError::unsupported(
            <Self::Backend as Backend>::ID,
            communicator,
        )
        .into())
    }

    /// Allocates `size` bytes from this queue's device's pool for an
    /// [`alloca`](super::HardwareQueue::alloca) being recorded: a buffer whose
    /// [`Buffer::queue_ordered`](crate::Buffer::queue_ordered) is `Some`, and whose memory is valid
    /// for every command recorded after it. (A stream-ordered allocator
    /// allocates on the queue's stream here; one whose memory is valid at
    /// once just takes a range.)
    ///
    /// The default: a backend without queue-ordered allocation refuses.
    ///
    /// # Errors
    /// Out of memory, with the pool's figures; the default's
    /// [`Error::NoQueueOrderedMemory`].
    fn alloca(&mut self, size: usize) -> Result<BufferOf<Self::Backend>> {
        let _ = size;
        Err(Error::NoQueueOrderedMemory {
            backend: <Self::Backend as Backend>::ID,
            command: "alloca",
        })
    }

    /// Checks, when a [`dealloca`](super::HardwareQueue::dealloca) is recorded,
    /// that `buffer` (made by `alloca`: the core checked) belongs to this
    /// queue's device's pool.
    ///
    /// The default: a backend without queue-ordered allocation refuses.
    ///
    /// # Errors
    /// Why the `dealloca` cannot run; it rejects the batch.
    fn check_dealloca(&self, buffer: &BufferOf<Self::Backend>) -> Result<()> {
        let _ = buffer;
        Err(Error::NoQueueOrderedMemory {
            backend: <Self::Backend as Backend>::ID,
            command: "dealloca",
        })
    }

    /// Takes `batch` (to run, or, when [`Batch::abandoned`], only to fail
    /// its signals once every batch submitted before it finished), and
    /// returns a batch to record the next one into: a finished one, whose
    /// memory recording then reuses, or `Batch::default()`. The queue
    /// clears it.
    ///
    /// # Contract
    ///
    /// 1. Batches run in the order submitted, and the commands of each in
    ///    order: a `signal` is set only once every earlier command of its
    ///    queue completed.
    /// 2. Every batch is settled exactly once: run (each `signal` set), or
    ///    failed through the [`Ledger`] ([`Ledger::settle`] for an engine
    ///    that runs a batch in one go; [`Ledger::admit`], then
    ///    [`Ledger::complete`] for one that learns of the end later).
    ///    Nothing submitted is dropped, so no waiter hangs. A failure
    ///    settles in queue order: an engine that hands work to a device
    ///    reports a batch failed at command `from` only once the batch's
    ///    work before `from` completed, so the values the failure fails
    ///    (which a settled wait lets through) never settle before work
    ///    ahead of them in the queue.
    /// 3. A signal is only raised: never set below a value it reached.
    ///
    /// `hwqueue-cts` checks these against the running engine.
    fn submit(&mut self, batch: Batch<Self::Backend>) -> Batch<Self::Backend>;

    /// Takes `batch` without moving it, where the engine can run it to the
    /// end right now (the CUDA engine: a batch of signals only, recorded
    /// on its stream with nothing queued before them): `true` when it did,
    /// on [`submit`](Self::submit)'s contract, and the core then clears
    /// the batch. `false`, the default, leaves the batch untouched for
    /// `submit`. A batch is a few hundred bytes: moving it into `submit`
    /// and back costs a `signal` + `submit` as much as its event record.
    fn submit_in_place(&mut self, batch: &mut Batch<Self::Backend>) -> bool {
        let _ = batch;
        false
    }

    /// Blocks until every batch submitted has finished: run, failed, or
    /// abandoned. Failures found here go to the ledger.
    fn synchronize(&mut self);

    /// Turns the timing of each command on or off (see
    /// [`profile`](crate::profile)). The default keeps nothing: an engine
    /// that does not profile reports no command events.
    fn set_profiling(&mut self, on: bool) {
        let _ = on;
    }

    /// Moves the events of commands that completed into `out`.
    fn take_profile(&mut self, out: &mut Vec<ProfileEvent>) {
        let _ = out;
    }

    /// The next batch handed to [`submit`](Self::submit) is one submitted
    /// again and again under `key` with the same commands
    /// ([`HardwareQueue::replay_as`](super::HardwareQueue::replay_as)): see
    /// [`launches`](Self::launches). `None`: it is not (the core says so
    /// for a batch it abandons, or an empty one it does not hand over). The
    /// default ignores it.
    fn replay_next(&mut self, key: Option<u32>) {
        let _ = key;
    }

    /// What the engine recorded into device programs and replayed
    /// ([`Launches`](super::Launches)). An engine with a replay form
    /// records a batch marked with a key ([`replay_next`](Self::replay_next)) once, and
    /// submits the recording again for a later batch under the same key
    /// whose commands match it (the same kernels, scalars and work sizes
    /// over the same bytes, waits and signals at the same places; only
    /// their values and the host data new): the batch settles through the
    /// ledger as any other, its waits and signals keeping their meaning.
    /// One without (the default) runs every batch the plain way and counts
    /// nothing.
    fn launches(&self) -> super::Launches {
        super::Launches::default()
    }

    /// Whether the engine holds, recorded from the last batch marked with
    /// `key` that it was handed, one device program per entry of
    /// `kernels` (a run of that many kernels, in batch order), each
    /// complete and holding what that batch gave its kernels: then it
    /// keeps them for the next batch handed to
    /// [`submit`](Self::submit), whose [`Command::Replay`](super::Command)s
    /// name them by index, and that batch is marked with `key` too (it
    /// repeats the recording; it does not replace it). A batch marked with
    /// `key` after that one replaces the recording, and until the engine
    /// has recorded it this answers `false`. The default, an engine
    /// without a replay form: `false`.
    fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
        let _ = (key, kernels);
        false
    }

    /// Checks, when a [`Command::Replay`](super::Command) of program
    /// `index` is recorded, that the engine keeps it for this batch
    /// ([`replay_recorded`](Self::replay_recorded)).
    ///
    /// # Errors
    /// [`Error::ReplayNotRecorded`]; it rejects the batch. The default
    /// always refuses.
    fn check_replay(&self, index: u32) -> Result<()> {
        Err(Error::ReplayNotRecorded { index, recorded: 0 })
    }
}
