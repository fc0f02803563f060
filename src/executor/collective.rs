//! Collectives in a schedule: [`Schedule::all_reduce`] and its siblings
//! add an operation like any other, on the compute queue of the device its
//! buffers live on. The planner orders it by the same hazards (it reads
//! its send buffer and writes its receive buffer), and every run records
//! it with [`HardwareQueue::collective`], in queue order with the kernels
//! around it (see [`crate::collective`] for what a queue does with one).
//!
//! Every rank of a communicator must run its collectives in one order. A
//! queue runs its commands in order and a plan records each queue's
//! operations in schedule order, so the planner requires every collective
//! over one communicator to be on one queue: then each rank that builds
//! the same schedule runs them in the same order, run after run. It also
//! requires every collective of one device to be on one queue: over two
//! communicators on two queues, unordered, ranks could start them in
//! different orders and each wait for what the other holds (a CPU
//! collective holds its buffers, parts of the device's one arena, while
//! its data moves; NCCL kernels of two communicators on two streams can
//! wait for each other).
//!
//! A run records a signal after each operation (what the other queues and
//! the next run wait for), but not between the sends and receives of a
//! *group*: two or more added to the schedule one after another, over one
//! communicator, on one device, none touching bytes another of them writes,
//! in a plan whose collectives all run on one queue. Their waits go before
//! the first (each is on the run before, or on an operation added before
//! them, which waits on none of them, and on no collective the first does
//! not wait for already: those before the group on its queue), and one
//! signal after the last stands for all of them (a queue's values only
//! rise), so the queue's batch holds them one after another and they run
//! as one group (see `crate::collective`'s groups): a ring (send to the
//! next rank, receive from the one before) completes on every rank, after
//! other collectives of its queue too. With collectives on two devices'
//! queues a plan groups none: a later member's wait could lead through the
//! other queue's collectives to a peer that needs the group's data, and an
//! operation of another queue that waits for one member (so for the whole
//! group) could too. A group's tensors are live through the whole group, so
//! the memory planner gives no two of them the same bytes. A member that
//! fails fails the group's one value,
//! the earlier members' too, and an operation of another queue that waits
//! for one member waits for the whole group. A send or receive outside
//! such a group meets its peer's alone: order those so that every send
//! meets its receive in turn (even ranks send first, odd ranks receive
//! first), or record them on a queue directly.

use crate::collective::{CollectiveElement, CollectiveOp, Communicator, Reduction};

use super::ordering::PlannedOp;
use super::schedule::*;
use super::*;

