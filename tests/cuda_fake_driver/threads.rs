//! Issue 45's replay with several threads at once, on the fake driver:
//! [`THREADS`] plans, each on a thread and queues of its own over one
//! device, run [`RUNS`] times each, binding before every run and binding
//! other views (and another scalar) about one run in three, first
//! with replay (graphs built, patched and repeated unrecorded) and then
//! without; every thread's kernels must be launched with the same
//! parameters both times, and its downloads must read the buffers it bound.

use std::sync::Arc;

use hwqueue::cuda::{CudaBuffer, CudaDevice, CudaProgram};
use hwqueue::{Buffer, Device, Download, ExecParams, Scalar, Schedule, Timeout};

use super::{REPLAY_WORDS, SCALE_PTX, kernels_launched, on_a_12_2_device, report, run_scenario};

/// Plans running at once.
const THREADS: u32 = 4;
/// Runs of each plan, per phase.
const RUNS: u32 = 150;
/// Kernels of each plan.
const KERNELS: u32 = 4;

/// A thread's scalars are `1000 * (thread + 1)` and up, so the launch log's
/// last parameter says whose kernel a line is.
fn base(thread: u32) -> u32 {
    1000 * (thread + 1)
}

/// The child's half: reports `replay` and `plain`, one `ok <repeats>` or
/// the first error per thread.
pub(super) fn run(device: CudaDevice) {
    let device = Arc::new(device);
    let program = CudaProgram::from_ptx(&device, SCALE_PTX, "scale", 2, 1).unwrap();
    // Three inputs and three outputs a thread, each filled with its own
    // word, the same buffers in both phases.
    let buffers: Vec<Vec<CudaBuffer>> = (0..THREADS)
        .map(|thread| {
            (0..6)
                .map(|b| {
                    let buffer = device.alloc(REPLAY_WORDS * 4).unwrap();
                    buffer
                        .write_at(0, &vec![thread * 10 + b; REPLAY_WORDS])
                        .unwrap();
                    buffer
                })
                .collect()
        })
        .collect();
    for (phase, replay) in [("replay", true), ("plain", false)] {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (device, program) = (device.clone(), program.clone());
                let buffers = buffers[thread as usize].clone();
                std::thread::spawn(move || runs(&device, &program, &buffers, thread, replay))
            })
            .collect();
        let outcomes: Vec<String> = threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or_else(|_| "panicked".to_owned()))
            .collect();
        report(phase, &outcomes.join(";"));
    }
}

/// One thread's plan, run [`RUNS`] times: `ok <repeats>`, or what went
/// wrong first.
fn runs(
    device: &Arc<CudaDevice>,
    program: &CudaProgram,
    buffers: &[CudaBuffer],
    thread: u32,
    replay: bool,
) -> String {
    let mut schedule = Schedule::<hwqueue::cuda::Cuda>::new();
    let d = schedule.add_device(device.clone());
    let input = schedule.add_slot(d, "in", REPLAY_WORDS * 4);
    let output = schedule.add_slot(d, "out", REPLAY_WORDS * 4);
    let k = schedule.add_scalar("k", base(thread));
    let grid = ExecParams::new_1d(REPLAY_WORDS as u32, 64);
    for kernel in 0..KERNELS {
        let args = if kernel % 2 == 0 {
            [input, output]
        } else {
            [output, input]
        };
        let scalar = Scalar::U32(base(thread) + 500 + kernel);
        let exec = schedule.exec(format!("k{kernel}"), d, program, &args, &[scalar], grid);
        if kernel == 1 {
            exec.scalar(0, k);
        }
    }
    let down = schedule.download("download out", output).id();
    let mut plan = match schedule.plan() {
        Ok(plan) => plan,
        Err(error) => return format!("plan: {error}"),
    };
    plan.set_replay(replay);
    // A xorshift seeded by the thread, the same in both phases.
    let mut state = 0x9e37_79b9_u32 ^ (thread + 1);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let (mut bound_in, mut bound) = (0, 0);
    for run in 0..RUNS {
        let (i, o, value) = (next() % 3, 3 + next() % 3, next() % 50);
        let rebind = run == 0 || next() % 3 == 0;
        if rebind {
            (bound_in, bound) = (i, o);
        }
        let out = Download::<u32>::new(REPLAY_WORDS);
        // Every run binds, as a caller that binds before each run does:
        // the same views, but for one run in three. Binding a view bound
        // already changes nothing, so those runs repeat.
        let outcome = plan
            .bind(input, &buffers[bound_in as usize])
            .and_then(|()| plan.bind(output, &buffers[bound as usize]))
            .and_then(|()| {
                if rebind {
                    plan.set_scalar(k, base(thread) + value)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| plan.download(down, &out))
            .and_then(|()| plan.run())
            .and_then(|run| run.wait(Timeout::Forever))
            .and_then(|()| out.take(Timeout::Forever));
        match outcome {
            // The fake's kernels write nothing: the output reads as filled.
            Ok(words) if words.iter().all(|&w| w == thread * 10 + bound) => {}
            Ok(words) => return format!("run {run} read {}", words[0]),
            Err(error) => return format!("run {run}: {error}"),
        }
    }
    format!("ok {}", plan.launches().repeats)
}

/// Several plans replaying at once launch what they launch without replay:
/// per thread, the same kernels with the same parameters in the same order
/// (their buffers, their scalars, rebound at random), while each repeated
/// its graphs unrecorded between rebindings.
#[test]
fn plans_on_several_threads_replay_what_they_run_plainly() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_threads", &[])) else {
        return;
    };
    for (phase, repeats) in [("replay", true), ("plain", false)] {
        let threads: Vec<&str> = outcome.field(phase).split(';').collect();
        assert_eq!(threads.len(), THREADS as usize, "{outcome:#?}");
        for line in threads {
            let count = line
                .strip_prefix("ok ")
                .unwrap_or_else(|| panic!("{phase}: {line}"));
            let count: u32 = count.parse().unwrap();
            if repeats {
                assert!(count >= RUNS / 3, "{phase}: {count} repeats");
            } else {
                assert_eq!(count, 0);
            }
        }
    }
    // Each thread's kernel lines, in its order: the replay phase's, then the
    // plain phase's.
    let launched = kernels_launched(&outcome);
    for thread in 0..THREADS {
        let own: Vec<&String> = launched
            .iter()
            .filter(|line| {
                let scalar: u32 = line.rsplit(',').next().unwrap().trim().parse().unwrap();
                scalar / 1000 == thread + 1
            })
            .collect();
        let per_phase = (RUNS * KERNELS) as usize;
        assert_eq!(own.len(), 2 * per_phase, "thread {thread}");
        let (replayed, plain) = own.split_at(per_phase);
        if let Some(at) = (0..per_phase).find(|&at| replayed[at] != plain[at]) {
            panic!(
                "thread {thread}, launch {at}: {} replayed, {} plain",
                replayed[at], plain[at]
            );
        }
    }
}
