//! `CpuEngine`: the CPU backend's engine: batches run in order by a worker
//! thread the queue owns.

use std::collections::VecDeque;
use std::fmt;
use std::mem;
use std::ops::Range;
use std::sync::OnceLock;

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::memory::MemoryPool;
use crate::params::{ExecParams, Limits};
use crate::profile::{BatchClock, Category, EventNames, Name, ProfileEvent, describe, move_events};
use crate::program::{Program, Scalar};
use crate::queue::{Batch, Command, Engine, Ledger, Queue, QueueId, QueueKind, queue_label};
use crate::signal::{TimelineSignal, Timeout};
use crate::sync::{
    Arc, AtomicBool, AtomicUsize, Condvar, JoinHandle, Mutex, Ordering, RwLockWriteGuard, SpinWait,
    fence, spawn_joinable,
};
use crate::view::View;

use super::buffer::Backing;
use super::device::CpuDevice;
use super::memory::HostBlocks;
use super::pool::{Grid, Pool};
use super::program::{BufferView, KernelArgs};
use super::{Cpu, CpuBuffer, CpuProgram};

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
    /// The queue as profile events name it: interned when profiling is
    /// first turned on.
    label: OnceLock<Name>,
    id: QueueId,
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
            id: ledger.id(),
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
        if batch.abandoned().is_some() && state.in_flight == 0 {
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
        if on {
            let shared = &self.shared;
            shared
                .label
                .get_or_init(|| Name::from(queue_label(shared.id, shared.kind)));
        }
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

/// The worker: runs batches in order until the queue is dropped and drained.
fn run_worker(shared: &Shared) {
    let mut scratch = ExecScratch::default();
    let mut names = EventNames::new();
    let mut ticks = Vec::new();
    // Held at the top of each round: finishing one batch and taking the next
    // is one critical section.
    let mut state = shared.state.lock();
    loop {
        let mut spin = Some(SpinWait::yielding());
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
        shared.ledger.settle(&batch, |batch| {
            run_batch(batch, &shared.pool, &mut scratch, profile.as_mut())
        });
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
        batch.clear();
        state = shared.state.lock();
        state.in_flight -= 1;
        if state.spare.len() < SPARE_BATCHES {
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

/// Runs a batch; on failure, the index of the failed command and why.
fn run_batch(
    batch: &Batch<Cpu>,
    pool: &Pool,
    scratch: &mut ExecScratch,
    profile: Option<&mut BatchProfile<'_>>,
) -> std::result::Result<(), (usize, Error)> {
    let mut held = HeldBuffers::new(scratch);
    let outcome = run_commands(batch, pool, &mut held, profile);
    held.finish(scratch);
    outcome
}

/// The timing of one batch, while it runs: one tick per command, and why
/// the last one failed, if it did. The events are made once the batch
/// settled ([`finish`](Self::finish)), so that a host waiting on the
/// batch's signal is not also waiting on them.
struct BatchProfile<'t> {
    clock: BatchClock,
    /// When the batch started, then when each command ended (the next
    /// one's start: commands run back to back on the worker), in the
    /// clock's ticks. The worker's, reused across batches.
    ticks: &'t mut Vec<u64>,
    failure: Option<String>,
}

impl<'t> BatchProfile<'t> {
    fn new(batch: &Batch<Cpu>, ticks: &'t mut Vec<u64>) -> Self {
        let clock = BatchClock::start();
        ticks.clear();
        ticks.reserve(batch.commands().len() + 1);
        ticks.push(clock.tick());
        Self {
            clock,
            ticks,
            failure: None,
        }
    }

    /// The next command ended with `result`.
    fn record(&mut self, result: &Result<()>) {
        // In order even if the worker moved to a core whose counter lags.
        let last = self.ticks.last().copied().unwrap_or(0);
        self.ticks.push(self.clock.tick().max(last));
        if let Err(error) = result {
            self.failure = Some(error.to_string());
        }
    }

    /// The events of the commands of `batch` that ran (all but those after
    /// a failure), timed on the host timeline.
    fn finish(
        self,
        shared: &Shared,
        batch: &Batch<Cpu>,
        names: &mut EventNames,
    ) -> Vec<ProfileEvent> {
        let map = self.clock.finish();
        let queue = shared
            .label
            .get_or_init(|| Name::from(queue_label(shared.id, shared.kind)));
        let (ran, sequence) = (self.ticks.len() - 1, batch.sequence());
        let mut events = Vec::with_capacity(ran);
        // The last kernel's name and where its program keeps it: while the
        // batch holds its programs, the same address is the same name, so a
        // run of one kernel's `exec`s looks its name up once.
        let mut kernel: Option<(*const u8, Name)> = None;
        let mut start = map.ns(self.ticks[0]);
        let commands = batch.commands().iter().zip(&self.ticks[1..]);
        for (index, (command, &tick)) in commands.enumerate() {
            let end = map.ns(tick);
            let failed = index + 1 == ran && self.failure.is_some();
            let event = match command {
                Command::Exec {
                    program, params, ..
                } if !failed => {
                    let name = program.name();
                    let name = match &kernel {
                        Some((at, interned))
                            if *at == name.as_ptr() && interned.len() == name.len() =>
                        {
                            interned.clone()
                        }
                        _ => kernel.insert((name.as_ptr(), names.get(name))).1.clone(),
                    };
                    ProfileEvent {
                        name,
                        category: Category::Kernel,
                        queue: queue.clone(),
                        batch: sequence,
                        index,
                        start_ns: start,
                        end_ns: end,
                        detail: String::new(),
                        params: Some(*params),
                    }
                }
                _ => {
                    let mut described = describe(command, names);
                    if let Some(failure) = self.failure.as_ref().filter(|_| failed) {
                        described.detail = format!("{}; failed: {failure}", described.detail);
                    }
                    described.into_event(queue.clone(), sequence, index, start, end)
                }
            };
            events.push(event);
            start = end;
        }
        events
    }
}

fn run_commands<'a>(
    batch: &'a Batch<Cpu>,
    pool: &Pool,
    held: &mut HeldBuffers<'a>,
    mut profile: Option<&mut BatchProfile<'_>>,
) -> std::result::Result<(), (usize, Error)> {
    for (index, command) in batch.commands().iter().enumerate() {
        if !matches!(command, Command::Exec { .. }) {
            // Buffers stay held only from one `exec` to the next.
            held.release();
        }
        let result = match command {
            Command::Wait { signal, value } => signal.wait(*value, Timeout::Forever),
            Command::WaitForeign { signal, value } => signal.wait_forever(*value),
            Command::Signal { signal, value } => {
                signal.set(*value);
                Ok(())
            }
            Command::Exec {
                program,
                buffers,
                scalars,
                params,
            } => run_exec(
                program,
                batch.buffers(),
                buffers.clone(),
                &batch.scalars()[scalars.clone()],
                params,
                pool,
                held,
            ),
            Command::Copy { dst, src } => run_copy(dst, src),
            Command::Fill {
                dst,
                pattern,
                width,
            } => run_fill(dst, &pattern[..usize::from(*width)]),
            // Host accesses at the views (lengths checked at record time):
            // the buffer's lock orders them with kernels of other queues.
            Command::Upload { dst, data } => dst.write_from(batch.host_bytes(data)),
            Command::Download { src, sink } => sink.complete(|out| src.read_into(out)),
            Command::Barrier => {
                fence(Ordering::SeqCst);
                Ok(())
            }
            // The range was taken when the `alloca` was recorded.
            Command::Alloca { .. } => Ok(()),
            // Every earlier command of this queue ran: the range goes back
            // (after whatever kernel of another queue holds it now).
            Command::Dealloca { buffer } => {
                buffer.release();
                Ok(())
            }
        };
        if let Some(profile) = profile.as_deref_mut() {
            profile.record(&result);
        }
        result.map_err(|error| (index, error))?;
    }
    Ok(())
}

fn run_copy(dst: &View<Cpu>, src: &View<Cpu>) -> Result<()> {
    let (dst_buffer, src_buffer) = (dst.buffer(), src.buffer());
    let copy = || {
        // SAFETY: both views lie in their buffers (checked when made), are
        // of equal length (checked at record time), and do not overlap
        // (checked at record time when of one buffer; distinct allocations
        // otherwise); the caller holds both buffers exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src_buffer.as_ptr().add(src.offset()),
                dst_buffer.as_ptr().add(dst.offset()),
                src.len(),
            );
        }
    };
    if dst_buffer.same_as(src_buffer) {
        let held = dst_buffer.lock_exclusive();
        held.check(|| "the copy's buffer".into())?;
        copy();
        return Ok(());
    }
    // Lock in address order, as `run_exec` does, so two queues never wait
    // on each other's buffers in a cycle.
    let (first, second) = if dst_buffer.address() < src_buffer.address() {
        (dst_buffer, src_buffer)
    } else {
        (src_buffer, dst_buffer)
    };
    let a = first.lock_exclusive();
    let b = second.lock_exclusive();
    a.check(|| "a buffer of the copy".into())?;
    b.check(|| "a buffer of the copy".into())?;
    copy();
    Ok(())
}

