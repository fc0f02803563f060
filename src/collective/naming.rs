//! How a collective is counted and named, in errors and profiles.

use super::{CollectiveOp, Element};

/// How many elements each rank contributes to `op` over views of
/// `send` and `recv` bytes (see [`Collective::count`](super::Collective::count)). Public for the
/// queue enums [`backend_set!`](crate::backend_set) makes.
#[doc(hidden)]
pub fn count_of(
    op: CollectiveOp,
    element: Element,
    send: Option<usize>,
    recv: Option<usize>,
) -> usize {
    let bytes = match op {
        CollectiveOp::ReduceScatter(_) | CollectiveOp::Recv { .. } => recv,
        // The root's view is sent, the others' received.
        CollectiveOp::Broadcast { .. } => send.or(recv),
        _ => send,
    };
    bytes.map_or(0, |bytes| bytes / element.size())
}

/// `all_reduce (sum) of 256 f32, submitted #3`; a `send` or `recv`, which
/// takes no place in the order, without the number: `send to rank 1 of 16
/// u32`.
pub(crate) fn describe(op: CollectiveOp, element: Element, count: usize, sequence: u64) -> String {
    let what = match op {
        CollectiveOp::AllReduce(r) | CollectiveOp::ReduceScatter(r) => {
            format!("{} ({})", op.name(), r.name())
        }
        CollectiveOp::Broadcast { root } => format!("broadcast from rank {root}"),
        CollectiveOp::Send { peer } => format!("send to rank {peer}"),
        CollectiveOp::Recv { peer } => format!("recv from rank {peer}"),
        CollectiveOp::AllGather => op.name().to_owned(),
    };
    if op.peer().is_some() {
        return format!("{what} of {count} {}", element.name());
    }
    format!(
        "{what} of {count} {}, submitted #{sequence}",
        element.name()
    )
}
