//! Fuzz target: see `hwqueue_testkit::plan_schedule`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::plan_schedule(data));
