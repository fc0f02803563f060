//! The simulated device's memory: one arena of its own, carved into blocks
//! for hwqueue's caching [`MemoryPool`], whose ranges are the buffers.
//!
//! Nothing here is `unsafe`: an address is an offset into the arena, and
//! every access copies under the arena's lock. A [`SimBuffer`] is hwqueue's
//! [`Allocation`] of the pool and nothing more: the identity, the range and
//! the `alloca` lifecycle are the core's.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hwqueue::buffer::check_host_access;
use hwqueue::memory::{
    Access, Allocation, BlockError, BlockSource, DeviceMemory, MemoryPool, QueueOrdered,
};
use hwqueue::{Buffer, Pod, Result};

use crate::Sim;

/// The alignment of every range (what a GPU's allocator gives).
pub const SIM_ALIGNMENT: usize = 256;

/// The device's bytes and the driver's record of which are handed out as
/// blocks.
pub(crate) struct Arena {
    bytes: Mutex<Vec<u8>>,
    /// Free ranges `(start, len)`, sorted by start, neighbours merged.
    free: Mutex<Vec<(usize, usize)>>,
    capacity: usize,
}

/// Locks `mutex`, taking the data of a poisoned one: every critical section
/// here leaves its data consistent before anything can panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Arena {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            // Zeroed pages come lazily from the system: a large arena costs
            // what is touched.
            bytes: Mutex::new(vec![0; capacity]),
            free: Mutex::new(vec![(0, capacity)]),
            capacity,
        }
    }

    fn free_bytes(&self) -> usize {
        lock(&self.free).iter().map(|&(_, len)| len).sum()
    }

    /// The first free range that fits `size` (a multiple of the alignment).
    fn take(&self, size: usize) -> Option<usize> {
        let mut free = lock(&self.free);
        let at = free.iter().position(|&(_, len)| len >= size)?;
        let (start, len) = free[at];
        if len == size {
            free.remove(at);
        } else {
            free[at] = (start + size, len - size);
        }
        Some(start)
    }

    fn give_back(&self, start: usize, size: usize) {
        let mut free = lock(&self.free);
        let at = free.partition_point(|&(other, _)| other < start);
        free.insert(at, (start, size));
        // Merge with the next, then with the previous.
        if at + 1 < free.len() && free[at].0 + free[at].1 == free[at + 1].0 {
            free[at].1 += free[at + 1].1;
            free.remove(at + 1);
        }
        if at > 0 && free[at - 1].0 + free[at - 1].1 == free[at].0 {
            free[at - 1].1 += free[at].1;
            free.remove(at);
        }
    }

    /// Runs `f` on the whole arena, as the device does for one command.
    pub(crate) fn with_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut lock(&self.bytes))
    }
}

/// The blocks of a simulated device, for its [`MemoryPool`]: ranges of its
/// arena, as `cuMemAlloc` gives a GPU's.
pub struct SimBlocks {
    pub(crate) arena: Arc<Arena>,
    pub(crate) ordinal: u32,
}

/// A block: a range of the arena.
#[derive(Debug)]
pub struct SimBlock {
    start: usize,
    len: usize,
}

impl BlockSource for SimBlocks {
    type Block = SimBlock;
    /// An offset into the device's arena.
    type Address = usize;

    const ALIGNMENT: usize = SIM_ALIGNMENT;
    /// Like `cuMemAlloc`: a block may hold what an earlier one left there.
    const ZEROED_BLOCKS: bool = false;

    fn device(&self) -> String {
        format!("sim:{}", self.ordinal)
    }

    fn allocate(&self, size: usize) -> std::result::Result<SimBlock, BlockError> {
        let size = size.next_multiple_of(SIM_ALIGNMENT);
        match self.arena.take(size) {
            Some(start) => Ok(SimBlock { start, len: size }),
            None => Err(BlockError::OutOfMemory(format!(
                "the simulated device has {} of its {} bytes free, in no range of {size}; \
                 give it more with `SimConfig::memory`",
                self.arena.free_bytes(),
                self.arena.capacity
            ))),
        }
    }

