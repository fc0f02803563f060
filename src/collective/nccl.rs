//! NCCL communicators (the `nccl` feature) and how a CUDA queue's stream
//! runs their collectives: the thin layer over cudarc's `nccl::result`
//! (every call a `Result`), a communicator that owns its `ncclComm_t`, and
//! [`enqueue_run`], which the stream side calls for a run of collectives;
//! [`Communicator::split`]'s NCCL side. The watchdog that bounds a
//! collective's time is `nccl_watchdog.rs`.
//!
//! cudarc loads NCCL at run time and panics when it is absent, or when a
//! symbol is missing, so nothing here calls NCCL before [`probe`] found
//! it: every constructor probes first, and a communicator (or an
//! [`NcclId`]) exists only once the library loaded.
//!
//! A collective (or send, or receive) that this rank skips, its batch
//! refused or failed before it, cannot be forfeited as a CPU queue
//! forfeits one over MPI (NCCL has no description to send failed), and
//! the peers' matching call would pair with this rank's next one: where
//! that came before their watchdog's timeout and was alike, they would
//! get another step's data. So a skip breaks the communicator on this
//! rank ([`NcclComm::skipped`], called in queue order where the batch
//! fails, `Batch::fail_from`): its later collectives fail at once with
//! [`CollectiveError::Broken`] naming the skipped one
//! ([`CollectiveError::Skipped`]), and the peers' call times out. The
//! groups already in flight are not aborted: they were issued in step.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use cudarc::nccl::{result, sys};

use cudarc::driver::CudaStream;

use super::nccl_behind::StreamWatch;
use super::nccl_create::{Settled, settle};
use super::nccl_watchdog::Watchdog;
use super::{
    Collective, CollectiveError, CollectiveOp, Communicator, Element, Reduction, Transport,
};
use crate::cuda::{Cuda, CudaDevice};
use crate::error::{Error, Result};
use crate::queue::{Command, Ledger};
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::view::View;

/// Checks that cudarc can load NCCL; [`CollectiveError::NoNccl`] saying
/// how to install it where not.
pub(super) fn probe() -> Result<()> {
    // SAFETY: a trial load of NCCL by cudarc's own names: it runs the
    // library's initialisers and nothing else.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    // SAFETY: as above, by the runtime package's name.
    let found = if unsafe { libloading::Library::new("libnccl.so.2") }.is_ok() {
        "`libnccl.so.2` is on the library path, but cudarc opens `libnccl.so` (and versioned \
         names other than `.so.2`)"
    } else {
        "no `libnccl.so` on the library path"
    };
    Err(CollectiveError::NoNccl { found }.into())
}

