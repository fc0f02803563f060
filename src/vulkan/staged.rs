//! Where a Vulkan device's buffers live, and the host's access to them
//! where it cannot map them.
//!
//! Buffers take the device's largest device-local heap, except on a
//! device that shares system memory (an integrated GPU, a CPU driver such
//! as lavapipe): all its heaps are system memory, and the device-local one
//! may be a small carve-out (an AMD APU reports its 512 MiB or so of
//! "VRAM" as the device-local heap, beside a host-visible heap of most of
//! the machine's memory), so buffers take the largest heap the host can
//! map. Where a
//! type of the chosen heap is also host-visible and coherent (lavapipe,
//! integrated GPUs, a discrete GPU with resizable BAR), they are mapped: host reads and
//! writes are copies through the mapping, and a queue copies uploads and
//! downloads on the host in queue order (`MemoryTypes::host_copies`: no
//! staging, no device copy, and a batch of transfers alone on an idle
//! queue submits nothing at all).
//! Otherwise (a discrete GPU without resizable BAR, whose only mappable
//! device-local type is a 256 MiB window) they are not mapped: uploads
//! and downloads go through staging ranges (a second pool, of
//! host-visible memory) and a device copy, and a host read or write of a
//! buffer is a staged copy submitted on its own and waited for, as
//! `cuMemcpyHtoD` is on CUDA. `HWQUEUE_VULKAN_MEMORY=unmapped` takes the
//! second way on any device, so that lavapipe runs it in CI.

use ash::vk;

use super::context::{Context, ID};
use crate::error::{Error, Result};

/// The environment variable that picks how buffers are reached from the
/// host: `auto` (the default) or `unmapped`.
pub const MEMORY_ENV: &str = "HWQUEUE_VULKAN_MEMORY";

/// A staged host copy moves at most this many bytes per submission, so
/// a host write of a large buffer needs no staging range as large.
pub(super) const STAGING_CHUNK: usize = 16 << 20;

/// The bytes of staging a device keeps cached once no transfer holds
/// them (CUDA's page-locked staging cache keeps as much): more goes back
/// to the driver as the transfers holding it complete.
pub const STAGING_KEEP: usize = 64 << 20;

/// The heap memory type `index` of `memory` lies in.
pub(super) fn heap_of(memory: &vk::PhysicalDeviceMemoryProperties, index: u32) -> vk::MemoryHeap {
    memory.memory_heaps[memory.memory_types[index as usize].heap_index as usize]
}

/// The memory types a device's buffers and staging ranges are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryTypes {
    /// Buffers' type.
    pub(super) device: u32,
    /// Whether buffers are mapped for the host (their type is host-visible
    /// and coherent, and mapping was not turned off).
    pub(super) mapped: bool,
    /// Staging ranges' type: host-visible and coherent, system memory
    /// rather than a device-local window where there is such a type, and
    /// host-cached where there is such a type (downloads read it).
    pub(super) staging: u32,
}