/// Fills `dst` with `pattern` (1, 2 or 4 bytes; `dst`'s offset and length
/// are multiples of its width, checked at record time).
fn run_fill(dst: &View<Cpu>, pattern: &[u8]) -> Result<()> {
    let buffer = dst.buffer();
    let held = buffer.lock_exclusive();
    held.check(|| "the fill destination".into())?;
    // SAFETY: the view lies in the buffer (checked when made), which is
    // held exclusively, so these bytes are valid and nobody else's now.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr().add(dst.offset()), dst.len()) };
    fill_pattern(bytes, pattern);
    Ok(())
}

/// Writes `pattern` over `bytes`, as wide stores where aligned.
fn fill_pattern(bytes: &mut [u8], pattern: &[u8]) {
    match *pattern {
        [byte] => bytes.fill(byte),
        [a, b] => match bytemuck::try_cast_slice_mut::<u8, u16>(bytes) {
            Ok(words) => words.fill(u16::from_ne_bytes([a, b])),
            Err(_) => bytes
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(pattern)),
        },
        [a, b, c, d] => match bytemuck::try_cast_slice_mut::<u8, u32>(bytes) {
            Ok(words) => words.fill(u32::from_ne_bytes([a, b, c, d])),
            Err(_) => bytes
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(pattern)),
        },
        _ => unreachable!("the core accepts 1-, 2- and 4-byte patterns only"),
    }
}

