//! Model test of `CpuSignal`: random sequences of `set`, `wait` (reached,
//! failed, or polled with a zero timeout), `is_reached`, `value` and `fail`,
//! against a running max and the failed ranges (the model lives in
//! `hwqueue_testkit`, shared with the `cpu_signal` fuzz target).

use hwqueue_testkit::{SignalOp, check_signal_ops};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = SignalOp> {
    // Small values, so sets, waits and failures land on each other.
    let value = 0u64..24;
    prop_oneof![
        3 => value.clone().prop_map(SignalOp::Set),
        3 => value.clone().prop_map(SignalOp::Wait),
        2 => value.clone().prop_map(SignalOp::IsReached),
        2 => value.prop_map(SignalOp::Fail),
        1 => Just(SignalOp::Value),
        1 => Just(SignalOp::WaitPastTheRange),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every result matches the model, and so does every value probed at
    /// the end.
    #[test]
    fn cpu_signal_matches_the_model(
        initial in 0u64..8,
        ops in proptest::collection::vec(op(), 0..48),
    ) {
        check_signal_ops(initial, &ops);
    }
}

/// The model's failure rules on a fixed sequence: a failure covers only
/// values above the value when it came, the narrowest failure's cause is
/// reported, and a later raise clears what it reaches.
#[test]
fn a_fixed_sequence_through_the_model() {
    use SignalOp::*;
    check_signal_ops(
        1,
        &[
            Fail(1),
            Wait(1),
            Fail(5),
            Fail(3),
            Fail(5),
            Wait(2),
            Wait(4),
            Wait(6),
            Set(4),
            Wait(4),
            Wait(5),
            IsReached(5),
            Set(2),
            Value,
        ],
    );
}
