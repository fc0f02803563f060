//! The simulated device's memory: one arena of its own, carved into blocks
//! for hwqueue's caching [`MemoryPool`](hwqueue::memory::MemoryPool), whose ranges are the buffers.
//!
//! Nothing here is `unsafe`: an address is an offset into the arena, and
//! every access copies under the arena's lock. This is the device's block
//! source and nothing else of memory: a buffer ([`SimBuffer`](crate::SimBuffer),
//! `buffer.rs`) is hwqueue's `Allocation` of the pool, whose identity, range
//! and `alloca` lifecycle are the core's.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hwqueue::Result;
use hwqueue::memory::{BlockError, BlockSource, DeviceMemory};

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

/// The blocks of a simulated device, for its [`MemoryPool`](hwqueue::memory::MemoryPool): ranges of its
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
