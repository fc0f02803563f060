//! Collectives over MPI on CPU queues (issue 48), run by every rank:
//!
//! ```text
//! cargo build --features mpi,half --test collective_mpi
//! mpirun --allow-run-as-root --oversubscribe -np 4 target/debug/deps/collective_mpi-*
//! mpirun --allow-run-as-root --oversubscribe --enable-recovery -np 4 \
//!     target/debug/deps/collective_mpi-* dead-peer
//! mpirun --allow-run-as-root --oversubscribe --enable-recovery -np 4 \
//!     target/debug/deps/collective_mpi-* stalled-peer
//! mpirun --allow-run-as-root --oversubscribe --enable-recovery -np 4 \
//!     target/debug/deps/collective_mpi-* late-peer
//! ```
//!
//! With `half` (as `.ci/run` builds it) the cases run over `f16` and
//! `bf16` too; without it, over `f32`, `f64`, `i32` and `u32`.
//!
//! Not a libtest harness: every rank must run the same cases in the same
//! order, one at a time. Each rank prints its results and exits non-zero
//! on a failure; rank 0 prints the totals over all ranks. Alone (without
//! `mpirun`) it is rank 0 of 1 and runs what one rank can.
//!
//! `dead-peer`: the last rank exits without a word after the first
//! collective (`--enable-recovery` keeps `mpirun` from killing the rest);
//! the others' next collective must fail with a timeout, and the one after
//! at once with a broken communicator.
//!
//! `late-peer` (also with `--enable-recovery`): cases whose timeouts leave
//! requests pending, so MPI is not finalised: a split one rank comes to
//! late, and a collective whose buffer a kernel holds past the timeout.
//!
//! `stalled-peer` (also with `--enable-recovery`): the last rank agrees to
//! a collective over the views' own memory and never moves its data; the
//! others time out, and their buffers, which MPI may still use, are
//! refused from then on (`collective_mpi/stalled.rs`).

mod common;
#[path = "collective_mpi/plans.rs"]
mod plans;
#[path = "collective_mpi/stalled.rs"]
mod stalled;

use std::time::{Duration, Instant};

use hwqueue::collective::{CollectiveElement, CollectiveError, Communicator, Mpi, Reduction};
use hwqueue::cpu::{CpuBuffer, CpuDevice, CpuProgram, CpuQueue, KernelArgs, WorkGroup};
use hwqueue::{
    Buffer, Device, Error, ExecParams, HardwareQueue, Pod, QueueFactory, TimelineSignal, Timeout,
    View,
};

/// Longer than any case needs; a hang fails the case instead.
const TIMEOUT: Duration = Duration::from_secs(30);
const REDUCTIONS: [Reduction; 4] = [
    Reduction::Sum,
    Reduction::Product,
    Reduction::Min,
    Reduction::Max,
];

struct Ranks {
    comm: Communicator,
    device: CpuDevice,
    rank: usize,
    size: usize,
}

type Outcome = Result<(), String>;

fn main() {
    let mpi = Mpi::init().expect("MPI initialises");
    let world = mpi.world(None).expect("the world communicator");
    world.set_timeout(TIMEOUT);
    let ranks = Ranks {
        rank: world.rank(),
        size: world.size(),
        comm: world,
        device: CpuDevice::new(),
    };
    if ranks.rank == 0 {
        println!(
            "MPI thread support: {}; {} ranks",
            mpi.threading(),
            ranks.size
        );
    }
    let case = std::env::args().nth(1);
    let dead_peer_case = matches!(case.as_deref(), Some("dead-peer" | "stalled-peer"));
    let mut failed = match case.as_deref() {
        Some("dead-peer") => dead_peer(&ranks),
        Some("stalled-peer") => stalled::stalled_peer(&ranks),
        Some("late-peer") => late_peer(&ranks),
        _ => suite(&mpi, &ranks),
    };
    let rank = ranks.rank;
    drop(ranks);
    drop(mpi);
    if dead_peer_case {
        // A timed-out collective left requests to the dead peer: `Mpi`'s
        // drop leaves MPI unfinalised, where `MPI_Finalize` could wait for
        // that peer for ever (OpenMPI's did, about one run in ten).
        let finalized = ::mpi::environment::is_finalized();
        println!("rank {rank}: MPI finalised after the timeout: {finalized}");
        failed |= finalized;
    }
    std::process::exit(i32::from(failed));
}

/// Runs every case; whether any failed on this rank.
fn suite(mpi: &Mpi, ranks: &Ranks) -> bool {
    let mut cases: Vec<(String, Outcome)> = Vec::new();
    let mut run = |name: String, outcome: Outcome| cases.push((name, outcome));
    run(
        "a world communicator made with no bound (Duration::MAX)".into(),
        unbounded_world(mpi, ranks),
    );
    for_each_type(ranks, &mut run);
    run(
        "interleaved with kernels on two queues".into(),
        interleaved(ranks),
    );
    plans::cases(ranks, &mut run);
    run(
        "shapes rejected at record time".into(),
        shapes_rejected(ranks),
    );
    if ranks.size > 1 {
        run("ranks that disagree fail".into(), disagreement(ranks));
        run(
            "a collective one rank will not run still takes its place, failed".into(),
            refused_batch(ranks),
        );
        run(
            "a failed batch fails the signals before a collective before forfeiting it".into(),
            forfeited_in_place(ranks),
        );
        run(
            "a send one rank skips still meets its peer's receive, failed".into(),
            skipped_send(ranks),
        );
    }
    run(
        "engines without collectives refuse them".into(),
        unsupported(ranks),
    );
    run("split into even and odd ranks".into(), split(ranks));
    if ranks.size > 1 {
        run(
            "sends and receives one after another run as a group".into(),
            p2p_groups(ranks),
        );
    }
    run(
        "a split's color or key above i32::MAX fails every rank".into(),
        split_out_of_range(ranks),
    );
    let failed: Vec<_> = cases.iter().filter(|(_, o)| o.is_err()).collect();
    for (name, outcome) in &failed {
        println!(
            "rank {}: FAILED {name}: {}",
            ranks.rank,
            outcome.as_ref().unwrap_err()
        );
    }
    // The totals over all ranks, by hwqueue itself.
    let counts = [(cases.len() - failed.len()) as u32, failed.len() as u32];
    match reduce_counts(ranks, &counts) {
        Ok([passed, failed]) if ranks.rank == 0 => println!(
            "collectives: {passed} passed, {failed} failed ({} cases x {} ranks)",
            cases.len(),
            ranks.size
        ),
        Ok(_) => {}
        Err(error) => println!("rank {}: the totals failed: {error}", ranks.rank),
    }
    !failed.is_empty()
}

