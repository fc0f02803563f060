//! Fuzz target: see `hwqueue::fuzz_harness::event_ring`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue::fuzz_harness::event_ring(data));
