//! The Vulkan compute backend (feature `vulkan`): hwqueue's queues, signals,
//! memory and kernels on any Vulkan 1.2 driver with timeline semaphores,
//! loaded at run time through `ash` (no Vulkan SDK at build time).
//!
//! Mesa's **lavapipe** (Debian's `mesa-vulkan-drivers`) runs it on the CPU,
//! so every test and CI run drives the whole backend through a real,
//! conformant driver; the same code runs on NVIDIA, AMD and Intel drivers.
//!
//! - **Devices** ([`devices`], `vulkan:N`): hardware devices first
//!   (discrete, integrated, virtual), then software ones (lavapipe), each
//!   group in the loader's order. **Selection never picks a software
//!   device**: [`Vulkan::probe`] lists only hardware devices, so automatic
//!   selection prefers the native CPU backend to lavapipe, and CUDA (higher
//!   precedence) to Vulkan on an NVIDIA GPU; open a software device by its
//!   spec (`vulkan:0` on a machine with lavapipe only).
//! - **One `VkDevice` per physical device per process**, made at the
//!   first [`VulkanDevice::open`] of it and kept until the process ends,
//!   as CUDA's primary context is one per GPU: every handle of that
//!   device, in every thread, submits to its `VkQueue`s under the same
//!   locks, and no `vkCreateDevice` or `vkDestroyDevice` ever runs while
//!   another thread drives the device (NVIDIA's driver hung when handles
//!   each made and destroyed a `VkDevice` of their own in several
//!   threads). What is a handle's own stays per handle: its memory pool
//!   and mode (mapped or staged), its one-shot command buffer, its record
//!   of a lost device, and the objects made of it (another handle's queue
//!   refuses them as another device's). Dropping a handle frees its
//!   memory and objects; the `VkDevice` stays.
//! - **Queues** ([`VulkanQueue`]): the queue core over [`VulkanEngine`]:
//!   batches become command buffers submitted with timeline semaphores; a
//!   copy queue uses a transfer-only family where the device has one.
//! - **Signals** ([`VulkanSignal`]): timeline semaphores; `wait` is
//!   `vkWaitSemaphores`, and [`wait_any`](crate::wait_any) /
//!   [`wait_all`](crate::wait_all) over signals of one device are one
//!   `vkWaitSemaphores` with or without `VK_SEMAPHORE_WAIT_ANY_BIT`, in
//!   slices that also look for failures recorded on the host.
//! - **Memory** ([`VulkanBuffer`]): the core's caching pool over blocks of
//!   `VkDeviceMemory` of the largest device-local heap (on a device that
//!   shares system memory, an integrated GPU or lavapipe, the largest heap
//!   the host can map: an APU's device-local heap is a small carve-out),
//!   one `VkBuffer` per block, shared by the compute and transfer-only
//!   families where the device has both (`CONCURRENT`); views are descriptor offsets, aligned to
//!   `minStorageBufferOffsetAlignment` ([`Limits::view_alignment`]). Where
//!   that heap's memory can be mapped (lavapipe, integrated GPUs, resizable
//!   BAR) the host reads and writes it directly; otherwise uploads,
//!   downloads and host access go through staging ranges of host memory
//!   ([`VulkanDevice::host_mapped`]; [`MEMORY_ENV`]`=unmapped` forces that
//!   path anywhere).
//! - **Interop**: [`VulkanDevice::raw_device`] and its siblings hand out
//!   the instance, physical device, device and compute family, and
//!   [`VulkanDevice::with_compute_queue`] the `VkQueue` under the lock
//!   hwqueue's submits take, for Vulkan work of the caller's own.
//! - **Kernels** ([`VulkanProgram`]): SPIR-V, or WGSL compiled by naga;
//!   storage buffers of `@group(0)` in binding order, scalars as push
//!   constants.
//! - **Profiling**: timestamp queries around each device command, mapped
//!   onto the host's clock by one calibration per queue (a timestamp
//!   written between two host readings: tick 0 sits at their midpoint less
//!   the ticks times `timestampPeriod`; drift is not corrected). Waits and
//!   signals, and commands on a family without timestamps, span from their
//!   submission to the host seeing it complete. The same `ProfileEvent`s
//!   and Chrome trace as the other backends.

