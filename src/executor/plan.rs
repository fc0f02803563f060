//! A planned schedule: its queues, waits and values, and how a run is
//! recorded and submitted.

use crate::profile::ProfileEvent;
use crate::sync::mpsc;

use super::host::{HostBatch, HostJob};
use super::ordering::{Bindings, InFlight, PlanFacts, PlannedWait, Refused, Timelines, WaitReason};
use super::replay::Stretches;
use super::run::Run;
use super::schedule::*;
use super::staged::Staged;
use super::*;

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Lane {
    Device { device: DeviceId, kind: QueueKind },
    Host,
}

pub(super) struct PlannedQueue<B: Backend> {
    pub(super) label: crate::profile::Name,
    /// `None` for the host stage.
    pub(super) queue: Option<B::Queue>,
    /// Operations in queue order.
    pub(super) ops: Vec<usize>,
    /// Its runs of kernels, for runs that repeat their programs.
    pub(super) stretches: Stretches,
    /// Its groups of sends and receives (`collective::p2p_groups`).
    pub(super) p2p_groups: Vec<Range<usize>>,
}

/// A planned schedule: run it as often as needed with [`Plan::run`].
pub struct Plan<B: Backend> {
    pub(super) queues: Vec<PlannedQueue<B>>,
    pub(super) facts: Arc<PlanFacts>,
    /// The runs that may be in flight, and the signals each sets.
    pub(super) in_flight: InFlight<B>,
    /// The last run a queue refused: the next run waits for it whole.
    pub(super) refused: Option<u64>,
    pub(super) schedule: Schedule<B>,
    pub(super) host: Option<mpsc::Sender<HostBatch<B>>>,
    pub(super) runs: u64,
    /// Per operation, the host side of an upload or download staged for
    /// the next run.
    pub(super) staged: Vec<Option<Staged<B>>>,
    /// The uploads and downloads among the operations.
    pub(super) transfers: Vec<usize>,
    /// Per scalar slot, its value for the next run.
    pub(super) scalar_values: Vec<Scalar>,
    /// An exec's scalars with the slots' values filled in.
    pub(super) scratch: Vec<Scalar>,
    pub(super) memory: PlanMemory,
    pub(super) bindings: Bindings<B>,
    /// Whether each run's batches are marked for replay
    /// ([`set_replay`](Self::set_replay)).
    pub(super) replay: bool,
    /// Counts the changes to what a run's kernels are given (bindings,
    /// scalars) or how they run (replay, profiling): see `replay.rs`.
    pub(super) edits: u64,
}

impl<B: Backend> Plan<B> {
    /// Records and submits one run with fresh timeline values; returns at once.
    /// It consumes the host data staged for the plan's uploads and
    /// downloads ([`upload`](Self::upload), [`download`](Self::download)).
    ///
    /// It takes the buffers bound to the plan's slots ([`bind`](Self::bind))
    /// and the values of its scalar slots ([`set_scalar`](Self::set_scalar))
    /// as they are now.
    ///
    /// # Errors
    /// [`Error::SlotUnbound`] when a slot has no buffer bound;
    /// [`Error::InvalidBinding`] when two bindings, or a binding and a
    /// buffer of the schedule, share bytes that the plan writes;
    /// [`Error::TransferNotStaged`] when an upload or download has nothing
    /// staged (in those three cases nothing is recorded, and what was
    /// staged stays: the peers' collectives wait for this rank's next run);
    /// when a queue refuses the batch (a command the backend rejects, or a
    /// queue that takes no more work), in which case every download staged
    /// for the run that was not yet submitted fails with that error (one
    /// a queue submitted before the refusing one still runs), and its
    /// collectives take their places, failed on this rank.
    pub fn run(&mut self) -> Result<Run<B>> {
        let refused = self
            .refused
            .filter(|&run| self.in_flight.in_flight(&self.facts, run));
        let barrier = self.check_bindings()?.max(refused);
        let mut staged = self.take_staged()?;
        let result = (self.in_flight.start(&self.facts, self.runs)).and_then(|timelines| {
            // Used once it starts: a run without values leaves the barrier.
            self.bindings_used(self.runs);
            self.record_and_submit(&mut staged, barrier, &timelines)
        });
        if let Err(error) = &result {
            // What was staged and never recorded: its downloads learn why.
            for leftover in staged.into_iter().flatten() {
                leftover.fail(error);
            }
        }
        result
    }

