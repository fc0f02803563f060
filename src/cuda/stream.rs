//! The stream side of a CUDA queue: what the owner and the worker thread
//! share, how a batch is put on the stream command by command, the batches
//! in flight until the stream passed them. The worker that takes over
//! behind a wait the stream cannot express is `super::worker`;
//! [`CudaEngine`](super::CudaEngine) is the queue core's side.

use std::collections::VecDeque;
use std::mem;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaStream, DriverError, result, sys};

use crate::error::{Error, Result, panic_message};
use crate::queue::{Admission, Batch, Command, Ledger};
use crate::ring::Dependency;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

pub(super) use super::in_flight::InFlight;
use super::launch;
use super::profiler::Profiler;
use super::repeat::Mark;
use super::replay::{Replayed, Replays};
use super::transfer::{self, Pinned};
use super::{Cuda, CudaDevice, context_error};
use crate::view::View;

/// The device address of a view's first byte.
pub(super) fn pointer(view: &View<Cuda>) -> u64 {
    view.buffer().device_pointer() + view.offset() as u64
}

/// How far a batch got on the stream.
pub(super) enum Outcome {
    /// Every command is on the stream.
    Done,
    /// Commands before this index are on the stream; this one waits for
    /// something the host must see first.
    Blocked(usize),
    /// Commands before this index are on the stream; this one failed.
    Failed(usize, Error),
}

/// What the owner and the worker share.
pub(super) struct Shared {
    pub(super) stream: std::sync::Arc<CudaStream>,
    /// The driver's entry points a launch calls directly.
    pub(super) entries: &'static super::entry::Entries,
    /// For its staging cache and allocation fence.
    pub(super) device: CudaDevice,
    /// The allocation fence's generation this stream last waited for.
    pub(super) fence_seen: AtomicU64,
    pub(super) ledger: Ledger,
    pub(super) state: Mutex<State>,
    /// The worker parks here for batches.
    pub(super) work: Condvar,
    /// `synchronize` parks here for the worker to catch up.
    pub(super) idle: Condvar,
    /// Lock order: `state`, then `in_flight`; never the reverse.
    pub(super) in_flight: Mutex<InFlight>,
    /// The timing state while profiling is on (`crate::profile`). Taken
    /// alone, never while holding `state` or `in_flight`.
    pub(super) profiler: Mutex<Option<Profiler>>,
    pub(super) profiling: AtomicBool,
    /// The staging of the batch being enqueued (one at a time, in queue
    /// order), moved into `in_flight` with it by `finish`. Taken alone.
    pub(super) staging: Mutex<Vec<Pinned>>,
    /// The key of the next batch `submit` takes, plus one (0: none): set
    /// by the owner (`Engine::replay_next`), taken by its `submit`.
    pub(super) replay_key: AtomicU64,
    /// The plan replay's graphs (`super::replay`). Taken by the thread
    /// enqueueing, alone.
    pub(super) replays: Mutex<Replays>,
    /// Kernels launched one by one or recorded into a graph, and graphs
    /// launched again (`crate::Launches`).
    pub(super) kernels: AtomicU64,
    pub(super) programs: AtomicU64,
    /// Of `programs`, the graphs a batch named (`Command::Replay`).
    pub(super) repeats: AtomicU64,
    /// Graphs whose kernel nodes took a run's new parameters.
    pub(super) patched: AtomicU64,
    /// `State::worker_busy`, mirrored (stored under `state`) for the
    /// owner's check without the lock: only the owner sets it, so a `false`
    /// it reads is true.
    pub(super) busy: AtomicBool,
    /// Whether `InFlight::batches` holds a batch (stored under
    /// `in_flight`): a `submit` with nothing to retire takes no lock.
    pub(super) holding: AtomicBool,
    /// `InFlight::unsettled` (how many batches in flight hold values kept
    /// `Unsettled`), mirrored: stored under `in_flight` at each change
    /// (`Shared::set_unsettled`), so it is exact whenever that lock is
    /// free; read alone (`Relaxed`) by the worker's idle and blocked
    /// checks (`Shared::unsettled`). Only the worker adds to it
    /// (`worker::settle`), so it never reads fewer than it put there; a
    /// retirement on the owner's thread it reads late costs it one more
    /// poll, never a missed one. No other memory is published through it.
    pub(super) unsettled_batches: AtomicUsize,
    /// The NCCL groups in flight on the stream, told of every batch
    /// enqueued behind them, so that an abort fails those too. Told by the
    /// thread enqueueing, in queue order; the owner's signal-only fast path
    /// asks whether it watches any (`StreamWatch::watching`).
    #[cfg(feature = "nccl")]
    pub(super) behind: crate::collective::StreamWatch,
}

