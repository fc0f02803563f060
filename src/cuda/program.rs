//! `CudaProgram`: a kernel loaded from PTX, or from CUDA C through NVRTC.

use std::ffi::{CString, c_char, c_void};
use std::fmt;

use cudarc::driver::{CudaFunction, DriverError, sys};
use cudarc::nvrtc::{self, Ptx};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::program::{KernelSignature, Program};
use crate::sync::{Arc, AtomicU32, Mutex, Ordering};

use super::launch::{self, CompileTarget, KernelFacts};
use super::{Cuda, CudaDevice, device_error, ensure_nvrtc};
use crate::ptx;

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
/// The safe constructors check the kernel's parameters against this ABI,
/// as the `.entry` directive of its PTX declares them (read by
/// [`ptx::entry_params`](crate::ptx::entry_params), so the check needs no
/// particular driver): their count, that buffers are 8-byte pointers, and
/// at `submit` that each scalar has its parameter's width. The `unsafe`
/// `*_unchecked` constructors load the kernel on the caller's word. Kernels
/// in CUDA C must be `extern "C"` so the entry name is not mangled.
///
/// `submit` also checks each `exec`'s block size against the kernel's own
/// maximum (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, lower than the
/// device's when the kernel uses many registers) and its dynamic shared
/// memory ([`ExecParams::with_shared_memory`](crate::ExecParams::with_shared_memory))
/// against what the kernel's static shared memory leaves; above 48 KiB
/// the launch opts the kernel in (`cuFuncSetAttribute`), once per size.
#[derive(Clone)]
pub struct CudaProgram {
    inner: Arc<ProgramInner>,
}

struct ProgramInner {
    signature: KernelSignature,
    /// Holds the module loaded.
    function: CudaFunction,
    device: CudaDevice,
    /// The PTX, when the kernel was loaded from PTX or NVRTC produced it.
    ptx: Option<String>,
    /// NVRTC's log (its warnings), empty for PTX or a silent compile.
    log: String,
    facts: KernelFacts,
    /// The dynamic shared memory the kernel is opted in to (0: none).
    opted_shared: AtomicU32,
    /// Held while raising the opt-in, so two launches raising it at once
    /// cannot leave the attribute below what `opted_shared` says.
    opting_in: Mutex<()>,
}

impl CudaProgram {
    /// Loads entry point `name` from PTX text on `device`. The kernel takes
    /// `buffers` buffer arguments, then `scalars` scalar arguments; the
    /// driver checks that (see the type's docs).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver rejects the PTX, with its JIT log
    /// (and, for PTX newer than the driver, the two versions and the fix);
    /// [`Error::EntryPointNotFound`] when it has no such entry point;
    /// [`Error::InvalidProgram`] when the kernel's parameters are not the
    /// declared ones, or its `.entry` is not PTX hwqueue reads.
    pub fn from_ptx(
        device: &CudaDevice,
        ptx: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        Self::load_ptx(device, ptx, name, (buffers, scalars), true)
    }

    /// As [`from_ptx`](Self::from_ptx), without checking the kernel's
    /// parameters: for PTX whose `.entry` hwqueue cannot read.
    ///
    /// # Safety
    /// The kernel's parameters must be exactly `buffers` pointers, then
    /// `scalars` scalars each as wide as the [`Scalar`](crate::Scalar)
    /// every `exec` of it passes there (4 or 8 bytes; 2 for f16/bf16 with the
    /// `half` feature): the driver copies
    /// as many bytes as the kernel declares from the launch's argument
    /// array, and a kernel that declares more reads past it.
    pub unsafe fn from_ptx_unchecked(
        device: &CudaDevice,
        ptx: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        Self::load_ptx(device, ptx, name, (buffers, scalars), false)
    }

    fn load_ptx(
        device: &CudaDevice,
        ptx: &str,
        name: &str,
        counts: (usize, usize),
        checked: bool,
    ) -> Result<Self> {
        check_no_nul(name, "the PTX", ptx)?;
        let image = Image {
            cubin: None,
            ptx: Some(ptx.to_owned()),
            log: String::new(),
        };
        Self::load(device, image, name, counts, checked)
    }

