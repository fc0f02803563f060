//! [`Queue<E>`]: the recording half of every backend's queue, over the
//! [`Engine`] a backend supplies to run the batches.

use std::fmt;

use crate::backend::{BufferOf, ProgramOf, SignalOf};
use crate::buffer::{Buffer, Pod, bytes_of, pattern_bytes};
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::profile::{Category, Described, EventNames, ProfileEvent, move_events, now_ns};
use crate::program::Scalar;
use crate::signal::{TimelineSignal, check_value};
use crate::transfer::{Download, HostBytes, HostBytesInner, check_transfer_len, owned_bytes};
use crate::view::{AsView, View};

use super::batch::{Batch, Command};
use super::engine::Engine;
use super::ledger::QueueId;
use super::{FailureScope, HardwareQueue, QueueKind, queue_label};

/// The host side of a queue's profile, allocated when profiling is first
/// turned on.
#[derive(Debug)]
pub(super) struct HostProfile {
    on: bool,
    /// Batches submitted since profiling was first turned on.
    pub(super) submitted: u64,
    /// The queue as events name it.
    label: crate::profile::Name,
    /// `submit` and `synchronize`, interned.
    names: EventNames,
    events: Vec<ProfileEvent>,
}

/// A command queue of any backend: the recording core, and the backend's
/// [`Engine`]. Each backend names it as its queue type (`CpuQueue` is
/// `Queue<CpuEngine>`).
///
/// See [`HardwareQueue`] for what each command does and
/// [the module docs](super) for what the core does and what it leaves to
/// the engine.
pub struct Queue<E: Engine> {
    pub(super) engine: E,
    pub(super) batch: Batch<E::Backend>,
    /// The first invalid command of the batch being recorded.
    pub(super) rejected: Option<Box<Error>>,
    /// The last `exec` arguments that passed the checks; boxed to keep the
    /// queue small.
    pub(super) last_checked: Option<Box<super::exec::CheckedExec>>,
    /// How many failures the owner has been told of (see [`Ledger`]).
    pub(super) epoch: u64,
    /// Host events and batch numbering while profiling (`None` until it is
    /// first turned on, so a queue that never profiles pays nothing).
    pub(super) profile: Option<Box<HostProfile>>,
}

impl<E: Engine> Queue<E> {
    /// A queue recording for `engine`.
    pub fn new(engine: E) -> Self {
        Self {
            engine,
            batch: Batch::default(),
            rejected: None,
            last_checked: None,
            epoch: 0,
            profile: None,
        }
    }

    /// Records a host call on the queue that started at `start` (called
    /// only while profiling): `batch` is the batch it submitted, or 0.
    pub(super) fn host_event(&mut self, name: &str, batch: u64, start: u64, outcome: &Result<()>) {
        if let Some(profile) = self.profile.as_deref_mut() {
            let detail = match outcome {
                Ok(()) => String::new(),
                Err(error) => error.to_string(),
            };
            let described = Described {
                name: profile.names.get(name),
                category: Category::Host,
                detail,
                params: None,
            };
            let event = described.into_event(profile.label.clone(), batch, 0, start, now_ns());
            profile.events.push(event);
        }
    }