/// `Mpi::world(Some(Duration::MAX))`, a caller's "no bound", makes a
/// communicator over every rank (it overflowed the deadline and panicked
/// before `clamp_timeout`).
fn unbounded_world(mpi: &Mpi, ranks: &Ranks) -> Outcome {
    let world = mpi.world(Some(Duration::MAX)).map_err(text)?;
    if (world.rank(), world.size()) != (ranks.rank, ranks.size) {
        return Err(format!(
            "rank {} of {}, want {} of {}",
            world.rank(),
            world.size(),
            ranks.rank,
            ranks.size
        ));
    }
    Ok(())
}

fn reduce_counts(ranks: &Ranks, counts: &[u32; 2]) -> Result<[u32; 2], String> {
    let (send, recv) = (buffer::<u32>(ranks, 2), buffer::<u32>(ranks, 2));
    send.write_from(counts).map_err(text)?;
    let mut queue = ranks.device.compute_queue().map_err(text)?;
    let done = ranks.device.new_signal(0).map_err(text)?;
    queue
        .all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv)
        .signal(&done, 1);
    queue.submit().map_err(text)?;
    done.wait(1, Timeout::Forever).map_err(text)?;
    let out = recv.to_vec::<u32>().map_err(text)?;
    Ok([out[0], out[1]])
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

fn buffer<T: Pod>(ranks: &Ranks, len: usize) -> CpuBuffer {
    ranks.device.alloc(len * size_of::<T>()).expect("a buffer")
}

/// A view of `len` elements at element `at` of a buffer of `at + len + 3`.
fn view_in<T: Pod>(ranks: &Ranks, at: usize, len: usize) -> View<hwqueue::cpu::Cpu> {
    let size = size_of::<T>();
    let buffer = buffer::<T>(ranks, at + len + 3);
    View::new(&buffer, at * size, len * size).expect("a view")
}

/// Element types the cases run over, with exact arithmetic on small
/// integers so every reduction has one right answer.
trait Element: CollectiveElement + PartialEq + std::fmt::Debug {
    fn from_small(v: u32) -> Self;
    fn combine(reduction: Reduction, a: Self, b: Self) -> Self;
}

macro_rules! element {
    ($($ty:ty),*) => {$(
        impl Element for $ty {
            fn from_small(v: u32) -> Self {
                v as $ty
            }
            fn combine(reduction: Reduction, a: Self, b: Self) -> Self {
                match reduction {
                    Reduction::Sum => a + b,
                    Reduction::Product => a * b,
                    Reduction::Min => if b < a { b } else { a },
                    Reduction::Max => if b > a { b } else { a },
                }
            }
        }
    )*};
}
element!(f32, f64, i32, u32);

/// 16-bit floats (the `half` feature), reduced as hwqueue reduces them: in
/// `f32`, rounded back at each step. Inputs 1 to 4 become -2, -1, 1, 2:
/// signed, so a min or max over the bits as integers (MPI's own
/// `MPI_MIN` on `MPI_UINT16_T`) would fail, and every sum and product of
/// 4 ranks' (within -16..=16) is exact in both, so the order the ranks
/// combine in does not matter.
#[cfg(feature = "half")]
macro_rules! half_element {
    ($($ty:ty),*) => {$(
        impl Element for $ty {
            fn from_small(v: u32) -> Self {
                let v = v as f32 - 2.0;
                <$ty>::from_f32(if v <= 0.0 { v - 1.0 } else { v })
            }
            fn combine(reduction: Reduction, a: Self, b: Self) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                match reduction {
                    Reduction::Sum => <$ty>::from_f32(x + y),
                    Reduction::Product => <$ty>::from_f32(x * y),
                    Reduction::Min => if b < a { b } else { a },
                    Reduction::Max => if b > a { b } else { a },
                }
            }
        }
    )*};
}
#[cfg(feature = "half")]
half_element!(hwqueue::half::f16, hwqueue::half::bf16);

/// Rank `rank`'s input: values 1 to 4, so a product of 4 ranks is exact.
fn input<T: Element>(rank: usize, len: usize, salt: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_small(((i * 7 + rank * 3 + salt) % 4 + 1) as u32))
        .collect()
}

fn reduced<T: Element>(reduction: Reduction, size: usize, len: usize, salt: usize) -> Vec<T> {
    (1..size).fold(input::<T>(0, len, salt), |acc, rank| {
        acc.into_iter()
            .zip(input::<T>(rank, len, salt))
            .map(|(a, b)| T::combine(reduction, a, b))
            .collect()
    })
}

/// Records with `record`, submits, and waits for the batch's signal.
fn run_batch(ranks: &Ranks, record: impl FnOnce(&mut CpuQueue)) -> Result<(), Error> {
    let mut queue = ranks.device.compute_queue()?;
    let done = ranks.device.new_signal(0)?;
    record(&mut queue);
    queue.signal(&done, 1);
    queue.submit()?;
    done.wait(1, Timeout::Forever)
}

fn check<T: Element>(what: &str, got: Vec<T>, want: Vec<T>) -> Outcome {
    if got == want {
        Ok(())
    } else {
        let at = got.iter().zip(&want).position(|(g, w)| g != w);
        Err(format!(
            "{what}: {} elements, first difference at {at:?} (got {:?}, want {:?})",
            got.len(),
            at.map(|i| &got[i]),
            at.map(|i| &want[i])
        ))
    }
}

fn for_each_type(ranks: &Ranks, run: &mut impl FnMut(String, Outcome)) {
    cases_of::<f32>(ranks, "f32", run);
    cases_of::<f64>(ranks, "f64", run);
    cases_of::<i32>(ranks, "i32", run);
    cases_of::<u32>(ranks, "u32", run);
    #[cfg(feature = "half")]
    {
        cases_of::<hwqueue::half::f16>(ranks, "f16", run);
        cases_of::<hwqueue::half::bf16>(ranks, "bf16", run);
    }
}

