//! `CpuSignal`: wake-ups, monotonicity, visibility and failure, with the
//! real signal code on loom's primitives.

use std::time::Duration;

use hwqueue::cpu::CpuSignal;
use hwqueue::{Error, TimelineSignal, Timeout};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use crate::model;

fn kernel_failed() -> Error {
    Error::KernelFailed {
        program: "model".into(),
        message: "boom".into(),
    }
}

/// A setter and a waiter: the waiter always wakes, and the setter's write
/// before `set` is visible after `wait` (loom reports a data race on the
/// cell otherwise).
#[test]
fn one_setter_one_waiter() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let data = Arc::new(UnsafeCell::new(0u32));
        let setter = {
            let (signal, data) = (signal.clone(), data.clone());
            thread::spawn(move || {
                // SAFETY: the waiter reads only after `wait` returns, which
                // happens-after this `set`.
                data.with_mut(|d| unsafe { *d = 42 });
                signal.set(1);
            })
        };
        signal.wait(1, Timeout::Forever).unwrap();
        assert_eq!(signal.value(), 1);
        // SAFETY: `wait(1)` returned, so the setter's write happened-before.
        assert_eq!(data.with(|d| unsafe { *d }), 42);
        setter.join().unwrap();
    });
}

/// Two setters race with different values; one waiter waits for each in
/// turn. The value never goes down (each setter sees at least its own value
/// after its `set`; the waiter's reads never fall), the waiter always wakes,
/// and the end value is the max.
#[test]
fn two_setters_one_waiter_monotonic() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let setters: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|v| {
                let signal = signal.clone();
                thread::spawn(move || {
                    signal.set(v);
                    assert!(signal.value() >= v, "value fell below {v}");
                })
            })
            .collect();
        signal.wait(1, Timeout::Forever).unwrap();
        let first = signal.value();
        assert!(first >= 1);
        signal.wait(2, Timeout::Forever).unwrap();
        let second = signal.value();
        assert!(second >= first, "value went down: {first} -> {second}");
        for setter in setters {
            setter.join().unwrap();
        }
        assert_eq!(signal.value(), 2);
    });
}

/// One setter, two waiters: both wake.
#[test]
fn one_setter_two_waiters() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let waiter = {
            let signal = signal.clone();
            thread::spawn(move || signal.wait(1, Timeout::Forever))
        };
        let setter = {
            let signal = signal.clone();
            thread::spawn(move || signal.set(1))
        };
        signal.wait(1, Timeout::Forever).unwrap();
        waiter.join().unwrap().unwrap();
        setter.join().unwrap();
        assert_eq!(signal.value(), 1);
    });
}

/// `set` racing the non-blocking readers: `value` never falls, `is_reached`
/// agrees with `value`, and a reached value publishes the work before it.
#[test]
fn set_races_is_reached_and_value() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let data = Arc::new(UnsafeCell::new(0u32));
        let setter = {
            let (signal, data) = (signal.clone(), data.clone());
            thread::spawn(move || {
                // SAFETY: read only by an observer that saw `value() >= 1`.
                data.with_mut(|d| unsafe { *d = 7 });
                signal.set(1);
                signal.set(2);
            })
        };
        let before = signal.value();
        let reached = signal.is_reached(2);
        let after = signal.value();
        assert!(before <= after, "value went down: {before} -> {after}");
        if reached {
            assert_eq!(after, 2);
        }
        if after >= 1 {
            // SAFETY: `value() >= 1` was read with Acquire after the
            // setter's Release `set(1)`: the write happened-before.
            assert_eq!(data.with(|d| unsafe { *d }), 7);
        }
        setter.join().unwrap();
        assert!(signal.is_reached(2));
    });
}

/// `fail` racing a waiter: the waiter wakes with `SignalFailed` carrying the
/// cause.
#[test]
fn fail_wakes_a_waiter_with_an_error() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let failer = {
            let signal = signal.clone();
            thread::spawn(move || signal.fail(1, kernel_failed()))
        };
        let error = signal.wait(1, Timeout::Forever).unwrap_err();
        assert!(
            matches!(
                error,
                Error::SignalFailed {
                    target: 1,
                    current: 0,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(matches!(error.root_cause(), Error::KernelFailed { .. }));
        failer.join().unwrap();
    });
}

/// `set` and `fail` of the same value race a waiter: whichever wins, the
/// waiter wakes (success, or an error if the failure came first), and the
/// value ends set.
#[test]
fn set_and_fail_race_a_waiter() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let setter = {
            let signal = signal.clone();
            thread::spawn(move || signal.set(1))
        };
        let failer = {
            let signal = signal.clone();
            thread::spawn(move || signal.fail(1, kernel_failed()))
        };
        match signal.wait(1, Timeout::Forever) {
            Ok(()) => assert_eq!(signal.value(), 1),
            Err(Error::SignalFailed { target: 1, .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        setter.join().unwrap();
        failer.join().unwrap();
        assert_eq!(signal.value(), 1);
        signal.wait(1, Duration::ZERO).unwrap();
    });
}

/// A zero-timeout wait racing `set` polls: success or a timeout with the
/// value it saw, never a hang.
#[test]
fn zero_timeout_wait_races_set() {
    model(None, || {
        let signal = CpuSignal::new(0);
        let setter = {
            let signal = signal.clone();
            thread::spawn(move || signal.set(1))
        };
        match signal.wait(1, Duration::ZERO) {
            Ok(()) => assert_eq!(signal.value(), 1),
            Err(Error::Timeout {
                target: 1,
                current: 0,
                ..
            }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        setter.join().unwrap();
    });
}
