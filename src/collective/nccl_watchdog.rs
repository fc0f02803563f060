//! The watchdog of an NCCL communicator: what bounds the time of its
//! collectives, as PyTorch's `ProcessGroupNCCL` watchdog does.
//!
//! NCCL has no timeout of its own: a collective whose peer died or never
//! comes spins in its kernel forever, and everything behind it on the
//! stream waits. So each group a queue puts on its stream
//! ([`super::nccl::enqueue_run`]) is followed by an event, and handed here
//! with the communicator's timeout and what the batch does after it (its
//! signals and downloads). One thread per communicator, started with its
//! first group and ended (joined) when the communicator drops, looks at
//! the groups in flight every [`POLL`] (or at the next deadline, if
//! sooner) while there are any, and sleeps otherwise:
//!
//! - a group whose event completed is done, and is forgotten;
//! - a group past its deadline, or an asynchronous NCCL error
//!   (`ncclCommGetAsyncError`), breaks the communicator: under its call
//!   lock (so no queue calls NCCL meanwhile, and every later collective
//!   fails at once with [`CollectiveError::Broken`]; while a launch holds
//!   that lock, which a blocking one can do with no bound, the
//!   communicator is marked breaking instead, to the same effect, and what
//!   follows happens without the lock, but for the abort), the signals and
//!   downloads after every group in flight are failed, even though their
//!   events are recorded ([`CudaSignal`]'s `abandon`): the late group's
//!   with [`CollectiveError::Timeout`] (or the oldest group's with the
//!   NCCL error), the others' not done yet with
//!   [`CollectiveError::Broken`]; so are the batches each group's stream
//!   enqueued behind it, under their queue's cascade (`nccl_behind.rs`);
//!   each queue's owner is told at
//!   its next `submit` or `synchronize`; and then, once the lock is free,
//!   `ncclCommAbort`, which makes NCCL's kernels exit, so the stream moves
//!   on.
//!
//! The launch path pays one event record and two short locks per group
//! (events and the lists of what to fail are reused), and no allocation
//! once warm; nothing per kernel.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream, sys::CUevent_flags};
use cudarc::nccl::sys;

use super::nccl::{Calls, NcclCore, nccl_error};
use super::nccl_behind::{Behind, StreamWatch};
use super::{Collective, CollectiveError, HostCollective};
use crate::cuda::{Cuda, CudaDevice, CudaSignal};
use crate::error::{Error, Result, panic_message};
use crate::queue::{Command, Ledger};
use crate::sync::{Arc, Condvar, JoinHandle, Mutex, MutexGuard, spawn_joinable};
use crate::transfer::DownloadSink;

/// How often the thread looks at the oldest group in flight (and asks
/// NCCL for an asynchronous error) while there is one. A timeout is seen
/// within this much of its deadline.
pub(super) const POLL: Duration = Duration::from_millis(10);

/// A communicator's watchdog: its thread (once started) and what the
/// queues hand it.
pub(super) struct Watchdog {
    shared: Arc<WatchShared>,
    /// The thread, once the first group started it; joined on drop.
    thread: Mutex<Option<JoinHandle>>,
}

struct WatchShared {
    state: Mutex<WatchState>,
    /// Notified when a group arrives at an empty list, and on close.
    changed: Condvar,
    /// Held while groups taken from `state` are failed, and by
    /// `break_under` until its abort is done: an abort (which lets the
    /// aborted kernels' events complete) never overtakes a failing pass
    /// the watchdog makes without `calls` (`break_communicator`), which
    /// would then take a group it has not failed yet for done.
    failing: Mutex<()>,
}

#[derive(Default)]
struct WatchState {
    /// The groups in flight, oldest first. One communicator's groups
    /// complete in the order they were enqueued only per stream: the
    /// thread forgets each completed one wherever it is. Pushed by the
    /// queues, removed by the thread alone.
    groups: VecDeque<Group>,
    /// Finished groups, kept with their event and list for reuse.
    spare: Vec<Group>,
    /// The communicator dropped: the thread ends.
    closed: bool,
}

