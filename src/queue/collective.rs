//! Recording collectives ([`Queue::all_reduce`] and the rest): what one
//! rank can check when it records one, and the
//! [`Command::Collective`] it pushes. See [`crate::collective`].

use crate::collective::{
    Collective, CollectiveElement, CollectiveError, CollectiveOp, Communicator, Element, Reduction,
};
use crate::view::{AsView, View};

use super::batch::Command;
use super::engine::Engine;
use super::{HardwareQueue, Queue};

/// Collectives, recorded like any other command: they run when the queue
/// reaches them, in order with its other commands and signals, and a bad
/// one rejects the batch at `submit` (naming this rank and the sizes). A
/// collective refused so, or in a batch refused or failed before it,
/// still takes its place in the communicator's order (a send or receive
/// in its peer's): on a CPU queue over MPI its peers' fails at once,
/// naming this rank, and every rank's next one meets the others' next; on
/// a CUDA queue over NCCL, which cannot tell the peers, the communicator
/// breaks on this rank ([`CollectiveError::Skipped`](crate::collective::CollectiveError::Skipped)),
/// and the peers' times out.
/// Every rank of `communicator` must record the same collectives in the
/// same order (a `send` is matched by its peer's `recv`); element counts
/// are a view's length over `T`'s size.
impl<E: Engine> Queue<E> {
    /// Records: combine every rank's `send` element-wise by `reduction`
    /// into every rank's `recv`, of `send`'s length (`recv` may be `send`
    /// itself: in place; otherwise they must not overlap).
    pub fn all_reduce<T, S, D>(
        &mut self,
        communicator: &Communicator,
        reduction: Reduction,
        send: &S,
        recv: &D,
    ) -> &mut Self
    where
        T: CollectiveElement,
        S: AsView<E::Backend>,
        D: AsView<E::Backend>,
    {
        let op = CollectiveOp::AllReduce(reduction);
        self.record_collective(communicator, op, T::ELEMENT, Some(send), Some(recv))
    }

    /// Records: every rank's `send`, in rank order, into every rank's
    /// `recv`, which is `size` times as long.
    pub fn all_gather<T, S, D>(
        &mut self,
        communicator: &Communicator,
        send: &S,
        recv: &D,
    ) -> &mut Self
    where
        T: CollectiveElement,
        S: AsView<E::Backend>,
        D: AsView<E::Backend>,
    {
        let op = CollectiveOp::AllGather;
        self.record_collective(communicator, op, T::ELEMENT, Some(send), Some(recv))
    }

    /// Records: combine every rank's `send` (`size` parts of `recv`'s
    /// length) element-wise by `reduction`; rank `r` receives part `r`.
    pub fn reduce_scatter<T, S, D>(
        &mut self,
        communicator: &Communicator,
        reduction: Reduction,
        send: &S,
        recv: &D,
    ) -> &mut Self
    where
        T: CollectiveElement,
        S: AsView<E::Backend>,
        D: AsView<E::Backend>,
    {
        let op = CollectiveOp::ReduceScatter(reduction);
        self.record_collective(communicator, op, T::ELEMENT, Some(send), Some(recv))
    }

    /// Records: rank `root`'s `view` into every other rank's `view`.
    pub fn broadcast<T, V>(
        &mut self,
        communicator: &Communicator,
        root: usize,
        view: &V,
    ) -> &mut Self
    where
        T: CollectiveElement,
        V: AsView<E::Backend>,
    {
        let op = CollectiveOp::Broadcast { root };
        if communicator.rank() == root {
            self.record_collective(communicator, op, T::ELEMENT, Some(view), None::<&V>)
        } else {
            self.record_collective(communicator, op, T::ELEMENT, None::<&V>, Some(view))
        }
    }

    /// Records: `view` to rank `peer`, whose [`recv`](Self::recv) from this
    /// rank, of the same length and type, receives it. Sends and receives
    /// recorded one after another over one communicator, with nothing
    /// between them, run as one group (over MPI and NCCL alike): a rank
    /// may send to and receive from its peers in any order within it. Over
    /// MPI, members whose peers agreed move their data even where another
    /// member of the group failed (see `collective::p2p`).
    pub fn send<T, V>(&mut self, communicator: &Communicator, peer: usize, view: &V) -> &mut Self
    where
        T: CollectiveElement,
        V: AsView<E::Backend>,
    {
        let op = CollectiveOp::Send { peer };
        self.record_collective(communicator, op, T::ELEMENT, Some(view), None::<&V>)
    }

    /// Records: receive rank `peer`'s [`send`](Self::send) to this rank into
    /// `view`.
    pub fn recv<T, V>(&mut self, communicator: &Communicator, peer: usize, view: &V) -> &mut Self
    where
        T: CollectiveElement,
        V: AsView<E::Backend>,
    {
        let op = CollectiveOp::Recv { peer };
        self.record_collective(communicator, op, T::ELEMENT, None::<&V>, Some(view))
    }

