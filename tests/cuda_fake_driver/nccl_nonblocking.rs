//! Non-blocking NCCL communicators (`NcclConfig::nonblocking`), on the
//! fake NCCL, which models them as NCCL 2.18+ has them: creation, a split
//! and a group's end answer `ncclInProgress` and settle on a later poll of
//! `ncclCommGetAsyncError` (the split's new handle written only then), or,
//! where `HWQUEUE_FAKE_NCCL_PENDING` names the call, never, until
//! `ncclCommAbort` (a peer that never comes). What is shown: the usual
//! path works (collectives move data, a split gives a communicator that
//! runs them), and each call that never settles returns a typed timeout
//! within the communicator's timeout, aborts what it must, and leaves
//! nothing hanging.

use std::time::Duration;

use hwqueue::collective::{Communicator, NcclConfig, NcclId, Reduction};
use hwqueue::cuda::CudaDevice;
use hwqueue::{Device, Download, HardwareQueue, QueueFactory, TimelineSignal};

use super::nccl::{nccl_calls, outcome};
use super::{NCCL_FAKE, on_a_12_2_device, report, run_scenario};

const LONG: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(200);

/// The child's half: `case` names what to do on `device`.
pub(super) fn run(device: &CudaDevice, case: &str) {
    match case {
        "works" => works(device, communicator(device, LONG)),
        // Made blocking, but NCCL_COMM_BLOCKING=0 (set by the test).
        "forced" => works(
            device,
            Communicator::nccl(device, NcclId::new().unwrap(), 0, 1).unwrap(),
        ),
        "forced_single" => {
            let comm = Communicator::nccl_single(device).unwrap();
            let (submitted, data) = reduce(device, &comm);
            report("submit", &submitted);
            report("data", &data);
        }
        "forced_old_nccl" => {
            let made = Communicator::nccl(device, NcclId::new().unwrap(), 0, 1);
            report("comm", &outcome(made));
        }
        "creation_never_settles" => {
            let config = NcclConfig::nonblocking().with_timeout(SHORT);
            let made = Communicator::nccl_with(device, NcclId::new().unwrap(), 0, 1, config);
            report("comm", &outcome(made));
        }
        "split_never_settles" => split_never_settles(device),
        "old_nccl" => {
            let config = NcclConfig::nonblocking();
            let made = Communicator::nccl_with(device, NcclId::new().unwrap(), 0, 1, config);
            report("comm", &outcome(made));
        }
        "launch_never_settles" => launch_never_settles(device),
        "watchdog_beside_a_launch" => watchdog_beside_a_launch(device),
        "threads" => threads(device),
        other => panic!("no non-blocking NCCL case `{other}`"),
    }
}

/// A non-blocking communicator of one rank, with `timeout`.
fn communicator(device: &CudaDevice, timeout: Duration) -> Communicator {
    let config = NcclConfig::nonblocking().with_timeout(timeout);
    Communicator::nccl_with(device, NcclId::new().unwrap(), 0, 1, config).unwrap()
}

/// Uploads `[5, 6]`, all-reduces it over `comm` on `queue`, downloads the
/// result and waits for it: the submit's outcome, then the data's.
fn reduce(device: &CudaDevice, comm: &Communicator) -> (String, String) {
    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
    let back = Download::<u32>::new(2);
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .upload(&input, &[5u32, 6])
        .all_reduce::<u32, _, _>(comm, Reduction::Sum, &input, &output)
        .download(&output, &back)
        .submit();
    let data = format!("{:?}", back.take(LONG));
    let _ = queue.synchronize();
    (outcome(submitted), data)
}

