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
//! starting `HWQUEUE-FAKE `; the parent parses them and asserts. A scenario
//! that goes further (loads a kernel, runs a queue) is named by
//! [`SCENARIO`]; the child runs it after the probe and prints more lines.
#![cfg(all(feature = "cuda", target_os = "linux"))]

use std::path::{Path, PathBuf};

#[path = "cuda_fake_driver/contexts.rs"]
mod contexts;
#[path = "cuda_fake_driver/exec_checks.rs"]
mod exec_checks;
#[path = "cuda_fake_driver/failure_order.rs"]
mod failure_order;
#[path = "cuda_fake_driver/host_side.rs"]
mod host_side;
#[path = "cuda_fake_driver/memory.rs"]
mod memory;
#[cfg(feature = "nccl")]
#[path = "cuda_fake_driver/nccl.rs"]
mod nccl;
#[cfg(feature = "nccl")]
#[path = "cuda_fake_driver/nccl_nonblocking.rs"]
mod nccl_nonblocking;
#[path = "cuda_fake_driver/repeat.rs"]
mod repeat;
#[path = "cuda_fake_driver/threads.rs"]
mod threads;
#[path = "cuda_fake_driver/wait_policy.rs"]
mod wait_policy;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use hwqueue::cuda::{Cuda, CudaDevice, CudaProgram, STAGING_CACHE};
use hwqueue::{Backend, Buffer, Device, Error, HardwareQueue, QueueFactory, TimelineSignal};

/// Set (to `1`) in the child process only.
const CHILD: &str = "HWQUEUE_FAKE_CHILD";
/// What the child's report lines start with.
const MARK: &str = "HWQUEUE-FAKE ";
/// The scenario the child runs after the probe (see [`run_child_scenario`]);
/// unset, it only probes.
const SCENARIO: &str = "HWQUEUE_FAKE_SCENARIO";
/// Set by a scenario that needs NVRTC: the fake `libnvrtc.so`
/// (`tests/fake_cuda/libnvrtc.c`) then goes on the child's library path,
/// and reports this version.
const NVRTC_VERSION: &str = "HWQUEUE_FAKE_NVRTC_VERSION";
/// Set by a scenario that needs NCCL: `so` puts the fake `libnccl.so`
/// (`tests/fake_cuda/libnccl.c`) on the child's library path, `so2` the
/// same library named `libnccl.so.2` only (as NCCL's runtime package
/// installs it); unset, no NCCL.
const NCCL_FAKE: &str = "HWQUEUE_FAKE_NCCL";
/// The variables the fakes read (see `tests/fake_cuda/libcuda.c`), and
/// [`SCENARIO`].
const FAKE_VARS: [&str; 28] = [
    "HWQUEUE_FAKE_CUINIT",
    "HWQUEUE_FAKE_DRIVER_VERSION",
    "HWQUEUE_FAKE_DEVICE_COUNT",
    "HWQUEUE_FAKE_CALLS",
    "HWQUEUE_FAKE_MAX_PTX_ISA",
    "HWQUEUE_FAKE_FAULT_AFTER",
    "HWQUEUE_FAKE_FAULT",
    "HWQUEUE_FAKE_FAULT_SEEN_BY",
    "HWQUEUE_FAKE_LAUNCHES",
    "HWQUEUE_FAKE_REFUSE",
    "HWQUEUE_FAKE_REFUSAL",
    "HWQUEUE_FAKE_REFUSE_TIMES",
    "HWQUEUE_FAKE_EVENT_DELAY_US",
    NVRTC_VERSION,
    NCCL_FAKE,
    "HWQUEUE_FAKE_NCCL_FAIL",
    "HWQUEUE_FAKE_NCCL_RESULT",
    "HWQUEUE_FAKE_NCCL_HANG",
    "HWQUEUE_FAKE_NCCL_HANG_S",
    "HWQUEUE_FAKE_NCCL_ASYNC_ERROR",
    "HWQUEUE_FAKE_NCCL_IDLE_ERROR",
    "NCCL_COMM_BLOCKING",
    "HWQUEUE_FAKE_NCCL_FAIL_LATE",
    "HWQUEUE_FAKE_NCCL_BLOCK_HOST",
    "HWQUEUE_FAKE_NCCL_DESTROY_RAISES",
    "HWQUEUE_FAKE_NCCL_BLOCK_S",
    "HWQUEUE_FAKE_NCCL_INIT_SETTLED",
    SCENARIO,
];

/// The directory holding the fake `libcuda.so` (and `libcuda.so.1`), built
/// once per process; `None` without a C compiler.
fn fake_driver_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    // cudarc tries `libcuda.so` first and `libcuda.so.1` last: both are the
    // fake, so no real driver further down the path can win.
    DIR.get_or_init(|| build_fake("libcuda.c", "fake_cuda", &["libcuda.so", "libcuda.so.1"]))
        .as_deref()
}

/// The directory holding the fake `libnvrtc.so`, built once per process;
/// `None` without a C compiler. A directory of its own: only scenarios that
/// set [`NVRTC_VERSION`] have it on their path.
fn fake_nvrtc_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| build_fake("libnvrtc.c", "fake_nvrtc", &["libnvrtc.so"]))
        .as_deref()
}

/// The directory holding the fake NCCL under `name` (`libnccl.so`, or
/// `libnccl.so.2` alone), built once per process and name; `None` without
/// a C compiler.
fn fake_nccl_dir(name: &str) -> Option<&'static Path> {
    static SO: OnceLock<Option<PathBuf>> = OnceLock::new();
    static SO2: OnceLock<Option<PathBuf>> = OnceLock::new();
    match name {
        "libnccl.so" => SO.get_or_init(|| build_fake("libnccl.c", "fake_nccl", &[name])),
        _ => SO2.get_or_init(|| build_fake("libnccl.c", "fake_nccl_so2", &[name])),
    }
    .as_deref()
}

/// Compiles `tests/fake_cuda/<source>` into a shared library in directory
/// `dir` of the target's scratch space, under each of `names`; `None`
/// without a C compiler.
fn build_fake(source: &str, dir: &str, names: &[&str]) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fake_cuda")
        .join(source);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Compiled under a name of this process's own, then renamed into
    // place: another test process may be loading the library meanwhile,
    // and a rename swaps the whole file at once.
    let scratch = dir.join(format!("build.{}.tmp", std::process::id()));
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
    for name in names {
        let copy = dir.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::copy(&scratch, &copy).unwrap();
        std::fs::rename(&copy, dir.join(name)).unwrap();
    }
    std::fs::remove_file(&scratch).unwrap();
    Some(dir)
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
    /// The kernels the fake ran and the graphs it launched, in order (its
    /// `HWQUEUE_FAKE_LAUNCHES` log: `kernel NAME via=... params=...` and
    /// `graph nodes=N` lines).
    launches: Vec<String>,
    /// All the child printed, for the lines of a [`SCENARIO`].
    stdout: String,
}

impl Outcome {
    /// What the child reported as `key` (a [`SCENARIO`]'s own lines).
    fn field(&self, key: &str) -> &str {
        find_field(&self.stdout, key).unwrap_or_else(|| panic!("no `{key}` in {self:#?}"))
    }

    /// Whether the fake was called through `symbol`.
    fn called(&self, symbol: &str) -> bool {
        self.calls.iter().any(|call| call == symbol)
    }
}

/// The value of the child's report line `key`, if it printed one.
fn find_field<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout.lines().find_map(|line| {
        // libtest prints `test fake_driver_child ... ` with no line break
        // before the test's own output: a mark may be mid-line.
        line.split_once(MARK)?
            .1
            .strip_prefix(key)?
            .strip_prefix('=')
    })
}

/// How long a child may run before it is killed and its test fails: the
/// longest scenario takes about 20 s (a fake NCCL call blocking the host
/// that long), and a loaded machine may take a few times that.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Runs [`fake_driver_child`] in a child process over the fake driver with
/// `vars` set; `None` (after printing why) when there is no C compiler.
/// A child still running after [`CHILD_LIMIT`] fails the test.
fn run_scenario(vars: &[(&str, &str)]) -> Option<Outcome> {
    run_scenario_within(vars, CHILD_LIMIT)
}

/// Runs `command` to its end, with its output, or kills it once `limit`
/// passed (`Err`, with what it printed until then): a child that hangs (a
/// defect in what a scenario waits for) fails its test, instead of
/// holding the test run until CI's own limit kills it unnamed.
fn output_within(mut command: Command, limit: Duration) -> Result<Output, Output> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("re-running the test binary");
    // Read beside the wait: a child whose pipe fills up would otherwise
    // block in its writes and never end.
    fn read_all(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }
    let stdout = read_all(child.stdout.take().expect("piped"));
    let stderr = read_all(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + limit;
    let (status, hung) = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break (status, false);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break (child.wait().expect("waiting for the killed child"), true);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let output = Output {
        status,
        stdout: stdout.join().expect("reading the child's stdout"),
        stderr: stderr.join().expect("reading the child's stderr"),
    };
    if hung { Err(output) } else { Ok(output) }
}

