//! `wait_all` and `wait_any` on each kind of signal: the CPU signal (which
//! notifies a multi-wait), the mock backend's signal of `common::mock`
//! (which keeps `TimelineSignal::watch`'s default, so a multi-wait polls
//! it), CPU signals as `AnySignal`s, and `MixedSignal`s alternating CPU and
//! mock in one list.

mod common;

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use common::LONG;
use common::mock::{MixedSignal, MockSignal};
use hwqueue::cpu::CpuSignal;
use hwqueue::{
    AnySignal, Error, MAX_SIGNAL_VALUE, Producer, Result, SignalWaker, TimelineSignal, Timeout,
    WaitPolicy, WaitTuning, wait_all, wait_any,
};

fn kernel_failed() -> Error {
    Error::KernelFailed {
        program: "k".into(),
        message: "boom".into(),
    }
}

/// `n` signals at `initial`, the `i`th made by `new(i, initial)`.
fn signals<S>(new: fn(usize, u64) -> S, n: usize, initial: u64) -> Vec<S> {
    (0..n).map(|index| new(index, initial)).collect()
}

/// A signal that reports each `watch` of it by raising `watched`: a test
/// gates a setter on it, so the set comes after the multi-wait reached its
/// blocking path (after its first look), without sleeps.
#[derive(Clone, Debug)]
struct Observed<S> {
    inner: S,
    watched: CpuSignal,
}

impl<S: TimelineSignal> TimelineSignal for Observed<S> {
    fn value(&self) -> u64 {
        self.inner.value()
    }
    fn set(&self, value: u64) {
        self.inner.set(value)
    }
    fn is_reached(&self, target: u64) -> bool {
        self.inner.is_reached(target)
    }
    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        self.inner.wait(target, timeout)
    }
    fn fail(&self, upto: u64, cause: Error) {
        self.inner.fail(upto, cause)
    }
    fn producer(&self) -> &Producer {
        self.inner.producer()
    }
    fn watch(&self, waker: &SignalWaker) -> bool {
        let accepted = self.inner.watch(waker);
        // Only the waiting thread watches: no race on the count.
        self.watched.set(self.watched.value() + 1);
        accepted
    }
    fn unwatch(&self, waker: &SignalWaker) {
        self.inner.unwatch(waker)
    }
}

/// `signals`, each wrapped to raise one shared counter when watched.
fn observed<S: TimelineSignal>(signals: &[S]) -> (Vec<Observed<S>>, CpuSignal) {
    let watched = CpuSignal::new(0);
    let wrapped = signals
        .iter()
        .map(|inner| Observed {
            inner: inner.clone(),
            watched: watched.clone(),
        })
        .collect();
    (wrapped, watched)
}

fn pairs<'a, S>(signals: &'a [S], targets: &[u64]) -> Vec<(&'a S, u64)> {
    signals.iter().zip(targets.iter().copied()).collect()
}

// The tests, generic over the signal type; instantiated per backend below.

fn wait_all_returns_once_every_value_is_reached<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 3, 0);
    let waits = pairs(&s, &[1, 2, 3]);
    s[0].set(1);
    s[2].set(5);
    assert!(matches!(
        wait_all(&waits, Duration::ZERO),
        Err(Error::Timeout { .. })
    ));
    s[1].set(2);
    // A zero timeout cannot block: success proves no wait happened.
    wait_all(&waits, Duration::ZERO).unwrap();
    wait_all(&waits, Timeout::Forever).unwrap();
    // The same signal twice, and a value of 0, are fine.
    wait_all(&[(&s[0], 1), (&s[0], 0), (&s[2], 4)], Duration::ZERO).unwrap();
}

fn wait_any_returns_the_lowest_reached_index<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 3, 0);
    let waits = pairs(&s, &[1, 1, 1]);
    s[1].set(1);
    assert_eq!(wait_any(&waits, Duration::ZERO).unwrap(), 1);
    s[2].set(1);
    assert_eq!(wait_any(&waits, LONG).unwrap(), 1);
    s[0].set(1);
    assert_eq!(wait_any(&waits, Timeout::Forever).unwrap(), 0);
    // Past its target counts as reached.
    let s = signals(new, 2, 0);
    s[1].set(9);
    assert_eq!(wait_any(&pairs(&s, &[1, 4]), LONG).unwrap(), 1);
}