    /// Checks a collective this rank records, and pushes it.
    #[inline(never)]
    pub(super) fn record_collective<S, D>(
        &mut self,
        communicator: &Communicator,
        op: CollectiveOp,
        element: Element,
        send: Option<&S>,
        recv: Option<&D>,
    ) -> &mut Self
    where
        S: AsView<E::Backend>,
        D: AsView<E::Backend>,
    {
        let checked = self
            .engine
            .check_collective(communicator)
            .and_then(|()| check_shape(communicator, op, element, send, recv))
            .and_then(|()| {
                let send = send
                    .map(|view| self.collective_view("the collective's send view", view))
                    .transpose()?;
                let recv = recv
                    .map(|view| self.collective_view("the collective's receive view", view))
                    .transpose()?;
                Ok((send, recv))
            });
        let (send, recv) = match checked {
            Ok(views) => views,
            Err(error) => {
                let send = send.map(|view| view.view_parts().2);
                let recv = recv.map(|view| view.view_parts().2);
                let count = crate::collective::count_of(op, element, send, recv);
                return self.forfeit_place(communicator, (op, element, count), error);
            }
        };
        // Each takes its place when the batch is submitted
        // (`stamp_collectives`): a collective in the order every rank
        // shares, a send or receive in its peer's.
        self.batch.collectives = true;
        self.push_collective(communicator, (op, element, 0), send, recv);
        self
    }

    /// Pushes a [`Command::Collective`], not numbered yet (`refused_count`:
    /// see [`Collective::count`]).
    fn push_collective(
        &mut self,
        communicator: &Communicator,
        (op, element, refused_count): (CollectiveOp, Element, usize),
        send: Option<View<E::Backend>>,
        recv: Option<View<E::Backend>>,
    ) {
        let collective = Collective {
            communicator: communicator.clone(),
            op,
            element,
            sequence: 0,
            numbered: false,
            refused_count,
            send,
            recv,
        };
        self.batch
            .commands
            .push(Command::Collective(Box::new(collective)));
    }

    /// Rejects the batch with `cause` and records a collective with no
    /// views in `op`'s place (of `element`s, `count` of them asked for):
    /// numbered at `submit` (a rejected batch's collectives are), it is
    /// forfeited, never run. A rank refusing a collective that its peers
    /// record would otherwise pair their next one with its own next: a
    /// mismatch for good, or, where the two are alike, data of another
    /// step (see [`HardwareQueue::forfeit_collective`]). So too where the
    /// engine does not run `communicator`'s collectives at all (an NCCL
    /// communicator of another device, or on a CPU queue): over NCCL the
    /// place breaks the communicator (`Batch::fail_from`); over MPI a
    /// queue that cannot forfeit it leaves the peers' call to time out.
    pub(super) fn forfeit_place(
        &mut self,
        communicator: &Communicator,
        (op, element, count): (CollectiveOp, Element, usize),
        cause: crate::Error,
    ) -> &mut Self {
        self.reject(cause);
        // A send or receive to no other rank of the group has no peer to
        // meet (every rank refuses such a collective alike).
        let meets = op
            .peer()
            .is_none_or(|peer| peer < communicator.size() && peer != communicator.rank());
        if meets {
            self.batch.collectives = true;
            self.push_collective(communicator, (op, element, count), None, None);
        }
        self
    }

    /// Gives each collective of the batch, about to be submitted, its place
    /// in its communicator's order. Taken at submit, not when recorded (a
    /// batch discarded or dropped unsubmitted takes none), and by a batch
    /// refused at submit too: its peers submitted theirs, and a CPU queue's
    /// worker exchanges each numbered collective it will not run, described
    /// failed, so the peers fail theirs at once and every rank stays in
    /// step (`cpu::queue::collective::forfeit_collective`). A `send` or
    /// `recv` over MPI takes its place too, without a number (MPI pairs a
    /// peer's messages in order): forfeited, it still meets its peer's,
    /// described failed, where its peer would otherwise pair the next one
    /// with it (`cpu::queue::collective::forfeit_p2p_group`). A CUDA queue
    /// cannot forfeit one over NCCL: it breaks the communicator instead
    /// (`NcclComm::skipped`).
    #[inline(never)]
    pub(super) fn stamp_collectives(&mut self) {
        for command in &mut self.batch.commands {
            if let Command::Collective(collective) = command {
                if collective.op.peer().is_none() {
                    collective.sequence = collective.communicator.next_sequence();
                }
                collective.numbered = true;
            }
        }
    }

    /// `view` for a collective, once the engine accepted its buffer and the
    /// batch took a use of it.
    fn collective_view<V: AsView<E::Backend>>(
        &mut self,
        what: &'static str,
        view: &V,
    ) -> crate::Result<View<E::Backend>> {
        let (buffer, offset, len) = view.view_parts();
        self.engine.check_buffer(what, buffer)?;
        self.batch.take_use(buffer, || what.to_owned())?;
        Ok(View::from_parts(buffer.clone(), offset, len))
    }
}

