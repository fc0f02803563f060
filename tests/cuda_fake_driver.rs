//! The CUDA backend against a fake driver (`tests/fake_cuda/libcuda.c`):
//! driver failures that need broken hardware or a broken installation to
//! happen for real, reproduced on any Linux machine with a C compiler
//! (without one, each test prints `skipped: no C compiler`).
//!
//! cudarc loads `libcuda` once per process, and the dynamic loader reads
//! `LD_LIBRARY_PATH` only at start, so each scenario runs in a child
//! process: the test re-executes this binary for the single test
//! [`fake_driver_child`] with the fake's directory first on
//! `LD_LIBRARY_PATH` and the scenario's `HWQUEUE_FAKE_*` variables. The
//! child probes and opens like any user and prints what it got on lines
//! starting `HWQUEUE-FAKE `; the parent parses them and asserts.
#![cfg(all(feature = "cuda", target_os = "linux"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys;
use hwqueue::cuda::{Cuda, CudaDevice};
use hwqueue::{Backend, Error};

/// Set (to `1`) in the child process only.
const CHILD: &str = "HWQUEUE_FAKE_CHILD";
/// What the child's report lines start with.
const MARK: &str = "HWQUEUE-FAKE ";
/// The variables the fake reads (see `tests/fake_cuda/libcuda.c`).
const FAKE_VARS: [&str; 4] = [
    "HWQUEUE_FAKE_CUINIT",
    "HWQUEUE_FAKE_DRIVER_VERSION",
    "HWQUEUE_FAKE_DEVICE_COUNT",
    "HWQUEUE_FAKE_CALLS",
];

/// The directory holding the fake `libcuda.so` (and `libcuda.so.1`), built
/// once per process; `None` without a C compiler.
fn fake_driver_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/libcuda.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake_cuda");
        std::fs::create_dir_all(&dir).unwrap();
        // Compiled under a name of this process's own, then renamed into
        // place: another test process may be loading the library meanwhile,
        // and a rename swaps the whole file at once.
        let scratch = dir.join(format!("libcuda.so.{}.tmp", std::process::id()));
        let compiled = match Command::new("cc")
            .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-o"])
            .arg(&scratch)
            .arg(&source)
            .output()
        {
            Ok(output) => output,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => panic!("running cc: {error}"),
        };
        assert!(
            compiled.status.success(),
            "cc failed on {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&compiled.stderr)
        );
        // cudarc tries `libcuda.so` first and `libcuda.so.1` last: both are
        // the fake, so no real driver further down the path can win.
        let scratch_1 = dir.join(format!("libcuda.so.1.{}.tmp", std::process::id()));
        std::fs::copy(&scratch, &scratch_1).unwrap();
        std::fs::rename(&scratch, dir.join("libcuda.so")).unwrap();
        std::fs::rename(&scratch_1, dir.join("libcuda.so.1")).unwrap();
        Some(dir)
    })
    .as_deref()
}

/// What the child saw.
#[derive(Debug)]
struct Outcome {
    /// `cuDriverGetVersion`, called directly: the fake's answer.
    version: String,
    /// `Cuda::probe`: `ok <count> [<name>; ...]` or `<variant> <Display>`.
    probe: String,
    /// `Cuda::open(0)`, in the same form, or `not tried` where the probe
    /// found devices.
    open: String,
    /// What `tests/cuda.rs`'s `device()` would do: run or skip.
    gpu_tests: String,
    /// The `cu*` symbols the fake was called through, in order.
    calls: Vec<String>,
}

