//! `CpuEngine`: the CPU backend's engine: batches run in order by a worker
//! thread the queue owns. This file is the engine and its worker (taking
//! batches, spinning and parking, shutdown); `run.rs` runs one batch's
//! commands, `profile.rs` times them when the queue profiles.

mod collective;
mod profile;
mod run;

use std::collections::VecDeque;
use std::fmt;
use std::sync::OnceLock;

use crate::collective::Collective;
use crate::error::{Error, Result};
use crate::memory::MemoryPool;
use crate::params::Limits;
use crate::profile::{EventNames, Name, ProfileEvent, move_events};
use crate::queue::{Batch, Command, Engine, Ledger, Queue, QueueKind, queue_label};
use crate::sync::{
    Arc, AtomicBool, AtomicUsize, Condvar, JoinHandle, Mutex, Ordering, SpinWait, spawn_joinable,
};

use super::device::CpuDevice;
use super::memory::HostBlocks;
use super::pool::Pool;
use super::{Cpu, CpuBuffer};
use profile::BatchProfile;
use run::{ExecScratch, run_batch};

/// A command queue of the CPU backend: the shared recording core
/// ([`Queue`]) over the CPU's [`CpuEngine`].
pub type CpuQueue = Queue<CpuEngine>;

/// How the CPU runs a queue's batches.
///
/// [`submit`](crate::HardwareQueue::submit) moves the batch to a worker
/// thread owned by the queue, which runs batches in submission order:
///
/// - `wait` blocks the worker until the signal is reached (or failed);
/// - `signal` raises the signal after every earlier command completed;
/// - `exec` runs the grid's work-groups on the worker and the device's
///   pool of threads (see the `pool` module: the worker takes part, the
///   device's slots cap the parallelism of all its queues; one work-group
///   runs on the worker alone), holding its buffers exclusively;
/// - `copy` moves whole buffers of equal size;
/// - `memory_barrier` is a `SeqCst` fence: the worker already runs commands
///   in order, and each `exec` waits for every thread of its grid before
///   the next command.
///
/// The worker may spin for a few microseconds after each batch before it
/// parks, so a batch submitted right after the previous one finished is
/// picked up without a wake-up. An `exec` takes its bookkeeping (lock
/// order, guards, buffer views) from scratch memory the worker keeps, so
/// one that runs on the worker alone allocates nothing.
///
/// Dropping the queue finishes the work already submitted (the worker
/// drains it, then exits). No panic on the worker can end it: a kernel's
/// panic fails its batch, and anything else that panics fails the batch it
/// happened in.
pub struct CpuEngine {
    shared: Arc<Shared>,
    worker: Option<JoinHandle>,
    /// The device's memory, for `alloca`.
    memory: MemoryPool<HostBlocks>,
}

/// What the owner and the worker share.
struct Shared {
    kind: QueueKind,
    limits: Limits,
    ledger: Ledger,
    state: Mutex<State>,
    /// The worker parks here for batches.
    work: Condvar,
    /// `synchronize` parks here for `in_flight == 0`.
    idle: Condvar,
    /// The device's threads, on which an `exec` of many groups runs.
    pool: Pool,
    /// `state.pending.len()`, written under `state`'s lock whenever it
    /// changes, and set non-zero when the queue is closed (to end a spin);
    /// read without the lock (`Relaxed`) only by the spinning worker, as a
    /// hint to take the lock. The deque under the lock stays the truth, so a stale read costs
    /// a lock round or a park, never a batch.
    queued: AtomicUsize,
    /// Profiling is on: read by the worker once per batch.
    profiling: AtomicBool,
    /// The profile events of finished batches, for `take_profile`.
    profile: Mutex<Vec<ProfileEvent>>,
    /// The queue as profile events name it ([`label`](Self::label)).
    label: OnceLock<Name>,
}

impl Shared {
    /// The queue as profile events name it: interned by its first profiled
    /// batch, so that a queue that never profiles interns nothing.
    fn label(&self) -> &Name {
        self.label
            .get_or_init(|| Name::from(queue_label(self.ledger.id(), self.kind)))
    }
}

#[derive(Default)]
struct State {
    /// Submitted, not yet started.
    pending: VecDeque<Batch<Cpu>>,
    /// Submitted, not yet finished (pending or running).
    in_flight: usize,
    /// The owner dropped the queue: exit once `pending` is empty.
    closed: bool,
    worker_parked: bool,
    sync_waiters: usize,
    /// Finished batches, cleared, for reuse.
    spare: Vec<Batch<Cpu>>,
}

/// How many finished batches to keep for reuse.
const SPARE_BATCHES: usize = 4;

