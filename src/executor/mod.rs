//! The executor: plan a schedule once, run it many times.
//!
//! A compiler hands hwqueue a [`Schedule`]: operations (kernel `exec`s,
//! copies, fills, host uploads and downloads, and collectives over a
//! [`Communicator`](crate::collective::Communicator): `collective.rs`) in program order, each declaring the byte ranges of the buffers it
//! reads and writes, the device it runs on and the queue kind it wants.
//! [`Schedule::plan`] turns it into a [`Plan`]:
//!
//! - **Queues.** One compute queue per device used, one copy queue per device
//!   whose copies ask for one (the compute queue where the device has none),
//!   and one host stage for copies between devices that cannot see each
//!   other's memory: it reads the source to host memory and writes the
//!   destination, in order, on a thread of the plan's own.
//! - **Several backends.** A schedule over a backend set ([`AnyBackend`](crate::AnyBackend),
//!   or a [`backend_set!`](crate::backend_set) of your own) spans devices
//!   of different backends, a CPU beside a GPU: copies between them run on
//!   the host stage, and a queue waits on another backend's signal with
//!   `wait_foreign` within a run and `wait_foreign_settled` on the run
//!   before it (`ordering.rs` says why the latter is settled). Runs
//!   started back to back stay correct across backends as within one.
//! - **Dependencies** come from hazards between an operation and every
//!   earlier one: read-after-write, write-after-read and write-after-write on
//!   overlapping byte ranges of one buffer. Disjoint ranges do not depend.
//! - **Fewest waits.** Every queue has one timeline signal and every
//!   operation a value on it. A dependency on the same queue needs nothing
//!   (queues run in order). Across queues, the planner keeps a vector clock
//!   per queue position (what each queue is known to have completed there),
//!   and inserts a wait only when no earlier wait already implies it, directly
//!   or through another queue's wait; of the waits one operation needs, those
//!   implied by another of them are dropped.
//! - **Back-to-back runs.** The planner plans the schedule twice in a row
//!   and keeps the second copy's waits, so hazards between an operation and
//!   one of the *previous* run (the next upload overwriting what the last
//!   matmul still reads) get a wait too, marked `previous_run`; runs started
//!   without waiting for each other stay correct. The first run skips them,
//!   and so does a run whose previous run already failed at that point (its
//!   later operations never run, so there is nothing to race, and the new
//!   run must not inherit the failure).
//!
//! - **Replay.** Every run records the same commands on each queue (the
//!   values and host data aside), so each run's batch on a device queue is
//!   marked for replay ([`HardwareQueue::replay_as`],
//!   keyed by the queue): an engine with a replay form records it once
//!   and submits the recording again while the commands match (Vulkan:
//!   command buffers resubmitted with the run's semaphore values; a
//!   rebinding rewrites the changed descriptors of an idle recording
//!   where the driver can write them after binding, and otherwise, like
//!   another scalar value, records anew, the last few recordings kept.
//!   CUDA: each run of kernels a CUDA graph, instantiated
//!   once and launched per run, the run's signals recorded after it; a
//!   rebinding or another scalar value patches the changed kernel nodes in
//!   place, never instantiating again). A run whose bindings and scalars
//!   did not change since the last one that recorded its kernels records
//!   none where the engine still holds that run's programs
//!   ([`HardwareQueue::replay_recorded`]: CUDA's graphs): one
//!   [`replay_program`](HardwareQueue::replay_program) per run of kernels
//!   and one signal at its last value instead (`replay.rs`). The CPU engine
//!   has none and runs every batch as recorded. A recording the driver refuses falls back to
//!   the plain path with the reason kept. [`Plan::launches`] counts what was recorded
//!   against what was replayed; [`Plan::set_replay`] turns it off. Failure,
//!   refusal, profiling (a profiled run is recorded the plain way) and the
//!   ordering of runs are the same either way.
//!
//! Uploads and downloads name device bytes only; the host data changes
//! every run, so [`Plan::upload`] and [`Plan::download`] stage it for the
//! next run, which consumes it (a run with one left unstaged is refused).
//! The inputs land and the outputs leave in queue order, ordered against
//! the kernels by the same hazards:
//!
//! ```
//! use std::sync::Arc;
//! use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
//! use hwqueue::{Device, Download, ExecParams, Schedule, Timeout};
//!
//! fn double(group: &WorkGroup, args: &KernelArgs<'_>) {
//!     // SAFETY: each work-group touches only its own range.
//!     for x in unsafe { args.buffer(0).slice_mut::<f32>(group.global_range(0)) } {
//!         *x *= 2.0;
//!     }
//! }
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = Arc::new(CpuDevice::new());
//! let program = CpuProgram::from_fn("double", 1, 0, double);
//! let mut schedule = Schedule::<Cpu>::new();
//! let d = schedule.add_device(device.clone());
//! let x = schedule.add_tensor(d, "x", 4096);               // placed by the planner
//! let up = schedule.upload("upload x", x).id();            // the model's input ...
//! schedule.exec("double", d, &program, &[x], &[], ExecParams::new_1d(1024, 256));
//! let down = schedule.download("download x", x).id();      // ... and its output
//! let mut plan = schedule.plan()?;
//!
//! for step in 0..3 {
//!     plan.upload(up, &vec![step as f32; 1024])?;         // this run's data
//!     let out = Download::<f32>::new(1024);
//!     plan.download(down, &out)?;                          // where its output lands
//!     plan.run()?.wait(Timeout::Forever)?;
//!     assert_eq!(out.take(Timeout::Forever)?, vec![2.0 * step as f32; 1024]);
//! }
//! // The last run consumed what was staged; a run without it is refused.
//! assert!(matches!(plan.run(), Err(hwqueue::Error::TransferNotStaged { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! **Memory.** Tensors declared by size ([`Schedule::add_tensor`]) are
//! placed by the planner: each lives from the first operation naming it to
//! the last, and a device's tensors share one arena from its pool, greedy
//! by size with best fit, so tensors live together never share a byte
//! ([`Plan::memory`] reports the arena against the lower bound and the
//! naive sum). The hazards compare arena bytes, so reuse is ordered like any
//! other write-after-read. Explicit views of the caller's buffers
//! ([`Schedule::add_view`]) work beside them.
//!
//! **Bindings.** Slots ([`Schedule::add_slot`]) are inputs and outputs in
//! the caller's memory, bound per run with [`Plan::bind`] (no copy, no
//! re-planning, as IREE's binding tables), and scalar slots
//! ([`Schedule::add_scalar`], [`OpBuilder::scalar`]) values an exec takes
//! per run ([`Plan::set_scalar`]):
//!
//! ```
//! use std::sync::Arc;
//! use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
//! use hwqueue::{Buffer, Device, ExecParams, Scalar, Schedule, Timeout};
//!
//! /// `out = in + step`, one work-group.
//! fn add(_: &WorkGroup, args: &KernelArgs<'_>) {
//!     let step: u32 = args.scalar(0);
//!     let (input, out) = (args.buffer(0), args.buffer(1));
//!     // SAFETY: one work-group; the two are different memory.
//!     unsafe {
//!         let input = input.as_slice::<u32>();
//!         for (o, i) in out.slice_mut::<u32>(0..out.len::<u32>()).iter_mut().zip(input) {
//!             *o = i + step;
//!         }
//!     }
//! }
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = Arc::new(CpuDevice::new());
//! let program = CpuProgram::from_fn("add", 2, 1, add);
//! let mut schedule = Schedule::<Cpu>::new();
//! let d = schedule.add_device(device.clone());
//! let (input, output) = (schedule.add_slot(d, "in", 64), schedule.add_slot(d, "out", 64));
//! let step = schedule.add_scalar("step", 0u32);
//! schedule
//!     .exec("add", d, &program, &[input, output], &[Scalar::U32(0)], ExecParams::new_1d(1, 1))
//!     .scalar(0, step)                                    // scalar 0 from `step`, per run
//!     .reads(input, ..)
//!     .writes(output, ..);
//! let mut plan = schedule.plan()?;
//!
//! let (a, out) = (device.alloc(64)?, device.alloc(64)?);
//! a.write_at(0, &[40u32; 16])?;
//! plan.bind(input, &a)?;                                  // the caller's buffers ...
//! plan.bind(output, &out)?;
//! plan.set_scalar(step, 2u32)?;
//! plan.run()?.wait(Timeout::Forever)?;
//! let mut got = [0u32; 16];
//! out.read_at(0, &mut got)?;                              // ... hold the run's output
//! assert_eq!(got, [42; 16]);
//! # Ok(())
//! # }
//! ```
//!
//! [`Plan::run`] records every queue's batch with fresh timeline values
//! (each run sets signals of its own, one per queue: `n` values on a queue
//! of `n` operations), submits them and returns a [`Run`] handle. Nothing
//! is re-planned; the recording reuses the queues' batch storage.
//!
//! Failure of any operation fails the run, and only that run: its queue
//! fails the signals the batch would have set, every operation of the run
//! waiting on them fails in turn, and [`Run::wait`] returns
//! [`Error::OperationFailed`] naming the operation that failed first (the
//! unfinished operation whose own waits were all met). Runs recorded after
//! it, even before it failed, run as usual, ordered after the failed run's
//! surviving operations; nothing hangs. How runs are ordered (by the bytes
//! they touch, whatever slot or binding names them; through refusal,
//! failure and rebinding) is written down once, in `ordering.rs`.
//!
//! The files, each using only those above it: `schedule.rs` (the input),
//! `ordering.rs`, `memory.rs` (placing tensors), `host.rs`, `staged.rs`,
//! `run.rs`; `plan.rs` (recording a run); and the `impl`s that extend a
//! plan or schedule: `binding.rs`, `transfer.rs`, `collective.rs`,
//! `planner.rs`.

