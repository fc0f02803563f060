//! The executor: plan a schedule once, run it many times.
//!
//! A compiler hands hwqueue a [`Schedule`]: operations (kernel `exec`s and
//! copies) in program order, each declaring the byte ranges of the buffers it
//! reads and writes, the device it runs on and the queue kind it wants.
//! [`Schedule::plan`] turns it into a [`Plan`]:
//!
//! - **Queues.** One compute queue per device used, one copy queue per device
//!   whose copies ask for one (the compute queue where the device has none),
//!   and one host stage for copies between devices that cannot see each
//!   other's memory: it reads the source to host memory and writes the
//!   destination, in order, on a thread of the plan's own.
//! - **Dependencies** come from hazards between an operation and every
//!   earlier one: read-after-write, write-after-read and write-after-write on
//!   overlapping byte ranges of one buffer. Disjoint ranges do not depend.
//! - **Fewest waits.** Every queue has one timeline signal and every
//!   operation a value on it. A dependency on the same queue needs nothing
//!   (queues run in order). Across queues, the planner keeps a vector clock
//!   per queue position (what each queue is known to have completed there),
//!   and inserts a wait only when no earlier wait already implies it, directly
//!   or through another queue's wait; of the waits one operation needs, those
//!   implied by another of them are dropped.
//! - **Back-to-back runs.** The planner plans the schedule twice in a row
//!   and keeps the second copy's waits, so hazards between an operation and
//!   one of the *previous* run (the next upload overwriting what the last
//!   matmul still reads) get a wait too, marked `previous_run`; runs started
//!   without waiting for each other stay correct. The first run skips them,
//!   and so does a run whose previous run already failed at that point (its
//!   later operations never run, so there is nothing to race, and the new
//!   run must not inherit the failure).
//!
//! [`Plan::run`] records every queue's batch with fresh timeline values (run
//! `r` uses values `r * n + 1 ..= (r + 1) * n` on a queue of `n` operations),
//! submits them and returns a [`Run`] handle. Nothing is re-planned; the
//! recording reuses the queues' batch storage.
//!
//! Failure of any operation fails the run: its queue fails the signals the
//! batch would have set, every queue waiting on them fails in turn, and
//! [`Run::wait`] returns [`Error::OperationFailed`] naming the operation that
//! failed first (the unfinished operation whose own waits were all met).
//! Nothing hangs, and the next run of the same plan starts clean.

use std::fmt;
use std::ops::{Bound, Range, RangeBounds};
use std::time::Instant;

use crate::backend::Backend;
use crate::buffer::Buffer;
use crate::device::QueueFactory;
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::{Program, Scalar};
use crate::queue::{HardwareQueue, QueueKind};
use crate::signal::{TimelineSignal, Timeout};
use crate::sync::{Arc, mpsc, spawn};

/// A device of a schedule: an index into [`Schedule::add_device`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(usize);

/// A buffer of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

/// An operation of a schedule, in program order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(usize);

impl OpId {
    /// The operation's position in program order.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A byte range of a buffer that an operation reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Access {
    buffer: BufferId,
    range: Range<usize>,
}

impl Access {
    fn overlaps(&self, other: &Access) -> bool {
        self.buffer == other.buffer
            && self.range.start < other.range.end
            && other.range.start < self.range.end
    }
}

/// Which way two operations conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hazard {
    /// The later operation reads what the earlier wrote.
    ReadAfterWrite,
    /// The later operation overwrites what the earlier read.
    WriteAfterRead,
    /// Both write.
    WriteAfterWrite,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hazard::ReadAfterWrite => "read-after-write",
            Hazard::WriteAfterRead => "write-after-read",
            Hazard::WriteAfterWrite => "write-after-write",
        })
    }
}

struct BufferSlot<B: Backend> {
    name: String,
    device: DeviceId,
    buffer: B::Buffer,
}

enum Work<B: Backend> {
    Exec {
        program: B::Program,
        buffers: Vec<BufferId>,
        scalars: Vec<Scalar>,
        params: ExecParams,
    },
    Copy {
        dst: BufferId,
        src: BufferId,
    },
}

struct Op<B: Backend> {
    name: String,
    device: DeviceId,
    kind: QueueKind,
    work: Work<B>,
    /// `None`: not declared; an exec then reads and writes every argument whole.
    reads: Option<Vec<Access>>,
    writes: Option<Vec<Access>>,
}