impl CpuEngine {
    pub(crate) fn new(device: &CpuDevice, kind: QueueKind) -> Result<Self> {
        let ledger = Ledger::new();
        let shared = Arc::new(Shared {
            kind,
            limits: device.limits_ref(),
            label: OnceLock::new(),
            ledger,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            pool: device.pool().clone(),
            queued: AtomicUsize::new(0),
            profiling: AtomicBool::new(false),
            profile: Mutex::new(Vec::new()),
        });
        let worker = shared.clone();
        let worker = spawn_joinable(format!("hwqueue-cpu-{kind}"), move || run_worker(&worker))
            .map_err(|e| Error::System {
                what: "spawning a CPU queue's worker thread",
                detail: e.to_string(),
            })?;
        Ok(Self {
            shared,
            worker: Some(worker),
            memory: device.memory().clone(),
        })
    }
}

impl Engine for CpuEngine {
    type Backend = Cpu;

    /// MPI's communicators move host memory: this queue's worker runs
    /// their collectives (see [`crate::collective`]).
    fn check_collective(&self, communicator: &crate::collective::Communicator) -> Result<()> {
        if communicator.on_host() {
            Ok(())
        } else {
            Err(crate::collective::CollectiveError::unsupported("cpu", communicator).into())
        }
    }

    fn kind(&self) -> QueueKind {
        self.shared.kind
    }

    fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    fn ledger(&self) -> &Ledger {
        &self.shared.ledger
    }

    /// A range of the device's pool, taken now: host memory is valid at
    /// once, so the `Alloca` command has nothing left to do.
    fn alloca(&mut self, size: usize) -> Result<CpuBuffer> {
        CpuBuffer::allocate(&self.memory, size, false, true)
    }

    fn check_dealloca(&self, buffer: &CpuBuffer) -> Result<()> {
        if buffer.is_of(&self.memory) {
            Ok(())
        } else {
            Err(Error::InvalidDealloca {
                reason: "the buffer is of another CPU device's pool; record the `dealloca` on \
                         a queue of the device whose queue made it"
                    .into(),
            })
        }
    }

    fn submit(&mut self, mut batch: Batch<Cpu>) -> Batch<Cpu> {
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        // (One whose collectives took places goes to the worker, which
        // forfeits them: that blocks until the peers reach theirs.)
        if batch.abandoned().is_some() && state.in_flight == 0 && !batch.collectives_numbered() {
            // Nothing earlier can still set a value: fail now. Only the
            // owner submits, so this stays true.
            drop(state);
            shared.ledger.settle(&batch, |_| Ok(()));
            batch.clear();
            return batch;
        }
        // Waking a parked worker for a batch with a multi-group exec: wake
        // the pool's parked helpers alongside (after the lock), so the two
        // wake-ups overlap instead of the helpers' following the worker's.
        let wide = state.worker_parked && has_wide_exec(&batch);
        state.pending.push_back(batch);
        shared.queued.store(state.pending.len(), Ordering::Relaxed);
        state.in_flight += 1;
        if state.worker_parked {
            shared.work.notify_one();
        }
        let spare = state.spare.pop().unwrap_or_default();
        drop(state);
        if wide {
            shared.pool.prepare();
        }
        spare
    }

    fn synchronize(&mut self) {
        let mut state = self.shared.state.lock();
        state.sync_waiters += 1;
        while state.in_flight > 0 {
            state = self.shared.idle.wait(state);
        }
        state.sync_waiters -= 1;
    }

    fn set_profiling(&mut self, on: bool) {
        self.shared.profiling.store(on, Ordering::Relaxed);
    }

    fn take_profile(&mut self, out: &mut Vec<ProfileEvent>) {
        move_events(out, &mut self.shared.profile.lock());
    }
}

impl Drop for CpuEngine {
    fn drop(&mut self) {
        let idle = {
            let mut state = self.shared.state.lock();
            state.closed = true;
            // A spinning worker takes the lock at its next look, finds the
            // queue closed and ends, rather than spin out its budget
            // (~100 µs) while the drop below waits to join it.
            self.shared.queued.store(1, Ordering::Relaxed);
            self.shared.work.notify_one();
            state.in_flight == 0
        };
        if idle {
            // Nothing left to run: the queue is gone now (see `Ledger`),
            // and its worker ends at once, so wait for it: dropping the
            // last queue and its device then leaves no thread behind.
            // With work in flight the worker drains it first, on its own.
            self.shared.ledger.retire();
            if let Some(worker) = self.worker.take() {
                worker.join();
            }
        }
    }
}

impl fmt::Debug for CpuEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuEngine")
            .field("pool", &self.shared.pool)
            .finish_non_exhaustive()
    }
}

/// Forfeits `group`, numbered, which this rank will not run: a collective
/// alone (`collective::forfeit_collective`), or a group of sends and
/// receives (`collective::forfeit_p2p_group`). A panic there (a bug)
/// loses the forfeit, not the worker, nor the batch's outcome.
fn forfeit(group: &[&Collective<Cpu>]) {
    let forfeit = || match group {
        [collective] if collective.op.peer().is_none() => {
            collective::forfeit_collective(collective);
        }
        [first, ..] if first.op.peer().is_some() => collective::forfeit_p2p_group(group),
        _ => {}
    };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(forfeit));
}

