//! The ordinal's shared host stream and allocation fence (`HostSide` in
//! `src/cuda/memory.rs`) under many threads at once, on the fake driver:
//! [`THREADS`] threads, started together on a barrier, each open a handle
//! of device 0 [`ROUNDS`] times, allocate (a zero fill on the host stream,
//! behind the fence), write, copy on a queue and read back, and let
//! everything go; first while one handle stays open (`anchored`: every
//! handle opened then must share its `HostSide`, so no host stream is made
//! but the anchor's), then with none (`churn`: the last handle of one
//! round drops the `HostSide` while another thread's open makes the next).
//! The call log then shows each phase's streams, and that every stream and
//! event made was destroyed.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use hwqueue::cuda::CudaDevice;
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory};

use super::{on_a_12_2_device, report, run_scenario};

/// Threads opening handles at once.
const THREADS: usize = 8;
/// Handles each thread opens, one after the other, per phase.
const ROUNDS: usize = 12;
/// Words of each thread's buffers.
const WORDS: usize = 256;

/// One thread's rounds: `ok` or the first thing that went wrong.
fn rounds(thread: usize, barrier: &Barrier) -> String {
    barrier.wait();
    for round in 0..ROUNDS {
        let outcome = (|| -> hwqueue::Result<Option<String>> {
            let device = CudaDevice::open(0)?;
            let (source, target) = (device.alloc(WORDS * 4)?, device.alloc(WORDS * 4)?);
            let zeros = target.to_vec::<u32>()?;
            if zeros.iter().any(|&word| word != 0) {
                return Ok(Some(format!("round {round}: a new buffer read {zeros:?}")));
            }
            let word = (thread * 1000 + round) as u32;
            source.write_at(0, &vec![word; WORDS])?;
            let mut queue = device.compute_queue()?;
            queue.copy(&target, &source).submit()?;
            queue.synchronize()?;
            let read = target.to_vec::<u32>()?;
            Ok((read != vec![word; WORDS]).then(|| format!("round {round}: read {read:?}")))
        })();
        match outcome {
            Ok(None) => {}
            Ok(Some(wrong)) => return wrong,
            Err(error) => return format!("round {round}: {error}"),
        }
    }
    "ok".to_owned()
}

/// Runs one phase's threads; their outcomes, `;`-separated.
fn phase() -> String {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || rounds(thread, barrier))
            })
            .collect();
        let outcomes: Vec<String> = threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or_else(|_| "panicked".to_owned()))
            .collect();
        outcomes.join(";")
    })
}

/// Puts a lone `cuGetErrorName` in the fake's call log, to tell the
/// phases apart there: hwqueue and cudarc call it only for an error, and
/// every round's steps are checked to succeed.
fn mark() {
    let mut name = std::ptr::null();
    // SAFETY: the call writes one pointer (or fails, for an unknown code).
    let _ = unsafe {
        cudarc::driver::sys::cuGetErrorName(
            cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN,
            &mut name,
        )
    };
}

/// Whether the fake's call log so far shows as many streams and events
/// destroyed as made.
fn balanced(log: &str) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let count = |symbol: &str| text.lines().filter(|line| *line == symbol).count();
    count("cuStreamCreate") == count("cuStreamDestroy_v2")
        && count("cuEventCreate") == count("cuEventDestroy_v2")
}

/// The child's half: reports `anchored` (the child's handle open) and
/// `churn` (none), each phase after a [`mark`]; then waits (up to 20 s)
/// for the queues' workers, which a queue's drop does not wait for, to
/// let their streams go, and reports `balanced` (`true` once they did).
pub(super) fn run(device: CudaDevice) {
    mark();
    report("anchored", &phase());
    drop(device);
    mark();
    report("churn", &phase());
    let log = std::env::var("HWQUEUE_FAKE_CALLS").expect("the call log's path");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !balanced(&log) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    report("balanced", &balanced(&log).to_string());
}

/// Many threads opening, using and dropping handles of one ordinal at once
/// share its host stream while a handle stays open, make a new one when
/// none does, and leave no stream or event behind; every buffer reads
/// zeros when new and its copy's words after.
#[test]
fn handles_opened_and_dropped_on_many_threads_share_one_host_side_and_leak_nothing() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("host_side_threads", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    let ok = ["ok"; THREADS].join(";");
    assert_eq!(outcome.field("anchored"), ok, "anchored");
    assert_eq!(outcome.field("churn"), ok, "churn");
    let calls = &outcome.calls;
    let count = |from: usize, to: usize, symbol: &str| {
        calls[from..to]
            .iter()
            .filter(|call| *call == symbol)
            .count()
    };
    let marks: Vec<usize> = calls
        .iter()
        .enumerate()
        .filter(|(_, call)| *call == "cuGetErrorName")
        .map(|(at, _)| at)
        .collect();
    let [anchored, churn] = marks[..] else {
        panic!("not two marks in the call log, but {marks:?}: a step failed?");
    };
    let queues = THREADS * ROUNDS;
    // The anchor's host stream was made before the phase (by the child's
    // open): in it, only the queues' streams.
    assert_eq!(
        count(anchored, churn, "cuStreamCreate"),
        queues,
        "streams made while a handle was open: a handle made a host stream of its own"
    );
    // The churn phase: the queues' streams, and at most one host stream a
    // handle (none where the anchored phase's lived on in a worker that
    // had not ended yet).
    let churned = count(churn, calls.len(), "cuStreamCreate");
    assert!(
        (queues..=2 * queues).contains(&churned),
        "{churned} streams made without an anchor"
    );
    assert_eq!(outcome.field("balanced"), "true", "streams or events left");
    for (made, destroyed) in [
        ("cuStreamCreate", "cuStreamDestroy_v2"),
        ("cuEventCreate", "cuEventDestroy_v2"),
    ] {
        assert_eq!(
            count(0, calls.len(), made),
            count(0, calls.len(), destroyed),
            "{made} against {destroyed}"
        );
    }
}
