//! Issue 45's repeat of recorded graphs on the fake driver, at the queue's
//! level: a batch names the graphs its key's last batch recorded
//! (`replay_recorded`, `replay_program`) only once that batch is enqueued
//! whole, never the graphs of one recorded before it; and naming graphs the
//! queue does not hold is an error at record time.

use hwqueue::cuda::{CudaDevice, CudaProgram};
use hwqueue::{Device, Error, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal};

use super::{SCALE_PTX, describe, on_a_12_2_device, report, run_scenario};

/// The key the scenario's batches are marked with.
const KEY: u32 = 7;

/// The child's half: a batch of two `scale` launches (`n` 1 and 2) under
/// [`KEY`]; then one of `n` 10 and 11 behind a wait on a host-set gate,
/// which holds it at the worker; whether the queue offers the key's graphs
/// while it is held (`behind_wait`) and once it ran (`after_wait`); a batch
/// that names the graph (`repeat`); whether graphs of other kernel counts
/// are offered (`other_counts`); a batch that names a graph with none
/// offered (`unoffered`); and whether the graphs of kernels over a buffer
/// `alloca` made are offered (`alloca`).
pub(super) fn run(device: &CudaDevice) {
    let program = CudaProgram::from_ptx(device, SCALE_PTX, "scale", 2, 1).unwrap();
    let (a, b) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    let gate = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let grid = ExecParams::new_1d(16, 16);
    let long = std::time::Duration::from_secs(10);
    let record = |queue: &mut hwqueue::cuda::CudaQueue, n: u32, value: u64| {
        queue
            .exec(&program, &[&a, &b], &[Scalar::U32(n)], grid)
            .signal(&done, value - 1)
            .exec(&program, &[&b, &a], &[Scalar::U32(n + 1)], grid)
            .signal(&done, value)
            .replay_as(KEY)
            .submit()
    };
    record(&mut queue, 1, 2).unwrap();
    queue.synchronize().unwrap();
    report("first", &queue.replay_recorded(KEY, &[2]).to_string());
    queue.wait(&gate, 1);
    record(&mut queue, 10, 4).unwrap();
    report("behind_wait", &queue.replay_recorded(KEY, &[2]).to_string());
    gate.set(1);
    report(
        "held",
        &describe(done.wait(4, long), |()| done.value().to_string()),
    );
    queue.synchronize().unwrap();
    report("after_wait", &queue.replay_recorded(KEY, &[2]).to_string());
    queue.replay_program(0).signal(&done, 5).replay_as(KEY);
    report("repeat", &describe(queue.submit(), |()| "submitted".into()));
    report(
        "repeated",
        &describe(done.wait(5, long), |()| done.value().to_string()),
    );
    report(
        "other_counts",
        &queue.replay_recorded(KEY, &[3]).to_string(),
    );
    let unoffered = queue.replay_program(0).signal(&done, 6).submit();
    report(
        "unoffered",
        &match unoffered {
            Err(Error::BatchRejected { cause }) => cause.to_string(),
            other => format!("{other:?}"),
        },
    );
    report("launches", &format!("{:?}", queue.launches()));
    // Kernels over a buffer `alloca` made: recorded every time, so each
    // takes its use of it.
    let scratch = queue.alloca(64).unwrap();
    queue
        .exec(&program, &[&scratch, &a], &[Scalar::U32(20)], grid)
        .exec(&program, &[&a, &scratch], &[Scalar::U32(21)], grid)
        .signal(&done, 7)
        .replay_as(KEY)
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    report("alloca", &queue.replay_recorded(KEY, &[2]).to_string());
}

/// The graphs a batch names are those of the last batch under its key, and
/// only once it is on the stream: while a later batch under the key waits
/// at the worker, the queue offers none (the earlier batch's graph holds
/// `n` 1 and 2; naming it would run the wrong kernels' arguments), and
/// once it ran, the graph named runs `n` 10 and 11.
#[test]
fn a_repeat_names_the_graphs_of_the_last_batch_under_its_key_once_it_is_enqueued() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("repeat_order", &[])) else {
        return;
    };
    assert_eq!(outcome.field("first"), "true", "{outcome:#?}");
    assert_eq!(outcome.field("behind_wait"), "false", "{outcome:#?}");
    assert_eq!(outcome.field("held"), "ok 4", "{outcome:#?}");
    assert_eq!(outcome.field("after_wait"), "true", "{outcome:#?}");
    assert_eq!(outcome.field("repeat"), "ok submitted", "{outcome:#?}");
    assert_eq!(outcome.field("repeated"), "ok 5", "{outcome:#?}");
    assert_eq!(outcome.field("other_counts"), "false", "{outcome:#?}");
    let unoffered = outcome.field("unoffered");
    assert!(unoffered.contains("device program 0"), "{unoffered}");
    assert!(
        unoffered.contains("call `replay_recorded` first"),
        "{unoffered}"
    );
    // Four graph launches: the two recorded batches', then the repeat's,
    // which ran the second batch's arguments, then the `alloca` batch's.
    let graphs: Vec<usize> = (outcome.launches.iter().enumerate())
        .filter(|(_, line)| line.starts_with("graph "))
        .map(|(at, _)| at)
        .collect();
    assert_eq!(graphs.len(), 4, "{outcome:#?}");
    let scalar = |at: usize| outcome.launches[at].rsplit(',').next().unwrap().to_owned();
    let last = graphs[2];
    assert_eq!(
        (scalar(last + 1), scalar(last + 2)),
        ("10".into(), "11".into())
    );
    assert!(
        outcome.field("launches").contains("repeats: 1"),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("alloca"), "false", "{outcome:#?}");
}
