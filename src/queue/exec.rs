//! Recording an `exec`, the command a compiler's hot loop records most:
//! the checks it skips when an `exec` is like the last, the views it shares
//! with the last `exec` on the same arguments, and the use each buffer made
//! by `alloca` takes.

use std::ops::Range;

use crate::backend::{BufferOf, ProgramOf};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::{Program, Scalar};
use crate::view::View;

use super::HardwareQueue;
use super::batch::{Batch, Command};
use super::checks::{check_exec, is_deallocated};
use super::engine::Engine;
use super::recording::Queue;

/// What `check_exec` checked last: the parameters, the program's buffer and
/// scalar counts, the counts given. The check is a pure function of these
/// (the kind and limits never change), so an `exec` like the last skips it.
pub(super) type CheckedExec = (ExecParams, (usize, usize), (usize, usize));

impl<E: Engine> Queue<E> {
    #[inline]
    fn check_exec(
        &mut self,
        program: &ProgramOf<E::Backend>,
        buffers: usize,
        scalars: usize,
        params: &ExecParams,
    ) -> Result<()> {
        let key = (
            *params,
            (program.buffer_count(), program.scalar_count()),
            (buffers, scalars),
        );
        if self.last_checked.as_deref() != Some(&key) {
            check_exec(
                self.engine.kind(),
                self.engine.limits(),
                program.name(),
                key.1,
                key.2,
                params,
            )?;
            // The key holds the last `exec`'s work sizes (a repeated
            // `exec`, which skips this, has the same): this one's may
            // differ from the batch's earlier `exec`s', where there are
            // any (exactly where `last_exec` has not wrapped; a batch
            // that starts with a wait or an upload keeps the flag clear).
            if self.batch.last_exec != 0 || self.batch.commands.len() > u32::MAX as usize {
                self.batch.mixed_params = true;
            }
            match &mut self.last_checked {
                Some(last) => **last = key,
                None => self.last_checked = Some(Box::new(key)),
            }
        }
        Ok(())
    }

