//! How a batch drops its commands when it is cleared: in place, and on
//! past a command whose drop panics.

use std::ops::Range;

use crate::backend::Backend;
use crate::params::ExecParams;

use super::{Batch, Command};

impl<B: Backend> Batch<B> {
    /// Empties `commands`, dropping the two a hot loop records (`exec`,
    /// `signal`: one handle each, their other fields need no drop) in
    /// place and inline: the enum's own drop is a call and a jump table
    /// per command, and moving each out first copied its 80 bytes twice.
    #[inline]
    pub(super) fn drop_commands(&mut self) {
        const _: () = assert!(
            !std::mem::needs_drop::<ExecParams>() && !std::mem::needs_drop::<Range<usize>>()
        );
        /// On a panic in one command's drop (a caller's upload owner),
        /// drops the commands after it, as a slice's drop does, so that
        /// none leaks (their views, signals, `dealloca`s); a second panic
        /// aborts, as there.
        struct Rest<B: Backend> {
            base: *mut Command<B>,
            next: usize,
            len: usize,
        }
        impl<B: Backend> Drop for Rest<B> {
            fn drop(&mut self) {
                for index in self.next..self.len {
                    // SAFETY: commands `next..len` are initialised and not
                    // dropped yet (`next` passed each one before its drop
                    // began), and the vector no longer owns them.
                    unsafe { std::ptr::drop_in_place(self.base.add(index)) };
                }
            }
        }
        let len = self.commands.len();
        let base = self.commands.as_mut_ptr();
        // SAFETY: the length goes to 0 first, so nothing is left to the
        // vector to drop again; each of the `len` initialised commands is
        // dropped exactly once, whole: an `Exec` or `Signal` by its one
        // field that needs a drop (the others are plain data, asserted
        // above for `Exec`; a signal's value is a `u64`), any other by the
        // enum's drop; those after one whose drop panicked by `Rest`.
        unsafe {
            self.commands.set_len(0);
            let mut rest = Rest { base, next: 0, len };
            while rest.next < len {
                let command = base.add(rest.next);
                rest.next += 1;
                match &mut *command {
                    // Every field named: one added to either variant is a
                    // compile error here, not a silent leak.
                    Command::Exec {
                        program,
                        buffers: _,
                        scalars: _,
                        params: _,
                    } => std::ptr::drop_in_place(program),
                    Command::Signal { signal, value: _ } => std::ptr::drop_in_place(signal),
                    _ => std::ptr::drop_in_place(command),
                }
            }
            std::mem::forget(rest);
        }
    }
}
