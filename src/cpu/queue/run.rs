//! How the worker runs one batch: each command in order, an `exec`'s
//! buffers held across a run of `exec`s on the same ones, and the scratch
//! memory that makes an `exec` allocate nothing.

use std::mem;
use std::ops::Range;

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::memory::Access;
use crate::params::ExecParams;
use crate::program::{Program, Scalar};
use crate::queue::{Batch, Command};
use crate::signal::{TimelineSignal, Timeout};
use crate::sync::{Ordering, fence};
use crate::view::View;

use super::profile::BatchProfile;
use crate::cpu::buffer::Held;
use crate::cpu::pool::{Grid, Pool};
use crate::cpu::program::{BufferView, KernelArgs};
use crate::cpu::{Cpu, CpuBuffer, CpuProgram};

/// Runs a batch; on failure, the index of the failed command and why.
pub(super) fn run_batch(
    batch: &Batch<Cpu>,
    pool: &Pool,
    scratch: &mut ExecScratch,
    profile: Option<&mut BatchProfile<'_>>,
) -> std::result::Result<(), (usize, Error)> {
    let mut held = HeldBuffers::new(scratch);
    let outcome = run_commands(batch, pool, &mut held, profile);
    held.finish(scratch);
    outcome
}

fn run_commands<'a>(
    batch: &'a Batch<Cpu>,
    pool: &Pool,
    held: &mut HeldBuffers<'a>,
    mut profile: Option<&mut BatchProfile<'_>>,
) -> std::result::Result<(), (usize, Error)> {
    let commands = batch.commands();
    // Past the group of sends and receives the loop just ran.
    let mut next = 0;
    for (index, command) in commands.iter().enumerate() {
        if index < next {
            continue;
        }
        if !matches!(command, Command::Exec { .. }) {
            // Buffers stay held only from one `exec` to the next.
            held.release();
        }
        let result = match command {
            // A send or receive, and those right after it: one group.
            Command::Collective(collective) if collective.op.peer().is_some() => {
                let group = super::collective::p2p_group(&commands[index..]);
                next = index + group.len();
                let outcome = super::collective::run_p2p_group(&group);
                if let Some(profile) = profile.as_deref_mut() {
                    // One end for every member, up to the one that failed.
                    let failed = outcome.as_ref().err().map_or(group.len(), |(at, _)| *at);
                    for _ in 0..failed {
                        profile.record(&Ok(()));
                    }
                    if let Err((_, error)) = &outcome {
                        profile.record(&Err(error.clone()));
                    }
                }
                outcome.map_err(|(at, error)| (index + at, error))?;
                continue;
            }
            Command::Wait { signal, value } => signal.wait(*value, Timeout::Forever),
            Command::WaitSettled { signal, value } => {
                crate::queue::settled(signal.wait(*value, Timeout::Forever))
            }
            Command::WaitForeign { signal, value } => signal.wait_forever(*value),
            Command::Signal { signal, value } => {
                signal.set(*value);
                Ok(())
            }
            Command::Exec {
                program,
                buffers,
                scalars,
                params,
            } => run_exec(
                program,
                batch.buffers(),
                buffers.clone(),
                &batch.scalars()[scalars.clone()],
                params,
                pool,
                held,
            ),
            Command::Copy { dst, src } => run_copy(dst, src),
            Command::Fill {
                dst,
                pattern,
                width,
            } => run_fill(dst, &pattern[..usize::from(*width)]),
            // Host accesses at the views (lengths checked at record time):
            // the buffer's lock orders them with kernels of other queues.
            Command::Upload { dst, data } => {
                dst.buffer()
                    .write_bytes(Access::Queue, dst.offset(), batch.host_bytes(data))
            }
            Command::Download { src, sink } => {
                sink.complete(|out| src.buffer().read_bytes(Access::Queue, src.offset(), out))
            }
            Command::Collective(collective) => super::collective::run_collective(collective),
            Command::Barrier => {
                fence(Ordering::SeqCst);
                Ok(())
            }
            // The range was taken when the `alloca` was recorded.
            Command::Alloca { .. } => Ok(()),
            // No replay form: `check_replay` refuses it at record time.
            Command::Replay { index } => Err(Error::ReplayNotRecorded {
                index: *index,
                recorded: 0,
            }),
            // Every earlier command of this queue ran: the range goes back
            // now, or when the last batch of another queue using it is let
            // go.
            Command::Dealloca { buffer } => {
                crate::memory::dealloca_completed(buffer);
                Ok(())
            }
        };
        if let Some(profile) = profile.as_deref_mut() {
            profile.record(&result);
        }
        result.map_err(|error| (index, error))?;
    }
    Ok(())
}

