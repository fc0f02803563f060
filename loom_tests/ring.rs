//! `EventRing`, the CUDA signal's ring of events, with the real ring code on
//! loom's primitives and a mock event whose completion the model controls:
//! a waiter racing a recorder, wrap-around while a waiter holds a slot's
//! event, `value` folding completions racing a record, a host `set`
//! racing a record, `abandon` racing a waiter on the abandoned value's
//! event, `given_up` racing an abandon and a record, and a host `set`
//! racing a waiter with a timeout, which sleeps between its polls.
//!
//! The rings are built with one or two slots
//! ([`EventRing::with_slots`]), so wrap-around and back-pressure take a
//! record or two instead of sixteen.
//!
//! The mock device (`hwqueue_testkit::mock_event`, built on loom's
//! primitives under `cfg(loom)`) checks on every execution:
//!
//! - an event is never re-recorded while a thread synchronises on it, and
//!   a synchronise never ends on a later recording than the one it started
//!   on;
//! - an event is never destroyed while a thread synchronises on it, nor
//!   recorded after it was destroyed;
//! - every value the ring reports (a `wait` that returned, `value()`) is at
//!   most the highest value the device completed or the host set
//!   ([`Truth`]), which is raised *before* the completion or `set` it
//!   stands for, so a ring that runs ahead of the device is caught.
//!
//! A lost waiter is a deadlock, which loom reports (aborting the binary:
//! see `main.rs`).

use hwqueue::Timeout;
use hwqueue::ring::EventRing;
use hwqueue_testkit::mock_event::{MockDevice, MockEvent};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

use crate::model;

/// One recording, and the value it stands for.
struct Recording {
    value: u64,
    recording: hwqueue_testkit::mock_event::Recording,
}

/// The device of the model, and the highest value it completed or the host
/// set, raised before the completion or `set` itself: a value the ring
/// reports must never be above it.
#[derive(Clone)]
struct Truth {
    highest: Arc<AtomicU64>,
}

impl Truth {
    fn new() -> Self {
        Self {
            highest: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The device completes `recording` (and everything the queue did
    /// before it, which the models do not need).
    fn complete(&self, recording: &Recording) {
        self.highest.fetch_max(recording.value, Ordering::SeqCst);
        recording.recording.complete();
    }

    /// The host sets `value` on `ring`.
    fn set(&self, ring: &Ring, value: u64) {
        self.highest.fetch_max(value, Ordering::SeqCst);
        ring.set(value);
    }

    /// Asserts that `observed`, a value the ring reported, is not ahead of
    /// the device and the host.
    fn check(&self, observed: u64, what: &str) {
        let truth = self.highest.load(Ordering::SeqCst);
        assert!(
            observed <= truth,
            "{what}: the ring reported {observed}, but only {truth} completed or was set"
        );
    }
}

/// Records `value`; the recording that stands for it, or `None` when the
/// ring recorded nothing (the value was reached already). Each call makes
/// its events on a device of its own, so a thread that records holds no
/// shared handle (every handle clone is an operation loom explores); a
/// model's ring accepts events of any mock device.
fn record(ring: &Ring, value: u64) -> Option<Recording> {
    let device = MockDevice::new();
    let mut recorder = device.recorder();
    ring.record(value, &mut recorder).expect("record");
    recorder
        .last
        .map(|recording| Recording { value, recording })
}

type Ring = EventRing<MockEvent>;

/// The NCCL watchdog's timeout, on a thread of its own: `one`'s value is
/// abandoned, then the abort lets its event complete.
fn abort_on_thread(ring: &Arc<Ring>, one: Recording) -> thread::JoinHandle<()> {
    let ring = ring.clone();
    thread::spawn(move || {
        let cause = hwqueue::Error::KernelFailed {
            program: "all_reduce".into(),
            message: "aborted".into(),
        };
        ring.abandon(one.value, cause);
        one.recording.complete();
    })
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

/// (f) `abandon` racing a waiter on the abandoned value's event (the NCCL
/// watchdog's timeout: the value is failed, then the abort lets the event
/// complete): whether the waiter looks before the failure, while it waits
/// on the event, or once the event completed, it fails; it never takes the
/// event's completion for the work's.
#[test]
fn abandon_racing_a_waiter_fails_it_though_the_event_completes() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let one = record(&ring, 1).expect("1 is not reached yet");
        let watchdog = abort_on_thread(&ring, one);
        let waited = ring.wait(1, Timeout::Forever);
        assert!(
            matches!(waited, Err(hwqueue::Error::SignalFailed { target: 1, .. })),
            "{waited:?}"
        );
        watchdog.join().unwrap();
        assert_eq!(ring.value(), 0);
    });
}

/// (g) `given_up` racing the abandon of 1 and the abort that then
/// completes 1's event, then a record of 2, on a ring of one slot: a
/// settled waiter asking for 1 gets 1's event (abandoned, its work maybe
/// still running) or nothing (not abandoned yet, so it orders on the event
/// itself; or done already); the record of 2 takes another event while
/// `given_up` holds 1's (the mock device catches a re-record under a
/// synchronise), or waits for 1's as the oldest; and once 1's event
/// completed nothing is kept.
#[test]
fn given_up_racing_the_abandon_names_only_the_abandoned_event() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let one = record(&ring, 1).expect("1 is not reached yet");
        let id = one.recording.event;
        let watchdog = abort_on_thread(&ring, one);
        if let Some(event) = ring.given_up(1) {
            assert_eq!(event.id(), id, "given_up named another event");
        }
        let two = record(&ring, 2).expect("2 is not reached yet");
        watchdog.join().unwrap();
        assert!(ring.given_up(1).is_none(), "1's work exited");
        two.recording.complete();
        assert_eq!(ring.value(), 2);
    });
}

/// (h) A host `set` racing a waiter with a (finite) timeout on a recorded
/// value whose event does not complete: between its polls the waiter
/// sleeps on the ring's condvar, not in `thread::sleep`, so that the `set`
/// ends its sleep at once. Whether the `set` comes before its look, between
/// the look and the sleep, or while it sleeps, the waiter wakes with `Ok`
/// (loom's condvar never times out, so a missed notification is a
/// deadlock here). Under loom such a nap ends only by a notification: a
/// model whose waiter with a timeout is released by its event completing
/// alone (which notifies nothing) would deadlock.
#[test]
fn host_set_wakes_a_waiter_sleeping_between_polls() {
    model(None, || {
        let ring = Arc::new(Ring::with_slots(0, 1));
        let truth = Truth::new();
        let one = record(&ring, 1).expect("1 is not reached yet");
        let setter = {
            let (ring, truth) = (ring.clone(), truth.clone());
            thread::spawn(move || truth.set(&ring, 1))
        };
        ring.wait(1, std::time::Duration::from_secs(3600)).unwrap();
        truth.check(1, "wait(1) returned");
        setter.join().unwrap();
        drop(one);
        assert_eq!(ring.value(), 1);
    });
}
