//! A recorded batch of commands, as the core hands it to an engine.

use std::fmt;
use std::ops::Range;

use crate::backend::{Backend, BufferOf, ProgramOf, SignalOf};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::Scalar;
use crate::signal::{TimelineSignal, Timeout};
use crate::transfer::{DownloadSink, HostBytes, HostBytesInner};
use crate::view::View;

/// One command of a [`Batch`].
///
/// Engines match on it exhaustively, so a new command is a compile error in
/// every engine until it runs it: none is ever silently dropped.
pub enum Command<B: Backend> {
    /// Block later commands until `signal` reaches `value`.
    Wait {
        /// The signal.
        signal: SignalOf<B>,
        /// The value.
        value: u64,
    },
    /// Block later commands until `signal` reaches `value` or the work that
    /// would set it failed: a failure *settles* the wait instead of failing
    /// the batch ([`settled`](super::settled)). For work ordered after other work that may
    /// fail on its own account (the next run of a plan after this one).
    WaitSettled {
        /// The signal.
        signal: SignalOf<B>,
        /// The value.
        value: u64,
    },
    /// Block later commands until a signal of another backend reaches
    /// `value`.
    WaitForeign {
        /// The signal, type-erased: see [`ForeignWait`].
        signal: Box<dyn ForeignWait>,
        /// The value.
        value: u64,
    },
    /// Raise `signal` to `value` once every earlier command completed.
    Signal {
        /// The signal.
        signal: SignalOf<B>,
        /// The value.
        value: u64,
    },
    /// Run `program` over the grid of `params`.
    Exec {
        /// The kernel.
        program: ProgramOf<B>,
        /// Its buffer arguments, each a view (a whole buffer is a view of
        /// all of it): a range of [`Batch::buffers`].
        buffers: Range<usize>,
        /// Its scalar arguments: a range of [`Batch::scalars`].
        scalars: Range<usize>,
        /// Work sizes, validated against the engine's limits.
        params: ExecParams,
    },
    /// Copy all of `src` into `dst` (equal lengths; disjoint when of one
    /// buffer: both checked).
    Copy {
        /// Destination.
        dst: View<B>,
        /// Source.
        src: View<B>,
    },
    /// Fill `dst` with a pattern of `width` bytes (1, 2 or 4; `dst`'s
    /// offset and length are multiples of it: checked).
    Fill {
        /// Destination.
        dst: View<B>,
        /// The pattern's native-endian bytes are the first `width` of
        /// `pattern.to_ne_bytes()`.
        pattern: [u8; 4],
        /// 1, 2 or 4.
        width: u8,
    },
    /// Copy host bytes into `dst` (equal lengths, checked).
    Upload {
        /// Destination.
        dst: View<B>,
        /// The bytes: [`Batch::host_bytes`] reads them.
        data: HostBytes,
    },
    /// Copy `src` into host memory, and mark the download ready.
    Download {
        /// Source.
        src: View<B>,
        /// Where the bytes go (equal lengths, checked).
        sink: DownloadSink,
    },
    /// A collective over a communicator (boxed: one pointer): see
    /// [`crate::collective`]. An engine that runs none fails it with
    /// [`CollectiveError::Unsupported`](crate::collective::CollectiveError::Unsupported)
    /// (the core refuses it at record time already, through
    /// [`Engine::check_collective`](super::Engine::check_collective)).
    Collective(Box<crate::collective::Collective<B>>),
    /// Make earlier writes visible to later commands and other queues.
    Barrier,
    /// Run device program `index` of those the engine recorded from the
    /// last batch marked with this batch's replay key, as it recorded them
    /// (its kernels in order, over the bytes they named then). Recorded
    /// only after the engine said it holds them
    /// ([`HardwareQueue::replay_recorded`](crate::HardwareQueue::replay_recorded)
    /// returned `true`, which keeps them for this batch); an engine without
    /// a replay form never accepts one at record time, and fails a batch
    /// that holds one anyway.
    Replay {
        /// Which program, in the order the engine recorded them.
        index: u32,
    },
    /// `buffer` was allocated from the device's pool by
    /// [`alloca`](crate::HardwareQueue::alloca). Its memory is valid when
    /// `alloca` returns (an engine with a stream-ordered allocator, CUDA's,
    /// allocated on its stream then), so an engine has nothing to do here;
    /// the core records this command only while profiling, for the
    /// profile's `alloca` event.
    Alloca {
        /// The buffer `alloca` returned.
        buffer: BufferOf<B>,
    },
    /// Give `buffer`'s range back to its pool: every earlier command of the
    /// queue completed, so no later one of this queue can touch it; other
    /// queues may reuse the range once they waited on a signal recorded
    /// after this. An engine that does not run the command (the batch
    /// failed or was abandoned) does nothing: the range then goes back
    /// when the last handle is dropped.
    Dealloca {
        /// The buffer `dealloca` named (made by `alloca` on this queue's
        /// device: checked).
        buffer: BufferOf<B>,
    },
}

