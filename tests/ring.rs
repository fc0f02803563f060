//! `EventRing` against a mock event whose completion the test controls.
//!
//! These run on every machine: the ring does not depend on CUDA.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::LONG;
use hwqueue::ring::{Dependency, EventRecorder, EventRing, RING_SLOTS};
use hwqueue::{Error, MAX_SIGNAL_VALUE, Timeout};
use hwqueue_testkit::mock_event::{MockDevice, MockEvent, MockRecorder};
use hwqueue_testkit::{RingOp, check_ring_ops};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// The mock: `hwqueue_testkit`'s device, whose events the test completes.

type Ring = EventRing<MockEvent>;

/// Records `value` and returns the id of the event that stands for it.
fn record(ring: &Ring, device: &MockDevice, value: u64) -> usize {
    let mut recorder = device.recorder();
    ring.record(value, &mut recorder).unwrap();
    recorder.last.expect("the value was recorded").event
}

fn kernel_failed() -> Error {
    Error::KernelFailed {
        program: "k".into(),
        message: "boom".into(),
    }
}

/// Whether a wait for `target` (within `timeout`) fails with
/// `SignalFailed` for that target.
fn wait_fails(ring: &Ring, target: u64, timeout: Duration) -> bool {
    matches!(
        ring.wait(target, timeout),
        Err(Error::SignalFailed { target: failed, .. }) if failed == target
    )
}

/// A thread waiting on `ring` for `target` within `timeout`.
fn waiter(
    ring: &Arc<Ring>,
    target: u64,
    timeout: impl Into<Timeout> + Send + 'static,
) -> thread::JoinHandle<hwqueue::Result<()>> {
    let ring = ring.clone();
    thread::spawn(move || ring.wait(target, timeout))
}

/// Records `value`, completes its event and waits for it.
fn record_and_reach(ring: &Ring, device: &MockDevice, value: u64) {
    let event = record(ring, device, value);
    device.complete(event);
    ring.wait(value, LONG).unwrap();
}

/// A record that finds every slot pending (a queue whose work the device
/// has not caught up with) asks the device about each pending event once.
/// On `babd494` it asked twice: the steady-state path folded, found no
/// slot to reuse, and the rest of `record` locked and folded again.
#[test]
fn a_record_behind_pending_work_queries_each_pending_event_once() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let pending: Vec<usize> = (1..=3).map(|value| record(&ring, &device, value)).collect();
    let before: Vec<u64> = pending.iter().map(|&id| device.queries_of(id)).collect();
    record(&ring, &device, 4);
    let after: Vec<u64> = pending.iter().map(|&id| device.queries_of(id)).collect();
    let asked: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        asked,
        [1, 1, 1],
        "queries of each pending event by one record"
    );
}

// ---------------------------------------------------------------------------
// value: completed events only.

#[test]
fn a_recorded_but_incomplete_value_is_not_reached() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let event = record(&ring, &device, 5);
    assert_eq!(ring.value(), 0);
    assert!(!ring.is_reached(5));
    assert!(matches!(
        ring.wait(5, Duration::ZERO),
        Err(Error::Timeout {
            target: 5,
            current: 0,
            ..
        })
    ));
    device.complete(event);
    assert_eq!(ring.value(), 5);
    assert!(ring.is_reached(5));
    ring.wait(5, Duration::ZERO).unwrap();
}

#[test]
fn recording_never_moves_the_value() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    for value in 1..=RING_SLOTS as u64 {
        record(&ring, &device, value);
        assert_eq!(ring.value(), 0);
    }
}

#[test]
fn value_folds_the_highest_completed_event() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let one = record(&ring, &device, 1);
    let two = record(&ring, &device, 2);
    let three = record(&ring, &device, 3);
    device.complete(two);
    assert_eq!(ring.value(), 2, "2 completed; 3 did not");
    device.complete(one);
    assert_eq!(ring.value(), 2);
    device.complete(three);
    assert_eq!(ring.value(), 3);
}

