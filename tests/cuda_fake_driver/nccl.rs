//! Issue 48's NCCL under CUDA queues, on the fake driver and the fake NCCL
//! (`tests/fake_cuda/libnccl.c`, one rank: each collective copies its send
//! view to its receive view, and logs its stream and group depth to the
//! call log): collectives recorded between an upload and a download run on
//! the queue's stream, grouped, ordered by a signal, and move the data; an
//! NCCL error fails the batch from that command with a typed error; a
//! missing NCCL is an error saying how to install it (never a panic); a
//! communicator of another device, or on a CPU queue, is refused; a split
//! gives the fake's rank and size, or none for no color; a collective that
//! never completes (`HWQUEUE_FAKE_NCCL_HANG`: it stalls its stream until
//! `ncclCommAbort`) fails its batch's signal with a typed timeout, breaks
//! the communicator, and leaves nothing hanging on drop.

use std::time::Duration;

use hwqueue::collective::{CollectiveError, Communicator, NcclId, Reduction};
use hwqueue::cpu::CpuDevice;
use hwqueue::cuda::{CudaBuffer, CudaDevice, CudaQueue, CudaSignal};
use hwqueue::{
    Device, Download, Error, FailureScope, HardwareQueue, QueueFactory, Schedule, TimelineSignal,
};

use super::{NCCL_FAKE, Outcome, on_a_12_2_device, report, run_scenario};

const LONG: Duration = Duration::from_secs(10);

/// `Ok` as `ok`, an error as `<variant> <Display>`: the variant of its
/// root cause ([`CollectiveError`]'s where it is one), `Display` its own.
pub(super) fn outcome<T>(result: Result<T, Error>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(error) => {
            let variant = match error.root_cause() {
                Error::Collective(CollectiveError::NoNccl { .. }) => "NoNccl",
                Error::Collective(CollectiveError::Nccl { .. }) => "Nccl",
                Error::Collective(CollectiveError::Unsupported { .. }) => "Unsupported",
                Error::Collective(CollectiveError::Invalid { .. }) => "Invalid",
                Error::Collective(CollectiveError::Timeout { .. }) => "Timeout",
                Error::Collective(CollectiveError::Broken { .. }) => "Broken",
                Error::DeviceMismatch { .. } => "DeviceMismatch",
                _ => "other",
            };
            format!("{variant} {error}")
        }
    }
}

/// The child's half: `case` names what to do on `device`.
pub(super) fn run(device: &CudaDevice, case: &str) {
    match case {
        "collectives" => collectives(device),
        "fails" => fails(device),
        "unwatched" => unwatched(device),
        "absent" => {
            report("single", &outcome(Communicator::nccl_single(device)));
            report("id", &outcome(NcclId::new()));
        }
        "elsewhere" => elsewhere(device),
        "plan" => plan(device),
        "split" => split(device),
        "split_fails" => {
            let comm = Communicator::nccl_single(device).unwrap();
            report("split", &outcome(comm.split(Some(1), 0)));
            report("split_again", &outcome(comm.split(Some(1), 0)));
        }
        "idle_error" => {
            let comm = Communicator::nccl_single(device);
            report("comm", &outcome(comm.map(drop)));
        }
        "hang" => hang(device),
        "async_error" => async_error(device),
        "hang_beside" => hang_beside(device),
        "launch_blocks" => launch_blocks(device),
        "launches_block" => launches_block(device),
        "hang_behind" => hang_behind(device),
        "hang_gate" => hang_gate(device),
        "hang_behind_threads" => hang_behind_threads(device),
        "many_groups" => many_groups(device),
        "skipped" => skipped(device),
        "skipped_unsettled" => skipped_unsettled(device),
        "stalled" => stalled(device),
        #[cfg(feature = "mpi")]
        "over_mpi" => over_mpi(device),
        #[cfg(feature = "half")]
        "half" => half(device),
        other => panic!("no NCCL case `{other}`"),
    }
}

/// Uploads on one queue, then on a second queue (after a signal of the
/// first): `all_reduce` (sum), `all_gather`, `broadcast`, `reduce_scatter`
/// of one rank, each into a buffer of its own, and downloads them.
fn collectives(device: &CudaDevice) {
    let comm = match Communicator::nccl_single(device) {
        Ok(comm) => comm,
        Err(error) => return report("comm", &outcome::<()>(Err(error))),
    };
    report(
        "comm",
        &format!("{} {} of {}", comm.engine(), comm.rank(), comm.size()),
    );
    let data = [1.5f32, -2.0, 3.25, 8.0];
    let buffer = || device.alloc(16).unwrap();
    let (input, summed, gathered, scattered) = (buffer(), buffer(), buffer(), buffer());
    let words = device.alloc(16).unwrap();
    let uploaded = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut uploads = device.compute_queue().unwrap();
    uploads
        .upload(&input, &data)
        .upload(&words, &[7u32, 8, 9, 10])
        .signal(&uploaded, 1)
        .submit()
        .unwrap();
    let mut queue = device.compute_queue().unwrap();
    report(
        "stream",
        &format!("{:p}", queue.engine().stream().cu_stream()),
    );
    report(
        "upload_stream",
        &format!("{:p}", uploads.engine().stream().cu_stream()),
    );
    let downloads: Vec<Download<f32>> = (0..3).map(|_| Download::new(4)).collect();
    let words_back = Download::<u32>::new(4);
    let submitted = queue
        .wait(&uploaded, 1)
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &summed)
        .all_gather::<f32, _, _>(&comm, &input, &gathered)
        .broadcast::<u32, _>(&comm, 0, &words)
        .reduce_scatter::<f32, _, _>(&comm, Reduction::Max, &input, &scattered)
        .signal(&done, 1)
        .download(&summed, &downloads[0])
        .download(&gathered, &downloads[1])
        .download(&scattered, &downloads[2])
        .download(&words, &words_back)
        .submit();
    report("submit", &outcome(submitted));
    report("done", &outcome(done.wait(1, LONG)));
    let taken: Vec<String> = downloads
        .iter()
        .map(|d| format!("{:?}", d.take(LONG).unwrap()))
        .collect();
    report("floats", &taken.join(" "));
    report("words", &format!("{:?}", words_back.take(LONG).unwrap()));
    report("synchronize", &outcome(queue.synchronize()));
}

/// An f16 `all_reduce` and a bf16 `all_gather` of one rank: NCCL's own
/// 16-bit types, so the calls move 2 bytes an element.
#[cfg(feature = "half")]
fn half(device: &CudaDevice) {
    use half::{bf16, f16};
    let comm = Communicator::nccl_single(device).unwrap();
    let halves = [1.5f32, -2.0, 3.25, 8.0].map(f16::from_f32);
    let brains = [0.5f32, 4.0, -1.0, 6.5].map(bf16::from_f32);
    let (a, b, c, d) = (
        device.alloc(8).unwrap(),
        device.alloc(8).unwrap(),
        device.alloc(8).unwrap(),
        device.alloc(8).unwrap(),
    );
    let (got_halves, got_brains) = (Download::<f16>::new(4), Download::<bf16>::new(4));
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .upload(&a, &halves)
        .upload(&c, &brains)
        .all_reduce::<f16, _, _>(&comm, Reduction::Sum, &a, &b)
        .all_gather::<bf16, _, _>(&comm, &c, &d)
        .download(&b, &got_halves)
        .download(&d, &got_brains)
        .submit();
    report("submit", &outcome(submitted));
    report("synchronize", &outcome(queue.synchronize()));
    let back = |values: Vec<f32>| format!("{values:?}");
    report(
        "halves",
        &back(
            got_halves
                .take(LONG)
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect(),
        ),
    );
    report(
        "brains",
        &back(
            got_brains
                .take(LONG)
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect(),
        ),
    );
}

/// The fake fails `ncclAllGather` (`HWQUEUE_FAKE_NCCL_FAIL`): the batch
/// fails from it; the signal before it is set, the one after it failed.
/// Then an all_reduce alone (`again`): NCCL launched none of the failed
/// group, where the peers may have launched theirs, so the communicator
/// is broken.
fn fails(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let (before, after) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .signal(&before, 1)
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .all_gather::<u32, _, _>(&comm, &input, &output)
        .signal(&after, 1)
        .submit();
    report("submit", &outcome(submitted));
    report("before", &outcome(before.wait(1, LONG)));
    report("after", &outcome(after.wait(1, LONG)));
    report("synchronize", &outcome(queue.synchronize()));
    let again = device.new_signal(0).unwrap();
    queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&again, 1)
        .submit()
        .unwrap();
    report("again", &outcome(again.wait(1, LONG)));
}

