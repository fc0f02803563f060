//! Plan replay (issue 45): a plan's device work recorded once into the
//! device's replay form and submitted again for every later run. On Vulkan
//! (lavapipe in CI) a run's batch on a queue is recorded into command
//! buffers once and resubmitted with the run's semaphore values; on CUDA
//! its runs of kernels become graphs, launched again and patched where a
//! binding changed (these run on a GPU only: `tests/cuda_fake_driver.rs`
//! runs the CUDA path on the fake driver in CI). These tests show that
//! the replay is used (`Plan::launches`), that it computes what the plain
//! path computes under random rebinding, and that it says why it falls
//! back where it cannot replay. The executor's own tests, the plan model
//! and the conformance suite run with replay on (the default).
#![cfg(any(feature = "vulkan", feature = "cuda"))]

mod common;

use std::sync::Arc;

use common::LONG;
use hwqueue::{
    Backend, Buffer, Device, Download, ExecParams, OpId, Plan, Scalar, ScalarId, Schedule, Timeout,
};

/// The two kernels the plans run, in a backend's form: `add` (`x[i] += n`)
/// and `mix` (`out[i] = out[i] * 3 + a[i] + k`), over words, in work-groups
/// of 64.
struct Kernels<B: Backend> {
    add: B::Program,
    mix: B::Program,
}

const WORDS: usize = 256;
const KERNELS: usize = 64;

/// A chain of [`KERNELS`] dependent kernels over one tensor, between its
/// upload and its download: the issue's benchmark shape.
fn chain<B: Backend>(device: &Arc<B::Device>, kernels: &Kernels<B>) -> (Plan<B>, OpId, OpId) {
    let add = &kernels.add;
    let mut schedule = Schedule::<B>::new();
    let d = schedule.add_device(device.clone());
    let x = schedule.add_tensor(d, "x", WORDS * 4);
    let up = schedule.upload("upload x", x).id();
    for k in 0..KERNELS {
        schedule.exec(
            format!("add {k}"),
            d,
            add,
            &[x],
            &[Scalar::U32(1)],
            ExecParams::new_1d(WORDS as u32, 64),
        );
    }
    let down = schedule.download("download x", x).id();
    (schedule.plan().unwrap(), up, down)
}

/// Runs the chain `runs` times, one after another, checking every output.
fn run_chain<B: Backend>(plan: &mut Plan<B>, up: OpId, down: OpId, runs: u32) {
    for run in 0..runs {
        plan.upload(up, &vec![run; WORDS]).unwrap();
        let out = Download::<u32>::new(WORDS);
        plan.download(down, &out).unwrap();
        plan.run().unwrap().wait(LONG).unwrap();
        assert_eq!(
            out.take(Timeout::Forever).unwrap(),
            vec![run + KERNELS as u32; WORDS],
            "run {run}"
        );
    }
}

/// The issue's proof that replay is used: 100 runs of a 64-kernel plan
/// record the 64 kernels once (twice at most: the first run has no waits
/// on a run before it, so its batch may differ) and submit the recording
/// for the rest, instead of recording or launching 6,400 kernels. With
/// replay off, every run has its 64. `fallback`: whether the device may
/// fall back for a reason of its own (Vulkan's staging on unmapped memory).
fn check_a_chain_replays<B: Backend>(
    device: &Arc<B::Device>,
    kernels: &Kernels<B>,
    fallback: bool,
    repeats: bool,
) {
    let (mut plan, up, down) = chain(device, kernels);
    assert!(plan.replay(), "replay is on by default");
    run_chain(&mut plan, up, down, 100);
    let launches = plan.launches();
    assert!(
        launches.kernels <= 2 * KERNELS as u64,
        "100 runs recorded {} kernels: {launches:?}",
        launches.kernels
    );
    assert!(
        launches.programs >= 98,
        "100 runs replayed {} recordings: {launches:?}",
        launches.programs
    );
    if !fallback {
        assert_eq!(launches.fallback, None);
    }
    // Where the engine offers its programs again (CUDA), the runs after
    // the first two named them instead of recording their kernels.
    if repeats {
        assert!(launches.repeats >= 97, "{launches:?}");
    } else {
        assert_eq!(launches.repeats, 0, "{launches:?}");
    }

    let (mut plain, up, down) = chain(device, kernels);
    plain.set_replay(false);
    run_chain(&mut plain, up, down, 100);
    let launches = plain.launches();
    assert_eq!(launches.kernels, 100 * KERNELS as u64, "{launches:?}");
    assert_eq!(launches.programs, 0, "{launches:?}");
}

