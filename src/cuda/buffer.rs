//! `CudaBuffer`: device memory from the device's pool, with synchronous
//! host uploads and downloads.

use std::fmt;

use cudarc::driver::{CudaStream, result};

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::Result;
use crate::memory::{Access, Allocation, QueueOrdered};

use super::memory::CudaBlocks;
use super::{Cuda, CudaDevice, context_error};

/// Device memory of one CUDA device: an [`Allocation`] of the device's
/// [`MemoryPool`](crate::memory::MemoryPool) (ranges of `cuMemAlloc`
/// blocks), from [`Device::alloc`](crate::Device::alloc), `alloc_uninit`
/// and [`alloca`](crate::HardwareQueue::alloca) alike. Clones name the same
/// memory.
///
/// Host access ([`write_at`](Buffer::write_at), [`read_at`](Buffer::read_at))
/// is a copy through the driver on the device's host-transfer stream, and
/// returns once the copy completed. It is not ordered with queue work: as on
/// any GPU, order it with signals (upload, then `set` or `signal` what a
/// queue `wait`s on; `wait` on a queue's signal, then download). A host
/// access racing a kernel on the same bytes reads or leaves unspecified
/// bytes, but is never undefined behaviour on the host: device memory is
/// not Rust memory.
///
/// Queues keep every buffer they use alive until their stream passed that
/// use, so dropping the last handle never frees memory under a kernel; a
/// `dealloca`'s range goes back to the pool only once its own batch and
/// every batch of another queue using it completed on the device (see
/// [`QueueOrdered`]). After a `dealloca` ran, host access is refused
/// ([`Error::UseAfterDealloca`](crate::Error::UseAfterDealloca)).
#[derive(Clone)]
pub struct CudaBuffer {
    /// Tagged with its device.
    allocation: Allocation<CudaBlocks, CudaDevice>,
}

impl CudaBuffer {
    /// `size` bytes of `device`'s pool, zeroed or not, made by `alloca` when
    /// `ordered`: ready for every stream (a zero fill is ordered by the
    /// allocation fence), without a synchronisation.
    pub(crate) fn new(
        device: &CudaDevice,
        size: usize,
        zeroed: bool,
        ordered: bool,
    ) -> Result<Self> {
        let allocation =
            Allocation::tagged(device.memory(), size, zeroed, ordered, device.clone())?;
        Ok(Self { allocation })
    }

    /// The device this memory lives on.
    pub fn device(&self) -> &CudaDevice {
        self.allocation.tag()
    }

    /// The device address (a `CUdeviceptr`; 0 for an empty buffer), as a
    /// kernel receives it.
    #[inline]
    pub fn device_pointer(&self) -> u64 {
        self.allocation.address().unwrap_or(0)
    }

    /// Copies `bytes` in at `offset`, for `by` (the host, or queue work
    /// holding a use).
    fn write_bytes(&self, by: Access, offset: usize, bytes: &[u8]) -> Result<()> {
        check_host_access(offset, bytes.len(), self.size())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let dst = self.device_pointer() + offset as u64;
        self.host_copy(by, false, "a host write", |stream| {
            // A sticky fault seen here marks the device lost.
            let fail = |e| context_error(stream.context(), "uploading to a buffer", e);
            stream.context().bind_to_thread().map_err(fail)?;
            // SAFETY: `dst..dst + bytes.len()` lies in this live buffer
            // (checked above; held by the lock `host_copy` takes), and the
            // stream is synchronised before `bytes` goes away.
            unsafe { result::memcpy_htod_async(dst, bytes, stream.cu_stream()) }.map_err(fail)?;
            // `bytes` is pageable memory the driver may still read: wait.
            stream.synchronize().map_err(fail)
        })
    }

    /// Copies out from `offset` into `bytes`, for `by`.
    fn read_bytes(&self, by: Access, offset: usize, bytes: &mut [u8]) -> Result<()> {
        check_host_access(offset, bytes.len(), self.size())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let src = self.device_pointer() + offset as u64;
        self.host_copy(by, true, "a host read", |stream| {
            let fail = |e| context_error(stream.context(), "downloading from a buffer", e);
            stream.context().bind_to_thread().map_err(fail)?;
            // SAFETY: `src..src + bytes.len()` lies in this live buffer
            // (checked above; held by the lock `host_copy` takes), `bytes`
            // is initialised memory the copy overwrites, and the stream is
            // synchronised before this returns.
            unsafe { result::memcpy_dtoh_async(bytes, src, stream.cu_stream()) }.map_err(fail)?;
            // The driver writes into `bytes` asynchronously: wait.
            stream.synchronize().map_err(fail)
        })
    }

    /// Runs a host copy with the memory held for `by`; refuses the host
    /// after a `dealloca` ran.
    fn host_copy(
        &self,
        by: Access,
        read: bool,
        what: &str,
        copy: impl FnOnce(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        let what = || format!("{what} (a buffer of {} bytes)", self.size());
        let stream = self.device().host_stream();
        if read {
            let _held = self.allocation.read(by, what)?;
            copy(stream)
        } else {
            let _held = self.allocation.write(by, what)?;
            copy(stream)
        }
    }
}

impl Buffer for CudaBuffer {
    type Backend = Cuda;

    fn size(&self) -> usize {
        self.allocation.size()
    }

    fn same_as(&self, other: &CudaBuffer) -> bool {
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

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("size", &self.size())
            .field("id", &self.allocation.id().get())
            .field("device", &self.device().ordinal())
            .finish_non_exhaustive()
    }
}