/// Every operation (every reduction of the reducing ones) over `T`, on
/// views at odd offsets, against the host's reference.
fn cases_of<T: Element>(ranks: &Ranks, name: &str, run: &mut impl FnMut(String, Outcome)) {
    let (rank, size) = (ranks.rank, ranks.size);
    for (salt, reduction) in REDUCTIONS.into_iter().enumerate() {
        let outcome = at_each_len(|len| {
            let (send, recv) = (view_in::<T>(ranks, 5, len), view_in::<T>(ranks, 1, len));
            send.write_from(&input::<T>(rank, len, salt))
                .map_err(text)?;
            run_batch(ranks, |q| {
                q.all_reduce::<T, _, _>(&ranks.comm, reduction, &send, &recv);
            })
            .map_err(text)?;
            check(
                "all_reduce",
                recv.to_vec::<T>().map_err(text)?,
                reduced(reduction, size, len, salt),
            )
        });
        run(format!("all_reduce {} {name}", reduction.name()), outcome);

        let outcome = at_each_len(|len| {
            let view = view_in::<T>(ranks, 3, len);
            view.write_from(&input::<T>(rank, len, salt))
                .map_err(text)?;
            run_batch(ranks, |q| {
                q.all_reduce::<T, _, _>(&ranks.comm, reduction, &view, &view);
            })
            .map_err(text)?;
            check(
                "in place",
                view.to_vec::<T>().map_err(text)?,
                reduced(reduction, size, len, salt),
            )
        });
        run(
            format!("all_reduce in place {} {name}", reduction.name()),
            outcome,
        );

        let outcome = at_each_len(|len| {
            let (send, recv) = (
                view_in::<T>(ranks, 2, len * size),
                view_in::<T>(ranks, 7, len),
            );
            send.write_from(&input::<T>(rank, len * size, salt))
                .map_err(text)?;
            run_batch(ranks, |q| {
                q.reduce_scatter::<T, _, _>(&ranks.comm, reduction, &send, &recv);
            })
            .map_err(text)?;
            let all = reduced::<T>(reduction, size, len * size, salt);
            check(
                "reduce_scatter",
                recv.to_vec::<T>().map_err(text)?,
                all[rank * len..][..len].to_vec(),
            )
        });
        run(
            format!("reduce_scatter {} {name}", reduction.name()),
            outcome,
        );
    }
    let outcome = at_each_len(|len| {
        let (send, recv) = (
            view_in::<T>(ranks, 1, len),
            view_in::<T>(ranks, 4, len * size),
        );
        send.write_from(&input::<T>(rank, len, 9)).map_err(text)?;
        run_batch(ranks, |q| {
            q.all_gather::<T, _, _>(&ranks.comm, &send, &recv);
        })
        .map_err(text)?;
        let want: Vec<T> = (0..size).flat_map(|r| input::<T>(r, len, 9)).collect();
        check("all_gather", recv.to_vec::<T>().map_err(text)?, want)
    });
    run(format!("all_gather {name}"), outcome);

    for root in [0, size - 1] {
        let outcome = at_each_len(|len| {
            let view = view_in::<T>(ranks, 6, len);
            view.write_from(&input::<T>(rank, len, 11)).map_err(text)?;
            run_batch(ranks, |q| {
                q.broadcast::<T, _>(&ranks.comm, root, &view);
            })
            .map_err(text)?;
            check(
                "broadcast",
                view.to_vec::<T>().map_err(text)?,
                input::<T>(root, len, 11),
            )
        });
        run(format!("broadcast from {root} {name}"), outcome);
    }

    if size > 1 && size % 2 == 0 {
        // Pairs (0, 1), (2, 3), ...: even ranks send first, odd ones
        // receive first; then the other way round.
        let peer = rank ^ 1;
        let outcome = at_each_len(|len| {
            let (send, recv) = (view_in::<T>(ranks, 2, len), view_in::<T>(ranks, 9, len));
            send.write_from(&input::<T>(rank, len, 13)).map_err(text)?;
            run_batch(ranks, |q| {
                if rank % 2 == 0 {
                    q.send::<T, _>(&ranks.comm, peer, &send)
                        .recv::<T, _>(&ranks.comm, peer, &recv);
                } else {
                    q.recv::<T, _>(&ranks.comm, peer, &recv)
                        .send::<T, _>(&ranks.comm, peer, &send);
                }
            })
            .map_err(text)?;
            check(
                "send/recv",
                recv.to_vec::<T>().map_err(text)?,
                input::<T>(peer, len, 13),
            )
        });
        run(format!("send/recv between pairs {name}"), outcome);
    }
}

/// Runs a case at each of [`LENS`]: the first error, naming the length.
fn at_each_len(mut case: impl FnMut(usize) -> Outcome) -> Outcome {
    LENS.into_iter()
        .try_for_each(|len| case(len).map_err(|error| format!("{len} elements: {error}")))
}

/// The lengths each case runs at: one whose every send view fits the
/// description exchange's inline room (1 KiB; a `reduce_scatter` of 4
/// ranks' f64 sends 29 x 4 x 8 = 928 bytes), so the ranks finish it
/// there, and one that goes through MPI's own collective (1003 f16 are
/// 2006 bytes: MPI's, with hwqueue's 16-bit operations).
const LENS: [usize; 2] = [29, 1003];

/// `x[i] *= s` over the group's range (f32).
fn scale(group: &WorkGroup, args: &KernelArgs<'_>) {
    let range = group.global_range(0);
    let end = range.end.min(args.buffer(0).len::<f32>());
    let factor: f32 = args.scalar(0);
    // SAFETY: each group writes only its own range.
    let x = unsafe { args.buffer(0).slice_mut::<f32>(range.start.min(end)..end) };
    x.iter_mut().for_each(|x| *x *= factor);
}

/// Two queues per rank: A scales the input by `rank + 1` and signals; B
/// waits for it, all-reduces (sum), and signals; A waits for that and
/// scales the result by 2. B is submitted first, so only the signals
/// order it after A's kernel; A's second kernel only sees the sum if the
/// collective really completed before B's signal.
fn interleaved(ranks: &Ranks) -> Outcome {
    let (rank, size, len) = (ranks.rank, ranks.size, 4096);
    let scale_program = CpuProgram::from_fn("scale", 1, 1, scale);
    let mut a = ranks.device.compute_queue().map_err(text)?;
    let mut b = ranks.device.compute_queue().map_err(text)?;
    let (scaled, reduced, done) = (
        ranks.device.new_signal(0).map_err(text)?,
        ranks.device.new_signal(0).map_err(text)?,
        ranks.device.new_signal(0).map_err(text)?,
    );
    let (x, sum) = (buffer::<f32>(ranks, len), buffer::<f32>(ranks, len));
    for step in 1..=3u64 {
        x.write_from(&input::<f32>(rank, len, step as usize))
            .map_err(text)?;
        b.wait(&scaled, step)
            .all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &x, &sum)
            .signal(&reduced, step);
        b.submit().map_err(text)?;
        let params = ExecParams::new_1d(len as u32, 256);
        a.exec(&scale_program, &[&x], &[(rank as f32 + 1.0).into()], params)
            .signal(&scaled, step)
            .wait(&reduced, step)
            .exec(&scale_program, &[&sum], &[2.0f32.into()], params)
            .signal(&done, step);
        a.submit().map_err(text)?;
        done.wait(step, Timeout::Forever).map_err(text)?;
        let want: Vec<f32> = (0..len)
            .map(|i| {
                let total: f32 = (0..size)
                    .map(|r| input::<f32>(r, len, step as usize)[i] * (r as f32 + 1.0))
                    .sum();
                total * 2.0
            })
            .collect();
        check(
            &format!("step {step}"),
            sum.to_vec::<f32>().map_err(text)?,
            want,
        )?;
    }
    Ok(())
}

