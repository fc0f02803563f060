//! Schedules for the executor's memory planner: the demo's MLP and a
//! transformer block (for `examples/plan_memory.rs` and the tests), and
//! a harness that builds a random schedule from bytes, plans it, checks
//! the placement and runs it with canary kernels (the `plan_schedule` fuzz
//! target, `tests/plan_memory.rs`'s and `tests/plan_runs.rs`'s proptests),
//! rebinding its slots and failing kernels between runs (`plan_runs.rs`).

use std::sync::{Arc, OnceLock};

use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{
    Backend, BufferId, Device, DeviceId, DeviceOf, ExecParams, ProgramOf, Scalar, Schedule,
};
use hwqueue_sim::{SimConfig, SimDevice, SimProgram, SimSet, SimSetDevice, SimSetProgram};

use crate::plan_runs::{RunSlot, Scalars, run_and_check};

use crate::reader::Reader;
use crate::sizes::{SPLITMIX_GAMMA, splitmix64};

/// A kernel that does nothing: schedules that are planned, not computed.
fn nothing(_: &WorkGroup, _: &KernelArgs<'_>) {}

/// A do-nothing program of `buffers` buffers.
fn noop(buffers: usize) -> CpuProgram {
    CpuProgram::from_fn(format!("noop{buffers}"), buffers, 0, nothing)
}

const F32: usize = size_of::<f32>();

/// The demo's two-layer MLP (batch 64, 256 → 512 → 16): `x` a slot, the
/// weights buffers, `h`, `logits` and `probs` tensors, `probs` downloaded.
///
/// # Panics
/// When the device cannot allocate the weights.
pub fn mlp_schedule(device: &Arc<CpuDevice>) -> Schedule<Cpu> {
    let (batch, input, hidden, output) = (64, 256, 512, 16);
    let mut s = Schedule::new();
    let d = s.add_device(device.clone());
    let buffer = |s: &mut Schedule<Cpu>, name: &str, floats: usize| {
        let memory = device.alloc(floats * F32).expect("weights");
        s.add_buffer(d, name, memory)
    };
    let x = s.add_slot(d, "x", batch * input * F32);
    let w1 = buffer(&mut s, "w1", input * hidden);
    let b1 = buffer(&mut s, "b1", hidden);
    let w2 = buffer(&mut s, "w2", hidden * output);
    let b2 = buffer(&mut s, "b2", output);
    let h = s.add_tensor(d, "h", batch * hidden * F32);
    let logits = s.add_tensor(d, "logits", batch * output * F32);
    let probs = s.add_tensor(d, "probs", batch * output * F32);
    let one = ExecParams::new_1d(1, 1);
    kernel(&mut s, d, "matmul1", &[x, w1], h, one);
    s.exec("bias_relu", d, &noop(2), &[h, b1], &[], one)
        .reads(h, ..)
        .reads(b1, ..)
        .writes(h, ..);
    kernel(&mut s, d, "matmul2", &[h, w2], logits, one);
    kernel(&mut s, d, "bias_softmax", &[logits, b2], probs, one);
    s.download("download probs", probs);
    s
}

/// One exec reading `reads` whole and writing `write` whole.
fn kernel(
    s: &mut Schedule<Cpu>,
    d: DeviceId,
    name: &str,
    reads: &[BufferId],
    write: BufferId,
    params: ExecParams,
) {
    let mut buffers = reads.to_vec();
    buffers.push(write);
    let mut op = s.exec(name, d, &noop(buffers.len()), &buffers, &[], params);
    for &read in reads {
        op = op.reads(read, ..);
    }
    op.writes(write, ..);
}

/// A transformer block's shape (128 tokens, width 256, 4 heads, MLP width
/// 1024): layer norm, Q/K/V projections, per head scores, softmax and
/// context, the output projection and residual, layer norm, and the MLP
/// with its residual. `x` and `out` are slots, the weights buffers, and
/// the 23 intermediates tensors.
///
/// # Panics
/// When the device cannot allocate the weights.
pub fn transformer_block_schedule(device: &Arc<CpuDevice>) -> Schedule<Cpu> {
    let (tokens, width, heads, mlp) = (128, 256, 4, 1024);
    let head = width / heads;
    let mut s = Schedule::new();
    let d = s.add_device(device.clone());
    let act = |rows: usize, cols: usize| rows * cols * F32;
    let weight = |s: &mut Schedule<Cpu>, name: &str, bytes: usize| {
        let memory = device.alloc(bytes).expect("weights");
        s.add_buffer(d, name, memory)
    };
    let x = s.add_slot(d, "x", act(tokens, width));
    let out = s.add_slot(d, "out", act(tokens, width));
    let ln1_g = weight(&mut s, "ln1.gain", width * F32);
    let [wq, wk, wv, wo] = ["wq", "wk", "wv", "wo"].map(|n| weight(&mut s, n, act(width, width)));
    let ln2_g = weight(&mut s, "ln2.gain", width * F32);
    let w_up = weight(&mut s, "mlp.up", act(width, mlp));
    let w_down = weight(&mut s, "mlp.down", act(mlp, width));
    let one = ExecParams::new_1d(1, 1);

    let ln1 = s.add_tensor(d, "ln1", act(tokens, width));
    kernel(&mut s, d, "layer_norm1", &[x, ln1_g], ln1, one);
    let [q, k, v] = ["q", "k", "v"].map(|n| s.add_tensor(d, n, act(tokens, width)));
    kernel(&mut s, d, "q_proj", &[ln1, wq], q, one);
    kernel(&mut s, d, "k_proj", &[ln1, wk], k, one);
    kernel(&mut s, d, "v_proj", &[ln1, wv], v, one);
    let mut contexts = Vec::new();
    for h in 0..heads {
        let scores = s.add_tensor(d, format!("scores{h}"), act(tokens, tokens));
        kernel(&mut s, d, &format!("qk{h}"), &[q, k], scores, one);
        let probs = s.add_tensor(d, format!("probs{h}"), act(tokens, tokens));
        kernel(&mut s, d, &format!("softmax{h}"), &[scores], probs, one);
        let context = s.add_tensor(d, format!("context{h}"), act(tokens, head));
        kernel(&mut s, d, &format!("pv{h}"), &[probs, v], context, one);
        contexts.push(context);
    }
    let attention = s.add_tensor(d, "attention", act(tokens, width));
    kernel(&mut s, d, "concat_heads", &contexts, attention, one);
    let projected = s.add_tensor(d, "projected", act(tokens, width));
    kernel(&mut s, d, "o_proj", &[attention, wo], projected, one);
    let residual = s.add_tensor(d, "residual", act(tokens, width));
    kernel(&mut s, d, "residual1", &[x, projected], residual, one);
    let ln2 = s.add_tensor(d, "ln2", act(tokens, width));
    kernel(&mut s, d, "layer_norm2", &[residual, ln2_g], ln2, one);
    let up = s.add_tensor(d, "mlp_up", act(tokens, mlp));
    kernel(&mut s, d, "up_proj", &[ln2, w_up], up, one);
    let gelu = s.add_tensor(d, "gelu", act(tokens, mlp));
    kernel(&mut s, d, "gelu", &[up], gelu, one);
    let down = s.add_tensor(d, "mlp_down", act(tokens, width));
    kernel(&mut s, d, "down_proj", &[gelu, w_down], down, one);
    kernel(&mut s, d, "residual2", &[residual, down], out, one);
    s
}

/// What a value of a random schedule holds in run `run`: every word the
/// same.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Holds {
    /// `canary(id, run)`: written by a kernel, or an input bound per run.
    Canary(u32),
    /// A constant: written by a fill.
    Constant(u32),
}

