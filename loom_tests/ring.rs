//! `EventRing`, the CUDA signal's ring of events, with the real ring code on
//! loom's primitives and a mock event whose completion the model controls:
//! a waiter racing a recorder, wrap-around while a waiter holds a slot's
//! event, `value` folding completions racing a record, and a host `set`
//! racing a record.
//!
//! The rings are built with one or two slots
//! ([`EventRing::with_slots`]), so wrap-around and back-pressure take a
//! record or two instead of sixteen.
//!
//! What the mock checks on every execution:
//!
//! - an event is never re-recorded while a thread synchronises on it, and
//!   a synchronise never ends on a later recording than the one it started
//!   on ([`MockRecorder::record`], [`MockEvent::synchronize`]);
//! - an event is never destroyed while a thread synchronises on it, nor
//!   recorded after it was destroyed ([`MockEvent`]'s `Drop`);
//! - every value the ring reports (a `wait` that returned, `value()`) is at
//!   most the highest value the device completed or the host set
//!   ([`Truth`]), which is raised *before* the completion or `set` it
//!   stands for, so a ring that runs ahead of the device is caught.
//!
//! A lost waiter is a deadlock, which loom reports (aborting the binary:
//! see `main.rs`).

use hwqueue::Timeout;
use hwqueue::ring::{EventRecorder, EventRing, RingEvent};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use crate::model;

/// One device event, as the device of the model sees it.
struct EventCell {
    state: Mutex<EventState>,
    /// Notified when a recording of the event completes.
    completed: Condvar,
}

#[derive(Default)]
struct EventState {
    /// How many times the event was recorded: the generation of its latest
    /// recording (0: never recorded).
    recorded: usize,
    /// The latest generation the device completed.
    completed: usize,
    /// How many threads are inside `synchronize` on it.
    synchronizing: usize,
    /// The ring destroyed it (its last handle was dropped).
    destroyed: bool,
}

impl EventCell {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(EventState::default()),
            completed: Condvar::new(),
        })
    }
}

/// The event type the ring holds: a handle to its cell.
struct MockEvent {
    cell: Arc<EventCell>,
}

impl RingEvent for MockEvent {
    fn is_complete(&self) -> hwqueue::Result<bool> {
        let state = self.cell.state.lock().unwrap();
        Ok(state.completed >= state.recorded)
    }

    fn synchronize(&self) -> hwqueue::Result<()> {
        let mut state = self.cell.state.lock().unwrap();
        let generation = state.recorded;
        state.synchronizing += 1;
        while state.completed < generation {
            state = self.cell.completed.wait(state).unwrap();
        }
        assert_eq!(
            state.recorded, generation,
            "the event was re-recorded while a waiter synchronised on it"
        );
        state.synchronizing -= 1;
        Ok(())
    }
}

impl Drop for MockEvent {
    fn drop(&mut self) {
        let mut state = self.cell.state.lock().unwrap();
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

/// One recording of an event: what the device completes.
struct Recording {
    value: u64,
    cell: Arc<EventCell>,
    generation: usize,
}

/// The highest value the device completed or the host set, raised before
/// the completion or `set` itself: a value the ring reports must never be
/// above it.
#[derive(Clone)]
struct Truth(Arc<AtomicU64>);

impl Truth {
    fn new() -> Self {
        Self(Arc::new(AtomicU64::new(0)))
    }

    /// The device completes `recording` (and everything the queue did
    /// before it, which the models do not need).
    fn complete(&self, recording: &Recording) {
        self.0.fetch_max(recording.value, Ordering::SeqCst);
        let mut state = recording.cell.state.lock().unwrap();
        state.completed = state.completed.max(recording.generation);
        recording.cell.completed.notify_all();
    }

    /// The host sets `value` on `ring`.
    fn set(&self, ring: &Ring, value: u64) {
        self.0.fetch_max(value, Ordering::SeqCst);
        ring.set(value);
    }

    /// Asserts that `observed`, a value the ring reported, is not ahead of
    /// the device and the host.
    fn check(&self, observed: u64, what: &str) {
        let truth = self.0.load(Ordering::SeqCst);
        assert!(
            observed <= truth,
            "{what}: the ring reported {observed}, but only {truth} completed or was set"
        );
    }
}

/// Creates events and records them; remembers the last recording.
#[derive(Default)]
struct MockRecorder {
    last: Option<Recording>,
    value: u64,
}

impl EventRecorder<MockEvent> for MockRecorder {
    fn create(&mut self) -> hwqueue::Result<MockEvent> {
        Ok(MockEvent {
            cell: EventCell::new(),
        })
    }

    fn record(&mut self, event: &MockEvent) -> hwqueue::Result<()> {
        let mut state = event.cell.state.lock().unwrap();
        assert!(!state.destroyed, "a destroyed event was recorded");
        assert_eq!(
            state.synchronizing, 0,
            "an event was re-recorded while a waiter synchronised on it"
        );
        state.recorded += 1;
        self.last = Some(Recording {
            value: self.value,
            cell: event.cell.clone(),
            generation: state.recorded,
        });
        Ok(())
    }
}

type Ring = EventRing<MockEvent>;

/// Records `value`; the recording that stands for it, or `None` when the
/// ring recorded nothing (the value was reached already).
fn record(ring: &Ring, value: u64) -> Option<Recording> {
    let mut recorder = MockRecorder { last: None, value };
    ring.record(value, &mut recorder).expect("record");
    recorder.last
}

/// (a) A waiter racing the recorder of the value it waits for: whether it
/// finds the value unrecorded (and parks until the record) or recorded
/// (and synchronises on its event), it wakes with `Ok` once the event
/// completes, never before.
#[test]
fn a_waiter_racing_the_recorder_wakes_once_the_event_completes() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let truth = Truth::new();
        let recorder = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                let one = record(&ring, 1).expect("1 is not reached yet");
                truth.complete(&one);
            })
        };
        ring.wait(1, Timeout::Forever).unwrap();
        truth.check(1, "wait(1) returned");
        recorder.join().unwrap();
        assert_eq!(ring.value(), 1);
    });
}