/// Collectives, each on the compute queue of the device its buffers live
/// on (move one with [`OpBuilder::on`]). Each reads its send buffer whole
/// and writes its receive buffer whole (views of a buffer, with
/// [`Schedule::add_view`], narrow that), so the planner orders it against
/// kernels, copies and transfers as it orders those, within a run and
/// against the previous run. Element counts are a buffer's length over
/// `T`'s size; [`plan`](Schedule::plan) checks the lengths against the
/// operation and the communicator's size, and that all collectives over
/// one communicator share a queue (every rank must run them in one order).
/// The data checks between ranks happen when a run reaches them, as for a
/// queue's collectives.
impl<B: Backend> Schedule<B> {
    /// Adds: combine every rank's `send` element-wise by `reduction` into
    /// every rank's `recv`, of `send`'s length (`recv` may be `send`: in
    /// place).
    pub fn all_reduce<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        reduction: Reduction,
        send: BufferId,
        recv: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::AllReduce(reduction);
        self.push_collective::<T>(name.into(), communicator, op, Some(send), Some(recv))
    }

    /// Adds: every rank's `send`, in rank order, into every rank's `recv`,
    /// which is the communicator's size times as long.
    pub fn all_gather<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        send: BufferId,
        recv: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::AllGather;
        self.push_collective::<T>(name.into(), communicator, op, Some(send), Some(recv))
    }

    /// Adds: combine every rank's `send` (the communicator's size times
    /// `recv`'s length) element-wise by `reduction`; rank `r` receives
    /// part `r` into `recv`.
    pub fn reduce_scatter<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        reduction: Reduction,
        send: BufferId,
        recv: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::ReduceScatter(reduction);
        self.push_collective::<T>(name.into(), communicator, op, Some(send), Some(recv))
    }

    /// Adds: rank `root`'s `buffer` into every other rank's `buffer` (it
    /// reads it on the root and writes it elsewhere).
    pub fn broadcast<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        root: usize,
        buffer: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::Broadcast { root };
        let (send, recv) = if communicator.rank() == root {
            (Some(buffer), None)
        } else {
            (None, Some(buffer))
        };
        self.push_collective::<T>(name.into(), communicator, op, send, recv)
    }

    /// Adds: `src` to rank `peer`, whose schedule receives it with a
    /// [`recv`](Self::recv) from this rank of the same length and type.
    pub fn send<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        peer: usize,
        src: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::Send { peer };
        self.push_collective::<T>(name.into(), communicator, op, Some(src), None)
    }

    /// Adds: receive rank `peer`'s [`send`](Self::send) to this rank into
    /// `dst`.
    pub fn recv<T: CollectiveElement>(
        &mut self,
        name: impl Into<String>,
        communicator: &Communicator,
        peer: usize,
        dst: BufferId,
    ) -> OpBuilder<'_, B> {
        let op = CollectiveOp::Recv { peer };
        self.push_collective::<T>(name.into(), communicator, op, None, Some(dst))
    }

    fn push_collective<T: CollectiveElement>(
        &mut self,
        name: String,
        communicator: &Communicator,
        op: CollectiveOp,
        send: Option<BufferId>,
        recv: Option<BufferId>,
    ) -> OpBuilder<'_, B> {
        // Both are there for every operation but `send` and `recv`.
        let device = recv
            .or(send)
            .map_or(DeviceId(usize::MAX), |b| self.device_of(b));
        self.push(Op {
            name,
            device,
            kind: QueueKind::Compute,
            work: Work::Collective(CollectiveWork {
                communicator: communicator.clone(),
                op,
                element: T::ELEMENT,
                send,
                recv,
            }),
            reads: None,
            writes: None,
            bound_scalars: Vec::new(),
        })
    }
}

/// What `plan` checks of one collective: its buffers known and on one
/// device, their lengths right for the operation and the group, and no
/// overlap between them but an all_reduce's in place.
pub(super) fn validate<B: Backend>(
    schedule: &Schedule<B>,
    op: &Op<B>,
    collective: &CollectiveWork,
) -> Result<()> {
    let invalid = |reason: String| Error::InvalidSchedule { reason };
    let slot = |id: Option<BufferId>| -> Result<Option<&BufferSlot<B>>> {
        id.map(|id| {
            schedule.buffers.get(id.0).ok_or_else(|| {
                invalid(format!(
                    "collective `{}` names unknown buffer {}",
                    op.name, id.0
                ))
            })
        })
        .transpose()
    };
    let (send, recv) = (slot(collective.send)?, slot(collective.recv)?);
    if let (Some(send), Some(recv)) = (send, recv)
        && send.device != recv.device
    {
        return Err(invalid(format!(
            "collective `{}` reads `{}` on device {} and writes `{}` on device {}; a collective \
             runs on one device's queue: copy one of them over first",
            op.name, send.name, send.device.0, recv.name, recv.device.0
        )));
    }
    crate::queue::check_lengths(
        &collective.communicator,
        collective.op,
        collective.element,
        send.map(|s| s.len),
        recv.map(|r| r.len),
    )
    .map_err(|error| invalid(format!("collective `{}`: {error}", op.name)))?;
    // Views of one buffer that overlap, but for an all_reduce in place (one
    // view as both), as a queue refuses them when a run records them.
    if let (Some(send), Some(recv)) = (send, recv)
        && send.root == recv.root
    {
        let (s, r) = (
            send.offset..send.offset + send.len,
            recv.offset..recv.offset + recv.len,
        );
        let overlap = s.start < r.end && r.start < s.end && !s.is_empty() && !r.is_empty();
        let in_place = s == r && matches!(collective.op, CollectiveOp::AllReduce(_));
        if overlap && !in_place {
            return Err(invalid(format!(
                "collective `{}` reads `{}` (bytes {}..{} of `{}`) and writes `{}` (bytes \
                 {}..{}), which overlap; only an all_reduce runs in place (one buffer as \
                 both): use separate buffers",
                op.name,
                send.name,
                s.start,
                s.end,
                schedule.buffers[send.root.0].name,
                recv.name,
                r.start,
                r.end
            )));
        }
    }
    Ok(())
}

