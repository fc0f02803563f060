//! `CudaProgram`: a kernel loaded from PTX, or from CUDA C through NVRTC.

use std::fmt;

use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};

use crate::error::{Error, Result};
use crate::program::{KernelSignature, Program};
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
    signature: KernelSignature,
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
    /// [`Error::Driver`] when the driver rejects the PTX (its JIT error);
    /// [`Error::EntryPointNotFound`] when it has no such entry point.
    pub fn from_ptx(
        device: &CudaDevice,
        ptx: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        check_no_nul(name, "the PTX", ptx)?;
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
    /// [`Error::NoDriver`] when NVRTC is not installed; [`Error::Compile`]
    /// carrying NVRTC's log when the source does not compile; as
    /// [`from_ptx`](Self::from_ptx) when loading fails.
    pub fn from_cuda_c(
        device: &CudaDevice,
        source: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        check_no_nul(name, "the CUDA C source", source)?;
        check_no_nul(name, "the kernel name", name)?;
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
        check_no_nul(name, "the kernel name", name)?;
        let module = device.context().load_module(ptx).map_err(|e| {
            driver_error(
                "loading the PTX module (check that it targets this GPU, and that the PTX \
                     or the NVRTC that made it is not newer than the driver)",
                e,
            )
        })?;
        let function = module
            .load_function(name)
            .map_err(|e| Error::EntryPointNotFound {
                program: name.to_owned(),
                entry: name.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(Self {
            inner: Arc::new(ProgramInner {
                signature: KernelSignature::new(name, buffers, scalars),
                function,
                device: device.clone(),
                ptx: text,
            }),
        })
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
fn check_no_nul(name: &str, what: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(Error::InvalidProgram {
            program: name.replace('\0', "\\0"),
            reason: format!("{what} contains a NUL byte; remove it"),
        });
    }
    Ok(())
}

fn compile_error(name: &str, error: CompileError) -> Error {
    let output = match error {
        CompileError::CompileError { nvrtc, log, .. } => {
            format!("({nvrtc:?})\n{}", log.to_string_lossy().trim_end())
        }
        other => format!("{other:?}"),
    };
    Error::Compile {
        program: name.to_owned(),
        compiler: "NVRTC".into(),
        output,
    }
}

impl Program for CudaProgram {
    type Backend = Cuda;

    fn signature(&self) -> &KernelSignature {
        &self.inner.signature
    }
}

impl fmt::Debug for CudaProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaProgram")
            .field("kernel", &self.inner.signature)
            .field("device", &self.inner.device.ordinal())
            .finish()
    }
}
