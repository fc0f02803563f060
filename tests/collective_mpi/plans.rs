//! Collectives in plans: schedules that hold collectives beside kernels and
//! transfers, planned once and run several times back to back (each run
//! started before the last one finished, with fresh uploads), every run's
//! downloads checked against the host.

use std::sync::Arc;

use hwqueue::cpu::Cpu;
use hwqueue::{Download, OpId, Plan, Run, Schedule};

use super::*;

/// Runs started back to back before any is waited for.
const RUNS: usize = 4;

pub(super) fn cases(ranks: &Ranks, run: &mut impl FnMut(String, Outcome)) {
    run(
        "plan: upload, kernel, all_reduce, kernel, download; runs back to back".into(),
        kernels_and_all_reduce(ranks),
    );
    run(
        "plan: every collective, runs back to back".into(),
        every_collective(ranks),
    );
    run(
        "plan over AnyBackend: an all_reduce on an AnyQueue, runs back to back".into(),
        any_backend(ranks),
    );
    run(
        "plan: collectives a rank cannot run are refused at plan time".into(),
        refused_at_plan(ranks),
    );
    if ranks.size > 1 {
        run(
            "plan: a ring of sends and receives runs as a group, runs back to back".into(),
            ring(ranks),
        );
        run(
            "plan: a run refused before its collective's queue recorded still takes its place"
                .into(),
            refused_before_the_collective(ranks),
        );
        run(
            "plan: a run refused before its sends' queue recorded still meets the peers' receives"
                .into(),
            refused_before_the_sends(ranks),
        );
    }
    if ranks.size.is_multiple_of(2) {
        run(
            "plan: with collectives on two devices, a send waiting on a receive runs after it"
                .into(),
            send_behind_a_collective(ranks),
        );
        run(
            "plan: with collectives on two devices, sends and receives run alone".into(),
            member_waited_on(ranks),
        );
    }
}

/// A kernel writing a slot on the compute queue, and an all_reduce of an
/// upload on the copy queue, which records after the compute queue. In
/// run 0 rank 1 binds the slot to misaligned bytes, which its compute
/// queue refuses, so its copy queue records nothing of the run. Its
/// all_reduce still takes its place, forfeited: the others' run 0 fails
/// naming rank 1, and run 1 sums every rank's `2`s. On `1d3f1b4` it took
/// none: the others' run 0 met rank 1's run 1 (`Ok`, a sum of another
/// run's data) and their run 1 waited until the timeout.
fn refused_before_the_collective(ranks: &Ranks) -> Outcome {
    let (rank, size, len) = (ranks.rank, ranks.size, 4);
    let (mut schedule, d, slot, kernel) = refusable_schedule();
    let bytes = len * size_of::<u32>();
    let (x, sum) = (
        schedule.add_tensor(d, "x", bytes),
        schedule.add_tensor(d, "sum", bytes),
    );
    let upload = schedule.upload("upload x", x).id();
    let all_reduce = (schedule.all_reduce::<u32>("sum x", &ranks.comm, Reduction::Sum, x, sum))
        .on(hwqueue::QueueKind::Copy)
        .id();
    let download = schedule.download("download sum", sum).id();
    let mut plan = schedule.plan().map_err(text)?;
    if plan.queue_of(kernel) >= plan.queue_of(all_reduce) {
        return Err(format!("the all_reduce's queue records first:\n{plan}"));
    }
    let bytes_for_slot = ranks.device.alloc(128).map_err(text)?;
    for run in 0..2u32 {
        bind_refused_on_rank_1(&mut plan, slot, &bytes_for_slot, run == 0 && rank == 1)?;
        plan.upload(upload, &vec![run + 1; len]).map_err(text)?;
        let got = Download::<u32>::new(len);
        plan.download(download, &got).map_err(text)?;
        let outcome = plan.run().and_then(|r| r.wait(Timeout::Forever));
        match (run, outcome) {
            (0, Err(error)) if rank == 1 => {
                if !matches!(error.root_cause(), Error::ViewMisaligned { .. }) {
                    return Err(format!("run 0 refused with another error: {error}"));
                }
            }
            (0, Err(error))
                if error.to_string().contains("failed on its rank")
                    && error
                        .to_string()
                        .contains("rank 1's all_reduce (sum) of 4 u32") => {}
            (1, Ok(())) => {
                let got = got.take(Timeout::Forever).map_err(text)?;
                check("run 1's sum", got, vec![2 * size as u32; len])?;
            }
            (run, outcome) => {
                let got = got.take(Timeout::Forever);
                return Err(format!("run {run}: {outcome:?}, downloaded {got:?}"));
            }
        }
    }
    Ok(())
}

