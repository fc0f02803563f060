//! What hwqueue decides about a CUDA kernel before the driver sees it: the
//! NVRTC target for the device, the checks of a kernel's parameters and of
//! an `exec` against what the driver reports of the function, the launch
//! configuration, and which driver errors lose the device.
//!
//! Everything here is a plain function of numbers the driver reported, so
//! it is unit-tested without a GPU; the callers in `program.rs`, `queue.rs`
//! and `device.rs` only read those numbers and act on the answers.

use cudarc::driver::{LaunchConfig, sys};

use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::Scalar;

/// Dynamic shared memory a kernel may use without opting in
/// (`cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`):
/// 48 KiB on every architecture since Volta, minus the kernel's static
/// shared memory.
pub(crate) const SHARED_MEMORY_WITHOUT_OPT_IN: u32 = 48 << 10;

/// What the driver reports of one kernel function, read once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelFacts {
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`: below the device's limit
    /// when the kernel uses many registers.
    pub(crate) max_threads: u32,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: the kernel's `__shared__`
    /// arrays of fixed size.
    pub(crate) static_shared: u32,
    /// The size of each parameter (from the PTX's `.entry`), or `None` for
    /// a kernel loaded through an `unchecked` constructor.
    pub(crate) params: Option<Vec<usize>>,
}

/// What NVRTC compiles CUDA C into, for [`compile`](super::compile); an
/// architecture is `10 * major + minor` of a compute capability (`90` for
/// sm_90), as NVRTC numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileTarget {
    /// Machine code for exactly that architecture
    /// (`--gpu-architecture=sm_XY`), with its PTX beside it: nothing left
    /// to JIT at load, and no PTX version for the driver to refuse.
    /// [`CudaProgram::from_cuda_c`](super::CudaProgram::from_cuda_c) picks
    /// this for the device's own architecture where NVRTC knows it.
    Cubin(i32),
    /// PTX for that architecture (`compute_XY`), for the driver to JIT on
    /// it or any newer GPU: what a device newer than the NVRTC gets.
    Ptx(i32),
}

impl CompileTarget {
    /// The architecture, `10 * major + minor`.
    pub fn arch(self) -> i32 {
        match self {
            CompileTarget::Cubin(arch) | CompileTarget::Ptx(arch) => arch,
        }
    }

    /// NVRTC's `--gpu-architecture` option for the target.
    pub(crate) fn option(self) -> String {
        match self {
            CompileTarget::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
            CompileTarget::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
        }
    }
}

/// The target for a device of compute capability `capability` (`10 *
/// major + minor`, as NVRTC numbers architectures), given the
/// architectures this NVRTC supports (`nvrtcGetSupportedArchs`).
///
/// # Errors
/// [`Error::Compile`] when NVRTC knows no architecture the device runs.
pub(crate) fn nvrtc_target(
    program: &str,
    capability: i32,
    supported: &[i32],
) -> Result<CompileTarget> {
    if supported.contains(&capability) {
        return Ok(CompileTarget::Cubin(capability));
    }
    // PTX of an older architecture runs on newer GPUs (the driver JITs it);
    // never the other way round.
    match supported
        .iter()
        .copied()
        .filter(|arch| *arch <= capability)
        .max()
    {
        Some(arch) => Ok(CompileTarget::Ptx(arch)),
        None => Err(Error::Compile {
            program: program.to_owned(),
            compiler: "NVRTC".into(),
            output: format!(
                "this NVRTC supports architectures {supported:?}, none of which a device of \
                 compute capability {}.{} runs; install the NVRTC of a CUDA toolkit that \
                 supports it",
                capability / 10,
                capability % 10
            ),
        }),
    }
}

