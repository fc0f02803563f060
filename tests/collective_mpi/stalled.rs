//! `stalled-peer`: a peer that agreed to a collective and then never moves
//! its data. The collective runs over the views' own memory (16 KiB, too
//! large to ride along the description exchange), so when the others time
//! out, MPI still has their buffers' memory: each buffer must be refused
//! from then on ([`Error::MemoryLost`]) rather than read, reused or
//! handed to another buffer.
//!
//! The order is made, not hoped for: the last rank holds its receive buffer
//! in a kernel that never returns, then records the collective, so its
//! worker describes the collective (the ranks agree) and then waits for
//! the buffer, never starting MPI's side. Rank 0 releases it over a second
//! communicator once every other rank has seen its failure; it then exits
//! without a word, as a crashed rank, its worker still blocked.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// Elements per view: 16 KiB of f32, over MPI's own collective.
const LEN: usize = 4096;

/// Set by the kernel that holds the last rank's receive buffer.
static HOLDING: AtomicBool = AtomicBool::new(false);

/// Holds its buffer (as every CPU kernel does while it runs) for ever.
fn hold_forever(_: &WorkGroup, _: &KernelArgs<'_>) {
    HOLDING.store(true, Ordering::Release);
    loop {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// See the module docs; whether it failed on this rank.
pub(super) fn stalled_peer(ranks: &Ranks) -> bool {
    let (rank, size) = (ranks.rank, ranks.size);
    match run(ranks) {
        Ok(()) if rank == size - 1 => unreachable!("the stalled rank exits in `stall`"),
        Ok(()) => {
            println!("rank {rank}: stalled peer: ok");
            false
        }
        Err(error) => {
            println!("rank {rank}: stalled peer: FAILED {error}");
            true
        }
    }
}

fn run(ranks: &Ranks) -> Outcome {
    let (rank, size) = (ranks.rank, ranks.size);
    let side = (ranks.comm.split(Some(0), rank as u32).map_err(text)?)
        .ok_or("the split gave no communicator")?;
    let (send, recv) = (buffer::<f32>(ranks, LEN), buffer::<f32>(ranks, LEN));
    send.write_from(&vec![1.0f32; LEN]).map_err(text)?;
    // First, one that completes over the views' memory.
    run_batch(ranks, |q| {
        q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv);
    })
    .map_err(text)?;
    check(
        "the first all_reduce",
        recv.to_vec().map_err(text)?,
        vec![size as f32; LEN],
    )?;
    if rank == size - 1 {
        stall(ranks, &side, &send, &recv)?;
    }
    let timeout = Duration::from_secs(3);
    ranks.comm.set_timeout(timeout);
    let started = Instant::now();
    let timed_out = failure_of(ranks, |q| {
        q.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, &send, &recv);
    });
    let waited = started.elapsed();
    // Printed, not asserted: how long it took is the timeout's business.
    println!("rank {rank}: the all_reduce failed after {waited:.1?} (timeout {timeout:?})");
    let refused = |buffer: &CpuBuffer| match buffer.to_vec::<f32>() {
        Err(Error::MemoryLost { .. }) => Ok(()),
        Ok(read) => Err(format!(
            "a buffer MPI may still use was read ({} elements), not refused",
            read.len()
        )),
        Err(other) => Err(format!(
            "a buffer MPI may still use failed otherwise: {other}"
        )),
    };
    let outcome = match timed_out {
        // In the data phase: the ranks had agreed.
        Ok(CollectiveError::Timeout { rank: r, op, .. })
            if r == rank && !op.contains("exchanging descriptions") =>
        {
            refused(&recv).and_then(|()| refused(&send))
        }
        other => Err(format!("not a timeout while the data moved: {other:?}")),
    };
    // Fresh memory works, and the stalled rank is let go whatever happened.
    let fresh = buffer::<f32>(ranks, 4);
    let fresh_ok = fresh.write_from(&[1.0f32; 4]).map_err(text);
    let grouped = if rank < 2 && size >= 3 {
        group_past_a_lost_buffer(ranks, &side, &send)
    } else {
        Ok(())
    };
    release(ranks, &side)?;
    outcome.and(fresh_ok).and(grouped)
}

/// Ranks 0 and 1, over `side`: rank 0 sends its lost `send` and then a
/// fresh buffer to rank 1, which receives both. The first member fails on
/// both ranks (rank 0 cannot reach its buffer; rank 1 is told so), and the
/// second still moves its data, on a communicator that runs on (`release`
/// uses it next). On 86cdf0c rank 0 held the lost buffer too, for the
/// second member's transfer: the hold failed, broke `side`, and rank 1's
/// second receive timed out.
fn group_past_a_lost_buffer(ranks: &Ranks, side: &Communicator, lost: &CpuBuffer) -> Outcome {
    side.set_timeout(Duration::from_secs(3));
    let fresh = buffer::<u32>(ranks, 16);
    let data: Vec<u32> = (0..16).collect();
    let outcome = if ranks.rank == 0 {
        fresh.write_from(&data).map_err(text)?;
        run_batch(ranks, |q| {
            q.send::<f32, _>(side, 1, lost)
                .send::<u32, _>(side, 1, &fresh);
        })
    } else {
        let into = buffer::<f32>(ranks, LEN);
        run_batch(ranks, |q| {
            q.recv::<f32, _>(side, 0, &into)
                .recv::<u32, _>(side, 0, &fresh);
        })
    };
    let cause = match outcome {
        Err(Error::SignalFailed { cause, .. }) => cause,
        other => return Err(format!("the group past a lost buffer: {other:?}")),
    };
    let expected = match &*cause {
        Error::MemoryLost { .. } => ranks.rank == 0,
        Error::Collective(CollectiveError::Mismatch { peer: 0, there, .. }) => {
            ranks.rank == 1 && there.contains("failed on its rank")
        }
        _ => false,
    };
    if !expected {
        return Err(format!("the group past a lost buffer failed with {cause}"));
    }
    check(
        "the second member's data",
        fresh.to_vec().map_err(text)?,
        data,
    )
}

/// The last rank: holds `recv` in a kernel, records the collective, waits
/// for rank 0's release, and exits.
fn stall(ranks: &Ranks, side: &Communicator, send: &CpuBuffer, recv: &CpuBuffer) -> Outcome {
    let program = CpuProgram::from_fn("hold_forever", 1, 0, hold_forever);
    let mut holder = ranks.device.compute_queue().map_err(text)?;
    holder.exec(&program, &[recv], &[], ExecParams::new_1d(1, 1));
    holder.submit().map_err(text)?;
    while !HOLDING.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut queue = ranks.device.compute_queue().map_err(text)?;
    queue.all_reduce::<f32, _, _>(&ranks.comm, Reduction::Sum, send, recv);
    queue.submit().map_err(text)?;
    release(ranks, side)?;
    println!("rank {}: exiting without a word", ranks.rank);
    std::process::exit(0);
}

/// A broadcast from rank 0 over `side`: rank 0 gets there once it has seen
/// its failure, so the others have too.
fn release(ranks: &Ranks, side: &Communicator) -> Outcome {
    let flag = buffer::<u32>(ranks, 1);
    run_batch(ranks, |q| {
        q.broadcast::<u32, _>(side, 0, &flag);
    })
    .map_err(text)
}
