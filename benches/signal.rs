//! `CpuSignal` against the primitives it is built from.
//!
//! | group | `hwqueue` | baselines |
//! |-------|-----------|-----------|
//! | `signal_set` | `CpuSignal::set`, nobody waiting | `fetch_max`: a bare `AtomicU64::fetch_max`; `lock_notify`: `fetch_max`, then lock and `notify_all` every time (the naive correct signal) |
//! | `signal_wait_reached` | `CpuSignal::wait` on a value already reached | `atomic_load`: one `Acquire` load and a compare |
//! | `signal_wake` | two threads ping-pong through two `CpuSignal`s | `parking_lot_condvar`: the same with a `parking_lot` `Mutex<u64>` + `Condvar` per direction |
//! | `signal_wake_any` | `wait_any_2`, `wait_any_4`: the same ping-pong, the partner answering on one of 2 or 4 `CpuSignal`s in turn and the host waking in `wait_any` on all of them | `wait`: one answer signal, the host waking in its `wait` |
//!
//! One iteration of `signal_wake` and `signal_wake_any` is one round trip:
//! two wake-ups. In `signal_wake_any` only the host's differs (the partner
//! always wakes in a single `wait`), so a round-trip ratio `r` against
//! `wait` means the host's wake-up costs `2r - 1` times a single `wait`'s.

mod support;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hwqueue::cpu::CpuSignal;
use hwqueue::{TimelineSignal, Timeout, wait_any};
use parking_lot::{Condvar, Mutex};

use support::Profile;

fn signal_set(c: &mut Criterion) {
    let mut group = c.benchmark_group("signal_set");
    support::configure(&mut group, Profile::Latency);

    group.bench_function("hwqueue", |b| {
        let signal = CpuSignal::new(0);
        let mut value = 0;
        b.iter(|| {
            value += 1;
            signal.set(black_box(value));
        });
    });

    group.bench_function("fetch_max", |b| {
        let word = AtomicU64::new(0);
        let mut value = 0;
        b.iter(|| {
            value += 1;
            word.fetch_max(black_box(value), Ordering::AcqRel)
        });
    });

    group.bench_function("lock_notify", |b| {
        let word = AtomicU64::new(0);
        let lock = Mutex::new(());
        let parked = Condvar::new();
        let mut value = 0;
        b.iter(|| {
            value += 1;
            word.fetch_max(black_box(value), Ordering::AcqRel);
            let _guard = lock.lock();
            parked.notify_all()
        });
    });

    group.finish();
}

fn signal_wait_reached(c: &mut Criterion) {
    let mut group = c.benchmark_group("signal_wait_reached");
    support::configure(&mut group, Profile::Latency);

    group.bench_function("hwqueue", |b| {
        let signal = CpuSignal::new(1_000);
        b.iter(|| signal.wait(black_box(500), Timeout::Forever).is_ok());
    });

    group.bench_function("atomic_load", |b| {
        let word = AtomicU64::new(1_000);
        b.iter(|| word.load(Ordering::Acquire) >= black_box(500));
    });

    group.finish();
}

/// A one-directional timeline: what one side of the ping-pong waits on.
trait Timeline: Sync {
    fn new() -> Self;
    fn raise(&self, value: u64);
    fn wait_for(&self, value: u64);
}

impl Timeline for CpuSignal {
    fn new() -> Self {
        CpuSignal::new(0)
    }

    fn raise(&self, value: u64) {
        self.set(value);
    }

    fn wait_for(&self, value: u64) {
        self.wait(value, Timeout::Forever)
            .expect("nothing fails this signal");
    }
}

/// The textbook baseline: a value under a mutex, and a condvar to wait on.
struct LockedCounter {
    value: Mutex<u64>,
    changed: Condvar,
}

impl Timeline for LockedCounter {
    fn new() -> Self {
        Self {
            value: Mutex::new(0),
            changed: Condvar::new(),
        }
    }

    fn raise(&self, value: u64) {
        let mut guard = self.value.lock();
        if *guard < value {
            *guard = value;
            self.changed.notify_all();
        }
    }

    fn wait_for(&self, value: u64) {
        let mut guard = self.value.lock();
        while *guard < value {
            self.changed.wait(&mut guard);
        }
    }
}

/// `iters` round trips: this thread raises `ping`, a partner thread waits
/// for it and raises `pong`, this thread waits for `pong`.
fn ping_pong<T: Timeline>(iters: u64) -> Duration {
    let ping = T::new();
    let pong = T::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for value in 1..=iters {
                ping.wait_for(value);
                pong.raise(value);
            }
        });
        let start = Instant::now();
        for value in 1..=iters {
            ping.raise(value);
            pong.wait_for(value);
        }
        start.elapsed()
    })
}

fn signal_wake(c: &mut Criterion) {
    let mut group = c.benchmark_group("signal_wake");
    support::configure(&mut group, Profile::Latency);
    group.bench_function("hwqueue", |b| b.iter_custom(ping_pong::<CpuSignal>));
    group.bench_function("parking_lot_condvar", |b| {
        b.iter_custom(ping_pong::<LockedCounter>)
    });
    group.finish();
}

/// `iters` round trips: this thread raises `ping`, a partner thread waits
/// for it and raises answer `value % answers` to `value`, this thread waits
/// for that answer: with `wait_any` over all answers when `any`, else (one
/// answer) with its `wait`.
fn ping_pong_any(iters: u64, answers: usize, any: bool) -> Duration {
    let ping = CpuSignal::new(0);
    let answer: Vec<CpuSignal> = (0..answers).map(|_| CpuSignal::new(0)).collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for value in 1..=iters {
                ping.wait(value, Timeout::Forever)
                    .expect("nothing fails this signal");
                answer[value as usize % answers].set(value);
            }
        });
        let mut waits: Vec<(&CpuSignal, u64)> = answer.iter().map(|s| (s, 0)).collect();
        let start = Instant::now();
        for value in 1..=iters {
            ping.set(value);
            if any {
                for wait in &mut waits {
                    wait.1 = value;
                }
                let fired = wait_any(&waits, Timeout::Forever).expect("nothing fails");
                assert_eq!(fired, value as usize % answers);
            } else {
                answer[0]
                    .wait(value, Timeout::Forever)
                    .expect("nothing fails this signal");
            }
        }
        start.elapsed()
    })
}

fn signal_wake_any(c: &mut Criterion) {
    let mut group = c.benchmark_group("signal_wake_any");
    support::configure(&mut group, Profile::Latency);
    group.bench_function("wait", |b| b.iter_custom(|n| ping_pong_any(n, 1, false)));
    group.bench_function("wait_any_2", |b| {
        b.iter_custom(|n| ping_pong_any(n, 2, true))
    });
    group.bench_function("wait_any_4", |b| {
        b.iter_custom(|n| ping_pong_any(n, 4, true))
    });
    group.finish();
}

criterion_group!(
    benches,
    signal_set,
    signal_wait_reached,
    signal_wake,
    signal_wake_any
);
criterion_main!(benches);