impl Holds {
    pub(crate) fn word(self, run: u32) -> u32 {
        match self {
            Holds::Canary(id) => canary(id, run),
            Holds::Constant(word) => word,
        }
    }

    /// As two scalars for the canary kernel: a tag and a value.
    fn scalars(self) -> [Scalar; 2] {
        match self {
            Holds::Canary(id) => [Scalar::U32(0), Scalar::U32(id)],
            Holds::Constant(word) => [Scalar::U32(1), Scalar::U32(word)],
        }
    }
}

/// The word tensor `id` holds in run `run`: never 0 (fresh memory).
pub fn canary(id: u32, run: u32) -> u32 {
    let seed = (u64::from(id) << 32 | u64::from(run)).wrapping_add(SPLITMIX_GAMMA);
    (splitmix64(seed) as u32) | 1
}

/// The canary kernel: buffer 0 is written, buffers 1.. read. Scalars: the
/// run, the written value's id, the id of the kernel to fail in this run
/// (0: none), then per read a tag (0: a canary, 1: a constant) and an id
/// or constant. Panics (failing the run) when it is the kernel to fail,
/// and when a read sees a word other than what its producer wrote in this
/// run.
fn canary_kernel(_: &WorkGroup, args: &KernelArgs<'_>) {
    let run: u32 = args.scalar(0);
    let id: u32 = args.scalar(1);
    if args.scalar::<u32>(2) == id {
        panic!("{}", injected_failure(id, run));
    }
    for read in 1..args.buffer_count() {
        let tag: u32 = args.scalar(1 + 2 * read);
        let value: u32 = args.scalar(2 + 2 * read);
        let expected = if tag == 0 { canary(value, run) } else { value };
        // SAFETY: the plan orders this read after every write of these
        // bytes (that is what this kernel checks), and one work-group runs.
        let words = unsafe { args.buffer(read).as_slice::<u32>() };
        if let Some(at) = words.iter().position(|w| *w != expected) {
            panic!(
                "run {run}: read {read} saw {:#x} at word {at}, expected {expected:#x}",
                words[at]
            );
        }
    }
    let out = args.buffer(0);
    // SAFETY: as above: no other operation touches these bytes now.
    unsafe { out.slice_mut::<u32>(0..out.len::<u32>()) }.fill(canary(id, run));
}

