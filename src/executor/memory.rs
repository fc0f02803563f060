//! Static memory planning: where a schedule's tensors live.
//!
//! A tensor ([`Schedule::add_tensor`]) lives from the first operation that
//! names it to the last, in program order (through the whole of a run of
//! sends and receives a plan may group, whose members run at once: see
//! `collective::p2p_runs`). Tensors of one device share one
//! arena from the device's pool: two whose lifetimes overlap never share a
//! byte, two whose lifetimes do not may. Offsets come from the "greedy by
//! size" heuristic of TFLite's and tinygrad's planners: the largest tensor
//! first, each at the smallest gap between the tensors already placed that
//! overlap it in time (best fit), or past the last of them. The
//! hazards of the planner see the reuse, since they compare bytes of the
//! arena: the first writer of a tensor waits for the last reader of the one
//! whose bytes it takes, within a run and across back-to-back runs.

use std::ops::RangeInclusive;

use super::schedule::*;
use super::*;
use crate::device::Device;

/// Where [`Schedule::plan`] placed a schedule's tensors, and how good the
/// placement is: [`Plan::memory`](super::Plan::memory).
///
/// Prints as `memory: arena_bytes=A lower_bound_bytes=L naive_bytes=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMemory {
    /// The bytes of every device's arena, summed.
    pub arena_bytes: usize,
    /// What no placement can beat: per device, the largest sum of the
    /// bytes of the tensors live at one operation; summed over devices.
    pub lower_bound_bytes: usize,
    /// Every tensor in a buffer of its own: the sum of their bytes.
    pub naive_bytes: usize,
    /// Each tensor some operation names, in the order they were added. A
    /// tensor no operation names gets no bytes and is not listed.
    pub tensors: Vec<TensorPlacement>,
}

impl fmt::Display for PlanMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory: arena_bytes={} lower_bound_bytes={} naive_bytes={}",
            self.arena_bytes, self.lower_bound_bytes, self.naive_bytes
        )
    }
}

/// One tensor's place: [`PlanMemory::tensors`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlacement {
    /// The tensor, as [`Schedule::add_tensor`] returned it.
    pub tensor: BufferId,
    /// Its name.
    pub name: String,
    /// Its device: its arena is that device's.
    pub device: DeviceId,
    /// Its first byte in the arena.
    pub offset: usize,
    /// Its length.
    pub bytes: usize,
    /// The operations from the first that names it to the last.
    pub live: RangeInclusive<OpId>,
}

/// The placement, and the arena each device needs.
pub(super) struct Placement {
    pub(super) memory: PlanMemory,
    /// Per device of the schedule, its arena's bytes; `None` where no
    /// operation names a tensor of it.
    pub(super) arenas: Vec<Option<usize>>,
}

