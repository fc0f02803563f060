//! `CudaEngine`: the CUDA backend's engine: batches enqueued on a CUDA
//! stream, with host-side waits deferred to a worker thread.

use std::fmt;

use cudarc::driver::CudaStream;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};
use crate::profile::ProfileEvent;
use crate::program::{Program, Scalar};
use crate::queue::{Batch, Command, Engine, Ledger, Queue, QueueKind, queue_label};
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, spawn};

use super::device::PARAMETER_BYTES;
use super::launch;
use super::profiler::Profiler;
use super::repeat::Mark;
use super::stream::{InFlight, Pending, Shared, State};
use super::worker::run_worker;
use super::{Cuda, CudaBuffer, CudaDevice, CudaProgram, driver_error, lost};
use crate::view::View;

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
///   matters. A batch of signals only (`signal` + `submit`), with no batch
///   before it held by the worker, costs an event record per signal and
///   the ring's lock: no completion event, no hand-over, no thread woken;
/// - `wait(s, v)` on a value already recorded is `cuStreamWaitEvent` on the
///   event of the smallest recorded value `>= v` (a device-side wait, also
///   across streams and devices); on a value already reached it is nothing;
/// - `memory_barrier` enqueues nothing: a stream runs its commands in order,
///   each seeing the writes of the ones before, and other queues see them
///   through the events they wait on.
///
/// **Host waits** on a CUDA signal (`wait`, `wait_any`/`wait_all`, a CPU
/// queue's `wait_foreign`) poll its event for a short, adaptive budget
/// before they sleep in the driver, as the device's
/// [`WaitPolicy`](crate::WaitPolicy) says
/// ([`CudaDevice::set_wait_policy`]): waking a thread asleep on a
/// blocking-sync event costs tens of microseconds.
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
/// have set, and is reported by a later `submit` or `synchronize` (the
/// next, where the stream held no work before the failure and the queue's
/// failures are not its batches' own; else the worker fails the signals,
/// once that work completed, and reports it then); batches submitted before
/// the owner was told are not run either. A batch refused at `submit`, or
/// skipped after a failure, fails its signals after the work before it too. A kernel that
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
/// **Replay.** A batch marked for replay
/// ([`replay_as`](crate::HardwareQueue::replay_as): a plan's run) launches
/// each run of two or more kernels in it (with only barriers and signals
/// between them) as a CUDA graph, built and instantiated on first sight and
/// launched again for every later batch under the key whose kernels, grids
/// and parameter counts match; a changed buffer address or scalar patches
/// that kernel's node (`cuGraphExecKernelNodeSetParams`). The stretch's
/// signals are recorded after the graph's launch, each signal once at its
/// highest value; everything else goes on the stream as above. A graph the
/// driver refuses to build or patch launches kernel by kernel, the reason
/// in [`launches`](crate::HardwareQueue::launches); so does a profiling
/// queue. Once a batch under a key is on the stream with every run of
/// kernels a graph, [`replay_recorded`](crate::HardwareQueue::replay_recorded)
/// offers its graphs to the next batch, which names them with
/// [`replay_program`](crate::HardwareQueue::replay_program) instead of
/// recording their kernels (a plan's run whose bindings did not change):
/// one `cuGraphLaunch` each, nothing matched, and, for a batch of only
/// such launches, waits and signals, no completion event. The queue keeps the last such batch's buffers per key until a
/// later batch under it replaces it.
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