#[test]
fn a_value_already_reached_records_nothing() {
    let device = MockDevice::new();
    let ring = Ring::new(4);
    let mut recorder = device.recorder();
    ring.record(3, &mut recorder).unwrap();
    ring.record(4, &mut recorder).unwrap();
    assert_eq!(recorder.last, None);
    assert_eq!(device.created(), 0);
}

// ---------------------------------------------------------------------------
// wait: the smallest recorded value >= target.

#[test]
fn wait_synchronises_on_the_smallest_recorded_value_at_or_above_the_target() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let three = record(&ring, &device, 3);
    let five = record(&ring, &device, 5);
    let seven = record(&ring, &device, 7);

    let waiter = waiter(&ring, 4, Timeout::Forever);
    device.await_synchronize_on(five, LONG);
    // Neither the smaller 3 (which does not imply 4) nor the larger 7
    // (which would wait longer than needed).
    assert_eq!(device.synchronized(), vec![five]);
    device.complete(five);
    waiter.join().unwrap().unwrap();
    assert_eq!(ring.value(), 5);
    assert!(!device.synchronized().contains(&three));
    assert!(!device.synchronized().contains(&seven));
}

#[test]
fn wait_on_an_exact_recorded_value_picks_that_value() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    record(&ring, &device, 3);
    let five = record(&ring, &device, 5);
    record(&ring, &device, 7);
    let waiter = waiter(&ring, 5, Timeout::Forever);
    device.await_synchronize_on(five, LONG);
    device.complete(five);
    waiter.join().unwrap().unwrap();
    assert_eq!(device.synchronized(), vec![five]);
}

#[test]
fn a_polling_wait_returns_once_its_event_completes() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let two = record(&ring, &device, 2);
    let waiter = waiter(&ring, 2, LONG);
    thread::sleep(Duration::from_millis(20));
    device.complete(two);
    waiter.join().unwrap().unwrap();
    // A finite timeout polls; it never blocks on the event.
    assert!(device.synchronized().is_empty());
}

#[test]
fn dependency_names_the_event_to_wait_for() {
    let device = MockDevice::new();
    let ring = Ring::new(1);
    assert!(matches!(ring.dependency(1), Ok(Some(Dependency::Reached))));
    assert!(matches!(ring.dependency(2), Ok(None)));
    record(&ring, &device, 2);
    let six = record(&ring, &device, 6);
    match ring.dependency(3) {
        Ok(Some(Dependency::Event(event))) => assert_eq!(event.id(), six),
        other => panic!("expected event {six}, got {other:?}", other = other.is_ok()),
    }
    assert!(matches!(ring.dependency(7), Ok(None)));
    assert!(matches!(
        ring.wait_dependency(7, Duration::from_millis(10)),
        Err(Error::Timeout { target: 7, .. })
    ));
    assert!(matches!(
        ring.dependency(MAX_SIGNAL_VALUE + 1),
        Err(Error::SignalValueOutOfRange { .. })
    ));
}

#[test]
fn wait_dependency_returns_at_the_record_not_the_completion() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let waiter = {
        let ring = ring.clone();
        thread::spawn(move || match ring.wait_dependency(3, LONG) {
            Ok(Dependency::Event(event)) => event.id(),
            _ => panic!("expected an event"),
        })
    };
    thread::sleep(Duration::from_millis(20));
    let four = record(&ring, &device, 4);
    assert_eq!(waiter.join().unwrap(), four);
    assert_eq!(ring.value(), 0);
}

// ---------------------------------------------------------------------------
// wait for a value not recorded yet.

#[test]
fn a_wait_for_an_unrecorded_value_waits_for_its_record() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let waiter = waiter(&ring, 10, Timeout::Forever);
    thread::sleep(Duration::from_millis(20));
    let ten = record(&ring, &device, 10);
    device.await_synchronize_on(ten, LONG);
    assert_eq!(ring.value(), 0, "recorded is not completed");
    device.complete(ten);
    waiter.join().unwrap().unwrap();
    assert_eq!(ring.value(), 10);
}

