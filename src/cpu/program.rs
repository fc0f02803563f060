//! `CpuProgram`: a kernel the CPU runs once per work-group of the grid.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use crate::buffer::Pod;
use crate::program::{Program, Scalar};
use crate::sync::Arc;

use super::Cpu;

/// The signature of a CPU kernel written in Rust: called once per work-group,
/// possibly on several threads at once, with the group's coordinates and the
/// `exec`'s arguments. The kernel loops over its work-items itself.
///
/// A kernel that panics fails its batch with the panic message; the panic
/// does not escape the queue.
pub type CpuKernelFn = fn(&WorkGroup, &KernelArgs<'_>);

/// A kernel for the CPU backend. Clones name the same kernel.
#[derive(Clone)]
pub struct CpuProgram {
    inner: Arc<ProgramInner>,
}

struct ProgramInner {
    name: String,
    buffers: usize,
    scalars: usize,
    kernel: Kernel,
}

/// How a program runs. Kernels compiled from C source join as a variant.
#[derive(Clone, Copy)]
enum Kernel {
    Rust(CpuKernelFn),
}

impl CpuProgram {
    /// A kernel from a Rust function taking `buffers` buffer arguments and
    /// `scalars` scalar arguments; an `exec` with other counts is rejected at
    /// `submit`.
    pub fn from_fn(
        name: impl Into<String>,
        buffers: usize,
        scalars: usize,
        kernel: CpuKernelFn,
    ) -> Self {
        Self {
            inner: Arc::new(ProgramInner {
                name: name.into(),
                buffers,
                scalars,
                kernel: Kernel::Rust(kernel),
            }),
        }
    }

    /// How many buffer arguments the kernel takes.
    pub fn buffer_count(&self) -> usize {
        self.inner.buffers
    }

    /// How many scalar arguments the kernel takes.
    pub fn scalar_count(&self) -> usize {
        self.inner.scalars
    }

    /// Runs one work-group.
    #[inline]
    pub(crate) fn run_group(&self, group: &WorkGroup, args: &KernelArgs<'_>) {
        match self.inner.kernel {
            Kernel::Rust(kernel) => kernel(group, args),
        }
    }
}

impl Program for CpuProgram {
    type Backend = Cpu;

    fn name(&self) -> &str {
        &self.inner.name
    }
}

impl fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuProgram")
            .field("name", &self.inner.name)
            .field("buffers", &self.inner.buffers)
            .field("scalars", &self.inner.scalars)
            .finish()
    }
}

/// One work-group of an `exec`'s grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkGroup {
    pub(crate) id: [u32; 3],
    pub(crate) groups: [u32; 3],
    pub(crate) local: [u32; 3],
}

impl WorkGroup {
    /// This group's coordinates in the grid (`blockIdx`).
    pub fn id(&self) -> [u32; 3] {
        self.id
    }

    /// The grid's size in work-groups (`gridDim`).
    pub fn groups(&self) -> [u32; 3] {
        self.groups
    }

    /// Work-items per group and dimension (`blockDim`).
    pub fn local_size(&self) -> [u32; 3] {
        self.local
    }

    /// The global size per dimension.
    pub fn global_size(&self) -> [usize; 3] {
        [0, 1, 2].map(|d| self.groups[d] as usize * self.local[d] as usize)
    }

    /// The global indices this group covers along dimension `axis` (0..3):
    /// `id * local .. (id + 1) * local`.
    pub fn global_range(&self, axis: usize) -> Range<usize> {
        let start = self.id[axis] as usize * self.local[axis] as usize;
        start..start + self.local[axis] as usize
    }

    /// The group's index in x-fastest order.
    pub fn linear_id(&self) -> usize {
        let [x, y, z] = self.id.map(|v| v as usize);
        let [gx, gy, _] = self.groups.map(|v| v as usize);
        x + gx * (y + gy * z)
    }
}

/// The arguments of one `exec`, as a kernel sees them.
#[derive(Debug)]
pub struct KernelArgs<'a> {
    pub(crate) program: &'a str,
    pub(crate) buffers: &'a [BufferView<'a>],
    pub(crate) scalars: &'a [Scalar],
}

impl<'a> KernelArgs<'a> {
    /// Buffer argument `index`.
    ///
    /// # Panics
    /// If there is no such argument (the counts were checked against the
    /// program's at `submit`, so this is a bug in the kernel; the panic fails
    /// the batch with this message).
    pub fn buffer(&self, index: usize) -> BufferView<'a> {
        match self.buffers.get(index) {
            Some(view) => *view,
            None => kernel_misuse(
                self.program,
                format!(
                    "has no buffer argument {index} ({} given)",
                    self.buffers.len()
                ),
            ),
        }
    }

    /// Scalar argument `index`, converted to `T`.
    ///
    /// # Panics
    /// If there is no such argument or it has another type (fails the batch).
    pub fn scalar<T: FromScalar>(&self, index: usize) -> T {
        match self.scalars.get(index) {
            Some(scalar) => T::from_scalar(*scalar).unwrap_or_else(|| {
                kernel_misuse(
                    self.program,
                    format!(
                        "scalar argument {index} is {}, not {}",
                        scalar.type_name(),
                        T::NAME
                    ),
                )
            }),
            None => kernel_misuse(
                self.program,
                format!(
                    "has no scalar argument {index} ({} given)",
                    self.scalars.len()
                ),
            ),
        }
    }

    /// How many buffer arguments there are.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// How many scalar arguments there are.
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }
}

