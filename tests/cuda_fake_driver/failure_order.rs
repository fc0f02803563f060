//! A batch that fails on the thread that submits it, after some of its
//! work went on the stream: under `FailureScope::Queue` (the default) its
//! signals from the failure on fail only once that work completed, as the
//! `Engine::submit` contract says (a waiter the failure lets through, a
//! settled wait or a plan's next run, must not race the batch's earlier
//! work). The fake's `HWQUEUE_FAKE_EVENT_DELAY_US` makes the earlier work
//! run that long: its event completes then, and `cuStreamSynchronize`
//! waits for it.

use std::time::Duration;

use hwqueue::cuda::CudaDevice;
use hwqueue::{Device, Error, FailureScope, HardwareQueue, QueueFactory, TimelineSignal};

use super::{on_a_12_2_device, report, run_scenario};

/// The work before a failure runs 2 s, and every wait for the stream from
/// the first signal's event record on fails with CUDA_ERROR_INVALID_HANDLE
/// (400: not sticky), while the events still answer.
const UNSTICKY_STREAM_WAIT: [(&str, &str); 4] = [
    ("HWQUEUE_FAKE_EVENT_DELAY_US", "2000000"),
    ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
    ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuStreamSynchronize"),
    ("HWQUEUE_FAKE_FAULT", "400"),
];

/// From the first upload on, nothing tells when work is done: event
/// queries, event waits and stream waits all fail unsticky.
const NOTHING_TELLS: [(&str, &str); 3] = [
    ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2"),
    ("HWQUEUE_FAKE_FAULT", "400"),
    (
        "HWQUEUE_FAKE_FAULT_SEEN_BY",
        "cuEventQuery,cuEventSynchronize,cuStreamSynchronize",
    ),
];

/// Runs the child `failure_order:CASE` under `vars`, and checks each of
/// `fields` reads as given (and the device opened); `None` without a C
/// compiler, else what the child reported.
fn expect_fields(
    case: &str,
    vars: &[(&str, &str)],
    fields: &[(&str, &str)],
) -> Option<super::Outcome> {
    let outcome = run_scenario(&on_a_12_2_device(&format!("failure_order:{case}"), vars))?;
    assert_eq!(outcome.field("device"), "ok", "{case}: {outcome:#?}");
    for (field, value) in fields {
        assert_eq!(
            outcome.field(field),
            *value,
            "{case}, {field}: {outcome:#?}"
        );
    }
    Some(outcome)
}

/// Submits what `queue` recorded, past what the batches before report:
/// the failure of the one before may be reported first (the batch stays
/// recorded), so it is submitted again (up to 3 times); and the stall may
/// land first (the worker retired the batches before meanwhile, and
/// nothing could tell their work done), after which the queue takes no
/// more work and says so at every submit: then the batch is let go, and
/// the values kept unsettled before it failed. Anything else panics.
fn submit_past_reports(queue: &mut hwqueue::cuda::CudaQueue) {
    let stalled = |ended: &hwqueue::Result<()>| {
        matches!(ended, Err(Error::QueueFailed { cause })
            if matches!(**cause, Error::QueueStalled { .. }))
    };
    let mut submitted = queue.submit();
    for _ in 0..3 {
        match submitted {
            Err(Error::QueueFailed { .. }) if !stalled(&submitted) => submitted = queue.submit(),
            _ => break,
        }
    }
    assert!(submitted.is_ok() || stalled(&submitted), "{submitted:?}");
}

/// A signal whose value 1 failed on another queue: a wait on it fails the
/// batch there.
fn failed_elsewhere(device: &CudaDevice) -> hwqueue::cuda::CudaSignal {
    let failed = device.new_signal(0).unwrap();
    failed.fail(
        1,
        Error::KernelFailed {
            program: "elsewhere".into(),
            message: "failed on another queue".into(),
        },
    );
    failed
}

/// How a timed wait for a value ended, as the children report it.
fn describe(ended: &hwqueue::Result<()>) -> &'static str {
    match ended {
        Err(Error::SignalFailed { .. }) => "failed",
        Err(Error::Timeout { .. }) => "pending",
        Ok(()) => "reached",
        Err(_) => "other",
    }
}

