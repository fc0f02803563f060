//! The MPI engine under CPU queues, on rsmpi's raw bindings (`mpi::ffi`):
//! [`Mpi`] (MPI's life in this process), and `MpiComm`, the communicator's
//! MPI side, which runs one collective on the calling thread: description
//! exchange, then the data, each a non-blocking MPI call polled until done
//! or the deadline (one whose send view fits [`INLINE`](small::INLINE) bytes rides along
//! the exchange: `small.rs`). Every raw call's code becomes a
//! [`CollectiveError::Mpi`] at the call (the communicators are duplicated
//! with `MPI_ERRORS_RETURN`, so MPI returns errors instead of aborting).
//! The datatypes and operations the calls name, 16-bit floats' own
//! operations among them, come from `mpi_types.rs`.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ::mpi::environment::Universe;
use ::mpi::ffi;

use self::exchange::{Messages, SLOT, poll};
use super::description::{Description, WORDS};
use super::mpi_types::{check, datatype, mpi_error, op};
use super::small;
use super::staging::StagingPool;
use super::{
    CollectiveError, CollectiveOp, Communicator, DEFAULT_TIMEOUT, HostCollective, HostData,
    Transport,
};
use crate::error::{Error, Result};
use crate::sync::{Arc, Mutex, RwLock};

mod exchange;
mod p2p;

/// MPI's state in this process, as hwqueue sees it. Collectives hold it
/// shared while they call MPI; [`Mpi`]'s drop takes it exclusively to
/// finalise, so MPI is never finalised under a running collective, and no
/// collective starts after.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    NotStarted,
    Live,
    Finalized,
}

/// Set once a collective left MPI requests pending (a timeout, or an
/// error mid-flight): a peer may have died, and `MPI_Finalize` would wait
/// for it for ever (OpenMPI's does, now and then), so `Mpi`'s drop then
/// leaves MPI unfinalised, as a crashed peer's process is.
static REQUESTS_LEFT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn life() -> &'static RwLock<Life> {
    static LIFE: OnceLock<RwLock<Life>> = OnceLock::new();
    LIFE.get_or_init(|| RwLock::new(Life::NotStarted))
}

/// MPI in this process: initialised by [`Mpi::init`] (with
/// `MPI_THREAD_MULTIPLE`, as queue workers call MPI), finalised when
/// dropped, on the thread that made it (MPI's rule: it is not `Send`).
/// Rank and size come from the launcher (`mpirun`); a program started
/// alone is rank 0 of 1.
///
/// Dropping it waits for collectives running on queue workers (each
/// bounded by its communicator's timeout); collectives after it fail with
/// [`CollectiveError::Finalized`]. Synchronise the queues first. After a
/// collective timed out (or failed with requests in flight), it leaves MPI
/// unfinalised: a dead peer can make `MPI_Finalize` wait for ever.
pub struct Mpi {
    /// `None` when the program initialised MPI itself (it finalises it).
    universe: Option<Universe>,
    threading: &'static str,
    _not_send: PhantomData<*const ()>,
}

impl Mpi {
    /// Initialises MPI (or adopts it, when the program initialised it
    /// with `MPI_THREAD_MULTIPLE`).
    ///
    /// # Errors
    /// [`CollectiveError::Threading`] when MPI does not provide
    /// `MPI_THREAD_MULTIPLE` (its level is reported);
    /// [`CollectiveError::Finalized`] after MPI was finalised, or while
    /// another `Mpi` lives; [`CollectiveError::Mpi`] when the operations
    /// that reduce 16-bit floats (the `half` feature) cannot be made.
    pub fn init() -> Result<Mpi> {
        let mut life = life().write();
        if *life != Life::NotStarted || ::mpi::environment::is_finalized() {
            return Err(CollectiveError::Finalized.into());
        }
        let universe = if ::mpi::environment::is_initialized() {
            None
        } else {
            let (universe, _) = ::mpi::initialize_with_threading(::mpi::Threading::Multiple)
                .ok_or(CollectiveError::Mpi {
                    rank: usize::MAX,
                    call: "MPI_Init_thread",
                    code: -1,
                    message: "rsmpi found MPI initialised already".into(),
                })?;
            Some(universe)
        };
        let threading = match ::mpi::environment::threading_support() {
            ::mpi::Threading::Single => "single",
            ::mpi::Threading::Funneled => "funneled",
            ::mpi::Threading::Serialized => "serialized",
            ::mpi::Threading::Multiple => "multiple",
        };
        if threading != "multiple" {
            if universe.is_some() {
                *life = Life::Finalized;
            }
            drop(universe);
            return Err(CollectiveError::Threading {
                provided: threading,
            }
            .into());
        }
        // 16-bit floats' MPI operations, made here so that a failure
        // fails every rank's `init`, not one rank's collective.
        if let Err(error) = super::mpi_types::make_ops() {
            if universe.is_some() {
                *life = Life::Finalized;
            }
            drop(universe);
            return Err(error);
        }
        *life = Life::Live;
        Ok(Mpi {
            universe,
            threading,
            _not_send: PhantomData,
        })
    }

