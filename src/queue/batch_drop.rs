//! How a batch drops its commands when it is cleared: in place.

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
        let len = self.commands.len();
        let base = self.commands.as_mut_ptr();
        // SAFETY: the length goes to 0 first, so a drop that panics leaks
        // the commands after it instead of leaving them to be dropped
        // again; each of the `len` initialised commands is dropped exactly
        // once, whole: an `Exec` or `Signal` by its one field that needs a
        // drop (the others are plain data, asserted above for `Exec`; a
        // signal's value is a `u64`), any other by the enum's drop.
        unsafe {
            self.commands.set_len(0);
            for index in 0..len {
                let command = base.add(index);
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
        }
    }

    /// [`clear`](Self::clear)s it for reuse; `false` where a drop it ran
    /// panicked (a value of the caller's): the panic's message is left for
    /// [`Ledger::letting_go`](super::Ledger::letting_go) to tell the owner,
    /// and the rest of the batch is dropped (its uses let go), not kept.
    pub fn clear_caught(&mut self) -> bool {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let Err(payload) = catch_unwind(AssertUnwindSafe(|| self.clear())) else {
            return true;
        };
        crate::transfer::contain_panic(crate::error::panic_message(payload));
        let lost = std::mem::take(self);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(lost)));
        false
    }
}
