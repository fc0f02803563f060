//! The description exchange that starts every collective over MPI: each
//! rank's description of what it is about to run (and, for a collective
//! that [fits](super::small::fits), its send bytes) goes to its peers,
//! which compare it with their own before any data moves; then the
//! polling that drives MPI's non-blocking calls to completion or a
//! deadline.
//!
//! A collective's messages are the communicator's own memory, kept from
//! one exchange to the next ([`Messages`]): a 1 KiB all_reduce used to
//! allocate (and zero) two of them each time, about a third of the
//! instructions of its exchange.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::super::CollectiveError;
use super::super::description::{Description, WORDS};
use super::super::mpi_types::{check, u64_type};
use super::super::small::INLINE;
use super::{MpiComm, null_request};
use crate::error::{Error, Result};

/// The words of a rank's message in a collective's description exchange:
/// the description, then room for [`INLINE`] send bytes.
pub(super) const SLOT: usize = WORDS + INLINE / 8;

/// A collective exchange's memory, kept by the communicator: this rank's
/// message, and every rank's gathered.
#[derive(Default)]
pub(super) struct Messages {
    sent: Vec<u64>,
    /// Every rank's message, in rank order, after an exchange.
    pub(super) gathered: Vec<u64>,
}

impl MpiComm {
    /// Exchanges descriptions of a collective (`describe` names it in
    /// errors) with every rank and compares them (a `send` or `recv` exchanges with its peer alone, in
    /// its group: `p2p.rs`). A message is [`SLOT`] words, the description
    /// then `payload` (at most [`INLINE`] bytes, zero-padded): every
    /// rank's, in rank order, is left in `messages.gathered`. On a failure
    /// while MPI has the messages, they are leaked to it and `messages` is
    /// left empty.
    pub(super) fn exchange(
        &self,
        (rank, size): (usize, usize),
        describe: &impl Fn() -> String,
        mine: Description,
        payload: &[u8],
        messages: &mut Messages,
        (deadline, timeout): (Instant, Duration),
    ) -> Result<()> {
        let compare = |theirs: [u64; WORDS], peer: usize| -> Result<()> {
            let theirs = Description(theirs);
            if peer == rank || mine.agrees(&theirs, rank, peer) {
                return Ok(());
            }
            Err(CollectiveError::Mismatch {
                rank,
                peer,
                here: mine.to_string(),
                there: theirs.to_string(),
            }
            .into())
        };
        let mut sent = std::mem::take(&mut messages.sent);
        sent.clear();
        sent.extend_from_slice(&mine.0);
        sent.resize(SLOT, 0);
        bytemuck::cast_slice_mut::<u64, u8>(&mut sent[WORDS..])[..payload.len()]
            .copy_from_slice(payload);
        let mut all = std::mem::take(&mut messages.gathered);
        // Every word is MPI's to write: kept as it was otherwise.
        all.resize(SLOT * size, 0);
        let mut requests = [null_request()];
        // SAFETY: `sent` holds `SLOT` u64s and `all` `size` times
        // as many (their heap memory stays put when the vectors
        // move), live until the request completes, or leaked.
        check(rank, "MPI_Iallgather", unsafe {
            ffi::MPI_Iallgather(
                sent.as_ptr().cast::<c_void>(),
                SLOT as c_int,
                u64_type(),
                all.as_mut_ptr().cast::<c_void>(),
                SLOT as c_int,
                u64_type(),
                self.raw.0,
                &mut requests[0],
            )
        })?;
        if let Err(error) = self.settle(rank, describe, &mut requests, deadline, timeout) {
            std::mem::forget(all);
            std::mem::forget(sent);
            return Err(error);
        }
        messages.sent = sent;
        let compared = (all.chunks_exact(SLOT).enumerate()).try_for_each(|(peer, slot)| {
            compare(slot[..WORDS].try_into().expect("WORDS words"), peer)
        });
        messages.gathered = all;
        compared
    }

    /// Polls the description exchange's `requests` to completion. A
    /// timeout, or an error while they are pending, breaks the
    /// communicator: the caller leaks their memory to MPI.
    fn settle(
        &self,
        rank: usize,
        describe: &impl Fn() -> String,
        requests: &mut [ffi::MPI_Request],
        deadline: Instant,
        waited: Duration,
    ) -> Result<()> {
        let error = match poll(rank, requests, deadline) {
            Ok(true) => return Ok(()),
            Ok(false) => Error::from(CollectiveError::Timeout {
                rank,
                op: format!("{} (exchanging descriptions)", describe()),
                waited,
            }),
            Err(error) => error,
        };
        self.break_with(&error);
        Err(error)
    }
}

/// Polls `requests` until all completed (`true`) or `deadline` passed
/// (`false`: they are still pending), backing off as [`back_off`] does.
pub(super) fn poll(
    rank: usize,
    requests: &mut [ffi::MPI_Request],
    deadline: Instant,
) -> Result<bool> {
    let start = Instant::now();
    let mut tries = 0u32;
    loop {
        if test_all(rank, requests)? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        back_off(&mut tries, now - start);
    }
}

/// Whether every request of `requests` completed (each then null).
pub(super) fn test_all(rank: usize, requests: &mut [ffi::MPI_Request]) -> Result<bool> {
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

/// Between two looks of a poll that has looked `tries` times over
/// `polled`: spins briefly, then yields the core (MPI progresses only
/// inside its calls, so the polling is the progress), then sleeps in short
/// steps.
pub(super) fn back_off(tries: &mut u32, polled: Duration) {
    *tries = tries.saturating_add(1);
    if *tries < 64 {
        std::hint::spin_loop();
    } else if polled < Duration::from_millis(20) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}
