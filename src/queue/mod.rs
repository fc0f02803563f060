//! Hardware command queues: record a batch, then hand it over on `submit`.
//!
//! # One core, one engine per backend
//!
//! Every backend's queue is a [`Queue<E>`]: the recording half is written
//! once, here, and a backend supplies only an [`Engine`], the part that
//! *runs* batches (the CPU backend's worker thread, the CUDA backend's
//! stream and its deferred worker). The core owns:
//!
//! - the batch being recorded ([`Batch`], [`Command`]) and the validation
//!   of every command when it is recorded: work sizes and argument counts
//!   against the engine's [`Limits`](crate::Limits), copy sizes, signal
//!   values, another backend's or another device's objects (through
//!   [`Engine::check_exec`] and [`Engine::check_buffer`]), and which queue
//!   produces a signal ([`Producer`](crate::signal::Producer)); an `exec`
//!   that repeats the batch's last one (the same program by
//!   [`Program::same_as`](crate::Program::same_as), views, work sizes and
//!   scalar types) passed all of it already, and is only recorded;
//! - rejection: the first invalid command rejects its whole batch at
//!   `submit`, and nothing of it runs;
//! - abandonment in queue order: a rejected, discarded or dropped batch is
//!   handed to the engine like any other, marked abandoned, so its signals
//!   fail only after every batch submitted before it finished;
//! - the failure [`Ledger`]: what failed, which batches were submitted
//!   before the owner was told (they do not run), and telling the owner
//!   exactly once.
//!
//! A backend defined outside this crate (the mock backend of the tests is
//! one) implements [`Engine`] and names `Queue<ItsEngine>` as its queue; it
//! writes none of the above.

mod batch;
mod batch_drop;
mod checks;
mod collective;
mod engine;
mod exec;
mod ledger;
mod recording;
mod replay;
mod submit;

use std::fmt;

pub(crate) use batch::p2p_run;
pub use batch::{Batch, Command, ExecAt, ForeignWait};
pub(crate) use collective::check_lengths;

pub use engine::Engine;
pub use ledger::{Admission, Ledger, QueueId};
pub use recording::Queue;
pub use replay::Launches;

use crate::backend::{Backend, BufferOf, ProgramOf, SignalOf};
use crate::buffer::Pod;
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::profile::ProfileEvent;
use crate::program::Scalar;
use crate::signal::TimelineSignal;
use crate::transfer::Download;
use crate::view::{AsView, View};

/// What a queue may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// Every command.
    Compute,
    /// Everything but `exec`.
    Copy,
}

impl fmt::Display for QueueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueKind::Compute => "compute",
            QueueKind::Copy => "copy",
        })
    }
}

/// What a failed batch takes down with it ([`HardwareQueue::set_failure_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureScope {
    /// The default: the batches submitted before the owner was told of the
    /// failure do not run (their signals fail with
    /// [`Error::EarlierBatchFailed`]), since they may depend on the failed
    /// work by queue order alone.
    #[default]
    Queue,
    /// Only the failed batch: later batches run, ordered by their waits,
    /// as a caller that records every dependency as a wait wants (a
    /// [`Plan`](crate::executor::Plan), whose runs are independent but for
    /// the waits between them). A batch that fails then still honours, in
    /// order, the waits recorded after the failed command before failing
    /// the signals that follow each ([`Batch::drain_failed`]), so a value
    /// it fails settles only after what it waited for before it: a
    /// [`wait_settled`](HardwareQueue::wait_settled) on it orders the
    /// waiter after that work, as a wait on a reached value would.
    /// Engines that hand work to a device and learn of failures later (the
    /// CUDA stream) fail the rest of a failed batch at once instead; there
    /// a kernel fault is fatal to the device anyway. A batch that never
    /// ran (rejected at `submit`, discarded, or skipped) fails its signals
    /// at once, in queue order, without honouring its own waits: a caller
    /// that orders later work after such a batch waits for what it waited
    /// for itself (a plan's next run waits for a refused run whole).
    Batch,
}

/// The outcome of a wait recorded with
/// [`wait_settled`](HardwareQueue::wait_settled): a failed value settles
/// it ([`Error::SignalFailed`] becomes `Ok`); any other error stays.
/// Engines run [`Command::WaitSettled`] through it.
#[inline]
pub fn settled(outcome: Result<()>) -> Result<()> {
    match outcome {
        Err(Error::SignalFailed { .. }) => Ok(()),
        other => other,
    }
}

