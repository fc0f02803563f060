//! The Vulkan objects under a [`VulkanDevice`], for code that records its
//! own Vulkan work beside hwqueue's: a compiler's hand-written pipelines,
//! a renderer sharing the device, a baseline in a benchmark. wgpu-hal
//! (`Device::raw_device`) and cudarc (`CudaContext::cu_ctx`) hand out
//! theirs the same way.
//!
//! The handles are hwqueue's, and the `VkDevice` and `VkQueue`s are the
//! process's one per physical device, shared by every [`VulkanDevice`]
//! handle of it and never destroyed (see the module docs): objects made
//! from them are the caller's to destroy, and never the device itself. Every `ash` call on them is `unsafe`,
//! with Vulkan's own rules, and hwqueue adds three:
//!
//! - Submits to its compute `VkQueue` go through
//!   [`VulkanDevice::with_compute_queue`], which holds the lock hwqueue's
//!   own submits take. Never call `vkDeviceWaitIdle` on
//!   [`raw_device`](VulkanDevice::raw_device): it needs every queue of the
//!   device held, and hwqueue's transfer queue is not handed out.
//! - hwqueue orders its command buffers after earlier submissions to the
//!   queue by their compute and transfer work only (a barrier of those
//!   stages opens each). Raw work of other stages (a renderer's draws)
//!   that hwqueue's must follow ends with a barrier of its own from those
//!   stages to the compute and transfer stages, or is waited for on the
//!   host before the hwqueue batch is submitted.
//! - hwqueue's host copies (mapped uploads and downloads) follow only its
//!   own submissions: raw work that writes memory hwqueue reads must be
//!   complete before the hwqueue batch that reads it is submitted.

use ash::vk;

use super::VulkanDevice;

impl VulkanDevice {
    /// The process's `ash` instance, which hwqueue made and keeps.
    pub fn raw_instance(&self) -> &ash::Instance {
        &super::context::instance()
            .expect("a device was opened from it")
            .instance
    }

    /// The `VkPhysicalDevice` this device was opened from.
    pub fn raw_physical_device(&self) -> vk::PhysicalDevice {
        self.context().physical.handle
    }

    /// The `VkDevice`, with its function table: the same for every handle
    /// of this physical device, and kept for the process.
    pub fn raw_device(&self) -> &ash::Device {
        &self.context().device
    }

    /// The queue family of the compute `VkQueue` (command pools for
    /// [`with_compute_queue`](Self::with_compute_queue) are made for it).
    pub fn compute_family(&self) -> u32 {
        self.context().compute_family
    }

    /// Runs `f` with the compute `VkQueue` (index 0 of
    /// [`compute_family`](Self::compute_family)), which hwqueue's compute
    /// queues submit to, holding the lock their submits take:
    /// `vkQueueSubmit*` needs external synchronisation. `f` must not call
    /// into hwqueue for this device at all, nor wait for anything hwqueue
    /// has yet to submit: submits, queue creation, host reads and writes of
    /// unmapped buffers, zeroed allocations of unmapped memory and waits
    /// for a queue's work can each need the lock `f` holds, and would hang.
    /// It should return soon: hwqueue's submits wait for it.
    pub fn with_compute_queue<R>(&self, f: impl FnOnce(vk::Queue) -> R) -> R {
        let queue = self.context().compute_queue.lock();
        f(*queue)
    }
}
