//! `HostBlocks`: the CPU's blocks for its [`MemoryPool`](crate::memory::MemoryPool):
//! anonymous memory mappings, zeroed by the kernel.

use std::ptr::NonNull;

use crate::error::Result;
use crate::memory::{BLOCK_GRANULE, BlockError, BlockSource, DeviceMemory, ZeroError};

use super::CPU_BUFFER_ALIGN;

/// The CPU's block source: blocks are anonymous private mappings (`mmap`),
/// which read as zeros until written and go back to the kernel with
/// `munmap`; on Linux, blocks of 2 MiB and more ask for transparent huge
/// pages (`MADV_HUGEPAGE`): a first touch then maps 2 MiB at once, where 4 KiB
/// pages would fault 512 times (measured here: 4 MiB of fresh memory
/// touched once per page took 1.5 ms on 4 KiB pages, 77 µs on huge
/// pages), and a kernel sweeping a large tensor takes one TLB entry per
/// 2 MiB. A reused range is zeroed by writing zeros. (Under Miri, and off
/// Unix, blocks come from the global allocator, zeroed.)
#[derive(Debug, Default)]
pub struct HostBlocks {
    _private: (),
}

/// A block of host memory.
#[derive(Debug)]
pub struct HostBlock {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: a `HostBlock` is the sole owner of its mapping; it is only an
// address and a size, handed between threads by the pool under its lock.
unsafe impl Send for HostBlock {}
// SAFETY: shared access reads the address and size only.
unsafe impl Sync for HostBlock {}

/// A host address inside a block: a pointer that keeps the block's
/// provenance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAddress(NonNull<u8>);

impl HostAddress {
    /// The pointer.
    pub fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }
}

// SAFETY: an address is plain data; whoever dereferences it answers for
// the access (the buffer, under its lock).
unsafe impl Send for HostAddress {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostAddress {}

impl HostBlocks {
    /// The CPU's block source.
    pub fn new() -> Self {
        Self::default()
    }
}

impl BlockSource for HostBlocks {
    type Block = HostBlock;
    type Address = HostAddress;

    const ALIGNMENT: usize = CPU_BUFFER_ALIGN;
    const ZEROED_BLOCKS: bool = true;

    fn device(&self) -> String {
        "cpu:0".into()
    }

    /// The page size: a mapping takes whole pages.
    fn granularity(&self) -> usize {
        page_size()
    }

    fn allocate(&self, size: usize) -> std::result::Result<HostBlock, BlockError> {
        // SAFETY: `size` is non-zero (a multiple of the alignment, at least
        // one unit: the pool never asks for an empty block).
        let ptr = unsafe { map(size) }.map_err(BlockError::OutOfMemory)?;
        Ok(HostBlock { ptr, size })
    }

    fn address(&self, block: &HostBlock, offset: usize) -> HostAddress {
        debug_assert!(offset < block.size);
        // SAFETY: the pool asks only for offsets inside the block, so the
        // result stays in the mapping (and is not null).
        HostAddress(unsafe { block.ptr.add(offset) })
    }

    fn free(&self, block: HostBlock) {
        // SAFETY: the block came from `map` with this size, and the pool
        // frees it once, when no range of it is handed out.
        unsafe { unmap(block.ptr, block.size) };
    }

    /// Writes zeros, rather than `madvise(MADV_DONTNEED)`: measured by hand
    /// on this project's machines (a VM), a first touch of a page handed
    /// back costs about 1.5 µs, a write of its 4 KiB of zeros about 30 ns,
    /// so writing wins at every size once the memory is used.
    unsafe fn zero(&self, address: HostAddress, len: usize) -> Result<(), ZeroError> {
        // SAFETY: the caller guarantees the bytes lie in a live block and are
        // nobody else's during the call.
        unsafe { address.0.as_ptr().write_bytes(0, len) };
        Ok(())
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        let [free, total] = meminfo(["MemAvailable:", "MemTotal:"])?;
        Some(DeviceMemory { free, total })
    }
}

/// The `/proc/meminfo` fields `names` (with their colons), in bytes, where
/// the file has them all.
pub(super) fn meminfo<const N: usize>(names: [&str; N]) -> Option<[u64; N]> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|line| line.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    let mut values = [0; N];
    for (value, name) in values.iter_mut().zip(names) {
        *value = field(name)?;
    }
    Some(values)
}

/// The system's page size, what a mapping is rounded up to.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(os::page_size)
}

#[cfg(all(unix, not(miri)))]
mod os {
    use std::ptr::NonNull;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    use super::BLOCK_GRANULE;

    /// The page size (`sysconf(_SC_PAGESIZE)`; 4 KiB where it says
    /// nothing).
    pub(super) fn page_size() -> usize {
        // SAFETY: `sysconf` only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page)
            .ok()
            .filter(|page| page.is_power_of_two())
            .unwrap_or(4096)
    }

    /// Maps `size` bytes of zeroed memory.
    ///
    /// # Safety
    /// `size` is not zero.
    pub(super) unsafe fn map(size: usize) -> Result<NonNull<u8>, String> {
        // SAFETY: an anonymous private mapping at an address the kernel
        // picks touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {size} bytes failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Transparent huge pages are Linux's (and Android's, whose kernel
        // it is): `MADV_HUGEPAGE` is not in other Unixes' `libc` (macOS,
        // the BSDs), where a block is a plain mapping.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if size >= BLOCK_GRANULE {
            // A hint: where transparent huge pages are off, nothing changes.
            // SAFETY: the range is the mapping just made.
            unsafe { libc::madvise(ptr, size, libc::MADV_HUGEPAGE) };
        }
        NonNull::new(ptr.cast::<u8>()).ok_or_else(|| "mmap returned a null mapping".to_owned())
    }

    /// Unmaps a block.
    ///
    /// # Safety
    /// `ptr` and `size` are a mapping `map` made, not yet unmapped, and
    /// nothing uses its memory any more.
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, size: usize) {
        // SAFETY: as the caller guarantees. A failure (only possible for
        // arguments that are not a mapping) would leave the memory mapped:
        // a leak, never an unsafety.
        unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
    }
}

#[cfg(not(all(unix, not(miri))))]
mod os {
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::ptr::NonNull;

    const BLOCK_ALIGN: usize = 4096;

    /// The allocator's unit for blocks: they are aligned to it.
    pub(super) fn page_size() -> usize {
        BLOCK_ALIGN
    }

    /// Allocates `size` zeroed bytes.
    ///
    /// # Safety
    /// `size` is not zero.
    pub(super) unsafe fn map(size: usize) -> Result<NonNull<u8>, String> {
        let layout = Layout::from_size_align(size, BLOCK_ALIGN)
            .map_err(|_| format!("{size} bytes is too large for this address space"))?;
        // SAFETY: `layout` is not empty (the caller's guarantee).
        let ptr = unsafe { alloc_zeroed(layout) };
        NonNull::new(ptr).ok_or_else(|| format!("the allocator refused {size} bytes"))
    }

    /// Frees a block.
    ///
    /// # Safety
    /// `ptr` and `size` come from `map`, not yet freed.
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, size: usize) {
        // SAFETY: as the caller guarantees; the layout is `map`'s.
        unsafe {
            dealloc(
                ptr.as_ptr(),
                Layout::from_size_align_unchecked(size, BLOCK_ALIGN),
            )
        };
    }
}

use os::{map, unmap};

const _: () = assert!(BLOCK_GRANULE.is_multiple_of(CPU_BUFFER_ALIGN));