/// What a query of the stream (`cuStreamQuery`, which blocks for
/// nothing) found: [`Shared::query_stream`].
pub(super) enum StreamQuery {
    /// The queue is stalled (see
    /// [`earlier_work_done`](Shared::earlier_work_done)): no query was
    /// made, and nothing will prove work done any more.
    Stalled,
    /// The stream completed all the work put on it: among it, the batches
    /// in flight before the query, this many ([`Shared::put_in_flight`]
    /// then), for [`retire_waited`](Shared::retire_waited).
    Idle(u64),
    /// Work on the stream may still run (`CUDA_ERROR_NOT_READY`).
    Busy,
    /// The query failed otherwise (with this many batches in flight
    /// before it): sticky or not, the caller decides what that means.
    Failed(u64, DriverError),
}

/// A batch for the worker: the command it resumes at (or, with an error,
/// failed at: the worker drains it), and how it replays.
pub(super) struct Pending {
    pub(super) batch: Batch<Cuda>,
    pub(super) from: usize,
    pub(super) failed: Option<Error>,
    pub(super) mark: Mark,
}

#[derive(Default)]
pub(super) struct State {
    /// Batches for the worker.
    pub(super) pending: VecDeque<Pending>,
    /// The worker has batches, so later ones must go through it too (to
    /// stay in order). Set by the owner when it hands one over, cleared by
    /// the worker once `pending` is empty.
    pub(super) worker_busy: bool,
    /// The owner dropped the queue: the worker exits once `pending` is empty.
    pub(super) closed: bool,
    pub(super) sync_waiters: usize,
}

/// An enqueue (`work`), with a panic (a bug) turned into a failure of the
/// batch (`panicked` makes it of the error), so no thread unwinds with a
/// batch half-enqueued and its signals unset.
fn caught<T>(work: impl FnOnce() -> T, panicked: impl FnOnce(Error) -> T) -> T {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        panicked(Error::EnginePanicked {
            message: panic_message(payload),
        })
    })
}

impl Shared {
    /// Takes `batch` from command `from` on, on the thread that reached it
    /// in queue order (the owner's, or the worker's after a deferred wait):
    /// fails its signals if the ledger says it must not run, else enqueues
    /// what the stream can take now; what follows a wait the stream cannot
    /// express goes to the worker. Gives `batch` back when nothing keeps
    /// it (the stream holds nothing of it), to be cleared and reused.
    pub(super) fn process(
        &self,
        batch: Batch<Cuda>,
        from: usize,
        mark: Mark,
    ) -> Option<Batch<Cuda>> {
        match self.ledger.admit(&batch) {
            Admission::Run => {}
            // Its values must not fail before the work ahead of them
            // completed: the worker waits for the stream (see
            // `earlier_work_done`).
            Admission::Skip(_) if !self.stream_idle() => {
                self.hand_over(batch, from, None, mark);
                return None;
            }
            Admission::Skip(cause) => {
                batch.fail_signals(from, &cause);
                self.hold(mark.held());
                return Some(batch);
            }
        }
        match self.enqueue_caught(&batch, from, &mark) {
            Outcome::Done => {
                let all = batch.commands().len();
                self.finish(batch, all, mark.held())
            }
            Outcome::Blocked(at) => {
                self.hand_over(batch, at, None, mark);
                None
            }
            // Reported by a later `submit` or `synchronize`, as for work
            // that fails on the GPU. A batch whose failure is its own
            // (`FailureScope::Batch`) drains its later waits: on the
            // worker, which may block, and which later batches follow. So
            // does one with work on the stream before the failure: its
            // values from there on fail once that work completed (the
            // worker waits for the stream), not while it still runs,
            // which a waiter let through by the failure (a settled wait)
            // would race with; and one behind earlier batches' work still
            // on the stream.
            Outcome::Failed(at, error) if self.fails_on_the_worker(at) => {
                self.hand_over(batch, at, Some(error), mark);
                None
            }
            Outcome::Failed(at, error) => {
                self.ledger.fail(&batch, at, error);
                self.finish(batch, at, mark.held())
            }
        }
    }