/// As `refused_before_the_collective`, over a ring of sends and receives
/// on the copy queue (a send to the next rank, a receive from the one
/// before: one group). In run 0 rank 1's compute queue refuses, so its
/// copy queue records nothing: its send and receive still take their
/// places, forfeited, so rank 2 (rank 0 of two ranks) fails its run 0's
/// receive, and run 1 moves run 1's data. Before sends and receives took
/// places (daac295), rank 2's run 0 received rank 1's run 1 data (`Ok`)
/// and its run 1 waited until the timeout.
fn refused_before_the_sends(ranks: &Ranks) -> Outcome {
    let (rank, size, len) = (ranks.rank, ranks.size, 4);
    let (next, before) = ((rank + 1) % size, (rank + size - 1) % size);
    let comm = short_lived(ranks)?;
    let (mut schedule, d, slot, kernel) = refusable_schedule();
    let bytes = len * size_of::<u32>();
    let (out, into) = (
        schedule.add_tensor(d, "out", bytes),
        schedule.add_tensor(d, "into", bytes),
    );
    let upload = schedule.upload("upload out", out).id();
    let send = (schedule.send::<u32>("send to the next rank", &comm, next, out))
        .on(hwqueue::QueueKind::Copy)
        .id();
    (schedule.recv::<u32>("receive from the rank before", &comm, before, into))
        .on(hwqueue::QueueKind::Copy);
    let download = schedule.download("download into", into).id();
    let mut plan = schedule.plan().map_err(text)?;
    if plan.queue_of(kernel) >= plan.queue_of(send) {
        return Err(format!("the sends' queue records first:\n{plan}"));
    }
    let bytes_for_slot = ranks.device.alloc(128).map_err(text)?;
    let data = |run: u32, r: usize| vec![run * 100 + r as u32 + 1; len];
    for run in 0..2u32 {
        bind_refused_on_rank_1(&mut plan, slot, &bytes_for_slot, run == 0 && rank == 1)?;
        plan.upload(upload, &data(run, rank)).map_err(text)?;
        let got = Download::<u32>::new(len);
        plan.download(download, &got).map_err(text)?;
        let outcome = plan.run().and_then(|r| r.wait(Timeout::Forever));
        match (run, outcome) {
            (0, Err(error)) if rank == 1 => {
                if !matches!(error.root_cause(), Error::ViewMisaligned { .. }) {
                    return Err(format!("run 0 refused with another error: {error}"));
                }
            }
            // Rank 1's peers: the one it sends to fails its receive, and
            // the one it receives from fails its send (each pair of
            // descriptions disagrees on both sides); the others run.
            (0, Err(error)) if error.to_string().contains("rank 1") => {}
            (0, Ok(())) if before != 1 => {}
            (1, Ok(())) => {
                let got = got.take(Timeout::Forever).map_err(text)?;
                check("run 1's receive", got, data(1, before))?;
            }
            (run, outcome) => {
                let got = got.take(Timeout::Forever);
                return Err(format!("run {run}: {outcome:?}, downloaded {got:?}"));
            }
        }
    }
    Ok(())
}

