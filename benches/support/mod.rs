//! Settings shared by the benches.
//!
//! Every group's warm-up and measurement times are set here, sized so that a
//! full `cargo bench` finishes in a few minutes on a 2-core machine, and so
//! that a quick first look is one environment variable away:
//!
//! ```text
//! HWQUEUE_BENCH_QUICK=1 cargo bench      # short warm-up and measurement
//! cargo bench -- --quick                 # criterion's own quick mode
//! ```
//!
//! Each bench file includes this module with `mod support;`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkGroup, SamplingMode, Throughput};

/// The environment variable that shortens every group.
pub const QUICK_ENV: &str = "HWQUEUE_BENCH_QUICK";

/// Whether quick mode is on (`HWQUEUE_BENCH_QUICK` set to anything but `0`).
pub fn quick() -> bool {
    std::env::var_os(QUICK_ENV).is_some_and(|value| value != "0")
}

/// How a group's cases behave, which decides how it is sampled.
#[derive(Debug, Clone, Copy)]
pub enum Profile {
    /// Nanoseconds to microseconds per iteration: many samples, linear sampling.
    Latency,
    /// Milliseconds per iteration (memory bandwidth): fewer samples, flat
    /// sampling, so no sample runs hundreds of iterations.
    Bandwidth,
}

/// Applies `profile`'s timings (or quick mode's) to `group`.
pub fn configure<M: Measurement>(group: &mut BenchmarkGroup<'_, M>, profile: Profile) {
    let quick = quick();
    let ms = Duration::from_millis;
    match profile {
        Profile::Latency => {
            group
                .warm_up_time(ms(if quick { 200 } else { 1_000 }))
                .measurement_time(ms(if quick { 600 } else { 3_000 }))
                .sample_size(if quick { 20 } else { 100 });
        }
        Profile::Bandwidth => {
            group
                .sampling_mode(SamplingMode::Flat)
                .warm_up_time(ms(if quick { 200 } else { 1_000 }))
                .measurement_time(ms(if quick { 600 } else { 4_000 }))
                .sample_size(if quick { 10 } else { 30 });
        }
    }
}

/// `Measurement` and `ValueFormatter` for a paired measurement `$name`,
/// whose values come from `iter_custom` with `support::$timer` only: its
/// values scaled by its own `scale`, its unscaled units `$unit` (for
/// throughputs) and `$machine` (for machines).
macro_rules! paired_measurement {
    ($name:ident, $timer:literal, $unit:literal, $machine:literal) => {
        impl Measurement for $name {
            type Intermediate = ();
            type Value = f64;

            fn start(&self) {}

            fn end(&self, (): ()) -> f64 {
                panic!(concat!(
                    "a ",
                    stringify!($name),
                    " group is timed by `iter_custom` with `support::",
                    $timer,
                    "`, not by `iter`"
                ))
            }

            fn add(&self, a: &f64, b: &f64) -> f64 {
                a + b
            }

            fn zero(&self) -> f64 {
                0.0
            }

            fn to_f64(&self, value: &f64) -> f64 {
                *value
            }

            fn formatter(&self) -> &dyn ValueFormatter {
                self
            }
        }

        impl ValueFormatter for $name {
            fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
                self.scale(typical, values)
            }

            fn scale_throughputs(
                &self,
                _typical: f64,
                _: &Throughput,
                _values: &mut [f64],
            ) -> &'static str {
                $unit
            }

            fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
                $machine
            }
        }
    };
}

/// A paired measurement: what criterion records for an iteration is the
/// ratio of hwqueue's time to its baseline's, both timed in the same
/// iteration ([`paired`]), instead of a time.
///
/// Two groups timed one after the other see whatever the shared machine
/// did meanwhile: on this project's 2-core VMs the same code moves
/// 0.95–1.22x between groups (memory bandwidth, vCPU wake-up latency).
/// Timed side by side, each iteration of one next to one of the other,
/// both see the same conditions, and the ratio's spread is that of the
/// code. Criterion's report then reads "time: [low median high]" in
/// `x`, the ratio's confidence interval (1.00 x: as fast as the baseline).
/// Used only through `iter_custom` with [`paired`]: criterion's own
/// timing (`iter`) has no baseline to divide by.
pub struct Ratio;

