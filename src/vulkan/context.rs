//! The Vulkan instance, physical device and logical device one
//! [`VulkanDevice`](super::VulkanDevice) runs on: loading the loader,
//! choosing what is required, and turning every `VkResult` error into a
//! typed [`Error`] naming the call.

use std::ffi::CStr;
use std::sync::OnceLock;

use ash::vk;
use parking_lot::Mutex;

use super::staged::{MemoryTypes, OneShot};
use crate::error::{Error, Result};

/// The backend id, as errors name it.
pub(super) const ID: &str = "vulkan";

/// What to install where there is no Vulkan driver.
const INSTALL: &str = "install a Vulkan loader and driver: on Debian or Ubuntu `apt-get install \
                       libvulkan1 mesa-vulkan-drivers` (Mesa's lavapipe runs Vulkan on the CPU; \
                       a GPU's vendor driver brings its own ICD)";

/// The loader, loaded once per process (`None`, with why, where it is
/// missing).
pub(super) fn entry() -> Result<&'static ash::Entry> {
    static ENTRY: OnceLock<std::result::Result<ash::Entry, String>> = OnceLock::new();
    ENTRY
        .get_or_init(|| {
            // SAFETY: loading `libvulkan.so.1` runs its initialisers, which
            // the Vulkan loader documents as safe to run at any time; the
            // entry lives for the process (a static), so no function
            // pointer it hands out outlives the library.
            unsafe { ash::Entry::load() }.map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|detail| Error::NoDriver {
            backend: ID,
            detail: format!("the Vulkan loader did not load ({detail}); {INSTALL}"),
        })
}

/// A failed Vulkan call as an [`Error`]: `VK_ERROR_DEVICE_LOST` is
/// [`Error::DeviceLost`] (sticky: nothing more runs on the device), every
/// other error [`Error::Driver`] naming the call and the code.
pub(super) fn vk_error(device: &str, call: &str, result: vk::Result) -> Error {
    match result {
        vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost {
            device: device.into(),
            detail: format!("{call} returned VK_ERROR_DEVICE_LOST"),
        },
        other => Error::Driver {
            backend: ID,
            what: call.into(),
            detail: format!("{other:?} ({})", other.as_raw()),
        },
    }
}

/// A physical device as the loader reports it, before it is opened.
pub(super) struct Physical {
    pub(super) handle: vk::PhysicalDevice,
    pub(super) properties: vk::PhysicalDeviceProperties,
    pub(super) driver: String,
    pub(super) driver_id: vk::DriverId,
    pub(super) memory: vk::PhysicalDeviceMemoryProperties,
    pub(super) families: Vec<vk::QueueFamilyProperties>,
    pub(super) timeline_semaphores: bool,
    /// `maxTimelineSemaphoreValueDifference`.
    pub(super) max_value_difference: u64,
    /// Whether queries may be reset on the host (`hostQueryReset`).
    pub(super) host_query_reset: bool,
    /// Whether storage buffer descriptors may be written after their set
    /// is bound (`descriptorBindingStorageBufferUpdateAfterBind`): a
    /// recording for replay then takes a run's new bindings by rewriting
    /// its descriptor sets (`replay.rs`), not by being recorded again.
    pub(super) update_after_bind: bool,
    /// The most storage buffers one set layout may give the compute stage
    /// on a device with [`update_after_bind`](Self::update_after_bind),
    /// where those limits count every set, plain or not: the least of
    /// `maxPerStageDescriptorUpdateAfterBindStorageBuffers`,
    /// `maxDescriptorSetUpdateAfterBindStorageBuffers` and
    /// `maxPerStageUpdateAfterBindResources`.
    pub(super) update_after_bind_buffers: u32,
}

impl Physical {
    pub(super) fn name(&self) -> String {
        self.properties.device_name_as_c_str().map_or_else(
            |_| "unnamed".into(),
            |name| name.to_string_lossy().into_owned(),
        )
    }

    /// Why the backend cannot use this device, if it cannot.
    pub(super) fn missing(&self) -> Option<String> {
        let api = self.properties.api_version;
        if api < vk::API_VERSION_1_2 {
            return Some(format!(
                "it offers Vulkan {}.{}, and hwqueue needs 1.2 (timeline semaphores); update the \
                 driver",
                vk::api_version_major(api),
                vk::api_version_minor(api)
            ));
        }
        if !self.timeline_semaphores {
            return Some("it lacks the `timelineSemaphore` feature; update the driver".into());
        }
        if self.compute_family().is_none() {
            return Some("it has no queue family with compute".into());
        }
        None
    }