/// The child's half. `behind_wait`: `signal(a, 1)`, then a wait on a value
/// failed on the host, then `signal(b, 1)`, submitted on the caller's
/// thread. `behind_record`: `signal(a, 1)` and `signal(b, 1)` alone (the
/// in-place path), `b`'s event record refused by the fake. `behind_batch`:
/// `signal(a, 1)` submitted alone, then a batch of the failed wait and
/// `signal(b, 1)`, which fails at its first command. `behind_rejected`:
/// `signal(a, 1)` submitted alone, then `signal(b, 1)` and a copy between
/// buffers of two sizes, which `submit` refuses. Reports how
/// `b` ended and whether `a` was reached by then.
pub(super) fn run(device: &CudaDevice, case: &str) {
    if case == "blocked_behind_unsettled" {
        return run_blocked_behind_unsettled(device);
    }
    if case == "drain_behind_unsettled" {
        return run_drain_behind_unsettled(device);
    }
    if case == "drain_unsettled" {
        return run_drain(device, false);
    }
    if case == "drain_signal_then_wait" {
        return run_drain(device, true);
    }
    if case == "stalled_template" {
        return run_stalled_template(device);
    }
    if case == "plan_on_a_stalled_queue" {
        return run_plan_on_a_stalled_queue(device);
    }
    if case == "dropped_unsettled" {
        return run_dropped_unsettled(device);
    }
    if let Some(how) = case.strip_prefix("dropped_while_blocked_") {
        return run_dropped_while_blocked(device, how == "draining");
    }
    if case == "rejected_behind_unsettled" {
        return run_rejected_behind_unsettled(device);
    }
    let mut queue = device.compute_queue().unwrap();
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    match case {
        "behind_wait" => {
            let failed = failed_elsewhere(device);
            queue.signal(&a, 1).wait(&failed, 1).signal(&b, 1);
        }
        "behind_record" => {
            queue.signal(&a, 1).signal(&b, 1);
        }
        "behind_batch" => {
            let failed = failed_elsewhere(device);
            queue.signal(&a, 1).submit().unwrap();
            queue.wait(&failed, 1).signal(&b, 1);
        }
        "behind_rejected" => {
            queue.signal(&a, 1).submit().unwrap();
            let (small, large) = (device.alloc(16).unwrap(), device.alloc(32).unwrap());
            queue.signal(&b, 1).copy(&small, &large);
            let refused = queue.submit();
            assert!(
                matches!(refused, Err(Error::BatchRejected { .. })),
                "{refused:?}"
            );
        }
        other => panic!("no failure_order case `{other}`"),
    }
    queue.submit().unwrap();
    // 30 s: a value that never settles fails the test, not CI.
    let ended = b.wait(1, Duration::from_secs(30));
    let a_reached = a.is_reached(1);
    report(
        "b",
        match &ended {
            Err(Error::SignalFailed { .. }) => "failed",
            Ok(()) => "reached",
            Err(_) => "other",
        },
    );
    report("a_reached_when_b_failed", &a_reached.to_string());
    // The owner hears of the failure, and its `synchronize` ends.
    let synchronized = queue.synchronize();
    report(
        "synchronize",
        &match synchronized {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("err {error}"),
        },
    );
}

/// The child's half of `blocked_behind_unsettled`: under
/// `FailureScope::Batch`, `signal(a, 1)` submitted alone, then a batch of
/// a wait on a failed value and `signal(b, 1)` (failing at its first
/// command), then one that waits for `x`, which only the host sets, once
/// `b` settled (as a thread that waits for `b` before it sets `x` would).
/// Reports how `b` ended (within 10 s) and whether `a` was reached then;
/// then sets `x` and synchronises.
fn run_blocked_behind_unsettled(device: &CudaDevice) {
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let (x, c) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let failed = failed_elsewhere(device);
    queue.signal(&a, 1).submit().unwrap();
    queue.wait(&failed, 1).signal(&b, 1).submit().unwrap();
    queue.wait(&x, 1).signal(&c, 1);
    submit_past_reports(&mut queue);
    let ended = b.wait(1, Duration::from_secs(10));
    let a_reached = a.is_reached(1);
    report(
        "b",
        match &ended {
            Err(Error::SignalFailed { .. }) => "failed",
            Ok(()) => "reached",
            Err(_) => "other",
        },
    );
    report("a_reached_when_b_failed", &a_reached.to_string());
    x.set(1);
    let reached = c.wait(1, Duration::from_secs(30));
    report("c", &format!("{reached:?}"));
}

