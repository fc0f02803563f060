//! The demo's MLP over MPI ranks (data parallel): each rank runs the demo's
//! forward pass (the same C kernels and weights, `examples/demo/`) on its
//! shard of the batch, as one plan on the CPU backend whose last operation
//! is an `all_gather` of the ranks' outputs, so every rank ends each step
//! with the whole batch's probabilities. Rank 0 checks every step against
//! plain Rust over the whole batch and prints the time per step.
//!
//! ```text
//! cargo build --release --features mpi --example distributed
//! mpirun --allow-run-as-root --oversubscribe -np 4 \
//!     target/release/examples/distributed [--iterations N]
//! ```
//!
//! (`--allow-run-as-root` and `--oversubscribe` are for a container run as
//! root with fewer cores than ranks.) The number of ranks must divide the
//! batch (64 rows).

// The demo's model module also plans and runs the one-device model, which
// this example does not use; its kernels module has CUDA and WGSL kernels.
#[allow(dead_code)]
#[path = "demo/kernels.rs"]
mod kernels;
#[allow(dead_code)]
#[path = "demo/model.rs"]
mod model;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hwqueue::collective::{Communicator, Mpi};
use hwqueue::cpu::{CompileOptions, Cpu, CpuDevice, CpuProgram};
use hwqueue::{Buffer, Device, Download, ExecParams, OpId, Plan, Schedule, Timeout};
use kernels::{HIDDEN, INPUT, OUTPUT};
use model::{BATCH, Lcg, TOLERANCE, Weights};

/// How long a rank waits for the others in a collective before failing.
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let mpi = match Mpi::init() {
        Ok(mpi) => mpi,
        Err(error) => {
            eprintln!("distributed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = run(&mpi);
    let rank = mpi.world_rank_size().0;
    drop(mpi);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("distributed: rank {rank}: {error}");
            ExitCode::FAILURE
        }
    }
}

fn iterations() -> Result<usize, String> {
    let mut args = std::env::args().skip(1);
    let mut iterations = 20;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iterations" => {
                let value = args.next().ok_or("--iterations needs a number")?;
                iterations = value.parse().ok().filter(|n| *n > 0).ok_or(format!(
                    "--iterations takes a positive number, not `{value}`"
                ))?;
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; the only option is --iterations N"
                ));
            }
        }
    }
    Ok(iterations)
}

/// A rank's plan: its shard's upload, the four kernels, the all_gather
/// and the download of the gathered outputs.
struct Shard {
    plan: Plan<Cpu>,
    upload: OpId,
    download: OpId,
    rows: usize,
}

fn run(mpi: &Mpi) -> Result<(), String> {
    let err = |e: hwqueue::Error| e.to_string();
    let iterations = iterations()?;
    let world = mpi.world(Some(COLLECTIVE_TIMEOUT)).map_err(err)?;
    world.set_timeout(COLLECTIVE_TIMEOUT);
    let (rank, size) = (world.rank(), world.size());
    if !BATCH.is_multiple_of(size) || !(BATCH / size).is_multiple_of(4) {
        return Err(format!(
            "{size} ranks do not split the batch of {BATCH} rows into shards of a multiple of 4 \
             rows: run with -np 1, 2, 4, 8 or 16"
        ));
    }
    let weights = Weights::new();
    let device = Arc::new(CpuDevice::new());
    let compile_start = Instant::now();
    let programs = compile()?;
    let compiled = compile_start.elapsed();
    let mut shard = plan(&device, &world, &programs, &weights)?;
    if rank == 0 {
        println!(
            "hwqueue distributed: the demo's MLP (batch {BATCH}, {INPUT} -> {HIDDEN} -> ReLU -> \
             {OUTPUT} -> softmax) over {size} MPI ranks (thread support: {}), {} rows each, \
             outputs all-gathered; {iterations} steps",
            mpi.threading(),
            shard.rows
        );
        println!("kernels: 4 generated as C, built by the system C compiler in {compiled:.1?}");
        println!("rank 0's {}", shard.plan);
    }

    let mut times = Vec::with_capacity(iterations);
    let mut worst_error = 0f32;
    let mut gathered = vec![0f32; BATCH * OUTPUT];
    for step in 0..iterations {
        // Every rank makes the whole batch and takes its rows.
        let x = Lcg(1000 + step as u64).vec(BATCH * INPUT, 1.0);
        let rows = rank * shard.rows * INPUT..(rank + 1) * shard.rows * INPUT;
        let start = Instant::now();
        shard.plan.upload(shard.upload, &x[rows]).map_err(err)?;
        let output = Download::from_vec(gathered);
        shard.plan.download(shard.download, &output).map_err(err)?;
        shard
            .plan
            .run()
            .map_err(err)?
            .wait(Timeout::Forever)
            .map_err(|e| format!("step {step}: {e}"))?;
        gathered = output.take(Timeout::Forever).map_err(err)?;
        times.push(start.elapsed());
        if rank == 0 {
            let error = model::max_error(&gathered, &model::reference(&x, &weights));
            worst_error = worst_error.max(error);
            if error > TOLERANCE {
                return Err(format!(
                    "step {step}: the gathered outputs differ from plain Rust by {error} \
                     (tolerance {TOLERANCE})"
                ));
            }
        }
    }
    if rank == 0 {
        let mut sorted = times.clone();
        sorted.sort();
        let total: Duration = times.iter().sum();
        println!(
            "per step (upload of the shard, 4 kernels, all_gather over {size} ranks, download, \
             host wait): median {:.2?}, min {:.2?}, mean {:.2?}",
            sorted[sorted.len() / 2],
            sorted[0],
            total / times.len() as u32
        );
        println!(
            "verified: all {iterations} steps' gathered outputs ({BATCH} x {OUTPUT}) match plain \
             Rust (max abs error {worst_error:.2e}, tolerance {TOLERANCE:.0e}); {} runs of one \
             plan on each of {size} ranks",
            shard.plan.runs()
        );
    }
    Ok(())
}

