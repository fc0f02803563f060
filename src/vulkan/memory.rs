//! A Vulkan device's memory: blocks of `VkDeviceMemory`, each with one
//! `VkBuffer` over all of it, mapped for the host where it can be, for the core's
//! caching [`MemoryPool`](crate::memory::MemoryPool); a
//! [`VulkanBuffer`] is the core's [`Allocation`] of that pool.

use std::sync::Arc;

use ash::vk;

use super::Vulkan;
use super::context::Context;
use super::staged::STAGING_CHUNK;
use crate::buffer::{Buffer, Pod, bytes_of, bytes_of_mut, check_host_access};
use crate::error::{Error, Result};
use crate::memory::{
    Access, Allocation, BlockError, BlockSource, DeviceMemory, MemoryPool, QueueOrdered, ZeroError,
};

/// Every range of the pool starts at a multiple of this: at least the
/// storage-buffer offset alignment of every device seen (16 to 256).
pub const VULKAN_ALIGNMENT: usize = 256;

/// The blocks of one device's buffers, or of its staging ranges.
pub struct VulkanBlocks {
    pub(super) context: Arc<Context>,
    /// The memory type of the blocks, and whether they are mapped.
    memory_type: u32,
    mapped: bool,
    /// The pool of staging ranges (host-visible, mapped), for the
    /// buffers' blocks; `None` in the staging pool's own.
    staging: Option<MemoryPool<VulkanBlocks>>,
}

impl VulkanBlocks {
    /// The blocks of `context`'s buffers, with a staging pool of their own.
    pub(super) fn for_device(context: Arc<Context>) -> Self {
        let types = context.memory;
        let staging = MemoryPool::new(Self {
            context: context.clone(),
            memory_type: types.staging,
            mapped: true,
            staging: None,
        });
        staging.set_release_threshold(super::STAGING_KEEP);
        Self {
            context,
            memory_type: types.device,
            mapped: types.mapped,
            staging: Some(staging),
        }
    }

    /// The pool staging ranges come from.
    pub(super) fn staging_pool(&self) -> &MemoryPool<VulkanBlocks> {
        self.staging
            .as_ref()
            .expect("staging ranges come from a device's buffer pool")
    }
}

/// A block: memory, the buffer over it, and where the host sees it (`None`
/// where it is not mapped).
#[derive(Debug)]
pub struct VulkanBlock {
    memory: vk::DeviceMemory,
    buffer: vk::Buffer,
    host: Option<usize>,
}

/// Where a range lies: the block's buffer, the offset in it, and the
/// host's address of its first byte (`None` where it is not mapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VulkanAddress {
    pub(super) buffer: vk::Buffer,
    pub(super) offset: u64,
    pub(super) host: Option<usize>,
}

/// The usages every block's buffer has: a kernel's storage buffer, and
/// either end of a copy.
const USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// `create` shared by the queue `families` that use it.
///
/// A block's ranges go to whichever queue a program asks for, compute or
/// copy, and hwqueue records no queue-family ownership transfers (a
/// release on one queue and an acquire on the other, for every use that
/// changes family). Where the two are one family, `EXCLUSIVE` is
/// exact; where a device has a transfer-only family (NVIDIA, AMD), an
/// `EXCLUSIVE` buffer written by one family and read by the other would
/// hold undefined contents, so the buffer is `CONCURRENT` over both, as
/// the spec allows for buffers used by several families without
/// transfers.
fn sharing<'a>(create: vk::BufferCreateInfo<'a>, families: &'a [u32]) -> vk::BufferCreateInfo<'a> {
    if families.len() > 1 {
        create
            .sharing_mode(vk::SharingMode::CONCURRENT)
            .queue_family_indices(families)
    } else {
        create.sharing_mode(vk::SharingMode::EXCLUSIVE)
    }
}

