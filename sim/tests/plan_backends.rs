//! A plan over the CPU and the simulator (`SimSet`), from outside the
//! crate, as a compiler splitting a model over a CPU and an accelerator
//! holds one: runs started back to back, several in flight, with failing
//! and refused runs among them (`hwqueue_testkit::two_backends`).

use std::sync::Arc;
use std::time::Duration;

use hwqueue::cpu::CpuDevice;
use hwqueue_sim::{KernelArgs, SimConfig, SimDevice, SimProgram, SimSet, SimSetDevice};
use hwqueue_testkit::check_plan_over_two_backends;

/// `data[i] += n` (u32) over the grid.
fn add(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let n = match args.scalars() {
        [hwqueue::Scalar::U32(n)] => *n,
        other => return Err(format!("add takes one u32 scalar, not {other:?}")),
    };
    let mut data: Vec<u32> = args.read(0);
    for value in &mut data {
        *value = value.wrapping_add(n);
    }
    args.write(0, &data);
    Ok(())
}

#[test]
fn a_plan_over_the_cpu_and_the_simulator_runs_back_to_back() {
    let config = SimConfig {
        latency: Duration::from_micros(200),
        ..SimConfig::default()
    };
    let cpu = Arc::new(SimSetDevice::from(CpuDevice::new()));
    let sim = Arc::new(SimSetDevice::from(SimDevice::new(0, config)));
    let program = SimProgram::new("add", 1, 1, add);
    check_plan_over_two_backends::<SimSet>(cpu, sim, Some(program.into()));
}