/// Pairs of ranks over two communicators; the even rank over two devices:
/// a send of `s` and a receive into `t` over `a` (device 1), a copy of `u`
/// (a buffer) into `s`, which waits for the send, and a receive into `u`
/// over `b` (device 2), which waits for the copy. The odd rank receives
/// over `a`, sends over `b`, then sends over `a`. Run alone, the even
/// rank's send meets the odd rank's receive, the copy and the receive over
/// `b` follow, then the rest. As one group the copy would wait for the
/// receive into `t` too, which needs the odd rank's last send, which comes
/// after its send over `b`, which needs the receive behind the copy:
/// every rank would wait until the timeout.
fn member_waited_on(ranks: &Ranks) -> Outcome {
    let (rank, len) = (ranks.rank, 16);
    let peer = rank ^ 1;
    let (a, b) = (short_lived(ranks)?, short_lived(ranks)?);
    let bytes = len * size_of::<u32>();
    let mut schedule = Schedule::<Cpu>::new();
    let d1 = schedule.add_device(Arc::new(CpuDevice::new()));
    if rank.is_multiple_of(2) {
        let device2 = CpuDevice::new();
        let d2 = schedule.add_device(Arc::new(device2.clone()));
        let (s, t) = (
            schedule.add_tensor(d1, "s", bytes),
            schedule.add_tensor(d1, "t", bytes),
        );
        let u = schedule.add_buffer(d2, "u", device2.alloc(bytes).map_err(text)?);
        let upload = schedule.upload("upload s", s).id();
        schedule.send::<u32>("send s over a", &a, peer, s);
        schedule.recv::<u32>("receive t over a", &a, peer, t);
        schedule.copy("copy u into s", s, u);
        schedule.recv::<u32>("receive u over b", &b, peer, u);
        let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
        plan.upload(upload, &vec![5u32; len]).map_err(text)?;
        run_once(&mut plan)
    } else {
        let (x, y, z) = (
            schedule.add_tensor(d1, "x", bytes),
            schedule.add_tensor(d1, "y", bytes),
            schedule.add_tensor(d1, "z", bytes),
        );
        let uploads = [
            schedule.upload("upload y", y).id(),
            schedule.upload("upload z", z).id(),
        ];
        schedule.recv::<u32>("receive x over a", &a, peer, x);
        schedule.send::<u32>("send z over b", &b, peer, z);
        schedule.send::<u32>("send y over a", &a, peer, y);
        let download = schedule.download("download x", x).id();
        let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
        for upload in uploads {
            plan.upload(upload, &vec![6u32; len]).map_err(text)?;
        }
        check(
            "x",
            run_once_for(&mut plan, download, len)?,
            vec![5u32; len],
        )
    }
}

/// Pairs of ranks over two communicators. The even rank, over two devices:
/// a receive over `b` into `u` (device 2), a copy of `u` into `t` (device
/// 1), then sends of `s` and `t` over `a`, one after another. The odd rank
/// receives `s` over `a`, sends it back over `b`, and receives `t` over
/// `a`. The send of `t` waits (through the copy) on the receive over `b`,
/// which waits for the odd rank's send, which comes after its receive of
/// `s`: grouped with the send of `s`, its wait would go before both, and
/// every rank would wait for the other until the timeout. Checked on the
/// odd rank: `t` arrives, and is `s`. (With collectives on two devices the
/// plan groups none of them, so this guards the two-device rule, as
/// `member_waited_on` does, not the grouping's handling of waits.)
fn send_behind_a_collective(ranks: &Ranks) -> Outcome {
    let (rank, len) = (ranks.rank, 16);
    let peer = rank ^ 1;
    let (a, b) = (short_lived(ranks)?, short_lived(ranks)?);
    let bytes = len * size_of::<u32>();
    let data: Vec<u32> = (0..len as u32).map(|i| i * 3 + 1).collect();
    let mut schedule = Schedule::<Cpu>::new();
    let d1 = schedule.add_device(Arc::new(CpuDevice::new()));
    if rank.is_multiple_of(2) {
        let d2 = schedule.add_device(Arc::new(CpuDevice::new()));
        let (s, t, u) = (
            schedule.add_tensor(d1, "s", bytes),
            schedule.add_tensor(d1, "t", bytes),
            schedule.add_tensor(d2, "u", bytes),
        );
        let upload = schedule.upload("upload s", s).id();
        schedule.recv::<u32>("receive u over b", &b, peer, u);
        schedule.copy("copy u to t", t, u);
        schedule.send::<u32>("send s over a", &a, peer, s);
        schedule.send::<u32>("send t over a", &a, peer, t);
        let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
        plan.upload(upload, &data).map_err(text)?;
        run_once(&mut plan)
    } else {
        let (s, t) = (
            schedule.add_tensor(d1, "s", bytes),
            schedule.add_tensor(d1, "t", bytes),
        );
        schedule.recv::<u32>("receive s over a", &a, peer, s);
        schedule.send::<u32>("send s back over b", &b, peer, s);
        schedule.recv::<u32>("receive t over a", &a, peer, t);
        let download = schedule.download("download t", t).id();
        let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
        check("t", run_once_for(&mut plan, download, len)?, data)
    }
}

