//! CUDA device memory: the blocks of the device's
//! [`MemoryPool`](crate::memory::MemoryPool) (`cuMemAlloc`), from which
//! every buffer is a range (`alloca`'s too), the allocation fence that
//! orders zero fills before any queue's use, and the cache of page-locked
//! staging memory that host transfers reuse.
//!
//! No allocation path synchronises a stream:
//!
//! - a block is a `cuMemAlloc`, ready for every stream when it returns;
//! - a zeroed range is a `cuMemsetD8Async` on the device's host stream,
//!   followed by an event recorded there: the **allocation fence** (where
//!   that record fails, the one exception: a wait for the host stream,
//!   and a range the memset may still write is kept out of the pool for
//!   the process: `CudaBlocks::fence_failed`). Every
//!   queue makes its stream wait for the newest fence before it enqueues a
//!   batch, when the fence moved since its last batch (one atomic load per
//!   batch otherwise), and host transfers run on the host stream itself, so
//!   no use of the range can overtake its fill;
//! - `alloca` takes a range of the pool when it is recorded: valid for
//!   every stream. `dealloca` gives it back through the core's lifecycle
//!   ([`QueueOrdered`](crate::memory::QueueOrdered)): once its batch and
//!   every batch of another queue that used the range completed on the
//!   device (each queue learns that from the event recorded after its
//!   batch), so no stream can reach a range another buffer was handed.
//!   Statistics, the limit, `trim` and peaks count it like every range.
//!   (The driver's stream-ordered pool, `cuMemAllocFromPoolAsync`, is not
//!   used: its memory bypassed the pool's figures and limit, and its
//!   `cuMemFreeAsync` was ordered only on the freeing queue's stream.)

use std::fmt;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};

use crate::Backend;
use crate::error::{Error, Result};
use crate::memory::{BlockError, BlockSource, DeviceMemory, ZeroError};
use crate::sync::{AtomicU64, Mutex, Ordering};

use super::driver_error;
use super::signal::EVENT_FLAGS;

/// The alignment of every CUDA range of the pool: what `cuMemAlloc`
/// guarantees, and enough for any vector load.
pub const CUDA_BUFFER_ALIGN: usize = 256;

/// The CUDA device's block source: `cuMemAlloc` blocks, zeroed by a memset
/// on the device's host stream behind the allocation fence.
pub struct CudaBlocks {
    ordinal: u32,
    context: std::sync::Arc<CudaContext>,
    host: std::sync::Arc<HostSide>,
}

/// A device ordinal's host-transfer stream and allocation fence, one in the
/// process, shared by every handle of the ordinal open at once: a queue of
/// one handle may use a buffer another handle's pool zero-filled, and
/// waits for the fence it shares (each handle with its own fence, the
/// queue waited only for its own handle's fills; review helper-58).
pub(crate) struct HostSide {
    pub(crate) stream: std::sync::Arc<CudaStream>,
    fence: Fence,
}

/// The live [`HostSide`] of each ordinal.
static HOST_SIDES: parking_lot::Mutex<Vec<(u32, std::sync::Weak<HostSide>)>> =
    parking_lot::Mutex::new(Vec::new());

impl HostSide {
    /// Ordinal `ordinal`'s, live, or made with a new stream of `context`.
    ///
    /// # Errors
    /// The driver's, creating the stream.
    pub(crate) fn of(
        ordinal: u32,
        context: &std::sync::Arc<CudaContext>,
    ) -> std::result::Result<std::sync::Arc<HostSide>, DriverError> {
        let mut sides = HOST_SIDES.lock();
        sides.retain(|(_, side)| side.strong_count() > 0);
        let live = sides.iter().find(|(at, _)| *at == ordinal);
        if let Some(side) = live.and_then(|(_, side)| side.upgrade()) {
            return Ok(side);
        }
        let side = std::sync::Arc::new(HostSide {
            stream: context.new_stream()?,
            fence: Fence::default(),
        });
        sides.push((ordinal, std::sync::Arc::downgrade(&side)));
        Ok(side)
    }
}

/// A `cuMemAlloc` block.
#[derive(Debug)]
pub struct DeviceBlock {
    pointer: sys::CUdeviceptr,
    size: usize,
}

impl CudaBlocks {
    pub(crate) fn new(
        ordinal: u32,
        context: std::sync::Arc<CudaContext>,
        host: std::sync::Arc<HostSide>,
    ) -> Self {
        Self {
            ordinal,
            context,
            host,
        }
    }

    /// The allocation fence (the ordinal's, shared by its handles): what
    /// every queue's stream waits for before using memory a pool of the
    /// ordinal handed out.
    pub(crate) fn fence(&self) -> &Fence {
        &self.host.fence
    }
}