/// The child's half of `drain_behind_unsettled`: under
/// `FailureScope::Batch`, `signal(a, 1)` submitted alone, then a batch of
/// a wait on a failed value and `signal(b, 1)` (whose values the worker
/// cannot fail yet: the fake fails its first stream wait), then one of
/// the same failed wait, a settled wait for `b` 1 and `signal(c, 1)`:
/// the second stream wait succeeds, so `c`'s batch fails at once, and its
/// drain honours the settled wait for `b` first. Reports how `c` ended
/// (within 10 s), and how `b` did.
fn run_drain_behind_unsettled(device: &CudaDevice) {
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let c = device.new_signal(0).unwrap();
    let failed = failed_elsewhere(device);
    queue.signal(&a, 1).submit().unwrap();
    queue.wait(&failed, 1).signal(&b, 1).submit().unwrap();
    queue.wait(&failed, 1).wait_settled(&b, 1).signal(&c, 1);
    let mut submitted = queue.submit();
    for _ in 0..3 {
        match submitted {
            Err(Error::QueueFailed { .. }) => submitted = queue.submit(),
            _ => break,
        }
    }
    submitted.unwrap();
    let ended = c.wait(1, Duration::from_secs(10));
    report("c", describe(&ended));
    report("a_reached_when_c_failed", &a.is_reached(1).to_string());
    report("b", describe(&b.wait(1, Duration::ZERO)));
}

/// The child's half of `drain_unsettled` and (`signal_first`)
/// `drain_signal_then_wait`: under `FailureScope::Batch`, `signal(a, 1)`
/// submitted alone, then a batch of a wait on a failed value and either
/// a wait for `x` 1 (which only the host sets) then `signal(b, 1)`, or
/// `signal(b, 1)`, the wait for `x` and `signal(c, 1)`, as a thread that
/// sets `x` once `b` settled would need. Reports how a wait for `b` (5 s;
/// 10 s where it should fail) ended before `x` is set, and whether `a`
/// was reached then; then sets `x` and reports how a wait of 10 s for the
/// batch's last value (`b`, or `c`) ended.
fn run_drain(device: &CudaDevice, signal_first: bool) {
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let (x, c) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let failed = failed_elsewhere(device);
    queue.signal(&a, 1).submit().unwrap();
    queue.wait(&failed, 1);
    if signal_first {
        queue.signal(&b, 1).wait(&x, 1).signal(&c, 1);
    } else {
        queue.wait(&x, 1).signal(&b, 1);
    }
    queue.submit().unwrap();
    let before_x = Duration::from_secs(if signal_first { 10 } else { 5 });
    report("b_before_x", describe(&b.wait(1, before_x)));
    report("a_reached", &a.is_reached(1).to_string());
    x.set(1);
    let (name, last) = if signal_first { ("c", &c) } else { ("b", &b) };
    report(name, describe(&last.wait(1, Duration::from_secs(10))));
}

