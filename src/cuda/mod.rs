//! The CUDA backend, on [`cudarc`]'s driver API and NVRTC (feature `cuda`).
//!
//! - **No panic on a missing driver.** cudarc loads `libcuda` and `libnvrtc`
//!   at run time and panics when they are absent. Every path that reaches
//!   the driver starts at [`Cuda::probe`], [`Cuda::open`] /
//!   [`CudaDevice::open`] or [`CudaProgram::from_cuda_c`], and each first
//!   checks the library with `is_culib_present()` (and that the driver is new
//!   enough to have every function the backend calls), answering
//!   [`Error::NoDriver`] with how to install it. Everything else needs a
//!   [`CudaDevice`], which only exists once those checks passed.
//! - [`CudaDevice`] holds one CUDA context per ordinal (the device's primary
//!   context) and a stream of its own for allocation and host transfers.
//! - [`CudaQueue`] is the shared queue core over a [`CudaEngine`], which
//!   enqueues each batch on its own CUDA stream at `submit` (a copy queue is
//!   a second stream of the same context). `exec` launches with grid = global / local and block = local;
//!   the kernel ABI is the buffers' device pointers in order, then the
//!   scalars by value.
//! - [`CudaProgram`] compiles CUDA C with NVRTC for the device's own
//!   architecture (a cubin; PTX where NVRTC predates the GPU), and checks
//!   the kernel's parameters, block size and shared memory against what
//!   the driver reports of it.
//! - [`CudaSignal`] is an [`EventRing`](crate::ring::EventRing) of CUDA
//!   events: its value moves only when an event *completes*.
//! - A sticky fault (an illegal address, a failed launch) loses the device
//!   for the rest of the process: [`Error::DeviceLost`] from then on.
//! - **Waits that the stream cannot express are made on the host, before
//!   enqueueing.** A wait on a CUDA signal value that is recorded is a
//!   device-side `cuStreamWaitEvent`. A wait on a value not recorded yet, or
//!   on another backend's signal ([`HardwareQueue::wait_foreign`]), stops the
//!   enqueueing: the queue's worker thread blocks on the host until the value
//!   is recorded (or the foreign signal is reached), then enqueues the rest.
//!   The stream never holds work gated on the host, so every recorded event
//!   completes on its own. See [`CudaEngine`] for the cost.
//!
//! Failure never hangs: a launch or driver error while enqueueing, or a
//! failed wait, fails the signals the rest of the batch would have set (once
//! the work on the stream before it completed) and is reported to the owner
//! by a later `submit` or `synchronize`; a device
//! fault shows up to signal waiters as [`Error::SignalFailed`].
//!
//! [`HardwareQueue::wait_foreign`]: crate::HardwareQueue::wait_foreign

mod buffer;
mod device;
mod entry;
mod in_flight;
mod launch;
mod launches;
mod memory;
mod profiler;
mod program;
mod queue;
mod repeat;
mod replay;
mod signal;
mod stream;
mod transfer;
mod worker;

pub use buffer::CudaBuffer;
pub use device::{CUDA_MAX_BUFFERS, CUDA_VIEW_ALIGNMENT, CudaDevice};
pub use launch::CompileTarget;
pub use memory::{CUDA_BUFFER_ALIGN, CudaBlocks, DeviceBlock, STAGING_CACHE};
pub use program::{CompiledKernel, CudaProgram, compile};
pub use queue::{CudaEngine, CudaQueue};
pub use signal::CudaSignal;

use std::sync::OnceLock;

use cudarc::driver::{DriverError, result, sys};

use crate::backend::{Backend, DeviceInfo};
use crate::error::{Error, Result};
use crate::spec::DeviceSpec;

/// The CUDA backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cuda;

impl Backend for Cuda {
    const ID: &'static str = "cuda";
    const PRECEDENCE: u32 = 100;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;
    const ALIASES: &'static [&'static str] = &["gpu", "nvidia"];

    type Device = CudaDevice;
    type Queue = CudaQueue;
    type Signal = CudaSignal;
    type Buffer = CudaBuffer;
    type Program = CudaProgram;

    /// The CUDA devices present: `Ok(vec![])` when the driver is installed
    /// but sees no GPU.
    fn probe() -> Result<Vec<DeviceInfo>> {
        ensure_driver()?;
        let count = match device_count() {
            Err(Error::NoSuchDevice { .. }) => return Ok(Vec::new()),
            other => other?,
        };
        (0..count).map(device_info).collect()
    }

    fn open(ordinal: u32) -> Result<CudaDevice> {
        CudaDevice::open(ordinal)
    }
}

