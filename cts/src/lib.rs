//! `hwqueue-cts`: the conformance test suite every hwqueue backend runs.
//!
//! Written anew for hwqueue after IREE's HAL CTS (`runtime/src/iree/hal/cts/`:
//! semaphores, submission, command buffer copies, fills and dispatches):
//! each case is a generic function over a [`Target`] (a backend, and how to
//! open a device of it and load the suite's kernels), and [`cts_suite!`]
//! expands to one `#[test]` per case for a given target:
//!
//! ```ignore
//! struct MyTarget;
//!
//! impl hwqueue_cts::Target for MyTarget {
//!     type Backend = MyBackend;
//!     fn device() -> Result<MyDevice, hwqueue_cts::Skip> { Ok(MyDevice::open()) }
//!     fn program(device: &MyDevice, kernel: hwqueue_cts::Kernel) -> hwqueue::Result<MyProgram> {
//!         match kernel {
//!             hwqueue_cts::Kernel::Add => my_compiler::load(device, "add"),
//!         }
//!     }
//! }
//!
//! hwqueue_cts::cts_suite!(MyTarget);
//! ```
//!
//! A case that finds the backend breaking the contract panics with a
//! message naming the case and the rule ([`rules`]), for instance
//! ``hwqueue-cts case `queue_batches_run_in_submission_order` failed on
//! `sim`: rule broken: queue order (...)``. A target whose device is
//! missing ([`Skip`]) makes every case print `skipped: <why>` and pass, as
//! hwqueue's GPU tests do without a GPU. `docs/backends.md` is the guide.

use std::sync::Arc;
use std::time::Duration;

use hwqueue::{Backend, DeviceOf, ProgramOf};

mod cases;
mod cx;

pub use cases::*;
pub use cx::Cx;

/// A backend under test, and how the suite gets what it needs of it.
pub trait Target: 'static {
    /// The backend.
    type Backend: Backend;

    /// A device to run the cases on, opened afresh or shared; or why there
    /// is none (no driver, no device), which makes each case skip.
    ///
    /// # Errors
    /// The [`Skip`] reason.
    fn device() -> Result<DeviceOf<Self::Backend>, Skip>;

    /// The suite's kernel `kernel` ([`Kernel`] says what it computes),
    /// loaded for `device`.
    ///
    /// # Errors
    /// Whatever loading it reports: a setup failure of the case.
    fn program(
        device: &DeviceOf<Self::Backend>,
        kernel: Kernel,
    ) -> hwqueue::Result<ProgramOf<Self::Backend>>;
}

/// Why a target has no device: each case prints `skipped: <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

/// The kernels the cases run. Every target supplies each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// `add(u32 data[], u32 n)`: `data[i] += n` (wrapping) for each `i` of
    /// a 1-D grid whose global size is the number of elements; one buffer,
    /// one scalar ([`hwqueue::Scalar::U32`]). Grids are whole multiples of
    /// their local size, so no bounds check is needed, but one is harmless.
    Add,
}

/// How long a case waits for what must happen (a failure past it is a
/// hang, reported as such).
pub const LONG: Duration = Duration::from_secs(10);

/// How long a case waits for what must *not* happen yet (a gated batch's
/// signal): the wait must time out, whatever the machine's speed.
pub const SHORT: Duration = Duration::from_millis(50);

/// The rules the cases check, as their failure messages name them.
pub mod rules {
    /// `Engine::submit` rule 1.
    pub const ORDER: &str = "queue order (Engine::submit rule 1: batches run in the order \
                             submitted, each command after the one before it; a signal is set \
                             only once every earlier command completed)";
    /// `Engine::submit` rule 2.
    pub const SETTLED: &str = "every batch settles (Engine::submit rule 2: each batch submitted \
                               runs, setting its signals, or fails them through the Ledger; none \
                               is dropped)";
    /// `Engine::submit` rule 3 and `TimelineSignal`.
    pub const MONOTONIC: &str = "signals only rise (Engine::submit rule 3, TimelineSignal::set: a \
                                 lower value is ignored)";
    /// `TimelineSignal::wait`.
    pub const WAIT: &str = "signal waits (TimelineSignal::wait: returns once the value is \
                            reached, times out with its figures, fails with SignalFailed when the \
                            work failed)";
    /// `TimelineSignal::fail`.
    pub const FAILURE: &str = "failure propagation (a failed batch fails the signals it would \
                               set, every waiter wakes once with SignalFailed, the queue reports \
                               QueueFailed once and runs later batches)";
    /// The commands' meaning.
    pub const COMMANDS: &str = "command semantics (exec, copy, fill, upload and download do \
                                exactly what HardwareQueue documents, on exactly their ranges)";
    /// Validation at recording.
    pub const VALIDATION: &str = "validation (an invalid command rejects its batch with the \
                                  documented error, and nothing of the batch runs)";
    /// Profiling.
    pub const PROFILE: &str = "profiling (with profiling on, each command of a completed batch \
                               has one event, named and ordered, on the queue's label)";
    /// Memory.
    pub const MEMORY: &str = "memory (alloc is zeroed and counted; alloca's buffer is valid in \
                              queue order; dealloca gives its range back)";
}