impl CudaBlocks {
    /// A zero fill whose allocation fence could not be recorded (`record`
    /// failed): nothing orders a queue's later use of the range behind its
    /// memset, which may still run. The one allocation path that waits for
    /// the host stream: where the wait succeeds, the memset is done and the
    /// range stands, zeroed (the record's error is not passed on: the
    /// device did all that was asked); where it fails with a sticky error,
    /// the device is lost and its streams run nothing again, so the range
    /// may go back; otherwise the memset may still run, and the range is
    /// kept out of the pool for the process (helper-75; it went back free,
    /// and `alloc_uninit` could hand it to a queue the memset then zeroed
    /// under).
    #[cold]
    fn fence_failed(&self, record: DriverError) -> Result<(), ZeroError> {
        let fail = |e| super::context_error(&self.context, "zeroing device memory", e);
        let record = fail(record);
        let Err(wait) = self.host.stream.synchronize() else {
            return Ok(());
        };
        match fail(wait) {
            lost @ Error::DeviceLost { .. } => Err(ZeroError::Failed(lost)),
            wait => Err(ZeroError::StillWriting(Error::Driver {
                backend: super::Cuda::ID,
                what: "zeroing device memory".into(),
                detail: format!(
                    "recording the allocation fence after the memset failed ({record}), and so \
                     did the wait for it ({wait}): the memset may still run, so the range is \
                     kept out of the pool for the process (its bytes stay counted in use); \
                     check the device's health, and reopen it if this repeats"
                ),
            })),
        }
    }
}

impl fmt::Debug for CudaBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBlocks")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl BlockSource for CudaBlocks {
    type Block = DeviceBlock;
    type Address = sys::CUdeviceptr;

    const ALIGNMENT: usize = CUDA_BUFFER_ALIGN;
    const ZEROED_BLOCKS: bool = false;

    fn device(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn allocate(&self, size: usize) -> std::result::Result<DeviceBlock, BlockError> {
        self.context
            .bind_to_thread()
            .map_err(|e| BlockError::Other(driver_error("making the context current", e)))?;
        // SAFETY: a plain allocation with the context current; the pool
        // never reads the memory, and buffers on it are device memory the
        // host only reaches through copies.
        match unsafe { result::malloc_sync(size) } {
            Ok(pointer) => Ok(DeviceBlock { pointer, size }),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(BlockError::OutOfMemory(e.to_string()))
            }
            Err(e) => Err(BlockError::Other(driver_error(
                "allocating device memory",
                e,
            ))),
        }
    }

    fn address(&self, block: &DeviceBlock, offset: usize) -> sys::CUdeviceptr {
        debug_assert!(offset < block.size);
        block.pointer + offset as u64
    }

    fn free(&self, block: DeviceBlock) {
        // A failure (a lost context) leaves the memory to the context's
        // teardown: a leak at worst, never a use after free.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: the block came from `malloc_sync` and the pool frees it
            // once, when none of its ranges is handed out: every buffer on
            // it is gone, so every queue's stream passed its last use.
            let _ = unsafe { result::free_sync(block.pointer) };
        }
    }

    unsafe fn zero(&self, address: sys::CUdeviceptr, len: usize) -> Result<(), ZeroError> {
        let fail = |e| super::context_error(&self.context, "zeroing device memory", e);
        self.context.bind_to_thread().map_err(fail)?;
        // SAFETY: the caller guarantees the bytes lie in a live block and are
        // nobody else's; the memset is ordered before every later use by
        // the fence recorded next (or, where that fails, by a wait for it).
        unsafe { sys::cuMemsetD8Async(address, 0, len, self.host.stream.cu_stream()) }
            .result()
            .map_err(fail)?;
        let Err(record) = self.host.fence.advance(&self.host.stream) else {
            return Ok(());
        };
        self.fence_failed(record)
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        device_memory(&self.context)
    }
}

/// The device's free and total memory (`cuMemGetInfo`).
pub(crate) fn device_memory(context: &CudaContext) -> Option<DeviceMemory> {
    context.bind_to_thread().ok()?;
    let (free, total) = result::mem_get_info().ok()?;
    Some(DeviceMemory {
        free: free as u64,
        total: total as u64,
    })
}

/// The allocation fence: the newest event recorded on the host stream after
/// a zero fill, and how many were recorded.
#[derive(Default)]
pub(crate) struct Fence {
    /// Moved under `event`'s lock; read alone on the fast path.
    generation: AtomicU64,
    event: Mutex<Option<CudaEvent>>,
}

