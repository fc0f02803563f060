//! # hwqueue: the device layer of an ML compiler
//!
//! A compiler hands hwqueue compiled kernels, buffers and dependencies;
//! hwqueue runs them through hardware command queues and timeline signals.
//!
//! ## Design choices
//!
//! - **Backends are types, chosen at compile time.** A [`Backend`] is a
//!   zero-sized type naming a family of associated types (device, queue,
//!   signal, buffer, program). Code generic over `B: Backend` is
//!   monomorphised, so a launch through [`QueueOf<B>`] is a direct call: no
//!   `dyn` stands on the path of `wait`, `signal`, `exec`, `copy` or
//!   `submit`. Each associated type points back to its backend, so handing a
//!   CUDA buffer to a CPU queue does not compile.
//! - **Queues record, then submit.** A [`HardwareQueue`] batches commands;
//!   `submit` hands the batch over without waiting. Commands run in order.
//!   An invalid command rejects its whole batch at `submit`: nothing is
//!   silently dropped or clamped.
//! - **One queue core, one engine per backend.** Every backend's queue is a
//!   [`Queue<E>`](Queue): recording, validation, rejection, in-order
//!   abandonment and the failure [`Ledger`](queue::Ledger) are written once
//!   ([`queue`]); a backend supplies an [`Engine`], how it runs a batch.
//!   A backend defined in another crate does the same.
//! - **Signals tell the truth.** A [`TimelineSignal`]'s value is the highest
//!   value whose work has *completed*. When work fails, the signals it would
//!   have set fail too, and their waiters wake with the error: failure never
//!   hangs anyone. A signal has one producing queue, so a failure fails only
//!   the values that queue would have set.
//! - **One place for synchronisation.** Atomics, locks and condvars come from
//!   one internal `sync` module, which swaps in loom's types under
//!   `cfg(loom)`, so the loom models check the real code.
//! - **Errors say how to fix it.** One [`Error`] enum; each variant carries the
//!   facts, each message ends with what to do.
//!
//! ## Where `dyn` stands
//!
//! Nowhere on the path of a command of a queue's own backend. Four trait
//! objects remain in the library, all off it: the panic payload that
//! `catch_unwind` hands back (a kernel's or a backend's panic, turned into
//! an error); the signal of a [`wait_foreign`](HardwareQueue::wait_foreign)
//! ([`ForeignWait`](queue::ForeignWait)), which may be of any type, from any
//! crate, and must wait in a batch until the engine reaches it; and, for
//! host transfers, the owner of an
//! [`upload_vec`](HardwareQueue::upload_vec)'s data and the host memory of
//! a [`Download`], which a batch holds for any element type (each is
//! touched once, when the transfer runs).
//!
//! ## The traits
//!
//! | trait | role |
//! |-------|------|
//! | [`Backend`] | the root: ids, precedence, associated types, probe and open |
//! | [`Device`] | an opened device: allocates buffers, reports limits |
//! | [`QueueFactory`] | makes compute queues, an optional copy queue, and signals |
//! | [`HardwareQueue`] | records `wait`/`signal`/`exec`/`copy`/`memory_barrier`, then `submit`s; every backend's is a [`Queue`] |
//! | [`Engine`] | how a backend runs the batches its [`Queue`] records |
//! | [`TimelineSignal`] | a monotonically increasing `u64`: `value`, `set`, `wait`, `is_reached`; host waits on several at once with [`wait_all`] and [`wait_any`] |
//! | [`Buffer`] | device memory with host `write_from`/`read_into` |
//! | [`Program`] | a loaded kernel |
//!
//! Plain types: [`ExecParams`] (1–3-D global and local sizes, validated at
//! `submit`), [`DeviceSpec`] (`cpu`, `cuda:1`, …), [`Timeout`], [`Scalar`].
//!
//! ## Backends
//!
//! | backend | module | feature |
//! |---------|--------|---------|
//! | CPU (the reference) | [`cpu`] | always |
//! | CUDA (driver API and NVRTC via `cudarc`, loaded at run time) | `cuda` | `cuda` |
//!
//! The CUDA signal is an [`EventRing`](ring::EventRing) of device events, a
//! concept compiled in every build (and tested with a mock event) so it can
//! be checked without a GPU.
//!
//! ## Example
//!
//! ```
//! use hwqueue::cpu::{CpuDevice, CpuProgram, WorkGroup, KernelArgs};
//! use hwqueue::{Buffer, Device, ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout};
//!
//! fn double(group: &WorkGroup, args: &KernelArgs<'_>) {
//!     let range = group.global_range(0);
//!     // SAFETY: each work-group touches only its own range.
//!     let data = unsafe { args.buffer(0).slice_mut::<f32>(range) };
//!     for x in data {
//!         *x *= 2.0;
//!     }
//! }
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = CpuDevice::new();
//! let buffer = device.alloc(1024 * 4)?;
//! buffer.write_from(&vec![1.0f32; 1024])?;
//! let program = CpuProgram::from_fn("double", 1, 0, double);
//! let done = device.new_signal(0)?;
//!
//! let mut queue = device.compute_queue()?;
//! queue
//!     .exec(&program, &[&buffer], &[], ExecParams::new_1d(1024, 256))
//!     .signal(&done, 1)
//!     .submit()?;
//! done.wait(1, Timeout::Forever)?;
//!
//! assert_eq!(buffer.to_vec::<f32>()?, vec![2.0f32; 1024]);
//! # Ok(())
//! # }
//! ```

