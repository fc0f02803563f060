//! `CpuBuffer`: 64-byte-aligned host memory from the device's pool, shared
//! by queues and the host.

use std::fmt;
use std::ptr::NonNull;

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::{Error, Result};
use crate::memory::{MemoryPool, PooledRange, QueueOrdered};
use crate::sync::{Arc, RwLock, RwLockWriteGuard};

use super::Cpu;
use super::memory::HostBlocks;

/// The alignment of every CPU buffer: a cache line, and enough for any SIMD
/// load up to AVX-512.
pub const CPU_BUFFER_ALIGN: usize = 64;

/// Host memory for the CPU backend: a range of its device's
/// [`MemoryPool`](crate::memory::MemoryPool). Clones name the same memory;
/// the range goes back to the pool when the last clone is dropped (queues
/// hold a clone for every batch that uses the buffer until it ran), or when
/// a [`dealloca`](crate::HardwareQueue::dealloca) of it runs.
///
/// Every access goes through the buffer's lock: host reads share it, host
/// writes, copies and kernels hold it exclusively for their duration. So host
/// access never races queue work; within one `exec`, the kernel's own
/// accesses follow the contract of [`BufferView`](super::BufferView). After
/// a `dealloca` ran, every access through a remaining handle is refused
/// ([`Error::UseAfterDealloca`]), so no handle can reach bytes the pool has
/// handed to another buffer.
#[derive(Clone)]
pub struct CpuBuffer {
    inner: Arc<Memory>,
}

struct Memory {
    /// The first byte (a dangling, aligned pointer for an empty buffer).
    ptr: NonNull<u8>,
    size: usize,
    /// Guards the bytes behind `ptr`, and says whose they are.
    lock: RwLock<Backing>,
    /// For buffers made by `alloca`: whether a `dealloca` is recorded.
    ordered: Option<QueueOrdered>,
    /// For buffers made by `alloca` with a range: its pool, which a
    /// `dealloca` checks without taking `lock` (a kernel may hold it).
    pool: Option<MemoryPool<HostBlocks>>,
}

/// Where a buffer's bytes come from.
pub(crate) enum Backing {
    /// No bytes: an empty buffer owns no memory.
    Empty,
    /// A range of the device's pool, returned when this is dropped.
    Pooled(
        #[allow(dead_code, reason = "held for its drop, which returns the range")]
        PooledRange<HostBlocks>,
    ),
    /// A `dealloca` ran: the range went back to the pool, and the bytes may
    /// be another buffer's now.
    Released,
}

impl Backing {
    /// `Err` once a `dealloca` gave the bytes away; `what` names the buffer.
    #[inline]
    pub(crate) fn check(&self, what: impl FnOnce() -> String) -> Result<()> {
        match self {
            Backing::Released => Err(Error::UseAfterDealloca { what: what() }),
            Backing::Empty | Backing::Pooled(_) => Ok(()),
        }
    }
}

// SAFETY: `Memory` owns its range outright (no other owner of `ptr`'s
// bytes while the range is held), and every access to the bytes is made
// under `lock`, so sharing and sending it between threads is sound.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared access only reads `ptr`/`size`, and the bytes
// are reached only under `lock`.
unsafe impl Sync for Memory {}

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
        if size == 0 {
            return Ok(Self::empty(ordered));
        }
        let range = memory.allocate(size, zeroed)?;
        Ok(Self::pooled(range, ordered))
    }

    /// Whether the buffer's memory is a range of `memory` (an empty buffer,
    /// which has none, is of every pool).
    /// Only `alloca`'s buffers are asked (what `dealloca` takes); it never
    /// waits for a kernel holding the buffer.
    pub(crate) fn is_of(&self, memory: &MemoryPool<HostBlocks>) -> bool {
        self.inner
            .pool
            .as_ref()
            .is_none_or(|pool| pool.same_as(memory))
    }

    /// A buffer on `range`; made by `alloca` when `ordered`.
    fn pooled(range: PooledRange<HostBlocks>, ordered: bool) -> Self {
        let pool = ordered.then(|| range.pool().clone());
        Self::with_backing(
            range.address().non_null(),
            range.len(),
            Backing::Pooled(range),
            ordered,
            pool,
        )
    }

    /// An empty buffer, which owns no memory.
    fn empty(ordered: bool) -> Self {
        Self::with_backing(
            NonNull::<Line>::dangling().cast(),
            0,
            Backing::Empty,
            ordered,
            None,
        )
    }

    fn with_backing(
        ptr: NonNull<u8>,
        size: usize,
        backing: Backing,
        ordered: bool,
        pool: Option<MemoryPool<HostBlocks>>,
    ) -> Self {
        Self {
            inner: Arc::new(Memory {
                ptr,
                size,
                lock: RwLock::new(backing),
                ordered: ordered.then(QueueOrdered::new),
                pool,
            }),
        }
    }

    /// The address of the memory, for ordering locks and for kernels.
    pub(crate) fn address(&self) -> usize {
        self.inner.ptr.as_ptr() as usize
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
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// Holds the buffer exclusively (for a kernel or a copy). Check the
    /// guard's [`Backing::check`] before touching the bytes.
    pub(crate) fn lock_exclusive(&self) -> RwLockWriteGuard<'_, Backing> {
        self.inner.lock.write()
    }

    /// Gives the range back to the pool, for a `dealloca` that ran: waits
    /// for whoever holds the buffer now (a kernel of another queue), and
    /// refuses every later access.
    pub(crate) fn release(&self) {
        // An empty buffer too: every access after a `dealloca` is refused.
        *self.inner.lock.write() = Backing::Released;
    }
}

impl Buffer for CpuBuffer {
    type Backend = Cpu;

    fn size(&self) -> usize {
        self.inner.size
    }

    fn same_as(&self, other: &CpuBuffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        let bytes = bytes_of(data);
        check_host_access(offset, bytes.len(), self.inner.size)?;
        let backing = self.inner.lock.write();
        backing.check(|| "the buffer written".into())?;
        // SAFETY: `offset + len <= size` was checked, so the destination lies
        // in our range, which we still hold (checked under the lock); we hold
        // the lock exclusively, so nothing else touches these bytes; a `&[T]`
        // cannot overlap memory we own.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.inner.ptr.as_ptr().add(offset),
                bytes.len(),
            );
        }
        Ok(())
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        let bytes = bytes_of_mut(data);
        check_host_access(offset, bytes.len(), self.inner.size)?;
        let backing = self.inner.lock.read();
        backing.check(|| "the buffer read".into())?;
        // SAFETY: the source lies in our range, still held (checked under
        // the lock); the shared lock excludes every writer; `data` is caller
        // memory that cannot overlap ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.ptr.as_ptr().add(offset),
                bytes.as_mut_ptr(),
                bytes.len(),
            );
        }
        Ok(())
    }

    #[inline]
    fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.inner.ordered.as_ref()
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("size", &self.inner.size)
            .field("alloca", &self.inner.ordered.is_some())
            .finish_non_exhaustive()
    }
}
