//! `Pool`: the threads a CPU device runs work-groups on.
//!
//! A device has `threads` *execution slots* and `threads - 1` helper
//! threads, spawned at its first multi-group `exec` and ended with the
//! device. An `exec` of many work-groups is a [`Job`] of the queue's
//! worker: the worker posts it, takes a slot if one is free and runs chunks
//! of the grid itself, while helpers with a free slot claim the other
//! chunks. Every thread, worker or helper, runs work-groups only while it
//! holds a slot, so all the queues of a device together never run more
//! than `threads` groups at once: a second queue's `exec` waits for a slot
//! (or for a helper to run its chunks), instead of oversubscribing the
//! cores.
//!
//! - **Hot between the `exec`s of a batch, cold when idle.** After a job, a
//!   helper spins for a few microseconds watching for the next one (the
//!   crate's adaptive [`SpinWait`]), then parks on a condvar; a worker
//!   waiting for helpers to finish spins the same way before it parks.
//!   Posting a job wakes only helpers that are parked.
//! - **Balance.** Chunks are claimed from one counter, guided: each claim
//!   takes `remaining / (2 * threads)` groups (at least one), so chunks are
//!   large while much is left (few claims) and single groups at the end,
//!   where every thread finishes within about one group of the others
//!   (fixed chunks of `total / (threads * 8)` could leave a thread idle for
//!   a whole chunk at the end of each `exec`).
//! - **Panics stay in the job.** Each thread runs its chunks inside
//!   `catch_unwind`; the first panic stops the job's other chunks and is
//!   the job's result. The pool and its threads go on.
//! - **No allocation per `exec`.** The job lives on the worker's stack; the
//!   pool keeps a pointer to it in a vector whose memory it reuses.
//!
//! Why not rayon: `ThreadPool::install` blocks the calling thread while the
//! pool works, so every launch would cost the queue's worker a sleep and a
//! wake-up on top of the pool's, and two queues' launches would run on the
//! pool's threads with the workers asleep beside them. Here the worker is
//! one of the threads that run the groups, so a launch costs a lock, a
//! push and the chunk claiming, and the slot count caps the parallelism of
//! the whole device.
//!
//! Not built under loom: there the engine runs every grid on its worker.

#[cfg(not(loom))]
use std::fmt;
#[cfg(not(loom))]
use std::mem;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
#[cfg(not(loom))]
use std::time::Instant;

use crate::error::panic_message;
#[cfg(not(loom))]
use crate::sync::{
    Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, JoinHandle, Mutex, MutexGuard, Ordering,
    SpinWait, spawn_joinable,
};

use super::CpuProgram;
use super::program::{KernelArgs, WorkGroup};

/// The shape of a grid, for turning linear group indices into work-groups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    pub(crate) groups: [u32; 3],
    pub(crate) local: [u32; 3],
}

impl Grid {
    /// Runs the groups with linear indices in `range`.
    #[inline]
    pub(crate) fn run(&self, program: &CpuProgram, args: &KernelArgs<'_>, range: Range<u64>) {
        let [gx, gy, gz] = self.groups.map(u64::from);
        let run = |id| {
            let group = WorkGroup {
                id,
                groups: self.groups,
                local: self.local,
            };
            program.run_group(&group, args);
        };
        if gy == 1 && gz == 1 {
            // A 1-D grid (the common case): the linear index is x, and no
            // division is needed. It is below the u32 group count.
            for linear in range {
                run([linear as u32, 0, 0]);
            }
            return;
        }
        for linear in range {
            // Each coordinate is below its u32 group count.
            run([
                (linear % gx) as u32,
                ((linear / gx) % gy) as u32,
                (linear / (gx * gy)) as u32,
            ]);
        }
    }
}

/// Under loom there are no real threads to spare: every grid runs on its
/// queue's worker.
#[cfg(loom)]
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    threads: usize,
}

#[cfg(loom)]
impl Pool {
    pub(crate) fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    pub(crate) fn prepare(&self) {}

    pub(crate) fn run(
        &self,
        program: &CpuProgram,
        args: &KernelArgs<'_>,
        grid: Grid,
        total: u64,
    ) -> Result<(), String> {
        run_inline(program, args, grid, total)
    }
}

/// Runs every group of `grid` on the calling thread: a grid of one group,
/// a pool of one slot, and every grid under loom.
fn run_inline(
    program: &CpuProgram,
    args: &KernelArgs<'_>,
    grid: Grid,
    total: u64,
) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| grid.run(program, args, 0..total))).map_err(panic_message)
}

