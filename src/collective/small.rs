//! Collectives small enough to ride along the description exchange.
//!
//! Every collective over MPI starts with the ranks exchanging descriptions
//! (`mpi.rs`), so that ranks that disagree fail with both sides named and
//! leave nothing pending. That exchange is a collective of its own: at
//! 1 KiB it cost as much as the data's. So each rank's message in the
//! exchange has room for [`INLINE`] bytes of its send view, always (every
//! rank must give MPI the same length, whatever it describes): when the
//! descriptions agree and the data fits ([`fits`], decided from the
//! description alone, so every rank decides alike), every rank already
//! holds every contribution and finishes the collective itself
//! ([`finish`]), with no second MPI call. A reduction combines the ranks
//! in rank order on every rank, so every rank gets the same bits.

use super::{CollectiveOp, Element, Reduction};

/// The send bytes a rank's description message carries: large enough for
/// the 1 KiB all_reduce the benches time, small enough that a large
/// collective's exchange stays one short message.
pub(super) const INLINE: usize = 1024;

/// Whether `op` of `count` `element`s over `size` ranks finishes in the
/// exchange: its send view fits [`INLINE`] (a broadcast's root view).
/// `send`/`recv` never do (their exchange is between two ranks).
pub(super) fn fits(op: CollectiveOp, element: Element, count: usize, size: usize) -> bool {
    let bytes = count.saturating_mul(element.size());
    match op {
        CollectiveOp::AllReduce(_) | CollectiveOp::AllGather | CollectiveOp::Broadcast { .. } => {
            bytes <= INLINE
        }
        CollectiveOp::ReduceScatter(_) => bytes.saturating_mul(size) <= INLINE,
        CollectiveOp::Send { .. } | CollectiveOp::Recv { .. } => false,
    }
}

/// Finishes a collective that [`fits`] from the send bytes of every rank
/// (`sent(k)`: rank `k`'s, at least its send length), writing this rank's
/// result into `recv` (its receive length; empty for a broadcast's root).
pub(super) fn finish<'a>(
    op: CollectiveOp,
    element: Element,
    count: usize,
    (rank, size): (usize, usize),
    sent: impl Fn(usize) -> &'a [u8],
    recv: &mut [u8],
) {
    let n = count * element.size();
    match op {
        CollectiveOp::AllReduce(reduction) => {
            reduce(element, reduction, recv, (0..size).map(|k| &sent(k)[..n]));
        }
        CollectiveOp::ReduceScatter(reduction) => {
            let part = rank * n..(rank + 1) * n;
            let parts = (0..size).map(|k| &sent(k)[part.clone()]);
            reduce(element, reduction, recv, parts);
        }
        CollectiveOp::AllGather => {
            for (k, out) in recv.chunks_exact_mut(n.max(1)).take(size).enumerate() {
                out.copy_from_slice(&sent(k)[..n]);
            }
        }
        CollectiveOp::Broadcast { root } => {
            if !recv.is_empty() {
                recv.copy_from_slice(&sent(root)[..n]);
            }
        }
        CollectiveOp::Send { .. } | CollectiveOp::Recv { .. } => {
            unreachable!("send and recv never finish in the exchange")
        }
    }
}

/// `out` = the element-wise `reduction` of `parts`, in order.
fn reduce<'a>(
    element: Element,
    reduction: Reduction,
    out: &mut [u8],
    parts: impl Iterator<Item = &'a [u8]>,
) {
    match element {
        Element::F32 => reduce_as::<f32>(reduction, out, parts),
        Element::F64 => reduce_as::<f64>(reduction, out, parts),
        Element::I32 => reduce_as::<i32>(reduction, out, parts),
        Element::U32 => reduce_as::<u32>(reduction, out, parts),
    }
}

/// What MPI's predefined operations do to one pair of elements (C's
/// arithmetic: integers wrap; `MPI_MIN`/`MPI_MAX` as `a < b ? a : b`).
trait Combine: bytemuck::Pod + PartialOrd {
    fn sum(self, other: Self) -> Self;
    fn product(self, other: Self) -> Self;
}

macro_rules! combine_float {
    ($($ty:ty),*) => {$(
        impl Combine for $ty {
            fn sum(self, other: Self) -> Self { self + other }
            fn product(self, other: Self) -> Self { self * other }
        }
    )*};
}
macro_rules! combine_int {
    ($($ty:ty),*) => {$(
        impl Combine for $ty {
            fn sum(self, other: Self) -> Self { self.wrapping_add(other) }
            fn product(self, other: Self) -> Self { self.wrapping_mul(other) }
        }
    )*};
}
combine_float!(f32, f64);
combine_int!(i32, u32);

fn reduce_as<'a, T: Combine>(
    reduction: Reduction,
    out: &mut [u8],
    mut parts: impl Iterator<Item = &'a [u8]>,
) {
    let width = std::mem::size_of::<T>();
    let Some(first) = parts.next() else { return };
    out.copy_from_slice(first);
    for part in parts {
        for (acc, theirs) in out.chunks_exact_mut(width).zip(part.chunks_exact(width)) {
            let a: T = bytemuck::pod_read_unaligned(acc);
            let b: T = bytemuck::pod_read_unaligned(theirs);
            let combined = match reduction {
                Reduction::Sum => a.sum(b),
                Reduction::Product => a.product(b),
                Reduction::Min => {
                    if b < a {
                        b
                    } else {
                        a
                    }
                }
                Reduction::Max => {
                    if b > a {
                        b
                    } else {
                        a
                    }
                }
            };
            acc.copy_from_slice(bytemuck::bytes_of(&combined));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(values).to_vec()
    }

    #[test]
    fn every_op_finishes_like_mpi() {
        let sent = [bytes(&[1i32, -4, 3, 9]), bytes(&[2i32, 5, -1, 9])];
        let run = |op: CollectiveOp, count: usize, rank: usize, recv_len: usize| {
            let mut recv = vec![0u8; recv_len * 4];
            finish(op, Element::I32, count, (rank, 2), |k| &sent[k], &mut recv);
            (recv.chunks_exact(4))
                .map(|bytes| i32::from_ne_bytes(bytes.try_into().expect("4 bytes")))
                .collect::<Vec<_>>()
        };
        let sum = CollectiveOp::AllReduce(Reduction::Sum);
        assert_eq!(run(sum, 4, 0, 4), [3, 1, 2, 18]);
        let min = CollectiveOp::AllReduce(Reduction::Min);
        assert_eq!(run(min, 4, 1, 4), [1, -4, -1, 9]);
        let product = CollectiveOp::ReduceScatter(Reduction::Product);
        assert_eq!(run(product, 2, 1, 2), [-3, 81]);
        assert_eq!(run(CollectiveOp::AllGather, 2, 0, 4), [1, -4, 2, 5]);
        let broadcast = CollectiveOp::Broadcast { root: 1 };
        assert_eq!(run(broadcast, 4, 0, 4), [2, 5, -1, 9]);
        assert!(run(broadcast, 4, 1, 0).is_empty());
    }

    #[test]
    fn fits_counts_what_the_send_view_holds() {
        let sum = CollectiveOp::AllReduce(Reduction::Sum);
        assert!(fits(sum, Element::F32, 256, 4));
        assert!(!fits(sum, Element::F32, 257, 4));
        let scatter = CollectiveOp::ReduceScatter(Reduction::Sum);
        assert!(fits(scatter, Element::F64, 32, 4));
        assert!(!fits(scatter, Element::F64, 33, 4));
        assert!(!fits(CollectiveOp::Send { peer: 1 }, Element::U32, 1, 2));
    }
}
