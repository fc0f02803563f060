//! Fills and host transfers on a CUDA stream: page-locked staging memory
//! and asynchronous copies, in stream order.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaStream, DriverError, result, sys};

use crate::Backend;
use crate::error::Error;
use crate::transfer::DownloadSink;

use super::memory::{Chunk, StagingCache};

/// Uploads up to this size are copied from the batch's own memory:
/// `cuMemcpyHtoDAsync` from pageable memory copies it to the driver's
/// staging before it returns (and is still ordered on the stream). Larger
/// ones go through page-locked staging from the device's cache (reused,
/// not pinned afresh per transfer), so the DMA engine reads them while the
/// host goes on.
pub(crate) const INLINE_UPLOAD: usize = 64 << 10;

/// Page-locked host memory from the device's [`StagingCache`], given back
/// to it when dropped; a batch keeps its staging until the stream passed it.
pub(crate) struct Pinned {
    cache: std::sync::Arc<StagingCache>,
    chunk: Option<Chunk>,
}

impl Pinned {
    /// At least `len` bytes of page-locked memory from `cache`.
    pub(crate) fn new(
        cache: &std::sync::Arc<StagingCache>,
        len: usize,
    ) -> Result<Self, DriverError> {
        Ok(Self {
            chunk: Some(cache.take(len)?),
            cache: cache.clone(),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.chunk
            .as_ref()
            .map_or(std::ptr::null_mut(), |chunk| chunk.ptr)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(chunk) = self.chunk.take() {
            // No stream work uses it any more: the batch that held it was
            // passed by its stream.
            self.cache.give_back(chunk);
        }
    }
}

/// Fills `count` elements of `width` bytes at `dst` with `pattern`.
///
/// # Safety
/// `dst` is a live allocation of at least `count * width` bytes on the
/// stream's device, aligned to `width`, kept alive until the stream passed
/// this fill.
pub(crate) unsafe fn fill(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    pattern: [u8; 4],
    width: u8,
    count: usize,
) -> Result<(), DriverError> {
    // An empty view (of an empty buffer: address 0) has nothing to fill,
    // and a driver may refuse the null address (review helper-58).
    if count == 0 {
        return Ok(());
    }
    let stream = stream.cu_stream();
    // SAFETY: the caller's contract; the driver checks the alignment of
    // the 16- and 32-bit forms itself.
    unsafe {
        match width {
            1 => sys::cuMemsetD8Async(dst, pattern[0], count, stream).result(),
            2 => sys::cuMemsetD16Async(
                dst,
                u16::from_ne_bytes([pattern[0], pattern[1]]),
                count,
                stream,
            )
            .result(),
            _ => sys::cuMemsetD32Async(dst, u32::from_ne_bytes(pattern), count, stream).result(),
        }
    }
}

/// Copies `data` to `dst` on the stream; a large upload first goes to
/// page-locked staging, pushed onto `staging` to live with the batch.
///
/// # Safety
/// `dst` is a live allocation of at least `data.len()` bytes on the
/// stream's device, kept alive until the stream passed this copy; `data`
/// is kept alive until the stream passed the batch (the batch holds it),
/// since the driver need not have read a pageable source when this returns.
pub(crate) unsafe fn upload(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    data: &[u8],
    cache: &std::sync::Arc<StagingCache>,
    staging: &mut Vec<Pinned>,
) -> Result<(), DriverError> {
    if data.is_empty() {
        return Ok(());
    }
    if data.len() <= INLINE_UPLOAD {
        // SAFETY: the caller keeps `data` alive until the stream passed
        // the batch; the driver stages a pageable source itself (CUDA's
        // API sync-behaviour notes), and may read it before or after
        // returning.
        return unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) };
    }
    let pinned = Pinned::new(cache, data.len())?;
    // SAFETY: the staging holds at least `data.len()` bytes and is no other
    // transfer's (taken from the cache), so it cannot overlap `data`.
    let pinned_bytes = unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), pinned.as_ptr(), data.len());
        std::slice::from_raw_parts(pinned.as_ptr(), data.len())
    };
    // SAFETY: the staging lives with the batch until the stream passed it.
    let outcome = unsafe { result::memcpy_htod_async(dst, pinned_bytes, stream.cu_stream()) };
    staging.push(pinned);
    outcome
}

