//! The registry: open once, concurrency, retries, selection, errors.

#![cfg(not(loom))]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use common::mock::*;
use hwqueue::registry::RegistryError;
use hwqueue::{Backend, Device, DeviceSpec, Error, Policy, Registry, TimelineSignal};

#[test]
fn eight_threads_racing_the_first_open_open_it_once() {
    let registry = Arc::new(Registry::<Mixed>::new());
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (registry, start) = (registry.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                registry
                    .open(DeviceSpec::new("mock", RACE_ORDINAL))
                    .unwrap()
            })
        })
        .collect();
    let devices: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(OPENS[RACE_ORDINAL as usize].load(Ordering::SeqCst), 1);
    assert!(devices.iter().all(|d| Arc::ptr_eq(d, &devices[0])));
    // Later lookups hit the cache.
    let again = registry.acquire(&format!("fake:{RACE_ORDINAL}")).unwrap();
    assert!(Arc::ptr_eq(&again, &devices[0]));
    assert_eq!(OPENS[RACE_ORDINAL as usize].load(Ordering::SeqCst), 1);
}

#[test]
fn a_failed_open_is_not_cached_and_the_next_caller_retries() {
    let registry = Registry::<Mixed>::new();
    let spec = format!("mock:{FLAKY_ORDINAL}");
    let error = registry.acquire(&spec).unwrap_err();
    assert!(error.to_string().contains("first open fails"));
    assert!(!registry.is_open(DeviceSpec::new("mock", FLAKY_ORDINAL)));
    let device = registry.acquire(&spec).unwrap();
    assert_eq!(device.spec().to_string(), spec);
    assert_eq!(OPENS[FLAKY_ORDINAL as usize].load(Ordering::SeqCst), 2);
}

#[test]
fn a_slow_open_does_not_block_other_specs() {
    let registry = Arc::new(Registry::<Mixed>::new());
    let slow = {
        let registry = registry.clone();
        std::thread::spawn(move || registry.acquire(&format!("mock:{SLOW_ORDINAL}")))
    };
    while !SLOW_OPENING.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // mock:1 is mid-open (blocked on the gate) while these complete.
    registry.acquire("cpu").unwrap();
    registry.acquire("mock:4").unwrap();
    assert!(!registry.is_open(DeviceSpec::new("mock", SLOW_ORDINAL)));
    slow_gate().set(1);
    slow.join().unwrap().unwrap();
    assert!(registry.is_open(DeviceSpec::new("mock", SLOW_ORDINAL)));
}

#[test]
fn an_open_that_uses_the_registry_does_not_deadlock() {
    let device = global_registry()
        .acquire(&format!("mock:{NESTED_ORDINAL}"))
        .unwrap();
    assert_eq!(device.spec(), DeviceSpec::new("mock", NESTED_ORDINAL));
    assert!(global_registry().is_open(DeviceSpec::cpu()));
    // An open that asks for its own spec is an error, not a hang.
    let error = global_registry()
        .acquire(&format!("mock:{SELF_ORDINAL}"))
        .unwrap_err();
    assert!(
        error.to_string().contains("must not acquire its own spec"),
        "{error}"
    );
}

#[test]
fn selection_prefers_the_present_backend_of_highest_precedence_and_opens_only_it() {
    let registry = Registry::<Mixed>::new();
    let selection = registry.select(Policy::default()).unwrap();
    assert_eq!(selection.spec, DeviceSpec::new("mock", 0));
    assert!(
        selection.reason.contains("highest precedence"),
        "{}",
        selection.reason
    );
    assert!(!registry.is_open(DeviceSpec::cpu()));
    assert_eq!(
        hwqueue::registry::preferred::<Mixed>(Policy::no_fallback())
            .unwrap()
            .id,
        "mock"
    );
}

#[test]
fn the_cpu_is_the_explicit_fallback_and_a_policy_can_forbid_it() {
    let registry = Registry::<CpuOrAbsent>::new();
    // `Absent` outranks the CPU but is not present: never opened (it panics if opened).
    let selection = registry.select(Policy::default()).unwrap();
    assert_eq!(selection.spec, DeviceSpec::cpu());
    assert!(
        selection.reason.contains("falling back"),
        "{}",
        selection.reason
    );
    assert!(
        selection.reason.contains("libabsent.so"),
        "{}",
        selection.reason
    );
    let error = Registry::<CpuOrAbsent>::new()
        .select(Policy::no_fallback())
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("forbids the fallback") && message.contains("libabsent.so"),
        "{message}"
    );
}

/// Selection goes past a backend whose probe finds a device that then
/// does not open, naming why: it returned that open's error, though a
/// present backend below it (and the CPU) opened. Where nothing else
/// opens and the fallback is forbidden, the error names the refusal.
#[test]
fn selection_goes_past_a_device_that_does_not_open_and_says_why() {
    let registry = Registry::<BrokenFirst>::new();
    let selection = registry.select(Policy::default()).unwrap();
    assert_eq!(selection.spec, DeviceSpec::new("mock", 0));
    assert!(
        selection.reason.contains("`broken`") && selection.reason.contains("refused device 0"),
        "{}",
        selection.reason
    );
    assert!(!registry.is_open(DeviceSpec::cpu()));
}

