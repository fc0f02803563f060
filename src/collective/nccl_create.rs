//! How an NCCL communicator is made ([`NcclConfig`]), and what a
//! non-blocking one needs: NCCL's `ncclConfig_t`, and [`settle`], the
//! bounded wait for a call NCCL finishes on a thread of its own.
//!
//! NCCL's calls on a *blocking* communicator (its default) return once
//! done, so a creation or a split whose peer never comes blocks the
//! calling thread for good, and nothing but the process's end frees it.
//! On a *non-blocking* one (`ncclConfig_t::blocking = 0`) the creation, a
//! split, and the end of a group go on on a thread of NCCL's (the
//! creation and a group's end answer `ncclInProgress`; `ncclCommSplit`
//! answers `ncclSuccess` all the same); the communicator's
//! `ncclCommGetAsyncError` says `ncclInProgress` until they are done, and
//! `ncclCommAbort` ends one that never will be (RCCL's fault-tolerance
//! guide, which follows NCCL's model, says recovery relies on them:
//! rocm.docs.amd.com/projects/rccl/en/develop/how-to/fault-tolerance.html).
//! hwqueue polls it, bounded by the communicator's timeout, and aborts
//! where it runs out. On NCCL 2.26 and newer that poll also finishes the
//! call (it joins NCCL's thread), so one thread at a time asks: the one
//! that started the call, under the communicator's call lock (the
//! watchdog skips its look while that is held). hwqueue needs NCCL 2.27 or
//! newer for this: before it, NCCL kept the call's state in the calling
//! thread's thread-local storage, which several queues' threads and the
//! watchdog sharing a communicator break. The constructors of NCCL
//! communicators are here too.

use std::ffi::{c_char, c_int, c_uint};
use std::time::{Duration, Instant};

use cudarc::nccl::{result, sys};

use super::nccl::{Calls, NcclComm, NcclId, bind, invalid, nccl_error, probe};
use super::{CollectiveError, Communicator, DEFAULT_TIMEOUT};
#[cfg(feature = "mpi")]
use super::{CollectiveOp, Element};
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};

/// How [`Communicator::nccl_with`](super::Communicator::nccl_with) makes an
/// NCCL communicator.
///
/// - **Blocking** ([`NcclConfig::blocking`], the default, and what
///   [`Communicator::nccl`](super::Communicator::nccl) makes): NCCL's
///   default. Each group of collectives costs one `ncclGroupEnd`; the
///   creation and [`split`](super::Communicator::split)s wait for every
///   rank, with no bound: a peer that never comes blocks the calling
///   thread for good. So can a group's launch, where NCCL first connects
///   to a peer (lazily, inside `ncclGroupEnd`) or waits for room in its
///   work queue behind a hung kernel; the groups already in flight still
///   fail at their timeout, but the abort that would end such a launch
///   needs the call lock the launch holds, so the launch stays stuck.
/// - **Non-blocking** ([`NcclConfig::nonblocking`]): the creation, every
///   split, and every group's launch are bounded by the communicator's
///   timeout: one that runs out aborts the communicator
///   ([`CollectiveError::Timeout`](super::CollectiveError::Timeout), and
///   the communicator is broken). The cost is NCCL's: its `ncclGroupEnd`
///   starts a thread for each group's launch (NCCL's `group.cc`), which
///   the queue's thread polls for, a cost per group the blocking launch
///   does not pay (not measured yet: no GPU was lent). Needs NCCL 2.27 or
///   newer (see the module docs). NCCL's environment can override it:
///   `NCCL_COMM_BLOCKING=1` makes every communicator blocking, and then
///   nothing bounds the creation or a split again; `NCCL_COMM_BLOCKING=0`
///   makes every one non-blocking, those made blocking (and by
///   [`nccl_single`](super::Communicator::nccl_single)) included. hwqueue
///   goes by what NCCL did, not by what it asked: a creation that answers
///   `ncclInProgress` made a non-blocking communicator, treated as one
///   from then on (bounded by its timeout, refused before NCCL 2.27).
///
/// Either way the communicator starts with `timeout` as its
/// [timeout](super::Communicator::timeout), which bounds its collectives
/// on the device ([the watchdog](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclConfig {
    nonblocking: bool,
    timeout: Duration,
}