    /// Hands `batch` to the worker, to resume at command `at` (or, with
    /// `failed`, to drain from it); later batches follow it there.
    fn hand_over(&self, batch: Batch<Cuda>, from: usize, failed: Option<Error>, mark: Mark) {
        let mut state = self.state.lock();
        state.worker_busy = true;
        self.busy.store(true, Ordering::Release);
        state.pending.push_back(Pending {
            batch,
            from,
            failed,
            mark,
        });
        self.work.notify_one();
    }

    /// On the worker, before it fails values after work on the stream:
    /// whether that work is done, by a wait for the stream: `Ok` where it
    /// succeeded or failed with a sticky error (the device is marked lost,
    /// and its stream runs nothing again), with how many batches were in
    /// flight before it (those it passed, for `retire_waited`); the error
    /// where it failed otherwise, and the stream may still run it. `Ok(0)`
    /// at once on a stalled queue (see `super::in_flight`): nothing will
    /// prove its work done any more, so values fail at once, as
    /// `keep_for_the_process` fails them; but no batch in flight is passed
    /// (one the stall did not keep for the process, such as a skipped
    /// batch keeping its replay template, goes only once its own event
    /// says the stream passed it).
    pub(super) fn earlier_work_done(&self, what: &str) -> Result<u64> {
        if self.ledger.refuses() {
            return Ok(0);
        }
        let before = self.put_in_flight();
        match self.stream.synchronize() {
            Ok(()) => Ok(before),
            Err(error) => match self.fault(what, error) {
                Error::DeviceLost { .. } => Ok(before),
                error => Err(error),
            },
        }
    }

    /// What every batch needs before its first command goes on the stream.
    /// (Inlined: its frame and its result's round trip through memory were
    /// about 15 instructions of a signal-only batch.)
    #[inline(always)]
    fn prepare(&self) -> Result<()> {
        // A device lost since the batch's `exec`s were checked (an `exec`
        // repeating the last is not checked again: `Engine::check_exec`).
        if let Some(lost) = super::lost(self.device.ordinal()) {
            return Err(lost);
        }
        // Once, for every raw driver call after it (copies, fills,
        // transfers, event records): this thread (the owner's, or the
        // worker's) may not have the stream's context current.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.fault("making the queue's context current", e))?;
        // Memory the pool zeroed since this stream's last batch: its fill
        // comes first.
        self.device
            .fence()
            .order(&self.stream, &self.fence_seen)
            .map_err(|e| self.fault("waiting for the allocation fence", e))
    }

    /// [`enqueue`](Self::enqueue) of a batch of signals only, when the
    /// queue does not profile: their events recorded in order, and nothing
    /// of `enqueue`'s replays, profiling and other commands. A failure (the
    /// command's index and why) is boxed: an `Outcome` returned through the
    /// panic catch was copied whole, error payload and all, on every signal.
    fn enqueue_signals(&self, batch: &Batch<Cuda>) -> std::result::Result<(), Box<(usize, Error)>> {
        let work = || {
            self.prepare().map_err(|error| Box::new((0, error)))?;
            for (index, command) in batch.commands().iter().enumerate() {
                if let Command::Signal { signal, value } = command
                    && let Err(error) = signal.record(*value, &self.stream)
                {
                    return Err(Box::new((index, error)));
                }
            }
            Ok(())
        };
        caught(work, |error| Err(Box::new((0, error))))
    }