#[test]
fn the_listing_is_sorted_by_precedence_with_probe_results() {
    let reports = Registry::<CpuOrAbsent>::new().backends();
    let ids: Vec<_> = reports.iter().map(|r| r.id).collect();
    assert_eq!(ids, ["absent", "cpu"]);
    assert!(reports[0].probe.is_err());
    assert_eq!(reports[1].probe.as_ref().unwrap().len(), 1);
    assert!(reports[1].reference_oracle);
}

#[test]
#[cfg(not(feature = "cuda"))]
fn cuda_without_the_feature_is_an_error_that_says_how_to_fix_it() {
    for spec in ["cuda", "cuda:0", "gpu:1"] {
        let error = hwqueue::acquire(spec).unwrap_err();
        assert!(
            matches!(
                error,
                Error::BackendNotCompiled {
                    backend: "cuda",
                    ..
                }
            ),
            "{spec}: {error}"
        );
        assert!(error.to_string().contains("--features cuda"));
        let error = Registry::<Mixed>::new().acquire(spec).unwrap_err();
        assert!(
            matches!(error, Error::BackendNotCompiled { .. }),
            "{spec}: {error}"
        );
    }
}

#[test]
fn unknown_specs_and_devices_are_errors() {
    let registry = Registry::<Mixed>::new();
    let error = registry.acquire("tpu").unwrap_err();
    assert!(error.to_string().contains("`mock`/`fake`"), "{error}");
    let error = registry.acquire("mock:99").unwrap_err();
    assert!(
        matches!(
            error,
            Error::NoSuchDevice {
                ordinal: 99,
                count: MOCK_DEVICES,
                ..
            }
        ),
        "{error}"
    );
    let error = registry.acquire("cpu:1").unwrap_err();
    assert!(
        matches!(error, Error::NoSuchDevice { backend: "cpu", .. }),
        "{error}"
    );
    // The registry of the crate's set knows nothing of `mock`.
    assert!(hwqueue::acquire("mock").is_err());
}

#[test]
fn the_set_backend_opens_its_preferred_backend() {
    let device = Mixed::open(7).unwrap();
    assert_eq!(device.spec(), DeviceSpec::new("mock", 7));
    assert!(!Mixed::probe().unwrap().is_empty());
}

/// With CUDA compiled in: on a machine without a driver, asking for it is an
/// error that says so (not a panic), and selection falls back to the CPU,
/// naming why; with a driver, selection prefers CUDA.
#[cfg(feature = "cuda")]
#[test]
fn cuda_compiled_in_is_preferred_when_present_and_explained_when_not() {
    let present = matches!(hwqueue::cuda::Cuda::probe(), Ok(devices) if !devices.is_empty());
    let registry = Registry::<hwqueue::AnyBackend>::new();
    let selection = registry.select(Policy::default()).unwrap();
    if present {
        assert_eq!(selection.spec, DeviceSpec::cuda(0));
        return;
    }
    println!("skipped: no CUDA driver (checking the no-driver path instead)");
    assert_eq!(selection.spec, DeviceSpec::cpu());
    assert!(selection.reason.contains("`cuda`"), "{}", selection.reason);
    let error = registry.acquire("cuda:0").unwrap_err();
    assert!(
        matches!(
            error,
            Error::NoDriver {
                backend: "cuda",
                ..
            }
        ),
        "{error}"
    );
    let error = registry.select(Policy::no_fallback()).unwrap_err();
    assert!(error.to_string().contains("cuda"), "{error}");
}

#[test]
fn a_panicking_open_is_an_error_and_the_spec_stays_usable() {
    let registry = Registry::<Mixed>::new();
    let spec = format!("mock:{PANIC_ORDINAL}");
    for _ in 0..2 {
        // Each caller gets the error; none waits on a slot left `Opening`.
        let error = registry.acquire(&spec).unwrap_err();
        assert!(error.to_string().contains("panicked"), "{error}");
        assert!(!registry.is_open(DeviceSpec::new("mock", PANIC_ORDINAL)));
    }
    assert_eq!(OPENS[PANIC_ORDINAL as usize].load(Ordering::SeqCst), 2);
}

/// Issue 10, defect 3: before the fix the registry dropped the payload
/// outside its `catch_unwind`, so the second panic escaped `acquire` and
/// left the slot `Opening`: every later caller of the spec hung.
#[test]
fn an_open_whose_panic_payload_panics_on_drop_is_an_error_too() {
    let registry = Registry::<Mixed>::new();
    let spec = format!("mock:{BAD_PAYLOAD_ORDINAL}");
    for _ in 0..2 {
        let error = registry.acquire(&spec).unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Registry(RegistryError::OpenPanicked {
                    backend: "mock",
                    ..
                })
            ),
            "{error:?}"
        );
        assert!(!registry.is_open(DeviceSpec::new("mock", BAD_PAYLOAD_ORDINAL)));
    }
}