/// The advice for `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: PTX of an ISA
/// newer than the driver's JIT, from an NVRTC (or a toolkit) newer than the
/// driver. `isa` is the PTX's `.version`.
pub(crate) fn unsupported_ptx_advice(
    isa: Option<(u32, u32)>,
    nvrtc: Option<(i32, i32)>,
    driver: Option<i32>,
) -> String {
    let isa = isa.map_or("of an unknown ISA".to_owned(), |(major, minor)| {
        match crate::ptx::isa_cuda_release(major, minor) {
            Some((cuda, cuda_minor)) => {
                format!("ISA {major}.{minor}, which needs a CUDA {cuda}.{cuda_minor} driver")
            }
            None => format!("ISA {major}.{minor}"),
        }
    });
    let nvrtc = nvrtc.map_or("unknown".to_owned(), |(major, minor)| {
        format!("{major}.{minor}")
    });
    let driver = driver.map_or("unknown".to_owned(), super::cuda_version);
    format!(
        "the PTX ({isa}) is newer than this driver can load (driver supports CUDA {driver}; \
         NVRTC here is {nvrtc}); update the GPU driver, or load a cubin for the device \
         (`CudaProgram::from_cuda_c` makes one where NVRTC knows the GPU, and a driver \
         loads a cubin from any newer NVRTC), or make the PTX with an NVRTC no newer than \
         the driver"
    )
}

/// The widths of the scalars hwqueue passes, and their types for errors.
#[cfg(not(feature = "half"))]
const SCALAR_WIDTHS: &[usize] = &[4, 8];
#[cfg(not(feature = "half"))]
const SCALAR_TYPES: &str = "4 or 8 bytes (u32, i32, f32, u64, i64, f64)";
#[cfg(feature = "half")]
const SCALAR_WIDTHS: &[usize] = &[2, 4, 8];
#[cfg(feature = "half")]
const SCALAR_TYPES: &str = "2, 4 or 8 bytes (f16, bf16, u32, i32, f32, u64, i64, f64)";

/// Checks a kernel's parameters, as the driver reports their sizes,
/// against the ABI it was declared with: `buffers` device pointers, then
/// `scalars` scalars of one of [`SCALAR_WIDTHS`].
///
/// # Errors
/// [`Error::InvalidProgram`] naming the mismatch.
pub(crate) fn check_params(
    program: &str,
    buffers: usize,
    scalars: usize,
    sizes: &[usize],
) -> Result<()> {
    let fail = |reason: String| {
        Err(Error::InvalidProgram {
            program: program.to_owned(),
            reason,
        })
    };
    if buffers.checked_add(scalars) != Some(sizes.len()) {
        return fail(format!(
            "the kernel takes {} parameters, but was declared with {buffers} buffers and \
             {scalars} scalars; declare the counts the kernel's signature has",
            sizes.len()
        ));
    }
    if let Some((index, size)) = sizes[..buffers]
        .iter()
        .enumerate()
        .find(|(_, size)| **size != 8)
    {
        return fail(format!(
            "parameter {index} is declared a buffer (an 8-byte device pointer), but the kernel \
             takes {size} bytes there; make it a pointer, or declare it a scalar"
        ));
    }
    if let Some((index, size)) = sizes[buffers..]
        .iter()
        .enumerate()
        .find(|(_, size)| !SCALAR_WIDTHS.contains(*size))
    {
        return fail(format!(
            "scalar {index} (parameter {}) takes {size} bytes; hwqueue passes scalars of \
             {SCALAR_TYPES}: pass larger values in a buffer",
            buffers + index
        ));
    }
    Ok(())
}