fn run_copy(dst: &View<Cpu>, src: &View<Cpu>) -> Result<()> {
    let (dst_buffer, src_buffer) = (dst.buffer(), src.buffer());
    let copy = || {
        // SAFETY: both views lie in their buffers (checked when made), are
        // of equal length (checked at record time), and do not overlap
        // (checked at record time when of one buffer; distinct allocations
        // otherwise); the caller holds both buffers exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src_buffer.as_ptr().add(src.offset()),
                dst_buffer.as_ptr().add(dst.offset()),
                src.len(),
            );
        }
    };
    let (first, second) = lock_order(dst_buffer, src_buffer);
    let a = first.lock_exclusive();
    let b = second.map(CpuBuffer::lock_exclusive);
    let what = if b.is_some() {
        "a buffer of the copy"
    } else {
        "the copy's buffer"
    };
    a.check(|| what.into())?;
    if let Some(b) = &b {
        b.check(|| what.into())?;
    }
    copy();
    Ok(())
}

/// Two buffers a command holds at once, in the order every queue locks
/// them, their allocations' ids, as `run_exec` does, so two queues never
/// wait on each other's buffers in a cycle (ids are distinct; addresses
/// are not: every empty buffer has the same one); no second when both are
/// one buffer.
pub(super) fn lock_order<'a>(
    a: &'a CpuBuffer,
    b: &'a CpuBuffer,
) -> (&'a CpuBuffer, Option<&'a CpuBuffer>) {
    if a.same_as(b) {
        (a, None)
    } else if a.id() < b.id() {
        (a, Some(b))
    } else {
        (b, Some(a))
    }
}

/// Fills `dst` with `pattern` (1, 2 or 4 bytes; `dst`'s offset and length
/// are multiples of its width, checked at record time).
fn run_fill(dst: &View<Cpu>, pattern: &[u8]) -> Result<()> {
    let buffer = dst.buffer();
    let held = buffer.lock_exclusive();
    held.check(|| "the fill destination".into())?;
    // SAFETY: the view lies in the buffer (checked when made), which is
    // held exclusively, so these bytes are valid and nobody else's now.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr().add(dst.offset()), dst.len()) };
    fill_pattern(bytes, pattern);
    Ok(())
}

/// Writes `pattern` over `bytes`, as wide stores where aligned.
fn fill_pattern(bytes: &mut [u8], pattern: &[u8]) {
    match *pattern {
        [byte] => bytes.fill(byte),
        [a, b] => match bytemuck::try_cast_slice_mut::<u8, u16>(bytes) {
            Ok(words) => words.fill(u16::from_ne_bytes([a, b])),
            Err(_) => bytes
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(pattern)),
        },
        [a, b, c, d] => match bytemuck::try_cast_slice_mut::<u8, u32>(bytes) {
            Ok(words) => words.fill(u32::from_ne_bytes([a, b, c, d])),
            Err(_) => bytes
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(pattern)),
        },
        _ => unreachable!("the core accepts 1-, 2- and 4-byte patterns only"),
    }
}

/// Memory every `exec` of a worker reuses, so that running one allocates
/// nothing once the vectors have grown. Kept empty between batches.
#[derive(Default)]
pub(super) struct ExecScratch {
    /// Indices into the `exec`'s buffers, in lock order.
    order: Vec<usize>,
    /// Room for the buffer guards.
    guards: Vec<Held<'static>>,
    /// Room for the kernel's views.
    views: Vec<BufferView<'static>>,
}

