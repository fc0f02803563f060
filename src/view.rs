//! Views: a byte range of a buffer, usable wherever a buffer is.
//!
//! A compiler's runtime places many tensors in one allocation (an arena)
//! and launches kernels on sub-ranges of it. A [`View`] names such a range:
//! a buffer handle, a byte offset and a length. Queues take views as `exec`
//! arguments ([`exec_views`](crate::HardwareQueue::exec_views)), as copy
//! sources and destinations, and for fills, uploads and downloads; the
//! host reads and writes through them; the executor orders work by the
//! bytes each view covers, so two kernels writing disjoint views of one
//! arena need no wait between them.
//!
//! ```
//! use hwqueue::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
//! use hwqueue::{Buffer, Device, Download, ExecParams, HardwareQueue, QueueFactory, Timeout};
//!
//! fn double(group: &WorkGroup, args: &KernelArgs<'_>) {
//!     // SAFETY: each work-group touches only its own range.
//!     for x in unsafe { args.buffer(0).slice_mut::<f32>(group.global_range(0)) } {
//!         *x *= 2.0;
//!     }
//! }
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = CpuDevice::new();
//! let program = CpuProgram::from_fn("double", 1, 0, double);
//! let mut queue = device.compute_queue()?;
//!
//! let arena = device.alloc(64 << 10)?;                   // one allocation, many tensors
//! let x = arena.view(0, 4096)?;                          // a View: bytes 0..4096
//! let y = arena.view(4096, 4096)?;                       // checked against the size now
//! let out = Download::<f32>::new(1024);                  // host memory the queue fills
//!
//! queue
//!     .upload(&x, &vec![1.0f32; 1024])                   // taken now, lands in queue order
//!     .fill(&y, 0.0f32)                                  // 1-, 2- or 4-byte patterns
//!     .exec_views(&program, &[&x], &[], ExecParams::new_1d(1024, 256))
//!     .copy(&y, &x)                                      // partial copies through views
//!     .download(&y, &out)                                // read back once the batch ran
//!     .submit()?;
//! assert_eq!(out.take(Timeout::Forever)?, vec![2.0f32; 1024]);
//! # Ok(())
//! # }
//! ```
//!
//! A view is checked against its buffer's size when it is made, so a view
//! that exists is in range. Where a command needs more (an `exec` argument
//! needs the offset aligned to the queue's
//! [`Limits::view_alignment`](crate::Limits::view_alignment); a `fill` the
//! pattern's width), the command checks it when it is recorded, and a bad
//! view rejects its batch.

use std::fmt;
use std::ops::Range;

use crate::backend::{Backend, BufferOf};
use crate::buffer::{Buffer, Pod, check_host_access};
use crate::error::{Error, Result};

/// A byte range of a buffer. Clones name the same memory.
pub struct View<B: Backend> {
    buffer: BufferOf<B>,
    offset: usize,
    len: usize,
}

impl<B: Backend> View<B> {
    /// The `len` bytes of `buffer` from byte `offset`.
    ///
    /// # Errors
    /// [`Error::ViewOutOfRange`] when the range does not lie in the buffer.
    pub fn new(buffer: &BufferOf<B>, offset: usize, len: usize) -> Result<Self> {
        check_range(offset, len, buffer.size())?;
        Ok(Self {
            buffer: buffer.clone(),
            offset,
            len,
        })
    }

    /// A view the caller checked (`offset + len <= buffer.size()`).
    #[inline]
    pub(crate) fn from_parts(buffer: BufferOf<B>, offset: usize, len: usize) -> Self {
        debug_assert!(offset + len <= buffer.size());
        Self {
            buffer,
            offset,
            len,
        }
    }

    /// All of `buffer`.
    pub fn whole(buffer: &BufferOf<B>) -> Self {
        Self {
            buffer: buffer.clone(),
            offset: 0,
            len: buffer.size(),
        }
    }

    /// The `len` bytes from `offset` *within this view*.
    ///
    /// # Errors
    /// [`Error::ViewOutOfRange`] when the range does not lie in this view
    /// (the error names the view's length as the size).
    pub fn view(&self, offset: usize, len: usize) -> Result<Self> {
        check_range(offset, len, self.len)?;
        Ok(Self {
            buffer: self.buffer.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// The buffer this view is part of.
    pub fn buffer(&self) -> &BufferOf<B> {
        &self.buffer
    }

    /// The first byte, as an offset in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view covers no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of the buffer this view covers.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }

    /// Whether the two views share a byte (empty views share none).
    pub fn overlaps(&self, other: &Self) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && self.buffer.same_as(&other.buffer)
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }

    /// Copies `data` into the view, from its start, now (as
    /// [`Buffer::write_at`], with its ordering rules; for a write in queue
    /// order, [`upload`](crate::HardwareQueue::upload)).
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`] when `data` is longer than the view
    /// (nothing is written then).
    pub fn write_from<T: Pod>(&self, data: &[T]) -> Result<()> {
        check_host_access(0, size_of_val(data), self.len)?;
        self.buffer.write_at(self.offset, data)
    }

    /// Copies the start of the view into `data`, now (as
    /// [`Buffer::read_at`]; for a read in queue order,
    /// [`download`](crate::HardwareQueue::download)).
    ///
    /// # Errors
    /// [`Error::HostAccessOutOfBounds`] when `data` is longer than the view
    /// (nothing is read then).
    pub fn read_into<T: Pod>(&self, data: &mut [T]) -> Result<()> {
        check_host_access(0, size_of_val(data), self.len)?;
        self.buffer.read_at(self.offset, data)
    }

    /// Reads the whole view as `T`s (a trailing partial element is not
    /// read).
    ///
    /// # Errors
    /// As [`read_into`](Self::read_into).
    pub fn to_vec<T: Pod>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len / size_of::<T>().max(1)];
        self.read_into(&mut out)?;
        Ok(out)
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::ViewOutOfRange { offset, len, size }),
    }
}

impl<B: Backend> Clone for View<B> {
    fn clone(&self) -> Self {
        Self {
            buffer: self.buffer.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl<B: Backend> fmt::Debug for View<B>
where
    BufferOf<B>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("buffer", &self.buffer)
            .field("range", &self.range())
            .finish()
    }
}

/// What a command takes where it takes memory: a whole buffer (`&buffer`)
/// or a [`View`] of one (`&view`).
pub trait AsView<B: Backend> {
    /// The buffer, the first byte and the length.
    fn view_parts(&self) -> (&BufferOf<B>, usize, usize);
}

impl<B: Backend> AsView<B> for View<B> {
    #[inline]
    fn view_parts(&self) -> (&BufferOf<B>, usize, usize) {
        (&self.buffer, self.offset, self.len)
    }
}

impl<T: Buffer> AsView<T::Backend> for T {
    #[inline]
    fn view_parts(&self) -> (&T, usize, usize) {
        (self, 0, self.size())
    }
}