/// A group on a stream, watched.
pub(super) struct Group {
    /// Recorded right after the group on its stream; the stream's watch
    /// holds it too, to forget the group once it completed
    /// ([`StreamWatch::follow`]).
    event: Arc<CudaEvent>,
    /// When it was enqueued, and when it times out (`None`: never).
    enqueued: Instant,
    deadline: Option<Instant>,
    /// Its first collective, to name in the error.
    first: Option<HostCollective>,
    /// What the batch does after it: failed should it time out.
    after: Vec<After>,
    /// The queue's failure record, told of a timeout.
    ledger: Option<Ledger>,
    /// What its stream enqueued behind it (`nccl_behind.rs`); a fresh
    /// one whenever the last group's is still held by its stream.
    behind: Arc<Behind>,
}

impl Drop for Group {
    fn drop(&mut self) {
        // Forgotten (the communicator dropped): its stream stops following.
        self.behind.done();
    }
}

/// A signal value or a download after a group: in its batch, or in a
/// later batch on its stream (`nccl_behind.rs`).
pub(super) enum After {
    Signal(CudaSignal, u64),
    Download(DownloadSink),
}

impl After {
    /// What `command` does that a failure must fail, if anything.
    pub(super) fn of(command: &Command<Cuda>) -> Option<After> {
        match command {
            Command::Signal { signal, value } => Some(After::Signal(signal.clone(), *value)),
            Command::Download { sink, .. } => Some(After::Download(sink.share())),
            _ => None,
        }
    }

    /// Fails it with `failure`, though its event may complete (the work
    /// before it was given up on the device).
    pub(super) fn fail(&self, failure: &Error) {
        match self {
            After::Signal(signal, value) => signal.abandon(*value, failure.clone()),
            After::Download(sink) => sink.fail(failure),
        }
    }
}

impl Watchdog {
    pub(super) fn new() -> Self {
        Self {
            shared: Arc::new(WatchShared {
                state: Mutex::new(WatchState::default()),
                changed: Condvar::new(),
                failing: Mutex::new(()),
            }),
            thread: Mutex::new(None),
        }
    }

    /// Breaks the communicator now with `cause`, under `calls` (held by
    /// the caller, whose NCCL call on it failed or never finished: a
    /// non-blocking split or group launch past its timeout or failed, a
    /// blocking split that failed while making its communicator): the
    /// groups in flight fail with [`CollectiveError::Broken`], and
    /// `ncclCommAbort` ends the call (it joins NCCL's thread before it
    /// returns).
    pub(super) fn break_now(&self, core: &NcclCore, calls: MutexGuard<'_, Calls>, cause: Error) {
        break_under(&self.shared, core, calls, Arc::new(cause), usize::MAX);
    }

