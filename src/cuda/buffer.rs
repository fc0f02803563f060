//! `CudaBuffer`: device memory, with synchronous host uploads and downloads.

use std::fmt;

use cudarc::driver::{CudaSlice, DevicePtr, DriverError, sys};

use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::sync::{Arc, Mutex};

use super::{Cuda, CudaDevice, driver_error};

/// Device memory of one CUDA device. Clones name the same memory.
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
#[derive(Clone)]
pub struct CudaBuffer {
    inner: Arc<Memory>,
}

struct Memory {
    /// The allocation (freed, stream-ordered, when dropped). cudarc's
    /// sub-views for host copies need `&mut`, hence the lock; kernels and
    /// copies use `pointer` and never take it.
    slice: Mutex<CudaSlice<u8>>,
    /// The device address, for kernel arguments and device copies.
    pointer: sys::CUdeviceptr,
    size: usize,
    device: CudaDevice,
}

impl CudaBuffer {
    /// Allocates `size` zeroed bytes on `device`; returns once the memory is
    /// ready for any stream.
    pub(crate) fn new(device: &CudaDevice, size: usize) -> Result<Self> {
        let stream = device.host_stream();
        let oom = |error: DriverError| match error.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
                device: device.spec().to_string(),
                size,
                detail: error.to_string(),
                in_use: 0,
                reserved: 0,
                device_free: None,
                device_total: None,
            },
            _ => driver_error("allocating device memory", error),
        };
        // CUDA refuses empty allocations; an empty buffer holds one byte.
        let slice = stream.alloc_zeros::<u8>(size.max(1)).map_err(oom)?;
        // The allocation and its zero fill are ordered on the host stream
        // only: finish them before any queue's stream may use the memory.
        stream.synchronize().map_err(oom)?;
        let pointer = {
            // Event tracking is off (see `CudaDevice::open`): the guard
            // records nothing.
            let (pointer, _untracked) = slice.device_ptr(stream);
            pointer
        };
        Ok(Self {
            inner: Arc::new(Memory {
                slice: Mutex::new(slice),
                pointer,
                size,
                device: device.clone(),
            }),
        })
    }

    /// The device this memory lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    /// The device address (a `CUdeviceptr`), as a kernel receives it.
    pub fn device_pointer(&self) -> u64 {
        self.inner.pointer
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
        let stream = self.inner.device.host_stream();
        let fail = |e| driver_error("uploading to a buffer", e);
        let mut slice = self.inner.slice.lock();
        let mut range = slice.slice_mut(offset..offset + bytes.len());
        stream.memcpy_htod(bytes, &mut range).map_err(fail)?;
        // `bytes` is pageable memory the driver may still read: wait.
        stream.synchronize().map_err(fail)
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        let bytes = bytes_of_mut(data);
        check_host_access(offset, bytes.len(), self.inner.size)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = self.inner.device.host_stream();
        let fail = |e| driver_error("downloading from a buffer", e);
        let slice = self.inner.slice.lock();
        let range = slice.slice(offset..offset + bytes.len());
        stream.memcpy_dtoh(&range, bytes).map_err(fail)?;
        // The driver writes into `bytes` asynchronously: wait.
        stream.synchronize().map_err(fail)
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