    /// The family compute queues use ([`compute_family_of`]).
    pub(super) fn compute_family(&self) -> Option<u32> {
        compute_family_of(&self.families)
    }

    /// A family that only transfers (a copy engine), where there is one.
    pub(super) fn transfer_family(&self) -> Option<u32> {
        self.families
            .iter()
            .position(|f| {
                f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                    && !f
                        .queue_flags
                        .intersects(vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS)
            })
            .map(|index| index as u32)
    }

    /// Whether the device is a software rasteriser on the CPU (lavapipe).
    pub(super) fn is_cpu(&self) -> bool {
        self.properties.device_type == vk::PhysicalDeviceType::CPU
    }
}

/// The process's Vulkan instance, made once, and its physical devices.
pub(super) struct Instance {
    pub(super) instance: ash::Instance,
    pub(super) physical: Vec<Physical>,
}

// SAFETY: `ash::Instance` is a table of function pointers and a handle;
// Vulkan instances are safe to use from any thread (calls that need
// external synchronisation take `&mut` or are not made concurrently here).
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

/// The instance, made on first use; an error where there is no loader or no
/// Vulkan 1.2 instance.
pub(super) fn instance() -> Result<&'static Instance> {
    static INSTANCE: OnceLock<std::result::Result<Instance, Error>> = OnceLock::new();
    INSTANCE
        .get_or_init(make_instance)
        .as_ref()
        .map_err(Clone::clone)
}

fn make_instance() -> Result<Instance> {
    let entry = entry()?;
    // SAFETY: a plain query of the loaded entry.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .map_err(|e| vk_error(ID, "vkEnumerateInstanceVersion", e))?
        .unwrap_or(vk::API_VERSION_1_0);
    if version < vk::API_VERSION_1_2 {
        return Err(Error::NoDriver {
            backend: ID,
            detail: format!(
                "the Vulkan loader offers {}.{}, and hwqueue needs 1.2; {INSTALL}",
                vk::api_version_major(version),
                vk::api_version_minor(version)
            ),
        });
    }
    let app = vk::ApplicationInfo::default()
        .application_name(c"hwqueue")
        .engine_name(c"hwqueue")
        .api_version(vk::API_VERSION_1_3.min(version));
    let create = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `create` and what it points to live across the call.
    let instance = unsafe { entry.create_instance(&create, None) }.map_err(|e| match e {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => Error::NoDriver {
            backend: ID,
            detail: format!(
                "the Vulkan loader found no driver (vkCreateInstance: \
                 VK_ERROR_INCOMPATIBLE_DRIVER); {INSTALL}"
            ),
        },
        other => vk_error(ID, "vkCreateInstance", other),
    })?;
    // SAFETY: `instance` was just made; the queries below read properties.
    let handles = match unsafe { instance.enumerate_physical_devices() } {
        Ok(handles) => handles,
        Err(e) => {
            // SAFETY: nothing was made from the instance.
            unsafe { instance.destroy_instance(None) };
            return Err(vk_error(ID, "vkEnumeratePhysicalDevices", e));
        }
    };
    let physical = handles
        .into_iter()
        .map(|handle| describe(&instance, handle))
        .collect();
    Ok(Instance { instance, physical })
}

