//! `EventRing`: a timeline signal whose values stand for device events.
//!
//! A GPU queue cannot raise a host word when its work completes; it can only
//! *record an event* that the host may later query or block on. An
//! [`EventRing`] turns such events into a [`TimelineSignal`](crate::TimelineSignal)-shaped value:
//! `record(v)` puts `(v, event)` in one of [`RING_SLOTS`] slots (or as
//! many as [`EventRing::with_slots`] asks for), and
//!
//! - [`value`](EventRing::value) is the highest value whose event has
//!   **completed** (or that the host [`set`](EventRing::set)); recording never
//!   moves it, so "submitted" can never pass for "completed";
//! - [`wait`](EventRing::wait) synchronises on the event of the smallest
//!   recorded value `>= target`, and, when no such value is recorded yet,
//!   waits on the host for a record, a host `set` or a failure;
//! - [`fail`](EventRing::fail) has the
//!   [`TimelineSignal::fail`](crate::TimelineSignal::fail) semantics.
//!
//! The ring knows nothing of CUDA: events are any [`RingEvent`] ("is it
//! complete?", "block until complete"), and a queue records them through an
//! [`EventRecorder`]. So this file is compiled in every build and tested
//! with a mock event (`tests/ring.rs`), and loom can model it.
//!
//! ## Slots, reuse and wrap-around
//!
//! A slot is *done* once its value is `<=` the completed value: its work
//! finished, or the host raised the value past it. Events are handles
//! (`Arc<E>`); a waiter clones a slot's handle **under the lock** and blocks
//! on its clone **outside** it. `record(v)`, under the lock, takes the first
//! of:
//!
//! 1. a done slot whose event nobody else holds (`strong_count == 1`, and the
//!    recorder [accepts](EventRecorder::accepts) it): the event is re-recorded
//!    in place. This is the steady state: no event is created per record;
//! 2. an empty slot, or a done slot whose event a waiter still holds: a new
//!    event is created; the old handle (if any) is dropped by the ring, and
//!    the waiter's clone keeps the event alive until it is done with it;
//! 3. otherwise every slot holds unfinished work: the recorder blocks (outside
//!    the lock) on the **oldest** record's event, folds it in, and tries
//!    again. This is back-pressure: at most `slots` records of one
//!    signal are in flight. It cannot deadlock as long as every recorded
//!    event completes on its own, which holds for queues that only record
//!    events after work already handed to the device (the CUDA queue defers
//!    host-side waits instead of putting them on the stream).
//!
//! An event is therefore never re-recorded or destroyed while a waiter holds
//! it, and a waiter is never lost: it remembers the value of the slot it
//! cloned and, once its event completes, raises the value to it itself, even
//! if the slot was handed to another record meanwhile.
//!
//! Only the crate's `sync` primitives are used, so loom can check the
//! protocol.

use std::fmt;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::signal::{
    Failures, MAX_SIGNAL_VALUE, Producer, Timeout, check_value, value_out_of_range,
};
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, fence};
use crate::wait_policy::WaitTuning;

mod abandon;
mod wait;

/// How many records one ring holds at once (and how many events it keeps
/// for reuse). A queue rarely has more than a few values of one signal in
/// flight; past this many, recording blocks on the oldest (see the module
/// docs). The default of [`EventRing::new`]; [`EventRing::with_slots`]
/// picks another count (the loom models use one or two slots and the fuzz
/// harness one to four, so that wrap-around takes few operations).
pub const RING_SLOTS: usize = 16;
const _: () = assert!(RING_SLOTS > 0, "a ring needs at least one slot");

/// A device event as the ring sees it.
pub trait RingEvent: Send + Sync + 'static {
    /// Whether the work recorded in this event has completed. Never blocks.
    ///
    /// # Errors
    /// When the device reports a failure (a faulted context).
    fn is_complete(&self) -> Result<bool>;

    /// Blocks until the work recorded in this event has completed.
    ///
    /// # Errors
    /// When the device reports a failure.
    fn synchronize(&self) -> Result<()>;

    /// How a host [`EventRing::wait`] on this event spins before it
    /// sleeps: the policy and adaptive budget of the event's device (see
    /// [`crate::wait_policy`]). The default, `None`, never spins: a wait
    /// sleeps at once, as under [`WaitPolicy::Sleep`](crate::WaitPolicy::Sleep).
    fn wait_tuning(&self) -> Option<&'static WaitTuning> {
        None
    }
}

