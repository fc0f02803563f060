//! Kernel launches on a queue's stream: a batch's run of `exec`s put on
//! the stream one `cuLaunchKernel` each, with nothing allocated, nothing
//! locked and the kernel counter touched once per run.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use cudarc::driver::LaunchConfig;

use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::{Program, Scalar};
use crate::queue::{Batch, ExecAt};
use crate::sync::Ordering;
use crate::view::View;

use super::launch;
use super::stream::Shared;
use super::{Cuda, CudaProgram};

/// Parameters a launch passes from the stack; more (up to CUDA's
/// 4 KiB) take two small allocations.
const INLINE_PARAMETERS: usize = 32;

/// An exec's parameters as the kernel takes them, one 8-byte cell each:
/// the buffers' device addresses, then the scalars, each scalar's bytes
/// starting its cell (which is what the driver reads for a 4-byte one).
pub(super) fn parameter_values<'a>(
    buffers: &'a [View<Cuda>],
    scalars: &'a [Scalar],
) -> impl Iterator<Item = u64> + 'a {
    buffers.iter().map(super::stream::pointer).chain(
        scalars
            .iter()
            .map(|scalar| u64::from_ne_bytes(scalar.to_ne_bytes().0)),
    )
}

impl Shared {
    /// Launches the `exec`s from command `from` of `batch` up to the first
    /// other command, whose index it returns; or the index of the one that
    /// failed, and why. Execs after one with the same work sizes reuse its
    /// launch configuration (all of them, compared with none, in a batch
    /// of [`uniform_params`](Batch::uniform_params)). Out of line: one
    /// call per run of kernels, and the loop's code no longer depends on
    /// what else is inlined into `enqueue` (unrelated changes had moved it
    /// by 8 instructions an `exec`, `benches/callgrind.sh`).
    #[inline(never)]
    pub(super) fn launch_run(
        &self,
        batch: &Batch<Cuda>,
        from: usize,
    ) -> std::result::Result<usize, (usize, Error)> {
        let mut last: Option<(&ExecParams, LaunchConfig)> = None;
        // Every `exec` with the same work sizes: the first's configuration
        // serves them all, with no comparison per `exec`.
        let uniform = batch.uniform_params();
        let mut index = from;
        let outcome = loop {
            let Some(ExecAt {
                program,
                views,
                scalars,
                params,
                ..
            }) = batch.exec_at(index)
            else {
                break Ok(index);
            };
            let config = match last {
                Some((same, config)) if uniform || same == params => config,
                _ => {
                    let config = launch::launch_config(params);
                    last = Some((params, config));
                    config
                }
            };
            if let Err(error) = self.launch(program, views, scalars, params, config) {
                break Err((index, error));
            }
            index += 1;
        };
        // Counted, the failed launch too, before the signals after the run
        // are recorded, so whoever they wake sees the count.
        let tried = index - from + usize::from(outcome.is_err());
        self.kernels.fetch_add(tried as u64, Ordering::Relaxed);
        outcome
    }

    /// Launches `program` with `config` (`params`' grid = global / local,
    /// block = local, and shared memory); its parameters are the buffers'
    /// device pointers, then the scalars. Inlined into `launch_run`'s loop:
    /// the call was a tenth of hwqueue's own cost of an `exec`.
    #[inline(always)]
    pub(super) fn launch(
        &self,
        program: &CudaProgram,
        buffers: &[View<Cuda>],
        scalars: &[Scalar],
        params: &ExecParams,
        config: LaunchConfig,
    ) -> Result<()> {
        // At most CUDA's `PARAMETER_BYTES` / 8: `CudaEngine::check_exec`
        // refused more when the `exec` was recorded (and any count is safe
        // here: more than the inline cells spill to the heap).
        let count = buffers.len() + scalars.len();
        // A launch without dynamic shared memory never needs the opt-in.
        if params.shared_memory() > 0 {
            program.opt_in_shared(params.shared_memory())?;
        }
        let values = parameter_values(buffers, scalars);
        // Each parameter in an 8-byte, 8-aligned cell. On the stack for the usual few, left uninitialised but for the
        // `count` written (clearing even 32 cells per launch was an eighth
        // of hwqueue's own cost of an `exec`), and no launch builder's
        // `Vec` of argument pointers: no allocation.
        let mut cells = [const { MaybeUninit::<u64>::uninit() }; INLINE_PARAMETERS];
        let mut inline = [const { MaybeUninit::<*mut c_void>::uninit() }; INLINE_PARAMETERS];
        let mut spilled: (Vec<MaybeUninit<u64>>, Vec<MaybeUninit<*mut c_void>>);
        let (cells, pointers) = if count <= INLINE_PARAMETERS {
            (&mut cells[..count], &mut inline[..count])
        } else {
            spilled = (
                vec![MaybeUninit::uninit(); count],
                vec![MaybeUninit::uninit(); count],
            );
            (&mut spilled.0[..], &mut spilled.1[..])
        };
        for ((cell, pointer), value) in cells.iter_mut().zip(pointers.iter_mut()).zip(values) {
            pointer.write(cell.write(value) as *mut u64 as *mut c_void);
        }
        // SAFETY: the loop above wrote every one of the `count` pointers
        // (`values` yields exactly `count` items), and `MaybeUninit<T>` has
        // `T`'s layout.
        let pointers = unsafe {
            std::slice::from_raw_parts_mut(pointers.as_mut_ptr().cast::<*mut c_void>(), count)
        };
        // SAFETY: the context is current (`enqueue`). The parameters are
        // exactly the kernel ABI of `CudaProgram` (one device pointer per
        // buffer, then the scalars), in counts checked against the program
        // at record time; each points at a live 8-byte cell the driver
        // copies before it returns. Every buffer belongs to this stream's
        // device and is kept alive until the stream passed this launch
        // (`InFlight`). What the kernel does with them is the kernel's
        // contract, as with any GPU kernel.
        // The pointer is the driver's `cuLaunchKernel` (`super::entry`).
        unsafe {
            (self.entries.launch_kernel)(
                program.function().cu_function(),
                config.grid_dim.0,
                config.grid_dim.1,
                config.grid_dim.2,
                config.block_dim.0,
                config.block_dim.1,
                config.block_dim.2,
                config.shared_mem_bytes,
                self.stream.cu_stream(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| {
            if launch::is_sticky(e.0) {
                self.fault("launching a kernel", e)
            } else {
                Error::KernelFailed {
                    program: program.name().to_owned(),
                    message: format!("the launch failed: {e}"),
                }
            }
        })
    }
}