    /// Starts the thread, if it is not running yet.
    ///
    /// # Errors
    /// [`Error::System`] when the thread cannot be spawned.
    pub(super) fn start(&self, core: &Arc<NcclCore>, device: &CudaDevice) -> Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return Ok(());
        }
        let (shared, core, device) = (self.shared.clone(), core.clone(), device.clone());
        let name = format!("hwqueue-nccl{}-watchdog", device.ordinal());
        let started = spawn_joinable(name, move || {
            // A panic (a bug, or cudarc's on a symbol the library lacks)
            // would leave every group in flight unwatched: none would time
            // out. The communicator breaks instead, failing them.
            let watched = catch_unwind(AssertUnwindSafe(|| run(&shared, &core, &device)));
            if let Err(payload) = watched {
                let message = panic_message(payload);
                let cause = Error::EnginePanicked { message };
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    break_communicator(&shared, &core, cause, usize::MAX);
                }));
            }
        });
        *thread = Some(started.map_err(|e| Error::System {
            what: "spawning an NCCL communicator's watchdog thread",
            detail: e.to_string(),
        })?);
        Ok(())
    }

    /// The group the next launch on `stream` will be watched as: a spare
    /// one, or one with a new event. Taken before the launch, so that a
    /// driver that cannot make the event fails the run with nothing on the
    /// stream (the group would be on it unwatched: no timeout, no abort).
    /// Give it to [`watch`](Self::watch), or back with
    /// [`give_back`](Self::give_back) when the launch failed.
    ///
    /// # Errors
    /// A driver error creating the event.
    pub(super) fn take_group(&self, stream: &CudaStream) -> Result<Group> {
        let spare = self.shared.state.lock().spare.pop();
        // A spare group's event may still be held by a stream's watch,
        // next to a `Behind` done by then (a group is spare only once this
        // thread took it for done): recorded again, it stops that watch's
        // forgetting at that entry for one batch, whose `follow` drops a
        // done `Behind` all the same.
        match spare {
            Some(group) => Ok(group),
            None => Ok(Group {
                event: stream
                    .context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map(Arc::new)
                    .map_err(|e| crate::cuda::driver_error("creating an NCCL group's event", e))?,
                enqueued: Instant::now(),
                deadline: None,
                first: None,
                after: Vec::new(),
                ledger: None,
                behind: Arc::default(),
            }),
        }
    }

    /// A group [`take_group`](Self::take_group) gave that watches nothing.
    pub(super) fn give_back(&self, group: Group) {
        self.shared.state.lock().spare.push(group);
    }

    /// Watches the group just put on `stream` as `group` (its first
    /// collective `first`), to complete within `timeout`; `rest` is the
    /// batch after it, `epoch` the batch's, and `behind` the stream's
    /// watch, which hands the group what the stream enqueues after it.
    /// Called with the communicator's call lock held.
    ///
    /// # Errors
    /// A driver error recording the event (the group is on the stream,
    /// unwatched: the caller breaks the communicator).
    pub(super) fn watch(
        &self,
        mut group: Group,
        stream: &CudaStream,
        first: &Collective<Cuda>,
        rest: &[Command<Cuda>],
        (ledger, epoch, timeout): (&Ledger, u64, Duration),
        behind: &StreamWatch,
    ) -> Result<()> {
        // An event reused from a group of a stream of this device: every
        // queue running this communicator's collectives is of its device.
        if let Err(e) = group.event.record(stream) {
            let error =
                crate::cuda::context_error(stream.context(), "recording an NCCL group's event", e);
            self.shared.state.lock().spare.push(group);
            return Err(error);
        }
        group.enqueued = Instant::now();
        group.deadline = group.enqueued.checked_add(timeout);
        group.first = Some(HostCollective::of(first));
        group.ledger = Some(ledger.clone());
        group.after.extend(rest.iter().filter_map(After::of));
        if Arc::get_mut(&mut group.behind).is_none() {
            // Its stream still holds the last group's.
            group.behind = Arc::default();
        }
        group.behind.open(epoch);
        behind.push(group.behind.clone(), group.event.clone());
        let mut state = self.shared.state.lock();
        let idle = state.groups.is_empty();
        state.groups.push_back(group);
        drop(state);
        if idle {
            self.shared.changed.notify_one();
        }
        Ok(())
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.changed.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            thread.join();
        }
    }
}

impl Group {
    /// Clears it for reuse (its event and list stay).
    fn clear(&mut self) {
        self.first = None;
        self.after.clear();
        self.ledger = None;
    }
}

