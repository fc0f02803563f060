//! A group of point-to-point commands over MPI (see `collective::p2p`).
//!
//! Every member's description goes to its peer at once, tagged by its role:
//! a `send`'s under [`TAG_FROM_SENDER`], a `recv`'s under
//! [`TAG_FROM_RECEIVER`], each receiving the other. MPI matches messages of
//! one source, tag and communicator in the order they were sent, so the
//! k-th send to a peer meets that peer's k-th receive from this rank,
//! whatever else the two groups hold and in whatever order. Then every
//! member whose peer agreed starts its transfer, and all are polled
//! together until they complete or the communicator's timeout passes.
//!
//! Agreement is per member and symmetric (each side compares the same two
//! descriptions), so a member that fails fails on both ranks, and neither
//! starts its transfer, while the members that agreed move their data on
//! both: no message is left for a later exchange to meet. A member whose
//! peer never runs the matching command (it sends too, or runs nothing)
//! waits for a description that never comes: the group times out, and the
//! communicator is broken, as for a dead peer.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::super::HostGroupViews;
use super::super::description::{Description, WORDS};
use super::super::mpi_types::{check, u64_type};
use super::super::{CollectiveError, CollectiveOp, Communicator, HostCollective};
use super::exchange::poll;
use super::{MpiComm, null_request};
use crate::error::Error;

/// The tag of the description a `send` sends (and a `recv` receives).
const TAG_FROM_SENDER: c_int = 3;
/// The tag of the description a `recv` sends (and a `send` receives).
const TAG_FROM_RECEIVER: c_int = 4;

/// A member's index in its group, and why it failed.
type Failed = (usize, Error);

impl MpiComm {
    /// Runs `plans` (`send`s and `recv`s only) as one group over `views`:
    /// see the module docs. Held: the communicator's point-to-point start
    /// lock, from the exchange until every transfer started.
    pub(in super::super) fn run_p2p(
        &self,
        communicator: &Communicator,
        plans: &[HostCollective],
        views: &mut dyn HostGroupViews,
    ) -> std::result::Result<(), Failed> {
        let rank = communicator.rank();
        if let Some(index) = plans.iter().position(|plan| plan.op.peer().is_none()) {
            let error = CollectiveError::Invalid {
                rank,
                size: communicator.size(),
                op: plans[index].op.name(),
                reason: "hwqueue's bug: a collective was run in a group of point-to-point \
                         commands"
                    .to_owned(),
            };
            return Err((index, error.into()));
        }
        let life = self.usable(rank).map_err(|error| (0, error))?;
        let timeout = communicator.timeout();
        let deadline = Instant::now() + timeout;
        // A member that cannot reach its memory still describes itself,
        // marked failed, so its peer fails it at once.
        let mut own: Vec<Option<Error>> = (0..plans.len()).map(|i| views.check(i).err()).collect();
        let mine: Vec<[u64; WORDS]> = (plans.iter().zip(&own))
            .map(|(plan, own)| Description::of(plan, own.is_some()).0)
            .collect();
        let start = self.p2p_start.lock();
        // Broken while this waited for the lock: see `run`.
        if let Some(cause) = self.broken.lock().clone() {
            return Err((0, CollectiveError::Broken { rank, cause }.into()));
        }
        let theirs = self.exchange_p2p(rank, plans, mine.clone(), (deadline, timeout))?;
        let mut failed: Option<Failed> = None;
        let mut agreed = Vec::with_capacity(plans.len());
        for (index, plan) in plans.iter().enumerate() {
            let peer = plan.op.peer().unwrap_or(rank);
            let (here, there) = (Description(mine[index]), Description(theirs[index]));
            let verdict = match own[index].take() {
                Some(error) => Err(error),
                None if here.agrees(&there, rank, peer) => Ok(()),
                None => Err(CollectiveError::Mismatch {
                    rank,
                    peer,
                    here: here.to_string(),
                    there: there.to_string(),
                }
                .into()),
            };
            match verdict {
                Ok(()) => agreed.push(index),
                Err(error) => {
                    failed.get_or_insert((index, error));
                }
            }
        }
        let Some(&first) = agreed.first() else {
            return failed.map_or(Ok(()), Err);
        };
        // The peers of the members that agreed start their transfers: a
        // failure before this rank started all of its own leaves it out
        // of step with them, so the communicator is done. The batch fails
        // from its first member that failed, this one or an earlier one
        // that its peer refused.
        let mut broken = |at: usize, error: Error| {
            self.break_with(&error);
            match failed.take() {
                Some(earlier) if earlier.0 < at => earlier,
                _ => (at, error),
            }
        };
        let memory = views.hold(&agreed).map_err(|error| broken(first, error))?;
        let mut requests = Vec::with_capacity(agreed.len());
        for (&index, &memory) in agreed.iter().zip(&memory) {
            match self.start(rank, &plans[index], memory) {
                Ok(started) => requests.extend(started),
                Err(error) => {
                    // Those started may still use the memory.
                    views.lose();
                    return Err(broken(index, error));
                }
            }
        }
        drop(start);
        let done = poll(rank, &mut requests, deadline).and_then(|done| {
            done.then_some(()).ok_or_else(|| {
                Error::from(CollectiveError::Timeout {
                    rank,
                    op: described(&plans[first], plans.len()),
                    waited: timeout,
                })
            })
        });
        if let Err(error) = done {
            // MPI may still read and write the views: they are MPI's now.
            views.lose();
            return Err(broken(first, error));
        }
        drop(life);
        failed.map_or(Ok(()), Err)
    }