fn empty_lists<S: TimelineSignal>(_new: fn(usize, u64) -> S) {
    let none: &[(&S, u64)] = &[];
    wait_all(none, Timeout::Forever).unwrap();
    let error = wait_any(none, Timeout::Forever).unwrap_err();
    assert!(matches!(error, Error::EmptyWaitList), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("no index") && message.contains("at least one"),
        "{message}"
    );
}

fn a_timeout_names_the_first_value_still_pending<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 3, 0);
    s[0].set(5);
    s[1].set(1);
    s[2].set(2);
    // wait_all: index 0 is reached, index 1 is the first still pending.
    let waits = pairs(&s, &[3, 4, 6]);
    for timeout in [Duration::ZERO, Duration::from_millis(20)] {
        match wait_all(&waits, timeout) {
            Err(Error::Timeout {
                target: 4,
                current: 1,
                ..
            }) => {}
            other => panic!("expected a timeout naming value 4 at 1, got {other:?}"),
        }
    }
    // wait_any: nothing reached, the first pair is named.
    let waits = pairs(&s, &[7, 4, 6]);
    for timeout in [Duration::ZERO, Duration::from_millis(20)] {
        match wait_any(&waits, timeout) {
            Err(Error::Timeout {
                target: 7,
                current: 5,
                ..
            }) => {}
            other => panic!("expected a timeout naming value 7 at 5, got {other:?}"),
        }
    }
    let message = wait_any(&waits, Duration::ZERO).unwrap_err().to_string();
    assert!(message.contains("reach 7 (it is at 5)"), "{message}");
}

fn values_past_the_range_are_an_error_not_a_hang<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 2, 0);
    s[0].set(1);
    let waits = [(&s[0], 1), (&s[1], MAX_SIGNAL_VALUE + 1)];
    assert!(matches!(
        wait_all(&waits, Timeout::Forever),
        Err(Error::SignalValueOutOfRange { value, max: MAX_SIGNAL_VALUE }) if value == MAX_SIGNAL_VALUE + 1
    ));
    // Checked before anything else: even with index 0 reached.
    assert!(matches!(
        wait_any(&waits, Timeout::Forever),
        Err(Error::SignalValueOutOfRange { .. })
    ));
    s[1].set(MAX_SIGNAL_VALUE);
    wait_all(&[(&s[1], MAX_SIGNAL_VALUE)], Duration::ZERO).unwrap();
}

fn a_failure_ends_a_wait_all_at_once<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 3, 0);
    s[1].fail(2, kernel_failed());
    // Index 0 is still pending, the failure is reported anyway.
    match wait_all(&pairs(&s, &[1, 2, 1]), Timeout::Forever) {
        Err(error @ Error::SignalFailed { target: 2, .. }) => {
            assert!(matches!(error.root_cause(), Error::KernelFailed { .. }));
        }
        other => panic!("expected SignalFailed for 2, got {other:?}"),
    }
}

fn a_failure_ends_a_wait_any_only_when_nothing_is_reached<S: TimelineSignal>(
    new: fn(usize, u64) -> S,
) {
    let s = signals(new, 3, 0);
    s[2].fail(1, kernel_failed());
    s[1].set(1);
    assert_eq!(
        wait_any(&pairs(&s, &[1, 1, 1]), Timeout::Forever).unwrap(),
        1
    );
    match wait_any(&pairs(&s, &[1, 2, 1]), Timeout::Forever) {
        Err(Error::SignalFailed {
            target: 1,
            current: 0,
            ..
        }) => {}
        other => panic!("expected SignalFailed for 1, got {other:?}"),
    }
}

fn a_set_from_another_thread_wakes_a_blocked_wait_any<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 4, 0);
    let (watched, gate) = observed(&s);
    thread::scope(|scope| {
        scope.spawn(|| {
            // Every signal is watched: the waiter looked once, found nothing,
            // and is about to sleep (or already does).
            gate.wait(4, LONG).unwrap();
            s[2].set(3);
        });
        let fired = wait_any(&pairs(&watched, &[1, 1, 3, 1]), LONG).unwrap();
        assert_eq!(fired, 2);
    });
}

