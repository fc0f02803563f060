//! A group of point-to-point commands over MPI (see `collective::p2p`).
//!
//! Every member's description goes to its peer at once, tagged by its role:
//! a `send`'s under [`TAG_FROM_SENDER`], a `recv`'s under
//! [`TAG_FROM_RECEIVER`], each receiving the other. MPI matches messages of
//! one source, tag and communicator in the order they were sent, so the
//! k-th send to a peer meets that peer's k-th receive from this rank,
//! whatever else the two groups hold and in whatever order. Each member
//! starts its transfer as soon as its own pair of descriptions arrived and
//! agreed: no member waits for another's peer, so a group meets its peers'
//! commands however they recorded them (one batch each, a group of another
//! shape), as NCCL's groups do. The transfers are polled until they
//! complete or the communicator's timeout passes.
//!
//! Agreement is per member and symmetric (each side compares the same two
//! descriptions), so a member that fails fails on both ranks, and neither
//! starts its transfer, while the members that agreed move their data on
//! both: no message is left for a later exchange to meet. A member whose
//! peer never runs the matching command (it sends too, or runs nothing)
//! waits for a description that never comes: the group times out, and the
//! communicator is broken, as for a dead peer.
//!
//! A member's buffers are held from its agreement until the group ends,
//! each taken without waiting (one a kernel holds is tried again the next
//! round): a group holding one buffer never blocks on another, whatever
//! order an `exec` of another queue takes them in.

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

/// Where each member of a group stands while the group starts.
struct Starting {
    /// Two requests a member: its description's receive and send.
    exchange: Vec<ffi::MPI_Request>,
    /// Whether its pair of descriptions arrived (and its verdict was made).
    described: Vec<bool>,
    /// Agreed, waiting for its buffers.
    ready: Vec<usize>,
    /// Started: its transfer's requests are among `transfers`.
    started: Vec<usize>,
    transfers: Vec<ffi::MPI_Request>,
    /// The first member that failed its agreement (on its rank or its
    /// peer's), which the batch fails from.
    refused: Option<Failed>,
}