/// [`run_scenario`], killing the child and failing after `limit`.
fn run_scenario_within(vars: &[(&str, &str)], limit: Duration) -> Option<Outcome> {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = fake_driver_dir() else {
        println!("skipped: no C compiler");
        return None;
    };
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let calls = dir.join(format!("calls-{}-{run}.log", std::process::id()));
    let launches = dir.join(format!("launches-{}-{run}.log", std::process::id()));
    let _ = std::fs::remove_file(&calls);
    let _ = std::fs::remove_file(&launches);
    let mut library_path = dir.as_os_str().to_owned();
    if vars.iter().any(|(var, _)| *var == NVRTC_VERSION) {
        let Some(nvrtc) = fake_nvrtc_dir() else {
            println!("skipped: no C compiler");
            return None;
        };
        library_path.push(":");
        library_path.push(nvrtc);
    }
    if let Some((_, which)) = vars.iter().find(|(var, _)| *var == NCCL_FAKE) {
        let name = if *which == "so2" {
            "libnccl.so.2"
        } else {
            "libnccl.so"
        };
        let Some(nccl) = fake_nccl_dir(name) else {
            println!("skipped: no C compiler");
            return None;
        };
        library_path.push(":");
        library_path.push(nccl);
    }
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH").filter(|rest| !rest.is_empty()) {
        library_path.push(":");
        library_path.push(rest);
    }
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
        .env("HWQUEUE_FAKE_LAUNCHES", &launches)
        // A GPU job's "fail without a GPU" switch is about the real GPU.
        .env_remove("HWQUEUE_REQUIRE_GPU")
        .envs(vars.iter().copied());
    let output = output_within(child, limit).unwrap_or_else(|output| {
        panic!(
            "the child did not end within {limit:?} (killed): scenario {vars:?}\n--- stdout\n{}\n--- stderr\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let read_log = |path: &Path| -> Vec<String> {
        let lines = std::fs::read_to_string(path).unwrap_or_default();
        let _ = std::fs::remove_file(path);
        lines.lines().map(str::to_owned).collect()
    };
    let calls_made = read_log(&calls);
    let launches_made = read_log(&launches);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let context = || {
        format!(
            "scenario {vars:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert!(output.status.success(), "the child failed: {}", context());
    let field = |key: &str| {
        find_field(&stdout, key)
            .unwrap_or_else(|| panic!("the child printed no `{key}`: {}", context()))
            .to_owned()
    };
    let outcome = Outcome {
        version: field("version"),
        probe: field("probe"),
        open: field("open"),
        gpu_tests: field("gpu_tests"),
        calls: calls_made,
        launches: launches_made,
        stdout: stdout.to_string(),
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
                Error::DeviceLost { .. } => "DeviceLost",
                Error::Driver { .. } => "Driver",
                Error::InvalidProgram { .. } => "InvalidProgram",
                Error::EntryPointNotFound { .. } => "EntryPointNotFound",
                Error::SignalFailed { .. } => "SignalFailed",
                Error::Timeout { .. } => "Timeout",
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
    report("version", &version);
    report("probe", &probe);
    report("open", &open);
    report("gpu_tests", gpu_tests);
    if let Ok(scenario) = std::env::var(SCENARIO) {
        run_child_scenario(&scenario);
    }
}

/// Prints a report line for the parent, on one line.
fn report(key: &str, value: &str) {
    println!("{MARK}{key}={}", value.replace('\n', "\\n"));
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

// ---- Scenarios past the probe: a device opened, kernels, queues ----------

/// A kernel of two pointers and a `u32`, in the form NVRTC writes PTX (ISA
/// 7.8, CUDA 11.8's); the fake driver keeps the text and finds the entry in
/// it. Written by hand: no NVRTC is needed.
const SCALE_PTX: &str = "\
// The `.entry` of `scale(float *out, const float *in, unsigned n)`.

.version 7.8
.target sm_70
.address_size 64

.visible .entry scale(
\t.param .u64 scale_param_0,
\t.param .u64 scale_param_1,
\t.param .u32 scale_param_2
)
{
\tret;
}
";

/// [`SCALE_PTX`] declaring ISA `version` instead.
fn scale_ptx(version: &str) -> String {
    SCALE_PTX.replace(".version 7.8", &format!(".version {version}"))
}

/// The child's half of a [`SCENARIO`]: opens device 0 (reported as
/// `device`), then does what the scenario names and reports each step.
fn run_child_scenario(scenario: &str) {
    let device = match CudaDevice::open(0) {
        Ok(device) => device,
        Err(error) => {
            report("device", &describe::<()>(Err(error), |()| String::new()));
            return;
        }
    };
    report("device", "ok");
    let loaded = |_: CudaProgram| "loaded".to_owned();
    match scenario {
        // Checked loading on a driver without `cuFuncGetParamInfo`.
        "ptx_params" => {
            report("param_info_symbol", param_info_symbol());
            let matching = CudaProgram::from_ptx(&device, SCALE_PTX, "scale", 2, 1);
            report("matching", &describe(matching, loaded));
            let wrong_count = CudaProgram::from_ptx(&device, SCALE_PTX, "scale", 2, 0);
            report("wrong_count", &describe(wrong_count, loaded));
        }
        // PTX of ISA 8.8 (CUDA 12.9's) on a driver that reads up to 8.2.
        "ptx_too_new" => {
            // Unchecked, so that only the PTX's version decides.
            // SAFETY: the kernel is never launched, so its parameters
            // need not match.
            let at_limit = unsafe {
                CudaProgram::from_ptx_unchecked(&device, &scale_ptx("8.2"), "scale", 2, 1)
            };
            report("at_limit", &describe(at_limit, loaded));
            // SAFETY: a trial load of NVRTC by cudarc's usual names.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                report("nvrtc", "present");
            } else {
                report("nvrtc", "absent");
            }
            let too_new = CudaProgram::from_ptx(&device, &scale_ptx("8.8"), "scale", 2, 1);
            report("too_new", &describe(too_new, loaded));
        }
        // One upload larger than the staging cache, so the page-locked
        // chunk it goes through is freed (`cuMemFreeHost`) as soon as it is
        // given back, rather than kept: the call log shows when that is.
        "staged_upload" => {
            let len = STAGING_CACHE / 4 + 1;
            let data: Vec<u32> = (0..len as u32).collect();
            let last = data[len - 1];
            let buffer = device.alloc_uninit(len * 4).unwrap();
            let mut queue = device.compute_queue().unwrap();
            let submitted = queue.upload_vec(&buffer, data).submit();
            report("submit", &describe(submitted, |()| String::new()));
            report(
                "synchronize",
                &describe(queue.synchronize(), |()| String::new()),
            );
            report("health", &describe(device.health(), |()| String::new()));
            if device.health().is_ok() {
                let mut ends = [0u32; 2];
                buffer.read_at(0, &mut ends[..1]).unwrap();
                buffer.read_at((len - 1) * 4, &mut ends[1..]).unwrap();
                report("ends", &format!("{ends:?} of [0, {last}]"));
            }
        }
        // An upload (staged, over the cache: its staging is freed as soon
        // as it is let go) into a buffer `alloca` made, and its
        // `dealloca`, in one batch; then a batch of a signal alone, whose
        // submit retires what the stream passed (querying the first
        // batch's completion event). Reports the buffer's phase after
        // each step, and what `synchronize` said. Then again (`again_*`),
        // with two more submits of a signal (the first, a retry of the
        // second) before `synchronize`.
        "query_error" => {
            let len = STAGING_CACHE / 4 + 1;
            let mut queue = device.compute_queue().unwrap();
            let signal = device.new_signal(0).unwrap();
            let outcome = |r: Result<(), Error>| describe(r, |()| String::new());
            let phase =
                |b: &hwqueue::cuda::CudaBuffer| format!("{:?}", b.queue_ordered().unwrap().phase());
            let scratch = queue.alloca(len * 4).unwrap();
            let data: Vec<u32> = (0..len as u32).collect();
            let submitted = queue.upload_vec(&scratch, data).dealloca(&scratch).submit();
            report("submit", &outcome(submitted));
            report("second", &outcome(queue.signal(&signal, 1).submit()));
            report("phase_after_second", &phase(&scratch));
            report("synchronize", &outcome(queue.synchronize()));
            report("phase_after_synchronize", &phase(&scratch));
            report("health", &describe(device.health(), |()| String::new()));
            let scratch = queue.alloca(len * 4).unwrap();
            let data: Vec<u32> = (0..len as u32).collect();
            let submitted = queue.upload_vec(&scratch, data).dealloca(&scratch).submit();
            report("again_submit", &outcome(submitted));
            report("again_second", &outcome(queue.signal(&signal, 2).submit()));
            report("again_third", &outcome(queue.signal(&signal, 3).submit()));
            // The batch the failure report left recorded.
            report("again_retry", &outcome(queue.submit()));
            report("again_phase_after_retry", &phase(&scratch));
            report("again_synchronize", &outcome(queue.synchronize()));
            report("again_phase_after_synchronize", &phase(&scratch));
        }
        // [`PILE_UP_SUBMITS`] batches, each a small upload into a buffer
        // `alloca` made and its `dealloca`, submitted one after another with
        // no `synchronize` between (an owner that only submits), each
        // buffer kept: a batch in flight holds its `dealloca`'s range out
        // of the pool (`DeallocaRecorded`) until it is let go. Reports the
        // most buffers held so at once after a submit (`peak_held`), how
        // many submits failed and the first and last failure, how many are
        // held after the last submit, then what `synchronize` said and how
        // many are held after it.
        "pile_up" => {
            let mut queue = device.compute_queue().unwrap();
            let outcome = |r: Result<(), Error>| describe(r, |()| String::new());
            let held = |buffers: &[hwqueue::cuda::CudaBuffer]| {
                buffers
                    .iter()
                    .filter(|b| {
                        b.queue_ordered().unwrap().phase()
                            == hwqueue::memory::Phase::DeallocaRecorded
                    })
                    .count()
            };
            let mut scratches = Vec::new();
            let (mut peak, mut failed) = (0, 0);
            let (mut first_error, mut last_error) = (None, None);
            for i in 0..PILE_UP_SUBMITS {
                let scratch = queue.alloca(64).unwrap();
                queue
                    .upload_vec(&scratch, vec![i as u32; 16])
                    .dealloca(&scratch);
                if let Err(error) = queue.submit() {
                    failed += 1;
                    let error = outcome(Err(error));
                    first_error.get_or_insert_with(|| error.clone());
                    last_error = Some(error);
                }
                scratches.push(scratch);
                peak = peak.max(held(&scratches));
            }
            report("peak_held", &peak.to_string());
            report("failed_submits", &failed.to_string());
            report("first_error", first_error.as_deref().unwrap_or("none"));
            report("last_error", last_error.as_deref().unwrap_or("none"));
            report("held_after_submits", &held(&scratches).to_string());
            report("synchronize", &outcome(queue.synchronize()));
            report("held_after_synchronize", &held(&scratches).to_string());
            report("health", &describe(device.health(), |()| String::new()));
        }
        // An upload (staged, over the cache: its staging is freed as soon
        // as it is let go) into a buffer `alloca` made, and its `dealloca`,
        // in one batch; then `synchronize` (not in `wait_error_drop`), and
        // the queue's drop. Reports the buffer's phase after each step,
        // once the drop's worker let go of the stream (the fake logged its
        // `cuStreamDestroy_v2`), and what `synchronize` said.
        "wait_error" | "wait_error_drop" => {
            let len = STAGING_CACHE / 4 + 1;
            let mut queue = device.compute_queue().unwrap();
            let outcome = |r: Result<(), Error>| describe(r, |()| String::new());
            let phase =
                |b: &hwqueue::cuda::CudaBuffer| format!("{:?}", b.queue_ordered().unwrap().phase());
            let scratch = queue.alloca(len * 4).unwrap();
            let data: Vec<u32> = (0..len as u32).collect();
            let submitted = queue.upload_vec(&scratch, data).dealloca(&scratch).submit();
            report("submit", &outcome(submitted));
            report("phase_after_submit", &phase(&scratch));
            if scenario == "wait_error" {
                report("synchronize", &outcome(queue.synchronize()));
                report("phase_after_synchronize", &phase(&scratch));
            }
            let log = std::env::var("HWQUEUE_FAKE_CALLS").unwrap();
            let destroyed = || {
                let calls = std::fs::read_to_string(&log).unwrap_or_default();
                calls.lines().filter(|l| *l == "cuStreamDestroy_v2").count()
            };
            let before = destroyed();
            drop(queue);
            let start = std::time::Instant::now();
            while destroyed() == before && start.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let shut = if destroyed() > before {
                "done"
            } else {
                "timed out"
            };
            report("shut_down", shut);
            report("phase_after_drop", &phase(&scratch));
            report("health", &describe(device.health(), |()| String::new()));
        }
        // The conformance case `failure_scoped_to_its_batch_drains_and_settles`
        // without kernels: a batch of a `FailureScope::Batch` queue that
        // fails at its first wait must still honour its later wait before
        // failing the signal after it.
        "failure_scope" => {
            let signal = || device.new_signal(0).unwrap();
            let (gate, later, done, drained) = (signal(), signal(), signal(), signal());
            let second = device.alloc(16).unwrap();
            let mut queue = device.compute_queue().unwrap();
            queue
                .set_failure_scope(hwqueue::FailureScope::Batch)
                .unwrap();
            queue
                .wait(&gate, 1)
                .signal(&done, 1)
                .wait(&later, 1)
                .signal(&drained, 1)
                .submit()
                .unwrap();
            queue.fill(&second, 6u32).signal(&done, 2).submit().unwrap();
            gate.fail(
                1,
                Error::Abandoned {
                    reason: "failed by the test",
                },
            );
            let long = std::time::Duration::from_secs(10);
            let short = std::time::Duration::from_millis(100);
            let outcome = |r: Result<(), Error>| describe(r, |()| String::new());
            report("done1", &outcome(done.wait(1, long).map(drop)));
            report("drained_before", &outcome(drained.wait(1, short).map(drop)));
            later.set(1);
            report("drained_after", &outcome(drained.wait(1, long).map(drop)));
            report("done2", &outcome(done.wait(2, long).map(drop)));
            report("second", &format!("{:?}", second.to_vec::<u32>().unwrap()));
        }
        // A plan over the CPU and CUDA (issue 44): runs back to back, a
        // failing and a refused one among them, each run's waits on the
        // run before crossing backends both ways. The fake's kernels do
        // nothing, so the CUDA side copies instead of adding.
        "plan_two_backends" => {
            use hwqueue::{AnyBackend, AnyDevice};
            let cpu = std::sync::Arc::new(AnyDevice::from(hwqueue::cpu::CpuDevice::new()));
            let cuda = std::sync::Arc::new(AnyDevice::from(device));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                hwqueue_testkit::check_plan_over_two_backends::<AnyBackend>(cpu, cuda, None);
            }));
            let outcome = outcome.map_err(hwqueue::error::panic_message);
            report(
                "plan",
                &match outcome {
                    Ok(()) => "ok".to_owned(),
                    Err(message) => format!("failed: {message}"),
                },
            );
        }
        "graph_replay" => graph_replay(&device),
        // A second open of device 0: its buffers, zero-filled, copied on
        // a queue of the first handle.
        "second_handle" => {
            let second = CudaDevice::open(0).unwrap();
            let mut queue = device.compute_queue().unwrap();
            let (src, dst) = (second.alloc(4096).unwrap(), second.alloc(4096).unwrap());
            report("same", &second.same_as(&device).to_string());
            let copied = queue
                .copy(&dst, &src)
                .submit()
                .and_then(|()| queue.synchronize());
            report("copied", &describe(copied, |()| String::new()));
        }
        // Fills of an empty buffer and of an empty view.
        "empty_fill" => {
            let (empty, real) = (device.alloc(0).unwrap(), device.alloc(64).unwrap());
            let mut queue = device.compute_queue().unwrap();
            queue
                .fill(&empty, 7u8)
                .fill(&real.view(64, 0).unwrap(), 7u32);
            let filled = queue.submit().and_then(|()| queue.synchronize());
            report("filled", &describe(filled, |()| String::new()));
            report(
                "real",
                &format!("{:?}", real.to_vec::<u8>().unwrap()[..4].to_vec()),
            );
        }
        // A host write that meets a sticky fault.
        "host_fault" => {
            let buffer = device.alloc(64).unwrap();
            let written = buffer.write_at(0, &[1u32; 4]);
            report("write", &describe(written, |()| String::new()));
            report("health", &describe(device.health(), |()| String::new()));
        }
        // An upload owner whose drop panics, then a batch of a signal
        // alone: the queue goes on.
        "panicking_owner" => {
            struct PanicsOnDrop(Vec<u8>);
            impl AsRef<[u8]> for PanicsOnDrop {
                fn as_ref(&self) -> &[u8] {
                    &self.0
                }
            }
            impl Drop for PanicsOnDrop {
                fn drop(&mut self) {
                    panic!("injected failure: {}", "an upload owner's drop panics");
                }
            }
            let buffer = device.alloc(4).unwrap();
            let (first, second) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
            let mut queue = device.compute_queue().unwrap();
            let submitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                queue
                    .upload_vec(&buffer, PanicsOnDrop(vec![1, 2, 3, 4]))
                    .signal(&first, 1)
                    .submit()
            }));
            report("first", &format!("{:?}", submitted.map(|r| r.is_ok())));
            let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                queue.signal(&second, 1).submit().unwrap();
                second.wait(1, std::time::Duration::from_secs(5))
            }));
            report("second", &format!("{waited:?}"));
            let synchronized =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| queue.synchronize()));
            report("synchronize", &format!("{synchronized:?}"));
        }
        "plan_replay" => plan_replay(device),
        "many_params" => many_params(&device),
        "signal_behind_wait" => signal_behind_wait(&device),
        "plan_rebind" => plan_rebind(device),
        "repeat_order" => repeat::run(&device),
        "exec_checks" => exec_checks::run(&device),
        "exec_checks_lost" => exec_checks::run_lost(&device),
        "record_lost" => exec_checks::run_record_lost(&device),
        "exec_params" => exec_checks::run_params(&device),
        "plan_threads" => threads::run(device),
        "host_side_threads" => host_side::run(device),
        #[cfg(feature = "nccl")]
        other if other.starts_with("nccl:") => nccl::run(&device, &other["nccl:".len()..]),
        #[cfg(feature = "nccl")]
        other if other.starts_with("nccl_nonblocking:") => {
            nccl_nonblocking::run(&device, &other["nccl_nonblocking:".len()..])
        }
        "other_device_event" => contexts::run(false),
        "other_device_last_event" => contexts::run(true),
        "signal_event_drop" => contexts::run_event_drop(&device),
        other if other.starts_with("memory:") => memory::run(&device, &other["memory:".len()..]),
        other if other.starts_with("failure_order:") => {
            failure_order::run(&device, &other["failure_order:".len()..]);
        }
        other if other.starts_with("wait_policy:") => {
            wait_policy::run(&device, &other["wait_policy:".len()..]);
        }
        // Never ends: what a defect that hangs a scenario looks like to
        // the parent (`a_hung_child_fails_its_test_instead_of_hanging_the_run`).
        "hang" => loop {
            std::thread::park();
        },
        other => panic!("no scenario `{other}`"),
    }
}

