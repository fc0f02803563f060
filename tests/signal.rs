//! `CpuSignal` against the `TimelineSignal` contract.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::LONG;
use hwqueue::cpu::CpuSignal;
use hwqueue::{Error, MAX_SIGNAL_VALUE, TimelineSignal, Timeout};
use proptest::prelude::*;

#[test]
fn a_new_signal_reads_zero() {
    let signal = CpuSignal::default();
    assert_eq!(signal.value(), 0);
    assert!(signal.is_reached(0));
    assert!(!signal.is_reached(1));
    assert_eq!(CpuSignal::new(7).value(), 7);
}

#[test]
fn values_only_rise() {
    let signal = CpuSignal::new(0);
    signal.set(5);
    signal.set(3);
    assert_eq!(signal.value(), 5);
    signal.set(5);
    assert_eq!(signal.value(), 5);
    signal.set(9);
    assert_eq!(signal.value(), 9);
}

#[test]
fn is_reached_below_at_above() {
    let signal = CpuSignal::new(5);
    assert!(signal.is_reached(4));
    assert!(signal.is_reached(5));
    assert!(!signal.is_reached(6));
}

#[test]
fn wait_on_a_reached_value_returns_at_once() {
    let signal = CpuSignal::new(5);
    // A zero timeout cannot block: success proves no wait happened.
    signal.wait(5, Duration::ZERO).unwrap();
    signal.wait(1, Duration::ZERO).unwrap();
}

#[test]
fn a_blocked_waiter_is_woken_by_a_later_set() {
    let signal = CpuSignal::new(0);
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || signal.wait(3, LONG))
    };
    // Give the waiter time to park; correctness does not depend on it.
    thread::sleep(Duration::from_millis(20));
    signal.set(1);
    signal.set(3);
    waiter.join().unwrap().unwrap();
    assert_eq!(signal.value(), 3);
}

#[test]
fn a_wait_for_a_value_never_set_times_out_with_the_facts() {
    let signal = CpuSignal::new(2);
    let error = signal.wait(10, Duration::from_millis(20)).unwrap_err();
    match error {
        Error::Timeout {
            target,
            current,
            waited,
        } => {
            assert_eq!(target, 10);
            assert_eq!(current, 2);
            assert!(waited >= Duration::from_millis(20));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let message = signal.wait(10, Duration::ZERO).unwrap_err().to_string();
    assert!(
        message.contains("10") && message.contains("at 2"),
        "{message}"
    );
}

#[test]
fn a_zero_timeout_polls() {
    let signal = CpuSignal::new(0);
    assert!(matches!(
        signal.wait(1, Duration::ZERO),
        Err(Error::Timeout {
            target: 1,
            current: 0,
            ..
        })
    ));
}

#[test]
fn a_target_past_the_range_is_an_error_not_a_hang() {
    let signal = CpuSignal::new(0);
    assert!(matches!(
        signal.wait(MAX_SIGNAL_VALUE + 1, Timeout::Forever),
        Err(Error::SignalValueOutOfRange { .. })
    ));
    signal.set(MAX_SIGNAL_VALUE);
    assert_eq!(signal.value(), MAX_SIGNAL_VALUE);
}

#[test]
#[should_panic(expected = "past the largest timeline value")]
fn set_past_the_range_is_a_programming_error() {
    CpuSignal::new(0).set(MAX_SIGNAL_VALUE + 1);
}

#[test]
fn fail_wakes_waiters_with_the_cause() {
    let signal = CpuSignal::new(1);
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || signal.wait(4, Timeout::Forever))
    };
    thread::sleep(Duration::from_millis(20));
    signal.fail(
        5,
        Error::KernelFailed {
            program: "k".into(),
            message: "boom".into(),
        },
    );
    let error = waiter.join().unwrap().unwrap_err();
    match &error {
        Error::SignalFailed {
            target, current, ..
        } => {
            assert_eq!((*target, *current), (4, 1));
        }
        other => panic!("expected SignalFailed, got {other:?}"),
    }
    assert!(matches!(error.root_cause(), Error::KernelFailed { .. }));
    assert!(error.to_string().contains("boom"));
}

#[test]
fn failure_covers_only_its_values() {
    let signal = CpuSignal::new(1);
    signal.fail(
        3,
        Error::KernelFailed {
            program: "k".into(),
            message: "boom".into(),
        },
    );
    // Reached values stay fine, failed ones error at once, later ones wait.
    signal.wait(1, Duration::ZERO).unwrap();
    assert!(matches!(
        signal.wait(3, Timeout::Forever),
        Err(Error::SignalFailed { target: 3, .. })
    ));
    assert!(matches!(
        signal.wait(4, Duration::ZERO),
        Err(Error::Timeout { .. })
    ));
    signal.set(4);
    signal.wait(4, Duration::ZERO).unwrap();
    // Reached now, so the failure no longer applies to 3.
    signal.wait(3, Duration::ZERO).unwrap();
}

#[test]
fn many_setters_and_waiters_all_wake_and_the_value_never_drops() {
    const SETTERS: u64 = 4;
    const STEPS: u64 = 2_000;
    let signal = Arc::new(CpuSignal::new(0));
    let waiters: Vec<_> = (1..=4u64)
        .map(|w| {
            let signal = signal.clone();
            thread::spawn(move || {
                for target in (w..=SETTERS * STEPS).step_by(97) {
                    signal.wait(target, LONG).unwrap();
                    assert!(signal.value() >= target);
                }
            })
        })
        .collect();
    let setters: Vec<_> = (0..SETTERS)
        .map(|s| {
            let signal = signal.clone();
            thread::spawn(move || {
                let mut last = 0;
                for step in 0..STEPS {
                    signal.set(step * SETTERS + s + 1);
                    let now = signal.value();
                    assert!(now >= last, "value went down: {last} -> {now}");
                    last = now;
                }
            })
        })
        .collect();
    for handle in setters.into_iter().chain(waiters) {
        handle.join().unwrap();
    }
    assert_eq!(signal.value(), SETTERS * STEPS);
}

proptest! {
    /// `value` is the running max of everything set; `is_reached` and a
    /// non-blocking `wait` agree with it.
    #[test]
    fn value_is_the_running_max(sets in proptest::collection::vec(0u64..1_000, 0..64), probe in 0u64..1_100) {
        let signal = CpuSignal::new(0);
        let mut max = 0;
        for v in sets {
            signal.set(v);
            max = max.max(v);
            prop_assert_eq!(signal.value(), max);
        }
        prop_assert_eq!(signal.is_reached(probe), probe <= max);
        prop_assert_eq!(signal.wait(probe, Duration::ZERO).is_ok(), probe <= max);
    }
}
