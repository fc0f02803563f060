//! `CudaEngine`: the CUDA backend's engine: batches enqueued on a CUDA
//! stream, with host-side waits deferred to a worker thread.

use std::collections::VecDeque;
use std::fmt;
use std::mem;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaEvent, CudaStream, PushKernelArg, result};

use crate::device::Device;
use crate::error::{Error, Result, panic_message};
use crate::params::{ExecParams, Limits};
use crate::profile::{ProfileEvent, now_ns};
use crate::program::{Program, Scalar};
use crate::queue::{Admission, Batch, Command, Engine, Ledger, Queue, QueueKind, queue_label};
use crate::ring::Dependency;
use crate::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, Ordering, spawn};

use super::device::PARAMETER_BYTES;
use super::launch;
use super::profiler::Profiler;
use super::signal::EVENT_FLAGS;
use super::transfer::{self, Pinned};
use super::{Cuda, CudaBuffer, CudaDevice, CudaProgram, context_error, driver_error, lost};
use crate::view::View;

/// The device address of a view's first byte.
fn pointer(view: &View<Cuda>) -> u64 {
    view.buffer().device_pointer() + view.offset() as u64
}

/// A command queue of the CUDA backend: the shared recording core
/// ([`Queue`]) over a [`CudaEngine`], one CUDA stream.
pub type CudaQueue = Queue<CudaEngine>;

/// How CUDA runs a queue's batches: on one CUDA stream.
///
/// [`submit`](crate::HardwareQueue::submit) enqueues the batch on the
/// stream right there, command by command, and returns without waiting for
/// the GPU:
///
/// - `exec` is a kernel launch with grid = global / local and block = local;
///   its parameters are the buffers' device pointers in order, then the
///   scalars by value;
/// - `copy` is a device-to-device `cuMemcpyDtoDAsync` between the two
///   views; `fill` a `cuMemsetD8/D16/D32Async`;
/// - `upload` is a `cuMemcpyHtoDAsync`: up to 64 KiB straight from the
///   batch's memory (the driver stages pageable memory before it returns),
///   larger ones from page-locked staging the batch keeps until the stream
///   passed it; `download` is a `cuMemcpyDtoHAsync` into page-locked
///   staging, then a stream callback (`cuStreamAddCallback`) copies it
///   into the [`Download`](crate::Download) and wakes its waiters, or,
///   after a fault, fails it: both in stream order, neither blocking the
///   host;
/// - `signal(s, v)` records one of `s`'s events on the stream (see
///   [`CudaSignal`](super::CudaSignal)): `v` is reached when the GPU gets
///   there. **Back-pressure:** a signal holds at most
///   [`RING_SLOTS`](crate::ring::RING_SLOTS) (16) unfinished records; a
///   `submit` that records a 17th value of one signal while the 16 before
///   are all still running blocks until the oldest completes (a batch that
///   signals one signal many times, or a host that submits far ahead of
///   the GPU). Signal fewer values, or use more signals, where that
///   matters;
/// - `wait(s, v)` on a value already recorded is `cuStreamWaitEvent` on the
///   event of the smallest recorded value `>= v` (a device-side wait, also
///   across streams and devices); on a value already reached it is nothing;
/// - `memory_barrier` enqueues nothing: a stream runs its commands in order,
///   each seeing the writes of the ones before, and other queues see them
///   through the events they wait on.
///
/// **Waits the stream cannot express.** A `wait(s, v)` whose value is not
/// recorded yet (the producing queue submits later, or the host will `set`
/// it), and a [`wait_foreign`](crate::HardwareQueue::wait_foreign) on
/// another backend's signal that is not reached yet, stop the enqueueing:
/// the rest of the batch, and every later batch, goes to the queue's worker
/// thread, which blocks on the host (the ring's condvar, or the foreign
/// signal's own `wait`) and then enqueues the rest. So the stream never runs
/// past such a wait, because what follows is not on it yet, and it never
/// holds work gated on the host, so every event it records completes on its
/// own. Cost: nothing while the value is already there; otherwise one parked
/// thread while waiting, a host wake-up (microseconds) plus the enqueueing
/// of the remaining commands once it arrives, and a thread hand-off per
/// `submit` until the worker has caught up. The GPU idles on this stream
/// meanwhile, as it would behind any wait. A signal of the queue's own
/// backend passed to `wait_foreign` is waited on the same host way; pass it
/// to `wait` for the device-side wait.
///
/// Failure never hangs: a launch or driver error while enqueueing, or a
/// failed wait, abandons the rest of the batch, fails the signals it would
/// have set, and is reported by the next `submit` or `synchronize`; batches
/// submitted before the owner was told are not run either. A kernel that
/// faults on the GPU shows up later, to waiters of its signals as
/// [`Error::SignalFailed`] and to the owner at `synchronize`. Such faults
/// (an illegal address, a failed launch) are sticky in CUDA: the context is
/// unusable for the rest of the process, so they are
/// [`Error::DeviceLost`], and every later `submit` with an `exec` on the
/// device, every `alloc`, the registry and [`CudaDevice::open`] answer the
/// same. An abandoned
/// batch (rejected, discarded, dropped) fails its signals when enqueueing
/// reaches it: values that earlier batches already recorded are decided by
/// their events, not by that failure.
///
/// Buffers and programs of submitted work are kept alive until the stream
/// passed them. Dropping the queue lets the worker finish the work already
/// submitted.
pub struct CudaEngine {
    kind: QueueKind,
    device: CudaDevice,
    limits: Limits,
    shared: Arc<Shared>,
}