    /// Sends each member's description `mine[i]` to its peer and receives
    /// the peer's, under the tags of their roles (see the module docs).
    /// A failure while MPI has the messages breaks the communicator and
    /// leaks them to MPI.
    fn exchange_p2p(
        &self,
        rank: usize,
        plans: &[HostCollective],
        mine: Vec<[u64; WORDS]>,
        (deadline, timeout): (Instant, Duration),
    ) -> std::result::Result<Vec<[u64; WORDS]>, Failed> {
        let mut theirs = vec![[0u64; WORDS]; plans.len()];
        let mut requests = vec![null_request(); 2 * plans.len()];
        let (count, dtype) = (WORDS as c_int, u64_type());
        let mut posted = Ok(());
        for (index, plan) in plans.iter().enumerate() {
            let sends = matches!(plan.op, CollectiveOp::Send { .. });
            let peer = plan.op.peer().unwrap_or(rank) as c_int;
            let (out, back) = if sends {
                (TAG_FROM_SENDER, TAG_FROM_RECEIVER)
            } else {
                (TAG_FROM_RECEIVER, TAG_FROM_SENDER)
            };
            // SAFETY: `theirs[index]` and `mine[index]` are `WORDS` u64s
            // each, whose heap memory neither vector moves (neither grows),
            // live until the requests complete, or forever (leaked below);
            // the communicator is live; each request is written before its
            // call returns.
            posted = check(rank, "MPI_Irecv", unsafe {
                ffi::MPI_Irecv(
                    theirs[index].as_mut_ptr().cast::<c_void>(),
                    count,
                    dtype,
                    peer,
                    back,
                    self.raw.0,
                    &mut requests[2 * index],
                )
            })
            .and_then(|()| {
                // SAFETY: as above.
                check(rank, "MPI_Isend", unsafe {
                    ffi::MPI_Isend(
                        mine[index].as_ptr().cast::<c_void>(),
                        count,
                        dtype,
                        peer,
                        out,
                        self.raw.0,
                        &mut requests[2 * index + 1],
                    )
                })
            })
            .map_err(|error| (index, error));
            if posted.is_err() {
                break;
            }
        }
        let failed = match posted {
            Err(failed) => failed,
            Ok(()) => match poll(rank, &mut requests, deadline) {
                Ok(true) => return Ok(theirs),
                Ok(false) => {
                    let op = described(&plans[0], plans.len());
                    let op = format!("{op} (exchanging descriptions)");
                    let error = CollectiveError::Timeout {
                        rank,
                        op,
                        waited: timeout,
                    };
                    (0, error.into())
                }
                Err(error) => (0, error),
            },
        };
        // The receives may still write `theirs`: MPI's now, and the
        // communicator is done.
        self.break_with(&failed.1);
        std::mem::forget(theirs);
        std::mem::forget(mine);
        Err(failed)
    }
}

/// A group, for errors: its first member, and how many others.
fn described(first: &HostCollective, members: usize) -> String {
    match members {
        1 => first.describe(),
        2 => format!(
            "{} and the point-to-point command after it",
            first.describe()
        ),
        n => format!(
            "{} and the {} point-to-point commands after it",
            first.describe(),
            n - 1
        ),
    }
}
