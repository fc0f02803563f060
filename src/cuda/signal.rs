//! `CudaSignal`: a timeline signal on a ring of CUDA events.

use std::fmt;

use cudarc::driver::{CudaEvent, CudaStream, sys};

use crate::error::{Error, Result};
use crate::ring::{Dependency, EventRecorder, EventRing, RingEvent};
use crate::signal::{Producer, TimelineSignal, Timeout};
use crate::sync::Arc;

use super::{context_error, driver_error};

/// A timeline signal for the CUDA backend; also usable from any host thread.
///
/// A queue's `signal(s, v)` records a CUDA event on its stream into one of
/// [`RING_SLOTS`](crate::ring::RING_SLOTS) slots; `value()` is the highest
/// value whose event has **completed** (or that the host `set`): a recorded
/// value is not reached until the GPU finished the work before it. Events are
/// reused, never destroyed or re-recorded under a waiter, and created with
/// `CU_EVENT_BLOCKING_SYNC`, so an unbounded host `wait` sleeps instead of
/// spinning. See [`EventRing`] for the protocol.
///
/// A signal needs no device: any queue of any CUDA device may signal it or
/// wait on it (a wait on another device's event is still a device-side
/// `cuStreamWaitEvent`).
///
/// It keeps [`TimelineSignal::watch`]'s default: [`wait_all`](crate::wait_all)
/// and [`wait_any`](crate::wait_any) poll it with a bounded back-off
/// (10 µs doubling to 1 ms), since its value moves when the GPU completes an
/// event, with no host thread there to wake a waiter.
#[derive(Clone)]
pub struct CudaSignal {
    ring: Arc<EventRing<SignalEvent>>,
}

/// The flags of every event hwqueue creates (signal rings, batch
/// completion): timing off, so a record writes no timestamp and a query is
/// a flag test. cudarc's flag enum cannot express timing off *and* blocking
/// sync together (`CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC`), so
/// a host's unbounded wait (`cuEventSynchronize`) spins instead of
/// sleeping; finite waits poll with back-off either way. Which of the two
/// costs less on a real GPU is not measured yet (this task had none): the
/// `cuda_signal` bench's baseline uses the same flags.
pub(crate) const EVENT_FLAGS: sys::CUevent_flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;

/// A CUDA event in a signal's ring.
pub(crate) struct SignalEvent(CudaEvent);

impl SignalEvent {
    pub(crate) fn event(&self) -> &CudaEvent {
        &self.0
    }

    /// A driver error of this event, as an [`Error`](crate::Error): a
    /// sticky one marks its device lost (see `device_error`).
    fn fault(&self, what: &str, error: cudarc::driver::DriverError) -> crate::Error {
        context_error(self.0.context(), what, error)
    }
}

impl RingEvent for SignalEvent {
    fn is_complete(&self) -> Result<bool> {
        self.0
            .try_is_complete()
            .map_err(|e| self.fault("querying a signal's event", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.0
            .synchronize()
            .map_err(|e| self.fault("waiting for a signal's event", e))
    }
}

/// Records signal events on one stream.
pub(crate) struct StreamRecorder<'a> {
    pub(crate) stream: &'a std::sync::Arc<CudaStream>,
}

impl EventRecorder<SignalEvent> for StreamRecorder<'_> {
    fn create(&mut self) -> Result<SignalEvent> {
        self.stream
            .context()
            .new_event(Some(EVENT_FLAGS))
            .map(SignalEvent)
            .map_err(|e| driver_error("creating a signal's event", e))
    }

    /// An event records only on a stream of its own context.
    fn accepts(&self, event: &SignalEvent) -> bool {
        **event.0.context() == **self.stream.context()
    }

    fn record(&mut self, event: &SignalEvent) -> Result<()> {
        event
            .0
            .record(self.stream)
            .map_err(|e| driver_error("recording a signal's event", e))
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
