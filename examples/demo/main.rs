//! The hwqueue demo: what a compiler's device layer does, end to end.
//!
//! A two-layer MLP forward pass over a batch (matmul, bias + ReLU, matmul,
//! bias + softmax), with its kernels generated as C source (CUDA C on a CUDA GPU, WGSL on a
//! Vulkan device) with the shapes baked in, compiled at run time, planned once by the
//! executor (four kernels on the compute queue, a download on the copy
//! queue, its intermediates placed in one arena by the memory planner,
//! waits derived from the bytes they touch), then run for N iterations,
//! each with its input bound from a caller's buffer. Every iteration's
//! output is checked against plain Rust.
//!
//! With two devices (`--device cpu,vulkan:0`), the plan is heterogeneous:
//! layer 1 (matmul1, bias_relu) runs on the first device, layer 2 (matmul2,
//! bias_softmax) on the second, each with its own weights and kernels, and
//! the hidden activations are copied from the first to the second (on the
//! executor's host stage when neither can see the other's memory). The
//! input is bound on the first, the output downloaded from the second.
//!
//! ```text
//! cargo run --release --example demo -- [--device cpu|cuda:0|vulkan:0] [--iterations N]
//! cargo run --release --example demo -- --device cpu,vulkan:0 [--iterations N]
//! ```

// `cuda_kernels` is unused without the `cuda` feature, `wgsl_kernels`
// without `vulkan`.
#[cfg_attr(not(all(feature = "cuda", feature = "vulkan")), allow(dead_code))]
mod kernels;
mod model;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hwqueue::cpu::{CompileOptions, CpuProgram};
use hwqueue::{AnyBackend, AnyDevice, AnyProgram, Device, Policy, registry};
use kernels::{HIDDEN, INPUT, OUTPUT};
use model::{BATCH, TOLERANCE};

/// What `--help` prints.
const USAGE: &str =
    "usage: demo [--device DEVICE | --device DEVICE,DEVICE] [--iterations N] [--trace FILE.json]
  DEVICE is cpu, cuda:0 or vulkan:0 (another ordinal for another device);
  two different devices split the model: layer 1 on the first, layer 2 on
  the second, e.g. `--device cpu,vulkan:0`";

struct Options {
    /// `--device`'s value: one spec, or two separated by a comma.
    device: Option<String>,
    iterations: usize,
    /// Write the runs' timeline here (Chrome trace JSON).
    trace: Option<String>,
}

