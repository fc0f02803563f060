//! `CpuProgram`: a kernel the CPU runs once per work-group of the grid,
//! written in Rust or compiled at run time from C.
//!
//! The C kernel ABI is documented on the `cpu` module, with the cache.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::path::Path;

use crate::buffer::Pod;
use crate::error::{Error, Result};
use crate::program::{KernelSignature, Program, Scalar};
use crate::sync::Arc;

use super::Cpu;
use super::c_compiler::{self, CacheOutcome, CompileOptions, CompiledLibrary};

/// The C text [`CpuProgram::from_c_source`] puts before every kernel's
/// source: the ABI's types, two index helpers, and `HWQ_KERNEL(name)`,
/// which declares an exported entry point with the ABI's signature.
///
/// After it comes `#line 1 "NAME.c"`, so the compiler's messages point at
/// the lines of the source as given, in a file named after the program.
pub const CPU_KERNEL_PRELUDE: &str = r#"/* hwqueue CPU kernel ABI, version 1: prepended to every C kernel. */
#include <stddef.h>
#include <stdint.h>

#define HWQ_ABI_VERSION 1
/* Every buffer starts at a multiple of this many bytes. */
#define HWQ_BUFFER_ALIGN 64

/* One work-group of the grid; the kernel is called once per group. */
typedef struct hwq_group {
    uint32_t id[3];     /* this group's coordinates in the grid (blockIdx) */
    uint32_t groups[3]; /* the grid's size in work-groups (gridDim) */
    uint32_t local[3];  /* work-items per group and dimension (blockDim) */
} hwq_group;

/* One scalar argument: read the member of the type the exec passed. */
typedef union hwq_scalar {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
} hwq_scalar;

_Static_assert(sizeof(hwq_group) == 36, "hwq_group is three uint32_t[3]");
_Static_assert(sizeof(hwq_scalar) == 8, "hwq_scalar is 8 bytes");

/* The first global index this group covers along `axis` (0..3): id * local. */
static inline size_t hwq_global_start(const hwq_group *group, int axis) {
    return (size_t)group->id[axis] * group->local[axis];
}

/* The global size along `axis`: groups * local. */
static inline size_t hwq_global_size(const hwq_group *group, int axis) {
    return (size_t)group->groups[axis] * group->local[axis];
}

/* Declares an entry point: HWQ_KERNEL(vadd) { ... }. */
#define HWQ_KERNEL(name)                                                \
    __attribute__((visibility("default"))) void name(                   \
        const hwq_group *group, void *const *buffers, const hwq_scalar *scalars)
"#;

/// The entry point of a C kernel, as the ABI declares it.
type CKernelFn = unsafe extern "C" fn(*const WorkGroup, *const *mut c_void, *const RawScalar);

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
    signature: KernelSignature,
    kernel: Kernel,
}

/// How a program runs.
enum Kernel {
    Rust(CpuKernelFn),
    C(CKernel),
}