/// How a queue makes and records events for an [`EventRing`]. Called by the
/// ring under its lock, so `record` must not block.
pub trait EventRecorder<E> {
    /// A new event, not recorded yet.
    ///
    /// # Errors
    /// When the device cannot create one.
    fn create(&mut self) -> Result<E>;

    /// Whether `event` can be recorded by this recorder (a CUDA event can
    /// only be recorded on a stream of its own context). Events it refuses
    /// are not reused for this record.
    fn accepts(&self, event: &E) -> bool {
        let _ = event;
        true
    }

    /// Records the current point of the queue into `event`: it completes
    /// once everything the queue was given before it has completed.
    ///
    /// # Errors
    /// When the device refuses the record.
    fn record(&mut self, event: &E) -> Result<()>;
}

/// What a queue must wait for before running past `wait(signal, target)`.
#[derive(Debug)]
pub enum Dependency<E> {
    /// The target is reached already: nothing to wait for.
    Reached,
    /// The event of the smallest recorded value `>= target`: make the device
    /// wait for it (CUDA: `cuStreamWaitEvent`). Holding the handle keeps the
    /// ring from re-recording the event.
    Event(Arc<E>),
}

/// A timeline signal made of a ring of device events. See the module docs.
pub struct EventRing<E> {
    /// The completed value, mirrored for the lock-free fast path of
    /// `is_reached` and `wait`.
    ///
    /// | written by | how | read by | how |
    /// |------------|-----|---------|-----|
    /// | whoever raises `RingState::completed` (a fold, a waiter whose event completed, `set`) | `store(Release)`, under `state`, after `completed` | `is_reached`, `wait` fast paths | `load(Acquire)` |
    ///
    /// Only stored under the lock, right after `completed`, so it never
    /// runs ahead of it and never goes down. A stale read is only ever too
    /// low, which sends the reader to the locked path.
    reached: AtomicU64,
    /// How many failures were recorded, so that a waiter spinning on an
    /// event (off the lock) notices a `fail` that settles its target.
    ///
    /// | written by | how | read by | how |
    /// |------------|-----|---------|-----|
    /// | `fail`, `abandon`, and a fold that records a device fault, whenever [`Failures::record`] recorded something (and `abandon` when it moved a slot, though nothing new was recorded) | `fetch_add(1, Release)`, under `state` | a spinning `wait`: once under `state` before it spins, then on each look, and under `state` again once its event completed | `load(Acquire)` |
    ///
    /// It orders nothing itself: a spinner that sees it change takes the
    /// lock and asks the failures there. Incremented only under the lock,
    /// so the count a waiter reads under the lock matches the failures it
    /// checked there, and any later change is a failure it has not seen.
    failed: AtomicU64,
    state: Mutex<RingState<E>>,
    /// How many slots the ring holds (at least one): [`RING_SLOTS`] unless
    /// built by [`with_slots`](Self::with_slots). Never changes.
    capacity: usize,
    /// Notified (under `state`) whenever something a waiter checks changes:
    /// a record, a raise of `completed`, a failure.
    changed: Condvar,
    /// The queue that records into this ring (see
    /// [`TimelineSignal`](crate::TimelineSignal)).
    producer: Producer,
}

/// The ring's state, all guarded by [`EventRing::state`].
///
/// | field | meaning | changed by |
/// |-------|---------|------------|
/// | `slots` | at most `capacity` `(value, seq, event)`; a slot is *done* when `value <= completed`, *pending* otherwise | `record` (fill, re-record, replace) |
/// | `completed` | the highest value known completed: a pending slot whose event completed, or a host `set`. Only rises | folds (`value`, `wait`, `record`), a waiter after its event completed, `set` |
/// | `failures` | which unreached values failed, and why ([`Failures`]); causes `<= completed` are dropped | `fail`, `abandon`, raises |
/// | `next_seq` | record order, to find the oldest pending slot when the ring is full | `record` |
/// | `highest` | the highest value ever recorded: no slot's value is above it, so none is pending while it is `<= completed` (a fold then queries nothing) | `record` |
/// | `abandoned` | the highest value [`abandon`](EventRing::abandon)ed (0: none): a failed value up to it is not recorded again | `abandon` |
/// | `given_up` | the events of abandoned records, with the values each abandon failed, until they complete: what a settled wait on such a value orders after on the device | `abandon` (adds; drops the done), `given_up` (drops the done) |
///
/// Nothing but a completed event or the host raises `completed`: in
/// particular `record` never does, so a value cannot be reached before its
/// work is done (DESIGN.md, mistake 2).
struct RingState<E> {
    slots: Vec<Slot<E>>,
    completed: u64,
    failures: Failures,
    next_seq: u64,
    highest: u64,
    abandoned: u64,
    /// The events of abandoned records whose work may still run on the
    /// device (`abandon`), kept until they complete.
    given_up: Vec<abandon::GivenUp<E>>,
}