fn describe(instance: &ash::Instance, handle: vk::PhysicalDevice) -> Physical {
    // SAFETY: `handle` is one of the instance's physical devices; the
    // structures chained below live across each call.
    unsafe {
        let properties = instance.get_physical_device_properties(handle);
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut timeline = vk::PhysicalDeviceTimelineSemaphoreProperties::default();
        let mut indexing = vk::PhysicalDeviceDescriptorIndexingProperties::default();
        let mut chained = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut driver)
            .push_next(&mut timeline)
            .push_next(&mut indexing);
        instance.get_physical_device_properties2(handle, &mut chained);
        // Read before `chained`'s borrow of them ends below.
        let max_value_difference = timeline.max_timeline_semaphore_value_difference;
        let update_after_bind_buffers = indexing
            .max_per_stage_descriptor_update_after_bind_storage_buffers
            .min(indexing.max_descriptor_set_update_after_bind_storage_buffers)
            .min(indexing.max_per_stage_update_after_bind_resources);
        let driver_name = driver
            .driver_name_as_c_str()
            .map(CStr::to_string_lossy)
            .unwrap_or_default()
            .into_owned();
        let driver_info = driver
            .driver_info_as_c_str()
            .map(CStr::to_string_lossy)
            .unwrap_or_default()
            .into_owned();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
        instance.get_physical_device_features2(handle, &mut features);
        Physical {
            handle,
            properties,
            driver: format!("{driver_name} {driver_info}").trim().to_owned(),
            driver_id: driver.driver_id,
            memory: instance.get_physical_device_memory_properties(handle),
            families: instance.get_physical_device_queue_family_properties(handle),
            timeline_semaphores: v12.timeline_semaphore == vk::TRUE,
            host_query_reset: v12.host_query_reset == vk::TRUE,
            update_after_bind: v12.descriptor_binding_storage_buffer_update_after_bind == vk::TRUE,
            update_after_bind_buffers,
            // 0 from a driver that did not fill it in: the spec's least.
            max_value_difference: if max_value_difference == 0 {
                (1 << 31) - 1
            } else {
                max_value_difference
            },
        }
    }
}

/// The process's one logical device per physical device: the `VkDevice`
/// and its `VkQueue`s, made at the first [`Context::open`] of that
/// physical device and kept for the process, as CUDA's primary context is
/// one per GPU. Every [`VulkanDevice`](super::VulkanDevice) handle of the
/// physical device, in any thread, runs on it:
///
/// - no `vkCreateDevice` or `vkDestroyDevice` ever runs while another
///   thread drives the device (NVIDIA's driver hung when handles were
///   opened and dropped in several threads, each with a `VkDevice` of its
///   own: one thread in `vkDestroyDevice` held the loader's lock that
///   others' `vkCreateDevice` and submits waited on);
/// - every handle's queues submit to the same `VkQueue`s, under the same
///   locks (`vkQueueSubmit` needs external synchronisation);
/// - what belongs to a handle stays per handle ([`Context`]): its memory
///   pool and mode (mapped or staged), its one-shot command buffer, its
///   spec and its record of a lost device. A handle's objects (buffers,
///   signals, queues) are its own: another handle's queue refuses them as
///   another device's.
pub(super) struct SharedDevice {
    device: ash::Device,
    compute_family: u32,
    transfer_family: Option<u32>,
    compute_queue: Mutex<vk::Queue>,
    transfer_queue: Option<Mutex<vk::Queue>>,
}

// SAFETY: `ash::Device` is a table of function pointers and a handle;
// Vulkan devices may be used from any thread, and every call needing
// external synchronisation (queue submits) goes through the locks above.
unsafe impl Send for SharedDevice {}
// SAFETY: as above.
unsafe impl Sync for SharedDevice {}

/// The shared devices, by the instance's physical device index: each
/// made under its own lock, once (a failed creation is retried by the
/// next open), and never destroyed.
fn shared_device(index: u32, spec: &str) -> Result<&'static SharedDevice> {
    static SHARED: OnceLock<Vec<Mutex<Option<&'static SharedDevice>>>> = OnceLock::new();
    let instance = instance()?;
    let slots = SHARED.get_or_init(|| instance.physical.iter().map(|_| Mutex::new(None)).collect());
    let mut slot = slots[index as usize].lock();
    if let Some(shared) = *slot {
        return Ok(shared);
    }
    let physical = &instance.physical[index as usize];
    let compute_family = physical.compute_family().expect("checked by `missing`");
    let transfer_family = physical.transfer_family();
    let priorities = [1.0f32];
    let mut families = vec![
        vk::DeviceQueueCreateInfo::default()
            .queue_family_index(compute_family)
            .queue_priorities(&priorities),
    ];
    if let Some(family) = transfer_family {
        families.push(
            vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&priorities),
        );
    }
    // Host query resets where the device has them: a transfer-only
    // family cannot reset its timestamps in a command buffer.
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
        .timeline_semaphore(true)
        .host_query_reset(physical.host_query_reset)
        .descriptor_binding_storage_buffer_update_after_bind(physical.update_after_bind);
    let create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&families)
        .push_next(&mut v12);
    // SAFETY: `physical` is the instance's; `create` and its chain live
    // across the call; no other thread creates a device of this physical
    // device meanwhile (the slot's lock is held).
    let device = unsafe {
        instance
            .instance
            .create_device(physical.handle, &create, None)
    }
    .map_err(|e| vk_error(spec, "vkCreateDevice", e))?;
    // SAFETY: each family was asked for with one queue, index 0.
    let (compute_queue, transfer_queue) = unsafe {
        (
            device.get_device_queue(compute_family, 0),
            transfer_family.map(|family| device.get_device_queue(family, 0)),
        )
    };
    let shared: &'static SharedDevice = Box::leak(Box::new(SharedDevice {
        device,
        compute_family,
        transfer_family,
        compute_queue: Mutex::new(compute_queue),
        transfer_queue: transfer_queue.map(Mutex::new),
    }));
    *slot = Some(shared);
    Ok(shared)
}

