//! The timing of a profiled CUDA queue's commands (see
//! [`profile`](crate::profile)).
//!
//! While profiling is on, each command enqueued is bracketed by two events
//! *with timing enabled*, recorded on the queue's stream (the signal ring's
//! events keep timing off: they are on every path, these only while
//! profiling). Their times are read with `cuEventElapsedTime` against a
//! reference event, recorded and waited for when profiling was turned on,
//! whose host time ([`now_ns`]) is taken right after the wait returns: the
//! event completed before that instant, so the device's spans land on the
//! host timeline never earlier than they ran (a span never starts before
//! the host submitted its work), and later by at most the latency of that
//! one wait (so a span's end may pass the host time at which a
//! `synchronize` after it returned, by that latency; its start does not,
//! for any kernel longer than the latency). `cuEventElapsedTime` has about half a microsecond of resolution
//! and answers in an `f32` of milliseconds: so each span's duration is read
//! between its own two events (exact to that resolution however long the
//! queue has profiled), and only its start is placed against the
//! reference, to the microsecond for about 16 s after it and more coarsely
//! later (7.8 µs from about 65 s, 15.6 µs from about 131 s).
//!
//! A wait the stream cannot express blocks the queue's worker on the host;
//! that span is timed with the host clock.

use cudarc::driver::{CudaEvent, CudaStream, sys};

use crate::error::Result;
use crate::profile::{Described, EventNames, ProfileEvent, describe, now_ns};
use crate::queue::Command;

use super::Cuda;

/// The flags of the profiler's events: timing on. (cudarc's
/// `new_event(None)` means `CU_EVENT_DISABLE_TIMING`, whose events
/// `cuEventElapsedTime` refuses.)
const TIMING_EVENT_FLAGS: sys::CUevent_flags = sys::CUevent_flags::CU_EVENT_DEFAULT;

/// A profiled queue's timing state.
pub(crate) struct Profiler {
    reference: CudaEvent,
    reference_ns: u64,
    /// The queue, as events name it.
    label: crate::profile::Name,
    /// The kernels' and commands' names, interned.
    names: EventNames,
    /// Commands whose end event may not have completed yet.
    pending: Vec<Span>,
    /// Spans already timed: host-side waits.
    done: Vec<ProfileEvent>,
}

/// One command between its two events.
struct Span {
    described: Described,
    batch: u64,
    index: usize,
    start: CudaEvent,
    end: CudaEvent,
}

impl Profiler {
    /// Records the reference event on `stream` and waits for it (so for
    /// the work enqueued before it).
    ///
    /// # Errors
    /// What the driver reports.
    pub(crate) fn start(stream: &std::sync::Arc<CudaStream>, label: String) -> Result<Self> {
        let label = label.into();
        let fail = |e| super::driver_error("starting a CUDA queue's profile", e);
        let reference = stream
            .context()
            .new_event(Some(TIMING_EVENT_FLAGS))
            .map_err(fail)?;
        reference.record(stream).map_err(fail)?;
        reference.synchronize().map_err(fail)?;
        Ok(Self {
            reference,
            reference_ns: now_ns(),
            label,
            names: EventNames::new(),
            pending: Vec::new(),
            done: Vec::new(),
        })
    }

    /// Records a timing event on `stream`, where the next (or the last)
    /// command stands. `None` if the driver refuses: the command is then
    /// left out of the profile, never failed for it.
    pub(crate) fn mark(stream: &std::sync::Arc<CudaStream>) -> Option<CudaEvent> {
        let event = stream.context().new_event(Some(TIMING_EVENT_FLAGS)).ok()?;
        event.record(stream).ok()?;
        Some(event)
    }

    /// Keeps command `index` of batch `batch`, between `start` and `end`.
    pub(crate) fn push(
        &mut self,
        command: &Command<Cuda>,
        batch: u64,
        index: usize,
        start: CudaEvent,
        end: CudaEvent,
    ) {
        self.pending.push(Span {
            described: describe(command, &mut self.names),
            batch,
            index,
            start,
            end,
        });
    }

    /// Keeps a host-side span of command `index` (a wait that blocked the
    /// worker).
    pub(crate) fn push_host(
        &mut self,
        command: &Command<Cuda>,
        batch: u64,
        index: usize,
        start_ns: u64,
    ) {
        let mut described = describe(command, &mut self.names);
        described.detail = format!("{} (on the host)", described.detail);
        let event = described.into_event(self.label.clone(), batch, index, start_ns, now_ns());
        self.done.push(event);
    }

    /// Moves the spans that completed into `out`, on the host timeline.
    /// A span whose events report an error (a lost device) is dropped.
    pub(crate) fn take(&mut self, out: &mut Vec<ProfileEvent>) {
        out.append(&mut self.done);
        for span in std::mem::take(&mut self.pending) {
            match span.end.try_is_complete() {
                Ok(false) => self.pending.push(span),
                Ok(true) => {
                    let start = self.at(&span.start);
                    let duration = span.start.elapsed_ms(&span.end).ok();
                    if let (Some(start), Some(ms)) = (start, duration) {
                        let end = start + millis_to_ns(ms);
                        let label = self.label.clone();
                        let event = span
                            .described
                            .into_event(label, span.batch, span.index, start, end);
                        out.push(event);
                    }
                }
                Err(_) => {}
            }
        }
    }

    /// A completed event on the host timeline: milliseconds after the
    /// reference, in nanoseconds (never before it).
    fn at(&self, event: &CudaEvent) -> Option<u64> {
        let ms = self.reference.elapsed_ms(event).ok()?;
        Some(self.reference_ns + millis_to_ns(ms))
    }
}

/// An elapsed time as `cuEventElapsedTime` gives it, in nanoseconds (never
/// negative).
fn millis_to_ns(ms: f32) -> u64 {
    (f64::from(ms.max(0.0)) * 1e6) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events made without timing make `cuEventElapsedTime` fail, and
    /// every span would be dropped: the profiler's must keep it on.
    #[test]
    fn the_profilers_events_keep_timing_on() {
        let disable = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        assert_eq!(TIMING_EVENT_FLAGS as u32 & disable, 0);
    }

    #[test]
    fn elapsed_milliseconds_become_nanoseconds() {
        assert_eq!(millis_to_ns(1.5), 1_500_000);
        assert_eq!(millis_to_ns(-0.25), 0);
    }
}