#[test]
fn a_wait_for_an_unrecorded_value_is_woken_by_a_host_set() {
    let ring = Arc::new(Ring::new(0));
    let waiter = waiter(&ring, 10, LONG);
    thread::sleep(Duration::from_millis(20));
    ring.set(9);
    ring.set(10);
    waiter.join().unwrap().unwrap();
}

#[test]
fn a_wait_for_an_unrecorded_value_times_out_with_the_facts() {
    let ring = Ring::new(2);
    match ring.wait(10, Duration::from_millis(20)) {
        Err(Error::Timeout {
            target,
            current,
            waited,
        }) => {
            assert_eq!((target, current), (10, 2));
            assert!(waited >= Duration::from_millis(20));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn a_wait_on_a_recorded_value_times_out_with_the_facts() {
    let device = MockDevice::new();
    let ring = Ring::new(1);
    record(&ring, &device, 3);
    match ring.wait(3, Duration::from_millis(20)) {
        Err(Error::Timeout {
            target,
            current,
            waited,
        }) => {
            assert_eq!((target, current), (3, 1));
            assert!(waited >= Duration::from_millis(20));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn a_target_past_the_range_is_an_error_not_a_hang() {
    let ring = Ring::new(0);
    assert!(matches!(
        ring.wait(MAX_SIGNAL_VALUE + 1, Timeout::Forever),
        Err(Error::SignalValueOutOfRange { .. })
    ));
    let device = MockDevice::new();
    let mut recorder = device.recorder();
    assert!(matches!(
        ring.record(MAX_SIGNAL_VALUE + 1, &mut recorder),
        Err(Error::SignalValueOutOfRange { .. })
    ));
}

// ---------------------------------------------------------------------------
// Wrap-around and reuse.

#[test]
fn events_are_reused_when_nobody_holds_them() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let first = record(&ring, &device, 1);
    for value in 2..=100 {
        device.complete(first);
        let event = record(&ring, &device, value);
        assert_eq!(event, first, "value {value} got a new event");
    }
    assert_eq!(device.created(), 1);
    assert_eq!(device.records_of(first), 100);
}

#[test]
fn a_full_ring_of_done_slots_creates_no_events() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    for value in 1..=(RING_SLOTS as u64 * 4) {
        let event = record(&ring, &device, value);
        device.complete(event);
    }
    assert!(device.created() <= RING_SLOTS);
    assert!(ring.slots_in_use() <= RING_SLOTS);
    assert_eq!(ring.value(), RING_SLOTS as u64 * 4);
}

#[test]
fn wrap_around_never_re_records_an_event_a_waiter_holds() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let one = record(&ring, &device, 1);
    let waiter = waiter(&ring, 1, Timeout::Forever);
    device.await_synchronize_on(one, LONG);
    // The host passes 1: its slot is done while the waiter still holds the
    // event. Fill every other slot with pending work, so the only slot left
    // for the next record is the held one.
    ring.set(1);
    let mut pending: Vec<usize> = (2..=RING_SLOTS as u64)
        .map(|value| record(&ring, &device, value))
        .collect();
    assert_eq!(ring.slots_in_use(), RING_SLOTS);
    let evicting = record(&ring, &device, RING_SLOTS as u64 + 1);
    assert_ne!(evicting, one, "the held event was handed to a new value");
    assert_eq!(device.records_of(one), 1, "the held event was re-recorded");
    assert_eq!(device.created(), RING_SLOTS + 1);
    pending.push(evicting);
    // Wrap the ring a few more times.
    for event in pending {
        device.complete(event);
    }
    for value in (RING_SLOTS as u64 + 2)..=(RING_SLOTS as u64 * 3) {
        let event = record(&ring, &device, value);
        assert_ne!(event, one);
        device.complete(event);
    }
    assert_eq!(device.records_of(one), 1);
    // The waiter is not lost: its own event completes and it returns.
    assert!(!waiter.is_finished());
    device.complete(one);
    waiter.join().unwrap().unwrap();
    assert_eq!(ring.value(), RING_SLOTS as u64 * 3);
    assert!(ring.slots_in_use() <= RING_SLOTS);
}

#[test]
fn events_a_recorder_refuses_are_not_reused() {
    /// A recorder for "another context": it accepts none of the ring's events.
    struct Foreign<'a>(MockRecorder<'a>);
    impl EventRecorder<MockEvent> for Foreign<'_> {
        fn create(&mut self) -> hwqueue::Result<MockEvent> {
            self.0.create()
        }
        fn accepts(&self, _: &MockEvent) -> bool {
            false
        }
        fn record(&mut self, event: &MockEvent) -> hwqueue::Result<()> {
            self.0.record(event)
        }
    }
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let one = record(&ring, &device, 1);
    device.complete(one);
    let mut foreign = Foreign(device.recorder());
    ring.record(2, &mut foreign).unwrap();
    assert_ne!(foreign.0.last.map(|r| r.event), Some(one));
    assert_eq!(device.created(), 2);
}

#[test]
fn a_full_ring_of_pending_work_blocks_the_recorder_on_the_oldest() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let events: Vec<usize> = (1..=RING_SLOTS as u64)
        .map(|value| record(&ring, &device, value))
        .collect();
    // Waiters on old values hold their slots' events.
    let waiters: Vec<_> = [1u64, 2, 3]
        .into_iter()
        .map(|target| waiter(&ring, target, Timeout::Forever))
        .collect();
    for &event in &events[..3] {
        device.await_synchronize_on(event, LONG);
    }
    let recorder = {
        let ring = ring.clone();
        let device = device.clone();
        thread::spawn(move || record(&ring, &device, RING_SLOTS as u64 + 1))
    };
    // The recorder blocks on the oldest record's event (value 1).
    thread::sleep(Duration::from_millis(20));
    assert!(!recorder.is_finished(), "recorded past a full ring");
    device.complete(events[0]);
    let newest = recorder.join().unwrap();
    assert_ne!(newest, events[1]);
    assert_ne!(newest, events[2]);
    for &event in &events[1..] {
        device.complete(event);
    }
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
    device.complete(newest);
    ring.wait(RING_SLOTS as u64 + 1, LONG).unwrap();
    assert_eq!(ring.value(), RING_SLOTS as u64 + 1);
}