/// A builder of command batches for one hardware queue.
///
/// Recording calls chain (`q.wait(&a, 1).exec(..).signal(&b, 2)`) and never
/// fail on their own: a command that cannot run (bad sizes, a value out of
/// range, a copy-queue `exec`) rejects the whole batch, reported by the next
/// [`submit`](Self::submit), and nothing of that batch runs. Commands run in
/// the order recorded, batch after batch; `submit` returns without waiting
/// for them.
///
/// When a command fails while running (a kernel panics, a waited-on signal
/// fails), the rest of its batch is abandoned, every signal the batch would
/// have set is [failed](TimelineSignal::fail) so its waiters wake with an
/// error, and the failure is reported to the owner, once, by the next
/// `submit` or `synchronize`. Batches submitted before the owner was told
/// are not run either (their signals fail too); after it, the queue works
/// again.
///
/// A queue is the only producer of the signals it `signal`s: see
/// [`TimelineSignal`] for the rule and why.
pub trait HardwareQueue: Send + Sized {
    /// The backend this queue runs on.
    type Backend: Backend<Queue = Self>;

    /// The queue's kind.
    fn kind(&self) -> QueueKind;

    /// Records: block later commands until `signal` reaches `value`.
    fn wait(&mut self, signal: &SignalOf<Self::Backend>, value: u64) -> &mut Self;

    /// Records: block later commands until `signal` reaches `value`, or
    /// the work that would set it failed; a failure *settles* the wait
    /// rather than failing this batch ([`settled`]). For work that must
    /// come after other work but not share its fate: the next run of a
    /// plan after one that may fail. The default, for a queue type without
    /// it, rejects the batch.
    fn wait_settled(&mut self, signal: &SignalOf<Self::Backend>, value: u64) -> &mut Self {
        let _ = (signal, value);
        self.reject(Error::UnsupportedCommand {
            kind: self.kind(),
            command: "wait_settled",
        })
    }

    /// Sets what a batch that fails while running takes down with it
    /// ([`FailureScope`]; by default [`FailureScope::Queue`]), for every
    /// batch the engine reaches from now on: set it before submitting.
    ///
    /// # Errors
    /// [`Error::UnsupportedCommand`] from the default, for a queue type
    /// that has only the default scope (every queue of this crate has
    /// both).
    fn set_failure_scope(&mut self, scope: FailureScope) -> Result<()> {
        match scope {
            FailureScope::Queue => Ok(()),
            FailureScope::Batch => Err(Error::UnsupportedCommand {
                kind: self.kind(),
                command: "set_failure_scope(FailureScope::Batch)",
            }),
        }
    }

    /// Records: once every earlier command completed, raise `signal` to
    /// `value`. The first queue to signal a signal becomes its producer;
    /// another queue's `signal` on it rejects that queue's batch with
    /// [`Error::SignalProducerConflict`] while the producer lives.
    fn signal(&mut self, signal: &SignalOf<Self::Backend>, value: u64) -> &mut Self;

