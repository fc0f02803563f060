//! `CpuDevice`: the host as a device.

use std::fmt;

use crate::backend::DeviceInfo;
use crate::device::{Device, QueueFactory};
use crate::error::Result;
use crate::memory::MemoryPool;
use crate::params::Limits;
use crate::queue::QueueKind;
use crate::signal::check_value;
use crate::spec::DeviceSpec;
use crate::sync::Arc;

use super::memory::HostBlocks;
use super::pool::Pool;
use super::queue::CpuEngine;
use super::{Cpu, CpuBuffer, CpuQueue, CpuSignal};
use crate::queue::Queue;

/// What one CPU `exec` may ask for. The local limits are CUDA's documented
/// ones, so that a schedule valid on the CPU is meant to be valid on a GPU
/// too (not yet run on one).
pub const CPU_LIMITS: Limits = Limits {
    max_local_size: [1024, 1024, 64],
    max_local_count: 1024,
    max_groups: [u32::MAX, u32::MAX, u32::MAX],
    max_buffers: 64,
    max_shared_memory: 0,
    // A CPU kernel reads `f32x4`-style vectors from a view's start; 16
    // bytes also keeps a schedule valid on CUDA.
    view_alignment: 16,
};

/// The CPU, opened. Cheap to clone; clones share one device.
#[derive(Clone)]
pub struct CpuDevice {
    inner: Arc<Inner>,
}

struct Inner {
    /// The threads its queues run work-groups on.
    pool: Pool,
    /// Its memory: every buffer is a range of it.
    memory: MemoryPool<HostBlocks>,
    name: String,
}

impl CpuDevice {
    /// The most execution slots [`with_threads`](Self::with_threads)
    /// gives a device: more threads than any machine has cores to run.
    pub const MAX_THREADS: usize = 4096;

    /// Opens the CPU, using every core the process may run on.
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(threads)
    }

    /// Opens the CPU with `threads` execution slots (at least 1, at most
    /// [`MAX_THREADS`](Self::MAX_THREADS)): its queues together run at
    /// most that many work-groups at once, on their worker threads and
    /// `threads - 1` helper threads of the device's own. The helpers start
    /// at the first `exec` of more than one work-group, and end when the
    /// device and its last queue are dropped.
    pub fn with_threads(threads: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                // An absurd count spawned threads until the OS refused and
                // overflowed the pool's arithmetic (`threads * 2`).
                pool: Pool::new(threads.min(Self::MAX_THREADS)),
                memory: MemoryPool::new(HostBlocks::new()),
                name: cpu_name(),
            }),
        }
    }

    /// How many work-groups the device runs at once.
    pub fn threads(&self) -> usize {
        self.inner.pool.threads()
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The device's memory pool: every buffer of this device is a range of
    /// it (statistics, `trim`, the release threshold and a limit are here).
    pub fn memory(&self) -> &MemoryPool<HostBlocks> {
        &self.inner.memory
    }

    pub(crate) fn limits_ref(&self) -> Limits {
        CPU_LIMITS
    }

    /// What the probe reports for this machine.
    pub(crate) fn info() -> DeviceInfo {
        DeviceInfo {
            spec: DeviceSpec::cpu(),
            name: cpu_name(),
            memory: total_memory(),
            compute_units: std::thread::available_parallelism()
                .ok()
                .and_then(|n| u32::try_from(n.get()).ok()),
        }
    }
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl QueueFactory for CpuDevice {
    type Queue = CpuQueue;
    type Signal = CpuSignal;

    fn compute_queue(&self) -> Result<CpuQueue> {
        CpuEngine::new(self, QueueKind::Compute).map(Queue::new)
    }

    /// The CPU has no copy engine, but a copy queue is a second worker
    /// thread, so uploads overlap kernels as on a GPU.
    fn copy_queue(&self) -> Result<Option<CpuQueue>> {
        CpuEngine::new(self, QueueKind::Copy).map(|engine| Some(Queue::new(engine)))
    }

    fn new_signal(&self, initial: u64) -> Result<CpuSignal> {
        check_value(initial)?;
        Ok(CpuSignal::new(initial))
    }
}

impl Device for CpuDevice {
    type Backend = Cpu;

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::cpu()
    }

    fn name(&self) -> String {
        self.inner.name.clone()
    }

    fn limits(&self) -> Limits {
        CPU_LIMITS
    }

    fn alloc(&self, size: usize) -> Result<CpuBuffer> {
        CpuBuffer::allocate(&self.inner.memory, size, true, false)
    }

    fn alloc_uninit(&self, size: usize) -> Result<CpuBuffer> {
        CpuBuffer::allocate(&self.inner.memory, size, false, false)
    }

    crate::pooled_device_memory!(self => self.inner.memory);
}

impl fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuDevice")
            .field("name", &self.inner.name)
            .field("threads", &self.threads())
            .field("memory", &self.inner.memory)
            .finish()
    }
}

/// The CPU's model name from `/proc/cpuinfo`, or a generic name.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Total memory from `/proc/meminfo`, where there is one.
fn total_memory() -> Option<u64> {
    super::memory::meminfo(["MemTotal:"]).map(|[total]| total)
}