/// `signal(a, 1)`, an all_reduce, `signal(b, 1)`, where the fake refuses
/// every event record after `a`'s (HWQUEUE_FAKE_FAULT_AFTER): the group is
/// on the stream, but the event its watch needs is not recorded.
fn unwatched(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (
        device.alloc_uninit(16).unwrap(),
        device.alloc_uninit(16).unwrap(),
    );
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .signal(&a, 1)
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&b, 1)
        .submit();
    report("submit", &outcome(submitted));
    report("b", &outcome(b.wait(1, LONG)));
    report("synchronize", &format!("{:?}", queue.synchronize()));
}

/// A communicator of device 1 on a queue of device 0, and on a CPU queue.
fn elsewhere(device: &CudaDevice) {
    let other = CudaDevice::open(1).unwrap();
    let comm = Communicator::nccl_single(&other).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &output)
        .submit();
    report("cuda_queue", &outcome(submitted));
    let cpu = CpuDevice::new();
    let (input, output) = (cpu.alloc(16).unwrap(), cpu.alloc(16).unwrap());
    let mut queue = cpu.compute_queue().unwrap();
    let submitted = queue
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &output)
        .submit();
    report("cpu_queue", &outcome(submitted));
    // Each refusal took its place: the peers' all_reduce does not pair
    // with this one, on the communicator's own device.
    let (input, output) = (other.alloc(16).unwrap(), other.alloc(16).unwrap());
    let mut queue = other.compute_queue().unwrap();
    let submitted = queue
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &output)
        .submit()
        .and_then(|()| queue.synchronize());
    report("after", &outcome(submitted));
    // A plan is refused when planned, not at its first run.
    let mut schedule = Schedule::<hwqueue::cuda::Cuda>::new();
    let d = schedule.add_device(std::sync::Arc::new(device.clone()));
    let (a, b) = (
        schedule.add_tensor(d, "a", 16),
        schedule.add_tensor(d, "b", 16),
    );
    schedule.fill("fill a", a, 0u32);
    schedule.all_reduce::<f32>("sum on cuda:0", &comm, Reduction::Sum, a, b);
    report("cuda_plan", &outcome(schedule.plan()));
    let mut schedule = Schedule::<hwqueue::cpu::Cpu>::new();
    let d = schedule.add_device(std::sync::Arc::new(cpu));
    let (a, b) = (
        schedule.add_tensor(d, "a", 16),
        schedule.add_tensor(d, "b", 16),
    );
    schedule.fill("fill a", a, 0u32);
    schedule.all_reduce::<f32>("sum on the cpu", &comm, Reduction::Sum, a, b);
    report("cpu_plan", &outcome(schedule.plan()));
}

/// `Communicator::nccl_over` an MPI world of one rank (a singleton MPI
/// process): rank 0 makes the id, the world carries it, and an all_reduce
/// runs; a world that is not MPI's is refused.
#[cfg(feature = "mpi")]
fn over_mpi(device: &CudaDevice) {
    let mpi = hwqueue::collective::Mpi::init().unwrap();
    let world = mpi.world(None).unwrap();
    report("world", &format!("{} of {}", world.rank(), world.size()));
    let comm = match Communicator::nccl_over(&world, device) {
        Ok(comm) => comm,
        Err(error) => return report("comm", &outcome::<()>(Err(error))),
    };
    report(
        "comm",
        &format!("{} {} of {}", comm.engine(), comm.rank(), comm.size()),
    );
    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
    let back = Download::<i32>::new(2);
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&input, &[-3i32, 4])
        .all_reduce::<i32, _, _>(&comm, Reduction::Sum, &input, &output)
        .download(&output, &back)
        .submit()
        .unwrap();
    report("data", &format!("{:?}", back.take(LONG).unwrap()));
    report("not_mpi", &outcome(Communicator::nccl_over(&comm, device)));
}

/// `split` of a communicator of one rank: a color gives the one rank of
/// its group (`nccl 0 of 1`, on the same device), over which an
/// `all_reduce` runs; no color gives none; a color NCCL's `int` cannot
/// hold is refused before NCCL is called.
fn split(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    comm.set_timeout(Duration::from_secs(7));
    let describe = |split: hwqueue::Result<Option<Communicator>>| match split {
        Ok(Some(comm)) => format!("{} {} of {}", comm.engine(), comm.rank(), comm.size()),
        Ok(None) => "none".to_owned(),
        Err(error) => outcome::<()>(Err(error)),
    };
    let half = comm.split(Some(3), 7);
    report("split", &describe(half.clone()));
    report("no_color", &describe(comm.split(None, 0)));
    report("huge_color", &describe(comm.split(Some(u32::MAX), 0)));
    let Ok(Some(half)) = half else {
        return;
    };
    report("split_timeout", &format!("{:?}", half.timeout()));
    report(
        "same_device",
        &format!(
            "{}",
            half.nccl_device().is_some_and(|d| d.same_as(device)) && !half.same_as(&comm)
        ),
    );
    let (input, output) = (device.alloc(8).unwrap(), device.alloc(8).unwrap());
    let back = Download::<u32>::new(2);
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .upload(&input, &[5u32, 6])
        .all_reduce::<u32, _, _>(&half, Reduction::Sum, &input, &output)
        .download(&output, &back)
        .submit();
    report("submit", &outcome(submitted));
    report("data", &format!("{:?}", back.take(LONG)));
    // The batch lets go of the split communicator once retired: both are
    // destroyed before the process ends.
    report("synchronize", &outcome(queue.synchronize()));
    drop((queue, half, comm));
}

/// Two queues of `device`, the first (`stuck`) with an all-gather over
/// `comm` of `input` into `output` submitted, then `gathered` signalled:
/// what the scenarios that run beside a (hanging) all-gather start from.
struct Beside {
    input: CudaBuffer,
    output: CudaBuffer,
    gathered: CudaSignal,
    stuck: CudaQueue,
    other: CudaQueue,
}

/// A communicator of one rank that times out after 200 ms, and an
/// all-gather over it ([`beside_an_all_gather`]).
fn timing_out_beside(device: &CudaDevice) -> (Communicator, Beside) {
    let comm = Communicator::nccl_single(device).unwrap();
    comm.set_timeout(Duration::from_millis(200));
    let beside = beside_an_all_gather(device, &comm);
    (comm, beside)
}

fn beside_an_all_gather(device: &CudaDevice, comm: &Communicator) -> Beside {
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let gathered = device.new_signal(0).unwrap();
    let (mut stuck, other) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    stuck
        .all_gather::<u32, _, _>(comm, &input, &output)
        .signal(&gathered, 1)
        .submit()
        .unwrap();
    Beside {
        input,
        output,
        gathered,
        stuck,
        other,
    }
}

/// A group that stays in flight on one queue (the fake's `ncclAllGather`
/// hangs for a second), so the watchdog looks only every 10 ms; then fifty
/// batches of an all-reduce and a signal on another queue, one after the
/// other (the fake completes each at once): how many groups that queue's
/// stream still hands its batches to after each (`followed`: the most).
fn many_groups(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let Beside {
        input,
        output,
        gathered,
        stuck: _stuck,
        other: mut queue,
    } = beside_an_all_gather(device, &comm);
    let done = device.new_signal(0).unwrap();
    let mut most = 0;
    for value in 1..=50 {
        queue
            .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
            .signal(&done, value)
            .submit()
            .unwrap();
        most = most.max(queue.engine().nccl_groups_followed());
    }
    report("followed", &most.to_string());
    report("done", &outcome(done.wait(50, LONG)));
    report("gathered", &outcome(gathered.wait(1, LONG)));
}

