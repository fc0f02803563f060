//! A collective on a CPU queue's worker: through the communicator's
//! staging memory when it is small enough to ride along the ranks'
//! description exchange, else over the views' own memory, held from the
//! moment the ranks agreed until the data moved.
//!
//! Handing MPI the views' memory saves two copies of the data (at 64 MiB,
//! as long as a third of the collective). The price is what a timeout
//! leaves: MPI cannot cancel a started collective, so the views' buffers
//! are then [lost](crate::memory::Allocation::lose): refused with
//! [`Error::MemoryLost`](crate::Error::MemoryLost) from then on, their
//! memory never reused.

use crate::buffer::Buffer;
use crate::collective::{Collective, HostCollective, HostViews};
use crate::error::Result;
use crate::memory::Access;
use crate::view::View;

use super::run::lock_order;
use crate::cpu::buffer::Held;
use crate::cpu::{Cpu, CpuBuffer};

/// Runs `collective` on this worker, returning when it completed, failed
/// or timed out. Each view is locked only while it is copied (staged) or
/// while the data moves (direct), never while the ranks wait for each
/// other to agree.
pub(super) fn run_collective(collective: &Collective<Cpu>) -> Result<()> {
    let plan = HostCollective::of(collective);
    let (send, recv) = (collective.send.as_ref(), collective.recv.as_ref());
    if collective.communicator.stages(&plan) {
        let mut read = |out: &mut [u8]| match send {
            Some(view) => view.buffer().read_bytes(Access::Queue, view.offset(), out),
            None => Ok(()),
        };
        let mut write = |bytes: &[u8]| match recv {
            Some(view) => view
                .buffer()
                .write_bytes(Access::Queue, view.offset(), bytes),
            None => Ok(()),
        };
        return collective
            .communicator
            .run_on_host(&plan, &mut read, &mut write);
    }
    let in_place = matches!((send, recv), (Some(s), Some(r))
        if s.buffer().same_as(r.buffer()) && s.offset() == r.offset());
    let mut views = Views {
        send,
        recv,
        in_place,
        held: [None, None],
    };
    collective
        .communicator
        .run_on_host_direct(&plan, &mut views)
}

/// A collective's views (one view as both, or views that do not overlap:
/// recording refuses the rest), and their buffers' locks while MPI has
/// their memory.
struct Views<'a> {
    send: Option<&'a View<Cpu>>,
    recv: Option<&'a View<Cpu>>,
    /// One view as both (an `all_reduce` in place).
    in_place: bool,
    /// The buffers held, in [`lock_order`]: dropped, so released, when
    /// the worker is done with the collective.
    held: [Option<(&'a CpuBuffer, Held<'a>)>; 2],
}

impl<'a> Views<'a> {
    /// The views' buffers, each once, in the order queues lock them
    /// ([`lock_order`]).
    fn buffers(&self) -> [Option<&'a CpuBuffer>; 2] {
        match (self.send.map(View::buffer), self.recv.map(View::buffer)) {
            (Some(send), Some(recv)) => {
                let (first, second) = lock_order(send, recv);
                [Some(first), second]
            }
            (send, recv) => [send.or(recv), None],
        }
    }
}

impl HostViews for Views<'_> {
    /// Without waiting for a kernel that holds a buffer: `hold` checks
    /// again, and the early answer only spares the peers a timeout.
    fn check(&mut self) -> Result<()> {
        self.buffers()
            .into_iter()
            .flatten()
            .try_for_each(CpuBuffer::peek)
    }

    fn hold(&mut self) -> Result<(*const u8, *mut u8)> {
        let buffers = self.buffers();
        for (slot, buffer) in self.held.iter_mut().zip(buffers) {
            if let Some(buffer) = buffer {
                let held = buffer.lock_exclusive();
                held.check(|| "the collective's buffer".into())?;
                *slot = Some((buffer, held));
            }
        }
        // SAFETY: each view lies in its buffer (checked when it was made),
        // so its offset is within the allocation.
        let first = |view: &View<Cpu>| unsafe { view.buffer().as_ptr().add(view.offset()) };
        let send = self
            .send
            .map_or(std::ptr::null(), |v| first(v).cast_const());
        let recv = self.recv.map_or(std::ptr::null_mut(), first);
        Ok((send, recv))
    }

    fn in_place(&self) -> bool {
        self.in_place
    }

    fn lose(&mut self) {
        for (buffer, held) in self.held.iter_mut().flatten() {
            buffer.lose(held);
        }
    }
}