    /// [`enqueue`](Self::enqueue), with a panic (a bug) turned into a
    /// failure of the batch at `from` (see [`caught`]).
    pub(super) fn enqueue_caught(&self, batch: &Batch<Cuda>, from: usize, mark: &Mark) -> Outcome {
        caught(
            || self.enqueue(batch, from, mark),
            |error| Outcome::Failed(from, error),
        )
    }

    /// Puts the commands of `batch` from `from` on the stream, without ever
    /// blocking on the host. A batch marked for replay (`mark`) launches
    /// its runs of kernels as graphs, or repeats its template's
    /// (`super::replay`).
    fn enqueue(&self, batch: &Batch<Cuda>, from: usize, mark: &Mark) -> Outcome {
        if let Err(error) = self.prepare() {
            return Outcome::Failed(from, error);
        }
        // Behind an NCCL group in flight: the group's abort fails this too.
        #[cfg(feature = "nccl")]
        (self.behind).follow(batch.commands(), from, batch.epoch());
        let profiling = self.profiling.load(Ordering::Relaxed);
        let (replay, template) = match mark {
            Mark::Record(key, template, _) => (Some(*key), Some(&**template)),
            _ => (None, None),
        };
        let replay = match replay {
            Some(_) if profiling => {
                self.replays.lock().fallback = Some(
                    "the queue profiles: its kernels launch one by one, so that each is timed"
                        .to_owned(),
                );
                None
            }
            replay => replay,
        };
        // Execs before `plain_until` launch one by one.
        let mut plain_until = from;
        let mut index = from;
        while let Some(command) = batch.commands().get(index) {
            // After this command: the next, or past a graph launched (or
            // the collectives grouped with it).
            let mut next = index + 1;
            if let (Some(key), Command::Exec { .. }) = (replay, command)
                && index >= plain_until
            {
                match self.replay(batch, key, template, index) {
                    Ok(Replayed::Graph(end)) => {
                        index = end;
                        continue;
                    }
                    Ok(Replayed::Plain(end)) => plain_until = end,
                    Ok(Replayed::Failed(at, error)) => return Outcome::Failed(at, error),
                    Err(error) => return Outcome::Failed(index, error),
                }
            }
            if !profiling
                && replay.is_none()
                && let Command::Exec { .. } = command
            {
                match self.launch_run(batch, index) {
                    Ok(end) => index = end,
                    Err((at, error)) => return Outcome::Failed(at, error),
                }
                continue;
            }
            let start = if profiling {
                Profiler::mark(&self.stream)
            } else {
                None
            };
            let result = match command {
                Command::Wait { signal, value } | Command::WaitSettled { signal, value } => {
                    match signal.dependency(*value) {
                        Ok(None) => return Outcome::Blocked(index),
                        Ok(Some(Dependency::Reached)) => Ok(()),
                        Ok(Some(Dependency::Event(event))) => {
                            event.order_before(&self.stream).map_err(|e| {
                                self.fault("making the stream wait for a signal's event", e)
                            })
                        }
                        // A settled wait on a failed value: the work that
                        // would set it never runs, but an aborted
                        // collective's may still (`given_up`).
                        Err(error) if matches!(command, Command::WaitSettled { .. }) => {
                            let given_up = match error {
                                Error::SignalFailed { .. } => signal.given_up(*value),
                                _ => None,
                            };
                            match given_up {
                                Some(event) => event.order_before(&self.stream).map_err(|e| {
                                    self.fault("making the stream wait for aborted work", e)
                                }),
                                None => crate::queue::settled(Err(error)),
                            }
                        }
                        Err(error) => Err(error),
                    }
                }
                Command::WaitForeign { signal, value } => {
                    if !signal.is_reached(*value) {
                        return Outcome::Blocked(index);
                    }
                    Ok(())
                }
                Command::Signal { signal, value } => signal.record(*value, &self.stream),
                Command::Exec {
                    program,
                    buffers,
                    scalars,
                    params,
                } => {
                    // Counted before the signals after it are recorded, so
                    // whoever they wake sees the count.
                    self.kernels.fetch_add(1, Ordering::Relaxed);
                    self.launch(
                        program,
                        &batch.buffers()[buffers.clone()],
                        &batch.scalars()[scalars.clone()],
                        params,
                        launch::launch_config(params),
                    )
                }
                // The batch holds a use of every buffer `alloca` made that
                // it names, so none of their ranges is returned before the
                // stream passed it.
                Command::Copy { dst, src } => self.copy(dst, src),
                Command::Fill {
                    dst,
                    pattern,
                    width,
                } => {
                    // SAFETY: the view lies in its buffer, of this stream's
                    // device, aligned to `width` (checked at record time),
                    // kept alive until the stream passed the batch.
                    unsafe {
                        transfer::fill(
                            &self.stream,
                            pointer(dst),
                            *pattern,
                            *width,
                            dst.len() / usize::from(*width),
                        )
                    }
                    .map_err(|e| self.fault("a fill", e))
                }
                Command::Upload { dst, data } => {
                    let mut staging = self.staging.lock();
                    // SAFETY: the view lies in its buffer, of this stream's
                    // device, of the data's length (checked at record
                    // time), kept alive until the stream passed the batch;
                    // so is the batch's memory the data is in.
                    unsafe {
                        transfer::upload(
                            &self.stream,
                            pointer(dst),
                            batch.host_bytes(data),
                            self.device.staging(),
                            &mut staging,
                        )
                    }
                    .map_err(|e| self.fault("an upload", e))
                }
                Command::Download { src, sink } => {
                    let mut staging = self.staging.lock();
                    // SAFETY: the view lies in its buffer, of this stream's
                    // device, of the download's length (checked at record
                    // time), kept alive until the stream passed the batch.
                    unsafe {
                        transfer::download(
                            &self.stream,
                            pointer(src),
                            sink,
                            self.device.staging(),
                            &mut staging,
                        )
                    }
                    .map_err(|e| self.fault("a download", e))
                }
                // With those after it, in one NCCL group: profiled as one.
                Command::Collective(_) => {
                    match super::queue::enqueue_collectives(batch, index, self) {
                        Ok(end) => {
                            next = end;
                            Ok(())
                        }
                        Err((at, error)) => return Outcome::Failed(at, error),
                    }
                }
                // A range of the pool, taken when it was recorded.
                Command::Barrier | Command::Alloca { .. } => Ok(()),
                // Completes with the batch: `retire` says so once the
                // stream passed it.
                Command::Dealloca { .. } => Ok(()),
                Command::Replay { index } => self.repeat(mark, *index),
            };
            if let Err(error) = result {
                return Outcome::Failed(index, error);
            }
            if let Some(start) = start
                && let Some(end) = Profiler::mark(&self.stream)
                && let Some(profiler) = self.profiler.lock().as_mut()
            {
                profiler.push(command, batch.sequence(), index, start, end);
            }
            index = next;
        }
        if let (Some(template), Some(_)) = (template, replay) {
            template.finish(batch);
        }
        Outcome::Done
    }