#[test]
fn many_records_in_flight_with_waiters_on_old_values_all_return() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let total = RING_SLOTS as u64 * 4;
    let waiters: Vec<_> = (1..=total)
        .step_by(5)
        .map(|target| {
            let ring = ring.clone();
            thread::spawn(move || {
                ring.wait(target, Timeout::Forever)?;
                Ok::<_, Error>(target)
            })
        })
        .collect();
    // A "device" thread completes events in record order, a little behind.
    let recorded = Arc::new(Mutex::new(Vec::<usize>::new()));
    let runner = {
        let device = device.clone();
        let recorded = recorded.clone();
        thread::spawn(move || {
            let mut next = 0;
            let deadline = Instant::now() + LONG;
            while next < total as usize {
                assert!(Instant::now() < deadline, "the device stalled");
                let event = recorded.lock().unwrap().get(next).copied();
                match event {
                    Some(event) => {
                        device.complete(event);
                        next += 1;
                    }
                    None => thread::sleep(Duration::from_micros(200)),
                }
            }
        })
    };
    for value in 1..=total {
        let mut recorder = device.recorder();
        ring.record(value, &mut recorder).unwrap();
        recorded.lock().unwrap().push(recorder.last.unwrap().event);
    }
    runner.join().unwrap();
    for waiter in waiters {
        let target = waiter.join().unwrap().unwrap();
        assert!(ring.value() >= target);
    }
    ring.wait(total, LONG).unwrap();
    assert!(ring.slots_in_use() <= RING_SLOTS);
}

// ---------------------------------------------------------------------------
// Host set, failure.