    /// The thread support MPI provides: `"multiple"` (anything less fails
    /// [`init`](Self::init)).
    pub fn threading(&self) -> &'static str {
        self.threading
    }

    /// This process's rank in MPI's world, and the world's size, as the
    /// launcher set them.
    pub fn world_rank_size(&self) -> (usize, usize) {
        // SAFETY: MPI is initialised (`self` lives), and COMM_WORLD is
        // valid until it is finalised.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        rank_size(world).unwrap_or((0, 1))
    }

    /// A communicator over every rank of MPI's world: a duplicate of
    /// `MPI_COMM_WORLD` (so its traffic never mixes with the program's
    /// own), made by every rank together within `timeout`
    /// ([`DEFAULT_TIMEOUT`] if `None`).
    ///
    /// # Errors
    /// [`CollectiveError::Timeout`] when some rank does not make it in
    /// time; [`CollectiveError::Mpi`].
    pub fn world(&self, timeout: Option<Duration>) -> Result<Communicator> {
        let _live = life().read();
        // SAFETY: as in `world_rank_size`.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        let (rank, _) = rank_size(world)?;
        // Boxed: MPI writes it when the request completes, which may be
        // after a timeout (the box is leaked then).
        let mut raw = Box::new(std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit());
        let mut request = null_request();
        // SAFETY: `world` is a live communicator; `request` is written
        // before MPI returns; `*raw` lives until the request completed, or
        // forever.
        check(rank, "MPI_Comm_idup", unsafe {
            ffi::MPI_Comm_idup(world, raw.as_mut_ptr(), &mut request)
        })?;
        // As a communicator's own timeout: at most `u64::MAX` ns (584
        // years), so that `Duration::MAX` (no bound) cannot overflow the
        // deadline.
        let timeout = Duration::from_nanos(super::duration_ns(timeout.unwrap_or(DEFAULT_TIMEOUT)));
        let deadline = Instant::now() + timeout;
        let mut requests = [request];
        // Not done (timed out, or the poll failed): MPI may still write
        // `raw`, so it is MPI's, and MPI is not finalised under the
        // pending request.
        let done = poll(rank, &mut requests, deadline).and_then(|done| {
            done.then_some(()).ok_or_else(|| {
                Error::from(CollectiveError::Timeout {
                    rank,
                    op: "making the world communicator (MPI_Comm_idup)".into(),
                    waited: timeout,
                })
            })
        });
        if let Err(error) = done {
            REQUESTS_LEFT.store(true, std::sync::atomic::Ordering::Relaxed);
            std::mem::forget(raw);
            return Err(error);
        }
        // SAFETY: the request completed, so MPI wrote the new handle.
        MpiComm::adopt(unsafe { raw.assume_init_read() })
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // Waits for running collectives (each bounded by its timeout).
        let mut life = life().write();
        *life = if self.universe.is_some() {
            Life::Finalized
        } else {
            Life::NotStarted
        };
        // Finalises MPI, when we initialised it, and no collective left
        // requests to a peer that may be dead (`REQUESTS_LEFT`).
        let universe = self.universe.take();
        if REQUESTS_LEFT.load(std::sync::atomic::Ordering::Relaxed) {
            std::mem::forget(universe);
        }
    }
}

