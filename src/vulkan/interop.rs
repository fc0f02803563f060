//! The Vulkan objects under a [`VulkanDevice`], for code that records its
//! own Vulkan work beside hwqueue's: a compiler's hand-written pipelines,
//! a renderer sharing the device, a baseline in a benchmark. wgpu-hal
//! (`Device::raw_device`) and cudarc (`CudaContext::cu_ctx`) hand out
//! theirs the same way.
//!
//! The handles are hwqueue's: objects made from them are the caller's to
//! destroy before the [`VulkanDevice`] (and its last clone, buffer,
//! signal, program and queue) goes. Every `ash` call on them is `unsafe`,
//! with Vulkan's own rules; the one rule hwqueue adds is that submits to
//! its queue go through [`VulkanDevice::with_compute_queue`], which holds
//! the lock hwqueue's own submits take.

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

    /// The `VkDevice`, with its function table.
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
    /// `vkQueueSubmit*` needs external synchronisation. `f` must not use
    /// an hwqueue queue of this device (its submit would wait for the lock
    /// `f` holds) and should return soon: hwqueue's submits wait for it.
    pub fn with_compute_queue<R>(&self, f: impl FnOnce(vk::Queue) -> R) -> R {
        let queue = self.context().compute_queue.lock();
        f(*queue)
    }
}