    /// Records the wait `command` makes, once `value` is a signal value.
    #[inline(always)]
    fn push_wait(
        &mut self,
        value: u64,
        command: impl FnOnce() -> Command<E::Backend>,
    ) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        self.batch.push_with(command);
        self
    }

    /// Records a [`Command::WaitForeign`] on `value` of the signal `boxed`
    /// makes, once the value is in range.
    fn record_foreign_wait(
        &mut self,
        value: u64,
        boxed: impl FnOnce() -> Box<dyn super::ForeignWait>,
    ) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        self.batch.commands.push(Command::WaitForeign {
            signal: boxed(),
            value,
        });
        self
    }

    /// The engine that runs this queue's batches.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// The queue's id: it names the queue in errors, and a signal's
    /// producer.
    #[inline]
    pub fn id(&self) -> QueueId {
        self.engine.ledger().id()
    }

    /// `view` as a command's view, once the engine accepted its buffer
    /// ([`Engine::check_buffer`], naming it `what`) and the batch took a
    /// use of it (refused once a `dealloca` of it was recorded).
    fn device_view<V: AsView<E::Backend>>(
        &mut self,
        what: &'static str,
        view: &V,
    ) -> Result<View<E::Backend>> {
        let (buffer, offset, len) = view.view_parts();
        self.use_buffer(what, buffer)?;
        Ok(View::from_parts(buffer.clone(), offset, len))
    }

    /// The engine's [`Engine::check_buffer`], then a use of `buffer` for
    /// the batch (where `alloca` made it): refused once a `dealloca` of it
    /// was recorded.
    fn use_buffer(&mut self, what: &'static str, buffer: &BufferOf<E::Backend>) -> Result<()> {
        self.engine.check_buffer(what, buffer)?;
        self.batch.take_use(buffer, || what.to_owned())
    }

    /// Checks an upload of `host` bytes into `dst`: the view for its
    /// command, or `None` with the batch rejected.
    fn check_upload<D: AsView<E::Backend>>(
        &mut self,
        dst: &D,
        host: usize,
    ) -> Option<View<E::Backend>> {
        let (_, _, len) = dst.view_parts();
        let checked = check_transfer_len("upload", host, len)
            .and_then(|()| self.device_view("the upload destination", dst));
        checked.map_err(|e| self.reject(e)).ok()
    }

    /// `signal` past its fast path: every check, each refusal rejecting
    /// the batch, and the claim of a signal no queue produces yet.
    #[inline(never)]
    fn signal_checked(&mut self, signal: &SignalOf<E::Backend>, value: u64) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        let queue = self.id();
        if let Err(e) = self.engine.check_signal(signal, value) {
            // Recorded all the same (unclaimed), so that the rejected
            // batch fails the value and its waiters learn why; but not
            // where another live queue produces it (as below): failing
            // `value` would fail that queue's values up to it. (`submit`
            // looks again, for a producer that claimed it since; one
            // that claims it after that still races the abandon.)
            let produced_elsewhere = (signal.producer().queue())
                .is_some_and(|producer| producer != queue && producer.is_live());
            if !produced_elsewhere {
                self.batch.commands.push(Command::Signal {
                    signal: signal.clone(),
                    value,
                });
            }
            return self.reject(e);
        }
        if let Err(producer) = signal.producer().claim(queue) {
            // Not recorded: a batch this queue abandons must not fail the
            // values another queue produces.
            return self.reject(Error::SignalProducerConflict {
                value,
                producer,
                queue,
            });
        }
        // Recorded even in a rejected batch, so `submit` can fail it.
        self.batch.push_with(|| Command::Signal {
            signal: signal.clone(),
            value,
        });
        self
    }
}

/// The commands that do real work (validation, a push, a handle's clone)
/// are `#[inline(never)]`: one body per backend, which every caller shares
/// (the concrete queue, a generic function, an `Any*` enum's arm), so each
/// pays exactly the same for them and a program that records from many
/// generic call sites does not grow a copy at each. Trivial ones inline.
impl<E: Engine> HardwareQueue for Queue<E> {
    type Backend = E::Backend;

    #[inline]
    fn kind(&self) -> QueueKind {
        self.engine.kind()
    }

    #[inline(never)]
    fn wait(&mut self, signal: &SignalOf<E::Backend>, value: u64) -> &mut Self {
        self.push_wait(value, || Command::Wait {
            signal: signal.clone(),
            value,
        })
    }

    #[inline(never)]
    fn wait_settled(&mut self, signal: &SignalOf<E::Backend>, value: u64) -> &mut Self {
        self.push_wait(value, || Command::WaitSettled {
            signal: signal.clone(),
            value,
        })
    }

