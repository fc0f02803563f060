//! The one place that touches synchronisation primitives.
//!
//! Everything else in the crate imports atomics, mutexes, condition variables,
//! `Arc`, thread spawning and the bounded spinning before a park
//! (`SpinWait`) from here. Under `cfg(loom)` these are loom's
//! model-checked types, so the loom models in `loom_tests/` exercise the real
//! signal and queue code; otherwise they are `std` atomics and `parking_lot`
//! locks. Tiny adapters give both sides one API (no lock poisoning, a condvar
//! `wait` that takes and returns the guard).
//!
//! loom has no timed condvar wait: under `cfg(loom)` a timed wait behaves as an
//! untimed one, so models must not rely on timeouts firing.

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::mpsc;

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(loom)]
pub(crate) use loom::sync::mpsc;

#[cfg(not(loom))]
mod imp {
    use std::time::Instant;

    /// A mutex without poisoning (`parking_lot`).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    /// The guard of [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }

        /// The lock if it is free now; `None` without waiting otherwise.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }

        /// The lock once it is free, waiting at most `timeout`.
        #[allow(dead_code)]
        pub(crate) fn try_lock_for(
            &self,
            timeout: std::time::Duration,
        ) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock_for(timeout)
        }
    }

    /// A reader-writer lock without poisoning (`parking_lot`).
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(parking_lot::RwLock<T>);

    pub(crate) type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }

        /// Shared, if no writer holds it now.
        pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            self.0.try_read()
        }

        /// Exclusive, if nobody holds it now.
        pub(crate) fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            self.0.try_write()
        }
    }

    /// A condition variable whose `wait` takes and returns the guard.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        /// Waits until notified or `deadline` passes (`None`: no deadline).
        pub(crate) fn wait_until<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            deadline: Option<Instant>,
        ) -> MutexGuard<'a, T> {
            match deadline {
                Some(deadline) => {
                    self.0.wait_until(&mut guard, deadline);
                }
                None => self.0.wait(&mut guard),
            }
            guard
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    /// Spawns a named thread.
    pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        spawn_joinable(name, f).map(drop)
    }

    /// A thread that can be waited for.
    #[derive(Debug)]
    pub(crate) struct JoinHandle(std::thread::JoinHandle<()>);

    impl JoinHandle {
        /// Waits for the thread to end. A thread of the crate never
        /// panics out of its function (each catches what it runs), and a
        /// panic that still did is already reported by the panic hook: it
        /// is not raised again in the joiner.
        pub(crate) fn join(self) {
            let _ = self.0.join();
        }
    }

    /// Spawns a named thread that can be waited for.
    pub(crate) fn spawn_joinable<F>(name: String, f: F) -> std::io::Result<JoinHandle>
    where
        F: FnOnce() + Send + 'static,
    {
        std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map(JoinHandle)
    }

    /// Bounded, adaptive spinning before a thread parks.
    ///
    /// A value that another core is about to publish often arrives sooner
    /// than a futex sleep and wake-up take (microseconds each), so a waiter
    /// may first spin: `spin` pauses 1, 2, 4, … 512 times (1,023 pause hints
    /// in all, re-checking between steps: about 25 µs on this project's
    /// machines, whose pause hint takes 24 ns). The budget is sized to outlast
    /// a parked thread's wake-up there (10–20 µs on these VMs): a waiter
    /// whose partner had to be woken still catches its answer spinning, so
    /// one park does not make both sides park from then on. Measured with
    /// `queue_roundtrip` (`benches/cpu_queue.rs`): at 127 hints the round
    /// trip stayed at 15–17 µs (each side's spin ran out during the other's
    /// wake-up, and the budgets collapsed), at 1,023 it is under 0.5 µs.
    /// Spinning only
    /// pays when the thread it waits for runs on another core; when both
    /// share one core (an oversubscribed machine) every pause delays the
    /// very thread it waits for. So each thread adapts: a wait that ended
    /// while spinning restores the full budget, one that had to park
    /// shortens the next one by a step, and once the budget is spent a
    /// thread spins again only on every `PROBE_EVERY`th wait, to notice when
    /// spinning pays again.
    ///
    /// An engine's own threads (a queue's worker, a pool helper:
    /// [`mark_engine_thread`](Self::mark_engine_thread)), whatever they
    /// wait for, call `yield_now` before each step from the seventh on (after about
    /// 1.5 µs); it returns at once when no other thread is ready, and
    /// otherwise hands over the core. Without it, with as many busy threads
    /// as cores, a thread just woken (the host whose wait ended) found every
    /// core held by the engine's spinners and waited for one to give up:
    /// `exec_matmul` in `benches/cpu_queue.rs` used 1.83 of 2 cores against
    /// rayon's 1.95, and took 1.12x rayon's time; with the engine's threads
    /// yielding, 1.02–1.10x over six runs, and 0.95–1.02x once their budget
    /// grew to [`ENGINE_STEPS`](Self::ENGINE_STEPS). A host thread's wait
    /// does not yield:
    /// on a machine whose cores are busy with other processes a yield can
    /// cost a whole time slice, and the host would pay it in every wait it
    /// spins (`signal_wake` with both cores kept busy by two shell loops:
    /// 256 µs a round trip with yielding host waits, 5.5 µs without, 37–44
    /// µs for a `parking_lot` condvar).
    #[derive(Debug)]
    pub(crate) struct SpinWait {
        step: u32,
        limit: u32,
        /// Whether later steps offer the core: an engine thread's spin
        /// ([`mark_engine_thread`](Self::mark_engine_thread)).
        yields: bool,
        /// A thread without a budget spinning once in full: if it loses,
        /// the thread stays without one.
        probe: bool,
    }

    /// This thread's spin budget, in `SpinWait` steps, how many waits
    /// went without spinning since the last probe, and whether the thread
    /// is one of an engine's own ([`SpinWait::mark_engine_thread`]).
    #[derive(Clone, Copy)]
    struct SpinBudget {
        limit: u32,
        skipped: u32,
        engine: bool,
    }

    thread_local! {
        static SPIN_BUDGET: std::cell::Cell<SpinBudget> = const {
            std::cell::Cell::new(SpinBudget {
                limit: SpinWait::FULL,
                skipped: 0,
                engine: false,
            })
        };
    }

    impl SpinWait {
        /// Steps in a host wait's full budget: `2^step` pause hints each
        /// (1,023 in all, about 25 µs here).
        const STEPS: u32 = 10;
        /// Steps in an engine thread's full budget (4,095 hints and the
        /// yields, about 100 µs): a worker waiting for the host to record
        /// its next batch (1,000 `exec`s take the host 25–30 µs) still
        /// catches it, where 10 steps ran out, parked, and set both sides
        /// parking from then on (`queue_throughput` and `profile_overhead`
        /// read 48 µs or 111 µs from one run to the next; 45–49 µs over
        /// three runs with 12 steps). The yields keep it from holding a
        /// core another thread is ready to use.
        const ENGINE_STEPS: u32 = 12;
        /// The budget after a win, read as the spinner's own full budget.
        const FULL: u32 = u32::MAX;
        /// From this step on, each step first offers the core to a thread
        /// that is ready to run (`yield_now`; it returns at once when none
        /// is).
        const YIELD_FROM: u32 = 6;
        /// With no budget left, every this many waits spin once in full.
        const PROBE_EVERY: u32 = 32;

        /// Marks this thread as one of an engine's own (a queue's worker, a
        /// pool helper): its spins, whatever it waits for (the next batch,
        /// a `wait` command's signal, a job's helpers), take the engine
        /// budget and, from step [`YIELD_FROM`](Self::YIELD_FROM) on, first
        /// offer the core to a ready thread. Any other thread (the host's)
        /// spins with pause hints only.
        pub(crate) fn mark_engine_thread() {
            SPIN_BUDGET.with(|cell| {
                cell.set(SpinBudget {
                    engine: true,
                    ..cell.get()
                })
            });
        }

        /// Whether this thread spins as an engine's.
        #[cfg(test)]
        pub(crate) fn on_engine_thread() -> bool {
            SPIN_BUDGET.with(|cell| cell.get().engine)
        }

        /// A spinner with this thread's current budget.
        pub(crate) fn new() -> Self {
            let yields = SPIN_BUDGET.with(|cell| cell.get().engine);
            let full = if yields {
                Self::ENGINE_STEPS
            } else {
                Self::STEPS
            };
            // Under Miri a pause hint is a thread switch and a spin takes
            // milliseconds of interpretation, so it would only slow the
            // threads a test waits for: Miri checks the parking path.
            let (limit, probe) = if cfg!(miri) {
                (0, false)
            } else {
                SPIN_BUDGET.with(|cell| {
                    let mut budget = cell.get();
                    let spin = if budget.limit > 0 {
                        (budget.limit.min(full), false)
                    } else {
                        budget.skipped += 1;
                        if budget.skipped >= Self::PROBE_EVERY {
                            budget.skipped = 0;
                            (full, true)
                        } else {
                            (0, false)
                        }
                    };
                    cell.set(budget);
                    spin
                })
            };
            Self {
                step: 0,
                limit,
                yields,
                probe,
            }
        }

        /// Whether this thread may spin at all this time.
        pub(crate) fn has_budget(&self) -> bool {
            self.limit > 0
        }

        /// Spins until `done()` or the budget is spent; whether `done()` won.
        /// The outcome sets this thread's budget for its next waits.
        pub(crate) fn until(self, done: impl Fn() -> bool) -> bool {
            self.until_before(None, done)
        }

        /// [`until`](Self::until), ending also once `deadline` (the
        /// caller's timeout) has passed: that outcome, neither a win nor a
        /// loss of the spin, leaves the thread's budget as it was. The
        /// clock is read once a step (ten or twelve reads at most), so the
        /// spin ends within one step of the deadline (a host thread's last
        /// step is about 12 µs).
        pub(crate) fn until_before(
            mut self,
            deadline: Option<Instant>,
            done: impl Fn() -> bool,
        ) -> bool {
            loop {
                if done() {
                    self.won();
                    return true;
                }
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    return false;
                }
                if !self.spin() {
                    self.lost();
                    return false;
                }
            }
        }

        /// Spins once; `false` (without waiting) once the budget is spent,
        /// when the caller should park.
        #[inline]
        fn spin(&mut self) -> bool {
            if self.step >= self.limit {
                return false;
            }
            if self.yields && self.step >= Self::YIELD_FROM {
                std::thread::yield_now();
            }
            for _ in 0..1u32 << self.step {
                std::hint::spin_loop();
            }
            self.step += 1;
            true
        }

        /// The wait ended while spinning: spinning pays on this thread.
        fn won(self) {
            SPIN_BUDGET.with(|cell| {
                cell.set(SpinBudget {
                    limit: Self::FULL,
                    skipped: 0,
                    ..cell.get()
                })
            });
        }

        /// The wait had to park after spinning: the next spin of this
        /// thread is one step (half) shorter; at none, only probes spin,
        /// and a lost probe leaves the thread at none.
        fn lost(self) {
            if self.limit == 0 {
                return;
            }
            let limit = if self.probe { 0 } else { self.limit - 1 };
            SPIN_BUDGET.with(|cell| {
                cell.set(SpinBudget {
                    limit,
                    skipped: 0,
                    ..cell.get()
                })
            });
        }
    }

    #[cfg(all(test, not(miri)))]
    mod tests {
        use super::SpinWait;

        #[test]
        fn a_spin_past_its_deadline_looks_once_and_keeps_the_budget() {
            use std::cell::Cell;
            use std::time::Instant;
            let looks = Cell::new(0);
            let look = || {
                looks.set(looks.get() + 1);
                false
            };
            // A wait whose timeout passed as it began (`CpuSignal::wait`
            // with a few nanoseconds) looks once, where it spun its whole
            // budget before its timeout counted.
            assert!(!SpinWait::new().until_before(Some(Instant::now()), look));
            assert_eq!(looks.get(), 1);
            // Neither a win nor a loss: the next spin has the full budget,
            // one look before each of its steps and one after.
            looks.set(0);
            assert!(!SpinWait::new().until(look));
            assert_eq!(looks.get(), SpinWait::STEPS + 1);
        }

        #[test]
        fn a_probe_that_has_to_park_leaves_the_thread_without_a_budget() {
            // Lose until this thread's budget is spent, a step a loss.
            for _ in 0..=SpinWait::ENGINE_STEPS {
                let spin = SpinWait::new();
                if !spin.has_budget() {
                    break;
                }
                assert!(!spin.until(|| false));
            }
            // The probe: one wait in `PROBE_EVERY` spins in full.
            let probe = (0..SpinWait::PROBE_EVERY)
                .map(|_| SpinWait::new())
                .find(SpinWait::has_budget)
                .expect("a thread without a budget probes once every PROBE_EVERY waits");
            assert!(probe.probe);
            assert!(!probe.until(|| false));
            // Lost: no spin until the next probe.
            let spun = (1..SpinWait::PROBE_EVERY).filter(|_| SpinWait::new().has_budget());
            assert_eq!(
                spun.count(),
                0,
                "a lost probe gave the thread a budget back"
            );
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::time::Instant;

    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// The lock if it is free now; `None` without waiting otherwise.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            match self.0.try_read() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }

        pub(crate) fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            match self.0.try_write() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0
                .wait(guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// loom's condvar never times out: this is an untimed wait.
        pub(crate) fn wait_until<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _deadline: Option<Instant>,
        ) -> MutexGuard<'a, T> {
            self.wait(guard)
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        spawn_joinable(name, f).map(drop)
    }

    /// Under loom, joining is left out: a model's threads end with the
    /// model, and a join would add to every model a synchronisation the
    /// real code's correctness does not rest on.
    #[derive(Debug)]
    pub(crate) struct JoinHandle;

    impl JoinHandle {
        pub(crate) fn join(self) {}
    }

    pub(crate) fn spawn_joinable<F>(_name: String, f: F) -> std::io::Result<JoinHandle>
    where
        F: FnOnce() + Send + 'static,
    {
        drop(loom::thread::spawn(f));
        Ok(JoinHandle)
    }

    /// Under loom a spin is one look, a point where loom may run another
    /// thread first: the models explore a partner acting before the spin,
    /// and after it gave up but before the waiter took the lock to park,
    /// which is where spinning could lose a wake-up (the worker's spin off
    /// the lock, a host wait's spin before `wait_slow`). More looks would
    /// only repeat those interleavings, at five times the models' run time
    /// for two.
    #[derive(Debug)]
    pub(crate) struct SpinWait;

    impl SpinWait {
        pub(crate) fn new() -> Self {
            Self
        }

        pub(crate) fn mark_engine_thread() {}

        pub(crate) fn has_budget(&self) -> bool {
            true
        }

        pub(crate) fn until(self, done: impl Fn() -> bool) -> bool {
            done()
        }

        pub(crate) fn until_before(
            self,
            _deadline: Option<Instant>,
            done: impl Fn() -> bool,
        ) -> bool {
            done()
        }
    }
}