impl<B: Backend> Command<B> {
    /// Whether the command only synchronises (a signal or a wait): it
    /// names no buffer, program or host data, so a batch of such commands
    /// holds nothing an engine must keep until the device passed it.
    pub fn only_synchronises(&self) -> bool {
        matches!(
            self,
            Command::Signal { .. }
                | Command::Wait { .. }
                | Command::WaitSettled { .. }
                | Command::WaitForeign { .. }
        )
    }
}

/// A signal of another backend, as a queue's worker waits on it.
///
/// The one `dyn` of a queue: `wait_foreign` takes a signal of *any* type
/// (another backend's, one defined in another crate), and a batch must hold
/// it until the worker reaches it, so the type is erased into a box. It is
/// never on a same-backend path: the `Any*` enums send a signal of the
/// queue's own backend to the native [`Command::Wait`].
pub trait ForeignWait: Send + Sync {
    /// Whether the wait is over: the signal reached `value` (or, for a
    /// settled wait, [`wait_foreign_settled`](crate::HardwareQueue::wait_foreign_settled),
    /// the work that would set it failed). Never blocks.
    fn is_reached(&self, value: u64) -> bool;

    /// Blocks until the wait is over.
    ///
    /// # Errors
    /// The signal's own: [`Error::SignalFailed`] when the work that would
    /// set `value` failed (never for a settled wait).
    fn wait_forever(&self, value: u64) -> Result<()>;
}

impl<S: TimelineSignal> ForeignWait for S {
    fn is_reached(&self, value: u64) -> bool {
        TimelineSignal::is_reached(self, value)
    }

    fn wait_forever(&self, value: u64) -> Result<()> {
        self.wait(value, Timeout::Forever)
    }
}

/// A signal of another backend whose wait a failure *settles*, as
/// [`Command::WaitSettled`] does for the queue's own backend: what
/// [`wait_foreign_settled`](crate::HardwareQueue::wait_foreign_settled)
/// boxes into a [`Command::WaitForeign`], so every engine runs it as it
/// runs any foreign wait.
pub(crate) struct SettledForeign<S>(pub(crate) S);

impl<S: TimelineSignal> ForeignWait for SettledForeign<S> {
    fn is_reached(&self, value: u64) -> bool {
        self.0.is_settled(value)
    }

    fn wait_forever(&self, value: u64) -> Result<()> {
        super::settled(self.0.wait(value, Timeout::Forever))
    }
}

/// An `exec` of a batch with its arguments ([`Batch::exec_at`]).
pub struct ExecAt<'a, B: Backend> {
    /// The kernel.
    pub program: &'a ProgramOf<B>,
    /// Its views.
    pub views: &'a [View<B>],
    /// The range of `views` in [`Batch::buffers`].
    pub range: Range<usize>,
    /// Its scalars.
    pub scalars: &'a [Scalar],
    /// Its work sizes.
    pub params: &'a ExecParams,
}

