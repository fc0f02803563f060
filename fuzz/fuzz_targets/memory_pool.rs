//! Fuzz target: see `hwqueue_testkit::memory_pool`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::memory_pool(data));