/// A device's pool. Clones are handles; the helpers end (and are joined)
/// when the last handle is dropped.
#[cfg(not(loom))]
#[derive(Clone)]
pub(crate) struct Pool {
    owner: Arc<Owner>,
}

#[cfg(not(loom))]
/// Shuts the pool down when the last [`Pool`] handle goes.
struct Owner {
    shared: Arc<Shared>,
}

#[cfg(not(loom))]
/// What the helpers share with the handles.
struct Shared {
    /// Execution slots: threads that may run work-groups at once.
    threads: usize,
    state: Mutex<State>,
    /// Helpers park here for jobs.
    work: Condvar,
    /// Workers park here for their job to finish, or for a free slot.
    finished: Condvar,
    /// Jobs posted so far, bumped under `state` when one is. Read without
    /// the lock (`Relaxed`) only by spinning helpers, as a hint to take the
    /// lock: a stale read costs a lock round or a park, never a job.
    posted: AtomicUsize,
}

#[cfg(not(loom))]
/// The pool's state, guarded by [`Shared::state`].
///
/// | field | meaning | changed by |
/// |-------|---------|------------|
/// | `jobs` | posted jobs whose worker has not taken them back, oldest first | a worker posts its job, and removes it once every chunk is claimed |
/// | `free` | execution slots not held | a thread takes one before running chunks and gives it back after |
/// | `parked` | helpers parked on `work` | helpers |
/// | `helpers` | the helper threads, to join at shutdown | the first worker with a multi-group job spawns them |
/// | `spawned` | whether helpers were spawned (or failed to be) | that worker |
/// | `hints` | parked helpers woken by [`Pool::prepare`] that have not yet taken their hint | `prepare`, helpers |
/// | `shutdown` | the last handle is gone: helpers exit | `Owner::drop` |
#[derive(Default)]
struct State {
    jobs: Vec<JobRef>,
    free: usize,
    parked: usize,
    helpers: Vec<JoinHandle>,
    spawned: bool,
    hints: usize,
    shutdown: bool,
}

#[cfg(not(loom))]
/// One `exec`'s groups, on its worker's stack while it runs.
struct Job {
    program: *const CpuProgram,
    /// `KernelArgs<'a>` with `'a` erased: valid as long as the job is.
    args: *const KernelArgs<'static>,
    grid: Grid,
    total: u64,
    /// Each claim takes the remaining groups over this (`2 * threads`).
    divisor: u64,
    /// The first group not claimed yet.
    next: AtomicU64,
    /// Threads running chunks of this job. Changed under the pool's lock.
    active: AtomicUsize,
    /// Set by the first panic: the others claim no more chunks.
    stop: AtomicBool,
    panic: Mutex<Option<String>>,
}

#[cfg(not(loom))]
/// Aborts the process if dropped: held, then forgotten, around code that
/// must not unwind (see `Pool::run`).
struct AbortOnUnwind;

#[cfg(not(loom))]
impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        std::process::abort();
    }
}

#[cfg(not(loom))]
/// A posted job, as the pool's state holds it.
#[derive(Clone, Copy)]
struct JobRef(*const Job);

#[cfg(not(loom))]
// SAFETY: a `JobRef` is only dereferenced while its job is listed in the
// pool's `jobs` (looked up under the lock) or counted in its `active`
// (taken under the lock while listed); the worker that owns the job removes
// it from the list and waits for `active` to drop to 0 before its stack
// frame ends (`Pool::run`). Everything a helper reaches through it (the
// program, the arguments, the job's atomics) is `Sync`: the kernel's
// contract makes its groups safe to run from several threads at once.
unsafe impl Send for JobRef {}

#[cfg(not(loom))]
impl Job {
    fn has_chunks(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && self.next.load(Ordering::Relaxed) < self.total
    }

    /// Claims the next chunk: `remaining / divisor` groups, at least one;
    /// `None` once every group is claimed.
    fn claim(&self) -> Option<Range<u64>> {
        let mut start = self.next.load(Ordering::Relaxed);
        loop {
            let remaining = self.total.checked_sub(start).filter(|&r| r > 0)?;
            let end = start + (remaining / self.divisor).max(1);
            match self
                .next
                .compare_exchange_weak(start, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(start..end),
                Err(now) => start = now,
            }
        }
    }

