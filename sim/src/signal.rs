//! [`SimSignal`]: a timeline signal written on hwqueue's public pieces
//! ([`Failures`], [`Producer`], [`SignalWaker`]), a mutex and a condition
//! variable: what a backend without a native signal writes.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hwqueue::multi_wait::SignalWaker;
use hwqueue::signal::{Failures, MAX_SIGNAL_VALUE, Producer, check_value};
use hwqueue::{Error, Result, TimelineSignal, Timeout};

use crate::memory::lock;

/// A simulated device's timeline signal. Clones name the same signal.
#[derive(Clone)]
pub struct SimSignal {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    producer: Producer,
}

#[derive(Default)]
struct State {
    value: u64,
    failures: Failures,
    watchers: Vec<SignalWaker>,
}

impl State {
    /// After a change: wakes blocked waits and `wait_all`/`wait_any`.
    fn changed(&self, condvar: &Condvar) {
        condvar.notify_all();
        for waker in &self.watchers {
            waker.wake();
        }
    }
}

impl SimSignal {
    /// A signal at `initial`.
    ///
    /// # Errors
    /// [`Error::SignalValueOutOfRange`] past [`MAX_SIGNAL_VALUE`].
    pub fn new(initial: u64) -> Result<Self> {
        check_value(initial)?;
        Ok(Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    value: initial,
                    ..State::default()
                }),
                changed: Condvar::new(),
                producer: Producer::new(),
            }),
        })
    }

    /// Sets the value even when lower: the broken engine
    /// ([`Defect::LowerSignal`](crate::Defect::LowerSignal)) does this.
    pub(crate) fn store_even_if_lower(&self, value: u64) {
        let mut state = lock(&self.inner.state);
        state.value = value;
        state.changed(&self.inner.changed);
    }
}

impl std::fmt::Debug for SimSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("SimSignal")
            .field("value", &state.value)
            .field("failed_up_to", &state.failures.highest())
            .finish()
    }
}

impl TimelineSignal for SimSignal {
    fn value(&self) -> u64 {
        lock(&self.inner.state).value
    }

    fn set(&self, value: u64) {
        assert!(
            value <= MAX_SIGNAL_VALUE,
            "signal value {value} is past MAX_SIGNAL_VALUE ({MAX_SIGNAL_VALUE})"
        );
        let mut state = lock(&self.inner.state);
        if value > state.value {
            state.value = value;
            state.failures.forget_reached(value);
            state.changed(&self.inner.changed);
        }
    }

    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        check_value(target)?;
        let start = Instant::now();
        let deadline = timeout.into().deadline_from(start);
        let mut state = lock(&self.inner.state);
        loop {
            if state.value >= target {
                return Ok(());
            }
            state.failures.check(target, state.value)?;
            state = match deadline {
                None => self
                    .inner
                    .changed
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::Timeout {
                            target,
                            current: state.value,
                            waited: now - start,
                        });
                    }
                    self.inner
                        .changed
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn fail(&self, upto: u64, cause: Error) {
        let mut state = lock(&self.inner.state);
        let value = state.value;
        if state.failures.record(value, upto, cause, value) {
            state.changed(&self.inner.changed);
        }
    }

    fn producer(&self) -> &Producer {
        &self.inner.producer
    }

    /// Always `true`: every raise and recorded failure wakes the watchers,
    /// under the lock that `value` and `wait` read through.
    fn watch(&self, waker: &SignalWaker) -> bool {
        lock(&self.inner.state).watchers.push(waker.clone());
        true
    }

    fn unwatch(&self, waker: &SignalWaker) {
        let mut state = lock(&self.inner.state);
        if let Some(at) = state.watchers.iter().position(|w| w.same_as(waker)) {
            state.watchers.swap_remove(at);
        }
    }
}