impl MemoryTypes {
    /// The types of `memory` (see the module docs) of a device of type
    /// `kind`; `unmapped` keeps buffers unmapped even where their type is
    /// host-visible. `None` where no type is host-visible and coherent.
    pub(super) fn choose(
        memory: &vk::PhysicalDeviceMemoryProperties,
        kind: vk::PhysicalDeviceType,
        unmapped: bool,
    ) -> Option<Self> {
        let shares_system = matches!(
            kind,
            vk::PhysicalDeviceType::INTEGRATED_GPU | vk::PhysicalDeviceType::CPU
        );
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let types = &memory.memory_types[..memory.memory_type_count as usize];
        // The first type with `want`, on `heap` if given, and not
        // device-local if `system` (a BAR window is no staging memory).
        let find = |want: vk::MemoryPropertyFlags, heap: Option<u32>, system: bool| {
            types
                .iter()
                .position(|t| {
                    t.property_flags.contains(want)
                        && heap.is_none_or(|h| t.heap_index == h)
                        && !(system && t.property_flags.contains(local))
                })
                .map(|index| index as u32)
        };
        // Staging: system memory, cached where it can be.
        let cached = host | vk::MemoryPropertyFlags::HOST_CACHED;
        let staging = find(cached, None, true)
            .or_else(|| find(host, None, true))
            .or_else(|| find(cached, None, false))
            .or_else(|| find(host, None, false))?;
        // The heap buffers take: the largest a device-local type lies in,
        // or, where all memory is system memory, the largest the host can
        // map (device-local preferred between equals).
        let on = if shares_system { host } else { local };
        let heap = types
            .iter()
            .filter(|t| t.property_flags.contains(on))
            .map(|t| t.heap_index)
            .max_by_key(|&h| {
                let heap = &memory.memory_heaps[h as usize];
                let local_heap = heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL);
                (heap.size, local_heap)
            });
        // Its type: mapped where one is host-visible and coherent (and
        // device-local, unless all memory is the system's).
        let (device, mappable) = match heap {
            Some(heap) => match find(local | host, Some(heap), false)
                .or_else(|| find(on | host, Some(heap), false))
            {
                Some(index) => (index, true),
                None => (
                    find(local, Some(heap), false).expect("the heap has a device-local type"),
                    false,
                ),
            },
            None => (staging, true),
        };
        Some(Self {
            device,
            mapped: mappable && !unmapped,
            staging,
        })
    }

    /// Whether a queue's uploads and downloads are copies on the host, in
    /// queue order, rather than device copies through staging: wherever
    /// buffers are mapped, cached or not. Resizable BAR's write-combined
    /// VRAM included: on an H200 the raw `ash` baseline copied 4 KiB in and
    /// out of it in 0.51 µs, while the staged path (a submission, a device
    /// copy each way, the retire thread's wake-up) took 72.7 µs, and 16 MiB
    /// cost 1.63x the baseline's two host copies.
    pub(super) fn host_copies(&self) -> bool {
        self.mapped
    }

    /// Whether `HWQUEUE_VULKAN_MEMORY` asks for unmapped buffers.
    ///
    /// # Errors
    /// [`Error::Driver`] for a value other than `auto` and `unmapped`.
    pub(super) fn unmapped_from_env(spec: &str) -> Result<bool> {
        match std::env::var(MEMORY_ENV) {
            Err(_) => Ok(false),
            Ok(value) => match value.as_str() {
                "" | "auto" => Ok(false),
                "unmapped" => Ok(true),
                other => Err(Error::Driver {
                    backend: ID,
                    what: format!("opening `{spec}`"),
                    detail: format!(
                        "{MEMORY_ENV} is `{other}`; it takes `auto` (buffers mapped where the \
                         device allows) or `unmapped` (host access through staging, as on a \
                         discrete GPU): set one of them, or unset it"
                    ),
                }),
            },
        }
    }
}

/// The command buffer and fence of the host's staged copies (one at a
/// time, behind the context's lock).
pub(super) struct OneShot {
    pool: vk::CommandPool,
    command: vk::CommandBuffer,
    fence: vk::Fence,
}

impl OneShot {
    fn new(context: &Context) -> Result<Self> {
        let device = &context.device;
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(context.compute_family);
        // SAFETY: the infos live across the calls; what is made is
        // destroyed on failure here, or by `destroy`.
        unsafe {
            let pool = device
                .create_command_pool(&info, None)
                .map_err(|e| context.error("vkCreateCommandPool (host copies)", e))?;
            let allocate = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            let made = device
                .allocate_command_buffers(&allocate)
                .and_then(|command| {
                    let fence = device.create_fence(&vk::FenceCreateInfo::default(), None)?;
                    Ok((command[0], fence))
                });
            match made {
                Ok((command, fence)) => Ok(Self {
                    pool,
                    command,
                    fence,
                }),
                Err(e) => {
                    device.destroy_command_pool(pool, None);
                    Err(context.error("vkAllocateCommandBuffers / vkCreateFence (host copies)", e))
                }
            }
        }
    }

    /// Frees what `new` made.
    ///
    /// # Safety
    /// Nothing it recorded is pending (every `run_once` waited for its
    /// submission, or the device is idle).
    pub(super) unsafe fn destroy(&self, device: &ash::Device) {
        // SAFETY: by the caller, nothing uses them.
        unsafe {
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.pool, None);
        }
    }
}