fn a_set_from_another_thread_wakes_a_blocked_wait_all<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    let s = signals(new, 3, 0);
    let (watched, gate) = observed(&s);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(3, LONG).unwrap();
            s[2].set(1);
            s[0].set(1);
            s[1].set(2);
        });
        wait_all(&pairs(&watched, &[1, 2, 1]), LONG).unwrap();
        assert!(s[0].is_reached(1) && s[1].is_reached(2) && s[2].is_reached(1));
    });
    // Woken by sets that reach only some values, it keeps waiting: the one
    // value never set makes it time out, naming that pair. (Checking the
    // values after a wait that returned could not catch an early return:
    // by then the setter has usually set them all.)
    let s = signals(new, 3, 0);
    let (watched, gate) = observed(&s);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(3, LONG).unwrap();
            s[2].set(1);
            s[0].set(1);
        });
        match wait_all(&pairs(&watched, &[1, 2, 1]), Duration::from_millis(50)) {
            Err(Error::Timeout {
                target: 2,
                current: 0,
                ..
            }) => {}
            other => panic!("expected a timeout on the pair never set, got {other:?}"),
        }
    });
}

fn a_failure_from_another_thread_wakes_a_blocked_wait_any<S: TimelineSignal>(
    new: fn(usize, u64) -> S,
) {
    let s = signals(new, 2, 0);
    let (watched, gate) = observed(&s);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(2, LONG).unwrap();
            s[1].fail(4, kernel_failed());
        });
        match wait_any(&pairs(&watched, &[1, 3]), LONG) {
            Err(Error::SignalFailed { target: 3, .. }) => {}
            other => panic!("expected SignalFailed for 3, got {other:?}"),
        }
    });
}

fn a_failure_from_another_thread_wakes_a_blocked_wait_all<S: TimelineSignal>(
    new: fn(usize, u64) -> S,
) {
    let s = signals(new, 2, 0);
    let (watched, gate) = observed(&s);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(2, LONG).unwrap();
            s[0].fail(1, kernel_failed());
        });
        match wait_all(&pairs(&watched, &[1, 1]), LONG) {
            Err(Error::SignalFailed { target: 1, .. }) => {}
            other => panic!("expected SignalFailed for 1, got {other:?}"),
        }
    });
}

/// Many rounds of a setter racing a blocked `wait_any`: every round wakes
/// (a lost wake-up hangs until `LONG` and fails).
fn many_rounds_of_set_and_wait_any<S: TimelineSignal>(new: fn(usize, u64) -> S) {
    const ROUNDS: u64 = 300;
    let s = signals(new, 2, 0);
    let turn = CpuSignal::new(0);
    thread::scope(|scope| {
        scope.spawn(|| {
            for round in 1..=ROUNDS {
                turn.wait(round, LONG).unwrap();
                s[(round % 2) as usize].set(round);
            }
        });
        for round in 1..=ROUNDS {
            turn.set(round);
            let fired = wait_any(&pairs(&s, &[round, round]), LONG).unwrap();
            assert_eq!(fired, (round % 2) as usize);
        }
    });
}

macro_rules! per_backend {
    ($($backend:ident($Signal:ty): $new:expr;)+) => {
        $(
            mod $backend {
                use super::*;

                const NEW: fn(usize, u64) -> $Signal = $new;

                per_backend!(@tests
                    wait_all_returns_once_every_value_is_reached,
                    wait_any_returns_the_lowest_reached_index,
                    empty_lists,
                    a_timeout_names_the_first_value_still_pending,
                    values_past_the_range_are_an_error_not_a_hang,
                    a_failure_ends_a_wait_all_at_once,
                    a_failure_ends_a_wait_any_only_when_nothing_is_reached,
                    a_set_from_another_thread_wakes_a_blocked_wait_any,
                    a_set_from_another_thread_wakes_a_blocked_wait_all,
                    a_failure_from_another_thread_wakes_a_blocked_wait_any,
                    a_failure_from_another_thread_wakes_a_blocked_wait_all,
                    many_rounds_of_set_and_wait_any,
                );
            }
        )+
    };
    (@tests $($test:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                super::$test(NEW);
            }
        )+
    };
}

