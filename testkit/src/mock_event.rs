//! The one mock of a device's events, for [`EventRing`](hwqueue::ring::EventRing):
//! its unit tests (`tests/ring.rs`), its loom models (`loom_tests/ring.rs`)
//! and its fuzz harness ([`check_ring_ops`](crate::check_ring_ops)).
//!
//! A [`MockDevice`] numbers the events it creates. A [`MockRecorder`]
//! creates events and records them; each recording is a new *generation*
//! of its event, which the test completes (or breaks) when it likes. The
//! mock checks what a real device cannot be trusted to report, on every
//! use:
//!
//! - an event is never re-recorded while a thread synchronises on it, so a
//!   synchronise never ends on a later recording than the one it began on;
//! - an event is never destroyed while a thread synchronises on it, nor
//!   recorded after it was destroyed, nor destroyed twice.
//!
//! Under `cfg(loom)` it is built on loom's mutex and condvar, so the loom
//! models explore it with the ring. Each event has its own lock, and an
//! operation on an event takes only that lock, so the mock adds as few
//! interleavings as it can; the device-wide log of synchronisations (for
//! tests that wait until a thread blocks) is left out under loom.

#[cfg(loom)]
use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use hwqueue::Error;
use hwqueue::ring::{EventRecorder, RingEvent};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A device whose events the test completes by hand. Clones are handles
/// to one device.
#[derive(Clone, Default)]
pub struct MockDevice {
    inner: Arc<DeviceInner>,
}

#[derive(Default)]
struct DeviceInner {
    /// Every event created, by id. Not kept under loom, where nothing
    /// looks events up by id (and a device-wide lock on every creation
    /// would only add interleavings): ids come from `next_id` there.
    #[cfg(not(loom))]
    events: Mutex<Vec<Arc<EventCell>>>,
    #[cfg(loom)]
    next_id: std::sync::atomic::AtomicUsize,
    /// `synchronize` completes the event instead of blocking (the device
    /// runs up to it), for single-threaded tests.
    run_on_synchronize: bool,
    /// Event ids in the order `synchronize` was called on them.
    #[cfg(not(loom))]
    log: Mutex<Vec<usize>>,
    #[cfg(not(loom))]
    logged: Condvar,
}

/// One event, as the device sees it.
struct EventCell {
    id: usize,
    state: Mutex<CellState>,
    /// Notified when a recording completes or breaks.
    changed: Condvar,
}

#[derive(Default, Clone, Copy, Debug)]
struct CellState {
    /// How many times the event was recorded: the generation of its latest
    /// recording (0: never recorded).
    recorded: u64,
    /// The latest generation the device completed.
    completed: u64,
    /// The device reports a fault on query and synchronise, until the next
    /// recording.
    broken: bool,
    /// Threads inside `synchronize` on it.
    synchronizing: usize,
    /// Its last handle was dropped.
    destroyed: bool,
    /// How many times it was queried (`is_complete`).
    queries: u64,
}

/// One recording of an event: what the device completes.
#[derive(Clone)]
pub struct Recording {
    /// The event's id.
    pub event: usize,
    /// Which recording of it.
    pub generation: u64,
    cell: Arc<EventCell>,
}

impl PartialEq for Recording {
    fn eq(&self, other: &Self) -> bool {
        (self.event, self.generation) == (other.event, other.generation)
    }
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recording({}#{})", self.event, self.generation)
    }
}

impl Recording {
    /// The device completes this recording (a later recording of the same
    /// event stays pending).
    pub fn complete(&self) {
        let mut state = lock(&self.cell.state);
        state.completed = state.completed.max(self.generation);
        self.cell.changed.notify_all();
    }

    /// Whether this recording has completed.
    pub fn is_complete(&self) -> bool {
        lock(&self.cell.state).completed >= self.generation
    }
}

/// The error a broken event reports.
pub fn device_fault() -> Error {
    Error::DeviceLost {
        device: "mock:0".into(),
        detail: "the mock device reported a fault".into(),
    }
}

impl MockDevice {
    /// A device whose events complete only when the test says so.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device on which `synchronize` runs the device up to the event
    /// (completes it) instead of blocking: for tests with one thread.
    pub fn running_on_synchronize() -> Self {
        Self {
            inner: Arc::new(DeviceInner {
                run_on_synchronize: true,
                ..DeviceInner::default()
            }),
        }
    }