#[test]
fn host_set_is_monotonic() {
    let ring = Ring::new(0);
    ring.set(5);
    ring.set(3);
    assert_eq!(ring.value(), 5);
    ring.set(9);
    assert_eq!(ring.value(), 9);
    ring.set(MAX_SIGNAL_VALUE);
    assert_eq!(ring.value(), MAX_SIGNAL_VALUE);
}

#[test]
#[should_panic(expected = "past the largest timeline value")]
fn set_past_the_range_is_a_programming_error() {
    Ring::new(0).set(MAX_SIGNAL_VALUE + 1);
}

#[test]
fn a_host_set_makes_slots_done_and_their_events_reusable() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let one = record(&ring, &device, 1);
    ring.set(1);
    // Event `one` never completed, but its value is passed: reuse it.
    assert_eq!(record(&ring, &device, 2), one);
    assert_eq!(ring.value(), 1);
}

#[test]
fn failure_wakes_a_waiter_for_an_unrecorded_value() {
    let ring = Arc::new(Ring::new(1));
    let waiter = waiter(&ring, 4, Timeout::Forever);
    thread::sleep(Duration::from_millis(20));
    ring.fail(5, kernel_failed());
    let error = waiter.join().unwrap().unwrap_err();
    match &error {
        Error::SignalFailed {
            target, current, ..
        } => assert_eq!((*target, *current), (4, 1)),
        other => panic!("expected SignalFailed, got {other:?}"),
    }
    assert!(matches!(error.root_cause(), Error::KernelFailed { .. }));
}

/// Issue 10, defect 2: a queue that fails or abandons a batch fails the
/// values that batch would have set, but a value that earlier work of the
/// same queue already recorded is its event's to decide. Before the fix the
/// waiter on 3 woke with `SignalFailed` although its work completed.
#[test]
fn a_failure_does_not_fail_a_value_recorded_work_stands_for() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let three = record(&ring, &device, 3);
    ring.fail(5, kernel_failed());
    // Pending, not failed: neither a poll nor the dependency says failed.
    assert!(matches!(
        ring.wait(3, Duration::ZERO),
        Err(Error::Timeout { target: 3, .. })
    ));
    assert!(matches!(ring.dependency(2), Ok(Some(Dependency::Event(_)))));
    // What no recorded event stands for did fail.
    assert!(matches!(
        ring.wait(4, Duration::ZERO),
        Err(Error::SignalFailed { target: 4, .. })
    ));
    let waiter = waiter(&ring, 3, Timeout::Forever);
    device.await_synchronize_on(three, LONG);
    device.complete(three);
    waiter.join().unwrap().unwrap();
    assert!(matches!(
        ring.wait(5, Duration::ZERO),
        Err(Error::SignalFailed { target: 5, .. })
    ));
}

#[test]
fn failure_covers_only_its_values() {
    let device = MockDevice::new();
    let ring = Ring::new(1);
    ring.fail(3, kernel_failed());
    ring.wait(1, Duration::ZERO).unwrap();
    assert!(matches!(
        ring.wait(3, Timeout::Forever),
        Err(Error::SignalFailed { target: 3, .. })
    ));
    assert!(matches!(
        ring.dependency(2),
        Err(Error::SignalFailed { target: 2, .. })
    ));
    assert!(matches!(
        ring.wait(4, Duration::ZERO),
        Err(Error::Timeout { .. })
    ));
    // A later record of 4 works as usual, and reaching it covers 3 too.
    let four = record(&ring, &device, 4);
    device.complete(four);
    ring.wait(4, Duration::ZERO).unwrap();
    ring.wait(3, Duration::ZERO).unwrap();
}

#[test]
fn a_device_fault_fails_the_waiter_instead_of_hanging() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let two = record(&ring, &device, 2);
    let waiter = waiter(&ring, 2, Timeout::Forever);
    device.await_synchronize_on(two, LONG);
    device.break_event(two);
    let error = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(&error, Error::SignalFailed { target: 2, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("reported a fault"), "{error}");
    assert_eq!(ring.value(), 0);
}