/// A batch of commands. The buffers and scalars of every `exec` live in two
/// vectors per batch, so recording an `exec` allocates nothing once they
/// have grown; engines recycle finished batches.
pub struct Batch<B: Backend> {
    pub(super) commands: Vec<Command<B>>,
    pub(super) buffers: Vec<View<B>>,
    /// The bytes of the batch's `upload`s, one after another.
    pub(super) bytes: Vec<u8>,
    pub(super) scalars: Vec<Scalar>,
    /// The owner's epoch when submitted (see [`Ledger`](super::Ledger)).
    pub(super) epoch: u64,
    /// The queue's submit count when it was submitted, once the queue has
    /// turned profiling on (0 before): names the batch in profile events.
    pub(super) sequence: u64,
    /// Why a batch will not run (rejected, discarded, or left recorded when
    /// the queue was dropped): the engine only fails its signals, in queue
    /// order. Boxed: the recording batch lives inside the queue.
    pub(super) abandoned: Option<Box<Error>>,
    /// One past the index in `commands` of the last `exec` (0: none yet):
    /// an `exec` on the same views shares its range of `buffers` instead
    /// of cloning the handles again, and one repeating it whole is not
    /// checked again. A `u32`, so that it and `mixed_params` take one
    /// word (a `Batch` lives inside every queue, and an
    /// [`AnyQueue`](crate::AnyQueue) is bounded): past `u32::MAX`
    /// commands it wraps, which is harmless, since any `exec` of the
    /// batch passed its checks and an `exec` on the same views may share
    /// any one's range, and a wrapped index that finds another command
    /// shares nothing.
    pub(super) last_exec: u32,
    /// Whether an `exec` of this batch has work sizes other than the `exec`
    /// before it (set, conservatively, whenever an `exec` after the first
    /// was checked anew): while it is `false`, every `exec` has the first
    /// one's, and an engine may build their launch once (see
    /// [`uniform_params`](Self::uniform_params)).
    pub(super) mixed_params: bool,
    /// Whether it holds a collective (not a `send` or `recv`) whose place
    /// in its communicator's order is taken when the batch is submitted
    /// (see `Queue::stamp_collectives`).
    pub(super) collectives: bool,
    /// Buffers made by `alloca` that commands of this batch name, once per
    /// command, each holding a use (see [`QueueOrdered`](crate::memory::QueueOrdered));
    /// and (flagged `true`) those whose `dealloca` it records, which are
    /// live again if it never ran. Let go when the batch is cleared or
    /// dropped.
    pub(super) uses: Vec<(BufferOf<B>, bool)>,
}

impl<B: Backend> Default for Batch<B> {
    fn default() -> Self {
        Self {
            commands: Vec::new(),
            buffers: Vec::new(),
            bytes: Vec::new(),
            scalars: Vec::new(),
            epoch: 0,
            sequence: 0,
            abandoned: None,
            last_exec: 0,
            mixed_params: false,
            collectives: false,
            uses: Vec::new(),
        }
    }
}

impl<B: Backend> Batch<B> {
    /// The commands, in order.
    pub fn commands(&self) -> &[Command<B>] {
        &self.commands
    }

    /// The buffer arguments of every `exec`; [`Command::Exec`] names its
    /// range.
    pub fn buffers(&self) -> &[View<B>] {
        &self.buffers
    }

    /// Appends the command `make` builds, written straight into the
    /// vector: `Vec::push` of a command built first put its 80 bytes on
    /// the stack and copied them in (a sixth of recording a repeated
    /// `exec`).
    #[inline(always)]
    pub(super) fn push_with(&mut self, make: impl FnOnce() -> Command<B>) {
        let commands = &mut self.commands;
        if commands.len() == commands.capacity() {
            commands.reserve(1);
        }
        let len = commands.len();
        let command = make();
        // SAFETY: the capacity is above `len` (reserved just above, and
        // `make`, which cannot reach the vector, did not change it), so
        // slot `len` lies in the allocation, uninitialised; it is written
        // before the length takes it in.
        unsafe {
            commands.as_mut_ptr().add(len).write(command);
            commands.set_len(len + 1);
        }
    }

