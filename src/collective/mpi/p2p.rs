//! A group of point-to-point commands over MPI (see `collective::p2p`).
//!
//! Every member's description goes to its peer at once, tagged by its role:
//! a `send`'s under [`TAG_FROM_SENDER`], a `recv`'s under
//! [`TAG_FROM_RECEIVER`], each receiving the other. MPI matches messages of
//! one source, tag and communicator in the order they were sent, so the
//! k-th send to a peer meets that peer's k-th receive from this rank,
//! whatever else the two groups hold and in whatever order. Each member
//! starts its transfer as soon as its own pair of descriptions arrived and
//! agreed, every earlier member to the same peer the same way started or
//! was refused (data moves under one tag, and MPI pairs a peer's messages
//! in the order they were posted), and its buffer is free: no member waits
//! for another peer, so a group meets
//! its peers' commands however they recorded them (one batch each, a group
//! of another shape), as NCCL's groups do. The transfers are polled until
//! they complete or the communicator's timeout passes.
//!
//! Agreement is per member and symmetric (each side compares the same two
//! descriptions), so a member that fails fails on both ranks, and neither
//! starts its transfer, while the members that agreed move their data on
//! both: no message is left for a later exchange to meet. A member whose
//! peer never runs the matching command (it sends too, or runs nothing)
//! waits for a description that never comes: the group times out, and the
//! communicator is broken, as for a dead peer.
//!
//! A member's buffer is held from its start until its transfer completed,
//! taken without waiting (one a kernel holds is tried again the next
//! round): a group holding one buffer never blocks on another, whatever
//! order an `exec` of another queue takes them in, and lets each go as
//! soon as its transfer no longer needs it.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::super::HostGroupViews;
use super::super::description::{Description, WORDS};
use super::super::mpi_types::{check, u64_type};
use super::super::{CollectiveError, CollectiveOp, Communicator, HostCollective};
use super::exchange::{back_off, test_all};
use super::{MpiComm, null_request};
use crate::error::Error;

/// The tag of the description a `send` sends (and a `recv` receives).
const TAG_FROM_SENDER: c_int = 3;
/// The tag of the description a `recv` sends (and a `send` receives).
const TAG_FROM_RECEIVER: c_int = 4;

/// A member's index in its group, and why it failed.
type Failed = (usize, Error);

/// Where a member of a group stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Its pair of descriptions is in flight.
    Described,
    /// Agreed, not started: waiting for an earlier member to the same peer
    /// the same way, or for its buffer.
    Agreed,
    /// Its transfer's requests are `transfers[i]`.
    Started,
    /// Its transfer completed, and its buffer was let go.
    Done,
    /// Refused, on its rank or its peer's: no transfer.
    Refused,
}

/// A group as it runs.
struct Group {
    /// Two requests a member: its description's receive and send.
    exchange: Vec<ffi::MPI_Request>,
    stage: Vec<Stage>,
    /// Per member, its transfer's requests once started.
    transfers: Vec<Vec<ffi::MPI_Request>>,
    /// The first member refused (by index), which the batch fails from.
    refused: Option<Failed>,
}

impl Group {
    /// The members still under way (not done, not refused).
    fn busy(&self) -> impl Iterator<Item = usize> + '_ {
        (self.stage.iter().enumerate())
            .filter(|(_, stage)| !matches!(stage, Stage::Done | Stage::Refused))
            .map(|(index, _)| index)
    }
}

