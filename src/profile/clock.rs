//! Timestamps for the commands of a batch, cheaper than a clock read each.
//!
//! A profiled CPU batch needs one timestamp per command, and the system's
//! monotonic clock costs 30–45 ns a read (a vDSO call) where an empty
//! `exec` costs about 40. Where the processor has an invariant time-stamp
//! counter (x86-64 with CPUID's "invariant TSC" bit, the counter readable
//! by the thread), a batch reads the counter per command (a few
//! nanoseconds, not serialising: it may be taken a few dozen cycles early
//! or late) and the host clock only twice, when it starts and when it
//! ends (each time between two counter reads, which stand for their
//! midpoint, so that a preemption between the reads skews the pair by half
//! of it at most). The counter readings are mapped onto the host timeline
//! by the line through those two points, so every command's time lies between
//! the batch's two clock reads, in order, and no calibration can drift:
//! the host's clock pins both ends of every batch. Elsewhere (other
//! architectures, no invariant counter, Miri) the "counter" is the host
//! clock itself and the mapping is exact.

use std::cell::Cell;
use std::sync::OnceLock;

use super::now_ns;

/// What a batch's per-command timestamps read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The time-stamp counter (`rdtsc`).
    Tsc,
    /// The host clock ([`now_ns`]).
    Host,
}

impl Source {
    /// The time-stamp counter where it runs at a constant rate in every
    /// power state (asked once for the process) and this thread may read it
    /// (asked once per thread); the host clock otherwise.
    fn get() -> Self {
        static INVARIANT: OnceLock<bool> = OnceLock::new();
        thread_local! {
            static SOURCE: Cell<Option<Source>> = const { Cell::new(None) };
        }
        SOURCE.with(|source| {
            let known = source.get().unwrap_or_else(|| {
                if *INVARIANT.get_or_init(tsc_invariant) && tsc_readable() {
                    Source::Tsc
                } else {
                    Source::Host
                }
            });
            source.set(Some(known));
            known
        })
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unused_unsafe)] // `__cpuid` is safe since Rust 1.89, unsafe before.
fn tsc_invariant() -> bool {
    use std::arch::x86_64::__cpuid;
    // CPUID 0x8000_0007, EDX bit 8: the counter is invariant (constant
    // rate, runs in deep sleep states).
    // SAFETY: every x86-64 processor has CPUID, and a leaf past the
    // highest one (checked first for 0x8000_0007) reads as data, not a fault.
    unsafe { __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0 }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn tsc_invariant() -> bool {
    false
}

/// Whether `rdtsc` is allowed on this thread: Linux can make it fault per
/// thread (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`, inherited by threads
/// spawned after it; some sandboxes use it). Asked by each thread that
/// times a batch (a queue's worker, which only hwqueue runs code on).
#[cfg(all(target_arch = "x86_64", not(miri), target_os = "linux"))]
fn tsc_readable() -> bool {
    let mut state: libc::c_int = 0;
    // SAFETY: PR_GET_TSC writes one `int` through its second argument,
    // which points at `state`.
    let rc = unsafe { libc::prctl(libc::PR_GET_TSC, &raw mut state) };
    rc == 0 && state == libc::PR_TSC_ENABLE
}

#[cfg(all(target_arch = "x86_64", not(miri), not(target_os = "linux")))]
fn tsc_readable() -> bool {
    true
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn tsc_readable() -> bool {
    false
}

/// The time-stamp counter.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter and touches no memory; it is only
    // called once `Source::get` found it present and allowed.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
#[inline]
fn tsc() -> u64 {
    now_ns()
}

/// The host clock and the counter at one moment: the counter read on both
/// sides of the clock, and their midpoint taken.
fn pair(source: Source) -> (u64, u64) {
    match source {
        Source::Tsc => {
            let before = tsc();
            let ns = now_ns();
            let after = tsc();
            (ns, before + after.saturating_sub(before) / 2)
        }
        Source::Host => {
            let now = now_ns();
            (now, now)
        }
    }
}

/// Times the commands of one batch: [`tick`](Self::tick) after each, then
/// [`finish`](Self::finish) maps the ticks onto the host timeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchClock {
    source: Source,
    start_ns: u64,
    start_tick: u64,
}

impl BatchClock {
    /// The batch starts now.
    pub(crate) fn start() -> Self {
        Self::with_source(Source::get())
    }

    fn with_source(source: Source) -> Self {
        let (start_ns, start_tick) = pair(source);
        Self {
            source,
            start_ns,
            start_tick,
        }
    }

    /// Now, in ticks, for [`TickMap::ns`].
    #[inline]
    pub(crate) fn tick(&self) -> u64 {
        match self.source {
            Source::Tsc => tsc(),
            Source::Host => now_ns(),
        }
    }

    /// The batch ended now: how its ticks map to host time.
    pub(crate) fn finish(&self) -> TickMap {
        let (end_ns, end_tick) = pair(self.source);
        TickMap::new(self.start_tick, end_tick, self.start_ns, end_ns)
    }
}

/// The line from a batch's first (tick, host time) pair to its last.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TickMap {
    start_tick: u64,
    end_tick: u64,
    start_ns: u64,
    /// Nanoseconds per tick, in 32.32 fixed point.
    scale: u64,
}