    /// The command at `index`, if it is an `exec`, with its arguments:
    /// what a launch (and the test whether the next `exec` repeats it)
    /// reads, without checking its ranges against the batch's vectors
    /// again.
    #[inline]
    pub fn exec_at(&self, index: usize) -> Option<ExecAt<'_, B>> {
        let Some(Command::Exec {
            program,
            buffers,
            scalars,
            params,
        }) = self.commands.get(index)
        else {
            return None;
        };
        debug_assert!(buffers.start <= buffers.end && buffers.end <= self.buffers.len());
        debug_assert!(scalars.start <= scalars.end && scalars.end <= self.scalars.len());
        // SAFETY: an `exec`'s ranges lie within `buffers` and `scalars`:
        // `Queue::push_exec`, the only place that puts a `Command::Exec`
        // into a batch (`commands` is private to `queue`), takes them from
        // the two vectors' lengths right after extending them (or from an
        // earlier `exec` of this batch), and the vectors only grow until
        // `clear` empties them together with the commands (the fields are
        // private to `queue`, and nothing else there shrinks them). So both
        // slices are in bounds.
        let (views, values) = unsafe {
            (
                self.buffers.get_unchecked(buffers.clone()),
                self.scalars.get_unchecked(scalars.clone()),
            )
        };
        Some(ExecAt {
            program,
            views,
            range: buffers.clone(),
            scalars: values,
            params,
        })
    }

    /// Whether every `exec` of the batch has the same [`ExecParams`] (true
    /// with none or one): an engine may then derive their launch
    /// configuration once instead of comparing each `exec`'s work sizes
    /// with the last. (Conservative: `false` may still hold equal ones.)
    #[inline]
    pub fn uniform_params(&self) -> bool {
        !self.mixed_params
    }

    /// The bytes of an upload of this batch.
    pub fn host_bytes<'a>(&'a self, data: &'a HostBytes) -> &'a [u8] {
        match &data.0 {
            HostBytesInner::Inline(range) => &self.bytes[range.clone()],
            HostBytesInner::Owned(bytes) => bytes.bytes(),
        }
    }

    /// The scalar arguments of every `exec`; [`Command::Exec`] names its
    /// range.
    pub fn scalars(&self) -> &[Scalar] {
        &self.scalars
    }

    /// The owner's epoch when the batch was submitted.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Why the batch will not run, if it was abandoned.
    pub fn abandoned(&self) -> Option<&Error> {
        self.abandoned.as_deref()
    }

    /// Whether the batch holds no command.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Empties the batch for reuse, keeping its memory.
    pub fn clear(&mut self) {
        self.drop_commands();
        self.buffers.clear();
        self.bytes.clear();
        self.scalars.clear();
        self.epoch = 0;
        // `sequence` is left: every submit stamps it once the queue has
        // profiled (so recording pays nothing for it), and it is 0 until
        // then.
        self.abandoned = None;
        self.last_exec = 0;
        self.mixed_params = false;
        self.collectives = false;
        self.let_go();
    }

    /// Takes a use of `buffer` (named `what` in an error) for a command of
    /// this batch, where it was made by `alloca`.
    ///
    /// # Errors
    /// [`Error::UseAfterDealloca`] once a `dealloca` of it is recorded.
    #[inline]
    pub(super) fn take_use(
        &mut self,
        buffer: &BufferOf<B>,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        if let Some(ordered) = buffer.queue_ordered() {
            ordered.begin_use(what)?;
            self.uses.push((buffer.clone(), false));
        }
        Ok(())
    }

    /// Records a `dealloca` of `buffer` (made by `alloca`) in this batch
    /// for `queue`, folding in the uses this batch holds of it: they are
    /// ordered before the `dealloca`.
    ///
    /// # Errors
    /// [`Error::InvalidDealloca`] when one is recorded already, or ran.
    pub(super) fn record_dealloca(
        &mut self,
        buffer: &BufferOf<B>,
        ordered: &crate::memory::QueueOrdered,
        queue: super::QueueId,
    ) -> Result<()> {
        let own = self
            .uses
            .iter()
            .filter(|(used, dealloca)| !dealloca && used.same_as(buffer))
            .count();
        ordered.record_dealloca(queue, u32::try_from(own).unwrap_or(u32::MAX))?;
        if own > 0 {
            self.uses
                .retain(|(used, dealloca)| *dealloca || !used.same_as(buffer));
        }
        self.uses.push((buffer.clone(), true));
        Ok(())
    }

    /// For an engine that learns late that its commands completed (a GPU's,
    /// once its stream passed the event recorded after the batch): the
    /// `dealloca`s among the first `upto` commands completed
    /// ([`dealloca_completed`](crate::memory::dealloca_completed)). Costs
    /// nothing for a batch without a `dealloca`.
    pub fn complete_deallocas(&self, upto: usize) {
        if !self.uses.iter().any(|(_, dealloca)| *dealloca) {
            return;
        }
        for command in self.commands.get(..upto).unwrap_or(&self.commands) {
            if let Command::Dealloca { buffer } = command {
                crate::memory::dealloca_completed(buffer);
            }
        }
    }

    /// Lets go of every use and `dealloca` the batch holds: a range whose
    /// `dealloca` ran goes back to the pool with its last use, and a
    /// `dealloca` that never ran leaves its buffer live again.
    #[inline]
    fn let_go(&mut self) {
        // Most batches name no buffer `alloca` made: no drain to set up.
        if !self.uses.is_empty() {
            self.let_go_uses();
        }
    }

    /// [`let_go`](Self::let_go) of a batch that took uses.
    #[inline(never)]
    fn let_go_uses(&mut self) {
        for (buffer, dealloca) in self.uses.drain(..) {
            if !dealloca {
                crate::memory::end_use(&buffer);
            } else if let Some(ordered) = buffer.queue_ordered() {
                ordered.dealloca_let_go();
            }
        }
    }

    /// The queue's submit count when this batch was submitted, once the
    /// queue has turned profiling on; 0 before. Profile events name
    /// batches by it.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Fails every signal the commands from `from` on would have set, and
    /// every download they would have made.
    pub fn fail_signals(&self, from: usize, cause: &Error) {
        self.fail_from(from, cause, Failed::At, &mut |_| {});
    }

    /// For a batch that failed at command `from` while running: goes on in
    /// queue order without running anything, still honouring each wait
    /// after `from` (until its value is reached or failed) before failing
    /// the signals and downloads that follow it. A value the batch fails
    /// then settles only after everything the batch waited for before it
    /// settled, as if the work had run: whoever waits for it (settled)
    /// still comes after that work. Blocks like the waits it honours, so
    /// an engine calls it where it would have run them (its own thread).
    pub fn drain_failed(&self, from: usize, cause: &Error) {
        self.fail_from(from, cause, Failed::Draining, &mut |_| {});
    }

    /// [`fail_signals`](Self::fail_signals) (`Failed::At` or
    /// `Failed::Skipped`) or [`drain_failed`](Self::drain_failed)
    /// (`Failed::Draining`), handing each numbered collective after `from`
    /// (from `from` itself where the batch was skipped) to `forfeit` at its
    /// place among them: the signals before it fail first, the waits
    /// before it are honoured first, as if it had run. Each numbered one
    /// over NCCL from `from` on (not on the device) breaks its
    /// communicator there (after the waits before it, when draining).
    pub(crate) fn fail_from(
        &self,
        from: usize,
        cause: &Error,
        how: Failed,
        forfeit: &mut impl FnMut(&[&crate::collective::Collective<B>]),
    ) {
        let commands = &self.commands;
        // Past the sends and receives handed over as a group, and, where
        // the command that failed is a send or receive, past the rest of
        // its group: they met their peers' already (a group exchanges all
        // its descriptions at once).
        let mut next = match commands.get(from) {
            Some(Command::Collective(c)) if c.op.peer().is_some() && how != Failed::Skipped => {
                from + p2p_run(&commands[from..])
            }
            _ => from,
        };
        for (index, command) in commands.iter().enumerate().skip(from) {
            #[cfg(feature = "nccl")] // Not run here: it breaks (`NcclComm::skipped`).
            if let Command::Collective(collective) = command
                && collective.numbered
                && let Some(nccl) = collective.communicator.as_nccl()
            {
                nccl.skipped(collective, cause);
            }
            match command {
                // The command that failed: nothing more to wait for.
                Command::Wait { .. }
                | Command::WaitSettled { .. }
                | Command::WaitForeign { .. }
                    if index == from || how != Failed::Draining => {}
                // Reached or failed, either settles it.
                Command::Wait { signal, value } | Command::WaitSettled { signal, value } => {
                    let _ = signal.wait(*value, Timeout::Forever);
                }
                Command::WaitForeign { signal, value } => {
                    let _ = signal.wait_forever(*value);
                }
                Command::Signal { signal, value } => signal.fail(*value, cause.clone()),
                Command::Download { sink, .. } => sink.fail(cause),
                // The one that failed took its place.
                Command::Collective(collective)
                    if collective.numbered
                        && (index > from || how == Failed::Skipped)
                        && index >= next =>
                {
                    if collective.op.peer().is_none() {
                        forfeit(&[&**collective]);
                        continue;
                    }
                    // A send or receive, with those its queue would have
                    // run with it: forfeited together, as they would have
                    // run (one at a time, two ranks forfeiting a receive
                    // then a send to each other would each wait for the
                    // other's send).
                    next = index + p2p_run(&commands[index..]);
                    let group: Vec<_> = (commands[index..next].iter())
                        .filter_map(|command| match command {
                            Command::Collective(member) => Some(&**member),
                            _ => None,
                        })
                        .collect();
                    forfeit(&group);
                }
                _ => {}
            }
        }
    }

    /// Whether a collective of it took its place in its communicator's
    /// order (see `Queue::stamp_collectives`).
    pub fn collectives_numbered(&self) -> bool {
        self.collectives
            && (self.commands.iter())
                .any(|command| matches!(command, Command::Collective(c) if c.numbered))
    }

    /// Whether some signal of the batch is not reached yet, or it holds a
    /// download (so abandoning the batch has something to fail).
    pub(super) fn has_something_to_fail(&self) -> bool {
        self.commands.iter().any(|command| match command {
            Command::Signal { signal, value } => !TimelineSignal::is_reached(signal, *value),
            Command::Download { .. } => true,
            _ => false,
        })
    }
}