/// One opened device handle's view of its physical device: the shared
/// logical device and queues ([`SharedDevice`]), and what is the handle's
/// own; shared by every buffer, signal, program and queue made of the
/// handle.
pub(crate) struct Context {
    pub(super) device: ash::Device,
    pub(super) physical: &'static Physical,
    pub(super) ordinal: u32,
    /// The compute family, and the transfer-only family where there is one.
    pub(super) compute_family: u32,
    pub(super) transfer_family: Option<u32>,
    /// The shared `VkQueue`s, one per family used, each behind a lock:
    /// submits need external synchronisation, and logical queues (of
    /// every handle of the device) share them.
    pub(super) compute_queue: &'static Mutex<vk::Queue>,
    pub(super) transfer_queue: Option<&'static Mutex<vk::Queue>>,
    /// The memory types of buffers and of staging ranges, and whether
    /// buffers are mapped (`super::staged`).
    pub(super) memory: MemoryTypes,
    /// The command buffer of the host's staged copies, made at the first.
    pub(super) once: Mutex<Option<OneShot>>,
    pub(super) spec: String,
    /// What lost the device, once a call returned `VK_ERROR_DEVICE_LOST`:
    /// sticky, every later submission fails with it. Set once (the first
    /// loss is the one named), so that [`health`](Self::health), which
    /// every device command asks, is a load, not a lock.
    pub(super) lost: OnceLock<String>,
    /// Whether queries are reset on the host (`hostQueryReset` enabled).
    pub(super) host_query_reset: bool,
    /// The largest difference between values of one timeline semaphore:
    /// the device's `maxTimelineSemaphoreValueDifference`, or less, for
    /// tests (`VulkanDevice::limit_value_difference`).
    pub(super) max_value_difference: std::sync::atomic::AtomicU64,
}

