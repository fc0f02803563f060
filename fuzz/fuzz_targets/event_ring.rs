//! Fuzz target: see `hwqueue_testkit::event_ring`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::event_ring(data));