/// A kernel compiled from C: its entry point, and the library holding the
/// code, kept loaded as long as the program lives.
struct CKernel {
    entry: CKernelFn,
    library: std::sync::Arc<CompiledLibrary>,
    outcome: CacheOutcome,
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
                signature: KernelSignature::new(name, buffers, scalars),
                kernel: Kernel::Rust(kernel),
            }),
        }
    }

    /// Compiles C `source` with the system C compiler (as `options` say)
    /// and loads function `entry_point` from it, a kernel taking `buffers`
    /// buffer arguments and `scalars` scalar arguments; an `exec` with other
    /// counts is rejected at `submit`. The kernel follows the
    /// [C kernel ABI](super#the-c-kernel-abi-version-1): the source may use
    /// everything [`CPU_KERNEL_PRELUDE`] declares.
    ///
    /// Libraries are cached in this process and on disk, keyed by the text,
    /// flags and compiler and checked against the headers and static
    /// libraries the compile read (see [`CompileOptions`]), so compiling the same
    /// source again costs a look-up; [`cache_outcome`](Self::cache_outcome)
    /// tells which happened.
    ///
    /// ```
    /// use hwqueue::cpu::{CompileOptions, CpuDevice, CpuProgram};
    /// use hwqueue::{Buffer, Device, ExecParams, HardwareQueue, QueueFactory, Scalar};
    ///
    /// const SCALE: &str = r"
    /// HWQ_KERNEL(scale) {
    ///     float *data = buffers[0];
    ///     size_t start = hwq_global_start(group, 0);
    ///     for (size_t i = start; i < start + group->local[0]; i++) {
    ///         data[i] *= scalars[0].f32;
    ///     }
    /// }
    /// ";
    ///
    /// # fn main() -> hwqueue::Result<()> {
    /// // SAFETY: `scale` has the ABI's signature and each group writes only
    /// // its own range of the one buffer.
    /// let program = match unsafe {
    ///     CpuProgram::from_c_source("scale", SCALE, "scale", 1, 1, &CompileOptions::default())
    /// } {
    ///     Ok(program) => program,
    /// #   Err(hwqueue::Error::NoDriver { .. }) => return Ok(()), // no C compiler here
    ///     Err(error) => return Err(error),
    /// };
    /// let device = CpuDevice::new();
    /// let buffer = device.alloc(1024 * 4)?;
    /// buffer.write_from(&vec![1.5f32; 1024])?;
    /// let mut queue = device.compute_queue()?;
    /// queue
    ///     .exec(&program, &[&buffer], &[Scalar::F32(2.0)], ExecParams::new_1d(1024, 128))
    ///     .submit()?;
    /// queue.synchronize()?;
    /// assert_eq!(buffer.to_vec::<f32>()?, vec![3.0f32; 1024]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// - [`Error::NoDriver`] when no C compiler is found (`$CC`, else `cc`,
    ///   or [`CompileOptions::compiler`]).
    /// - [`Error::Compile`] carrying the compiler's output when the source
    ///   does not compile, or the library does not load (an undefined
    ///   function).
    /// - [`Error::InvalidProgram`] when `entry_point` is not a C identifier;
    ///   [`Error::EntryPointNotFound`] when the library has no such function.
    /// - [`Error::System`] when the cache directory cannot be written.
    ///
    /// # Safety
    /// The C code runs inside this process, where Rust cannot check it. The
    /// caller promises that:
    /// - the function `entry_point` has the ABI's signature,
    ///   `void (const hwq_group *, void *const *, const hwq_scalar *)`;
    /// - called once per work-group, from several threads at once, it reads
    ///   and writes only within the `buffers` buffers passed (their sizes),
    ///   reads only the `scalars` scalars, each through the member of the
    ///   type passed, and keeps no pointer past its return;
    /// - no two work-groups of one `exec` race on the same bytes (one
    ///   writing what another reads or writes, other than through atomics),
    ///   and any state it shares across calls (globals) is thread-safe;
    /// - it does not unwind out of the call (no C++ exceptions, no
    ///   `longjmp` past it), and the library's load-time code, if any, is
    ///   sound;
    /// - it has no undefined behaviour under the C standard.
    ///
    /// A kernel breaking these breaks memory safety; a kernel that crashes
    /// takes the process down, as no panic handler can catch it.
    pub unsafe fn from_c_source(
        name: impl Into<String>,
        source: &str,
        entry_point: &str,
        buffers: usize,
        scalars: usize,
        options: &CompileOptions,
    ) -> Result<Self> {
        let name = name.into();
        if !is_c_identifier(entry_point) {
            return Err(Error::InvalidProgram {
                program: name,
                reason: format!(
                    "its entry point `{entry_point}` is not a C identifier; give the name of the \
                     C function"
                ),
            });
        }
        let text = format!(
            "{CPU_KERNEL_PRELUDE}#line 1 \"{}.c\"\n{source}",
            file_stem(&name)
        );
        let (library, outcome) = c_compiler::load_or_compile(&name, &text, options)?;
        // SAFETY: the caller promised that the function `entry_point` has the
        // ABI's signature, which `CKernelFn` spells. The pointer copied out of
        // the symbol is only called while `library`, stored beside it in the
        // program, keeps the code loaded.
        let entry = unsafe { library.library().get::<CKernelFn>(entry_point.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|e| Error::EntryPointNotFound {
                program: name.clone(),
                entry: entry_point.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(Self {
            inner: Arc::new(ProgramInner {
                signature: KernelSignature::new(name, buffers, scalars),
                kernel: Kernel::C(CKernel {
                    entry,
                    library,
                    outcome,
                }),
            }),
        })
    }

    /// For a kernel compiled from C: whether its library was compiled, loaded
    /// from the on-disk cache, or already loaded in this process. `None` for
    /// a Rust kernel.
    pub fn cache_outcome(&self) -> Option<CacheOutcome> {
        match &self.inner.kernel {
            Kernel::Rust(_) => None,
            Kernel::C(kernel) => Some(kernel.outcome),
        }
    }

    /// For a kernel compiled from C: the library file in the cache (its
    /// source lies beside it, as `.c`). `None` for a Rust kernel.
    pub fn library_path(&self) -> Option<&Path> {
        match &self.inner.kernel {
            Kernel::Rust(_) => None,
            Kernel::C(kernel) => Some(kernel.library.path()),
        }
    }

    /// Runs one work-group.
    #[inline]
    pub(crate) fn run_group(&self, group: &WorkGroup, args: &KernelArgs<'_>) {
        match &self.inner.kernel {
            Kernel::Rust(kernel) => kernel(group, args),
            Kernel::C(kernel) => {
                let native = &args.native;
                let signature = &self.inner.signature;
                if native.buffers.len() != signature.buffers
                    || native.scalars.len() != signature.scalars
                {
                    kernel_misuse(&signature.name, "was run without its C arguments".into());
                }
                // SAFETY: the caller of `from_c_source` promised that `entry`
                // has the ABI's signature and keeps its contract (bounds, no
                // races between groups, no unwinding). `kernel.library` keeps
                // the code loaded for this call. `group` is `#[repr(C)]`,
                // laid out as `hwq_group` (asserted below). `native` holds
                // exactly the program's counts (checked above) of buffer
                // pointers, each valid and held exclusively for the `exec`
                // (the invariant of the `BufferView`s they came from), and
                // 8-byte scalars; it lives in `args`, which outlives the call.
                unsafe {
                    (kernel.entry)(group, native.buffers.as_ptr(), native.scalars.as_ptr());
                }
            }
        }
    }
}

/// Whether `name` is a C identifier (so also a symbol without a NUL).
fn is_c_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The program's name as a file name for `#line` (no quotes or escapes).
fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() {
        "kernel".to_owned()
    } else {
        stem
    }
}

impl Program for CpuProgram {
    type Backend = Cpu;

    fn signature(&self) -> &KernelSignature {
        &self.inner.signature
    }

    #[inline]
    fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CpuProgram")
            .field(&self.inner.signature)
            .finish()
    }
}