/// The buffers of the last `exec` of a batch, held exclusively with their
/// views, while the next command is an `exec` of the same buffers: a run of
/// `exec`s on one set of buffers takes the locks once. Released before any
/// other command (a `wait` must never hold a buffer the host may need to
/// read before it signals) and at the end of the batch.
struct HeldBuffers<'a> {
    /// The range of `Batch::buffers` held, if any.
    range: Option<Range<usize>>,
    order: Vec<usize>,
    guards: Vec<Held<'a>>,
    views: Vec<BufferView<'a>>,
}

impl<'a> HeldBuffers<'a> {
    fn new(scratch: &mut ExecScratch) -> Self {
        Self {
            range: None,
            order: mem::take(&mut scratch.order),
            guards: recycle(mem::take(&mut scratch.guards)),
            views: recycle(mem::take(&mut scratch.views)),
        }
    }

    /// Holds `buffers[range]` exclusively, in the order of their
    /// allocations' ids (each once), with views; refuses a buffer whose
    /// range a `dealloca` gave back.
    fn hold(&mut self, buffers: &'a [View<Cpu>], range: Range<usize>) -> Result<()> {
        if self.range.as_ref() == Some(&range) {
            return Ok(());
        }
        self.release();
        let buffers = &buffers[range.clone()];
        let order = &mut self.order;
        order.clear();
        order.extend(0..buffers.len());
        order.sort_unstable_by_key(|&i| buffers[i].buffer().id());
        order.dedup_by_key(|i| buffers[*i].buffer().id());
        self.guards
            .extend(order.iter().map(|&i| buffers[i].buffer().lock_exclusive()));
        let checked = self
            .guards
            .iter()
            .zip(order.iter())
            .try_for_each(|(guard, &index)| guard.check(|| format!("buffer {index} of the exec")));
        if let Err(error) = checked {
            self.release();
            return Err(error);
        }
        self.views.extend(
            buffers
                .iter()
                // SAFETY: each view lies in its buffer (checked when made),
                // whose memory is valid, initialised bytes, held exclusively
                // by `self.guards` until `release`, which clears these views
                // first.
                .map(|v| unsafe { BufferView::new(v.buffer().as_ptr().add(v.offset()), v.len()) }),
        );
        self.range = Some(range);
        Ok(())
    }

    /// Drops the views, then the guards.
    fn release(&mut self) {
        self.views.clear();
        self.guards.clear();
        self.range = None;
    }

    /// Releases everything and gives the memory back to `scratch`.
    fn finish(mut self, scratch: &mut ExecScratch) {
        self.release();
        scratch.order = self.order;
        scratch.views = recycle(self.views);
        scratch.guards = recycle(self.guards);
    }
}

/// An empty vector on `vec`'s memory, for elements that differ from `vec`'s
/// only in a lifetime: the scratch vectors hold `'static` element types
/// between `exec`s and borrowed ones during an `exec`.
#[inline]
fn recycle<T, U>(mut vec: Vec<T>) -> Vec<U> {
    const {
        assert!(size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>());
    }
    vec.clear();
    let mut vec = mem::ManuallyDrop::new(vec);
    // SAFETY: the pointer and capacity come from a `Vec<T>` of the global
    // allocator, and `U` has `T`'s size and alignment (asserted above), so
    // they describe the same allocation as a `Vec<U>`; the length is 0, so
    // no `T` is reinterpreted as a `U`; `ManuallyDrop` keeps the old vector
    // from freeing the memory the new one now owns.
    unsafe { Vec::from_raw_parts(vec.as_mut_ptr().cast::<U>(), 0, vec.capacity()) }
}

fn run_exec<'a>(
    program: &CpuProgram,
    batch_buffers: &'a [View<Cpu>],
    buffers: Range<usize>,
    scalars: &[Scalar],
    params: &ExecParams,
    pool: &Pool,
    held: &mut HeldBuffers<'a>,
) -> Result<()> {
    held.hold(batch_buffers, buffers)?;
    let args = KernelArgs::new(program, &held.views, scalars);
    let grid = Grid {
        groups: params.groups(),
        local: params.local(),
    };
    pool.run(program, &args, grid, params.group_count())
        .map_err(|message| Error::KernelFailed {
            program: program.name().to_owned(),
            message,
        })
}