/// The thread: see the module docs. Holds the core (so the handle stays
/// live until it ends) and the device (whose context it binds once, for
/// its event queries).
fn run(shared: &WatchShared, core: &NcclCore, device: &CudaDevice) {
    // Without its context bound, the queries below may fail: a group is
    // then taken for done, as after a device fault (its queue reports
    // that), and only the timeout is lost.
    let _ = device.context().bind_to_thread();
    let mut state = shared.state.lock();
    loop {
        if state.closed {
            return;
        }
        // Every group whose event completed is done (the groups of
        // several queues' streams complete in no common order). A query
        // error is a device fault: the stream's queue reports it, and the
        // events of its signals fail alike.
        let mut index = 0;
        while index < state.groups.len() {
            if matches!(state.groups[index].event.try_is_complete(), Ok(false)) {
                index += 1;
            } else if let Some(mut group) = state.groups.remove(index) {
                group.behind.done();
                group.clear();
                state.spare.push(group);
            }
        }
        if state.groups.is_empty() {
            state = shared.changed.wait(state);
            continue;
        }
        let now = Instant::now();
        // The first group past its deadline; else NCCL's asynchronous
        // error, named after the oldest group.
        let late = (state.groups.iter())
            .position(|group| group.deadline.is_some_and(|deadline| now >= deadline));
        let failure = match late {
            Some(index) => {
                let group = &state.groups[index];
                Some(
                    CollectiveError::Timeout {
                        rank: core.rank,
                        op: group
                            .first
                            .map_or_else(String::new, |first| first.describe()),
                        waited: now - group.enqueued,
                    }
                    .into(),
                )
            }
            None => async_error(core, state.groups[0].first),
        };
        if let Some(cause) = failure {
            drop(state);
            // Only this thread removes groups: the index stays valid.
            break_communicator(shared, core, cause, late.unwrap_or(0));
            state = shared.state.lock();
            continue;
        }
        let next = state.groups.iter().filter_map(|group| group.deadline).min();
        let wake = next.map_or(now + POLL, |deadline| deadline.min(now + POLL));
        state = shared.changed.wait_until(state, Some(wake));
    }
}

/// NCCL's asynchronous error of the communicator (a peer's failure, a
/// network error), as [`CollectiveError::Nccl`]; `None` while there is
/// none.
///
/// Called under the watch state with a group in flight. On a non-blocking
/// communicator, `ncclCommGetAsyncError` also finishes (joins and frees,
/// NCCL 2.26 and newer) the call NCCL ran on its own thread once it is
/// done, so only one thread may ask at a time: the thread that started
/// the call asks under `calls` (`settle`), and this one only when `calls`
/// is free (`try_lock`: it never waits under the watch state, which
/// `enqueue_run` takes after `calls`); it skips this look otherwise.
fn async_error(core: &NcclCore, first: Option<HostCollective>) -> Option<Error> {
    let _calls = if core.nonblocking {
        match core.calls.try_lock() {
            Some(calls) if !calls.aborted => Some(calls),
            _ => return None,
        }
    } else {
        None
    };
    let mut code = sys::ncclResult_t::ncclSuccess;
    // SAFETY: the handle is live: a communicator is aborted only by
    // `break_under`, which empties the groups in flight under the watch
    // state (held here, with a group in flight) before it aborts, and the
    // core (which destroys it) outlives this thread. A blocking
    // communicator's state may be asked from any thread at any time; a
    // non-blocking one's by one thread at a time (`calls` is held).
    let asked = unsafe { sys::ncclCommGetAsyncError(core.raw.0, &mut code) };
    let what = first.map_or_else(String::new, |first| first.describe());
    match asked.result().and_then(|_| code.result()) {
        Ok(_) => None,
        Err(e) => Some(nccl_error(e, core.rank, "ncclCommGetAsyncError", &what)),
    }
}

/// Breaks the communicator with `cause` (see the module docs): the
/// signals and downloads of group `culprit` fail with it, those of the
/// other groups not done yet with [`CollectiveError::Broken`], and then
/// `ncclCommAbort`.
///
/// The abort needs `calls`, which a queue holds while it launches a group,
/// and a blocking communicator's launch can take it for good (NCCL's
/// connection to a peer, made lazily inside `ncclGroupEnd`, waits for a
/// peer that never comes; a full work queue waits behind a hung kernel).
/// Waiting for it would leave every group in flight unbounded too: so
/// while a launch holds it, the communicator is marked breaking (a launch
/// or split that takes `calls` next refuses, as on a broken one), what
/// is in flight fails at once, and again at each look (the group the
/// holder hands over when its launch returns), and the abort follows
/// once `calls` is free, looked for every [`POLL`] until the communicator
/// drops.
fn break_communicator(shared: &WatchShared, core: &NcclCore, cause: Error, culprit: usize) {
    let cause = Arc::new(cause);
    let mut culprit = culprit;
    loop {
        // Lock order: `calls`, then the watch state (as `enqueue_run`,
        // which holds `calls` while it hands a group over).
        if let Some(calls) = core.calls.try_lock() {
            break_under(shared, core, calls, cause, culprit);
            break;
        }
        // Set before anything fails: whoever sees a failure and then
        // calls on the communicator (a split, a launch) finds it broken.
        let _ = core.breaking.set(cause.clone());
        // Dropped at once: no lock is held here (see `break_under`).
        drop(fail_in_flight(shared, core, &cause, culprit));
        // Failed, with its cause: what comes later fails as broken.
        culprit = usize::MAX;
        let state = shared.state.lock();
        if state.closed {
            break;
        }
        let wake = Instant::now() + POLL;
        drop(shared.changed.wait_until(state, Some(wake)));
    }
}