impl Default for NcclConfig {
    fn default() -> Self {
        Self::blocking()
    }
}

impl NcclConfig {
    /// A blocking communicator (NCCL's default), with [`DEFAULT_TIMEOUT`].
    pub fn blocking() -> Self {
        Self {
            nonblocking: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// A non-blocking communicator, with [`DEFAULT_TIMEOUT`].
    pub fn nonblocking() -> Self {
        Self {
            nonblocking: true,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same, with `timeout` as the communicator's timeout (and, when
    /// non-blocking, its creation's bound).
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// Whether it makes a non-blocking communicator.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// The communicator's timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// NCCL's `ncclConfig_t` as NCCL 2.18 laid it out (hwqueue's own: cudarc's
/// follows the headers it was generated from). NCCL reads a config by its
/// `size` and `version`: the fields a later NCCL added keep their
/// defaults, and those this one names are "undefined" (NCCL's default)
/// but `blocking`.
#[repr(C)]
pub(super) struct RawConfig {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
    /// NCCL 2.25's; ignored for a config of 2.18 (it fills what would be
    /// padding, so that every byte NCCL copies is written).
    traffic_class: c_int,
}

/// `NCCL_API_MAGIC` (`nccl.h`).
const MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_VERSION(2, 18, 0)`: the version of the layout above (NCCL reads
/// a config by its `size` and `version`, so any later NCCL reads this one).
const VERSION: c_uint = 21800;
/// `NCCL_CONFIG_UNDEF_INT` (`nccl.h`): "NCCL's default".
const UNDEF: c_int = c_int::MIN;

impl RawConfig {
    /// A config asking for a non-blocking communicator, the rest NCCL's
    /// defaults.
    pub(super) fn nonblocking() -> Self {
        Self::with_blocking(false)
    }

    /// A config asking for a blocking communicator or not, the rest NCCL's
    /// defaults.
    fn with_blocking(blocking: bool) -> Self {
        Self {
            size: std::mem::size_of::<Self>(),
            magic: MAGIC,
            version: VERSION,
            blocking: c_int::from(blocking),
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
            traffic_class: UNDEF,
        }
    }

    /// The pointer NCCL's calls take (they only read it).
    pub(super) fn as_ptr(&mut self) -> *mut sys::ncclConfig_t {
        (self as *mut Self).cast()
    }
}

/// How a non-blocking call ended ([`settle`]).
pub(super) enum Settled {
    /// Done: the communicator is ready.
    Done,
    /// NCCL's error, as `ncclCommGetAsyncError` gave it.
    Failed(cudarc::nccl::result::NcclError),
    /// Still in progress after `timeout`: how long it waited.
    TimedOut(Duration),
}

/// Waits, at most `timeout`, for the call in flight on `comm` (a
/// non-blocking communicator) to finish: polls `ncclCommGetAsyncError`,
/// yielding the core between polls for the first 100 µs (a group's
/// launch is short work on NCCL's thread), then sleeping 50 µs, doubling
/// to 1 ms (a creation or split waits for its peers).
///
/// # Safety
/// `comm` is a live NCCL communicator.
pub(super) unsafe fn settle(comm: sys::ncclComm_t, timeout: Duration) -> Settled {
    let start = Instant::now();
    let mut nap = Duration::from_micros(50);
    loop {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is live (the caller's promise); NCCL lets any
        // thread ask for a communicator's state at any time.
        let asked = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        if let Err(error) = asked.result() {
            return Settled::Failed(error);
        }
        match state {
            sys::ncclResult_t::ncclSuccess => return Settled::Done,
            sys::ncclResult_t::ncclInProgress => {}
            _ => {
                if let Err(error) = state.result() {
                    return Settled::Failed(error);
                }
                return Settled::Done;
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Settled::TimedOut(waited);
        }
        if waited < Duration::from_micros(100) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap.min(timeout - waited));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// The first NCCL whose non-blocking calls hwqueue can drive from several
/// threads (see the module docs): `NCCL_VERSION(2, 27, 0)`.
const NONBLOCKING_SINCE: c_int = 22700;

/// The NCCL loaded's version (`ncclGetVersion`: `NCCL_VERSION(X, Y, Z)`).
pub(super) fn nccl_version(rank: usize) -> Result<c_int> {
    let mut version: c_int = 0;
    // SAFETY: NCCL is loaded (probed); `version` is one `int`.
    unsafe { sys::ncclGetVersion(&mut version) }
        .result()
        .map_err(|e| nccl_error(e, rank, "ncclGetVersion", "NCCL's version"))?;
    Ok(version)
}

/// [`CollectiveError::Invalid`] unless the NCCL loaded is 2.27 or newer
/// (`ncclGetVersion`); `forced`: the communicator was asked to block, and
/// `NCCL_COMM_BLOCKING=0` made it non-blocking.
fn check_nonblocking_version(rank: usize, size: usize, forced: bool) -> Result<()> {
    let version = nccl_version(rank)?;
    if version >= NONBLOCKING_SINCE {
        return Ok(());
    }
    // NCCL_VERSION: X * 10000 + Y * 100 + Z from 2.9 on (X * 1000 + ... before).
    let (major, minor, patch) = if version >= 20900 {
        (version / 10000, version / 100 % 100, version % 100)
    } else {
        (version / 1000, version / 100 % 10, version % 100)
    };
    let reason = match forced {
        false => format!(
            "a non-blocking communicator needs NCCL 2.27 or newer, and this one is \
             {major}.{minor}.{patch}: upgrade NCCL, or make a blocking one \
             (`NcclConfig::blocking`)"
        ),
        true => format!(
            "NCCL_COMM_BLOCKING=0 in the environment made this communicator non-blocking, \
             which needs NCCL 2.27 or newer, and this one is {major}.{minor}.{patch}: \
             unset NCCL_COMM_BLOCKING (NCCL reads it from /etc/nccl.conf and \
             ~/.nccl.conf too), or upgrade NCCL"
        ),
    };
    Err(CollectiveError::Invalid {
        rank,
        size,
        op: "nccl",
        reason,
    }
    .into())
}

/// Aborts `raw`, a handle a creation or a split just made (NULL: none)
/// and gave nobody else: the way to drop one that failed or ran out of
/// time (the abort joins NCCL's thread for it).
///
/// # Safety
/// `raw` is NULL, or live with no other user.
pub(super) unsafe fn abort_made(raw: sys::ncclComm_t) {
    if !raw.is_null() {
        // SAFETY: live and unused elsewhere (the caller's promise).
        let _ = unsafe { result::comm_abort(raw) };
    }
}

/// The end of a creation `call` (making `what`) that answered `started`,
/// asked to make a non-blocking communicator or not (`asked`): refused, or
/// whether NCCL made it non-blocking ([`made_nonblocking`]), and such a
/// creation settled within `timeout` and on NCCL 2.27 or newer (see the
/// module docs). `Ok(true)` for a non-blocking communicator, `Ok(false)`
/// for a blocking one; on an error, `raw` has been aborted (NCCL gives
/// out the communicator of a creation that failed while it was made).
///
/// # Safety
/// `raw` is the handle the creation just made (or NULL), given to nobody.
unsafe fn finish_creation(
    raw: sys::ncclComm_t,
    started: std::result::Result<result::NcclStatus, result::NcclError>,
    (rank, size): (usize, usize),
    (call, what, asked): (&'static str, &'static str, bool),
    timeout: Duration,
) -> Result<bool> {
    let status = match started {
        Ok(status) => status,
        Err(e) => {
            // SAFETY: the caller's promise.
            unsafe { abort_made(raw) };
            return Err(nccl_error(e, rank, call, what));
        }
    };
    if raw.is_null() {
        let reason = "NCCL's creation gave no communicator";
        return Err(invalid(rank, size, reason));
    }
    let in_progress = matches!(status, result::NcclStatus::InProgress);
    if !made_nonblocking(in_progress, asked) {
        return Ok(false);
    }
    let settled = match in_progress {
        // SAFETY: `raw` is the live handle just made, whose creation this
        // thread started.
        true => unsafe { settle(raw, timeout) },
        // Done before NCCL's answer (its thread was quicker).
        false => Settled::Done,
    };
    let settled = match settled {
        Settled::Done => match asked {
            true => Ok(true),
            // Settled first: NCCL before 2.27 keeps the call's state in
            // this thread, which is the one that settles it.
            false => check_nonblocking_version(rank, size, true).map(|()| true),
        },
        Settled::Failed(e) => Err(nccl_error(e, rank, call, what)),
        Settled::TimedOut(waited) => Err(CollectiveError::Timeout {
            rank,
            op: format!("{what} ({call}, rank {rank} of {size})"),
            waited,
        }
        .into()),
    };
    if settled.is_err() {
        // SAFETY: the caller's promise.
        unsafe { abort_made(raw) };
    }
    settled
}

/// Whether NCCL made a communicator it just created non-blocking: it
/// did where its creation answered `ncclInProgress` (`in_progress`), and
/// otherwise as NCCL decides, from the environment over the config
/// (`asked`): `NCCL_COMM_BLOCKING=0` makes every communicator non-blocking
/// and `1` blocking (NCCL's `envConfigOverride`). A non-blocking creation
/// can answer `ncclSuccess` (NCCL's thread finished before the call's
/// last look), and `ncclCommInitRank` always does. Read after the
/// creation, once NCCL has put the settings of its config files
/// (`/etc/nccl.conf`, `~/.nccl.conf`) into the environment.
fn made_nonblocking(in_progress: bool, asked: bool) -> bool {
    if in_progress {
        return true;
    }
    let env = std::env::var("NCCL_COMM_BLOCKING").ok();
    match env.and_then(|value| value.trim().parse::<i64>().ok()) {
        Some(0) => true,
        Some(1) => false,
        _ => asked,
    }
}

impl Communicator {
    /// A communicator of one rank (rank 0 of 1) on `device`
    /// (`ncclCommInitAll` over that device): collectives copy the send
    /// view into the receive view, on the queue's stream, through NCCL.
    ///
    /// # Errors
    /// [`CollectiveError::NoNccl`] (how to install NCCL),
    /// [`CollectiveError::Nccl`], a driver error making the device's
    /// context current.
    pub fn nccl_single(device: &CudaDevice) -> Result<Communicator> {
        probe()?;
        bind(device)?;
        let ordinal = c_int::try_from(device.ordinal()).unwrap_or(c_int::MAX);
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is one handle and the device list one ordinal, as
        // the count says; NCCL is loaded (probed).
        let started = unsafe { result::comm_init_all(&mut raw, 1, &ordinal) };
        let call = ("ncclCommInitAll", "a communicator of one rank", false);
        // SAFETY: the handle just made (or NULL), given to nobody.
        let nonblocking = unsafe { finish_creation(raw, started, (0, 1), call, DEFAULT_TIMEOUT) }?;
        Ok(Self::of_nccl(raw, device, (0, 1), nonblocking))
    }

    /// Rank `rank` of a blocking communicator of `size` ranks on `device`
    /// (`ncclCommInitRankConfig` asking `blocking = 1`; `ncclCommInitRank`
    /// before NCCL 2.18), every rank giving the same `id` (made by one
    /// of them with [`NcclId::new`]). Blocks until every rank called it,
    /// with no bound: [`nccl_with`](Self::nccl_with) and
    /// [`NcclConfig::nonblocking`] bound it. With MPI (the `mpi` feature
    /// too), `Communicator::nccl_over` hands the id round.
    ///
    /// # Errors
    /// [`CollectiveError::Invalid`] for a rank not below `size`;
    /// [`CollectiveError::NoNccl`], [`CollectiveError::Nccl`].
    pub fn nccl(device: &CudaDevice, id: NcclId, rank: usize, size: usize) -> Result<Communicator> {
        Self::nccl_with(device, id, rank, size, NcclConfig::blocking())
    }

    /// Rank `rank` of a communicator of `size` ranks on `device`, as
    /// [`nccl`](Self::nccl) makes it, made as `config` says: a
    /// non-blocking one (`ncclCommInitRankConfig`) waits for the other
    /// ranks at most `config`'s timeout, as its splits and its groups'
    /// launches do (see [`NcclConfig`]).
    ///
    /// # Errors
    /// Those of [`nccl`](Self::nccl); [`CollectiveError::Timeout`] where a
    /// non-blocking creation did not finish within the timeout (a rank
    /// never came: NCCL's attempt is aborted); [`CollectiveError::Invalid`]
    /// for an NCCL older than 2.27 asked for a non-blocking one.
    pub fn nccl_with(
        device: &CudaDevice,
        id: NcclId,
        rank: usize,
        size: usize,
        config: NcclConfig,
    ) -> Result<Communicator> {
        let (Ok(rank32), Ok(size32)) = (c_int::try_from(rank), c_int::try_from(size)) else {
            return Err(invalid(rank, size, "NCCL counts ranks in a C `int`"));
        };
        if rank >= size {
            return Err(invalid(rank, size, "a rank must be below the group's size"));
        }
        probe()?;
        if config.is_nonblocking() {
            check_nonblocking_version(rank, size, false)?;
        }
        bind(device)?;
        let mut raw = std::ptr::null_mut();
        // A blocking one through the config call too, asking for it
        // (`blocking = 1`): `NCCL_COMM_BLOCKING=0` overrides any config,
        // and a creation run in a group, as this call runs it, answers
        // `ncclInProgress` then, while it goes on (`ncclCommInitRank`
        // creates on the calling thread). Either way `finish_creation`
        // also reads the variable, as NCCL does. hwqueue's config is NCCL
        // 2.18's: an older NCCL gets `ncclCommInitRank`.
        let by_config = config.is_nonblocking() || nccl_version(rank)? >= VERSION as c_int;
        let (call, started) = if by_config {
            let mut raw_config = RawConfig::with_blocking(!config.is_nonblocking());
            // SAFETY: `raw` is one handle; the id is NCCL's (made by
            // `ncclGetUniqueId` on some rank); NCCL is loaded (probed), and
            // the device's context is current, which selects its device.
            // NCCL writes the handle before it returns (a non-blocking
            // creation then goes on on its thread) and reads the config
            // only during the call.
            let started = unsafe {
                sys::ncclCommInitRankConfig(&mut raw, size32, id.0, rank32, raw_config.as_ptr())
            };
            ("ncclCommInitRankConfig", started)
        } else {
            // SAFETY: as above.
            let started = unsafe { sys::ncclCommInitRank(&mut raw, size32, id.0, rank32) };
            ("ncclCommInitRank", started)
        };
        let what = "the communicator's creation";
        // SAFETY: the handle the creation made (or NULL), given to nobody.
        let nonblocking = unsafe {
            finish_creation(
                raw,
                started.result(),
                (rank, size),
                (call, what, config.is_nonblocking()),
                config.timeout(),
            )
        }?;
        let comm = Self::of_nccl(raw, device, (rank, size), nonblocking);
        comm.set_timeout(config.timeout());
        Ok(comm)
    }

    /// This rank of an NCCL communicator on `device` with the ranks of
    /// `world`, an MPI communicator (rank and size from `mpirun`): rank 0
    /// makes the unique id and broadcasts it over `world`, from the
    /// calling thread (a host collective at this point of `world`'s order,
    /// bounded by its timeout, as [`Communicator::split`] is).
    ///
    /// # Errors
    /// Those of the broadcast ([`CollectiveError::Timeout`] where a rank
    /// never comes; [`CollectiveError::Invalid`] for a `world` that is
    /// not MPI's) and of [`Communicator::nccl`].
    #[cfg(feature = "mpi")]
    pub fn nccl_over(world: &Communicator, device: &CudaDevice) -> Result<Communicator> {
        Self::nccl_over_with(world, device, NcclConfig::blocking())
    }

    /// [`nccl_over`](Self::nccl_over), the communicator made as `config`
    /// says ([`nccl_with`](Self::nccl_with)).
    ///
    /// # Errors
    /// Those of [`nccl_over`](Self::nccl_over) and
    /// [`nccl_with`](Self::nccl_with).
    #[cfg(feature = "mpi")]
    pub fn nccl_over_with(
        world: &Communicator,
        device: &CudaDevice,
        config: NcclConfig,
    ) -> Result<Communicator> {
        let (rank, size) = (world.rank(), world.size());
        if world.engine() != "mpi" {
            let reason =
                "`nccl_over` hands NCCL's id round over an MPI communicator (`Mpi::world`)";
            return Err(invalid(rank, size, reason));
        }
        // Every rank probes, and rank 0 makes the id; a rank that cannot
        // still joins the broadcast, described failed, so its peers fail
        // at once (a mismatch naming it) instead of waiting for it until
        // the timeout breaks `world`, and every rank keeps `world`'s order.
        let ready = probe().and_then(|()| match rank {
            0 => NcclId::new().map(|id| id.to_bytes()),
            _ => Ok([0u8; 128]),
        });
        let plan = super::HostCollective {
            op: CollectiveOp::Broadcast { root: 0 },
            element: Element::U32,
            count: 128 / Element::U32.size(),
            sequence: world.next_sequence(),
        };
        // The root's own id (a broadcast writes nothing at its root).
        let mut received = ready.as_ref().map_or([0u8; 128], |bytes| *bytes);
        let sent = world.run_on_host(
            &plan,
            &mut |send| match &ready {
                Ok(bytes) => {
                    send.copy_from_slice(&bytes[..send.len()]);
                    Ok(())
                }
                Err(error) => Err(error.clone()),
            },
            &mut |recv| {
                received.copy_from_slice(recv);
                Ok(())
            },
        );
        // This rank's own failure first: its peers were told of it.
        ready?;
        sent?;
        Self::nccl_with(device, NcclId::from_bytes(received), rank, size, config)
    }
}

impl NcclComm {
    /// `ncclCommSplit` of a non-blocking communicator (whose mode the new
    /// one takes), under `calls`: NCCL writes the new handle from its own
    /// thread once the split finished, so the place it writes to is on
    /// the heap, and read only once the split settled or the abort of
    /// this communicator (which joins NCCL's thread) ended it. A split
    /// still running after `timeout` breaks this communicator (its peers
    /// are stuck in the exchange) and aborts it, and the new one too.
    pub(super) fn split_nonblocking(
        &self,
        calls: crate::sync::MutexGuard<'_, Calls>,
        timeout: Duration,
        color: c_int,
        key: c_int,
    ) -> Result<sys::ncclComm_t> {
        let rank = self.core.rank;
        let parent = self.core.raw.0;
        let out = Box::into_raw(Box::new(std::ptr::null_mut::<sys::ncclComm>()));
        // Takes the new handle back from where NCCL wrote it (NULL where
        // it made none), once NCCL's thread ended; frees the box.
        let take = || {
            // SAFETY: `out` is the box made above, whose writer (NCCL's
            // thread) has ended: the split settled, or failed to start, or
            // the parent's abort joined it.
            unsafe { *Box::from_raw(out) }
        };
        let mut config = RawConfig::nonblocking();
        // SAFETY: the parent handle is live (not aborted: `broken` is set
        // before an abort) and used by this thread alone (`calls` held);
        // `out` stays valid until NCCL's thread ended (see `take`); NCCL
        // reads `config` only during the call.
        let started = unsafe { sys::ncclCommSplit(parent, color, key, out, config.as_ptr()) };
        let what = "splitting the communicator";
        // `Ok` is done or `ncclInProgress` (cudarc's `NcclStatus`).
        if let Err(e) = started.result() {
            // SAFETY: the split's new handle (or NULL), given to nobody.
            unsafe { abort_made(take()) };
            return Err(nccl_error(e, rank, "ncclCommSplit", what));
        }
        // SAFETY: the parent is live (`calls` is held, so nobody aborts
        // it), and this thread is the one that asks for its state meanwhile
        // (the watchdog asks only when `calls` is free).
        match unsafe { settle(parent, timeout) } {
            Settled::Done => {
                drop(calls);
                Ok(take())
            }
            // NCCL's errors on a communicator are fatal to it: broken and
            // aborted, which joins NCCL's thread (should it still run).
            Settled::Failed(e) => {
                let failed = nccl_error(e, rank, "ncclCommSplit", what);
                self.watchdog.break_now(&self.core, calls, failed.clone());
                // SAFETY: the split's new handle (or NULL), given to nobody.
                unsafe { abort_made(take()) };
                Err(failed)
            }
            Settled::TimedOut(waited) => {
                let timed_out: Error = CollectiveError::Timeout {
                    rank,
                    op: "the split of the communicator (ncclCommSplit)".to_owned(),
                    waited,
                }
                .into();
                // Aborts the parent, which joins NCCL's thread.
                self.watchdog
                    .break_now(&self.core, calls, timed_out.clone());
                // SAFETY: the split's new handle (or NULL), given to nobody.
                unsafe { abort_made(take()) };
                Err(timed_out)
            }
        }
    }
}