/// The worker: runs batches in order until the queue is dropped and drained.
fn run_worker(shared: &Shared) {
    SpinWait::mark_engine_thread();
    let mut scratch = ExecScratch::default();
    let mut names = EventNames::new();
    let mut ticks = Vec::new();
    // Held at the top of each round: finishing one batch and taking the next
    // is one critical section.
    let mut state = shared.state.lock();
    loop {
        let mut spin = Some(SpinWait::new());
        let mut batch = loop {
            if let Some(batch) = state.pending.pop_front() {
                shared.queued.store(state.pending.len(), Ordering::Relaxed);
                break batch;
            }
            if state.closed {
                shared.ledger.retire();
                return;
            }
            // Spin a little before parking, off the lock: a host that submits
            // right after its last batch finished (a wait, then the next
            // step) then costs no wake-up.
            if let Some(spinner) = spin.take().filter(SpinWait::has_budget) {
                drop(state);
                spinner.until(|| shared.queued.load(Ordering::Relaxed) != 0);
                state = shared.state.lock();
                continue;
            }
            state.worker_parked = true;
            state = shared.work.wait(state);
            state.worker_parked = false;
        };
        drop(state);
        // Read once per batch: a batch is timed whole or not at all.
        let mut profile = shared
            .profiling
            .load(Ordering::Relaxed)
            .then(|| BatchProfile::new(&batch, &mut ticks));
        // The numbered collectives this rank will not run (all of a skipped
        // batch's, those after a failed command) are forfeited each at its
        // place among the signals the batch fails and the waits it still
        // honours, as it would have run (`Ledger::settle_with`).
        shared.ledger.settle_with(
            &batch,
            |batch| run_batch(batch, &shared.pool, &mut scratch, profile.as_mut()),
            &mut forfeit,
        );
        if let Some(profile) = profile {
            // Outside `settle`'s catch: a panic making the events (there is
            // nothing but formatting to panic) loses them, not the worker.
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                profile.finish(shared, &batch, &mut names)
            }));
            if let Ok(mut events) = made {
                move_events(&mut shared.profile.lock(), &mut events);
            }
        }
        // Clearing drops what the batch owns of the caller's (an
        // `upload_vec`'s owner), which may panic: the batch is lost, never
        // the worker, whose later batches nobody else would run or fail;
        // the owner is told.
        let what = "a CPU queue's worker, letting a finished batch go";
        let reuse = shared.ledger.letting_go(what, || batch.clear_caught());
        state = shared.state.lock();
        state.in_flight -= 1;
        if reuse && state.spare.len() < SPARE_BATCHES {
            state.spare.push(batch);
        }
        if state.in_flight == 0 && state.sync_waiters > 0 {
            shared.idle.notify_all();
        }
    }
}

/// Whether `batch` holds an `exec` of more than one work-group (one that
/// runs on the pool).
fn has_wide_exec(batch: &Batch<Cpu>) -> bool {
    batch
        .commands()
        .iter()
        .any(|command| matches!(command, Command::Exec { params, .. } if params.group_count() > 1))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
    use crate::sync::SpinWait;
    use crate::{ExecParams, HardwareQueue, QueueFactory};

    static GROUPS: AtomicUsize = AtomicUsize::new(0);
    static ON_HOST_THREADS: AtomicUsize = AtomicUsize::new(0);

    fn record_thread(_: &WorkGroup, _: &KernelArgs<'_>) {
        GROUPS.fetch_add(1, Ordering::Relaxed);
        if !SpinWait::on_engine_thread() {
            ON_HOST_THREADS.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every thread a queue runs commands on (its worker; the pool's
    /// helpers for a wide grid) spins as an engine thread, whatever it
    /// waits for: a `wait` command's signal too, which took the host's
    /// non-yielding spin when the kind of spin was chosen by the call site.
    #[test]
    fn a_queue_runs_its_commands_on_engine_threads_only() {
        let device = CpuDevice::with_threads(2);
        let mut queue = device.compute_queue().unwrap();
        let program = CpuProgram::from_fn("record_thread", 0, 0, record_thread);
        queue
            .exec(&program, &[], &[], ExecParams::new_1d(1, 1))
            .exec(&program, &[], &[], ExecParams::new_1d(256, 1))
            .submit()
            .unwrap();
        queue.synchronize().unwrap();
        assert_eq!(GROUPS.load(Ordering::Relaxed), 257);
        assert_eq!(ON_HOST_THREADS.load(Ordering::Relaxed), 0);
        assert!(
            !SpinWait::on_engine_thread(),
            "the test's own thread is a host's"
        );
    }
}