/// What the canary kernel of value `id` panics with when run `run` fails
/// it on purpose.
pub(crate) fn injected_failure(id: u32, run: u32) -> String {
    format!("injected failure of kernel {id} in run {run}")
}

/// The canary program reading `reads` buffers.
fn canary_program(reads: usize) -> CpuProgram {
    static PROGRAMS: OnceLock<Vec<CpuProgram>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        (0..=MAX_READS)
            .map(|reads| {
                CpuProgram::from_fn(
                    format!("canary{reads}"),
                    1 + reads,
                    3 + 2 * reads,
                    canary_kernel,
                )
            })
            .collect()
    })[reads]
        .clone()
}

const MAX_READS: usize = 3;

/// The device random schedules run on (twice: two device ids, so two
/// compute queues, two copy queues and the host stage).
pub(crate) fn device() -> Arc<CpuDevice> {
    static DEVICE: OnceLock<Arc<CpuDevice>> = OnceLock::new();
    DEVICE.get_or_init(|| Arc::new(CpuDevice::new())).clone()
}

/// The two device ids of a random schedule: their devices (of one
/// backend set) and the canary kernel for each.
pub(crate) trait PlanDevices {
    /// The backend set.
    type Set: Backend;
    /// Device ids 0 and 1.
    fn devices(&self) -> [Arc<DeviceOf<Self::Set>>; 2];
    /// The canary kernel reading `reads` buffers, for device id `device`.
    fn canary(&self, device: usize, reads: usize) -> ProgramOf<Self::Set>;
}

/// One CPU device under both ids.
pub(crate) struct OneCpu;

impl PlanDevices for OneCpu {
    type Set = Cpu;

    fn devices(&self) -> [Arc<CpuDevice>; 2] {
        [device(), device()]
    }

    fn canary(&self, _device: usize, reads: usize) -> CpuProgram {
        canary_program(reads)
    }
}

/// Two backends: the CPU (id 0) and the simulator (id 1), whose memory
/// the CPU cannot see, so every copy between them runs on the host stage
/// and each queue waits on the other backend's signals.
pub(crate) struct CpuAndSim;

impl PlanDevices for CpuAndSim {
    type Set = SimSet;

    fn devices(&self) -> [Arc<SimSetDevice>; 2] {
        static DEVICES: OnceLock<[Arc<SimSetDevice>; 2]> = OnceLock::new();
        DEVICES
            .get_or_init(|| {
                [
                    Arc::new(SimSetDevice::from(CpuDevice::new())),
                    Arc::new(SimSetDevice::from(SimDevice::new(0, SimConfig::default()))),
                ]
            })
            .clone()
    }

    fn canary(&self, device: usize, reads: usize) -> SimSetProgram {
        if device == 0 {
            return canary_program(reads).into();
        }
        static PROGRAMS: OnceLock<Vec<SimProgram>> = OnceLock::new();
        PROGRAMS.get_or_init(|| {
            (0..=MAX_READS)
                .map(|reads| {
                    SimProgram::new(
                        format!("canary{reads}"),
                        1 + reads,
                        3 + 2 * reads,
                        sim_canary_kernel,
                    )
                })
                .collect()
        })[reads]
            .clone()
            .into()
    }
}