/// Makes a buffer of `size` bytes of memory type `memory_type`, bound,
/// and mapped where `map` says.
pub(super) fn make_buffer(
    context: &Context,
    size: usize,
    memory_type: u32,
    map: bool,
) -> std::result::Result<VulkanBlock, (String, vk::Result)> {
    let device = &context.device;
    let (families, used) = context.families();
    let create = sharing(
        vk::BufferCreateInfo::default()
            .size(size as u64)
            .usage(USAGE),
        &families[..used],
    );
    // SAFETY: `create` lives across the call; what is made here is
    // destroyed below on failure or by `free_buffer`.
    unsafe {
        let buffer = device
            .create_buffer(&create, None)
            .map_err(|e| ("vkCreateBuffer".into(), e))?;
        let needs = device.get_buffer_memory_requirements(buffer);
        if needs.memory_type_bits & (1 << memory_type) == 0 {
            device.destroy_buffer(buffer, None);
            return Err((
                "vkGetBufferMemoryRequirements".into(),
                vk::Result::ERROR_FORMAT_NOT_SUPPORTED,
            ));
        }
        let allocate = vk::MemoryAllocateInfo::default()
            .allocation_size(needs.size)
            .memory_type_index(memory_type);
        let memory = match device.allocate_memory(&allocate, None) {
            Ok(memory) => memory,
            Err(e) => {
                device.destroy_buffer(buffer, None);
                return Err((format!("vkAllocateMemory of {} bytes", needs.size), e));
            }
        };
        let mapped = device.bind_buffer_memory(buffer, memory, 0).and_then(|()| {
            if !map {
                return Ok(None);
            }
            device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .map(|host| Some(host as usize))
        });
        match mapped {
            Ok(host) => Ok(VulkanBlock {
                memory,
                buffer,
                host,
            }),
            Err(e) => {
                device.destroy_buffer(buffer, None);
                device.free_memory(memory, None);
                Err(("vkBindBufferMemory / vkMapMemory".into(), e))
            }
        }
    }
}

/// Destroys what [`make_buffer`] made.
pub(super) fn free_buffer(context: &Context, block: &VulkanBlock) {
    // SAFETY: nothing uses the block any more (the pool frees a block with
    // no range handed out; a staging buffer goes once its batch completed).
    unsafe {
        context.device.destroy_buffer(block.buffer, None);
        context.device.free_memory(block.memory, None);
    }
}

impl VulkanBlock {
    pub(super) fn buffer(&self) -> vk::Buffer {
        self.buffer
    }
}

impl BlockSource for VulkanBlocks {
    type Block = VulkanBlock;
    type Address = VulkanAddress;

    const ALIGNMENT: usize = VULKAN_ALIGNMENT;
    /// `vkAllocateMemory` promises nothing of the contents.
    const ZEROED_BLOCKS: bool = false;

    fn device(&self) -> String {
        self.context.spec.clone()
    }

    fn allocate(&self, size: usize) -> std::result::Result<VulkanBlock, BlockError> {
        make_buffer(&self.context, size, self.memory_type, self.mapped).map_err(|(call, result)| {
            match result {
                vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                    BlockError::OutOfMemory(format!("{call} returned {result:?}"))
                }
                other => BlockError::Other(self.context.error(&call, other)),
            }
        })
    }

    fn address(&self, block: &VulkanBlock, offset: usize) -> VulkanAddress {
        VulkanAddress {
            buffer: block.buffer,
            offset: offset as u64,
            host: block.host.map(|host| host + offset),
        }
    }

    fn free(&self, block: VulkanBlock) {
        free_buffer(&self.context, &block);
    }

    unsafe fn zero(&self, address: VulkanAddress, len: usize) -> Result<(), ZeroError> {
        if let Some(host) = address.host {
            // SAFETY: the caller hands a range of a live block, mapped for
            // the host, that nothing else touches now.
            unsafe { std::ptr::write_bytes(host as *mut u8, 0, len) };
            return Ok(());
        }
        // A range's bytes run to the next multiple of the alignment (256),
        // so a fill rounded up to a word stays in it.
        let size = len.next_multiple_of(4) as u64;
        self.context.run_once(
            "zeroing new memory the host cannot map",
            |device, command| {
                // SAFETY: the range lies in a live buffer; offset (a multiple
                // of the alignment) and size are multiples of 4.
                unsafe { device.cmd_fill_buffer(command, address.buffer, address.offset, size, 0) };
            },
        )?;
        Ok(())
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        let heap = super::staged::heap_of(&self.context.physical.memory, self.memory_type);
        // Vulkan 1.2 core has no query of what is free (that is
        // VK_EXT_memory_budget): the heap's size stands for both.
        Some(DeviceMemory {
            free: heap.size,
            total: heap.size,
        })
    }
}