/// A plan whose input and output are slots bound per run, with a scalar
/// slot: an upload into a tensor, `mix` of it and the input into the
/// output, two `add`s of the output, and the output's download.
struct Mixer<B: Backend> {
    plan: Plan<B>,
    input: hwqueue::BufferId,
    output: hwqueue::BufferId,
    k: ScalarId,
    up: OpId,
    down: OpId,
    inputs: Vec<B::Buffer>,
    outputs: Vec<B::Buffer>,
}

impl<B: Backend> Mixer<B> {
    fn new(device: &Arc<B::Device>, kernels: &Kernels<B>, replay: bool) -> Self {
        let (mix, add) = (&kernels.mix, &kernels.add);
        let mut schedule = Schedule::<B>::new();
        let d = schedule.add_device(device.clone());
        let t = schedule.add_tensor(d, "t", WORDS * 4);
        let input = schedule.add_slot(d, "in", WORDS * 4);
        let output = schedule.add_slot(d, "out", WORDS * 4);
        let k = schedule.add_scalar("k", 0u32);
        let up = schedule.upload("upload t", t).id();
        let grid = ExecParams::new_1d(WORDS as u32, 64);
        schedule
            .exec("mix", d, mix, &[input, output], &[Scalar::U32(0)], grid)
            .scalar(0, k)
            .reads(input, ..)
            .writes(output, ..);
        schedule.exec("add t", d, add, &[output], &[Scalar::U32(5)], grid);
        schedule.exec("add 7", d, add, &[output], &[Scalar::U32(7)], grid);
        schedule
            .exec("mix t", d, mix, &[t, output], &[Scalar::U32(0)], grid)
            .scalar(0, k);
        let down = schedule.download("download out", output).id();
        let mut plan = schedule.plan().unwrap();
        plan.set_replay(replay);
        let buffers = |seed: u32| -> Vec<B::Buffer> {
            (0..3u32)
                .map(|b| {
                    let buffer = device.alloc(WORDS * 4).unwrap();
                    let words: Vec<u32> = (0..WORDS as u32).map(|i| i * (b + 1) + seed).collect();
                    buffer.write_at(0, &words).unwrap();
                    buffer
                })
                .collect()
        };
        Self {
            plan,
            input,
            output,
            k,
            up,
            down,
            inputs: buffers(1),
            outputs: buffers(100),
        }
    }

    /// One run with input `i`, output `o`, scalar `k` and upload `seed`:
    /// what it downloaded.
    fn run(&mut self, i: usize, o: usize, k: u32, seed: u32) -> Vec<u32> {
        self.plan.bind(self.input, &self.inputs[i]).unwrap();
        self.plan.bind(self.output, &self.outputs[o]).unwrap();
        self.plan.set_scalar(self.k, k).unwrap();
        let data: Vec<u32> = (0..WORDS as u32).map(|w| w ^ seed).collect();
        self.plan.upload(self.up, &data).unwrap();
        let out = Download::<u32>::new(WORDS);
        self.plan.download(self.down, &out).unwrap();
        self.plan.run().unwrap().wait(LONG).unwrap();
        out.take(Timeout::Forever).unwrap()
    }
}