/// Runs case `name` against target `T`: skips (printing why) without a
/// device; otherwise runs it, and turns a failure into a panic naming the
/// case and the backend.
pub fn run<T: Target>(name: &str, case: fn(&Cx<T>)) {
    let device = match T::device() {
        Ok(device) => device,
        Err(Skip(why)) => {
            println!("skipped: {why}");
            return;
        }
    };
    let cx = Cx::<T>::new(Arc::new(device));
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&cx))) {
        let message = hwqueue::error::panic_message(payload);
        panic!(
            "hwqueue-cts case `{name}` failed on `{}`: {message}",
            <T::Backend as Backend>::ID
        );
    }
}

/// Expands to one `#[test]` per conformance case for target `$target` (a
/// type implementing [`Target`], in scope where the macro is invoked).
/// Invoke it once per target, in a module of its own when a crate tests
/// several.
#[macro_export]
macro_rules! cts_suite {
    ($target:ty) => {
        $crate::cts_suite!(@cases $target;
            signal_starts_at_its_initial_value_and_rises
            signal_lower_set_is_ignored
            signal_wait_before_the_set_returns_once_set
            signal_wait_times_out_with_its_figures
            signal_values_cross_2_pow_32
            signal_failure_wakes_every_waiter_once
            signal_value_past_the_maximum_is_an_error
            queue_signal_comes_after_the_work_before_it
            queue_batches_run_in_submission_order
            queue_dropped_while_its_batch_waits_returns_and_the_batch_runs
            queue_every_submitted_batch_settles
            queue_signal_never_lowers_a_value
            queue_submit_leaves_an_empty_batch_to_record_into
            queue_discard_fails_the_signals_it_would_set
            queue_exec_runs_the_kernel_over_the_grid
            view_exec_touches_only_its_range
            copy_partial_ranges_between_and_within_buffers
            copy_overlap_and_size_mismatch_reject_the_batch
            fill_patterns_of_1_2_and_4_bytes
            fill_misaligned_rejects_the_batch
            transfer_uploads_and_downloads_run_in_queue_order
            wait_all_and_wait_any_over_signals
            cross_queue_wait_orders_two_queues
            failure_propagates_and_the_queue_recovers
            failure_scoped_to_its_batch_drains_and_settles
            profile_events_name_each_command
            plan_runs_with_a_buffer_bound_per_run
            memory_alloc_is_zeroed_and_counted
            memory_alloca_and_dealloca_in_queue_order
        );
    };
    (@cases $target:ty; $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                $crate::run::<$target>(stringify!($case), $crate::$case::<$target>);
            }
        )*
    };
}

/// [`Kernel::Add`] as CUDA C (entry point `add`, one buffer and one
/// scalar), for a target that compiles CUDA C; `tests/nvrtc.rs` compiles it
/// with a real NVRTC with the crate's other kernels.
pub const ADD_CUDA_C: &str = r#"
extern "C" __global__ void add(unsigned int *data, unsigned int n) {
    data[blockIdx.x * blockDim.x + threadIdx.x] += n;
}
"#;

/// [`Kernel::Add`] as WGSL (entry point `add`, one storage buffer and one
/// push-constant `u32`; its work-group size an `override`, so any local
/// size runs), for a target that takes WGSL (the Vulkan backend).
pub const ADD_WGSL: &str = "
override local_x: u32 = 64;
override local_y: u32 = 1;
override local_z: u32 = 1;
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
var<immediate> n: u32;
@compute @workgroup_size(local_x, local_y, local_z)
fn add(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) {
        data[id.x] = data[id.x] + n;
    }
}
";
