//! Issue 47: an `exec` repeating the last one of its batch (the same
//! kernel, views, work sizes and scalar types) is recorded without being
//! checked again; any difference is checked in full. A scalar of another
//! width is the difference only the CUDA engine's check can see (it reads
//! the kernel's parameter sizes), so it shows the repeat was not taken.
//! What can change between two `exec`s, the device lost, is checked when a
//! batch goes on the stream, a batch of signals only included.

use hwqueue::cuda::{CudaDevice, CudaProgram};
use hwqueue::{Device, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal};

use super::{SCALE_PTX, describe, on_a_12_2_device, report, run_scenario};

/// The child's half: a batch of the same `scale` twice (`same`), then one
/// of `scale` with its 4-byte `n` and again with an 8-byte `n`
/// (`wider`), then one of a `scale` whose `n` takes 8 bytes and `scale`
/// after it with the same arguments (`other_kernel`).
pub(super) fn run(device: &CudaDevice) {
    let scale = CudaProgram::from_ptx(device, SCALE_PTX, "scale", 2, 1).unwrap();
    let wide_ptx = SCALE_PTX.replace(".param .u32", ".param .u64");
    let wide_scale = CudaProgram::from_ptx(device, &wide_ptx, "scale", 2, 1).unwrap();
    let (a, b) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let grid = ExecParams::new_1d(16, 16);
    let n = |n: u32| [Scalar::from(n)];
    let wide = [Scalar::from(16u64)];
    let outcome = |r| describe(r, |()| String::new());
    queue
        .exec(&scale, &[&a, &b], &n(16), grid)
        .exec(&scale, &[&a, &b], &n(16), grid);
    report("same", &outcome(queue.submit()));
    queue
        .exec(&scale, &[&a, &b], &n(16), grid)
        .exec(&scale, &[&a, &b], &wide, grid);
    report("wider", &outcome(queue.submit()));
    queue
        .exec(&wide_scale, &[&a, &b], &wide, grid)
        .exec(&scale, &[&a, &b], &wide, grid);
    report("other_kernel", &outcome(queue.submit()));
    report("synchronize", &outcome(queue.synchronize()));
}

/// What it can see from outside: a repeat runs, and an `exec` that differs
/// from the last only in what the CUDA engine's check reads (a scalar's
/// width, another kernel) is checked, not taken for a repeat. That the
/// repeat skips its checks is not observable here (they would pass); the
/// instruction counts show it (`BENCH=cuda benches/callgrind.sh`).
#[test]
fn an_exec_repeating_the_last_skips_its_checks_and_any_other_is_checked() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("exec_checks", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("same"), "ok ", "{outcome:#?}");
    for key in ["wider", "other_kernel"] {
        let refused = outcome.field(key);
        assert!(
            refused
                .contains("scalar 0 is a u64 (8 bytes), but the kernel's parameter takes 4 bytes"),
            "{key}: {refused}"
        );
    }
    assert_eq!(outcome.field("synchronize"), "ok ", "{outcome:#?}");
    // Only the first batch reached the stream.
    let launches = outcome
        .calls
        .iter()
        .filter(|call| *call == "cuLaunchKernel");
    assert_eq!(launches.count(), 2, "{outcome:#?}");
}

/// The child's half of the work-size case: one batch of `scale` on work
/// sizes A, A, B, B, A (1-D, then 2-D), then, each after a wait, one of
/// B, B and one of B, A; each is launched with its own grid and block.
pub(super) fn run_params(device: &CudaDevice) {
    let scale = CudaProgram::from_ptx(device, SCALE_PTX, "scale", 2, 1).unwrap();
    let (a, b) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let first = ExecParams::new_1d(64, 16);
    let second = ExecParams::new_2d([32, 8], [8, 4]);
    let n = [Scalar::from(16u32)];
    let outcome = |r| describe(r, |()| String::new());
    for params in [first, first, second, second, first] {
        queue.exec(&scale, &[&a, &b], &n, params);
    }
    report("mixed", &outcome(queue.submit()));
    // After a batch that ended with `first`: one that starts with a wait
    // and runs `second` only, then one that mixes them after a wait.
    let ready = device.new_signal(1).unwrap();
    queue
        .wait(&ready, 1)
        .exec(&scale, &[&a, &b], &n, second)
        .exec(&scale, &[&a, &b], &n, second);
    report("uniform", &outcome(queue.submit()));
    queue
        .wait(&ready, 1)
        .exec(&scale, &[&a, &b], &n, second)
        .exec(&scale, &[&a, &b], &n, first);
    report("mixed_after_wait", &outcome(queue.submit()));
    report("synchronize", &outcome(queue.synchronize()));
}