/// A duplicated MPI communicator with `MPI_ERRORS_RETURN`, and what keeps
/// the collectives over it in one order.
pub(super) struct MpiComm {
    raw: RawComm,
    /// Held from a collective's description exchange until its data
    /// transfer started, so each rank starts the collectives of this
    /// communicator in one order (MPI's rule); bounded, as the holder
    /// gives up at its deadline. It keeps the exchange's messages.
    collective_start: Mutex<Messages>,
    /// The same for groups of `send`s and `recv`s (`p2p.rs`), which never
    /// block collectives.
    p2p_start: Mutex<()>,
    /// The first failure that left MPI requests pending (a timeout): the
    /// communicator runs nothing after it.
    broken: Mutex<Option<Arc<Error>>>,
    /// Set once it broke (`break_with`): requests of it may be pending,
    /// which a late peer can still complete, or an `MPI_Comm_split` be
    /// under way on its thread (`split_within` gave up on it). The handle
    /// is then never freed: OpenMPI crashed (a segfault in its progress)
    /// when a peer completed a collective of a communicator freed with it
    /// pending (`tests/collective_mpi.rs`, "a split one rank comes to
    /// late").
    keep: std::sync::atomic::AtomicBool,
    /// Staging memory kept for the next collectives.
    staging: StagingPool,
}

/// An `MPI_Comm` handle.
struct RawComm(ffi::MPI_Comm);

// SAFETY: an `MPI_Comm` is a handle MPI lets any thread use under
// `MPI_THREAD_MULTIPLE`, which `Mpi::init` requires; the collectives that
// must not start concurrently are serialised by `MpiComm`'s locks.
unsafe impl Send for RawComm {}
// SAFETY: as for `Send`: MPI's handles are thread-safe at that level.
unsafe impl Sync for RawComm {}

impl MpiComm {
    /// Breaks the communicator with `error`, which left MPI requests
    /// pending (or this rank out of step with its peers): it runs nothing
    /// more, and MPI is not finalised.
    fn break_with(&self, error: &Error) {
        *self.broken.lock() = Some(Arc::new(error.clone()));
        self.keep.store(true, std::sync::atomic::Ordering::Relaxed);
        REQUESTS_LEFT.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// MPI's life, held for a collective, where live and this one not broken.
    fn usable(&self, rank: usize) -> Result<crate::sync::RwLockReadGuard<'static, Life>> {
        let life = life().read();
        if *life != Life::Live {
            return Err(CollectiveError::Finalized.into());
        }
        if let Some(cause) = self.broken.lock().clone() {
            return Err(CollectiveError::Broken { rank, cause }.into());
        }
        Ok(life)
    }