per_backend! {
    cpu(CpuSignal): |_, initial| CpuSignal::new(initial);
    mock(MockSignal): |_, initial| MockSignal(CpuSignal::new(initial));
    any(AnySignal): |_, initial| AnySignal::from(CpuSignal::new(initial));
    // CPU and mock alternating: one list, one notifying and one polled kind.
    mixed(MixedSignal): |index, initial| {
        if index % 2 == 0 {
            MixedSignal::from(CpuSignal::new(initial))
        } else {
            MixedSignal::from(MockSignal(CpuSignal::new(initial)))
        }
    };
}

#[test]
fn cpu_signals_accept_a_watch_and_mock_signals_are_polled() {
    let waker = SignalWaker::new();
    let cpu = CpuSignal::new(0);
    assert!(cpu.watch(&waker));
    assert!(AnySignal::from(cpu.clone()).watch(&waker));
    assert!(MixedSignal::from(cpu.clone()).watch(&waker));
    let mock = MockSignal(CpuSignal::new(0));
    assert!(!mock.watch(&waker));
    assert!(!MixedSignal::from(mock).watch(&waker));
    for _ in 0..3 {
        cpu.unwatch(&waker);
    }
}

#[test]
fn a_cpu_signal_wakes_its_watchers_until_unwatched() {
    let cpu = CpuSignal::new(0);
    let waker = SignalWaker::new();
    let woken = |waker: &SignalWaker| format!("{waker:?}").contains("woken: true");
    assert!(cpu.watch(&waker));
    cpu.set(1);
    assert!(woken(&waker));

    let fresh = SignalWaker::new();
    assert!(cpu.watch(&fresh));
    // A second raise while watched: the flag was set again, so it wakes.
    cpu.set(2);
    assert!(woken(&fresh));
    cpu.unwatch(&fresh);

    // A failure wakes too; a lower set does not (nothing changed).
    let third = SignalWaker::new();
    assert!(cpu.watch(&third));
    cpu.set(1);
    assert!(!woken(&third));
    cpu.fail(5, kernel_failed());
    assert!(woken(&third));
    cpu.unwatch(&third);
    cpu.unwatch(&waker);

    // Unwatched: a raise wakes nobody.
    let last = SignalWaker::new();
    assert!(cpu.watch(&last));
    cpu.unwatch(&last);
    cpu.set(3);
    assert!(!woken(&last));
}

#[test]
fn a_mixed_list_wakes_on_either_backend() {
    let cpu = MixedSignal::from(CpuSignal::new(0));
    let mock = MixedSignal::from(MockSignal(CpuSignal::new(0)));
    let (watched, gate) = observed(&[cpu.clone(), mock.clone()]);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(2, LONG).unwrap();
            mock.set(1);
        });
        assert_eq!(wait_any(&pairs(&watched, &[1, 1]), LONG).unwrap(), 1);
    });
    let (watched, gate) = observed(&[cpu.clone(), mock.clone()]);
    thread::scope(|scope| {
        scope.spawn(|| {
            gate.wait(2, LONG).unwrap();
            cpu.set(1);
        });
        assert_eq!(wait_any(&pairs(&watched, &[1, 2]), LONG).unwrap(), 0);
    });
    wait_all(&[(&cpu, 1), (&mock, 1)], Duration::ZERO).unwrap();
}

/// A signal that declines `watch` (so a multi-wait polls it, as it polls a
/// CUDA signal) and answers a device tuning of the test's choosing, as a
/// CUDA signal answers its event's device's. It counts the multi-wait's
/// looks at it, and records the time slices its multi-waits are given.
#[derive(Clone, Debug)]
struct Tuned {
    inner: CpuSignal,
    tuning: Option<&'static WaitTuning>,
    looks: Arc<AtomicUsize>,
}

thread_local! {
    /// The `timeout` of each `Tuned::wait_native` on this thread.
    static SLICES: RefCell<Vec<Duration>> = const { RefCell::new(Vec::new()) };
}

impl Tuned {
    fn new(initial: u64, tuning: Option<&'static WaitTuning>) -> Self {
        Self {
            inner: CpuSignal::new(initial),
            tuning,
            looks: Arc::default(),
        }
    }
}

