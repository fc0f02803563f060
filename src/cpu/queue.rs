//! `CpuQueue`: batches recorded on the caller's thread, run in order by a
//! worker thread the queue owns.

use std::collections::VecDeque;
use std::fmt;
use std::mem;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::backend::Backend;
use crate::buffer::Buffer;
use crate::error::{Error, Result, panic_message};
use crate::params::{ExecParams, Limits};
use crate::program::{Program, Scalar};
use crate::queue::{HardwareQueue, QueueKind, report_failure};
use crate::signal::{TimelineSignal, Timeout, check_value};
use crate::sync::{
    Arc, AtomicUsize, Condvar, Mutex, Ordering, RwLockWriteGuard, SpinWait, fence, spawn,
};

use super::device::CpuDevice;
use super::program::{BufferView, KernelArgs, WorkGroup};
use super::{Cpu, CpuBuffer, CpuProgram, CpuSignal};

/// A command queue of the CPU backend.
///
/// Recording happens on the caller's thread; [`submit`](HardwareQueue::submit)
/// moves the batch to a worker thread owned by the queue, which runs batches
/// in submission order:
///
/// - `wait` blocks the worker until the signal is reached (or failed);
/// - `signal` raises the signal after every earlier command completed;
/// - `exec` runs the grid's work-groups in parallel on the device's cores
///   (one work-group runs inline on the worker), holding its buffers
///   exclusively;
/// - `copy` moves whole buffers of equal size;
/// - `memory_barrier` is a `SeqCst` fence: the worker already runs commands
///   in order, and each `exec` joins its threads before the next command.
///
/// The worker may spin for a few microseconds after each batch before it
/// parks, so a batch submitted right after the previous one finished is
/// picked up without a wake-up. An `exec` takes its bookkeeping (lock
/// order, guards, buffer views) from scratch memory the worker keeps, so
/// one that runs on the worker alone allocates nothing.
///
/// Dropping a queue finishes the work already submitted (the worker drains
/// it, then exits) and fails the signals of a batch recorded but never
/// submitted, so nobody waits on them forever.
pub struct CpuQueue {
    kind: QueueKind,
    limits: Limits,
    batch: Batch,
    /// The first invalid command of the batch being recorded.
    rejected: Option<Error>,
    /// The last `exec` arguments that passed `check_exec`: (params, the
    /// program's buffer and scalar counts, the given counts). The check is a
    /// pure function of these (kind and limits never change), so an `exec`
    /// like the last one skips it. Boxed: `CpuQueue` stays small.
    last_checked: Option<Box<CheckedExec>>,
    shared: Arc<Shared>,
}

/// One submitted unit of work. Buffers and scalars of all `exec`s live in
/// two vectors per batch, so recording an `exec` allocates nothing once the
/// vectors have grown; finished batches are recycled.
#[derive(Default)]
struct Batch {
    commands: Vec<Command>,
    buffers: Vec<CpuBuffer>,
    scalars: Vec<Scalar>,
    /// `State::epoch` when submitted.
    epoch: u64,
    /// A batch that will not run (rejected, discarded, or left recorded
    /// when the queue was dropped): the worker only fails its signals with
    /// this cause, after every batch submitted before it finished. Boxed:
    /// the recording batch lives inside `CpuQueue`, which stays small.
    abandoned: Option<Box<Error>>,
    /// The range of `buffers` the last `exec` uses: an `exec` on the same
    /// buffers shares it instead of cloning the handles again. (`u32`s keep
    /// `CpuQueue`, which holds the recording batch, small.)
    last_exec_buffers: Range<u32>,
}

impl Batch {
    fn clear(&mut self) {
        self.commands.clear();
        self.buffers.clear();
        self.scalars.clear();
        self.abandoned = None;
        self.last_exec_buffers = 0..0;
    }

    /// Fails every signal the commands from `from` on would have set.
    fn fail_signals(&self, from: usize, cause: &Error) {
        for command in &self.commands[from..] {
            if let Command::Signal { signal, value } = command {
                signal.fail(*value, cause.clone());
            }
        }
    }
}

enum Command {
    Wait {
        signal: CpuSignal,
        value: u64,
    },
    /// A wait on another backend's signal: the only boxed command, off the
    /// same-backend path.
    WaitForeign {
        signal: Box<dyn crate::queue::ForeignSignal>,
        value: u64,
    },
    Signal {
        signal: CpuSignal,
        value: u64,
    },
    Exec {
        program: CpuProgram,
        buffers: Range<usize>,
        scalars: Range<usize>,
        params: ExecParams,
    },
    Copy {
        dst: CpuBuffer,
        src: CpuBuffer,
    },
    Barrier,
}