mod binding;
mod collective;
mod host;
mod memory;
mod ordering;
mod plan;
mod planner;
mod replay;
mod run;
mod schedule;
mod staged;
mod transfer;

use std::fmt;
use std::ops::Range;

pub use memory::{PlanMemory, TensorPlacement};
pub use ordering::{PlannedWait, WaitReason};
pub use plan::Plan;
pub use run::Run;
pub use schedule::{OpBuilder, Schedule};

use crate::backend::Backend;
use crate::buffer::Pod;
use crate::device::QueueFactory;
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::{Program, Scalar};
use crate::queue::{HardwareQueue, QueueKind};
use crate::signal::{TimelineSignal, Timeout};
use crate::sync::Arc;
use crate::view::View;

/// A device of a schedule: an index into [`Schedule::add_device`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(usize);

/// A buffer of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

/// A scalar slot of a schedule ([`Schedule::add_scalar`]): a value an
/// exec takes per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScalarId(usize);

/// An operation of a schedule, in program order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(usize);

impl OpId {
    /// The operation's position in program order.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A byte range of a buffer that an operation reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Access {
    buffer: BufferId,
    range: Range<usize>,
}

impl Access {
    fn overlaps(&self, other: &Access) -> bool {
        self.buffer == other.buffer
            && self.range.start < other.range.end
            && other.range.start < self.range.end
    }
}

/// Which way two operations conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hazard {
    /// The later operation reads what the earlier wrote.
    ReadAfterWrite,
    /// The later operation overwrites what the earlier read.
    WriteAfterRead,
    /// Both write.
    WriteAfterWrite,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hazard::ReadAfterWrite => "read-after-write",
            Hazard::WriteAfterRead => "write-after-read",
            Hazard::WriteAfterWrite => "write-after-write",
        })
    }
}