/// (b) Wrap-around while a waiter holds the only slot's event: the host
/// passes the waiter's value and the next record needs the slot. Whether
/// the waiter cloned the event before (the record must then use a new
/// event, and the waiter's clone keeps the old one alive) or after the
/// `set` (it returns at once), the held event is never re-recorded or
/// destroyed under the waiter, and the waiter is not lost.
#[test]
fn wrap_around_never_takes_an_event_a_waiter_holds() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let truth = Truth::new();
        let one = record(&ring, 1).expect("1 is not reached yet");
        let waiter = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                ring.wait(1, Timeout::Forever).unwrap();
                truth.check(1, "wait(1) returned");
            })
        };
        truth.set(&ring, 1);
        let two = record(&ring, 2).expect("2 is not reached yet");
        truth.complete(&one);
        truth.complete(&two);
        waiter.join().unwrap();
        ring.wait(2, Timeout::Forever).unwrap();
        assert_eq!(ring.value(), 2);
    });
}

/// (b) A full ring: a recorder blocks on the oldest record's event while a
/// waiter synchronises on the same event. Once it completes, the recorder
/// takes the slot (re-recording the event only when the waiter let go of
/// it), and both return.
#[test]
fn a_full_ring_blocks_the_recorder_beside_a_waiter_on_the_oldest() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let truth = Truth::new();
        let one = record(&ring, 1).expect("1 is not reached yet");
        let waiter = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                ring.wait(1, Timeout::Forever).unwrap();
                truth.check(1, "wait(1) returned");
            })
        };
        let recorder = {
            let ring = ring.clone();
            thread::spawn(move || record(&ring, 2).expect("2 is not reached yet"))
        };
        truth.complete(&one);
        let two = recorder.join().unwrap();
        waiter.join().unwrap();
        truth.check(ring.value(), "value() after 1 completed");
        truth.complete(&two);
        ring.wait(2, Timeout::Forever).unwrap();
        assert_eq!(ring.value(), 2);
    });
}

/// (c) `value()` folds completions while another thread records: every
/// value it reports was completed, and it never goes down.
#[test]
fn value_folds_completions_racing_a_record() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 2));
        let truth = Truth::new();
        let one = record(&ring, 1).expect("1 is not reached yet");
        let recorder = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                let two = record(&ring, 2).expect("2 is not reached yet");
                truth.complete(&two);
            })
        };
        let device = {
            let truth = truth.clone();
            thread::spawn(move || truth.complete(&one))
        };
        let first = ring.value();
        truth.check(first, "first value()");
        let second = ring.value();
        truth.check(second, "second value()");
        assert!(first <= second, "value went down: {first} -> {second}");
        recorder.join().unwrap();
        device.join().unwrap();
        assert_eq!(ring.value(), 2);
    });
}

/// (d) A host `set` racing a record of a lower value: the value never goes
/// down, never passes what was completed or set, and a waiter for the set
/// value (which nothing records) wakes.
#[test]
fn host_set_racing_a_record_wakes_the_waiter() {
    // Four threads: exhaustive takes minutes; bound 4 is 90 k executions
    // (about 6 s), and a ring that advances its value at record time
    // already fails at bound 1.
    model(Some(4), || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let truth = Truth::new();
        let setter = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                truth.set(&ring, 2);
                assert!(ring.value() >= 2, "value fell below a set 2");
            })
        };
        let recorder = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || {
                // Recorded unless the set came first.
                if let Some(one) = record(&ring, 1) {
                    let before = ring.value();
                    truth.check(before, "value() after record(1)");
                    truth.complete(&one);
                    let after = ring.value();
                    assert!(before <= after, "value went down: {before} -> {after}");
                }
            })
        };
        ring.wait(2, Timeout::Forever).unwrap();
        truth.check(2, "wait(2) returned");
        assert_eq!(ring.value(), 2);
        setter.join().unwrap();
        recorder.join().unwrap();
        assert_eq!(ring.value(), 2);
    });
}