/// What the callback of a download needs: the staging (null for an empty
/// download, which has none), and the download to complete.
struct Landing {
    staging: *const u8,
    len: usize,
    sink: DownloadSink,
}

/// Copies `src` into page-locked staging on the stream, then, in stream
/// order, a stream callback copies the staging into the download's memory
/// and marks it ready, or fails it with the stream's error. An empty
/// download takes no staging and copies nothing: only its callback goes on
/// the stream, so it still completes in stream order (a 64 KiB chunk of
/// staging, and a copy from what may be address 0, were taken for it).
///
/// A stream callback (`cuStreamAddCallback`), not a host function
/// (`cuLaunchHostFunc`): the driver calls it with the stream's status even
/// after a fault, where a host function is not run, so a waiter on the
/// download learns of the fault instead of waiting until the queue's owner
/// next calls into it.
///
/// # Safety
/// `src` is a live allocation of at least `sink.len()` bytes on the
/// stream's device, kept alive until the stream passed this copy.
pub(crate) unsafe fn download(
    stream: &CudaStream,
    src: sys::CUdeviceptr,
    sink: &DownloadSink,
    cache: &std::sync::Arc<StagingCache>,
    staging: &mut Vec<Pinned>,
) -> Result<(), DriverError> {
    let len = sink.len();
    let mut landed_in = std::ptr::null();
    if len > 0 {
        let pinned = Pinned::new(cache, len)?;
        // SAFETY: the caller's contract for `src`; the staging holds `len`
        // bytes and lives with the batch until the stream passed it (so
        // after the callback below ran). A raw copy, not cudarc's slice
        // form: the staging is uninitialised until the copy lands, so no
        // `&mut [u8]` of it may be made first.
        unsafe { sys::cuMemcpyDtoHAsync_v2(pinned.as_ptr().cast(), src, len, stream.cu_stream()) }
            .result()?;
        landed_in = pinned.as_ptr().cast_const();
        staging.push(pinned);
    }
    let landing = Box::into_raw(Box::new(Landing {
        staging: landed_in,
        len,
        sink: sink.share(),
    }));
    // SAFETY: `land` takes the box back exactly once, when the driver calls
    // it; if the driver refuses it, we take it back here instead (the
    // shared handle does not fail the download when dropped: the batch's
    // failure does, with the real cause).
    let outcome =
        unsafe { sys::cuStreamAddCallback(stream.cu_stream(), Some(land), landing.cast(), 0) }
            .result();
    if outcome.is_err() {
        // SAFETY: the driver did not take the box, so we own it again.
        drop(unsafe { Box::from_raw(landing) });
    }
    outcome
}

/// The callback of a download: runs on a driver thread, in stream order,
/// after the copy into the staging, with the stream's status. Calls no
/// CUDA function.
unsafe extern "C" fn land(_stream: sys::CUstream, status: sys::CUresult, arg: *mut c_void) {
    // SAFETY: `arg` is the `Landing` box leaked by `download`, handed to
    // this function once.
    let landing = unsafe { Box::from_raw(arg.cast::<Landing>()) };
    // A panic must not unwind into the driver; the download then fails
    // when the batch drops its handle.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if status != sys::CUresult::CUDA_SUCCESS {
            // The copy did not land: the stream faulted before it. (The
            // queue reports the fault itself, as `DeviceLost` where it is
            // sticky, at its next `submit` or `synchronize`.)
            landing.sink.fail(&Error::Driver {
                backend: super::Cuda::ID,
                what: "a download".into(),
                detail: format!(
                    "the stream failed with {status:?} before the data arrived; the device \
                     may be lost (see the queue's next `synchronize`)"
                ),
            });
            return;
        }
        let bytes: &[u8] = if landing.len == 0 {
            &[]
        } else {
            // SAFETY: the staging holds `len` bytes the copy before this
            // wrote, alive until the stream passed the batch.
            unsafe { std::slice::from_raw_parts(landing.staging, landing.len) }
        };
        let _ = landing.sink.complete(|out| {
            out.copy_from_slice(bytes);
            Ok(())
        });
    }));
}
