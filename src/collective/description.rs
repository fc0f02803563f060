//! What a rank says of a collective before its data moves, so ranks that
//! disagree fail with both sides named instead of mixing their data.

use super::{CollectiveOp, Element, HostCollective, Reduction};

/// The words of a [`Description`].
pub(super) const WORDS: usize = 5;

/// What a rank says of a collective before its data: `[sequence, op,
/// reduction or root or peer, element, count]`, the op's high bit set
/// when the rank failed it itself (it could not reach its views, or a
/// receive overlaps another view of its group of sends and receives).
#[derive(Clone, Copy)]
pub(super) struct Description(pub(super) [u64; WORDS]);

const FAILED: u64 = 1 << 63;
/// The op word of a split.
const SPLIT: u64 = 6;

impl Description {
    pub(super) fn of(plan: &HostCollective, failed: bool) -> Self {
        let (op, arg) = match plan.op {
            CollectiveOp::AllReduce(r) => (0, reduction_code(r)),
            CollectiveOp::AllGather => (1, 0),
            CollectiveOp::ReduceScatter(r) => (2, reduction_code(r)),
            CollectiveOp::Broadcast { root } => (3, root as u64),
            CollectiveOp::Send { peer } => (4, peer as u64),
            CollectiveOp::Recv { peer } => (5, peer as u64),
        };
        let element = match plan.element {
            Element::F32 => 0,
            Element::F64 => 1,
            Element::I32 => 2,
            Element::U32 => 3,
            #[cfg(feature = "half")]
            Element::F16 => 4,
            #[cfg(feature = "half")]
            Element::BF16 => 5,
        };
        let failed = if failed { FAILED } else { 0 };
        Description([plan.sequence, op | failed, arg, element, plan.count as u64])
    }

    /// A split of the communicator, `sequence`th in its order; `invalid`
    /// where this rank's color or key is one MPI cannot take, so that
    /// its peers fail the split too, at once, naming it.
    pub(super) fn split(sequence: u64, invalid: bool) -> Self {
        let invalid = if invalid { FAILED } else { 0 };
        Description([sequence, SPLIT | invalid, 0, 0, 0])
    }

    /// Whether `theirs` (of `peer`) matches this (of `rank`): equal for a
    /// collective (a split: at the same place); a `send` to `peer` against
    /// a `recv` from `rank` of the same element and count.
    pub(super) fn agrees(&self, theirs: &Description, rank: usize, peer: usize) -> bool {
        let [_, op, arg, element, count] = self.0;
        let [_, their_op, their_arg, their_element, their_count] = theirs.0;
        match op {
            SPLIT => theirs.0[..2] == self.0[..2],
            4 | 5 => {
                their_op == 9 - op
                    && their_arg == rank as u64
                    && arg == peer as u64
                    && (element, count) == (their_element, their_count)
            }
            _ => self.0 == theirs.0,
        }
    }
}

impl std::fmt::Display for Description {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [sequence, op, arg, element, count] = self.0;
        if op & !FAILED == SPLIT {
            write!(f, "split of the communicator, #{sequence} in its order")?;
            if op & FAILED != 0 {
                f.write_str(" (with a color or key above i32::MAX)")?;
            }
            return Ok(());
        }
        let reduction = match arg {
            0 => Reduction::Sum,
            1 => Reduction::Product,
            2 => Reduction::Min,
            _ => Reduction::Max,
        };
        let what = match op & !FAILED {
            0 => CollectiveOp::AllReduce(reduction),
            1 => CollectiveOp::AllGather,
            2 => CollectiveOp::ReduceScatter(reduction),
            3 => CollectiveOp::Broadcast { root: arg as usize },
            4 => CollectiveOp::Send { peer: arg as usize },
            _ => CollectiveOp::Recv { peer: arg as usize },
        };
        let element = match element {
            0 => Element::F32,
            1 => Element::F64,
            2 => Element::I32,
            #[cfg(feature = "half")]
            4 => Element::F16,
            #[cfg(feature = "half")]
            5 => Element::BF16,
            _ => Element::U32,
        };
        let described = super::describe(what, element, count as usize, sequence);
        if op & FAILED != 0 {
            write!(
                f,
                "{described} (which failed on its rank: see that rank's error)"
            )
        } else {
            f.write_str(&described)
        }
    }
}

fn reduction_code(reduction: Reduction) -> u64 {
    match reduction {
        Reduction::Sum => 0,
        Reduction::Product => 1,
        Reduction::Min => 2,
        Reduction::Max => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each element type has its own code, which reads back as itself:
    /// ranks that record f16 where others record bf16 disagree, and the
    /// mismatch names both.
    #[test]
    fn every_element_type_is_told_apart() {
        let elements = [
            Element::F32,
            Element::F64,
            Element::I32,
            Element::U32,
            #[cfg(feature = "half")]
            Element::F16,
            #[cfg(feature = "half")]
            Element::BF16,
        ];
        let of = |element| {
            let op = CollectiveOp::AllReduce(Reduction::Sum);
            let plan = HostCollective {
                op,
                element,
                count: 8,
                sequence: 2,
            };
            Description::of(&plan, false)
        };
        for &a in &elements {
            let told = of(a).to_string();
            assert!(
                told.ends_with(&format!("of 8 {}, submitted #2", a.name())),
                "{told}"
            );
            for &b in &elements {
                assert_eq!(of(a).agrees(&of(b), 0, 1), a == b, "{a:?} against {b:?}");
            }
        }
    }
}