    fn set_failure_scope(&mut self, scope: FailureScope) -> Result<()> {
        self.engine.ledger().set_scope(scope);
        Ok(())
    }

    #[inline(never)]
    fn signal(&mut self, signal: &SignalOf<E::Backend>, value: u64) -> &mut Self {
        // The usual signal, whose checks all pass, with no error on this
        // frame: a value in range, on a signal this engine takes, that
        // this queue produces already. Anything else (or a signal no
        // queue claimed yet) goes through every check again, out of line.
        if value <= crate::signal::MAX_SIGNAL_VALUE
            && signal.producer().is_claimed_by(self.id())
            && self.engine.accepts_signal(signal)
        {
            self.batch.push_with(|| Command::Signal {
                signal: signal.clone(),
                value,
            });
            return self;
        }
        self.signal_checked(signal, value)
    }

    #[inline(never)]
    fn exec(
        &mut self,
        program: &ProgramOf<E::Backend>,
        buffers: &[&BufferOf<E::Backend>],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self {
        self.record_exec(
            program,
            buffers.len(),
            |index| buffers[index].view_parts(),
            scalars,
            params,
        )
    }

    #[inline(never)]
    fn exec_views(
        &mut self,
        program: &ProgramOf<E::Backend>,
        buffers: &[&View<E::Backend>],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self {
        self.record_exec(
            program,
            buffers.len(),
            |index| buffers[index].view_parts(),
            scalars,
            params,
        )
    }

    #[inline(never)]
    fn copy<D: AsView<E::Backend>, S: AsView<E::Backend>>(
        &mut self,
        dst: &D,
        src: &S,
    ) -> &mut Self {
        let (dst_len, src_len) = (dst.view_parts().2, src.view_parts().2);
        if dst_len != src_len {
            return self.reject(Error::CopySizeMismatch {
                dst: dst_len,
                src: src_len,
            });
        }
        let views = match self.device_view("the copy destination", dst) {
            Ok(dst) => self
                .device_view("the copy source", src)
                .map(|src| (dst, src)),
            Err(e) => Err(e),
        };
        let (dst, src) = match views {
            Ok(views) => views,
            Err(e) => return self.reject(e),
        };
        if dst.overlaps(&src) {
            return self.reject(Error::CopyOverlap {
                dst: dst.range(),
                src: src.range(),
                size: Buffer::size(dst.buffer()),
            });
        }
        self.batch.commands.push(Command::Copy { dst, src });
        self
    }

    #[inline(never)]
    fn fill<D: AsView<E::Backend>, T: Pod>(&mut self, dst: &D, pattern: T) -> &mut Self {
        let (_, offset, len) = dst.view_parts();
        let (bytes, width) = pattern_bytes(&pattern);
        let bad = |reason: String| Error::InvalidFill {
            offset,
            len,
            reason,
        };
        if !matches!(width, 1 | 2 | 4) {
            return self.reject(bad(format!(
                "the pattern is {width} bytes; pass a 1-, 2- or 4-byte value (u8, u16, u32, \
                 f32, ...)"
            )));
        }
        if !offset.is_multiple_of(width) || !len.is_multiple_of(width) {
            return self.reject(bad(format!(
                "the offset and length must be multiples of the pattern's {width} bytes; align \
                 the view, or fill with a narrower pattern"
            )));
        }
        let dst = match self.device_view("the fill destination", dst) {
            Ok(dst) => dst,
            Err(e) => return self.reject(e),
        };
        self.batch.commands.push(Command::Fill {
            dst,
            pattern: bytes,
            width: width as u8,
        });
        self
    }

    #[inline(never)]
    fn upload<D: AsView<E::Backend>, T: Pod>(&mut self, dst: &D, data: &[T]) -> &mut Self {
        let bytes = bytes_of(data);
        let Some(dst) = self.check_upload(dst, bytes.len()) else {
            return self;
        };
        let start = self.batch.bytes.len();
        self.batch.bytes.extend_from_slice(bytes);
        let data = HostBytes(HostBytesInner::Inline(start..self.batch.bytes.len()));
        self.batch.commands.push(Command::Upload { dst, data });
        self
    }

    #[inline(never)]
    fn upload_vec<D, T, O>(&mut self, dst: &D, data: O) -> &mut Self
    where
        D: AsView<E::Backend>,
        T: Pod,
        O: AsRef<[T]> + Send + Sync + 'static,
    {
        let Some(dst) = self.check_upload(dst, size_of_val(data.as_ref())) else {
            return self;
        };
        let data = HostBytes(HostBytesInner::Owned(owned_bytes(data)));
        self.batch.commands.push(Command::Upload { dst, data });
        self
    }

    #[inline(never)]
    fn download<S: AsView<E::Backend>, T: Pod + Send>(
        &mut self,
        src: &S,
        into: &Download<T>,
    ) -> &mut Self {
        let (buffer, offset, len) = src.view_parts();
        let sink = match into.arm() {
            Ok(sink) => sink,
            Err(e) => return self.reject(e),
        };
        // Recorded even when invalid (or the batch is rejected already):
        // `submit` then fails the download with the batch's rejection, so
        // whoever waits on it learns why.
        let checked = check_transfer_len("download", sink.len(), len)
            .and_then(|()| self.use_buffer("the download source", buffer));
        if let Err(e) = checked {
            self.reject(e);
        }
        self.batch.commands.push(Command::Download {
            src: View::from_parts(buffer.clone(), offset, len),
            sink,
        });
        self
    }

    fn alloca(&mut self, size: usize) -> Result<BufferOf<E::Backend>> {
        let buffer = self.engine.alloca(size)?;
        debug_assert!(
            buffer.queue_ordered().is_some(),
            "Engine::alloca must return a buffer whose `queue_ordered` is `Some`"
        );
        // The command does nothing in an engine (the memory is valid now);
        // it is there to give the profile its `alloca` event.
        if self.profiling() {
            self.batch.commands.push(Command::Alloca {
                buffer: buffer.clone(),
            });
        }
        Ok(buffer)
    }

    fn dealloca(&mut self, buffer: &BufferOf<E::Backend>) -> &mut Self {
        let Some(ordered) = buffer.queue_ordered() else {
            return self.reject(Error::InvalidDealloca {
                reason: "the buffer was not made by `alloca`; drop its handles instead (its \
                         range goes back to the pool once the last one, and the last batch \
                         using it, are gone)"
                    .into(),
            });
        };
        if let Err(e) = self.engine.check_dealloca(buffer) {
            return self.reject(e);
        }
        let queue = self.id();
        if let Err(e) = self.batch.record_dealloca(buffer, ordered, queue) {
            return self.reject(e);
        }
        self.batch.commands.push(Command::Dealloca {
            buffer: buffer.clone(),
        });
        self
    }

    #[inline]
    fn memory_barrier(&mut self) -> &mut Self {
        self.batch.commands.push(Command::Barrier);
        self
    }

    fn wait_foreign<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
        self.record_foreign_wait(value, || Box::new(signal.clone()))
    }

    fn collective(
        &mut self,
        communicator: &crate::collective::Communicator,
        op: crate::collective::CollectiveOp,
        element: crate::collective::Element,
        send: Option<&View<E::Backend>>,
        recv: Option<&View<E::Backend>>,
    ) -> &mut Self {
        self.record_collective(communicator, op, element, send, recv)
    }

    fn check_collective(&self, communicator: &crate::collective::Communicator) -> Result<()> {
        self.engine.check_collective(communicator)
    }

    fn forfeit_collective(
        &mut self,
        communicator: &crate::collective::Communicator,
        what: (
            crate::collective::CollectiveOp,
            crate::collective::Element,
            usize,
        ),
        cause: Error,
    ) -> &mut Self {
        self.forfeit_place(communicator, what, cause)
    }

    fn wait_foreign_settled<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
        self.record_foreign_wait(value, || {
            Box::new(super::batch::SettledForeign(signal.clone()))
        })
    }

