//! `wait_any` and `wait_all` on `CpuSignal`s: the watch protocol (a
//! multi-wait's waker registered with each signal, woken by `set` and
//! `fail`) loses no wake-up, with the real code on loom's primitives.
//!
//! A multi-wait takes many more synchronisation steps than a single `wait`
//! (a watch and an un-watch per signal, a lock per failure check), so these
//! models run under a preemption bound by default: 2 for the four-thread
//! model (about 26 000 executions, 3 s; bound 3 takes about a minute),
//! 3 for the others (a few seconds each; exhaustive takes over ten minutes).
//! Each protocol step is needed, and the models show it: without the flag
//! that `watch` sets, without the re-flag in `CpuSignal`'s slow `set` path,
//! or without waking the watchers in `fail`, some model here deadlocks
//! within its bound (checked by hand when the models were written).

use hwqueue::cpu::CpuSignal;
use hwqueue::{Error, TimelineSignal, Timeout, wait_all, wait_any};
use loom::thread;

use crate::model;

fn kernel_failed() -> Error {
    Error::KernelFailed {
        program: "model".into(),
        message: "boom".into(),
    }
}

/// `wait_any` on two signals, racing a setter of each and a `fail` of the
/// first: it always wakes (a lost wake-up is a deadlock loom reports), and
/// its answer is a signal that reached its value or the failure, never a
/// failure while a value it reports as reached was not.
#[test]
fn wait_any_races_two_setters_and_a_failure() {
    model(Some(2), || {
        let a = CpuSignal::new(0);
        let b = CpuSignal::new(0);
        let threads = [
            {
                let a = a.clone();
                thread::spawn(move || a.set(1))
            },
            {
                let b = b.clone();
                thread::spawn(move || b.set(1))
            },
            {
                let a = a.clone();
                thread::spawn(move || a.fail(1, kernel_failed()))
            },
        ];
        match wait_any(&[(&a, 1), (&b, 1)], Timeout::Forever) {
            Ok(0) => assert!(a.is_reached(1)),
            Ok(1) => assert!(b.is_reached(1)),
            Ok(other) => panic!("index {other} of a list of two"),
            Err(Error::SignalFailed { target: 1, .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        for setter in threads {
            setter.join().unwrap();
        }
    });
}

/// `wait_any` where only a failure can end the wait: a raise short of the
/// target wakes the waiter for nothing, and the `fail` must wake it again.
#[test]
fn wait_any_is_ended_by_a_failure() {
    model(Some(3), || {
        let a = CpuSignal::new(0);
        let b = CpuSignal::new(0);
        let threads = [
            {
                let a = a.clone();
                thread::spawn(move || a.set(1))
            },
            {
                let a = a.clone();
                thread::spawn(move || a.fail(2, kernel_failed()))
            },
        ];
        match wait_any(&[(&a, 2), (&b, 1)], Timeout::Forever) {
            Err(Error::SignalFailed { target: 2, .. }) => {}
            other => panic!("expected the failure, got {other:?}"),
        }
        for thread in threads {
            thread.join().unwrap();
        }
    });
}

/// `wait_all` with one signal set and the other failed: the failure ends
/// it, whichever comes first.
#[test]
fn wait_all_is_ended_by_a_failure() {
    model(Some(3), || {
        let a = CpuSignal::new(0);
        let b = CpuSignal::new(0);
        let threads = [
            {
                let a = a.clone();
                thread::spawn(move || a.set(1))
            },
            {
                let b = b.clone();
                thread::spawn(move || b.fail(1, kernel_failed()))
            },
        ];
        match wait_all(&[(&a, 1), (&b, 1)], Timeout::Forever) {
            Err(Error::SignalFailed { target: 1, .. }) => {}
            other => panic!("expected the failure, got {other:?}"),
        }
        for thread in threads {
            thread.join().unwrap();
        }
    });
}

/// `wait_any` with one watcher-raising setter: the setter's first raise
/// clears the flag and a second raise races the re-flag; the waiter waits
/// for the second value and must still wake.
#[test]
fn wait_any_sees_a_raise_that_races_the_re_flag() {
    model(Some(3), || {
        let a = CpuSignal::new(0);
        let b = CpuSignal::new(0);
        let setters = [1u64, 2].map(|value| {
            let a = a.clone();
            thread::spawn(move || a.set(value))
        });
        assert_eq!(wait_any(&[(&b, 1), (&a, 2)], Timeout::Forever).unwrap(), 1);
        for setter in setters {
            setter.join().unwrap();
        }
    });
}

/// `wait_all` on two signals with a setter of each: it wakes once both are
/// set, whatever the order.
#[test]
fn wait_all_races_two_setters() {
    model(Some(3), || {
        let a = CpuSignal::new(0);
        let b = CpuSignal::new(0);
        let setters = [a.clone(), b.clone()].map(|signal| thread::spawn(move || signal.set(1)));
        wait_all(&[(&a, 1), (&b, 1)], Timeout::Forever).unwrap();
        assert!(a.is_reached(1) && b.is_reached(1));
        for setter in setters {
            setter.join().unwrap();
        }
    });
}
