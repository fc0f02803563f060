//! Device memory and the plain-old-data types that move through it.

use crate::backend::Backend;
use crate::error::Result;

/// Types that are any bit pattern and have no padding, so they move to and
/// from device memory as raw bytes: `bytemuck`'s trait, re-exported.
///
/// The numbers and arrays of them are `Pod` already; a type of your own
/// derives it (`#[derive(Clone, Copy, Pod, Zeroable)]` with `#[repr(C)]`,
/// from `hwqueue::bytemuck`), and with the `half` feature `half::f16` and
/// `half::bf16` are too.
pub use bytemuck::{Pod, Zeroable};

/// Views a `Pod` slice as bytes.
pub fn bytes_of<T: Pod>(data: &[T]) -> &[u8] {
    bytemuck::cast_slice(data)
}

/// Views a mutable `Pod` slice as bytes.
pub fn bytes_of_mut<T: Pod>(data: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(data)
}

/// A fill pattern's bytes, zero-padded to 4, and its width in bytes (any
/// width: the caller checks for 1, 2 or 4).
pub(crate) fn pattern_bytes<T: Pod>(pattern: &T) -> ([u8; 4], usize) {
    let bytes = bytes_of(std::slice::from_ref(pattern));
    let mut padded = [0u8; 4];
    let kept = bytes.len().min(4);
    padded[..kept].copy_from_slice(&bytes[..kept]);
    (padded, bytes.len())
}

/// A handle to device memory. Clones name the same memory.
///
/// Host access is synchronous and memory-safe on every backend: it returns
/// once its bytes moved, and no interleaving with queue work is undefined
/// behaviour on the host. Whether it is *ordered* with queue work is the
/// backend's: the CPU backend locks the buffer, so a host read or write
/// waits for a kernel holding it and never sees it half done; CUDA copies
/// through the driver on a stream of its own, unordered with the queues,
/// so a host access racing a kernel on the same bytes gets unspecified
/// bytes. Portable code orders host access with signals (upload, then let
/// a queue `wait` on a value the host sets; `wait` on a queue's signal,
/// then download).
pub trait Buffer: Clone + Send + Sync + 'static {
    /// The backend owning this memory.
    type Backend: Backend<Buffer = Self>;

    /// Size in bytes.
    fn size(&self) -> usize;

    /// Whether two handles name the same buffer: clones of one allocation.
    /// Two buffers that are ranges of one pool block are not the same (they
    /// share no byte); two views of one buffer are views of the same.
    fn same_as(&self, other: &Self) -> bool;

    /// The `len` bytes from byte `offset`, as a [`View`](crate::View).
    ///
    /// # Errors
    /// [`Error::ViewOutOfRange`](crate::Error::ViewOutOfRange) when the
    /// range does not lie in the buffer.
    fn view(&self, offset: usize, len: usize) -> Result<crate::View<Self::Backend>> {
        crate::View::new(self, offset, len)
    }

    /// Copies `data` into the buffer at byte `offset`.
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`](crate::Error::HostAccessOutOfBounds)
    /// when it does not fit (nothing is written then).
    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()>;

    /// Copies from byte `offset` of the buffer into `data`.
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`](crate::Error::HostAccessOutOfBounds)
    /// when it does not fit (nothing is read then).
    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()>;

    /// Copies `bytes` into the buffer at byte `offset` as *queue work*
    /// that holds a use of it ([`QueueOrdered`](crate::memory::QueueOrdered)):
    /// the executor's host stage, which copies between devices on the
    /// host for a run recorded before a `dealloca` of the buffer. Unlike
    /// [`write_at`](Self::write_at), it is not refused once that
    /// `dealloca` ran, since the use it holds keeps the range. A backend
    /// over [`Allocation`](crate::memory::Allocation) writes with
    /// [`Access::Queue`](crate::memory::Access::Queue); the default, for a
    /// backend without queue-ordered allocation, is `write_at`.
    ///
    /// # Errors
    /// As [`write_at`](Self::write_at).
    fn queue_write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.write_at(offset, bytes)
    }

    /// Copies from byte `offset` of the buffer into `bytes`, as queue work
    /// holding a use of it: as [`queue_write_at`](Self::queue_write_at).
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    fn queue_read_at(&self, offset: usize, bytes: &mut [u8]) -> Result<()> {
        self.read_at(offset, bytes)
    }

    /// Copies `data` to the start of the buffer.
    ///
    /// # Errors
    /// As [`write_at`](Self::write_at).
    fn write_from<T: Pod>(&self, data: &[T]) -> Result<()> {
        self.write_at(0, data)
    }

    /// Copies the start of the buffer into `data`.
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    fn read_into<T: Pod>(&self, data: &mut [T]) -> Result<()> {
        self.read_at(0, data)
    }

    /// For a buffer made by [`alloca`](crate::HardwareQueue::alloca): its
    /// lifecycle ([`QueueOrdered`](crate::memory::QueueOrdered): whether its
    /// [`dealloca`](crate::HardwareQueue::dealloca) was recorded or ran, and
    /// which batches use it), which the queue core keeps. `None` for every
    /// other buffer, and for a backend without queue-ordered allocation
    /// (the default). A backend over [`Allocation`](crate::memory::Allocation)
    /// forwards to [`Allocation::queue_ordered`](crate::memory::Allocation::queue_ordered).
    #[inline]
    fn queue_ordered(&self) -> Option<&crate::memory::QueueOrdered> {
        None
    }

    /// Gives the buffer's range back to its pool: called by the queue core,
    /// once, when the lifecycle of a buffer made by `alloca` says so (its
    /// `dealloca` ran and no batch uses it). A backend over
    /// [`Allocation`](crate::memory::Allocation) forwards to
    /// [`Allocation::give_back`](crate::memory::Allocation::give_back); the
    /// default does nothing, and the range then goes back when the last
    /// handle is dropped.
    #[inline]
    fn give_back(&self) {}

    /// Reads the whole buffer as `T`s (its size must be a multiple of
    /// `size_of::<T>()`; a trailing partial element is not read).
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    fn to_vec<T: Pod>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.size() / std::mem::size_of::<T>().max(1)];
        self.read_at(0, &mut out)?;
        Ok(out)
    }
}

/// Checks a host access of `len` bytes at `offset` against `size`: what
/// every [`Buffer::write_at`] and [`Buffer::read_at`] checks first.
///
/// # Errors
/// [`Error::HostAccessOutOfBounds`](crate::Error::HostAccessOutOfBounds)
/// when the range does not lie in `size` bytes.
pub fn check_host_access(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(crate::Error::HostAccessOutOfBounds { offset, len, size }),
    }
}