    /// A driver error of this queue's stream, as an [`Error`]: a sticky
    /// one marks the device lost (see `device_error`).
    pub(super) fn fault(&self, what: &str, error: cudarc::driver::DriverError) -> Error {
        context_error(self.stream.context(), what, error)
    }

    /// Copies all of `src` into `dst` on the stream.
    fn copy(&self, dst: &View<Cuda>, src: &View<Cuda>) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // The context is current (`enqueue`). The result layer, because cudarc's safe copy wants the destination
        // `&mut` (a lock per buffer, and lock ordering between two) for an
        // exclusivity our queues do not need: signals order buffer use.
        // SAFETY: both views lie in allocations on this stream's device
        // (checked at record time) and are of equal length, kept alive
        // until the stream passed this copy; two views of one buffer do not
        // overlap (checked at record time).
        unsafe {
            result::memcpy_dtod_async(
                pointer(dst),
                pointer(src),
                src.len(),
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| self.fault("a device-to-device copy", e))
    }

    /// Takes a batch of signals only (a queue's `signal` + `submit`) with
    /// no batch at the worker before it, in place (the queue clears it):
    /// its events are recorded right here, with no completion event (its
    /// signals' rings keep their events), no staging and no hand-over: one
    /// lock per signal, its ring's, and no thread woken.
    pub(super) fn signal_only(&self, batch: &mut Batch<Cuda>) {
        if self.holding.load(Ordering::Relaxed) {
            self.retire();
        }
        if let Admission::Skip(cause) = self.ledger.admit(batch) {
            // As `process` does.
            if self.stream_idle() {
                batch.fail_signals(0, &cause);
            } else {
                self.hand_over(mem::take(batch), 0, None, Mark::Plain);
            }
            return;
        }
        // Profiled, each signal is an event of its own: `enqueue` times it.
        let outcome = if self.profiling.load(Ordering::Relaxed) {
            self.enqueue_caught(batch, 0, &Mark::Plain)
        } else {
            match self.enqueue_signals(batch) {
                Ok(()) => return,
                Err(failed) => {
                    let (at, error) = *failed;
                    Outcome::Failed(at, error)
                }
            }
        };
        match outcome {
            Outcome::Done => {}
            // Not from signals; as `process` would, should it be.
            Outcome::Blocked(at) => {
                self.hand_over(mem::take(batch), at, None, Mark::Plain);
            }
            // As `process` would: after the work on the stream before it.
            Outcome::Failed(at, error) if self.fails_on_the_worker(at) => {
                self.hand_over(mem::take(batch), at, Some(error), Mark::Plain);
            }
            Outcome::Failed(at, error) => {
                self.ledger.fail(batch, at, error);
            }
        }
    }