/// A child that never ends (here the `hang` scenario; for real, a defect
/// in what a scenario waits for) is killed after its limit and fails its
/// test, naming the scenario. `Command::output` waited for it without
/// bound: this test hung, and with it the whole run.
#[test]
fn a_hung_child_fails_its_test_instead_of_hanging_the_run() {
    if fake_driver_dir().is_none() {
        println!("skipped: no C compiler");
        return;
    }
    let started = Instant::now();
    let hung = std::panic::catch_unwind(|| {
        run_scenario_within(&on_a_12_2_device("hang", &[]), Duration::from_secs(3))
    });
    let message = match hung {
        Ok(outcome) => panic!("a child that never ends returned: {outcome:?}"),
        Err(panic) => panic
            .downcast::<String>()
            .map_or_else(|_| String::new(), |message| *message),
    };
    assert!(
        message.contains("did not end within 3s (killed)") && message.contains("hang"),
        "{message}"
    );
    // The probe's report, printed before the child hung, comes with it.
    assert!(message.contains("HWQUEUE-FAKE device=ok"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// How many times [`graph_replay`] captures `scale`.
const KERNELS: u32 = 3;

/// The child's half of the graph scenarios (issue 45): on a stream of
/// cudarc's, captures an upload of 4 words, [`KERNELS`] launches of `scale`
/// (its `n` the launch's number: 1, 2, 3) and a download back, and launches
/// the graph 3 times, new words going up each time; before the third, the
/// first kernel's `n` becomes 10 on the executable graph. Reports the graph's
/// node types, what each launch brought back (`launch1` ..), and the first
/// kernel node's `n` as the graph keeps it before and after that update.
/// First, a capture that synchronises its stream, which capture forbids.
fn graph_replay(device: &CudaDevice) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    const WORDS: usize = 4;
    let context = device.context();
    let stream = context.new_stream().unwrap();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let no_flags = CUgraphInstantiate_flags(0);

    stream.begin_capture(mode).unwrap();
    report("sync_in_capture", &format!("{:?}", stream.synchronize()));
    let invalidated = stream.end_capture(no_flags).map(|graph| graph.is_some());
    report("invalidated_end", &format!("{invalidated:?}"));

    let module = context.load_module(SCALE_PTX.into()).unwrap();
    let scale = module.load_function("scale").unwrap();
    let buffer = device.alloc(WORDS * 4).unwrap();
    let on_device = buffer.device_pointer();
    // The words going up, then the words coming back: the graph reads and
    // writes them through these pointers each time it runs.
    let mut host = vec![0u32; 2 * WORDS];
    let input = host.as_mut_ptr();
    // SAFETY: `host` holds 2 * WORDS words.
    let output = unsafe { input.add(WORDS) };
    stream.begin_capture(mode).unwrap();
    report("status", &format!("{:?}", stream.capture_status().unwrap()));
    // SAFETY: WORDS words from `host`, which outlives the graph, to the
    // buffer, as large.
    unsafe { sys::cuMemcpyHtoDAsync_v2(on_device, input.cast(), WORDS * 4, stream.cu_stream()) }
        .result()
        .unwrap();
    for n in 1..=KERNELS {
        let mut launch = stream.launch_builder(&scale);
        launch.arg(&on_device).arg(&on_device).arg(&n);
        // SAFETY: `scale` takes two pointers and a `u32`, and the fake's
        // kernels touch nothing.
        unsafe { launch.launch(LaunchConfig::for_num_elems(WORDS as u32)) }.unwrap();
    }
    // SAFETY: as the upload, the other way.
    unsafe { sys::cuMemcpyDtoHAsync_v2(output.cast(), on_device, WORDS * 4, stream.cu_stream()) }
        .result()
        .unwrap();
    let graph = match stream.end_capture(no_flags) {
        Ok(graph) => graph.expect("a capture of work makes a graph"),
        Err(error) => return report("end_capture", &format!("{error:?}")),
    };
    report("end_capture", "ok");

    let nodes = graph_nodes(graph.cu_graph());
    let types: Vec<_> = nodes.iter().map(|&node| node_type(node)).collect();
    report("nodes", &format!("{types:?}"));
    let first_kernel = nodes[1];
    report("n_in_graph", &kernel_params(first_kernel).1.to_string());
    for launch in 1..=3u32 {
        if launch == 3 {
            let (mut params, _) = kernel_params(first_kernel);
            let mut n = 10u32;
            // SAFETY: the node's `scale` has 3 parameters.
            let mut args = unsafe { std::slice::from_raw_parts(params.kernelParams, 3) }.to_vec();
            args[2] = (&raw mut n).cast();
            params.kernelParams = args.as_mut_ptr();
            // SAFETY: a kernel node of the graph the exec was made from,
            // with parameters for its kernel, which the driver copies.
            let set = unsafe {
                sys::cuGraphExecKernelNodeSetParams_v2(graph.cu_graph_exec(), first_kernel, &params)
            };
            report("set_params", &format!("{set:?}"));
        }
        let words: Vec<u32> = (0..WORDS as u32).map(|i| 100 * launch + i).collect();
        // SAFETY: WORDS words into the first half of `host`.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), input, WORDS) };
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        // SAFETY: the second half of `host`, which the graph wrote.
        let back = unsafe { std::slice::from_raw_parts(output, WORDS) };
        report(&format!("launch{launch}"), &format!("{back:?}"));
    }
    report(
        "n_in_graph_after",
        &kernel_params(first_kernel).1.to_string(),
    );
    drop(graph);
    drop(host);
}

/// The nodes of `graph`, in the order capture added them.
fn graph_nodes(graph: sys::CUgraph) -> Vec<sys::CUgraphNode> {
    let mut count = 0;
    // SAFETY: a live graph; with no array, only the count is written.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }
        .result()
        .unwrap();
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: room for `count` nodes.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }
        .result()
        .unwrap();
    nodes
}

fn node_type(node: sys::CUgraphNode) -> sys::CUgraphNodeType {
    let mut kind = std::mem::MaybeUninit::uninit();
    // SAFETY: a node of a live graph; the call writes the type.
    unsafe { sys::cuGraphNodeGetType(node, kind.as_mut_ptr()) }
        .result()
        .unwrap();
    // SAFETY: written by the successful call.
    unsafe { kind.assume_init() }
}

/// A `scale` kernel node's parameters, and its `n` (the third).
fn kernel_params(node: sys::CUgraphNode) -> (sys::CUDA_KERNEL_NODE_PARAMS, u32) {
    let mut params = std::mem::MaybeUninit::uninit();
    // SAFETY: a kernel node of a live graph; the call writes the struct.
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, params.as_mut_ptr()) }
        .result()
        .unwrap();
    // SAFETY: written by the successful call.
    let params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { params.assume_init() };
    // SAFETY: `scale`'s third parameter is a `u32`, kept by the node.
    let n = unsafe { *(*params.kernelParams.add(2)).cast::<u32>() };
    (params, n)
}