    /// Compiles CUDA C `source` with NVRTC for `device` and loads entry
    /// point `name`. The kernel takes `buffers` buffer arguments, then
    /// `scalars` scalar arguments; the driver checks that (see the type's
    /// docs).
    ///
    /// NVRTC compiles for the device's own architecture
    /// (`--gpu-architecture=sm_XY` from its compute capability) into a
    /// cubin, so nothing is JIT-compiled at load, every feature of the
    /// GPU is available (`atomicAdd` on `double`, `bf16`, `__nanosleep`),
    /// and an NVRTC newer than the driver still works (a driver refuses
    /// PTX of a newer ISA, never a cubin); an NVRTC that predates the GPU
    /// produces PTX for the newest architecture it knows instead, which
    /// the driver JIT-compiles. NVRTC's warnings are kept:
    /// [`log`](Self::log).
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
        let compiled = compile_for_device(device, source, name)?;
        Self::load(device, compiled.image, name, (buffers, scalars), true)
    }

    /// Loads a kernel [`compile`](super::compile) made (for this device's
    /// architecture, or PTX for it or an older one): compile once, load on
    /// every device. Checked as [`from_cuda_c`](Self::from_cuda_c).
    ///
    /// # Errors
    /// As [`from_ptx`](Self::from_ptx).
    pub fn from_compiled(
        device: &CudaDevice,
        kernel: &CompiledKernel,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        Self::load(
            device,
            kernel.image.clone(),
            &kernel.name,
            (buffers, scalars),
            true,
        )
    }

    /// As [`from_cuda_c`](Self::from_cuda_c), without checking the
    /// kernel's parameters.
    ///
    /// # Safety
    /// As [`from_ptx_unchecked`](Self::from_ptx_unchecked).
    pub unsafe fn from_cuda_c_unchecked(
        device: &CudaDevice,
        source: &str,
        name: &str,
        buffers: usize,
        scalars: usize,
    ) -> Result<Self> {
        let compiled = compile_for_device(device, source, name)?;
        Self::load(device, compiled.image, name, (buffers, scalars), false)
    }

    /// Loads the image's cubin if it has one, else its PTX.
    fn load(
        device: &CudaDevice,
        Image { cubin, ptx, log }: Image,
        name: &str,
        (buffers, scalars): (usize, usize),
        checked: bool,
    ) -> Result<Self> {
        check_no_nul(name, "the kernel name", name)?;
        let (image, jitted) = match (cubin, &ptx) {
            (Some(cubin), _) => (Ptx::from_binary(cubin), None),
            (None, Some(text)) => (Ptx::from_src(text.clone()), Some(text.as_str())),
            (None, None) => {
                return Err(Error::InvalidProgram {
                    program: name.to_owned(),
                    reason: "neither a cubin nor PTX to load".into(),
                });
            }
        };
        let module = device
            .context()
            .load_module(image)
            .map_err(|e| load_error(device, jitted, &log, e))?;
        let function = module
            .load_function(name)
            .map_err(|e| Error::EntryPointNotFound {
                program: name.to_owned(),
                entry: name.to_owned(),
                detail: e.to_string(),
            })?;
        let facts = kernel_facts(device, &function, name, checked, ptx.as_deref())?;
        if let Some(sizes) = &facts.params {
            launch::check_params(name, buffers, scalars, sizes)?;
        }
        Ok(Self {
            inner: Arc::new(ProgramInner {
                signature: KernelSignature::new(name, buffers, scalars),
                function,
                device: device.clone(),
                ptx,
                log,
                facts,
                opted_shared: AtomicU32::new(0),
                opting_in: Mutex::new(()),
            }),
        })
    }

    /// The PTX the kernel was loaded from, or NVRTC's PTX for it; `None`
    /// when the kernel was loaded as a cubin and NVRTC kept no PTX.
    pub fn ptx(&self) -> Option<&str> {
        self.inner.ptx.as_deref()
    }

    /// NVRTC's log of the compile: its warnings, empty when it had none
    /// (and for a kernel loaded from PTX).
    pub fn log(&self) -> &str {
        &self.inner.log
    }

    /// The device the kernel is loaded on.
    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    pub(crate) fn function(&self) -> &CudaFunction {
        &self.inner.function
    }

    pub(crate) fn facts(&self) -> &KernelFacts {
        &self.inner.facts
    }

    /// Opts the kernel in to `bytes` of dynamic shared memory if a launch
    /// with that much needs it (above 48 KiB less its static memory).
    pub(crate) fn opt_in_shared(&self, bytes: u32) -> Result<()> {
        let needs = |opted: &AtomicU32| {
            launch::needs_opt_in(&self.inner.facts, bytes, opted.load(Ordering::Relaxed))
        };
        if !needs(&self.inner.opted_shared) {
            return Ok(());
        }
        // Raised under the lock, checked again there: the attribute only
        // ever rises, and `opted_shared` is what it is.
        let _raising = self.inner.opting_in.lock();
        if !needs(&self.inner.opted_shared) {
            return Ok(());
        }
        let value = i32::try_from(bytes).unwrap_or(i32::MAX);
        self.inner
            .function
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
            .map_err(|e| {
                device_error(
                    self.inner.device.ordinal(),
                    "opting the kernel in to more dynamic shared memory",
                    e,
                )
            })?;
        self.inner.opted_shared.store(bytes, Ordering::Relaxed);
        Ok(())
    }
}

