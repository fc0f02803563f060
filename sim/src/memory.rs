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
use hwqueue::memory::{BlockError, BlockSource, DeviceMemory, ZeroError};

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
    /// An arena of `capacity` bytes, of which none is allocated yet: the
    /// bytes grow to cover each range handed out (`take`), so a device of
    /// any size opens (one of `usize::MAX` bytes panicked, and one larger
    /// than the system's memory aborted the process), and a range the
    /// allocator refuses is an allocation's error (a system that
    /// overcommits may grant it and fail when it is written instead).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            bytes: Mutex::new(Vec::new()),
            free: Mutex::new(vec![(0, capacity)]),
            capacity,
        }
    }

    fn free_bytes(&self) -> usize {
        lock(&self.free).iter().map(|&(_, len)| len).sum()
    }

    /// The first free range that fits `size` (a multiple of the alignment):
    /// `Ok(None)` where none does, `Err` where the system could not give
    /// the bytes that back it.
    fn take(&self, size: usize) -> std::result::Result<Option<usize>, String> {
        let mut free = lock(&self.free);
        let Some(at) = free.iter().position(|&(_, len)| len >= size) else {
            return Ok(None);
        };
        let (start, len) = free[at];
        self.cover(start + size)?;
        if len == size {
            free.remove(at);
        } else {
            free[at] = (start + size, len - size);
        }
        Ok(Some(start))
    }

    /// Grows the bytes to `end`, zeroed (written: resident from then on,
    /// so the arena costs the highest range handed out, not its capacity).
    /// The reserve doubles up to the capacity, so growing costs amortised
    /// time.
    fn cover(&self, end: usize) -> std::result::Result<(), String> {
        let mut bytes = lock(&self.bytes);
        let len = bytes.len();
        if end <= len {
            return Ok(());
        }
        let reserve = len.saturating_mul(2).clamp(end, self.capacity.max(end));
        bytes.try_reserve_exact(reserve - len).map_err(|error| {
            format!(
                "the system could not give the simulated device's arena {end} bytes ({error}); \
                 give the device less with `SimConfig::memory`"
            )
        })?;
        bytes.resize(end, 0);
        Ok(())
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
        match self.arena.take(size).map_err(BlockError::OutOfMemory)? {
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

    unsafe fn zero(&self, address: usize, len: usize) -> Result<(), ZeroError> {
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

#[cfg(test)]
mod tests {
    use hwqueue::{Buffer, Device, Error};

    use crate::{SimConfig, SimDevice};

    /// A device larger than the machine's memory opens and allocates what
    /// the machine can give; a range past what it can hold is an error.
    /// `SimDevice::new` panicked on `usize::MAX` bytes ("capacity
    /// overflow"), since the arena was allocated whole. (A range the
    /// system cannot back is `cover`'s error; not tried here, since a
    /// system that overcommits would give it and the test would touch it.)
    #[test]
    fn a_device_of_any_size_opens_and_refuses_what_the_system_cannot_give() {
        let device = SimDevice::new(0, SimConfig::default().memory(usize::MAX));
        let small = device.alloc(1 << 10).unwrap();
        small.write_from(&[7u8; 1 << 10]).unwrap();
        assert_eq!(small.to_vec::<u8>().unwrap(), vec![7u8; 1 << 10]);
        let error = device.alloc(1 << 62).unwrap_err();
        assert!(
            matches!(&error, Error::OutOfMemory { size, .. } if *size == 1 << 62),
            "{error}"
        );
        // The arena still serves what fits.
        assert!(device.alloc(1 << 20).is_ok());
    }
}