    /// Wraps a communicator this process made (and now owns).
    fn adopt(raw: ffi::MPI_Comm) -> Result<Communicator> {
        let (rank, size) = rank_size(raw)?;
        // SAFETY: `raw` is a live communicator; the error handler is one
        // of MPI's predefined ones.
        check(rank, "MPI_Comm_set_errhandler", unsafe {
            ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN)
        })?;
        let comm = MpiComm {
            raw: RawComm(raw),
            collective_start: Mutex::default(),
            p2p_start: Mutex::default(),
            broken: Mutex::new(None),
            keep: std::sync::atomic::AtomicBool::new(false),
            staging: StagingPool::default(),
        };
        Ok(Communicator::new(rank, size, Transport::Mpi(comm)))
    }

    /// Runs `plan` on the calling thread over `data` (see
    /// [`Communicator::run_on_host`] and
    /// [`run_on_host_direct`](Communicator::run_on_host_direct)).
    pub(super) fn run(
        &self,
        communicator: &Communicator,
        plan: &HostCollective,
        data: HostData<'_>,
    ) -> Result<()> {
        let (rank, size) = (communicator.rank(), communicator.size());
        let life = self.usable(rank)?;
        let timeout = communicator.timeout();
        let deadline = Instant::now() + timeout;
        let element = plan.element.size();
        let (send_len, recv_len) = match plan.op {
            CollectiveOp::AllReduce(_) => (plan.count, plan.count),
            CollectiveOp::AllGather => (plan.count, plan.count * size),
            CollectiveOp::ReduceScatter(_) => (plan.count * size, plan.count),
            CollectiveOp::Broadcast { root } if root == rank => (plan.count, 0),
            CollectiveOp::Broadcast { .. } => (0, plan.count),
            CollectiveOp::Send { .. } => (plan.count, 0),
            CollectiveOp::Recv { .. } => (0, plan.count),
        };
        // Small enough: the send bytes ride along the description, and
        // the exchange is the whole collective (`small.rs`).
        let inline = small::fits(plan.op, plan.element, plan.count, size);
        let (mut staged, mut direct) = match data {
            HostData::Staged { read, write } => (Some((read, write)), None),
            // `Communicator::stages` sends every inline one through staging,
            // and a queue every `send` and `recv` through `run_p2p`.
            HostData::Direct(_) if inline || plan.op.peer().is_some() => {
                return Err(CollectiveError::Invalid {
                    rank,
                    size,
                    op: plan.op.name(),
                    reason: "hwqueue's bug: a collective small enough to ride along the \
                             exchange was given its views' memory, not staging, or a \
                             point-to-point command was run alone, not in its group"
                        .to_owned(),
                }
                .into());
            }
            HostData::Direct(views) => (None, Some(views)),
        };
        // Direct, the views' own memory, but for the copy an all_reduce in
        // place sends.
        let in_place = direct.as_ref().is_some_and(|views| views.in_place());
        let staging = |len: usize, copied: bool| self.staging.take(if copied { len } else { 0 });
        let mut send = staging(send_len * element, staged.is_some() || in_place);
        let mut recv = staging(recv_len * element, staged.is_some());
        // A rank that cannot read its view still describes itself, marked
        // failed, so its peers fail at once rather than at the timeout.
        let read_error = match (&mut staged, &mut direct) {
            (Some((read, _)), _) => read(send.bytes()).err(),
            (None, Some(views)) => views.check().err(),
            (None, None) => None,
        };
        let mine = Description::of(plan, read_error.is_some());
        let mut guard = self.collective_start.lock();
        // Broken while this waited for the lock: the holder's timeout left
        // its messages pending, and an exchange now could pair with them.
        if let Some(cause) = self.broken.lock().clone() {
            return Err(CollectiveError::Broken { rank, cause }.into());
        }
        let payload: &[u8] = if inline && read_error.is_none() {
            &send.bytes()[..]
        } else {
            &[]
        };
        let limits = (deadline, timeout);
        let describe = || plan.describe();
        let exchanged = self.exchange((rank, size), &describe, mine, payload, &mut guard, limits);
        let gathered = &guard.gathered;
        let started = match (exchanged, read_error) {
            // This rank's own failure to read its send view, which its
            // peers learned in the exchange (as a mismatch naming it).
            (Err(Error::Collective(CollectiveError::Mismatch { .. })), Some(error)) => Err(error),
            (Err(error), _) => Err(error),
            // Every rank failed to read its send view: none moves data.
            (Ok(()), Some(error)) => Err(error),
            (Ok(()), None) if inline => {
                let sent = |k: usize| {
                    let words = &gathered[k * SLOT + WORDS..(k + 1) * SLOT];
                    bytemuck::cast_slice::<u64, u8>(words)
                };
                let (op, element, count) = (plan.op, plan.element, plan.count);
                small::finish(op, element, count, (rank, size), sent, recv.bytes());
                Ok(Vec::new())
            }
            (Ok(()), None) => (|| {
                let held = |views: &mut &mut dyn super::HostViews| {
                    views.hold(deadline)?.ok_or_else(|| {
                        Error::from(CollectiveError::Timeout {
                            rank,
                            op: format!(
                                "{} (waiting for its buffers, which other work holds)",
                                plan.describe()
                            ),
                            waited: timeout,
                        })
                    })
                };
                let memory = match &mut direct {
                    // Held from here until this returns (the caller's
                    // guards), so MPI has the views' own memory.
                    Some(views) if in_place => {
                        let (view, result) = held(views)?;
                        let bytes = send.bytes();
                        // SAFETY: `view` is the held send view's first byte,
                        // and the view is `send_len` elements long (checked
                        // at record time), as the staging is.
                        let view = unsafe { std::slice::from_raw_parts(view, bytes.len()) };
                        bytes.copy_from_slice(view);
                        (send.ptr().cast_const().cast(), result)
                    }
                    Some(views) => held(views)?,
                    None => (send.ptr().cast_const().cast(), recv.ptr().cast()),
                };
                self.start(rank, plan, memory)
            })()
            .inspect_err(|error| {
                // The peers agreed too and started their part of the
                // transfer: this rank, which did not, would start its next
                // collective where they are still in this one, so the
                // communicator is done (they time out, and are done too).
                self.break_with(error);
            }),
        };
        drop(guard);
        let mut flight = started?;
        let done = poll(rank, &mut flight, deadline).and_then(|done| {
            done.then_some(()).ok_or_else(|| {
                Error::from(CollectiveError::Timeout {
                    rank,
                    op: plan.describe(),
                    waited: timeout,
                })
            })
        });
        if let Err(error) = done {
            // MPI may still read and write the memory: it is MPI's now,
            // and the communicator is done.
            std::mem::forget(send);
            std::mem::forget(recv);
            if let Some(views) = direct {
                views.lose();
            }
            self.break_with(&error);
            return Err(error);
        }
        drop(life);
        if let Some((_, write)) = staged
            && recv_len > 0
        {
            write(recv.bytes())?;
        }
        self.staging.give_back(send);
        self.staging.give_back(recv);
        Ok(())
    }

    /// Splits `communicator` (see [`Communicator::split`]): a description
    /// exchange at the split's place in the order (bounded by the
    /// timeout, so a rank that never comes fails it), then
    /// `MPI_Comm_split`, which every rank has reached by then.
    pub(super) fn split(
        &self,
        communicator: &Communicator,
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Communicator>> {
        let (rank, size) = (communicator.rank(), communicator.size());
        let life = self.usable(rank)?;
        let timeout = communicator.timeout();
        let sequence = communicator.next_sequence();
        // MPI takes both as C `int`s: a rank with one it cannot take still
        // exchanges (marked), so every rank fails the split at once.
        let int = |value: u32, what: &str| {
            c_int::try_from(value).map_err(|_| CollectiveError::Invalid {
                rank,
                size,
                op: "split",
                reason: format!(
                    "MPI takes the split's {what} as a non-negative C `int`: {value} is \
                     above {}",
                    c_int::MAX
                ),
            })
        };
        // SAFETY: reading MPI's predefined constant.
        let undefined = unsafe { ffi::RSMPI_UNDEFINED };
        let color = color.map_or(Ok(undefined), |color| int(color, "color"));
        let key = int(key, "key");
        let invalid = color.is_err() || key.is_err();
        let mut messages = self.collective_start.lock();
        if let Some(cause) = self.broken.lock().clone() {
            return Err(CollectiveError::Broken { rank, cause }.into());
        }
        let deadline = Instant::now() + timeout;
        let mine = Description::split(sequence, invalid);
        let limits = (deadline, timeout);
        let describe = || format!("split of the communicator, submitted #{sequence}");
        let exchanged = self.exchange((rank, size), &describe, mine, &[], &mut messages, limits);
        let (color, key) = (color?, key?);
        exchanged?;
        let raw = self.split_within(rank, (color, key), (deadline, timeout))?;
        // SAFETY: reading MPI's predefined constant.
        if raw == unsafe { ffi::RSMPI_COMM_NULL } {
            return Ok(None);
        }
        // Under `life`: MPI is not finalised while `adopt` calls it.
        let adopted = MpiComm::adopt(raw).map(Some);
        drop(life);
        adopted
    }

    /// `MPI_Comm_split` of this communicator by `color` and `key`, bounded
    /// by `deadline`. MPI's split blocks until every rank calls it: a rank
    /// whose exchange completed just as its peers' timed out (they never
    /// call it) would block for ever, holding `collective_start`. So it
    /// runs on a thread of its own; at the deadline the communicator is
    /// broken, its handle kept (never freed under the split still in it)
    /// and the thread left to MPI (a split it completes later makes a
    /// communicator nobody frees).
    fn split_within(
        &self,
        rank: usize,
        (color, key): (c_int, c_int),
        (deadline, timeout): (Instant, Duration),
    ) -> Result<ffi::MPI_Comm> {
        let comm = RawComm(self.raw.0);
        let (sender, receiver) = std::sync::mpsc::channel();
        let split = move || {
            let comm = comm;
            let mut raw = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
            // SAFETY: the communicator is live (its handle is freed only
            // once this sent its result, or never: `keep`); `raw` is
            // written before the call returns success.
            let code = unsafe { ffi::MPI_Comm_split(comm.0, color, key, raw.as_mut_ptr()) };
            // SAFETY: written where the call succeeded.
            let made = (code == ffi::MPI_SUCCESS as c_int)
                .then(|| RawComm(unsafe { raw.assume_init() }))
                .ok_or(code);
            let _ = sender.send(made);
        };
        let spawned = std::thread::Builder::new()
            .name("hwqueue-mpi-split".into())
            .spawn(split);
        if let Err(error) = spawned {
            let error = Error::from(CollectiveError::Invalid {
                rank,
                size: 0,
                op: "split",
                reason: format!("no thread to run MPI_Comm_split on: {error}"),
            });
            // The peers agreed and split: this rank is out of step.
            self.break_with(&error);
            return Err(error);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(made) => made
                .map(|made| made.0)
                .map_err(|code| mpi_error(rank, "MPI_Comm_split", code)),
            Err(_) => {
                let error = Error::from(CollectiveError::Timeout {
                    rank,
                    op: "split of the communicator (MPI_Comm_split: a peer never called it)".into(),
                    waited: timeout,
                });
                self.break_with(&error);
                Err(error)
            }
        }
    }

    /// Starts the data transfer of `plan` over `memory`: its send and
    /// receive memory (staging, or the views' own), each as long as `plan`
    /// needs and live until the transfer completes, or forever.
    fn start(
        &self,
        rank: usize,
        plan: &HostCollective,
        (send, recv): (*const u8, *mut u8),
    ) -> Result<Vec<ffi::MPI_Request>> {
        let mut request = null_request();
        let count = c_int::try_from(plan.count).map_err(|_| CollectiveError::Invalid {
            rank,
            size: 0,
            op: plan.op.name(),
            reason: format!(
                "{} elements are more than MPI counts (2^31 - 1)",
                plan.count
            ),
        })?;
        let dtype = datatype(plan.element);
        let (s, r) = (send.cast_mut().cast::<c_void>(), recv.cast::<c_void>());
        let comm = self.raw.0;
        let reduce = |reduction| op(rank, plan.element, reduction);
        // SAFETY: the send and receive memory are as long as the op needs
        // for `count` elements (staging sized in `run`; views checked at
        // record time), and stay MPI's until the request completes or
        // forever (leaked or lost on a timeout); MPI only reads the send
        // memory, though its C API takes it as `void *`; `comm` is a live
        // communicator; the datatype and op handles are MPI's predefined
        // ones or ours, made while MPI is live and never freed
        // (`mpi_types.rs`); `request` is written before the call returns.
        let (call, code) = unsafe {
            match plan.op {
                CollectiveOp::AllReduce(reduction) => (
                    "MPI_Iallreduce",
                    ffi::MPI_Iallreduce(s, r, count, dtype, reduce(reduction)?, comm, &mut request),
                ),
                CollectiveOp::AllGather => (
                    "MPI_Iallgather",
                    ffi::MPI_Iallgather(s, count, dtype, r, count, dtype, comm, &mut request),
                ),
                CollectiveOp::ReduceScatter(reduction) => (
                    "MPI_Ireduce_scatter_block",
                    ffi::MPI_Ireduce_scatter_block(
                        s,
                        r,
                        count,
                        dtype,
                        reduce(reduction)?,
                        comm,
                        &mut request,
                    ),
                ),
                CollectiveOp::Broadcast { root } => {
                    let buffer = if root == rank { s } else { r };
                    (
                        "MPI_Ibcast",
                        ffi::MPI_Ibcast(buffer, count, dtype, root as c_int, comm, &mut request),
                    )
                }
                CollectiveOp::Send { peer } => (
                    "MPI_Isend",
                    ffi::MPI_Isend(s, count, dtype, peer as c_int, TAG_DATA, comm, &mut request),
                ),
                CollectiveOp::Recv { peer } => (
                    "MPI_Irecv",
                    ffi::MPI_Irecv(r, count, dtype, peer as c_int, TAG_DATA, comm, &mut request),
                ),
            }
        };
        check(rank, call, code)?;
        Ok(vec![request])
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let life = life().read();
        // Broken, with requests or a split maybe still in MPI: leaked.
        if *life == Life::Live && !self.keep.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: MPI is live; the handle is ours (duplicated in
            // `adopt`) and no collective uses it (they hold a clone of the
            // communicator, and this is its last), nor any request: one
            // that broke it (which may leave requests) sets `keep`.
            unsafe { ffi::MPI_Comm_free(&mut self.raw.0) };
        }
    }
}

const TAG_DATA: c_int = 2;

fn rank_size(comm: ffi::MPI_Comm) -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is a live communicator; both outputs are plain ints.
    check(usize::MAX, "MPI_Comm_rank", unsafe {
        ffi::MPI_Comm_rank(comm, &mut rank)
    })?;
    // SAFETY: as above.
    check(usize::MAX, "MPI_Comm_size", unsafe {
        ffi::MPI_Comm_size(comm, &mut size)
    })?;
    Ok((rank as usize, size as usize))
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading one of MPI's predefined handles, set at load.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}