/// Checks, once per process, that `libcuda` loads and is at least as new as
/// the bindings (`cudarc::driver::sys::CUDA_VERSION`). Nothing may call the
/// driver before this passed.
pub(crate) fn ensure_driver() -> Result<()> {
    static DRIVER: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DRIVER
        .get_or_init(check_driver)
        .clone()
        .map_err(|detail| Error::NoDriver {
            backend: Cuda::ID,
            detail,
        })
}

fn check_driver() -> std::result::Result<(), String> {
    // SAFETY: `is_culib_present` tries to load the NVIDIA driver library by
    // its usual names and unloads it again; loading runs the vendor
    // library's initialisers, which is what every CUDA program does.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "the NVIDIA driver's CUDA library (`libcuda.so.1`, `nvcuda.dll`) could not \
                    be loaded; install the NVIDIA driver for your GPU \
                    (https://www.nvidia.com/drivers, or your distribution's `nvidia-driver` \
                    package), or add the directory holding `libcuda.so.1` to \
                    `LD_LIBRARY_PATH`"
                .into(),
        );
    }
    let mut version = 0;
    // SAFETY: the library is present (checked above), so cudarc loads it
    // instead of panicking; `cuDriverGetVersion` exists in every driver and
    // only writes the `c_int` we pass. The result layer has no wrapper for
    // it, hence the raw call.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!(
            "the CUDA driver did not report its version ({status:?}); reinstall the NVIDIA \
             driver, and check that `nvidia-smi` works"
        ));
    }
    if version < MIN_DRIVER_VERSION {
        return Err(format!(
            "the installed driver supports CUDA {} but the CUDA backend needs CUDA {} or newer; \
             update the NVIDIA driver (https://www.nvidia.com/drivers)",
            cuda_version(version),
            cuda_version(MIN_DRIVER_VERSION)
        ));
    }
    Ok(())
}

/// The oldest driver (as `cuDriverGetVersion` reports it) the backend runs
/// on, whatever `cuda-XXXXX` version the bindings were built for.
///
/// cudarc resolves each driver function on its first call and panics when
/// the loaded driver lacks it (the three the backend calls per command it
/// looks up itself, when a queue or a signal's event is made, and reports
/// a missing one as an error: `entry`). The backend calls only functions that every
/// driver since CUDA 11.2 exports (contexts, streams, events,
/// `cuLaunchKernel`, `cuMemcpy*Async_v2`, `cuMemsetD*Async`, modules), and
/// 11.4 is the oldest CUDA cudarc
/// supports. A driver at least this new therefore has every symbol the
/// backend can reach: a kernel's parameters are read from its PTX, not
/// asked of the driver (`cuFuncGetParamInfo` is 12.4's). The exception is
/// profiling with `cuda-13xxx` bindings (see `Cargo.toml`). Calling a
/// newer driver function through
/// [`CudaDevice::context`] is the caller's own check.
const MIN_DRIVER_VERSION: i32 = 11040;

/// Checks, once per process, that NVRTC loads. Nothing may call NVRTC
/// before this passed.
pub(crate) fn ensure_nvrtc() -> Result<()> {
    static NVRTC: OnceLock<bool> = OnceLock::new();
    // SAFETY: as for `libcuda` in `check_driver`: a trial load of the vendor
    // library by its usual names.
    if *NVRTC.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::NoDriver {
            backend: Cuda::ID,
            detail: "CUDA's runtime compiler (`libnvrtc`) could not be loaded; install NVRTC \
                     (the CUDA toolkit, the `cuda-nvrtc` package of NVIDIA's repositories, or \
                     `pip install nvidia-cuda-nvrtc-cu12`) and add its `lib` directory to \
                     `LD_LIBRARY_PATH`, or load kernels from PTX with `CudaProgram::from_ptx`"
                .into(),
        })
    }
}

