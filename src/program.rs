//! Loaded kernels and their scalar arguments.

use crate::backend::Backend;

/// A handle to a loaded kernel. Clones name the same kernel.
pub trait Program: Clone + Send + Sync + 'static {
    /// The backend that runs it.
    type Backend: Backend<Program = Self>;

    /// The kernel's name and the arguments it takes.
    fn signature(&self) -> &KernelSignature;

    /// The kernel's name, used in errors and plans.
    fn name(&self) -> &str {
        &self.signature().name
    }

    /// How many buffer arguments the kernel takes; an `exec` passing
    /// another number is rejected at `submit`.
    fn buffer_count(&self) -> usize {
        self.signature().buffers
    }

    /// How many scalar arguments the kernel takes; an `exec` passing
    /// another number is rejected at `submit`.
    fn scalar_count(&self) -> usize {
        self.signature().scalars
    }

    /// Whether `other` is a clone of this handle, the same loaded kernel.
    /// A queue records an `exec` of the kernel the last `exec` ran, on the
    /// same views, scalar types and work sizes, without checking any of it
    /// again. `false`, the default, only means every `exec` is checked.
    fn same_as(&self, other: &Self) -> bool {
        let _ = other;
        false
    }
}

/// What every backend knows of a kernel it loaded: its name, and how many
/// buffer and scalar arguments it takes (buffers first, then scalars).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSignature {
    /// The kernel's name, used in errors and plans.
    pub name: String,
    /// How many buffer arguments it takes.
    pub buffers: usize,
    /// How many scalar arguments it takes.
    pub scalars: usize,
}

impl KernelSignature {
    /// The signature of kernel `name` taking `buffers` buffers, then
    /// `scalars` scalars.
    pub fn new(name: impl Into<String>, buffers: usize, scalars: usize) -> Self {
        Self {
            name: name.into(),
            buffers,
            scalars,
        }
    }
}

/// A scalar kernel argument, passed by value.
///
/// Buffers and scalars are separate lists: a kernel's parameters are its
/// buffers in order, then its scalars in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `uint32_t`.
    U32(u32),
    /// `int32_t`.
    I32(i32),
    /// `uint64_t`.
    U64(u64),
    /// `int64_t`.
    I64(i64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// `__half` / `_Float16` (the `half` feature): 2 bytes.
    #[cfg(feature = "half")]
    F16(half::f16),
    /// `__nv_bfloat16` / `__bf16` (the `half` feature): 2 bytes.
    #[cfg(feature = "half")]
    BF16(half::bf16),
}

impl Scalar {
    /// The type's name, for errors.
    pub const fn type_name(&self) -> &'static str {
        match self {
            Scalar::U32(_) => "u32",
            Scalar::I32(_) => "i32",
            Scalar::U64(_) => "u64",
            Scalar::I64(_) => "i64",
            Scalar::F32(_) => "f32",
            Scalar::F64(_) => "f64",
            #[cfg(feature = "half")]
            Scalar::F16(_) => "f16",
            #[cfg(feature = "half")]
            Scalar::BF16(_) => "bf16",
        }
    }

    /// The value's native-endian bytes (and how many are used), as a kernel parameter buffer holds them.
    pub fn to_ne_bytes(&self) -> ([u8; 8], usize) {
        let mut out = [0u8; 8];
        let len = match *self {
            Scalar::U32(v) => put(&mut out, &v.to_ne_bytes()),
            Scalar::I32(v) => put(&mut out, &v.to_ne_bytes()),
            Scalar::U64(v) => put(&mut out, &v.to_ne_bytes()),
            Scalar::I64(v) => put(&mut out, &v.to_ne_bytes()),
            Scalar::F32(v) => put(&mut out, &v.to_ne_bytes()),
            Scalar::F64(v) => put(&mut out, &v.to_ne_bytes()),
            #[cfg(feature = "half")]
            Scalar::F16(v) => put(&mut out, &v.to_ne_bytes()),
            #[cfg(feature = "half")]
            Scalar::BF16(v) => put(&mut out, &v.to_ne_bytes()),
        };
        (out, len)
    }
}

fn put(out: &mut [u8; 8], bytes: &[u8]) -> usize {
    out[..bytes.len()].copy_from_slice(bytes);
    bytes.len()
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident),*) => {
        $(
            impl From<$t> for Scalar {
                fn from(value: $t) -> Self {
                    Scalar::$v(value)
                }
            }
        )*
    };
}
scalar_from!(u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);
#[cfg(feature = "half")]
scalar_from!(half::f16 => F16, half::bf16 => BF16);
