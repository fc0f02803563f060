//! Model test of the memory pool: random sequences of `alloc`,
//! `alloc_uninit`, `alloca`, drops, `dealloca`, fills, failing kernels,
//! discards, submits, synchronisations, `trim` and release thresholds on a
//! CPU device and two of its queues, against a model of every buffer's
//! lifecycle (the model lives in `hwqueue_testkit`, shared with the
//! `memory_pool` fuzz target; each queue's batches are gated until a
//! synchronisation, so the model is exact). It checks that no two held
//! ranges overlap, that no buffer's bytes change under it, that the
//! statistics and each buffer's phase equal the model's, that misuse is
//! rejected and failures reported exactly when the model says, and that
//! nothing is stranded at the end.

use hwqueue_testkit::{PoolOp, check_pool_ops};
use proptest::prelude::*;

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        6 => 1usize..4096,
        3 => 4096usize..(512 << 10),
        1 => (1usize << 20)..(3 << 20),
        1 => (10usize << 20)..(12 << 20),
    ]
}

fn op() -> impl Strategy<Value = PoolOp> {
    let queue = 0..hwqueue_testkit::memory::POOL_QUEUES;
    let index = 0usize..64;
    prop_oneof![
        4 => (size(), any::<bool>()).prop_map(|(size, zeroed)| PoolOp::Alloc { size, zeroed }),
        3 => (queue.clone(), size()).prop_map(|(queue, size)| PoolOp::Alloca { queue, size }),
        3 => index.clone().prop_map(|index| PoolOp::Drop { index }),
        3 => (index.clone(), queue.clone()).prop_map(|(index, queue)| PoolOp::Dealloca { index, queue }),
        2 => (index, queue.clone()).prop_map(|(index, queue)| PoolOp::Fill { index, queue }),
        1 => queue.clone().prop_map(|queue| PoolOp::Fail { queue }),
        1 => queue.clone().prop_map(|queue| PoolOp::Discard { queue }),
        2 => queue.prop_map(|queue| PoolOp::Submit { queue }),
        1 => Just(PoolOp::Sync),
        1 => Just(PoolOp::Trim),
        1 => prop_oneof![Just(0usize), Just(1 << 20), Just(usize::MAX)]
            .prop_map(|bytes| PoolOp::Threshold { bytes }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Every step agrees with the model, and at the end nothing is in use
    /// and `trim` gives every block back.
    #[test]
    fn the_pool_matches_the_model(ops in proptest::collection::vec(op(), 0..64)) {
        check_pool_ops(&ops);
    }
}

/// The model's rules on a fixed sequence: a dropped buffer that a submitted
/// batch still fills stays held; a second `dealloca`, a `dealloca` of a
/// buffer `alloc` made and a fill after a `dealloca` are rejected (and the
/// rejected `dealloca`s leave their buffers live); a `dealloca` on the
/// other queue is allowed; trims in between.
#[test]
fn a_fixed_sequence_through_the_model() {
    use PoolOp::*;
    check_pool_ops(&[
        Alloc {
            size: 4096,
            zeroed: true,
        },
        Fill { index: 0, queue: 0 },
        Submit { queue: 0 },
        Drop { index: 0 },
        Alloc {
            size: 4096,
            zeroed: false,
        },
        Alloca {
            queue: 1,
            size: 100,
        },
        Dealloca { index: 2, queue: 0 },
        Submit { queue: 1 },
        Submit { queue: 0 },
        Dealloca { index: 2, queue: 1 },
        Submit { queue: 1 },
        Dealloca { index: 1, queue: 0 },
        Submit { queue: 0 },
        Alloca {
            queue: 0,
            size: 3 << 20,
        },
        Dealloca { index: 3, queue: 0 },
        Fill { index: 3, queue: 1 },
        Submit { queue: 1 },
        Trim,
        Sync,
        Threshold { bytes: 0 },
        Alloc {
            size: 11 << 20,
            zeroed: true,
        },
        Trim,
        Drop { index: 4 },
        Sync,
        Trim,
    ]);
}

/// A `dealloca` behind a failing kernel never runs, nor does a later batch
/// of that queue; a discarded one neither: each leaves its buffer live, and
/// a later `dealloca` returns it. Queue 1's fill of a third buffer,
/// recorded before queue 0's `dealloca` of it, holds its range until it
/// ran (queue 0 runs first).
#[test]
fn failures_and_discards_leave_deallocas_unrun() {
    use PoolOp::*;
    check_pool_ops(&[
        Alloca {
            queue: 0,
            size: 4096,
        },
        Alloca {
            queue: 0,
            size: 100,
        },
        Fill { index: 0, queue: 1 },
        Fail { queue: 0 },
        Dealloca { index: 0, queue: 0 },
        Submit { queue: 0 },
        Dealloca { index: 1, queue: 0 },
        Submit { queue: 0 },
        Sync,
        Dealloca { index: 1, queue: 1 },
        Discard { queue: 1 },
        Dealloca { index: 0, queue: 0 },
        Fill { index: 1, queue: 1 },
        Submit { queue: 1 },
        Sync,
        Dealloca { index: 1, queue: 1 },
        Alloca {
            queue: 0,
            size: 256,
        },
        Fill { index: 2, queue: 1 },
        Dealloca { index: 2, queue: 0 },
        Sync,
    ]);
}