/// Whether the `libcuda` loaded exports `cuFuncGetParamInfo` (CUDA 12.4):
/// `absent` on the fake, as on every driver before 12.4.
fn param_info_symbol() -> &'static str {
    // SAFETY: the driver library by the name cudarc loaded it, so the
    // loader hands back the library already loaded (the fake, first on
    // the path); loading it runs no initialisers a second time.
    let library = unsafe { libloading::Library::new("libcuda.so") }.expect("libcuda.so loads");
    // SAFETY: only whether the symbol exists is asked; it is not called.
    match unsafe { library.get::<unsafe extern "C" fn()>(b"cuFuncGetParamInfo\0") } {
        Ok(_) => "present",
        Err(_) => "absent",
    }
}

/// The variables of a [`SCENARIO`] on one fake device of a CUDA 12.2 driver
/// whose JIT reads PTX up to ISA 8.2 (as 12.2's does), plus `extra`.
fn on_a_12_2_device<'a>(
    scenario: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut vars = vec![
        (SCENARIO, scenario),
        ("HWQUEUE_FAKE_DEVICE_COUNT", "1"),
        ("HWQUEUE_FAKE_DRIVER_VERSION", "12020"),
        ("HWQUEUE_FAKE_MAX_PTX_ISA", "82"),
    ];
    vars.extend_from_slice(extra);
    vars
}

/// Issue 24, defect 5: checked loading asked the driver for the kernel's
/// parameters (`cuFuncGetParamInfo`, CUDA 12.4), so on the 12.2 (r535)
/// drivers many clusters run, a correctly declared kernel could not be
/// loaded at all. The parameters come from the PTX's `.entry` now.
#[test]
fn checked_ptx_loading_works_on_a_driver_without_cufuncgetparaminfo() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("ptx_params", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    // The point of the scenario: the driver cannot report parameters (a
    // call would have made cudarc panic, failing the child).
    assert_eq!(outcome.field("param_info_symbol"), "absent");
    assert_eq!(outcome.field("matching"), "ok loaded", "{outcome:#?}");
    let wrong = outcome.field("wrong_count");
    assert!(wrong.starts_with("InvalidProgram "), "{wrong}");
    assert!(
        wrong.contains(
            "the kernel takes 3 parameters, but was declared with 2 buffers and 0 scalars"
        ),
        "{wrong}"
    );
    // The driver loaded the module and found the kernel in it both times.
    let loads = outcome
        .calls
        .iter()
        .filter(|call| *call == "cuModuleLoadData");
    assert_eq!(loads.count(), 2, "{outcome:#?}");
    assert!(outcome.called("cuModuleGetFunction"), "{outcome:#?}");
    assert!(!outcome.called("cuFuncGetParamInfo"), "{outcome:#?}");
}

/// Issue 24, defect 4: PTX of an ISA newer than the driver's JIT
/// (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) said neither which ISA nor which
/// CUDA it needs. The error names the PTX's ISA, the CUDA release that
/// introduced it, the driver's CUDA and the fix.
#[test]
fn ptx_newer_than_the_driver_names_both_versions_and_says_to_update_the_driver() {
    let vars = on_a_12_2_device("ptx_too_new", &[(NVRTC_VERSION, "12.9")]);
    let Some(outcome) = run_scenario(&vars) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    let text = outcome.field("too_new");
    assert!(text.starts_with("Driver "), "{text}");
    for phrase in [
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        "ISA 8.8, which needs a CUDA 12.9 driver",
        "driver supports CUDA 12.2",
        "NVRTC here is 12.9",
        "update the GPU driver",
    ] {
        assert!(text.contains(phrase), "no `{phrase}` in: {text}");
    }
    assert!(outcome.called("nvrtcVersion"), "{outcome:#?}");
    // Not vacuous: the fake refuses only what is newer than its JIT.
    assert_eq!(outcome.field("at_limit"), "ok loaded", "{outcome:#?}");
}

/// As above with no NVRTC installed (a user loading PTX made elsewhere,
/// which `from_ptx` is documented for): still an error, not a panic.
#[test]
fn ptx_newer_than_the_driver_is_an_error_without_nvrtc_too() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("ptx_too_new", &[])) else {
        return;
    };
    if outcome.field("nvrtc") == "present" {
        println!("skipped: a real NVRTC is installed");
        return;
    }
    let text = outcome.field("too_new");
    assert!(text.starts_with("Driver "), "{text}");
    assert!(text.contains("ISA 8.8"), "{text}");
}

/// What every staged-upload scenario checks: the device opened and the
/// upload went through page-locked staging.
fn assert_staged(outcome: &Outcome) {
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("submit"), "ok ", "{outcome:#?}");
    assert!(outcome.called("cuMemHostAlloc"), "{outcome:#?}");
}

