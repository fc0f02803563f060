//! How a plan's runs are ordered, in one place: the values each run sets
//! on each queue's timeline, which of them a run waits for, and the rules
//! that decide it, used by every path that records, refuses or fails a run
//! (`plan.rs`), by the bindings (`binding.rs`), by the host stage
//! (`host.rs`) and by [`Run`](super::Run); and why each wait is there,
//! for people ([`WaitReason`]).
//!
//! - **Signals per run.** Each run sets signals of its own, one per queue
//!   ([`Timelines`]; those of a settled run whose handle is gone are
//!   reused, [`InFlight::start`]): a later run never raises a value this
//!   run failed past it, so a [`Run`](super::Run) reports its own failure
//!   however late it is asked, and never another's.
//! - **Values.** A run sets, on queue `q`, `n_q` values (one per
//!   operation, in queue order) past where its signals' last run ended
//!   ([`PlanFacts::value`], [`PlanFacts::end`]).
//! - **Waits within a run** fail with their value: an operation whose
//!   input failed does not run. **Waits on the run before** are *settled*
//!   (`wait_settled`: a failure passes them) and dropped once that run
//!   settled ([`PlanFacts::wait_to_record`]). The plan's queues scope a
//!   failure to its batch (`FailureScope::Batch`): later runs' batches
//!   run, and a failed batch still honours its later waits before failing
//!   the values after them (the host stage does the same), so a value
//!   settles only after what it waited for. The order the planner implied
//!   through another queue's wait then holds whether that run failed or
//!   not: its surviving operations are waited for before a later run
//!   touches their bytes.
//! - **Across backends.** A plan over two backends (a CPU and a GPU, or
//!   the host stage between them) waits on another backend's signal
//!   wherever the planner put a wait between their queues. Within a run
//!   that is [`wait`](crate::HardwareQueue::wait), which a backend set's
//!   queue turns into `wait_foreign`. On the run before it must stay
//!   settled, so it is [`wait_foreign_settled`](crate::HardwareQueue::wait_foreign_settled):
//!   a foreign wait whose awaited value's failure settles it, run by each
//!   engine as any foreign wait (the CPU's worker blocks on the signal, a
//!   GPU queue hands the rest of its batch to a host thread). A failed
//!   value still settles only after what its batch waited for before it
//!   (the drain above), so the order holds across backends too, whether
//!   that run failed or not. The host stage waits on any backend's
//!   signals from its own thread, settled the same way.
//! - **Runs ordered by the bytes they touch.** A binding that takes bytes an
//!   earlier binding of any slot used in a run still in flight (another
//!   slot's, or the same slot's at other offsets), and a run a queue
//!   refused (its unsubmitted operations' waits are gone), make the next
//!   run wait for that run whole, settled ([`PlanFacts::barrier_waits`]).
//! - **Refusal and failure fail only the run's own values,** in each
//!   queue's order (the queue core's abandoned batches; the host stage's
//!   in-order failure), never a run in flight before it
//!   (`Plan::fail_in_order`). A `submit` that reports an earlier run's
//!   failure (`QueueFailed`, once per failure) keeps the batch, and is
//!   called again until the batch records or the queue refuses it: one
//!   run's failure is never taken for another's refusal. A queue that
//!   takes no more work (stalled) reports one cause at every call: the
//!   same cause twice refuses the run. A refused run's
//!   batch on the refusing queue is discarded, never sent with the next
//!   run's. The collectives of the queues that recorded nothing of a
//!   refused run still take their places, forfeited
//!   ([`HardwareQueue::forfeit_collective`]): this rank's next run meets
//!   its peers' next, never the run they ran alone.
//! - **The host stage holds uses** of every buffer made by `alloca` that
//!   its copies read or write, from when the run is recorded until the
//!   copy settled, as a device queue's batch does: a `dealloca` recorded
//!   after `run` does not take the bytes from under it (it reads and
//!   writes them with `Buffer::queue_read_at` and `queue_write_at`).

use std::collections::VecDeque;

use super::schedule::*;
use super::*;