/// The child's half of `stalled_template`: a batch of two `scale`
/// launches under a key (one graph: the key's template), run and
/// synchronised; a repeat of its graph; then, behind a wait on a host-set
/// gate (the worker holds all that follows), [`STALL_UPLOADS`] batches of
/// an upload each (the fake's faults start at the first), a batch under the
/// key recording its kernels again (its mark now holds the first
/// template, which the repeat launched), and `signal(s, 1)`. The gate set,
/// the queue stalls once more than 64 batches are in flight behind the
/// first upload's, and every later batch is skipped. Reports how `s`
/// ended, and how many bytes of device memory went back to the pool by
/// then (the kernels' buffers `a` and `b`, whose handles the child
/// dropped after the second batch under the key: the queue holds the only
/// uses left).
fn run_stalled_template(device: &CudaDevice) {
    use hwqueue::cuda::CudaProgram;
    use hwqueue::{ExecParams, Scalar};
    const KEY: u32 = 7;
    let program = CudaProgram::from_ptx(device, super::SCALE_PTX, "scale", 2, 1).unwrap();
    let (a, b) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    let (gate, done, s) = (
        device.new_signal(0).unwrap(),
        device.new_signal(0).unwrap(),
        device.new_signal(0).unwrap(),
    );
    let grid = ExecParams::new_1d(16, 16);
    let mut queue = device.compute_queue().unwrap();
    let record = |queue: &mut hwqueue::cuda::CudaQueue, n: u32| {
        queue
            .exec(&program, &[&a, &b], &[Scalar::U32(n)], grid)
            .exec(&program, &[&b, &a], &[Scalar::U32(n + 1)], grid)
            .replay_as(KEY)
            .submit()
            .unwrap();
    };
    record(&mut queue, 1);
    queue.synchronize().unwrap();
    assert!(queue.replay_recorded(KEY, &[2]));
    queue.replay_program(0).signal(&done, 1).submit().unwrap();
    queue.wait(&gate, 1).submit().unwrap();
    let buffer = device.alloc(64).unwrap();
    for i in 0..STALL_UPLOADS {
        queue.upload_vec(&buffer, vec![i; 16]).submit().unwrap();
    }
    record(&mut queue, 10);
    // The queue keeps what its work uses: the template (and the batch
    // above) hold the only uses of `a` and `b` left.
    drop((a, b));
    let held = device.memory_stats().in_use;
    queue.signal(&s, 1).submit().unwrap();
    gate.set(1);
    let ended = s.wait(1, Duration::from_secs(10));
    report(
        "s",
        match &ended {
            Err(Error::SignalFailed { .. }) => "failed",
            Err(Error::Timeout { .. }) => "pending",
            Ok(()) => "reached",
            Err(_) => "other",
        },
    );
    let freed = held - device.memory_stats().in_use;
    report("device_memory_freed", &freed.to_string());
    // The failed queries are reported first, then the stall, each time.
    let _ = queue.synchronize();
    let synchronized = queue.synchronize();
    if let Err(error) = synchronized {
        report("synchronize_says", &error.to_string());
    }
}

/// The child's half of `plan_on_a_stalled_queue`: a plan of one upload,
/// run back to back (never waited for) until a run is refused, at most
/// [`STALL_UPLOADS`] + 10 times. Reports `refused`: the run refused and
/// why, or `none`.
fn run_plan_on_a_stalled_queue(device: &CudaDevice) {
    use hwqueue::Schedule;
    use hwqueue::cuda::Cuda;
    let mut schedule = Schedule::<Cuda>::new();
    let d = schedule.add_device(std::sync::Arc::new(device.clone()));
    let x = schedule.add_buffer(d, "x", device.alloc(64).unwrap());
    let up = schedule.upload("upload x", x).id();
    let mut plan = schedule.plan().unwrap();
    let mut refused = "none".to_owned();
    for run in 0..STALL_UPLOADS + 10 {
        plan.upload(up, &[run; 16]).unwrap();
        if let Err(error) = plan.run() {
            refused = format!("run {run}: {error}");
            break;
        }
    }
    report("refused", &refused);
}

/// How many upload batches `stalled_template` submits: past the 64
/// batches a CUDA queue keeps behind one whose completion cannot be told.
const STALL_UPLOADS: u32 = 70;

