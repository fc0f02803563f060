//! Opened devices and the factories of their queues and signals.

use crate::backend::{Backend, BufferOf, QueueOf, SignalOf};
use crate::error::Result;
use crate::memory::MemoryStats;
use crate::params::Limits;
use crate::queue::HardwareQueue;
use crate::signal::TimelineSignal;
use crate::spec::DeviceSpec;

/// Makes queues and signals. Callers generic over a factory name its queue
/// and signal through the associated types.
pub trait QueueFactory {
    /// The queues this factory makes.
    type Queue: HardwareQueue;
    /// The signals this factory makes.
    type Signal: TimelineSignal;

    /// A new compute queue: runs every command.
    ///
    /// # Errors
    /// When the backend cannot create one (a stream, a thread).
    fn compute_queue(&self) -> Result<Self::Queue>;

    /// A new copy queue (`wait`, `signal`, `copy`, `memory_barrier`; `exec` is
    /// an error), or `None` when the device has no separate copy engine.
    ///
    /// # Errors
    /// When the backend cannot create one.
    fn copy_queue(&self) -> Result<Option<Self::Queue>>;

    /// A new timeline signal starting at `initial`.
    ///
    /// # Errors
    /// When the backend cannot create one, or `initial` is past
    /// [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE).
    fn new_signal(&self, initial: u64) -> Result<Self::Signal>;
}

/// An opened device: allocates buffers, and through [`QueueFactory`] makes
/// queues and signals. Programs are loaded by backend-specific constructors
/// (a Rust function, C source, PTX), since their sources differ by backend.
pub trait Device:
    QueueFactory<Queue = QueueOf<Self::Backend>, Signal = SignalOf<Self::Backend>> + Send + Sync
{
    /// The backend this device belongs to.
    type Backend: Backend<Device = Self>;

    /// The spec this device was opened for.
    fn spec(&self) -> DeviceSpec;

    /// A human-readable name.
    fn name(&self) -> String;

    /// What one `exec` may ask for.
    fn limits(&self) -> Limits;

    /// Allocates `size` bytes of device memory, zero-filled, from the
    /// device's memory pool (see [`memory`](crate::memory)); `size` 0 gives
    /// an empty buffer, which owns no memory.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory), with the pool's
    /// and the device's figures.
    fn alloc(&self, size: usize) -> Result<BufferOf<Self::Backend>>;

    /// Allocates `size` bytes as [`alloc`](Self::alloc) does, without
    /// zeroing them: the buffer holds whatever the pool's range last held.
    /// For memory the next command overwrites anyway; where zeros are
    /// needed in queue order, record a [`fill`](crate::HardwareQueue::fill).
    /// The default, for a backend without a pool, zeroes.
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc).
    fn alloc_uninit(&self, size: usize) -> Result<BufferOf<Self::Backend>> {
        self.alloc(size)
    }

    /// The device's memory pool's figures (all zero for a backend without a
    /// pool, the default).
    fn memory_stats(&self) -> MemoryStats {
        MemoryStats::default()
    }

    /// The device's free and total memory as its driver reports them (CPU:
    /// `/proc/meminfo`'s available and total; CUDA: `cuMemGetInfo`), where
    /// the backend knows them (the default: `None`).
    fn memory_info(&self) -> Option<crate::memory::DeviceMemory> {
        None
    }

    /// Gives the pool's cached blocks back to the backend; returns how many
    /// bytes that released.
    fn trim_memory(&self) -> usize {
        0
    }

    /// Starts the pool's peak figures over from now.
    fn reset_peak_memory(&self) {}

    /// Keeps at most `bytes` cached in the pool (see
    /// [`MemoryPool::set_release_threshold`](crate::memory::MemoryPool::set_release_threshold)).
    fn set_memory_release_threshold(&self, bytes: usize) {
        let _ = bytes;
    }

    /// Limits the bytes the pool may reserve (see
    /// [`MemoryPool::set_limit`](crate::memory::MemoryPool::set_limit)).
    ///
    /// The limit, like [`memory_stats`](Self::memory_stats), is of the
    /// device's buffers. Host memory a backend keeps for transfers
    /// (CUDA's page-locked staging, Vulkan's staging ranges where buffers
    /// are not mapped) is outside it: it is held while a transfer is
    /// queued, and at most 64 MiB of it stays cached for the next ones.
    fn set_memory_limit(&self, limit: Option<usize>) {
        let _ = limit;
    }

    /// Whether the device can still run work. The registry asks before it
    /// hands out a device it opened earlier.
    ///
    /// # Errors
    /// [`Error::DeviceLost`](crate::Error::DeviceLost) once a fault made
    /// the device unusable for the rest of the process (CUDA's sticky
    /// errors: an illegal address, a launch failure). The default never
    /// fails.
    fn health(&self) -> Result<()> {
        Ok(())
    }
}