    fn record_and_submit(
        &mut self,
        staged: &mut [Option<Staged<B>>],
        barrier: Option<u64>,
        timelines: &std::sync::Arc<Timelines<B>>,
    ) -> Result<Run<B>> {
        let run = self.runs;
        self.runs += 1;
        let facts = self.facts.clone();
        let own_value = |queue: usize, value: u64| facts.value(timelines, queue, value);
        let previous = run
            .checked_sub(1)
            .and_then(|r| self.in_flight.get(r))
            .cloned();
        let previous = previous.as_deref();
        // The run to wait for whole (a binding took bytes it used, or a
        // queue refused it): each queue starts after it ended on every
        // other queue, where it has not yet (see `ordering`).
        let barrier = barrier.and_then(|r| self.in_flight.get(r)).cloned();
        let barrier = barrier.as_deref();
        let barrier_waits = |own: usize| facts.barrier_waits(barrier, own);
        let view = |id: BufferId| -> Result<View<B>> {
            self.schedule.buffers[id.0]
                .buffer
                .clone()
                .ok_or_else(|| Error::InvalidSchedule {
                    reason: format!(
                        "buffer `{}` has no bytes at record time (a bug in the executor)",
                        self.schedule.buffers[id.0].name
                    ),
                })
        };
        let mut host_jobs = Vec::new();
        for (index, planned) in self.queues.iter().enumerate() {
            if planned.queue.is_some() {
                continue;
            }
            for (position, &op) in planned.ops.iter().enumerate() {
                let op_plan = &facts.ops[op];
                let Work::Copy { dst, src } = self.schedule.ops[op].work else {
                    unreachable!("only copies between devices run on the host stage");
                };
                let barrier = barrier_waits(index)
                    .filter(|_| position == 0)
                    .map(|(signal, value)| (signal.clone(), value, true));
                let (dst, src) = match view(dst).and_then(|dst| Ok((dst, view(src)?))) {
                    Ok(views) => views,
                    Err(error) => {
                        return Err(self.fail_in_order(timelines, Refused::Unrecorded, error));
                    }
                };
                // Held from now until the job settled, as a batch holds them.
                let uses = match HostJob::take_uses(&dst, &src) {
                    Ok(uses) => uses,
                    Err(error) => {
                        let error = self.refused(run, index, Some(op), error);
                        return Err(self.fail_in_order(timelines, Refused::Unrecorded, error));
                    }
                };
                host_jobs.push(HostJob {
                    waits: op_plan
                        .waits
                        .iter()
                        .filter_map(|w| facts.wait_to_record(w, timelines, previous))
                        .map(|(signal, value, settled)| (signal.clone(), value, settled))
                        .chain(barrier)
                        .collect(),
                    dst,
                    src,
                    signal: timelines.signals[index].clone(),
                    value: own_value(index, op_plan.value),
                    uses,
                });
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut refused = None;
        let (replay, edits) = (self.replay, self.edits);
        // The waits of operation `op` this run records.
        let record_waits = |queue: &mut B::Queue, op: usize| {
            for wait in &facts.ops[op].waits {
                match facts.wait_to_record(wait, timelines, previous) {
                    Some((signal, value, true)) => queue.wait_settled(signal, value),
                    Some((signal, value, false)) => queue.wait(signal, value),
                    None => queue,
                };
            }
        };
        for (index, planned) in self.queues.iter_mut().enumerate() {
            let Some(queue) = planned.queue.as_mut() else {
                continue;
            };
            let key = index as u32;
            let stretches = &planned.stretches;
            // Unchanged since a run recorded its kernels, whose programs
            // the engine still holds: each run of kernels is one command.
            let repeat = replay
                && !stretches.kernels.is_empty()
                && stretches.recorded_at == Some(edits)
                && queue.replay_recorded(key, &stretches.kernels);
            let mut next_stretch = 0;
            // The next group of sends and receives, and where the one
            // being recorded ends (no signal between its members).
            let (mut next_group, mut group_end) = (0, 0);
            // The operation whose command the queue refused, if one is.
            let mut culprit = None;
            for (signal, value) in barrier_waits(index) {
                queue.wait_settled(signal, value);
            }
            let mut position = 0;
            // Operations before this one had their waits recorded before
            // their stretch's first kernel.
            let mut hoisted = 0;
            while position < planned.ops.len() {
                let op = planned.ops[position];
                position += 1;
                let op_plan = &facts.ops[op];
                if position > hoisted {
                    record_waits(queue, op);
                }
                if let Some(group) = planned.p2p_groups.get(next_group)
                    && group.start == position - 1
                {
                    next_group += 1;
                    for &later in &planned.ops[group.start + 1..group.end] {
                        record_waits(queue, later);
                    }
                    (hoisted, group_end) = (hoisted.max(group.end), group.end);
                }
                if replay
                    && let Some(stretch) = stretches.at.get(next_stretch)
                    && stretch.start == position - 1
                {
                    let program = next_stretch as u32;
                    next_stretch += 1;
                    // Its later kernels wait only on the run before
                    // (`Stretches::of`), where that is still pending:
                    // those waits go before its first kernel, so the engine
                    // sees one run of kernels whatever is pending (waiting
                    // earlier on the run before is safe: it waits on
                    // nothing of this run).
                    for &later in &stretches.waiting[program as usize] {
                        record_waits(queue, later);
                    }
                    hoisted = stretch.end;
                    if repeat {
                        // Its kernels are the program's, and its last
                        // value stands for all of its values.
                        queue.replay_program(program);
                        let last = &facts.ops[planned.ops[stretch.end - 1]];
                        queue.signal(&timelines.signals[index], own_value(index, last.value));
                        if culprit.is_none() && queue.rejection().is_some() {
                            culprit = Some(op);
                        }
                        position = stretch.end;
                        continue;
                    }
                }
                let slots = &self.schedule.buffers;
                let bytes = |id: &BufferId| slots[id.0].buffer.as_ref();
                let name = &facts.ops[op].name;
                let bound_scalars = &self.schedule.ops[op].bound_scalars;
                match &self.schedule.ops[op].work {
                    Work::Exec {
                        program,
                        buffers,
                        scalars,
                        params,
                    } => {
                        // The scalar slots' values, where the exec takes some.
                        let scalars: &[Scalar] = if bound_scalars.is_empty() {
                            scalars
                        } else {
                            scratch.clear();
                            scratch.extend_from_slice(scalars);
                            for &(position, slot) in bound_scalars {
                                scratch[position] = self.scalar_values[slot.0];
                            }
                            &scratch
                        };
                        // Gathered on the stack: a replay allocates nothing.
                        let gathered = crate::any::with_gathered(
                            buffers.len(),
                            |index| slots.get(buffers[index].0).and_then(|s| s.buffer.as_ref()),
                            |refs| {
                                queue.exec_views(program, refs, scalars, *params);
                            },
                        );
                        // The planner checked every id and `run` every
                        // binding, so this is a bug: the batch is refused
                        // rather than run without the exec whose value it
                        // would still signal.
                        if gathered.is_err() {
                            unplaced_bug(queue, name);
                        }
                    }
                    Work::Copy { dst, src } => match (bytes(dst), bytes(src)) {
                        (Some(dst), Some(src)) => {
                            queue.copy(dst, src);
                        }
                        _ => unplaced_bug(queue, name),
                    },
                    Work::Upload { dst } => {
                        match (bytes(dst), staged.get_mut(op).and_then(Option::take)) {
                            (Some(dst), Some(Staged::Upload(data))) => {
                                queue.upload_vec::<_, u8, _>(dst, data);
                            }
                            _ => unplaced_bug(queue, name),
                        }
                    }
                    Work::Download { src } => {
                        match (bytes(src), staged.get_mut(op).and_then(Option::take)) {
                            (Some(src), Some(Staged::Download(into))) => into.record(queue, src),
                            _ => unplaced_bug(queue, name),
                        }
                    }
                    Work::Collective(collective) => {
                        super::collective::record(queue, collective, bytes, name);
                    }
                    Work::Fill {
                        dst,
                        pattern,
                        width,
                    } => match bytes(dst) {
                        Some(dst) => {
                            match width {
                                1 => queue.fill(dst, pattern[0]),
                                2 => queue.fill(dst, u16::from_ne_bytes([pattern[0], pattern[1]])),
                                _ => queue.fill(dst, u32::from_ne_bytes(*pattern)),
                            };
                        }
                        None => unplaced_bug(queue, name),
                    },
                }
                if position >= group_end {
                    queue.signal(&timelines.signals[index], own_value(index, op_plan.value));
                }
                if culprit.is_none() && queue.rejection().is_some() {
                    culprit = Some(op);
                }
            }
            if replay {
                // The same commands every run: where the engine has a
                // replay form, recorded once and submitted again.
                queue.replay_as(key);
            }
            // An earlier run's failure is reported once per call, and the
            // batch is kept: submit again until it records (each report is
            // a failure of a batch submitted before, so this ends), or the
            // queue really refuses this batch. A queue that takes no more
            // work (stalled) reports its one cause at every call, having
            // let the batch go: the same cause again refuses the run.
            let mut reported: Option<std::sync::Arc<Error>> = None;
            let submitted = loop {
                match queue.submit() {
                    Err(Error::QueueFailed { cause }) => {
                        if reported
                            .as_ref()
                            .is_some_and(|r| std::sync::Arc::ptr_eq(r, &cause))
                        {
                            break Err(Error::QueueFailed { cause });
                        }
                        reported = Some(cause);
                    }
                    other => break other,
                }
            };
            if let Err(error) = submitted {
                refused = Some((index, error, culprit));
                break;
            }
            if replay && !repeat {
                planned.stretches.recorded_at = Some(edits);
            }
        }
        if let Some((index, error, culprit)) = refused {
            self.scratch = scratch;
            let error = self.refused(run, index, culprit, error);
            // From the refusing queue on: where its batch was not abandoned
            // by the core, it is discarded, never sent with the next run's.
            return Err(self.fail_in_order(timelines, Refused::By(index), error));
        }
        self.scratch = scratch;
        if !host_jobs.is_empty()
            && let Some(host) = &self.host
        {
            let (jobs, fail) = (host_jobs, None);
            if let Err(error) = (HostBatch { jobs, fail }).send(host) {
                // Its values failed at once: the next run waits for it whole.
                self.refused = Some(timelines.run);
                return Err(error);
            }
        }
        Ok(Run {
            run,
            facts,
            timelines: timelines.clone(),
        })
    }

    /// The error of run `run`, refused by queue `queue` at operation
    /// `culprit` (where it said which) with `cause`: naming the run, the
    /// queue, the operation and what its slots were bound to.
    fn refused(&self, run: u64, queue: usize, culprit: Option<usize>, cause: Error) -> Error {
        let buffers = &self.schedule.buffers;
        let bindings = culprit
            .map(|op| {
                let mut slots = super::schedule::named_buffers(&self.schedule.ops[op]);
                // Each slot once, whichever views of it the operation takes.
                for id in &mut slots {
                    *id = buffers[id.0].root;
                }
                slots.retain(|root| buffers[root.0].origin == Origin::Slot);
                slots.sort_unstable_by_key(|root| root.0);
                slots.dedup();
                slots
                    .iter()
                    .map(|root| {
                        let slot = &buffers[root.0];
                        match &slot.buffer {
                            Some(view) => format!(
                                "slot `{}` bound to bytes {}..{} of a buffer of {} bytes",
                                slot.name,
                                view.offset(),
                                view.offset() + view.len(),
                                crate::buffer::Buffer::size(view.buffer())
                            ),
                            None => format!("slot `{}`, unbound", slot.name),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Error::RunRefused {
            run,
            queue: self.queues[queue].label.to_string(),
            operation: culprit.map(|op| self.facts.ops[op].name.clone()),
            bindings,
            cause: std::sync::Arc::new(cause),
        }
    }

    /// Fails the values of the run of `timelines` that nothing will set,
    /// after a queue refused its batch (or the run could not be recorded):
    /// those of the device queues from `first` on, which were not
    /// submitted, and those of the host stage, whose jobs were not sent.
    /// The collectives of the queues that recorded nothing take their places.
    /// Each fails in its queue's order, after the earlier runs' work there
    /// (a batch holding only the run's last signal, rejected with `error`,
    /// so the queue core fails it as it fails every abandoned batch; the
    /// host stage fails after its earlier jobs): a run still in flight is
    /// never failed by this one, and a queue already submitted that waits
    /// on these values wakes with the error instead of hanging. The
    /// refusing queue is among them: the core abandoned a rejected batch
    /// already (its values fail twice, in order, harmlessly), and any
    /// batch it kept is discarded here rather than sent with the next
    /// run's. The waits of the operations not submitted are gone, so the
    /// next run waits for this one whole (`refused`). Returns `error`.
    fn fail_in_order(&mut self, timelines: &Timelines<B>, first: Refused, error: Error) -> Error {
        let (first, unrecorded) = first.queues();
        self.refused = Some(timelines.run);
        // The next run records its kernels again.
        self.edits += 1;
        let facts = &self.facts;
        for (index, planned) in self.queues.iter_mut().enumerate() {
            let last = facts.end(timelines, index);
            let signal = &timelines.signals[index];
            match planned.queue.as_mut() {
                Some(queue) if index >= first => {
                    queue.discard();
                    if index >= unrecorded {
                        let schedule = &self.schedule;
                        super::collective::forfeit(queue, &planned.ops, schedule, &error);
                    }
                    queue.signal(signal, last).reject(error.clone());
                    // Rejected by design: the core fails the signal in order.
                    let _ = queue.submit();
                }
                Some(_) => {}
                None => {
                    if let Some(host) = &self.host {
                        // Failed here, where its thread has exited.
                        let failed = HostBatch {
                            jobs: Vec::new(),
                            fail: Some((signal.clone(), last, error.clone())),
                        };
                        let _ = failed.send(host);
                    }
                }
            }
        }
        error
    }

    /// Where the planner placed the schedule's tensors
    /// ([`Schedule::add_tensor`]): the arena's bytes against the lower
    /// bound and the naive sum, and each tensor's offset and lifetime.
    pub fn memory(&self) -> &PlanMemory {
        &self.memory
    }

    /// The queues, by index: `"cpu:0 compute"`, `"cpu:0 copy"`, `"host"`.
    pub fn queue_labels(&self) -> Vec<&str> {
        self.queues.iter().map(|q| &*q.label).collect()
    }

    /// Why operation `op` waits with `wait`, for people: the hazard, the
    /// buffer's name and the bytes, the tensors sharing them, the
    /// operation waited for. Formatted only when shown.
    pub fn reason<'a>(&'a self, op: OpId, wait: &'a PlannedWait) -> WaitReason<'a, B> {
        WaitReason::new(&self.schedule, op, wait)
    }

    /// The waits inserted before operation `op` (none for an id of
    /// another schedule's).
    pub fn waits_of(&self, op: OpId) -> &[PlannedWait] {
        self.facts.ops.get(op.0).map_or(&[], |op| &op.waits)
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
    /// runs `op`; `None` for an id of another schedule's.
    pub fn queue_of(&self, op: OpId) -> Option<usize> {
        self.facts.ops.get(op.0).map(|op| op.queue)
    }

    /// How many runs were started.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Turns replay on (the default) or off: on, each run's batch on a
    /// device queue is marked for replay
    /// ([`HardwareQueue::replay_as`]), so an engine with a replay form
    /// (Vulkan: command buffers recorded once and submitted again)
    /// records the run's device work once and submits the recording for
    /// every later run with the same bindings and scalars; off, every run
    /// records its commands anew. Either way the runs do the same work,
    /// in the same order, with the same failures.
    pub fn set_replay(&mut self, on: bool) {
        self.replay = on;
        self.edits += 1;
    }

    /// Whether runs are marked for replay ([`set_replay`](Self::set_replay)).
    pub fn replay(&self) -> bool {
        self.replay
    }

    /// What the plan's device queues recorded and replayed, summed
    /// ([`Launches`](crate::Launches)): with replay, a plan of K kernels
    /// run N times records K kernel launches, not K·N, and submits its
    /// recordings again instead; `repeats` counts the recordings a run
    /// named without recording its kernels at all (bindings and scalars
    /// unchanged: see [the module docs](super)); `fallback` says why a run
    /// ran the plain way, where one did.
    pub fn launches(&self) -> crate::Launches {
        let mut total = crate::Launches::default();
        for queue in self.queues.iter().filter_map(|q| q.queue.as_ref()) {
            total.add(&queue.launches());
        }
        total
    }

    /// Turns profiling on or off on every device queue of the plan (see
    /// [`profile`](crate::profile)).
    pub fn set_profiling(&mut self, on: bool) {
        self.edits += 1;
        for queue in self.queues.iter_mut().filter_map(|q| q.queue.as_mut()) {
            queue.set_profiling(on);
        }
    }

    /// The profile events of the plan's device queues since the last call
    /// (see [`HardwareQueue::take_profile`]), oldest first, each queue
    /// named by its plan label (`"cpu:0 compute"`).
    ///
    /// Waits for the runs submitted first: a run's signals are set before
    /// its queues have filed the events of the commands that set them, so
    /// a profile taken right after [`Run::wait`] would miss some. A run
    /// that failed was reported by its `wait`; the queues' own report of it
    /// is consumed here, as the next [`run`](Self::run) would.
    pub fn take_profile(&mut self) -> Vec<ProfileEvent> {
        let mut events = Vec::new();
        for planned in &mut self.queues {
            if let Some(queue) = planned.queue.as_mut() {
                // `QueueFailed` only: the failure reached the run's waiters.
                let _ = queue.synchronize();
                events.extend(queue.take_profile().into_iter().map(|mut event| {
                    event.queue.clone_from(&planned.label);
                    event
                }));
            }
        }
        events.sort_by_key(|event| (event.start_ns, event.end_ns));
        events
    }
}

/// `take_staged` checked every transfer, the planner placed every tensor
/// and `run` checked every binding, so this is a bug: the batch is refused
/// rather than run without the operation whose value it would still
/// signal.
pub(super) fn unplaced_bug<Q: HardwareQueue>(queue: &mut Q, operation: &str) {
    queue.reject(Error::InvalidSchedule {
        reason: format!(
            "operation `{operation}` lost its bytes or its staged host data (a bug in the \
             executor)"
        ),
    });
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
                        wait.queue,
                        wait.value,
                        self.reason(OpId(op), wait)
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