/// Replay on and off compute the same thing: two plans of the same
/// schedule over buffers of the same contents, one replaying and one
/// recording every run, are run 1,000 times with the same random
/// bindings (three inputs, three outputs that accumulate), scalars and
/// uploads; every download agrees, and the outputs' bytes at the end.
fn check_replay_and_plain_agree<B: Backend>(
    device: &Arc<B::Device>,
    kernels: &Kernels<B>,
    repeats: bool,
    patches: bool,
) {
    let mut replayed = Mixer::new(device, kernels, true);
    let mut plain = Mixer::new(device, kernels, false);
    // A fixed xorshift: the same sequence every run of the test.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for run in 0..1000 {
        let r = next();
        let (i, o) = ((r % 3) as usize, ((r >> 8) % 3) as usize);
        // Few scalar values, so bindings and scalars repeat and replay.
        let (k, seed) = (((r >> 16) % 2) as u32, (r >> 32) as u32);
        let want = plain.run(i, o, k, seed);
        let got = replayed.run(i, o, k, seed);
        assert_eq!(got, want, "run {run}: in {i}, out {o}, k {k}");
    }
    for (a, b) in replayed.outputs.iter().zip(&plain.outputs) {
        assert_eq!(a.to_vec::<u32>().unwrap(), b.to_vec::<u32>().unwrap());
    }
    let (on, off) = (replayed.plan.launches(), plain.plan.launches());
    assert!(
        on.programs > 0 && on.kernels < off.kernels,
        "replay was used: {on:?} against {off:?}"
    );
    assert_eq!(off.programs, 0);
    // A rebinding gives the recorded programs the new bindings (CUDA's
    // kernel nodes, Vulkan's descriptor sets) where the device can, so
    // the runs record their kernels a few times, not once per binding.
    if patches {
        assert!(on.patched > 0 && on.kernels <= 64, "{on:?}");
    }
    // A run bound as the one before (binding a view bound already is no
    // change) repeats its graphs unrecorded, where the engine offers them.
    assert_eq!(on.repeats > 0, repeats, "{on:?}");
}

/// A profiled run times each kernel, so nothing replays, and the plan says
/// why.
fn check_a_profiled_plan_runs_plainly<B: Backend>(device: &Arc<B::Device>, kernels: &Kernels<B>) {
    let (mut plan, up, down) = chain(device, kernels);
    plan.set_profiling(true);
    run_chain(&mut plan, up, down, 3);
    let launches = plan.launches();
    assert_eq!(launches.programs, 0, "{launches:?}");
    let why = launches.fallback.expect("a reason");
    assert!(why.contains("profiles"), "{why}");
    assert!(
        plan.take_profile()
            .iter()
            .any(|e| e.name.starts_with("add")),
        "the profile holds the kernels"
    );
}

/// Runs started back to back, each before the last finished, submit the
/// recording again while an earlier submission of it is pending: every
/// run's output is its own.
fn check_runs_back_to_back<B: Backend>(device: &Arc<B::Device>, kernels: &Kernels<B>) {
    let (mut plan, up, down) = chain(device, kernels);
    let mut started = Vec::new();
    for run in 0..50u32 {
        plan.upload(up, &vec![run; WORDS]).unwrap();
        let out = Download::<u32>::new(WORDS);
        plan.download(down, &out).unwrap();
        started.push((run, plan.run().unwrap(), out));
    }
    for (run, handle, out) in started {
        handle.wait(LONG).unwrap();
        assert_eq!(
            out.take(Timeout::Forever).unwrap(),
            vec![run + KERNELS as u32; WORDS],
            "run {run}"
        );
    }
    assert!(plan.launches().programs >= 40, "{:?}", plan.launches());
}

#[cfg(feature = "vulkan")]
mod vulkan {
    use super::*;
    use hwqueue::Error;
    use hwqueue::vulkan::{Vulkan, VulkanDevice, VulkanProgram};