/// Issue 13.4: a device that a fault made unusable for the process (CUDA's
/// sticky errors) is not handed out again from the cache: the registry
/// answers `DeviceLost` for its spec, which says a restart is needed.
#[test]
fn a_lost_device_is_answered_as_lost_not_handed_out_again() {
    let registry = Registry::<Mixed>::new();
    let spec = format!("mock:{LOST_ORDINAL}");
    let device = registry.acquire(&spec).unwrap();
    device.health().unwrap();
    LOST.store(true, Ordering::SeqCst);
    let error = registry.acquire(&spec).unwrap_err();
    assert!(matches!(&error, Error::DeviceLost { .. }), "{error:?}");
    assert!(error.to_string().contains("restart the process"), "{error}");
    assert!(error.to_string().contains(&spec), "{error}");
    // Other specs are unaffected.
    registry.acquire("cpu").unwrap();
}

/// Two opens on two threads, each acquiring the other's spec once both are
/// opening: the one that would close the cycle is refused with
/// `OpenCycle`, and neither thread hangs. On 09cc67d both waited for good
/// (review helper-60).
#[test]
fn opens_that_acquire_each_other_s_spec_fail_instead_of_deadlocking() {
    let (sender, receiver) = std::sync::mpsc::channel();
    for ordinal in ABBA_ORDINALS {
        let sender = sender.clone();
        std::thread::spawn(move || {
            let opened = global_registry().acquire(&format!("mock:{ordinal}"));
            let _ = sender.send(opened.map(drop));
        });
    }
    let mut cycles = 0;
    for _ in 0..2 {
        let outcome = receiver
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("both opens return");
        let error = outcome.expect_err("an open that is part of a cycle fails");
        if matches!(
            error.root_cause(),
            Error::Registry(RegistryError::OpenCycle { .. })
        ) {
            let text = error.to_string();
            assert!(
                text.contains("mock:10") && text.contains("mock:11"),
                "{text}"
            );
            cycles += 1;
        }
    }
    assert!(cycles >= 1, "one of them names the cycle");
}

/// A preference list: the first spec that opens is chosen, and each one
/// before it that did not is named with why. (`cuda:4096` opens nowhere:
/// CUDA not compiled in, no driver, or no such device.)
#[test]
fn a_preference_list_goes_past_specs_that_do_not_open_and_names_them() {
    let registry = Registry::<hwqueue::AnyBackend>::new();
    let selection = registry
        .select_from(&["cpu:5", "cuda:4096", " cpu "])
        .unwrap();
    assert_eq!(selection.spec, DeviceSpec::cpu());
    assert!(registry.is_open(DeviceSpec::cpu()));
    for tried in ["`cpu:5`", "use an ordinal below 1", "`cuda:4096`"] {
        assert!(
            selection.reason.contains(tried),
            "`{tried}` missing from: {}",
            selection.reason
        );
    }
}

/// When nothing listed opens, the error names every spec tried and why.
#[test]
fn a_preference_list_where_nothing_opens_is_an_error_naming_each_try() {
    let registry = Registry::<hwqueue::AnyBackend>::new();
    let error = registry.select_from(&["cpu:5", "cuda:4096"]).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Registry(RegistryError::NoPreferenceOpened { .. })
        ),
        "{error:?}"
    );
    let message = error.to_string();
    for tried in ["`cpu:5`", "use an ordinal below 1", "`cuda:4096`", "`cpu`"] {
        assert!(message.contains(tried), "`{tried}` missing from: {message}");
    }
    // An empty list says so.
    let message = registry.select_from(&[]).unwrap_err().to_string();
    assert!(message.contains("no device was listed"), "{message}");
}

/// A misspelled spec is refused before anything opens, even where a spec
/// before it would have opened.
#[test]
fn a_preference_list_with_a_misspelled_spec_is_refused_before_opening() {
    let registry = Registry::<hwqueue::AnyBackend>::new();
    let error = registry.select_from(&["cpu", "tpu:1"]).unwrap_err();
    assert!(
        matches!(error, Error::InvalidDeviceSpec { ref input, .. } if input == "tpu:1"),
        "{error:?}"
    );
    assert!(!registry.is_open(DeviceSpec::cpu()));
}

/// helper-79: a crate backend this registry's set lacks (Vulkan, compiled
/// in by default, on `Mixed`: CPU and mock) is a device that does not open
/// here, as one not compiled in is: skipped for the next preference, not
/// refused as a misspelling.
#[test]
fn a_preference_list_skips_a_backend_the_set_lacks() {
    let registry = Registry::<Mixed>::new();
    let selection = registry.select_from(&["vulkan", "cuda", "cpu"]);
    let selection = selection.unwrap_or_else(|error| panic!("refused: {error}"));
    assert_eq!(selection.spec, DeviceSpec::cpu());
    assert!(
        selection.reason.contains("`vulkan`"),
        "{}",
        selection.reason
    );
    // A misspelling is still refused before anything opens.
    let error = registry.select_from(&["vulkam", "cpu"]).unwrap_err();
    assert!(
        matches!(error, Error::InvalidDeviceSpec { .. }),
        "{error:?}"
    );
}
