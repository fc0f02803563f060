//! `CudaSignal`: a timeline signal on a ring of CUDA events.

use std::fmt;
use std::mem::ManuallyDrop;

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};

use crate::error::{Error, Result};
use crate::ring::{Dependency, EventRecorder, EventRing, RingEvent};
use crate::signal::{Producer, TimelineSignal, Timeout};
use crate::sync::Arc;
use crate::wait_policy::WaitTuning;

use super::context_error;
use super::entry::{Entries, entries};

/// A timeline signal for the CUDA backend; also usable from any host thread.
///
/// A queue's `signal(s, v)` records a CUDA event on its stream into one of
/// [`RING_SLOTS`](crate::ring::RING_SLOTS) slots; `value()` is the highest
/// value whose event has **completed** (or that the host `set`): a recorded
/// value is not reached until the GPU finished the work before it. Events are
/// reused, never destroyed or re-recorded under a waiter, and created with
/// `CU_EVENT_BLOCKING_SYNC`. See [`EventRing`] for the protocol.
///
/// A host `wait` (and [`wait_all`](crate::wait_all),
/// [`wait_any`](crate::wait_any), and a CPU queue's `wait_foreign` on this
/// signal) follows the [`WaitPolicy`](crate::WaitPolicy) of the device
/// whose event it waits on ([`CudaDevice::set_wait_policy`](super::CudaDevice::set_wait_policy)):
/// by default it polls the event for a short budget that adapts to the
/// device's recent waits (20–200 µs), then sleeps in the driver, since
/// waking a thread asleep on a blocking-sync event costs about 40 µs on an
/// H200; a value failed or set on the host meanwhile ends the spin. See
/// [`crate::wait_policy`].
///
/// A signal needs no device: any queue of any CUDA device may signal it or
/// wait on it (a wait on another device's event is still a device-side
/// `cuStreamWaitEvent`).
///
/// It keeps [`TimelineSignal::watch`]'s default: after their spin,
/// [`wait_all`](crate::wait_all) and [`wait_any`](crate::wait_any) poll it
/// with a bounded back-off (10 µs doubling to 1 ms), since its value moves
/// when the GPU completes an event, with no host thread there to wake a
/// waiter.
#[derive(Clone)]
pub struct CudaSignal {
    ring: Arc<EventRing<SignalEvent>>,
}

/// The flags of a signal's events: timing off, so a record writes no
/// timestamp and a query is a flag test, and blocking sync, so a host
/// thread that waits past its spin (`cuEventSynchronize`) sleeps in the
/// driver instead of spinning a core (the spin before it is hwqueue's own:
/// [`crate::wait_policy`]). cudarc's flag type is an enum that
/// cannot hold both bits, which is why [`SignalEvent`] creates its event
/// itself.
pub(crate) const SIGNAL_EVENT_FLAGS: u32 = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
    | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;

/// The flags of the events hwqueue only queries or orders streams with
/// (batch completion, allocation fences): timing off. No host thread
/// blocks on them.
pub(crate) const EVENT_FLAGS: sys::CUevent_flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;

/// A CUDA event in a signal's ring, created with [`SIGNAL_EVENT_FLAGS`].
pub(crate) struct SignalEvent {
    event: sys::CUevent,
    /// Let go in `Drop`, inside the context (see `in_context`).
    context: ManuallyDrop<std::sync::Arc<CudaContext>>,
    /// The driver's record and query, called directly.
    entries: &'static Entries,
}

// SAFETY: a `CUevent` is a handle the driver lets any thread use (every
// call below but the query, which needs none, binds the event's context
// first); the handle is destroyed only by `Drop`, once.
unsafe impl Send for SignalEvent {}
// SAFETY: as above: the driver's event calls are thread-safe, and no method
// mutates the handle itself.
unsafe impl Sync for SignalEvent {}

impl SignalEvent {
    /// A new event in `context`.
    fn new(context: &std::sync::Arc<CudaContext>) -> Result<Self> {
        let entries = entries()?;
        let fail = |e| context_error(context, "creating a signal's event", e);
        context.bind_to_thread().map_err(fail)?;
        let mut event = std::ptr::null_mut();
        // SAFETY: the context is bound to this thread; the call writes one
        // handle, owned from here by the returned value.
        unsafe { sys::cuEventCreate(&mut event, SIGNAL_EVENT_FLAGS) }
            .result()
            .map_err(fail)?;
        Ok(Self {
            event,
            context: ManuallyDrop::new(context.clone()),
            entries,
        })
    }

