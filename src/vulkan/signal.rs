//! [`VulkanSignal`]: a timeline semaphore, with the core's failure record
//! beside it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ash::vk;
use parking_lot::{Condvar, Mutex};

use super::context::Context;
use crate::error::{Error, Result};
use crate::signal::{Failures, MAX_SIGNAL_VALUE, Producer, TimelineSignal, Timeout, check_value};

/// A Vulkan timeline semaphore as a hwqueue signal. Clones name the same
/// semaphore.
///
/// - `value` is the semaphore's counter (`vkGetSemaphoreCounterValue`);
/// - `set` signals it from the host (`vkSignalSemaphore`), where higher;
/// - `wait` is `vkWaitSemaphores`, in slices of at most a millisecond so
///   that a failure recorded on the host (a batch that will never signal
///   the value) wakes it with [`Error::SignalFailed`];
/// - a queue's `wait` on it is a semaphore wait in the submission, made
///   once a submission that signals the value is on a `VkQueue` (until
///   then the queue holds the batch on the host: a wait no signal was
///   submitted for would stall every later submission of a shared
///   `VkQueue`).
///
/// Only a queue of the device handle that made it may `signal` it
/// (another's refuses the batch with [`Error::DeviceMismatch`]); a queue
/// of another device handle, or of another backend, may `wait` on it (the
/// host waits for it there).
///
/// The semaphore is destroyed with the last clone; queues hold a clone
/// for every batch that waits on or signals it until the batch completed.
#[derive(Clone)]
pub struct VulkanSignal {
    inner: Arc<Inner>,
}

/// The counters beside the semaphore's own, which together keep values
/// rising when the host `set`s a value while a queue's signal of the
/// semaphore is pending (Vulkan forbids a host signal at or above a
/// pending signal's value, VUID-VkSemaphoreSignalInfo-value-03259, and the
/// pending signal would then lower the counter):
///
/// | field | meaning | written | ordering |
/// |-------|---------|---------|----------|
/// | `submitted` | the highest value the semaphore will reach: some submission on a `VkQueue` signals it, or the host set it | `note_submitted`, `set` | `AcqRel` `fetch_max`; read `Acquire` by `is_submitted` |
/// | `queued` | the highest value a queue's submission signals, raised *before* the submission | `note_queued`, under `state`'s lock | `AcqRel`; read under the lock where it decides |
/// | `deferred` | a host `set` not yet signalled (0: none), because a queue's signal was pending; signalled once every queue signal completed and none reaches it (`apply_deferred`), which may wait for a kept-back batch: no device wait waits for it (`wait_submitted`) | `set`, `apply_deferred`, under the lock | `AcqRel`; `value()` reads it `Acquire` (values seen only rise) |
struct Inner {
    context: Arc<Context>,
    semaphore: vk::Semaphore,
    submitted: AtomicU64,
    /// The highest value a submission on a `VkQueue` signals: `submitted`
    /// without the host `set`s deferred behind one (which no submission
    /// signals; `apply_deferred` does, once the queue's signals completed).
    signalled: AtomicU64,
    queued: AtomicU64,
    deferred: AtomicU64,
    /// A floor of the counter that costs no driver call: the initial
    /// value, raised by each read `check_value_difference` makes where the
    /// floor was too far (`fetch_max`, `Relaxed`: a stale floor only sends
    /// a check to the driver).
    observed: AtomicU64,
    /// The failures, and host `set`s serialised (a signal operation must
    /// raise the counter).
    state: Mutex<Failures>,
    changed: Condvar,
    producer: Producer,
}