pub(crate) use imp::{
    Condvar, JoinHandle, Mutex, RwLock, RwLockWriteGuard, SpinWait, spawn, spawn_joinable,
};

/// Identifies a thread (a loom thread under loom, where every model thread
/// shares one OS thread).
#[cfg(not(loom))]
pub(crate) type ThreadKey = std::thread::ThreadId;
#[cfg(loom)]
pub(crate) type ThreadKey = loom::thread::ThreadId;

/// The calling thread's key.
pub(crate) fn current_thread() -> ThreadKey {
    #[cfg(not(loom))]
    return std::thread::current().id();
    #[cfg(loom)]
    return loom::thread::current().id();
}
#[allow(unused_imports)]
pub(crate) use imp::{MutexGuard, RwLockReadGuard};

/// Atomics for process-wide hints that order nothing (a device's
/// [`WaitTuning`](crate::wait_policy::WaitTuning)): always `std`'s, also
/// under loom, whose atomics exist only inside a model and so cannot sit
/// in a `static`. Nothing that synchronises may use them.
pub(crate) mod hint {
    pub(crate) use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
}

/// One round of a spin that polls something another thread changes: a
/// pause hint to the core, or, under loom, a yield, so that a model runs
/// the other threads while the spinner waits (a loom spin that never
/// yields never ends).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    for _ in 0..8 {
        std::hint::spin_loop();
    }
    #[cfg(loom)]
    loom::thread::yield_now();
}