/// Every rank sends `out` to the next rank and receives the one before's
/// into `into`, the send first on every rank: alone, each send would wait
/// for a receive its peer records only after its own send (until the
/// timeout, short here); as one group they complete. Two sizes: one
/// through the exchange, one over the views' own memory.
fn ring(ranks: &Ranks) -> Outcome {
    let (rank, size) = (ranks.rank, ranks.size);
    let (next, before) = ((rank + 1) % size, (rank + size - 1) % size);
    // A communicator of its own, whose timeout fails the case in seconds.
    let comm = (ranks.comm.split(Some(0), rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    comm.set_timeout(Duration::from_secs(5));
    [16, 4096].into_iter().try_for_each(|len| {
        let (mut schedule, d) = new_schedule();
        let bytes = len * size_of::<u32>();
        // Before the ring, a tensor filled, summed over the ranks in place
        // (on the ring's queue) and read back on the copy queue: `into`
        // takes its bytes, so the receive waits for that download (this
        // run's, after a collective the group's first member waits for
        // already), which the first member then waits for too.
        let out = schedule.add_tensor(d, "out", bytes);
        let into = schedule.add_tensor(d, "into", bytes);
        let upload = schedule.upload("upload out", out).id();
        let before_ring = schedule.add_tensor(d, "before", bytes);
        schedule.fill("fill before", before_ring, 7u32);
        schedule.all_reduce::<u32>(
            "sum before",
            &comm,
            Reduction::Sum,
            before_ring,
            before_ring,
        );
        let read_before = schedule.download("read before", before_ring).id();
        schedule.send::<u32>("send to the next rank", &comm, next, out);
        schedule.recv::<u32>("receive from the rank before", &comm, before, into);
        let download = schedule.download("download into", into).id();
        let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
        let shares = |a: &str, b: &str| {
            let at = |name: &str| {
                plan.memory()
                    .tensors
                    .iter()
                    .find(|t| t.name == name)
                    .map(|t| t.offset)
            };
            at(a).is_some() && at(a) == at(b)
        };
        if !shares("into", "before") {
            return Err(format!(
                "`into` does not take the bytes of `before`:\n{plan}"
            ));
        }
        let data = |run: usize, r: usize| input::<u32>(r, len, 60 + run);
        let (runs, got) = back_to_back(&mut plan, |plan, index| {
            plan.upload(upload, &data(index, rank)).map_err(text)?;
            let into = Download::<u32>::new(len);
            plan.download(download, &into).map_err(text)?;
            plan.download(read_before, &Download::<u32>::new(len))
                .map_err(text)?;
            Ok(into)
        })?;
        wait_all(runs, |index| {
            let got = got[index].take(Timeout::Forever).map_err(text)?;
            check("received", got, data(index, before))
        })
        .map_err(|error| format!("{len} elements: {error}"))
    })
}

/// A communicator of every rank's own (a split), whose 5 s timeout fails
/// a case in seconds, not the suite's 30.
fn short_lived(ranks: &Ranks) -> Result<Communicator, String> {
    let comm = ranks.comm.split(Some(0), ranks.rank as u32).map_err(text)?;
    let comm = comm.ok_or("the split gave no communicator")?;
    comm.set_timeout(Duration::from_secs(5));
    Ok(comm)
}

/// A schedule whose first operation, a kernel on the compute queue,
/// writes slot `s`: bound to misaligned bytes, the queue refuses the run
/// ([`bind_refused_on_rank_1`]). Returns it, its device, the slot and the
/// kernel.
fn refusable_schedule() -> (Schedule<Cpu>, hwqueue::DeviceId, hwqueue::BufferId, OpId) {
    let touch = CpuProgram::from_fn("touch", 1, 0, |_, _| {});
    let (mut schedule, d) = new_schedule();
    let slot = schedule.add_slot(d, "s", 64);
    let params = ExecParams::new_1d(1, 1);
    let kernel = (schedule.exec("touch s", d, &touch, &[slot], &[], params))
        .writes(slot, ..)
        .id();
    (schedule, d, slot, kernel)
}

/// Binds `slot` to 64 bytes of `bytes`: misaligned (4 bytes in) where
/// `refused`, so the run that takes them is refused.
fn bind_refused_on_rank_1(
    plan: &mut Plan<Cpu>,
    slot: hwqueue::BufferId,
    bytes: &CpuBuffer,
    refused: bool,
) -> Outcome {
    let view = View::new(bytes, if refused { 4 } else { 0 }, 64).map_err(text)?;
    plan.bind(slot, &view).map_err(text)
}

fn new_schedule() -> (Schedule<Cpu>, hwqueue::DeviceId) {
    let mut schedule = Schedule::<Cpu>::new();
    let device = schedule.add_device(Arc::new(CpuDevice::new()));
    (schedule, device)
}

/// Waits for every run, then checks each one's downloads with `check_run`.
/// One run of `plan`, waited for.
fn run_once(plan: &mut Plan<Cpu>) -> Outcome {
    plan.run()
        .map_err(text)?
        .wait(Timeout::Forever)
        .map_err(text)
}

/// One run of `plan`, waited for, and what its download `op` (of `len`
/// u32s) took.
fn run_once_for(plan: &mut Plan<Cpu>, op: OpId, len: usize) -> Result<Vec<u32>, String> {
    let got = Download::<u32>::new(len);
    plan.download(op, &got).map_err(text)?;
    run_once(plan)?;
    got.take(Timeout::Forever).map_err(text)
}

/// [`RUNS`] runs of `plan` started back to back, each staged first by
/// `stage` (its uploads and downloads, given the run's index): the runs,
/// and what each staging gave back (its downloads).
fn back_to_back<B: hwqueue::Backend, T>(
    plan: &mut Plan<B>,
    mut stage: impl FnMut(&mut Plan<B>, usize) -> Result<T, String>,
) -> Result<(Vec<Run<B>>, Vec<T>), String> {
    let (mut runs, mut staged) = (Vec::new(), Vec::new());
    for index in 0..RUNS {
        staged.push(stage(plan, index)?);
        runs.push(plan.run().map_err(text)?);
    }
    Ok((runs, staged))
}

fn wait_all(runs: Vec<Run<Cpu>>, mut check_run: impl FnMut(usize) -> Outcome) -> Outcome {
    for (index, run) in runs.into_iter().enumerate() {
        run.wait(Timeout::Forever)
            .map_err(|e| format!("run {index}: {e}"))?;
    }
    (0..RUNS).try_for_each(|index| check_run(index).map_err(|e| format!("run {index}: {e}")))
}

/// `x` uploaded, scaled by `rank + 1` by a kernel, summed over the ranks
/// into `sum`, which a second kernel doubles; `sum` and `x` downloaded.
/// The all_reduce runs on the copy queue (beside the transfers) and the
/// kernels on the compute queue, so only the planner's waits order it
/// after the kernel writing `x` and before the kernel doubling `sum`.
fn kernels_and_all_reduce(ranks: &Ranks) -> Outcome {
    let (rank, size, len) = (ranks.rank, ranks.size, 4096);
    let scale_program = CpuProgram::from_fn("scale", 1, 1, scale);
    let (mut schedule, d) = new_schedule();
    let bytes = len * size_of::<f32>();
    let (x, sum) = (
        schedule.add_tensor(d, "x", bytes),
        schedule.add_tensor(d, "sum", bytes),
    );
    let upload = schedule.upload("upload x", x).id();
    let params = ExecParams::new_1d(len as u32, 256);
    let factor = hwqueue::Scalar::from(rank as f32 + 1.0);
    let scale_x = (schedule.exec("scale x", d, &scale_program, &[x], &[factor], params)).id();
    let all_reduce = (schedule.all_reduce::<f32>("sum x", &ranks.comm, Reduction::Sum, x, sum))
        .on(hwqueue::QueueKind::Copy)
        .id();
    let double = (schedule.exec(
        "double sum",
        d,
        &scale_program,
        &[sum],
        &[2.0f32.into()],
        params,
    ))
    .id();
    let download_sum = schedule.download("download sum", sum).id();
    let download_x = schedule.download("download x", x).id();
    let mut plan = schedule.plan().map_err(text)?;
    // The all_reduce reads what `scale x` wrote; `double sum` reads what
    // the all_reduce wrote: across queues, each a wait of the same run.
    let waits_for = |op: OpId, after: OpId| {
        plan.waits_of(op)
            .iter()
            .any(|w| w.after == after && !w.previous_run)
    };
    if plan.queue_of(scale_x) == plan.queue_of(all_reduce)
        || !waits_for(all_reduce, scale_x)
        || !waits_for(double, all_reduce)
    {
        return Err(format!(
            "the all_reduce is not ordered between the kernels by waits:\n{plan}"
        ));
    }
    let data = |run: usize, r: usize| input::<f32>(r, len, 100 + run);
    let (runs, outputs) = back_to_back(&mut plan, |plan, index| {
        plan.upload(upload, &data(index, rank)).map_err(text)?;
        let (got_sum, got_x) = (Download::<f32>::new(len), Download::<f32>::new(len));
        plan.download(download_sum, &got_sum).map_err(text)?;
        plan.download(download_x, &got_x).map_err(text)?;
        Ok((got_sum, got_x))
    })?;
    wait_all(runs, |index| {
        let (got_sum, got_x) = &outputs[index];
        let want_x: Vec<f32> = data(index, rank)
            .iter()
            .map(|v| v * (rank as f32 + 1.0))
            .collect();
        let want_sum: Vec<f32> = (0..len)
            .map(|i| {
                let total: f32 = (0..size)
                    .map(|r| data(index, r)[i] * (r as f32 + 1.0))
                    .sum();
                total * 2.0
            })
            .collect();
        check("x", got_x.take(Timeout::Forever).map_err(text)?, want_x)?;
        check(
            "sum",
            got_sum.take(Timeout::Forever).map_err(text)?,
            want_sum,
        )
    })
}

/// The outputs of [`every_collective`]'s plan: per download, its id and
/// the expected values per run.
type Expected = Vec<(OpId, Box<dyn Fn(usize) -> Vec<i32>>)>;

/// One schedule with an all_reduce in place, an all_gather, a
/// reduce_scatter, a broadcast and (with an even number of ranks) a
/// send/recv between pairs, each over uploaded data, run back to back.
fn every_collective(ranks: &Ranks) -> Outcome {
    let (rank, size, len) = (ranks.rank, ranks.size, 257);
    let comm = &ranks.comm;
    let (mut schedule, d) = new_schedule();
    let i32s = |n: usize| n * size_of::<i32>();
    let data = move |run: usize, r: usize, salt: usize| input::<i32>(r, len, 10 * run + salt);
    let mut uploads: Vec<(OpId, usize)> = Vec::new();
    let mut expected: Expected = Vec::new();
    let root = size - 1;

    let a = schedule.add_tensor(d, "a", i32s(len));
    uploads.push((schedule.upload("upload a", a).id(), 1));
    schedule.all_reduce::<i32>("all_reduce a", comm, Reduction::Max, a, a);
    expected.push((
        schedule.download("download a", a).id(),
        Box::new(move |run| {
            (0..len)
                .map(|i| (0..size).map(|r| data(run, r, 1)[i]).max().unwrap())
                .collect()
        }),
    ));

    let (g, gathered) = (
        schedule.add_tensor(d, "g", i32s(len)),
        schedule.add_tensor(d, "gathered", i32s(len * size)),
    );
    uploads.push((schedule.upload("upload g", g).id(), 2));
    schedule.all_gather::<i32>("all_gather g", comm, g, gathered);
    expected.push((
        schedule.download("download gathered", gathered).id(),
        Box::new(move |run| (0..size).flat_map(|r| data(run, r, 2)).collect()),
    ));

    // Its send buffer is `size` parts of `len`: uploaded as `size` rows.
    let (s, part) = (
        schedule.add_tensor(d, "s", i32s(len * size)),
        schedule.add_tensor(d, "part", i32s(len)),
    );
    let s_parts: Vec<_> = (0..size)
        .map(|p| schedule.add_view(format!("s part {p}"), s, i32s(len * p), i32s(len)))
        .collect::<Result<_, _>>()
        .map_err(text)?;
    for (p, view) in s_parts.iter().enumerate() {
        uploads.push((
            schedule.upload(format!("upload s part {p}"), *view).id(),
            30 + p,
        ));
    }
    schedule.reduce_scatter::<i32>("reduce_scatter s", comm, Reduction::Sum, s, part);
    expected.push((
        schedule.download("download part", part).id(),
        Box::new(move |run| {
            (0..len)
                .map(|i| (0..size).map(|r| data(run, r, 30 + rank)[i]).sum())
                .collect()
        }),
    ));

    let b = schedule.add_tensor(d, "b", i32s(len));
    uploads.push((schedule.upload("upload b", b).id(), 4));
    schedule.broadcast::<i32>("broadcast b", comm, root, b);
    expected.push((
        schedule.download("download b", b).id(),
        Box::new(move |run| data(run, root, 4)),
    ));

    if size > 1 && size.is_multiple_of(2) {
        let peer = rank ^ 1;
        let (out, into) = (
            schedule.add_tensor(d, "out", i32s(len)),
            schedule.add_tensor(d, "into", i32s(len)),
        );
        uploads.push((schedule.upload("upload out", out).id(), 5));
        if rank % 2 == 0 {
            schedule.send::<i32>("send out", comm, peer, out);
            schedule.recv::<i32>("recv into", comm, peer, into);
        } else {
            schedule.recv::<i32>("recv into", comm, peer, into);
            schedule.send::<i32>("send out", comm, peer, out);
        }
        expected.push((
            schedule.download("download into", into).id(),
            Box::new(move |run| data(run, peer, 5)),
        ));
    }

    let mut plan: Plan<Cpu> = schedule.plan().map_err(text)?;
    let (runs, downloads) = back_to_back(&mut plan, |plan, index| {
        for &(op, salt) in &uploads {
            plan.upload(op, &data(index, rank, salt)).map_err(text)?;
        }
        let mut these = Vec::new();
        for (op, want) in &expected {
            let into = Download::<i32>::new(want(index).len());
            plan.download(*op, &into).map_err(text)?;
            these.push(into);
        }
        Ok(these)
    })?;
    wait_all(runs, |index| {
        for ((op, want), got) in expected.iter().zip(&downloads[index]) {
            let name = format!("operation {}", op.index());
            check(
                &name,
                got.take(Timeout::Forever).map_err(text)?,
                want(index),
            )?;
        }
        Ok(())
    })
}

/// What `plan` refuses, naming the collective and this rank: lengths that
/// cannot be right, one communicator's collectives on two queues, and two
/// communicators' on two queues of one device.
/// Nothing runs, so no peer is involved.
fn refused_at_plan(ranks: &Ranks) -> Outcome {
    let (size, comm) = (ranks.size, &ranks.comm);
    let refusal = |schedule: Schedule<Cpu>| match schedule.plan() {
        Err(error @ Error::InvalidSchedule { .. }) => Ok(error.to_string()),
        Err(other) => Err(format!("refused with another error: {other}")),
        Ok(plan) => Err(format!("planned:\n{plan}")),
    };
    let expect = |what: &str, message: Result<String, String>, needles: &[&str]| -> Outcome {
        let message = message.map_err(|e| format!("{what}: {e}"))?;
        match needles.iter().find(|needle| !message.contains(*needle)) {
            Some(needle) => Err(format!("{what}: {message:?} does not say {needle:?}")),
            None => Ok(()),
        }
    };

    let (mut schedule, d) = new_schedule();
    let (a, b) = (
        schedule.add_tensor(d, "a", 64),
        schedule.add_tensor(d, "b", 64 * size + 4),
    );
    schedule.fill("fill a", a, 0u32);
    schedule.all_gather::<f32>("gather a", comm, a, b);
    expect(
        "all_gather into a buffer of the wrong size",
        refusal(schedule),
        &[
            "collective `gather a`",
            &format!("rank {} of {size}", ranks.rank),
            "group's size times",
        ],
    )?;

    let (mut schedule, d) = new_schedule();
    let (a, b) = (
        schedule.add_tensor(d, "a", 64),
        schedule.add_tensor(d, "b", 64),
    );
    schedule.fill("fill a", a, 0u32);
    schedule.all_reduce::<u32>("first", comm, Reduction::Sum, a, b);
    schedule
        .all_reduce::<u32>("second", comm, Reduction::Sum, b, a)
        .on(hwqueue::QueueKind::Copy);
    expect(
        "one communicator's collectives on two queues",
        refusal(schedule),
        &["`first`", "`second`", "one queue"],
    )?;

    // Two views of one tensor that overlap, as send and receive (on
    // 246e0c8 planned, and refused by the queue on every run).
    let (mut schedule, d) = new_schedule();
    let whole = schedule.add_tensor(d, "whole", 128);
    let low = schedule.add_view("low", whole, 0, 64).map_err(text)?;
    let high = schedule.add_view("high", whole, 32, 64).map_err(text)?;
    schedule.fill("fill whole", whole, 0u32);
    schedule.all_reduce::<u32>("overlapping", comm, Reduction::Sum, low, high);
    expect(
        "an all_reduce between overlapping views",
        refusal(schedule),
        &["`overlapping`", "`low`", "`high`", "overlap"],
    )?;

    // Two communicators on two queues of one device, unordered: their
    // collectives would each hold parts of the device's one arena while
    // waiting for peers that may hold the other's (on f672715 planned, and
    // could time out with the arena lost).
    let other = (comm.split(Some(0), ranks.rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    let (mut schedule, d) = new_schedule();
    let (a, b, c, e) = (
        schedule.add_tensor(d, "a", 64),
        schedule.add_tensor(d, "b", 64),
        schedule.add_tensor(d, "c", 64),
        schedule.add_tensor(d, "e", 64),
    );
    schedule.fill("fill a", a, 0u32);
    schedule.fill("fill c", c, 0u32);
    schedule.all_reduce::<u32>("over world", comm, Reduction::Sum, a, b);
    schedule
        .all_reduce::<u32>("over the other", &other, Reduction::Sum, c, e)
        .on(hwqueue::QueueKind::Copy);
    expect(
        "two communicators' collectives on two queues of one device",
        refusal(schedule),
        &["`over world`", "`over the other`", "device 0", "one queue"],
    )
}

/// The same through the `Any*` enums (a plan over [`AnyBackend`], as the
/// demo's): `x` uploaded, summed over the ranks in place, doubled by a
/// kernel, downloaded.
fn any_backend(ranks: &Ranks) -> Outcome {
    use hwqueue::{AnyBackend, AnyProgram};
    let (rank, size, len) = (ranks.rank, ranks.size, 1024);
    let device = hwqueue::acquire("cpu").map_err(text)?;
    let scale_program = AnyProgram::from(CpuProgram::from_fn("scale", 1, 1, scale));
    let mut schedule = Schedule::<AnyBackend>::new();
    let d = schedule.add_device(device);
    let x = schedule.add_tensor(d, "x", len * size_of::<f32>());
    let upload = schedule.upload("upload x", x).id();
    schedule.all_reduce::<f32>("sum x", &ranks.comm, Reduction::Sum, x, x);
    let params = ExecParams::new_1d(len as u32, 256);
    schedule.exec(
        "double x",
        d,
        &scale_program,
        &[x],
        &[2.0f32.into()],
        params,
    );
    let download = schedule.download("download x", x).id();
    let mut plan = schedule.plan().map_err(text)?;
    let data = |run: usize, r: usize| input::<f32>(r, len, 200 + run);
    let (runs, outputs) = back_to_back(&mut plan, |plan, index| {
        plan.upload(upload, &data(index, rank)).map_err(text)?;
        let got = Download::<f32>::new(len);
        plan.download(download, &got).map_err(text)?;
        Ok(got)
    })?;
    for (index, run) in runs.into_iter().enumerate() {
        run.wait(Timeout::Forever)
            .map_err(|e| format!("run {index}: {e}"))?;
    }
    for (index, got) in outputs.iter().enumerate() {
        let want: Vec<f32> = (0..len)
            .map(|i| 2.0 * (0..size).map(|r| data(index, r)[i]).sum::<f32>())
            .collect();
        check(
            &format!("run {index}"),
            got.take(Timeout::Forever).map_err(text)?,
            want,
        )?;
    }
    Ok(())
}