/// How far a batch got on the stream.
enum Outcome {
    /// Every command is on the stream.
    Done,
    /// Commands before this index are on the stream; this one waits for
    /// something the host must see first.
    Blocked(usize),
    /// Commands before this index are on the stream; this one failed.
    Failed(usize, Error),
}

/// What the owner and the worker share.
struct Shared {
    stream: std::sync::Arc<CudaStream>,
    /// For its staging cache and allocation fence.
    device: CudaDevice,
    /// The allocation fence's generation this stream last waited for.
    fence_seen: AtomicU64,
    ledger: Ledger,
    state: Mutex<State>,
    /// The worker parks here for batches.
    work: Condvar,
    /// `synchronize` parks here for the worker to catch up.
    idle: Condvar,
    /// Lock order: `state`, then `in_flight`; never the reverse.
    in_flight: Mutex<InFlight>,
    /// The timing state while profiling is on (`crate::profile`). Taken
    /// alone, never while holding `state` or `in_flight`.
    profiler: Mutex<Option<Profiler>>,
    profiling: AtomicBool,
    /// The staging of the batch being enqueued (one at a time, in queue
    /// order), moved into `in_flight` with it by `finish`. Taken alone.
    staging: Mutex<Vec<Pinned>>,
}

#[derive(Default)]
struct State {
    /// Batches for the worker, and the command each resumes at.
    pending: VecDeque<(Batch<Cuda>, usize)>,
    /// The worker has batches, so later ones must go through it too (to
    /// stay in order). Set by the owner when it hands one over, cleared by
    /// the worker once `pending` is empty.
    worker_busy: bool,
    /// The owner dropped the queue: the worker exits once `pending` is empty.
    closed: bool,
    sync_waiters: usize,
}

/// Enqueued batches, kept (with their buffers and programs) until the
/// stream passed the event recorded after them.
#[derive(Default)]
struct InFlight {
    /// Each with the page-locked staging of its transfers.
    batches: VecDeque<(CudaEvent, Batch<Cuda>, Vec<Pinned>)>,
    spare_events: Vec<CudaEvent>,
    spare_batches: Vec<Batch<Cuda>>,
}

/// How many finished batches and completion events to keep for reuse.
const SPARE_BATCHES: usize = 4;
const SPARE_EVENTS: usize = 16;

impl CudaEngine {
    pub(crate) fn new(device: &CudaDevice, kind: QueueKind) -> Result<Self> {
        let stream = device
            .context()
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let shared = Arc::new(Shared {
            stream,
            device: device.clone(),
            fence_seen: AtomicU64::new(0),
            ledger: Ledger::new(),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            in_flight: Mutex::new(InFlight::default()),
            profiler: Mutex::new(None),
            profiling: AtomicBool::new(false),
            staging: Mutex::new(Vec::new()),
        });
        let worker = shared.clone();
        spawn(
            format!("hwqueue-cuda{}-{kind}", device.ordinal()),
            move || run_worker(&worker),
        )
        .map_err(|e| Error::System {
            what: "spawning a CUDA queue's worker thread",
            detail: e.to_string(),
        })?;
        Ok(Self {
            kind,
            device: device.clone(),
            limits: device.limits(),
            shared,
        })
    }

