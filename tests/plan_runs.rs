//! The model-based test of how a plan's runs are ordered (issue 35): random
//! plans over two device ids (two compute queues, two copy queues and the
//! host stage) with input and output slots, scalar slots and
//! planner-placed tensors, run back to back without waiting, the slots
//! rebound between runs to disjoint, identical, overlapping-shifted and
//! misaligned views and a kernel failed at random. Every run produces the
//! sequential model's bytes or fails naming its own operation (a refused
//! run naming its misaligned binding), no run reports another's failure,
//! and nothing hangs. The harness is `hwqueue_testkit::check_plan_runs`
//! (`check_plan_schedule`, the `plan_schedule` fuzz target, with fewer
//! operations); see `testkit/src/plan_runs.rs`. The same model draws
//! plans over two backends too (issue 44): device id 0 the CPU, id 1 the
//! simulator, so copies between them run on the host stage and each
//! run's waits on the run before it cross backends.

mod common;

use common::{no_hang, quiet_injected_failures};
use hwqueue_testkit::{check_plan_runs, check_plan_runs_over_two_backends};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Short schedules, so that most of the bytes choose the runs'
    /// bindings and failures; four runs each.
    #[test]
    fn runs_rebound_and_failing_at_random_match_the_sequential_model(
        schedule in proptest::collection::vec(any::<u8>(), 0..96),
        runs in proptest::collection::vec(any::<u8>(), 96),
    ) {
        quiet_injected_failures();
        let mut data = schedule;
        data.extend(runs);
        no_hang("four back-to-back runs of a random plan", move || {
            check_plan_runs(&data, 4);
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// As above, over the CPU and the simulator.
    #[test]
    fn runs_over_two_backends_match_the_sequential_model(
        schedule in proptest::collection::vec(any::<u8>(), 0..96),
        runs in proptest::collection::vec(any::<u8>(), 96),
    ) {
        quiet_injected_failures();
        let mut data = schedule;
        data.extend(runs);
        no_hang("four back-to-back runs of a random plan over two backends", move || {
            check_plan_runs_over_two_backends(&data, 4);
        });
    }
}