/// The control of the next test: on a healthy device, staging larger than
/// the cache goes back to the driver (`cuMemFreeHost`) once the batch is
/// done, so a free of staging shows in the call log.
#[test]
fn staging_larger_than_the_cache_is_freed_once_its_batch_is_done() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("staged_upload", &[])) else {
        return;
    };
    assert_staged(&outcome);
    assert_eq!(outcome.field("synchronize"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
    let last = STAGING_CACHE / 4;
    assert_eq!(
        outcome.field("ends"),
        format!("[0, {last}] of [0, {last}]"),
        "{outcome:#?}"
    );
    assert!(outcome.called("cuMemFreeHost"), "{outcome:#?}");
}

/// Issue 24, defect 8: after a sticky fault the driver may still copy to
/// or from page-locked staging, so hwqueue must never free it then. A fault
/// first seen by recording a batch's completion event, by querying it, or
/// by synchronising the stream was not made a device error before the
/// staging went back, so the staging was freed.
#[test]
fn after_a_sticky_fault_staging_is_never_freed() {
    // Which entry points report the fault (all of them, as a real driver's
    // do, or only the one a path sees first).
    for seen_by in [None, Some("cuEventQuery"), Some("cuStreamSynchronize")] {
        let mut extra = vec![("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2")];
        extra.extend(seen_by.map(|symbols| ("HWQUEUE_FAKE_FAULT_SEEN_BY", symbols)));
        let Some(outcome) = run_scenario(&on_a_12_2_device("staged_upload", &extra)) else {
            return;
        };
        assert_staged(&outcome);
        assert!(outcome.called("cuMemcpyHtoDAsync_v2"), "{outcome:#?}");
        let release = outcome
            .calls
            .iter()
            .position(|call| call == "cuDevicePrimaryCtxRelease_v2")
            .unwrap_or(outcome.calls.len());
        assert!(
            !outcome.calls[..release]
                .iter()
                .any(|call| call == "cuMemFreeHost"),
            "fault seen by {}: staging freed while the context lives: {:?}",
            seen_by.unwrap_or("all"),
            outcome.calls
        );
        let health = outcome.field("health");
        assert!(
            health.starts_with("DeviceLost ") && health.contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
            "fault seen by {seen_by:?}: {health}"
        );
    }
}

/// A batch whose completion-event query fails with an error that is not
/// sticky (the device is not lost, so its stream may still be running the
/// batch) keeps what it holds: its `dealloca`'s range does not go back to
/// the pool, nor its staging to the driver, until a wait for the stream
/// (`synchronize`) says the stream passed it; the owner hears of the error
/// there. On 81863f1 the batch was taken for passed at its first failed
/// query: the next submit's retirement returned the range and freed the
/// staging while the stream might still use both, and nobody was told.
/// The control (no fault) shows that the fake's batch is passed at once,
/// so the next submit's retirement does let it go.
#[test]
fn a_batch_whose_event_query_fails_unsticky_keeps_its_memory_until_a_wait() {
    let Some(control) = run_scenario(&on_a_12_2_device("query_error", &[])) else {
        return;
    };
    assert_staged(&control);
    assert_eq!(control.field("second"), "ok ", "{control:#?}");
    assert_eq!(
        control.field("phase_after_second"),
        "Returned",
        "{control:#?}"
    );
    assert_eq!(control.field("synchronize"), "ok ", "{control:#?}");
    // CUDA_ERROR_INVALID_HANDLE (400), which is not sticky, from
    // `cuEventQuery` only, from the upload on: a wait on the batch's event
    // decides where its query failed, so the batch is let go at the next
    // submit all the same (batches do not pile up behind a query that
    // keeps failing: helper-65), and the owner is told.
    let query_only = unsticky_from_the_upload("cuEventQuery");
    let Some(decided) = run_scenario(&on_a_12_2_device("query_error", &query_only)) else {
        return;
    };
    assert!(decided.called("cuEventSynchronize"), "{decided:#?}");
    assert_eq!(
        decided.field("phase_after_second"),
        "Returned",
        "{decided:#?}"
    );
    assert!(
        decided
            .field("synchronize")
            .contains("querying a batch's completion event"),
        "{decided:#?}"
    );
    // The same error from the event's wait too: only a wait for the
    // stream lets the batch go.
    let extra = unsticky_from_the_upload("cuEventQuery,cuEventSynchronize");
    let Some(outcome) = run_scenario(&on_a_12_2_device("query_error", &extra)) else {
        return;
    };
    assert_staged(&outcome);
    assert_eq!(outcome.field("second"), "ok ", "{outcome:#?}");
    // The failed query left the batch in flight: its range is not the
    // pool's again.
    assert_eq!(
        outcome.field("phase_after_second"),
        "DeallocaRecorded",
        "{outcome:#?}"
    );
    // Nor was its staging freed before the stream was waited for.
    let synchronized = outcome
        .calls
        .iter()
        .position(|call| call == "cuStreamSynchronize")
        .unwrap_or(outcome.calls.len());
    assert!(
        !outcome.calls[..synchronized]
            .iter()
            .any(|call| call == "cuMemFreeHost"),
        "staging freed before the stream was waited for: {:?}",
        outcome.calls
    );
    // `synchronize` waited for the stream, which passed the batch: let go
    // now, and the owner told of the failed query.
    let synchronize = outcome.field("synchronize");
    assert!(
        synchronize.contains("querying a batch's completion event")
            && synchronize.contains("CUDA_ERROR_INVALID_HANDLE"),
        "{outcome:#?}"
    );
    assert_eq!(
        outcome.field("phase_after_synchronize"),
        "Returned",
        "{outcome:#?}"
    );
    assert!(outcome.called("cuMemFreeHost"), "{outcome:#?}");
    // Not sticky: the device is not lost.
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
    // Again: the next batch's query fails too, and every later retirement
    // (the retried submit's) keeps it; the owner is told once, by the next
    // call (the third submit, whose batch stays recorded).
    assert_eq!(outcome.field("again_submit"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("again_second"), "ok ", "{outcome:#?}");
    let third = outcome.field("again_third");
    assert!(
        third.contains("querying a batch's completion event")
            && third.contains("CUDA_ERROR_INVALID_HANDLE"),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("again_retry"), "ok ", "{outcome:#?}");
    assert_eq!(
        outcome.field("again_phase_after_retry"),
        "DeallocaRecorded",
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("again_synchronize"), "ok ", "{outcome:#?}");
    assert_eq!(
        outcome.field("again_phase_after_synchronize"),
        "Returned",
        "{outcome:#?}"
    );
}

/// How many batches the `pile_up` scenario submits.
const PILE_UP_SUBMITS: usize = 300;

/// How many `pile_up` buffers a CUDA queue may hold at once: as many
/// batches as it keeps in flight behind a front batch whose completion
/// can be told neither by a query of its event nor by a wait on it
/// (`MAX_BEHIND_A_FAILED_WAIT` in `src/cuda/in_flight.rs`, 64), plus that
/// front batch and the batch submitted since its retirement last looked;
/// and a few more for batches that hold two (a submit that reports a
/// failure leaves its batch recorded, and the next buffer's commands go
/// into it too).
const HELD_AT_MOST: usize = 64 + 2 + 4;

/// `pile_up`'s peak of batches held at once is within [`HELD_AT_MOST`].
fn assert_held_at_most_at_once(outcome: &Outcome) {
    let peak: usize = outcome.field("peak_held").parse().unwrap();
    assert!(
        peak <= HELD_AT_MOST,
        "{peak} of {PILE_UP_SUBMITS} batches held at once: {outcome:#?}"
    );
}

/// An owner that only submits (never a `synchronize`), on a stream whose
/// batches' completion events can be neither queried nor waited for (an
/// error that is not sticky, CUDA_ERROR_INVALID_HANDLE: the device is not
/// lost, so the stream may still run them): each batch stays in flight,
/// with what it holds (its `dealloca`'s range, its staging). On 145130e
/// nothing bounded that: every one of the [`PILE_UP_SUBMITS`] batches was
/// held at once (`peak_held` 300), for the life of the queue. Now, past
/// a bound, the retirement waits for the stream itself: where that
/// succeeds, it lets go of every batch it waited for; where it fails too
/// (not sticky), it keeps them for the process, and the queue takes no
/// more work: every later submit fails, saying to drop the queue, and
/// lets its batch go unrun, so nothing grows.
#[test]
fn batches_behind_an_event_that_cannot_be_told_are_bounded() {
    // The stream's wait succeeds: the bound lets the batches go.
    let extra = unsticky_from_the_upload("cuEventQuery,cuEventSynchronize");
    let Some(outcome) = run_scenario(&on_a_12_2_device("pile_up", &extra)) else {
        return;
    };
    assert_held_at_most_at_once(&outcome);
    assert!(outcome.called("cuStreamSynchronize"), "{outcome:#?}");
    // The owner hears of the failed queries (once per front batch).
    let first = outcome.field("first_error");
    assert!(
        first.contains("querying a batch's completion event")
            && first.contains("CUDA_ERROR_INVALID_HANDLE"),
        "{outcome:#?}"
    );
    // The queue goes on working: a `synchronize` lets go of the rest.
    assert_eq!(outcome.field("held_after_synchronize"), "0", "{outcome:#?}");
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");

    // The stream's wait fails too (not sticky): the batches it waited for
    // are kept for the process, and the queue takes no more work.
    let extra = unsticky_from_the_upload("cuEventQuery,cuEventSynchronize,cuStreamSynchronize");
    let Some(outcome) = run_scenario(&on_a_12_2_device("pile_up", &extra)) else {
        return;
    };
    assert_held_at_most_at_once(&outcome);
    let held: usize = outcome.field("held_after_submits").parse().unwrap();
    assert!(held <= HELD_AT_MOST, "{outcome:#?}");
    // Kept for the process: a `synchronize` lets none go.
    assert_eq!(
        outcome.field("held_after_synchronize"),
        held.to_string(),
        "{outcome:#?}"
    );
    // Every submit after the stream's failed wait fails, and says why and
    // what to do.
    let failed: usize = outcome.field("failed_submits").parse().unwrap();
    assert!(
        failed >= PILE_UP_SUBMITS - HELD_AT_MOST - 2,
        "{failed} submits failed: {outcome:#?}"
    );
    for key in ["last_error", "synchronize"] {
        let error = outcome.field(key);
        assert!(
            error.contains("CUDA_ERROR_INVALID_HANDLE")
                && error.contains("takes no more work")
                && error.contains("drop"),
            "{key}: {outcome:#?}"
        );
    }
    // Not sticky: the device is not lost.
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
}

/// The fake's faults for a device that is not lost: from the upload on,
/// CUDA_ERROR_INVALID_HANDLE (400, not sticky) from the entry points
/// `seen_by` names (comma-separated).
fn unsticky_from_the_upload(seen_by: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2"),
        ("HWQUEUE_FAKE_FAULT", "400"),
        ("HWQUEUE_FAKE_FAULT_SEEN_BY", seen_by),
    ]
}

/// Whether the fake freed page-locked memory (`cuMemFreeHost`) before it
/// destroyed the queue's stream (the queue's drop, done): the staging of
/// an upload over the cache is freed as soon as it is let go.
fn staging_freed_by_the_queue(outcome: &Outcome) -> bool {
    let destroyed = outcome
        .calls
        .iter()
        .position(|call| call == "cuStreamDestroy_v2")
        .unwrap_or(outcome.calls.len());
    outcome.calls[..destroyed]
        .iter()
        .any(|call| call == "cuMemFreeHost")
}

/// The queue's drop waits for its stream (`shut_down`). Where that wait
/// fails with an error that is not sticky (the device is not lost, so the
/// stream may still be running its batches), nothing the stream may use
/// may be let go: a batch in flight keeps its `dealloca`'s range out of
/// the pool and its staging from the driver, for the process. On aece0d2
/// the drop let both go whatever the wait said (the range was `Returned`,
/// the staging freed). The control (no fault) shows the drop does let go
/// of a batch the stream passed.
#[test]
fn a_failed_wait_at_a_queues_drop_lets_nothing_go_unless_the_device_is_lost() {
    let Some(control) = run_scenario(&on_a_12_2_device("wait_error_drop", &[])) else {
        return;
    };
    assert_staged(&control);
    assert_eq!(control.field("shut_down"), "done", "{control:#?}");
    assert_eq!(
        control.field("phase_after_drop"),
        "Returned",
        "{control:#?}"
    );
    assert!(staging_freed_by_the_queue(&control), "{control:#?}");
    // CUDA_ERROR_INVALID_HANDLE (400), which is not sticky, from the event
    // query and the event's wait (so no retirement lets the batch go
    // first) and the stream's wait, from the upload on.
    let extra = unsticky_from_the_upload("cuEventQuery,cuEventSynchronize,cuStreamSynchronize");
    for scenario in ["wait_error_drop", "wait_error"] {
        let Some(outcome) = run_scenario(&on_a_12_2_device(scenario, &extra)) else {
            return;
        };
        assert_staged(&outcome);
        assert_eq!(
            outcome.field("phase_after_submit"),
            "DeallocaRecorded",
            "{outcome:#?}"
        );
        if scenario == "wait_error" {
            let synchronize = outcome.field("synchronize");
            assert!(
                synchronize.contains("CUDA_ERROR_INVALID_HANDLE"),
                "{outcome:#?}"
            );
            assert_eq!(
                outcome.field("phase_after_synchronize"),
                "DeallocaRecorded",
                "{outcome:#?}"
            );
        }
        // The drop ended (no hang), and let nothing go.
        assert_eq!(outcome.field("shut_down"), "done", "{outcome:#?}");
        assert_eq!(
            outcome.field("phase_after_drop"),
            "DeallocaRecorded",
            "{scenario}: {outcome:#?}"
        );
        assert!(
            !staging_freed_by_the_queue(&outcome),
            "{scenario}: staging freed after a failed wait: {:?}",
            outcome.calls
        );
        assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
    }
    // Sticky (CUDA_ERROR_ILLEGAL_ADDRESS, the default): the device is lost
    // and its stream runs nothing again, so the range does go back (the
    // staging cache still keeps the staging: issue 24, defect 8).
    let Some(lost) = run_scenario(&on_a_12_2_device("wait_error_drop", &extra[..1])) else {
        return;
    };
    assert_staged(&lost);
    assert_eq!(lost.field("shut_down"), "done", "{lost:#?}");
    assert_eq!(lost.field("phase_after_drop"), "Returned", "{lost:#?}");
    assert!(!staging_freed_by_the_queue(&lost), "{lost:#?}");
    assert!(lost.field("health").starts_with("DeviceLost "), "{lost:#?}");
}

/// A batch whose completion event cannot be recorded is waited for at
/// once (`finish`). Where that wait fails with an error that is not sticky,
/// the stream may still be running the batch: it keeps its `dealloca`'s
/// range and its staging, for the process, and the owner hears of the
/// failed wait (its next call). On aece0d2 both were let go at the submit
/// whatever the wait said, and the failed wait was told to nobody (the
/// next `synchronize` reported only its own wait).
#[test]
fn a_batch_whose_completion_event_and_wait_fail_unsticky_keeps_its_memory() {
    let Some(control) = run_scenario(&on_a_12_2_device("wait_error", &[])) else {
        return;
    };
    assert_staged(&control);
    assert_eq!(control.field("synchronize"), "ok ", "{control:#?}");
    assert_eq!(
        control.field("phase_after_synchronize"),
        "Returned",
        "{control:#?}"
    );
    assert!(staging_freed_by_the_queue(&control), "{control:#?}");
    // CUDA_ERROR_INVALID_HANDLE (400), which is not sticky, from recording
    // the batch's completion event and from the stream's wait.
    let extra = unsticky_from_the_upload("cuEventRecord,cuStreamSynchronize");
    let Some(outcome) = run_scenario(&on_a_12_2_device("wait_error", &extra)) else {
        return;
    };
    assert_staged(&outcome);
    assert!(outcome.called("cuEventRecord"), "{outcome:#?}");
    assert_eq!(
        outcome.field("phase_after_submit"),
        "DeallocaRecorded",
        "{outcome:#?}"
    );
    // Told by the next call: the wait after the failed record.
    let synchronize = outcome.field("synchronize");
    assert!(
        synchronize.contains("waiting for a batch's stream")
            && synchronize.contains("CUDA_ERROR_INVALID_HANDLE"),
        "{outcome:#?}"
    );
    for phase in ["phase_after_synchronize", "phase_after_drop"] {
        assert_eq!(outcome.field(phase), "DeallocaRecorded", "{outcome:#?}");
    }
    assert_eq!(outcome.field("shut_down"), "done", "{outcome:#?}");
    assert!(
        !staging_freed_by_the_queue(&outcome),
        "staging freed after a failed wait: {:?}",
        outcome.calls
    );
    assert_eq!(outcome.field("health"), "ok ", "{outcome:#?}");
}

/// Found on an H100 (the conformance case, which needs a GPU): a CUDA
/// queue with `FailureScope::Batch` failed every signal of a batch that
/// failed at a wait, at once, instead of honouring the batch's later waits
/// first (the worker called `Ledger::fail`, not the drain).
#[test]
fn a_batch_scoped_failure_on_cuda_drains_its_later_waits_in_order() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("failure_scope", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert!(
        outcome.field("done1").starts_with("SignalFailed "),
        "{outcome:#?}"
    );
    assert!(
        outcome.field("drained_before").starts_with("Timeout "),
        "the value after the unset wait settled before it: {outcome:#?}"
    );
    assert!(
        outcome.field("drained_after").starts_with("SignalFailed "),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("done2"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("second"), "[6, 6, 6, 6]", "{outcome:#?}");
}

/// A plan over the CPU and CUDA on the fake driver (issue 44): each run's
/// settled waits on the run before cross backends (the CUDA queues wait on
/// the host stage's signals, the host stage on CUDA's), with a failing
/// and a refused run among ten back to back.
#[test]
fn a_plan_over_the_cpu_and_cuda_runs_back_to_back_on_the_fake_driver() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_two_backends", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("plan"), "ok", "{outcome:#?}");
}

/// Issue 45's first step: what a plan replayed as a CUDA graph needs of the
/// fake driver. Work captured on a stream becomes nodes in order, not run;
/// each graph launch replays them, the copies really copying (new words
/// come back each time) and each kernel counted in the fake's launch log;
/// a kernel node's parameters read back from the graph, and set on the
/// executable graph, change what later launches run and not the graph. A
/// capture that synchronises its stream fails and is invalidated, as on
/// the driver.
#[test]
fn captured_work_replays_as_a_graph_on_the_fake_driver() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("graph_replay", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(
        outcome.field("sync_in_capture"),
        "Err(DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, \"operation not permitted when stream is capturing\"))"
    );
    assert!(
        outcome
            .field("invalidated_end")
            .starts_with("Err(DriverError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
        "{outcome:#?}"
    );
    assert_eq!(outcome.field("status"), "CU_STREAM_CAPTURE_STATUS_ACTIVE");
    assert_eq!(outcome.field("end_capture"), "ok", "{outcome:#?}");
    let kernels = vec!["CU_GRAPH_NODE_TYPE_KERNEL"; KERNELS as usize].join(", ");
    assert_eq!(
        outcome.field("nodes"),
        format!("[CU_GRAPH_NODE_TYPE_MEMCPY, {kernels}, CU_GRAPH_NODE_TYPE_MEMCPY]")
    );
    for launch in 1..=3 {
        let words: Vec<u32> = (0..4).map(|i| 100 * launch + i).collect();
        assert_eq!(
            outcome.field(&format!("launch{launch}")),
            format!("{words:?}")
        );
    }
    assert_eq!(outcome.field("set_params"), "CUDA_SUCCESS");
    // The graph keeps what was captured; only the executable graph changed.
    assert_eq!(outcome.field("n_in_graph"), "1");
    assert_eq!(outcome.field("n_in_graph_after"), "1");

    // Captured launches ran nothing; each graph launch ran every kernel,
    // the third with the new `n`.
    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    assert_eq!(count("cuLaunchKernel"), KERNELS as usize, "{outcome:#?}");
    assert_eq!(count("cuGraphLaunch"), 3, "{outcome:#?}");
    let graphs = outcome
        .launches
        .iter()
        .filter(|line| line.starts_with("graph "));
    assert!(
        graphs.clone().all(|line| line == "graph nodes=5"),
        "{outcome:#?}"
    );
    assert_eq!(graphs.count(), 3, "{outcome:#?}");
    let ns: Vec<&str> = outcome
        .launches
        .iter()
        .filter(|line| line.starts_with("kernel scale via=graph "))
        .map(|line| line.rsplit(',').next().unwrap())
        .collect();
    assert_eq!(
        ns,
        ["1", "2", "3", "1", "2", "3", "10", "2", "3"],
        "{outcome:#?}"
    );
    assert_eq!(
        outcome.launches.len(),
        3 + 3 * KERNELS as usize,
        "{outcome:#?}"
    );
}

/// The replay path's fallback needs graphs to fail: with
/// `HWQUEUE_FAKE_REFUSE` naming `cuGraphInstantiateWithFlags`, instantiation
/// fails with `HWQUEUE_FAKE_REFUSAL`'s code, cudarc destroys the captured
/// graph, and nothing is launched.
#[test]
fn a_refused_instantiation_fails_the_capture_and_launches_nothing() {
    let refuse = [
        ("HWQUEUE_FAKE_REFUSE", "cuGraphInstantiateWithFlags"),
        ("HWQUEUE_FAKE_REFUSAL", "2"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("graph_replay", &refuse)) else {
        return;
    };
    let end = outcome.field("end_capture");
    assert!(end.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{outcome:#?}");
    assert!(outcome.called("cuGraphDestroy"), "{outcome:#?}");
    assert!(!outcome.called("cuGraphLaunch"), "{outcome:#?}");
    assert!(outcome.launches.is_empty(), "{outcome:#?}");
}

// ---- Plan replay as CUDA graphs (issue 45) ------------------------------

/// Words each kernel of the replay scenarios is launched over.
const REPLAY_WORDS: usize = 256;
/// Kernels in the replayed chain: the issue's benchmark shape.
const CHAIN: u32 = 64;

/// `Launches` as `kernels programs fallback`.
fn launches_line(launches: &hwqueue::Launches) -> String {
    format!(
        "{} {} {}",
        launches.kernels,
        launches.programs,
        launches.fallback.as_deref().unwrap_or("none")
    )
}

/// The child's half of the chain scenarios: a plan of [`CHAIN`] launches of
/// `scale` (its `n` the kernel's number) between an upload and a download,
/// run 100 times with replay on, then 100 times with replay off, then 3
/// times profiled. Reports each plan's `Launches` (`replay`, `plain`,
/// `profiled`), and `runs`: `ok`, or the
/// first run's error (the fake's kernels do nothing, so each download
/// brings back what its run uploaded).
fn plan_replay(device: CudaDevice) {
    use hwqueue::{Download, ExecParams, Scalar, Schedule};
    let device = std::sync::Arc::new(device);
    let program = CudaProgram::from_ptx(&device, SCALE_PTX, "scale", 2, 1).unwrap();
    let mut failure = None;
    for (name, replay) in [("replay", true), ("plain", false), ("profiled", true)] {
        let mut schedule = Schedule::<Cuda>::new();
        let d = schedule.add_device(device.clone());
        let x = schedule.add_tensor(d, "x", REPLAY_WORDS * 4);
        let y = schedule.add_tensor(d, "y", REPLAY_WORDS * 4);
        let up = schedule.upload("upload x", x).id();
        schedule.fill("clear y", y, 0u32);
        for k in 0..CHAIN {
            let grid = ExecParams::new_1d(REPLAY_WORDS as u32, 64);
            schedule.exec(
                format!("scale {k}"),
                d,
                &program,
                &[y, x],
                &[Scalar::U32(k)],
                grid,
            );
        }
        let down = schedule.download("download x", x).id();
        // A device lost by an earlier plan's run refuses to plan.
        let mut plan = match schedule.plan() {
            Ok(plan) => plan,
            Err(error) => {
                failure.get_or_insert(format!("{name} plan: {error}"));
                continue;
            }
        };
        plan.set_replay(replay);
        plan.set_profiling(name == "profiled");
        let runs = if name == "profiled" { 3 } else { 100 };
        for run in 0..runs {
            let out = Download::<u32>::new(REPLAY_WORDS);
            let outcome = plan
                .upload(up, &vec![run; REPLAY_WORDS])
                .and_then(|()| plan.download(down, &out))
                .and_then(|()| plan.run())
                .and_then(|run| run.wait(std::time::Duration::from_secs(10)))
                .and_then(|()| out.take(hwqueue::Timeout::Forever));
            match outcome {
                Ok(words) if words == vec![run; REPLAY_WORDS] => {}
                Ok(words) => {
                    failure.get_or_insert(format!("{name} run {run} brought back {words:?}"));
                }
                Err(error) => {
                    failure.get_or_insert(format!("{name} run {run}: {error}"));
                }
            }
        }
        report(name, &launches_line(&plan.launches()));
        report(
            &format!("{name}_repeats"),
            &plan.launches().repeats.to_string(),
        );
    }
    report("runs", failure.as_deref().unwrap_or("ok"));
}

/// The child's half of the rebinding scenarios: a plan whose input and
/// output are slots and whose `k` is a scalar slot (an upload into the
/// input, three kernels, a copy of the output into the input on the copy
/// queue, two more kernels, the output's download), run 1,000 times with
/// replay on and then 1,000 times with replay off, about one run in three
/// binding an input and an output of three each and setting `k` as a
/// seeded sequence says (the same for both; the runs between repeat their
/// graphs without recording their kernels). Reports each plan's `Launches`, `outputs`
/// (`equal`, or where the downloads first differ), and `runs` (`ok` or the
/// first error). The fake's launch log holds both plans' kernels, with
/// their parameters, in order.
fn plan_rebind(device: CudaDevice) {
    use hwqueue::{Download, ExecParams, Scalar, Schedule};
    let device = std::sync::Arc::new(device);
    let program = CudaProgram::from_ptx(&device, SCALE_PTX, "scale", 2, 1).unwrap();
    let buffers: Vec<_> = (0..6)
        .map(|b| {
            let buffer = device.alloc(REPLAY_WORDS * 4).unwrap();
            buffer.write_at(0, &vec![b as u32; REPLAY_WORDS]).unwrap();
            buffer
        })
        .collect();
    let mut failure = None;
    let mut outputs: Vec<Vec<Vec<u32>>> = Vec::new();
    for (name, replay) in [("replay", true), ("plain", false)] {
        let mut schedule = Schedule::<Cuda>::new();
        let d = schedule.add_device(device.clone());
        let input = schedule.add_slot(d, "in", REPLAY_WORDS * 4);
        let output = schedule.add_slot(d, "out", REPLAY_WORDS * 4);
        let k = schedule.add_scalar("k", 0u32);
        let grid = ExecParams::new_1d(REPLAY_WORDS as u32, 64);
        let up = schedule.upload("upload in", input).id();
        schedule
            .exec("a", d, &program, &[output, input], &[Scalar::U32(0)], grid)
            .scalar(0, k);
        schedule.exec("b", d, &program, &[input, output], &[Scalar::U32(5)], grid);
        schedule
            .exec("c", d, &program, &[output, input], &[Scalar::U32(7)], grid)
            .scalar(0, k);
        schedule.copy("out to in", input, output);
        schedule.exec("d", d, &program, &[output, input], &[Scalar::U32(9)], grid);
        schedule
            .exec("e", d, &program, &[input, output], &[Scalar::U32(0)], grid)
            .scalar(0, k);
        let down = schedule.download("download out", output).id();
        let mut plan = match schedule.plan() {
            Ok(plan) => plan,
            Err(error) => {
                failure.get_or_insert(format!("{name} plan: {error}"));
                continue;
            }
        };
        plan.set_replay(replay);
        // A xorshift, seeded the same for both plans.
        let mut state = 0x2545_f491_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let mut downloaded = Vec::new();
        for run in 0..1000u32 {
            let (i, o, value) = (next() % 3, 3 + next() % 3, next() % 4);
            let rebind = run == 0 || next() % 3 == 0;
            let out = Download::<u32>::new(REPLAY_WORDS);
            let outcome = (if rebind {
                plan.bind(input, &buffers[i as usize])
                    .and_then(|()| plan.bind(output, &buffers[o as usize]))
                    .and_then(|()| plan.set_scalar(k, value))
            } else {
                Ok(())
            })
            .and_then(|()| plan.upload(up, &vec![run; REPLAY_WORDS]))
            .and_then(|()| plan.download(down, &out))
            .and_then(|()| plan.run())
            .and_then(|run| run.wait(std::time::Duration::from_secs(10)))
            .and_then(|()| out.take(hwqueue::Timeout::Forever));
            match outcome {
                Ok(words) => downloaded.push(words),
                Err(error) => {
                    failure.get_or_insert(format!("{name} run {run}: {error}"));
                }
            }
        }
        outputs.push(downloaded);
        report(name, &launches_line(&plan.launches()));
        report(
            &format!("{name}_repeats"),
            &plan.launches().repeats.to_string(),
        );
        report(
            &format!("{name}_patched"),
            &plan.launches().patched.to_string(),
        );
    }
    if outputs.len() < 2 {
        report("outputs", "a plan was not made");
        return report("runs", failure.as_deref().unwrap_or("ok"));
    }
    let outputs_line = match outputs[0].iter().zip(&outputs[1]).position(|(a, b)| a != b) {
        None if outputs[0].len() == outputs[1].len() => "equal".to_owned(),
        None => format!(
            "{} against {} downloads",
            outputs[0].len(),
            outputs[1].len()
        ),
        Some(run) => format!("differ at run {run}"),
    };
    report("outputs", &outputs_line);
    report("runs", failure.as_deref().unwrap_or("ok"));
}

/// `kernels programs fallback` as the child reported it for `key`.
fn launches_of(outcome: &Outcome, key: &str) -> (u64, u64, String) {
    let line = outcome.field(key);
    let mut parts = line.splitn(3, ' ');
    let mut number = || parts.next().unwrap().parse::<u64>().unwrap();
    let (kernels, programs) = (number(), number());
    (kernels, programs, parts.next().unwrap().to_owned())
}

/// The kernel lines of the fake's launch log, without how each was
/// launched (`via=stream` or `via=graph`).
fn kernels_launched(outcome: &Outcome) -> Vec<String> {
    outcome
        .launches
        .iter()
        .filter(|line| line.starts_with("kernel "))
        .map(|line| {
            line.replace(" via=graph ", " ")
                .replace(" via=stream ", " ")
        })
        .collect()
}

/// Issue 45's proof on CUDA, on the fake driver: a 64-kernel plan run 100
/// times builds its graph once (twice at most: the first run has no waits
/// on a run before it) and launches it for the rest, instead of launching
/// 6,400 kernels; the driver saw the graph launches and ran every kernel
/// in them, in order, as the plain plan's launches did. With replay off,
/// every run launches its 64.
#[test]
fn a_cuda_plan_of_64_kernels_run_100_times_launches_one_graph_per_run() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_replay", &[])) else {
        return;
    };
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    let (kernels, programs, fallback) = launches_of(&outcome, "replay");
    assert!(
        kernels <= 2 * u64::from(CHAIN),
        "{kernels} kernels: {outcome:#?}"
    );
    assert!(programs >= 98, "{programs} graphs replayed: {outcome:#?}");
    assert_eq!(fallback, "none");
    assert_eq!(
        launches_of(&outcome, "plain"),
        (100 * u64::from(CHAIN), 0, "none".into())
    );
    // From the third run on (the first two record: the second is the
    // first with waits on a run before it), nothing changed, so each run
    // named its graph instead of recording its 64 `exec`s.
    let repeats = |name: &str| {
        outcome
            .field(&format!("{name}_repeats"))
            .parse::<u64>()
            .unwrap()
    };
    assert!(repeats("replay") >= 98, "{outcome:#?}");
    assert_eq!(repeats("plain"), 0);
    assert_eq!(repeats("profiled"), 0);

    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    assert!(count("cuGraphInstantiateWithFlags") <= 2, "{outcome:#?}");
    assert_eq!(count("cuGraphLaunch"), 100, "{outcome:#?}");
    assert_eq!(
        count("cuLaunchKernel"),
        103 * CHAIN as usize,
        "{outcome:#?}"
    );
    let graphs: Vec<&String> = outcome
        .launches
        .iter()
        .filter(|l| l.starts_with("graph "))
        .collect();
    assert_eq!(graphs.len(), 100);
    assert!(
        graphs
            .iter()
            .all(|line| *line == &format!("graph nodes={CHAIN}"))
    );
    // Both plans' kernels, in the same order with the same parameters,
    // but for the tensors' places (each plan has its own arena).
    let launched = kernels_launched(&outcome);
    assert_eq!(launched.len(), 203 * CHAIN as usize);
    let ns = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.rsplit(',').next().unwrap().to_owned())
            .collect()
    };
    let (replayed, plain) = launched[..200 * CHAIN as usize].split_at(100 * CHAIN as usize);
    assert_eq!(ns(replayed), ns(plain));
    let expected: Vec<String> = (0..100)
        .flat_map(|_| (0..CHAIN).map(|k| k.to_string()))
        .collect();
    assert_eq!(ns(replayed), expected);
}

/// Rebinding without re-instantiating, and replay against the plain path
/// over 1,000 runs of random bindings and scalars: the same downloads,
/// and the same kernels launched with the same parameters (both plans use
/// the same six buffers), while the graphs were instantiated once per
/// segment (twice at most) and a rebind patched their nodes instead.
#[test]
fn a_cuda_plan_rebound_at_random_replays_what_the_plain_path_runs() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_rebind", &[])) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("outputs"), "equal", "{outcome:#?}");
    let (kernels, programs, fallback) = launches_of(&outcome, "replay");
    // Two segments a run (three kernels, then two): each built once or
    // twice, replayed for the rest.
    assert!(kernels <= 2 * 5, "{kernels} kernels: {outcome:#?}");
    assert!(
        programs >= 2 * 998,
        "{programs} graphs replayed: {outcome:#?}"
    );
    assert_eq!(fallback, "none");
    assert_eq!(launches_of(&outcome, "plain"), (5000, 0, "none".into()));
    // The runs that bound nothing new repeated both graphs unrecorded,
    // between the rebinding runs that patched them.
    let repeats = outcome.field("replay_repeats").parse::<u64>().unwrap();
    assert!(
        (1000..2000).contains(&repeats),
        "{repeats} repeats: {outcome:#?}"
    );
    assert_eq!(outcome.field("plain_repeats"), "0");
    // The plan counts the patched graphs (`Launches::patched`).
    let patched = outcome.field("replay_patched").parse::<u64>().unwrap();
    assert!(patched > 100, "{patched} graphs patched: {outcome:#?}");
    assert_eq!(outcome.field("plain_patched"), "0");

    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    assert!(count("cuGraphInstantiateWithFlags") <= 4, "{outcome:#?}");
    assert!(
        count("cuGraphExecKernelNodeSetParams_v2") > 100,
        "{outcome:#?}"
    );
    let launched = kernels_launched(&outcome);
    assert_eq!(launched.len(), 10_000);
    let (replayed, plain) = launched.split_at(5000);
    if let Some(at) = (0..5000).find(|&at| replayed[at] != plain[at]) {
        panic!(
            "launch {at}: {} replayed, {} plain",
            replayed[at], plain[at]
        );
    }
}

/// A driver that refuses to instantiate a graph: the plan runs every kernel
/// one by one, each run right, and says why.
#[test]
fn a_cuda_plan_whose_graph_the_driver_refuses_launches_its_kernels_and_says_why() {
    let refuse = [("HWQUEUE_FAKE_REFUSE", "cuGraphInstantiateWithFlags")];
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_replay", &refuse)) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    let (kernels, programs, fallback) = launches_of(&outcome, "replay");
    assert_eq!(
        (kernels, programs),
        (100 * u64::from(CHAIN), 0),
        "{outcome:#?}"
    );
    assert!(fallback.contains("to instantiate a graph"), "{fallback}");
    assert!(fallback.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{fallback}");
    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    // Refused for want of memory: tried again 8, 16, 32 segments on (at
    // segments 1, 9, 25, 57 of the 100), not every run.
    assert_eq!(count("cuGraphInstantiateWithFlags"), 4, "{outcome:#?}");
    assert!(!outcome.called("cuGraphLaunch"), "{outcome:#?}");
    // Refused for good (`CUDA_ERROR_NOT_SUPPORTED`): tried once.
    let refuse = [
        ("HWQUEUE_FAKE_REFUSE", "cuGraphInstantiateWithFlags"),
        ("HWQUEUE_FAKE_REFUSAL", "801"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_replay", &refuse)) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    assert_eq!(count("cuGraphInstantiateWithFlags"), 1, "{outcome:#?}");
}

/// A driver out of memory for one moment: the plan's graph refused at
/// its first build is built again 8 segments on, and launched from then
/// on. On 4322daa the refusal was kept for the life of the queue: all 100
/// runs launched kernel by kernel (review helper-52).
#[test]
fn a_cuda_plan_whose_graph_was_refused_for_want_of_memory_builds_it_again() {
    let refuse = [
        ("HWQUEUE_FAKE_REFUSE", "cuGraphInstantiateWithFlags"),
        ("HWQUEUE_FAKE_REFUSE_TIMES", "1"),
    ];
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_replay", &refuse)) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    let count = |symbol: &str| outcome.calls.iter().filter(|call| *call == symbol).count();
    assert_eq!(count("cuGraphInstantiateWithFlags"), 2, "{outcome:#?}");
    // Runs 0 to 8 kernel by kernel (the 9th built it), the other 91 and
    // the profiled plan's none as graphs.
    assert_eq!(count("cuGraphLaunch"), 92, "{outcome:#?}");
}

/// A fault that poisons the context, reported by the graph's build or by
/// a patch, fails the run and marks the device lost, as a launch's does,
/// rather than passing for a refusal (on 4322daa both runs fell back to
/// plain launches and reported `ok`; review helper-52).
#[test]
fn a_context_fault_while_building_or_patching_a_graph_fails_the_run() {
    for (scenario, symbol, what) in [
        (
            "plan_replay",
            "cuGraphInstantiateWithFlags",
            "building a plan's CUDA graph",
        ),
        (
            "plan_rebind",
            "cuGraphExecKernelNodeSetParams_v2",
            "patching a plan's CUDA graph",
        ),
    ] {
        let refuse = [
            ("HWQUEUE_FAKE_REFUSE", symbol),
            ("HWQUEUE_FAKE_REFUSAL", "700"),
        ];
        let Some(outcome) = run_scenario(&on_a_12_2_device(scenario, &refuse)) else {
            return;
        };
        let runs = outcome.field("runs");
        for phrase in [what, "CUDA_ERROR_ILLEGAL_ADDRESS"] {
            assert!(runs.contains(phrase), "{scenario}: no `{phrase}` in {runs}");
        }
    }
}

/// A driver that refuses to patch a node: the run launches its kernels one
/// by one with the new bindings (never the graph's old ones), and says why.
#[test]
fn a_cuda_plan_whose_rebind_the_driver_refuses_launches_the_new_bindings_plainly() {
    let refuse = [("HWQUEUE_FAKE_REFUSE", "cuGraphExecKernelNodeSetParams_v2")];
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_rebind", &refuse)) else {
        return;
    };
    assert_eq!(outcome.field("runs"), "ok", "{outcome:#?}");
    assert_eq!(outcome.field("outputs"), "equal", "{outcome:#?}");
    let (_, _, fallback) = launches_of(&outcome, "replay");
    assert!(fallback.contains("new kernel parameters"), "{fallback}");
    let launched = kernels_launched(&outcome);
    let (replayed, plain) = launched.split_at(launched.len() / 2);
    assert_eq!(replayed, plain);
}

/// A graph launch the driver refuses fails its run, with the reason, and
/// nothing hangs: every run's wait returns.
#[test]
fn a_refused_graph_launch_fails_its_run() {
    let refuse = [("HWQUEUE_FAKE_REFUSE", "cuGraphLaunch")];
    let Some(outcome) = run_scenario(&on_a_12_2_device("plan_replay", &refuse)) else {
        return;
    };
    let runs = outcome.field("runs");
    assert!(runs.starts_with("replay run 0: "), "{outcome:#?}");
    assert!(runs.contains("launching a plan's CUDA graph"), "{runs}");
    // The plain plan after it ran: its launches are all there.
    assert_eq!(launches_of(&outcome, "plain").0, 100 * u64::from(CHAIN));
    assert!(outcome.field("replay").ends_with(" none"), "{outcome:#?}");
}

/// Scalars of the many-parameter kernel: more than a launch passes from
/// the stack (32 parameters), so its cells are allocated.
const MANY: u32 = 39;

/// The child's half of [`a_kernel_of_40_parameters_gets_each_in_its_cell`]:
/// a kernel of one pointer and [`MANY`] `u32`s, launched once with scalars
/// 100, 101, ..; reports `launched` and the buffer's `pointer`.
fn many_params(device: &CudaDevice) {
    let params: Vec<String> = std::iter::once("\t.param .u64 many_param_0".to_owned())
        .chain((1..=MANY).map(|i| format!("\t.param .u32 many_param_{i}")))
        .collect();
    let ptx = format!(
        ".version 7.8\n.target sm_70\n.address_size 64\n\n.visible .entry many(\n{}\n)\n{{\n\tret;\n}}\n",
        params.join(",\n")
    );
    let program = CudaProgram::from_ptx(device, &ptx, "many", 1, MANY as usize).unwrap();
    let buffer = device.alloc(64).unwrap();
    let scalars: Vec<hwqueue::Scalar> = (0..MANY).map(|i| hwqueue::Scalar::U32(100 + i)).collect();
    let mut queue = device.compute_queue().unwrap();
    queue.exec(
        &program,
        &[&buffer],
        &scalars,
        hwqueue::ExecParams::new_1d(1, 1),
    );
    report(
        "launched",
        &describe(queue.submit().and_then(|()| queue.synchronize()), |()| {
            String::new()
        }),
    );
    report("pointer", &buffer.device_pointer().to_string());
}

/// A launch of more parameters than fit on the stack passes each in its
/// own cell, in order, as the fake's launch log shows.
#[test]
fn a_kernel_of_40_parameters_gets_each_in_its_cell() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("many_params", &[])) else {
        return;
    };
    assert_eq!(outcome.field("launched"), "ok ", "{outcome:#?}");
    let expected: Vec<String> = std::iter::once(outcome.field("pointer").to_owned())
        .chain((0..MANY).map(|i| (100 + i).to_string()))
        .collect();
    let kernel = outcome
        .launches
        .iter()
        .find(|line| line.starts_with("kernel many via=stream "))
        .unwrap_or_else(|| panic!("no launch: {outcome:#?}"));
    assert_eq!(
        kernel.rsplit_once("params=").unwrap().1,
        expected.join(","),
        "{outcome:#?}"
    );
}

/// The child's half of [`a_signal_only_batch_behind_a_deferred_wait_keeps_its_place`]:
/// a batch waiting for `gate` (not recorded: the queue's worker takes it),
/// then two batches of signals only (`done` 1 and 2); reports whether
/// `done` was reached before the gate opened (`early`), and after
/// (`after`), and then a signal-only batch on an idle queue (`idle`).
fn signal_behind_wait(device: &CudaDevice) {
    let gate = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.wait(&gate, 1).submit().unwrap();
    queue.signal(&done, 1).submit().unwrap();
    queue.signal(&done, 2).submit().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    report("early", &done.value().to_string());
    gate.set(1);
    let long = std::time::Duration::from_secs(10);
    report(
        "after",
        &describe(done.wait(2, long), |()| done.value().to_string()),
    );
    queue.synchronize().unwrap();
    queue.signal(&done, 3).submit().unwrap();
    report(
        "idle",
        &describe(done.wait(3, long), |()| done.value().to_string()),
    );
}

/// A batch of signals only goes on the stream at once, but not past a
/// batch the worker holds for a wait: behind one, its signals stay
/// unreached until the wait is satisfied; with the queue idle, it reaches
/// its value. (It checks the values; which path recorded the idle batch,
/// in place or through the worker, it does not see.)
#[test]
fn a_signal_only_batch_behind_a_deferred_wait_keeps_its_place() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("signal_behind_wait", &[])) else {
        return;
    };
    assert_eq!(outcome.field("early"), "0", "{outcome:#?}");
    assert_eq!(outcome.field("after"), "ok 2", "{outcome:#?}");
    assert_eq!(outcome.field("idle"), "ok 3", "{outcome:#?}");
}

/// A finished batch's upload owner whose drop panics (the caller's type)
/// never ends the queue: the next batch runs, and `synchronize` reports
/// the panic (as on the CPU and Vulkan). On 29c1bd6 the panic came out of
/// clearing the batch (`InFlight::keep`) on whichever thread retired it,
/// here the second `submit` (review helper-57).
#[test]
fn a_panicking_upload_owner_loses_its_batch_not_the_cuda_queue() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("panicking_owner", &[])) else {
        return;
    };
    assert_eq!(outcome.field("first"), "Ok(true)", "{outcome:#?}");
    assert_eq!(outcome.field("second"), "Ok(Ok(()))", "{outcome:#?}");
    let synchronized = outcome.field("synchronize");
    for phrase in ["Ok(Err(", "EnginePanicked", "an upload owner's drop panics"] {
        assert!(
            synchronized.contains(phrase),
            "no `{phrase}` in {synchronized}"
        );
    }
}