/// What `CpuQueue::check_exec` checked last: the parameters, the program's
/// buffer and scalar counts, the counts given.
type CheckedExec = (ExecParams, (usize, usize), (usize, usize));

/// What the owner and the worker share.
struct Shared {
    state: Mutex<State>,
    /// The worker parks here for batches.
    work: Condvar,
    /// `synchronize` parks here for `in_flight == 0`.
    idle: Condvar,
    /// Threads an `exec` may use.
    threads: usize,
    /// `state.pending.len()`, written under `state`'s lock whenever it
    /// changes; read without the lock (`Relaxed`) only by the spinning
    /// worker, as a hint to take the lock. The deque under the lock stays
    /// the truth, so a stale read costs a lock round or a park, never a batch.
    queued: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// Submitted, not yet started.
    pending: VecDeque<Batch>,
    /// Submitted, not yet finished (pending or running).
    in_flight: usize,
    /// The owner dropped the queue: exit once `pending` is empty.
    closed: bool,
    worker_parked: bool,
    sync_waiters: usize,
    /// A failure not yet reported to the owner.
    failure: Option<std::sync::Arc<Error>>,
    /// How many failures the owner has been told of. A batch submitted in
    /// the epoch of a failure was submitted before the owner knew, and is
    /// not run.
    epoch: u64,
    /// Finished batches, cleared, for reuse.
    spare: Vec<Batch>,
}

impl Shared {
    /// Hands `batch` to the worker: queues it, keeps the `queued` hint
    /// current, counts it in flight, and wakes the worker if it is parked.
    fn enqueue(&self, state: &mut State, batch: Batch) {
        state.pending.push_back(batch);
        self.queued.store(state.pending.len(), Ordering::Relaxed);
        state.in_flight += 1;
        if state.worker_parked {
            self.work.notify_one();
        }
    }
}

/// How many finished batches to keep for reuse.
const SPARE_BATCHES: usize = 4;

impl CpuQueue {
    pub(crate) fn new(device: &CpuDevice, kind: QueueKind) -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            threads: device.threads(),
            queued: AtomicUsize::new(0),
        });
        let worker = shared.clone();
        spawn(format!("hwqueue-cpu-{kind}"), move || run_worker(&worker)).map_err(|e| {
            Error::System {
                what: "spawning a CPU queue's worker thread",
                detail: e.to_string(),
            }
        })?;
        Ok(Self {
            kind,
            limits: device.limits_ref(),
            batch: Batch::default(),
            rejected: None,
            last_checked: None,
            shared,
        })
    }

    /// How many commands are recorded and not yet submitted.
    pub fn recorded(&self) -> usize {
        self.batch.commands.len()
    }

    /// Throws away the batch being recorded (and its rejection, if a command
    /// was invalid) without running any of it; the queue then records a new
    /// batch. Work already submitted is not affected.
    ///
    /// As when a queue is dropped with a batch recorded, the signals the
    /// batch would have set are [failed](TimelineSignal::fail), so nobody
    /// waits on them forever; values already reached are left alone. With
    /// none to fail, discarding takes no lock and allocates nothing.
    pub fn discard(&mut self) {
        self.rejected = None;
        self.abandon_recorded(Error::Backend {
            backend: Cpu::ID,
            message: "the batch that would have set this value was discarded before it was \
                      submitted; record and submit it again"
                .into(),
        });
    }

    /// Fails the signals of the recorded batch, which will not run, with
    /// `cause`, and starts a new batch.
    ///
    /// The failure keeps queue order: while batches submitted earlier are
    /// still in flight, the batch goes to the worker, which fails its
    /// signals after those batches finished. Failing at once would fail a
    /// value that an earlier batch is about to set (`fail(upto)` covers
    /// every unreached value up to `upto`), and its waiters would wake with
    /// an error although their work completes. With no unreached signal,
    /// this takes no lock and allocates nothing.
    fn abandon_recorded(&mut self, cause: Error) {
        let unreached = self.batch.commands.iter().any(|command| {
            matches!(command, Command::Signal { signal, value } if !signal.is_reached(*value))
        });
        if !unreached {
            self.batch.clear();
            return;
        }
        let mut state = self.shared.state.lock();
        if state.in_flight == 0 {
            // Nothing earlier can still set a value: fail now. Only the
            // owner (`&mut self`) submits, so this stays true.
            drop(state);
            self.batch.fail_signals(0, &cause);
            self.batch.clear();
            return;
        }
        let fresh = state.spare.pop().unwrap_or_default();
        let mut batch = mem::replace(&mut self.batch, fresh);
        batch.abandoned = Some(Box::new(cause));
        self.shared.enqueue(&mut state, batch);
    }

    fn check_exec(
        &mut self,
        program: &CpuProgram,
        buffers: &[&CpuBuffer],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        let key = (
            *params,
            (program.buffer_count(), program.scalar_count()),
            (buffers.len(), scalars.len()),
        );
        if self.last_checked.as_deref() == Some(&key) {
            return Ok(());
        }
        crate::queue::check_exec(
            self.kind,
            &self.limits,
            program.name(),
            key.1,
            key.2,
            params,
        )?;
        match &mut self.last_checked {
            Some(last) => **last = key,
            None => self.last_checked = Some(Box::new(key)),
        }
        Ok(())
    }
}

