//! The conformance suite on the simulator, as a backend outside the crate
//! runs it; and the simulator's deliberately broken variants, each caught
//! by the case that checks the rule it breaks, with that rule named.

use std::time::Duration;

use hwqueue_cts::{Kernel, Skip, Target};
use hwqueue_sim::{Defect, KernelArgs, Sim, SimConfig, SimDevice, SimProgram};

/// `hwqueue_cts::Kernel::Add` for the simulator.
fn add(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let n = match args.scalars() {
        [hwqueue::Scalar::U32(n)] => *n,
        other => return Err(format!("add takes one u32 scalar, not {other:?}")),
    };
    let global = args.params().global()[0] as usize;
    let mut data: Vec<u32> = args.read(0);
    for value in data.iter_mut().take(global) {
        *value = value.wrapping_add(n);
    }
    args.write(0, &data);
    Ok(())
}

/// A simulator target: a fresh device configured by `config()` per case.
macro_rules! sim_target {
    ($(#[$doc:meta])* $name:ident, $config:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl Target for $name {
            type Backend = Sim;

            fn device() -> Result<SimDevice, Skip> {
                Ok(SimDevice::new(0, $config))
            }

            fn program(_device: &SimDevice, kernel: Kernel) -> hwqueue::Result<SimProgram> {
                match kernel {
                    Kernel::Add => Ok(SimProgram::new("add", 1, 1, add)),
                    other => unimplemented!("the simulator target has no {other:?}"),
                }
            }
        }
    };
}

mod sim {
    use super::*;
    sim_target!(
        /// The simulator as it ships.
        SimTarget,
        SimConfig::default()
    );
    hwqueue_cts::cts_suite!(SimTarget);
}

mod sim_with_latency {
    use super::*;
    sim_target!(
        /// Every command takes 200 µs of device time: batches are still
        /// running when the host moves on.
        SlowSimTarget,
        SimConfig::default().latency(Duration::from_micros(200))
    );
    hwqueue_cts::cts_suite!(SlowSimTarget);
}

mod broken {
    use super::*;

    sim_target!(
        LowerSignal,
        SimConfig::default().defect(Defect::LowerSignal)
    );
    sim_target!(
        SwapBatches,
        SimConfig::default().defect(Defect::SwapBatches)
    );
    sim_target!(DropBatch, SimConfig::default().defect(Defect::DropBatch));

    #[test]
    #[should_panic(
        expected = "case `queue_signal_never_lowers_a_value` failed on `sim`: rule broken: signals only rise"
    )]
    fn an_engine_that_lowers_a_signal_is_caught() {
        hwqueue_cts::run::<LowerSignal>(
            "queue_signal_never_lowers_a_value",
            hwqueue_cts::queue_signal_never_lowers_a_value,
        );
    }

    #[test]
    #[should_panic(
        expected = "case `queue_batches_run_in_submission_order` failed on `sim`: rule broken: queue order"
    )]
    fn an_engine_that_runs_batches_out_of_order_is_caught() {
        hwqueue_cts::run::<SwapBatches>(
            "queue_batches_run_in_submission_order",
            hwqueue_cts::queue_batches_run_in_submission_order,
        );
    }

    #[test]
    #[should_panic(
        expected = "case `queue_every_submitted_batch_settles` failed on `sim`: rule broken: every batch settles"
    )]
    fn an_engine_that_drops_a_batch_is_caught() {
        hwqueue_cts::run::<DropBatch>(
            "queue_every_submitted_batch_settles",
            hwqueue_cts::queue_every_submitted_batch_settles,
        );
    }

    /// Each variant passes the cases of the rules it keeps: a case fails
    /// for its own rule, not for any defect.
    #[test]
    fn each_variant_passes_a_case_it_does_not_break() {
        hwqueue_cts::run::<LowerSignal>(
            "queue_batches_run_in_submission_order",
            hwqueue_cts::queue_batches_run_in_submission_order,
        );
        hwqueue_cts::run::<SwapBatches>(
            "queue_signal_never_lowers_a_value",
            hwqueue_cts::queue_signal_never_lowers_a_value,
        );
        // One submit: the first batch runs (every second one is dropped).
        hwqueue_cts::run::<DropBatch>(
            "queue_signal_never_lowers_a_value",
            hwqueue_cts::queue_signal_never_lowers_a_value,
        );
    }
}