/// The demo's four kernels, compiled for the CPU.
fn compile() -> Result<Vec<CpuProgram>, String> {
    let options = CompileOptions::default();
    kernels::c_kernels()
        .into_iter()
        .map(|(name, source)| {
            // SAFETY: as in the demo: each kernel has the ABI's signature
            // (declared by HWQ_KERNEL), reads and writes only within the
            // buffers the schedule passes (the shapes are baked in, and a
            // shard's buffers hold the rows its grid covers), and each
            // work-group writes only its own tile of rows and columns.
            unsafe {
                CpuProgram::from_c_source(name, &source, name, kernels::buffers(name), 0, &options)
            }
            .map_err(|e| format!("compiling `{name}`: {e}"))
        })
        .collect()
}

/// Plans a rank's shard: the demo's schedule over `rows` rows, then an
/// all_gather of its probabilities into the whole batch's.
fn plan(
    device: &Arc<CpuDevice>,
    world: &Communicator,
    programs: &[CpuProgram],
    weights: &Weights,
) -> Result<Shard, String> {
    let err = |e: hwqueue::Error| e.to_string();
    let rows = BATCH / world.size();
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(Arc::clone(device));
    let mut weight = |name: &str, data: &[f32]| -> Result<_, String> {
        let buffer = device.alloc(size_of_val(data)).map_err(err)?;
        buffer.write_at(0, data).map_err(err)?;
        Ok(schedule.add_buffer(d, name, buffer))
    };
    let (bw1, bb1) = (weight("w1", &weights.w1)?, weight("b1", &weights.b1)?);
    let (bw2, bb2) = (weight("w2", &weights.w2)?, weight("b2", &weights.b2)?);
    let f32s = |n: usize| n * size_of::<f32>();
    let bx = schedule.add_tensor(d, "x", f32s(rows * INPUT));
    let bh = schedule.add_tensor(d, "h", f32s(rows * HIDDEN));
    let blogits = schedule.add_tensor(d, "logits", f32s(rows * OUTPUT));
    let bprobs = schedule.add_tensor(d, "probs", f32s(rows * OUTPUT));
    let ball = schedule.add_tensor(d, "all probs", f32s(BATCH * OUTPUT));
    let tile = |cols: usize, local: [u32; 2]| ExecParams::new_2d([cols as u32, rows as u32], local);
    let upload = schedule.upload("upload x", bx).id();
    schedule
        .exec(
            "matmul1",
            d,
            &programs[0],
            &[bx, bw1, bh],
            &[],
            tile(HIDDEN, [64, 4]),
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
            tile(HIDDEN, [64, 4]),
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
            tile(OUTPUT, [16, 4]),
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
            ExecParams::new_1d(rows as u32, 4),
        )
        .reads(blogits, ..)
        .reads(bb2, ..)
        .writes(bprobs, ..);
    schedule.all_gather::<f32>("all_gather probs", world, bprobs, ball);
    let download = schedule.download("download all probs", ball).id();
    let plan = schedule.plan().map_err(err)?;
    Ok(Shard {
        plan,
        upload,
        download,
        rows,
    })
}