paired_measurement!(Ratio, "paired", "x", "ratio");

impl Ratio {
    /// A ratio, as it is.
    fn scale(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "x"
    }
}

/// A paired measurement of the time `ours` adds to its baseline: what
/// criterion records for an iteration is hwqueue's time less its
/// baseline's, both timed in the same iteration ([`paired_added`]), in
/// nanoseconds (criterion's report scales it to ns, µs or ms; it may be
/// negative).
///
/// The same pairing as [`Ratio`], for a target stated as added latency
/// ("under 5 µs more than the baseline"): two groups timed one after the
/// other differ by whatever the shared machine did between them, often
/// more than the difference measured.
pub struct Added;

paired_measurement!(Added, "paired_added", "ns", "ns");

impl Added {
    /// Nanoseconds, in ns, µs or ms as `typical` is.
    fn scale(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match typical.abs() {
            t if t < 1e3 => (1.0, "ns"),
            t if t < 1e6 => (1e-3, "µs"),
            _ => (1e-6, "ms"),
        };
        values.iter_mut().for_each(|value| *value *= factor);
        unit
    }
}

/// `iters` iterations of `ours` and as many of `baseline`, side by side
/// (`ours` first in even iterations, `baseline` first in odd ones, so
/// that neither always runs on what the other left warm): the total
/// time of each.
fn side_by_side(
    iters: u64,
    ours: &mut impl FnMut(),
    baseline: &mut impl FnMut(),
) -> (Duration, Duration) {
    fn time(f: &mut impl FnMut()) -> Duration {
        let start = Instant::now();
        f();
        start.elapsed()
    }
    let (mut a, mut b) = (Duration::ZERO, Duration::ZERO);
    for i in 0..iters {
        if i % 2 == 0 {
            a += time(ours);
            b += time(baseline);
        } else {
            b += time(baseline);
            a += time(ours);
        }
    }
    (a, b)
}

/// [`side_by_side`], as the [`Ratio`] measurement records it: `iters`
/// times the ratio of `ours`'s total time to `baseline`'s.
pub fn paired(iters: u64, ours: &mut impl FnMut(), baseline: &mut impl FnMut()) -> f64 {
    let (a, b) = side_by_side(iters, ours, baseline);
    iters as f64 * a.as_secs_f64() / b.as_secs_f64()
}

/// [`side_by_side`], as the [`Added`] measurement records it: the
/// nanoseconds `ours` took beyond `baseline` over the `iters` iterations
/// (negative where it took less).
pub fn paired_added(iters: u64, ours: &mut impl FnMut(), baseline: &mut impl FnMut()) -> f64 {
    let (a, b) = side_by_side(iters, ours, baseline);
    (a.as_secs_f64() - b.as_secs_f64()) * 1e9
}

/// The loop `benches/callgrind.sh` counts instructions in: runs `routine`
/// `iters` times, and callgrind collects only inside it
/// (`--toggle-collect='<bench>::support::repeat*'`), so a bench's setup
/// and teardown stay out of the count.
#[inline(never)]
pub fn repeat(iters: u64, mut routine: impl FnMut()) {
    for _ in 0..iters {
        routine();
    }
}

/// In a bench's instruction-count mode (`benches/callgrind.sh`): the
/// iterations the environment variable `var` (`HWQUEUE_<BENCH>_ITERS`)
/// asks for, or `default`.
pub fn count_iters(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().map_or(default, |iters| {
        iters
            .parse()
            .unwrap_or_else(|_| panic!("{var} is a number, not {iters:?}"))
    })
}

/// CUDA device 0, or `None` after printing `skipped: no CUDA driver` (no
/// driver, or no device): the CUDA benches measure nothing then.
#[cfg(feature = "cuda")]
pub fn cuda_device() -> Option<hwqueue::cuda::CudaDevice> {
    use hwqueue::Backend;
    match hwqueue::cuda::Cuda::probe() {
        Ok(devices) if !devices.is_empty() => {
            Some(hwqueue::cuda::Cuda::open(0).expect("a probed device opens"))
        }
        _ => {
            println!("skipped: no CUDA driver");
            None
        }
    }
}