mod commands;
mod context;
mod engine;
mod interop;
mod memory;
mod program;
mod rebind;
mod recorder;
mod replay;
mod retire;
mod setup;
mod signal;
mod staged;
mod submit;
#[cfg(test)]
mod testing;
mod timing;

use std::sync::Arc;

use ash::vk;

/// The `ash` hwqueue is built on, for the handles
/// [`VulkanDevice::raw_device`] and its siblings hand out.
pub use ash;

pub use engine::VulkanEngine;
pub use memory::{VULKAN_ALIGNMENT, VulkanAddress, VulkanBlock, VulkanBlocks, VulkanBuffer};
pub use program::VulkanProgram;
pub use signal::VulkanSignal;
pub use staged::{MEMORY_ENV, STAGING_KEEP};

use crate::backend::{Backend, DeviceInfo};
use crate::device::{Device, QueueFactory};
use crate::error::{Error, Result};
use crate::memory::MemoryPool;
use crate::params::Limits;
use crate::queue::{Queue, QueueKind};
use crate::spec::DeviceSpec;
use context::{Context, Physical};

/// The Vulkan backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Vulkan;

/// A Vulkan device's queue: the queue core over [`VulkanEngine`].
pub type VulkanQueue = Queue<VulkanEngine>;

/// What one Vulkan device is, as [`devices`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VulkanDeviceInfo {
    /// The spec that opens it (`vulkan:0`).
    pub spec: DeviceSpec,
    /// `deviceName`.
    pub name: String,
    /// The driver's name and version string, and its `driverID`.
    pub driver: String,
    /// `apiVersion`, as `major.minor.patch`.
    pub api_version: String,
    /// `deviceType`: `discrete GPU`, `integrated GPU`, `CPU`, ….
    pub kind: String,
    /// Each memory heap: bytes, and whether device-local.
    pub heaps: Vec<(u64, bool)>,
    /// Each queue family: its flags (`COMPUTE | TRANSFER`, …) and queue count.
    pub families: Vec<(String, u32)>,
    /// Why hwqueue cannot use it, where it cannot.
    pub unusable: Option<String>,
}

/// The physical devices in ordinal order: hardware first, then software.
fn ordered() -> Result<Vec<&'static Physical>> {
    let instance = context::instance()?;
    let mut devices: Vec<&Physical> = instance.physical.iter().collect();
    devices.sort_by_key(|p| match p.properties.device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 4,
        _ => 3,
    });
    Ok(devices)
}

/// Every Vulkan device, usable or not, in ordinal order (see the module
/// docs): what `examples/info` prints.
///
/// # Errors
/// [`Error::NoDriver`] where there is no Vulkan loader or 1.2 instance,
/// naming the packages to install.
pub fn devices() -> Result<Vec<VulkanDeviceInfo>> {
    Ok(ordered()?
        .into_iter()
        .enumerate()
        .map(|(ordinal, physical)| {
            let api = physical.properties.api_version;
            let memory = &physical.memory;
            VulkanDeviceInfo {
                spec: DeviceSpec::new(context::ID, ordinal as u32),
                name: physical.name(),
                driver: format!("{} ({:?})", physical.driver, physical.driver_id),
                api_version: format!(
                    "{}.{}.{}",
                    vk::api_version_major(api),
                    vk::api_version_minor(api),
                    vk::api_version_patch(api)
                ),
                kind: match physical.properties.device_type {
                    vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
                    vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
                    vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
                    vk::PhysicalDeviceType::CPU => "CPU (software)",
                    _ => "other",
                }
                .into(),
                heaps: memory.memory_heaps[..memory.memory_heap_count as usize]
                    .iter()
                    .map(|h| (h.size, h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)))
                    .collect(),
                families: physical
                    .families
                    .iter()
                    .map(|f| (format!("{:?}", f.queue_flags), f.queue_count))
                    .collect(),
                unusable: physical.missing(),
            }
        })
        .collect())
}