/// The fake's `ncclAllReduce` never completes (`HWQUEUE_FAKE_NCCL_HANG`):
/// with a 200 ms timeout, a host wait on the signal after it returns the
/// watchdog's typed error (`wait` is how long that took to come, well
/// under [`LONG`], and not asserted); `synchronize` reports it; the next
/// collective, and a split, find the communicator broken; then the queue
/// and the communicator drop (`dropped`: it returned).
fn hang(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    comm.set_timeout(Duration::from_millis(200));
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let (reduced, later) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .upload(&input, &[1u32, 2, 3, 4])
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&reduced, 1)
        .submit();
    report("submit", &outcome(submitted));
    let start = std::time::Instant::now();
    report("reduced", &outcome(reduced.wait(1, LONG)));
    report("wait", &format!("{:?}", start.elapsed()));
    report("value", &reduced.value().to_string());
    report("synchronize", &outcome(queue.synchronize()));
    let submitted = queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&later, 1)
        .submit();
    report("submit_after", &outcome(submitted));
    report("later", &outcome(later.wait(1, LONG)));
    report("split_after", &outcome(comm.split(Some(0), 0)));
    // The stream lets go of the batch (and its handle to the
    // communicator) before the communicator is dropped: then the drop is
    // the last, and it aborts the communicator here if the watchdog did
    // not (its look may have found the call lock held by the split, and
    // its thread ends with the drop). Without it, the queue's worker could
    // drop the last handle after this process reported and exited.
    let _ = queue.synchronize();
    drop(queue);
    drop(comm);
    report("dropped", "ok");
}

/// Two queues share a communicator; the fake's `ncclAllGather` never
/// completes, its `ncclAllReduce` does: the queue whose all_gather timed
/// out fails with the timeout, the other queue's all_reduce (done) keeps
/// its signal and its queue reports nothing.
fn hang_beside(device: &CudaDevice) {
    let (
        comm,
        Beside {
            input,
            output,
            gathered,
            mut stuck,
            other: mut fine,
        },
    ) = timing_out_beside(device);
    let reduced = device.new_signal(0).unwrap();
    fine.all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&reduced, 1)
        .submit()
        .unwrap();
    report("reduced", &outcome(reduced.wait(1, LONG)));
    report("gathered", &outcome(gathered.wait(1, LONG)));
    report("fine_synchronize", &outcome(fine.synchronize()));
    report("stuck_synchronize", &outcome(stuck.synchronize()));
    drop((stuck, fine, comm));
    report("dropped", "ok");
}

/// An all-gather hangs on one queue's stream while another queue's
/// launch (`ncclGroupEnd`, on a thread of its own) blocks the host for
/// three seconds holding the communicator's call lock. The all-gather's
/// signal, waited for two seconds once that launch blocks (`gathered`),
/// then the other queue's (`reduced`).
fn launch_blocks(device: &CudaDevice) {
    let (
        comm,
        Beside {
            input,
            output,
            gathered,
            stuck,
            other: blocked,
        },
    ) = timing_out_beside(device);
    let reduced = device.new_signal(0).unwrap();
    let launcher = {
        let (comm, reduced) = (comm.clone(), reduced.clone());
        submit_on_thread(blocked, move |queue| {
            queue
                .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
                .signal(&reduced, 1);
        })
    };
    // Gated on the fake's log: the launch is blocked, holding the lock.
    logged("ncclGroupEnd blocks the host");
    report(
        "gathered",
        &outcome(gathered.wait(1, Duration::from_secs(2))),
    );
    let (mut blocked, submitted) = launcher.join().unwrap();
    report("blocked_submit", &submitted);
    report("reduced", &outcome(reduced.wait(1, LONG)));
    // Once the lock is free, the watchdog aborts: later collectives fail.
    logged("ncclCommAbort");
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let after = blocked
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .submit();
    report(
        "after",
        &outcome(after.and_then(|()| blocked.synchronize())),
    );
    drop((stuck, blocked, comm));
    report("dropped", "ok");
}

/// As `launch_blocks`, with both further launches all-gathers (which
/// the fake hangs on the stream): the second's `ncclGroupEnd` blocks for
/// three seconds holding the call lock, and a third queue's launch waits
/// for the lock meanwhile, and would block too. Once the second returns:
/// its group's signal, waited for two seconds (`second`), and the third's
/// (`third`).
fn launches_block(device: &CudaDevice) {
    let (
        comm,
        Beside {
            input,
            output,
            gathered,
            stuck,
            other,
        },
    ) = timing_out_beside(device);
    let launch = |queue: CudaQueue| {
        let (comm, done) = (comm.clone(), device.new_signal(0).unwrap());
        let (input, output) = (input.clone(), output.clone());
        let signal = done.clone();
        let thread = submit_on_thread(queue, move |queue| {
            queue
                .all_gather::<u32, _, _>(&comm, &input, &output)
                .signal(&signal, 1);
        });
        (thread, done)
    };
    let (second, second_done) = launch(other);
    logged("ncclGroupEnd blocks the host");
    let (third, third_done) = launch(device.compute_queue().unwrap());
    report("gathered", &outcome(gathered.wait(1, LONG)));
    // The third returns while the second still blocks (the fake holds it
    // until the gate file exists, or for its seconds).
    let (returned, third_returned) = std::sync::mpsc::channel();
    let third = std::thread::spawn(move || {
        let joined = third.join().unwrap();
        let _ = returned.send(());
        joined
    });
    let in_time = third_returned.recv_timeout(LONG).is_ok();
    report("third_while_blocked", &in_time.to_string());
    // A queue's settled wait on the abandoned value waits, on the device,
    // for the aborted group to exit: not before the abort, which needs the
    // blocked launch's lock.
    let (mut fourth, settled) = (
        device.compute_queue().unwrap(),
        device.new_signal(0).unwrap(),
    );
    let submitted = (fourth.wait_settled(&gathered, 1).signal(&settled, 1)).submit();
    report("fourth_submit", &outcome(submitted));
    let early = settled.wait(1, Duration::from_millis(300));
    report("settled_while_blocked", &outcome(early));
    let log = std::env::var("HWQUEUE_FAKE_CALLS").unwrap();
    std::fs::write(format!("{log}.release"), "").unwrap();
    report("settled", &outcome(settled.wait(1, LONG)));
    let (second_queue, submitted) = second.join().unwrap();
    report("second_submit", &submitted);
    report(
        "second",
        &outcome(second_done.wait(1, Duration::from_secs(2))),
    );
    let (third_queue, submitted) = third.join().unwrap();
    report("third_submit", &submitted);
    report("third", &outcome(third_done.wait(1, LONG)));
    drop((stuck, second_queue, third_queue, fourth, comm));
    report("dropped", "ok");
}

/// Records on `queue` what `record` says and submits it, on a thread of
/// its own (a launch that may block the host); the queue back, and how
/// the submit ended.
fn submit_on_thread(
    mut queue: CudaQueue,
    record: impl FnOnce(&mut CudaQueue) + Send + 'static,
) -> std::thread::JoinHandle<(CudaQueue, String)> {
    std::thread::spawn(move || {
        record(&mut queue);
        let submitted = queue.submit();
        (queue, outcome(submitted))
    })
}

