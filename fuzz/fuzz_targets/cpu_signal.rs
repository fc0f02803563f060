//! Fuzz target: see `hwqueue::fuzz_harness::cpu_signal`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hwqueue::fuzz_harness::cpu_signal(data));
