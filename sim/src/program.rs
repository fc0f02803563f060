//! [`SimProgram`]: a simulated kernel, a Rust function over its arguments.

use std::ops::Range;
use std::sync::Arc;

use hwqueue::{ExecParams, KernelSignature, Pod, Program, Scalar};

use crate::Sim;

/// A simulated kernel: runs once per `exec`, over the whole grid, on the
/// device thread. `Err` fails the batch with [`hwqueue::Error::KernelFailed`]
/// carrying the message, as a device fault would; a panic does the same.
pub type SimKernelFn = fn(&mut KernelArgs<'_>) -> Result<(), String>;

/// A kernel for the simulator. Clones name the same kernel.
#[derive(Clone)]
pub struct SimProgram {
    inner: Arc<(KernelSignature, SimKernelFn)>,
}

impl SimProgram {
    /// Kernel `name`, taking `buffers` buffer and `scalars` scalar
    /// arguments (an `exec` with other counts is rejected at `submit`).
    pub fn new(
        name: impl Into<String>,
        buffers: usize,
        scalars: usize,
        kernel: SimKernelFn,
    ) -> Self {
        Self {
            inner: Arc::new((KernelSignature::new(name, buffers, scalars), kernel)),
        }
    }

    pub(crate) fn kernel(&self) -> SimKernelFn {
        self.inner.1
    }
}

impl std::fmt::Debug for SimProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimProgram({})", self.inner.0.name)
    }
}

impl Program for SimProgram {
    type Backend = Sim;

    fn signature(&self) -> &KernelSignature {
        &self.inner.0
    }
}

/// What a simulated kernel sees: its buffers (each the view the `exec`
/// passed, as a range of the device's memory), its scalars and its grid.
/// Buffers may alias (two views of one arena): reads and writes copy, so
/// aliasing is well defined, in argument order.
pub struct KernelArgs<'a> {
    pub(crate) memory: &'a mut [u8],
    pub(crate) buffers: &'a [Range<usize>],
    pub(crate) scalars: &'a [Scalar],
    pub(crate) params: &'a ExecParams,
}

impl KernelArgs<'_> {
    /// How many buffers the kernel got.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// Buffer `index`'s bytes. Panics (failing the batch) for an index
    /// past [`buffer_count`](Self::buffer_count).
    pub fn bytes(&mut self, index: usize) -> &mut [u8] {
        &mut self.memory[self.buffers[index].clone()]
    }

    /// Buffer `index` as `T`s (a trailing partial element is not read).
    pub fn read<T: Pod>(&self, index: usize) -> Vec<T> {
        let bytes = &self.memory[self.buffers[index].clone()];
        let mut out = vec![T::zeroed(); bytes.len() / size_of::<T>().max(1)];
        let len = size_of_val(out.as_slice());
        hwqueue::buffer::bytes_of_mut(&mut out[..]).copy_from_slice(&bytes[..len]);
        out
    }

    /// Writes `data` to the start of buffer `index`. Panics (failing the
    /// batch) when it does not fit.
    pub fn write<T: Pod>(&mut self, index: usize, data: &[T]) {
        let data = hwqueue::buffer::bytes_of(data);
        self.bytes(index)[..data.len()].copy_from_slice(data);
    }

    /// The scalar arguments.
    pub fn scalars(&self) -> &[Scalar] {
        self.scalars
    }

    /// The grid the `exec` asked for.
    pub fn params(&self) -> &ExecParams {
        self.params
    }
}