struct Slot<E> {
    value: u64,
    seq: u64,
    /// Cloned by waiters under the lock; reused only when unique.
    event: Arc<E>,
}

/// What the ring knows about a target, under its lock.
enum Step<E> {
    Reached,
    /// The smallest recorded value `>= target`, and its event.
    Recorded(u64, Arc<E>),
    Unrecorded,
}

impl<E: RingEvent> EventRing<E> {
    /// A ring at `initial`, with no event recorded.
    ///
    /// # Panics
    /// If `initial` exceeds [`MAX_SIGNAL_VALUE`].
    pub fn new(initial: u64) -> Self {
        Self::with_slots(initial, RING_SLOTS)
    }

    /// A ring at `initial` with `slots` slots instead of [`RING_SLOTS`]:
    /// at most that many records in flight, and that many events kept for
    /// reuse.
    ///
    /// # Panics
    /// If `initial` exceeds [`MAX_SIGNAL_VALUE`], or `slots` is 0.
    pub fn with_slots(initial: u64, slots: usize) -> Self {
        if initial > MAX_SIGNAL_VALUE {
            value_out_of_range(initial);
        }
        assert!(slots > 0, "an event ring needs at least one slot");
        Self {
            reached: AtomicU64::new(initial),
            failed: AtomicU64::new(0),
            state: Mutex::new(RingState {
                slots: Vec::with_capacity(slots),
                completed: initial,
                failures: Failures::default(),
                next_seq: 0,
                highest: 0,
                abandoned: 0,
                given_up: Vec::new(),
            }),
            capacity: slots,
            changed: Condvar::new(),
            producer: Producer::new(),
        }
    }

    /// The highest value whose event completed, or that the host set. Folds
    /// in every pending slot whose event completed; never blocks (event
    /// queries do not).
    pub fn value(&self) -> u64 {
        let mut state = self.state.lock();
        self.fold(&mut state);
        state.completed
    }

    /// Whether `value() >= target`. Never blocks.
    #[inline]
    pub fn is_reached(&self, target: u64) -> bool {
        self.reached.load(Ordering::Acquire) >= target || self.poll(target)
    }

    /// [`is_reached`](Self::is_reached) past its lock-free test: the fold
    /// inlined into this one frame (a poll, the host's way to wait without
    /// blocking, paid a second call and frame for it).
    #[inline(never)]
    fn poll(&self, target: u64) -> bool {
        let mut state = self.state.lock();
        if state.highest > state.completed {
            self.fold_slots(&mut state);
        }
        state.completed >= target
    }

    /// Raises the value to `value` from the host; a lower value is ignored.
    /// Wakes the waiters it satisfies.
    ///
    /// # Panics
    /// If `value` exceeds [`MAX_SIGNAL_VALUE`].
    pub fn set(&self, value: u64) {
        if value > MAX_SIGNAL_VALUE {
            value_out_of_range(value);
        }
        let mut state = self.state.lock();
        self.raise(&mut state, value);
    }

    /// Records `value`: the recorder's next event stands for it, and the
    /// value is reached once that event completes. A value already reached
    /// records nothing, and so does a failed value up to one
    /// [`abandon`](Self::abandon)ed. May block when every slot holds
    /// unfinished work (see the module docs).
    ///
    /// # Errors
    /// [`Error::SignalValueOutOfRange`]; whatever the recorder or a blocking
    /// event reports (nothing is recorded then).
    #[inline]
    pub fn record(&self, value: u64, recorder: &mut impl EventRecorder<E>) -> Result<()> {
        if value > MAX_SIGNAL_VALUE {
            return check_value(value);
        }
        let mut guard = self.state.lock();
        self.fold(&mut guard);
        // The steady state, with nothing of the rarer cases on this frame:
        // a value above the completed and abandoned ones, whose record
        // reuses a done slot's event.
        if value > guard.completed
            && value > guard.abandoned
            && let Some(recorded) = self.reuse(&mut guard, value, recorder)
        {
            return recorded.map_err(|error| *error);
        }
        // The lock goes along, folded: locking and folding again would
        // query every pending event twice (a pipelined queue's records
        // find every slot pending).
        self.record_anew(guard, value, recorder)
    }

