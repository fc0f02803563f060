//! A signal's event of another device, destroyed in the middle of a
//! queue's enqueue, leaves the queue's context current. The fake refuses a
//! launch on a stream of a context that is not current, as the driver does.
//! And a signal's event is destroyed even where its context cannot be made
//! current.

use std::time::{Duration, Instant};

use hwqueue::cuda::{Cuda, CudaDevice, CudaProgram};
use hwqueue::{Backend, Device, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal};

use super::{SCALE_PTX, describe, on_a_12_2_device, report, run_scenario};

/// The child's half, over two devices: a queue of device 1 signals `s`
/// sixteen times (every slot of its ring holds an event of device 1, all
/// done once the queue synchronised) and is dropped; then a queue of device 0 signals `s` 17 and runs
/// a kernel in the same batch. Device 1's events cannot be recorded on
/// device 0's stream, so the ring replaces one, destroying it mid-batch.
/// Reports the batch's outcome (`batch`) and whether `s` reached 17.
///
/// `last`: device 1's handle goes too, so the ring's events hold its
/// context's last handles; device 0's queue then signals `s` 17 to 31, one
/// batch each (its events delayed, so each replaces a done event of device
/// 1), and 32 with the kernel: that replacement drops the context's last
/// handle. Reports as above, for 32.
pub(super) fn run(last: bool) {
    let (zero, one) = (Cuda::open(0).unwrap(), Cuda::open(1).unwrap());
    let signal = one.new_signal(0).unwrap();
    {
        let mut queue = one.compute_queue().unwrap();
        for value in 1..=16 {
            queue.signal(&signal, value).submit().unwrap();
        }
        queue.synchronize().unwrap();
    }
    // The worker lets the dropped queue go: then another may signal.
    while signal
        .producer()
        .queue()
        .is_some_and(|queue| queue.is_live())
    {
        std::thread::yield_now();
    }
    let scale = CudaProgram::from_ptx(&zero, SCALE_PTX, "scale", 2, 1).unwrap();
    let (a, b) = (zero.alloc(64).unwrap(), zero.alloc(64).unwrap());
    let mut queue = zero.compute_queue().unwrap();
    let mut value = 17;
    if last {
        drop(one);
        for _ in 0..15 {
            queue.signal(&signal, value).submit().unwrap();
            value += 1;
        }
    }
    queue.signal(&signal, value).exec(
        &scale,
        &[&a, &b],
        &[Scalar::from(16u32)],
        ExecParams::new_1d(16, 16),
    );
    queue.submit().unwrap();
    let ran = queue.synchronize();
    report("batch", &describe(ran, |()| String::new()));
    report("reached", &signal.is_reached(value).to_string());
}

/// On 5af1e38 the replaced event's drop made device 1's context current on
/// the enqueuing thread, and the kernel after the signal was refused
/// (`CUDA_ERROR_INVALID_CONTEXT`): the batch failed.
#[test]
fn a_signal_event_of_another_device_dropped_mid_batch_leaves_the_queue_s_context_current() {
    // Events that take 50 ms: each of the sixteen records finds the ones
    // before it pending, so it takes a slot of its own.
    let extra = [
        ("HWQUEUE_FAKE_DEVICE_COUNT", "2"),
        ("HWQUEUE_FAKE_EVENT_DELAY_US", "50000"),
    ];
    let vars = on_a_12_2_device("other_device_event", &extra);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("batch"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("reached"), "true", "{outcome:#?}");
}

/// The same, where the replaced event holds its context's last handle. On
/// `b4d6606` the handle was let go after the caller's context was made
/// current again, and cudarc's drop of a context makes it current to
/// release it, and leaves it so: the kernel after the signal was refused
/// (`CUDA_ERROR_INVALID_CONTEXT`).
#[test]
fn a_signal_event_holding_its_context_s_last_handle_dropped_mid_batch_leaves_the_queue_s_context_current()
 {
    let extra = [
        ("HWQUEUE_FAKE_DEVICE_COUNT", "2"),
        ("HWQUEUE_FAKE_EVENT_DELAY_US", "50000"),
    ];
    let vars = on_a_12_2_device("other_device_last_event", &extra);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("batch"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("reached"), "true", "{outcome:#?}");
}

/// The child's half of `signal_event_drop`: a queue signals `s` 1 and is
/// dropped (its worker lets go of it); then `s` is dropped on a thread of
/// its own, where no context is current, so that the drop of its event
/// makes its context current (`cuCtxSetCurrent`). Reports how many events
/// that drop destroyed (`cuEventDestroy_v2` in the fake's call log).
pub(super) fn run_event_drop(device: &CudaDevice) {
    let long = Duration::from_secs(30);
    let signal = device.new_signal(0).unwrap();
    {
        let mut queue = device.compute_queue().unwrap();
        queue.signal(&signal, 1).submit().unwrap();
        report(
            "reached",
            &describe(signal.wait(1, long), |()| String::new()),
        );
    }
    let start = Instant::now();
    while signal
        .producer()
        .queue()
        .is_some_and(|queue| queue.is_live())
        && start.elapsed() < long
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let log = std::env::var("HWQUEUE_FAKE_CALLS").unwrap();
    let destroyed = || {
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        calls.lines().filter(|l| *l == "cuEventDestroy_v2").count()
    };
    let before = destroyed();
    std::thread::spawn(move || drop(signal)).join().unwrap();
    report("events_destroyed", &(destroyed() - before).to_string());
}

/// A signal's event is destroyed inside its context (`in_context`). On
/// 895dc75 a context call that failed first (`cuCtxGetCurrent`, or the
/// bind's `cuCtxSetCurrent`: a driver shutting down answers them so) left
/// the event undestroyed: `events_destroyed` was 0 where the control's is
/// one. The fake fails them (CUDA_ERROR_DEINITIALIZED, 4) from the
/// signal's record on.
#[test]
fn a_signal_event_is_destroyed_even_where_its_context_cannot_be_made_current() {
    let Some(control) = run_scenario(&on_a_12_2_device("signal_event_drop", &[])) else {
        return;
    };
    assert_eq!(control.field("reached"), "ok ", "{control:#?}");
    let expected = control.field("events_destroyed");
    assert_ne!(expected, "0", "{control:#?}");
    for failing in ["cuCtxGetCurrent", "cuCtxSetCurrent"] {
        let extra = [
            ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT_SEEN_BY", failing),
            ("HWQUEUE_FAKE_FAULT", "4"),
        ];
        let Some(outcome) = run_scenario(&on_a_12_2_device("signal_event_drop", &extra)) else {
            return;
        };
        assert_eq!(outcome.field("reached"), "ok ", "{failing}: {outcome:#?}");
        assert!(outcome.called(failing), "{outcome:#?}");
        assert_eq!(
            outcome.field("events_destroyed"),
            expected,
            "{failing}: {outcome:#?}"
        );
    }
}