impl HardwareQueue for CpuQueue {
    type Backend = Cpu;

    fn kind(&self) -> QueueKind {
        self.kind
    }

    fn wait(&mut self, signal: &CpuSignal, value: u64) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        self.batch.commands.push(Command::Wait {
            signal: signal.clone(),
            value,
        });
        self
    }

    fn signal(&mut self, signal: &CpuSignal, value: u64) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        // Recorded even in a rejected batch, so `submit` can fail it.
        self.batch.commands.push(Command::Signal {
            signal: signal.clone(),
            value,
        });
        self
    }

    fn exec(
        &mut self,
        program: &CpuProgram,
        buffers: &[&CpuBuffer],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self {
        if self.rejected.is_some() {
            return self;
        }
        if let Err(e) = self.check_exec(program, buffers, scalars, &params) {
            return self.reject(e);
        }
        let batch = &mut self.batch;
        let Range { start, end } = batch.last_exec_buffers.clone();
        let last = &batch.buffers[start as usize..end as usize];
        let same_buffers = last.len() == buffers.len()
            && last.iter().zip(buffers).all(|(old, new)| old.same_as(new));
        let range = if same_buffers {
            start as usize..end as usize
        } else {
            let first_buffer = batch.buffers.len();
            batch.buffers.extend(buffers.iter().map(|b| (*b).clone()));
            let range = first_buffer..batch.buffers.len();
            // Past `u32::MAX` handles, later `exec`s just clone again.
            batch.last_exec_buffers = u32::try_from(range.start)
                .and_then(|start| Ok(start..u32::try_from(range.end)?))
                .unwrap_or(0..0);
            range
        };
        let first_scalar = self.batch.scalars.len();
        self.batch.scalars.extend_from_slice(scalars);
        self.batch.commands.push(Command::Exec {
            program: program.clone(),
            buffers: range,
            scalars: first_scalar..self.batch.scalars.len(),
            params,
        });
        self
    }

    fn copy(&mut self, dst: &CpuBuffer, src: &CpuBuffer) -> &mut Self {
        if dst.size() != src.size() {
            return self.reject(Error::CopySizeMismatch {
                dst: dst.size(),
                src: src.size(),
            });
        }
        self.batch.commands.push(Command::Copy {
            dst: dst.clone(),
            src: src.clone(),
        });
        self
    }

    fn memory_barrier(&mut self) -> &mut Self {
        self.batch.commands.push(Command::Barrier);
        self
    }

    /// The worker blocks on the foreign signal's own host `wait`: correct for
    /// any backend whose signal tells the truth, costs one boxed command at
    /// record time and one host wait (a parked thread) at run time.
    fn wait_foreign<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
        if let Err(e) = check_value(value) {
            return self.reject(e);
        }
        self.batch.commands.push(Command::WaitForeign {
            signal: Box::new(signal.clone()),
            value,
        });
        self
    }

    fn reject(&mut self, error: Error) -> &mut Self {
        if self.rejected.is_none() {
            self.rejected = Some(error);
        }
        self
    }

    fn submit(&mut self) -> Result<()> {
        if let Some(error) = self.rejected.take() {
            let cause = std::sync::Arc::new(error);
            self.abandon_recorded(Error::BatchRejected {
                cause: cause.clone(),
            });
            return Err(Error::BatchRejected { cause });
        }
        let mut state = self.shared.state.lock();
        {
            let state = &mut *state;
            report_failure(&mut state.failure, &mut state.epoch)?;
        }
        if self.batch.commands.is_empty() {
            return Ok(());
        }
        let fresh = state.spare.pop().unwrap_or_default();
        let mut batch = mem::replace(&mut self.batch, fresh);
        batch.epoch = state.epoch;
        self.shared.enqueue(&mut state, batch);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        let mut state = self.shared.state.lock();
        state.sync_waiters += 1;
        while state.in_flight > 0 {
            state = self.shared.idle.wait(state);
        }
        state.sync_waiters -= 1;
        let state = &mut *state;
        report_failure(&mut state.failure, &mut state.epoch)
    }
}

