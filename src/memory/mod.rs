//! Device memory that hwqueue owns: one caching pool per device.
//!
//! # The vocabulary
//!
//! Three nouns, used the same way everywhere (here, in the backends, in
//! [`MemoryStats`] and in errors):
//!
//! - a **block** is memory the backend handed over: an anonymous mapping on
//!   the CPU, a `cuMemAlloc` on CUDA. Blocks are large (2 MiB for small
//!   requests, 20 MiB for large ones, a block of its own, rounded to 2 MiB,
//!   past 10 MiB: PyTorch's caching allocator's sizes) and few;
//! - a **range** is part of a block handed out as a buffer: a
//!   [`PooledRange`]. Its size is rounded up to the backend's
//!   [`BlockSource::ALIGNMENT`] (64 bytes on the CPU, 256 on CUDA), and so is
//!   its address;
//! - the **pool** ([`MemoryPool`]) is one per device: it asks its
//!   [`BlockSource`] for blocks, sub-allocates ranges from them with an O(1)
//!   offset allocator (the `offset-allocator` crate: two-level bins, exact
//!   sizes, neighbours merged on free), keeps empty blocks cached for reuse,
//!   and counts everything.
//!
//! # The design
//!
//! - **Written once.** The bookkeeping is here, backend-independent, the
//!   way the queue core is; a backend supplies only raw blocks through
//!   [`BlockSource`] (allocate, free, zero, and where it has them its
//!   device's figures), as an engine supplies commands to the queue core.
//! - **Reuse only when no queue can touch it.** A range goes back to the
//!   pool when its buffer's last handle is dropped. Queues hold a handle to
//!   every buffer of a batch they were handed until the batch completed (the
//!   CPU worker until it ran the batch, CUDA until the stream passed the
//!   event recorded after it), so a buffer dropped by the host while a
//!   submitted batch uses it is held exactly that long: no host wait, and no
//!   range is reused under a running kernel. The loom model
//!   `loom_tests/memory.rs` checks this on the real code.
//! - **One allocation type.** Every backend's buffer is an [`Allocation`]
//!   of its device's pool and nothing more: an identity distinct for every
//!   allocation (empty ones included; queues order and de-duplicate buffer
//!   locks by it), the range, the lock every access to the bytes takes, and
//!   for `alloca`'s buffers the lifecycle ([`QueueOrdered`]). A backend
//!   supplies raw blocks ([`BlockSource`]) and nothing else of memory.
//! - **Queue-ordered allocation.** [`alloca`](crate::HardwareQueue::alloca)
//!   hands out a buffer at once, valid from its place in the queue on;
//!   [`dealloca`](crate::HardwareQueue::dealloca) gives the range back once
//!   every earlier command of that queue completed **and** every batch of
//!   any queue that was recorded on the buffer before it was let go
//!   (PyTorch's `record_stream`, with the batch's completion as the event):
//!   never a host wait, and the same rule on every backend. A `dealloca`
//!   whose batch does not run leaves the buffer live. See [`QueueOrdered`].
//! - **Zeroing only what may hold data.** Fresh blocks come zeroed from
//!   the backend where it can (the CPU's anonymous mappings), and the pool
//!   remembers how much of each block was ever handed out, so a zeroed range
//!   from untouched bytes costs nothing. A reused range is zeroed by the
//!   backend ([`BlockSource::zero`]): the CPU writes zeros (on this
//!   project's machines a page handed back to the kernel costs 50 times
//!   more on its first touch than writing it: see `cpu::HostBlocks`); CUDA
//!   enqueues a memset on the device.
//! - **Statistics and control.** [`MemoryPool::stats`] counts bytes in use,
//!   reserved, their peaks, allocations and blocks, the largest free range;
//!   [`trim`](MemoryPool::trim) returns cached blocks to the backend; a
//!   release threshold bounds what stays cached; a limit bounds what may be
//!   reserved. Out of memory, the pool frees its cache and retries once, and
//!   the error that remains carries the figures.
//!
//! ```
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{Buffer, Device};
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = CpuDevice::new();
//! let a = device.alloc(1 << 20)?;                 // zeroed, from a 2 MiB block
//! let b = device.alloc_uninit(4096)?;             // not zeroed: whatever the range held
//! assert_eq!(a.to_vec::<u8>()?, vec![0; 1 << 20]);
//! let stats = device.memory_stats();
//! assert_eq!(stats.in_use, (1 << 20) + 4096);
//! assert_eq!(stats.live_allocations, 2);
//! drop((a, b));                                   // back to the pool, cached
//! assert_eq!(device.memory_stats().in_use, 0);
//! assert!(device.memory_stats().reserved > 0);
//! device.trim_memory();                           // cached blocks back to the system
//! assert_eq!(device.memory_stats().reserved, 0);
//! # Ok(())
//! # }
//! ```

