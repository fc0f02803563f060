//! The demo's model, generic over the backend: its weights, a reference in
//! plain Rust, the schedule a compiler would hand over, and the verified
//! run loop. `examples/demo/main.rs` runs it on one device (the CPU, CUDA
//! or Vulkan) or split over two ([`plan_layers`]: layer 1 on one, layer 2
//! on the other); `sim/examples/mlp.rs` runs the same plan on the simulated
//! accelerator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hwqueue::{
    Backend, Buffer, BufferId, Device, DeviceOf, Download, ExecParams, OpId, Plan, ProgramOf,
    Schedule, Timeout,
};

use crate::kernels::{HIDDEN, INPUT, OUTPUT};

/// Rows per forward pass.
pub const BATCH: usize = 64;

/// The largest difference from plain Rust accepted: the kernels sum in
/// the same order as the reference, but `expf` and a GPU's fused
/// multiply-adds may differ in the last bits.
pub const TOLERANCE: f32 = 1e-4;

/// Deterministic pseudo-random values in [-1, 1).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }
}

/// The model's parameters.
pub struct Weights {
    pub w1: Vec<f32>,
    pub b1: Vec<f32>,
    pub w2: Vec<f32>,
    pub b2: Vec<f32>,
}

impl Weights {
    /// The demo's weights: the same every run.
    pub fn new() -> Self {
        let mut rng = Lcg(42);
        Self {
            w1: rng.vec(INPUT * HIDDEN, 0.1),
            b1: rng.vec(HIDDEN, 0.1),
            w2: rng.vec(HIDDEN * OUTPUT, 0.1),
            b2: rng.vec(OUTPUT, 0.1),
        }
    }
}

/// The largest difference between `output` and `expected`; a non-finite
/// output counts as an infinite error (`f32::max` would otherwise skip a
/// NaN).
pub fn max_error(output: &[f32], expected: &[f32]) -> f32 {
    output
        .iter()
        .zip(expected)
        .map(|(a, b)| {
            if a.is_finite() {
                (a - b).abs()
            } else {
                f32::INFINITY
            }
        })
        .fold(0f32, f32::max)
}

