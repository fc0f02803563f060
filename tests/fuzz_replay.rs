//! Replays every committed fuzz corpus through its harness, so a plain
//! `cargo test` re-checks every input the fuzzers kept (crashes included,
//! once fixed). A missing or empty corpus directory passes.

use std::fs;
use std::path::Path;

use hwqueue_testkit as fuzz_harness;

/// Runs `harness` over every file in `fuzz/corpus/<target>/`; returns how
/// many inputs ran.
fn replay(target: &str, harness: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let Ok(entries) = fs::read_dir(&dir) else {
        return 0;
    };
    let mut paths: Vec<_> = entries
        .map(|entry| entry.expect("read corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    for path in &paths {
        let data = fs::read(path).expect("read corpus file");
        // A panic names the input that caused it.
        let result = std::panic::catch_unwind(|| harness(&data));
        if let Err(payload) = result {
            eprintln!("fuzz corpus input {} failed", path.display());
            std::panic::resume_unwind(payload);
        }
    }
    paths.len()
}

#[test]
fn device_spec_corpus() {
    assert!(replay("device_spec", fuzz_harness::device_spec) > 0);
}

#[test]
fn cpu_signal_corpus() {
    assert!(replay("cpu_signal", fuzz_harness::cpu_signal) > 0);
}

#[test]
fn cpu_queue_corpus() {
    assert!(replay("cpu_queue", fuzz_harness::cpu_queue) > 0);
}

#[test]
fn a_missing_corpus_replays_nothing() {
    assert_eq!(replay("no_such_target", fuzz_harness::device_spec), 0);
}

#[test]
fn event_ring_corpus() {
    assert!(replay("event_ring", fuzz_harness::event_ring) > 0);
}

#[test]
fn memory_pool_corpus() {
    assert!(replay("memory_pool", fuzz_harness::memory_pool) > 0);
}

#[test]
fn plan_schedule_corpus() {
    assert!(replay("plan_schedule", fuzz_harness::plan_schedule) > 0);
}

#[test]
fn ptx_params_corpus() {
    assert!(replay("ptx_params", fuzz_harness::ptx_params) > 0);
}