/// Memory of a Vulkan device: an [`Allocation`] of its pool, a range of a
/// block's `VkBuffer`, mapped for the host where the device allows. Clones name the same memory;
/// the range goes back to the pool when the last clone is dropped (queues
/// hold one for every batch that uses it until the batch completed), or
/// when a `dealloca` of it ran and no batch still uses it.
///
/// `read_at` and `write_at` go through the host mapping where the memory
/// is mapped, and otherwise through a staging range and a device copy,
/// submitted and waited for (`super::staged`): like any host access, they race with work
/// a queue runs on the same bytes unless ordered after it (wait for its
/// signal first).
#[derive(Clone, Debug)]
pub struct VulkanBuffer {
    allocation: Allocation<VulkanBlocks>,
}

impl VulkanBuffer {
    pub(super) fn allocate(
        pool: &MemoryPool<VulkanBlocks>,
        size: usize,
        zeroed: bool,
        ordered: bool,
    ) -> Result<Self> {
        Ok(Self {
            allocation: Allocation::tagged(pool, size, zeroed, ordered, ())?,
        })
    }

    pub(super) fn is_of(&self, pool: &MemoryPool<VulkanBlocks>) -> bool {
        self.allocation.is_of(pool)
    }

    /// The device, as errors name it.
    pub(super) fn device(&self) -> String {
        self.allocation.pool().source().context.spec.clone()
    }

    /// Where the buffer lies, for a command (`None` when empty).
    pub(super) fn queue_address(&self) -> Result<Option<VulkanAddress>> {
        let access = self
            .allocation
            .read(Access::Queue, || "a Vulkan buffer".into())?;
        Ok(access.address())
    }

    /// Writes `bytes` at `offset` through the mapping, as a queue's host
    /// copy in queue order (an upload where the memory is mapped):
    /// checked like a command's access, not the host's.
    pub(super) fn queue_write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.write_bytes(Access::Queue, offset, bytes)
    }

    /// Reads into `out` from `offset` through the mapping, as a queue's
    /// host copy in queue order (a download where the memory is
    /// mapped).
    pub(super) fn queue_read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.read_bytes(Access::Queue, offset, out)
    }

    fn write_bytes(&self, by: Access, offset: usize, bytes: &[u8]) -> Result<()> {
        check_host_access(offset, bytes.len(), self.size())?;
        if bytes.is_empty() {
            return Ok(());
        }
        // Held until the copy is done: no `dealloca` returns the range
        // under it (a staged copy waits for the device).
        let access = self.allocation.write(by, || "the buffer written".into())?;
        self.host_copy(access.address(), offset, Staged::Write(bytes))
    }

    fn read_bytes(&self, by: Access, offset: usize, out: &mut [u8]) -> Result<()> {
        check_host_access(offset, out.len(), self.size())?;
        if out.is_empty() {
            return Ok(());
        }
        // Held until the copy is done, as in `write_bytes`.
        let access = self.allocation.read(by, || "the buffer read".into())?;
        self.host_copy(access.address(), offset, Staged::Read(out))
    }

    /// The host's copy of `data` at `offset` of the range at `address`
    /// (checked to fit, and held): through the mapping, or staged.
    fn host_copy(
        &self,
        address: Option<VulkanAddress>,
        offset: usize,
        data: Staged<'_>,
    ) -> Result<()> {
        let address = address.expect("a range of more than 0 bytes has an address");
        let Some(host) = address.host else {
            return self.staged(address, offset, data);
        };
        let at = (host + offset) as *mut u8;
        // SAFETY: `offset + len <= size` was checked and the range is held,
        // so `at` points at `len` mapped bytes of ours; caller memory
        // cannot overlap the mapping.
        unsafe {
            match data {
                Staged::Write(bytes) => {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len())
                }
                Staged::Read(out) => std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len()),
            }
        }
        Ok(())
    }

    /// A host read or write of memory the host cannot map: through a
    /// staging range, a chunk at a time, each a device copy submitted and
    /// waited for.
    fn staged(&self, address: VulkanAddress, offset: usize, mut data: Staged<'_>) -> Result<()> {
        let blocks = self.allocation.pool().source();
        let len = data.len();
        let chunk = len.min(STAGING_CHUNK);
        let staging = Self::allocate(blocks.staging_pool(), chunk, false, false)?;
        let near = staging
            .queue_address()?
            .expect("a range of more than 0 bytes has an address");
        let near = (near.buffer, near.offset);
        for start in (0..len).step_by(chunk) {
            let size = chunk.min(len - start);
            let far = (address.buffer, address.offset + (offset + start) as u64);
            let ((from, src_offset), (to, dst_offset), what) = match &data {
                Staged::Write(bytes) => {
                    staging.write_at(0, &bytes[start..start + size])?;
                    (near, far, "a host write of memory the host cannot map")
                }
                Staged::Read(_) => (far, near, "a host read of memory the host cannot map"),
            };
            let region = vk::BufferCopy {
                src_offset,
                dst_offset,
                size: size as u64,
            };
            let copied = blocks.context.run_once(what, |device, command| {
                // SAFETY: both ranges lie in live buffers held here (the
                // checked range of this buffer, the staging range).
                unsafe { device.cmd_copy_buffer(command, from, to, &[region]) };
            });
            if let Err(error) = copied {
                // The copy may still run: its staging range never returns.
                std::mem::forget(staging);
                return Err(error);
            }
            if let Staged::Read(out) = &mut data {
                staging.read_at(0, &mut out[start..start + size])?;
            }
        }
        Ok(())
    }
}