#[cold]
#[inline(never)]
fn kernel_misuse(program: &str, what: String) -> ! {
    panic!("kernel `{program}` {what}")
}

/// Scalar types a kernel can read from a [`Scalar`].
pub trait FromScalar: Sized {
    /// The type's name, for errors.
    const NAME: &'static str;
    /// The value, when `scalar` holds this type.
    fn from_scalar(scalar: Scalar) -> Option<Self>;
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),*) => {
        $(
            impl FromScalar for $t {
                const NAME: &'static str = stringify!($t);
                fn from_scalar(scalar: Scalar) -> Option<Self> {
                    match scalar {
                        Scalar::$v(value) => Some(value),
                        _ => None,
                    }
                }
            }
        )*
    };
}
from_scalar!(u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

/// A kernel's view of one buffer argument: raw memory, shared by every
/// work-group of the `exec`.
///
/// The queue holds the buffer exclusively while the kernel runs, so nothing
/// outside the `exec` touches it. Inside, the work-groups run concurrently,
/// exactly as on a GPU: the kernel must not let two groups race on the same
/// bytes. That is the contract of the `unsafe` accessors below.
///
/// The lifetime `'a` is the kernel call's: slices from a view cannot outlive
/// the `exec`.
#[derive(Debug, Clone, Copy)]
pub struct BufferView<'a> {
    ptr: *mut u8,
    size: usize,
    _exec: PhantomData<&'a [u8]>,
}

// SAFETY: a `BufferView` is an address and a length; the memory it names is
// held exclusively by the running `exec` (see above), and every access through
// it is an `unsafe` call whose contract excludes data races.
unsafe impl Send for BufferView<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for BufferView<'_> {}

impl<'a> BufferView<'a> {
    /// A view of `size` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `size` bytes, aligned to
    /// [`CPU_BUFFER_ALIGN`](super::CPU_BUFFER_ALIGN), initialised, and held
    /// for the kernel's exclusive use for `'a`.
    pub(crate) unsafe fn new(ptr: *mut u8, size: usize) -> Self {
        Self {
            ptr,
            size,
            _exec: PhantomData,
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// How many whole `T`s fit.
    pub fn len<T: Pod>(&self) -> usize {
        self.size / std::mem::size_of::<T>().max(1)
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The start of the memory (64-byte aligned).
    pub fn as_ptr<T: Pod>(&self) -> *mut T {
        self.ptr.cast()
    }

    /// The whole buffer as `T`s, to read.
    ///
    /// # Safety
    /// No work-group of this `exec` writes any of these elements while the
    /// returned slice is alive.
    pub unsafe fn as_slice<T: Pod>(&self) -> &'a [T] {
        check_align::<T>();
        // SAFETY: the memory is `size` bytes, 64-aligned (so aligned for `T`,
        // checked above), initialised (zeroed at allocation), and any bits are
        // a valid `T: Pod`; the caller promises no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), self.len::<T>()) }
    }

    /// Elements `range` of the buffer as `T`s, to read and write.
    ///
    /// # Safety
    /// No other work-group of this `exec` reads or writes any of these
    /// elements while the returned slice is alive, and this group makes no
    /// other reference to them.
    ///
    /// # Panics
    /// If `range` is past the buffer's end (fails the batch).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T: Pod>(&self, range: Range<usize>) -> &'a mut [T] {
        check_align::<T>();
        if range.start > range.end || range.end > self.len::<T>() {
            out_of_bounds(range, self.len::<T>());
        }
        // SAFETY: `range` lies within the buffer (checked above), aligned for
        // `T` (checked), valid for any bits (`Pod`); the caller promises
        // exclusive access to these elements.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.cast::<T>().add(range.start), range.len())
        }
    }
}

fn check_align<T>() {
    if std::mem::align_of::<T>() > super::CPU_BUFFER_ALIGN {
        misaligned::<T>();
    }
}

#[cold]
#[inline(never)]
fn misaligned<T>() -> ! {
    panic!(
        "type {} needs alignment {} but CPU buffers are aligned to {}",
        std::any::type_name::<T>(),
        std::mem::align_of::<T>(),
        super::CPU_BUFFER_ALIGN
    )
}

#[cold]
#[inline(never)]
fn out_of_bounds(range: Range<usize>, len: usize) -> ! {
    panic!("buffer access {range:?} is out of bounds: the buffer holds {len} elements")
}