/// One work-group of an `exec`'s grid.
///
/// `#[repr(C)]`: C kernels receive it as `hwq_group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct WorkGroup {
    pub(crate) id: [u32; 3],
    pub(crate) groups: [u32; 3],
    pub(crate) local: [u32; 3],
}

// The layout of `hwq_group` in `CPU_KERNEL_PRELUDE`, and its alignment.
static_assertions::assert_eq_size!(WorkGroup, [u32; 9]);
static_assertions::const_assert_eq!(std::mem::offset_of!(WorkGroup, groups), 12);
static_assertions::const_assert_eq!(std::mem::offset_of!(WorkGroup, local), 24);
static_assertions::const_assert_eq!(super::CPU_BUFFER_ALIGN, 64);

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
    /// The arrays a C kernel receives; empty for a Rust kernel.
    pub(crate) native: NativeArgs,
}

/// An `exec`'s arguments as the C ABI passes them, built once per `exec`:
/// one pointer per buffer, one `hwq_scalar` per scalar.
#[derive(Debug, Default)]
pub(crate) struct NativeArgs {
    buffers: Vec<*mut c_void>,
    scalars: Vec<RawScalar>,
}

// SAFETY: the pointers come from the `exec`'s `BufferView`s and carry their
// guarantees (memory held exclusively by the running `exec`); Rust code never
// dereferences them, and C kernels promise not to race through them.
unsafe impl Send for NativeArgs {}
// SAFETY: as for `Send`; shared access only reads the arrays.
unsafe impl Sync for NativeArgs {}

