//! Fuzz target: see `hwqueue::fuzz_harness::device_spec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue::fuzz_harness::device_spec(data));
