//! Host staging and the pool's zero fills on the fake driver: what an
//! empty download takes, and what a zero fill whose allocation fence
//! cannot be recorded does with its range.

use hwqueue::Download;
use hwqueue::cuda::CudaDevice;
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory, TimelineSignal};

use super::{describe, on_a_12_2_device, report, run_scenario};

/// The child's half of `empty_download`: two empty downloads (of an empty
/// buffer, whose address is 0, and of an empty view of a real buffer)
/// behind a wait on a host-set gate, then a signal; whether either is
/// ready while the gate holds the batch (`ready_behind_gate`), then, once
/// the gate is set, what each download and the signal say.
///
/// `fill_first`: the batch fills the real buffer before the downloads (a
/// fault scenario makes that fill fault the device).
fn empty_download(device: &CudaDevice, fill_first: bool) {
    let (empty, real) = (device.alloc(0).unwrap(), device.alloc(64).unwrap());
    let (gate, done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let (whole, view) = (Download::<u32>::new(0), Download::<u32>::new(0));
    let mut queue = device.compute_queue().unwrap();
    queue.wait(&gate, 1);
    if fill_first {
        queue.fill(&real, 7u32);
    }
    queue
        .download(&empty, &whole)
        .download(&real.view(64, 0).unwrap(), &view)
        .signal(&done, 1);
    report("submit", &describe(queue.submit(), |()| String::new()));
    report(
        "ready_behind_gate",
        &format!("{} {}", whole.is_ready(), view.is_ready()),
    );
    gate.set(1);
    let long = std::time::Duration::from_secs(10);
    let outcome = |r: Result<(), hwqueue::Error>| describe(r, |()| String::new());
    report("done", &outcome(done.wait(1, long).map(drop)));
    report("whole", &outcome(whole.wait(long)));
    report("view", &outcome(view.wait(long)));
    report("synchronize", &outcome(queue.synchronize()));
}

/// The child's half of `zero_fill_fence`: a zeroed allocation (on the
/// fake, `cuMemAlloc` memory is never zeroed, so its range is filled by
/// a memset behind the allocation fence), what the pool counts in use
/// after it (`in_use`), and the device's health.
fn zero_fill_fence(device: &CudaDevice) {
    let buffer = device.alloc(4096);
    report("in_use", &device.memory_stats().in_use.to_string());
    report("alloc", &describe(buffer.map(drop), |()| String::new()));
    report("health", &describe(device.health(), |()| String::new()));
}

/// The child's half: the scenario `name`.
pub(super) fn run(device: &CudaDevice, name: &str) {
    match name {
        "empty_download" => empty_download(device, false),
        "empty_download_fault" => empty_download(device, true),
        "zero_fill_fence" => zero_fill_fence(device),
        other => panic!("no memory scenario `{other}`"),
    }
}

/// An empty download takes no page-locked staging and copies nothing, and
/// still completes in queue order: not before the wait ahead of it, and
/// before the signal after it is reached. On d441ef0 each took a 64 KiB
/// chunk of staging (`cuMemHostAlloc`, on a cold cache) and copied 0 bytes
/// from it (`cuMemcpyDtoHAsync_v2`, from address 0 for the empty buffer).
#[test]
fn an_empty_download_takes_no_staging_and_completes_in_order() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("memory:empty_download", &[])) else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok ", "{outcome:#?}");
    assert_eq!(
        outcome.field("ready_behind_gate"),
        "false false",
        "{outcome:#?}"
    );
    for key in ["done", "whole", "view", "synchronize"] {
        assert_eq!(outcome.field(key), "ok ", "{key}: {outcome:#?}");
    }
    for symbol in ["cuMemHostAlloc", "cuMemcpyDtoHAsync_v2"] {
        assert!(!outcome.called(symbol), "{symbol}: {:?}", outcome.calls);
    }
    // Completed by the stream, in its order: a callback behind the wait.
    assert!(outcome.called("cuStreamAddCallback"), "{:?}", outcome.calls);
}

/// An empty download behind work that faulted the device fails with the
/// fault, as a download with data does, rather than report data ready.
#[test]
fn an_empty_download_behind_a_fault_fails() {
    let extra = [("HWQUEUE_FAKE_FAULT_AFTER", "cuMemsetD32Async")];
    let scenario = on_a_12_2_device("memory:empty_download_fault", &extra);
    let Some(outcome) = run_scenario(&scenario) else {
        return;
    };
    assert_eq!(
        outcome.field("ready_behind_gate"),
        "false false",
        "{outcome:#?}"
    );
    for key in ["whole", "view"] {
        let said = outcome.field(key);
        assert!(!said.starts_with("ok"), "{key}: {outcome:#?}");
    }
    assert!(!outcome.called("cuMemHostAlloc"), "{:?}", outcome.calls);
}

/// The allocation fence recorded after a zero fill's memset fails once
/// (an error that is not sticky), and the wait for the host stream that
/// follows proves the memset done: the allocation stands, zeroed, with
/// nothing left for a queue to order behind. On d441ef0 the allocation
/// failed and its range went back to the pool free while the memset, for
/// all the pool knew, still ran: `alloc_uninit` could hand it to a queue
/// that no fence ordered behind it.
#[test]
fn a_zero_fill_whose_fence_fails_waits_for_its_memset() {
    let extra = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemsetD8Async"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuEventRecord"),
        ("HWQUEUE_FAKE_FAULT", "400"),
        ("HWQUEUE_FAKE_FAULT_TIMES", "1"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("memory:zero_fill_fence", &extra)) else {
        return;
    };
    assert_eq!(outcome.field("alloc"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("in_use"), "4096", "{outcome:#?}");
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
    let calls = &outcome.calls;
    let memset = calls.iter().position(|c| c == "cuMemsetD8Async").unwrap();
    assert!(
        calls[memset..].iter().any(|c| c == "cuStreamSynchronize"),
        "the memset is waited for: {:?}",
        &calls[memset..]
    );
}

/// As the last, where the wait for the host stream fails too (not
/// sticky: the device is not lost, and the memset may still run): the
/// allocation fails, saying so, and its range is kept out of the pool for
/// the process, still counted in use, never handed out again. On d441ef0
/// the range went back to the pool free (`in_use` 0).
#[test]
fn a_zero_fill_whose_fence_and_wait_fail_keeps_its_range() {
    let extra = [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemsetD8Async"),
        (
            "HWQUEUE_FAKE_FAULT_SEEN_BY",
            "cuEventRecord,cuStreamSynchronize",
        ),
        ("HWQUEUE_FAKE_FAULT", "400"),
        ("HWQUEUE_FAKE_FAULT_TIMES", "2"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("memory:zero_fill_fence", &extra)) else {
        return;
    };
    let alloc = outcome.field("alloc");
    assert!(alloc.starts_with("Driver "), "{outcome:#?}");
    assert!(alloc.contains("kept out of the pool"), "{outcome:#?}");
    assert_eq!(outcome.field("in_use"), "4096", "{outcome:#?}");
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
}
