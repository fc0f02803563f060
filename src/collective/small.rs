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
        #[cfg(feature = "half")]
        Element::F16 => reduce_as::<half::f16>(reduction, out, parts),
        #[cfg(feature = "half")]
        Element::BF16 => reduce_as::<half::bf16>(reduction, out, parts),
    }
}

/// What MPI's predefined operations do to one pair of elements (C's
/// arithmetic: integers wrap; `MPI_MIN`/`MPI_MAX` as `a < b ? a : b`),
/// and what hwqueue's own MPI operations do to 16-bit floats
/// (`mpi_types.rs`, which calls [`combine`]): the sum or product in `f32`,
/// rounded back to nearest (even); min and max by value. None of it
/// panics, as the MPI operations call it from C.
pub(super) trait Combine: bytemuck::Pod + PartialOrd {
    fn sum(self, other: Self) -> Self;
    fn product(self, other: Self) -> Self;
}

/// `a` combined with `b` by `reduction` (`a` from the lower rank).
pub(super) fn combine<T: Combine>(reduction: Reduction, a: T, b: T) -> T {
    match reduction {
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
    }
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
/// 16-bit floats, computed in `f32` (exact for both: their values are
/// `f32` values) and rounded back once, as PyTorch and NCCL do.
#[cfg(feature = "half")]
macro_rules! combine_half {
    ($($ty:ty),*) => {$(
        impl Combine for $ty {
            fn sum(self, other: Self) -> Self {
                <$ty>::from_f32(self.to_f32() + other.to_f32())
            }
            fn product(self, other: Self) -> Self {
                <$ty>::from_f32(self.to_f32() * other.to_f32())
            }
        }
    )*};
}
combine_float!(f32, f64);
combine_int!(i32, u32);
#[cfg(feature = "half")]
combine_half!(half::f16, half::bf16);

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
            let combined = combine(reduction, a, b);
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

    /// f16 and bf16 sum and multiply in f32 and round back once per
    /// step; min and max compare values.
    #[cfg(feature = "half")]
    #[test]
    fn halves_compute_in_f32_and_round_back() {
        use half::{bf16, f16};
        fn run<T: bytemuck::Pod>(
            element: Element,
            reduction: Reduction,
            sent: &[Vec<T>],
        ) -> Vec<T> {
            let sent: Vec<Vec<u8>> = sent.iter().map(|s| bytes(s)).collect();
            let mut recv = vec![0u8; sent[0].len()];
            let op = CollectiveOp::AllReduce(reduction);
            let count = sent[0].len() / 2;
            finish(op, element, count, (0, sent.len()), |k| &sent[k], &mut recv);
            (recv.chunks_exact(2))
                .map(bytemuck::pod_read_unaligned)
                .collect()
        }
        let h = |v: &[f32]| v.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>();
        let sent = [h(&[1.0, -4.0, 3.0, 2048.0]), h(&[2.0, 5.0, -0.5, 1.0])];
        assert_eq!(
            run(Element::F16, Reduction::Sum, &sent),
            h(&[3.0, 1.0, 2.5, 2048.0])
        );
        assert_eq!(
            run(Element::F16, Reduction::Product, &sent),
            h(&[2.0, -20.0, -1.5, 2048.0])
        );
        assert_eq!(
            run(Element::F16, Reduction::Min, &sent),
            h(&[1.0, -4.0, -0.5, 1.0])
        );
        assert_eq!(
            run(Element::F16, Reduction::Max, &sent),
            h(&[2.0, 5.0, 3.0, 2048.0])
        );
        // 2048 + 1 is 2049 in f32, a tie between f16's 2048 and 2050:
        // rounded to even, 2048 (above). bf16 has 8 bits: 256 + 1 -> 256.
        let b = |v: &[f32]| v.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
        let sent = [b(&[256.0, 1.5, -3.0]), b(&[1.0, 2.0, 3.0])];
        assert_eq!(
            run(Element::BF16, Reduction::Sum, &sent),
            b(&[256.0, 3.5, 0.0])
        );
        assert_eq!(
            run(Element::BF16, Reduction::Product, &sent),
            b(&[256.0, 3.0, -9.0])
        );
        assert_eq!(
            run(Element::BF16, Reduction::Max, &sent),
            b(&[256.0, 2.0, 3.0])
        );
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
