//! The executor's memory planner on two schedules: the demo's MLP and a
//! transformer block (attention with four heads, then an MLP; 23 tensors).
//! For each it prints the planner's `memory:` line, in the demo's format,
//! prefixed by the schedule's name, then every tensor's place.
//!
//! ```text
//! cargo run --release --example plan_memory
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use hwqueue::Schedule;
use hwqueue::cpu::{Cpu, CpuDevice};
use hwqueue_testkit::{mlp_schedule, transformer_block_schedule};

/// Builds one of the schedules on a device.
type Build = fn(&Arc<CpuDevice>) -> Schedule<Cpu>;

fn main() -> ExitCode {
    let device = Arc::new(CpuDevice::new());
    let schedules: [(&str, Build); 2] = [
        ("mlp", mlp_schedule),
        ("transformer_block", transformer_block_schedule),
    ];
    for (name, build) in schedules {
        let plan = match build(&device).plan() {
            Ok(plan) => plan,
            Err(error) => {
                eprintln!("{name}: planning failed: {error}");
                return ExitCode::FAILURE;
            }
        };
        let memory = plan.memory();
        println!("{name}: {memory}");
        println!(
            "  arena / lower bound {:.3}, arena / naive {:.3}, {} tensors",
            memory.arena_bytes as f64 / memory.lower_bound_bytes as f64,
            memory.arena_bytes as f64 / memory.naive_bytes as f64,
            memory.tensors.len()
        );
        for tensor in &memory.tensors {
            println!(
                "    {:<12} [{:>8}, {:>8})  live over operations {}..={}",
                tensor.name,
                tensor.offset,
                tensor.offset + tensor.bytes,
                tensor.live.start().index(),
                tensor.live.end().index()
            );
        }
    }
    ExitCode::SUCCESS
}