/// What a compile gives to load: a cubin, PTX, or both, and NVRTC's log.
#[derive(Clone)]
struct Image {
    cubin: Option<Vec<u8>>,
    ptx: Option<String>,
    log: String,
}

/// A CUDA C kernel compiled by NVRTC and not loaded on any device: what
/// [`compile`] returns. [`CudaProgram::from_compiled`] loads it.
#[derive(Clone)]
pub struct CompiledKernel {
    name: String,
    target: CompileTarget,
    image: Image,
}

impl CompiledKernel {
    /// The kernel's entry point.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it was compiled for.
    pub fn target(&self) -> CompileTarget {
        self.target
    }

    /// Its PTX (NVRTC writes PTX for a cubin target too).
    pub fn ptx(&self) -> Option<&str> {
        self.image.ptx.as_deref()
    }

    /// Its machine code, for a [`CompileTarget::Cubin`].
    pub fn cubin(&self) -> Option<&[u8]> {
        self.image.cubin.as_deref()
    }

    /// NVRTC's log: its warnings, empty when it had none.
    pub fn log(&self) -> &str {
        &self.image.log
    }

    /// The size of each of the kernel's parameters, from its PTX (see
    /// [`ptx::entry_params`](crate::ptx::entry_params)).
    ///
    /// # Errors
    /// As `ptx::entry_params`; [`Error::InvalidProgram`] if NVRTC kept no
    /// PTX.
    pub fn params(&self) -> Result<Vec<usize>> {
        let Some(ptx) = self.ptx() else {
            return Err(Error::InvalidProgram {
                program: self.name.clone(),
                reason: "NVRTC kept no PTX of the kernel to read its parameters from".into(),
            });
        };
        ptx::entry_params(ptx, &self.name)
    }

    /// Checks the kernel's parameters against the ABI of [`CudaProgram`]:
    /// `buffers` device pointers, then `scalars` scalars. This is the check
    /// the checked constructors make at load, made here without a device.
    ///
    /// # Errors
    /// [`Error::InvalidProgram`] naming the mismatch.
    pub fn check_signature(&self, buffers: usize, scalars: usize) -> Result<()> {
        launch::check_params(&self.name, buffers, scalars, &self.params()?)
    }
}

impl fmt::Debug for CompiledKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledKernel")
            .field("name", &self.name)
            .field("target", &self.target)
            .field("ptx_bytes", &self.ptx().map(str::len))
            .field("cubin_bytes", &self.cubin().map(<[u8]>::len))
            .field("log", &self.image.log)
            .finish()
    }
}

/// Compiles CUDA C `source` with NVRTC for `target`, on a machine with or
/// without a GPU: it needs NVRTC (`libnvrtc`), not the driver. The entry
/// point `name` must be `extern "C"`; it names the program in errors and
/// is the entry [`CompiledKernel::params`] reads.
///
/// ```no_run
/// use hwqueue::cuda::{CompileTarget, compile};
/// let source = r#"extern "C" __global__ void fill(float *out, float value, unsigned n) {
///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///     if (i < n) out[i] = value;
/// }"#;
/// let kernel = compile(source, "fill", CompileTarget::Cubin(90))?;
/// kernel.check_signature(1, 2)?;
/// assert!(kernel.cubin().is_some());
/// # Ok::<(), hwqueue::Error>(())
/// ```
///
/// # Errors
/// [`Error::NoDriver`] when NVRTC is not installed; [`Error::Compile`] with
/// NVRTC's log when the source does not compile, or when this NVRTC cannot
/// compile for `target`'s architecture (the error lists those it can).
pub fn compile(source: &str, name: &str, target: CompileTarget) -> Result<CompiledKernel> {
    check_no_nul(name, "the CUDA C source", source)?;
    check_no_nul(name, "the kernel name", name)?;
    ensure_nvrtc()?;
    let archs = supported_archs();
    if !archs.is_empty() && !archs.contains(&target.arch()) {
        return Err(Error::Compile {
            program: name.to_owned(),
            compiler: "NVRTC".into(),
            output: format!(
                "this NVRTC ({}) compiles for architectures {archs:?}, not {}; pick one of \
                 those, or install the NVRTC of a CUDA toolkit that supports it",
                nvrtc_version().map_or("version unknown".to_owned(), |(major, minor)| format!(
                    "{major}.{minor}"
                )),
                target.arch()
            ),
        });
    }
    nvrtc_compile(source, name, target)
}

