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

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hwqueue::cpu::{CompileOptions, CpuProgram};
use hwqueue::{
    AnyBackend, AnyDevice, AnyProgram, Buffer, Device, Download, ExecParams, Policy, Schedule,
    Timeout, registry,
};

const BATCH: usize = 64;
const INPUT: usize = 256;
const HIDDEN: usize = 512;
const OUTPUT: usize = 16;

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

/// The C a compiler's CPU backend would emit for this model: one function
/// per kernel, shapes baked in, called once per work-group.
fn c_kernels() -> [(&'static str, String); 4] {
    let matmul = |name: &str, k: usize, n: usize| {
        format!(
            r#"
HWQ_KERNEL({name}) {{
    const float *a = buffers[0], *b = buffers[1];
    float *c = buffers[2];
    size_t col0 = hwq_global_start(group, 0), row0 = hwq_global_start(group, 1);
    size_t cols = group->local[0], rows = group->local[1];
    for (size_t r = row0; r < row0 + rows; r++) {{
        float *out = c + r * {n} + col0;
        for (size_t j = 0; j < cols; j++) out[j] = 0.0f;
        for (size_t k = 0; k < {k}; k++) {{
            float av = a[r * {k} + k];
            const float *brow = b + k * {n} + col0;
            for (size_t j = 0; j < cols; j++) out[j] += av * brow[j];
        }}
    }}
}}"#
        )
    };
    let bias_relu = format!(
        r#"
HWQ_KERNEL(bias_relu) {{
    float *h = buffers[0];
    const float *bias = buffers[1];
    size_t col0 = hwq_global_start(group, 0), row0 = hwq_global_start(group, 1);
    for (size_t r = row0; r < row0 + group->local[1]; r++)
        for (size_t j = col0; j < col0 + group->local[0]; j++) {{
            float v = h[r * {HIDDEN} + j] + bias[j];
            h[r * {HIDDEN} + j] = v > 0.0f ? v : 0.0f;
        }}
}}"#
    );
    let bias_softmax = format!(
        r#"
#include <math.h>
HWQ_KERNEL(bias_softmax) {{
    const float *logits = buffers[0], *bias = buffers[1];
    float *probs = buffers[2];
    size_t row0 = hwq_global_start(group, 0);
    for (size_t r = row0; r < row0 + group->local[0]; r++) {{
        float *p = probs + r * {OUTPUT};
        float max = -INFINITY;
        for (size_t j = 0; j < {OUTPUT}; j++) {{
            p[j] = logits[r * {OUTPUT} + j] + bias[j];
            if (p[j] > max) max = p[j];
        }}
        float sum = 0.0f;
        for (size_t j = 0; j < {OUTPUT}; j++) {{ p[j] = expf(p[j] - max); sum += p[j]; }}
        for (size_t j = 0; j < {OUTPUT}; j++) p[j] /= sum;
    }}
}}"#
    );
    [
        ("matmul1", matmul("matmul1", INPUT, HIDDEN)),
        ("bias_relu", bias_relu),
        ("matmul2", matmul("matmul2", HIDDEN, OUTPUT)),
        ("bias_softmax", bias_softmax),
    ]
}

/// The same kernels as CUDA C: one thread per output element (per row for
/// the softmax).
#[cfg(feature = "cuda")]
fn cuda_kernels() -> [(&'static str, String); 4] {
    let matmul = |name: &str, k: usize, n: usize| {
        format!(
            r#"extern "C" __global__ void {name}(const float *a, const float *b, float *c) {{
    unsigned j = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    float acc = 0.0f;
    for (unsigned k = 0; k < {k}; k++) acc += a[r * {k} + k] * b[k * {n} + j];
    c[r * {n} + j] = acc;
}}"#
        )
    };
    [
        ("matmul1", matmul("matmul1", INPUT, HIDDEN)),
        (
            "bias_relu",
            format!(
                r#"extern "C" __global__ void bias_relu(float *h, const float *bias) {{
    unsigned j = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    float v = h[r * {HIDDEN} + j] + bias[j];
    h[r * {HIDDEN} + j] = v > 0.0f ? v : 0.0f;
}}"#
            ),
        ),
        ("matmul2", matmul("matmul2", HIDDEN, OUTPUT)),
        (
            "bias_softmax",
            format!(
                r#"extern "C" __global__ void bias_softmax(const float *logits, const float *bias, float *probs) {{
    unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    float *p = probs + r * {OUTPUT};
    // -infinity from its bits: NVRTC defines no INFINITY without headers.
    float max = __int_as_float(0xff800000);
    for (unsigned j = 0; j < {OUTPUT}; j++) {{ p[j] = logits[r * {OUTPUT} + j] + bias[j]; max = fmaxf(max, p[j]); }}
    float sum = 0.0f;
    for (unsigned j = 0; j < {OUTPUT}; j++) {{ p[j] = expf(p[j] - max); sum += p[j]; }}
    for (unsigned j = 0; j < {OUTPUT}; j++) p[j] /= sum;
}}"#
            ),
        ),
    ]
}

/// Compiles the generated kernels for `device`; reports how.
fn compile(device: &AnyDevice) -> Result<(Vec<AnyProgram>, String), hwqueue::Error> {
    let arity = |name: &str| match name {
        "bias_relu" => 2,
        _ => 3,
    };
    if device.as_cpu().is_some() {
        let options = CompileOptions::default();
        let mut programs = Vec::new();
        let mut outcomes = Vec::new();
        for (name, source) in c_kernels() {
            // SAFETY: each kernel above has the ABI's signature (declared by
            // HWQ_KERNEL), reads and writes only within the buffers the
            // schedule passes (the shapes are baked in and match the
            // buffers' sizes), and each work-group writes only its own tile
            // of rows and columns.
            let program = unsafe {
                CpuProgram::from_c_source(name, &source, name, arity(name), 0, &options)?
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
        for (name, source) in cuda_kernels() {
            let program =
                hwqueue::cuda::CudaProgram::from_cuda_c(cuda, &source, name, arity(name), 0)?;
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