    /// Records: run `program` over the grid of `params`, with `buffers` then
    /// `scalars` as its arguments.
    fn exec(
        &mut self,
        program: &ProgramOf<Self::Backend>,
        buffers: &[&BufferOf<Self::Backend>],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self;

    /// Records: run `program` as [`exec`](Self::exec) does, with views as
    /// its buffer arguments: the kernel sees each view as a buffer of the
    /// view's length, starting at the view's first byte. Each view's offset
    /// must be a multiple of the queue's
    /// [`Limits::view_alignment`](crate::Limits::view_alignment)
    /// ([`Error::ViewMisaligned`] otherwise). A whole buffer is
    /// [`View::whole`].
    fn exec_views(
        &mut self,
        program: &ProgramOf<Self::Backend>,
        buffers: &[&View<Self::Backend>],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self;

    /// Records: copy all of `src` into `dst`, each a buffer or a
    /// [`View`]. Lengths must be equal ([`Error::CopySizeMismatch`]), and
    /// two ranges of one buffer must not overlap ([`Error::CopyOverlap`]);
    /// either rejects the batch and copies nothing.
    fn copy<D: AsView<Self::Backend>, S: AsView<Self::Backend>>(
        &mut self,
        dst: &D,
        src: &S,
    ) -> &mut Self;

    /// Records: fill `dst` (a buffer or a [`View`]) with `pattern`, a
    /// 1-, 2- or 4-byte value repeated; `dst`'s offset and length must be
    /// multiples of its width ([`Error::InvalidFill`] otherwise).
    fn fill<D: AsView<Self::Backend>, T: Pod>(&mut self, dst: &D, pattern: T) -> &mut Self;

    /// Records: copy `data` into `dst` (a buffer or a [`View`]) when the
    /// queue reaches this command. The data is copied into the batch now,
    /// so the caller's memory is free at once; to hand over a vector
    /// without that copy, [`upload_vec`](Self::upload_vec). Its length must
    /// be `dst`'s ([`Error::TransferSizeMismatch`] otherwise).
    fn upload<D: AsView<Self::Backend>, T: Pod>(&mut self, dst: &D, data: &[T]) -> &mut Self;

    /// Records: as [`upload`](Self::upload), taking ownership of `data`
    /// instead of copying it: the one copy is into the device memory. Any
    /// owner of a slice will do: a `Vec<T>`, a `Box<[T]>`, or an
    /// `Arc<[T]>`, which the host keeps sharing (the queue drops its clone
    /// once the batch ran), so the same input goes up every step without
    /// a copy of the data (the batch boxes the owner: one small
    /// allocation).
    fn upload_vec<D, T, O>(&mut self, dst: &D, data: O) -> &mut Self
    where
        D: AsView<Self::Backend>,
        T: Pod,
        O: AsRef<[T]> + Send + Sync + 'static;

    /// Records: when the queue reaches this command, copy `src` (a buffer
    /// or a [`View`]) into `into`, whose length in bytes must be `src`'s
    /// ([`Error::TransferSizeMismatch`] otherwise). Wait on `into` (or on a
    /// signal recorded after this), then take its data. If the batch does
    /// not run, or fails before this command, `into` fails with the reason.
    fn download<S: AsView<Self::Backend>, T: Pod + Send>(
        &mut self,
        src: &S,
        into: &Download<T>,
    ) -> &mut Self;

    /// Records: make the memory writes of earlier commands visible to later
    /// commands and to other queues.
    fn memory_barrier(&mut self) -> &mut Self;

    /// Records collective `op` of `element`s over `communicator`, reading
    /// `send` and writing `recv` (either `None` where the operation has no
    /// such view on this rank: a `recv` sends nothing, a broadcast's root
    /// receives nothing): what [`Queue::all_reduce`] and its siblings
    /// record, in a form a generic caller (a plan) can name. The checks and
    /// the ordering are theirs (see [`crate::collective`]).
    ///
    /// The default, for a queue type that runs no collectives, rejects the
    /// batch with [`CollectiveError::Unsupported`](crate::collective::CollectiveError::Unsupported).
    fn collective(
        &mut self,
        communicator: &crate::collective::Communicator,
        op: crate::collective::CollectiveOp,
        element: crate::collective::Element,
        send: Option<&View<Self::Backend>>,
        recv: Option<&View<Self::Backend>>,
    ) -> &mut Self {
        let _ = (op, element, send, recv);
        let error = crate::collective::CollectiveError::unsupported(
            <Self::Backend as Backend>::ID,
            communicator,
        );
        self.reject(error.into())
    }

    /// Whether this queue runs `communicator`'s collectives: the first
    /// check [`collective`](Self::collective) makes. A plan asks it of
    /// each collective's queue when it is planned, so a queue type that
    /// runs collectives overrides both.
    ///
    /// # Errors
    /// [`CollectiveError::Unsupported`](crate::collective::CollectiveError::Unsupported)
    /// for a communicator of another engine (the default, for a queue type
    /// that runs no collectives); [`Error::DeviceMismatch`]
    /// for one of another device.
    fn check_collective(
        &self,
        communicator: &crate::collective::Communicator,
    ) -> crate::Result<()> {
        Err(crate::collective::CollectiveError::unsupported(
            <Self::Backend as Backend>::ID,
            communicator,
        )
        .into())
    }

    /// Rejects the batch being recorded with `cause` (where no command was
    /// refused before) and records in it the place of collective `op`,
    /// which this rank will not run: at `submit` it is numbered like the
    /// peers' and, on an engine that describes each collective to its
    /// peers (a CPU queue over MPI), forfeited, described failed, so the
    /// peers fail theirs at once and every rank stays in step. What
    /// [`collective`](Self::collective) does with a collective it refuses;
    /// for a generic caller that will not record one (a plan whose run
    /// another queue refused). `count` is how many elements it would have
    /// contributed (its peers' errors say). A send or receive takes its
    /// place too (over MPI, its peer's fails at once). Over NCCL, which
    /// cannot tell the peers, the communicator breaks on this rank
    /// instead ([`CollectiveError::Skipped`](crate::collective::CollectiveError::Skipped)).
    ///
    /// The default, for a queue type that runs no collectives, only
    /// rejects.
    #[doc(hidden)]
    fn forfeit_collective(
        &mut self,
        communicator: &crate::collective::Communicator,
        (op, element, count): (
            crate::collective::CollectiveOp,
            crate::collective::Element,
            usize,
        ),
        cause: crate::Error,
    ) -> &mut Self {
        let _ = (communicator, op, element, count);
        self.reject(cause)
    }

    /// Allocates `size` bytes from the device's memory pool in queue order
    /// (IREE's `queue_alloca`): the buffer is returned at once, and its
    /// memory is valid from this point of the queue on (commands recorded
    /// after this, and other queues once they waited on a signal this queue
    /// records after it). It is not zeroed: record a
    /// [`fill`](Self::fill) where zeros are needed. Give it back with
    /// [`dealloca`](Self::dealloca), or drop every handle (the range then
    /// returns once the last batch using it completed). `size` 0 gives an
    /// empty buffer.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], with the pool's figures;
    /// [`Error::NoQueueOrderedMemory`] for a backend without queue-ordered
    /// allocation (the default).
    fn alloca(&mut self, size: usize) -> Result<BufferOf<Self::Backend>> {
        let _ = size;
        Err(Error::NoQueueOrderedMemory {
            backend: <Self::Backend as Backend>::ID,
            command: "alloca",
        })
    }

    /// Records: give `buffer`, made by [`alloca`](Self::alloca) on this
    /// queue's device, back to the pool once every earlier command of this
    /// queue completed (IREE's `queue_dealloca`) and every batch of another
    /// queue recorded on it before the `dealloca` is done (PyTorch's
    /// `record_stream`): such a batch runs on the buffer's bytes even if it
    /// runs after the `dealloca`. A queue that waits on a signal this queue
    /// sets after the `dealloca` (the death frontier) may get the range
    /// from its next `alloca`. From the moment it is recorded, any queue
    /// refuses new work on the buffer ([`Error::UseAfterDealloca`]), and
    /// once it ran the host's reads and writes through a remaining handle
    /// are refused too. If its batch does not run (discarded, rejected, or
    /// stopped by a failure), the buffer is live again and a new `dealloca`
    /// may be recorded. See [`QueueOrdered`](crate::memory::QueueOrdered).
    ///
    /// [`Error::InvalidDealloca`] rejects the batch for a buffer not made by
    /// `alloca`, of another device's pool, or with a `dealloca` recorded
    /// already. The default (a backend without queue-ordered allocation)
    /// rejects it.
    fn dealloca(&mut self, buffer: &BufferOf<Self::Backend>) -> &mut Self {
        let _ = buffer;
        self.reject(Error::NoQueueOrderedMemory {
            backend: <Self::Backend as Backend>::ID,
            command: "dealloca",
        })
    }

    /// Records: block later commands until a signal of *another* backend
    /// reaches `value`. The backend waits for it by whatever means it has
    /// (the CPU blocks its worker on it; a GPU queue defers the rest of the
    /// batch to a host thread): see each backend's docs for the cost.
    /// Same-backend signals take [`wait`](Self::wait), which is native.
    fn wait_foreign<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self;

    /// Records: block later commands until a signal of *another* backend
    /// reaches `value`, or the work that would set it failed: a failure
    /// settles the wait, as [`wait_settled`](Self::wait_settled) does for
    /// the queue's own backend's signals (a plan orders a run after the
    /// run before it on another backend with it). Runs as
    /// [`wait_foreign`](Self::wait_foreign) does, at its cost. The
    /// default, for a queue type without it, rejects the batch.
    fn wait_foreign_settled<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
        let _ = (signal, value);
        self.reject(Error::UnsupportedCommand {
            kind: self.kind(),
            command: "wait_foreign_settled",
        })
    }

    /// Records a failure: the batch is rejected at `submit` with `error`.
    /// For callers (like the Any* enums) that find a problem while recording.
    fn reject(&mut self, error: Error) -> &mut Self;

    /// How many commands are recorded and not yet submitted.
    fn recorded(&self) -> usize;

    /// The error the batch being recorded will be rejected with at
    /// `submit`, once a command was refused (or [`reject`](Self::reject)
    /// called); `None` while every command so far was accepted. Lets a
    /// caller that records many commands (a plan) say which one it was.
    #[inline]
    fn rejection(&self) -> Option<&Error> {
        None
    }

    /// Throws away the batch being recorded (and its rejection, if a
    /// command was invalid) without running any of it; the queue then
    /// records a new batch. Work already submitted is not affected.
    ///
    /// As when a queue is dropped with a batch recorded, the signals the
    /// batch would have set are [failed](TimelineSignal::fail), in queue
    /// order (after the batches submitted before it), so nobody waits on
    /// them forever.
    fn discard(&mut self);

    /// Marks the batch being recorded as one submitted again and again
    /// under `key` with the same commands, only its signal and wait values
    /// and its host data new each time (a plan's run on this queue): an
    /// engine with a replay form records it once and submits the recording
    /// again while the commands match (see [`Launches`]). The default, and
    /// an engine without a replay form, runs it the plain way. Mark the
    /// batch just before its `submit`.
    fn replay_as(&mut self, key: u32) -> &mut Self {
        let _ = key;
        self
    }

    /// What this queue recorded into device programs and replayed
    /// ([`Launches`]); nothing by default.
    fn launches(&self) -> Launches {
        Launches::default()
    }

    /// Whether the engine holds the device programs it recorded from the
    /// last batch this queue submitted marked with `key`
    /// ([`replay_as`](Self::replay_as)), one per entry of `kernels`: a run
    /// of that many `exec`s with nothing between them but signals and
    /// barriers (an engine records such a run of two or more as one
    /// program), in batch order, each still holding that batch's kernels,
    /// work sizes and arguments. Where it does, the batch recorded next is
    /// marked with `key` and may name them with
    /// [`replay_program`](Self::replay_program) instead of recording their
    /// `exec`s again: a plan's run whose bindings did not change since
    /// its last recorded one costs a command per program, not per kernel.
    /// `false` (the default, and every engine without a replay form, and a
    /// profiling queue) means: record the `exec`s.
    fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
        let _ = (key, kernels);
        false
    }