/// The most iterations a run times (each keeps its time, to report the
/// median).
const MAX_ITERATIONS: usize = 10_000_000;

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        device: None,
        iterations: 20,
        trace: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--device" => {
                options.device = Some(args.next().ok_or(
                    "--device needs a value, e.g. `--device cpu`, `--device cuda:0`, \
                     `--device vulkan:0`, or two to split the model, `--device cpu,vulkan:0`",
                )?)
            }
            "--iterations" => {
                let value = args.next().ok_or("--iterations needs a number")?;
                options.iterations = (value.parse().ok())
                    .filter(|n| (1..=MAX_ITERATIONS).contains(n))
                    .ok_or(format!(
                        "--iterations takes a number from 1 to {MAX_ITERATIONS}, not `{value}`"
                    ))?;
            }
            "--trace" => {
                options.trace = Some(args.next().ok_or(
                    "--trace needs a file name, e.g. `--trace /tmp/trace.json` (open it in \
                     https://ui.perfetto.dev or chrome://tracing)",
                )?);
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`; try --help")),
        }
    }
    Ok(options)
}

/// Compiles the generated kernels for `device`; reports how.
fn compile(device: &AnyDevice) -> Result<(Vec<AnyProgram>, String), hwqueue::Error> {
    if device.as_cpu().is_some() {
        let options = CompileOptions::default();
        let mut programs = Vec::new();
        let mut outcomes = Vec::new();
        for (name, source) in kernels::c_kernels() {
            // SAFETY: each kernel above has the ABI's signature (declared by
            // HWQ_KERNEL), reads and writes only within the buffers the
            // schedule passes (the shapes are baked in and match the
            // buffers' sizes), and each work-group writes only its own tile
            // of rows and columns.
            let program = unsafe {
                CpuProgram::from_c_source(name, &source, name, kernels::buffers(name), 0, &options)?
            };
            outcomes.push(format!(
                "{name}: {:?}",
                program.cache_outcome().expect("a C kernel")
            ));
            programs.push(AnyProgram::from(program));
        }
        return Ok((
            programs,
            format!(
                "generated as C, built by the system C compiler ({})",
                outcomes.join(", ")
            ),
        ));
    }
    #[cfg(feature = "cuda")]
    if let Some(cuda) = device.as_cuda() {
        let mut programs = Vec::new();
        for (name, source) in kernels::cuda_kernels() {
            let program = hwqueue::cuda::CudaProgram::from_cuda_c(
                cuda,
                &source,
                name,
                kernels::buffers(name),
                0,
            )?;
            programs.push(AnyProgram::from(program));
        }
        return Ok((
            programs,
            "generated as CUDA C, compiled with NVRTC".to_owned(),
        ));
    }
    #[cfg(feature = "vulkan")]
    if device.as_vulkan().is_some() {
        let mut programs = Vec::new();
        for (name, source) in kernels::wgsl_kernels() {
            let program = hwqueue::vulkan::VulkanProgram::from_wgsl(name, &source, name)?;
            programs.push(AnyProgram::from(program));
        }
        return Ok((
            programs,
            "generated as WGSL, compiled to SPIR-V by naga".to_owned(),
        ));
    }
    Err(hwqueue::Error::InvalidProgram {
        program: "demo".into(),
        reason: format!(
            "the demo has no kernels for `{}`; run it with `--device cpu`",
            device.spec()
        ),
    })
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("demo failed: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The devices `--device`'s value names: one spec, acquired as given, or
/// two different ones separated by a comma (layer 1's, then layer 2's).
fn acquire_devices(value: &str) -> Result<Vec<Arc<AnyDevice>>, String> {
    let specs: Vec<&str> = value.split(',').collect();
    match specs[..] {
        [spec] => Ok(vec![registry().acquire(spec).map_err(|e| e.to_string())?]),
        [first, second] => {
            let parse = |which: &str, spec: &str| {
                registry()
                    .parse(spec)
                    .map_err(|e| format!("--device `{value}`: {which} device: {e}"))
            };
            let (first, second) = (parse("layer 1's", first)?, parse("layer 2's", second)?);
            if first == second {
                return Err(format!(
                    "--device `{value}` names {first} twice: splitting the model needs two \
                     different devices, e.g. `--device cpu,vulkan:0`; for one device, give \
                     it alone: `--device {first}`"
                ));
            }
            [("layer 1's", first), ("layer 2's", second)]
                .into_iter()
                .map(|(which, spec)| {
                    registry()
                        .open(spec)
                        .map_err(|e| format!("--device `{value}`: {which} device: {e}"))
                })
                .collect()
        }
        _ => Err(format!(
            "--device `{value}` names {} devices; give one (`--device cpu`) or two to split \
             the model over (`--device cpu,vulkan:0`)",
            specs.len()
        )),
    }
}

fn run() -> Result<(), String> {
    let options = parse_options()?;
    let err = |e: hwqueue::Error| e.to_string();

    let (devices, why) = match &options.device {
        Some(value) => (
            acquire_devices(value)?,
            "asked for with --device".to_owned(),
        ),
        None => {
            let selection = registry().select(Policy::default()).map_err(err)?;
            (vec![selection.device], selection.reason)
        }
    };
    println!(
        "hwqueue demo: a 2-layer MLP forward pass (batch {BATCH}, {INPUT} -> {HIDDEN} -> ReLU -> {OUTPUT} -> softmax), {} iterations",
        options.iterations
    );
    let weights = model::Weights::new();
    let mut mlp = match &devices[..] {
        [device] => {
            println!("device: {} ({}): {why}", device.spec(), device.name());
            if device.as_cpu().is_some() && options.device.is_none() {
                println!(
                    "  (no GPU in use: this runs on the CPU backend; see `cargo run --release --example info`)"
                );
            }

            let compile_start = Instant::now();
            let (programs, how) = compile(device).map_err(err)?;
            println!("kernels: 4 {how}, in {:.1?}", compile_start.elapsed());

            model::plan::<AnyBackend>(device, &programs, &weights)?
        }
        [first, second] => {
            println!(
                "devices: layer 1 on {} ({}), layer 2 on {} ({}): {why}",
                first.spec(),
                first.name(),
                second.spec(),
                second.name()
            );
            let mut programs = Vec::new();
            for (layer, device) in [first, second].into_iter().enumerate() {
                let compile_start = Instant::now();
                let (compiled, how) = compile(device).map_err(err)?;
                println!(
                    "kernels on {} (layer {}): 4 {how}, in {:.1?}",
                    device.spec(),
                    layer + 1,
                    compile_start.elapsed()
                );
                programs.push(compiled);
            }
            model::plan_layers::<AnyBackend>(
                [(first, &programs[0]), (second, &programs[1])],
                &weights,
            )?
        }
        _ => unreachable!("acquire_devices gives one device or two"),
    };
    println!("{}", mlp.plan);
    println!("{}", mlp.plan.memory());
    if options.trace.is_some() {
        mlp.plan.set_profiling(true);
    }
    let model::Report { times, worst_error } = model::run(&mut mlp, &weights, options.iterations)?;
    let plan = &mut mlp.plan;

    let mut sorted = times.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let total: Duration = times.iter().sum();
    let flops = 2.0 * (BATCH * INPUT * HIDDEN + BATCH * HIDDEN * OUTPUT) as f64;
    let copy = if devices.len() == 2 {
        " and a copy between the devices"
    } else {
        ""
    };
    println!("per iteration (input write and bind, 4 kernels{copy}, download, host wait):");
    for (i, t) in times.iter().enumerate().take(5) {
        println!("  iteration {:>3}: {t:.2?}", i + 1);
    }
    if times.len() > 5 {
        println!("  ... {} more", times.len() - 5);
    }
    println!(
        "median {median:.2?}, min {:.2?}, mean {:.2?}; {:.0} samples/s, {:.2} GFLOP/s",
        sorted[0],
        total.div_f64(times.len() as f64),
        BATCH as f64 / median.as_secs_f64(),
        flops / median.as_secs_f64() / 1e9
    );
    // What the plan recorded once and submitted again (Vulkan: command
    // buffers; CUDA: graphs), against what it recorded run by run.
    let launches = plan.launches();
    if launches.kernels + launches.programs == 0 {
        println!("replay: none (no device here has a replay form; each run records its commands)");
    } else {
        println!(
            "replay: {} kernel launches recorded, {} recorded programs submitted again{}",
            launches.kernels,
            launches.programs,
            match &launches.fallback {
                Some(why) => format!("; ran the plain way where {why}"),
                None => String::new(),
            }
        );
    }
    println!(
        "verified: all {} iterations match plain Rust (max abs error {worst_error:.2e}, tolerance {TOLERANCE:.0e}); {} runs of one plan",
        options.iterations,
        plan.runs()
    );
    if let Some(path) = &options.trace {
        let events = plan.take_profile();
        std::fs::write(path, hwqueue::chrome_trace(&events))
            .map_err(|e| format!("writing the trace to {path}: {e}"))?;
        println!(
            "trace: {} events written to {path}; open it in https://ui.perfetto.dev or chrome://tracing",
            events.len()
        );
    }
    Ok(())
}
