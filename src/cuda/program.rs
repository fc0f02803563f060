//! `CudaProgram`: a kernel loaded from PTX, or from CUDA C through NVRTC.

use std::fmt;

use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::program::Program;
use crate::sync::Arc;

use super::{Cuda, CudaDevice, driver_error, ensure_nvrtc};

/// A kernel for the CUDA backend. Clones name the same kernel.
///
/// # Kernel ABI
///
/// `exec(program, buffers, scalars, params)` passes, in order, one device
/// pointer per buffer, then each scalar by value (`u32`, `i32`, `u64`,
/// `i64`, `float`, `double`). A kernel taking two buffers and a count is
///
/// ```c
/// extern "C" __global__ void scale(float *out, const float *in, unsigned int n);
/// ```
///
/// The buffer and scalar counts given here are checked at `submit`; the
/// scalars' types are not (PTX does not say them): they must match the
/// kernel's parameters. Kernels in CUDA C must be `extern "C"` so the entry
/// name is not mangled.
#[derive(Clone)]
pub struct CudaProgram {
    inner: Arc<ProgramInner>,
}

struct ProgramInner {
    name: String,
    buffers: usize,
    scalars: usize,
    /// Holds the module loaded.
    function: CudaFunction,
    device: CudaDevice,
    ptx: String,
}

impl CudaProgram {
    /// Loads entry point `name` from PTX text on `device`. The kernel takes
    /// `buffers` buffer arguments, then `scalars` scalar arguments.
    ///
    /// # Errors
    /// [`Error::Backend`] when the driver rejects the PTX (its JIT error) or
    /// has no such entry point.
    pub fn from_ptx(
        device: &CudaDevice,
        ptx: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        check_no_nul("the PTX", ptx)?;
        Self::load(
            device,
            Ptx::from_src(ptx),
            ptx.to_owned(),
            name,
            buffers,
            scalars,
        )
    }

    /// Compiles CUDA C `source` with NVRTC and loads entry point `name` on
    /// `device`. The kernel takes `buffers` buffer arguments, then `scalars`
    /// scalar arguments.
    ///
    /// # Errors
    /// [`Error::NoDriver`] when NVRTC is not installed; [`Error::Backend`]
    /// carrying NVRTC's log when the source does not compile, or the
    /// driver's error when loading fails.
    pub fn from_cuda_c(
        device: &CudaDevice,
        source: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        check_no_nul("the CUDA C source", source)?;
        check_no_nul("the kernel name", name)?;
        ensure_nvrtc()?;
        let options = CompileOptions {
            name: Some(format!("{name}.cu")),
            ..CompileOptions::default()
        };
        let ptx = compile_ptx_with_opts(source, options).map_err(|e| compile_error(name, e))?;
        let text = ptx.to_src();
        Self::load(device, ptx, text, name, buffers, scalars)
    }

    fn load(
        device: &CudaDevice,
        ptx: Ptx,
        text: String,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        check_no_nul("the kernel name", name)?;
        let module = device.context().load_module(ptx).map_err(|e| {
            driver_error(
                "loading the PTX module (check that it targets this GPU, and that the PTX \
                     or the NVRTC that made it is not newer than the driver)",
                e,
            )
        })?;
        let function = module.load_function(name).map_err(|e| {
            driver_error(
                "finding the kernel's entry point (is it `extern \"C\"` and spelled the same?)",
                e,
            )
        })?;
        Ok(Self {
            inner: Arc::new(ProgramInner {
                name: name.to_owned(),
                buffers,
                scalars,
                function,
                device: device.clone(),
                ptx: text,
            }),
        })
    }

    /// How many buffer arguments the kernel takes.
    pub fn buffer_count(&self) -> usize {
        self.inner.buffers
    }

    /// How many scalar arguments the kernel takes.
    pub fn scalar_count(&self) -> usize {
        self.inner.scalars
    }

    /// The PTX the kernel was loaded from (NVRTC's output for CUDA C).
    pub fn ptx(&self) -> &str {
        &self.inner.ptx
    }

    /// The device the kernel is loaded on.
    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    pub(crate) fn function(&self) -> &CudaFunction {
        &self.inner.function
    }
}

/// cudarc turns names and sources into C strings and panics on an interior
/// NUL: refuse them first.
fn check_no_nul(what: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(Error::Backend {
            backend: Cuda::ID,
            message: format!("{what} contains a NUL byte; remove it"),
        });
    }
    Ok(())
}

fn compile_error(name: &str, error: CompileError) -> Error {
    let message = match error {
        CompileError::CompileError { nvrtc, log, .. } => format!(
            "NVRTC could not compile `{name}` ({nvrtc:?}); fix the source. Compiler log:\n{}",
            log.to_string_lossy().trim_end()
        ),
        other => format!("NVRTC failed on `{name}`: {other:?}"),
    };
    Error::Backend {
        backend: Cuda::ID,
        message,
    }
}

impl Program for CudaProgram {
    type Backend = Cuda;

    fn name(&self) -> &str {
        &self.inner.name
    }
}

impl fmt::Debug for CudaProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaProgram")
            .field("name", &self.inner.name)
            .field("buffers", &self.inner.buffers)
            .field("scalars", &self.inner.scalars)
            .field("device", &self.inner.device.ordinal())
            .finish()
    }
}