/// Two opens of one ordinal share its allocation fence (each keeps its
/// own pool): a buffer the second zero-filled is used on a queue of the
/// first only after its fill. On 49598ad each open had its own fence, and
/// the copy's stream did not wait for the second's fill (review
/// helper-58).
#[test]
fn two_opens_of_one_ordinal_order_each_other_s_zero_fills() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("second_handle", &[])) else {
        return;
    };
    assert_eq!(outcome.field("same"), "true", "{outcome:#?}");
    assert_eq!(outcome.field("copied"), "ok ", "{outcome:#?}");
    let calls = &outcome.calls;
    let fill = calls.iter().rposition(|c| c == "cuMemsetD8Async").unwrap();
    let copy = calls
        .iter()
        .rposition(|c| c == "cuMemcpyDtoDAsync_v2")
        .unwrap();
    assert!(
        calls[fill..copy].iter().any(|c| c == "cuStreamWaitEvent"),
        "the copy's stream waits for the fill: {:?}",
        &calls[fill..=copy]
    );
}

/// A sticky fault a host write meets marks the device lost, as one a
/// queue meets does (on 49598ad it was a plain driver error, and the
/// device stayed healthy; review helper-58).
#[test]
fn a_sticky_fault_a_host_write_meets_marks_the_device_lost() {
    let extra = [("HWQUEUE_FAKE_FAULT_AFTER", "cuMemcpyHtoDAsync_v2")];
    let Some(outcome) = run_scenario(&on_a_12_2_device("host_fault", &extra)) else {
        return;
    };
    assert!(
        outcome.field("write").starts_with("DeviceLost "),
        "{outcome:#?}"
    );
    assert!(
        outcome.field("health").starts_with("DeviceLost "),
        "{outcome:#?}"
    );
}

/// A fill of an empty buffer or view calls no memset (an empty buffer's
/// address is 0, which a driver may refuse; on 30f40e1 both reached
/// `cuMemsetD*Async` with a count of 0; review helper-58).
#[test]
fn an_empty_fill_reaches_no_memset() {
    let Some(outcome) = run_scenario(&on_a_12_2_device("empty_fill", &[])) else {
        return;
    };
    assert_eq!(outcome.field("filled"), "ok ", "{outcome:#?}");
    assert_eq!(outcome.field("real"), "[0, 0, 0, 0]", "{outcome:#?}");
    let memsets = outcome.calls.iter().filter(|c| c.starts_with("cuMemsetD"));
    // The 64-byte buffer's own zero fill, and nothing else.
    assert_eq!(memsets.count(), 1, "{outcome:#?}");
}
