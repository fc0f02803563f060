//! What a batch that fails while running takes down with it
//! (`FailureScope`), and waits that a failure settles (`wait_settled`):
//! the queue core's part of keeping one run of a plan from failing
//! another. The failing batch is held on a host signal until the later
//! batch is submitted, so the order each test needs is forced.

mod common;

use std::time::Duration;

use common::{LONG, no_hang};
use hwqueue::cpu::{CpuDevice, CpuProgram, CpuSignal};
use hwqueue::{
    Device, Error, ExecParams, FailureScope, HardwareQueue, QueueFactory, TimelineSignal,
};

fn failing() -> CpuProgram {
    CpuProgram::from_fn("fails", 1, 0, |_, _| panic!("this kernel fails"))
}

/// Submits, on a queue of `scope`, a batch held on `gate` whose kernel
/// fails before it signals `first`, then a batch that signals `second`,
/// then lets the first run. Returns how `second` ended.
fn after_a_failed_batch(scope: FailureScope) -> (Error, hwqueue::Result<()>) {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(scope).unwrap();
    let buffer = device.alloc(4).unwrap();
    let (gate, first, second) = (CpuSignal::new(0), CpuSignal::new(0), CpuSignal::new(0));
    queue
        .wait(&gate, 1)
        .exec(&failing(), &[&buffer], &[], ExecParams::new_1d(1, 1))
        .signal(&first, 1);
    queue.submit().unwrap();
    queue.signal(&second, 1);
    queue.submit().unwrap();
    gate.set(1);
    let failed = first.wait(1, LONG).unwrap_err();
    (failed, second.wait(1, LONG))
}

/// By default a batch submitted before its owner was told of a failure
/// does not run; scoped to the batch, it does, and the failure stays the
/// failed batch's own.
#[test]
fn a_failure_scoped_to_its_batch_lets_the_batches_after_it_run() {
    no_hang("batches after a failed one", || {
        let (failed, second) = after_a_failed_batch(FailureScope::Queue);
        assert!(matches!(failed, Error::SignalFailed { .. }), "{failed}");
        let cascaded = second.unwrap_err();
        assert!(
            matches!(cascaded.root_cause(), Error::KernelFailed { .. })
                && cascaded.to_string().contains("earlier batch"),
            "{cascaded}"
        );
        let (failed, second) = after_a_failed_batch(FailureScope::Batch);
        assert!(
            matches!(failed.root_cause(), Error::KernelFailed { .. }),
            "{failed}"
        );
        second.unwrap();
    });
}

/// A settled wait passes a failed value; a plain wait fails with it.
#[test]
fn wait_settled_passes_a_value_whose_work_failed() {
    no_hang("a settled wait on a failed value", || {
        let device = CpuDevice::new();
        let buffer = device.alloc(4).unwrap();
        let mut producer = device.compute_queue().unwrap();
        let failed = CpuSignal::new(0);
        producer
            .exec(&failing(), &[&buffer], &[], ExecParams::new_1d(1, 1))
            .signal(&failed, 1);
        producer.submit().unwrap();
        let mut consumer = device.compute_queue().unwrap();
        let (settled, plain) = (CpuSignal::new(0), CpuSignal::new(0));
        consumer.wait_settled(&failed, 1).signal(&settled, 1);
        consumer.submit().unwrap();
        settled.wait(1, LONG).unwrap();
        consumer.wait(&failed, 1).signal(&plain, 1);
        // The previous batch failed on its own: this one is stamped after
        // the report, so it runs, and fails on its wait.
        let _ = consumer.submit();
        let _ = consumer.submit();
        let error = plain.wait(1, LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::KernelFailed { .. }),
            "{error}"
        );
    });
}

/// A batch scoped to itself that fails still honours the waits recorded
/// after the failed command before failing the signals after them: a
/// value it fails settles only after what it waited for, so a settled
/// wait on that value still orders the waiter after that work.
#[test]
fn a_failed_batch_honours_its_later_waits_before_failing_what_follows() {
    no_hang("a failed batch draining", || {
        let device = CpuDevice::new();
        let buffer = device.alloc(4).unwrap();
        let mut queue = device.compute_queue().unwrap();
        queue.set_failure_scope(FailureScope::Batch).unwrap();
        let (gate, before, after) = (CpuSignal::new(0), CpuSignal::new(0), CpuSignal::new(0));
        queue
            .exec(&failing(), &[&buffer], &[], ExecParams::new_1d(1, 1))
            .signal(&before, 1)
            .wait(&gate, 1)
            .signal(&after, 1);
        queue.submit().unwrap();
        // The kernel failed: the value before the wait fails at once.
        let error = before.wait(1, LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::KernelFailed { .. }),
            "{error}"
        );
        // The one after it waits for the gate. (Correct code never settles
        // it here, so the bound only decides how soon a regression shows.)
        match after.wait(1, Duration::from_millis(200)) {
            Err(Error::Timeout { .. }) => {}
            other => panic!("the value after the wait settled before the gate opened: {other:?}"),
        }
        gate.set(1);
        let error = after.wait(1, LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::KernelFailed { .. }),
            "{error}"
        );
        // Reported once, as any failure.
        assert!(matches!(
            queue.synchronize(),
            Err(Error::QueueFailed { .. })
        ));
        queue.synchronize().unwrap();
    });
}

/// A queue type with only the default scope says so.
#[test]
fn every_queue_of_the_crate_takes_both_scopes() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    queue.set_failure_scope(FailureScope::Queue).unwrap();
    let mut any: hwqueue::AnyQueue = hwqueue::acquire("cpu").unwrap().compute_queue().unwrap();
    any.set_failure_scope(FailureScope::Batch).unwrap();
}

/// A batch failing after its owner was told of another failure takes
/// down the batches submitted since (they came after it, before the
/// owner knew of its failure): its cascade counts from the owner's epoch,
/// not from the one it was stamped with. Here the first failure is
/// reported while the second batch, scoped to itself, waits on a gate;
/// the queue is then scoped to the queue, a third batch submitted, and the
/// second fails. On bf76f69 the third ran (found by a review, helper-47).
#[test]
fn a_failure_after_another_was_reported_cascades_over_what_was_submitted_since() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    let buffer = device.alloc(4).unwrap();
    let [gate, admitted, first, second, third] = [(); 5].map(|()| CpuSignal::new(0));
    let params = ExecParams::new_1d(1, 1);
    queue
        .exec(&failing(), &[&buffer], &[], params)
        .signal(&first, 1);
    queue.submit().unwrap();
    queue
        .signal(&admitted, 1)
        .wait(&gate, 1)
        .exec(&failing(), &[&buffer], &[], params)
        .signal(&second, 1);
    queue.submit().unwrap();
    first.wait(1, LONG).unwrap_err();
    // Admitted (under the batch scope) before the scope changes.
    admitted.wait(1, LONG).unwrap();
    // The owner is told of the first failure (an empty submit reports it).
    assert!(queue.submit().is_err());
    queue.set_failure_scope(FailureScope::Queue).unwrap();
    queue.signal(&third, 1);
    queue.submit().unwrap();
    gate.set(1);
    second.wait(1, LONG).unwrap_err();
    let third = third.wait(1, LONG);
    assert!(
        matches!(&third, Err(Error::SignalFailed { .. })),
        "the batch submitted after the first failure was reported, before the second, ran: {third:?}"
    );
}