/// NCCL's unique id: made by one rank ([`NcclId::new`]) and handed to the
/// others (over MPI, a file, the launcher's environment) before each makes
/// its rank of the communicator ([`Communicator::nccl`]).
#[derive(Clone, Copy)]
pub struct NcclId(pub(super) sys::ncclUniqueId);

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`).
    ///
    /// # Errors
    /// [`CollectiveError::NoNccl`], [`CollectiveError::Nccl`].
    pub fn new() -> Result<NcclId> {
        probe()?;
        let id = result::get_uniqueid()
            .map_err(|e| nccl_error(e, usize::MAX, "ncclGetUniqueId", "a unique id"))?;
        Ok(NcclId(id))
    }

    /// Its 128 bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id another rank made, from its bytes.
    pub fn from_bytes(bytes: [u8; 128]) -> NcclId {
        NcclId(sys::ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        })
    }
}

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

/// One rank's NCCL communicator on one CUDA device, and its watchdog
/// (declared first: dropped first, it stops its thread, which holds the
/// core, before the core goes).
pub(crate) struct NcclComm {
    pub(super) watchdog: Watchdog,
    pub(super) core: Arc<NcclCore>,
    pub(super) device: CudaDevice,
}

/// What the communicator and its watchdog's thread share: the
/// `ncclComm_t`, owned (destroyed by the last holder, unless aborted).
pub(super) struct NcclCore {
    pub(super) raw: RawNcclComm,
    pub(super) rank: usize,
    /// Non-blocking, as NCCL made it (asked for with
    /// [`NcclConfig::nonblocking`](super::NcclConfig::nonblocking), or
    /// forced by `NCCL_COMM_BLOCKING=0`; see `nccl_create::finish_creation`):
    /// its splits and groups finish on NCCL's threads, polled for
    /// (`settle`, under `calls`).
    pub(super) nonblocking: bool,
    /// Held while a thread calls NCCL on the communicator (a queue's
    /// worker putting a group on its stream, a split, the watchdog's
    /// abort): NCCL forbids concurrent calls on one communicator, and
    /// several queues may share it. Guards whether it is broken.
    pub(super) calls: Mutex<Calls>,
    /// Why the watchdog is breaking it while a launch holds `calls` (see
    /// `nccl_watchdog::break_communicator`): a launch or split that takes
    /// `calls` meanwhile finds it broken, as it will be.
    pub(super) breaking: std::sync::OnceLock<Arc<Error>>,
}

/// The state of an NCCL communicator that its calls check, under
/// [`NcclCore::calls`].
#[derive(Default)]
pub(super) struct Calls {
    /// Why it runs no more collectives: the watchdog's timeout, an
    /// asynchronous NCCL error, or a call that failed or never finished
    /// (`Watchdog::break_now`). Set once, before the abort.
    pub(super) broken: Option<Arc<Error>>,
    /// `ncclCommAbort` freed the handle: nothing may call NCCL with it,
    /// destroying it included.
    pub(super) aborted: bool,
}

/// An `ncclComm_t`.
pub(super) struct RawNcclComm(pub(super) sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one at a time;
// `NcclCore::calls` serialises every call on it (groups, splits, the
// watchdog's abort, and a non-blocking one's `ncclCommGetAsyncError`,
// which finishes NCCL's call in flight); a blocking one's
// `ncclCommGetAsyncError`, which any thread may call at any time, is the
// exception, and creation and destruction have the only handle.
unsafe impl Send for RawNcclComm {}
// SAFETY: as for `Send`: shared use goes through `NcclComm::calls`.
unsafe impl Sync for RawNcclComm {}

impl Drop for NcclCore {
    fn drop(&mut self) {
        // Commands hold the communicator until their stream passed them,
        // and the watchdog's thread (the other holder) has ended, so
        // nothing of it is in flight. An error cannot be returned from
        // here, and a failed release leaks only NCCL's resources.
        if !self.calls.lock().aborted {
            if self.breaking.get().is_some() {
                // Its watchdog ended before it could abort (a launch held
                // `calls`): a collective timed out, so no destroy, which
                // may wait for it.
                // SAFETY: the handle is live (not aborted) and this is its
                // last user; the abort frees it.
                let _ = unsafe { result::comm_abort(self.raw.0) };
                return;
            }
            // SAFETY: the handle is live (not aborted) and this is its
            // last user.
            unsafe { release(self.raw.0) };
        }
    }
}

/// Frees `raw`: `ncclCommDestroy` when it holds no error, `ncclCommAbort`
/// when it does (or when NCCL cannot say). NCCL's destroy returns an error
/// the communicator holds (a peer that failed after its last collective,
/// which no watchdog saw: it looks only while a group is in flight) from
/// inside a group it opened and never closes, leaving the calling
/// thread's group depth raised: every later `ncclGroupEnd` on that thread
/// would then return success having launched nothing, and a creation
/// would return an uninitialised communicator.
///
/// # Safety
/// `raw` is a live communicator that nothing else uses, with no call in
/// flight; it is freed either way.
pub(super) unsafe fn release(raw: sys::ncclComm_t) {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: live and unused elsewhere (the caller's promise).
    let asked = unsafe { sys::ncclCommGetAsyncError(raw, &mut state) };
    let healthy =
        asked == sys::ncclResult_t::ncclSuccess && state == sys::ncclResult_t::ncclSuccess;
    if !healthy {
        // SAFETY: as above; the abort frees the handle.
        let _ = unsafe { result::comm_abort(raw) };
        return;
    }
    // SAFETY: as above; the destroy frees the handle, but for the case
    // below.
    if unsafe { result::comm_destroy(raw) }.is_err() {
        // An error raised after the look above (a peer failing just
        // then). NCCL 2.24 to 2.26 and 2.27.6 on return it from inside the
        // destroy's group, before anything was freed: that group is
        // closed here, so that this thread's group depth is right again,
        // and the handle aborted. Where the error came from closing that
        // group (the handle may be freed then), no group is open and this
        // answers `ncclInvalidUsage`. NCCL 2.23, 2.27.3 and 2.27.5 open
        // no group, and free nothing on an error: aborted too. (Before
        // 2.23 an error may come after the handle was freed: left.)
        // SAFETY: no handle is passed; it ends this thread's group.
        let closed = unsafe { sys::ncclGroupEnd() } == sys::ncclResult_t::ncclSuccess;
        let groupless = || {
            let version = super::nccl_create::nccl_version(0).unwrap_or(0);
            (22300..22400).contains(&version) || matches!(version, 22703 | 22705)
        };
        if closed || groupless() {
            // SAFETY: the destroy stopped before it freed the handle.
            let _ = unsafe { result::comm_abort(raw) };
        }
    }
}

impl NcclComm {
    /// The device it runs on.
    pub(super) fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// `calls`, for a launch or a split, once it is free and the
    /// communicator not broken. A blocking launch can hold it for good
    /// (NCCL connecting to a peer that never comes, inside `ncclGroupEnd`):
    /// where the watchdog is breaking the communicator meanwhile, this
    /// refuses at once, as broken, rather than wait behind it.
    fn take_calls(&self) -> Result<MutexGuard<'_, Calls>> {
        loop {
            if let Some(calls) = self.core.calls.try_lock_for(CALLS_LOOK) {
                self.check_broken(&calls)?;
                return Ok(calls);
            }
            if let Some(cause) = self.core.breaking.get() {
                return Err(CollectiveError::Broken {
                    rank: self.core.rank,
                    cause: cause.clone(),
                }
                .into());
            }
        }
    }

    /// Breaks it on this rank because `collective` will not run here
    /// (see the module docs), for `cause`: where nothing broke it before,
    /// every later launch or split fails with [`CollectiveError::Broken`]
    /// naming it. What is in flight goes on (it was issued in step), and
    /// nothing calls NCCL here. It is marked breaking, as the watchdog
    /// marks one a launch holds, so that dropped it is aborted, not
    /// destroyed: the peers may still be in the call it skipped.
    pub(crate) fn skipped<B: crate::Backend>(&self, collective: &Collective<B>, cause: &Error) {
        let error = || -> Arc<Error> {
            Arc::new(
                CollectiveError::Skipped {
                    rank: self.core.rank,
                    op: collective.describe(),
                    cause: Arc::new(cause.clone()),
                }
                .into(),
            )
        };
        // Without `calls`, which a launch on another queue may hold (a
        // blocking one for good). Where the watchdog broke it already, its
        // cause stays first (`check_broken` looks at `broken` first).
        if self.core.breaking.get().is_none() {
            let _ = self.core.breaking.set(error());
        }
    }

    /// [`CollectiveError::Broken`] if the watchdog broke it.
    fn check_broken(&self, calls: &Calls) -> Result<()> {
        match calls.broken.as_ref().or_else(|| self.core.breaking.get()) {
            Some(cause) => Err(CollectiveError::Broken {
                rank: self.core.rank,
                cause: cause.clone(),
            }
            .into()),
            None => Ok(()),
        }
    }

    /// [`Communicator::split`] over NCCL: `ncclCommSplit` with `color`
    /// (`NCCL_SPLIT_NOCOLOR` for `None`, which makes no communicator) and
    /// `key`, on this communicator's device; the new one is as blocking as
    /// this one, and `timeout` bounds a non-blocking split (`size`: this
    /// communicator's, for errors).
    pub(super) fn split(
        &self,
        (size, timeout): (usize, Duration),
        color: Option<u32>,
        key: u32,
    ) -> Result<Option<Communicator>> {
        let rank = self.core.rank;
        let int = |value: u32, what: &str| {
            c_int::try_from(value).map_err(|_| {
                let reason = format!(
                    "NCCL takes the split's {what} as a non-negative C `int`: {value} is above {}",
                    c_int::MAX
                );
                CollectiveError::Invalid {
                    rank,
                    size,
                    op: "split",
                    reason,
                }
            })
        };
        let color = match color {
            Some(color) => int(color, "color")?,
            None => NCCL_SPLIT_NOCOLOR,
        };
        let key = int(key, "key")?;
        // cudarc panics on a symbol the library lacks: NCCL has
        // `ncclCommSplit` from 2.18 on.
        // SAFETY: NCCL is loaded (a communicator exists); a lookup by name
        // runs nothing.
        let found = unsafe { sys::culib().get::<unsafe extern "C" fn()>(b"ncclCommSplit\0") };
        if found.is_err() {
            let reason = "the NCCL loaded has no `ncclCommSplit` (NCCL 2.18 or newer has it): \
                          upgrade NCCL, or make the smaller group's communicator with \
                          `Communicator::nccl` and an id of its own";
            return Err(CollectiveError::Invalid {
                rank,
                size,
                op: "split",
                reason: reason.to_owned(),
            }
            .into());
        }
        bind(&self.device)?;
        let calls = self.take_calls()?;
        let raw = if self.core.nonblocking {
            self.split_nonblocking(calls, timeout, color, key)?
        } else {
            let mut raw = std::ptr::null_mut();
            // SAFETY: the parent handle is live (not aborted: `broken` is
            // set before an abort) and used by this thread alone (`calls`
            // held); `raw` is one handle, written before the call returns
            // (the parent blocks: its creation said so, and NCCL gives a
            // split its parent's mode); a null config asks for the
            // parent's.
            let split = unsafe {
                sys::ncclCommSplit(self.core.raw.0, color, key, &mut raw, std::ptr::null_mut())
            };
            if let Err(e) = split.result() {
                let failed = nccl_error(e, rank, "ncclCommSplit", "splitting the communicator");
                if !raw.is_null() {
                    // NCCL gives out the new communicator of a split that
                    // failed while making it, and keeps it linked to this
                    // one until it is aborted: this one first (its peers
                    // are somewhere in the split), then the new one.
                    self.watchdog.break_now(&self.core, calls, failed.clone());
                    // SAFETY: the split's new handle, given to nobody.
                    unsafe { super::nccl_create::abort_made(raw) };
                }
                return Err(failed);
            }
            drop(calls);
            raw
        };
        if raw.is_null() {
            if color == NCCL_SPLIT_NOCOLOR {
                return Ok(None);
            }
            let reason = "NCCL's split gave this rank no communicator for its color";
            return Err(invalid(rank, size, reason));
        }
        // SAFETY: `raw` is the live handle the split just made.
        let counted = unsafe { (result::comm_user_rank(raw), result::comm_count(raw)) };
        let failed = match counted {
            (Ok(new_rank), Ok(new_size)) => Ok((new_rank, new_size)),
            (Err(e), _) => Err((e, "ncclCommUserRank", "the split's rank")),
            (_, Err(e)) => Err((e, "ncclCommCount", "the split's size")),
        };
        let (new_rank, new_size) = match failed {
            Ok(counts) => counts,
            Err((e, call, what)) => {
                // SAFETY: `raw` is live and has no other user.
                unsafe { release(raw) };
                return Err(nccl_error(e, rank, call, what));
            }
        };
        let (Ok(new_rank), Ok(new_size)) = (usize::try_from(new_rank), usize::try_from(new_size))
        else {
            // SAFETY: as above.
            unsafe { release(raw) };
            return Err(invalid(rank, size, "NCCL reported a negative rank or size"));
        };
        Ok(Some(Communicator::of_nccl(
            raw,
            &self.device,
            (new_rank, new_size),
            self.core.nonblocking,
        )))
    }
}

/// `NCCL_SPLIT_NOCOLOR` (`nccl.h`): the color of a rank that joins no
/// communicator of the split.
const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// How long a launch or split waits for `calls` between looks at whether
/// the watchdog is breaking the communicator (`NcclComm::take_calls`).
const CALLS_LOOK: Duration = Duration::from_millis(1);

impl Communicator {
    pub(super) fn of_nccl(
        raw: sys::ncclComm_t,
        device: &CudaDevice,
        (rank, size): (usize, usize),
        nonblocking: bool,
    ) -> Communicator {
        let comm = NcclComm {
            watchdog: Watchdog::new(),
            core: Arc::new(NcclCore {
                raw: RawNcclComm(raw),
                rank,
                nonblocking,
                calls: Mutex::new(Calls::default()),
                breaking: std::sync::OnceLock::new(),
            }),
            device: device.clone(),
        };
        Communicator::new(rank, size, Transport::Nccl(comm))
    }

    /// Its NCCL communicator, if it is one.
    pub(crate) fn as_nccl(&self) -> Option<&NcclComm> {
        match self.shared.transport {
            Transport::Nccl(ref comm) => Some(comm),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The device of its NCCL communicator, if it is one: a CUDA queue of
    /// that device runs its collectives.
    pub fn nccl_device(&self) -> Option<&CudaDevice> {
        self.as_nccl().map(NcclComm::device)
    }
}

/// Makes `device`'s context current on this thread: NCCL's creation calls
/// take the current device.
pub(super) fn bind(device: &CudaDevice) -> Result<()> {
    let context = device.context();
    (context.bind_to_thread())
        .map_err(|e| crate::cuda::context_error(context, "making the context current for NCCL", e))
}

pub(super) fn invalid(rank: usize, size: usize, reason: &str) -> Error {
    CollectiveError::Invalid {
        rank,
        size,
        op: "nccl",
        reason: reason.to_owned(),
    }
    .into()
}

/// [`CollectiveError::Nccl`] for `call`'s failure.
pub(super) fn nccl_error(
    error: result::NcclError,
    rank: usize,
    call: &'static str,
    what: &str,
) -> Error {
    use sys::ncclResult_t as R;
    let remedy = match error.0 {
        R::ncclUnhandledCudaError => "a CUDA call inside NCCL failed: check the device's health",
        R::ncclSystemError => {
            "a system call failed (in a container, shared memory is often too small: \
             `--shm-size=1g`); NCCL_DEBUG=WARN prints which"
        }
        R::ncclInternalError => "NCCL_DEBUG=WARN prints NCCL's reason",
        R::ncclInvalidArgument | R::ncclInvalidUsage => {
            "NCCL refused the call's arguments or their order; NCCL_DEBUG=WARN prints why"
        }
        R::ncclRemoteError => "a peer failed or exited: make a new communicator",
        _ => "NCCL_DEBUG=WARN prints NCCL's reason",
    };
    CollectiveError::Nccl {
        rank,
        call,
        what: what.to_owned(),
        code: error.0 as u32,
        name: format!("{:?}", error.0),
        remedy,
    }
    .into()
}

/// Puts the run of collectives that starts at `commands[start]` on
/// `stream`, in one `ncclGroupStart`/`ncclGroupEnd`: the collectives that
/// follow it in the batch over the same communicator; then hands the
/// group to the communicator's watchdog (an event recorded after it, and
/// the signals and downloads after it in the batch, to fail should it
/// time out; `ledger`, the queue's, to report that to, with the batch's
/// `epoch`; `behind`, the stream's watch, to hand the group what the
/// stream enqueues after it). Returns where the run ends, or the index of
/// the command that failed and its error (the group is ended in either
/// case). A broken communicator fails the run at once, calling nothing.
pub(crate) fn enqueue_run(
    commands: &[Command<Cuda>],
    start: usize,
    stream: &CudaStream,
    (ledger, epoch): (&Ledger, u64),
    behind: &StreamWatch,
) -> std::result::Result<usize, (usize, Error)> {
    let collective = |index: usize| match commands.get(index) {
        Some(Command::Collective(collective)) => Some(&**collective),
        _ => None,
    };
    let first = collective(start).expect("a run starts at a collective");
    let Some(comm) = first.communicator.as_nccl() else {
        let error = CollectiveError::unsupported("cuda", &first.communicator);
        return Err((start, error.into()));
    };
    let mut end = start + 1;
    while collective(end).is_some_and(|next| next.communicator.same_as(&first.communicator)) {
        end += 1;
    }
    let calls = comm.take_calls().map_err(|e| (start, e))?;
    comm.watchdog
        .start(&comm.core, &comm.device)
        .map_err(|e| (start, e))?;
    let rank = first.communicator.rank();
    let group = comm.watchdog.take_group(stream).map_err(|e| (start, e))?;
    if let Err(e) = result::group_start() {
        comm.watchdog.give_back(group);
        return Err((start, nccl_error(e, rank, "ncclGroupStart", "a group")));
    }
    let mut failed = None;
    for index in start..end {
        let collective = collective(index).expect("the run holds collectives only");
        if let Err(error) = issue(comm, collective, stream.cu_stream().cast()) {
            failed = Some((index, error));
            break;
        }
    }
    let timeout = first.communicator.timeout();
    // A non-blocking communicator's group is put on the stream by NCCL's
    // thread: nothing else goes on the stream (nor is NCCL called on the
    // communicator) before it did, or failed to.
    let group_failed = |e| nccl_error(e, rank, "ncclGroupEnd", "a group");
    let ended = match result::group_end() {
        // SAFETY: the handle is live (`calls` is held, so nobody aborts
        // it), and this thread is the one that asks for its state
        // meanwhile (the watchdog asks only when `calls` is free).
        Ok(result::NcclStatus::InProgress) => match unsafe { settle(comm.core.raw.0, timeout) } {
            Settled::Done => Ok(()),
            Settled::Failed(e) => Err(group_failed(e)),
            Settled::TimedOut(waited) => Err(CollectiveError::Timeout {
                rank,
                op: format!("{} (its launch: ncclGroupEnd)", first.describe()),
                waited,
            }
            .into()),
        },
        ended => ended.map(drop).map_err(group_failed),
    };
    if let Some(failure) = failed.or_else(|| ended.err().map(|error| (start, error))) {
        // NCCL launches none of a group that failed (an error of any of
        // its calls is the group's, `group.cc`), where the peers may have
        // launched theirs: this rank would start its next collective where
        // they are still in this one, and nothing here compares the two.
        // A non-blocking communicator's state holds the error from now on
        // too (and a launch that never settled is still NCCL's). So it is
        // broken and aborted, as by an asynchronous error.
        comm.watchdog.give_back(group);
        comm.watchdog
            .break_now(&comm.core, calls, failure.1.clone());
        return Err(failure);
    }
    // A panic there (a bug) must not leave the group on the stream
    // unwatched, nor pass it for skipped (`Batch::fail_from`): aborted too.
    let watched = catch_unwind(AssertUnwindSafe(|| {
        let after = &commands[end..];
        (comm.watchdog).watch(
            group,
            stream,
            first,
            after,
            (ledger, epoch, timeout),
            behind,
        )
    }))
    .unwrap_or_else(|payload| {
        Err(Error::EnginePanicked {
            message: crate::error::panic_message(payload),
        })
    });
    if let Err(error) = watched {
        // On the stream, with nothing to end it should a peer never come:
        // broken and aborted now (its kernels exit), failing from its
        // start.
        comm.watchdog.break_now(&comm.core, calls, error.clone());
        return Err((start, error));
    }
    drop(calls);
    Ok(end)
}

/// The device address of a view's first byte.
fn address(view: Option<&View<Cuda>>) -> u64 {
    view.map_or(0, |view| {
        view.buffer().device_pointer() + view.offset() as u64
    })
}

/// Puts one collective on `stream` (inside the caller's group).
fn issue(comm: &NcclComm, collective: &Collective<Cuda>, stream: sys::cudaStream_t) -> Result<()> {
    let count = collective.count();
    let datatype = match collective.element {
        Element::F32 => sys::ncclDataType_t::ncclFloat32,
        Element::F64 => sys::ncclDataType_t::ncclFloat64,
        Element::I32 => sys::ncclDataType_t::ncclInt32,
        Element::U32 => sys::ncclDataType_t::ncclUint32,
        #[cfg(feature = "half")]
        Element::F16 => sys::ncclDataType_t::ncclFloat16,
        #[cfg(feature = "half")]
        Element::BF16 => sys::ncclDataType_t::ncclBfloat16,
    };
    let reduction = |reduction: Reduction| match reduction {
        Reduction::Sum => sys::ncclRedOp_t::ncclSum,
        Reduction::Product => sys::ncclRedOp_t::ncclProd,
        Reduction::Min => sys::ncclRedOp_t::ncclMin,
        Reduction::Max => sys::ncclRedOp_t::ncclMax,
    };
    let send = address(collective.send.as_ref()) as *const std::ffi::c_void;
    let recv = address(collective.recv.as_ref()) as *mut std::ffi::c_void;
    let raw = comm.core.raw.0;
    // The checks at record time: peers and roots below the group's size
    // (so they fit NCCL's `int`), views of this queue's device.
    let peer = |peer: usize| c_int::try_from(peer).unwrap_or(c_int::MAX);
    // SAFETY: every view lies in a buffer of the communicator's device
    // (checked at record time: the queue's device is the communicator's),
    // of the lengths the operation needs for `count` elements (checked at
    // record time), kept alive until the stream passed the batch; `raw`
    // is live (the command holds its communicator, and `enqueue_run` found
    // it not broken under `calls`, which the watchdog sets before it
    // aborts), used by this thread alone (`calls` is held), and `stream`
    // is the queue's, of the same
    // device.
    let (call, done) = unsafe {
        match collective.op {
            CollectiveOp::AllReduce(r) => (
                "ncclAllReduce",
                result::all_reduce(send, recv, count, datatype, reduction(r), raw, stream),
            ),
            CollectiveOp::AllGather => (
                "ncclAllGather",
                result::all_gather(send, recv, count, datatype, raw, stream),
            ),
            CollectiveOp::ReduceScatter(r) => (
                "ncclReduceScatter",
                result::reduce_scatter(send, recv, count, datatype, reduction(r), raw, stream),
            ),
            CollectiveOp::Broadcast { root } => {
                // One view: the root's is sent, the others' received.
                let view = address(collective.send.as_ref().or(collective.recv.as_ref()));
                let (send, recv) = (
                    view as *const std::ffi::c_void,
                    view as *mut std::ffi::c_void,
                );
                (
                    "ncclBroadcast",
                    result::broadcast(send, recv, count, datatype, peer(root), raw, stream),
                )
            }
            CollectiveOp::Send { peer: to } => (
                "ncclSend",
                result::send(send, count, datatype, peer(to), raw, stream),
            ),
            CollectiveOp::Recv { peer: from } => (
                "ncclRecv",
                result::recv(recv, count, datatype, peer(from), raw, stream),
            ),
        }
    };
    done.map(drop).map_err(|e| {
        nccl_error(
            e,
            collective.communicator.rank(),
            call,
            &collective.describe(),
        )
    })
}
