//! `CudaDevice`: one CUDA context per ordinal.

use std::fmt;

use cudarc::driver::{CudaContext, CudaStream, sys};

use crate::device::{Device, QueueFactory};
use crate::error::{Error, Result};
use crate::memory::{MemoryPool, MemoryStats};
use crate::params::Limits;
use crate::queue::QueueKind;
use crate::signal::check_value;
use crate::spec::DeviceSpec;
use crate::sync::Arc;
use crate::wait_policy::{WaitPolicy, WaitTuning};

use super::memory::{self, CudaBlocks, StagingCache};
use super::queue::CudaEngine;
use super::{
    Cuda, CudaBuffer, CudaQueue, CudaSignal, device_count, driver_error, driver_version,
    ensure_driver, lost,
};
use crate::queue::Queue;

/// The most buffers one CUDA `exec` takes (as on the CPU, so that a schedule
/// valid there is meant to be valid here too; not yet run on a GPU). Kernel
/// parameters are 8 bytes each and must fit CUDA's 4 KiB parameter space.
pub const CUDA_MAX_BUFFERS: usize = 64;

/// The alignment of a view's offset in an `exec` on CUDA
/// ([`Limits::view_alignment`](crate::Limits::view_alignment)).
pub const CUDA_VIEW_ALIGNMENT: usize = 16;

/// CUDA's parameter space per launch, in bytes.
pub(crate) const PARAMETER_BYTES: usize = 4096;

/// A CUDA device, opened: its primary context, a stream for zero fills and
/// host transfers (with the allocation fence, one per ordinal in the
/// process, shared by every handle of it open at once), its memory pool
/// (ranges of `cuMemAlloc` blocks, see [`crate::memory`]; `alloca` takes
/// its ranges too), and its cache of page-locked staging. Cheap to clone;
/// clones share the context.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

struct Inner {
    ordinal: u32,
    context: std::sync::Arc<CudaContext>,
    /// Zero fills, host uploads and downloads (the ordinal's: every
    /// handle's). Each host transfer synchronises it before returning; a
    /// zero fill does not (the allocation fence orders it).
    host_stream: std::sync::Arc<CudaStream>,
    /// Every buffer (`Device::alloc`, `alloc_uninit`, `alloca`) is a range
    /// of it.
    memory: MemoryPool<CudaBlocks>,
    /// Page-locked staging that host transfers reuse.
    staging: std::sync::Arc<StagingCache>,
    name: String,
    limits: Limits,
    /// Compute capability as NVRTC numbers architectures: `10 * major +
    /// minor` (90 for an H100).
    capability: i32,
    /// `cuDriverGetVersion`'s answer (`12080` for 12.8), if it gave one.
    driver_version: Option<i32>,
}