    /// Records an `exec` of `count` buffer arguments, argument `i` being
    /// the view `get(i)` (buffer, offset, length).
    #[inline]
    pub(super) fn record_exec<'b>(
        &mut self,
        program: &ProgramOf<E::Backend>,
        count: usize,
        get: impl Fn(usize) -> (&'b BufferOf<E::Backend>, usize, usize),
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self {
        if self.rejected.is_some() {
            return self;
        }
        // The last `exec`'s views passed the alignment check when they were
        // pushed, and the alignment never changes: an `exec` on the same
        // views (a kernel run again on the same tensors) shares their range
        // and checks nothing again, so it costs what one on whole buffers
        // does (whose offset 0 the compiler knows is aligned).
        let last = (self.batch.last_exec as usize).checked_sub(1);
        let (shared, repeats) = match last.and_then(|index| self.batch.exec_at(index)) {
            Some(last) => {
                let shared = same_views(last.views, count, &get).then_some(last.range);
                let repeats = shared.is_some()
                    && repeats(
                        last.program,
                        last.scalars,
                        last.params,
                        program,
                        scalars,
                        &params,
                    );
                (shared, repeats)
            }
            None => (None, false),
        };
        if repeats && let Some(buffers) = shared {
            return self.push_exec(program, buffers, scalars, params);
        }
        self.check_and_record_exec(program, count, get, scalars, params, shared)
    }

    /// [`record_exec`](Self::record_exec) of an `exec` that does not
    /// repeat the last, on the last one's views where `shared` says so.
    /// (Inlined: out of line, the call cost an `exec` of a CPU queue, whose
    /// engine checks nothing, 45 instructions in `benches/dispatch.rs`'s
    /// `exec_swapped`; a repeated CUDA `exec` gains 6 from it.)
    #[inline]
    fn check_and_record_exec<'b>(
        &mut self,
        program: &ProgramOf<E::Backend>,
        count: usize,
        get: impl Fn(usize) -> (&'b BufferOf<E::Backend>, usize, usize),
        scalars: &[Scalar],
        params: ExecParams,
        shared: Option<Range<usize>>,
    ) -> &mut Self {
        if let Err(e) = self.check_exec(program, count, scalars.len(), &params) {
            return self.reject(e);
        }
        // Views not shared with the last `exec`: the alignment check is a
        // plain scan; the error is built after it, out of the loop.
        let buffers = match shared {
            Some(buffers) => buffers,
            None => {
                let alignment = self.engine.limits().view_alignment;
                // A power of two (see `Limits::view_alignment`): a mask, not
                // a division per view; any other value is still honoured.
                let misaligned = |offset: usize| {
                    if alignment.is_power_of_two() {
                        offset & (alignment - 1) != 0
                    } else {
                        !offset.is_multiple_of(alignment)
                    }
                };
                // One scan for both exceptions: a misaligned view (refused)
                // and a buffer `alloca` made (it takes a use).
                let special = (0..count).find(|&index| {
                    let (buffer, offset, _) = get(index);
                    misaligned(offset) || buffer.queue_ordered().is_some()
                });
                if let Some(start) = special
                    && let Some(index) = (start..count).find(|&index| misaligned(get(index).1))
                {
                    let (buffer, offset, len) = get(index);
                    return self.reject(Error::ViewMisaligned {
                        what: format!("buffer {index} of exec `{}`", program.name()),
                        offset,
                        end: offset + len,
                        size: buffer.size(),
                        alignment,
                    });
                }
                match self.push_buffers(count, &get, special) {
                    Ok(buffers) => buffers,
                    Err(index) => {
                        let what = format!("buffer {index} of exec `{}`", program.name());
                        let detail = get_refusal(&get, index);
                        return self.reject(Error::UseAfterDealloca { what, detail });
                    }
                }
            }
        };
        if let Err(e) = self.engine.check_exec(
            program,
            &self.batch.buffers[buffers.clone()],
            scalars,
            &params,
        ) {
            return self.reject(e);
        }
        self.push_exec(program, buffers, scalars, params)
    }

    /// Records an `exec` that passed its checks, on the batch's views
    /// `buffers`.
    #[inline]
    fn push_exec(
        &mut self,
        program: &ProgramOf<E::Backend>,
        buffers: Range<usize>,
        scalars: &[Scalar],
        params: ExecParams,
    ) -> &mut Self {
        let batch = &mut self.batch;
        let first_scalar = batch.scalars.len();
        if !scalars.is_empty() {
            batch.scalars.extend_from_slice(scalars);
        }
        let scalars = first_scalar..batch.scalars.len();
        batch.push_with(|| Command::Exec {
            program: program.clone(),
            buffers,
            scalars,
            params,
        });
        // Wraps past `u32::MAX` commands, harmlessly (see `Batch::last_exec`).
        batch.last_exec = batch.commands.len() as u32;
        self
    }

    /// Adds the views `get(0..count)` to the batch with a use of each
    /// buffer `alloca` made (none before index `ordered_from`, where the
    /// caller knows); `Err(index)` for the first whose `dealloca` was
    /// recorded (the batch is then rejected, and lets the uses taken go).
    #[inline]
    fn push_buffers<'b>(
        &mut self,
        count: usize,
        get: impl Fn(usize) -> (&'b BufferOf<E::Backend>, usize, usize),
        ordered_from: Option<usize>,
    ) -> std::result::Result<Range<usize>, usize> {
        let batch = &mut self.batch;
        let first = batch.buffers.len();
        batch.buffers.extend((0..count).map(|index| {
            let (buffer, offset, len) = get(index);
            View::from_parts(buffer.clone(), offset, len)
        }));
        if let Some(start) = ordered_from {
            take_uses(batch, start..count, &get)?;
        }
        Ok(first..batch.buffers.len())
    }
}

/// Whether the views `last` (of the last `exec`) are the views
/// `get(0..count)`.
#[inline(always)]
fn same_views<'b, B: crate::backend::Backend>(
    last: &[View<B>],
    count: usize,
    get: &impl Fn(usize) -> (&'b BufferOf<B>, usize, usize),
) -> bool {
    if last.len() != count {
        return false;
    }
    // A plain loop: `Iterator::all` over it was a call even for none.
    for (index, old) in last.iter().enumerate() {
        let (buffer, offset, len) = get(index);
        if !(old.buffer().same_as(buffer)
            && old.offset() == offset
            && old.len() == len
            && !is_deallocated(buffer))
        {
            return false;
        }
    }
    true
}

/// Whether an `exec` of `program` with `scalars` and `params`, on the last
/// `exec`'s views, repeats that `exec` (of `last`, with `last_scalars` and
/// `last_params`): the same program (a clone of its handle), work sizes and
/// scalar types. Every check the last one passed then holds again, since
/// each is a function of exactly these and the views (see
/// [`Engine::check_exec`]) and of the queue, which does not change; so a
/// kernel run again and again on the same tensors (a step of a training
/// loop) is checked once per batch.
///
/// Always inlined: left to the compiler, whether it was (and how its scalar
/// loop came out) changed with unrelated code elsewhere in the crate, and a
/// repeated CUDA `exec` moved between 323 and 330 instructions
/// (`BENCH=cuda benches/callgrind.sh`) with it.
#[inline(always)]
fn repeats<P: Program>(
    last: &P,
    last_scalars: &[Scalar],
    last_params: &ExecParams,
    program: &P,
    scalars: &[Scalar],
    params: &ExecParams,
) -> bool {
    last.same_as(program)
        && last_params == params
        && last_scalars.len() == scalars.len()
        && last_scalars
            .iter()
            .zip(scalars)
            .all(|(old, new)| std::mem::discriminant(old) == std::mem::discriminant(new))
}

/// A use of each buffer `alloca` made among the views `get(indices)`, for
/// `batch`; `Err(index)` for the first whose `dealloca` was recorded.
#[inline(never)]
fn take_uses<'b, B: crate::backend::Backend>(
    batch: &mut Batch<B>,
    indices: Range<usize>,
    get: &impl Fn(usize) -> (&'b BufferOf<B>, usize, usize),
) -> std::result::Result<(), usize> {
    for index in indices {
        let buffer = get(index).0;
        if buffer.queue_ordered().is_some() && batch.take_use(buffer, String::new).is_err() {
            return Err(index);
        }
    }
    Ok(())
}

/// What the buffer of view `index` is refused with.
#[cold]
fn get_refusal<'b, B: Buffer + 'b>(
    get: &impl Fn(usize) -> (&'b B, usize, usize),
    index: usize,
) -> String {
    get(index)
        .0
        .queue_ordered()
        .map_or_else(String::new, |ordered| ordered.refusal())
}
