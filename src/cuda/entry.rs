//! The driver's entry points on the paths a queue takes per command
//! (`cuLaunchKernel`, `cuEventRecord`, `cuEventQuery`), looked up once in
//! the library cudarc loaded and then called directly.
//!
//! cudarc's `sys` functions check a lazily initialised pointer of their
//! own on every call and pass their arguments on again (for a launch,
//! eleven of them): about a tenth of hwqueue's own cost of an `exec` on
//! the fake driver (`benches/callgrind.sh`). The pointers here are the
//! very symbols cudarc would call, looked up by the same names in the
//! same library handle (`sys::culib`). One difference: a driver library
//! without one of them (no real driver; every one since CUDA 4 has all
//! three) fails the queue's or the signal event's creation with an error,
//! where cudarc would panic at the first call.

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUevent, CUfunction, CUresult, CUstream};

use crate::error::{Error, Result};

/// `cuLaunchKernel`'s signature, as cudarc declares it.
pub(super) type LaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// `cuEventRecord`'s signature, as cudarc declares it.
pub(super) type EventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;

/// `cuEventQuery`'s signature, as cudarc declares it.
pub(super) type EventQuery = unsafe extern "C" fn(CUevent) -> CUresult;

/// The driver's hot entry points (see the module docs).
#[derive(Debug)]
pub(super) struct Entries {
    pub(super) launch_kernel: LaunchKernel,
    pub(super) event_record: EventRecord,
    pub(super) event_query: EventQuery,
}

/// The entry points, looked up on first use. Call only once the driver
/// is known present (the caller holds a context of an opened device):
/// cudarc's `culib` loads the library, or panics without one.
///
/// # Errors
/// [`Error::System`] when the driver library lacks one of them (no real
/// driver does; a stand-in might).
pub(super) fn entries() -> Result<&'static Entries> {
    static ENTRIES: OnceLock<std::result::Result<Entries, String>> = OnceLock::new();
    let found = ENTRIES.get_or_init(|| {
        // SAFETY: both callers hold a context of an opened device, so
        // cudarc has loaded the library and `culib` returns its handle
        // (it never panics here); each type is the
        // symbol's C signature as cudarc's bindings of the CUDA headers
        // declare it, and the library stays loaded for the process
        // (cudarc's handle is a static), so the pointers never dangle.
        unsafe {
            let library = sys::culib();
            let find = |name: &str| format!("the CUDA driver library has no `{name}`");
            Ok(Entries {
                launch_kernel: *library
                    .get::<LaunchKernel>(b"cuLaunchKernel\0")
                    .map_err(|_| find("cuLaunchKernel"))?,
                event_record: *library
                    .get::<EventRecord>(b"cuEventRecord\0")
                    .map_err(|_| find("cuEventRecord"))?,
                event_query: *library
                    .get::<EventQuery>(b"cuEventQuery\0")
                    .map_err(|_| find("cuEventQuery"))?,
            })
        }
    });
    found.as_ref().map_err(|detail| Error::System {
        what: "looking up the CUDA driver's entry points",
        detail: format!("{detail}; install NVIDIA's CUDA driver (libcuda.so.1)"),
    })
}