impl VulkanSignal {
    pub(super) fn new(context: Arc<Context>, initial: u64) -> Result<Self> {
        check_value(initial)?;
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(initial);
        let create = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
        // SAFETY: `create` and its chain live across the call; the device
        // outlives the semaphore (the signal holds the context).
        let semaphore = unsafe { context.device.create_semaphore(&create, None) }
            .map_err(|e| context.error("vkCreateSemaphore (timeline)", e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                context,
                semaphore,
                submitted: AtomicU64::new(initial),
                signalled: AtomicU64::new(initial),
                queued: AtomicU64::new(0),
                deferred: AtomicU64::new(0),
                observed: AtomicU64::new(initial),
                state: Mutex::new(Failures::default()),
                changed: Condvar::new(),
                producer: Producer::new(),
            }),
        })
    }

    /// The semaphore, for a submission of the same device.
    pub(super) fn semaphore(&self) -> vk::Semaphore {
        self.inner.semaphore
    }

    /// The spec of the device that made it, for messages.
    pub(super) fn device_spec(&self) -> &str {
        &self.inner.context.spec
    }

    /// Whether the signal is of `context`'s device.
    #[inline]
    pub(super) fn is_of(&self, context: &Arc<Context>) -> bool {
        Arc::ptr_eq(&self.inner.context, context)
    }

    /// Whether the semaphore holds `value`, or a submission on a `VkQueue`
    /// signals it or more.
    pub(super) fn is_submitted(&self, value: u64) -> bool {
        self.inner.submitted.load(Ordering::Acquire) >= value || self.is_reached(value)
    }

    /// The highest value a submission on a `VkQueue` signals (or the
    /// initial value); not a host `set` deferred behind one.
    pub(super) fn submitted(&self) -> u64 {
        self.inner.signalled.load(Ordering::Acquire)
    }

    /// Says that a submission on a `VkQueue` is about to signal `value`,
    /// before it is made, so that a host `set` from then on defers rather
    /// than signal below it; `false` (submit no signal) where the value is
    /// reached or promised already, by a host `set` too: values only rise.
    pub(super) fn note_queued(&self, value: u64) -> bool {
        let _state = self.inner.state.lock();
        if self.is_submitted(value) {
            return false;
        }
        self.inner.queued.fetch_max(value, Ordering::AcqRel);
        true
    }

    /// The semaphore's own counter (`vkGetSemaphoreCounterValue`); 0 on a
    /// lost device.
    pub(super) fn counter(&self) -> u64 {
        // SAFETY: the semaphore is alive (we hold it) and a timeline one.
        unsafe {
            self.inner
                .context
                .device
                .get_semaphore_counter_value(self.inner.semaphore)
        }
        .unwrap_or(0)
    }

    /// `Err` where `value` is further above the counter than the device
    /// allows between values of one timeline semaphore. Against the
    /// highest counter value seen first, which costs no driver call; the
    /// counter itself is read only where that floor is too far.
    pub(super) fn check_value_difference(&self, value: u64) -> Result<()> {
        let context = &self.inner.context;
        let floor = self.inner.observed.load(Ordering::Relaxed);
        context.check_value_difference(value, floor).or_else(|_| {
            let counter = self.counter();
            self.inner.observed.fetch_max(counter, Ordering::Relaxed);
            context.check_value_difference(value, counter)
        })
    }

    /// Signals a host `set` deferred while a queue's signal was pending,
    /// once every queue signal of the semaphore completed and none will
    /// reach it; forgets it once the counter reached it. The retire
    /// thread calls it for each signal of a batch that retired.
    pub(super) fn apply_deferred(&self) {
        // Under the lock even when nothing is deferred: a `set` that read
        // the counter short of a pending signal defers under it, and must
        // not store after this look, once that signal completed.
        let _state = self.inner.state.lock();
        let deferred = self.inner.deferred.load(Ordering::Acquire);
        if deferred == 0 {
            return;
        }
        let counter = self.counter();
        if counter >= deferred {
            self.inner.deferred.store(0, Ordering::Release);
            return;
        }
        // A queue's signal at or past it will raise the counter there.
        let queued = self.inner.queued.load(Ordering::Acquire);
        if queued >= deferred || counter < queued {
            return;
        }
        // `deferred` is above the counter and no queue signal is pending
        // (every one queued completed), and none can be queued meanwhile
        // (`note_queued` takes the lock held).
        if self.signal_from_host(deferred).is_ok() {
            self.inner.deferred.store(0, Ordering::Release);
        }
    }

    /// `vkSignalSemaphore` to `value`, in steps of at most the device's
    /// `maxTimelineSemaphoreValueDifference` (at least 2^31 - 1) from the
    /// counter where the jump is larger. The caller holds the state lock,
    /// `value` is above the counter and no queue signal of the semaphore
    /// is pending.
    fn signal_from_host(&self, value: u64) -> std::result::Result<(), vk::Result> {
        let max = self
            .inner
            .context
            .max_value_difference
            .load(Ordering::Relaxed)
            .max(1);
        let mut counter = self.counter();
        loop {
            let next = if value - counter > max {
                counter + max
            } else {
                value
            };
            let info = vk::SemaphoreSignalInfo::default()
                .semaphore(self.inner.semaphore)
                .value(next);
            // SAFETY: the semaphore is alive; `next` is above its counter
            // by at most the device's difference, and no queue signal is
            // pending (the caller's conditions).
            unsafe { self.inner.context.device.signal_semaphore(&info) }?;
            if next == value {
                return Ok(());
            }
            counter = next;
        }
    }

    /// Says that a value noted queued ([`note_queued`](Self::note_queued))
    /// will not be submitted after all (its submission failed, or the
    /// failure of its batch came first): the queue, the signal's only
    /// producer, has promised no more than it submitted, so a host `set`
    /// is no longer deferred behind it.
    pub(super) fn note_dropped(&self) {
        let _state = self.inner.state.lock();
        let submitted = self.inner.signalled.load(Ordering::Acquire);
        self.inner.queued.store(submitted, Ordering::Release);
    }

    /// Says that a submission on a `VkQueue` signals `value`.
    pub(super) fn note_submitted(&self, value: u64) {
        self.inner.signalled.fetch_max(value, Ordering::AcqRel);
        self.inner.submitted.fetch_max(value, Ordering::AcqRel);
        let _state = self.inner.state.lock();
        self.inner.changed.notify_all();
    }

    /// Blocks until a submission that signals `value` is on a `VkQueue`,
    /// or the semaphore holds it (`Ok(true)`: a semaphore wait for it may
    /// then be submitted without stalling the queue behind it), or a host
    /// `set` deferred behind a queue's pending signal reached it
    /// (`Ok(false)`: no device wait). A device wait must not wait for a
    /// deferred set: the semaphore gets there only once `apply_deferred`
    /// signals it, when the batch of the pending signal retires, and a
    /// batch kept back on its owner's thread (`Recorder::deferred`)
    /// retires only at that queue's next hand-over, which may never come
    /// (its owner waiting for this queue). Every host waiter sees it
    /// reached at once (`value`), and so does this queue.
    ///
    /// # Errors
    /// [`Error::SignalFailed`] when the work that would signal it failed.
    pub(super) fn wait_submitted(&self, value: u64) -> Result<bool> {
        let mut failures = self.inner.state.lock();
        loop {
            if self.is_submitted(value) {
                // Under the lock `set` defers under: a set that raised
                // `submitted` to `value` is seen here with its `deferred`.
                // (One applied meanwhile cleared `deferred` once the
                // counter held it: the device wait then waits for nothing.)
                return Ok(self.inner.deferred.load(Ordering::Acquire) < value);
            }
            failures.check(value, self.value())?;
            // Nothing more is submitted on a lost device.
            self.inner.context.health()?;
            // A host `set` or a failure notifies; the timeout catches a
            // value reached by another process's work.
            self.inner
                .changed
                .wait_for(&mut failures, Duration::from_millis(1));
        }
    }
}