/// The child's half of `dropped_unsettled`: an upload, a wait on a failed
/// value and `signal(b, 1)` in one batch (failing at the wait, after the
/// upload went on the stream), whose values the worker keeps unsettled
/// (its stream wait fails unsticky, and so do the queries of and waits on
/// the batch's completion event, for good). Reports how a wait of 1 s for
/// `b` ended while the queue lives, then drops the queue and reports how
/// one of 10 s ended, and whether the queue's id is still live 5 s on.
fn run_dropped_unsettled(device: &CudaDevice) {
    let mut queue = device.compute_queue().unwrap();
    let id = queue.id();
    let b = device.new_signal(0).unwrap();
    let buffer = device.alloc(64).unwrap();
    let failed = failed_elsewhere(device);
    queue
        .upload_vec(&buffer, vec![7u32; 16])
        .wait(&failed, 1)
        .signal(&b, 1)
        .submit()
        .unwrap();
    report("b_while_live", describe(&b.wait(1, Duration::from_secs(1))));
    drop(queue);
    report("b", describe(&b.wait(1, Duration::from_secs(10))));
    // The worker lets the id go right after it settled `b`.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while id.is_live() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    report("live_after_drop", &id.is_live().to_string());
}

/// The child's half of `rejected_behind_unsettled`: the batch of
/// `dropped_unsettled` (an upload, a wait on a failed value and
/// `signal(b, 1)`), whose values the worker keeps unsettled; once the
/// worker is idle (a wait of 1 s for `b`), `signal(c, 1)` and a copy
/// between buffers of two sizes, which `submit` refuses: the engine fails
/// `c` in queue order, on the owner's thread, the stream being idle (its
/// query still answers). Reports how `c` ended (within 10 s), and how `b`
/// stood then.
fn run_rejected_behind_unsettled(device: &CudaDevice) {
    let mut queue = device.compute_queue().unwrap();
    let (b, c) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let buffer = device.alloc(64).unwrap();
    let failed = failed_elsewhere(device);
    queue
        .upload_vec(&buffer, vec![7u32; 16])
        .wait(&failed, 1)
        .signal(&b, 1)
        .submit()
        .unwrap();
    report("b_while_live", describe(&b.wait(1, Duration::from_secs(1))));
    let (small, large) = (device.alloc(16).unwrap(), device.alloc(32).unwrap());
    queue.signal(&c, 1).copy(&small, &large);
    let refused = queue.submit();
    assert!(
        matches!(refused, Err(Error::BatchRejected { .. })),
        "{refused:?}"
    );
    let c_ended = c.wait(1, Duration::from_secs(10));
    let b_then = b.wait(1, Duration::ZERO);
    report("c", describe(&c_ended));
    report("b_when_c_settled", describe(&b_then));
}

/// The child's half of `dropped_while_blocked_*`: under
/// `FailureScope::Batch`, an upload, a wait on a failed value and
/// `signal(b, 1)`, whose values the worker keeps unsettled (nothing
/// proves the work before them done); then a wait for `x` 1, which only
/// the host sets (as a thread that sets it once `b` settled would), and
/// `signal(c, 1)`: in the same batch (`draining`: the worker honours the
/// wait draining the failed batch), or in the next (`blocked`: the worker
/// blocks on it). Reports how a wait of 1 s for `b` ended while the queue
/// lives, then drops the queue and reports how one of 10 s ended; then
/// sets `x`.
fn run_dropped_while_blocked(device: &CudaDevice, draining: bool) {
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    let (b, c) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let x = device.new_signal(0).unwrap();
    let buffer = device.alloc(64).unwrap();
    let failed = failed_elsewhere(device);
    queue
        .upload_vec(&buffer, vec![7u32; 16])
        .wait(&failed, 1)
        .signal(&b, 1);
    if !draining {
        queue.submit().unwrap();
    }
    queue.wait(&x, 1).signal(&c, 1);
    submit_past_reports(&mut queue);
    report("b_while_live", describe(&b.wait(1, Duration::from_secs(1))));
    drop(queue);
    report("b", describe(&b.wait(1, Duration::from_secs(10))));
    x.set(1);
    let _ = c.wait(1, Duration::from_secs(10));
}

fn scenario(case: &str, extra: &[(&str, &str)]) {
    scenario_outcome(case, extra);
}