mod allocation;
mod blocks;
mod pool;
pub(crate) mod stats;

pub(crate) use allocation::Memory;
pub use allocation::{
    Access, Allocation, AllocationId, Phase, QueueOrdered, ReadAccess, WriteAccess,
};
pub use pool::{MemoryPool, PooledRange};
pub use stats::MemoryStats;

/// For an engine: the `dealloca` of `buffer` completed (every earlier
/// command of its queue did: on the CPU when the command runs, on a GPU
/// when its batch completed on the device). Gives the range back to the
/// pool when no batch of another queue still uses it; otherwise the last
/// such batch does when it is let go.
pub fn dealloca_completed<T: crate::Buffer>(buffer: &T) {
    if buffer
        .queue_ordered()
        .is_some_and(|ordered| ordered.dealloca_ran())
    {
        buffer.give_back();
    }
}

/// Queue work (a batch, the executor's host stage) lets go of one use of
/// `buffer` it took ([`QueueOrdered::begin_use`]): the range goes back to
/// the pool where its `dealloca` ran and this was the last use.
pub(crate) fn end_use<T: crate::Buffer>(buffer: &T) {
    if buffer
        .queue_ordered()
        .is_some_and(|ordered| ordered.end_uses(1))
    {
        buffer.give_back();
    }
}

use crate::error::Result;

/// The most bytes a pool keeps cached by default: all of them (as
/// PyTorch's caching allocator does). [`MemoryPool::set_release_threshold`]
/// lowers it.
pub const DEFAULT_RELEASE_THRESHOLD: usize = usize::MAX;

/// Requests up to this size come from small blocks.
pub const SMALL_REQUEST: usize = 1 << 20;
/// The size of a small block.
pub const SMALL_BLOCK: usize = 2 << 20;
/// The size of a large block, for requests above [`SMALL_REQUEST`] and up to
/// [`DEDICATED_REQUEST`].
pub const LARGE_BLOCK: usize = 20 << 20;
/// Requests above this size get a block of their own, rounded up to
/// [`BLOCK_GRANULE`].
pub const DEDICATED_REQUEST: usize = 10 << 20;
/// Blocks are multiples of this (a huge page on x86-64, and CUDA's
/// allocation granularity).
pub const BLOCK_GRANULE: usize = 2 << 20;

/// What a backend supplies to a [`MemoryPool`]: raw blocks of its device's
/// memory. The pool does all the bookkeeping; a source only allocates,
/// frees and zeroes.
///
/// The pool never dereferences an address: it hands out disjoint ranges of
/// the blocks a source allocated, and the buffers built on them do the
/// accesses.
pub trait BlockSource: Send + Sync + 'static {
    /// A block, as the source must see it again to free it.
    type Block: Send + Sync;
    /// A device address, as a buffer holds it (a host pointer, a
    /// `CUdeviceptr`).
    type Address: Copy + Send + Sync + 'static;

    /// The alignment of every range's address and size, in bytes: a power of
    /// two, at least what the device needs (64 on the CPU, 256 on CUDA).
    const ALIGNMENT: usize;

    /// Whether a fresh block reads as zeros (the CPU's anonymous mappings
    /// do; `cuMemAlloc` does not).
    const ZEROED_BLOCKS: bool;

    /// The device, as errors name it (`"cpu:0"`, `"cuda:1"`).
    fn device(&self) -> String;

    /// The unit the source really allocates in (the CPU's page size, for
    /// its `mmap`s): the pool asks only for blocks that are multiples of it,
    /// so [`MemoryStats::reserved`] counts what the source holds, not less.
    /// The default, [`ALIGNMENT`](Self::ALIGNMENT), suits a source that
    /// rounds no further.
    fn granularity(&self) -> usize {
        Self::ALIGNMENT
    }

    /// A new block of `size` bytes (a multiple of
    /// [`granularity`](Self::granularity) and of
    /// [`ALIGNMENT`](Self::ALIGNMENT)), its address aligned to `ALIGNMENT`.
    ///
    /// # Errors
    /// [`BlockError::OutOfMemory`] when the device has no room (the pool
    /// then frees its cache and asks once more); [`BlockError::Other`] for
    /// anything else, which the pool passes on.
    fn allocate(&self, size: usize) -> std::result::Result<Self::Block, BlockError>;

    /// The address `offset` bytes into `block`.
    fn address(&self, block: &Self::Block, offset: usize) -> Self::Address;

    /// Gives a block back to the backend. Every range of it was returned.
    fn free(&self, block: Self::Block);

    /// Makes `len` bytes from `address` read as zeros, before the range is
    /// handed out.
    ///
    /// # Errors
    /// [`ZeroError::Failed`] with what the device reports: the pool returns
    /// the range and passes the error on; [`ZeroError::StillWriting`] where
    /// the device may still be writing the zeros after the call (work it
    /// took that nothing can order later uses behind, or wait for): the
    /// pool keeps the range out of its free ranges for the process and
    /// passes the error on.
    ///
    /// # Safety
    /// `address..address + len` lies in a block this source allocated and
    /// has not freed, and nothing else accesses those bytes during the call.
    unsafe fn zero(&self, address: Self::Address, len: usize) -> Result<(), ZeroError>;

    /// The device's free and total memory in bytes, where the backend knows
    /// them: shown in out-of-memory errors and statistics.
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
}