/// `hwq_scalar`: a scalar's native-endian bytes from offset 0, zero after.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
struct RawScalar([u8; 8]);

static_assertions::assert_eq_size!(RawScalar, u64);

impl<'a> KernelArgs<'a> {
    /// The arguments of one `exec` of `program`, with the C kernel's arrays
    /// when it is one.
    #[inline]
    pub(crate) fn new(
        program: &'a CpuProgram,
        buffers: &'a [BufferView<'a>],
        scalars: &'a [Scalar],
    ) -> Self {
        let native = match program.inner.kernel {
            Kernel::Rust(_) => NativeArgs::default(),
            Kernel::C(_) => NativeArgs {
                buffers: buffers.iter().map(|view| view.ptr.cast()).collect(),
                scalars: scalars
                    .iter()
                    .map(|scalar| RawScalar(scalar.to_ne_bytes().0))
                    .collect(),
            },
        };
        Self {
            program: program.name(),
            buffers,
            scalars,
            native,
        }
    }

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
#[cfg(feature = "half")]
from_scalar!(half::f16 => F16, half::bf16 => BF16);

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
    /// `ptr` is valid for reads and writes of `size` bytes, initialised,
    /// and held for the kernel's exclusive use for `'a`.
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

    /// The alignment of the memory's start: 64 bytes for a whole buffer,
    /// the largest power of two dividing its offset (up to 64) for a
    /// [`View`](crate::View), at least the queue's
    /// [`view_alignment`](crate::Limits::view_alignment).
    pub fn align(&self) -> usize {
        // The largest power of two dividing the address, at most a
        // buffer's alignment.
        (1usize << (self.ptr as usize).trailing_zeros().min(63)).min(super::CPU_BUFFER_ALIGN)
    }

    /// The start of the memory (aligned to [`align`](Self::align)).
    pub fn as_ptr<T: Pod>(&self) -> *mut T {
        self.ptr.cast()
    }

    /// The whole buffer as `T`s, to read.
    ///
    /// # Safety
    /// No work-group of this `exec` writes any of these elements while the
    /// returned slice is alive.
    pub unsafe fn as_slice<T: Pod>(&self) -> &'a [T] {
        self.check_align::<T>();
        // SAFETY: the memory is `size` bytes, aligned for `T` (checked
        // above), initialised (zeroed at allocation), and any bits are
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
        self.check_align::<T>();
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

impl BufferView<'_> {
    #[inline]
    fn check_align<T>(&self) {
        if !self.ptr.cast::<T>().is_aligned() {
            misaligned::<T>(self.align());
        }
    }
}

#[cold]
#[inline(never)]
fn misaligned<T>(align: usize) -> ! {
    panic!(
        "type {} needs alignment {} but this buffer argument is aligned to {align} (a view at \
         an offset); place the view at a multiple of {}",
        std::any::type_name::<T>(),
        std::mem::align_of::<T>(),
        std::mem::align_of::<T>(),
    )
}

#[cold]
#[inline(never)]
fn out_of_bounds(range: Range<usize>, len: usize) -> ! {
    panic!("buffer access {range:?} is out of bounds: the buffer holds {len} elements")
}