    /// Makes `stream` wait, on the device, until the event completes, and
    /// leaves the stream's context current: its queue's enqueue makes that
    /// context current once and then calls the driver with it (launches,
    /// copies, event records) for the rest of the batch.
    pub(crate) fn order_before(&self, stream: &CudaStream) -> std::result::Result<(), DriverError> {
        let same = **self.context == **stream.context();
        if !same {
            self.context.bind_to_thread()?;
        }
        // SAFETY: both handles are alive (the stream by the borrow, the
        // event until `Drop`); a stream may wait on an event of any context.
        let waited = unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.event, 0) }.result();
        if !same {
            stream.context().bind_to_thread()?;
        }
        waited
    }

    /// A driver error of this event, as an [`Error`](crate::Error): a
    /// sticky one marks its device lost (see `device_error`).
    fn fault(&self, what: &str, error: DriverError) -> crate::Error {
        context_error(&self.context, what, error)
    }
}

/// Runs `f` with `context` current on this thread, then makes current
/// again the context that was (if it was another): a signal's event may be
/// dropped or waited on in the middle of a queue's enqueue of another
/// device, which made its stream's context current once for the whole
/// batch (a ring replacing a done slot's event of another device, a
/// wait's handle let go, a full ring waiting for its oldest event).
///
/// `f` runs whatever happens, told whether `context` could be made
/// current (`Err`: why not; where even the current context could not be
/// read, none is bound, and none restored): a handle to let go must go
/// then too, or it leaks for the process.
///
/// `context` is a handle: one given by value (an `Arc`) is let go before
/// the restore, since cudarc's drop of a context's last handle makes the
/// context current to release it, and leaves it current.
fn in_context<C: std::ops::Deref<Target = CudaContext>, T>(
    context: C,
    f: impl FnOnce(std::result::Result<(), DriverError>) -> std::result::Result<T, DriverError>,
) -> std::result::Result<T, DriverError> {
    let own = context.cu_ctx();
    let mut previous = std::ptr::null_mut();
    // SAFETY: the call writes one handle (null: none current).
    if let Err(error) = unsafe { sys::cuCtxGetCurrent(&mut previous) }.result() {
        let outcome = f(Err(error));
        drop(context);
        return outcome;
    }
    let outcome = f(context.bind_to_thread());
    drop(context);
    if previous != own {
        // SAFETY: `previous` was current on this thread just now (or is
        // null, which leaves none current); a context outlives the
        // handles of it that the thread's caller holds.
        unsafe { sys::cuCtxSetCurrent(previous) }.result()?;
    }
    outcome
}

impl Drop for SignalEvent {
    fn drop(&mut self) {
        // SAFETY: the field is taken once, here, and not used after.
        let context = unsafe { ManuallyDrop::take(&mut self.context) };
        let event = self.event;
        // The handle goes inside `in_context`, before the caller's context
        // is current again (see there); where its context cannot be made
        // current, it goes all the same, by its handle, as cudarc's own
        // events do: kept, it would be lost for the process.
        let _ = in_context(context, |bound| {
            // SAFETY: the event was created by `new` and is destroyed only
            // here; the driver lets an event be destroyed while recorded
            // work is still pending (it is released once that completes).
            let destroyed = unsafe { sys::cuEventDestroy_v2(event) }.result();
            bound.and(destroyed)
        });
    }
}

impl RingEvent for SignalEvent {
    /// A query needs no context current (as cudarc's
    /// `CudaEvent::try_is_complete`, which the stream's retirement uses,
    /// relies on too): a poll is one driver call, without the
    /// `cuCtxGetCurrent` (and possibly `cuCtxSetCurrent`) of a bind.
    fn is_complete(&self) -> Result<bool> {
        let fail = |e| self.fault("querying a signal's event", e);
        // SAFETY: the event is alive until `Drop`; a query only reads it.
        // The pointer is the driver's `cuEventQuery` (`super::entry`).
        match unsafe { (self.entries.event_query)(self.event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            error => Err(fail(DriverError(error))),
        }
    }

    /// The tuning of the event's device (by its context's ordinal).
    fn wait_tuning(&self) -> Option<&'static WaitTuning> {
        Some(wait_tuning(self.context.ordinal()))
    }

    /// The caller's current context stays current (see `in_context`).
    fn synchronize(&self) -> Result<()> {
        let fail = |e| self.fault("waiting for a signal's event", e);
        // Only with its context current: a wait has nothing to let go.
        in_context(&**self.context, |bound| {
            bound?;
            // SAFETY: the event is alive until `Drop`; the call blocks
            // (sleeping: `CU_EVENT_BLOCKING_SYNC`) until it completes.
            unsafe { sys::cuEventSynchronize(self.event) }.result()
        })
        .map_err(fail)
    }
}

/// The most device ordinals with a tuning of their own; devices past them
/// share one.
const TUNED_DEVICES: usize = 64;

/// The [`WaitTuning`] of CUDA device `ordinal`: one per device for the
/// whole process, like its primary context, so every handle and every
/// signal event of the device share its policy and its average wait.
pub(crate) fn wait_tuning(ordinal: usize) -> &'static WaitTuning {
    static TUNINGS: [WaitTuning; TUNED_DEVICES + 1] =
        [const { WaitTuning::new() }; TUNED_DEVICES + 1];
    &TUNINGS[ordinal.min(TUNED_DEVICES)]
}