/// [`scenario`], giving back what the child reported (`None` without a C
/// compiler).
fn scenario_outcome(case: &str, extra: &[(&str, &str)]) -> Option<super::Outcome> {
    let name = format!("failure_order:{case}");
    let mut vars = vec![("HWQUEUE_FAKE_EVENT_DELAY_US", "2000000")];
    vars.extend_from_slice(extra);
    let outcome = run_scenario(&on_a_12_2_device(&name, &vars))?;
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("b"), "failed", "{outcome:#?}");
    assert_eq!(
        outcome.field("a_reached_when_b_failed"),
        "true",
        "{outcome:#?}"
    );
    Some(outcome)
}

/// On 5af1e38 `b` failed as `submit` returned, two seconds before `a`'s
/// work completed.
#[test]
fn a_failed_wait_fails_the_values_after_it_once_the_work_before_it_completed() {
    scenario("behind_wait", &[]);
}

/// The same on the in-place path of a batch of signals only: on 5af1e38
/// `b` failed at once.
#[test]
fn a_refused_record_fails_the_values_after_it_once_the_work_before_it_completed() {
    scenario(
        "behind_record",
        &[
            ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT", "2"),
        ],
    );
}

/// The same where the failure is the batch's first command and the work
/// before it is an earlier batch's: on `e47a8a7` `b` failed at once (only
/// a failure after a command of its own batch waited for the stream).
#[test]
fn a_batch_failing_at_its_first_command_fails_its_values_once_earlier_batches_completed() {
    scenario("behind_batch", &[]);
}

/// The same for a batch refused at submit, whose signals the engine fails
/// in queue order: on `f3e555d` `b` failed at once, while `a`'s work ran.
#[test]
fn a_refused_batch_fails_its_values_once_earlier_batches_completed() {
    scenario("behind_rejected", &[]);
}

/// The same where the worker's wait for the stream, before it fails the
/// values, fails with an error that is not sticky (CUDA_ERROR_INVALID_HANDLE,
/// 400, from `cuStreamSynchronize` from `a`'s record on): the device is not
/// lost, so the stream may still run `a`'s work, and `b` must not fail
/// until something proves it done (here the event queries, which still
/// answer). On 895dc75 `b` failed at once, while `a`'s work ran.
#[test]
fn a_failed_batch_whose_stream_wait_fails_unsticky_fails_its_values_only_once_proven() {
    let stream_wait = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuStreamSynchronize"),
        ("HWQUEUE_FAKE_FAULT", "400"),
    ];
    for case in ["behind_batch", "behind_wait"] {
        let Some(outcome) = scenario_outcome(case, &stream_wait) else {
            return;
        };
        assert!(outcome.called("cuStreamSynchronize"), "{outcome:#?}");
        // The owner hears of the failure, and its `synchronize` ends.
        assert!(
            outcome.field("synchronize").starts_with("err "),
            "{outcome:#?}"
        );
    }
}

/// The same, with the worker then blocked on a later batch's wait for a
/// value only the host sets (`x`), by a thread that waits for `b` first:
/// `b`'s values are failed only by a retirement, and the worker retired
/// only while idle, so `b` never settled until `x` was set (here, `b`'s
/// wait timed out after 10 s; for a thread that sets `x` after `b`
/// settled, a deadlock). Under the same unsticky stream-wait fault.
#[test]
fn a_value_kept_unsettled_fails_while_the_worker_blocks_on_a_later_wait() {
    let stream_wait = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuStreamSynchronize"),
        ("HWQUEUE_FAKE_FAULT", "400"),
    ];
    let Some(outcome) = scenario_outcome("blocked_behind_unsettled", &stream_wait) else {
        return;
    };
    assert!(outcome.called("cuStreamSynchronize"), "{outcome:#?}");
    assert_eq!(outcome.field("c"), "Ok(())", "{outcome:#?}");
}