impl TimelineSignal for Tuned {
    fn value(&self) -> u64 {
        self.inner.value()
    }
    fn set(&self, value: u64) {
        self.inner.set(value)
    }
    fn is_reached(&self, target: u64) -> bool {
        self.looks.fetch_add(1, Ordering::Relaxed);
        self.inner.is_reached(target)
    }
    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        self.inner.wait(target, timeout)
    }
    fn fail(&self, upto: u64, cause: Error) {
        self.inner.fail(upto, cause)
    }
    fn producer(&self) -> &Producer {
        self.inner.producer()
    }
    fn wait_tuning(&self, _target: u64) -> Option<&'static WaitTuning> {
        self.tuning
    }
    /// Sleeps nothing, as the default does: the caller sleeps its back-off.
    fn wait_native(_waits: &[(&Self, u64)], _all: bool, timeout: Duration) -> bool {
        SLICES.with(|slices| slices.borrow_mut().push(timeout));
        false
    }
}

/// Issue 47's sleep-only setting per device: a multi-wait spins by the
/// tunings of the signals it still waits for. On f672715 it took every
/// signal's, reached ones too, so a signal reached long ago through a
/// `Spin` device made a `wait_all` for a signal of a `Sleep` device (or a
/// CPU signal) spin its whole timeout: here millions of looks in 200 ms,
/// where backing off from 10 µs to 1 ms looks a few hundred times.
#[test]
fn a_reached_signal_of_a_spinning_device_does_not_make_a_multi_wait_spin() {
    static SPINNING: WaitTuning = WaitTuning::new();
    static SLEEPING: WaitTuning = WaitTuning::new();
    SPINNING.set_policy(WaitPolicy::Spin);
    SLEEPING.set_policy(WaitPolicy::Sleep);
    let done = Tuned::new(1, Some(&SPINNING));
    for (pending, name) in [
        (Tuned::new(0, Some(&SLEEPING)), "a sleep-only device's"),
        (Tuned::new(0, None), "an untuned"),
    ] {
        let waits = [(&done, 1), (&pending, 1)];
        let waited = wait_all(&waits, Duration::from_millis(200));
        assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        let looks = pending.looks.load(Ordering::Relaxed);
        assert!(
            looks < 20_000,
            "the wait for {name} signal spun: {looks} looks at it"
        );
    }
}

/// The same, for a `Spin` device's signal reached during the wait: the
/// wait stops spinning soon after, rather than for the other signal's whole
/// wait. On `4e65311` the budget was taken once, before the spin, so here
/// the wait spun its 200 ms (millions of looks at the sleep-only signal).
#[test]
fn a_spinning_device_s_signal_reached_during_a_multi_wait_ends_its_spin() {
    static SPINNING: WaitTuning = WaitTuning::new();
    static SLEEPING: WaitTuning = WaitTuning::new();
    SPINNING.set_policy(WaitPolicy::Spin);
    SLEEPING.set_policy(WaitPolicy::Sleep);
    let spinning = Tuned::new(0, Some(&SPINNING));
    let pending = Tuned::new(0, Some(&SLEEPING));
    let setter = spinning.clone();
    let waited = std::thread::scope(|scope| {
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            setter.set(1);
        });
        wait_all(&[(&spinning, 1), (&pending, 1)], Duration::from_millis(200))
    });
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let looks = pending.looks.load(Ordering::Relaxed);
    assert!(
        looks < 20_000,
        "the wait spun on: {looks} looks at the pending signal"
    );
}

/// The back-off of a multi-wait over polled signals doubles once a round,
/// from 10 µs, as documented. On f672715 each round took two steps (one
/// for the signals' own multi-wait, which the CUDA signal does not have,
/// and one for the sleep), so it went 10, 40, 160 µs: a completion was
/// seen up to four times later than the back-off promised.
#[test]
fn a_multi_wait_over_polled_signals_backs_off_one_step_a_round() {
    let pending = [Tuned::new(0, None), Tuned::new(0, None)];
    SLICES.with(|slices| slices.borrow_mut().clear());
    let waited = wait_any(&pairs(&pending, &[1, 1]), Duration::from_millis(20));
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let slices = SLICES.with(|slices| slices.borrow().clone());
    let micros = |us: u64| Duration::from_micros(us);
    assert!(slices.len() >= 4, "{slices:?}");
    assert_eq!(
        slices[..4],
        [micros(10), micros(20), micros(40), micros(80)]
    );
}