/// Waits (at most `LONG`) until the fake's call log holds `line`.
fn logged(line: &str) {
    let log = std::env::var("HWQUEUE_FAKE_CALLS").unwrap();
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(line)
    {
        assert!(start.elapsed() < LONG, "the fake never logged `{line}`");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The fake's `ncclAllReduce` never completes; the queue puts two more
/// batches on its stream behind it before the watchdog's abort (a signal
/// alone, and an upload and a signal), whose events complete once the
/// abort lets the stream go on. Under each [`FailureScope`]
/// (`<scope>_<key>`): how the three signals end, what a `submit` right
/// after them reports (`told`), and its batch, submitted again (`fresh`).
fn hang_behind(device: &CudaDevice) {
    for (scope, name) in [
        (FailureScope::Queue, "queue"),
        (FailureScope::Batch, "batch"),
    ] {
        let comm = Communicator::nccl_single(device).unwrap();
        comm.set_timeout(Duration::from_millis(200));
        let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
        let signal = || device.new_signal(0).unwrap();
        let (reduced, alone, uploaded, fresh) = (signal(), signal(), signal(), signal());
        let mut queue = device.compute_queue().unwrap();
        queue.set_failure_scope(scope).unwrap();
        queue
            .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
            .signal(&reduced, 1)
            .submit()
            .unwrap();
        queue.signal(&alone, 1).submit().unwrap();
        queue
            .upload(&input, &[5u32, 6, 7, 8])
            .signal(&uploaded, 1)
            .submit()
            .unwrap();
        for (key, signal) in [
            ("reduced", &reduced),
            ("alone", &alone),
            ("uploaded", &uploaded),
        ] {
            report(&format!("{name}_{key}"), &outcome(signal.wait(1, LONG)));
        }
        // Right after a failed signal: the submit is told, and keeps its
        // batch for the next.
        let told = queue.signal(&fresh, 1).submit();
        report(&format!("{name}_told"), &outcome(told));
        report(&format!("{name}_resubmit"), &outcome(queue.submit()));
        report(&format!("{name}_fresh"), &outcome(fresh.wait(1, LONG)));
        drop((queue, comm));
    }
}

/// Two threads, each with a queue of its own on one communicator whose
/// `ncclAllReduce` never completes: each records an `all_reduce` and a
/// signal, then a batch behind it (a signal alone). One abort breaks both
/// groups; reports how each thread's two signals end (`<thread>_reduced`,
/// `<thread>_behind`).
fn hang_behind_threads(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    comm.set_timeout(Duration::from_millis(200));
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let comm = &comm;
                scope.spawn(move || {
                    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
                    let (reduced, behind) =
                        (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
                    let mut queue = device.compute_queue().unwrap();
                    queue
                        .all_reduce::<u32, _, _>(comm, Reduction::Sum, &input, &output)
                        .signal(&reduced, 1)
                        .submit()
                        .unwrap();
                    queue.signal(&behind, 1).submit().unwrap();
                    let outcomes = (
                        outcome(reduced.wait(1, LONG)),
                        outcome(behind.wait(1, LONG)),
                    );
                    drop(queue);
                    outcomes
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    for (index, (reduced, behind)) in outcomes.iter().enumerate() {
        report(&format!("{index}_reduced"), reduced);
        report(&format!("{index}_behind"), behind);
    }
    drop(comm);
}

/// The fake's `ncclAllReduce` never completes; behind it the queue puts a
/// batch that waits for `gate` (not recorded anywhere: the worker takes
/// the batch over and blocks) and then signals `after`. The watchdog's
/// abort fails `after` while it is not recorded yet; then the host sets
/// `gate`, and the worker records `after`, whose event completes. Reports
/// how `reduced` and `after` end, and `after`'s value.
fn hang_gate(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    comm.set_timeout(Duration::from_millis(200));
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let signal = || device.new_signal(0).unwrap();
    let (reduced, gate, after) = (signal(), signal(), signal());
    let mut queue = device.compute_queue().unwrap();
    queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&reduced, 1)
        .submit()
        .unwrap();
    queue.wait(&gate, 1).signal(&after, 1).submit().unwrap();
    report("reduced", &outcome(reduced.wait(1, LONG)));
    gate.set(1);
    // The worker records `after` once it sees the gate; the stream has
    // passed everything once `synchronize` returns (it reports the
    // timeout).
    report("synchronize", &outcome(queue.synchronize()));
    report("after", &outcome(after.wait(1, LONG)));
    report("after_value", &after.value().to_string());
    drop((queue, comm));
}

/// The fake's `ncclAllReduce` never completes, and NCCL reports an
/// asynchronous error for it (`HWQUEUE_FAKE_NCCL_ASYNC_ERROR`, as for a
/// peer's failure) long before the minute's timeout: the signal after it
/// fails with that error, and the communicator is broken.
fn async_error(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let reduced = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let submitted = queue
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&reduced, 1)
        .submit();
    report("submit", &outcome(submitted));
    report("reduced", &outcome(reduced.wait(1, LONG)));
    report("split_after", &outcome(comm.split(Some(0), 0)));
    // The stream lets go of the batch (and its handle to the
    // communicator) before the communicator is dropped: then the drop is
    // the last, and it aborts the communicator here if the watchdog did
    // not (its look may have found the call lock held by the split, and
    // its thread ends with the drop). Without it, the queue's worker could
    // drop the last handle after this process reported and exited.
    let _ = queue.synchronize();
    drop(queue);
    drop(comm);
    report("dropped", "ok");
}

/// A plan on the CUDA device: upload `x`, all_reduce it into `sum`,
/// all_gather `sum` into `all`, download `all`; run three times with new
/// data. Reports `runs` (`ok`, or the first wrong run).
fn plan(device: &CudaDevice) {
    use hwqueue::{Schedule, cuda::Cuda};
    let comm = Communicator::nccl_single(device).unwrap();
    let mut schedule = Schedule::<Cuda>::new();
    let d = schedule.add_device(std::sync::Arc::new(device.clone()));
    let tensor = |schedule: &mut Schedule<Cuda>, name| schedule.add_tensor(d, name, 64 * 4);
    let (x, sum, all) = (
        tensor(&mut schedule, "x"),
        tensor(&mut schedule, "sum"),
        tensor(&mut schedule, "all"),
    );
    let up = schedule.upload("upload x", x).id();
    schedule.all_reduce::<u32>("sum x", &comm, Reduction::Sum, x, sum);
    schedule.all_gather::<u32>("gather sum", &comm, sum, all);
    let down = schedule.download("download all", all).id();
    let mut plan = schedule.plan().unwrap();
    let mut runs = "ok".to_owned();
    for run in 0..3u32 {
        let data: Vec<u32> = (0..64).map(|i| i * 10 + run).collect();
        let out = Download::<u32>::new(64);
        let outcome = plan
            .upload(up, &data)
            .and_then(|()| plan.download(down, &out))
            .and_then(|()| plan.run())
            .and_then(|run| run.wait(LONG))
            .and_then(|()| out.take(LONG));
        match outcome {
            Ok(words) if words == data => {}
            Ok(words) => runs = format!("run {run} brought back {words:?}"),
            Err(error) => runs = format!("run {run}: {error}"),
        }
        if runs != "ok" {
            break;
        }
    }
    report("runs", &runs);
}

/// Under `FailureScope::Batch`: `signal(a, 1)` alone, then a batch of a
/// wait on a failed value, an all_reduce and `signal(b, 1)`, which fails
/// at its wait on the worker, where the fake fails the stream wait (not
/// sticky), so that its values stay unsettled until `a`'s delayed work
/// completes; then at once a batch of an all_reduce on the same
/// communicator and `signal(c, 1)` (`c`: how it ended).
fn skipped_unsettled(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let (a, b, c) = (
        device.new_signal(0).unwrap(),
        device.new_signal(0).unwrap(),
        device.new_signal(0).unwrap(),
    );
    let failed = device.new_signal(0).unwrap();
    failed.fail(
        1,
        Error::KernelFailed {
            program: "elsewhere".into(),
            message: "failed on another queue".into(),
        },
    );
    let mut queue = device.compute_queue().unwrap();
    queue.set_failure_scope(FailureScope::Batch).unwrap();
    queue.signal(&a, 1).submit().unwrap();
    queue
        .wait(&failed, 1)
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&b, 1)
        .submit()
        .unwrap();
    queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&c, 1);
    // The worker may fail the batch before first, and its failure is then
    // reported here (the batch stays recorded): submitted again.
    let mut submitted = queue.submit();
    if let Err(Error::QueueFailed { .. }) = submitted {
        submitted = queue.submit();
    }
    submitted.unwrap();
    report("c", &outcome(c.wait(1, LONG)));
    report("a_reached", &a.is_reached(1).to_string());
}

/// A queue that takes no more work (stalled: from the first upload on,
/// nothing tells when work is done, and 70 uploads are put behind it),
/// then a batch of an all_reduce on it, which its `submit` lets go unrun
/// (`stalled`: what that submit said). Everything is dropped after.
fn stalled(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let mut queue = device.compute_queue().unwrap();
    let refuses = |submitted: &hwqueue::Result<()>| {
        matches!(submitted, Err(Error::QueueFailed { cause })
            if matches!(**cause, Error::QueueStalled { .. }))
    };
    let stalled = (0..200).any(|_| {
        let submitted = queue.upload_vec(&input, vec![1u32; 4]).submit();
        refuses(&submitted)
    });
    report("stalled", &stalled.to_string());
    queue.all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output);
    report("refused", &refuses(&queue.submit()).to_string());
}

