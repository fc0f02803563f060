//! `CudaBuffer`: device memory from the device's pools, with synchronous
//! host uploads and downloads.

use std::fmt;

use cudarc::driver::{CudaStream, result, sys};

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::{Error, Result};
use crate::memory::{PooledRange, QueueOrdered};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};

use super::memory::{CudaBlocks, StreamAllocation};
use super::{Cuda, CudaDevice, driver_error};

/// Device memory of one CUDA device: a range of the device's
/// [`MemoryPool`](crate::memory::MemoryPool) (from
/// [`Device::alloc`](crate::Device::alloc) and `alloc_uninit`), or memory
/// from the device's `CUmemoryPool` allocated on a queue's stream (from
/// [`alloca`](crate::HardwareQueue::alloca)). Clones name the same memory.
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
/// use, so dropping the last handle never frees memory under a kernel.
/// After a [`dealloca`](crate::HardwareQueue::dealloca) ran, host access and
/// queue work that reaches the buffer are refused
/// ([`Error::UseAfterDealloca`]).
#[derive(Clone)]
pub struct CudaBuffer {
    inner: Arc<Memory>,
}

struct Memory {
    /// The device address, for kernel arguments and device copies.
    pointer: sys::CUdeviceptr,
    size: usize,
    device: CudaDevice,
    /// Whose memory it is; held during host copies, so a `dealloca` cannot
    /// free it under one.
    backing: Mutex<Backing>,
    /// A `dealloca` ran (read without the lock when a queue enqueues).
    released: AtomicBool,
    /// For buffers made by `alloca`: whether a `dealloca` is recorded.
    ordered: Option<QueueOrdered>,
}

/// Where a buffer's memory comes from.
enum Backing {
    /// No bytes.
    Empty,
    /// A range of the device's pool, returned when this is dropped.
    Pooled(
        #[expect(dead_code, reason = "held for its `Drop`, which returns the range")]
        PooledRange<CudaBlocks>,
    ),
    /// `alloca`'s memory, freed on its stream when this is dropped.
    Stream(StreamAllocation),
    /// A `dealloca` freed it.
    Released,
}

impl CudaBuffer {
    /// `size` bytes of `device`'s pool, zeroed or not: ready for every
    /// stream (a zero fill is ordered by the allocation fence), without a
    /// synchronisation.
    pub(crate) fn new(device: &CudaDevice, size: usize, zeroed: bool) -> Result<Self> {
        if size == 0 {
            return Ok(Self::with_backing(device, 0, 0, Backing::Empty, false));
        }
        let memory = device.memory();
        let range = memory.allocate(size, zeroed)?;
        let pointer = range.address();
        Ok(Self::with_backing(
            device,
            pointer,
            size,
            Backing::Pooled(range),
            false,
        ))
    }

    /// `size` bytes from the device's `CUmemoryPool`, allocated on `stream`
    /// (an `alloca` of the queue on it).
    pub(crate) fn alloca(
        device: &CudaDevice,
        stream: &std::sync::Arc<CudaStream>,
        size: usize,
    ) -> Result<Self> {
        if size == 0 {
            return Ok(Self::with_backing(device, 0, 0, Backing::Empty, true));
        }
        let allocation = device.stream_allocate(stream, size)?;
        Ok(Self::with_backing(
            device,
            allocation.pointer(),
            size,
            Backing::Stream(allocation),
            true,
        ))
    }

    fn with_backing(
        device: &CudaDevice,
        pointer: sys::CUdeviceptr,
        size: usize,
        backing: Backing,
        ordered: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Memory {
                pointer,
                size,
                device: device.clone(),
                backing: Mutex::new(backing),
                released: AtomicBool::new(false),
                ordered: ordered.then(QueueOrdered::new),
            }),
        }
    }

    /// The device this memory lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    /// The device address (a `CUdeviceptr`), as a kernel receives it.
    pub fn device_pointer(&self) -> u64 {
        self.inner.pointer
    }

    /// `Err` once a `dealloca` of this buffer ran: for queues, before they
    /// enqueue work that reaches it.
    #[inline]
    pub(crate) fn check_live(&self, what: impl FnOnce() -> String) -> Result<()> {
        if self.inner.released.load(Ordering::Acquire) {
            return Err(Error::UseAfterDealloca {
                what: format!("{} (a buffer of {} bytes)", what(), self.inner.size),
            });
        }
        Ok(())
    }

    /// A `dealloca` of this buffer, enqueued on `stream`: frees the memory
    /// there, after everything enqueued on it so far.
    pub(crate) fn release_on(&self, stream: &CudaStream) -> Result<()> {
        let mut backing = self.inner.backing.lock();
        let freed = match std::mem::replace(&mut *backing, Backing::Released) {
            Backing::Stream(allocation) => allocation
                .free_on(stream)
                .map_err(|e| driver_error("freeing memory in stream order (dealloca)", e)),
            // An empty buffer has nothing to free; the core only records a
            // `dealloca` of buffers `alloca` made, which are never pooled.
            Backing::Empty | Backing::Pooled(_) | Backing::Released => Ok(()),
        };
        self.inner.released.store(true, Ordering::Release);
        freed
    }

    /// Runs a host copy with the memory held: makes the host stream wait
    /// for an `alloca`'s allocation first; refuses after a `dealloca`.
    fn host_copy(&self, what: &str, copy: impl FnOnce(&CudaStream) -> Result<()>) -> Result<()> {
        let backing = self.inner.backing.lock();
        let stream = self.inner.device.host_stream();
        match &*backing {
            Backing::Released => {
                return Err(Error::UseAfterDealloca {
                    what: format!("{what} (a buffer of {} bytes)", self.inner.size),
                });
            }
            Backing::Stream(allocation) => allocation
                .order_before(stream)
                .map_err(|e| driver_error("ordering a host copy after `alloca`", e))?,
            Backing::Empty | Backing::Pooled(_) => {}
        }
        copy(stream)
    }
}

impl Buffer for CudaBuffer {
    type Backend = Cuda;

    fn size(&self) -> usize {
        self.inner.size
    }

    fn same_as(&self, other: &CudaBuffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        let bytes = bytes_of(data);
        check_host_access(offset, bytes.len(), self.inner.size)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let dst = self.inner.pointer + offset as u64;
        self.host_copy("a host write", |stream| {
            let fail = |e| driver_error("uploading to a buffer", e);
            stream.context().bind_to_thread().map_err(fail)?;
            // SAFETY: `dst..dst + bytes.len()` lies in this live buffer
            // (checked above; held by the lock `host_copy` takes), and the
            // stream is synchronised before `bytes` goes away.
            unsafe { result::memcpy_htod_async(dst, bytes, stream.cu_stream()) }.map_err(fail)?;
            // `bytes` is pageable memory the driver may still read: wait.
            stream.synchronize().map_err(fail)
        })
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        let bytes = bytes_of_mut(data);
        check_host_access(offset, bytes.len(), self.inner.size)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let src = self.inner.pointer + offset as u64;
        self.host_copy("a host read", |stream| {
            let fail = |e| driver_error("downloading from a buffer", e);
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

    fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.inner.ordered.as_ref()
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("size", &self.inner.size)
            .field("device", &self.inner.device.ordinal())
            .finish_non_exhaustive()
    }
}