/// Checks one `exec` against the kernel: the scalars' widths against its
/// parameters (where the driver reported them), the block size against the
/// kernel's own maximum, and its shared memory against the device's
/// opt-in limit `max_shared` less the kernel's static shared memory.
///
/// # Errors
/// [`Error::InvalidArguments`] or [`Error::InvalidExecParams`] saying what
/// to change.
pub(crate) fn check_exec(
    program: &str,
    facts: &KernelFacts,
    max_shared: u32,
    buffers: usize,
    scalars: &[Scalar],
    params: &ExecParams,
) -> Result<()> {
    if let Some(sizes) = &facts.params {
        let widths = sizes.iter().skip(buffers).zip(scalars).enumerate();
        for (index, (size, scalar)) in widths {
            let (_, width) = scalar.to_ne_bytes();
            if width != *size {
                return Err(Error::InvalidArguments {
                    program: program.to_owned(),
                    reason: format!(
                        "scalar {index} is a {} ({width} bytes), but the kernel's parameter \
                         takes {size} bytes; pass a {}-byte scalar",
                        scalar.type_name(),
                        size
                    ),
                });
            }
        }
    }
    let fail = |reason: String| {
        Err(Error::InvalidExecParams {
            params: params.to_string(),
            reason,
        })
    };
    if params.local_count() > u64::from(facts.max_threads) {
        return fail(format!(
            "a work-group of {} work-items exceeds the {} that kernel `{program}` can run in one \
             block (its registers limit it below the device's maximum); use smaller work-groups",
            params.local_count(),
            facts.max_threads
        ));
    }
    let available = max_shared.saturating_sub(facts.static_shared);
    if params.shared_memory() > available {
        return fail(format!(
            "{} bytes of dynamic shared memory exceed the {available} bytes kernel `{program}` \
             can have ({max_shared} per block on this device, less its {} bytes of static \
             shared memory); use less per work-group",
            params.shared_memory(),
            facts.static_shared
        ));
    }
    Ok(())
}

/// Whether a launch with `dynamic` bytes of dynamic shared memory needs
/// the kernel opted in above the default, given the size it was already
/// opted in to (`opted`, 0 if never).
pub(crate) fn needs_opt_in(facts: &KernelFacts, dynamic: u32, opted: u32) -> bool {
    let default = SHARED_MEMORY_WITHOUT_OPT_IN.saturating_sub(facts.static_shared);
    dynamic > default && dynamic > opted
}

/// The launch configuration of an `exec`: grid = global / local, block =
/// local, and its dynamic shared memory.
pub(crate) fn launch_config(params: &ExecParams) -> LaunchConfig {
    let [gx, gy, gz] = params.groups();
    let [lx, ly, lz] = params.local();
    LaunchConfig {
        grid_dim: (gx, gy, gz),
        block_dim: (lx, ly, lz),
        shared_mem_bytes: params.shared_memory(),
    }
}