/// A device fault is one failure, however often folds find it again.
/// On f672715 every fold that queried the broken event counted the fault
/// as new and woke every parked waiter, so two waiters parked for a value
/// not recorded yet woke each other, each querying the broken event,
/// without end (a core each, for as long as the value stayed unsettled).
#[test]
fn a_fault_found_again_wakes_no_one() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let three = record(&ring, &device, 3);
    device.break_event(three);
    assert!(wait_fails(&ring, 3, Duration::ZERO));
    let before = device.queries_of(three);
    let waiters: Vec<_> = (0..2)
        .map(|_| waiter(&ring, 10, Timeout::Forever))
        .collect();
    // Each waiter folds (querying the broken event) before it parks.
    let start = Instant::now();
    while device.queries_of(three) < before + 2 {
        assert!(start.elapsed() < LONG, "the waiters never looked");
        thread::yield_now();
    }
    thread::sleep(Duration::from_millis(100));
    let parked = device.queries_of(three);
    thread::sleep(Duration::from_millis(100));
    let woken = device.queries_of(three) - parked;
    assert!(woken < 100, "parked waiters woke {woken} times");
    // A failure of their value still wakes them.
    ring.fail(10, kernel_failed());
    for waiter in waiters {
        let waited = waiter.join().unwrap();
        assert!(
            matches!(waited, Err(Error::SignalFailed { target: 10, .. })),
            "{waited:?}"
        );
    }
}

/// A value the host set is reached, even if the event the waiter slept on
/// broke afterwards. On f672715 the wait returned `SignalFailed` (its
/// `current` naming the value it said failed) without looking at the
/// ring again.
#[test]
fn a_value_set_while_its_waiter_slept_is_reached_though_the_event_broke() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let two = record(&ring, &device, 2);
    let waiter = waiter(&ring, 2, Timeout::Forever);
    device.await_synchronize_on(two, LONG);
    ring.set(2);
    device.break_event(two);
    waiter.join().unwrap().unwrap();
    assert_eq!(ring.value(), 2);
}

/// A value a later record's completed event reached is reached, even if
/// the event the waiter slept on broke afterwards (a ring may hold events
/// of two contexts, so one can break while another completes). On
/// `3733012` the wait returned `SignalFailed` (current 0) while `value()`
/// said 3: it looked at the completed value without folding.
#[test]
fn a_value_a_later_event_reached_is_reached_though_the_waited_event_broke() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let two = record(&ring, &device, 2);
    let three = record(&ring, &device, 3);
    let waiter = waiter(&ring, 2, Timeout::Forever);
    device.await_synchronize_on(two, LONG);
    device.complete(three);
    device.break_event(two);
    waiter.join().unwrap().unwrap();
    assert_eq!(ring.value(), 3);
}

// ---------------------------------------------------------------------------
// Model test: the ring against `hwqueue_testkit`'s reference model (shared
// with the `event_ring` fuzz target), with proptest choosing the operations.