/// The driver's version as `cuDriverGetVersion` reports it (`12080` for
/// 12.8); `None` if it does not say. Call after [`ensure_driver`].
pub(crate) fn driver_version() -> Option<i32> {
    let mut version = 0;
    // SAFETY: only called once `ensure_driver` found the library, so
    // cudarc loads it instead of panicking; the call writes one `c_int`.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    (status == sys::CUresult::CUDA_SUCCESS).then_some(version)
}

/// `12080` as `12.8`.
pub(crate) fn cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

/// Initialises the driver and counts the devices. Call after
/// [`ensure_driver`].
///
/// # Errors
/// [`Error::NoSuchDevice`] (with a count of 0) when the driver sees no GPU;
/// [`Error::NoDriver`] when it cannot start, saying why and what to do (see
/// [`init_error`]).
pub(crate) fn device_count() -> Result<u32> {
    result::init().map_err(|DriverError(code)| init_error(code))?;
    let count = result::device::get_count().map_err(|e| driver_error("counting devices", e))?;
    Ok(u32::try_from(count).unwrap_or(0))
}

/// What `cuInit` failing with `code` means: [`Error::NoSuchDevice`] (a
/// count of 0) for `CUDA_ERROR_NO_DEVICE`, which [`Cuda::probe`] answers as
/// no devices; otherwise [`Error::NoDriver`] naming the code, what
/// happened, the likely cause and the fix. The one place these texts live.
///
/// A driver older than the bindings never gets here: [`ensure_driver`]
/// checks the version first (the runtime API's
/// `cudaErrorInsufficientDriver` has no driver-API code).
pub(crate) fn init_error(code: sys::CUresult) -> Error {
    use sys::CUresult as R;
    // (what happened, likely cause, fix)
    let (what, cause, fix) = match code {
        R::CUDA_ERROR_NO_DEVICE => {
            return Error::NoSuchDevice {
                backend: Cuda::ID,
                ordinal: 0,
                count: 0,
            };
        }
        R::CUDA_ERROR_NOT_INITIALIZED => (
            "the driver refused to initialise in this process",
            "the process was forked from one that had already initialised CUDA (driver state \
             does not survive `fork`), or the driver's own start-up was interrupted",
            "initialise CUDA only in the child, or start workers with fork+exec \
             (`std::process::Command`, Python multiprocessing's `spawn`) instead of a bare \
             `fork`; otherwise run `nvidia-smi` and look for NVRM errors in `dmesg`",
        ),
        R::CUDA_ERROR_OUT_OF_MEMORY => (
            "the driver ran out of memory while starting",
            "a limit on the process's memory (`ulimit -v`, a container or cgroup limit) is \
             below the virtual address space the driver reserves",
            "lift the limit (`ulimit -v unlimited`, or a larger container memory limit)",
        ),
        R::CUDA_ERROR_STUB_LIBRARY => (
            "the `libcuda` loaded is the CUDA toolkit's link-time stub, not the driver",
            "a toolkit `stubs` directory (such as `/usr/local/cuda/lib64/stubs`) is on \
             `LD_LIBRARY_PATH`",
            "remove the `stubs` directory from `LD_LIBRARY_PATH` so that the driver's \
             `libcuda.so.1` loads",
        ),
        R::CUDA_ERROR_DEVICE_UNAVAILABLE => (
            "the GPU is busy or unavailable to this process",
            "the GPU is in exclusive-process compute mode and another process holds it, or \
             in prohibited mode",
            "find the process holding it with `nvidia-smi --query-compute-apps=pid,name \
             --format=csv` and stop it, or (as root) set the default compute mode with \
             `nvidia-smi -c DEFAULT`",
        ),
        R::CUDA_ERROR_INVALID_DEVICE => (
            "the driver was pointed at a GPU that does not exist",
            "`CUDA_VISIBLE_DEVICES` names an index or UUID that no GPU has",
            "compare `CUDA_VISIBLE_DEVICES` with the GPUs `nvidia-smi -L` lists, or unset it",
        ),
        R::CUDA_ERROR_DEVICE_NOT_LICENSED => (
            "the GPU is a virtual GPU without a valid licence",
            "the vGPU licence client has not obtained a licence",
            "check `nvidia-smi -q | grep -i licen` and configure the vGPU licence (the \
             `nvidia-gridd` service)",
        ),
        R::CUDA_ERROR_OPERATING_SYSTEM => (
            "a system call inside the driver failed",
            "the process cannot open the GPU device files (`/dev/nvidia*`, \
             `/dev/nvidia-uvm`): the `nvidia-uvm` kernel module is not loaded, the files' \
             permissions exclude this user, or a container or sandbox hides them",
            "check `ls -l /dev/nvidia*`; load the module with `sudo modprobe nvidia-uvm` (or \
             `sudo nvidia-modprobe -u -c=0`); run containers with `--gpus all`",
        ),
        R::CUDA_ERROR_NOT_PERMITTED => (
            "the driver does not permit this process to use the GPU",
            "a container or sandbox restricts access to the GPU, or the GPU is partitioned \
             (MIG) and no instance is assigned to this process",
            "run `nvidia-smi -L` as the same user in the same container; pass `--gpus all` to \
             Docker; with MIG, set `CUDA_VISIBLE_DEVICES` to an instance's `MIG-...` UUID \
             from `nvidia-smi -L`",
        ),
        R::CUDA_ERROR_NOT_SUPPORTED => (
            "the driver does not support this GPU or platform",
            "the GPU is older than the installed driver branch supports, or the platform (a \
             VM without GPU passthrough, an unsupported WSL setup) has no CUDA support",
            "check that `nvidia-smi` lists the GPU and that the driver supports it \
             (https://www.nvidia.com/drivers); for an older GPU, install the legacy driver \
             branch that still does",
        ),
        R::CUDA_ERROR_SYSTEM_NOT_READY => (
            "the system's GPU interconnect is not ready",
            "on an NVSwitch system (HGX, DGX) the NVIDIA Fabric Manager is not running, or its \
             version differs from the driver's",
            "`sudo systemctl start nvidia-fabricmanager` (install the `nvidia-fabricmanager` \
             package of the driver's exact version), then check `systemctl status \
             nvidia-fabricmanager`",
        ),
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => (
            "the driver's user-space library and its kernel module are different versions",
            "the driver was upgraded while the old kernel module stayed loaded, or a second \
             `libcuda` of another version is on the library path (`nvidia-smi` then says \
             \"Driver/library version mismatch\")",
            "reboot (or unload and reload the `nvidia` modules); if that does not help, \
             compare `cat /proc/driver/nvidia/version` with the version of `libcuda.so.1` \
             and reinstall the driver so that they match",
        ),
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => (
            "the CUDA forward-compatibility package was loaded on a GPU that does not \
             support it",
            "`libcuda` came from a `cuda-compat` package (e.g. `/usr/local/cuda/compat` on \
             `LD_LIBRARY_PATH`, as some containers set), which only data-center GPUs accept",
            "remove the `compat` directory from `LD_LIBRARY_PATH` (or uninstall \
             `cuda-compat-*`) so that the system driver's `libcuda.so.1` loads, and update \
             that driver if it is older than the CUDA version you need",
        ),
        R::CUDA_ERROR_UNKNOWN => (
            "the driver failed with an unspecified error",
            "most often the `nvidia_uvm` kernel module is missing or wedged, typically after \
             a suspend/resume or a driver upgrade",
            "reload it with `sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`, or reboot; \
             `dmesg | grep -i nvrm` shows the driver's own account",
        ),
        _ => (
            "the driver failed to start",
            "not one this backend knows; see the code in NVIDIA's `cuInit` documentation",
            "run `nvidia-smi` and look for NVRM errors in `dmesg`",
        ),
    };
    Error::NoDriver {
        backend: Cuda::ID,
        detail: format!(
            "`cuInit` failed with {code:?} ({}): {what}. Likely cause: {cause}. Fix: {fix}. If \
             `nvidia-smi` fails too, the driver installation itself is broken: reinstall the \
             NVIDIA driver (https://www.nvidia.com/drivers)",
            code as u32
        ),
    }
}