    /// Records a run of device program `index` of those
    /// [`replay_recorded`](Self::replay_recorded) said the engine holds,
    /// in place of the `exec`s it was recorded from: a later `signal`
    /// still orders after all of them. The buffers they read and write
    /// are the ones the recorded batch named: keep them alive and bound as
    /// they were (the engine holds them until the run completes).
    ///
    /// Rejects the batch with [`Error::ReplayNotRecorded`] where the
    /// engine holds no such program for it (the default).
    fn replay_program(&mut self, index: u32) -> &mut Self {
        self.reject(Error::ReplayNotRecorded { index, recorded: 0 })
    }

    /// Hands the recorded batch to the hardware and starts a new one. Does
    /// not wait for the work to complete.
    ///
    /// # Errors
    /// [`Error::BatchRejected`] when a recorded command was invalid (nothing
    /// ran; the recorded batch is discarded and its signals failed);
    /// [`Error::QueueFailed`] when earlier submitted work failed (the batch
    /// is kept: call `submit` again to send it).
    fn submit(&mut self) -> Result<()>;

    /// Blocks until every submitted batch completed.
    ///
    /// # Errors
    /// [`Error::QueueFailed`] when submitted work failed since the last report.
    fn synchronize(&mut self) -> Result<()>;

    /// Turns profiling on or off (off by default; see
    /// [`profile`](crate::profile)): while on, the queue keeps the device
    /// start and end of each command of the batches submitted, how long its
    /// waits stood blocked, and the host's `submit` and `synchronize`
    /// calls. The default, for a queue type that does not profile, keeps
    /// nothing (every queue of this crate profiles).
    fn set_profiling(&mut self, on: bool) {
        let _ = on;
    }

    /// Whether profiling is on.
    fn profiling(&self) -> bool {
        false
    }

    /// The profile events kept since the last call, oldest first: host
    /// calls, and the commands of the work that completed (call
    /// `synchronize` first for all of it). Events of work still running
    /// stay for a later call.
    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        Vec::new()
    }
}

/// How profile events name a queue: its id and kind (`queue #3 (compute)`).
/// An engine that profiles names its events' queue with it.
pub fn queue_label(id: QueueId, kind: QueueKind) -> String {
    format!("{id} ({kind})")
}