/// The host's side of a host copy.
enum Staged<'a> {
    Write(&'a [u8]),
    Read(&'a mut [u8]),
}

impl Staged<'_> {
    fn len(&self) -> usize {
        match self {
            Staged::Write(bytes) => bytes.len(),
            Staged::Read(out) => out.len(),
        }
    }
}

impl Buffer for VulkanBuffer {
    type Backend = Vulkan;

    fn size(&self) -> usize {
        self.allocation.size()
    }

    fn same_as(&self, other: &Self) -> bool {
        self.allocation.same_as(&other.allocation)
    }

    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
        self.write_bytes(Access::Host, offset, bytes_of(data))
    }

    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
        self.read_bytes(Access::Host, offset, bytes_of_mut(data))
    }

    fn queue_write_at(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.write_bytes(Access::Queue, offset, bytes)
    }

    fn queue_read_at(&self, offset: usize, bytes: &mut [u8]) -> Result<()> {
        self.read_bytes(Access::Queue, offset, bytes)
    }

    fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.allocation.queue_ordered()
    }

    fn give_back(&self) {
        self.allocation.give_back();
    }
}

/// An error for a buffer of another device.
pub(super) fn mismatch(what: &'static str, buffer: &VulkanBuffer, queue: &str) -> Error {
    Error::DeviceMismatch {
        what: what.into(),
        resource: format!("{} (another Vulkan device)", buffer.device()),
        queue: queue.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_concurrent_over_two_families_and_exclusive_in_one() {
        let one = [0];
        let create = sharing(vk::BufferCreateInfo::default(), &one);
        assert_eq!(create.sharing_mode, vk::SharingMode::EXCLUSIVE);
        assert_eq!(create.queue_family_index_count, 0);
        let two = [0, 2];
        let create = sharing(vk::BufferCreateInfo::default(), &two);
        assert_eq!(create.sharing_mode, vk::SharingMode::CONCURRENT);
        assert_eq!(create.queue_family_index_count, 2);
        // SAFETY: the pointer is `two`'s, which lives here.
        let indices = unsafe { std::slice::from_raw_parts(create.p_queue_family_indices, 2) };
        assert_eq!(indices, two);
    }
}