    /// A recorder that creates its events on this device. It borrows the
    /// device rather than holding a handle: under loom every handle clone
    /// is an operation the model explores.
    pub fn recorder(&self) -> MockRecorder<'_> {
        MockRecorder {
            device: self,
            last: None,
        }
    }

    #[cfg(not(loom))]
    fn cell(&self, id: usize) -> Arc<EventCell> {
        lock(&self.inner.events)[id].clone()
    }

    #[cfg(not(loom))]
    fn update(&self, id: usize, change: impl FnOnce(&mut CellState)) {
        let cell = self.cell(id);
        change(&mut lock(&cell.state));
        cell.changed.notify_all();
    }

    /// How many events were created.
    #[cfg(not(loom))]
    pub fn created(&self) -> usize {
        lock(&self.inner.events).len()
    }

    /// How many times event `id` was recorded.
    #[cfg(not(loom))]
    pub fn records_of(&self, id: usize) -> u64 {
        lock(&self.cell(id).state).recorded
    }

    /// How many times event `id` was queried (`RingEvent::is_complete`).
    #[cfg(not(loom))]
    pub fn queries_of(&self, id: usize) -> u64 {
        lock(&self.cell(id).state).queries
    }

    /// Completes the latest recording of event `id`.
    #[cfg(not(loom))]
    pub fn complete(&self, id: usize) {
        self.update(id, |cell| cell.completed = cell.recorded);
    }

    /// Makes event `id` report a device fault until it is recorded again.
    #[cfg(not(loom))]
    pub fn break_event(&self, id: usize) {
        self.update(id, |cell| cell.broken = true);
    }

    /// Whether event `id`'s last handle was dropped.
    #[cfg(not(loom))]
    pub fn is_destroyed(&self, id: usize) -> bool {
        lock(&self.cell(id).state).destroyed
    }

    /// Event ids in the order `synchronize` was called on them.
    #[cfg(not(loom))]
    pub fn synchronized(&self) -> Vec<usize> {
        lock(&self.inner.log).clone()
    }

    /// Blocks until some thread is synchronising on event `id`; panics
    /// after `limit`.
    #[cfg(not(loom))]
    pub fn await_synchronize_on(&self, id: usize, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut log = lock(&self.inner.log);
        while !log.contains(&id) {
            assert!(
                std::time::Instant::now() < deadline,
                "nobody synchronised on event {id}"
            );
            log = self
                .inner
                .logged
                .wait_timeout(log, std::time::Duration::from_millis(10))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// An event of a [`MockDevice`].
pub struct MockEvent {
    cell: Arc<EventCell>,
    run_on_synchronize: bool,
    #[cfg(not(loom))]
    device: MockDevice,
}

impl MockEvent {
    /// The event's id on its device.
    pub fn id(&self) -> usize {
        self.cell.id
    }
}

impl RingEvent for MockEvent {
    fn is_complete(&self) -> hwqueue::Result<bool> {
        let state = {
            let mut state = lock(&self.cell.state);
            state.queries += 1;
            *state
        };
        if state.broken {
            return Err(device_fault());
        }
        Ok(state.completed >= state.recorded)
    }

    fn synchronize(&self) -> hwqueue::Result<()> {
        #[cfg(not(loom))]
        {
            lock(&self.device.inner.log).push(self.cell.id);
            self.device.inner.logged.notify_all();
        }
        let cell = &*self.cell;
        let mut state = lock(&cell.state);
        let generation = state.recorded;
        if self.run_on_synchronize {
            state.completed = generation;
        }
        state.synchronizing += 1;
        let outcome = loop {
            if state.broken {
                break Err(device_fault());
            }
            if state.completed >= generation {
                break Ok(());
            }
            state = cell
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        };
        assert_eq!(
            state.recorded, generation,
            "the event was re-recorded while a waiter synchronised on it"
        );
        state.synchronizing -= 1;
        outcome
    }
}

impl Drop for MockEvent {
    fn drop(&mut self) {
        let mut state = lock(&self.cell.state);
        if !std::thread::panicking() {
            assert_eq!(
                state.synchronizing, 0,
                "an event was destroyed while a waiter synchronised on it"
            );
            assert!(!state.destroyed, "an event was destroyed twice");
        }
        state.destroyed = true;
    }
}

/// Creates events on a [`MockDevice`] and records them; remembers the last
/// recording.
pub struct MockRecorder<'a> {
    device: &'a MockDevice,
    /// The last recording made through this recorder.
    pub last: Option<Recording>,
}

impl EventRecorder<MockEvent> for MockRecorder<'_> {
    fn create(&mut self) -> hwqueue::Result<MockEvent> {
        #[cfg(not(loom))]
        let mut events = lock(&self.device.inner.events);
        #[cfg(not(loom))]
        let id = events.len();
        #[cfg(loom)]
        let id = self
            .device
            .inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cell = Arc::new(EventCell {
            id,
            state: Mutex::new(CellState::default()),
            changed: Condvar::new(),
        });
        #[cfg(not(loom))]
        events.push(cell.clone());
        Ok(MockEvent {
            cell,
            run_on_synchronize: self.device.inner.run_on_synchronize,
            #[cfg(not(loom))]
            device: self.device.clone(),
        })
    }

    /// Only events of this recorder's device (under loom, where a model
    /// has one device, every event).
    fn accepts(&self, event: &MockEvent) -> bool {
        #[cfg(loom)]
        let _ = event;
        #[cfg(loom)]
        return true;
        #[cfg(not(loom))]
        lock(&self.device.inner.events)
            .get(event.cell.id)
            .is_some_and(|cell| Arc::ptr_eq(cell, &event.cell))
    }

    fn record(&mut self, event: &MockEvent) -> hwqueue::Result<()> {
        let mut state = lock(&event.cell.state);
        assert!(!state.destroyed, "a destroyed event was recorded");
        assert_eq!(
            state.synchronizing, 0,
            "an event was re-recorded while a waiter synchronised on it"
        );
        state.recorded += 1;
        state.broken = false;
        self.last = Some(Recording {
            event: event.cell.id,
            generation: state.recorded,
            cell: event.cell.clone(),
        });
        Ok(())
    }
}
