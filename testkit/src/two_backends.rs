//! A plan over two backends, run back to back: [`check_plan_over_two_backends`].
//!
//! The shape a compiler splitting a model over a CPU and an accelerator
//! records (issue 44): an input uploaded to the other device, a kernel
//! there, a copy to the CPU through the host stage, a copy into an output
//! slot bound per run, a CPU kernel on it, a copy back to the other device
//! through the host stage, a kernel there, and a download. Every run is
//! started before any is waited for, so several are in flight together,
//! and each run's waits on the run before it cross backends in both
//! directions (the other device's queues wait on the host stage's signal,
//! the CPU's on the other device's).

use std::sync::{Arc, Mutex};

use hwqueue::cpu::{CpuProgram, CpuSignal, KernelArgs, WorkGroup};
use hwqueue::{
    Backend, Device, Download, Error, ExecParams, Plan, Schedule, TimelineSignal, Timeout, View,
};

/// Words per tensor.
const WORDS: usize = 4;
const BYTES: usize = WORDS * 4;

/// A CPU kernel's scalar with this bit set makes it fail, naming the run
/// in the rest.
const FAIL: u32 = 1 << 31;

/// What the CPU kernel of run `run` panics with when the run fails it.
fn injected(run: u32) -> String {
    format!("injected failure of run {run}")
}

/// Gates the CPU kernels of first runs wait at ([`NO_GATE`]: none), one
/// per call of [`check_plan_over_two_backends`], by index.
static GATES: Mutex<Vec<CpuSignal>> = Mutex::new(Vec::new());
const NO_GATE: u32 = u32::MAX;

/// `data[i] += k`, or a panic when `k` has [`FAIL`] set; first, where
/// scalar 1 names a gate, waits until it is set.
fn add_or_fail(_: &WorkGroup, args: &KernelArgs<'_>) {
    let k: u32 = args.scalar(0);
    let gate: u32 = args.scalar(1);
    if gate != NO_GATE {
        let gate = GATES.lock().expect("gates")[gate as usize].clone();
        gate.wait(1, crate::MUST_FINISH)
            .expect("the harness opens the gate");
    }
    if k & FAIL != 0 {
        panic!("{}", injected(k & !FAIL));
    }
    let view = args.buffer(0);
    // SAFETY: one work-group, and the plan orders every other access to
    // these bytes before or after this kernel.
    for x in unsafe { view.slice_mut::<u32>(0..view.len::<u32>()) } {
        *x = x.wrapping_add(k);
    }
}

/// What happens to a run of [`check_plan_over_two_backends`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunFate {
    /// It completes.
    Completes,
    /// Its CPU kernel fails.
    Fails,
    /// Its output slot is bound to a misaligned view: `run` refuses it.
    Refused,
}

/// The runs of [`check_plan_over_two_backends`]: completing runs around a
/// failing one, a refused one, and more after both.
pub const FATES: [RunFate; 10] = [
    RunFate::Completes,
    RunFate::Completes,
    RunFate::Completes,
    RunFate::Fails,
    RunFate::Completes,
    RunFate::Refused,
    RunFate::Completes,
    RunFate::Fails,
    RunFate::Fails,
    RunFate::Completes,
];