/// The error a batch was rejected with, as text, or why it was not.
fn rejection(ranks: &Ranks, record: impl FnOnce(&mut CpuQueue)) -> Result<String, String> {
    let mut queue = ranks.device.compute_queue().map_err(text)?;
    record(&mut queue);
    let submitted = queue.submit();
    // A refused collective still takes its place, forfeited by the worker:
    // the next queue's must come after it, as ordered queues' do.
    let _ = queue.synchronize();
    match submitted {
        Err(Error::BatchRejected { cause }) => match &*cause {
            Error::Collective(CollectiveError::Invalid { rank, .. }) if *rank == ranks.rank => {
                Ok(cause.to_string())
            }
            other => Err(format!("rejected with another error: {other}")),
        },
        other => Err(format!("not rejected: {other:?}")),
    }
}

/// Shapes one rank can see are wrong reject the batch, naming the rank
/// and the sizes; nothing runs (each still takes its place, and every
/// rank forfeits it alike).
fn shapes_rejected(ranks: &Ranks) -> Outcome {
    let (size, comm) = (ranks.size, &ranks.comm);
    let (a, b) = (
        buffer::<f32>(ranks, 64),
        buffer::<f32>(ranks, 64 * size + 1),
    );
    let expect = |what: &str, message: Result<String, String>, needles: &[&str]| -> Outcome {
        let message = message.map_err(|e| format!("{what}: {e}"))?;
        for needle in needles {
            if !message.contains(needle) {
                return Err(format!("{what}: {message:?} does not say {needle:?}"));
            }
        }
        Ok(())
    };
    let rank = format!("rank {} of {size}", ranks.rank);
    let half = View::new(&b, 0, 128).map_err(text)?;
    expect(
        "all_reduce of unequal views",
        rejection(ranks, |q| {
            q.all_reduce::<f32, _, _>(comm, Reduction::Sum, &a, &half);
        }),
        &[&rank, "128 bytes", "256 bytes"],
    )?;
    expect(
        "all_gather into a short view",
        rejection(ranks, |q| {
            q.all_gather::<f32, _, _>(comm, &a, &View::new(&b, 0, 256 * size - 4).unwrap());
        }),
        &[&rank, "group's size times"],
    )?;
    expect(
        "reduce_scatter from a wrong view",
        rejection(ranks, |q| {
            q.reduce_scatter::<f32, _, _>(comm, Reduction::Max, &b, &a);
        }),
        &[&rank, "send view"],
    )?;
    expect(
        "a part of an element",
        rejection(ranks, |q| {
            q.broadcast::<f64, _>(comm, 0, &View::new(&a, 0, 12).unwrap());
        }),
        &[&rank, "12 bytes", "8-byte f64"],
    )?;
    expect(
        "a root outside the group",
        rejection(ranks, |q| {
            q.broadcast::<u32, _>(comm, size, &a);
        }),
        &[&rank, &format!("rank {size} is not in the group")],
    )?;
    expect(
        "a send to itself",
        rejection(ranks, |q| {
            q.send::<u32, _>(comm, ranks.rank, &a);
        }),
        &[&rank, "cannot send itself"],
    )?;
    expect(
        "views that partly overlap",
        rejection(ranks, |q| {
            let first = View::new(&a, 0, 128).unwrap();
            let second = View::new(&a, 64, 128).unwrap();
            q.all_reduce::<f32, _, _>(comm, Reduction::Sum, &first, &second);
        }),
        &[&rank, "overlap"],
    )
}

/// The signal of a batch that must fail, and the collective error it
/// failed with.
fn failure_of(
    ranks: &Ranks,
    record: impl FnOnce(&mut CpuQueue),
) -> Result<CollectiveError, String> {
    match run_batch(ranks, record) {
        Err(Error::SignalFailed { cause, .. }) => match &*cause {
            Error::Collective(error) => Ok(error.clone()),
            other => Err(format!("failed with another error: {other}")),
        },
        other => Err(format!("did not fail: {other:?}")),
    }
}

/// Rank 0 records 256 elements where the others record 128, then an
/// `i32` where they record `f32`: every rank's batch fails with both sides
/// named, and the communicator works after.
fn disagreement(ranks: &Ranks) -> Outcome {
    let rank = ranks.rank;
    let count = if rank == 0 { 256 } else { 128 };
    let (send, recv) = (buffer::<f32>(ranks, count), buffer::<f32>(ranks, count));
    // Every batch runs on every rank whatever the one before did, so the
    // ranks stay in step.
    let by_count = failure_of(ranks, |q| {
        q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv);
    });
    let (send, recv) = (buffer::<f32>(ranks, 128), buffer::<f32>(ranks, 128));
    let by_type = failure_of(ranks, |q| {
        if rank == 1 {
            q.all_reduce::<i32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv);
        } else {
            q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv);
        }
    });
    // Nothing was left pending: the next collective runs.
    let ones = buffer::<u32>(ranks, 8);
    ones.write_from(&[1u32; 8]).map_err(text)?;
    let after = run_batch(ranks, |q| {
        q.all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &ones);
    });
    match by_count? {
        CollectiveError::Mismatch {
            rank: r,
            peer,
            here,
            there,
        } if r == rank
            && peer == usize::from(rank == 0)
            && here.contains(&format!("{count} f32"))
            && there.contains(if rank == 0 { "128 f32" } else { "256 f32" }) => {}
        other => return Err(format!("count mismatch: {other}")),
    }
    // Rank 1 disagrees with rank 0 first; every other rank with rank 1.
    let (mine, theirs) = if rank == 1 {
        ("i32", "f32")
    } else {
        ("f32", "i32")
    };
    match by_type? {
        CollectiveError::Mismatch {
            peer, here, there, ..
        } if peer == usize::from(rank != 1) && here.contains(mine) && there.contains(theirs) => {}
        other => return Err(format!("type mismatch: {other}")),
    }
    after.map_err(text)?;
    check(
        "after",
        ones.to_vec::<u32>().map_err(text)?,
        vec![ranks.size as u32; 8],
    )
}