impl Fence {
    /// Records the fence after the work enqueued on `stream` so far.
    fn advance(&self, stream: &CudaStream) -> std::result::Result<(), DriverError> {
        let mut event = self.event.lock();
        let recorded = match event.take() {
            Some(reused) => match reused.record(stream) {
                Ok(()) => reused,
                Err(error) => {
                    // Kept: the queues that have not waited for the last
                    // fence yet still find it (review helper-59).
                    *event = Some(reused);
                    return Err(error);
                }
            },
            None => stream.record_event(Some(EVENT_FLAGS))?,
        };
        *event = Some(recorded);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Makes `stream` wait for the newest fence if it moved since `seen`,
    /// and updates `seen`. Inlined to its two loads when the fence has not
    /// moved: every batch asks.
    #[inline]
    pub(crate) fn order(
        &self,
        stream: &CudaStream,
        seen: &AtomicU64,
    ) -> std::result::Result<(), DriverError> {
        if self.generation.load(Ordering::Acquire) == seen.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.order_moved(stream, seen)
    }

    #[cold]
    fn order_moved(
        &self,
        stream: &CudaStream,
        seen: &AtomicU64,
    ) -> std::result::Result<(), DriverError> {
        let event = self.event.lock();
        if let Some(event) = &*event {
            // `cuStreamWaitEvent` waits for the record made before this
            // call, so a later re-record does not affect it.
            stream.wait(event)?;
        }
        seen.store(self.generation.load(Ordering::Relaxed), Ordering::Relaxed);
        Ok(())
    }
}

/// Staging kept for reuse, at most this many bytes per device.
pub const STAGING_CACHE: usize = 64 << 20;

/// Page-locked host memory that host transfers reuse: one per device.
/// Chunks are powers of two from 64 KiB; a transfer takes the smallest
/// cached chunk that fits, and gives it back when its batch is done. A
/// chunk is freed only when the cache is over [`STAGING_CACHE`] or the
/// device goes, and never once the device was lost (a dead stream's copy
/// engine might still read or write it).
pub(crate) struct StagingCache {
    context: std::sync::Arc<CudaContext>,
    ordinal: u32,
    chunks: Mutex<Vec<Chunk>>,
}

/// A page-locked allocation: its address and capacity.
pub(crate) struct Chunk {
    pub(crate) ptr: *mut u8,
    pub(crate) capacity: usize,
}

// SAFETY: a chunk is an address and a size, owned by one holder at a time
// (the cache, or the transfer that took it).
unsafe impl Send for Chunk {}
// SAFETY: as for `Send`.
unsafe impl Sync for Chunk {}

/// The smallest staging chunk.
pub(crate) const MIN_CHUNK: usize = 64 << 10;

impl StagingCache {
    pub(crate) fn new(context: std::sync::Arc<CudaContext>, ordinal: u32) -> Self {
        Self {
            context,
            ordinal,
            chunks: Mutex::new(Vec::new()),
        }
    }

    /// A chunk of at least `len` bytes: a cached one, or a new one.
    pub(crate) fn take(&self, len: usize) -> std::result::Result<Chunk, DriverError> {
        let capacity = len.max(MIN_CHUNK).next_power_of_two();
        {
            let mut chunks = self.chunks.lock();
            if let Some(at) = chunks
                .iter()
                .enumerate()
                .filter(|(_, chunk)| chunk.capacity >= capacity)
                .min_by_key(|(_, chunk)| chunk.capacity)
                .map(|(at, _)| at)
            {
                return Ok(chunks.swap_remove(at));
            }
        }
        self.context.bind_to_thread()?;
        // SAFETY: a plain allocation with the context current; the memory
        // is only ever used as bytes, written before it is read.
        let ptr = unsafe { result::malloc_host(capacity, 0) }?;
        Ok(Chunk {
            ptr: ptr.cast(),
            capacity,
        })
    }

    /// Takes back a chunk no stream uses any more: cached, or freed when the
    /// cache is full.
    pub(crate) fn give_back(&self, chunk: Chunk) {
        let mut chunks = self.chunks.lock();
        let cached: usize = chunks.iter().map(|chunk| chunk.capacity).sum();
        if cached + chunk.capacity <= STAGING_CACHE {
            chunks.push(chunk);
            return;
        }
        drop(chunks);
        self.free(chunk);
    }

    fn free(&self, chunk: Chunk) {
        // After a sticky fault the driver may still be copying to or from
        // the chunk: keep it (a leak of a lost device, never a write into
        // freed memory).
        if super::lost(self.ordinal).is_some() || self.context.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: `ptr` came from `malloc_host` and is freed once, here; no
        // stream work uses it any more (the caller's contract, or the
        // device is going and its queues are gone).
        let _ = unsafe { result::free_host(chunk.ptr.cast()) };
    }
}

impl Drop for StagingCache {
    fn drop(&mut self) {
        for chunk in std::mem::take(&mut *self.chunks.lock()) {
            self.free(chunk);
        }
    }
}