/// A batch failing with proof of the work before it (its stream wait
/// succeeded), behind one whose values the worker kept unsettled (the
/// stream wait before them failed unsticky, once: `HWQUEUE_FAKE_FAULT_TIMES`):
/// under `FailureScope::Batch` its drain honoured a settled wait for the
/// kept value `b` on the worker, and only a retirement, which the blocked
/// worker never reached, could settle `b`: a deadlock (`c` timed out
/// after 10 s, and the queue never ended). The proof settles the kept
/// values first, in queue order.
#[test]
fn a_proven_failure_settles_the_values_kept_unsettled_before_it_first() {
    let vars = [
        ("HWQUEUE_FAKE_EVENT_DELAY_US", "2000000"),
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuStreamSynchronize"),
        ("HWQUEUE_FAKE_FAULT", "400"),
        ("HWQUEUE_FAKE_FAULT_TIMES", "1"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device(
        "failure_order:drain_behind_unsettled",
        &vars,
    )) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("c"), "failed", "{outcome:#?}");
    assert_eq!(
        outcome.field("a_reached_when_c_failed"),
        "true",
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("b"), "failed", "{outcome:#?}");
}

/// Under `FailureScope::Batch` a failed batch honours its later waits
/// before failing the values after them (`Batch::drain_failed`), also
/// where its values wait for proof of the work before them (the stream
/// wait failed unsticky): that path failed them once the stream passed
/// the batch without honouring its waits, so `b` failed (at about 2 s)
/// while the wait for `x` before it was still open.
#[test]
fn a_batch_scoped_failure_kept_unsettled_still_honours_its_later_waits() {
    expect_fields(
        "drain_unsettled",
        &UNSTICKY_STREAM_WAIT,
        &[
            ("a_reached", "true"),
            ("b_before_x", "pending"),
            ("b", "failed"),
        ],
    );
}

/// A queue dropped with values kept unsettled behind a completion event
/// that can be neither queried nor waited for (CUDA_ERROR_INVALID_HANDLE,
/// not sticky, from the upload on; the stream's wait fails so too): the
/// worker's idle loop polled the retirement for them before it looked at
/// the drop, and nothing there could prove them done, so the worker never
/// reached `shut_down`, never ended, and `b` never settled (its wait timed
/// out after 10 s; the queue's id stayed live for the process). The
/// drop's wait for the stream decides for them instead, as for every
/// other batch in flight: here it fails unsticky, so the batch is kept for
/// the process and `b` fails.
#[test]
fn a_queue_dropped_with_values_that_cannot_be_proven_still_settles_them() {
    expect_fields(
        "dropped_unsettled",
        &NOTHING_TELLS,
        &[
            // Nothing can prove the work before `b` done: the queue stalls at
            // once, and `b` fails while it lives (helper-73, finding 3: it stayed
            // pending for as long as the queue lived, so that a waiter without a
            // timeout, or a worker blocked behind it, waited for good).
            ("b_while_live", "failed"),
            ("b", "failed"),
            ("live_after_drop", "false"),
        ],
    );
}

/// Under `FailureScope::Batch`, a failed batch's value before a later wait
/// settles before that wait is honoured (`Batch::drain_failed`: queue
/// order), also where its values wait for proof of the work before them
/// (the stream wait failed unsticky; the stream's query still answers):
/// the worker honoured every later wait before it kept the batch, so `b`
/// stayed pending until `x` was set (a thread that sets `x` once `b`
/// settled: a deadlock; here `b`'s wait timed out after 10 s), though
/// the work before it completed at 2 s.
#[test]
fn a_batch_scoped_failure_kept_unsettled_fails_a_value_before_a_later_wait_first() {
    expect_fields(
        "drain_signal_then_wait",
        &UNSTICKY_STREAM_WAIT,
        &[
            ("b_before_x", "failed"),
            ("a_reached", "true"),
            ("c", "failed"),
        ],
    );
}