impl CudaDevice {
    /// Opens CUDA device `ordinal` (retains its primary context).
    ///
    /// # Errors
    /// [`Error::NoDriver`] (saying how to install it) when the driver is
    /// missing or too old; [`Error::NoSuchDevice`] past the devices present;
    /// [`Error::DeviceLost`] when a sticky error already hit the device in
    /// this process (only a new process recovers); whatever the driver
    /// reports.
    pub fn open(ordinal: u32) -> Result<Self> {
        ensure_driver()?;
        if let Some(lost) = lost(ordinal) {
            return Err(lost);
        }
        let count = match device_count() {
            Err(Error::NoSuchDevice { .. }) => 0,
            other => other?,
        };
        if ordinal >= count {
            return Err(Error::NoSuchDevice {
                backend: "cuda",
                ordinal,
                count,
            });
        }
        let fail = |what| move |e| driver_error(what, e);
        let context = CudaContext::new(ordinal as usize).map_err(fail("creating a context"))?;
        // SAFETY: the contract of `disable_event_tracking` is that the user
        // orders streams themselves. hwqueue does: a buffer is used on a
        // queue's stream only after its zero fill (the allocation fence,
        // `cuda::memory`), queues keep every buffer they use alive until
        // their stream passed it (so no free races a use), and concurrent
        // writes are ordered by the caller's signals, as on every backend.
        // Tracking would also make every allocation create two events and
        // every use wait on them, which hwqueue's signals already express.
        unsafe { context.disable_event_tracking() };
        let host = memory::HostSide::of(ordinal, &context)
            .map_err(|e| super::context_error(&context, "creating the host-transfer stream", e))?;
        let host_stream = host.stream.clone();
        let name = context.name().map_err(fail("reading the device name"))?;
        let memory = MemoryPool::new(CudaBlocks::new(ordinal, context.clone(), host));
        let staging = std::sync::Arc::new(StagingCache::new(context.clone(), ordinal));
        let limits = read_limits(&context)?;
        let capability = {
            use sys::CUdevice_attribute as A;
            let read = |attribute| {
                context
                    .attribute(attribute)
                    .map_err(fail("reading the compute capability"))
            };
            10 * read(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?
                + read(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        };
        Ok(Self {
            inner: Arc::new(Inner {
                ordinal,
                context,
                host_stream,
                memory,
                staging,
                name,
                limits,
                capability,
                driver_version: driver_version(),
            }),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// The compute capability as `(major, minor)`: `(9, 0)` for an H100.
    pub fn compute_capability(&self) -> (i32, i32) {
        (self.inner.capability / 10, self.inner.capability % 10)
    }

    pub(crate) fn capability(&self) -> i32 {
        self.inner.capability
    }

    pub(crate) fn driver_version(&self) -> Option<i32> {
        self.inner.driver_version
    }

    /// The cudarc context, for work hwqueue does not cover (device
    /// attributes, libraries that take a context).
    ///
    /// hwqueue turned cudarc's event tracking off for this context (its
    /// signals order the work instead), so what you do through it owes
    /// what tracking would have done: cudarc no longer makes a stream wait
    /// for a slice's allocation or its last use elsewhere. Synchronise your
    /// streams with hwqueue's queues yourself (a `CudaSignal` waited on,
    /// or `synchronize` on both sides) before touching memory the other
    /// side uses, and keep a slice alive until every stream using it has
    /// passed that use.
    pub fn context(&self) -> &std::sync::Arc<CudaContext> {
        &self.inner.context
    }

    pub(crate) fn host_stream(&self) -> &std::sync::Arc<CudaStream> {
        &self.inner.host_stream
    }

    /// The device's memory pool: every buffer from
    /// [`alloc`](Device::alloc) is a range of it.
    pub fn memory(&self) -> &MemoryPool<CudaBlocks> {
        &self.inner.memory
    }

    pub(crate) fn staging(&self) -> &std::sync::Arc<StagingCache> {
        &self.inner.staging
    }

    pub(crate) fn fence(&self) -> &memory::Fence {
        self.inner.memory.source().fence()
    }

    /// Sets how host threads wait for this device's work: a `wait` on a
    /// [`CudaSignal`] whose event this device records, `wait_all` and
    /// `wait_any` over such signals, and a CPU queue's `wait_foreign` on
    /// one. [`WaitPolicy::Adaptive`] (the default) spins for 20–200 µs,
    /// adapting to the device's recent waits, then sleeps;
    /// [`WaitPolicy::Spin`] never sleeps (lowest latency, one core busy per
    /// waiting thread); [`WaitPolicy::Sleep`] sleeps at once (about 40 µs
    /// of wake-up per wait on an H200). See [`crate::wait_policy`].
    ///
    /// The setting is the device's, for the whole process: every handle
    /// of this ordinal shares it (as they share its primary context), and
    /// it applies to waits that start after the call. Ordinals 64 and up
    /// share one setting (and one average) among them.
    pub fn set_wait_policy(&self, policy: WaitPolicy) {
        self.wait_tuning().set_policy(policy);
    }

    /// The policy set by [`set_wait_policy`](Self::set_wait_policy).
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait_tuning().policy()
    }

    /// The device's wait policy and the average length of its host waits,
    /// which the adaptive spin follows.
    pub fn wait_tuning(&self) -> &'static WaitTuning {
        super::signal::wait_tuning(self.inner.ordinal as usize)
    }

    /// Whether two handles name the same context.
    pub fn same_as(&self, other: &CudaDevice) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || *self.inner.context == *other.inner.context
    }
}

/// The launch limits the device reports.
fn read_limits(context: &std::sync::Arc<CudaContext>) -> Result<Limits> {
    use sys::CUdevice_attribute as A;
    let attribute = |attribute| {
        context
            .attribute(attribute)
            .map(|value| u32::try_from(value).unwrap_or(0))
            .map_err(|e| driver_error("reading device limits", e))
    };
    Ok(Limits {
        max_local_size: [
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ],
        max_local_count: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_groups: [
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
        max_buffers: CUDA_MAX_BUFFERS,
        // Dynamic shared memory a kernel may opt in to (227 KiB on an
        // H100); its static shared memory comes out of the same budget,
        // which `submit` checks per kernel.
        max_shared_memory: attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        // A kernel's pointer must have its element's alignment, and a
        // vectorised one (`float4`, `double2`) 16 bytes.
        view_alignment: CUDA_VIEW_ALIGNMENT,
    })
}

impl QueueFactory for CudaDevice {
    type Queue = CudaQueue;
    type Signal = CudaSignal;

    /// A queue on a new CUDA stream of this context.
    fn compute_queue(&self) -> Result<CudaQueue> {
        CudaEngine::new(self, QueueKind::Compute).map(Queue::new)
    }

    /// A queue on a second stream of the same context: the copy engines run
    /// its copies alongside the compute queue's kernels.
    fn copy_queue(&self) -> Result<Option<CudaQueue>> {
        CudaEngine::new(self, QueueKind::Copy).map(|engine| Some(Queue::new(engine)))
    }

    fn new_signal(&self, initial: u64) -> Result<CudaSignal> {
        check_value(initial)?;
        Ok(CudaSignal::new(initial))
    }
}

impl Device for CudaDevice {
    type Backend = Cuda;

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::cuda(self.inner.ordinal)
    }

    fn name(&self) -> String {
        self.inner.name.clone()
    }

    fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// A zeroed range of the device's pool: the zero fill is a memset on
    /// the device, ordered before any queue's use by the allocation fence;
    /// nothing synchronises.
    fn alloc(&self, size: usize) -> Result<CudaBuffer> {
        self.health()?;
        CudaBuffer::new(self, size, true, false)
    }

    fn alloc_uninit(&self, size: usize) -> Result<CudaBuffer> {
        self.health()?;
        CudaBuffer::new(self, size, false, false)
    }

    /// The pool's figures: every buffer, `alloca`'s included, is a range
    /// of it.
    fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }

    /// Returns the pool's cached blocks to the driver; the bytes given
    /// back.
    fn trim_memory(&self) -> usize {
        self.inner.memory.trim()
    }

    /// `cuMemGetInfo`: every process's use counts.
    fn memory_info(&self) -> Option<crate::memory::DeviceMemory> {
        memory::device_memory(&self.inner.context)
    }

    fn reset_peak_memory(&self) {
        self.inner.memory.reset_peak();
    }

    fn set_memory_release_threshold(&self, bytes: usize) {
        self.inner.memory.set_release_threshold(bytes);
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        self.inner.memory.set_limit(limit);
    }

    fn health(&self) -> Result<()> {
        lost(self.inner.ordinal).map_or(Ok(()), Err)
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}