fn op() -> impl Strategy<Value = RingOp> {
    // Small values, so records, sets and failures land on each other.
    prop_oneof![
        4 => (1u64..60).prop_map(RingOp::Record),
        4 => any::<usize>().prop_map(RingOp::Complete),
        1 => (0u64..60).prop_map(RingOp::Set),
        1 => (0u64..60).prop_map(RingOp::Fail),
        2 => (0u64..64).prop_map(RingOp::Poll),
        2 => (0u64..64).prop_map(RingOp::IsReached),
        1 => (0u64..64).prop_map(RingOp::Dependency),
        1 => (0u64..64).prop_map(RingOp::PollDependency),
        1 => (0u64..64).prop_map(RingOp::WaitReached),
        1 => Just(RingOp::Value),
        1 => Just(RingOp::RecordPastTheRange),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every result matches the model (the value is the highest completed
    /// or set value, a full ring completes its oldest pending record, a
    /// failure covers only values no recorded event stands for, events are
    /// reused), with the default slot count and with one to four slots.
    #[test]
    fn the_ring_matches_the_model(
        initial in 0u64..8,
        slots in prop_oneof![Just(RING_SLOTS), 1usize..=4],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        check_ring_ops(initial, slots, &ops);
    }
}

/// Issue 13.4: `fold` took a query error for "not complete", so after a
/// fault the signal stayed unreached and unfailed: `dependency` handed the
/// broken event to the next queue, and `fail`/`check` knew nothing. Failed
/// on ef64ac6 (the first assertion: `dependency` returned the event).
#[test]
fn an_event_that_reports_a_fault_fails_the_values_it_stands_for() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let one = record(&ring, &device, 1);
    let three = record(&ring, &device, 3);
    device.complete(one);
    device.break_event(three);
    // The fault is found by the next look at the ring, whichever it is.
    assert!(matches!(
        ring.dependency(3),
        Err(Error::SignalFailed { target: 3, .. })
    ));
    assert!(!ring.is_reached(2));
    let error = ring.wait(2, Duration::ZERO).unwrap_err();
    assert!(
        matches!(&error, Error::SignalFailed { target: 2, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("reported a fault"), "{error}");
    // What completed before the fault stands.
    assert_eq!(ring.value(), 1);
    ring.wait(1, Duration::ZERO).unwrap();
    // A value the host sets later is reached as usual.
    ring.set(3);
    ring.wait(3, Duration::ZERO).unwrap();
}

// ---------------------------------------------------------------------------
// abandon: a recorded value whose work was given up on the device.

#[test]
fn an_abandoned_value_fails_though_its_event_completes() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    let one = record(&ring, &device, 1);
    let two = record(&ring, &device, 2);
    ring.abandon(2, kernel_failed());
    assert!(wait_fails(&ring, 2, Duration::ZERO));
    device.complete(one);
    device.complete(two);
    assert_eq!(ring.value(), 1, "1's work was done; 2's was abandoned");
    assert!(!ring.is_reached(2));
    assert!(wait_fails(&ring, 2, LONG));
    // The abandoned slot is reused, and a later value is reached as usual.
    record_and_reach(&ring, &device, 3);
    assert_eq!(ring.value(), 3);
}

/// A settled wait on an abandoned value must still order, on the device,
/// after the abandoned work, which may run until the abort makes it exit:
/// `given_up` names its event until that completes, and no record reuses
/// the event meanwhile. On `93bdff2` nothing kept it: a settled wait let
/// its queue's work run beside the aborted collective.
#[test]
fn an_abandoned_value_s_event_is_kept_for_settled_waits_until_it_completes() {
    let device = MockDevice::new();
    let ring = Ring::with_slots(0, 1);
    let two = record(&ring, &device, 2);
    ring.abandon(2, kernel_failed());
    let kept = ring.given_up(1).expect("the abandoned work's event");
    assert_eq!(kept.id(), two);
    assert_eq!(ring.given_up(2).map(|e| e.id()), Some(two));
    assert!(ring.given_up(3).is_none(), "3 was not abandoned");
    drop(kept);
    // The one slot is free again, but its event still stands for the
    // abandoned work: a record takes a new one.
    let three = record(&ring, &device, 3);
    assert_ne!(three, two);
    device.complete(two);
    assert!(ring.given_up(2).is_none(), "the abandoned work exited");
    device.complete(three);
    ring.wait(3, LONG).unwrap();
}

/// `given_up` names the event for the values its abandon failed, and only
/// those: not a value failed otherwise before (a settled wait on it has no
/// aborted work to wait for), nor one recorded below it; of two abandons,
/// each value's own; and still once a later `fail` covers a value too (the
/// work still runs). On `72205a1` it named the event of any abandoned
/// value above the target; on `66213bc` a later `fail` of 4 hid 5's.
#[test]
fn given_up_names_an_event_only_for_the_values_its_abandon_failed() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    ring.fail(1, kernel_failed());
    let five = record(&ring, &device, 5);
    ring.abandon(5, kernel_failed());
    assert!(ring.given_up(1).is_none(), "1 failed before, not abandoned");
    assert_eq!(ring.given_up(3).map(|e| e.id()), Some(five));
    assert_eq!(ring.given_up(5).map(|e| e.id()), Some(five));
    assert!(ring.given_up(6).is_none());
    device.complete(five);
    assert!(ring.given_up(5).is_none(), "the abandoned work exited");

    let ring = Ring::new(0);
    let three = record(&ring, &device, 3);
    let five = record(&ring, &device, 5);
    let seven = record(&ring, &device, 7);
    ring.abandon(7, kernel_failed());
    ring.abandon(5, kernel_failed());
    assert!(ring.given_up(3).is_none(), "3 is recorded, not abandoned");
    assert_eq!(ring.given_up(4).map(|e| e.id()), Some(five));
    assert_eq!(ring.given_up(5).map(|e| e.id()), Some(five));
    assert_eq!(ring.given_up(6).map(|e| e.id()), Some(seven));
    assert_eq!(ring.given_up(7).map(|e| e.id()), Some(seven));
    ring.fail(4, kernel_failed());
    assert_eq!(ring.given_up(4).map(|e| e.id()), Some(five));
    device.complete(three);
    assert_eq!(ring.value(), 3);

    // In order: 7's abandon failed only 6 and 7 (4 and 5 were 5's).
    let ring = Ring::new(0);
    let _three = record(&ring, &device, 3);
    let five = record(&ring, &device, 5);
    let seven = record(&ring, &device, 7);
    ring.abandon(5, kernel_failed());
    ring.abandon(7, kernel_failed());
    device.complete(five);
    assert!(
        ring.given_up(4).is_none(),
        "5's work exited; 7's abandon did not fail 4"
    );
    assert_eq!(ring.given_up(6).map(|e| e.id()), Some(seven));
}

/// An abandoned value not recorded yet (its batch still waited) is not
/// recorded after: the work before it came after the abandoned work. A
/// value above it records, and a host `set` reaches it, as usual.
#[test]
fn an_abandoned_value_recorded_after_the_abandon_stays_failed() {
    let device = MockDevice::new();
    let ring = Ring::new(0);
    ring.abandon(2, kernel_failed());
    let mut recorder = device.recorder();
    ring.record(2, &mut recorder).unwrap();
    assert!(recorder.last.is_none(), "2 was recorded after its abandon");
    assert!(wait_fails(&ring, 2, LONG));
    record_and_reach(&ring, &device, 3);
    let ring = Ring::new(0);
    ring.abandon(2, kernel_failed());
    ring.set(2);
    ring.wait(2, Duration::ZERO).unwrap();
}

/// A record that waits for the oldest slot of a full ring does not reach
/// that slot's value once it was abandoned meanwhile: its event
/// completing says nothing of it.
#[test]
fn a_record_waiting_on_an_abandoned_oldest_slot_does_not_reach_its_value() {
    let device = MockDevice::new();
    let ring = Ring::with_slots(0, 1);
    let one = record(&ring, &device, 1);
    thread::scope(|scope| {
        let second = scope.spawn(|| record(&ring, &device, 2));
        device.await_synchronize_on(one, LONG);
        ring.abandon(1, kernel_failed());
        device.complete(one);
        let two = second.join().unwrap();
        assert_eq!(ring.value(), 0, "1 was abandoned");
        assert!(wait_fails(&ring, 1, Duration::ZERO));
        device.complete(two);
        ring.wait(2, LONG).unwrap();
    });
}

#[test]
fn a_waiter_on_an_abandoned_values_event_fails_once_the_event_completes() {
    let device = MockDevice::new();
    let ring = Arc::new(Ring::new(0));
    let event = record(&ring, &device, 1);
    let waiter = waiter(&ring, 1, Timeout::Forever);
    // Whether the waiter blocks on the event before or after this, it
    // must not take the event's completion for the work's.
    thread::sleep(Duration::from_millis(20));
    ring.abandon(1, kernel_failed());
    device.complete(event);
    let waited = waiter.join().unwrap();
    assert!(
        matches!(waited, Err(Error::SignalFailed { target: 1, .. })),
        "{waited:?}"
    );
    assert_eq!(ring.value(), 0);
}
