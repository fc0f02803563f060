//! `CpuBuffer`: 64-byte-aligned host memory shared by queues and the host.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fmt;
use std::ptr::NonNull;

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::{Error, Result};
use crate::sync::{Arc, RwLock, RwLockWriteGuard};

use super::Cpu;

/// The alignment of every CPU buffer: a cache line, and enough for any SIMD
/// load up to AVX-512.
pub const CPU_BUFFER_ALIGN: usize = 64;

/// Host memory for the CPU backend. Clones name the same memory.
///
/// Every access goes through the buffer's lock: host reads share it, host
/// writes, copies and kernels hold it exclusively for their duration. So host
/// access never races queue work; within one `exec`, the kernel's own
/// accesses follow the contract of [`BufferView`](super::BufferView).
#[derive(Clone)]
pub struct CpuBuffer {
    inner: Arc<Memory>,
}

struct Memory {
    ptr: NonNull<u8>,
    size: usize,
    /// Guards the bytes behind `ptr` (the lock holds no data itself).
    lock: RwLock<()>,
}

// SAFETY: `Memory` owns its allocation outright (no other owner of `ptr`),
// and every access to the bytes is made under `lock`, so sharing and sending
// it between threads is sound.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared access only reads `ptr`/`size`, and the bytes
// are reached only under `lock`.
unsafe impl Sync for Memory {}

impl CpuBuffer {
    /// Allocates `size` zeroed bytes, aligned to [`CPU_BUFFER_ALIGN`].
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the allocator refuses.
    pub fn new(size: usize) -> Result<Self> {
        let oom = |detail: &str| Error::OutOfMemory {
            device: "cpu:0".into(),
            size,
            detail: detail.into(),
        };
        let layout = Layout::from_size_align(size.max(1), CPU_BUFFER_ALIGN)
            .map_err(|_| oom("size too large for this address space"))?;
        // SAFETY: `layout` has a non-zero size (`size.max(1)`).
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| oom("the system allocator refused"))?;
        Ok(Self {
            inner: Arc::new(Memory {
                ptr,
                size,
                lock: RwLock::new(()),
            }),
        })
    }

    /// The address of the memory, for ordering locks and for kernels.
    pub(crate) fn address(&self) -> usize {
        self.inner.ptr.as_ptr() as usize
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// Holds the buffer exclusively (for a kernel or a copy).
    pub(crate) fn lock_exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.inner.lock.write()
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.size.max(1), CPU_BUFFER_ALIGN)
            .expect("layout was valid at allocation");
        // SAFETY: `ptr` came from `alloc_zeroed` with this same layout, and
        // this is the last owner (we are in its drop).
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
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
        let _guard = self.inner.lock.write();
        // SAFETY: `offset + len <= size` was checked, so the destination lies
        // in our allocation; we hold the lock exclusively, so nothing else
        // touches these bytes; a `&[T]` cannot overlap memory we own.
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
        let _guard = self.inner.lock.read();
        // SAFETY: the source lies in our allocation (checked above); the
        // shared lock excludes every writer; `data` is caller memory that
        // cannot overlap ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.ptr.as_ptr().add(offset),
                bytes.as_mut_ptr(),
                bytes.len(),
            );
        }
        Ok(())
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}