/// Compiles `source` with NVRTC for the device: a cubin for its own
/// architecture, or PTX where NVRTC predates it.
fn compile_for_device(device: &CudaDevice, source: &str, name: &str) -> Result<CompiledKernel> {
    check_no_nul(name, "the CUDA C source", source)?;
    check_no_nul(name, "the kernel name", name)?;
    ensure_nvrtc()?;
    let target = launch::nvrtc_target(name, device.capability(), &supported_archs())?;
    nvrtc_compile(source, name, target)
}

/// One NVRTC compile of `source` (free of NUL bytes, as `name` is) for
/// `target`.
fn nvrtc_compile(source: &str, name: &str, target: CompileTarget) -> Result<CompiledKernel> {
    let nvrtc_failed = |what: &str, e: nvrtc::result::NvrtcError| Error::Compile {
        program: name.to_owned(),
        compiler: "NVRTC".into(),
        output: format!("{what}: {e:?}"),
    };
    // Both checked for NUL by the callers.
    let (source, file) = (
        CString::new(source).unwrap_or_default(),
        CString::new(format!("{name}.cu")).unwrap_or_default(),
    );
    let program = nvrtc::result::create_program(&source, Some(&file))
        .map_err(|e| nvrtc_failed("creating the program", e))?;
    let program = NvrtcProgram(program);
    // SAFETY: `program` was created above and is destroyed only by the
    // guard's drop, after every use below; `source` and `file` outlive it.
    let compiled = unsafe { nvrtc::result::compile_program(program.0, &[target.option()]) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::result::get_program_log(program.0) }
        .map(|log| c_text(&log).trim_end().to_owned())
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(Error::Compile {
            program: name.to_owned(),
            compiler: "NVRTC".into(),
            output: format!("({e:?}, {})\n{log}", target.option()),
        });
    }
    // SAFETY: as above; the program compiled.
    let ptx = unsafe { nvrtc::result::get_ptx(program.0) }
        .ok()
        .map(|text| c_text(&text));
    let cubin = match target {
        CompileTarget::Cubin(_) => {
            let mut size = 0usize;
            // SAFETY: as above; NVRTC writes the size, then that many bytes
            // into a buffer of that size.
            let cubin = unsafe {
                nvrtc::sys::nvrtcGetCUBINSize(program.0, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        nvrtc::sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>())
                            .result()
                            .map(|()| cubin)
                    })
            }
            .map_err(|e| nvrtc_failed("reading the cubin", e))?;
            Some(cubin)
        }
        CompileTarget::Ptx(_) if ptx.is_none() => {
            return Err(Error::Compile {
                program: name.to_owned(),
                compiler: "NVRTC".into(),
                output: "NVRTC compiled the source but gave no PTX".into(),
            });
        }
        CompileTarget::Ptx(_) => None,
    };
    Ok(CompiledKernel {
        name: name.to_owned(),
        target,
        image: Image { cubin, ptx, log },
    })
}

/// Destroys an NVRTC program when dropped.
struct NvrtcProgram(nvrtc::sys::nvrtcProgram);

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is
        // destroyed only here, once.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

/// The architectures this NVRTC compiles for (`nvrtcGetSupportedArchs`),
/// as `10 * major + minor`; empty if it cannot say.
fn supported_archs() -> Vec<i32> {
    let mut count = 0;
    // SAFETY: NVRTC was found (`ensure_nvrtc`); the calls write one count,
    // then that many `c_int`s into a buffer of that length.
    unsafe {
        if nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count)
            .result()
            .is_err()
        {
            return Vec::new();
        }
        let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
        if nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
            .result()
            .is_err()
        {
            return Vec::new();
        }
        archs
    }
}

