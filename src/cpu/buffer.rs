//! `CpuBuffer`: 64-byte-aligned host memory from the device's pool, shared
//! by queues and the host.

use std::fmt;
use std::ptr::NonNull;

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::Result;
use crate::memory::{Access, Allocation, AllocationId, Memory, MemoryPool, QueueOrdered};
use crate::sync::RwLockWriteGuard;

use super::Cpu;
use super::memory::HostBlocks;

/// The alignment of every CPU buffer: a cache line, and enough for any SIMD
/// load up to AVX-512.
pub const CPU_BUFFER_ALIGN: usize = 64;

/// Host memory for the CPU backend: an [`Allocation`] of its device's
/// [`MemoryPool`](crate::memory::MemoryPool), which holds everything of its
/// memory (identity, range, lifecycle, lock). Clones name the same memory;
/// the range goes back to the pool when the last clone is dropped (queues
/// hold a clone for every batch that uses the buffer until it ran), or when
/// a [`dealloca`](crate::HardwareQueue::dealloca) of it ran and no batch of
/// another queue still uses it.
///
/// Every access goes through the allocation's lock: host reads share it,
/// host writes, copies and kernels hold it exclusively for their duration.
/// So host access never races queue work; within one `exec`, the kernel's
/// own accesses follow the contract of [`BufferView`](super::BufferView).
/// After a `dealloca` ran, host access through a remaining handle is
/// refused ([`Error::UseAfterDealloca`](crate::Error::UseAfterDealloca)),
/// so no handle can reach bytes the pool has handed to another buffer.
#[derive(Clone)]
pub struct CpuBuffer {
    allocation: Allocation<HostBlocks>,
}

/// The guard of a buffer held exclusively by a command.
pub(crate) type Held<'a> = RwLockWriteGuard<'a, Memory<HostBlocks>>;

/// Aligns the dangling pointer of an empty buffer.
#[repr(align(64))]
struct Line;

const _: () = assert!(align_of::<Line>() == CPU_BUFFER_ALIGN);

impl CpuBuffer {
    /// A buffer of `size` bytes from `memory`, zeroed or not, made by
    /// `alloca` when `ordered`; an empty one, taking nothing from the pool,
    /// for `size` 0.
    pub(crate) fn allocate(
        memory: &MemoryPool<HostBlocks>,
        size: usize,
        zeroed: bool,
        ordered: bool,
    ) -> Result<Self> {
        Ok(Self {
            allocation: Allocation::tagged(memory, size, zeroed, ordered, ())?,
        })
    }

    /// Whether the buffer's memory is of `memory`.
    pub(crate) fn is_of(&self, memory: &MemoryPool<HostBlocks>) -> bool {
        self.allocation.is_of(memory)
    }

    /// The allocation's identity, which orders and de-duplicates the locks
    /// a command takes (distinct for every buffer, empty ones included).
    #[inline]
    pub(crate) fn id(&self) -> AllocationId {
        self.allocation.id()
    }

    /// The address of the first byte (64-byte aligned; dangling, and never
    /// to be read, for an empty buffer), for interop with host code that
    /// takes a pointer.
    ///
    /// Reading or writing through it takes no lock: it races the queues'
    /// kernels and copies and the host's `write_at`/`read_at` unless the
    /// caller orders them (a signal waited on), and it must stay within
    /// [`size`](Buffer::size) bytes and end before the buffer's last handle
    /// is dropped or a `dealloca` of it runs.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        match self.allocation.address() {
            Some(address) => address.as_ptr(),
            None => NonNull::<Line>::dangling().cast().as_ptr(),
        }
    }

    /// Copies `bytes` in at `offset`, for `by` (the host's `write_at`, a
    /// queue's `upload`).
    pub(crate) fn write_bytes(&self, by: Access, offset: usize, bytes: &[u8]) -> Result<()> {
        check_host_access(offset, bytes.len(), self.size())?;
        let _held = self.allocation.write(by, || "the buffer written".into())?;
        // SAFETY: `offset + len <= size` was checked, so the destination lies
        // in our range, which we still hold (checked under the lock); we hold
        // the lock exclusively, so nothing else touches these bytes; a `&[u8]`
        // cannot overlap memory we own.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.as_ptr().add(offset), bytes.len());
        }
        Ok(())
    }

    /// Copies out from `offset` into `bytes`, for `by` (the host's
    /// `read_at`, a queue's `download`).
    pub(crate) fn read_bytes(&self, by: Access, offset: usize, bytes: &mut [u8]) -> Result<()> {
        check_host_access(offset, bytes.len(), self.size())?;
        let _held = self.allocation.read(by, || "the buffer read".into())?;
        // SAFETY: the source lies in our range, still held (checked under
        // the lock); the shared lock excludes every writer; `bytes` is caller
        // memory that cannot overlap ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().add(offset),
                bytes.as_mut_ptr(),
                bytes.len(),
            );
        }
        Ok(())
    }

    /// Holds the buffer exclusively (for a kernel or a copy). Check the
    /// guard's [`Memory::check`] before touching the bytes.
    #[inline]
    pub(crate) fn lock_exclusive(&self) -> Held<'_> {
        self.allocation.lock_exclusive()
    }

    /// [`lock_exclusive`](Self::lock_exclusive), or `None` at once where
    /// someone holds the buffer.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn try_lock_exclusive(&self) -> Option<Held<'_>> {
        self.allocation.try_lock_exclusive()
    }

    /// Whether a queue may reach the buffer, checked now where no writer
    /// holds it: [`Allocation::peek`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn peek(&self) -> Result<()> {
        self.allocation
            .peek(Access::Queue, || "the collective's buffer".into())
    }

    /// Gives the buffer's memory up to a transfer that timed out and may
    /// still use it, under `held` (this buffer's exclusive hold): see
    /// [`Allocation::lose`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn lose(&self, held: &mut Held<'_>) {
        self.allocation.lose(held);
    }
}

impl Buffer for CpuBuffer {
    type Backend = Cpu;

    #[inline]
    fn size(&self) -> usize {
        self.allocation.size()
    }

    #[inline]
    fn same_as(&self, other: &CpuBuffer) -> bool {
        self.allocation.same_as(&other.allocation)
    }

    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        self.write_bytes(Access::Host, offset, bytes_of(data))
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        self.read_bytes(Access::Host, offset, bytes_of_mut(data))
    }

    fn queue_write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.write_bytes(Access::Queue, offset, bytes)
    }

    fn queue_read_at(&self, offset: usize, bytes: &mut [u8]) -> Result<()> {
        self.read_bytes(Access::Queue, offset, bytes)
    }

    #[inline]
    fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.allocation.queue_ordered()
    }

    fn give_back(&self) {
        self.allocation.give_back();
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("size", &self.size())
            .field("id", &self.id().get())
            .field("alloca", &self.queue_ordered().is_some())
            .finish_non_exhaustive()
    }
}