/// Places every tensor of `schedule`; `accesses` are each operation's
/// (reads, writes) in bytes of the roots, tensors not yet placed.
///
/// # Errors
/// [`Error::InvalidSchedule`] for a tensor whose first operation reads it
/// without writing it.
pub(super) fn place<B: Backend>(
    schedule: &Schedule<B>,
    accesses: &[(Vec<Access>, Vec<Access>)],
    p2p_runs: &[std::ops::Range<usize>],
) -> Result<Placement> {
    let is_tensor = |id: BufferId| {
        schedule.buffers[id.0].origin == Origin::Tensor && id == schedule.buffers[id.0].root
    };
    // Per root tensor, the first and last operation naming it.
    let mut live: Vec<Option<(usize, usize)>> = vec![None; schedule.buffers.len()];
    for (index, op) in schedule.ops.iter().enumerate() {
        let (reads, writes) = &accesses[index];
        let arguments = match &op.work {
            Work::Exec { buffers, .. } => buffers.as_slice(),
            _ => &[],
        };
        let named = reads
            .iter()
            .chain(writes)
            .map(|access| access.buffer)
            .chain(arguments.iter().map(|id| schedule.buffers[id.0].root));
        for root in named {
            if !is_tensor(root) {
                continue;
            }
            match &mut live[root.0] {
                Some((_, last)) => *last = index,
                slot @ None => {
                    let touched = reads.iter().chain(writes).any(|a| a.buffer == root);
                    let written = writes.iter().any(|a| a.buffer == root);
                    if touched && !written {
                        return Err(Error::InvalidSchedule {
                            reason: format!(
                                "tensor `{}` is read by `{}` before any operation writes it, so \
                                 it would hold garbage; write it first (an upload, a fill, a \
                                 copy, or a kernel declaring `.writes`), or make it a buffer \
                                 (`add_buffer`) or a slot (`add_slot`) if its bytes come from \
                                 outside the run",
                                schedule.buffers[root.0].name, op.name
                            ),
                        });
                    }
                    *slot = Some((index, index));
                }
            }
        }
    }
    // The members of a run of sends and receives a plan may group run at
    // once: a tensor one of them names is live through the whole run.
    for run in p2p_runs {
        let (start, end) = (run.start, run.end - 1);
        for (first, last) in live.iter_mut().flatten() {
            if *first <= end && start <= *last {
                (*first, *last) = ((*first).min(start), (*last).max(end));
            }
        }
    }

    let mut tensors = Vec::new();
    let mut arenas = vec![None; schedule.devices.len()];
    let mut lower_bound_bytes = 0usize;
    let mut naive_bytes = 0usize;
    let mut arena_bytes = 0usize;
    for (device, arena) in arenas.iter_mut().enumerate() {
        let align = schedule.devices[device].limits().view_alignment.max(1);
        let mine: Vec<(BufferId, usize, (usize, usize))> = live
            .iter()
            .enumerate()
            .filter_map(|(id, span)| {
                let slot = &schedule.buffers[id];
                (slot.device.0 == device).then_some(())?;
                Some((BufferId(id), slot.len, (*span)?))
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        // Every sum is checked: tensors near `usize::MAX` bytes are an
        // error naming them, never an overflow.
        let device_naive = sum_bytes(schedule, mine.iter().map(|t| (t.0, t.1)), "naive")?;
        naive_bytes = add_bytes(schedule, naive_bytes, device_naive, &mine, "naive")?;
        let mut device_lower = 0;
        for step in 0..schedule.ops.len() {
            let live = mine
                .iter()
                .filter(|(_, _, (first, last))| (*first..=*last).contains(&step))
                .map(|t| (t.0, t.1));
            device_lower = device_lower.max(sum_bytes(schedule, live, "lower-bound")?);
        }
        lower_bound_bytes = add_bytes(
            schedule,
            lower_bound_bytes,
            device_lower,
            &mine,
            "lower-bound",
        )?;
        let (offsets, end) = greedy_by_size(&mine, align)
            .map_err(|_| overflow(schedule, mine.iter().map(|t| (t.0, t.1)), "arena"))?;
        arena_bytes = add_bytes(schedule, arena_bytes, end, &mine, "arena")?;
        *arena = Some(end);
        for ((id, bytes, (first, last)), offset) in mine.into_iter().zip(offsets) {
            tensors.push(TensorPlacement {
                tensor: id,
                name: schedule.buffers[id.0].name.clone(),
                device: DeviceId(device),
                offset,
                bytes,
                live: OpId(first)..=OpId(last),
            });
        }
    }
    tensors.sort_by_key(|t| t.tensor.0);
    Ok(Placement {
        memory: PlanMemory {
            arena_bytes,
            lower_bound_bytes,
            naive_bytes,
            tensors,
        },
        arenas,
    })
}

/// Offsets for `tensors` (id, bytes, live operations) of one device,
/// aligned to `align`, and the arena's end: the largest first, each at the
/// smallest gap that fits it between the tensors placed so far that are
/// live with it.
fn greedy_by_size(
    tensors: &[(BufferId, usize, (usize, usize))],
    align: usize,
) -> Result<(Vec<usize>, usize)> {
    // Each tensor's bytes in the arena: its size rounded up to `align`.
    let sizes = tensors
        .iter()
        .map(|&(_, bytes, _)| {
            bytes
                .checked_next_multiple_of(align)
                .ok_or_else(|| too_large(bytes))
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    // Largest first; ties by first use, then by id, so plans repeat.
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(tensors[i].1),
            tensors[i].2.0,
            tensors[i].0.0,
        )
    });
    let mut offsets = vec![0usize; tensors.len()];
    let mut arena = 0usize;
    let mut placed: Vec<usize> = Vec::with_capacity(tensors.len());
    for &i in &order {
        let (first, last) = tensors[i].2;
        let mut neighbours: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| {
                let (f, l) = tensors[j].2;
                f <= last && first <= l
            })
            .map(|&j| (offsets[j], offsets[j] + sizes[j]))
            .collect();
        neighbours.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap, offset)
        let mut end = 0usize;
        for (start, stop) in neighbours {
            if start >= end {
                let gap = start - end;
                if gap >= sizes[i] && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, end));
                }
            }
            end = end.max(stop);
        }
        offsets[i] = best.map_or(end, |(_, offset)| offset);
        let stop = offsets[i]
            .checked_add(sizes[i])
            .ok_or_else(|| too_large(tensors[i].1))?;
        arena = arena.max(stop);
        placed.push(i);
    }
    Ok((offsets, arena))
}

