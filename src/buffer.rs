//! Device memory and the plain-old-data types that move through it.

use crate::backend::Backend;
use crate::error::Result;

/// Types that are any bit pattern and have no padding: safe to copy to and
/// from raw bytes.
///
/// # Safety
/// An implementor must be `Copy`, contain no padding bytes, no pointers or
/// references, and every bit pattern of its size must be a valid value.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! impl_pod {
    ($($t:ty),*) => {
        $(
            // SAFETY: a primitive number: no padding, every bit pattern valid.
            unsafe impl Pod for $t {}
        )*
    };
}
impl_pod!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);

// SAFETY: an array of `Pod` has no padding between elements and every bit
// pattern of each element is valid.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// Views a `Pod` slice as bytes.
pub fn bytes_of<T: Pod>(data: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so every byte of the slice is
    // initialised; the length is the slice's size in bytes, and `u8` has
    // alignment 1.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// Views a mutable `Pod` slice as bytes.
pub fn bytes_of_mut<T: Pod>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; moreover any bytes written are a valid `T`
    // because every bit pattern of a `Pod` is valid.
    unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    }
}

/// A handle to device memory. Clones name the same memory.
///
/// Host access is synchronous and memory-safe on every backend: it returns
/// once its bytes moved, and no interleaving with queue work is undefined
/// behaviour on the host. Whether it is *ordered* with queue work is the
/// backend's: the CPU backend locks the buffer, so a host read or write
/// waits for a kernel holding it and never sees it half done; CUDA copies
/// through the driver on a stream of its own, unordered with the queues,
/// so a host access racing a kernel on the same bytes gets unspecified
/// bytes. Portable code orders host access with signals (upload, then let
/// a queue `wait` on a value the host sets; `wait` on a queue's signal,
/// then download).
pub trait Buffer: Clone + Send + Sync + 'static {
    /// The backend owning this memory.
    type Backend: Backend<Buffer = Self>;

    /// Size in bytes.
    fn size(&self) -> usize;

    /// Whether two handles name the same memory.
    fn same_as(&self, other: &Self) -> bool;

    /// Copies `data` into the buffer at byte `offset`.
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`](crate::Error::HostAccessOutOfBounds)
    /// when it does not fit (nothing is written then).
    fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()>;

    /// Copies from byte `offset` of the buffer into `data`.
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`](crate::Error::HostAccessOutOfBounds)
    /// when it does not fit (nothing is read then).
    fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()>;

    /// Copies `data` to the start of the buffer.
    ///
    /// # Errors
    /// As [`write_at`](Self::write_at).
    fn write_from<T: Pod>(&self, data: &[T]) -> Result<()> {
        self.write_at(0, data)
    }

    /// Copies the start of the buffer into `data`.
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    fn read_into<T: Pod>(&self, data: &mut [T]) -> Result<()> {
        self.read_at(0, data)
    }

    /// Reads the whole buffer as `T`s (its size must be a multiple of
    /// `size_of::<T>()`; a trailing partial element is not read).
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    fn to_vec<T: Pod + Default>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.size() / std::mem::size_of::<T>().max(1)];
        self.read_at(0, &mut out)?;
        Ok(out)
    }
}

/// Checks a host access of `len` bytes at `offset` against `size`.
pub(crate) fn check_host_access(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(crate::Error::HostAccessOutOfBounds { offset, len, size }),
    }
}