/// Whether a driver error leaves the context unusable for the rest of the
/// process (CUDA's "sticky" errors: every later call of the context fails
/// the same way, and only a new process recovers).
///
/// The list is `cuda.h`'s (12.8, the version the bindings target): the
/// codes whose description says the process is left "in an inconsistent
/// state and any further CUDA work will return the same error", or must be
/// "terminated and relaunched", plus an uncorrectable ECC error and a
/// destroyed context, after which the context cannot go on either.
pub(crate) fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult as R;
    // By number: cudarc's `cuda-12040`..`cuda-12060` bindings (which the
    // crate builds against) lack these two variants.
    const CONTAINED: u32 = 226;
    const TENSOR_MEMORY_LEAK: u32 = 721;
    matches!(code as u32, CONTAINED | TENSOR_MEMORY_LEAK)
        || matches!(
            code,
            R::CUDA_ERROR_ILLEGAL_ADDRESS
                | R::CUDA_ERROR_MPS_CLIENT_TERMINATED
                | R::CUDA_ERROR_EXTERNAL_DEVICE
                | R::CUDA_ERROR_LAUNCH_FAILED
                | R::CUDA_ERROR_HARDWARE_STACK_ERROR
                | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | R::CUDA_ERROR_MISALIGNED_ADDRESS
                | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | R::CUDA_ERROR_INVALID_PC
                | R::CUDA_ERROR_ASSERT
                | R::CUDA_ERROR_ECC_UNCORRECTABLE
                | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
                | R::CUDA_ERROR_LAUNCH_TIMEOUT
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_ARCHS: [i32; 9] = [50, 52, 53, 60, 61, 62, 70, 75, 90];

    #[test]
    fn nvrtc_targets_a_cubin_for_the_device_when_it_knows_the_architecture() {
        assert_eq!(
            nvrtc_target("k", 90, &H100_ARCHS).unwrap(),
            CompileTarget::Cubin(90)
        );
        assert_eq!(
            CompileTarget::Cubin(90).option(),
            "--gpu-architecture=sm_90".to_owned()
        );
    }

    #[test]
    fn an_older_nvrtc_gets_ptx_of_its_newest_architecture_the_device_runs() {
        // An sm_120 GPU with an NVRTC that stops at sm_90: PTX for
        // compute_90, which the driver JITs forward.
        assert_eq!(
            nvrtc_target("k", 120, &H100_ARCHS).unwrap(),
            CompileTarget::Ptx(90)
        );
        assert_eq!(
            CompileTarget::Ptx(90).option(),
            "--gpu-architecture=compute_90".to_owned()
        );
        // sm_80 is missing from the list: compute_75, never a newer one.
        assert_eq!(
            nvrtc_target("k", 80, &H100_ARCHS).unwrap(),
            CompileTarget::Ptx(75)
        );
    }

    #[test]
    fn a_device_older_than_every_nvrtc_architecture_is_an_error_saying_so() {
        let error = nvrtc_target("k", 35, &H100_ARCHS).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("compute capability 3.5"), "{text}");
        assert!(text.contains("[50, 52"), "{text}");
    }

    #[test]
    fn the_ptx_advice_names_both_versions_and_the_fix() {
        let advice = unsupported_ptx_advice(Some((8, 8)), Some((12, 9)), Some(12020));
        assert!(
            advice.contains("ISA 8.8, which needs a CUDA 12.9 driver"),
            "{advice}"
        );
        assert!(advice.contains("NVRTC here is 12.9"), "{advice}");
        assert!(advice.contains("supports CUDA 12.2"), "{advice}");
        assert!(advice.contains("update the GPU driver"), "{advice}");
        assert!(advice.contains("load a cubin"), "{advice}");
        let unknown = unsupported_ptx_advice(None, None, None);
        assert!(unknown.contains("NVRTC here is unknown"), "{unknown}");
        assert!(unknown.contains("unknown ISA"), "{unknown}");
    }

    #[test]
    fn params_are_checked_against_the_declared_abi() {
        check_params("k", 2, 1, &[8, 8, 4]).unwrap();
        check_params("k", 0, 2, &[8, 4]).unwrap();
        let count = check_params("k", 2, 0, &[8, 8, 4]).unwrap_err().to_string();
        assert!(
            count.contains("takes 3 parameters") && count.contains("2 buffers"),
            "{count}"
        );
        let pointer = check_params("k", 2, 0, &[8, 4]).unwrap_err().to_string();
        assert!(
            pointer.contains("parameter 1 is declared a buffer"),
            "{pointer}"
        );
        let wide = check_params("k", 1, 1, &[8, 16]).unwrap_err().to_string();
        assert!(
            wide.contains("scalar 0 (parameter 1) takes 16 bytes"),
            "{wide}"
        );
    }

    /// A `__half` parameter is 2 bytes: accepted with the `half` feature
    /// (which passes `Scalar::F16`), refused without it.
    #[test]
    fn two_byte_scalars_follow_the_half_feature() {
        let outcome = check_params("k", 1, 1, &[8, 2]);
        assert_eq!(outcome.is_ok(), cfg!(feature = "half"), "{outcome:?}");
    }

    fn facts() -> KernelFacts {
        KernelFacts {
            max_threads: 512,
            static_shared: 4 << 10,
            params: Some(vec![8, 4, 8]),
        }
    }

    #[test]
    fn an_exec_is_checked_against_the_kernel() {
        let params = ExecParams::new_1d(1024, 256);
        let scalars = [Scalar::U32(1), Scalar::F64(2.0)];
        check_exec("k", &facts(), 227 << 10, 1, &scalars, &params).unwrap();
        // A scalar of the wrong width.
        let narrow = [Scalar::U32(1), Scalar::F32(2.0)];
        let error = check_exec("k", &facts(), 227 << 10, 1, &narrow, &params).unwrap_err();
        assert!(
            error.to_string().contains("scalar 1 is a f32 (4 bytes)"),
            "{error}"
        );
        // Unknown parameters (an unchecked load): the widths are not checked.
        let unknown = KernelFacts {
            params: None,
            ..facts()
        };
        check_exec("k", &unknown, 227 << 10, 1, &narrow, &params).unwrap();
        // A block larger than the kernel's own maximum.
        let big = ExecParams::new_1d(1024, 1024);
        let error = check_exec("k", &facts(), 227 << 10, 1, &scalars, &big).unwrap_err();
        assert!(error.to_string().contains("exceeds the 512"), "{error}");
        // Dynamic shared memory beyond what the static part leaves.
        let shared = params.with_shared_memory((223 << 10) + 1);
        let error = check_exec("k", &facts(), 227 << 10, 1, &scalars, &shared).unwrap_err();
        assert!(
            error.to_string().contains("exceed the 228352 bytes"),
            "{error}"
        );
        check_exec(
            "k",
            &facts(),
            227 << 10,
            1,
            &scalars,
            &params.with_shared_memory(223 << 10),
        )
        .unwrap();
    }

    #[test]
    fn the_launch_carries_its_shared_memory_and_opts_in_above_48_kib() {
        let params = ExecParams::new_2d([64, 32], [16, 8]).with_shared_memory(100 << 10);
        let config = launch_config(&params);
        assert_eq!(config.grid_dim, (4, 4, 1));
        assert_eq!(config.block_dim, (16, 8, 1));
        assert_eq!(config.shared_mem_bytes, 100 << 10);
        let facts = facts();
        // 44 KiB fit the default beside 4 KiB of static memory; 45 do not.
        assert!(!needs_opt_in(&facts, 44 << 10, 0));
        assert!(needs_opt_in(&facts, 45 << 10, 0));
        // Once opted in to 100 KiB, less needs nothing more.
        assert!(!needs_opt_in(&facts, 90 << 10, 100 << 10));
        assert!(needs_opt_in(&facts, 101 << 10, 100 << 10));
    }

    #[test]
    fn faults_that_poison_the_context_are_sticky_and_others_are_not() {
        use sys::CUresult as R;
        assert!(is_sticky(R::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(R::CUDA_ERROR_LAUNCH_FAILED));
        assert!(!is_sticky(R::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_sticky(R::CUDA_ERROR_INVALID_VALUE));
        assert!(!is_sticky(R::CUDA_ERROR_NOT_READY));
    }

    /// Issue 24, defect 7: every code whose description in `cuda.h` (12.8,
    /// the version the bindings target) says the process is left in an
    /// inconsistent state, or must be relaunched, is sticky. The last four
    /// were missing before; this failed on `37889df`.
    #[test]
    fn every_code_cuda_h_calls_process_fatal_is_sticky() {
        use sys::CUresult as R;
        for code in [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_LAUNCH_TIMEOUT,
            R::CUDA_ERROR_ASSERT,
            R::CUDA_ERROR_HARDWARE_STACK_ERROR,
            R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            R::CUDA_ERROR_MISALIGNED_ADDRESS,
            R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            R::CUDA_ERROR_INVALID_PC,
            R::CUDA_ERROR_LAUNCH_FAILED,
            R::CUDA_ERROR_CONTAINED,
            R::CUDA_ERROR_TENSOR_MEMORY_LEAK,
            R::CUDA_ERROR_MPS_CLIENT_TERMINATED,
            R::CUDA_ERROR_EXTERNAL_DEVICE,
        ] {
            assert!(is_sticky(code), "{code:?} is not sticky");
        }
    }
}
