//! Fuzz target: see `hwqueue_testkit::cpu_queue`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::cpu_queue(data));