/// The sum of `tensors`' bytes, or the error naming them.
fn sum_bytes<B: Backend>(
    schedule: &Schedule<B>,
    tensors: impl Iterator<Item = (BufferId, usize)> + Clone,
    sum: &str,
) -> Result<usize> {
    tensors
        .clone()
        .try_fold(0usize, |total, (_, bytes)| total.checked_add(bytes))
        .ok_or_else(|| overflow(schedule, tensors, sum))
}

/// `total + more`, the bytes of the devices so far and of one more whose
/// tensors are `mine`, or the error naming those.
fn add_bytes<B: Backend>(
    schedule: &Schedule<B>,
    total: usize,
    more: usize,
    mine: &[(BufferId, usize, (usize, usize))],
    sum: &str,
) -> Result<usize> {
    total.checked_add(more).ok_or_else(|| {
        let others = (0..schedule.buffers.len())
            .map(BufferId)
            .filter(|id| !mine.iter().any(|t| t.0 == *id))
            .filter(|id| {
                let slot = &schedule.buffers[id.0];
                slot.origin == Origin::Tensor && slot.root == *id
            })
            .map(|id| (id, schedule.buffers[id.0].len));
        overflow(schedule, mine.iter().map(|t| (t.0, t.1)).chain(others), sum)
    })
}

/// The error for a sum of tensors' bytes past `usize::MAX`, naming them
/// (the largest first, at most eight).
#[cold]
fn overflow<B: Backend>(
    schedule: &Schedule<B>,
    tensors: impl Iterator<Item = (BufferId, usize)>,
    sum: &str,
) -> Error {
    let mut tensors: Vec<(BufferId, usize)> = tensors.collect();
    tensors.sort_by_key(|&(id, bytes)| (std::cmp::Reverse(bytes), id.0));
    let count = tensors.len();
    let mut named: Vec<String> = tensors
        .iter()
        .take(8)
        .map(|(id, bytes)| format!("`{}` ({bytes} bytes)", schedule.buffers[id.0].name))
        .collect();
    if count > 8 {
        named.push(format!("and {} more", count - 8));
    }
    Error::InvalidSchedule {
        reason: format!(
            "the {sum} bytes of tensors {} overflow the address space ({} bytes at most); \
             declare smaller tensors, or split the schedule",
            named.join(", "),
            usize::MAX
        ),
    }
}

fn too_large(bytes: usize) -> Error {
    Error::InvalidSchedule {
        reason: format!(
            "a tensor of {bytes} bytes does not fit in an address space; declare smaller tensors"
        ),
    }
}