/// Memory every `exec` of a worker reuses, so that running one allocates
/// nothing once the vectors have grown. Kept empty between batches.
#[derive(Default)]
struct ExecScratch {
    /// Indices into the `exec`'s buffers, in lock order.
    order: Vec<usize>,
    /// Room for the buffer guards.
    guards: Vec<RwLockWriteGuard<'static, Backing>>,
    /// Room for the kernel's views.
    views: Vec<BufferView<'static>>,
}

/// The buffers of the last `exec` of a batch, held exclusively with their
/// views, while the next command is an `exec` of the same buffers: a run of
/// `exec`s on one set of buffers takes the locks once. Released before any
/// other command (a `wait` must never hold a buffer the host may need to
/// read before it signals) and at the end of the batch.
struct HeldBuffers<'a> {
    /// The range of `Batch::buffers` held, if any.
    range: Option<Range<usize>>,
    order: Vec<usize>,
    guards: Vec<RwLockWriteGuard<'a, Backing>>,
    views: Vec<BufferView<'a>>,
}

impl<'a> HeldBuffers<'a> {
    fn new(scratch: &mut ExecScratch) -> Self {
        Self {
            range: None,
            order: mem::take(&mut scratch.order),
            guards: recycle(mem::take(&mut scratch.guards)),
            views: recycle(mem::take(&mut scratch.views)),
        }
    }

    /// Holds `buffers[range]` exclusively, in address order, with views;
    /// refuses a buffer whose range a `dealloca` gave back.
    fn hold(&mut self, buffers: &'a [View<Cpu>], range: Range<usize>) -> Result<()> {
        if self.range.as_ref() == Some(&range) {
            return Ok(());
        }
        self.release();
        let buffers = &buffers[range.clone()];
        let order = &mut self.order;
        order.clear();
        order.extend(0..buffers.len());
        order.sort_unstable_by_key(|&i| buffers[i].buffer().address());
        order.dedup_by_key(|i| buffers[*i].buffer().address());
        self.guards
            .extend(order.iter().map(|&i| buffers[i].buffer().lock_exclusive()));
        let checked = self
            .guards
            .iter()
            .zip(order.iter())
            .try_for_each(|(guard, &index)| guard.check(|| format!("buffer {index} of the exec")));
        if let Err(error) = checked {
            self.release();
            return Err(error);
        }
        self.views.extend(
            buffers
                .iter()
                // SAFETY: each view lies in its buffer (checked when made),
                // whose memory is valid, initialised bytes, held exclusively
                // by `self.guards` until `release`, which clears these views
                // first.
                .map(|v| unsafe { BufferView::new(v.buffer().as_ptr().add(v.offset()), v.len()) }),
        );
        self.range = Some(range);
        Ok(())
    }

    /// Drops the views, then the guards.
    fn release(&mut self) {
        self.views.clear();
        self.guards.clear();
        self.range = None;
    }

    /// Releases everything and gives the memory back to `scratch`.
    fn finish(mut self, scratch: &mut ExecScratch) {
        self.release();
        scratch.order = self.order;
        scratch.views = recycle(self.views);
        scratch.guards = recycle(self.guards);
    }
}

/// An empty vector on `vec`'s memory, for elements that differ from `vec`'s
/// only in a lifetime: the scratch vectors hold `'static` element types
/// between `exec`s and borrowed ones during an `exec`.
#[inline]
fn recycle<T, U>(mut vec: Vec<T>) -> Vec<U> {
    const {
        assert!(size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>());
    }
    vec.clear();
    let mut vec = mem::ManuallyDrop::new(vec);
    // SAFETY: the pointer and capacity come from a `Vec<T>` of the global
    // allocator, and `U` has `T`'s size and alignment (asserted above), so
    // they describe the same allocation as a `Vec<U>`; the length is 0, so
    // no `T` is reinterpreted as a `U`; `ManuallyDrop` keeps the old vector
    // from freeing the memory the new one now owns.
    unsafe { Vec::from_raw_parts(vec.as_mut_ptr().cast::<U>(), 0, vec.capacity()) }
}

fn run_exec<'a>(
    program: &CpuProgram,
    batch_buffers: &'a [View<Cpu>],
    buffers: Range<usize>,
    scalars: &[Scalar],
    params: &ExecParams,
    pool: &Pool,
    held: &mut HeldBuffers<'a>,
) -> Result<()> {
    held.hold(batch_buffers, buffers)?;
    let args = KernelArgs::new(program, &held.views, scalars);
    let grid = Grid {
        groups: params.groups(),
        local: params.local(),
    };
    pool.run(program, &args, grid, params.group_count())
        .map_err(|message| Error::KernelFailed {
            program: program.name().to_owned(),
            message,
        })
}