/// A collective this rank does not run, where its peers run theirs: an
/// all_reduce behind a wait whose signal the host fails (its batch fails
/// before it), then one refused when recorded (its output too short);
/// each communicator's next all_reduce (`again`, `refused_again`).
fn skipped(device: &CudaDevice) {
    let comm = Communicator::nccl_single(device).unwrap();
    let (input, output) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let (gate, done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut queue = device.compute_queue().unwrap();
    // Discarded, it never took a place: the communicator stays whole.
    queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&done, 1)
        .discard();
    let kept = device.new_signal(0).unwrap();
    let submitted = queue
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&kept, 1)
        .submit();
    report(
        "discarded",
        &outcome(submitted.and_then(|()| kept.wait(1, LONG))),
    );
    let done = device.new_signal(0).unwrap();
    let submitted = queue
        .wait(&gate, 1)
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&done, 1)
        .submit();
    report("submit", &outcome(submitted));
    gate.fail(
        1,
        Error::Abandoned {
            reason: "the gate's producer gave up",
        },
    );
    report("done", &outcome(done.wait(1, LONG)));
    report("synchronize", &outcome(queue.synchronize()));
    let again = device.new_signal(0).unwrap();
    let mut other = device.compute_queue().unwrap();
    other
        .all_reduce::<u32, _, _>(&comm, Reduction::Sum, &input, &output)
        .signal(&again, 1)
        .submit()
        .unwrap();
    report("again", &outcome(again.wait(1, LONG)));
    report("reported", &outcome(other.synchronize()));

    let refusing = Communicator::nccl_single(device).unwrap();
    let short = device.alloc(8).unwrap();
    let refused = other
        .all_reduce::<u32, _, _>(&refusing, Reduction::Sum, &input, &short)
        .submit();
    report("refused", &outcome(refused));
    let after = device.new_signal(0).unwrap();
    other
        .all_reduce::<u32, _, _>(&refusing, Reduction::Sum, &input, &output)
        .signal(&after, 1)
        .submit()
        .unwrap();
    report("refused_again", &outcome(after.wait(1, LONG)));
}

/// The fake NCCL's log lines (`ncclAllReduce stream=0x... group=1 ...`).
/// f16 and bf16 go to NCCL as its own 16-bit types: each of 4 elements
/// comes back whole (a wrong element size would move 8 or 16 bytes).
#[cfg(feature = "half")]
#[test]
fn f16_and_bf16_collectives_move_two_bytes_an_element() {
    let vars = on_a_12_2_device("nccl:half", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("synchronize"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("halves"), "[1.5, -2.0, 3.25, 8.0]");
    assert_eq!(outcome.field("brains"), "[0.5, 4.0, -1.0, 6.5]");
    let calls = nccl_calls(&outcome);
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("ncclAllReduce") && c.ends_with("count=4")),
        "{calls:?}"
    );
}

pub(super) fn nccl_calls(outcome: &Outcome) -> Vec<&str> {
    let calls = outcome.calls.iter().map(String::as_str);
    calls.filter(|call| call.starts_with("nccl")).collect()
}

#[test]
fn collectives_run_on_the_queues_stream_in_one_group_and_move_the_data() {
    let vars = on_a_12_2_device("nccl:collectives", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("comm"), "nccl 0 of 1", "{outcome:#?}");
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("done"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("synchronize"), "ok", "{outcome:#?}");
    // One rank: a sum, a gather, a max-scatter and a broadcast all copy.
    let row = "[1.5, -2.0, 3.25, 8.0]";
    assert_eq!(outcome.field("floats"), format!("{row} {row} {row}"));
    assert_eq!(outcome.field("words"), "[7, 8, 9, 10]");
    let stream = outcome.field("stream");
    assert_ne!(stream, outcome.field("upload_stream"), "{outcome:#?}");
    // The four in one group, on the queue's stream, in recorded order.
    let calls = nccl_calls(&outcome);
    let expected = [
        "ncclCommInitAll".to_owned(),
        "ncclGroupStart".to_owned(),
        format!("ncclAllReduce stream={stream} group=1 count=4"),
        format!("ncclAllGather stream={stream} group=1 count=4"),
        format!("ncclBroadcast stream={stream} group=1 count=4"),
        format!("ncclReduceScatter stream={stream} group=1 count=4"),
        "ncclGroupEnd".to_owned(),
        "ncclCommDestroy".to_owned(),
    ];
    assert_eq!(calls, expected, "{outcome:#?}");
}