/// What the probe reports for device `ordinal`, without opening a context.
fn device_info(ordinal: u32) -> Result<DeviceInfo> {
    let fail = |e| driver_error("querying a device", e);
    let index = i32::try_from(ordinal).map_err(|_| Error::NoSuchDevice {
        backend: Cuda::ID,
        ordinal,
        count: 0,
    })?;
    let device = result::device::get(index).map_err(fail)?;
    let name = result::device::get_name(device).map_err(fail)?;
    // SAFETY: `device` came from `cuDeviceGet` for an ordinal below the
    // device count, after `cuInit` succeeded.
    let memory = unsafe { result::device::total_mem(device) }.map_err(fail)?;
    // SAFETY: as above; the attribute exists in every CUDA version.
    let units = unsafe {
        result::device::get_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
    }
    .map_err(fail)?;
    Ok(DeviceInfo {
        spec: DeviceSpec::cuda(ordinal),
        name,
        memory: u64::try_from(memory).ok(),
        compute_units: u32::try_from(units).ok(),
    })
}

/// The devices (by ordinal) a sticky error made unusable for the rest of
/// the process, each with the first such error.
static LOST: OnceLock<crate::sync::Mutex<Vec<(u32, String)>>> = OnceLock::new();

/// [`Error::DeviceLost`] if a sticky error hit device `ordinal` in this
/// process.
///
/// Inlined to the one load that says no device was ever lost: every batch
/// asks (`Shared::prepare`).
#[inline]
pub(crate) fn lost(ordinal: u32) -> Option<Error> {
    lost_among(LOST.get()?, ordinal)
}