/// That `comm` runs on: an all_reduce of ones over it sums to its size.
fn runs_on(ranks: &Ranks, comm: &Communicator) -> Outcome {
    let ones = buffer::<u32>(ranks, 4);
    ones.write_from(&[1; 4]).map_err(text)?;
    runs_on_with(ranks, comm, &ones)
}

/// [`runs_on`] over `ones`, four ones.
fn runs_on_with(ranks: &Ranks, comm: &Communicator, ones: &CpuBuffer) -> Outcome {
    run_batch(ranks, |q| {
        q.all_reduce::<u32, _, _>(comm, Reduction::Sum, ones, ones);
    })
    .map_err(text)?;
    check(
        "after",
        ones.to_vec::<u32>().map_err(text)?,
        vec![comm.size() as u32; 4],
    )
}

/// Every rank records an all_reduce of ones, and rank 1's batch does not
/// run it: refused at submit (a send to itself after it), refused itself
/// (a receive view of half the length), or failed before it (a wait on a
/// failed value). Rank 1's worker still exchanges it, described failed, so
/// the other ranks' all_reduce fails at once naming rank 1, and the next
/// all_reduce sums ones on every rank. At `d6f873d` the one refused at
/// submit took no place, so rank 1's next all_reduce met the others' first
/// (they got 2 * (size - 1) + 1, no error); the failed one took a place it
/// never used, so every later one mismatched. The one refused itself took
/// no place until `1d3f1b4` (the others got `Ok`).
fn refused_batch(ranks: &Ranks) -> Outcome {
    let ones = buffer::<u32>(ranks, 4);
    for how in ["refused at submit", "refused itself", "failed before it"] {
        ones.write_from(&[1; 4]).map_err(text)?;
        if ranks.rank == 1 {
            let mut queue = ranks.device.compute_queue().map_err(text)?;
            let done = ranks.device.new_signal(0).map_err(text)?;
            if how == "refused itself" {
                let half = View::new(&ones, 0, 8).map_err(text)?;
                queue
                    .all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &half)
                    .signal(&done, 1);
                match queue.submit() {
                    Err(Error::BatchRejected { .. }) => {}
                    other => return Err(format!("the batch was not refused: {other:?}")),
                }
            } else if how == "refused at submit" {
                queue
                    .all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &ones)
                    .send::<u32, _>(&ranks.comm, 1, &ones)
                    .signal(&done, 1);
                match queue.submit() {
                    Err(Error::BatchRejected { .. }) => {}
                    other => return Err(format!("the batch was not refused: {other:?}")),
                }
            } else {
                let failed = ranks.device.new_signal(0).map_err(text)?;
                failed.fail(
                    1,
                    Error::Abandoned {
                        reason: "failed by the test",
                    },
                );
                queue
                    .wait(&failed, 1)
                    .all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &ones)
                    .signal(&done, 1);
                queue.submit().map_err(text)?;
            }
            if done.wait(1, TIMEOUT).is_ok() {
                return Err(format!("{how}: rank 1's batch ran"));
            }
            // Its worker has forfeited the all_reduce once it is idle (the
            // failed batch is reported here, the refused one was at submit).
            match queue.synchronize() {
                Ok(()) | Err(Error::QueueFailed { .. }) => {}
                Err(error) => return Err(format!("{how}: synchronize: {error}")),
            }
        } else {
            match run_batch(ranks, |q| {
                q.all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &ones);
            }) {
                // Named as rank 1 recorded it (a refused one too).
                Err(error)
                    if error.to_string().contains("failed on its rank")
                        && error
                            .to_string()
                            .contains("rank 1's all_reduce (sum) of 4 u32") => {}
                other => {
                    let got = ones.to_vec::<u32>().map_err(text)?;
                    return Err(format!(
                        "{how}: the all_reduce did not fail naming rank 1: {other:?}, \
                         data {got:?}"
                    ));
                }
            }
        }
        ones.write_from(&[1; 4]).map_err(text)?;
        runs_on_with(ranks, &ranks.comm, &ones).map_err(|e| format!("{how}, then: {e}"))?;
    }
    Ok(())
}

