//! The CPU backend: the reference every other backend is tested against.
//!
//! - [`CpuSignal`] is one atomic word (value and a "waiting" flag) plus a
//!   mutex and condvar for the slow path; `set` with nobody waiting is one
//!   `fetch_max`, and no wake-up can be lost (the protocol is documented on
//!   the word and checked by loom).
//! - [`CpuQueue`] is the shared queue core over a [`CpuEngine`], which owns
//!   a worker thread. `submit` moves the recorded batch to it under one
//!   lock; the worker runs batches in order, `exec` spreading work-groups
//!   over the device's pool: its `threads` execution slots, shared by all
//!   its queues, run by the workers themselves and `threads - 1` helper
//!   threads that live as long as the device (no thread per `exec`).
//! - [`CpuBuffer`] is 64-byte-aligned host memory behind a lock, so host
//!   reads and writes never race queue work: a range of the device's
//!   [`MemoryPool`](crate::memory::MemoryPool), whose blocks are anonymous
//!   mappings ([`HostBlocks`]).
//! - [`CpuProgram`] is a function called once per work-group: Rust, or C
//!   compiled at run time by the system compiler into a cached shared
//!   library (the ABI is below, [`CPU_KERNEL_PRELUDE`] its header).
//!
//! Failure never hangs: a panicking kernel or a failed wait ends its batch,
//! fails the signals it would have set, and is reported to the queue's owner.
//!
//! The CPU is marked a reference oracle: automatic selection never ranks it
//! by precedence, it is only the explicit fallback when nothing else is present.
//!
//! # The C kernel ABI (version 1)
//!
//! [`CpuProgram::from_c_source`] prepends [`CPU_KERNEL_PRELUDE`] to the
//! source, compiles it into a shared library with the system C compiler and
//! looks up one function, the entry point:
//!
//! ```c
//! void NAME(const hwq_group *group, void *const *buffers, const hwq_scalar *scalars);
//! /* or, with the prelude's macro, which also exports it: */
//! HWQ_KERNEL(NAME) { ... }
//! ```
//!
//! - It is called once per work-group, like a Rust kernel, possibly on
//!   several threads at once, and loops over the group's work-items itself.
//!   `group` is laid out as [`WorkGroup`]: `uint32_t id[3], groups[3],
//!   local[3]` (`blockIdx`, `gridDim`, `blockDim`).
//! - `buffers[i]` is the start of buffer argument `i`, aligned to
//!   [`CPU_BUFFER_ALIGN`] (64) bytes; the kernel must stay within the
//!   buffer's size. A buffer passed twice gives two equal pointers: do not
//!   declare such pointers `restrict`.
//! - `scalars[i]` is scalar argument `i`, an 8-byte union: read the member
//!   of the [`Scalar`](crate::Scalar) variant passed (`u32`, `i32`, `u64`, `i64`, `f32`,
//!   `f64`). Types are not checked, counts are (at `submit`).
//! - Both arrays are built once per `exec` and shared by all its groups;
//!   neither they nor the buffers may be used after the call returns.
//! - The contract of Rust kernels holds: the queue holds the buffers
//!   exclusively for the `exec`, and no two work-groups may race on the same
//!   bytes (one writing what another reads or writes) except through atomics.
//!
//! A C kernel cannot panic, so it cannot fail its batch: one that crashes
//! (a bad pointer, `abort`) takes the process down, and nothing can catch
//! that. A kernel that runs is as fast as the compiler made it: the call
//! costs one indirect call per work-group.
//!
//! Libraries are cached in the process and on disk, keyed by the text
//! compiled, the flags and the compiler, and checked against the headers
//! and static libraries the compile read: [`CompileOptions`] describes the
//! cache, and [`CpuProgram::cache_outcome`] says whether a program was
//! compiled, loaded from disk, or already loaded.

mod buffer;
mod c_compiler;
mod c_manifest;
mod device;
mod memory;
mod pool;
mod program;
mod queue;
mod signal;

pub use buffer::{CPU_BUFFER_ALIGN, CpuBuffer};
pub use c_compiler::{CacheOutcome, CompileOptions, DEFAULT_C_FLAGS};
pub use device::{CPU_LIMITS, CpuDevice};
pub use memory::{HostAddress, HostBlock, HostBlocks};
pub use program::{
    BufferView, CPU_KERNEL_PRELUDE, CpuKernelFn, CpuProgram, FromScalar, KernelArgs, WorkGroup,
};
pub use queue::{CpuEngine, CpuQueue};
pub use signal::CpuSignal;

use crate::backend::{Backend, DeviceInfo};
use crate::error::{Error, Result};

/// The CPU backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cpu;

impl Backend for Cpu {
    const ID: &'static str = "cpu";
    const PRECEDENCE: u32 = 0;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = true;
    const ALIASES: &'static [&'static str] = &["host"];

    type Device = CpuDevice;
    type Queue = CpuQueue;
    type Signal = CpuSignal;
    type Buffer = CpuBuffer;
    type Program = CpuProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        Ok(vec![CpuDevice::info()])
    }

    fn open(ordinal: u32) -> Result<CpuDevice> {
        if ordinal != 0 {
            return Err(Error::NoSuchDevice {
                backend: Self::ID,
                ordinal,
                count: 1,
            });
        }
        Ok(CpuDevice::new())
    }
}

static_assertions::assert_eq_size!(Cpu, ());
static_assertions::assert_impl_all!(CpuQueue: Send);
static_assertions::assert_impl_all!(CpuSignal: Send, Sync, Clone);
static_assertions::assert_impl_all!(CpuBuffer: Send, Sync, Clone);
static_assertions::assert_impl_all!(CpuProgram: Send, Sync, Clone);
static_assertions::assert_impl_all!(CpuDevice: Send, Sync, Clone);
static_assertions::assert_impl_all!(BufferView<'static>: Send, Sync, Copy);