/// Plans the shape of the module docs over `cpu` and `other` (a device of
/// another backend of set `S`, whose `add` kernel is `other_add`:
/// `data[i] += n` over a 1-D grid, one buffer and one `u32` scalar; or,
/// where it is `None`, a copy on that device instead of each kernel), runs
/// it [`FATES`] times back to back (the first run held at a gate until
/// the last was started, so all are in flight together) with an input of its own each run and
/// the output slot rebound each run, then checks that every run that was
/// to complete produced its own bytes, that a failing run reports its own
/// kernel's failure and no other run's, and that a refused run is refused
/// at `run`, naming itself, and fails its staged download.
///
/// # Panics
/// On any difference, naming the run.
pub fn check_plan_over_two_backends<S>(
    cpu: Arc<S::Device>,
    other: Arc<S::Device>,
    other_add: Option<S::Program>,
) where
    S: Backend,
    S::Program: From<CpuProgram>,
{
    let mut s = Schedule::<S>::new();
    let d_other = s.add_device(other.clone());
    let d_cpu = s.add_device(cpu.clone());
    let add_on_cpu = S::Program::from(CpuProgram::from_fn("add_or_fail", 1, 2, add_or_fail));
    let step = s.add_scalar("k", 0u32);
    let gate_slot = s.add_scalar("gate", NO_GATE);
    // Run 0's CPU kernel waits at this gate until every run was started,
    // so that all of them are in flight together.
    let gate = CpuSignal::new(0);
    let gate_index = {
        let mut gates = GATES.lock().expect("gates");
        gates.push(gate.clone());
        (gates.len() - 1) as u32
    };
    let x = s.add_tensor(d_other, "x", BYTES);
    let y = s.add_tensor(d_cpu, "y", BYTES);
    let out = s.add_slot(d_cpu, "out", BYTES);
    // A buffer, not a tensor: `x`'s bytes are then not reused by `z`, so
    // the next run's upload into `x` waits for this run's host copy out of
    // it, a wait on the host stage's signal from the other backend's queue.
    let z = s.add_buffer(
        d_other,
        "z",
        other.alloc(BYTES).expect("the other device allocates"),
    );
    let grid = ExecParams::new_1d(WORDS as u32, WORDS as u32);
    let input = s.upload("in", x).id();
    let x = match &other_add {
        Some(add) => {
            s.exec("add 1 there", d_other, add, &[x], &[1u32.into()], grid);
            x
        }
        // No kernel there (a fake driver's kernels do nothing): a copy on
        // that device instead.
        None => {
            let x2 = s.add_tensor(d_other, "x2", BYTES);
            s.copy("x to x2", x2, x);
            x2
        }
    };
    s.copy("x to y", y, x);
    s.copy("y to out", out, y);
    s.exec(
        "add k here",
        d_cpu,
        &add_on_cpu,
        &[out],
        &[0u32.into(), NO_GATE.into()],
        grid,
    )
    .scalar(0, step)
    .scalar(1, gate_slot);
    s.copy("out to z", z, out);
    if let Some(add) = &other_add {
        s.exec("add 1 again", d_other, add, &[z], &[1u32.into()], grid);
    }
    let output = s.download("result", z).id();
    let mut plan = s.plan().expect("the schedule plans");
    let labels = plan.queue_labels();
    assert!(
        labels.contains(&"host"),
        "the copies between the backends run on the host stage: {labels:?}"
    );

    // Each run binds `out` to other bytes than the run before it: two
    // buffers, three aligned offsets; a refused run to a misaligned view.
    let slot_buffers: Vec<S::Buffer> = (0..2)
        .map(|_| cpu.alloc(4 * BYTES).expect("a slot buffer"))
        .collect();
    let input_of = |run: u32| -> [u32; WORDS] { std::array::from_fn(|i| run * 100 + i as u32) };
    let mut started = Vec::new();
    let mut refused_downloads = Vec::new();
    for (run, fate) in FATES.iter().enumerate() {
        let run = run as u32;
        let buffer = &slot_buffers[run as usize % 2];
        let offset = match fate {
            RunFate::Refused => 4,
            _ => BYTES * (run as usize % 3),
        };
        let view = View::new(buffer, offset, BYTES).expect("a view in the buffer");
        plan.bind(out, &view).expect("bind the output slot");
        let k = match fate {
            RunFate::Fails => FAIL | run,
            _ => run + 1,
        };
        plan.set_scalar(step, k).expect("set k");
        let gated = if run == 0 { gate_index } else { NO_GATE };
        plan.set_scalar(gate_slot, gated).expect("set the gate");
        plan.upload(input, &input_of(run)).expect("stage the input");
        let result = Download::<u32>::new(WORDS);
        plan.download(output, &result).expect("stage the output");
        match (fate, plan.run()) {
            (RunFate::Refused, Err(error)) => {
                assert!(
                    matches!(&error, Error::RunRefused { run: r, .. } if u64::from(run) == *r)
                        && error.to_string().contains("`out`"),
                    "run {run}: refused, but the error names neither the run nor the slot: \
                     {error}\n{plan}"
                );
                // Failed in queue order, so once the runs before it ran.
                refused_downloads.push((run, result));
            }
            (RunFate::Refused, Ok(_)) => {
                panic!("run {run}: bound to a misaligned view, not refused\n{plan}")
            }
            (_, Ok(handle)) => started.push((run, *fate, k, handle, result)),
            (_, Err(error)) => panic!("run {run} refused: {error}\n{plan}"),
        }
    }
    assert!(
        !started[0].3.is_complete(),
        "run 0 waits at its gate until every run was started"
    );
    gate.set(1);
    let added = if other_add.is_some() { 2 } else { 0 };
    check_runs(&plan, started, |run| input_of(run).map(|v| v + added));
    for (run, result) in refused_downloads {
        assert!(
            result.take(Timeout::After(crate::MUST_FINISH)).is_err(),
            "run {run}: refused, its staged download must fail"
        );
    }
}

/// A run started: its number, fate, `k`, handle and output.
type Started<S> = (u32, RunFate, u32, hwqueue::Run<S>, Download<u32>);

/// Waits for each started run and checks it against its fate.
fn check_runs<S: Backend>(
    plan: &Plan<S>,
    started: Vec<Started<S>>,
    input_of: impl Fn(u32) -> [u32; WORDS],
) {
    for (run, fate, k, handle, result) in started {
        let outcome = handle.wait(Timeout::After(crate::MUST_FINISH));
        match (fate, outcome) {
            (RunFate::Completes, Ok(())) => {
                let expected = input_of(run).map(|v| v + k);
                let got = result
                    .take(Timeout::After(crate::MUST_FINISH))
                    .unwrap_or_else(|e| panic!("run {run}: its download failed: {e}\n{plan}"));
                assert_eq!(got, expected, "run {run}: wrong output\n{plan}");
            }
            (RunFate::Completes, Err(error)) => {
                panic!("run {run} was to complete, it failed: {error}\n{plan}")
            }
            (_, Ok(())) => panic!("run {run} was to fail, it completed\n{plan}"),
            (_, Err(error)) => {
                let own = injected(run);
                assert!(
                    matches!(error.root_cause(), Error::KernelFailed { message, .. } if *message == own),
                    "run {run}: failed with {error}, not its own kernel's failure ({own})\n{plan}"
                );
                assert!(
                    result.take(Timeout::After(crate::MUST_FINISH)).is_err(),
                    "run {run}: failed before its download, which must fail"
                );
            }
        }
    }
}