    #[inline]
    fn reject(&mut self, error: Error) -> &mut Self {
        if self.rejected.is_none() {
            self.rejected = Some(Box::new(error));
        }
        self
    }

    #[inline]
    fn rejection(&self) -> Option<&Error> {
        self.rejected.as_deref()
    }

    #[inline]
    fn recorded(&self) -> usize {
        self.batch.commands.len()
    }

    fn replay_as(&mut self, key: u32) -> &mut Self {
        // The engine keeps the key for the batch it is handed next (the
        // batch itself stays as small as it is: the queue holds it inline).
        self.engine.replay_next(Some(key));
        self
    }

    fn launches(&self) -> super::Launches {
        self.engine.launches()
    }

    fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
        !self.profiling() && self.engine.replay_recorded(key, kernels)
    }

    fn replay_program(&mut self, index: u32) -> &mut Self {
        if let Err(error) = self.engine.check_replay(index) {
            return self.reject(error);
        }
        self.batch.commands.push(Command::Replay { index });
        self
    }

    fn discard(&mut self) {
        self.rejected = None;
        self.abandon_recorded(Error::Abandoned {
            reason: "the batch that would have set this value was discarded before it was \
                     submitted; record and submit it again",
        });
    }

    fn submit(&mut self) -> Result<()> {
        // The usual batch (nothing rejected or to report, never profiled),
        // as `submit_recorded` and `hand_over` would submit it, without
        // their frames: 60 instructions of a CUDA `signal` + `submit`
        // (`benches/callgrind.sh`).
        if self.profile.is_none()
            && self.rejected.is_none()
            && !self.batch.is_empty()
            && !self.engine.ledger().has_unreported()
        {
            self.batch.epoch = self.epoch;
            if self.batch.collectives {
                self.stamp_collectives();
            }
            self.hand_over();
            return Ok(());
        }
        self.submit_general()
    }

    fn synchronize(&mut self) -> Result<()> {
        let start = self.profiling().then(now_ns);
        self.engine.synchronize();
        let outcome = self.engine.ledger().report(&mut self.epoch);
        if let Some(start) = start {
            self.host_event("synchronize", 0, start, &outcome);
        }
        outcome
    }

    fn set_profiling(&mut self, on: bool) {
        if on && self.profile.is_none() {
            // `on` is set below, as for a profile made before.
            self.profile = Some(Box::new(HostProfile {
                on: false,
                submitted: 0,
                label: queue_label(self.id(), self.engine.kind()).into(),
                names: EventNames::new(),
                events: Vec::new(),
            }));
        }
        if let Some(profile) = self.profile.as_deref_mut() {
            profile.on = on;
        }
        self.engine.set_profiling(on);
    }

    fn profiling(&self) -> bool {
        self.profile.as_deref().is_some_and(|profile| profile.on)
    }

    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        // The engine's (one per command) first, into an empty vector, which
        // an engine may fill by handing over its own; then the host's few.
        let mut events = Vec::new();
        self.engine.take_profile(&mut events);
        if let Some(profile) = self.profile.as_deref_mut() {
            move_events(&mut events, &mut profile.events);
        }
        events.sort_by_key(|event| (event.start_ns, event.end_ns));
        events
    }
}

impl<E: Engine> Drop for Queue<E> {
    fn drop(&mut self) {
        if !self.batch.is_empty() {
            self.abandon_recorded(Error::Abandoned {
                reason: "the queue was dropped with a batch recorded but not submitted; call \
                         `submit` before dropping the queue",
            });
        }
    }
}

impl<E: Engine + fmt::Debug> fmt::Debug for Queue<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("id", &self.id())
            .field("kind", &self.engine.kind())
            .field("recorded", &self.batch.commands.len())
            .field("rejected", &self.rejected)
            .field("engine", &self.engine)
            .finish()
    }
}
