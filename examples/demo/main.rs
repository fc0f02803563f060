//! The hwqueue demo: what a compiler's device layer does, end to end.
//!
//! A two-layer MLP forward pass over a batch (matmul, bias + ReLU, matmul,
//! bias + softmax), with its kernels generated as C source (CUDA C on a GPU)
//! with the shapes baked in, compiled at run time, planned once by the
//! executor (four kernels on the compute queue, a download on the copy
//! queue, its intermediates placed in one arena by the memory planner,
//! waits derived from the bytes they touch), then run for N iterations,
//! each with its input bound from a caller's buffer. Every iteration's
//! output is checked against plain Rust.
//!
//! ```text
//! cargo run --release --example demo -- [--device cpu|cuda:0] [--iterations N]
//! ```

// `cuda_kernels` is unused without the `cuda` feature.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod kernels;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hwqueue::cpu::{CompileOptions, CpuProgram};
use hwqueue::{
    AnyBackend, AnyDevice, AnyProgram, Buffer, Device, Download, ExecParams, Policy, Schedule,
    Timeout, registry,
};
use kernels::{HIDDEN, INPUT, OUTPUT};

const BATCH: usize = 64;

/// The largest difference from plain Rust accepted: the C kernels sum in
/// the same order as the reference, but `expf` and a GPU's fused
/// multiply-adds may differ in the last bits.
const TOLERANCE: f32 = 1e-4;

struct Options {
    device: Option<String>,
    iterations: usize,
    /// Write the runs' timeline here (Chrome trace JSON).
    trace: Option<String>,
}

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
                options.device =
                    Some(args.next().ok_or(
                        "--device needs a value, e.g. `--device cpu` or `--device cuda:0`",
                    )?)
            }
            "--iterations" => {
                let value = args.next().ok_or("--iterations needs a number")?;
                options.iterations = value.parse().ok().filter(|n| *n > 0).ok_or(format!(
                    "--iterations takes a positive number, not `{value}`"
                ))?;
            }
            "--trace" => {
                options.trace = Some(args.next().ok_or(
                    "--trace needs a file name, e.g. `--trace /tmp/trace.json` (open it in \
                     https://ui.perfetto.dev or chrome://tracing)",
                )?);
            }
            "--help" | "-h" => {
                println!("usage: demo [--device cpu|cuda:0] [--iterations N] [--trace FILE.json]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`; try --help")),
        }
    }
    Ok(options)
}

/// Deterministic pseudo-random values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }
}