impl Backend for Vulkan {
    const ID: &'static str = context::ID;
    /// As device specs spell it too (`vk:0`).
    const ALIASES: &'static [&'static str] = &["vk"];
    /// Below CUDA (100): on an NVIDIA GPU, CUDA is chosen; above the
    /// simulator's 50.
    const PRECEDENCE: u32 = 90;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;

    type Device = VulkanDevice;
    type Queue = VulkanQueue;
    type Signal = VulkanSignal;
    type Buffer = VulkanBuffer;
    type Program = VulkanProgram;

    /// The usable **hardware** devices (what selection may choose; see the
    /// module docs).
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a Vulkan loader or a 1.2 instance,
    /// naming the packages to install; [`Error::Driver`] saying what each
    /// hardware device lacks where there are some and none is usable.
    fn probe() -> Result<Vec<DeviceInfo>> {
        let devices = ordered()?;
        let usable: Vec<DeviceInfo> = devices
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.is_cpu() && p.missing().is_none())
            .map(|(ordinal, physical)| DeviceInfo {
                spec: DeviceSpec::new(Self::ID, ordinal as u32),
                name: physical.name(),
                memory: Some(buffer_heap_bytes(physical)),
                compute_units: None,
            })
            .collect();
        let unusable: Vec<String> = devices
            .iter()
            .filter(|p| !p.is_cpu())
            .filter_map(|p| Some(format!("{}: {}", p.name(), p.missing()?)))
            .collect();
        if usable.is_empty() && !unusable.is_empty() {
            return Err(Error::Driver {
                backend: context::ID,
                what: "probing the Vulkan devices".into(),
                detail: unusable.join("; "),
            });
        }
        Ok(usable)
    }

    fn open(ordinal: u32) -> Result<VulkanDevice> {
        VulkanDevice::open(ordinal)
    }
}

/// The size of the heap the device's buffers would take
/// (`MemoryTypes::choose`: on an APU not its device-local carve-out).
fn buffer_heap_bytes(physical: &Physical) -> u64 {
    let memory = &physical.memory;
    staged::MemoryTypes::choose(memory, physical.properties.device_type, false)
        .map_or(0, |types| staged::heap_of(memory, types.device).size)
}

/// An opened Vulkan device. Cheap to clone; clones share one device. Every
/// handle of one physical device runs on the process's one `VkDevice` for
/// it (see the module docs), with its own memory pool and objects.
#[derive(Clone)]
pub struct VulkanDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    pool: MemoryPool<VulkanBlocks>,
    limits: Limits,
}

impl VulkanDevice {
    /// Opens device `ordinal` (see [`devices`]).
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a loader; [`Error::NoSuchDevice`] past
    /// the devices present; [`Error::Driver`] for a device hwqueue cannot
    /// use (saying what it lacks) or a failed `vkCreateDevice`.
    pub fn open(ordinal: u32) -> Result<Self> {
        Self::open_with(ordinal, None)
    }

    /// Opens device `ordinal` with its buffers unmapped, whatever the
    /// device allows: host access through staging, as on a discrete GPU
    /// without resizable BAR (tests of that path on any device).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    #[doc(hidden)]
    pub fn open_unmapped(ordinal: u32) -> Result<Self> {
        Self::open_with(ordinal, Some(true))
    }

    fn open_with(ordinal: u32, unmapped: Option<bool>) -> Result<Self> {
        let physical = ordered()?;
        let count = physical.len() as u32;
        let Some(chosen) = physical.get(ordinal as usize) else {
            return Err(Error::NoSuchDevice {
                backend: context::ID,
                ordinal,
                count,
            });
        };
        let index = context::instance()?
            .physical
            .iter()
            .position(|p| std::ptr::eq(p, *chosen))
            .expect("one of the instance's");
        let context = Arc::new(Context::open(index as u32, ordinal, unmapped)?);
        let physical = &context.physical;
        let after_bind = physical
            .update_after_bind
            .then_some(physical.update_after_bind_buffers);
        let limits = limits_of(context.limits(), after_bind);
        Ok(Self {
            inner: Arc::new(DeviceInner {
                pool: MemoryPool::new(VulkanBlocks::for_device(context)),
                limits,
            }),
        })
    }

    pub(super) fn context(&self) -> &Arc<Context> {
        &self.inner.pool.source().context
    }

    pub(super) fn pool(&self) -> &MemoryPool<VulkanBlocks> {
        &self.inner.pool
    }

    /// The pool of staging ranges (host-visible memory).
    pub(super) fn staging_pool(&self) -> &MemoryPool<VulkanBlocks> {
        self.inner.pool.source().staging_pool()
    }

    pub(super) fn limits_ref(&self) -> &Limits {
        &self.inner.limits
    }

