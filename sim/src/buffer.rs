//! [`SimBuffer`]: a simulated device's memory, as hwqueue's [`Allocation`]
//! of its pool over the device's arena ([`SimBlocks`]).

use hwqueue::buffer::check_host_access;
use hwqueue::memory::{Access, Allocation, BlockSource, MemoryPool, QueueOrdered};
use hwqueue::{Buffer, Pod, Result};

use crate::Sim;
use crate::memory::SimBlocks;

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
        Ok(Self {
            allocation: Allocation::tagged(pool, size, zeroed, ordered, ())?,
        })
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

    fn queue_write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.with_range(Access::Queue, offset, data.len(), |bytes| {
            bytes.copy_from_slice(data)
        })
    }

    fn queue_read_at(&self, offset: usize, data: &mut [u8]) -> Result<()> {
        self.with_range(Access::Queue, offset, data.len(), |bytes| {
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