/// [`canary_kernel`] for the simulator: the same checks, a failure
/// returned instead of panicked.
fn sim_canary_kernel(args: &mut hwqueue_sim::KernelArgs<'_>) -> Result<(), String> {
    let scalars: Vec<u32> = args
        .scalars()
        .iter()
        .map(|scalar| match scalar {
            Scalar::U32(value) => Ok(*value),
            other => Err(format!("the canary takes u32 scalars, not {other:?}")),
        })
        .collect::<Result<_, _>>()?;
    let (run, id) = (scalars[0], scalars[1]);
    if scalars[2] == id {
        return Err(injected_failure(id, run));
    }
    for read in 1..args.buffer_count() {
        let (tag, value) = (scalars[1 + 2 * read], scalars[2 + 2 * read]);
        let expected = if tag == 0 { canary(value, run) } else { value };
        let words: Vec<u32> = args.read(read);
        if let Some(at) = words.iter().position(|w| *w != expected) {
            return Err(format!(
                "run {run}: read {read} saw {:#x} at word {at}, expected {expected:#x}",
                words[at]
            ));
        }
    }
    let words = args.bytes(0).len() / 4;
    args.write(0, &vec![canary(id, run); words]);
    Ok(())
}

/// One value of a random schedule.
#[derive(Debug, Clone)]
struct Value {
    id: BufferId,
    device: usize,
    words: usize,
    holds: Holds,
}

/// Decodes a random schedule from `data`: 1–3 input slots, each uploaded
/// per run, then 5–60 operations over two device ids of one CPU device
/// (kernels reading up to three values of their device and writing a new
/// tensor or an output slot, copies into new tensors of either device,
/// fills), tensors of 1–4096 words; plans it; checks that tensors live at
/// once never share bytes and that the arena is at least the lower bound;
/// then runs it `runs` times back to back without waiting, the rest of
/// `data` choosing each run's bindings and the kernel it fails
/// (`plan_runs.rs`): every run reads what its producers
/// wrote in that run, produces the sequential model's outputs or fails
/// naming its own operation, and nothing hangs. Returns the arena bytes
/// over the lower bound (1.0 when there are no tensor bytes).
///
/// # Panics
/// On any violation, or when planning or running fails.
pub fn check_plan_schedule(data: &[u8], runs: u32) -> f64 {
    check_random_plan(&OneCpu, data, runs, 56)
}

/// [`check_plan_schedule`] with 5–16 operations, so that more of `data`
/// chooses the runs' bindings and failed kernels: the model-based test of
/// how runs are ordered (`tests/plan_runs.rs`).
///
/// # Panics
/// As [`check_plan_schedule`].
pub fn check_plan_runs(data: &[u8], runs: u32) {
    check_random_plan(&OneCpu, data, runs, 12);
}

/// [`check_plan_runs`] over two backends: device id 0 the CPU, id 1 the
/// simulator (`hwqueue-sim`), in one `SimSet` plan; every copy between
/// them runs on the host stage, and each run's waits on the run before
/// it cross backends.
///
/// # Panics
/// As [`check_plan_schedule`].
pub fn check_plan_runs_over_two_backends(data: &[u8], runs: u32) {
    check_random_plan(&CpuAndSim, data, runs, 12);
}