impl TickMap {
    fn new(start_tick: u64, end_tick: u64, start_ns: u64, end_ns: u64) -> Self {
        // A counter read on another core may lag the first one: the batch
        // then spans no ticks, and every tick maps to its start.
        let end_tick = end_tick.max(start_tick);
        let span_ticks = u128::from(end_tick - start_tick);
        let span_ns = u128::from(end_ns.saturating_sub(start_ns));
        let scale = (span_ns << 32)
            .checked_div(span_ticks)
            .map_or(0, |scale| u64::try_from(scale).unwrap_or(u64::MAX));
        Self {
            start_tick,
            end_tick,
            start_ns,
            scale,
        }
    }

    /// `tick`, on the host timeline: never outside the batch's span, and
    /// in the order of the ticks.
    #[inline]
    pub(crate) fn ns(&self, tick: u64) -> u64 {
        let since = tick.clamp(self.start_tick, self.end_tick) - self.start_tick;
        // `since * scale >> 32` is at most the span in nanoseconds.
        let offset = (u128::from(since) * u128::from(self.scale)) >> 32;
        self.start_ns + u64::try_from(offset).unwrap_or(u64::MAX - self.start_ns)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_batch_maps_its_ticks_inside_its_span_in_order() {
        for source in [Source::get(), Source::Host] {
            let before = now_ns();
            let clock = BatchClock::with_source(source);
            let ticks: Vec<u64> = (0..100).map(|_| clock.tick()).collect();
            let map = clock.finish();
            let after = now_ns();
            let times: Vec<u64> = ticks.iter().map(|&tick| map.ns(tick)).collect();
            assert!(times.is_sorted(), "{source:?}: {times:?}");
            assert!(times[0] >= before && times[99] <= after, "{source:?}");
        }
    }

    proptest! {
        #[test]
        fn the_map_is_monotone_bounded_and_exact_at_its_ends(
            start_tick in any::<u64>(),
            span_ticks in 0u64..1 << 40,
            start_ns in 0u64..1 << 62,
            span_ns in 0u64..1 << 40,
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let end_tick = start_tick.saturating_add(span_ticks);
            let map = TickMap::new(start_tick, end_tick, start_ns, start_ns + span_ns);
            let (low, high) = (a.min(b), a.max(b));
            prop_assert!(map.ns(low) <= map.ns(high));
            prop_assert!(map.ns(low) >= start_ns && map.ns(high) <= start_ns + span_ns);
            prop_assert_eq!(map.ns(start_tick), start_ns);
            let span_ticks = end_tick - start_tick;
            if span_ticks > 0 && span_ns >> 32 < span_ticks {
                // Exact at the end up to the fixed point's rounding (the
                // scale is at most one 2^-32 ns per tick short).
                prop_assert!(start_ns + span_ns - map.ns(end_tick) <= 1 + (span_ticks >> 32));
            }
        }
    }

    #[test]
    fn ticks_that_run_backwards_map_to_the_start() {
        let map = TickMap::new(1_000, 900, 50, 80);
        assert_eq!((map.ns(0), map.ns(950), map.ns(5_000)), (50, 50, 50));
    }
}