#[cold]
fn lost_among(lost: &crate::sync::Mutex<Vec<(u32, String)>>, ordinal: u32) -> Option<Error> {
    lost.lock()
        .iter()
        .find(|(lost, _)| *lost == ordinal)
        .map(|(_, detail)| device_lost(ordinal, detail.clone()))
}

fn device_lost(ordinal: u32, detail: String) -> Error {
    Error::DeviceLost {
        device: DeviceSpec::cuda(ordinal).to_string(),
        detail,
    }
}

/// A driver call on device `ordinal` that failed, as an [`Error`]. A
/// sticky error (an illegal address, a launch failure: see
/// `launch::is_sticky`) marks the device lost for the rest of the process
/// and is [`Error::DeviceLost`]: every later use of the device, a reopen
/// through the registry included, answers the same.
pub(crate) fn device_error(ordinal: u32, what: &str, error: DriverError) -> Error {
    if !launch::is_sticky(error.0) {
        return driver_error(what, error);
    }
    let detail = format!("{what}: {error}");
    let mut lost = LOST.get_or_init(Default::default).lock();
    if !lost.iter().any(|(lost, _)| *lost == ordinal) {
        lost.push((ordinal, detail.clone()));
    }
    device_lost(ordinal, detail)
}

/// [`device_error`] for work on `context`: the device is the context's.
pub(crate) fn context_error(
    context: &cudarc::driver::CudaContext,
    what: &str,
    error: DriverError,
) -> Error {
    let ordinal = u32::try_from(context.ordinal()).unwrap_or(u32::MAX);
    device_error(ordinal, what, error)
}

/// A driver call that failed, as an [`Error`].
pub(crate) fn driver_error(what: &str, error: DriverError) -> Error {
    Error::Driver {
        backend: Cuda::ID,
        what: what.to_owned(),
        detail: format!(
            "{error}; if the error is sticky (an illegal address, a launch failure), the context \
             is unusable for the rest of the process"
        ),
    }
}

static_assertions::assert_eq_size!(Cuda, ());
static_assertions::assert_impl_all!(CudaQueue: Send);
static_assertions::assert_impl_all!(CudaSignal: Send, Sync, Clone);
static_assertions::assert_impl_all!(CudaBuffer: Send, Sync, Clone);
static_assertions::assert_impl_all!(CudaProgram: Send, Sync, Clone);
static_assertions::assert_impl_all!(CudaDevice: Send, Sync, Clone);
// Handles are one pointer, so the Any* enums stay a pointer and a tag.
static_assertions::assert_eq_size!(CudaSignal, usize);
static_assertions::assert_eq_size!(CudaBuffer, usize);
static_assertions::assert_eq_size!(CudaProgram, usize);