/// Where a run stopped being recorded (`Plan::fail_in_order`).
#[derive(Clone, Copy)]
pub(super) enum Refused {
    /// Before any queue's batch: none recorded anything.
    Unrecorded,
    /// By queue `0`, which submitted its batch, refused, with every
    /// operation of the run recorded; the later queues recorded nothing.
    By(usize),
}

impl Refused {
    /// The first queue whose values the run fails, and the first of those
    /// that recorded nothing of it.
    pub(super) fn queues(self) -> (usize, usize) {
        match self {
            Refused::Unrecorded => (0, 0),
            Refused::By(queue) => (queue, queue + 1),
        }
    }
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
    /// Which way the two operations conflict.
    pub hazard: Hazard,
    /// The buffer they conflict on.
    pub buffer: BufferId,
    /// The bytes of it both touch.
    pub range: Range<usize>,
}

pub(super) struct PlannedOp {
    pub(super) name: String,
    pub(super) queue: usize,
    /// This operation's value on its queue's timeline, within one run.
    pub(super) value: u64,
    pub(super) waits: Vec<PlannedWait>,
    /// Program name for execs (to match kernel errors).
    pub(super) program: Option<String>,
}

/// The shared, immutable facts of a plan that a [`Run`] needs to explain a
/// failure.
pub(super) struct PlanFacts {
    pub(super) ops: Vec<PlannedOp>,
    /// Operations a run, per queue.
    pub(super) counts: Vec<u64>,
}

/// The signals one run sets, one per queue (see the module docs): its own,
/// so that a later run, however soon it is recorded, never raises a value
/// this run failed past it, and the run's handle reports the failure for
/// as long as it lives.
pub(super) struct Timelines<B: Backend> {
    pub(super) run: u64,
    /// How many runs set these signals before this one (they are reused
    /// once a run settled and its handle was dropped).
    pub(super) uses: u64,
    pub(super) signals: Vec<B::Signal>,
}

impl PlanFacts {
    /// Value `value` (within a run) of `queue` in the run of `timelines`.
    pub(super) fn value<B: Backend>(
        &self,
        timelines: &Timelines<B>,
        queue: usize,
        value: u64,
    ) -> u64 {
        timelines.uses * self.counts[queue] + value
    }

    /// The value that ends the run of `timelines` on `queue`.
    pub(super) fn end<B: Backend>(&self, timelines: &Timelines<B>, queue: usize) -> u64 {
        self.value(timelines, queue, self.counts[queue])
    }

    /// Whether `queue`'s signal of `timelines` is short of `value` and has
    /// not failed there: a wait for it would block. Never blocks.
    pub(super) fn pending<B: Backend>(timelines: &Timelines<B>, queue: usize, value: u64) -> bool {
        !timelines.signals[queue].is_settled(value)
    }

    /// Whether the run of `timelines` ended on every queue: completed, or
    /// failed.
    pub(super) fn settled<B: Backend>(&self, timelines: &Timelines<B>) -> bool {
        (0..self.counts.len())
            .all(|queue| !Self::pending(timelines, queue, self.end(timelines, queue)))
    }

    /// What to record for `wait` in the run of `current`, `previous` being
    /// the run before it while in flight (`None` once it settled, or
    /// before the first run): the signal, the value, and whether the wait
    /// is *settled* (a failure of the value passes it). A wait within the
    /// run fails with its value: the operation's input never came. A wait
    /// on the previous run is settled: that run's failure is its own, and
    /// a value it failed settles only after what it waited for (the
    /// queues drain, `FailureScope::Batch`), so the order the planner
    /// implied through it holds. `None` when no wait is needed (a value
    /// of the previous run that settled, or of no run).
    pub(super) fn wait_to_record<'a, B: Backend>(
        &self,
        wait: &PlannedWait,
        current: &'a Timelines<B>,
        previous: Option<&'a Timelines<B>>,
    ) -> Option<(&'a B::Signal, u64, bool)> {
        if !wait.previous_run {
            let value = self.value(current, wait.queue, wait.value);
            return Some((&current.signals[wait.queue], value, false));
        }
        let previous = previous?;
        let value = self.value(previous, wait.queue, wait.value);
        Self::pending(previous, wait.queue, value).then_some((
            &previous.signals[wait.queue],
            value,
            true,
        ))
    }

    /// The waits that make queue `own` start after the run of `barrier`
    /// ended on every other queue (settled: reached or failed), where it
    /// has not yet.
    pub(super) fn barrier_waits<'a, B: Backend>(
        &'a self,
        barrier: Option<&'a Timelines<B>>,
        own: usize,
    ) -> impl Iterator<Item = (&'a B::Signal, u64)> + 'a {
        barrier.into_iter().flat_map(move |timelines| {
            (0..self.counts.len())
                .filter(move |&q| q != own)
                .map(move |q| (q, self.end(timelines, q)))
                .filter(move |&(q, value)| Self::pending(timelines, q, value))
                .map(move |(q, value)| (&timelines.signals[q], value))
        })
    }
}