impl Drop for CpuQueue {
    fn drop(&mut self) {
        if !self.batch.commands.is_empty() {
            self.abandon_recorded(Error::Backend {
                backend: Cpu::ID,
                message: "the queue was dropped with a batch recorded but not submitted; call \
                          `submit` before dropping the queue"
                    .into(),
            });
        }
        let mut state = self.shared.state.lock();
        state.closed = true;
        self.shared.work.notify_one();
    }
}

impl fmt::Debug for CpuQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuQueue")
            .field("kind", &self.kind)
            .field("recorded", &self.batch.commands.len())
            .field("rejected", &self.rejected)
            .finish_non_exhaustive()
    }
}

/// The worker: runs batches in order until the queue is dropped and drained.
fn run_worker(shared: &Shared) {
    // The epoch and cause of the last failure this worker saw.
    let mut last_failure: Option<(u64, std::sync::Arc<Error>)> = None;
    let mut scratch = ExecScratch::default();
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
        let outcome = match (batch.abandoned.take(), &last_failure) {
            // Rejected, discarded or dropped: only fail its signals, in
            // queue order (see `CpuQueue::abandon_recorded`); the owner
            // already knows.
            (Some(cause), _) => {
                batch.fail_signals(0, &cause);
                Ok(())
            }
            (None, Some((epoch, cause))) if batch.epoch <= *epoch => Err((
                0,
                Error::EarlierBatchFailed {
                    cause: cause.clone(),
                },
            )),
            _ => run_batch(&batch, shared.threads, &mut scratch),
        };
        if let Err((from, error)) = outcome {
            let cause = std::sync::Arc::new(error);
            // Record the failure for the owner *before* failing the signals:
            // an owner that sees a failed signal and submits again must find
            // the failure reported, or its new batch would be taken for one
            // submitted before it knew, and cascade.
            {
                let mut state = shared.state.lock();
                if state.failure.is_none() {
                    state.failure = Some(cause.clone());
                }
            }
            batch.fail_signals(from, &cause);
            last_failure = Some((batch.epoch, cause));
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

/// Runs a batch; on failure, the index of the failed command and why.
fn run_batch(
    batch: &Batch,
    threads: usize,
    scratch: &mut ExecScratch,
) -> std::result::Result<(), (usize, Error)> {
    let mut held = HeldBuffers::new(scratch);
    let outcome = run_commands(batch, threads, &mut held);
    held.finish(scratch);
    outcome
}

fn run_commands<'a>(
    batch: &'a Batch,
    threads: usize,
    held: &mut HeldBuffers<'a>,
) -> std::result::Result<(), (usize, Error)> {
    for (index, command) in batch.commands.iter().enumerate() {
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
                &batch.buffers,
                buffers.clone(),
                &batch.scalars[scalars.clone()],
                params,
                threads,
                held,
            ),
            Command::Copy { dst, src } => {
                run_copy(dst, src);
                Ok(())
            }
            Command::Barrier => {
                fence(Ordering::SeqCst);
                Ok(())
            }
        };
        result.map_err(|error| (index, error))?;
    }
    Ok(())
}

fn run_copy(dst: &CpuBuffer, src: &CpuBuffer) {
    if dst.same_as(src) {
        return;
    }
    // Lock in address order, as `run_exec` does, so two queues never wait
    // on each other's buffers in a cycle.
    let (first, second) = if dst.address() < src.address() {
        (dst, src)
    } else {
        (src, dst)
    };
    let _a = first.lock_exclusive();
    let _b = second.lock_exclusive();
    // SAFETY: distinct buffers (checked above) of equal size (checked at
    // record time), both held exclusively, so the ranges are valid, do not
    // overlap, and nothing else accesses them.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), src.size()) };
}

/// Memory every `exec` of a worker reuses, so that running one allocates
/// nothing once the vectors have grown. Kept empty between batches.
#[derive(Default)]
struct ExecScratch {
    /// Indices into the `exec`'s buffers, in lock order.
    order: Vec<usize>,
    /// Room for the buffer guards.
    guards: Vec<RwLockWriteGuard<'static, ()>>,
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
    guards: Vec<RwLockWriteGuard<'a, ()>>,
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

