//! Fuzz target: see `hwqueue_testkit::device_spec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::device_spec(data));