/// NVRTC's version, if it says.
fn nvrtc_version() -> Option<(i32, i32)> {
    // Without NVRTC (a user loading PTX made elsewhere) there is no
    // version to tell, and cudarc would panic on the call.
    ensure_nvrtc().ok()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC was found just above; the call writes two `c_int`s.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .ok()
        .map(|()| (major, minor))
}

/// A NUL-terminated C text as a `String`.
fn c_text(text: &[c_char]) -> String {
    let bytes: Vec<u8> = text
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What the driver reports of `function` (see [`KernelFacts`]), and its
/// parameters from its PTX when `checked`.
fn kernel_facts(
    device: &CudaDevice,
    function: &CudaFunction,
    name: &str,
    checked: bool,
    ptx: Option<&str>,
) -> Result<KernelFacts> {
    let fail = |e| device_error(device.ordinal(), "reading the kernel's attributes", e);
    let max_threads = function.max_threads_per_block().map_err(fail)?;
    let static_shared = function.shared_size_bytes().map_err(fail)?;
    let params = match (checked, ptx) {
        (false, _) => None,
        (true, Some(ptx)) => Some(ptx::entry_params(ptx, name)?),
        (true, None) => {
            return Err(Error::InvalidProgram {
                program: name.to_owned(),
                reason: "NVRTC kept no PTX beside the cubin, so hwqueue cannot read the \
                         kernel's parameters to check them; load it with the `unsafe` \
                         `from_cuda_c_unchecked` and keep its contract"
                    .into(),
            });
        }
    };
    Ok(KernelFacts {
        max_threads: u32::try_from(max_threads).unwrap_or(0),
        static_shared: u32::try_from(static_shared).unwrap_or(0),
        params,
    })
}

/// The error for a module the driver would not load. A sticky error loses
/// the device (nothing more is asked of it); PTX newer than the driver
/// gets the two versions and the fix; other PTX gets the JIT's own log
/// (`cuModuleLoadDataEx` with an error-log buffer). `jitted` is the PTX
/// text when PTX was loaded (a cubin has no JIT to ask).
fn load_error(device: &CudaDevice, jitted: Option<&str>, log: &str, error: DriverError) -> Error {
    if launch::is_sticky(error.0) {
        return device_error(device.ordinal(), "loading the module", error);
    }
    let mut detail = error.to_string();
    if error.0 == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
        detail = format!(
            "{detail}: {}",
            launch::unsupported_ptx_advice(
                jitted.and_then(ptx::isa_version),
                nvrtc_version(),
                device.driver_version()
            )
        );
    } else if let Some(log) = jitted.and_then(|ptx| jit_log(device, ptx)) {
        detail = format!("{detail}; the JIT said:\n{log}");
    }
    if !log.is_empty() {
        detail = format!("{detail}\nNVRTC's log of the compile:\n{log}");
    }
    Error::Driver {
        backend: Cuda::ID,
        what: "loading the kernel's module (PTX must target this GPU's architecture or an \
               older one)"
            .to_owned(),
        detail,
    }
}

/// Loads `ptx` again with an error-log buffer, for the JIT's log; the
/// module, should it load this time, is unloaded at once.
fn jit_log(device: &CudaDevice, ptx: &str) -> Option<String> {
    const LOG_BYTES: usize = 16 << 10;
    // Checked for NUL when the kernel was given.
    let image = CString::new(ptx).ok()?;
    device.context().bind_to_thread().ok()?;
    let mut log = vec![0 as c_char; LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size option's value is the integer itself, cast to a pointer, as
    // the driver's documentation of `CUjit_option` says.
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), LOG_BYTES as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the context is bound to this thread; `image` is a
    // NUL-terminated PTX text that outlives the call; the two options
    // point at a live buffer of `LOG_BYTES` bytes and carry its size;
    // `module` is written only on success.
    let status = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if status == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: loaded just above, used by nothing else.
        let _ = unsafe { sys::cuModuleUnload(module) };
    }
    let text = c_text(&log);
    (!text.trim().is_empty()).then(|| text.trim_end().to_owned())
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

impl Program for CudaProgram {
    type Backend = Cuda;

    fn signature(&self) -> &KernelSignature {
        &self.inner.signature
    }

    #[inline]
    fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
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
