//! The checks the queue core makes when a command is recorded, the same
//! for every backend: the `exec` arguments against the program and the
//! limits, and that no `dealloca` of a buffer was recorded.

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};

use super::QueueKind;

/// Whether a `dealloca` of `buffer` was recorded.
#[inline]
pub(super) fn is_deallocated<T: Buffer>(buffer: &T) -> bool {
    buffer
        .queue_ordered()
        .is_some_and(|ordered| ordered.is_dealloca_recorded())
}

/// The checks every backend makes when an `exec` is recorded: the queue's
/// kind, the work sizes against `limits`, and the argument counts (`takes`
/// is what the program declares, `given` what the `exec` passes; each is
/// `(buffers, scalars)`).
pub(super) fn check_exec(
    kind: QueueKind,
    limits: &Limits,
    program: &str,
    takes: (usize, usize),
    given: (usize, usize),
    params: &ExecParams,
) -> Result<()> {
    if kind == QueueKind::Copy {
        return Err(Error::UnsupportedCommand {
            kind,
            command: "exec",
        });
    }
    params.validate(limits)?;
    let bad = |reason: String| {
        Err(Error::InvalidArguments {
            program: program.to_owned(),
            reason,
        })
    };
    if given.0 != takes.0 {
        return bad(format!(
            "it takes {} buffer(s) but {} were given",
            takes.0, given.0
        ));
    }
    if given.1 != takes.1 {
        return bad(format!(
            "it takes {} scalar(s) but {} were given",
            takes.1, given.1
        ));
    }
    if given.0 > limits.max_buffers {
        return bad(format!(
            "{} buffers exceed the device's limit of {} for one kernel; pass fewer (several \
             arrays in one buffer, at offsets, or the kernel split in two)",
            given.0, limits.max_buffers
        ));
    }
    Ok(())
}