/// How many settled runs' signals a plan keeps to reuse.
const SPARE_TIMELINES: usize = 4;

/// A plan's runs that may be in flight, oldest first, with their signals;
/// and the signals of runs that settled, kept to reuse.
pub(super) struct InFlight<B: Backend> {
    recent: VecDeque<std::sync::Arc<Timelines<B>>>,
    spare: Vec<std::sync::Arc<Timelines<B>>>,
    /// Per queue, the device that makes its signals.
    devices: Vec<Arc<B::Device>>,
}

impl<B: Backend> InFlight<B> {
    pub(super) fn new(devices: Vec<Arc<B::Device>>) -> Self {
        Self {
            recent: VecDeque::new(),
            spare: Vec::new(),
            devices,
        }
    }

    /// Run `run`, while it may be in flight (`None` once it settled and
    /// was let go, and for a run never started).
    pub(super) fn get(&self, run: u64) -> Option<&std::sync::Arc<Timelines<B>>> {
        let front = self.recent.front()?.run;
        let at = usize::try_from(run.checked_sub(front)?).ok()?;
        self.recent.get(at).filter(|t| t.run == run)
    }

    /// Whether run `run` may still be in flight on some queue. Never blocks.
    pub(super) fn in_flight(&self, facts: &PlanFacts, run: u64) -> bool {
        self.get(run).is_some_and(|t| !facts.settled(t))
    }

    /// The signals for run `run`, the next: a settled run's whose handle is
    /// gone (values go on rising from where it ended), else new ones.
    /// Settled runs at the front stop being watched first.
    pub(super) fn start(
        &mut self,
        facts: &PlanFacts,
        run: u64,
    ) -> Result<std::sync::Arc<Timelines<B>>> {
        while self.recent.front().is_some_and(|t| facts.settled(t)) {
            let done = self.recent.pop_front().expect("looked at");
            if self.spare.len() == SPARE_TIMELINES {
                // Make room by forgetting one a handle still holds.
                match self
                    .spare
                    .iter()
                    .position(|t| std::sync::Arc::strong_count(t) > 1)
                {
                    Some(held) => drop(self.spare.swap_remove(held)),
                    None => continue,
                }
            }
            self.spare.push(done);
        }
        let reusable = self
            .spare
            .iter_mut()
            .position(|t| std::sync::Arc::get_mut(t).is_some());
        let timelines = match reusable {
            Some(at) => {
                let mut timelines = self.spare.swap_remove(at);
                let reused = std::sync::Arc::get_mut(&mut timelines).expect("no other handle");
                reused.run = run;
                reused.uses += 1;
                timelines
            }
            None => std::sync::Arc::new(Timelines {
                run,
                uses: 0,
                signals: self
                    .devices
                    .iter()
                    .map(|device| QueueFactory::new_signal(&**device, 0))
                    .collect::<Result<_>>()?,
            }),
        };
        self.recent.push_back(timelines.clone());
        Ok(timelines)
    }
}

/// Each slot's view, as some runs were bound.
pub(super) type SlotViews<B> = Vec<(BufferId, View<B>)>;