    /// Claims and runs chunks until none is left; a panic stops the job.
    fn work(&self) {
        // SAFETY: see `JobRef`: the worker keeps the program and the
        // arguments alive, unmoved, until no thread works on the job.
        let (program, args) = unsafe { (&*self.program, &*self.args) };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            while !self.stop.load(Ordering::Relaxed) {
                let Some(groups) = self.claim() else {
                    break;
                };
                self.grid.run(program, args, groups);
            }
        }));
        if let Err(payload) = outcome {
            self.stop.store(true, Ordering::Relaxed);
            let message = panic_message(payload);
            self.panic.lock().get_or_insert(message);
        }
    }
}

#[cfg(not(loom))]
impl Pool {
    /// A pool of `threads` execution slots (at least 1). No thread starts
    /// before the first multi-group job.
    pub(crate) fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            owner: Arc::new(Owner {
                shared: Arc::new(Shared {
                    threads,
                    state: Mutex::new(State {
                        free: threads,
                        ..State::default()
                    }),
                    work: Condvar::new(),
                    finished: Condvar::new(),
                    posted: AtomicUsize::new(0),
                }),
            }),
        }
    }

    /// Execution slots: how many groups the device runs at once.
    pub(crate) fn threads(&self) -> usize {
        self.owner.shared.threads
    }

    /// A hint that a multi-group job will be posted soon: a queue's host
    /// side calls it when it wakes a parked worker for a batch with such an
    /// `exec`. Parked helpers wake now and watch for the job for up to
    /// [`HINT_SPIN`], so their wake-up overlaps the worker's instead of
    /// following it; helpers that are not parked are left alone.
    pub(crate) fn prepare(&self) {
        let shared = &self.owner.shared;
        if shared.threads <= 1 {
            return;
        }
        let mut state = shared.state.lock();
        // Before the first multi-group `exec` there are no helpers to wake:
        // they are spawned there, on the worker, not on the host's thread
        // inside `submit`.
        if state.parked > state.hints {
            state.hints = state.parked;
            shared.work.notify_all();
        }
    }

    /// Runs groups `0..total` of `grid` on this worker and the helpers
    /// (one group, or a pool of one slot: on this worker alone, with no
    /// hand-off); returns once every group ran, or the first panic's
    /// message.
    pub(crate) fn run(
        &self,
        program: &CpuProgram,
        args: &KernelArgs<'_>,
        grid: Grid,
        total: u64,
    ) -> Result<(), String> {
        let shared = &self.owner.shared;
        if total <= 1 || shared.threads <= 1 {
            return run_inline(program, args, grid, total);
        }
        let job = Job {
            program,
            args: (args as *const KernelArgs<'_>).cast::<KernelArgs<'static>>(),
            grid,
            total,
            divisor: shared.threads as u64 * 2,
            next: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
        };
        let mut state = shared.state.lock();
        if !state.spawned {
            state = shared.spawn_helpers(state);
        }
        state.jobs.push(JobRef(&job));
        // From here until the job is unlisted and idle, the stack frame
        // must not end: helpers reach `job` through its `JobRef`. Nothing
        // below unwinds today (kernel panics are caught in `Job::work`,
        // their payloads' panics in `panic_message`); should a later change
        // make something unwind, this aborts instead of freeing a job that
        // another thread may still read.
        let listed = AbortOnUnwind;
        shared.posted.fetch_add(1, Ordering::Relaxed);
        // Wake as many parked helpers as there are slots and chunks for.
        let wanted = (state.free.saturating_sub(1) as u64).min(total.saturating_sub(1));
        for _ in 0..wanted.min(state.parked as u64) {
            shared.work.notify_one();
        }
        loop {
            if job.has_chunks() && state.free > 0 {
                state = shared.work_on(state, &job);
                continue;
            }
            if !job.has_chunks() {
                // No new thread may join now; wait for those at work.
                state.jobs.retain(|other| !std::ptr::eq(other.0, &job));
                if job.active.load(Ordering::Relaxed) == 0 {
                    break;
                }
            }
            state = shared.wait_finished(state, &job);
        }
        mem::forget(listed);
        drop(state);
        let panic = job.panic.lock().take();
        match panic {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }
}

#[cfg(not(loom))]
impl Shared {
    /// Takes a slot, runs chunks of `job` off the lock, gives the slot
    /// back, and wakes whoever may now use it.
    fn work_on<'a>(&'a self, mut state: MutexGuard<'a, State>, job: &Job) -> MutexGuard<'a, State> {
        state.free -= 1;
        job.active.fetch_add(1, Ordering::Relaxed);
        drop(state);
        job.work();
        let mut state = self.state.lock();
        state.free += 1;
        job.active.fetch_sub(1, Ordering::Relaxed);
        // A worker may wait for this job to finish, or for a slot; a
        // parked helper may take the slot for another job's chunks.
        self.finished.notify_all();
        if state.parked > 0
            // SAFETY: listed jobs are alive (see `JobRef`).
            && state.jobs.iter().any(|other| unsafe { &*other.0 }.has_chunks())
        {
            self.work.notify_one();
        }
        state
    }

    /// Parks a worker until its job's helpers finish or a slot frees.
    /// Waiting for helpers that are at work (the usual end of a job), it
    /// spins briefly off the lock first; waiting for a slot, it parks.
    fn wait_finished<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        job: &Job,
    ) -> MutexGuard<'a, State> {
        if !job.has_chunks() {
            let spin = SpinWait::new();
            if spin.has_budget() {
                drop(state);
                spin.until(|| job.active.load(Ordering::Relaxed) == 0);
                return self.state.lock();
            }
        }
        self.finished.wait(state)
    }

    /// Spawns the helpers, once; a failure leaves the device with fewer
    /// (the workers run every chunk themselves if need be).
    fn spawn_helpers<'a>(
        self: &'a Arc<Self>,
        mut state: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        state.spawned = true;
        for index in 1..self.threads {
            let shared = self.clone();
            match spawn_joinable(format!("hwqueue-cpu-pool-{index}"), move || {
                run_helper(&shared)
            }) {
                Ok(handle) => state.helpers.push(handle),
                Err(_) => break,
            }
        }
        state
    }
}