/// What one rank can check of a collective: whole elements, lengths that
/// fit the operation and the group's size, roots and peers in the group,
/// counts MPI can express, and no partly overlapping views.
fn check_shape<B: crate::Backend, S: AsView<B>, D: AsView<B>>(
    communicator: &Communicator,
    op: CollectiveOp,
    element: Element,
    send: Option<&S>,
    recv: Option<&D>,
) -> crate::Result<()> {
    let send_parts = send.map(AsView::view_parts);
    let recv_parts = recv.map(AsView::view_parts);
    check_lengths(
        communicator,
        op,
        element,
        send_parts.map(|p| p.2),
        recv_parts.map(|p| p.2),
    )?;
    if let (Some((s, s_offset, s_len)), Some((r, r_offset, r_len))) = (send_parts, recv_parts)
        && crate::Buffer::same_as(s, r)
    {
        let overlap = s_offset < r_offset + r_len && r_offset < s_offset + s_len;
        let in_place =
            (s_offset, s_len) == (r_offset, r_len) && matches!(op, CollectiveOp::AllReduce(_));
        if overlap && !in_place && s_len > 0 && r_len > 0 {
            return Err(invalid(
                communicator,
                op,
                format!(
                    "its send view (bytes {s_offset}..{}) and receive view (bytes {r_offset}..{}) \
                     overlap; only an all_reduce runs in place (the same view as both): use \
                     separate views",
                    s_offset + s_len,
                    r_offset + r_len
                ),
            ));
        }
    }
    Ok(())
}

fn invalid(communicator: &Communicator, op: CollectiveOp, reason: String) -> crate::Error {
    CollectiveError::Invalid {
        rank: communicator.rank(),
        size: communicator.size(),
        op: op.name(),
        reason,
    }
    .into()
}

/// What one rank can check of a collective from its views' lengths alone
/// (bytes; `None` where it has no such view): whole elements, lengths that
/// fit the operation and the group's size, roots and peers in the group,
/// counts MPI can express. A plan checks its collectives with it before it
/// places their bytes.
pub(crate) fn check_lengths(
    communicator: &Communicator,
    op: CollectiveOp,
    element: Element,
    send: Option<usize>,
    recv: Option<usize>,
) -> crate::Result<()> {
    let (rank, size) = (communicator.rank(), communicator.size());
    let invalid = |reason: String| Err(invalid(communicator, op, reason));
    let width = element.size();
    for (what, len) in [("send", send), ("receive", recv)] {
        if let Some(len) = len
            && !len.is_multiple_of(width)
        {
            return invalid(format!(
                "its {what} view is {len} bytes, not a whole number of {width}-byte {}s: give \
                 it a multiple of {width} bytes",
                element.name()
            ));
        }
    }
    let send_len = send.unwrap_or(0);
    let recv_len = recv.unwrap_or(0);
    let expected = match op {
        CollectiveOp::AllReduce(_) => Some((recv_len, send_len, "the send view's length")),
        CollectiveOp::AllGather => Some((
            recv_len,
            send_len.saturating_mul(size),
            "the group's size times the send view's length",
        )),
        CollectiveOp::ReduceScatter(_) => Some((
            send_len,
            recv_len.saturating_mul(size),
            "the group's size times the receive view's length",
        )),
        CollectiveOp::Broadcast { root: peer }
        | CollectiveOp::Send { peer }
        | CollectiveOp::Recv { peer } => {
            if peer >= size {
                return invalid(format!(
                    "rank {peer} is not in the group (ranks 0 to {})",
                    size - 1
                ));
            }
            if peer == rank && !matches!(op, CollectiveOp::Broadcast { .. }) {
                return invalid(format!(
                    "rank {rank} cannot {} itself: copy instead",
                    op.name()
                ));
            }
            None
        }
    };
    if let Some((actual, wanted, rule)) = expected
        && actual != wanted
    {
        let (which, other) = match op {
            CollectiveOp::ReduceScatter(_) => ("send", "receive"),
            _ => ("receive", "send"),
        };
        return invalid(format!(
            "its {which} view is {actual} bytes, but must be {rule} ({wanted} bytes: the {other} \
             view is {} bytes, the group has {size} ranks)",
            if which == "send" { recv_len } else { send_len }
        ));
    }
    // What each rank contributes, as MPI counts it (an all_gather's
    // receive view and a reduce_scatter's send view are `size` of them):
    // an `int`. NCCL's counts are `size_t`.
    let count = match op {
        CollectiveOp::AllGather => send_len,
        CollectiveOp::ReduceScatter(_) => recv_len,
        _ => send_len.max(recv_len),
    } / width;
    if communicator.on_host() && count > i32::MAX as usize {
        return invalid(format!(
            "{count} elements per rank are more than MPI counts (2^31 - 1): split it"
        ));
    }
    Ok(())
}