impl Context {
    /// Records `record` into a command buffer of its own, ending with a
    /// barrier that makes its writes visible to later commands and to the
    /// host; submits it on the compute queue and waits for it: the host's
    /// access to memory it cannot map (`what` names it in errors).
    pub(super) fn run_once(
        &self,
        what: &str,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        self.health()?;
        let mut once = self.once.lock();
        if once.is_none() {
            *once = Some(OneShot::new(self)?);
        }
        let shot = once.as_ref().expect("made above");
        let device = &self.device;
        let call = |name: &str, e| self.error(&format!("{name} ({what})"), e);
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // Before: the writes and reads of work submitted earlier to the
        // compute `VkQueue`, against the copy (a host access to unmapped
        // memory so waits for that work, any queue's); after: the copy's
        // writes, against later work and the host. Work of a copy queue on
        // a transfer-only family is ordered by the caller's signals, as
        // any host access is.
        let before = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::MEMORY_READ
                    | vk::AccessFlags::MEMORY_WRITE
                    | vk::AccessFlags::HOST_READ,
            )];
        // SAFETY: the command buffer and fence are this context's and idle
        // (the last submission was waited for, under the lock held); the
        // infos live across the calls; `record` records into it only.
        unsafe {
            device
                .begin_command_buffer(shot.command, &begin)
                .map_err(|e| call("vkBeginCommandBuffer", e))?;
            device.cmd_pipeline_barrier(
                shot.command,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &before,
                &[],
                &[],
            );
            record(device, shot.command);
            device.cmd_pipeline_barrier(
                shot.command,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::ALL_COMMANDS | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
            device
                .end_command_buffer(shot.command)
                .map_err(|e| call("vkEndCommandBuffer", e))?;
            device
                .reset_fences(&[shot.fence])
                .map_err(|e| call("vkResetFences", e))?;
            let commands = [shot.command];
            let submit = [vk::SubmitInfo::default().command_buffers(&commands)];
            {
                let queue = self.compute_queue.lock();
                device
                    .queue_submit(*queue, &submit, shot.fence)
                    .map_err(|e| call("vkQueueSubmit", e))?;
            }
            let waited = loop {
                match device.wait_for_fences(&[shot.fence], true, 1_000_000_000) {
                    Ok(()) => break Ok(()),
                    // A device lost elsewhere never signals the fence.
                    Err(vk::Result::TIMEOUT) => {
                        if let Err(lost) = self.health() {
                            break Err(lost);
                        }
                    }
                    Err(e) => break Err(call("vkWaitForFences", e)),
                }
            };
            if waited.is_err() {
                // The submission may still be pending: its command buffer
                // and fence are never reused, nor destroyed (the context's
                // drop destroys only the one it holds), after this.
                *once = None;
            }
            waited
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    const VISIBLE: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_VISIBLE;
    const COHERENT: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_COHERENT;
    const CACHED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_CACHED;

    /// Memory properties of `heaps` (size, device-local) and `types`
    /// (flags, heap).
    fn memory(
        heaps: &[(u64, bool)],
        types: &[(vk::MemoryPropertyFlags, u32)],
    ) -> vk::PhysicalDeviceMemoryProperties {
        let mut memory = vk::PhysicalDeviceMemoryProperties {
            memory_heap_count: heaps.len() as u32,
            memory_type_count: types.len() as u32,
            ..Default::default()
        };
        for (at, &(size, local)) in heaps.iter().enumerate() {
            memory.memory_heaps[at] = vk::MemoryHeap {
                size,
                flags: if local {
                    vk::MemoryHeapFlags::DEVICE_LOCAL
                } else {
                    vk::MemoryHeapFlags::empty()
                },
            };
        }
        for (at, &(property_flags, heap_index)) in types.iter().enumerate() {
            memory.memory_types[at] = vk::MemoryType {
                property_flags,
                heap_index,
            };
        }
        memory
    }

    const GIB: u64 = 1 << 30;
    const CPU: vk::PhysicalDeviceType = vk::PhysicalDeviceType::CPU;
    const DISCRETE: vk::PhysicalDeviceType = vk::PhysicalDeviceType::DISCRETE_GPU;
    const INTEGRATED: vk::PhysicalDeviceType = vk::PhysicalDeviceType::INTEGRATED_GPU;

    #[test]
    fn a_cpu_driver_s_one_type_is_mapped_unless_asked_not_to_be() {
        // lavapipe: one heap, one type that is everything.
        let lavapipe = memory(
            &[(8 * GIB, true)],
            &[(LOCAL | VISIBLE | COHERENT | CACHED, 0)],
        );
        let want = MemoryTypes {
            device: 0,
            mapped: true,
            staging: 0,
        };
        assert_eq!(MemoryTypes::choose(&lavapipe, CPU, false), Some(want));
        assert_eq!(
            MemoryTypes::choose(&lavapipe, CPU, true),
            Some(MemoryTypes {
                mapped: false,
                ..want
            })
        );
    }

    #[test]
    fn a_discrete_gpu_without_resizable_bar_keeps_buffers_in_vram_unmapped() {
        // VRAM (heap 0), system memory (heap 1), the 256 MiB BAR window
        // (heap 2), as NVIDIA and AMD drivers report them.
        let discrete = memory(
            &[(24 * GIB, true), (64 * GIB, false), (256 << 20, true)],
            &[
                (VISIBLE | COHERENT, 1),
                (LOCAL, 0),
                (VISIBLE | COHERENT | CACHED, 1),
                (LOCAL | VISIBLE | COHERENT, 2),
            ],
        );
        assert_eq!(
            MemoryTypes::choose(&discrete, DISCRETE, false),
            Some(MemoryTypes {
                device: 1,
                mapped: false,
                staging: 2
            })
        );
    }

    #[test]
    fn resizable_bar_maps_vram() {
        let rebar = memory(
            &[(80 * GIB, true), (64 * GIB, false)],
            &[
                (LOCAL, 0),
                (LOCAL | VISIBLE | COHERENT, 0),
                (VISIBLE | COHERENT, 1),
            ],
        );
        assert_eq!(
            MemoryTypes::choose(&rebar, DISCRETE, false),
            Some(MemoryTypes {
                device: 1,
                mapped: true,
                staging: 2
            })
        );
    }

    /// Issue 46: a discrete GPU's small transfers took a submission and a
    /// device copy each way through staging (72.7 µs for 4 KiB up and
    /// down on an H200 against 0.51 µs for raw copies through resizable
    /// BAR), since only host-cached memory was copied on the host. Mapped
    /// memory is now copied on the host whether cached or not; unmapped
    /// memory still goes through staging.
    #[test]
    fn uploads_and_downloads_copy_on_the_host_wherever_buffers_are_mapped() {
        // An H200's: VRAM all mappable (resizable BAR), write-combined
        // (not host-cached), beside cached system memory.
        let rebar = memory(
            &[(140 * GIB, true), (64 * GIB, false)],
            &[
                (LOCAL, 0),
                (LOCAL | VISIBLE | COHERENT, 0),
                (VISIBLE | COHERENT | CACHED, 1),
            ],
        );
        let h200 = MemoryTypes::choose(&rebar, DISCRETE, false).unwrap();
        assert!(h200.mapped && h200.host_copies());
        let forced = MemoryTypes::choose(&rebar, DISCRETE, true).unwrap();
        assert!(
            !forced.host_copies(),
            "HWQUEUE_VULKAN_MEMORY=unmapped stages"
        );
        // Without resizable BAR (a 256 MiB window only): staging.
        let window = memory(
            &[(24 * GIB, true), (64 * GIB, false), (256 << 20, true)],
            &[
                (LOCAL, 0),
                (VISIBLE | COHERENT | CACHED, 1),
                (LOCAL | VISIBLE | COHERENT, 2),
            ],
        );
        assert!(
            !MemoryTypes::choose(&window, DISCRETE, false)
                .unwrap()
                .host_copies()
        );
        // lavapipe: cached and mapped, as before.
        let lavapipe = memory(
            &[(8 * GIB, true)],
            &[(LOCAL | VISIBLE | COHERENT | CACHED, 0)],
        );
        assert!(
            MemoryTypes::choose(&lavapipe, CPU, false)
                .unwrap()
                .host_copies()
        );
    }

    #[test]
    fn without_device_local_memory_buffers_are_host_memory_and_without_coherent_memory_none() {
        let host_only = memory(&[(16 * GIB, false)], &[(VISIBLE | COHERENT, 0)]);
        assert_eq!(
            MemoryTypes::choose(&host_only, DISCRETE, false),
            Some(MemoryTypes {
                device: 0,
                mapped: true,
                staging: 0
            })
        );
        let incoherent = memory(&[(16 * GIB, true)], &[(LOCAL, 0), (LOCAL | VISIBLE, 0)]);
        assert_eq!(MemoryTypes::choose(&incoherent, DISCRETE, false), None);
    }

    #[test]
    fn an_integrated_gpu_takes_its_largest_mappable_heap_not_a_small_carve_out() {
        // An AMD APU: 512 MiB of carve-out "VRAM" (heap 0, device-local)
        // beside 30 GiB of system memory (heap 1).
        let apu = memory(
            &[(512 << 20, true), (30 * GIB, false)],
            &[
                (LOCAL, 0),
                (VISIBLE | COHERENT, 1),
                (LOCAL | VISIBLE | COHERENT, 0),
                (VISIBLE | COHERENT | CACHED, 1),
            ],
        );
        let want = MemoryTypes {
            device: 1,
            mapped: true,
            staging: 3,
        };
        assert_eq!(MemoryTypes::choose(&apu, INTEGRATED, false), Some(want));
        // The same heaps on a discrete GPU are VRAM and system memory:
        // buffers stay in VRAM.
        assert_eq!(
            MemoryTypes::choose(&apu, DISCRETE, false),
            Some(MemoryTypes { device: 2, ..want })
        );
        // An Intel GPU: one device-local heap of system memory, which
        // the host maps.
        let intel = memory(
            &[(30 * GIB, true)],
            &[(LOCAL, 0), (LOCAL | VISIBLE | COHERENT | CACHED, 0)],
        );
        assert_eq!(
            MemoryTypes::choose(&intel, INTEGRATED, true),
            Some(MemoryTypes {
                device: 1,
                mapped: false,
                staging: 1
            })
        );
    }
}