#[cfg(not(loom))]
/// A helper: runs chunks of posted jobs while it holds a slot, spins a
/// little when there is nothing, then parks; exits at shutdown.
fn run_helper(shared: &Shared) {
    SpinWait::mark_engine_thread();
    // Whether the next idle moment may spin before parking, and whether
    // that spin is a hint's (a fixed watch for the job `prepare` announced)
    // rather than the adaptive one.
    let (mut may_spin, mut hinted) = (true, false);
    let mut state = shared.state.lock();
    loop {
        // Everything that can end a park (a shutdown, a job, a free slot)
        // changes under the lock, and is checked here, under the same hold
        // of the lock as the park below: no wake-up can be missed.
        if state.shutdown {
            return;
        }
        let job = state
            .jobs
            .iter()
            .copied()
            // SAFETY: listed jobs are alive (see `JobRef`).
            .find(|job| unsafe { &*job.0 }.has_chunks());
        if let Some(job) = job
            && state.free > 0
        {
            // SAFETY: listed under the lock we hold, so alive; counted in
            // `active` by `work_on` before the lock is released.
            state = shared.work_on(state, unsafe { &*job.0 });
            may_spin = true;
            continue;
        }
        if may_spin {
            // Watch for a job off the lock for a while, then look again
            // from the top, under the lock.
            may_spin = false;
            let seen = shared.posted.load(Ordering::Relaxed);
            if hinted {
                hinted = false;
                drop(state);
                let deadline = Instant::now() + HINT_SPIN;
                while shared.posted.load(Ordering::Relaxed) == seen && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                state = shared.state.lock();
            } else {
                let spin = SpinWait::new();
                if spin.has_budget() {
                    drop(state);
                    spin.until(|| shared.posted.load(Ordering::Relaxed) != seen);
                    state = shared.state.lock();
                }
            }
            continue;
        }
        state.parked += 1;
        state = shared.work.wait(state);
        state.parked -= 1;
        may_spin = true;
        if state.hints > 0 {
            // Woken by `prepare`: watch for the job a while before parking
            // again.
            state.hints -= 1;
            hinted = true;
        }
    }
}

#[cfg(not(loom))]
/// How long a helper woken by [`Pool::prepare`] watches for the job before
/// it parks again: longer than a parked worker takes to wake and reach its
/// `exec` on these machines, short enough that a hint whose job never comes
/// (an earlier command failed) costs little.
const HINT_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

#[cfg(not(loom))]
impl Drop for Owner {
    fn drop(&mut self) {
        let shared = &*self.shared;
        let helpers = {
            let mut state = shared.state.lock();
            state.shutdown = true;
            shared.work.notify_all();
            mem::take(&mut state.helpers)
        };
        for helper in helpers {
            helper.join();
        }
    }
}

#[cfg(not(loom))]
impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.owner.shared.threads)
            .finish_non_exhaustive()
    }
}
