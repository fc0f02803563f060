//! The CPU backend: the reference every other backend is tested against.
//!
//! - [`CpuSignal`] is one atomic word (value and a "waiting" flag) plus a
//!   mutex and condvar for the slow path; `set` with nobody waiting is one
//!   `fetch_max`, and no wake-up can be lost (the protocol is documented on
//!   the word and checked by loom).
//! - [`CpuQueue`] owns a worker thread. `submit` moves the recorded batch to
//!   it under one lock; the worker runs batches in order, `exec` spreading
//!   work-groups over the cores with scoped threads.
//! - [`CpuBuffer`] is 64-byte-aligned host memory behind a lock, so host
//!   reads and writes never race queue work.
//! - [`CpuProgram`] is a Rust function called once per work-group.
//!
//! Failure never hangs: a panicking kernel or a failed wait ends its batch,
//! fails the signals it would have set, and is reported to the queue's owner.
//!
//! The CPU is marked a reference oracle: automatic selection never ranks it
//! by precedence, it is only the explicit fallback when nothing else is present.

mod buffer;
mod device;
mod program;
mod queue;
mod signal;

pub use buffer::{CPU_BUFFER_ALIGN, CpuBuffer};
pub use device::{CPU_LIMITS, CpuDevice};
pub use program::{BufferView, CpuKernelFn, CpuProgram, FromScalar, KernelArgs, WorkGroup};
pub use queue::CpuQueue;
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