/// Collectives over `comm`, a split of it and collectives over that.
fn works(device: &CudaDevice, comm: Communicator) {
    report(
        "comm",
        &format!(
            "{} {} of {} {:?}",
            comm.engine(),
            comm.rank(),
            comm.size(),
            comm.timeout()
        ),
    );
    let (submitted, data) = reduce(device, &comm);
    report("submit", &submitted);
    report("data", &data);
    let split = comm.split(Some(3), 7);
    report(
        "split",
        &match &split {
            Ok(Some(half)) => format!("{} of {} {:?}", half.rank(), half.size(), half.timeout()),
            Ok(None) => "none".to_owned(),
            Err(error) => format!("{error}"),
        },
    );
    report(
        "no_color",
        &match comm.split(None, 0) {
            Ok(None) => "none".to_owned(),
            other => format!("{:?}", other.map(|made| made.is_some())),
        },
    );
    if let Ok(Some(half)) = split {
        let (submitted, data) = reduce(device, &half);
        report("split_submit", &submitted);
        report("split_data", &data);
    }
}

/// The split never settles: it times out within the parent's 200 ms, and
/// leaves the parent broken (a later collective on it fails at once).
fn split_never_settles(device: &CudaDevice) {
    let comm = communicator(device, SHORT);
    report("split", &outcome(comm.split(Some(1), 0)));
    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let _ = queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&done, 1)
        .submit();
    report("after", &outcome(done.wait(1, LONG)));
    drop((queue, comm));
    report("dropped", "ok");
}

/// A group's launch never settles: the batch fails from the collective
/// with a typed timeout within 200 ms, and the communicator is broken.
fn launch_never_settles(device: &CudaDevice) {
    let comm = communicator(device, SHORT);
    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&done, 1)
        .submit();
    report("submit", &outcome(submitted));
    report("done", &outcome(done.wait(1, LONG)));
    report("synchronize", &outcome(queue.synchronize()));
    report("split_after", &outcome(comm.split(Some(0), 0)));
    drop((queue, comm));
    report("dropped", "ok");
}

/// A group in flight (the fake's `ncclAllGather` hangs for a second), so
/// the watchdog looks at the communicator every 10 ms, while another
/// queue's launch on it takes a few hundred polls to settle: only the
/// launching thread may poll meanwhile.
fn watchdog_beside_a_launch(device: &CudaDevice) {
    let comm = communicator(device, LONG);
    let buffer = || device.alloc(8).unwrap();
    let (input, gathered, reduced) = (buffer(), buffer(), buffer());
    let (gather_done, reduce_done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let (mut stuck, mut other) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let submitted = stuck
        .all_gather::<u32, _, _>(&comm, &input, &gathered)
        .signal(&gather_done, 1)
        .submit();
    report("gather_submit", &outcome(submitted));
    let submitted = other
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &reduced)
        .signal(&reduce_done, 1)
        .submit();
    report("reduce_submit", &outcome(submitted));
    report("reduced", &outcome(reduce_done.wait(1, LONG)));
    report("gathered", &outcome(gather_done.wait(1, LONG)));
    drop((stuck, other, comm));
    report("dropped", "ok");
}

