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

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, SamplingMode};

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
pub fn configure(group: &mut BenchmarkGroup<'_, WallTime>, profile: Profile) {
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