/// What `plan` checks of `op` on `queue`, if it is a collective: that the
/// queue runs its communicator's collectives (an MPI communicator on a CPU
/// queue, an NCCL one on its device's CUDA queue), so no run is refused
/// for it. (`None`, the host stage, takes copies only.)
pub(super) fn check_engine<B: Backend>(op: &Op<B>, queue: Option<&B::Queue>) -> Result<()> {
    match (&op.work, queue) {
        (Work::Collective(collective), Some(queue)) => queue
            .check_collective(&collective.communicator)
            .map_err(|error| Error::InvalidSchedule {
                reason: format!("collective `{}`: {error}", op.name),
            }),
        _ => Ok(()),
    }
}

/// What `plan` checks of the collectives together: those over one
/// communicator on one queue, so that every rank runs them in one order,
/// and those of one device on one queue, so that no two wait for each
/// other across ranks.
pub(super) fn validate_order<B: Backend>(schedule: &Schedule<B>) -> Result<()> {
    let collectives: Vec<(&Op<B>, &CollectiveWork)> = (schedule.ops.iter())
        .filter_map(|op| match &op.work {
            Work::Collective(collective) => Some((op, collective)),
            _ => None,
        })
        .collect();
    for (at, (later, b)) in collectives.iter().enumerate() {
        let first = collectives[..at]
            .iter()
            .find(|(_, a)| a.communicator.same_as(&b.communicator));
        if let Some((earlier, _)) = first
            && (earlier.device, earlier.kind) != (later.device, later.kind)
        {
            return Err(Error::InvalidSchedule {
                reason: format!(
                    "collectives `{}` (device {}, {} queue) and `{}` (device {}, {} queue) run \
                     over one communicator on different queues, so ranks could run them in \
                     different orders; put every collective of a communicator on one queue",
                    earlier.name,
                    earlier.device.0,
                    earlier.kind,
                    later.name,
                    later.device.0,
                    later.kind
                ),
            });
        }
        // Over two communicators, two queues of one device could each hold
        // what the other's peers wait for: a CPU collective holds its
        // buffers (here, parts of the device's one arena) while its data
        // moves, and NCCL kernels of two communicators on two streams can
        // wait for each other when ranks launch them in different orders.
        let beside = collectives[..at]
            .iter()
            .find(|(a_op, _)| a_op.device == later.device && a_op.kind != later.kind);
        if let Some((earlier, _)) = beside {
            return Err(Error::InvalidSchedule {
                reason: format!(
                    "collectives `{}` ({} queue) and `{}` ({} queue) run on two queues of \
                     device {}, unordered, so ranks could wait for each other across them \
                     (a collective holds its buffers, here parts of the device's one arena, \
                     while its data moves); put every collective of a device on one queue",
                    earlier.name, earlier.kind, later.name, later.kind, later.device.0
                ),
            });
        }
    }
    Ok(())
}

/// Records `collective` of a run on `queue`, its buffers' bytes from
/// `bytes` (`name` is the operation's, for the error a bug gives).
pub(super) fn record<'a, Q: HardwareQueue>(
    queue: &mut Q,
    collective: &CollectiveWork,
    bytes: impl Fn(&BufferId) -> Option<&'a View<Q::Backend>>,
    name: &str,
) where
    Q::Backend: 'a,
{
    let send = collective.send.as_ref().map(&bytes);
    let recv = collective.recv.as_ref().map(&bytes);
    match (send, recv) {
        // Rejected (a bug), still taking its place, as the peers' take theirs.
        (Some(None), _) | (_, Some(None)) => {
            let len = |view: Option<Option<&View<Q::Backend>>>| view.flatten().map(View::len);
            let count = crate::collective::count_of(
                collective.op,
                collective.element,
                len(send),
                len(recv),
            );
            let what = (collective.op, collective.element, count);
            let cause = crate::Error::InvalidSchedule {
                reason: format!("operation `{name}` lost its bytes (a bug in the executor)"),
            };
            queue.forfeit_collective(&collective.communicator, what, cause);
        }
        (send, recv) => {
            queue.collective(
                &collective.communicator,
                collective.op,
                collective.element,
                send.flatten(),
                recv.flatten(),
            );
        }
    }
}