#[cfg(test)]
mod tests {
    use super::*;
    use sys::CUresult as R;

    /// The codes [`init_error`] has advice of its own for.
    const ADVISED: [R; 13] = [
        R::CUDA_ERROR_NOT_INITIALIZED,
        R::CUDA_ERROR_OUT_OF_MEMORY,
        R::CUDA_ERROR_STUB_LIBRARY,
        R::CUDA_ERROR_DEVICE_UNAVAILABLE,
        R::CUDA_ERROR_INVALID_DEVICE,
        R::CUDA_ERROR_DEVICE_NOT_LICENSED,
        R::CUDA_ERROR_OPERATING_SYSTEM,
        R::CUDA_ERROR_NOT_PERMITTED,
        R::CUDA_ERROR_NOT_SUPPORTED,
        R::CUDA_ERROR_SYSTEM_NOT_READY,
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        R::CUDA_ERROR_UNKNOWN,
    ];

    /// `init_error`'s detail for `code`, which must be `NoDriver`.
    fn detail(code: R) -> String {
        match init_error(code) {
            Error::NoDriver { backend, detail } => {
                assert_eq!(backend, "cuda");
                detail
            }
            other => panic!("{code:?} gave {other:?}"),
        }
    }

    #[test]
    fn no_device_is_no_such_device_with_a_count_of_zero() {
        assert!(matches!(
            init_error(R::CUDA_ERROR_NO_DEVICE),
            Error::NoSuchDevice {
                backend: "cuda",
                ordinal: 0,
                count: 0
            }
        ));
    }

    #[test]
    fn each_advised_code_has_a_cause_and_fix_of_its_own() {
        let details: Vec<String> = ADVISED.into_iter().map(detail).collect();
        for (code, text) in ADVISED.into_iter().zip(&details) {
            assert!(
                text.starts_with(&format!(
                    "`cuInit` failed with {code:?} ({}): ",
                    code as u32
                )),
                "{text}"
            );
            assert!(
                text.contains("Likely cause: ") && text.contains("Fix: "),
                "{text}"
            );
            assert!(!text.contains("not one this backend knows"), "{text}");
            // A command or a path to act on, and the installation fallback
            // tests/cuda.rs expects of every `NoDriver`.
            assert!(text.matches('`').count() > 4, "{text}");
            assert!(text.contains("reinstall the NVIDIA driver"), "{text}");
        }
        for (i, text) in details.iter().enumerate() {
            let advice = |text: &str| text.split_once("): ").unwrap().1.to_owned();
            assert!(
                details[..i]
                    .iter()
                    .all(|other| advice(other) != advice(text)),
                "two codes share the advice of {text}"
            );
        }
    }

    #[test]
    fn the_common_codes_name_their_specific_cause_and_fix() {
        let cases: [(R, &[&str]); 6] = [
            (R::CUDA_ERROR_NOT_INITIALIZED, &["fork", "fork+exec"]),
            (
                R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
                &["forward-compatibility", "cuda-compat", "LD_LIBRARY_PATH"],
            ),
            (
                R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                &["kernel module", "reboot", "/proc/driver/nvidia/version"],
            ),
            (
                R::CUDA_ERROR_DEVICE_UNAVAILABLE,
                &["exclusive-process", "nvidia-smi -c DEFAULT"],
            ),
            (R::CUDA_ERROR_OPERATING_SYSTEM, &["/dev/nvidia", "modprobe"]),
            (R::CUDA_ERROR_UNKNOWN, &["nvidia_uvm", "reboot"]),
        ];
        for (code, phrases) in cases {
            let text = detail(code);
            for phrase in phrases {
                assert!(text.contains(phrase), "{code:?}: no `{phrase}` in {text}");
            }
        }
    }

    #[test]
    fn a_code_without_advice_is_still_named() {
        let text = detail(R::CUDA_ERROR_DEINITIALIZED);
        assert!(
            text.starts_with("`cuInit` failed with CUDA_ERROR_DEINITIALIZED (4): "),
            "{text}"
        );
        assert!(text.contains("nvidia-smi"), "{text}");
        assert!(text.contains("reinstall the NVIDIA driver"), "{text}");
    }
}