/// Four threads share one non-blocking communicator, each with a queue
/// of its own, and issue twenty all-reduces each (every launch settles
/// on the thread that started it, one at a time under the communicator's
/// call lock), then one thread splits it: what each thread's last data
/// reads, and whether the split still works.
fn threads(device: &CudaDevice) {
    let comm = communicator(device, LONG);
    let results: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4u32)
            .map(|index| {
                let comm = comm.clone();
                scope.spawn(move || {
                    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
                    let done = device.new_signal(0).unwrap();
                    let back = Download::<u32>::new(2);
                    let mut queue = device.compute_queue().unwrap();
                    for value in 1..=20u32 {
                        queue
                            .upload(&input, &[index, value])
                            .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
                            .signal(&done, u64::from(value))
                            .submit()
                            .unwrap();
                    }
                    queue.download(&output, &back).submit().unwrap();
                    let waited = done.wait(20, LONG).map(|()| back.take(LONG));
                    format!("{waited:?}")
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    report("results", &results.join(" "));
    report(
        "split",
        &match comm.split(Some(0), 0) {
            Ok(Some(half)) => format!("{} of {}", half.rank(), half.size()),
            other => format!("{:?}", other.map(|made| made.is_some())),
        },
    );
}

/// Concurrency: the launches of four threads' queues on one non-blocking
/// communicator settle one at a time, each polled by its own thread only.
#[test]
fn four_threads_share_a_nonblocking_communicator() {
    let Some(outcome) = scenario("threads", None) else {
        return;
    };
    assert_eq!(
        outcome.field("results"),
        "Ok(Ok([0, 20])) Ok(Ok([1, 20])) Ok(Ok([2, 20])) Ok(Ok([3, 20]))",
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("split"), "0 of 1", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    let reduced = calls
        .iter()
        .filter(|c| c.starts_with("ncclAllReduce"))
        .count();
    assert_eq!(reduced, 80, "{calls:?}");
    // No call found the communicator busy, and none was polled by a
    // thread other than the one that started it.
    assert!(!calls.iter().any(|c| c.ends_with(" busy")), "{calls:?}");
    assert!(
        !calls.iter().any(|c| c.contains("from another thread")),
        "{calls:?}"
    );
}

#[test]
fn the_watchdog_does_not_poll_a_nonblocking_communicator_while_a_launch_settles() {
    let vars = on_a_12_2_device(
        "nccl_nonblocking:watchdog_beside_a_launch",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_NCCL_HANG", "ncclAllGather"),
            ("HWQUEUE_FAKE_NCCL_HANG_S", "1"),
            ("HWQUEUE_FAKE_NCCL_SETTLE_POLLS", "400"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    for field in [
        "gather_submit",
        "reduce_submit",
        "reduced",
        "gathered",
        "dropped",
    ] {
        assert_eq!(outcome.field(field), "ok", "{field}: {outcome:#?}");
    }
    let calls = nccl_calls(&outcome);
    // The all_gather's group stayed in flight through the launch.
    assert!(
        calls.iter().any(|c| c.starts_with("ncclAllGather")),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.contains("from another thread")),
        "{calls:?}"
    );
}

/// Runs `case` on the fake NCCL, with `pending` (if any) never settling.
fn scenario(case: &str, pending: Option<&str>) -> Option<super::Outcome> {
    scenario_with(
        case,
        pending.map(|call| ("HWQUEUE_FAKE_NCCL_PENDING", call)),
    )
}

/// Runs `case` on the fake NCCL with `extra` set.
fn scenario_with(case: &str, extra: Option<(&str, &str)>) -> Option<super::Outcome> {
    let scenario = format!("nccl_nonblocking:{case}");
    let mut vars = vec![(NCCL_FAKE, "so")];
    vars.extend(extra);
    run_scenario(&on_a_12_2_device(&scenario, &vars))
}

/// NCCL's environment overrides the config: `NCCL_COMM_BLOCKING=0` makes
/// a communicator made blocking (`Communicator::nccl`, `nccl_single`)
/// non-blocking. Its creation answers `ncclInProgress` and is settled
/// before anything uses it, and its split writes the new handle late, to
/// the heap (it was a stack slot the split had returned from).
#[test]
fn nccl_comm_blocking_0_makes_a_blocking_communicator_nonblocking_and_it_is_settled() {
    let forced = Some(("NCCL_COMM_BLOCKING", "0"));
    let Some(outcome) = scenario_with("forced", forced) else {
        return;
    };
    assert!(
        outcome.field("comm").starts_with("nccl 0 of 1 "),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("data"), "Ok([5, 6])", "{outcome:#?}");
    assert!(
        outcome.field("split").starts_with("0 of 1 "),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("no_color"), "none", "{outcome:#?}");
    assert_eq!(outcome.field("split_data"), "Ok([5, 6])", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    // Asked to block, by config: NCCL_COMM_BLOCKING=0 overrode it.
    let asked = "ncclCommInitRankConfig blocking=1 version=21800 size=48";
    assert!(calls.contains(&asked), "{calls:?}");
    // The splits went the non-blocking way (a heap slot, settled).
    assert!(
        calls.contains(&"ncclCommSplit color=3 key=7 blocking=0"),
        "{calls:?}"
    );
    for bad in ["busy", "from another thread", "ncclCommAbort"] {
        assert!(
            !calls.iter().any(|c| c.contains(bad)),
            "`{bad}` in {calls:?}"
        );
    }
    let Some(single) = scenario_with("forced_single", forced) else {
        return;
    };
    assert_eq!(single.field("data"), "Ok([5, 6])", "{single:#?}");
    let calls = nccl_calls(&single);
    assert!(!calls.iter().any(|c| c.contains("busy")), "{calls:?}");
}

/// A non-blocking creation can answer `ncclSuccess` (NCCL's thread done
/// before the call's last look): the communicator is non-blocking all the
/// same, asked for or made so by `NCCL_COMM_BLOCKING=0`, and its split
/// goes the non-blocking way (a heap slot; it used to take the blocking
/// one, whose stack slot NCCL's thread wrote after the split returned).
#[test]
fn a_nonblocking_creation_that_answers_success_is_still_nonblocking() {
    let settled = ("HWQUEUE_FAKE_NCCL_INIT_SETTLED", "1");
    for (case, extra) in [
        ("works", vec![(NCCL_FAKE, "so"), settled]),
        (
            "forced",
            vec![(NCCL_FAKE, "so"), settled, ("NCCL_COMM_BLOCKING", "0")],
        ),
    ] {
        let scenario = format!("nccl_nonblocking:{case}");
        let Some(outcome) = run_scenario(&on_a_12_2_device(&scenario, &extra)) else {
            return;
        };
        assert!(
            outcome.field("split").starts_with("0 of 1 "),
            "{outcome:#?}"
        );
        assert_eq!(outcome.field("split_data"), "Ok([5, 6])", "{outcome:#?}");
        let calls = nccl_calls(&outcome);
        assert!(
            calls.contains(&"ncclCommSplit color=3 key=7 blocking=0"),
            "{calls:?}"
        );
    }
}

/// `NCCL_COMM_BLOCKING=1` makes a communicator asked to be non-blocking
/// blocking: its creation answers `ncclSuccess`, and hwqueue treats it as
/// the blocking one it is (its split passes no config).
#[test]
fn nccl_comm_blocking_1_makes_a_nonblocking_communicator_blocking() {
    let Some(outcome) = scenario_with("works", Some(("NCCL_COMM_BLOCKING", "1"))) else {
        return;
    };
    assert_eq!(outcome.field("data"), "Ok([5, 6])", "{outcome:#?}");
    assert_eq!(outcome.field("split_data"), "Ok([5, 6])", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    assert!(calls.contains(&"ncclCommSplit color=3 key=7"), "{calls:?}");
}

/// `NCCL_COMM_BLOCKING=0` on an NCCL older than 2.27 (which hwqueue's
/// threads cannot share a non-blocking communicator of): the creation is
/// settled, then aborted, and refused, saying why.
#[test]
fn nccl_comm_blocking_0_on_an_nccl_older_than_2_27_is_refused() {
    let Some(outcome) = run_scenario(&on_a_12_2_device(
        "nccl_nonblocking:forced_old_nccl",
        &[
            (NCCL_FAKE, "so"),
            ("NCCL_COMM_BLOCKING", "0"),
            ("HWQUEUE_FAKE_NCCL_VERSION", "22304"),
        ],
    )) else {
        return;
    };
    let comm = outcome.field("comm");
    assert!(comm.starts_with("Invalid "), "{outcome:#?}");
    for phrase in ["NCCL_COMM_BLOCKING=0", "2.27 or newer", "2.23.4"] {
        assert!(comm.contains(phrase), "no `{phrase}` in {comm}");
    }
    let calls = nccl_calls(&outcome);
    assert!(calls.contains(&"ncclCommAbort"), "{calls:?}");
}

/// Before 2.27, NCCL kept a non-blocking call's state in the calling
/// thread's storage, which hwqueue's threads sharing a communicator break:
/// an older NCCL is refused, saying which it is and what to do.
#[test]
fn a_nonblocking_communicator_on_an_nccl_older_than_2_27_is_refused() {
    let Some(outcome) = scenario_with("old_nccl", Some(("HWQUEUE_FAKE_NCCL_VERSION", "22304")))
    else {
        return;
    };
    let comm = outcome.field("comm");
    assert!(comm.starts_with("Invalid "), "{outcome:#?}");
    for phrase in [
        "needs NCCL 2.27 or newer, and this one is 2.23.4",
        "make a blocking one (`NcclConfig::blocking`)",
    ] {
        assert!(comm.contains(phrase), "no `{phrase}` in {comm}");
    }
    // Nothing was made.
    let calls = nccl_calls(&outcome);
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("ncclCommInitRankConfig")),
        "{calls:?}"
    );
}

#[test]
fn a_nonblocking_communicator_settles_its_creation_groups_and_splits() {
    let Some(outcome) = scenario("works", None) else {
        return;
    };
    assert_eq!(outcome.field("comm"), "nccl 0 of 1 10s", "{outcome:#?}");
    // The group's end answered ncclInProgress and settled: the batch ran.
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("data"), "Ok([5, 6])", "{outcome:#?}");
    // The split's handle came once it settled; it keeps the timeout.
    assert_eq!(outcome.field("split"), "0 of 1 10s", "{outcome:#?}");
    assert_eq!(outcome.field("no_color"), "none", "{outcome:#?}");
    assert_eq!(outcome.field("split_submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("split_data"), "Ok([5, 6])", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    for call in [
        "ncclCommInitRankConfig blocking=0 version=21800 size=48",
        "ncclCommSplit color=3 key=7 blocking=0",
        "ncclCommSplit color=-1 key=0 blocking=0",
    ] {
        assert!(calls.contains(&call), "no `{call}` in {calls:?}");
    }
    assert!(!calls.contains(&"ncclCommAbort"), "{calls:?}");
    // The parent and the split one, each destroyed once.
    let destroyed = calls.iter().filter(|c| **c == "ncclCommDestroy").count();
    assert_eq!(destroyed, 2, "{calls:?}");
}

#[test]
fn a_nonblocking_creation_that_never_settles_times_out_and_is_aborted() {
    let Some(outcome) = scenario("creation_never_settles", Some("ncclCommInitRankConfig")) else {
        return;
    };
    let comm = outcome.field("comm");
    assert!(comm.starts_with("Timeout "), "{outcome:#?}");
    assert!(
        comm.contains("the communicator's creation (ncclCommInitRankConfig, rank 0 of 1)"),
        "{comm}"
    );
    let calls = nccl_calls(&outcome);
    assert_eq!(
        calls.iter().filter(|c| **c == "ncclCommAbort").count(),
        1,
        "{calls:?}"
    );
}

#[test]
fn a_nonblocking_split_that_never_settles_times_out_and_breaks_the_parent() {
    let Some(outcome) = scenario("split_never_settles", Some("ncclCommSplit")) else {
        return;
    };
    let split = outcome.field("split");
    assert!(split.starts_with("Timeout "), "{outcome:#?}");
    assert!(
        split.contains("the split of the communicator (ncclCommSplit) did not complete"),
        "{split}"
    );
    // The parent is broken: its next collective fails at once.
    let after = outcome.field("after");
    assert!(after.starts_with("Broken "), "{outcome:#?}");
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    // The parent was aborted (which wrote the split's handle out), then
    // the split's new communicator; neither destroyed after its abort.
    let calls = nccl_calls(&outcome);
    let aborted = calls.iter().filter(|c| **c == "ncclCommAbort").count();
    assert_eq!(aborted, 2, "{calls:?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{calls:?}");
}

#[test]
fn a_nonblocking_group_launch_that_never_settles_fails_its_batch_with_a_timeout() {
    let Some(outcome) = scenario("launch_never_settles", Some("ncclGroupEnd")) else {
        return;
    };
    let done = outcome.field("done");
    assert!(done.starts_with("Timeout "), "{outcome:#?}");
    assert!(done.contains("(its launch: ncclGroupEnd)"), "{done}");
    assert!(
        outcome.field("synchronize").starts_with("Timeout "),
        "{outcome:#?}"
    );
    assert!(
        outcome.field("split_after").starts_with("Broken "),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    let aborted = calls.iter().filter(|c| **c == "ncclCommAbort").count();
    assert_eq!(aborted, 1, "{calls:?}");
}