/// A batch's `exec`s of one work size share one launch configuration,
/// built once (`Batch::uniform_params`); a batch that mixes them launches
/// each `exec` with its own, the repeated ones (recorded without their
/// checks) included.
#[test]
fn each_exec_is_launched_with_its_own_work_sizes() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("exec_params", &[])) else {
        return;
    };
    for key in ["mixed", "uniform", "mixed_after_wait", "synchronize"] {
        assert_eq!(outcome.field(key), "ok ", "{key}: {outcome:#?}");
    }
    let first = "grid=4,1,1 block=16,1,1";
    let second = "grid=4,2,1 block=8,4,1";
    let launched: Vec<&str> = (outcome.launches.iter())
        .filter_map(|line| line.strip_prefix("kernel scale via=stream "))
        .map(|line| line.split(" shared=").next().unwrap())
        .collect();
    assert_eq!(
        launched,
        [
            first, first, second, second, first, second, second, second, first
        ],
        "{outcome:#?}"
    );
}

/// A sticky fault that only an event record sees (the work that faulted
/// ran on another queue, or its batch retired already): the signal's
/// batch fails with the device lost, and the device says so
/// (`health`), as a launch that saw it would have made it. On 93fee42 the
/// record's error was a plain driver error and the device stayed healthy
/// (found by a review, helper-47).
#[test]
fn a_fault_seen_by_a_signal_s_event_record_marks_the_device_lost() {
    let extra = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuEventRecord"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("record_lost", &extra)) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    for key in ["second", "health"] {
        let failed = outcome.field(key);
        assert!(
            failed.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && failed.to_lowercase().contains("lost"),
            "{key}: {failed}: {outcome:#?}"
        );
    }
}

/// The child's half of [`a_fault_seen_by_a_signal_s_event_record_marks_the_device_lost`]:
/// two batches of one signal each (`first`, `second`: their waits'
/// outcomes), then the device's `health`.
pub(super) fn run_record_lost(device: &CudaDevice) {
    use hwqueue::Device;
    let mut queue = device.compute_queue().unwrap();
    let outcome = |r: Result<(), hwqueue::Error>| describe(r, |()| String::new());
    let long = std::time::Duration::from_secs(10);
    for name in ["first", "second"] {
        let signal = device.new_signal(0).unwrap();
        queue.signal(&signal, 1);
        let _ = queue.submit();
        report(name, &outcome(signal.wait(1, long).map(drop)));
    }
    report("health", &outcome(device.health()));
}

/// The child's half of the device-lost case: a batch of `scale` after which
/// the device faults, seen only by the next launch (`first`); a second
/// batch of `scale`, whose launch sees it (`second`); then a batch of one
/// signal only (`signal_after`, its wait's outcome), which no driver call
/// of its own would fail here.
pub(super) fn run_lost(device: &CudaDevice) {
    let scale = CudaProgram::from_ptx(device, SCALE_PTX, "scale", 2, 1).unwrap();
    let (a, b) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let grid = ExecParams::new_1d(16, 16);
    let outcome = |r: Result<(), hwqueue::Error>| describe(r, |()| String::new());
    let long = std::time::Duration::from_secs(10);
    let signal = |value| device.new_signal(value).unwrap();
    let (first, second, after) = (signal(0), signal(0), signal(0));
    queue
        .exec(&scale, &[&a, &b], &[Scalar::from(16u32)], grid)
        .signal(&first, 1);
    let _ = queue.submit();
    report("first", &outcome(first.wait(1, long).map(drop)));
    queue
        .exec(&scale, &[&a, &b], &[Scalar::from(16u32)], grid)
        .signal(&second, 1);
    let _ = queue.submit();
    report("second", &outcome(second.wait(1, long).map(drop)));
    // The first submit reports the second batch's failure and leaves the
    // batch recorded; the next submits it.
    report("reported", &outcome(queue.signal(&after, 1).submit()));
    report("resubmitted", &outcome(queue.submit()));
    report("signal_after", &outcome(after.wait(1, long).map(drop)));
}

/// A device lost between two batches: a batch of signals only, which the
/// queue records in place without `enqueue`'s general path, still fails
/// with the loss instead of reaching its value (a real driver would fail
/// the event record; this fake reports the fault to launches only).
#[test]
fn a_signal_submitted_after_the_device_was_lost_fails_with_the_loss() {
    let extra = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuLaunchKernel"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuLaunchKernel"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("exec_checks_lost", &extra)) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("first"), "ok ", "{outcome:#?}");
    assert!(outcome.field("reported").contains("lost"), "{outcome:#?}");
    assert_eq!(outcome.field("resubmitted"), "ok ", "{outcome:#?}");
    for key in ["second", "signal_after"] {
        let failed = outcome.field(key);
        assert!(
            failed.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && failed.contains("lost"),
            "{key}: {failed}"
        );
    }
}