impl MpiComm {
    /// Runs `plans` (`send`s and `recv`s only) as one group over `views`:
    /// see the module docs. Held: the communicator's point-to-point start
    /// lock, from the exchange until every member started or failed.
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
        let own: Vec<Option<Error>> = (0..plans.len()).map(|i| views.check(i).err()).collect();
        let mine: Vec<[u64; WORDS]> = (plans.iter().zip(&own))
            .map(|(plan, own)| Description::of(plan, own.is_some()).0)
            .collect();
        let start = self.p2p_start.lock();
        // Broken while this waited for the lock: see `run`.
        if let Some(cause) = self.broken.lock().clone() {
            return Err((0, CollectiveError::Broken { rank, cause }.into()));
        }
        let mut theirs = vec![[0u64; WORDS]; plans.len()];
        let mut starting = Starting {
            exchange: vec![null_request(); 2 * plans.len()],
            described: vec![false; plans.len()],
            ready: Vec::new(),
            started: Vec::new(),
            transfers: Vec::new(),
            refused: None,
        };
        let posted =
            self.post_descriptions(rank, plans, &mine, &mut theirs, &mut starting.exchange);
        let outcome = posted.and_then(|()| {
            let agree = |index: usize| verdict(rank, plans, index, &mine, &theirs, &own);
            let limits = (deadline, timeout);
            self.start_members(rank, plans, views, &mut starting, agree, limits)
        });
        // The peers of the members that started start theirs: a failure
        // before this rank started all of its own leaves it out of step
        // with them, so the communicator is done. The batch fails from its
        // first member that failed, this one or an earlier one its peer
        // refused.
        let refused = starting.refused.take();
        let broken = |(at, error): Failed| {
            self.break_with(&error);
            match refused.clone() {
                Some(earlier) if earlier.0 < at => earlier,
                _ => (at, error),
            }
        };
        if let Err((at, error)) = outcome {
            if starting.described.contains(&false) {
                // Descriptions still in flight: MPI's memory now.
                std::mem::forget(theirs);
                std::mem::forget(mine);
            }
            if !starting.started.is_empty() {
                // Those started may still use the memory.
                views.lose();
            }
            // Those started never complete now: the batch fails from the
            // first of them, or from this member.
            let first = starting.started.iter().copied().chain([at]).min();
            return Err(broken((first.unwrap_or(at), error)));
        }
        drop(start);
        if let Some(&first) = starting.started.iter().min() {
            let done = poll(rank, &mut starting.transfers, deadline).and_then(|done| {
                done.then_some(()).ok_or_else(|| {
                    Error::from(CollectiveError::Timeout {
                        rank,
                        op: described(plans, first, ""),
                        waited: timeout,
                    })
                })
            });
            if let Err(error) = done {
                // MPI may still read and write the views: they are MPI's now.
                views.lose();
                return Err(broken((first, error)));
            }
        }
        drop(life);
        refused.map_or(Ok(()), Err)
    }

    /// Polls the descriptions in `exchange` (two requests a member) and
    /// starts each member once its pair arrived and `agree` says so, and
    /// its buffers are free, until every member started or was refused
    /// (into `starting`), or an MPI error, a hold's failure, or the
    /// deadline (`Err`: the member, and why).
    fn start_members(
        &self,
        rank: usize,
        plans: &[HostCollective],
        views: &mut dyn HostGroupViews,
        starting: &mut Starting,
        agree: impl Fn(usize) -> crate::error::Result<()>,
        (deadline, timeout): (Instant, Duration),
    ) -> std::result::Result<(), Failed> {
        let began = Instant::now();
        let mut tries = 0u32;
        loop {
            for index in 0..plans.len() {
                if starting.described[index] {
                    continue;
                }
                let pair = &mut starting.exchange[2 * index..2 * index + 2];
                if !test_all(rank, pair).map_err(|error| (index, error))? {
                    continue;
                }
                starting.described[index] = true;
                match agree(index) {
                    Ok(()) => starting.ready.push(index),
                    // The batch fails from the first, whichever arrived first.
                    Err(error) => {
                        if (starting.refused.as_ref()).is_none_or(|(at, _)| index < *at) {
                            starting.refused = Some((index, error));
                        }
                    }
                }
            }
            if let Some(&first) = starting.ready.first() {
                let held = views.try_hold(&starting.ready);
                if let Some(memory) = held.map_err(|error| (first, error))? {
                    for (&index, &memory) in starting.ready.iter().zip(&memory) {
                        let started = self.start(rank, &plans[index], memory);
                        starting.started.push(index);
                        starting
                            .transfers
                            .extend(started.map_err(|error| (index, error))?);
                    }
                    starting.ready.clear();
                }
            }
            let pending = starting.described.iter().position(|&done| !done);
            let waiting = pending.or(starting.ready.first().copied());
            let Some(stuck) = waiting else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                let what = if pending.is_some() {
                    " (exchanging descriptions)"
                } else {
                    " (waiting for its buffers, which another queue's work holds)"
                };
                let error = CollectiveError::Timeout {
                    rank,
                    op: described(plans, stuck, what),
                    waited: timeout,
                };
                return Err((stuck, error.into()));
            }
            tries = tries.saturating_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else if now - began < Duration::from_millis(20) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Sends each member's description `mine[i]` to its peer and receives
    /// the peer's into `theirs[i]`, under the tags of their roles (see the
    /// module docs): requests `2i` and `2i + 1` of `exchange`. On an
    /// error, the member it was posting, and why (the caller leaks the
    /// messages to MPI).
    fn post_descriptions(
        &self,
        rank: usize,
        plans: &[HostCollective],
        mine: &[[u64; WORDS]],
        theirs: &mut [[u64; WORDS]],
        exchange: &mut [ffi::MPI_Request],
    ) -> std::result::Result<(), Failed> {
        let (count, dtype) = (WORDS as c_int, u64_type());
        for (index, plan) in plans.iter().enumerate() {
            let sends = matches!(plan.op, CollectiveOp::Send { .. });
            let peer = plan.op.peer().unwrap_or(rank) as c_int;
            let (out, back) = if sends {
                (TAG_FROM_SENDER, TAG_FROM_RECEIVER)
            } else {
                (TAG_FROM_RECEIVER, TAG_FROM_SENDER)
            };
            // SAFETY: `theirs[index]` and `mine[index]` are `WORDS` u64s
            // each, in the caller's vectors, which neither move nor grow
            // and live until the requests complete, or forever (leaked on
            // a failure); the communicator is live; each request is
            // written before its call returns.
            check(rank, "MPI_Irecv", unsafe {
                ffi::MPI_Irecv(
                    theirs[index].as_mut_ptr().cast::<c_void>(),
                    count,
                    dtype,
                    peer,
                    back,
                    self.raw.0,
                    &mut exchange[2 * index],
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
                        &mut exchange[2 * index + 1],
                    )
                })
            })
            .map_err(|error| (index, error))?;
        }
        Ok(())
    }
}

/// Whether member `index` may start: its own check (`own`) passed, and
/// its description and its peer's agree.
fn verdict(
    rank: usize,
    plans: &[HostCollective],
    index: usize,
    mine: &[[u64; WORDS]],
    theirs: &[[u64; WORDS]],
    own: &[Option<Error>],
) -> crate::error::Result<()> {
    let peer = plans[index].op.peer().unwrap_or(rank);
    let (here, there) = (Description(mine[index]), Description(theirs[index]));
    match &own[index] {
        Some(error) => Err(error.clone()),
        None if here.agrees(&there, rank, peer) => Ok(()),
        None => Err(CollectiveError::Mismatch {
            rank,
            peer,
            here: here.to_string(),
            there: there.to_string(),
        }
        .into()),
    }
}

/// Whether every request of `requests` completed (each then null).
fn test_all(rank: usize, requests: &mut [ffi::MPI_Request]) -> crate::error::Result<bool> {
    let mut done: c_int = 0;
    // SAFETY: `requests` are live requests (or null ones, which MPI takes
    // as done); statuses are ignored.
    check(rank, "MPI_Testall", unsafe {
        ffi::MPI_Testall(
            requests.len() as c_int,
            requests.as_mut_ptr(),
            &mut done,
            ffi::RSMPI_STATUSES_IGNORE,
        )
    })?;
    Ok(done != 0)
}

/// Member `index` of a group, for errors, with `what` it was doing.
fn described(plans: &[HostCollective], index: usize, what: &str) -> String {
    match plans.len() {
        1 => format!("{}{what}", plans[index].describe()),
        n => format!(
            "{}{what}, command {} of a group of {n} sends and receives",
            plans[index].describe(),
            index + 1
        ),
    }
}