/// Rank 1's queue `a` fails at its first command (a wait on a failed
/// value), before a signal `s`, an all_reduce over the world and a last
/// signal; its queue `b` waits on `s`, then all_reduces over `other`. The
/// other ranks all_reduce over `other`, then over the world. `a` fails `s`
/// before it forfeits its all_reduce, as it would have set `s` before
/// running it: `b` then fails and forfeits its own, the others' two fail
/// at once naming rank 1, and both communicators run on. On `a7239ff`
/// `a` forfeited first, waiting for the others' all_reduce over the
/// world, which came after theirs over `other`, which waited for `b`'s,
/// which waited for `s`: until `other`'s timeout.
fn forfeited_in_place(ranks: &Ranks) -> Outcome {
    let other = (ranks.comm.split(Some(0), ranks.rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    other.set_timeout(Duration::from_secs(5));
    let ones = buffer::<u32>(ranks, 4);
    ones.write_from(&[1; 4]).map_err(text)?;
    if ranks.rank == 1 {
        let device = &ranks.device;
        let (mut a, mut b) = (device.compute_queue(), device.compute_queue());
        let (a, b) = (a.as_mut().map_err(text)?, b.as_mut().map_err(text)?);
        let [failed, s, a_done, b_done] = [(); 4].map(|()| device.new_signal(0).expect("a signal"));
        let reason = "failed by the test";
        failed.fail(1, Error::Abandoned { reason });
        a.wait(&failed, 1)
            .signal(&s, 1)
            .all_reduce::<u32, _, _>(&ranks.comm, Reduction::Sum, &ones, &ones)
            .signal(&a_done, 1)
            .submit()
            .map_err(text)?;
        b.wait(&s, 1)
            .all_reduce::<u32, _, _>(&other, Reduction::Sum, &ones, &ones)
            .signal(&b_done, 1)
            .submit()
            .map_err(text)?;
        for (name, done) in [("a", &a_done), ("b", &b_done)] {
            if done.wait(1, TIMEOUT).is_ok() {
                return Err(format!("queue {name}'s batch ran"));
            }
        }
        for queue in [a, b] {
            match queue.synchronize() {
                Ok(()) | Err(Error::QueueFailed { .. }) => {}
                Err(error) => return Err(format!("synchronize: {error}")),
            }
        }
    } else {
        for (name, comm) in [("other", &other), ("the world", &ranks.comm)] {
            match run_batch(ranks, |q| {
                q.all_reduce::<u32, _, _>(comm, Reduction::Sum, &ones, &ones);
            }) {
                Err(error) if error.to_string().contains("failed on its rank") => {}
                outcome => return Err(format!("over {name}: {outcome:?}")),
            }
        }
    }
    for comm in [&ranks.comm, &other] {
        ones.write_from(&[1; 4]).map_err(text)?;
        runs_on_with(ranks, comm, &ones)?;
    }
    Ok(())
}

/// Rank 0's batch fails before its send to rank 1 (a wait on a failed
/// signal); then it sends again. Rank 1's first receive must fail, not
/// take the second send's data (as it did before sends and receives were
/// forfeited: `Ok`, with the second send's data, and its second receive
/// timed out), and its second receive gets the second send's data.
fn skipped_send(ranks: &Ranks) -> Outcome {
    let pair = ranks.rank < 2;
    let comm = ranks
        .comm
        .split(pair.then_some(0), ranks.rank as u32)
        .map_err(text)?;
    let Some(comm) = comm else {
        return Ok(());
    };
    comm.set_timeout(Duration::from_secs(5));
    let (first, second) = ([7u32; 4], [9u32; 4]);
    if ranks.rank == 0 {
        let (out, again) = (buffer::<u32>(ranks, 4), buffer::<u32>(ranks, 4));
        out.write_from(&first).map_err(text)?;
        again.write_from(&second).map_err(text)?;
        let failed = ranks.device.new_signal(0).map_err(text)?;
        failed.fail(
            1,
            Error::Abandoned {
                reason: "failed by the test",
            },
        );
        match run_batch(ranks, |q| {
            q.wait(&failed, 1).send::<u32, _>(&comm, 1, &out);
        }) {
            Err(Error::SignalFailed { .. }) => {}
            outcome => return Err(format!("the failing batch: {outcome:?}")),
        }
        run_batch(ranks, |q| {
            q.send::<u32, _>(&comm, 1, &again);
        })
        .map_err(|error| format!("the second send: {error}"))
    } else {
        let (into, again) = (buffer::<u32>(ranks, 4), buffer::<u32>(ranks, 4));
        match run_batch(ranks, |q| {
            q.recv::<u32, _>(&comm, 0, &into);
        }) {
            Err(error) if error.to_string().contains("rank 0") => {}
            outcome => {
                let got = into.to_vec::<u32>().map_err(text)?;
                return Err(format!("the first receive: {outcome:?}, data {got:?}"));
            }
        }
        check(
            "the first receive",
            into.to_vec().map_err(text)?,
            vec![0u32; 4],
        )?;
        run_batch(ranks, |q| {
            q.recv::<u32, _>(&comm, 0, &again);
        })
        .map_err(|error| format!("the second receive: {error}"))?;
        check(
            "the second receive",
            again.to_vec().map_err(text)?,
            second.to_vec(),
        )
    }
}

/// The last rank calls `split` after its peers' 1 s timeout passed. They
/// fail the description exchange and leave it pending; their next MPI
/// calls (the next cases) complete it for the late rank, which then found
/// its exchange agreed and blocked for ever in `MPI_Comm_split`, which
/// they never call (the suite hung on 2c009af). Every rank must fail with
/// a timeout naming the split (it was named "all_gather of 0 u32").
fn late_split(ranks: &Ranks) -> Outcome {
    let child = (ranks.comm.split(Some(0), ranks.rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    child.set_timeout(Duration::from_secs(1));
    if ranks.rank == ranks.size - 1 {
        std::thread::sleep(Duration::from_millis(1500));
    }
    match child.split(Some(0), 0) {
        Err(Error::Collective(CollectiveError::Timeout { op, .. })) if op.contains("split") => {
            Ok(())
        }
        Ok(_) => Err("the late split succeeded".into()),
        Err(error) => Err(format!("the late split: {error}")),
    }
}

/// Even and odd ranks split into two groups, ranked in reverse; an
/// all_gather in each sees its members only, in the new order; the last
/// rank joins neither and gets `None`... when the group has more than 2.
fn split(ranks: &Ranks) -> Outcome {
    let (rank, size) = (ranks.rank, ranks.size);
    let leaves = size > 2 && rank == size - 1;
    let color = (!leaves).then_some((rank % 2) as u32);
    let key = (size - rank) as u32;
    let group = ranks.comm.split(color, key).map_err(text)?;
    let Some(group) = group else {
        return if leaves {
            Ok(())
        } else {
            Err("split gave no communicator to a rank with a color".into())
        };
    };
    if leaves {
        return Err("the rank without a color got a communicator".into());
    }
    let members: Vec<usize> = (0..size)
        .rev()
        .filter(|&r| r % 2 == rank % 2 && !(size > 2 && r == size - 1))
        .collect();
    if group.size() != members.len() || members[group.rank()] != rank {
        return Err(format!(
            "rank {rank} is rank {} of {} in its group; want {:?}",
            group.rank(),
            group.size(),
            members
        ));
    }
    let (send, recv) = (buffer::<u32>(ranks, 1), buffer::<u32>(ranks, members.len()));
    send.write_from(&[rank as u32]).map_err(text)?;
    run_batch(ranks, |q| {
        q.all_gather::<u32, _, _>(&group, &send, &recv);
    })
    .map_err(text)?;
    let want: Vec<u32> = members.iter().map(|&r| r as u32).collect();
    check(
        "all_gather in the group",
        recv.to_vec::<u32>().map_err(text)?,
        want,
    )
}

/// A color or key MPI cannot take (above `i32::MAX`) fails the split on
/// every rank at once: the rank that gave it with `Invalid`, the others
/// with a mismatch naming it; and the communicator runs on. On f672715
/// both were clamped to `i32::MAX`: ranks giving different colors above it
/// were put in one group, silently.
fn split_out_of_range(ranks: &Ranks) -> Outcome {
    let rank = ranks.rank;
    let invalid = |what: &str, split: Result<Option<Communicator>, Error>| match split {
        Err(Error::Collective(CollectiveError::Invalid {
            rank: r, reason, ..
        })) if r == rank && reason.contains(what) => Ok(()),
        other => Err(format!(
            "a {what} above i32::MAX: {:?}",
            other.map(|group| group.map(|group| group.size()))
        )),
    };
    // Each rank a color of its own: singletons, were MPI to take them.
    invalid("color", ranks.comm.split(Some(u32::MAX - rank as u32), 0))?;
    // Rank 0's key alone: every other rank learns it from the exchange.
    let key = if rank == 0 { u32::MAX } else { 0 };
    let split = ranks.comm.split(Some(0), key);
    if rank == 0 {
        invalid("key", split)?;
    } else {
        match split {
            Err(Error::Collective(CollectiveError::Mismatch { peer: 0, there, .. }))
                if there.contains("above i32::MAX") => {}
            other => {
                return Err(format!(
                    "a peer's key above i32::MAX: {:?}",
                    other.map(|group| group.map(|group| group.size()))
                ));
            }
        }
    }
    runs_on(ranks, &ranks.comm)
}

/// Sends and receives recorded one after another in a batch run as one
/// group, as over NCCL: a ring (each rank sends to the next and receives
/// from the one before) and an exchange between two ranks that both send
/// first complete. On f672715 each ran alone, in turn, so the ring timed
/// out (every rank's send waited for the next rank's receive, which waited
/// behind its own send) and the exchange failed with "send to rank 1 ...
/// against send to rank 0". A receive overlapping another member's view
/// is refused on both ranks, and the communicator runs on.
fn p2p_groups(ranks: &Ranks) -> Outcome {
    let (rank, size) = (ranks.rank, ranks.size);
    // Its own communicator, with a short timeout: a hang here breaks it
    // alone.
    let comm = ranks.comm.split(Some(0), rank as u32).map_err(text)?;
    let comm = comm.ok_or("the split gave no communicator")?;
    comm.set_timeout(Duration::from_secs(5));
    let (next, before) = ((rank + 1) % size, (rank + size - 1) % size);
    for len in [16, 4096] {
        let (out, into) = (view_in::<u32>(ranks, 1, len), view_in::<u32>(ranks, 2, len));
        out.write_from(&input::<u32>(rank, len, 21)).map_err(text)?;
        run_batch(ranks, |q| {
            q.send::<u32, _>(&comm, next, &out)
                .recv::<u32, _>(&comm, before, &into);
        })
        .map_err(|error| format!("ring of {len}: {error}"))?;
        check(
            "ring",
            into.to_vec().map_err(text)?,
            input::<u32>(before, len, 21),
        )?;
    }
    if size % 2 == 0 {
        let peer = rank ^ 1;
        let (out, into) = (view_in::<u32>(ranks, 0, 64), view_in::<u32>(ranks, 3, 64));
        out.write_from(&input::<u32>(rank, 64, 22)).map_err(text)?;
        run_batch(ranks, |q| {
            q.send::<u32, _>(&comm, peer, &out)
                .recv::<u32, _>(&comm, peer, &into);
        })
        .map_err(|error| format!("pair exchange: {error}"))?;
        check(
            "pair exchange",
            into.to_vec().map_err(text)?,
            input::<u32>(peer, 64, 22),
        )?;
        // A group against the same commands one batch each, received
        // first: its peer's group starts each transfer once that member
        // agreed, as NCCL's groups do, not once all did. Twice: a message
        // MPI sends eagerly, and one it sends only once received.
        for len in [64, 65536] {
            let (out, into) = (view_in::<u32>(ranks, 0, len), view_in::<u32>(ranks, 3, len));
            out.write_from(&input::<u32>(rank, len, 23)).map_err(text)?;
            if rank % 2 == 0 {
                run_batch(ranks, |q| {
                    q.send::<u32, _>(&comm, peer, &out)
                        .recv::<u32, _>(&comm, peer, &into);
                })
            } else {
                run_batch(ranks, |q| {
                    q.recv::<u32, _>(&comm, peer, &into);
                })
                .and_then(|()| {
                    run_batch(ranks, |q| {
                        q.send::<u32, _>(&comm, peer, &out);
                    })
                })
            }
            .map_err(|error| format!("a group against single commands, {len}: {error}"))?;
            check(
                "a group against single commands",
                into.to_vec().map_err(text)?,
                input::<u32>(peer, len, 23),
            )?;
        }
        two_sends_in_order(ranks, &comm, peer)?;
        // One view sent and received into in one group.
        match failure_of(ranks, |q| {
            q.send::<u32, _>(&comm, peer, &out)
                .recv::<u32, _>(&comm, peer, &out);
        })? {
            CollectiveError::Mismatch { peer: p, there, .. }
                if p == peer && there.contains("failed on its rank") => {}
            other => return Err(format!("an overlapping receive: {other}")),
        }
    }
    runs_on(ranks, &comm)
}

use std::sync::atomic::AtomicBool;

static GATE_HOLDING: AtomicBool = AtomicBool::new(false);
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// Holds its buffer (as a CPU kernel does while it runs) until the gate
/// opens.
fn gate(_: &WorkGroup, _: &KernelArgs<'_>) {
    hold_until(&GATE_HOLDING, &GATE_OPEN);
}

static HELD: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

/// Holds its buffer until `RELEASE` (a gate of its own: `gate`'s opens once).
fn hold_until_released(_: &WorkGroup, _: &KernelArgs<'_>) {
    hold_until(&HELD, &RELEASE);
}

/// A kernel's body that holds its buffer: says so in `holding`, then
/// returns once `open` is set.
fn hold_until(holding: &AtomicBool, open: &AtomicBool) {
    use std::sync::atomic::Ordering;
    holding.store(true, Ordering::Release);
    while !open.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Rank 0's send buffer of a 4 KiB all_reduce (over the views' own
/// memory) is held by a kernel of another queue, released only once the
/// all_reduce's batch has settled (or after 10 s). The ranks agree, the
/// peers start their part and time out after 1 s; rank 0 must fail at its
/// deadline too, the kernel still holding the buffer. On c961566 it waited
/// for the buffer without a bound, under the communicator's start lock,
/// until the 10 s release.
fn buffer_held_past_the_timeout(ranks: &Ranks) -> Outcome {
    use std::sync::atomic::Ordering;
    let comm = (ranks.comm.split(Some(0), ranks.rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    comm.set_timeout(Duration::from_secs(1));
    let len = 1024;
    let (send, recv) = (buffer::<f32>(ranks, len), buffer::<f32>(ranks, len));
    if ranks.rank != 0 {
        return match run_batch(ranks, |q| {
            q.all_reduce::<f32, _, _>(&comm, Reduction::Sum, &send, &recv);
        }) {
            Err(_) => Ok(()),
            Ok(()) => Err("the all_reduce ran without rank 0".into()),
        };
    }
    let program = CpuProgram::from_fn("hold", 1, 0, hold_until_released);
    let mut holder = ranks.device.compute_queue().map_err(text)?;
    holder.exec(&program, &[&send], &[], ExecParams::new_1d(1, 1));
    holder.submit().map_err(text)?;
    while !HELD.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let settled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let release = {
        let settled = settled.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !settled.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            RELEASE.store(true, Ordering::Release);
        })
    };
    let outcome = run_batch(ranks, |q| {
        q.all_reduce::<f32, _, _>(&comm, Reduction::Sum, &send, &recv);
    });
    let released_first = RELEASE.load(Ordering::Acquire);
    settled.store(true, Ordering::Release);
    release.join().map_err(|_| "the release thread panicked")?;
    holder.synchronize().map_err(text)?;
    match outcome {
        Err(error) if !released_first && error.to_string().contains("buffers") => Ok(()),
        outcome => Err(format!(
            "{outcome:?}, the kernel released the buffer before: {released_first}"
        )),
    }
}

/// Even ranks send `a` then `b` to their odd peer in one group, while a
/// kernel of another queue holds `a` for 300 ms; the peer receives into
/// `x` then `y` in one group. `b`'s transfer must wait for `a`'s: both
/// move under one tag, and MPI pairs them in the order they were posted.
/// On `9b2571f` `b` started first (its buffer was free) and landed in `x`.
fn two_sends_in_order(ranks: &Ranks, comm: &Communicator, peer: usize) -> Outcome {
    use std::sync::atomic::Ordering;
    let len = 64;
    if ranks.rank.is_multiple_of(2) {
        let (a, b) = (buffer::<u32>(ranks, len), buffer::<u32>(ranks, len));
        a.write_from(&vec![1u32; len]).map_err(text)?;
        b.write_from(&vec![2u32; len]).map_err(text)?;
        let program = CpuProgram::from_fn("gate", 1, 0, gate);
        let mut holder = ranks.device.compute_queue().map_err(text)?;
        holder.exec(&program, &[&a], &[], ExecParams::new_1d(1, 1));
        holder.submit().map_err(text)?;
        while !GATE_HOLDING.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let opener = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            GATE_OPEN.store(true, Ordering::Release);
        });
        let sent = run_batch(ranks, |q| {
            q.send::<u32, _>(comm, peer, &a)
                .send::<u32, _>(comm, peer, &b);
        });
        opener.join().map_err(|_| "the gate's thread panicked")?;
        holder.synchronize().map_err(text)?;
        sent.map_err(|error| format!("two sends: {error}"))
    } else {
        let (x, y) = (buffer::<u32>(ranks, len), buffer::<u32>(ranks, len));
        run_batch(ranks, |q| {
            q.recv::<u32, _>(comm, peer, &x)
                .recv::<u32, _>(comm, peer, &y);
        })
        .map_err(|error| format!("two receives: {error}"))?;
        check("the first send", x.to_vec().map_err(text)?, vec![1u32; len])?;
        check(
            "the second send",
            y.to_vec().map_err(text)?,
            vec![2u32; len],
        )
    }
}

/// A queue of the mock backend (no collectives) refuses one at record
/// time, saying what to do.
fn unsupported(ranks: &Ranks) -> Outcome {
    use common::mock::Mock;
    use hwqueue::Backend;
    let device = Mock::open(0).map_err(text)?;
    let mut queue = device.compute_queue().map_err(text)?;
    let data = device.alloc(16).map_err(text)?;
    queue.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &data, &data);
    match queue.submit() {
        Err(Error::BatchRejected { cause })
            if matches!(
                &*cause,
                Error::Collective(CollectiveError::Unsupported { .. })
            ) && cause.to_string().contains("CPU queue") =>
        {
            Ok(())
        }
        other => Err(format!("not refused as unsupported: {other:?}")),
    }
}

/// See the module docs. The last rank leaves after one collective; each
/// other rank's next one fails with a timeout, and the one after at once.
/// `late-peer` (with `--enable-recovery`): cases whose timeouts leave MPI
/// requests pending, so MPI is not finalised (which `mpirun` reports as
/// an abnormal exit): a split one rank comes to late, and a collective
/// whose buffer a kernel holds past the timeout. Prints `late peer: ok`
/// per rank; whether it failed.
fn late_peer(ranks: &Ranks) -> bool {
    type Case = fn(&Ranks) -> Outcome;
    let cases: [(&str, Case); 2] = [
        ("a split one rank comes to late", late_split),
        (
            "a buffer held past the timeout",
            buffer_held_past_the_timeout,
        ),
    ];
    let failures: Vec<String> = (cases.iter())
        .filter(|_| ranks.size > 1)
        .filter_map(|(name, case)| case(ranks).err().map(|error| format!("{name}: {error}")))
        .collect();
    let rank = ranks.rank;
    match failures.is_empty() {
        true => println!("rank {rank}: late peer: ok"),
        false => println!("rank {rank}: late peer: FAILED {}", failures.join("; ")),
    }
    !failures.is_empty()
}

fn dead_peer(ranks: &Ranks) -> bool {
    let (rank, size) = (ranks.rank, ranks.size);
    let data = buffer::<f32>(ranks, 1024);
    let first = run_batch(ranks, |q| {
        q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &data, &data);
    });
    if let Err(error) = first {
        println!("rank {rank}: FAILED the first collective: {error}");
        return true;
    }
    if rank == size - 1 {
        println!("rank {rank}: exiting without a word");
        // No MPI_Finalize, no goodbye: as a crashed rank.
        std::process::exit(0);
    }
    let timeout = Duration::from_secs(3);
    ranks.comm.set_timeout(timeout);
    let started = Instant::now();
    let timed_out = failure_of(ranks, |q| {
        q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &data, &data);
    });
    let waited = started.elapsed();
    let broken = failure_of(ranks, |q| {
        q.broadcast::<f32, _>(&ranks.comm, 0, &data);
    });
    let ok = matches!(&timed_out, Ok(CollectiveError::Timeout { rank: r, .. }) if *r == rank)
        && matches!(&broken, Ok(CollectiveError::Broken { rank: r, .. }) if *r == rank);
    // Printed, not asserted: how long it took is the timeout's business.
    println!(
        "rank {rank}: dead peer: {} after {waited:.1?} (timeout {timeout:?}): {}; then {}",
        if ok { "ok" } else { "FAILED" },
        timed_out.map_or_else(|e| e, |e| e.to_string()),
        broken.map_or_else(|e| e, |e| e.to_string()),
    );
    !ok
}