/// Runs [`fake_driver_child`] in a child process over the fake driver with
/// `vars` set; `None` (after printing why) when there is no C compiler.
fn run_scenario(vars: &[(&str, &str)]) -> Option<Outcome> {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = fake_driver_dir() else {
        println!("skipped: no C compiler");
        return None;
    };
    let calls = dir.join(format!(
        "calls-{}-{}.log",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&calls);
    let library_path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(rest) if !rest.is_empty() => {
            let mut path = dir.as_os_str().to_owned();
            path.push(":");
            path.push(rest);
            path
        }
        _ => dir.as_os_str().to_owned(),
    };
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.args([
        "--exact",
        "fake_driver_child",
        "--nocapture",
        "--test-threads=1",
    ]);
    // Only the scenario's settings: none inherited from this process.
    for var in FAKE_VARS {
        child.env_remove(var);
    }
    child
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", library_path)
        .env("HWQUEUE_FAKE_CALLS", &calls)
        // A GPU job's "fail without a GPU" switch is about the real GPU.
        .env_remove("HWQUEUE_REQUIRE_GPU")
        .envs(vars.iter().copied());
    let output = child.output().expect("re-running the test binary");
    let calls_made: Vec<String> = std::fs::read_to_string(&calls)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_file(&calls);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let context = || {
        format!(
            "scenario {vars:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert!(output.status.success(), "the child failed: {}", context());
    let field = |key: &str| {
        stdout
            .lines()
            // libtest prints `test fake_driver_child ... ` with no line
            // break before the test's own output: a mark may be mid-line.
            .find_map(|line| {
                line.split_once(MARK)?
                    .1
                    .strip_prefix(key)?
                    .strip_prefix('=')
            })
            .unwrap_or_else(|| panic!("the child printed no `{key}`: {}", context()))
            .to_owned()
    };
    let outcome = Outcome {
        version: field("version"),
        probe: field("probe"),
        open: field("open"),
        gpu_tests: field("gpu_tests"),
        calls: calls_made,
    };
    // Not vacuous: the library the child loaded was the fake, and hwqueue
    // reached the driver through it.
    let expected_version = vars
        .iter()
        .find(|(var, _)| *var == "HWQUEUE_FAKE_DRIVER_VERSION")
        .map_or("12020", |(_, value)| value);
    assert_eq!(outcome.version, expected_version, "{outcome:#?}");
    assert!(
        outcome
            .calls
            .iter()
            .any(|call| call == "cuDriverGetVersion"),
        "the fake was not called: {outcome:#?}"
    );
    Some(outcome)
}

/// `Ok` as `ok <what>`, an error as `<variant> <Display>`.
fn describe<T>(result: Result<T, Error>, ok: impl FnOnce(T) -> String) -> String {
    match result {
        Ok(value) => format!("ok {}", ok(value)),
        Err(error) => {
            let variant = match error {
                Error::NoDriver { .. } => "NoDriver",
                Error::NoSuchDevice { .. } => "NoSuchDevice",
                _ => "other",
            };
            format!("{variant} {error}")
        }
    }
}

/// The child's half: does nothing unless [`CHILD`] is set.
#[test]
fn fake_driver_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let probe = Cuda::probe();
    let gpu_tests = match &probe {
        // tests/cuda.rs's `device()`: any probe that gives no device skips.
        Ok(devices) if !devices.is_empty() => "run",
        _ => "skipped: no CUDA driver",
    };
    let probe = describe(probe, |devices| {
        let names: Vec<_> = devices
            .iter()
            .map(|info| {
                format!(
                    "{} {} {:?} {:?}",
                    info.spec, info.name, info.memory, info.compute_units
                )
            })
            .collect();
        format!("{} [{}]", devices.len(), names.join("; "))
    });
    // Opening a device needs context entry points the fake does not have
    // yet: only tried where there is none to open.
    let open = if gpu_tests == "run" {
        "not tried".to_owned()
    } else {
        describe(CudaDevice::open(0), |device| format!("{device:?}"))
    };
    // SAFETY: a trial load of `libcuda` by cudarc's usual names.
    let version = if unsafe { sys::is_culib_present() } {
        let mut version = 0;
        // SAFETY: the library is present, so cudarc loads it rather than
        // panicking; the call writes the one `c_int` passed.
        let status = unsafe { sys::cuDriverGetVersion(&mut version) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        version.to_string()
    } else {
        "no library".to_owned()
    };
    println!("{MARK}version={version}");
    println!("{MARK}probe={probe}");
    println!("{MARK}open={open}");
    println!("{MARK}gpu_tests={gpu_tests}");
}

/// Makes `cuInit` fail with `code` and checks what hwqueue says: probe and
/// open both answer `NoDriver` (never panic) naming the code, with each of
/// `advice` (the cause and fix of that code), and still saying how to
/// install the driver (what tests/cuda.rs's
/// `probe_and_open_answer_without_panicking` expects); the GPU tests skip.
/// False (after printing why) when there is no C compiler.
fn assert_cuinit_failure(code: sys::CUresult, advice: &[&str]) -> bool {
    let number = (code as u32).to_string();
    let Some(outcome) = run_scenario(&[("HWQUEUE_FAKE_CUINIT", &number)]) else {
        return false;
    };
    assert!(
        outcome.calls.iter().any(|call| call == "cuInit"),
        "{outcome:#?}"
    );
    for text in [&outcome.probe, &outcome.open] {
        assert!(text.starts_with("NoDriver "), "{code:?}: {text}");
        let name = format!("{code:?}");
        let phrases = [name.as_str()].into_iter().chain(advice.iter().copied());
        for phrase in phrases.chain(["install"]) {
            assert!(text.contains(phrase), "{code:?}: no `{phrase}` in: {text}");
        }
    }
    assert_eq!(outcome.gpu_tests, "skipped: no CUDA driver");
    true
}

#[test]
fn cuinit_not_initialized_names_a_fork_as_the_cause_and_how_to_avoid_it() {
    assert_cuinit_failure(
        sys::CUresult::CUDA_ERROR_NOT_INITIALIZED,
        &["fork", "initialise CUDA only in the child"],
    );
}

#[test]
fn cuinit_compat_not_supported_says_to_take_cuda_compat_off_the_library_path() {
    assert_cuinit_failure(
        sys::CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        &["forward-compatibility", "cuda-compat", "LD_LIBRARY_PATH"],
    );
}

#[test]
fn every_common_cuinit_failure_names_its_cause_and_fix() {
    use sys::CUresult as R;
    // A phrase of each code's own cause or fix, so that no code falls back
    // to another's text.
    let cases = [
        (R::CUDA_ERROR_OUT_OF_MEMORY, "ulimit -v"),
        (R::CUDA_ERROR_STUB_LIBRARY, "stubs"),
        (R::CUDA_ERROR_DEVICE_UNAVAILABLE, "nvidia-smi -c DEFAULT"),
        (R::CUDA_ERROR_INVALID_DEVICE, "CUDA_VISIBLE_DEVICES"),
        (R::CUDA_ERROR_DEVICE_NOT_LICENSED, "licen"),
        (R::CUDA_ERROR_OPERATING_SYSTEM, "modprobe nvidia-uvm"),
        (R::CUDA_ERROR_NOT_PERMITTED, "--gpus all"),
        (R::CUDA_ERROR_NOT_SUPPORTED, "legacy"),
        (R::CUDA_ERROR_SYSTEM_NOT_READY, "nvidia-fabricmanager"),
        (R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "reboot"),
        (R::CUDA_ERROR_UNKNOWN, "modprobe nvidia_uvm"),
        // No specific advice: the default still names the code and number.
        (R::CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED (4)"),
    ];
    for (code, advice) in cases {
        if !assert_cuinit_failure(code, &[advice]) {
            return;
        }
    }
}

#[test]
fn a_driver_without_devices_probes_empty_and_the_gpu_tests_skip() {
    // cuInit succeeds and counts 0 devices, or answers NO_DEVICE: the same.
    for cuinit in ["0", "100"] {
        let Some(outcome) = run_scenario(&[
            ("HWQUEUE_FAKE_CUINIT", cuinit),
            ("HWQUEUE_FAKE_DEVICE_COUNT", "0"),
        ]) else {
            return;
        };
        assert!(
            outcome.calls.iter().any(|call| call == "cuInit"),
            "{outcome:#?}"
        );
        assert_eq!(outcome.probe, "ok 0 []", "{outcome:#?}");
        assert!(
            outcome.open.starts_with("NoSuchDevice ") && outcome.open.contains("has 0 device(s)"),
            "{outcome:#?}"
        );
        assert_eq!(outcome.gpu_tests, "skipped: no CUDA driver");
    }
}

#[test]
fn probe_lists_the_fake_devices_without_opening_them() {
    let Some(outcome) = run_scenario(&[("HWQUEUE_FAKE_DEVICE_COUNT", "2")]) else {
        return;
    };
    assert_eq!(
        outcome.probe,
        "ok 2 [cuda:0 hwqueue fake GPU 0 Some(1073741824) Some(4); \
         cuda:1 hwqueue fake GPU 1 Some(1073741824) Some(4)]",
        "{outcome:#?}"
    );
}

#[test]
fn a_driver_older_than_the_backend_needs_says_to_update_it() {
    let Some(outcome) = run_scenario(&[("HWQUEUE_FAKE_DRIVER_VERSION", "11020")]) else {
        return;
    };
    for text in [&outcome.probe, &outcome.open] {
        assert!(
            text.starts_with("NoDriver ") && text.contains("CUDA 11.2"),
            "{outcome:#?}"
        );
        assert!(text.contains("update the NVIDIA driver"), "{outcome:#?}");
    }
    // The version check comes first: the driver was never initialised.
    assert!(
        !outcome.calls.iter().any(|call| call == "cuInit"),
        "{outcome:#?}"
    );
}