impl std::fmt::Debug for VulkanSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanSignal")
            .field("device", &self.inner.context.spec)
            .field("value", &self.value())
            .field("submitted", &self.inner.submitted.load(Ordering::Relaxed))
            .finish()
    }
}

impl TimelineSignal for VulkanSignal {
    /// The semaphore's counter, or a host `set` above it that waits for
    /// a pending queue signal to complete first (see `Inner`): values
    /// seen only rise.
    fn value(&self) -> u64 {
        let deferred = self.inner.deferred.load(Ordering::Acquire);
        self.counter().max(deferred)
    }

    /// A jump further than the device's `maxTimelineSemaphoreValueDifference`
    /// is made in steps of that size (`signal_from_host`), under the
    /// signal's lock: on a device at the spec's minimum (2^31 - 1) a jump
    /// of 2^40 is 512 host signals, and one of 2^62 billions (minutes).
    /// Keep a timeline's values within a few limits of each other.
    fn set(&self, value: u64) {
        assert!(
            value <= MAX_SIGNAL_VALUE,
            "signal value {value} is past MAX_SIGNAL_VALUE ({MAX_SIGNAL_VALUE})"
        );
        let mut failures = self.inner.state.lock();
        if value <= self.value() {
            return;
        }
        if self.inner.queued.load(Ordering::Acquire) > self.counter() {
            // A queue's signal is pending: Vulkan forbids a host signal at
            // or above it, and it would lower the counter after this one.
            // Seen at once (`value`), signalled once the pending signals
            // completed (`apply_deferred`).
            self.inner.deferred.fetch_max(value, Ordering::AcqRel);
            failures.forget_reached(value);
            self.inner.submitted.fetch_max(value, Ordering::AcqRel);
            self.inner.changed.notify_all();
            return;
        }
        // The value is above the counter, checked under the lock every host
        // `set` takes, and no queue signal is pending (one queued from now
        // on is noted under the same lock first, and the recorder does not
        // queue a value at or below `submitted`).
        if self.signal_from_host(value).is_ok() {
            failures.forget_reached(value);
            self.inner.submitted.fetch_max(value, Ordering::AcqRel);
            self.inner.changed.notify_all();
        }
    }

    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        check_value(target)?;
        let start = Instant::now();
        let deadline = timeout.into().deadline_from(start);
        // A host `fail` cannot wake a thread inside `vkWaitSemaphores`, so
        // the wait looks at the failures between slices of this length: a
        // failure is seen within it, and a value reached ends the slice at
        // once (shorter first slices cost a roundtrip a second wait).
        let slice = Duration::from_millis(1);
        loop {
            let current = self.value();
            if current >= target {
                return Ok(());
            }
            self.inner.state.lock().check(target, current)?;
            // A lost device reaches nothing more: its loss, not a timeout.
            self.inner.context.health()?;
            let now = Instant::now();
            let step = match deadline {
                Some(deadline) if now >= deadline => {
                    return Err(Error::Timeout {
                        target,
                        current,
                        waited: now - start,
                    });
                }
                Some(deadline) => slice.min(deadline - now),
                None => slice,
            };
            let semaphores = [self.inner.semaphore];
            let values = [target];
            let info = vk::SemaphoreWaitInfo::default()
                .semaphores(&semaphores)
                .values(&values);
            // SAFETY: the semaphore is alive; the arrays live across the call.
            match unsafe {
                self.inner
                    .context
                    .device
                    .wait_semaphores(&info, step.as_nanos() as u64)
            } {
                // Reached: no second look at the counter (each is a lock
                // the driver's queue thread may hold).
                Ok(()) => return Ok(()),
                Err(vk::Result::TIMEOUT) => {}
                Err(e) => return Err(self.inner.context.error("vkWaitSemaphores", e)),
            }
        }
    }

    fn fail(&self, upto: u64, cause: Error) {
        let mut failures = self.inner.state.lock();
        let value = self.value();
        // Values a submission will signal are decided by that submission.
        let above = value.max(self.inner.submitted.load(Ordering::Acquire));
        if failures.record(above, upto, cause, value) {
            self.inner.changed.notify_all();
        }
    }

    fn producer(&self) -> &Producer {
        &self.inner.producer
    }

    /// `vkWaitSemaphores` over every semaphore of `waits` (with
    /// `VK_SEMAPHORE_WAIT_ANY_BIT` unless `all`), where they are of one
    /// device; `false` where they are not, or the call failed.
    fn wait_native(waits: &[(&Self, u64)], all: bool, timeout: Duration) -> bool {
        let Some((first, _)) = waits.first() else {
            return false;
        };
        let context = &first.inner.context;
        if waits
            .iter()
            .any(|(signal, _)| !Arc::ptr_eq(&signal.inner.context, context))
        {
            return false;
        }
        let semaphores: Vec<vk::Semaphore> = waits.iter().map(|(s, _)| s.inner.semaphore).collect();
        let values: Vec<u64> = waits.iter().map(|&(_, value)| value).collect();
        let flags = if all {
            vk::SemaphoreWaitFlags::empty()
        } else {
            vk::SemaphoreWaitFlags::ANY
        };
        let info = vk::SemaphoreWaitInfo::default()
            .flags(flags)
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: every semaphore is alive (the caller holds the signals)
        // and of `context`'s device; the arrays live across the call.
        let waited = unsafe {
            context
                .device
                .wait_semaphores(&info, timeout.as_nanos().min(u128::from(u64::MAX)) as u64)
        };
        matches!(waited, Ok(()) | Err(vk::Result::TIMEOUT))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the last handle is going; every batch that used the
        // semaphore held a handle until it completed, so no pending
        // submission names it.
        unsafe { self.context.device.destroy_semaphore(self.semaphore, None) };
    }
}