/// The model in plain Rust, summing in the kernels' order.
pub fn reference(x: &[f32], w: &Weights) -> Vec<f32> {
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

/// The planned model: the plan, its input slot and its download.
pub struct Mlp<B: Backend> {
    pub plan: Plan<B>,
    input: BufferId,
    download: OpId,
    /// The caller's input buffers, bound in turn.
    inputs: [B::Buffer; 2],
}

/// What a verified run measured.
pub struct Report {
    pub times: Vec<Duration>,
    pub worst_error: f32,
}

/// Plans the model on `device` with `programs` (matmul1, bias_relu,
/// matmul2, bias_softmax, in that order).
pub fn plan<B: Backend>(
    device: &Arc<DeviceOf<B>>,
    programs: &[ProgramOf<B>],
    weights: &Weights,
) -> Result<Mlp<B>, String> {
    plan_layers([(device, programs), (device, programs)], weights)
}

/// Where a layer runs: its device, and that device's programs (matmul1,
/// bias_relu, matmul2, bias_softmax, in that order).
pub type Layer<'a, B> = (&'a Arc<DeviceOf<B>>, &'a [ProgramOf<B>]);

/// Plans the model with layer 1 (matmul1, bias_relu) on the first device
/// and layer 2 (matmul2, bias_softmax) on the second, each with that
/// device's `programs` (matmul1, bias_relu, matmul2, bias_softmax, in that
/// order; a layer uses its own two). Each layer's weights live on its
/// device, the input slot on the first, the output's download on the
/// second. On two devices, the hidden activations `h` are copied from the
/// first device to a tensor of the same size on the second (a copy the
/// planner runs on its host stage when neither device can see the other's
/// memory); on one (the same `Arc` twice), this is [`plan`]'s schedule.
pub fn plan_layers<B: Backend>(
    layers: [Layer<'_, B>; 2],
    weights: &Weights,
) -> Result<Mlp<B>, String> {
    let err = |e: hwqueue::Error| e.to_string();
    let [(device1, programs1), (device2, programs2)] = layers;
    let split = !Arc::ptr_eq(device1, device2);
    // The schedule, as the compiler hands it over: operations in program
    // order, each with the tensors it touches. The weights are the
    // caller's buffers; the input is a slot, bound to a caller's buffer
    // per run; the intermediates are tensors whose bytes the planner
    // places in one arena per device, `probs` reusing the bytes of layer
    // 2's input (`h`, or its copy on the second device) once that is dead.
    let mut schedule = Schedule::<B>::new();
    let d1 = schedule.add_device(Arc::clone(device1));
    let d2 = if split {
        schedule.add_device(Arc::clone(device2))
    } else {
        d1
    };
    let mut weight = |d, device: &DeviceOf<B>, name: &str, data: &[f32]| -> Result<_, String> {
        let buffer = device.alloc(size_of_val(data)).map_err(err)?;
        buffer.write_at(0, data).map_err(err)?;
        Ok(schedule.add_buffer(d, name, buffer))
    };
    let bw1 = weight(d1, device1, "w1", &weights.w1)?;
    let bb1 = weight(d1, device1, "b1", &weights.b1)?;
    let bw2 = weight(d2, device2, "w2", &weights.w2)?;
    let bb2 = weight(d2, device2, "b2", &weights.b2)?;
    let f32s = |n: usize| n * size_of::<f32>();
    let bx = schedule.add_slot(d1, "x", f32s(BATCH * INPUT));
    let bh = schedule.add_tensor(d1, "h", f32s(BATCH * HIDDEN));
    // Layer 2's input: `h` itself on one device, a copy of it on two.
    let bh2 = if split {
        schedule.add_tensor(d2, format!("h on {}", device2.spec()), f32s(BATCH * HIDDEN))
    } else {
        bh
    };
    let blogits = schedule.add_tensor(d2, "logits", f32s(BATCH * OUTPUT));
    let bprobs = schedule.add_tensor(d2, "probs", f32s(BATCH * OUTPUT));
    let tile = |cols: usize, rows: usize, local: [u32; 2]| {
        ExecParams::new_2d([cols as u32, rows as u32], local)
    };
    schedule
        .exec(
            "matmul1",
            d1,
            &programs1[0],
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
            d1,
            &programs1[1],
            &[bh, bb1],
            &[],
            tile(HIDDEN, BATCH, [64, 4]),
        )
        .reads(bh, ..)
        .reads(bb1, ..)
        .writes(bh, ..);
    if split {
        schedule.copy(format!("copy h to {}", device2.spec()), bh2, bh);
    }
    schedule
        .exec(
            "matmul2",
            d2,
            &programs2[2],
            &[bh2, bw2, blogits],
            &[],
            tile(OUTPUT, BATCH, [16, 4]),
        )
        .reads(bh2, ..)
        .reads(bw2, ..)
        .writes(blogits, ..);
    schedule
        .exec(
            "bias_softmax",
            d2,
            &programs2[3],
            &[blogits, bb2, bprobs],
            &[],
            ExecParams::new_1d(BATCH as u32, 4),
        )
        .reads(blogits, ..)
        .reads(bb2, ..)
        .writes(bprobs, ..);
    let download_probs = schedule.download("download probs", bprobs).id();
    let plan = schedule.plan().map_err(err)?;
    let inputs = [
        device1.alloc(f32s(BATCH * INPUT)).map_err(err)?,
        device1.alloc(f32s(BATCH * INPUT)).map_err(err)?,
    ];
    Ok(Mlp {
        plan,
        input: bx,
        download: download_probs,
        inputs,
    })
}

/// Runs the plan `iterations` times, each on a fresh input written to a
/// caller's buffer and bound to the plan's slot, its output downloaded and
/// checked against [`reference`].
pub fn run<B: Backend>(
    mlp: &mut Mlp<B>,
    weights: &Weights,
    iterations: usize,
) -> Result<Report, String> {
    let err = |e: hwqueue::Error| e.to_string();
    let plan = &mut mlp.plan;
    let (bx, download_probs, inputs) = (mlp.input, mlp.download, &mlp.inputs);
    let mut times = Vec::with_capacity(iterations);
    let mut worst_error = 0f32;
    let mut output = vec![0f32; BATCH * OUTPUT];
    for iteration in 0..iterations {
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

        let error = max_error(&output, &reference(&input, weights));
        worst_error = worst_error.max(error);
        if error > TOLERANCE {
            return Err(format!(
                "iteration {iteration}: output differs from plain Rust by {error} (tolerance {TOLERANCE})"
            ));
        }
    }
    Ok(Report { times, worst_error })
}