/// A stalled queue (`Error::QueueStalled`: its stream's work can no longer
/// be proven done) lets go of nothing that work may use: a skipped batch
/// under a replay key keeps the template its mark holds (whose graph a
/// repeat launched, never proven done) behind a completion event that
/// cannot be told. The next skipped batch's values fail at once
/// (`earlier_work_done`, `Ok` on a stalled queue), and the worker then
/// retired every batch in flight as if a wait for the stream had passed
/// them: the template went, and with it the buffers its kernels took
/// (back in the pool: `device_memory_freed` 512), while the stream may still run the
/// repeat over them.
#[test]
fn a_stalled_queue_keeps_a_skipped_batchs_template() {
    let vars = NOTHING_TELLS;
    let Some(outcome) = run_scenario(&on_a_12_2_device("failure_order:stalled_template", &vars))
    else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("s"), "failed", "{outcome:#?}");
    assert!(
        outcome
            .field("synchronize_says")
            .contains("takes no more work"),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("device_memory_freed"), "0", "{outcome:#?}");
}

/// A plan whose queue stalls (nothing tells when its uploads are done, and
/// its runs pile up behind the first, never waited for): the run the stall meets is
/// refused, saying the queue takes no more work. A stalled queue reports
/// its refusal (`QueueFailed`) at every `submit`, and `Plan::run` took
/// each report for an earlier run's failure and submitted again: the run
/// never returned, spinning a core (the child was killed at its limit).
#[test]
fn a_plan_on_a_stalled_queue_refuses_the_run_instead_of_spinning() {
    let vars = NOTHING_TELLS;
    let scenario = on_a_12_2_device("failure_order:plan_on_a_stalled_queue", &vars);
    let Some(outcome) = super::run_scenario_within(&scenario, Duration::from_secs(60)) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert!(
        outcome.field("refused").contains("takes no more work"),
        "{outcome:#?}"
    );
}

/// A batch whose values fail on the owner's thread, the stream found idle
/// (here one `submit` refused, its `c` failed in queue order), behind a
/// batch whose values the worker keeps unsettled (its stream wait, and
/// the queries of and waits on its completion event, fail unsticky; the
/// stream's query still answers): `c` failed at once while `b`, earlier
/// in queue order, stayed pending (for as long as the queue lived),
/// though the idle stream proved the work before both done.
#[test]
fn a_value_failed_on_an_idle_stream_comes_after_the_values_kept_unsettled_before_it() {
    expect_fields(
        "rejected_behind_unsettled",
        &NOTHING_TELLS,
        &[
            // The queue stalls once nothing tells (see the test before):
            // `b` fails first, then `c`.
            ("b_while_live", "failed"),
            ("c", "failed"),
            ("b_when_c_settled", "failed"),
        ],
    );
}

/// A queue dropped while its worker blocks on a wait for a value only the
/// host sets (`x`), behind values it keeps unsettled that nothing can
/// prove done (the stream's wait and query, and the queries of and waits
/// on the completion event, fail unsticky): the worker reached
/// `shut_down`, whose wait for the stream decides for such values, only
/// past the wait, so `b` stayed pending after the drop (its wait timed
/// out after 10 s): a thread that sets `x` once `b` settled, and the
/// worker, waited for each other for good. The drop decides for them
/// while the worker blocks too: here `b` fails.
#[test]
fn a_queue_dropped_while_its_worker_blocks_settles_the_values_kept_unsettled() {
    let vars = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2"),
        ("HWQUEUE_FAKE_FAULT", "400"),
        (
            "HWQUEUE_FAKE_FAULT_SEEN_BY",
            "cuEventQuery,cuEventSynchronize,cuStreamSynchronize,cuStreamQuery",
        ),
    ];
    for how in ["blocked", "draining"] {
        let name = format!("failure_order:dropped_while_blocked_{how}");
        let Some(outcome) = run_scenario(&on_a_12_2_device(&name, &vars)) else {
            return;
        };
        assert_eq!(outcome.field("device"), "ok", "{how}: {outcome:#?}");
        // The queue stalls once nothing tells, the worker blocked: `b`
        // fails while it lives (see the tests before).
        assert_eq!(
            outcome.field("b_while_live"),
            "failed",
            "{how}: {outcome:#?}"
        );
        assert_eq!(outcome.field("b"), "failed", "{how}: {outcome:#?}");
    }
}