    /// Whether a batch that failed at command `at` on the owner's thread
    /// goes to the worker: under `FailureScope::Batch` (it drains its
    /// later waits there), or with work on the stream before the failure
    /// (its own commands before `at`, or earlier batches' still running),
    /// since its values from the failure on must not settle before that
    /// work completed (the worker waits for the stream). A stream whose
    /// query fails goes too: the worker's wait reports the fault.
    fn fails_on_the_worker(&self, at: usize) -> bool {
        at > 0 || self.ledger.independent() || !self.stream_idle()
    }

    /// Whether the stream completed everything put on it (`false` where
    /// the query fails: the worker's wait for it reports the fault), or
    /// nothing will tell any more: `true` on a stalled queue, whose values
    /// fail at once (see [`earlier_work_done`](Self::earlier_work_done)).
    /// Where it is idle, the batches in flight before the query are
    /// retired first (it passed them, even one whose event cannot tell):
    /// the values they keep unsettled fail before the caller fails later
    /// ones at once (queue order).
    #[cold]
    #[inline(never)]
    fn stream_idle(&self) -> bool {
        match self.query_stream() {
            StreamQuery::Stalled => true,
            StreamQuery::Idle(before) => {
                self.retire_waited(before);
                true
            }
            StreamQuery::Busy | StreamQuery::Failed(..) => false,
        }
    }

    /// Queries the stream, unless the queue is stalled: what
    /// [`stream_idle`](Self::stream_idle) and the worker's
    /// `stream_passed` both ask, before each handles a failed query its
    /// own way.
    pub(super) fn query_stream(&self) -> StreamQuery {
        if self.ledger.refuses() {
            return StreamQuery::Stalled;
        }
        let before = self.put_in_flight();
        // SAFETY: the stream is alive (`self` holds it); a query blocks
        // for nothing.
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) }.result() {
            Ok(()) => StreamQuery::Idle(before),
            Err(error) if error.0 == sys::CUresult::CUDA_ERROR_NOT_READY => StreamQuery::Busy,
            Err(error) => StreamQuery::Failed(before, error),
        }
    }
}
