//! Fuzz target: see `hwqueue_testkit::cpu_signal`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::cpu_signal(data));