/// Why a [`BlockSource`] could not allocate a block.
#[derive(Debug)]
pub enum BlockError {
    /// The device has no room: what its allocator said.
    OutOfMemory(String),
    /// Anything else (a lost device, a driver error).
    Other(crate::Error),
}

/// Why a [`BlockSource`] could not zero a range.
#[derive(Debug)]
pub enum ZeroError {
    /// The bytes may not read as zeros, and nothing writes them any more:
    /// the range can be handed out again.
    Failed(crate::Error),
    /// The device may still be writing them, and nothing can order a later
    /// use behind it: the range must never be handed out again. The error
    /// says so.
    StillWriting(crate::Error),
}

impl From<crate::Error> for ZeroError {
    fn from(error: crate::Error) -> Self {
        Self::Failed(error)
    }
}

/// A device's memory, as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes free on the device (all users, not only this process).
    pub free: u64,
    /// Bytes the device has.
    pub total: u64,
}

/// Out of memory on `device` for `size` bytes, with the pool's figures and
/// the device's.
pub(crate) fn out_of_memory(
    device: String,
    size: usize,
    detail: String,
    (in_use, reserved): (usize, usize),
    memory: Option<DeviceMemory>,
) -> crate::Error {
    crate::Error::OutOfMemory {
        device,
        size,
        detail,
        in_use,
        reserved,
        device_free: memory.map(|memory| memory.free),
        device_total: memory.map(|memory| memory.total),
    }
}

/// The [`Device`](crate::Device) methods of memory (`memory_stats`,
/// `memory_info`, `trim_memory`, `reset_peak_memory`,
/// `set_memory_release_threshold`, `set_memory_limit`) for a device whose
/// memory is a [`MemoryPool`]: each asks the pool `$pool` names (an
/// expression of `self`), and `memory_info` its block source. Written
/// inside the `impl Device for …` block:
/// `hwqueue::pooled_device_memory!(self => self.pool());`, or, for a
/// device that keeps another pool beside it (Vulkan's staging ranges),
/// `pooled_device_memory!(self => self.pool(), trim EXPR)` with what
/// `trim_memory` returns.
#[macro_export]
macro_rules! pooled_device_memory {
    ($this:ident => $pool:expr) => {
        $crate::pooled_device_memory!($this => $pool, trim $pool.trim());
    };
    // `$trim` is what `trim_memory` does: the pool's trim, and that of
    // any pool of its own the device keeps beside it.
    ($this:ident => $pool:expr, trim $trim:expr) => {
        fn memory_stats(&$this) -> $crate::memory::MemoryStats {
            $pool.stats()
        }

        fn memory_info(&$this) -> ::std::option::Option<$crate::memory::DeviceMemory> {
            $crate::memory::BlockSource::device_memory($pool.source())
        }

        fn trim_memory(&$this) -> usize {
            $trim
        }

        fn reset_peak_memory(&$this) {
            $pool.reset_peak();
        }

        fn set_memory_release_threshold(&$this, bytes: usize) {
            $pool.set_release_threshold(bytes);
        }

        fn set_memory_limit(&$this, limit: ::std::option::Option<usize>) {
            $pool.set_limit(limit);
        }
    };
}