/// Operations over buffers on devices, in program order: the input of the
/// planner.
pub struct Schedule<B: Backend> {
    devices: Vec<Arc<B::Device>>,
    buffers: Vec<BufferSlot<B>>,
    ops: Vec<Op<B>>,
}

impl<B: Backend> Default for Schedule<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> Schedule<B> {
    /// An empty schedule.
    pub fn new() -> Self {
        Self {
            devices: Vec::new(),
            buffers: Vec::new(),
            ops: Vec::new(),
        }
    }

    /// Adds a device operations can run on.
    pub fn add_device(&mut self, device: Arc<B::Device>) -> DeviceId {
        self.devices.push(device);
        DeviceId(self.devices.len() - 1)
    }

    /// Adds a buffer living on `device`, named for plans and errors.
    pub fn add_buffer(
        &mut self,
        device: DeviceId,
        name: impl Into<String>,
        buffer: B::Buffer,
    ) -> BufferId {
        self.buffers.push(BufferSlot {
            name: name.into(),
            device,
            buffer,
        });
        BufferId(self.buffers.len() - 1)
    }

    /// Adds a kernel launch on `device`'s compute queue. Unless narrowed with
    /// [`OpBuilder::reads`]/[`OpBuilder::writes`], it reads and writes every
    /// buffer argument whole.
    pub fn exec(
        &mut self,
        name: impl Into<String>,
        device: DeviceId,
        program: &B::Program,
        buffers: &[BufferId],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> OpBuilder<'_, B> {
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Compute,
            work: Work::Exec {
                program: program.clone(),
                buffers: buffers.to_vec(),
                scalars: scalars.to_vec(),
                params,
            },
            reads: None,
            writes: None,
        })
    }

    /// Adds a whole-buffer copy (sizes must match). It runs on the copy queue
    /// of the destination's device when both buffers share a device, and on
    /// the host stage otherwise. It reads all of `src` and writes all of `dst`.
    pub fn copy(
        &mut self,
        name: impl Into<String>,
        dst: BufferId,
        src: BufferId,
    ) -> OpBuilder<'_, B> {
        let device = self
            .buffers
            .get(dst.0)
            .map_or(DeviceId(usize::MAX), |b| b.device);
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Copy,
            work: Work::Copy { dst, src },
            reads: None,
            writes: None,
        })
    }

    fn push(&mut self, op: Op<B>) -> OpBuilder<'_, B> {
        self.ops.push(op);
        let index = self.ops.len() - 1;
        OpBuilder {
            schedule: self,
            index,
        }
    }

    /// Plans the schedule: queues, dependencies, waits, timeline values.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for unknown ids, ranges past a buffer's end,
    /// an exec whose buffers live on another device, a copy between buffers
    /// of different sizes; any error creating queues or signals.
    pub fn plan(self) -> Result<Plan<B>> {
        planner::plan(self)
    }
}

/// Narrows what an operation touches, or moves it to another queue kind.
pub struct OpBuilder<'a, B: Backend> {
    schedule: &'a mut Schedule<B>,
    index: usize,
}

impl<B: Backend> OpBuilder<'_, B> {
    /// The operation's id.
    pub fn id(&self) -> OpId {
        OpId(self.index)
    }

    /// Declares that the operation reads `range` (bytes) of `buffer`.
    pub fn reads(self, buffer: BufferId, range: impl RangeBounds<usize>) -> Self {
        let access = self.access(buffer, range);
        self.schedule.ops[self.index]
            .reads
            .get_or_insert_with(Vec::new)
            .push(access);
        self
    }

    /// Declares that the operation writes `range` (bytes) of `buffer`.
    pub fn writes(self, buffer: BufferId, range: impl RangeBounds<usize>) -> Self {
        let access = self.access(buffer, range);
        self.schedule.ops[self.index]
            .writes
            .get_or_insert_with(Vec::new)
            .push(access);
        self
    }

    /// Runs the operation on a queue of `kind` (a copy on the compute queue,
    /// say). An exec on a copy queue is an error at `plan`.
    pub fn on(self, kind: QueueKind) -> Self {
        self.schedule.ops[self.index].kind = kind;
        self
    }

    fn access(&self, buffer: BufferId, range: impl RangeBounds<usize>) -> Access {
        let size = self
            .schedule
            .buffers
            .get(buffer.0)
            .map_or(0, |b| b.buffer.size());
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => size,
        };
        Access {
            buffer,
            range: start..end,
        }
    }
}

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    Device { device: DeviceId, kind: QueueKind },
    Host,
}

