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
        if let Err(e) = self.check_exec(program, count, scalars.len(), &params) {
            return self.reject(e);
        }
        // The last `exec`'s views passed the alignment check when they were
        // pushed, and the alignment never changes: an `exec` on the same
        // views (a kernel run again on the same tensors) shares their range
        // and checks nothing again, so it costs what one on whole buffers
        // does (whose offset 0 the compiler knows is aligned). Otherwise the
        // check is a plain scan; the error is built after it, out of the
        // loop.
        let buffers = match self.last_exec_views(count, &get) {
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
        let first_scalar = self.batch.scalars.len();
        self.batch.scalars.extend_from_slice(scalars);
        self.batch.commands.push(Command::Exec {
            program: program.clone(),
            buffers,
            scalars: first_scalar..self.batch.scalars.len(),
            params,
        });
        self
    }

    /// The range of the last `exec`'s views in the batch, when the views
    /// `get(0..count)` are the same views.
    #[inline]
    fn last_exec_views<'b>(
        &self,
        count: usize,
        get: &impl Fn(usize) -> (&'b BufferOf<E::Backend>, usize, usize),
    ) -> Option<Range<usize>> {
        let Range { start, end } = self.batch.last_exec_buffers.clone();
        let last = &self.batch.buffers[start as usize..end as usize];
        let same = last.len() == count
            && last.iter().enumerate().all(|(index, old)| {
                let (buffer, offset, len) = get(index);
                old.buffer().same_as(buffer)
                    && old.offset() == offset
                    && old.len() == len
                    && !is_deallocated(buffer)
            });
        same.then_some(start as usize..end as usize)
    }

    /// Adds the views `get(0..count)` to the batch, as the range the next
    /// `exec` on the same views shares, with a use of each buffer `alloca`
    /// made (none before index `ordered_from`, where the caller knows);
    /// `Err(index)` for the first whose `dealloca` was recorded (the batch
    /// is then rejected, and lets the uses taken go).
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
        let range = first..batch.buffers.len();
        // Past `u32::MAX` handles, later `exec`s just clone again.
        batch.last_exec_buffers = u32::try_from(range.start)
            .and_then(|start| Ok(start..u32::try_from(range.end)?))
            .unwrap_or(0..0);
        Ok(range)
    }
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
