//! Turning a schedule into queues, waits and values.

use crate::sync::{mpsc, spawn};

use super::host::run_host_stage;
use super::memory;
use super::ordering::*;
use super::plan::*;
use super::replay::Stretches;
use super::schedule::*;
use super::*;

/// What a queue is known to have completed: per queue, a value.
type Clock = Vec<u64>;

/// A wait chosen while planning two runs back to back: the queue and
/// value waited for, the awaited op's index, and why.
type DoubledWait = (usize, u64, usize, Hazard, Access);

/// An op of the doubled plan: its queue, its value there, its waits.
type DoubledOp = (usize, u64, Vec<DoubledWait>);

impl<B: Backend> Schedule<B> {
    /// Plans the schedule: queues, dependencies, waits, timeline values.
    /// (Here, beside the planner, so that the schedule, which the planner
    /// reads, does not name it.)
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for unknown ids, ranges past a buffer's end,
    /// an exec whose buffers live on another device, a copy between buffers
    /// of different sizes, two operations (or two buffers, or two scalar
    /// slots) with one name; any error creating queues or signals.
    pub fn plan(self) -> Result<Plan<B>> {
        plan(self)
    }
}

fn plan<B: Backend>(mut schedule: Schedule<B>) -> Result<Plan<B>> {
    validate(&schedule)?;
    super::collective::validate_order(&schedule)?;
    let accesses: Vec<(Vec<Access>, Vec<Access>)> = schedule
        .ops
        .iter()
        .map(|op| effective_accesses(&schedule, op))
        .collect();
    let runs = super::collective::p2p_runs(&schedule, &accesses);
    let placement = memory::place(&schedule, &accesses, &runs)?;
    place_tensors(&mut schedule, &placement)?;
    // Again, now in bytes of the arenas: tensors that share bytes conflict.
    let accesses: Vec<(Vec<Access>, Vec<Access>)> = schedule
        .ops
        .iter()
        .map(|op| effective_accesses(&schedule, op))
        .collect();
    let bindings = Bindings::new(&schedule, &accesses);

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
    // Per queue, the device that makes its signals.
    let mut devices = Vec::new();
    for lane in &lanes {
        let (lane, label, queue, device) = make_queue(&schedule, *lane)?;
        match resolved.iter().position(|l| *l == lane) {
            Some(index) => lane_queue.push(index),
            None => {
                resolved.push(lane);
                queues.push(PlannedQueue {
                    label: label.into(),
                    queue,
                    ops: Vec::new(),
                    stretches: Default::default(),
                    p2p_groups: Vec::new(),
                });
                devices.push(schedule.devices[device].clone());
                lane_queue.push(queues.len() - 1);
            }
        }
    }
    let queue_count = queues.len();
    // Each collective's queue runs its communicator's collectives.
    for (op, lane) in schedule.ops.iter().zip(&op_lane) {
        let queue = queues[lane_queue[*lane]].queue.as_ref();
        super::collective::check_engine(op, queue)?;
    }

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
            if let Some((hazard, access)) = conflict(reads, writes, earlier_reads, earlier_writes) {
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
                PlannedWait {
                    queue: q,
                    value: if previous_run {
                        value
                    } else {
                        value - counts[q]
                    },
                    previous_run,
                    after: OpId(earlier % n),
                    hazard,
                    buffer: access.buffer,
                    range: access.range.clone(),
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
                Work::Copy { .. }
                | Work::Fill { .. }
                | Work::Upload { .. }
                | Work::Download { .. }
                | Work::Collective(_) => None,
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
    let grouped = super::collective::one_collective_queue(&schedule, &ops);
    for planned in queues.iter_mut().filter(|q| q.queue.is_some()) {
        planned.stretches = Stretches::of(&planned.ops, &schedule, &ops);
        if grouped {
            planned.p2p_groups = super::collective::p2p_groups(&planned.ops, &runs);
        }
    }
    Ok(Plan {
        queues,
        facts: Arc::new(PlanFacts { ops, counts }),
        in_flight: InFlight::new(devices),
        refused: None,
        staged: (0..schedule.ops.len()).map(|_| None).collect(),
        transfers: (schedule.ops.iter().enumerate())
            .filter(|(_, op)| matches!(op.work, Work::Upload { .. } | Work::Download { .. }))
            .map(|(at, _)| at)
            .collect(),
        scalar_values: schedule.scalars.iter().map(|(_, value)| *value).collect(),
        scratch: Vec::new(),
        schedule,
        host,
        runs: 0,
        memory: placement.memory,
        bindings,
        replay: true,
        edits: 0,
    })
}

/// Takes each device's arena from its pool and turns every tensor (and
/// view of one) into a view of it.
fn place_tensors<B: Backend>(
    schedule: &mut Schedule<B>,
    placement: &memory::Placement,
) -> Result<()> {
    use crate::device::Device;
    let named = placement.arenas.iter().flatten().count() > 1;
    let mut arenas: Vec<Option<(BufferId, View<B>)>> = vec![None; schedule.devices.len()];
    for (device, bytes) in placement.arenas.iter().enumerate() {
        let Some(bytes) = *bytes else {
            continue;
        };
        let buffer = schedule.devices[device].alloc_uninit(bytes)?;
        let view = View::whole(&buffer);
        let name = if named {
            format!("arena of device {device}")
        } else {
            "arena".to_owned()
        };
        arenas[device] = Some((schedule.add_buffer(DeviceId(device), name, buffer), view));
    }
    let mut offset_of: Vec<Option<usize>> = vec![None; schedule.buffers.len()];
    for tensor in &placement.memory.tensors {
        offset_of[tensor.tensor.0] = Some(tensor.offset);
    }
    for slot in &mut schedule.buffers {
        if slot.origin != Origin::Tensor {
            continue;
        }
        // A tensor no operation names gets no bytes; nothing uses it.
        let Some(place) = offset_of[slot.root.0] else {
            continue;
        };
        let Some((arena, view)) = &arenas[slot.device.0] else {
            continue;
        };
        slot.root = *arena;
        // Within the arena (the placement checked every tensor's end), so
        // this never overflows; checked all the same.
        slot.offset = slot
            .offset
            .checked_add(place)
            .ok_or_else(|| Error::InvalidSchedule {
                reason: format!(
                    "view `{}` at byte {} of a tensor placed at byte {place} overflows the \
                     address space; declare smaller tensors",
                    slot.name, slot.offset
                ),
            })?;
        slot.buffer = Some(view.view(slot.offset, slot.len)?);
    }
    Ok(())
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
    // Every access in the bytes of the root buffer, so views of one arena
    // conflict only where their bytes do.
    let slot = |buffer: BufferId| &schedule.buffers[buffer.0];
    let whole = |buffer: BufferId| slot(buffer).access(0..slot(buffer).len);
    let declared = |accesses: &Option<Vec<Access>>| -> Vec<Access> {
        accesses
            .iter()
            .flatten()
            .map(|access| slot(access.buffer).access(access.range.clone()))
            .collect()
    };
    match &op.work {
        Work::Exec { buffers, .. } => {
            // Narrowed only where declared: an argument no declaration
            // names keeps its whole read and write (helper-78: it got no
            // hazard at all, so a kernel could read a tensor before the
            // operation writing it ran, or while the next overwrote it).
            let named = |buffer: &BufferId| {
                [&op.reads, &op.writes]
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|access| access.buffer == *buffer)
            };
            let undeclared: Vec<Access> = (buffers.iter())
                .filter(|buffer| !named(buffer))
                .map(|buffer| whole(*buffer))
                .collect();
            let mut reads = declared(&op.reads);
            let mut writes = declared(&op.writes);
            reads.extend(undeclared.iter().cloned());
            writes.extend(undeclared);
            (reads, writes)
        }
        Work::Copy { dst, src } => {
            let mut reads = vec![whole(*src)];
            let mut writes = vec![whole(*dst)];
            reads.extend(declared(&op.reads));
            writes.extend(declared(&op.writes));
            (reads, writes)
        }
        Work::Fill { dst, .. } | Work::Upload { dst } => {
            let mut writes = vec![whole(*dst)];
            writes.extend(declared(&op.writes));
            (declared(&op.reads), writes)
        }
        Work::Download { src } => {
            let mut reads = vec![whole(*src)];
            reads.extend(declared(&op.reads));
            (reads, declared(&op.writes))
        }
        // It reads its send view and writes its receive view.
        Work::Collective(collective) => {
            let mut reads: Vec<Access> = collective.send.iter().map(|b| whole(*b)).collect();
            let mut writes: Vec<Access> = collective.recv.iter().map(|b| whole(*b)).collect();
            reads.extend(declared(&op.reads));
            writes.extend(declared(&op.writes));
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
        Work::Exec { .. }
        | Work::Fill { .. }
        | Work::Upload { .. }
        | Work::Download { .. }
        | Work::Collective(_) => Lane::Device {
            device: op.device,
            kind: op.kind,
        },
    }
}

/// A lane's queue: the lane it resolved to, its label, the queue (none
/// for the host stage), and the device that makes its signals.
type MadeQueue<B> = (Lane, String, Option<<B as Backend>::Queue>, usize);

/// Makes a lane's queue, whose failures are its batch's own
/// ([`FailureScope::Batch`](crate::FailureScope): runs are ordered by the
/// plan's waits alone); returns the lane it resolved to.
fn make_queue<B: Backend>(schedule: &Schedule<B>, lane: Lane) -> Result<MadeQueue<B>> {
    use crate::device::Device;
    match lane {
        Lane::Host => {
            // The host stage's signals come from the first device.
            Ok((lane, "host".into(), None, 0))
        }
        Lane::Device { device, kind } => {
            let dev = &schedule.devices[device.0];
            // The spec names the device, unless the schedule holds two
            // devices of one spec (two handles to `cpu:0`, say): then its
            // index in the schedule says which.
            let spec = dev.spec();
            let shared_spec = schedule
                .devices
                .iter()
                .filter(|other| other.spec() == spec)
                .count()
                > 1;
            let label = |kind: QueueKind| {
                if shared_spec {
                    format!("{spec} (device {}) {kind}", device.0)
                } else {
                    format!("{spec} {kind}")
                }
            };
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
            let mut queue = queue;
            queue.set_failure_scope(crate::FailureScope::Batch)?;
            Ok((lane, label, Some(queue), device.0))
        }
    }
}

fn validate<B: Backend>(schedule: &Schedule<B>) -> Result<()> {
    let invalid = |reason: String| Err(Error::InvalidSchedule { reason });
    if schedule.devices.is_empty() && !schedule.ops.is_empty() {
        return invalid("no device was added; call `add_device` first".into());
    }
    check_unique_names(schedule)?;
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
            let size = slot.len;
            if access.range.start > access.range.end || access.range.end > size {
                return invalid(format!(
                    "operation `{}` declares bytes [{}, {}) of `{}`, which holds {size} bytes",
                    op.name, access.range.start, access.range.end, slot.name
                ));
            }
        }
        if !op.bound_scalars.is_empty() && !matches!(op.work, Work::Exec { .. }) {
            return invalid(format!(
                "operation `{}` takes a scalar slot (`OpBuilder::scalar`) but is not an exec; \
                 only execs take scalars",
                op.name
            ));
        }
        match &op.work {
            Work::Exec {
                buffers, scalars, ..
            } => {
                for &(position, slot) in &op.bound_scalars {
                    let Some((name, value)) = schedule.scalars.get(slot.0) else {
                        return invalid(format!(
                            "exec `{}` takes scalar slot {}, which is not in the schedule; use \
                             the id `add_scalar` returned",
                            op.name, slot.0
                        ));
                    };
                    let Some(given) = scalars.get(position) else {
                        return invalid(format!(
                            "exec `{}` binds its scalar {position} to slot `{name}`, but it has \
                             {} scalars",
                            op.name,
                            scalars.len()
                        ));
                    };
                    if std::mem::discriminant(given) != std::mem::discriminant(value) {
                        return invalid(format!(
                            "exec `{}` binds its scalar {position}, a {}, to slot `{name}`, a \
                             {}; give the exec a placeholder of the slot's type",
                            op.name,
                            given.type_name(),
                            value.type_name()
                        ));
                    }
                }
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
                if d.len != s.len {
                    return invalid(format!(
                        "copy `{}` from `{}` ({} bytes) to `{}` ({} bytes): sizes differ; copies \
                         move the whole source, so make both (buffers or views) one length",
                        op.name, s.name, s.len, d.name, d.len
                    ));
                }
                if d.access(0..d.len).overlaps(&s.access(0..s.len)) {
                    return invalid(format!(
                        "copy `{}` from `{}` to `{}`: the two ranges overlap in one buffer; copy \
                         between disjoint views",
                        op.name, s.name, d.name
                    ));
                }
            }
            Work::Upload { dst: id } | Work::Download { src: id } => {
                buffer(op, *id)?;
            }
            Work::Collective(collective) => {
                super::collective::validate(schedule, op, collective)?;
            }
            Work::Fill { dst, width, .. } => {
                let d = buffer(op, *dst)?;
                let width = usize::from(*width);
                // A tensor's or slot's own offset is the arena's or the
                // binding's; the queue checks those.
                if !matches!(width, 1 | 2 | 4)
                    || !d.offset.is_multiple_of(width)
                    || !d.len.is_multiple_of(width)
                {
                    return invalid(format!(
                        "fill `{}` of `{}` (bytes {:?}) with a {width}-byte pattern: patterns are \
                         1, 2 or 4 bytes, and the view's offset and length multiples of that",
                        op.name,
                        d.name,
                        d.offset..d.offset + d.len
                    ));
                }
            }
        }
    }
    Ok(())
}