    /// The CUDA stream this queue enqueues on (`queue.engine().stream()`).
    pub fn stream(&self) -> &std::sync::Arc<CudaStream> {
        &self.shared.stream
    }

    /// The device this queue runs on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    fn wrong_device(&self, what: &str, other: &CudaDevice) -> Error {
        Error::DeviceMismatch {
            what: what.to_owned(),
            resource: other.spec().to_string(),
            queue: self.device.spec().to_string(),
        }
    }
}

impl Engine for CudaEngine {
    type Backend = Cuda;

    fn kind(&self) -> QueueKind {
        self.kind
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn ledger(&self) -> &Ledger {
        &self.shared.ledger
    }

    fn check_exec(
        &self,
        program: &CudaProgram,
        buffers: &[View<Cuda>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        if let Some(lost) = lost(self.device.ordinal()) {
            return Err(lost);
        }
        let parameter_bytes = (buffers.len() + scalars.len()) * 8;
        if parameter_bytes > PARAMETER_BYTES {
            return Err(Error::InvalidArguments {
                program: program.name().to_owned(),
                reason: format!(
                    "its {parameter_bytes} bytes of parameters exceed CUDA's {PARAMETER_BYTES}; \
                     pass fewer scalars, or put them in a buffer"
                ),
            });
        }
        if !program.device().same_as(&self.device) {
            return Err(self.wrong_device("the program", program.device()));
        }
        if let Some((index, view)) = buffers
            .iter()
            .enumerate()
            .find(|(_, view)| !view.buffer().device().same_as(&self.device))
        {
            return Err(
                self.wrong_device(&format!("buffer {index} of exec"), view.buffer().device())
            );
        }
        launch::check_exec(
            program.name(),
            program.facts(),
            self.limits.max_shared_memory,
            buffers.len(),
            scalars,
            params,
        )
    }

    /// Memory from the device's `CUmemoryPool`, allocated on this queue's
    /// stream now (`cuMemAllocFromPoolAsync`): ahead of the batch in stream
    /// order, which no earlier batch can notice (none names the buffer), so
    /// the `Alloca` command has nothing left to enqueue.
    fn alloca(&mut self, size: usize) -> Result<CudaBuffer> {
        CudaBuffer::alloca(&self.device, &self.shared.stream, size)
    }

    fn check_dealloca(&self, buffer: &CudaBuffer) -> Result<()> {
        if buffer.device().same_as(&self.device) {
            Ok(())
        } else {
            Err(Error::InvalidDealloca {
                reason: format!(
                    "the buffer is {}'s memory and this queue runs on {}; record the \
                     `dealloca` on a queue of the buffer's device",
                    buffer.device().spec(),
                    self.device.spec()
                ),
            })
        }
    }

    fn check_buffer(&self, what: &'static str, buffer: &CudaBuffer) -> Result<()> {
        if buffer.device().same_as(&self.device) {
            Ok(())
        } else {
            Err(self.wrong_device(what, buffer.device()))
        }
    }

    fn submit(&mut self, batch: Batch<Cuda>) -> Batch<Cuda> {
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        if state.worker_busy {
            // Behind a deferred wait: keep the order.
            state.pending.push_back((batch, 0));
            shared.work.notify_one();
        } else {
            drop(state);
            shared.retire();
            shared.process(batch, 0);
        }
        shared
            .in_flight
            .lock()
            .spare_batches
            .pop()
            .unwrap_or_default()
    }

    fn set_profiling(&mut self, on: bool) {
        let shared = &*self.shared;
        if on {
            let mut profiler = shared.profiler.lock();
            if profiler.is_none() {
                let label = queue_label(shared.ledger.id(), self.kind);
                match Profiler::start(&shared.stream, label) {
                    Ok(started) => *profiler = Some(started),
                    // A stream that cannot record an event has failed
                    // already: its work reports that; it just stays
                    // unprofiled.
                    Err(_) => return,
                }
            }
        }
        shared.profiling.store(on, Ordering::Relaxed);
    }

    fn take_profile(&mut self, out: &mut Vec<ProfileEvent>) {
        if let Some(profiler) = self.shared.profiler.lock().as_mut() {
            profiler.take(out);
        }
    }

    fn synchronize(&mut self) {
        let shared = &*self.shared;
        {
            let mut state = shared.state.lock();
            state.sync_waiters += 1;
            while state.worker_busy {
                state = shared.idle.wait(state);
            }
            state.sync_waiters -= 1;
        }
        let synced = shared.stream.synchronize();
        shared.retire();
        if let Err(e) = synced {
            shared
                .ledger
                .fail_unbatched(shared.fault("running the queue's work", e));
        }
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.closed = true;
        self.shared.work.notify_one();
    }
}

impl fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEngine")
            .field("kind", &self.kind)
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Takes `batch` from command `from` on, on the thread that reached it
    /// in queue order (the owner's, or the worker's after a deferred wait):
    /// fails its signals if the ledger says it must not run, else enqueues
    /// what the stream can take now; what follows a wait the stream cannot
    /// express goes to the worker.
    fn process(&self, batch: Batch<Cuda>, from: usize) {
        let Some(batch) = self.admit(batch, from) else {
            return;
        };
        match self.enqueue_caught(&batch, from) {
            Outcome::Done => self.finish(batch),
            Outcome::Blocked(at) => {
                let mut state = self.state.lock();
                state.worker_busy = true;
                state.pending.push_back((batch, at));
                self.work.notify_one();
            }
            // Reported by the next `submit` or `synchronize`, as for work
            // that fails on the GPU.
            Outcome::Failed(at, error) => {
                self.ledger.fail(&batch, at, error);
                self.finish(batch);
            }
        }
    }

    /// `batch`, if the ledger says it runs; else its signals from `from` on
    /// fail, and it is kept for reuse.
    fn admit(&self, batch: Batch<Cuda>, from: usize) -> Option<Batch<Cuda>> {
        match self.ledger.admit(&batch) {
            Admission::Run => Some(batch),
            Admission::Skip(cause) => {
                batch.fail_signals(from, &cause);
                self.recycle(batch, None);
                None
            }
        }
    }

    /// [`enqueue`](Self::enqueue), with a panic (a bug) turned into a
    /// failure of the batch at `from`, so no thread unwinds with a batch
    /// half-enqueued and its signals unset.
    fn enqueue_caught(&self, batch: &Batch<Cuda>, from: usize) -> Outcome {
        catch_unwind(AssertUnwindSafe(|| self.enqueue(batch, from))).unwrap_or_else(|payload| {
            Outcome::Failed(
                from,
                Error::EnginePanicked {
                    message: panic_message(payload),
                },
            )
        })
    }

    /// Puts the commands of `batch` from `from` on the stream, without ever
    /// blocking on the host.
    fn enqueue(&self, batch: &Batch<Cuda>, from: usize) -> Outcome {
        // Once, for every raw driver call below (copies, fills, transfers):
        // this thread (the owner's, or the worker's) may not have the
        // stream's context current.
        if let Err(e) = self.stream.context().bind_to_thread() {
            return Outcome::Failed(from, self.fault("making the queue's context current", e));
        }
        // Memory the pool zeroed since this stream's last batch: its fill
        // comes first.
        if let Err(e) = self.device.fence().order(&self.stream, &self.fence_seen) {
            return Outcome::Failed(from, self.fault("waiting for the allocation fence", e));
        }
        let profiling = self.profiling.load(Ordering::Relaxed);
        for (index, command) in batch.commands().iter().enumerate().skip(from) {
            let start = if profiling {
                Profiler::mark(&self.stream)
            } else {
                None
            };
            let result = match command {
                Command::Wait { signal, value } => match signal.dependency(*value) {
                    Ok(None) => return Outcome::Blocked(index),
                    Ok(Some(Dependency::Reached)) => Ok(()),
                    Ok(Some(Dependency::Event(event))) => self
                        .stream
                        .wait(event.event())
                        .map_err(|e| self.fault("making the stream wait for a signal's event", e)),
                    Err(error) => Err(error),
                },
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
                } => self.launch(
                    program,
                    &batch.buffers()[buffers.clone()],
                    &batch.scalars()[scalars.clone()],
                    params,
                ),
                Command::Copy { dst, src } => dst
                    .buffer()
                    .check_live("the copy's destination")
                    .and_then(|()| src.buffer().check_live("the copy's source"))
                    .and_then(|()| self.copy(dst, src)),
                Command::Fill {
                    dst,
                    pattern,
                    width,
                } => dst
                    .buffer()
                    .check_live("the fill's destination")
                    .and_then(|()| {
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
                    }),
                Command::Upload { dst, data } => {
                    if let Err(error) = dst.buffer().check_live("the upload's destination") {
                        return Outcome::Failed(index, error);
                    }
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
                    if let Err(error) = src.buffer().check_live("the download's source") {
                        return Outcome::Failed(index, error);
                    }
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
                Command::Barrier => Ok(()),
                // Allocated on this stream when it was recorded.
                Command::Alloca { .. } => Ok(()),
                // Freed on this stream after everything enqueued before.
                Command::Dealloca { buffer } => buffer.release_on(&self.stream),
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
        }
        Outcome::Done
    }

    /// Launches `program`: grid = global / local, block = local; parameters
    /// are the buffers' device pointers, then the scalars.
    fn launch(
        &self,
        program: &CudaProgram,
        buffers: &[View<Cuda>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        for (index, view) in buffers.iter().enumerate() {
            view.buffer()
                .check_live(&format!("buffer {index} of `{}`", program.name()))?;
        }
        // Each parameter in an 8-byte, 8-aligned cell: a scalar's bytes
        // start the cell, which is what the driver reads for a 4-byte one.
        // On the stack: `check_exec` bounded the count by CUDA's parameter
        // space when the exec was recorded, so the argument list takes no
        // allocation of hwqueue's (cudarc's launch builder keeps a small
        // `Vec` of argument pointers).
        let mut cells = [0u64; PARAMETER_BYTES / 8];
        let count = buffers.len() + scalars.len();
        let values = buffers.iter().map(pointer).chain(
            scalars
                .iter()
                .map(|scalar| u64::from_ne_bytes(scalar.to_ne_bytes().0)),
        );
        for (cell, value) in cells.iter_mut().zip(values) {
            *cell = value;
        }
        let parameters = cells.get(..count).ok_or_else(|| Error::InvalidArguments {
            program: program.name().to_owned(),
            reason: format!("{count} parameters exceed CUDA's {PARAMETER_BYTES} bytes"),
        })?;
        program.opt_in_shared(params.shared_memory())?;
        let mut launch = self.stream.launch_builder(program.function());
        for parameter in parameters {
            launch.arg(parameter);
        }
        let config = launch::launch_config(params);
        // SAFETY: the parameters are exactly the kernel ABI of `CudaProgram`
        // (one device pointer per buffer, then the scalars), in counts
        // checked against the program at record time; each points at a live
        // 8-byte cell the driver copies before `launch` returns. Every buffer
        // belongs to this stream's device and is kept alive until the stream
        // passed this launch (`InFlight`). What the kernel does with them is
        // the kernel's contract, as with any GPU kernel.
        unsafe { launch.launch(config) }.map(drop).map_err(|e| {
            if launch::is_sticky(e.0) {
                self.fault("launching a kernel", e)
            } else {
                Error::KernelFailed {
                    program: program.name().to_owned(),
                    message: format!("the launch failed: {e}"),
                }
            }
        })
    }

    /// A driver error of this queue's stream, as an [`Error`]: a sticky
    /// one marks the device lost (see `device_error`).
    fn fault(&self, what: &str, error: cudarc::driver::DriverError) -> Error {
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

    /// Keeps `batch` until the stream passed what was enqueued of it.
    fn finish(&self, batch: Batch<Cuda>) {
        let staging = mem::take(&mut *self.staging.lock());
        let mut in_flight = self.in_flight.lock();
        let event = match in_flight.spare_events.pop() {
            Some(event) => Ok(event),
            None => self.stream.context().new_event(Some(EVENT_FLAGS)),
        };
        match event.and_then(|event| event.record(&self.stream).map(|()| event)) {
            Ok(event) => in_flight.batches.push_back((event, batch, staging)),
            Err(_) => {
                // No event to tell when the stream is done with the batch:
                // wait for it here (the stream only holds work that
                // completes on its own). An error is the stream's, and is
                // reported by `synchronize`.
                drop(in_flight);
                let _ = self.stream.synchronize();
                drop(staging);
                self.recycle(batch, None);
            }
        }
    }

    /// Drops the buffers and programs of batches the stream has passed.
    fn retire(&self) {
        let mut in_flight = self.in_flight.lock();
        loop {
            // A query error means the context faulted: the stream will not
            // use the batch again either.
            let passed = in_flight
                .batches
                .front()
                .is_some_and(|(event, ..)| !matches!(event.try_is_complete(), Ok(false)));
            if !passed {
                break;
            }
            if let Some((event, batch, staging)) = in_flight.batches.pop_front() {
                drop(staging);
                in_flight.keep(batch, Some(event));
            }
        }
    }

    fn recycle(&self, batch: Batch<Cuda>, event: Option<CudaEvent>) {
        self.in_flight.lock().keep(batch, event);
    }

    /// After the owner dropped the queue and the worker drained it: wait for
    /// the stream, then release everything.
    fn shut_down(&self) {
        let _ = self.stream.synchronize();
        let mut in_flight = self.in_flight.lock();
        let batches = mem::take(&mut in_flight.batches);
        in_flight.spare_events.clear();
        in_flight.spare_batches.clear();
        drop(in_flight);
        drop(batches);
    }
}

impl InFlight {
    /// Clears a finished batch and keeps it, and its event, for reuse.
    fn keep(&mut self, mut batch: Batch<Cuda>, event: Option<CudaEvent>) {
        batch.clear();
        if self.spare_batches.len() < SPARE_BATCHES {
            self.spare_batches.push(batch);
        }
        if let Some(event) = event
            && self.spare_events.len() < SPARE_EVENTS
        {
            self.spare_events.push(event);
        }
    }
}

/// The worker: enqueues handed-over batches in order, blocking on the host
/// for the waits that stopped them, until the queue is dropped and drained.
fn run_worker(shared: &Shared) {
    loop {
        let (batch, mut from) = {
            let mut state = shared.state.lock();
            loop {
                if let Some(next) = state.pending.pop_front() {
                    break next;
                }
                state.worker_busy = false;
                if state.sync_waiters > 0 {
                    shared.idle.notify_all();
                }
                if state.closed {
                    drop(state);
                    shared.shut_down();
                    shared.ledger.retire();
                    return;
                }
                state = shared.work.wait(state);
            }
        };
        // A batch handed over part-enqueued (`from > 0`) was admitted when
        // its first command went on the stream: it must finish, so the
        // buffers it already uses stay alive until the stream passes it.
        let batch = if from == 0 {
            match shared.admit(batch, 0) {
                Some(batch) => batch,
                None => continue,
            }
        } else {
            batch
        };
        let outcome = loop {
            match shared.enqueue_caught(&batch, from) {
                Outcome::Blocked(at) => {
                    let command = &batch.commands()[at];
                    let start = now_ns();
                    let blocked = block_on(command);
                    if shared.profiling.load(Ordering::Relaxed)
                        && let Some(profiler) = shared.profiler.lock().as_mut()
                    {
                        profiler.push_host(command, batch.sequence(), at, start);
                    }
                    match blocked {
                        // The value is recorded, reached, or the foreign
                        // signal is reached: the command now enqueues.
                        Ok(()) => from = at,
                        Err(error) => break Outcome::Failed(at, error),
                    }
                }
                other => break other,
            }
        };
        if let Outcome::Failed(at, error) = outcome {
            shared.ledger.fail(&batch, at, error);
        }
        shared.finish(batch);
        shared.retire();
    }
}

/// Blocks on the host until the wait `command` can be enqueued.
fn block_on(command: &Command<Cuda>) -> Result<()> {
    match command {
        Command::Wait { signal, value } => signal.wait_dependency(*value).map(drop),
        Command::WaitForeign { signal, value } => signal.wait_forever(*value),
        _ => Ok(()),
    }
}