/// A wait the planner inserted before an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedWait {
    /// The queue waited on (an index into [`Plan::queue_labels`]).
    pub queue: usize,
    /// The value waited for, within one run (1 = that queue's first operation).
    pub value: u64,
    /// Whether the value is of the *previous* run: a hazard between an
    /// operation and one of the run before it, so that back-to-back runs
    /// (started without waiting) stay correct. Skipped on the first run.
    pub previous_run: bool,
    /// The operation whose completion that value stands for.
    pub after: OpId,
    /// Why: the hazard, and the buffer and range it is on.
    pub reason: String,
}

struct PlannedOp {
    name: String,
    queue: usize,
    /// This operation's value on its queue's timeline, within one run.
    value: u64,
    waits: Vec<PlannedWait>,
    /// Program name for execs (to match kernel errors).
    program: Option<String>,
}

struct PlannedQueue<B: Backend> {
    label: String,
    /// `None` for the host stage.
    queue: Option<B::Queue>,
    signal: B::Signal,
    /// Operations in queue order.
    ops: Vec<usize>,
}

/// The shared, immutable facts of a plan that a [`Run`] needs to explain a
/// failure.
struct PlanFacts<B: Backend> {
    ops: Vec<PlannedOp>,
    signals: Vec<B::Signal>,
    counts: Vec<u64>,
}

impl<B: Backend> PlanFacts<B> {
    /// The value `wait` stands for in run `run`; `None` when it is of the
    /// run before the first, which needs no wait.
    fn target(&self, run: u64, wait: &PlannedWait) -> Option<u64> {
        let per_run = self.counts[wait.queue];
        if wait.previous_run {
            run.checked_sub(1)
                .map(|previous| previous * per_run + wait.value)
        } else {
            Some(run * per_run + wait.value)
        }
    }

    /// The value to record a wait for in run `run`, or `None` when no wait
    /// is needed: a previous-run value that is reached, or that failed (the
    /// failed run's later operations never run, so there is nothing to
    /// race; the new run must not inherit the failure).
    fn wait_to_record(&self, run: u64, wait: &PlannedWait) -> Option<u64> {
        let target = self.target(run, wait)?;
        if wait.previous_run
            && !matches!(
                self.signals[wait.queue].wait(target, std::time::Duration::ZERO),
                Err(Error::Timeout { .. })
            )
        {
            return None;
        }
        Some(target)
    }
}

/// A planned schedule: run it as often as needed with [`Plan::run`].
pub struct Plan<B: Backend> {
    queues: Vec<PlannedQueue<B>>,
    facts: Arc<PlanFacts<B>>,
    schedule: Schedule<B>,
    host: Option<mpsc::Sender<HostBatch<B>>>,
    runs: u64,
}

/// One run's work for the host stage.
struct HostBatch<B: Backend> {
    jobs: Vec<HostJob<B>>,
}

struct HostJob<B: Backend> {
    waits: Vec<(B::Signal, u64)>,
    dst: B::Buffer,
    src: B::Buffer,
    signal: B::Signal,
    value: u64,
    /// The last value of this run on the host's timeline, to fail on error.
    last: u64,
}