pub mod any;
pub mod backend;
pub mod buffer;
pub mod collective;
#[cfg(doctest)]
pub mod compile_fail_tests;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod error;
pub mod executor;
pub mod memory;
pub mod multi_wait;
pub mod params;
pub mod profile;
pub mod program;
pub mod ptx;
pub mod queue;
pub mod registry;
pub mod ring;
pub mod signal;
pub mod spec;
mod sync;
pub mod transfer;
pub mod view;
pub mod wait_policy;
// Not in the loom models' build: they model the CPU's synchronisation,
// and a driver backend there only grows `AnyQueue`.
#[cfg(all(feature = "vulkan", not(loom)))]
pub mod vulkan;

pub use any::{
    AnyBackend, AnyBuffer, AnyDevice, AnyProgram, AnyQueue, AnySignal, BackendEntry, BackendSet,
};
pub use backend::{Backend, BufferOf, DeviceInfo, DeviceOf, ProgramOf, QueueOf, SignalOf};
pub use buffer::{Buffer, Pod, Zeroable};
/// `bytemuck`, for `#[derive(Pod, Zeroable)]` on a type of your own.
pub use bytemuck;
pub use device::{Device, QueueFactory};
pub use error::{Error, Result};
pub use executor::{
    BufferId, DeviceId, Hazard, OpId, Plan, PlanMemory, PlannedWait, Run, ScalarId, Schedule,
    TensorPlacement, WaitReason,
};
/// `half`, whose `f16` and `bf16` move through buffers and scalars.
#[cfg(feature = "half")]
pub use half;
pub use memory::{MemoryPool, MemoryStats};
pub use multi_wait::{SignalWaker, wait_all, wait_any};
pub use params::{ExecParams, Limits};
pub use profile::{Category, KernelTiming, ProfileEvent, chrome_trace, time_exec};
pub use program::{KernelSignature, Program, Scalar};
pub use queue::{Engine, FailureScope, HardwareQueue, Launches, Queue, QueueId, QueueKind};
pub use registry::{BackendReport, Policy, Registry, Selection, preferred};
#[cfg(not(loom))]
pub use registry::{acquire, registry};
pub use signal::{MAX_SIGNAL_VALUE, Producer, TimelineSignal, Timeout};
pub use spec::{DeviceSpec, SPEC_NAMES, SpecName};
pub use transfer::Download;
pub use view::{AsView, View};
pub use wait_policy::{WaitPolicy, WaitTuning};