    /// The first usable Vulkan device's ordinal, or `None` (printing why the
    /// test skips; failing where `HWQUEUE_REQUIRE_VULKAN` is set).
    fn ordinal() -> Option<u32> {
        let usable = hwqueue::vulkan::devices()
            .ok()
            .and_then(|devices| devices.into_iter().find(|d| d.unusable.is_none()));
        if usable.is_none() {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
                "HWQUEUE_REQUIRE_VULKAN is set, and no usable Vulkan device was found"
            );
            println!("skipped: no Vulkan driver with a usable device");
        }
        usable.map(|info| info.spec.ordinal())
    }

    /// `x[i] += n`, one work-group of 64 per 64 words.
    const ADD: &str = "
    @group(0) @binding(0) var<storage, read_write> x: array<u32>;
    var<immediate> n: u32;
    @compute @workgroup_size(64)
    fn add(@builtin(global_invocation_id) id: vec3<u32>) {
        x[id.x] = x[id.x] + n;
    }
    ";

    /// `out[i] = out[i] * 3 + a[i] + k`.
    const MIX: &str = "
    @group(0) @binding(0) var<storage, read> a: array<u32>;
    @group(0) @binding(1) var<storage, read_write> out: array<u32>;
    var<immediate> k: u32;
    @compute @workgroup_size(64)
    fn mix(@builtin(global_invocation_id) id: vec3<u32>) {
        out[id.x] = out[id.x] * 3u + a[id.x] + k;
    }
    ";

    fn kernels() -> Kernels<Vulkan> {
        Kernels {
            add: VulkanProgram::from_wgsl("add", ADD, "add").unwrap(),
            mix: VulkanProgram::from_wgsl("mix", MIX, "mix").unwrap(),
        }
    }

    #[test]
    fn a_plan_of_64_kernels_run_100_times_records_them_once_and_replays_the_rest() {
        let Some(ordinal) = ordinal() else { return };
        let device = Arc::new(VulkanDevice::open(ordinal).unwrap());
        check_a_chain_replays(&device, &kernels(), !device.host_mapped(), false);
    }

    #[test]
    fn replay_and_plain_runs_agree_over_1000_runs_with_random_rebinding() {
        let Some(ordinal) = ordinal() else { return };
        let device = Arc::new(VulkanDevice::open(ordinal).unwrap());
        // CI runs this on a lavapipe that rewrites descriptors (Mesa 25)
        // with `HWQUEUE_REQUIRE_REBIND` set, so it cannot pass unchecked.
        let patches = device.rebinds_in_place();
        if !patches {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_REBIND").is_none(),
                "HWQUEUE_REQUIRE_REBIND is set, and {} cannot rewrite bound descriptors",
                device.driver()
            );
            println!("this driver records a rebound run again: rewriting is not checked");
        }
        check_replay_and_plain_agree(&device, &kernels(), false, patches);
    }

    /// Where a queue's run cannot replay it runs the plain way, and the plan
    /// says why: on unmapped memory the uploads and downloads (the copy
    /// queue's) take new staging ranges each run, while the kernels (the
    /// compute queue's) still replay; a profiled run records device
    /// timestamps, so nothing replays.
    #[test]
    fn runs_that_cannot_replay_run_the_plain_way_and_say_why() {
        let Some(ordinal) = ordinal() else { return };
        let kernels = kernels();
        let unmapped = Arc::new(VulkanDevice::open_unmapped(ordinal).unwrap());
        let (mut plan, up, down) = chain(&unmapped, &kernels);
        run_chain(&mut plan, up, down, 4);
        let launches = plan.launches();
        assert!(launches.kernels <= 2 * KERNELS as u64, "{launches:?}");
        assert!(launches.programs >= 2, "{launches:?}");
        let why = launches.fallback.expect("a reason");
        assert!(why.contains("staging"), "{why}");

        let device = Arc::new(VulkanDevice::open(ordinal).unwrap());
        check_a_profiled_plan_runs_plainly(&device, &kernels);
    }

    /// On Vulkan the recording is resubmitted while an earlier submission
    /// of it is pending (`SIMULTANEOUS_USE`).
    #[test]
    fn runs_started_back_to_back_replay_while_earlier_ones_are_pending() {
        let Some(ordinal) = ordinal() else { return };
        let device = Arc::new(VulkanDevice::open(ordinal).unwrap());
        check_runs_back_to_back(&device, &kernels());
    }

    /// A failure inside a replayed stretch (here the stretch's second signal
    /// is further from the counter than the device allows, found when the
    /// replay reaches it) fails the stretch from its start, its first signal
    /// with it: the recording holds commands after the failure too, so it is
    /// not submitted, and no value of the stretch may be set without its
    /// work. Before the fix the first signal was submitted alone, and read
    /// reached with the kernels never run.
    #[test]
    fn a_failure_inside_a_replayed_stretch_fails_its_signals_instead_of_setting_them_without_the_work()
     {
        use hwqueue::{HardwareQueue, QueueFactory, TimelineSignal};
        let Some(ordinal) = ordinal() else { return };
        let device = VulkanDevice::open(ordinal).unwrap();
        device.limit_value_difference(100);
        let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
        let x = device.alloc(64 * 4).unwrap();
        x.write_at(0, &[0u32; 64]).unwrap();
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let mut stretch = |first: u64, second: u64| {
            let grid = ExecParams::new_1d(64, 64);
            queue
                .exec(&add, &[&x], &[Scalar::U32(1)], grid)
                .signal(&signal, first)
                .exec(&add, &[&x], &[Scalar::U32(1)], grid)
                .signal(&signal, second)
                .replay_as(0)
                .submit()
                .unwrap();
        };
        stretch(1, 2);
        signal.wait(2, LONG).unwrap();
        assert_eq!(x.to_vec::<u32>().unwrap(), vec![2; 64]);
        // The same commands again, replayed: 500 is too far from 2.
        stretch(3, 500);
        let error = signal.wait(3, LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::SignalValueTooFarApart { .. }),
            "{error}"
        );
        assert_eq!(x.to_vec::<u32>().unwrap(), vec![2; 64], "nothing ran");
        assert!(queue.synchronize().is_err(), "the owner hears of it");
        assert_eq!(queue.launches().kernels, 2, "{:?}", queue.launches());
    }

    /// A rebinding gives an idle recording the new buffers where they alias
    /// each other as the old did; a batch whose two kernels write one
    /// buffer, where the recording's wrote two, needs a barrier the
    /// recording lacks (the second kernel must see the first one's
    /// writes), so it is recorded again, not patched; every batch computes
    /// what it should. (A plan refuses such bindings of its slots: this is
    /// a queue's own replay key.)
    #[test]
    fn a_rebinding_that_aliases_two_buffers_is_recorded_again_not_patched() {
        use hwqueue::{HardwareQueue, QueueFactory, TimelineSignal};
        let Some(ordinal) = ordinal() else { return };
        let device = VulkanDevice::open(ordinal).unwrap();
        if !device.rebinds_in_place() {
            assert!(std::env::var_os("HWQUEUE_REQUIRE_REBIND").is_none());
            println!("this driver records a rebound run again: rewriting is not checked");
            return;
        }
        let add = kernels().add;
        let buffers: Vec<_> = (0..3)
            .map(|_| {
                let buffer = device.alloc(WORDS * 4).unwrap();
                buffer.write_at(0, &[0u32; WORDS]).unwrap();
                buffer
            })
            .collect();
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let grid = ExecParams::new_1d(WORDS as u32, 64);
        let mut value = 0;
        let mut run = |x: usize, y: usize| {
            value += 1;
            queue
                .exec(&add, &[&buffers[x]], &[Scalar::U32(1)], grid)
                .exec(&add, &[&buffers[y]], &[Scalar::U32(2)], grid)
                .signal(&signal, value)
                .replay_as(0)
                .submit()
                .unwrap();
            signal.wait(value, LONG).unwrap();
            queue.launches()
        };
        let first = run(0, 1);
        // Other buffers, still two: the recording's descriptors rewritten.
        let second = run(1, 2);
        assert_eq!(second.patched, first.patched + 1, "{second:?}");
        assert_eq!(second.kernels, first.kernels, "{second:?}");
        // One buffer for both: recorded again, with the barrier.
        let third = run(2, 2);
        assert_eq!(third.patched, second.patched, "{third:?}");
        assert_eq!(third.kernels, second.kernels + 2, "{third:?}");
        let words = |at: usize| buffers[at].to_vec::<u32>().unwrap();
        assert_eq!(words(0), vec![1; WORDS]);
        assert_eq!(words(1), vec![2 + 1; WORDS]);
        assert_eq!(words(2), vec![2 + 1 + 2; WORDS]);
    }

    /// A batch naming buffers made by `alloca` is not replayed: once a
    /// `dealloca` completed, their block may go back to the driver and a new
    /// `VkBuffer` take its handle's number, which a recording could not tell
    /// from the old one.
    #[test]
    fn a_batch_naming_alloca_buffers_runs_the_plain_way_and_says_why() {
        use hwqueue::{HardwareQueue, QueueFactory, TimelineSignal};
        let Some(ordinal) = ordinal() else { return };
        let device = VulkanDevice::open(ordinal).unwrap();
        let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
        let out = device.alloc(64 * 4).unwrap();
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        for run in 1..=3u64 {
            let scratch = queue.alloca(64 * 4).unwrap();
            queue
                .fill(&scratch, 0u32)
                .exec(
                    &add,
                    &[&scratch],
                    &[Scalar::U32(7)],
                    ExecParams::new_1d(64, 64),
                )
                .copy(&out, &scratch)
                .dealloca(&scratch)
                .signal(&signal, run)
                .replay_as(0)
                .submit()
                .unwrap();
            signal.wait(run, LONG).unwrap();
            assert_eq!(out.to_vec::<u32>().unwrap(), vec![7; 64]);
        }
        let launches = queue.launches();
        assert_eq!(launches.programs, 0, "{launches:?}");
        assert_eq!(launches.kernels, 3, "{launches:?}");
        let why = launches.fallback.expect("a reason");
        assert!(why.contains("alloca"), "{why}");
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use hwqueue::cuda::{Cuda, CudaDevice, CudaProgram};

    /// The GPU's device 0 (see `common::cuda_device`).
    fn device() -> Option<Arc<CudaDevice>> {
        common::cuda_device().map(Arc::new)
    }

    /// [`Kernels`] in CUDA C.
    const KERNELS_C: &str = r#"
extern "C" __global__ void add(unsigned int *x, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = x[i] + n;
}
extern "C" __global__ void mix(const unsigned int *a, unsigned int *out, unsigned int k) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = out[i] * 3u + a[i] + k;
}
"#;

    fn kernels(device: &CudaDevice) -> Kernels<Cuda> {
        Kernels {
            add: CudaProgram::from_cuda_c(device, KERNELS_C, "add", 1, 1).unwrap(),
            mix: CudaProgram::from_cuda_c(device, KERNELS_C, "mix", 2, 1).unwrap(),
        }
    }

    /// One graph launch a run instead of 64 kernel launches.
    #[test]
    fn a_cuda_plan_of_64_kernels_run_100_times_launches_its_graph_for_each() {
        let Some(device) = device() else { return };
        check_a_chain_replays(&device, &kernels(&device), false, true);
    }

    /// Rebinding patches the graphs' nodes: the same downloads as the plain
    /// path over 1,000 runs.
    #[test]
    fn cuda_replay_and_plain_runs_agree_over_1000_runs_with_random_rebinding() {
        let Some(device) = device() else { return };
        check_replay_and_plain_agree(&device, &kernels(&device), true, true);
    }

    #[test]
    fn a_profiled_cuda_plan_launches_kernel_by_kernel_and_says_why() {
        let Some(device) = device() else { return };
        check_a_profiled_plan_runs_plainly(&device, &kernels(&device));
    }

    /// A graph launched again while its last launch still runs.
    #[test]
    fn cuda_runs_started_back_to_back_replay_while_earlier_ones_run() {
        let Some(device) = device() else { return };
        check_runs_back_to_back(&device, &kernels(&device));
    }
}