    /// Case 1 of a record (see the module docs): re-records the event of
    /// a done slot that nobody else holds, if there is one (`None`: none).
    /// Under the lock, folded, with `value` above the completed value.
    /// The recorder's error comes boxed: an `Option<Result<()>>` was
    /// copied whole, error-sized, on every record.
    #[inline(always)]
    fn reuse(
        &self,
        state: &mut RingState<E>,
        value: u64,
        recorder: &mut impl EventRecorder<E>,
    ) -> Option<std::result::Result<(), Box<Error>>> {
        let completed = state.completed;
        let slot = state.slots.iter_mut().find(|slot| {
            slot.value <= completed
                && Arc::strong_count(&slot.event) == 1
                && recorder.accepts(&slot.event)
        })?;
        // Pairs with the `Release` decrement of the last waiter's clone:
        // its use of the event happens-before the re-record.
        fence(Ordering::Acquire);
        if let Err(error) = recorder.record(&slot.event) {
            return Some(Err(Box::new(error)));
        }
        slot.value = value;
        slot.seq = state.next_seq;
        state.next_seq += 1;
        state.highest = state.highest.max(value);
        self.changed.notify_all();
        Some(Ok(()))
    }

    /// [`record`](Self::record) past its steady state, under `guard`
    /// (folded): every check, a new event, or a wait for the oldest slot.
    #[inline(never)]
    fn record_anew<'a>(
        &'a self,
        mut guard: MutexGuard<'a, RingState<E>>,
        value: u64,
        recorder: &mut impl EventRecorder<E>,
    ) -> Result<()> {
        // Folded by `record`, and again below after each wait.
        loop {
            let state = &mut *guard;
            if value <= state.completed {
                return Ok(());
            }
            // Abandoned on the device and failed: the record of it (work
            // that came after the abandoned work, once the device let it
            // run) stands for nothing, and the value stays failed.
            if value <= state.abandoned && state.failures.check(value, state.completed).is_err() {
                return Ok(());
            }
            let completed = state.completed;
            let seq = state.next_seq;

            // 1. Reuse a done slot's event that nobody else holds.
            if let Some(recorded) = self.reuse(state, value, recorder) {
                return recorded.map_err(|error| *error);
            }

            // 2. A new event, in an empty slot or a done one (whose old event
            //    a waiter may still hold: its clone keeps it alive).
            let free = if state.slots.len() < self.capacity {
                Some(None)
            } else {
                state
                    .slots
                    .iter()
                    .position(|slot| slot.value <= completed)
                    .map(Some)
            };
            if let Some(at) = free {
                let event = recorder.create()?;
                if let Err(error) = recorder.record(&event) {
                    // Destroyed outside the lock, as every event is: its
                    // drop may call the driver.
                    drop(guard);
                    drop(event);
                    return Err(error);
                }
                let slot = Slot {
                    value,
                    seq,
                    event: Arc::new(event),
                };
                state.next_seq += 1;
                state.highest = state.highest.max(value);
                let replaced = match at {
                    Some(index) => Some(std::mem::replace(&mut state.slots[index], slot)),
                    None => {
                        state.slots.push(slot);
                        None
                    }
                };
                self.changed.notify_all();
                drop(guard);
                // The ring's handle to a replaced event goes outside the
                // lock: if it is the last one, destroying the event may call
                // the driver.
                drop(replaced);
                return Ok(());
            }

            // 3. Every slot holds unfinished work: wait for the oldest.
            let Some(oldest) = state.slots.iter().min_by_key(|slot| slot.seq) else {
                unreachable!("a full ring has slots");
            };
            let (oldest_value, oldest_seq) = (oldest.value, oldest.seq);
            let event = oldest.event.clone();
            drop(guard);
            let outcome = event.synchronize();
            drop(event);
            outcome?;
            guard = self.state.lock();
            // Its value is reached only if its slot still stands for it:
            // an `abandon` meanwhile made the event say nothing of it.
            let still = (guard.slots.iter())
                .any(|slot| slot.seq == oldest_seq && slot.value == oldest_value);
            if still {
                self.raise(&mut guard, oldest_value);
            }
            self.fold(&mut guard);
        }
    }

    /// What a queue must wait for before running past `target`, without
    /// blocking: `None` when no value `>= target` is recorded yet.
    ///
    /// # Errors
    /// [`Error::SignalFailed`] when `target` failed;
    /// [`Error::SignalValueOutOfRange`] for a target no signal reaches.
    pub fn dependency(&self, target: u64) -> Result<Option<Dependency<E>>> {
        check_value(target)?;
        let mut state = self.state.lock();
        Ok(match self.step(&mut state, target)? {
            Step::Reached => Some(Dependency::Reached),
            Step::Recorded(_, event) => Some(Dependency::Event(event)),
            Step::Unrecorded => None,
        })
    }

    /// As [`dependency`](Self::dependency), but blocks on the host until a
    /// value `>= target` is recorded, set or failed, or `timeout` passes.
    ///
    /// # Errors
    /// As `dependency`, and [`Error::Timeout`].
    pub fn wait_dependency(
        &self,
        target: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<Dependency<E>> {
        check_value(target)?;
        let start = Instant::now();
        let deadline = timeout.into().deadline_from(start);
        let mut state = self.state.lock();
        loop {
            match self.step(&mut state, target)? {
                Step::Reached => return Ok(Dependency::Reached),
                Step::Recorded(_, event) => return Ok(Dependency::Event(event)),
                Step::Unrecorded => state = self.park(state, target, start, deadline)?,
            }
        }
    }

    /// Marks every value up to `upto` that is neither reached nor recorded
    /// as failed with `cause`, and wakes their waiters with
    /// [`Error::SignalFailed`]. Values above `upto`, values already reached,
    /// and values a recorded event stands for (every value up to the
    /// highest recorded one `<= upto`) are not affected: their events decide
    /// them. A failed value that the host sets later is reached as usual.
    ///
    /// So a queue that fails a batch (or abandons one) fails only what the
    /// batch itself would have set: values that earlier work of the same
    /// queue already recorded still complete.
    pub fn fail(&self, upto: u64, cause: Error) {
        let mut guard = self.state.lock();
        self.fold(&mut guard);
        self.fail_unrecorded(&mut guard, upto, cause);
    }

    /// [`fail`](Self::fail)'s work, under the state's lock (folded).
    /// Where it recorded a new failure (and woke the waiters), the value
    /// the failed range starts above; `None` where it recorded none.
    fn fail_unrecorded(&self, state: &mut RingState<E>, upto: u64, cause: Error) -> Option<u64> {
        let recorded = state
            .slots
            .iter()
            .map(|slot| slot.value)
            .filter(|value| *value <= upto)
            .max()
            .unwrap_or(0);
        let above = recorded.max(state.completed);
        let recorded = state.failures.record(above, upto, cause, state.completed);
        if recorded {
            self.failed.fetch_add(1, Ordering::Release);
            self.changed.notify_all();
        }
        recorded.then_some(above)
    }

    /// The [`WaitTuning`] a host wait for `target` spins by: that of the
    /// event of the smallest recorded value `>= target`, else of any
    /// recorded event; `None` with no event recorded, or events without
    /// one. Never blocks (queries nothing).
    pub fn wait_tuning(&self, target: u64) -> Option<&'static WaitTuning> {
        let state = self.state.lock();
        let pending = state.slots.iter().filter(|slot| slot.value >= target);
        let slot = pending.min_by_key(|slot| slot.value);
        slot.or(state.slots.first())?.event.wait_tuning()
    }

    /// The queue that records into this ring.
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// How many slots hold a record (done or pending), at most
    /// [`slots`](Self::slots).
    pub fn slots_in_use(&self) -> usize {
        self.state.lock().slots.len()
    }

    /// How many slots the ring has: [`RING_SLOTS`] unless built by
    /// [`with_slots`](Self::with_slots).
    pub fn slots(&self) -> usize {
        self.capacity
    }

    /// Raises `completed` to `value` (if higher) and wakes every waiter.
    fn raise(&self, state: &mut RingState<E>, value: u64) {
        if value <= state.completed {
            return;
        }
        state.completed = value;
        self.reached.store(value, Ordering::Release);
        // Causes for values now reached can never be reported again.
        state.failures.forget_reached(value);
        self.changed.notify_all();
    }

    /// Raises `completed` to the highest pending value whose event has
    /// completed. Queries only slots above the best value found so far.
    ///
    /// An event whose query fails (a faulted device: CUDA's errors of that
    /// kind are sticky, so every pending event of the context fails alike)
    /// will never complete: the values above `completed` up to the highest
    /// such event fail with the query's error, so waiters, `dependency` and
    /// the queues waiting on them learn it at once instead of never. The
    /// slot stays (dropping a broken event could call into the faulted
    /// driver under the lock); later folds record the same failure again,
    /// which [`Failures`] ignores, and wake no one for it.
    #[inline]
    fn fold(&self, state: &mut RingState<E>) {
        // Nothing pending: the common case of a record after its signal was
        // reached, and of a poll once it is. Inlined to this test.
        if state.highest > state.completed {
            self.fold_pending(state);
        }
    }

    /// [`fold`](Self::fold) once a slot may be pending.
    #[inline(never)]
    fn fold_pending(&self, state: &mut RingState<E>) {
        self.fold_slots(state);
    }

    /// [`fold_pending`](Self::fold_pending)'s work, for it and
    /// [`poll`](Self::poll).
    #[inline(always)]
    fn fold_slots(&self, state: &mut RingState<E>) {
        let mut best = state.completed;
        for (index, slot) in state.slots.iter().enumerate() {
            if slot.value <= best {
                continue;
            }
            match slot.event.is_complete() {
                Ok(true) => best = slot.value,
                Ok(false) => {}
                Err(cause) => return self.fold_faulted(state, best, index, cause),
            }
        }
        self.raise(state, best);
    }

    /// The rest of [`fold`](Self::fold) once the event of slot `at` failed
    /// its query with `cause` (`best`: the highest completed value found
    /// before it). Out of line, so that the fold of a healthy device
    /// carries no error on its stack.
    #[cold]
    #[inline(never)]
    fn fold_faulted(&self, state: &mut RingState<E>, mut best: u64, at: usize, cause: Error) {
        let mut fault = (state.slots[at].value, cause);
        for slot in &state.slots[at + 1..] {
            if slot.value <= best {
                continue;
            }
            match slot.event.is_complete() {
                Ok(true) => best = slot.value,
                Ok(false) => {}
                Err(cause) => {
                    if slot.value > fault.0 {
                        fault = (slot.value, cause);
                    }
                }
            }
        }
        self.raise(state, best);
        let (upto, cause) = fault;
        if upto > state.completed
            && state
                .failures
                .record(state.completed, upto, cause, state.completed)
        {
            self.failed.fetch_add(1, Ordering::Release);
            self.changed.notify_all();
        }
    }

    /// Folds, then says where `target` stands.
    fn step(&self, state: &mut RingState<E>, target: u64) -> Result<Step<E>> {
        self.fold(state);
        if state.completed >= target {
            return Ok(Step::Reached);
        }
        state.failures.check(target, state.completed)?;
        // Every slot `>= target` is pending, since `target > completed`.
        // Ties go to the older record.
        Ok(state
            .slots
            .iter()
            .filter(|slot| slot.value >= target)
            .min_by_key(|slot| (slot.value, slot.seq))
            .map_or(Step::Unrecorded, |slot| {
                Step::Recorded(slot.value, slot.event.clone())
            }))
    }

    /// Waits for a change (a record, a raise, a failure) or the deadline.
    fn park<'a>(
        &self,
        state: MutexGuard<'a, RingState<E>>,
        target: u64,
        start: Instant,
        deadline: Option<Instant>,
    ) -> Result<MutexGuard<'a, RingState<E>>> {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(Error::Timeout {
                target,
                current: state.completed,
                waited: start.elapsed(),
            });
        }
        Ok(self.changed.wait_until(state, deadline))
    }
}

impl<E> fmt::Debug for EventRing<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        let mut pending: Vec<u64> = state
            .slots
            .iter()
            .map(|slot| slot.value)
            .filter(|value| *value > state.completed)
            .collect();
        pending.sort_unstable();
        f.debug_struct("EventRing")
            .field("completed", &state.completed)
            .field("pending", &pending)
            .field("failed_upto", &state.failures.highest())
            .finish()
    }
}