impl MpiComm {
    /// Runs `plans` (`send`s and `recv`s only) as one group over `views`:
    /// see the module docs. Held: the communicator's point-to-point start
    /// lock, from the exchange until every member started or was refused,
    /// or, on a failure, until the communicator is marked broken.
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
        // Held until every member started or was refused, and on a failure
        // until the communicator is marked broken: a group of another
        // queue waiting for it must see that, not post data a peer could
        // pair with what this group left.
        let mut start = Some(self.p2p_start.lock());
        // Broken while this waited for the lock: see `run`.
        if let Some(cause) = self.broken.lock().clone() {
            return Err((0, CollectiveError::Broken { rank, cause }.into()));
        }
        // Written by MPI while their receives are pending: reached only
        // through this pointer, each once its own pair completed.
        let mut theirs = vec![[0u64; WORDS]; plans.len()];
        let theirs_at = theirs.as_mut_ptr();
        let mut group = Group {
            exchange: vec![null_request(); 2 * plans.len()],
            stage: vec![Stage::Described; plans.len()],
            transfers: vec![Vec::new(); plans.len()],
            refused: None,
        };
        let posted = self.post_descriptions(rank, plans, &mine, theirs_at, &mut group.exchange);
        let outcome = posted.and_then(|()| {
            let agree = |index: usize| {
                // SAFETY: `index` is a member, whose pair of descriptions
                // completed (the caller asks no sooner): MPI wrote
                // `theirs[index]` and no longer touches it; the vector
                // lives and does not move until this returns.
                let there = unsafe { theirs_at.add(index).read() };
                verdict(rank, plans, index, &mine[index], there, &own[index])
            };
            let limits = (rank, deadline, timeout);
            self.drive(plans, views, &mut group, &mut start, agree, limits)
        });
        let refused = group.refused.take();
        let Err((at, error)) = outcome else {
            drop(life);
            return refused.map_or(Ok(()), Err);
        };
        // Their peers started theirs: this rank is out of step with them,
        // so the communicator is done (marked so before the lock goes).
        self.break_with(&error);
        drop(start);
        if group.stage.contains(&Stage::Described) {
            // Descriptions still in flight: MPI's memory now.
            std::mem::forget(theirs);
            std::mem::forget(mine);
        }
        if group.stage.contains(&Stage::Started) {
            // MPI may still read and write the views of those started.
            views.lose();
        }
        // The batch fails from the first member refused, or under way.
        let first = group.busy().chain([at]).min().unwrap_or(at);
        Err(match refused {
            Some(earlier) if earlier.0 < first => earlier,
            _ => (first, error),
        })
    }

    /// Runs `group` to its end: polls the descriptions (two requests a
    /// member) and each member's transfer; starts each member once its
    /// pair arrived and `agree` says so, every earlier member to the same
    /// peer the same way started or was refused (MPI pairs one peer's
    /// messages of one tag in the order they were posted), and its buffer
    /// is free; lets a member's buffer go once its transfer completed; and
    /// lets the start lock go once every member started or was refused
    /// (on an `Err`, the caller does, once it broke the communicator).
    /// `Err`: an MPI error, a hold's failure, or the deadline (the member,
    /// and why).
    fn drive(
        &self,
        plans: &[HostCollective],
        views: &mut dyn HostGroupViews,
        group: &mut Group,
        start: &mut Option<crate::sync::MutexGuard<'_, ()>>,
        agree: impl Fn(usize) -> crate::error::Result<()>,
        (rank, deadline, timeout): (usize, Instant, Duration),
    ) -> std::result::Result<(), Failed> {
        let began = Instant::now();
        let mut tries = 0u32;
        let way = |index: usize| {
            let sends = matches!(plans[index].op, CollectiveOp::Send { .. });
            (plans[index].op.peer(), sends)
        };
        loop {
            for (index, plan) in plans.iter().enumerate() {
                match group.stage[index] {
                    Stage::Described => {
                        let pair = &mut group.exchange[2 * index..2 * index + 2];
                        if !test_all(rank, pair).map_err(|error| (index, error))? {
                            continue;
                        }
                        match agree(index) {
                            Ok(()) => group.stage[index] = Stage::Agreed,
                            Err(error) => {
                                group.stage[index] = Stage::Refused;
                                if group.refused.as_ref().is_none_or(|(at, _)| index < *at) {
                                    group.refused = Some((index, error));
                                }
                            }
                        }
                    }
                    Stage::Agreed => {
                        let behind = (0..index).any(|earlier| {
                            way(earlier) == way(index)
                                && matches!(group.stage[earlier], Stage::Described | Stage::Agreed)
                        });
                        if behind {
                            continue;
                        }
                        let held = views.try_hold(index).map_err(|error| (index, error))?;
                        let Some(memory) = held else {
                            continue;
                        };
                        // Started (for the failure paths) even where MPI
                        // refuses the call: it may hold part of it.
                        group.stage[index] = Stage::Started;
                        let started = self.start(rank, plan, memory);
                        group.transfers[index] = started.map_err(|error| (index, error))?;
                    }
                    Stage::Started => {
                        let requests = &mut group.transfers[index];
                        if test_all(rank, requests).map_err(|error| (index, error))? {
                            group.stage[index] = Stage::Done;
                            views.release(index);
                        }
                    }
                    Stage::Done | Stage::Refused => {}
                }
            }
            let waiting = |stage: &Stage| matches!(stage, Stage::Described | Stage::Agreed);
            if !group.stage.iter().any(waiting) {
                // Every member started or refused: other groups may start.
                drop(start.take());
            }
            let Some(stuck) = group.busy().next() else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                let what = match group.stage[stuck] {
                    Stage::Described => " (exchanging descriptions)",
                    Stage::Agreed => {
                        " (waiting for its buffer, which another queue's work holds, or for an \
                         earlier command of the group to the same rank)"
                    }
                    _ => "",
                };
                let error = CollectiveError::Timeout {
                    rank,
                    op: described(plans, stuck, what),
                    waited: timeout,
                };
                return Err((stuck, error.into()));
            }
            back_off(&mut tries, now - began);
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
        theirs: *mut [u64; WORDS],
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
            // SAFETY: `theirs` points at one slot of `WORDS` u64s a
            // member, and `mine[index]` is `WORDS` u64s, in the caller's
            // vectors, which neither move nor grow and live until the
            // requests complete, or forever (leaked on a failure); nothing
            // else reaches `theirs[index]` until its requests completed;
            // the communicator is live; each request is written before its
            // call returns.
            check(rank, "MPI_Irecv", unsafe {
                ffi::MPI_Irecv(
                    theirs.add(index).cast::<c_void>(),
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
    mine: &[u64; WORDS],
    theirs: [u64; WORDS],
    own: &Option<Error>,
) -> crate::error::Result<()> {
    let peer = plans[index].op.peer().unwrap_or(rank);
    let (here, there) = (Description(*mine), Description(theirs));
    match own {
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