// SAFETY: `ash::Device` is a table of function pointers and a handle;
// Vulkan devices may be used from any thread, and every call needing
// external synchronisation (queue submits) goes through the locks above.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the instance's physical device `index` as `vulkan:{ordinal}`;
    /// `unmapped` keeps buffers unmapped (`None`: as `HWQUEUE_VULKAN_MEMORY`
    /// says).
    pub(super) fn open(index: u32, ordinal: u32, unmapped: Option<bool>) -> Result<Self> {
        let instance = instance()?;
        let physical = &instance.physical[index as usize];
        let spec = format!("{ID}:{ordinal}");
        if let Some(missing) = physical.missing() {
            return Err(Error::Driver {
                backend: ID,
                what: format!("opening `{spec}` ({})", physical.name()),
                detail: missing,
            });
        }
        let shared = shared_device(index, &spec)?;
        let unmapped = unmapped.map_or_else(|| MemoryTypes::unmapped_from_env(&spec), Ok);
        let memory = unmapped.and_then(|unmapped| {
            MemoryTypes::choose(&physical.memory, physical.properties.device_type, unmapped)
                .ok_or_else(|| Error::Driver {
                    backend: ID,
                    what: format!("opening `{spec}`"),
                    detail: "it has no host-visible, coherent memory type, which hwqueue's Vulkan \
                         staging needs (every desktop and CPU driver has one): update the \
                         driver, or open another device (`examples/info` lists them)"
                        .into(),
                })
        });
        Ok(Self {
            device: shared.device.clone(),
            physical,
            ordinal,
            compute_family: shared.compute_family,
            transfer_family: shared.transfer_family,
            compute_queue: &shared.compute_queue,
            transfer_queue: shared.transfer_queue.as_ref(),
            memory: memory?,
            once: Mutex::new(None),
            spec,
            lost: OnceLock::new(),
            host_query_reset: physical.host_query_reset,
            max_value_difference: std::sync::atomic::AtomicU64::new(physical.max_value_difference),
        })
    }

    /// `Err` where `value` is further above `current` than the device
    /// allows between values of one timeline semaphore.
    pub(super) fn check_value_difference(&self, value: u64, current: u64) -> Result<()> {
        let max = self
            .max_value_difference
            .load(std::sync::atomic::Ordering::Relaxed);
        if value > current && value - current > max {
            return Err(Error::SignalValueTooFarApart {
                value,
                current,
                max,
                device: self.spec.clone(),
            });
        }
        Ok(())
    }

    /// `VkPhysicalDeviceLimits` of the device.
    pub(super) fn limits(&self) -> &vk::PhysicalDeviceLimits {
        &self.physical.properties.limits
    }

    /// The error of Vulkan call `call` on this device; a lost device is
    /// remembered ([`health`](Self::health)).
    pub(super) fn error(&self, call: &str, result: vk::Result) -> Error {
        let error = vk_error(&self.spec, call, result);
        if let Error::DeviceLost { detail, .. } = &error {
            self.lost.get_or_init(|| detail.clone());
        }
        error
    }

    /// [`Error::DeviceLost`] once a call lost the device, naming that call.
    pub(super) fn health(&self) -> Result<()> {
        match self.lost.get() {
            Some(detail) => Err(Error::DeviceLost {
                device: self.spec.clone(),
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }
}

impl Context {
    /// The queue families that use buffers, and how many of them there
    /// are: the compute family, and the transfer-only family where the
    /// device has one.
    pub(super) fn families(&self) -> ([u32; 2], usize) {
        match self.transfer_family {
            Some(transfer) => ([self.compute_family, transfer], 2),
            None => ([self.compute_family; 2], 1),
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the last handle of this context is going: every buffer,
        // signal, program and queue made of it holds the context, so none
        // is left, and their drops waited for the work that used them; the
        // one-shot command buffer's copies each waited for their fence.
        // The shared device stays (see `SharedDevice`).
        unsafe {
            if let Some(once) = self.once.get_mut().take() {
                once.destroy(&self.device);
            }
        }
    }
}

/// The family compute queues use: a compute-only one (an async compute
/// engine, as NVIDIA's and AMD's GPUs have beside their graphics family)
/// where the device has one, since it does not share its engine with
/// graphics work; else the first family that computes.
fn compute_family_of(families: &[vk::QueueFamilyProperties]) -> Option<u32> {
    let computes = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::COMPUTE);
    families
        .iter()
        .position(|f| computes(f) && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS))
        .or_else(|| families.iter().position(computes))
        .map(|index| index as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(flags: vk::QueueFlags, count: u32) -> vk::QueueFamilyProperties {
        vk::QueueFamilyProperties {
            queue_flags: flags,
            queue_count: count,
            timestamp_valid_bits: 64,
            ..Default::default()
        }
    }

    /// As an H100's or H200's: graphics + compute (16 queues), transfer
    /// only (2), compute only (8), and more.
    #[test]
    fn compute_queues_take_the_compute_only_family_where_there_is_one() {
        use vk::QueueFlags as F;
        let nvidia = [
            family(
                F::GRAPHICS | F::COMPUTE | F::TRANSFER | F::SPARSE_BINDING,
                16,
            ),
            family(F::TRANSFER | F::SPARSE_BINDING, 2),
            family(F::COMPUTE | F::TRANSFER | F::SPARSE_BINDING, 8),
            family(F::VIDEO_DECODE_KHR, 3),
        ];
        assert_eq!(compute_family_of(&nvidia), Some(2));
        // lavapipe: one family that does everything.
        let lavapipe = [family(F::GRAPHICS | F::COMPUTE | F::TRANSFER, 1)];
        assert_eq!(compute_family_of(&lavapipe), Some(0));
        assert_eq!(compute_family_of(&[family(F::TRANSFER, 1)]), None);
    }
}