/// Records signal events on one stream.
pub(crate) struct StreamRecorder<'a> {
    pub(crate) stream: &'a std::sync::Arc<CudaStream>,
}

impl EventRecorder<SignalEvent> for StreamRecorder<'_> {
    fn create(&mut self) -> Result<SignalEvent> {
        SignalEvent::new(self.stream.context())
    }

    /// An event records only on a stream of its own context. (The handle
    /// first: an event made for this stream holds a clone of its
    /// context's.)
    #[inline]
    fn accepts(&self, event: &SignalEvent) -> bool {
        let context = self.stream.context();
        std::sync::Arc::ptr_eq(&event.context, context) || **event.context == **context
    }

    /// The stream's context is current: its queue's enqueue made it so
    /// (the only caller), and `accepts` holds the event to that context.
    #[inline]
    fn record(&mut self, event: &SignalEvent) -> Result<()> {
        // A sticky error marks the device lost, as a launch's does.
        let fail = |e| context_error(self.stream.context(), "recording a signal's event", e);
        // SAFETY: the event (alive until its `Drop`) and the stream are of
        // one context (`accepts`), bound to this thread. The pointer is the
        // driver's `cuEventRecord` (`super::entry`).
        unsafe { (event.entries.event_record)(event.event, self.stream.cu_stream()) }
            .result()
            .map_err(fail)
    }
}

impl CudaSignal {
    /// A new signal at `initial`, with no event recorded.
    ///
    /// # Panics
    /// If `initial` exceeds [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE).
    pub fn new(initial: u64) -> Self {
        Self {
            ring: Arc::new(EventRing::new(initial)),
        }
    }

    /// Whether two handles name the same signal.
    pub fn same_as(&self, other: &CudaSignal) -> bool {
        Arc::ptr_eq(&self.ring, &other.ring)
    }

    pub(crate) fn record(&self, value: u64, stream: &std::sync::Arc<CudaStream>) -> Result<()> {
        self.ring.record(value, &mut StreamRecorder { stream })
    }

    pub(crate) fn dependency(&self, value: u64) -> Result<Option<Dependency<SignalEvent>>> {
        self.ring.dependency(value)
    }

    pub(crate) fn wait_dependency(&self, value: u64) -> Result<Dependency<SignalEvent>> {
        self.ring.wait_dependency(value, Timeout::Forever)
    }

    /// [`wait_dependency`](Self::wait_dependency) for at most `slice`
    /// ([`Error::Timeout`] then).
    pub(crate) fn wait_dependency_for(
        &self,
        value: u64,
        slice: std::time::Duration,
    ) -> Result<Dependency<SignalEvent>> {
        self.ring.wait_dependency(value, slice)
    }

    /// Fails `value` although its event is recorded: the work before it
    /// was abandoned on the device (see [`EventRing::abandon`]).
    #[cfg(feature = "nccl")]
    pub(crate) fn abandon(&self, value: u64, cause: Error) {
        self.ring.abandon(value, cause);
    }

    /// The event a settled wait on `value`, failed by an abandon, orders
    /// after on the device (see [`EventRing::given_up`]).
    pub(crate) fn given_up(&self, value: u64) -> Option<crate::sync::Arc<SignalEvent>> {
        self.ring.given_up(value)
    }
}

impl TimelineSignal for CudaSignal {
    fn value(&self) -> u64 {
        self.ring.value()
    }

    fn set(&self, value: u64) {
        self.ring.set(value);
    }

    fn is_reached(&self, target: u64) -> bool {
        self.ring.is_reached(target)
    }

    fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
        self.ring.wait(target, timeout)
    }

    fn fail(&self, upto: u64, cause: Error) {
        self.ring.fail(upto, cause);
    }

    /// The tuning of the device of the event a wait for `target` waits
    /// on (see [`EventRing::wait_tuning`]).
    fn wait_tuning(&self, target: u64) -> Option<&'static WaitTuning> {
        self.ring.wait_tuning(target)
    }

    fn producer(&self) -> &Producer {
        self.ring.producer()
    }
}

impl Default for CudaSignal {
    fn default() -> Self {
        Self::new(0)
    }
}

impl fmt::Debug for CudaSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CudaSignal").field(&self.ring).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24, defect 10: the docs promised `CU_EVENT_BLOCKING_SYNC`,
    /// but a signal's events were created with timing off only, so a host
    /// thread in `wait(Forever)` spun a core.
    #[test]
    fn signal_events_sleep_a_waiter_and_write_no_timestamp() {
        let blocking = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        let no_timing = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        assert_eq!(SIGNAL_EVENT_FLAGS, blocking | no_timing);
        assert_ne!(blocking, 0);
        // The other events are only queried or ordered on: timing off.
        assert_eq!(EVENT_FLAGS as u32, no_timing);
    }
}
