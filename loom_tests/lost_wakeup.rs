//! DESIGN.md's first mistake, kept as a model loom must reject: a signal
//! that raises its atomic and calls `notify_all` without taking the mutex
//! its waiters check under. A waiter between its check and its park misses
//! the notify and sleeps forever; loom finds the deadlock.
//!
//! The same algorithm with the mutex hand-off (take and drop the lock
//! between the raise and the notify) passes, so the failure is the bug's,
//! not the model's.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Condvar, Mutex};
use loom::thread;

use crate::model;

/// The old CPU signal, reduced to its wake-up protocol. `HANDOFF` chooses
/// the fixed (`true`) or the broken (`false`) `set`.
struct OldSignal<const HANDOFF: bool> {
    value: AtomicU64,
    lock: Mutex<()>,
    parked: Condvar,
}

impl<const HANDOFF: bool> OldSignal<HANDOFF> {
    fn new() -> Self {
        Self {
            value: AtomicU64::new(0),
            lock: Mutex::new(()),
            parked: Condvar::new(),
        }
    }

    fn set(&self, value: u64) {
        self.value.fetch_max(value, Ordering::SeqCst);
        if HANDOFF {
            // Cannot get the lock while a waiter is between its check and
            // its park: the notify below reaches it.
            drop(self.lock.lock().unwrap());
        }
        self.parked.notify_all();
    }

    fn wait(&self, target: u64) {
        let mut guard = self.lock.lock().unwrap();
        while self.value.load(Ordering::SeqCst) < target {
            guard = self.parked.wait(guard).unwrap();
        }
    }
}

fn setter_and_waiter<const HANDOFF: bool>() {
    model(None, || {
        // Leaked, not a loom `Arc`: when loom aborts the deadlocked
        // execution, unwinding a loom `Arc` would abort the whole process
        // instead of failing this test.
        let signal: &'static OldSignal<HANDOFF> = Box::leak(Box::new(OldSignal::new()));
        let setter = thread::spawn(move || signal.set(1));
        signal.wait(1);
        setter.join().unwrap();
    });
}

/// loom must find the lost wake-up: the model deadlocks.
#[test]
#[should_panic(expected = "deadlock")]
fn notify_without_the_lock_loses_a_wakeup() {
    setter_and_waiter::<false>();
}

/// The twin with the hand-off: no interleaving loses the wake-up.
#[test]
fn notify_after_the_lock_handoff_wakes_the_waiter() {
    setter_and_waiter::<true>();
}