    /// The driver's name and version, and its `driverID` (lavapipe is
    /// `MESA_LLVMPIPE`).
    pub fn driver(&self) -> String {
        let physical = self.context().physical;
        format!("{} ({:?})", physical.driver, physical.driver_id)
    }

    /// Whether buffers are mapped for the host: where they are not (a
    /// discrete GPU without resizable BAR, or [`MEMORY_ENV`]`=unmapped`),
    /// uploads, downloads and host reads and writes go through staging.
    pub fn host_mapped(&self) -> bool {
        self.context().memory.mapped
    }

    /// Whether a plan's replayed command buffers take a run's new
    /// bindings by rewriting their descriptor sets (the device writes
    /// storage buffer descriptors after binding:
    /// `descriptorBindingStorageBufferUpdateAfterBind`, on NVIDIA's, AMD's
    /// and Intel's drivers, and Mesa 25.0's lavapipe, checked in CI; not
    /// bookworm's Mesa 22.3). Without it, another
    /// binding records the run again (the last few kept per plan queue).
    pub fn rebinds_in_place(&self) -> bool {
        self.context().physical.update_after_bind
    }

    /// The figures of the device's staging pool: host-visible memory for
    /// uploads, downloads and host access where buffers are not mapped
    /// ([`host_mapped`](Self::host_mapped)). It is not the buffers'
    /// memory: outside [`memory_stats`](crate::Device::memory_stats) and
    /// [`set_memory_limit`](crate::Device::set_memory_limit). A range is
    /// held while its transfer is queued; once they all returned, at
    /// most [`STAGING_KEEP`] bytes stay cached, and
    /// [`trim_memory`](crate::Device::trim_memory) gives those back too.
    pub fn staging_stats(&self) -> crate::memory::MemoryStats {
        self.staging_pool().stats()
    }

    /// The most bytes a kernel's scalars (its push constants) may span on
    /// this device (`maxPushConstantsSize`: 128 on lavapipe and many
    /// GPUs, 256 on NVIDIA's): an `exec` of a kernel whose push constants
    /// span more is refused. A compiler passes the rest in a buffer.
    pub fn max_push_constant_bytes(&self) -> u32 {
        self.context().limits().max_push_constants_size
    }

    /// Whether the device is a software one on the CPU (lavapipe).
    pub fn is_software(&self) -> bool {
        self.context().physical.is_cpu()
    }

    /// The largest difference between values of one timeline semaphore
    /// the device allows (its `maxTimelineSemaphoreValueDifference`).
    pub fn max_value_difference(&self) -> u64 {
        self.context()
            .max_value_difference
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lowers [`max_value_difference`](Self::max_value_difference) for
    /// this handle, as a driver with a small limit has it: for tests of
    /// what follows, on drivers whose limit is too large to reach.
    #[doc(hidden)]
    pub fn limit_value_difference(&self, max: u64) {
        self.context()
            .max_value_difference
            .fetch_min(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks the device lost, as a `VK_ERROR_DEVICE_LOST` would: for tests
    /// of what follows a loss, which no driver produces on demand.
    #[doc(hidden)]
    pub fn simulate_device_loss(&self) {
        let _ = self
            .context()
            .error("simulate_device_loss", vk::Result::ERROR_DEVICE_LOST);
    }
}

/// The device's [`Limits`]; `after_bind`: the least of its
/// update-after-bind storage buffer limits, where it binds kernels'
/// buffers through update-after-bind set layouts (`Physical::update_after_bind`).
fn limits_of(limits: &vk::PhysicalDeviceLimits, after_bind: Option<u32>) -> Limits {
    Limits {
        max_local_size: limits.max_compute_work_group_size,
        max_local_count: limits.max_compute_work_group_invocations,
        max_groups: limits.max_compute_work_group_count,
        // A kernel's buffers are one set layout's storage buffers, in the
        // compute stage, so each limit on those holds: the plain ones, and
        // where the device uses update-after-bind layouts, theirs too (they
        // count every set's descriptors, plain or not: the spec's
        // `VkDescriptorSetLayoutCreateFlagBits`); and hwqueue's own, 64.
        max_buffers: [
            limits.max_per_stage_descriptor_storage_buffers,
            limits.max_descriptor_set_storage_buffers,
            limits.max_per_stage_resources,
        ]
        .into_iter()
        .chain(after_bind)
        .min()
        .map_or(0, |max| max as usize)
        .min(64),
        // Work-group memory is declared in the shader, not passed.
        max_shared_memory: 0,
        view_alignment: (limits.min_storage_buffer_offset_alignment as usize)
            .clamp(4, VULKAN_ALIGNMENT),
    }
}

impl std::fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("spec", &self.context().spec)
            .field("name", &self.context().physical.name())
            .finish_non_exhaustive()
    }
}

impl QueueFactory for VulkanDevice {
    type Queue = VulkanQueue;
    type Signal = VulkanSignal;