/// Records on `queue`, in a batch rejected with `cause`, the places of
/// the collectives among `ops` (its operations of a run it will not
/// record), forfeited at `submit` as a queue forfeits a collective it
/// refused.
pub(super) fn forfeit<Q: HardwareQueue>(
    queue: &mut Q,
    ops: &[usize],
    schedule: &Schedule<Q::Backend>,
    cause: &Error,
) {
    for &op in ops {
        if let Work::Collective(work) = &schedule.ops[op].work {
            let bytes = |id: Option<BufferId>| id.map(|id| schedule.buffers[id.0].len);
            let (send, recv) = (bytes(work.send), bytes(work.recv));
            let count = crate::collective::count_of(work.op, work.element, send, recv);
            let what = (work.op, work.element, count);
            queue.forfeit_collective(&work.communicator, what, cause.clone());
        }
    }
}

/// The runs of sends and receives a plan may group: two or more added to
/// the schedule one after another, over one communicator, on one device,
/// none touching bytes another of the run writes (`accesses`: each
/// operation's reads and writes, in bytes of the roots). Ranges of
/// operation indices. Their members run at once, so the memory planner
/// keeps every tensor one of them names live through the whole run.
pub(super) fn p2p_runs<B: Backend>(
    schedule: &Schedule<B>,
    accesses: &[(Vec<Access>, Vec<Access>)],
) -> Vec<Range<usize>> {
    let p2p = |op: usize| match &schedule.ops[op].work {
        Work::Collective(work) if work.op.peer().is_some() => Some(&work.communicator),
        _ => None,
    };
    // Whether `a` writes what `b` touches, or the other way round.
    let clash = |a: usize, b: usize| {
        let touches = |(reads, writes): &(Vec<Access>, Vec<Access>), written: &[Access]| {
            (reads.iter().chain(writes)).any(|x| written.iter().any(|w| x.overlaps(w)))
        };
        touches(&accesses[a], &accesses[b].1) || touches(&accesses[b], &accesses[a].1)
    };
    let mut runs = Vec::new();
    let mut index = 0;
    while index < schedule.ops.len() {
        let start = index;
        index += 1;
        let Some(communicator) = p2p(start) else {
            continue;
        };
        let device = schedule.ops[start].device;
        let joins = |op: usize| {
            p2p(op).is_some_and(|other| other.same_as(communicator))
                && schedule.ops[op].device == device
                && (start..op).all(|earlier| !clash(earlier, op))
        };
        while index < schedule.ops.len() && joins(index) {
            index += 1;
        }
        if index - start >= 2 {
            runs.push(start..index);
        }
    }
    runs
}

/// The groups of sends and receives among `ops`, a device queue's
/// operations in order (positions in `ops`): each stretch of two or more
/// operations of one of `runs` (see [`p2p_runs`]) that follow each other
/// on the queue. Called only where every collective of the plan runs on
/// this queue ([`one_collective_queue`]). The waits of its members after
/// the first go before the first member: each is on the run before, or on
/// an operation of this run added before the group (the members are
/// adjacent, and one queue's order needs no wait), which waits on nothing
/// of the group on this rank, and on no collective but those before the
/// group on this queue, which the first member waits for already: so on no
/// peer that could need the group's data. See the module docs.
pub(super) fn p2p_groups(ops: &[usize], runs: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut position = 0;
    while position < ops.len() {
        let start = position;
        position += 1;
        let Some(run) = runs.iter().find(|run| run.contains(&ops[start])) else {
            continue;
        };
        let joins = |position: usize| {
            let op = ops[position];
            op == ops[position - 1] + 1 && run.contains(&op)
        };
        while position < ops.len() && joins(position) {
            position += 1;
        }
        if position - start >= 2 {
            groups.push(start..position);
        }
    }
    groups
}

/// Whether every collective of the schedule runs on one queue (one
/// device's: see the module docs), where a plan groups sends and receives.
/// With collectives on two queues, an operation of another queue that
/// waits for one member of a group (so for the whole group, whose one
/// signal follows its last) could lead, through the other queue's
/// collectives and a peer, to what a later member needs: every rank would
/// wait for the others until the timeout, where members run alone meet
/// their peers in turn.
pub(super) fn one_collective_queue<B: Backend>(
    schedule: &Schedule<B>,
    facts: &[PlannedOp],
) -> bool {
    let mut queues = (schedule.ops.iter().zip(facts))
        .filter(|(op, _)| matches!(op.work, Work::Collective(_)))
        .map(|(_, fact)| fact.queue);
    let first = queues.next();
    queues.all(|queue| Some(queue) == first)
}
