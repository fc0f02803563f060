//! Fuzz target: see `hwqueue_testkit::ptx_params`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue_testkit::ptx_params(data));