/// [`break_communicator`] under `calls`, which it lets go of (`culprit`
/// out of range: every group in flight fails with
/// [`CollectiveError::Broken`]).
fn break_under(
    shared: &WatchShared,
    core: &NcclCore,
    mut calls: MutexGuard<'_, Calls>,
    cause: Arc<Error>,
    culprit: usize,
) {
    if calls.aborted {
        return;
    }
    calls.broken = Some(cause.clone());
    // Held through the abort: a failing pass of the watchdog's (without
    // `calls`) ends first.
    let failing = shared.failing.lock();
    let groups = fail_taken(shared, core, &cause, culprit);
    // SAFETY: the handle is live (not aborted yet, checked under `calls`,
    // which is held), and no other thread calls NCCL on it meanwhile: the
    // queues and splits take `calls` and then find it broken.
    // `ncclCommAbort` frees the handle; `aborted` keeps everyone off it.
    let _ = unsafe { cudarc::nccl::result::comm_abort(core.raw.0) };
    calls.aborted = true;
    drop(failing);
    drop(calls);
    // This thread's handles to the events go outside the locks
    // (destroying one calls the driver; a stream's watch may hold the last
    // one, and drops it when it forgets the group).
    drop(groups);
}

/// [`fail_taken`] under `failing`, for a pass the watchdog makes without
/// `calls`.
fn fail_in_flight(
    shared: &WatchShared,
    core: &NcclCore,
    cause: &Arc<Error>,
    culprit: usize,
) -> VecDeque<Group> {
    let _failing = shared.failing.lock();
    fail_taken(shared, core, cause, culprit)
}

/// Takes the groups in flight out of the watch and fails what each not
/// done yet does after it: group `culprit`'s signals and downloads with
/// `cause`, the others' with [`CollectiveError::Broken`], and the batches
/// each one's stream enqueued behind it. Returns them, to be dropped
/// outside the locks.
fn fail_taken(
    shared: &WatchShared,
    core: &NcclCore,
    cause: &Arc<Error>,
    culprit: usize,
) -> VecDeque<Group> {
    let groups = std::mem::take(&mut shared.state.lock().groups);
    let broken: Error = CollectiveError::Broken {
        rank: core.rank,
        cause: cause.clone(),
    }
    .into();
    for (index, group) in groups.iter().enumerate() {
        // One done meanwhile (another queue's stream) keeps its results.
        // (Its `Behind` is done when `groups` drops.)
        if index != culprit && matches!(group.event.try_is_complete(), Ok(true)) {
            continue;
        }
        let failure = if index == culprit { &**cause } else { &broken };
        // Before the abort: the events after the group complete only once
        // NCCL's kernels exited, and must not pass for the work's end.
        // The failure recorded for the queue's owner first (so an owner
        // that sees a signal fail and then submits is told), with the
        // later batches its stream enqueued behind the group.
        if let Some(ledger) = &group.ledger
            && !group.behind.abandon(ledger, failure)
        {
            ledger.fail_unbatched(failure.clone());
        }
        for after in &group.after {
            after.fail(failure);
        }
    }
    groups
}