impl<B: Backend> Plan<B> {
    /// Records and submits one run with fresh timeline values; returns at once.
    ///
    /// # Errors
    /// When a queue refuses the batch (a command the backend rejects).
    pub fn run(&mut self) -> Result<Run<B>> {
        let run = self.runs;
        self.runs += 1;
        let facts = self.facts.clone();
        let base = |queue: usize| run * facts.counts[queue];
        let mut host_jobs = Vec::new();
        for (index, planned) in self.queues.iter_mut().enumerate() {
            let own = base(index);
            let last = own + facts.counts[index];
            let Some(queue) = planned.queue.as_mut() else {
                for &op in &planned.ops {
                    let op_plan = &facts.ops[op];
                    let Work::Copy { dst, src } = self.schedule.ops[op].work else {
                        unreachable!("only copies run on the host stage");
                    };
                    host_jobs.push(HostJob {
                        waits: op_plan
                            .waits
                            .iter()
                            .filter_map(|w| {
                                Some((
                                    facts.signals[w.queue].clone(),
                                    facts.wait_to_record(run, w)?,
                                ))
                            })
                            .collect(),
                        dst: self.schedule.buffers[dst.0].buffer.clone(),
                        src: self.schedule.buffers[src.0].buffer.clone(),
                        signal: planned.signal.clone(),
                        value: own + op_plan.value,
                        last,
                    });
                }
                continue;
            };
            for &op in &planned.ops {
                let op_plan = &facts.ops[op];
                for wait in &op_plan.waits {
                    if let Some(target) = facts.wait_to_record(run, wait) {
                        queue.wait(&facts.signals[wait.queue], target);
                    }
                }
                match &self.schedule.ops[op].work {
                    Work::Exec {
                        program,
                        buffers,
                        scalars,
                        params,
                    } => {
                        let slots = &self.schedule.buffers;
                        with_buffers(
                            buffers,
                            |id| &slots[id.0].buffer,
                            |refs| {
                                queue.exec(program, refs, scalars, *params);
                            },
                        );
                    }
                    Work::Copy { dst, src } => {
                        queue.copy(
                            &self.schedule.buffers[dst.0].buffer,
                            &self.schedule.buffers[src.0].buffer,
                        );
                    }
                }
                queue.signal(&planned.signal, own + op_plan.value);
            }
            let submitted = match queue.submit() {
                // An earlier run failed on this queue; the batch was kept.
                Err(Error::QueueFailed { .. }) => queue.submit(),
                other => other,
            };
            if let Err(error) = submitted {
                // Queues already submitted may wait on this run's values of
                // the queues not submitted: fail those values so none hangs.
                for later in index..facts.signals.len() {
                    facts.signals[later].fail(base(later) + facts.counts[later], error.clone());
                }
                return Err(error);
            }
        }
        if !host_jobs.is_empty()
            && let Some(host) = &self.host
        {
            host.send(HostBatch { jobs: host_jobs })
                .map_err(|_| Error::System {
                    what: "handing copies to the executor's host stage",
                    detail: "its thread has exited".into(),
                })?;
        }
        Ok(Run { run, facts })
    }

    /// The queues, by index: `"cpu:0 compute"`, `"cpu:0 copy"`, `"host"`.
    pub fn queue_labels(&self) -> Vec<&str> {
        self.queues.iter().map(|q| q.label.as_str()).collect()
    }

    /// The waits inserted before operation `op`.
    pub fn waits_of(&self, op: OpId) -> &[PlannedWait] {
        &self.facts.ops[op.0].waits
    }

    /// Every inserted wait, as (waiting operation, wait).
    pub fn waits(&self) -> impl Iterator<Item = (OpId, &PlannedWait)> {
        self.facts
            .ops
            .iter()
            .enumerate()
            .flat_map(|(index, op)| op.waits.iter().map(move |w| (OpId(index), w)))
    }

    /// The queue (an index into [`queue_labels`](Self::queue_labels)) that
    /// runs `op`.
    pub fn queue_of(&self, op: OpId) -> usize {
        self.facts.ops[op.0].queue
    }

    /// How many runs were started.
    pub fn runs(&self) -> u64 {
        self.runs
    }
}

impl<B: Backend> fmt::Display for Plan<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let waits = self.facts.ops.iter().map(|o| o.waits.len()).sum::<usize>();
        writeln!(
            f,
            "plan: {} operations on {} queues, {} waits",
            self.facts.ops.len(),
            self.queues.len(),
            waits
        )?;
        for (index, queue) in self.queues.iter().enumerate() {
            writeln!(f, "  queue {index} ({}):", queue.label)?;
            for &op in &queue.ops {
                let planned = &self.facts.ops[op];
                for wait in &planned.waits {
                    writeln!(
                        f,
                        "    wait queue {} >= {}  ({})",
                        wait.queue, wait.value, wait.reason
                    )?;
                }
                writeln!(
                    f,
                    "    [{}] {}  -> signal {}",
                    op, planned.name, planned.value
                )?;
            }
        }
        Ok(())
    }
}

impl<B: Backend> fmt::Debug for Plan<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One run of a plan: wait for it, or ask whether it finished.
pub struct Run<B: Backend> {
    run: u64,
    facts: Arc<PlanFacts<B>>,
}

impl<B: Backend> Run<B> {
    fn target(&self, queue: usize) -> u64 {
        (self.run + 1) * self.facts.counts[queue]
    }

    /// Whether every operation of the run completed. Never blocks.
    pub fn is_complete(&self) -> bool {
        (0..self.facts.signals.len()).all(|q| self.facts.signals[q].is_reached(self.target(q)))
    }