/// How many of `commands`, from the first, run as one group of sends and
/// receives: the first, a `send` or `recv`, and those right after it over
/// the same communicator (0 where the first is neither). A CPU queue runs
/// each such group at once (`cpu::queue::collective::p2p_group`).
pub(crate) fn p2p_run<B: Backend>(commands: &[Command<B>]) -> usize {
    fn over<B: Backend>(command: &Command<B>) -> Option<&crate::collective::Communicator> {
        match command {
            Command::Collective(collective) if collective.op.peer().is_some() => {
                Some(&collective.communicator)
            }
            _ => None,
        }
    }
    let Some(first) = commands.first().and_then(over) else {
        return 0;
    };
    (commands.iter())
        .take_while(|command| over(command).is_some_and(|c| c.same_as(first)))
        .count()
}

/// How a batch's commands from some index on did not run
/// ([`Batch::fail_from`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Failed {
    /// None of them ran (the batch was skipped or abandoned).
    Skipped,
    /// The first failed; the rest fail at once.
    At,
    /// The first failed; the rest honour their waits (a failure scoped to
    /// its batch).
    Draining,
}

impl<B: Backend> Drop for Batch<B> {
    fn drop(&mut self) {
        self.let_go();
    }
}

impl<B: Backend> fmt::Debug for Batch<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("commands", &self.commands.len())
            .field("epoch", &self.epoch)
            .field("abandoned", &self.abandoned)
            .finish_non_exhaustive()
    }
}