    /// Holds `buffers[range]` exclusively, in address order, with views.
    fn hold(&mut self, buffers: &'a [CpuBuffer], range: Range<usize>) {
        if self.range.as_ref() == Some(&range) {
            return;
        }
        self.release();
        let buffers = &buffers[range.clone()];
        let order = &mut self.order;
        order.clear();
        order.extend(0..buffers.len());
        order.sort_unstable_by_key(|&i| buffers[i].address());
        order.dedup_by_key(|i| buffers[*i].address());
        self.guards
            .extend(order.iter().map(|&i| buffers[i].lock_exclusive()));
        self.views.extend(
            buffers
                .iter()
                // SAFETY: each buffer's memory is `size` valid, initialised,
                // 64-aligned bytes, held exclusively by `self.guards` until
                // `release`, which clears these views first.
                .map(|b| unsafe { BufferView::new(b.as_ptr(), b.size()) }),
        );
        self.range = Some(range);
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
    batch_buffers: &'a [CpuBuffer],
    buffers: Range<usize>,
    scalars: &[Scalar],
    params: &ExecParams,
    threads: usize,
    held: &mut HeldBuffers<'a>,
) -> Result<()> {
    held.hold(batch_buffers, buffers);
    let args = KernelArgs::new(program, &held.views, scalars);
    let grid = Grid {
        groups: params.groups(),
        local: params.local(),
    };
    let total = params.group_count();
    let outcome = if total <= 1 || threads <= 1 {
        catch_unwind(AssertUnwindSafe(|| grid.run(program, &args, 0..total))).map_err(panic_message)
    } else {
        run_parallel(program, &args, &grid, total, threads)
    };
    outcome.map_err(|message| Error::KernelFailed {
        program: program.name().to_owned(),
        message,
    })
}

/// The shape of a grid, for turning linear group indices into work-groups.
struct Grid {
    groups: [u32; 3],
    local: [u32; 3],
}

impl Grid {
    #[inline]
    fn run(&self, program: &CpuProgram, args: &KernelArgs<'_>, range: Range<u64>) {
        let [gx, gy, gz] = self.groups.map(u64::from);
        let run = |id| {
            let group = WorkGroup {
                id,
                groups: self.groups,
                local: self.local,
            };
            program.run_group(&group, args);
        };
        if gy == 1 && gz == 1 {
            // A 1-D grid (the common case): the linear index is x, and no
            // division is needed. It is below the u32 group count.
            for linear in range {
                run([linear as u32, 0, 0]);
            }
            return;
        }
        for linear in range {
            // Each coordinate is below its u32 group count.
            run([
                (linear % gx) as u32,
                ((linear / gx) % gy) as u32,
                (linear / (gx * gy)) as u32,
            ]);
        }
    }
}

/// Runs the groups on `threads` scoped threads pulling chunks from a counter.
/// The first panic wins; the others stop at their next chunk.
#[cfg(not(loom))]
fn run_parallel(
    program: &CpuProgram,
    args: &KernelArgs<'_>,
    grid: &Grid,
    total: u64,
    threads: usize,
) -> std::result::Result<(), String> {
    use crate::sync::{AtomicBool, AtomicU64};

    let workers = threads.min(usize::try_from(total).unwrap_or(usize::MAX));
    // Enough chunks per thread to balance uneven groups, few enough to keep
    // the counter cold.
    let chunk = (total / (workers as u64 * 8)).max(1);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first_panic = Mutex::new(None::<String>);
    let work = || {
        let result = catch_unwind(AssertUnwindSafe(|| {
            while !stop.load(Ordering::Relaxed) {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= total {
                    break;
                }
                grid.run(program, args, start..(start + chunk).min(total));
            }
        }));
        if let Err(payload) = result {
            stop.store(true, Ordering::Relaxed);
            first_panic.lock().get_or_insert(panic_message(payload));
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..workers {
            scope.spawn(work);
        }
        work();
    });
    match first_panic.lock().take() {
        Some(message) => Err(message),
        None => Ok(()),
    }
}

/// Under loom there are no real threads to spare: run the groups in order.
#[cfg(loom)]
fn run_parallel(
    program: &CpuProgram,
    args: &KernelArgs<'_>,
    grid: &Grid,
    total: u64,
    _threads: usize,
) -> std::result::Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| grid.run(program, args, 0..total))).map_err(panic_message)
}