struct Weights {
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

/// The model in plain Rust, summing in the kernels' order.
fn reference(x: &[f32], w: &Weights) -> Vec<f32> {
    let mut h = vec![0f32; BATCH * HIDDEN];
    for r in 0..BATCH {
        for k in 0..INPUT {
            let a = x[r * INPUT + k];
            for j in 0..HIDDEN {
                h[r * HIDDEN + j] += a * w.w1[k * HIDDEN + j];
            }
        }
        for j in 0..HIDDEN {
            h[r * HIDDEN + j] = (h[r * HIDDEN + j] + w.b1[j]).max(0.0);
        }
    }
    let mut out = vec![0f32; BATCH * OUTPUT];
    for r in 0..BATCH {
        for k in 0..HIDDEN {
            let a = h[r * HIDDEN + k];
            for j in 0..OUTPUT {
                out[r * OUTPUT + j] += a * w.w2[k * OUTPUT + j];
            }
        }
        let row = &mut out[r * OUTPUT..(r + 1) * OUTPUT];
        let mut max = f32::NEG_INFINITY;
        for (j, v) in row.iter_mut().enumerate() {
            *v += w.b2[j];
            max = max.max(*v);
        }
        let mut sum = 0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v /= sum;
        }
    }
    out
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

fn run() -> Result<(), String> {
    let options = parse_options()?;
    let err = |e: hwqueue::Error| e.to_string();

    let (device, why) = match &options.device {
        Some(spec) => (
            registry().acquire(spec).map_err(err)?,
            "asked for with --device".to_owned(),
        ),
        None => {
            let selection = registry().select(Policy::default()).map_err(err)?;
            (selection.device, selection.reason)
        }
    };
    println!(
        "hwqueue demo: a 2-layer MLP forward pass (batch {BATCH}, {INPUT} -> {HIDDEN} -> ReLU -> {OUTPUT} -> softmax), {} iterations",
        options.iterations
    );
    println!("device: {} ({}): {why}", device.spec(), device.name());
    if device.as_cpu().is_some() && options.device.is_none() {
        println!(
            "  (no GPU in use: this runs on the CPU backend; see `cargo run --release --example info`)"
        );
    }

    let compile_start = Instant::now();
    let (programs, how) = compile(&device).map_err(err)?;
    println!("kernels: 4 {how}, in {:.1?}", compile_start.elapsed());

    let mut rng = Lcg(42);
    let weights = Weights {
        w1: rng.vec(INPUT * HIDDEN, 0.1),
        b1: rng.vec(HIDDEN, 0.1),
        w2: rng.vec(HIDDEN * OUTPUT, 0.1),
        b2: rng.vec(OUTPUT, 0.1),
    };
    // The schedule, as the compiler hands it over: operations in program
    // order, each with the tensors it touches. The weights are the
    // caller's buffers; the input is a slot, bound to a caller's buffer
    // per run; the intermediates are tensors whose bytes the planner
    // places in one arena, `probs` reusing `h`'s once `h` is dead.
    let mut schedule = Schedule::<AnyBackend>::new();
    let d = schedule.add_device(Arc::clone(&device));
    let mut weight = |name: &str, data: &[f32]| -> Result<_, String> {
        let buffer = device.alloc(size_of_val(data)).map_err(err)?;
        buffer.write_at(0, data).map_err(err)?;
        Ok(schedule.add_buffer(d, name, buffer))
    };
    let bw1 = weight("w1", &weights.w1)?;
    let bb1 = weight("b1", &weights.b1)?;
    let bw2 = weight("w2", &weights.w2)?;
    let bb2 = weight("b2", &weights.b2)?;
    let f32s = |n: usize| n * size_of::<f32>();
    let bx = schedule.add_slot(d, "x", f32s(BATCH * INPUT));
    let bh = schedule.add_tensor(d, "h", f32s(BATCH * HIDDEN));
    let blogits = schedule.add_tensor(d, "logits", f32s(BATCH * OUTPUT));
    let bprobs = schedule.add_tensor(d, "probs", f32s(BATCH * OUTPUT));
    let tile = |cols: usize, rows: usize, local: [u32; 2]| {
        ExecParams::new_2d([cols as u32, rows as u32], local)
    };
    schedule
        .exec(
            "matmul1",
            d,
            &programs[0],
            &[bx, bw1, bh],
            &[],
            tile(HIDDEN, BATCH, [64, 4]),
        )
        .reads(bx, ..)
        .reads(bw1, ..)
        .writes(bh, ..);
    schedule
        .exec(
            "bias_relu",
            d,
            &programs[1],
            &[bh, bb1],
            &[],
            tile(HIDDEN, BATCH, [64, 4]),
        )
        .reads(bh, ..)
        .reads(bb1, ..)
        .writes(bh, ..);
    schedule
        .exec(
            "matmul2",
            d,
            &programs[2],
            &[bh, bw2, blogits],
            &[],
            tile(OUTPUT, BATCH, [16, 4]),
        )
        .reads(bh, ..)
        .reads(bw2, ..)
        .writes(blogits, ..);
    schedule
        .exec(
            "bias_softmax",
            d,
            &programs[3],
            &[blogits, bb2, bprobs],
            &[],
            ExecParams::new_1d(BATCH as u32, 4),
        )
        .reads(blogits, ..)
        .reads(bb2, ..)
        .writes(bprobs, ..);
    let download_probs = schedule.download("download probs", bprobs).id();
    let mut plan = schedule.plan().map_err(err)?;
    println!("{plan}");
    println!("{}", plan.memory());
    // The caller's input buffers, bound in turn: a run reads the one bound
    // when it started, with no copy into the plan.
    let inputs = [
        device.alloc(f32s(BATCH * INPUT)).map_err(err)?,
        device.alloc(f32s(BATCH * INPUT)).map_err(err)?,
    ];
    if options.trace.is_some() {
        plan.set_profiling(true);
    }

    let mut times = Vec::with_capacity(options.iterations);
    let mut worst_error = 0f32;
    let mut output = vec![0f32; BATCH * OUTPUT];
    for iteration in 0..options.iterations {
        let input = Lcg(1000 + iteration as u64).vec(BATCH * INPUT, 1.0);
        let start = Instant::now();
        // This run's input, written to a caller's buffer and bound to the
        // plan's slot, and where its output lands, staged for the plan's
        // download (reusing the last one's memory).
        let x = &inputs[iteration % 2];
        x.write_at(0, &input).map_err(err)?;
        plan.bind(bx, x).map_err(err)?;
        let probs = Download::from_vec(output);
        plan.download(download_probs, &probs).map_err(err)?;
        plan.run()
            .map_err(err)?
            .wait(Timeout::Forever)
            .map_err(err)?;
        output = probs.take(Timeout::Forever).map_err(err)?;
        times.push(start.elapsed());

        let expected = reference(&input, &weights);
        // A non-finite output counts as an infinite error (f32::max would
        // otherwise skip a NaN).
        let error = output
            .iter()
            .zip(&expected)
            .map(|(a, b)| {
                if a.is_finite() {
                    (a - b).abs()
                } else {
                    f32::INFINITY
                }
            })
            .fold(0f32, f32::max);
        worst_error = worst_error.max(error);
        if error > TOLERANCE {
            return Err(format!(
                "iteration {iteration}: output differs from plain Rust by {error} (tolerance {TOLERANCE})"
            ));
        }
    }

    let mut sorted = times.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let total: Duration = times.iter().sum();
    let flops = 2.0 * (BATCH * INPUT * HIDDEN + BATCH * HIDDEN * OUTPUT) as f64;
    println!("per iteration (input write and bind, 4 kernels, download, host wait):");
    for (i, t) in times.iter().enumerate().take(5) {
        println!("  iteration {:>3}: {t:.2?}", i + 1);
    }
    if times.len() > 5 {
        println!("  ... {} more", times.len() - 5);
    }
    println!(
        "median {median:.2?}, min {:.2?}, mean {:.2?}; {:.0} samples/s, {:.2} GFLOP/s",
        sorted[0],
        total / times.len() as u32,
        BATCH as f64 / median.as_secs_f64(),
        flops / median.as_secs_f64() / 1e9
    );
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
