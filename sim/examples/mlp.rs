//! The demo's plan on the simulated accelerator: the same two-layer MLP,
//! the same schedule and executor plan (`examples/demo/model.rs`), with
//! its kernels as simulator programs, run through `SimSet` (the CPU, the
//! simulator and, with the `cuda` feature, CUDA) and checked against plain
//! Rust every iteration.
//!
//! ```text
//! cargo run --release -p hwqueue-sim --example mlp -- [--latency-us N] [--iterations N]
//! ```

// The demo's C and CUDA C kernels are not used here: only its shapes.
#[allow(dead_code)]
#[path = "../../examples/demo/kernels.rs"]
mod kernels;
#[path = "../../examples/demo/model.rs"]
mod model;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hwqueue::{Backend, Device, Registry};
use hwqueue_sim::{KernelArgs, Sim, SimConfig, SimDevice, SimProgram, SimSet, SimSetDevice};
use kernels::{HIDDEN, INPUT, OUTPUT};
use model::BATCH;

/// `c[r][j] = sum_k a[r][k] * b[k][j]` over the `exec`'s grid (columns,
/// rows), summing `k` in order as the reference does.
fn matmul<const K: usize, const N: usize>(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let [cols, rows, _] = args.params().global().map(|n| n as usize);
    let (a, b) = (args.read::<f32>(0), args.read::<f32>(1));
    let mut c = vec![0f32; rows * N];
    for r in 0..rows {
        for j in 0..cols {
            let mut acc = 0f32;
            for k in 0..K {
                acc += a[r * K + k] * b[k * N + j];
            }
            c[r * N + j] = acc;
        }
    }
    args.write(2, &c);
    Ok(())
}

fn bias_relu(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let (mut h, bias) = (args.read::<f32>(0), args.read::<f32>(1));
    for (i, v) in h.iter_mut().enumerate() {
        *v = (*v + bias[i % HIDDEN]).max(0.0);
    }
    args.write(0, &h);
    Ok(())
}

fn bias_softmax(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let (logits, bias) = (args.read::<f32>(0), args.read::<f32>(1));
    let mut probs = vec![0f32; logits.len()];
    for (row, out) in logits.chunks(OUTPUT).zip(probs.chunks_mut(OUTPUT)) {
        let mut max = f32::NEG_INFINITY;
        for j in 0..OUTPUT {
            out[j] = row[j] + bias[j];
            max = max.max(out[j]);
        }
        let mut sum = 0f32;
        for v in out.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in out.iter_mut() {
            *v /= sum;
        }
    }
    args.write(2, &probs);
    Ok(())
}

fn programs() -> Vec<SimProgram> {
    vec![
        SimProgram::new("matmul1", 3, 0, matmul::<INPUT, HIDDEN>),
        SimProgram::new("bias_relu", 2, 0, bias_relu),
        SimProgram::new("matmul2", 3, 0, matmul::<HIDDEN, OUTPUT>),
        SimProgram::new("bias_softmax", 3, 0, bias_softmax),
    ]
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("mlp failed: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (mut latency_us, mut iterations) = (0u64, 10usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let value = args.next().ok_or(format!("{name} needs a number"))?;
            value
                .parse()
                .map_err(|_| format!("{name} takes a number, not `{value}`"))
        };
        match arg.as_str() {
            "--latency-us" => latency_us = number("--latency-us")?,
            "--iterations" => iterations = number("--iterations")?.max(1) as usize,
            other => {
                return Err(format!(
                    "unknown argument `{other}`; usage: mlp [--latency-us N] [--iterations N]"
                ));
            }
        }
    }
    let err = |e: hwqueue::Error| e.to_string();

    // What selection sees in the set: the simulator ranks above the CPU
    // and below a GPU.
    let registry = Registry::<SimSet>::new();
    let selection = registry.select(hwqueue::Policy::default()).map_err(err)?;
    println!(
        "SimSet selects {}: {}",
        selection.device.spec(),
        selection.reason
    );

    // The simulator with the asked-for latency, in the set's types.
    let config = SimConfig::default().latency(Duration::from_micros(latency_us));
    let device = Arc::new(SimSetDevice::from(SimDevice::new(0, config)));
    println!("device: {} ({})", device.spec(), device.name());
    assert_eq!(device.spec().backend(), Sim::ID);
    let programs: Vec<_> = programs().into_iter().map(Into::into).collect();

    let weights = model::Weights::new();
    let mut mlp = model::plan::<SimSet>(&device, &programs, &weights)?;
    println!("{}", mlp.plan);
    println!("{}", mlp.plan.memory());
    let model::Report { times, worst_error } = model::run(&mut mlp, &weights, iterations)?;
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "{iterations} iterations of batch {BATCH} ({INPUT} -> {HIDDEN} -> {OUTPUT}) on the simulator: median {:.2?}",
        sorted[sorted.len() / 2]
    );
    println!(
        "verified: all {iterations} iterations match plain Rust (max abs error {worst_error:.2e}); {} runs of one plan",
        mlp.plan.runs()
    );
    Ok(())
}
