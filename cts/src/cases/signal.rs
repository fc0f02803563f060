//! Timeline signals on their own (IREE's `semaphore_test`): values, waits,
//! timeouts, failures.

use std::sync::Barrier;
use std::time::Duration;

use hwqueue::{Error, MAX_SIGNAL_VALUE, TimelineSignal, Timeout};

use crate::cx::{broke, check};
use crate::rules::{FAILURE, MONOTONIC, WAIT};
use crate::{Cx, LONG, SHORT, Target};

/// A new signal holds its initial value; `set` raises it; `is_reached`
/// agrees with `value`.
pub fn signal_starts_at_its_initial_value_and_rises<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(7);
    check(signal.value() == 7, MONOTONIC, || {
        format!("new_signal(7) reads {}", signal.value())
    });
    signal.set(9);
    check(signal.value() == 9, MONOTONIC, || {
        format!("set(9) on 7 reads {}", signal.value())
    });
    check(
        signal.is_reached(9) && !signal.is_reached(10),
        MONOTONIC,
        || "is_reached disagrees with value 9".into(),
    );
    if let Err(error) = signal.wait(9, Timeout::After(Duration::ZERO)) {
        broke(
            WAIT,
            format!("a zero-timeout wait on a reached value failed: {error}"),
        );
    }
}

/// A `set` below the value is ignored.
pub fn signal_lower_set_is_ignored<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(0);
    signal.set(5);
    signal.set(3);
    check(signal.value() == 5, MONOTONIC, || {
        format!("set(5) then set(3) reads {}", signal.value())
    });
}

/// A wait that starts before the value is set returns once it is (the
/// setter is gated on the waiter having started).
pub fn signal_wait_before_the_set_returns_once_set<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(0);
    let started = Barrier::new(2);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            started.wait();
            signal.wait(3, LONG)
        });
        started.wait();
        signal.set(1);
        signal.set(3);
        match waiter.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => broke(WAIT, format!("a wait for 3, then set(3): {error}")),
            Err(_) => broke(WAIT, "the waiting thread panicked"),
        }
    });
}

/// A wait for a value nobody sets times out with the target, the value
/// reached and the time waited.
pub fn signal_wait_times_out_with_its_figures<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(2);
    match signal.wait(5, SHORT) {
        Err(Error::Timeout {
            target: 5,
            current: 2,
            waited,
        }) if waited >= SHORT => {}
        other => broke(
            WAIT,
            format!(
                "wait(5, {SHORT:?}) on a signal at 2 gave {other:?}, not Timeout {{ target: 5, current: 2, waited >= {SHORT:?} }}"
            ),
        ),
    }
}

/// Values past 2^32 are values like any other (no 32-bit truncation in the
/// signal, its waits or its queue commands).
pub fn signal_values_cross_2_pow_32<T: Target>(cx: &Cx<T>) {
    let big = 1u64 << 32;
    let signal = cx.signal(big - 1);
    let mut queue = cx.queue();
    hwqueue::HardwareQueue::signal(&mut queue, &signal, big + 5);
    if let Err(error) = hwqueue::HardwareQueue::submit(&mut queue) {
        broke(WAIT, format!("submitting signal(2^32 + 5): {error}"));
    }
    if let Err(error) = signal.wait(big + 5, LONG) {
        broke(
            WAIT,
            format!("wait(2^32 + 5) after a queue signalled it: {error}"),
        );
    }
    check(
        signal.value() == big + 5 && !signal.is_reached(big + 6),
        MONOTONIC,
        || format!("after signal(2^32 + 5) the value reads {}", signal.value()),
    );
}

/// `fail` wakes every waiter of the failed range once, with
/// `SignalFailed` carrying the cause; values above stay usable, and a later
/// `set` past the range satisfies a new waiter.
pub fn signal_failure_wakes_every_waiter_once<T: Target>(cx: &Cx<T>) {
    const WAITERS: usize = 4;
    let signal = cx.signal(1);
    let started = Barrier::new(WAITERS + 1);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let waiters: Vec<_> = (0..WAITERS)
            .map(|i| {
                let (signal, started) = (&signal, &started);
                scope.spawn(move || {
                    started.wait();
                    signal.wait(2 + (i as u64 % 2), LONG)
                })
            })
            .collect();
        started.wait();
        signal.fail(
            3,
            Error::Abandoned {
                reason: "failed by the conformance suite",
            },
        );
        waiters.into_iter().map(|w| w.join()).collect()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(Err(Error::SignalFailed { cause, .. }))
                if matches!(*cause, Error::Abandoned { .. }) => {}
            Ok(other) => broke(
                FAILURE,
                format!(
                    "waiter {i} (of a value up to the failed 3) got {other:?}, not SignalFailed with the cause"
                ),
            ),
            Err(_) => broke(FAILURE, format!("waiter {i} panicked")),
        }
    }
    check(
        matches!(signal.wait(4, SHORT), Err(Error::Timeout { .. })),
        FAILURE,
        || "a value above the failed range does not wait as usual".into(),
    );
    signal.set(4);
    if let Err(error) = signal.wait(3, Timeout::Forever) {
        broke(
            FAILURE,
            format!("after set(4) past the failed range, wait(3): {error}"),
        );
    }
}

/// A target past `MAX_SIGNAL_VALUE` is an error, never a hang.
pub fn signal_value_past_the_maximum_is_an_error<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(0);
    match signal.wait(MAX_SIGNAL_VALUE + 1, Timeout::Forever) {
        Err(Error::SignalValueOutOfRange { .. }) => {}
        other => broke(
            WAIT,
            format!("wait(MAX_SIGNAL_VALUE + 1) gave {other:?}, not SignalValueOutOfRange"),
        ),
    }
    check(
        hwqueue::QueueFactory::new_signal(&*cx.device, MAX_SIGNAL_VALUE + 1).is_err(),
        WAIT,
        || "new_signal(MAX_SIGNAL_VALUE + 1) did not fail".into(),
    );
}