/// The bindings of a plan's slots over its runs: what the rule that orders
/// runs by the bytes they touch compares (`binding.rs` keeps them).
pub(super) struct Bindings<B: Backend> {
    /// The roots that are slots.
    pub(super) slots: Vec<BufferId>,
    /// The roots that are buffers of the schedule (arenas included).
    pub(super) buffers: Vec<BufferId>,
    /// Per root: whether some operation writes it, reads it.
    pub(super) written: Vec<bool>,
    pub(super) read: Vec<bool>,
    /// Whether a binding changed since the last run.
    pub(super) changed: bool,
    /// The bindings of the runs since the last change, and the last of
    /// those runs (`None` until one ran).
    pub(super) current: (SlotViews<B>, Option<u64>),
    /// Earlier bindings, with the last run that used them, while that run
    /// may be in flight.
    pub(super) history: VecDeque<(SlotViews<B>, u64)>,
    /// The run the next run must wait for, whole.
    pub(super) barrier: Option<u64>,
}

impl<B: Backend> Bindings<B> {
    pub(super) fn new(schedule: &Schedule<B>, accesses: &[(Vec<Access>, Vec<Access>)]) -> Self {
        let roots = |origin: Origin| -> Vec<BufferId> {
            (0..schedule.buffers.len())
                .map(BufferId)
                .filter(|id| {
                    let slot = &schedule.buffers[id.0];
                    slot.root == *id && slot.origin == origin
                })
                .collect()
        };
        let mut written = vec![false; schedule.buffers.len()];
        let mut read = vec![false; schedule.buffers.len()];
        for (reads, writes) in accesses {
            for access in reads {
                read[access.buffer.0] = true;
            }
            for access in writes {
                written[access.buffer.0] = true;
            }
        }
        let slots = roots(Origin::Slot);
        Self {
            changed: !slots.is_empty(),
            slots,
            buffers: roots(Origin::Buffer),
            written,
            read,
            current: (Vec::new(), None),
            history: VecDeque::new(),
            barrier: None,
        }
    }
}

impl<B: Backend> Bindings<B> {
    /// Whether bindings `a` and `b` (their views `va`, `vb`) break the
    /// plan's hazards: they share bytes and the plan writes one of them.
    pub(super) fn clash(
        &self,
        (a, va): (BufferId, &View<B>),
        (b, vb): (BufferId, &View<B>),
    ) -> bool {
        let used = |id: BufferId| self.written[id.0] || self.read[id.0];
        used(a) && used(b) && (self.written[a.0] || self.written[b.0]) && va.overlaps(vb)
    }
}

/// Whether two views name exactly the same bytes of one buffer.
pub(super) fn same_bytes<B: Backend>(a: &View<B>, b: &View<B>) -> bool {
    crate::buffer::Buffer::same_as(a.buffer(), b.buffer())
        && a.offset() == b.offset()
        && a.len() == b.len()
}

/// Why an operation waits: [`Plan::reason`]. Displays as, for example,
/// ``read-after-write on `arena` [0, 4096) (`hidden`) after `matmul1` ``.
pub struct WaitReason<'a, B: Backend> {
    schedule: &'a Schedule<B>,
    op: OpId,
    wait: &'a PlannedWait,
}

impl<'a, B: Backend> WaitReason<'a, B> {
    pub(super) fn new(schedule: &'a Schedule<B>, op: OpId, wait: &'a PlannedWait) -> Self {
        Self { schedule, op, wait }
    }
}

impl<B: Backend> fmt::Display for WaitReason<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wait = self.wait;
        let ops = &self.schedule.ops;
        let (Some(later), Some(earlier), Some(buffer)) = (
            ops.get(self.op.0),
            ops.get(wait.after.0),
            self.schedule.buffers.get(wait.buffer.0),
        ) else {
            return f.write_str("a wait of another plan's (its operation is not this plan's)");
        };
        write!(
            f,
            "{} on `{}` [{}, {})",
            wait.hazard, buffer.name, wait.range.start, wait.range.end
        )?;
        super::schedule::write_tensors_at(
            f,
            self.schedule,
            later,
            earlier,
            wait.buffer,
            &wait.range,
        )?;
        write!(f, " after `{}`", earlier.name)?;
        if wait.previous_run {
            f.write_str(" of the previous run")?;
        }
        Ok(())
    }
}

impl<B: Backend> fmt::Debug for WaitReason<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