impl CudaEngine {
    pub(crate) fn new(device: &CudaDevice, kind: QueueKind) -> Result<Self> {
        let stream = device
            .context()
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let shared = Arc::new(Shared {
            stream,
            entries: super::entry::entries()?,
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
            replay_key: AtomicU64::new(0),
            replays: Mutex::new(Default::default()),
            kernels: AtomicU64::new(0),
            programs: AtomicU64::new(0),
            repeats: AtomicU64::new(0),
            patched: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            unsettled_batches: AtomicUsize::new(0),
            #[cfg(feature = "nccl")]
            behind: crate::collective::StreamWatch::default(),
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

    /// How many NCCL groups this queue's stream's watch holds (see
    /// `collective::nccl_behind`): those not seen complete when its last
    /// batch was enqueued, the groups that batch launched, and any
    /// abandoned one kept for batches still to fail. For tests and
    /// diagnostics; not part of the API.
    #[cfg(feature = "nccl")]
    #[doc(hidden)]
    pub fn nccl_groups_followed(&self) -> usize {
        self.shared.behind.followed()
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

    /// A range of the device's pool, taken now: its block is a
    /// `cuMemAlloc`, valid for every stream, and a range a `dealloca` gave
    /// back is handed out again only once every batch that used it
    /// completed on the device (see [`QueueOrdered`](crate::memory::QueueOrdered)),
    /// so the `Alloca` command has nothing left to enqueue.
    fn alloca(&mut self, size: usize) -> Result<CudaBuffer> {
        self.device.health()?;
        CudaBuffer::new(&self.device, size, false, true)
    }

    fn check_dealloca(&self, buffer: &CudaBuffer) -> Result<()> {
        self.check_buffer("the buffer", buffer)
            .map_err(|_| Error::InvalidDealloca {
                reason: format!(
                    "the buffer is {}'s memory and this queue runs on {}; record the \
                     `dealloca` on a queue of the buffer's device",
                    buffer.device().spec(),
                    self.device.spec()
                ),
            })
    }

    /// NCCL's communicators of this queue's device: the stream runs their
    /// collectives (see [`crate::collective`]). MPI's move host memory,
    /// and are refused, as are NCCL's of another device.
    fn check_collective(&self, communicator: &crate::collective::Communicator) -> Result<()> {
        #[cfg(feature = "nccl")]
        if let Some(device) = communicator.nccl_device() {
            return match device.same_as(&self.device) {
                true => Ok(()),
                false => Err(self.wrong_device("the NCCL communicator", device)),
            };
        }
        Err(crate::collective::CollectiveError::unsupported("cuda", communicator).into())
    }

    fn check_buffer(&self, what: &'static str, buffer: &CudaBuffer) -> Result<()> {
        if buffer.device().same_as(&self.device) {
            Ok(())
        } else {
            Err(self.wrong_device(what, buffer.device()))
        }
    }

    /// A batch of signals only (a queue's `signal` + `submit`) with no
    /// batch at the worker before it: its events are recorded right here
    /// (`Shared::signal_only`).
    fn submit_in_place(&mut self, batch: &mut Batch<Cuda>) -> bool {
        let shared = &*self.shared;
        if shared.busy.load(Ordering::Acquire) {
            return false;
        }
        // Behind an NCCL group in flight, a batch goes the whole way, so
        // that the group's abort can fail it (`collective::StreamWatch`).
        // Read after `busy` (`Acquire`): a group the worker put on the
        // stream happens-before the worker let go of it.
        #[cfg(feature = "nccl")]
        if shared.behind.watching() {
            return false;
        }
        if !batch
            .commands()
            .iter()
            .all(|command| matches!(command, Command::Signal { .. }))
        {
            return false;
        }
        // Nothing to record or repeat: the key's template stays. (Read
        // first: a swap is a locked instruction, and a key is rare.)
        if shared.replay_key.load(Ordering::Relaxed) != 0
            && shared.replay_key.swap(0, Ordering::Relaxed) != 0
        {
            shared.replays.lock().next = None;
        }
        shared.signal_only(batch);
        true
    }

    fn submit(&mut self, batch: Batch<Cuda>) -> Batch<Cuda> {
        let shared = &*self.shared;
        let key = shared.replay_key.swap(0, Ordering::Relaxed);
        let mark = match key {
            0 => Mark::Plain,
            key => shared.mark(u32::try_from(key - 1).unwrap_or(u32::MAX), &batch),
        };
        let mut state = shared.state.lock();
        let back = if state.worker_busy {
            // Behind a deferred wait: keep the order.
            state.pending.push_back(Pending {
                batch,
                from: 0,
                failed: None,
                mark,
            });
            shared.work.notify_one();
            None
        } else {
            drop(state);
            shared.retire();
            shared.process(batch, 0, mark)
        };
        // The stream holds nothing of it (a plan's repeat, signals and
        // waits only, a batch that did not run): the next batch records
        // into it (the queue clears what `submit` hands back).
        back.unwrap_or_else(|| (shared.in_flight.lock().spare_batches.pop()).unwrap_or_default())
    }

    /// Kept for the next `submit`, whose batch's runs of kernels become
    /// CUDA graphs (see `super::replay`).
    fn replay_next(&mut self, key: Option<u32>) {
        let shared = &*self.shared;
        match key {
            Some(key) => shared
                .replay_key
                .store(u64::from(key) + 1, Ordering::Relaxed),
            // No batch follows to repeat the graphs `replay_recorded` kept.
            None => {
                if shared.replay_key.swap(0, Ordering::Relaxed) != 0 {
                    shared.replays.lock().next = None;
                }
            }
        }
    }

    /// The graphs of `key`'s last batch, kept for the next one where they
    /// run `kernels` (see `super::replay`).
    fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
        let shared = &*self.shared;
        if !shared.recorded(key, kernels) {
            return false;
        }
        shared
            .replay_key
            .store(u64::from(key) + 1, Ordering::Relaxed);
        true
    }

    fn check_replay(&self, index: u32) -> Result<()> {
        let recorded = self.shared.kept();
        if index < recorded {
            Ok(())
        } else {
            Err(Error::ReplayNotRecorded { index, recorded })
        }
    }

    fn launches(&self) -> crate::Launches {
        let shared = &*self.shared;
        crate::Launches {
            kernels: shared.kernels.load(Ordering::Relaxed),
            programs: shared.programs.load(Ordering::Relaxed),
            repeats: shared.repeats.load(Ordering::Relaxed),
            patched: shared.patched.load(Ordering::Relaxed),
            fallback: shared.replays.lock().fallback.clone(),
        }
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
        // The fault is made (a sticky one marks the device lost) before
        // `retire` gives staging back (see `Shared::finish`). Once
        // the wait succeeded, the stream passed every batch in flight
        // before it, even one whose event's query fails.
        let (before, synced) = shared.wait_for_the_stream("running the queue's work");
        let synced = synced.map_err(|(_, error)| error);
        shared.retire_waited(if synced.is_ok() { before } else { 0 });
        if let Err(error) = synced {
            shared.ledger.fail_unbatched(error);
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

/// Puts the run of collectives that starts at `commands[start]` on
/// `stream`, grouped and watched (see [`crate::collective`]'s NCCL
/// section; `ledger`, the queue's, is told of a timeout): where the run
/// ends, or the failing command's index and error. Without the `nccl`
/// feature no communicator passes `check_collective`, and one that
/// reached the stream would fail here.
pub(super) fn enqueue_collectives(
    batch: &Batch<Cuda>,
    start: usize,
    shared: &Shared,
) -> std::result::Result<usize, (usize, Error)> {
    #[cfg(feature = "nccl")]
    return crate::collective::enqueue_nccl_run(
        batch.commands(),
        start,
        &shared.stream,
        (&shared.ledger, batch.epoch()),
        &shared.behind,
    );
    #[cfg(not(feature = "nccl"))]
    {
        let _ = shared;
        match &batch.commands()[start] {
            Command::Collective(collective) => Err((
                start,
                crate::collective::CollectiveError::unsupported("cuda", &collective.communicator)
                    .into(),
            )),
            _ => Ok(start + 1),
        }
    }
}