    fn address(&self, block: &SimBlock, offset: usize) -> usize {
        block.start + offset
    }

    fn free(&self, block: SimBlock) {
        self.arena.give_back(block.start, block.len);
    }

    unsafe fn zero(&self, address: usize, len: usize) -> Result<()> {
        self.arena
            .with_bytes(|bytes| bytes[address..address + len].fill(0));
        Ok(())
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        Some(DeviceMemory {
            free: self.arena.free_bytes() as u64,
            total: self.arena.capacity as u64,
        })
    }
}

/// Memory of a simulated device: an [`Allocation`] of its pool. Clones
/// name the same memory; the range goes back to the pool when the last
/// clone is dropped (queues hold a clone for every batch that uses it until
/// the batch completed), or when a `dealloca` of it ran and no batch still
/// uses it.
///
/// Host reads and writes copy under the device's arena lock, as do the
/// device's commands, so a host access never sees a command half done.
#[derive(Clone, Debug)]
pub struct SimBuffer {
    allocation: Allocation<SimBlocks>,
}

impl SimBuffer {
    /// `size` bytes of `pool` (none for 0), zeroed or not, made by `alloca`
    /// when `ordered`.
    pub(crate) fn allocate(
        pool: &MemoryPool<SimBlocks>,
        size: usize,
        zeroed: bool,
        ordered: bool,
    ) -> Result<Self> {
        let allocation = if ordered {
            Allocation::new_alloca(pool, size)?
        } else {
            Allocation::new(pool, size, zeroed)?
        };
        Ok(Self { allocation })
    }

    /// Whether the buffer is memory of `pool`'s device.
    pub(crate) fn is_of(&self, pool: &MemoryPool<SimBlocks>) -> bool {
        self.allocation.is_of(pool)
    }

    /// The device, as errors name it.
    pub(crate) fn device(&self) -> String {
        self.allocation.pool().source().device()
    }

    /// Where `range` of the buffer lies in the arena, for a command.
    pub(crate) fn arena_range(
        &self,
        range: std::ops::Range<usize>,
    ) -> Result<std::ops::Range<usize>> {
        let access = self
            .allocation
            .read(Access::Queue, || "a simulated buffer".into())?;
        Ok(match access.address() {
            Some(start) => start + range.start..start + range.end,
            None => 0..0,
        })
    }

    /// Runs `f` on bytes `offset..offset + len` of the buffer, for `by`.
    pub(crate) fn with_range<R>(
        &self,
        by: Access,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        check_host_access(offset, len, self.size())?;
        let access = self
            .allocation
            .write(by, || format!("a {}-byte simulated buffer", self.size()))?;
        let start = access.address().unwrap_or(0) + offset;
        Ok(self
            .allocation
            .pool()
            .source()
            .arena
            .with_bytes(|bytes| f(&mut bytes[start..start + len])))
    }
}

impl Buffer for SimBuffer {
    type Backend = Sim;

    fn size(&self) -> usize {
        self.allocation.size()
    }

    /// Clones of one allocation. Two buffers on ranges of one pool block are
    /// not the same: they share no byte.
    fn same_as(&self, other: &Self) -> bool {
        self.allocation.same_as(&other.allocation)
    }

    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        let data = hwqueue::buffer::bytes_of(data);
        self.with_range(Access::Host, offset, data.len(), |bytes| {
            bytes.copy_from_slice(data)
        })
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        let data = hwqueue::buffer::bytes_of_mut(data);
        self.with_range(Access::Host, offset, data.len(), |bytes| {
            data.copy_from_slice(bytes)
        })
    }

    fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.allocation.queue_ordered()
    }

    fn give_back(&self) {
        self.allocation.give_back();
    }
}