    /// Blocks until the run completed.
    ///
    /// # Errors
    /// [`Error::OperationFailed`] naming the operation that failed;
    /// [`Error::Timeout`] when `timeout` passes first.
    pub fn wait(&self, timeout: impl Into<Timeout>) -> Result<()> {
        let timeout = timeout.into();
        let start = Instant::now();
        let deadline = timeout.deadline_from(start);
        for queue in 0..self.facts.signals.len() {
            let remaining = match deadline {
                Some(deadline) => {
                    Timeout::After(deadline.saturating_duration_since(Instant::now()))
                }
                None => Timeout::Forever,
            };
            match self.facts.signals[queue].wait(self.target(queue), remaining) {
                Ok(()) => {}
                Err(error @ Error::Timeout { .. }) => return Err(error),
                Err(error) => {
                    // Let every queue of the run settle (complete or fail:
                    // failures propagate, so this ends), so the next run
                    // finds each failure reported and starts clean.
                    for other in 0..self.facts.signals.len() {
                        let _ = self.facts.signals[other].wait(self.target(other), remaining);
                    }
                    return Err(self.explain(error));
                }
            }
        }
        Ok(())
    }

    /// Names the operation behind a failure: the first unfinished operation
    /// whose own waits were met (it failed itself, rather than waiting on a
    /// failure), preferring one whose kernel the error names.
    fn explain(&self, error: Error) -> Error {
        let facts = &*self.facts;
        let base = |queue: usize| self.run * facts.counts[queue];
        let root = error.root_cause().clone();
        let failed_program = match &root {
            Error::KernelFailed { program, .. } => Some(program.clone()),
            _ => None,
        };
        let mut culprits = Vec::new();
        for (queue, signal) in facts.signals.iter().enumerate() {
            let first_unfinished = facts
                .ops
                .iter()
                .filter(|op| op.queue == queue && !signal.is_reached(base(queue) + op.value))
                .min_by_key(|op| op.value);
            if let Some(op) = first_unfinished {
                let waits_met = op.waits.iter().all(|w| {
                    facts
                        .target(self.run, w)
                        .is_none_or(|target| facts.signals[w.queue].is_reached(target))
                });
                if waits_met {
                    culprits.push(op);
                }
            }
        }
        let culprit = culprits
            .iter()
            .find(|op| failed_program.is_some() && op.program == failed_program)
            .or(culprits.first());
        match culprit {
            Some(op) => Error::OperationFailed {
                operation: op.name.clone(),
                cause: std::sync::Arc::new(root),
            },
            None => error,
        }
    }
}

impl<B: Backend> fmt::Debug for Run<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("run", &self.run)
            .field("complete", &self.is_complete())
            .finish()
    }
}