#[test]
fn a_plan_runs_its_collectives_on_a_cuda_queue_each_run() {
    let vars = on_a_12_2_device("nccl:plan", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    // Each run: both collectives, each in a group of its own (the plan
    // records a signal after each operation, and a group never spans a
    // signal), all on one stream.
    let calls = nccl_calls(&outcome);
    let ops: Vec<_> = calls.iter().filter(|c| c.contains(" stream=")).collect();
    let starts = calls.iter().filter(|c| **c == "ncclGroupStart").count();
    assert_eq!((ops.len(), starts), (6, 6), "{outcome:#?}");
    assert!(ops.iter().all(|c| c.contains(" group=1 ")), "{outcome:#?}");
    let stream = |call: &str| call.split(' ').nth(1).unwrap().to_owned();
    assert!(
        ops.iter().all(|c| stream(c) == stream(ops[0])),
        "{outcome:#?}"
    );
}

/// A group on the stream that its watch cannot follow (the event after it
/// not recorded) would have nothing to end it should a peer never come:
/// the communicator is broken and aborted at once, and the batch fails
/// from the group. On 25ef09c the group stayed on the stream unwatched
/// (no abort) and the failure was charged to the command after it.
#[test]
fn a_group_its_watch_cannot_follow_breaks_the_communicator() {
    let vars = on_a_12_2_device(
        "nccl:unwatched",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT", "2"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert!(outcome.field("b").starts_with("other "), "{outcome:#?}");
    let failed = outcome.field("synchronize");
    assert!(
        failed.contains("recording an NCCL group's event"),
        "{failed}"
    );
    assert!(
        nccl_calls(&outcome).contains(&"ncclCommAbort"),
        "{outcome:#?}"
    );
}

#[test]
fn an_nccl_error_fails_the_batch_from_that_command_with_a_typed_error() {
    let vars = on_a_12_2_device(
        "nccl:fails",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_NCCL_FAIL", "ncclAllGather"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("before"), "ok", "{outcome:#?}");
    // The signal after it failed, with the NCCL error as its cause.
    let after = outcome.field("after");
    assert!(after.starts_with("Nccl "), "{after}");
    let failed = outcome.field("synchronize");
    assert!(failed.starts_with("Nccl "), "{failed}");
    for phrase in [
        "rank 0: ncclAllGather (all_gather of 4 u32, submitted #1)",
        "ncclInternalError (3)",
        "NCCL_DEBUG=WARN",
    ] {
        assert!(failed.contains(phrase), "no `{phrase}` in {failed}");
    }
    // The group was ended all the same.
    let calls = nccl_calls(&outcome);
    assert!(calls.contains(&"ncclGroupEnd"), "{outcome:#?}");
    // NCCL launched none of the group, so this rank is out of step with
    // its peers: broken and aborted (on 25ef09c, a blocking
    // communicator ran on, and the all_reduce after it was launched).
    let again = outcome.field("again");
    assert!(again.starts_with("Broken "), "{again}");
    assert!(calls.contains(&"ncclCommAbort"), "{outcome:#?}");
    let starts = calls.iter().filter(|c| **c == "ncclGroupStart").count();
    assert_eq!(starts, 1, "{outcome:#?}");
}

#[test]
fn without_nccl_a_communicator_is_an_error_saying_how_to_install_it() {
    // A real NCCL on this machine's default path would be found: then
    // there is nothing to show.
    // SAFETY: a trial load by the name cudarc opens first.
    if unsafe { libloading::Library::new("libnccl.so") }.is_ok() {
        println!("skipped: a real NCCL is installed");
        return;
    }
    let Some(outcome) = run_scenario(&on_a_12_2_device("nccl:absent", &[])) else {
        return;
    };
    for key in ["single", "id"] {
        let text = outcome.field(key);
        assert!(text.starts_with("NoNccl "), "{key}: {text}");
        for phrase in [
            "no `libnccl.so` on the library path",
            "apt-get install libnccl2",
        ] {
            assert!(text.contains(phrase), "{key}: no `{phrase}` in {text}");
        }
    }
    // Only `libnccl.so.2`, as NCCL's runtime package installs it.
    let vars = on_a_12_2_device("nccl:absent", &[(NCCL_FAKE, "so2")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    let text = outcome.field("single");
    assert!(text.starts_with("NoNccl "), "{text}");
    for phrase in [
        "`libnccl.so.2` is on the library path",
        "symlink it as `libnccl.so`",
    ] {
        assert!(text.contains(phrase), "no `{phrase}` in {text}");
    }
    assert!(nccl_calls(&outcome).is_empty(), "{outcome:#?}");
}

#[test]
fn a_communicator_of_another_device_or_on_a_cpu_queue_is_refused() {
    let vars = on_a_12_2_device(
        "nccl:elsewhere",
        &[(NCCL_FAKE, "so"), ("HWQUEUE_FAKE_DEVICE_COUNT", "2")],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    let cuda = outcome.field("cuda_queue");
    assert!(cuda.starts_with("DeviceMismatch "), "{cuda}");
    assert!(
        cuda.contains("the NCCL communicator belongs to `cuda:1` but the queue runs on `cuda:0`"),
        "{cuda}"
    );
    let cpu = outcome.field("cpu_queue");
    assert!(cpu.starts_with("Unsupported "), "{cpu}");
    assert!(
        cpu.contains("record its collectives on a queue of its device"),
        "{cpu}"
    );
    // Plans are refused when planned, naming the collective (both were
    // planned on aa60241, refused at their first run).
    let cuda = outcome.field("cuda_plan");
    assert!(cuda.starts_with("other "), "{cuda}");
    for phrase in ["collective `sum on cuda:0`", "belongs to `cuda:1`"] {
        assert!(cuda.contains(phrase), "no `{phrase}` in {cuda}");
    }
    let cpu = outcome.field("cpu_plan");
    for phrase in ["collective `sum on the cpu`", "a queue of its device"] {
        assert!(cpu.contains(phrase), "no `{phrase}` in {cpu}");
    }
    // The refused all_reduce took its place, which breaks the NCCL
    // communicator there: the next one, on the communicator's own device,
    // fails naming it (on a425c80 it ran, `ok`, where the peers would have
    // paired it with the refused one).
    let after = outcome.field("after");
    assert!(after.starts_with("Broken "), "{after}");
    for phrase in ["all_reduce (sum) of 4 f32", "was not run", "cuda:1"] {
        assert!(after.contains(phrase), "no `{phrase}` in {after}");
    }
    // Nothing reached NCCL but the communicator's creation, and its abort
    // (a broken one's peers may still be in the call it skipped).
    let calls = nccl_calls(&outcome);
    assert_eq!(calls, ["ncclCommInitAll", "ncclCommAbort"], "{outcome:#?}");
}

#[cfg(feature = "mpi")]
#[test]
fn nccl_over_an_mpi_world_hands_rank_0s_id_round() {
    let vars = on_a_12_2_device("nccl:over_mpi", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("world"), "0 of 1", "{outcome:#?}");
    assert_eq!(outcome.field("comm"), "nccl 0 of 1", "{outcome:#?}");
    assert_eq!(outcome.field("data"), "[-3, 4]", "{outcome:#?}");
    let refused = outcome.field("not_mpi");
    assert!(refused.starts_with("Invalid "), "{refused}");
    assert!(refused.contains("over an MPI communicator"), "{refused}");
    // The fake's creation accepts only the id its GetUniqueId made.
    let mut calls = nccl_calls(&outcome);
    calls.retain(|call| *call != "ncclGetVersion");
    assert_eq!(
        calls[..2],
        [
            "ncclGetUniqueId",
            "ncclCommInitRankConfig blocking=1 version=21800 size=48"
        ],
        "{outcome:#?}"
    );
}

#[test]
fn split_gives_the_groups_rank_and_size_and_none_without_a_color() {
    let vars = on_a_12_2_device("nccl:split", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    // The fake has one rank: it is its color's whole group.
    assert_eq!(outcome.field("split"), "nccl 0 of 1", "{outcome:#?}");
    assert_eq!(outcome.field("no_color"), "none", "{outcome:#?}");
    assert_eq!(outcome.field("same_device"), "true", "{outcome:#?}");
    // The parent's timeout, not the default.
    assert_eq!(outcome.field("split_timeout"), "7s", "{outcome:#?}");
    let huge = outcome.field("huge_color");
    assert!(huge.starts_with("Invalid "), "{huge}");
    assert!(huge.contains("non-negative C `int`"), "{huge}");
    // A collective over the split communicator ran, and moved the data.
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("data"), "Ok([5, 6])", "{outcome:#?}");
    assert_eq!(outcome.field("synchronize"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    for call in [
        "ncclCommSplit color=3 key=7",
        "ncclCommUserRank",
        "ncclCommCount",
        "ncclCommSplit color=-1 key=0",
    ] {
        assert!(calls.contains(&call), "no `{call}` in {calls:?}");
    }
    // The huge color never reached NCCL; both communicators were destroyed.
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.starts_with("ncclCommSplit"))
            .count(),
        2,
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| **c == "ncclCommDestroy").count(),
        2,
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| c.starts_with("ncclAllReduce")),
        "{calls:?}"
    );
}

#[test]
fn an_nccl_split_error_is_a_typed_nccl_error() {
    let vars = on_a_12_2_device(
        "nccl:split_fails",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_NCCL_FAIL", "ncclCommSplit"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    let split = outcome.field("split");
    assert!(split.starts_with("Nccl "), "{split}");
    for phrase in ["rank 0: ncclCommSplit", "ncclInternalError (3)"] {
        assert!(split.contains(phrase), "no `{phrase}` in {split}");
    }
    // Refused before making anything: the parent stays usable.
    assert!(
        outcome.field("split_again").starts_with("Nccl "),
        "{outcome:#?}"
    );
    assert!(
        !nccl_calls(&outcome).contains(&"ncclCommAbort"),
        "{outcome:#?}"
    );
}

/// A blocking split whose making failed gives out the new communicator
/// all the same (NCCL's init job failed), linked to the parent until
/// aborted: the parent is broken and aborted first (its peers are
/// somewhere in the split), then the new one; it used to be leaked.
#[test]
fn a_split_that_failed_while_making_its_communicator_aborts_both() {
    let vars = on_a_12_2_device(
        "nccl:split_fails",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_NCCL_FAIL", "ncclCommSplit"),
            ("HWQUEUE_FAKE_NCCL_FAIL_LATE", "1"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert!(outcome.field("split").starts_with("Nccl "), "{outcome:#?}");
    let again = outcome.field("split_again");
    assert!(again.starts_with("Broken "), "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    let aborts = calls.iter().filter(|c| **c == "ncclCommAbort").count();
    assert_eq!(aborts, 2, "{calls:?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{calls:?}");
}

/// A communicator that holds an error when it is dropped (a peer that
/// failed after its last collective, which no watchdog saw) is aborted:
/// NCCL's destroy would return the error from inside a group it never
/// closes, leaving the dropping thread's group depth raised, so that its
/// later `ncclGroupEnd`s launch nothing.
#[test]
fn a_communicator_holding_an_error_is_aborted_not_destroyed() {
    let vars = on_a_12_2_device(
        "nccl:idle_error",
        &[(NCCL_FAKE, "so"), ("HWQUEUE_FAKE_NCCL_IDLE_ERROR", "6")],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("comm"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    assert!(calls.contains(&"ncclCommAbort"), "{calls:?}");
    assert!(
        !calls.iter().any(|call| call.starts_with("ncclCommDestroy")),
        "{calls:?}"
    );
}

/// A stream forgets the groups whose event completed before it hands them
/// its next batch: it used to wait for the watchdog (which looks every
/// 10 ms) to mark them done, so a queue issuing collectives faster than
/// that handed each batch to every group of the last 10 ms (an extend of
/// the batch's signals per group: linear cost per batch, quadratic memory).
#[test]
fn a_stream_hands_its_batches_only_to_the_groups_still_in_flight() {
    let hang_1_s = [("HWQUEUE_FAKE_NCCL_HANG_S", "1")];
    let Some(outcome) = with_hanging("nccl:many_groups", "ncclAllGather", &hang_1_s) else {
        return;
    };
    assert_eq!(outcome.field("done"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("gathered"), "ok", "{outcome:#?}");
    // The fake completes each all-reduce at once: at most the last
    // batch's own group is followed (the one before it was seen complete).
    let followed: usize = outcome.field("followed").parse().unwrap();
    assert!(followed <= 1, "{outcome:#?}");
}

/// Runs `scenario` on the fake NCCL, whose `ncclAllReduce` never
/// completes (`None`: skipped, as `run_scenario` says).
fn with_all_reduce_hanging(scenario: &str) -> Option<Outcome> {
    with_hanging(scenario, "ncclAllReduce", &[])
}

/// Runs `scenario` on the fake NCCL, whose collective `call` never
/// completes, with `extra` set too.
fn with_hanging(scenario: &str, call: &str, extra: &[(&str, &str)]) -> Option<Outcome> {
    let mut vars = vec![(NCCL_FAKE, "so"), ("HWQUEUE_FAKE_NCCL_HANG", call)];
    vars.extend_from_slice(extra);
    run_scenario(&on_a_12_2_device(scenario, &vars))
}

/// A collective that never completes: the watchdog times it out, aborts
/// the communicator, and fails what followed it with a typed error.
#[test]
fn a_collective_that_never_completes_times_out_and_breaks_the_communicator() {
    let Some(outcome) = with_all_reduce_hanging("nccl:hang") else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    // The wait returned (well within its 10 s), with the watchdog's error.
    let reduced = outcome.field("reduced");
    assert!(reduced.starts_with("Timeout "), "{outcome:#?}");
    for phrase in [
        "rank 0: all_reduce (sum) of 4 u32, submitted #0 did not complete within",
        "this communicator is unusable now",
    ] {
        assert!(reduced.contains(phrase), "no `{phrase}` in {reduced}");
    }
    // The abort let the stream go on, but the signal stays unreached.
    assert_eq!(outcome.field("value"), "0", "{outcome:#?}");
    assert!(
        outcome.field("synchronize").starts_with("Timeout "),
        "{outcome:#?}"
    );
    // Broken from then on: the next collective fails at once, calling
    // nothing, and so does a split.
    assert_eq!(outcome.field("submit_after"), "ok", "{outcome:#?}");
    for key in ["later", "split_after"] {
        let text = outcome.field(key);
        assert!(text.starts_with("Broken "), "{key}: {text}");
        assert!(text.contains("did not complete within"), "{key}: {text}");
    }
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    // One all_reduce reached NCCL; the communicator was aborted, and not
    // destroyed after (the abort freed it).
    let calls = nccl_calls(&outcome);
    let ops = calls.iter().filter(|c| c.starts_with("ncclAllReduce"));
    assert_eq!(ops.count(), 1, "{calls:?}");
    assert!(calls.contains(&"ncclCommAbort"), "{calls:?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{calls:?}");
    assert!(
        !calls.iter().any(|c| c.starts_with("ncclCommSplit")),
        "{calls:?}"
    );
}

/// Batches already on the stream behind a collective that times out ran
/// over what the aborted collective left: under the queue's cascade (the
/// default) their signals fail, naming the earlier batch's timeout, though
/// their events complete; under `FailureScope::Batch` they keep their
/// values. Under both, a `submit` right after a signal failed is told of
/// the timeout, once.
#[test]
fn batches_behind_a_collective_that_times_out_fail_with_it() {
    let Some(outcome) = with_all_reduce_hanging("nccl:hang_behind") else {
        return;
    };
    for scope in ["queue", "batch"] {
        let reduced = outcome.field(&format!("{scope}_reduced"));
        assert!(reduced.starts_with("Timeout "), "{scope}: {outcome:#?}");
        let fresh = format!("{scope}_fresh");
        assert_eq!(outcome.field(&fresh), "ok", "{outcome:#?}");
    }
    for key in ["queue_alone", "queue_uploaded"] {
        let text = outcome.field(key);
        assert!(text.starts_with("Timeout "), "{key}: {outcome:#?}");
        assert!(
            text.contains("ran behind an earlier batch on this queue whose work was abandoned"),
            "{key}: {text}"
        );
        assert!(text.contains("did not complete within"), "{key}: {text}");
    }
    for key in ["batch_alone", "batch_uploaded"] {
        assert_eq!(outcome.field(key), "ok", "{key}: {outcome:#?}");
    }
    // Told by the first submit after a signal failed, once: the batch it
    // kept runs when submitted again.
    for scope in ["queue", "batch"] {
        let text = outcome.field(&format!("{scope}_told"));
        assert!(text.starts_with("Timeout "), "{scope}: {text}");
        assert!(text.contains("a batch submitted earlier"), "{text}");
        assert_eq!(outcome.field(&format!("{scope}_resubmit")), "ok");
    }
}

/// Two threads' queues share a communicator whose collective hangs; each
/// has a batch behind its group. One abort fails both groups and both
/// batches behind them.
#[test]
fn batches_behind_on_queues_of_two_threads_fail_with_one_abort() {
    let Some(outcome) = with_all_reduce_hanging("nccl:hang_behind_threads") else {
        return;
    };
    for thread in ["0", "1"] {
        let reduced = outcome.field(&format!("{thread}_reduced"));
        assert!(
            reduced.starts_with("Timeout ") || reduced.starts_with("Broken "),
            "{thread}: {outcome:#?}"
        );
        let behind = outcome.field(&format!("{thread}_behind"));
        assert!(
            behind.contains("ran behind an earlier batch"),
            "{thread}: {behind}"
        );
    }
}

/// A batch behind a collective that times out, waiting at the worker when
/// the abort fails its signal (not recorded yet), keeps that signal
/// failed once the worker records it and its event completes.
#[test]
fn a_signal_failed_by_an_abort_before_it_is_recorded_stays_failed() {
    let Some(outcome) = with_all_reduce_hanging("nccl:hang_gate") else {
        return;
    };
    assert!(
        outcome.field("reduced").starts_with("Timeout "),
        "{outcome:#?}"
    );
    assert!(
        outcome.field("synchronize").starts_with("Timeout "),
        "{outcome:#?}"
    );
    let after = outcome.field("after");
    assert!(after.starts_with("Timeout "), "{outcome:#?}");
    assert!(after.contains("ran behind an earlier batch"), "{after}");
    assert_eq!(outcome.field("after_value"), "0", "{outcome:#?}");
}

/// NCCL's asynchronous error (a peer's failure) breaks the communicator
/// at once, as the timeout would, with NCCL's error.
#[test]
fn an_asynchronous_nccl_error_fails_the_collective_with_a_typed_error() {
    // ncclRemoteError.
    let remote_error = [("HWQUEUE_FAKE_NCCL_ASYNC_ERROR", "6")];
    let Some(outcome) = with_hanging("nccl:async_error", "ncclAllReduce", &remote_error) else {
        return;
    };
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    let reduced = outcome.field("reduced");
    assert!(reduced.starts_with("Nccl "), "{outcome:#?}");
    for phrase in [
        "rank 0: ncclCommGetAsyncError (all_reduce (sum) of 4 f32, submitted #0)",
        "ncclRemoteError (6)",
        "a peer failed or exited",
    ] {
        assert!(reduced.contains(phrase), "no `{phrase}` in {reduced}");
    }
    let split = outcome.field("split_after");
    assert!(split.starts_with("Broken "), "{split}");
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    assert!(calls.contains(&"ncclCommAbort"), "{calls:?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{calls:?}");
}

/// A blocking launch that holds the communicator's call lock (NCCL
/// connecting to a peer inside `ncclGroupEnd`) no longer keeps the
/// watchdog from failing the groups already in flight: the all-gather
/// that timed out fails within its timeout, not once the launch returns
/// (three seconds later); the abort follows once the lock is free, and
/// the launched group fails with it.
#[test]
fn a_launch_holding_the_call_lock_does_not_delay_a_timeout() {
    let Some(outcome) = with_hanging(
        "nccl:launch_blocks",
        "ncclAllGather",
        &[
            ("HWQUEUE_FAKE_NCCL_BLOCK_HOST", "ncclGroupEnd:2"),
            ("HWQUEUE_FAKE_NCCL_BLOCK_S", "3"),
        ],
    ) else {
        return;
    };
    let gathered = outcome.field("gathered");
    for phrase in ["all_gather of 4 u32", "did not complete within"] {
        assert!(gathered.contains(phrase), "no `{phrase}` in {outcome:#?}");
    }
    // Launched (and, on the fake, done at once) before the abort.
    assert_eq!(outcome.field("reduced"), "ok", "{outcome:#?}");
    assert!(
        outcome.field("after").starts_with("Broken "),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    let aborts = calls.iter().filter(|c| **c == "ncclCommAbort").count();
    assert_eq!(aborts, 1, "{calls:?}");
}

/// While the watchdog waits for a launch to let go of the call lock, the
/// group that launch hands over when it returns fails within the look
/// after (it used to wait, unwatched, until the lock was free), and a
/// launch waiting for the lock meanwhile refuses (the communicator is
/// breaking) instead of blocking again, so the abort follows. It refuses
/// while the launch still blocks (held by the fake until the scenario
/// lets it go): on `24ab59f` it waited for the lock, for as long as the
/// launch blocked (for good, where a peer never comes).
#[test]
fn groups_launched_while_the_watchdog_waits_for_the_lock_still_fail() {
    let Some(outcome) = with_hanging(
        "nccl:launches_block",
        "ncclAllGather",
        &[
            (
                "HWQUEUE_FAKE_NCCL_BLOCK_HOST",
                "ncclGroupEnd:2,ncclGroupEnd:3",
            ),
            ("HWQUEUE_FAKE_NCCL_BLOCK_S", "20"),
            ("HWQUEUE_FAKE_NCCL_BLOCK_RELEASE", "1"),
        ],
    ) else {
        return;
    };
    assert_eq!(outcome.field("third_while_blocked"), "true", "{outcome:#?}");
    // A settled wait on the group's failed value lets its queue go on
    // only once the aborted group exited (on 93bdff2 at once, beside the
    // collective still running).
    assert_eq!(outcome.field("fourth_submit"), "ok", "{outcome:#?}");
    let early = outcome.field("settled_while_blocked");
    assert!(early.starts_with("other "), "{outcome:#?}");
    assert!(early.contains("timed out"), "{outcome:#?}");
    assert_eq!(outcome.field("settled"), "ok", "{outcome:#?}");
    assert!(
        outcome
            .field("gathered")
            .contains("did not complete within"),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("second_submit"), "ok", "{outcome:#?}");
    let second = outcome.field("second");
    assert!(second.contains("runs no more collectives"), "{outcome:#?}");
    let third = outcome.field("third");
    assert!(third.contains("runs no more collectives"), "{outcome:#?}");
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    let blocked = calls
        .iter()
        .filter(|c| **c == "ncclGroupEnd blocks the host");
    assert_eq!(blocked.count(), 1, "{calls:?}");
}

/// A communicator whose error is raised between hwqueue's look and its
/// destroy: NCCL's destroy returns it from inside the group it opened,
/// having freed nothing; hwqueue closes that group, so the dropping
/// thread's later groups run, and aborts the communicator.
#[test]
fn an_error_raised_just_before_the_destroy_leaves_no_group_open() {
    let vars = on_a_12_2_device(
        "nccl:idle_error",
        &[(NCCL_FAKE, "so"), ("HWQUEUE_FAKE_NCCL_DESTROY_RAISES", "6")],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    let calls = nccl_calls(&outcome);
    let left = calls
        .iter()
        .position(|c| *c == "ncclCommDestroy left its group open");
    let left = left.unwrap_or_else(|| panic!("{calls:?}"));
    // The group closed, then the communicator the destroy left freed.
    assert_eq!(
        calls.get(left + 1..),
        Some(&["ncclGroupEnd", "ncclCommAbort"][..]),
        "{calls:?}"
    );
}

/// A timeout breaks the communicator, but a collective of another queue
/// that completed keeps its result: only what was not done fails.
#[test]
fn a_timeout_fails_only_the_groups_not_done() {
    let Some(outcome) = with_hanging("nccl:hang_beside", "ncclAllGather", &[]) else {
        return;
    };
    assert_eq!(outcome.field("reduced"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("fine_synchronize"), "ok", "{outcome:#?}");
    for key in ["gathered", "stuck_synchronize"] {
        let text = outcome.field(key);
        assert!(text.starts_with("Timeout "), "{key}: {text}");
        assert!(
            text.contains("rank 0: all_gather of 4 u32, submitted #0"),
            "{key}: {text}"
        );
    }
    assert_eq!(outcome.field("dropped"), "ok", "{outcome:#?}");
    assert!(
        nccl_calls(&outcome).contains(&"ncclCommAbort"),
        "{outcome:#?}"
    );
}

#[test]
fn a_collective_this_rank_skips_breaks_the_communicator_here() {
    let vars = on_a_12_2_device("nccl:skipped", &[(NCCL_FAKE, "so")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("discarded"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("submit"), "ok", "{outcome:#?}");
    assert!(outcome.field("done").starts_with("other "), "{outcome:#?}");
    // The peers would pair their all_reduce with this rank's next one
    // (on 7af95f3 `again` ran, `ok`): it fails, naming the skipped one.
    for key in ["again", "refused_again"] {
        let text = outcome.field(key);
        assert!(text.starts_with("Broken "), "{key}: {text}");
        for phrase in [
            "all_reduce (sum) of 4 u32",
            "was not run",
            "NCCL cannot tell them",
            "make a new communicator",
        ] {
            assert!(text.contains(phrase), "{key}: no `{phrase}` in {text}");
        }
    }
    assert!(
        outcome
            .field("again")
            .contains("the gate's producer gave up"),
        "{outcome:#?}"
    );
    let refused = outcome.field("refused");
    assert!(refused.starts_with("Invalid "), "{refused}");
    // Only the discarded batch's successor was launched; each broken
    // communicator is aborted when dropped (its peers may still be in the
    // call it skipped), not destroyed.
    let calls = nccl_calls(&outcome);
    let launches = calls.iter().filter(|c| c.starts_with("ncclAllReduce"));
    assert_eq!(launches.count(), 1, "{outcome:#?}");
    let aborts = calls.iter().filter(|c| **c == "ncclCommAbort").count();
    assert_eq!(aborts, 2, "{outcome:#?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{outcome:#?}");
}

/// A batch failed before its all_reduce, whose values stay unsettled (the
/// stream wait that would prove the work before them done failed, not
/// sticky): the skipped all_reduce broke the communicator only when the
/// batch retired, two seconds later, so the next batch's all_reduce on it
/// was launched meanwhile, out of step with the peers (helper-70; on
/// `1050450` `c` read `ok`). A skip breaks it as the batch fails.
#[test]
fn a_collective_skipped_by_a_batch_kept_unsettled_breaks_the_communicator_at_once() {
    let vars = on_a_12_2_device(
        "nccl:skipped_unsettled",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_EVENT_DELAY_US", "2000000"),
            ("HWQUEUE_FAKE_FAULT_AFTER", "cuEventRecord"),
            ("HWQUEUE_FAKE_FAULT_SEEN_BY", "cuStreamSynchronize"),
            ("HWQUEUE_FAKE_FAULT", "400"),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    let c = outcome.field("c");
    assert!(c.starts_with("Broken "), "{outcome:#?}");
}

/// A collective in a batch that a stalled queue (one that takes no more
/// work) let go unrun took no place in its communicator's order: the
/// communicator stayed whole, so its next collective (from another queue)
/// would have met the peers' collective this rank skipped, out of step
/// with them (helper-78). It is forfeited, as a refused batch's is: the
/// communicator breaks, and is aborted when dropped, not destroyed.
#[test]
fn a_collective_a_stalled_queue_lets_go_breaks_the_communicator() {
    let vars = on_a_12_2_device(
        "nccl:stalled",
        &[
            (NCCL_FAKE, "so"),
            ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2"),
            ("HWQUEUE_FAKE_FAULT", "400"),
            (
                "HWQUEUE_FAKE_FAULT_SEEN_BY",
                "cuEventQuery,cuEventSynchronize,cuStreamSynchronize",
            ),
        ],
    );
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("stalled"), "true", "{outcome:#?}");
    assert_eq!(outcome.field("refused"), "true", "{outcome:#?}");
    let calls = nccl_calls(&outcome);
    assert!(
        !calls.iter().any(|c| c.starts_with("ncclAllReduce")),
        "{outcome:#?}"
    );
    assert!(calls.contains(&"ncclCommAbort"), "{outcome:#?}");
    assert!(!calls.contains(&"ncclCommDestroy"), "{outcome:#?}");
}