/// [`check_plan_schedule`] with `5 + data % ops_range` operations, over
/// the device ids of `on`.
fn check_random_plan<D: PlanDevices>(on: &D, data: &[u8], runs: u32, ops_range: u8) -> f64 {
    let mut r = Reader { data };
    let mut s = Schedule::<D::Set>::new();
    let [first, second] = on.devices();
    let devices = [s.add_device(first), s.add_device(second)];
    let run_scalars = Scalars {
        step: s.add_scalar("run", 0u32),
        fail: s.add_scalar("fail", 0u32),
    };
    let words =
        |r: &mut Reader<'_>| 1 + (usize::from(r.byte()) | usize::from(r.byte()) << 8) % 4096;
    let mut values: Vec<Value> = Vec::new();
    let mut slots = Vec::new();
    for index in 0..1 + usize::from(r.byte()) % 3 {
        let device = usize::from(r.byte() % 2);
        let words = words(&mut r);
        let name = format!("input{index}");
        let id = s.add_slot(devices[device], name.clone(), words * 4);
        let upload = s.upload(format!("upload {name}"), id).id();
        let holds = Holds::Canary(values.len() as u32 + 1);
        slots.push(RunSlot {
            id,
            name,
            device,
            words,
            holds,
            upload: Some(upload),
            read_by_kernel: false,
        });
        values.push(Value {
            id,
            device,
            words,
            holds,
        });
    }
    let mut kernels = Vec::new();
    let ops = 5 + usize::from(r.byte() % ops_range);
    for op in 0..ops {
        let kind = r.byte() % 8;
        let device = usize::from(r.byte() % 2);
        let mine: Vec<usize> = (0..values.len())
            .filter(|&v| values[v].device == device)
            .collect();
        let next_id = values.len() as u32 + 1;
        if kind < 6 && !mine.is_empty() {
            let reads: Vec<usize> = (0..usize::from(r.byte()) % (MAX_READS + 1))
                .map(|_| mine[usize::from(r.byte()) % mine.len()])
                .collect();
            let words = words(&mut r);
            // 5, not 0: past the input's end every byte reads 0, and a
            // tail of output slots would test little.
            let output = r.byte() % 6 == 5;
            let target = if output {
                let name = format!("output{op}");
                let id = s.add_slot(devices[device], name.clone(), words * 4);
                slots.push(RunSlot {
                    id,
                    name,
                    device,
                    words,
                    holds: Holds::Canary(next_id),
                    upload: None,
                    read_by_kernel: false,
                });
                id
            } else {
                s.add_tensor(devices[device], format!("t{op}"), words * 4)
            };
            for &v in &reads {
                // Inputs are the first values: an input slot a kernel takes
                // must be aligned.
                if let Some(slot) = slots.get_mut(v).filter(|slot| slot.upload.is_some()) {
                    slot.read_by_kernel = true;
                }
            }
            let mut buffers = vec![target];
            let mut scalars = vec![Scalar::U32(0), Scalar::U32(next_id), Scalar::U32(0)];
            for &v in &reads {
                buffers.push(values[v].id);
                scalars.extend(values[v].holds.scalars());
            }
            let name = format!("k{op}");
            let mut builder = s
                .exec(
                    name.clone(),
                    devices[device],
                    &on.canary(device, reads.len()),
                    &buffers,
                    &scalars,
                    ExecParams::new_1d(1, 1),
                )
                .scalar(0, run_scalars.step)
                .scalar(2, run_scalars.fail)
                .writes(target, ..);
            for &v in &reads {
                builder = builder.reads(values[v].id, ..);
            }
            kernels.push((next_id, name));
            values.push(Value {
                id: target,
                device,
                words,
                holds: Holds::Canary(next_id),
            });
        } else if kind == 6 && !values.is_empty() {
            let src = values[usize::from(r.byte()) % values.len()].clone();
            let dst = s.add_tensor(devices[device], format!("t{op}"), src.words * 4);
            s.copy(format!("copy{op}"), dst, src.id);
            values.push(Value {
                id: dst,
                device,
                words: src.words,
                holds: src.holds,
            });
        } else {
            let words = words(&mut r);
            let dst = s.add_tensor(devices[device], format!("t{op}"), words * 4);
            let word = canary(next_id, u32::MAX);
            s.fill(format!("fill{op}"), dst, word);
            values.push(Value {
                id: dst,
                device,
                words,
                holds: Holds::Constant(word),
            });
        }
    }
    let mut plan = s.plan().expect("a random schedule plans");
    let memory = plan.memory().clone();
    for (i, a) in memory.tensors.iter().enumerate() {
        for b in &memory.tensors[i + 1..] {
            let live_together = a.live.start() <= b.live.end() && b.live.start() <= a.live.end();
            let share = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            assert!(
                !(a.device == b.device && live_together && share),
                "`{}` and `{}` are live together and share bytes: {a:?} {b:?}",
                a.name,
                b.name
            );
        }
    }
    assert!(
        memory.arena_bytes >= memory.lower_bound_bytes,
        "arena {} below the lower bound {}",
        memory.arena_bytes,
        memory.lower_bound_bytes
    );
    let ratio = if memory.lower_bound_bytes == 0 {
        1.0
    } else {
        memory.arena_bytes as f64 / memory.lower_bound_bytes as f64
    };
    let devices = on.devices();
    run_and_check(
        &mut plan,
        &devices,
        run_scalars,
        &slots,
        &kernels,
        runs,
        &mut r,
    );
    ratio
}

/// The fuzz target `plan_schedule`: [`check_plan_schedule`] with 3 runs.
pub fn plan_schedule(data: &[u8]) {
    check_plan_schedule(data, 3);
}