/// Calls `f` with the buffers `ids` name, gathered on the stack (on the heap
/// only past 16), so a replay records an `exec` without allocating.
fn with_buffers<'a, T: 'a, R>(
    ids: &[BufferId],
    get: impl Fn(BufferId) -> &'a T,
    f: impl FnOnce(&[&'a T]) -> R,
) -> R {
    const INLINE: usize = 16;
    match ids.first() {
        None => f(&[]),
        Some(&first) if ids.len() <= INLINE => {
            let mut refs = [get(first); INLINE];
            for (slot, id) in refs.iter_mut().zip(ids) {
                *slot = get(*id);
            }
            f(&refs[..ids.len()])
        }
        Some(_) => f(&ids.iter().map(|id| get(*id)).collect::<Vec<_>>()),
    }
}

/// The host stage's thread: runs each batch's copies in order.
fn run_host_stage<B: Backend>(batches: mpsc::Receiver<HostBatch<B>>) {
    let mut staging: Vec<u8> = Vec::new();
    while let Ok(batch) = batches.recv() {
        for (index, job) in batch.jobs.iter().enumerate() {
            let outcome = job
                .waits
                .iter()
                .try_for_each(|(signal, value)| signal.wait(*value, Timeout::Forever))
                .and_then(|()| {
                    staging.resize(job.src.size(), 0);
                    job.src.read_at(0, &mut staging)?;
                    job.dst.write_at(0, &staging)
                });
            match outcome {
                Ok(()) => job.signal.set(job.value),
                Err(error) => {
                    // Fail the rest of this batch's values: nobody hangs.
                    job.signal.fail(job.last, error);
                    for later in &batch.jobs[index + 1..] {
                        later.signal.fail(
                            later.last,
                            Error::EarlierBatchFailed {
                                cause: std::sync::Arc::new(Error::InvalidSchedule {
                                    reason: "an earlier host copy of this run failed".into(),
                                }),
                            },
                        );
                    }
                    break;
                }
            }
        }
    }
}

mod planner {
    //! Turning a schedule into queues, waits and values.

    use super::*;

    /// What a queue is known to have completed: per queue, a value.
    type Clock = Vec<u64>;

    /// A wait chosen while planning two runs back to back: the queue and
    /// value waited for, the awaited op's index, and why.
    type DoubledWait = (usize, u64, usize, Hazard, Access);

    /// An op of the doubled plan: its queue, its value there, its waits.
    type DoubledOp = (usize, u64, Vec<DoubledWait>);

    pub(super) fn plan<B: Backend>(schedule: Schedule<B>) -> Result<Plan<B>> {
        validate(&schedule)?;
        let accesses: Vec<(Vec<Access>, Vec<Access>)> = schedule
            .ops
            .iter()
            .map(|op| effective_accesses(&schedule, op))
            .collect();

        // Lanes in order of first use.
        let mut lanes: Vec<Lane> = Vec::new();
        let op_lane: Vec<usize> = schedule
            .ops
            .iter()
            .map(|op| {
                let lane = lane_of(&schedule, op);
                match lanes.iter().position(|l| *l == lane) {
                    Some(index) => index,
                    None => {
                        lanes.push(lane);
                        lanes.len() - 1
                    }
                }
            })
            .collect();
        // Make the queues. A copy lane on a device without a copy queue
        // resolves to that device's compute lane, sharing its queue.
        let mut queues: Vec<PlannedQueue<B>> = Vec::new();
        let mut resolved: Vec<Lane> = Vec::new();
        let mut lane_queue: Vec<usize> = Vec::new();
        for lane in &lanes {
            let (lane, label, queue, signal) = make_queue(&schedule, *lane)?;
            match resolved.iter().position(|l| *l == lane) {
                Some(index) => lane_queue.push(index),
                None => {
                    resolved.push(lane);
                    queues.push(PlannedQueue {
                        label,
                        queue,
                        signal,
                        ops: Vec::new(),
                    });
                    lane_queue.push(queues.len() - 1);
                }
            }
        }
        let queue_count = queues.len();

        let mut ops: Vec<PlannedOp> = Vec::with_capacity(schedule.ops.len());
        // The clock of each queue at its current end, and after each op.
        let mut known: Vec<Clock> = vec![vec![0; queue_count]; queue_count];
        let mut op_clock: Vec<Clock> = Vec::with_capacity(schedule.ops.len());
        let mut counts = vec![0u64; queue_count];
        // For each queue and value, the op it stands for.
        let mut op_at: Vec<Vec<usize>> = vec![Vec::new(); queue_count];

        // Plan two runs back to back and keep the second: its waits cover
        // hazards within a run and against the run before it.
        let n = schedule.ops.len();
        let mut doubled: Vec<DoubledOp> = Vec::with_capacity(2 * n);
        for index in 0..2 * n {
            let op = index % n;
            let queue = lane_queue[op_lane[op]];
            // The latest conflicting earlier op on each other queue.
            let mut needed: Vec<Option<(usize, Hazard, Access)>> = vec![None; queue_count];
            let (reads, writes) = &accesses[op];
            for earlier in 0..index {
                let other = doubled[earlier].0;
                if other == queue {
                    continue;
                }
                let (earlier_reads, earlier_writes) = &accesses[earlier % n];
                if let Some((hazard, access)) =
                    conflict(reads, writes, earlier_reads, earlier_writes)
                {
                    let later = needed[other]
                        .as_ref()
                        .is_none_or(|(e, _, _)| doubled[*e].1 < doubled[earlier].1);
                    if later {
                        needed[other] = Some((earlier, hazard, access));
                    }
                }
            }
            // Drop what this queue already knows, and what another needed
            // wait implies.
            let candidates: Vec<(usize, usize, Hazard, Access)> = needed
                .into_iter()
                .enumerate()
                .filter_map(|(q, n)| n.map(|(e, h, a)| (q, e, h, a)))
                .filter(|(q, e, _, _)| known[queue][*q] < doubled[*e].1)
                .collect();
            let mut waits = Vec::new();
            for (q, earlier, hazard, access) in &candidates {
                let value = doubled[*earlier].1;
                let implied_by_other = candidates
                    .iter()
                    .any(|(q2, e2, _, _)| q2 != q && op_clock[*e2][*q] >= value);
                if !implied_by_other {
                    waits.push((*q, value, *earlier, *hazard, access.clone()));
                }
            }
            // Everything the waited-on ops knew, this queue now knows.
            for (_, earlier, _, _) in &candidates {
                let merged = op_clock[*earlier].clone();
                for (slot, v) in known[queue].iter_mut().zip(merged) {
                    *slot = (*slot).max(v);
                }
            }
            counts[queue] += 1;
            let value = counts[queue];
            known[queue][queue] = value;
            op_clock.push(known[queue].clone());
            doubled.push((queue, value, waits));
        }
        // Values per run; the second copy's values are `per_run + v`.
        for count in &mut counts {
            *count /= 2;
        }
        for (index, (queue, value, waits)) in doubled.into_iter().enumerate().skip(n) {
            let op = &schedule.ops[index - n];
            let waits = waits
                .into_iter()
                .map(|(q, value, earlier, hazard, access)| {
                    let previous_run = earlier < n;
                    let buffer = &schedule.buffers[access.buffer.0].name;
                    PlannedWait {
                        queue: q,
                        value: if previous_run {
                            value
                        } else {
                            value - counts[q]
                        },
                        previous_run,
                        after: OpId(earlier % n),
                        reason: format!(
                            "{hazard} on `{buffer}` [{}, {}) after `{}`{}",
                            access.range.start,
                            access.range.end,
                            schedule.ops[earlier % n].name,
                            if previous_run {
                                " of the previous run"
                            } else {
                                ""
                            }
                        ),
                    }
                })
                .collect();
            op_at[queue].push(index - n);
            ops.push(PlannedOp {
                name: op.name.clone(),
                queue,
                value: value - counts[queue],
                waits,
                program: match &op.work {
                    Work::Exec { program, .. } => Some(program.name().to_owned()),
                    Work::Copy { .. } => None,
                },
            });
        }
        for (queue, planned) in queues.iter_mut().enumerate() {
            planned.ops = op_at[queue].clone();
        }
        let host = if queues.iter().any(|q| q.queue.is_none()) {
            let (sender, receiver) = mpsc::channel();
            spawn("hwqueue-executor-host".into(), move || {
                run_host_stage::<B>(receiver)
            })
            .map_err(|e| Error::System {
                what: "spawning the executor's host stage",
                detail: e.to_string(),
            })?;
            Some(sender)
        } else {
            None
        };
        let signals = queues.iter().map(|q| q.signal.clone()).collect();
        Ok(Plan {
            queues,
            facts: Arc::new(PlanFacts {
                ops,
                signals,
                counts,
            }),
            schedule,
            host,
            runs: 0,
        })
    }

    /// The first hazard between a later op (reads, writes) and an earlier one.
    fn conflict(
        reads: &[Access],
        writes: &[Access],
        earlier_reads: &[Access],
        earlier_writes: &[Access],
    ) -> Option<(Hazard, Access)> {
        for w in earlier_writes {
            if let Some(r) = reads.iter().find(|r| r.overlaps(w)) {
                return Some((Hazard::ReadAfterWrite, overlap(r, w)));
            }
        }
        for r in earlier_reads {
            if let Some(w) = writes.iter().find(|w| w.overlaps(r)) {
                return Some((Hazard::WriteAfterRead, overlap(w, r)));
            }
        }
        for w in earlier_writes {
            if let Some(w2) = writes.iter().find(|w2| w2.overlaps(w)) {
                return Some((Hazard::WriteAfterWrite, overlap(w2, w)));
            }
        }
        None
    }

    fn overlap(a: &Access, b: &Access) -> Access {
        Access {
            buffer: a.buffer,
            range: a.range.start.max(b.range.start)..a.range.end.min(b.range.end),
        }
    }

    fn effective_accesses<B: Backend>(
        schedule: &Schedule<B>,
        op: &Op<B>,
    ) -> (Vec<Access>, Vec<Access>) {
        let whole = |buffer: BufferId| Access {
            buffer,
            range: 0..schedule.buffers[buffer.0].buffer.size(),
        };
        match &op.work {
            Work::Exec { buffers, .. } => {
                let declared = op.reads.is_some() || op.writes.is_some();
                if declared {
                    (
                        op.reads.clone().unwrap_or_default(),
                        op.writes.clone().unwrap_or_default(),
                    )
                } else {
                    let all: Vec<Access> = buffers.iter().map(|b| whole(*b)).collect();
                    (all.clone(), all)
                }
            }
            Work::Copy { dst, src } => {
                let mut reads = vec![whole(*src)];
                let mut writes = vec![whole(*dst)];
                reads.extend(op.reads.iter().flatten().cloned());
                writes.extend(op.writes.iter().flatten().cloned());
                (reads, writes)
            }
        }
    }

    fn lane_of<B: Backend>(schedule: &Schedule<B>, op: &Op<B>) -> Lane {
        match op.work {
            Work::Copy { dst, src } => {
                let (d, s) = (
                    schedule.buffers[dst.0].device,
                    schedule.buffers[src.0].device,
                );
                if d == s {
                    Lane::Device {
                        device: d,
                        kind: op.kind,
                    }
                } else {
                    Lane::Host
                }
            }
            Work::Exec { .. } => Lane::Device {
                device: op.device,
                kind: op.kind,
            },
        }
    }

    type MadeQueue<B> = (
        Lane,
        String,
        Option<<B as Backend>::Queue>,
        <B as Backend>::Signal,
    );

    /// Makes a lane's queue and signal; returns the lane it resolved to.
    fn make_queue<B: Backend>(schedule: &Schedule<B>, lane: Lane) -> Result<MadeQueue<B>> {
        use crate::device::Device;
        match lane {
            Lane::Host => {
                // The host stage's signal comes from the first device.
                let device = &schedule.devices[0];
                Ok((lane, "host".into(), None, device.new_signal(0)?))
            }
            Lane::Device { device, kind } => {
                let dev = &schedule.devices[device.0];
                let label = |kind: QueueKind| format!("{} {kind}", dev.spec());
                let compute = Lane::Device {
                    device,
                    kind: QueueKind::Compute,
                };
                let (lane, label, queue) = match kind {
                    QueueKind::Copy => match dev.copy_queue()? {
                        Some(queue) => (lane, label(QueueKind::Copy), queue),
                        None => (compute, label(QueueKind::Compute), dev.compute_queue()?),
                    },
                    QueueKind::Compute => (lane, label(QueueKind::Compute), dev.compute_queue()?),
                };
                Ok((lane, label, Some(queue), dev.new_signal(0)?))
            }
        }
    }

    fn validate<B: Backend>(schedule: &Schedule<B>) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidSchedule { reason });
        if schedule.devices.is_empty() && !schedule.ops.is_empty() {
            return invalid("no device was added; call `add_device` first".into());
        }
        for (index, slot) in schedule.buffers.iter().enumerate() {
            if slot.device.0 >= schedule.devices.len() {
                return invalid(format!(
                    "buffer {index} (`{}`) names an unknown device",
                    slot.name
                ));
            }
        }
        let buffer = |op: &Op<B>, id: BufferId| -> Result<&BufferSlot<B>> {
            schedule
                .buffers
                .get(id.0)
                .ok_or_else(|| Error::InvalidSchedule {
                    reason: format!("operation `{}` names unknown buffer {}", op.name, id.0),
                })
        };
        for op in &schedule.ops {
            for access in op.reads.iter().flatten().chain(op.writes.iter().flatten()) {
                let slot = buffer(op, access.buffer)?;
                let size = slot.buffer.size();
                if access.range.start > access.range.end || access.range.end > size {
                    return invalid(format!(
                        "operation `{}` declares bytes [{}, {}) of `{}`, which holds {size} bytes",
                        op.name, access.range.start, access.range.end, slot.name
                    ));
                }
            }
            match &op.work {
                Work::Exec { buffers, .. } => {
                    if op.device.0 >= schedule.devices.len() {
                        return invalid(format!("operation `{}` names an unknown device", op.name));
                    }
                    if op.kind == QueueKind::Copy {
                        return invalid(format!(
                            "operation `{}` is an exec on a copy queue; leave it on the compute queue",
                            op.name
                        ));
                    }
                    for id in buffers {
                        let slot = buffer(op, *id)?;
                        if slot.device != op.device {
                            return invalid(format!(
                                "exec `{}` runs on device {} but its buffer `{}` lives on device {}; \
                                 copy it over first",
                                op.name, op.device.0, slot.name, slot.device.0
                            ));
                        }
                    }
                }
                Work::Copy { dst, src } => {
                    let (d, s) = (buffer(op, *dst)?, buffer(op, *src)?);
                    if d.buffer.size() != s.buffer.size() {
                        return invalid(format!(
                            "copy `{}` from `{}` ({} bytes) to `{}` ({} bytes): sizes differ; copies \
                             move whole buffers",
                            op.name,
                            s.name,
                            s.buffer.size(),
                            d.name,
                            d.buffer.size()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
