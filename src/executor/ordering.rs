//! How a plan's runs are ordered, in one place: the values each run sets
//! on each queue's timeline, which of them a run waits for, and the rules
//! that decide it, used by every path that records, refuses or fails a run
//! (`plan.rs`), by the bindings (`binding.rs`) and by [`Run`](super::Run).
//!
//! - **Values.** Run `r` sets, on queue `q`, the values `r * n_q + 1 ..=
//!   (r + 1) * n_q` (`n_q` operations a run), one per operation, in queue
//!   order ([`PlanFacts::end_of`]).
//! - **Waits within and across runs.** The planner's waits
//!   ([`PlannedWait`]) are recorded with their run's values
//!   ([`PlanFacts::target`]); a wait on the previous run is dropped when
//!   its value is no longer pending (reached, or failed: the failed run's
//!   later operations never run) ([`PlanFacts::wait_to_record`]).
//! - **Runs ordered by the bytes they touch.** A binding that takes bytes an
//!   earlier binding of any slot used in a run still in flight (another
//!   slot's, or the same slot's at other offsets), and a previous run that
//!   failed on some queue while it may still run on others
//!   ([`PlanFacts::failed_run_before`]), make the next run wait for that
//!   run whole ([`PlanFacts::barrier_waits`]).
//! - **Refusal and failure fail only the run's own values,** in each
//!   queue's order (the queue core's abandoned batches; the host stage's
//!   in-order failure), never a run in flight before it
//!   (`Plan::fail_in_order`).

use std::collections::VecDeque;

use super::schedule::*;
use super::*;

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
pub(super) struct PlanFacts<B: Backend> {
    pub(super) ops: Vec<PlannedOp>,
    pub(super) signals: Vec<B::Signal>,
    pub(super) counts: Vec<u64>,
}

impl<B: Backend> PlanFacts<B> {
    /// The value `wait` stands for in run `run`; `None` when it is of the
    /// run before the first, which needs no wait.
    pub(super) fn target(&self, run: u64, wait: &PlannedWait) -> Option<u64> {
        let per_run = self.counts[wait.queue];
        if wait.previous_run {
            run.checked_sub(1)
                .map(|previous| previous * per_run + wait.value)
        } else {
            Some(run * per_run + wait.value)
        }
    }

    /// The value to record a wait for in run `run`, or `None` when no wait
    /// is needed: a previous-run value that is not [`pending`](Self::pending)
    /// (the failed run's later operations never run, so there is nothing
    /// to race; the new run must not inherit the failure).
    pub(super) fn wait_to_record(&self, run: u64, wait: &PlannedWait) -> Option<u64> {
        let target = self.target(run, wait)?;
        (!wait.previous_run || self.pending(wait.queue, target)).then_some(target)
    }

    /// The value that ends run `run` on `queue`.
    pub(super) fn end_of(&self, run: u64, queue: usize) -> u64 {
        (run + 1) * self.counts[queue]
    }

    /// Whether `queue`'s signal is short of `value` and has not failed
    /// there: a wait for it would block. Never blocks.
    pub(super) fn pending(&self, queue: usize, value: u64) -> bool {
        matches!(
            self.signals[queue].wait(value, std::time::Duration::ZERO),
            Err(Error::Timeout { .. })
        )
    }

    /// The run before `run`, where it failed on some queue and may still
    /// run on another. Its failed values are not waited for (they never
    /// come), and so neither is what the planner dropped as implied by
    /// them: a wait on queue B's value implied queue A's earlier one, which
    /// B had waited for, but B failed before it waited. The new run then
    /// waits for the previous one whole ([`barrier_waits`](Self::barrier_waits):
    /// every value still pending), so a surviving operation of it never
    /// races the new run.
    pub(super) fn failed_run_before(&self, run: u64) -> Option<u64> {
        let previous = run.checked_sub(1)?;
        (0..self.signals.len())
            .any(|queue| {
                let end = self.end_of(previous, queue);
                !self.signals[queue].is_reached(end) && !self.pending(queue, end)
            })
            .then_some(previous)
    }

    /// The waits that make queue `own` start after run `barrier` ended on
    /// every other queue: its end there, where still pending (a value
    /// reached or failed needs none).
    pub(super) fn barrier_waits(&self, barrier: Option<u64>, own: usize) -> Vec<(usize, u64)> {
        let Some(previous) = barrier else {
            return Vec::new();
        };
        (0..self.signals.len())
            .filter(|&q| q != own)
            .map(|q| (q, self.end_of(previous, q)))
            .filter(|&(q, value)| self.pending(q, value))
            .collect()
    }

    /// Whether run `run` ended on every queue: completed, or failed.
    pub(super) fn settled(&self, run: u64) -> bool {
        (0..self.signals.len()).all(|queue| !self.pending(queue, self.end_of(run, queue)))
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