    fn compute_queue(&self) -> Result<VulkanQueue> {
        Ok(Queue::new(VulkanEngine::new(
            self.clone(),
            QueueKind::Compute,
        )?))
    }

    /// A copy queue: on the transfer-only family where the device has one,
    /// else on the compute family (a queue of its own either way).
    fn copy_queue(&self) -> Result<Option<VulkanQueue>> {
        Ok(Some(Queue::new(VulkanEngine::new(
            self.clone(),
            QueueKind::Copy,
        )?)))
    }

    fn new_signal(&self, initial: u64) -> Result<VulkanSignal> {
        VulkanSignal::new(self.context().clone(), initial)
    }
}

impl Device for VulkanDevice {
    type Backend = Vulkan;

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::new(context::ID, self.context().ordinal)
    }

    fn name(&self) -> String {
        self.context().physical.name()
    }

    fn limits(&self) -> Limits {
        self.inner.limits
    }

    fn alloc(&self, size: usize) -> Result<VulkanBuffer> {
        VulkanBuffer::allocate(self.pool(), size, true, false)
    }

    fn alloc_uninit(&self, size: usize) -> Result<VulkanBuffer> {
        VulkanBuffer::allocate(self.pool(), size, false, false)
    }

    // The buffers' pool. Staging ranges (host memory, for uploads,
    // downloads and host access where buffers are not mapped) are a pool
    // of their own: not counted in `memory_stats` nor held to
    // `set_memory_limit`, and trimmed with `trim_memory`.
    crate::pooled_device_memory!(
        self => self.pool(),
        trim self.pool().trim() + self.staging_pool().trim()
    );

    /// [`Error::DeviceLost`] once a Vulkan call returned
    /// `VK_ERROR_DEVICE_LOST`; sticky, like CUDA's.
    fn health(&self) -> Result<()> {
        self.context().health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Limits::max_buffers` followed `maxPerStageDescriptorStorageBuffers`
    /// alone: a kernel within it but over `maxDescriptorSetStorageBuffers`
    /// or `maxPerStageResources`, which a set layout counts against too,
    /// was not
    /// refused at record time, and got an invalid pipeline layout. The
    /// least of the three holds, and 64 at most.
    #[test]
    fn a_kernel_s_buffers_are_held_to_every_limit_of_its_set_layout() {
        let mut limits = vk::PhysicalDeviceLimits {
            max_per_stage_descriptor_storage_buffers: 40,
            max_descriptor_set_storage_buffers: 24,
            max_per_stage_resources: 128,
            ..Default::default()
        };
        assert_eq!(limits_of(&limits, None).max_buffers, 24, "the set's limit");
        limits.max_descriptor_set_storage_buffers = 96;
        limits.max_per_stage_resources = 30;
        assert_eq!(
            limits_of(&limits, None).max_buffers,
            30,
            "the stage's resources"
        );
        limits.max_per_stage_resources = 200;
        assert_eq!(
            limits_of(&limits, None).max_buffers,
            40,
            "the stage's buffers"
        );
        limits.max_per_stage_descriptor_storage_buffers = 1 << 20;
        limits.max_descriptor_set_storage_buffers = 1 << 20;
        limits.max_per_stage_resources = 1 << 20;
        assert_eq!(
            limits_of(&limits, None).max_buffers,
            64,
            "hwqueue's own limit"
        );
        // Where kernels' sets are update-after-bind, those limits hold too
        // (helper-79: a plain layout, which ebb0d74 fell back to past them,
        // counts against them all the same).
        assert_eq!(
            limits_of(&limits, Some(12)).max_buffers,
            12,
            "the update-after-bind limits"
        );
        assert_eq!(limits_of(&limits, Some(1 << 20)).max_buffers, 64);
    }
}
