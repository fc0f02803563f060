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
//!
//! A collective holds its views' buffers exclusively, as a kernel does,
//! the send view's too (losing it takes the exclusive hold). So two
//! collectives over two communicators that read one buffer, on two queues
//! not ordered by a signal, take it in turn: where ranks take it in
//! opposite orders, each waits for a peer that waits for the buffer, and
//! both time out. Order such queues by a signal, or send from distinct
//! buffers.

use crate::buffer::Buffer;
use crate::collective::{Collective, CollectiveError, HostCollective, HostGroupViews, HostViews};
use crate::error::{Error, Result};
use crate::memory::Access;
use crate::queue::Command;
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

/// Takes the place of `collective`, numbered, which this rank will not run
/// (its batch was refused at submit, skipped, or failed before it): it
/// still meets its peers' in the description exchange, described failed,
/// so they fail it at once (a mismatch naming this rank) and every rank
/// stays in step. Numbered at submit, a collective this rank skipped would
/// otherwise pair the peers' with this rank's next one: a mismatch for
/// good, or, where the next one is alike, data of another step. (Sends
/// and receives: [`forfeit_p2p_group`].) Blocks, as a collective does,
/// until the peers reach theirs or the timeout passes.
pub(super) fn forfeit_collective(collective: &Collective<Cpu>) {
    let plan = HostCollective::of(collective);
    let communicator = &collective.communicator;
    // Its outcome is this rank's failure, known already.
    let _ = if communicator.stages(&plan) {
        communicator.run_on_host(&plan, &mut |_| Err(not_run()), &mut |_| Ok(()))
    } else {
        communicator.run_on_host_direct(&plan, &mut Forfeit(not_run))
    };
}

/// Takes the place of a group of sends and receives (from
/// [`p2p_group`]), numbered, which this rank will not run, as
/// [`forfeit_collective`] takes a collective's: each member meets its
/// peer's, described failed, so the peer fails it at once, where the
/// peer's would otherwise pair with this rank's next send or receive and
/// take another step's data. As a group, as it would have run: its
/// members' descriptions all go at once. Blocks until every member's peer
/// described its own, or the timeout passes.
pub(super) fn forfeit_p2p_group(group: &[&Collective<Cpu>]) {
    let plans: Vec<HostCollective> = group
        .iter()
        .map(|member| HostCollective::of(member))
        .collect();
    // Its outcome is this rank's failure, known already.
    let _ = group[0]
        .communicator
        .run_p2p_on_host(&plans, &mut Forfeit(not_run));
}

/// Why a forfeited command did not run.
fn not_run() -> Error {
    Error::Abandoned {
        reason: "its batch was refused or failed before it on this rank",
    }
}

/// The views of a collective that will not run: described failed.
struct Forfeit<F>(F);

impl<F: Fn() -> Error> HostViews for Forfeit<F> {
    fn check(&mut self) -> Result<()> {
        Err((self.0)())
    }

    fn hold(&mut self, _: std::time::Instant) -> Result<Option<(*const u8, *mut u8)>> {
        Err((self.0)())
    }

    fn in_place(&self) -> bool {
        false
    }

    fn lose(&mut self) {}
}

/// The views of a group of sends and receives that will not run: each
/// described failed.
impl<F: Fn() -> Error> HostGroupViews for Forfeit<F> {
    fn check(&mut self, _: usize) -> Result<()> {
        Err((self.0)())
    }

    fn try_hold(&mut self, _: usize) -> Result<Option<(*const u8, *mut u8)>> {
        Err((self.0)())
    }

    fn release(&mut self, _: usize) {}

    fn lose(&mut self) {}
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

    /// Waits for a buffer another queue's work holds in short naps, up to
    /// `deadline` (it waited unbounded, under the communicator's start
    /// lock, while its peers timed out).
    fn hold(&mut self, deadline: std::time::Instant) -> Result<Option<(*const u8, *mut u8)>> {
        let buffers = self.buffers();
        for (slot, buffer) in self.held.iter_mut().zip(buffers) {
            if let Some(buffer) = buffer {
                let held = loop {
                    if let Some(held) = buffer.try_lock_exclusive() {
                        break held;
                    }
                    if std::time::Instant::now() >= deadline {
                        return Ok(None);
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                };
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
        Ok(Some((send, recv)))
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

/// The group of point-to-point commands that starts `commands`: the
/// first, and each `send` or `recv` right after it over the same
/// communicator (see `crate::collective` on groups).
pub(super) fn p2p_group(commands: &[Command<Cpu>]) -> Vec<&Collective<Cpu>> {
    // The grouping a forfeit follows too (`Batch::fail_from`).
    let run = crate::queue::p2p_run(commands);
    (commands[..run].iter())
        .filter_map(|command| match command {
            Command::Collective(collective) => Some(&**collective),
            _ => None,
        })
        .collect()
}

/// Runs a group of point-to-point commands (from [`p2p_group`]) over the
/// views' own memory; on failure, the index in the group of the first
/// member that failed.
pub(super) fn run_p2p_group(group: &[&Collective<Cpu>]) -> std::result::Result<(), (usize, Error)> {
    let plans: Vec<HostCollective> = group
        .iter()
        .map(|member| HostCollective::of(member))
        .collect();
    let mut views = GroupViews {
        members: group,
        held: Vec::new(),
    };
    group[0].communicator.run_p2p_on_host(&plans, &mut views)
}

/// The views of a group's members (one each), and their buffers' locks
/// while MPI has their memory.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
struct GroupViews<'a> {
    members: &'a [&'a Collective<Cpu>],
    /// Each buffer once, taken as its members start, never waiting for
    /// one (see `try_hold`), with how many started members hold it; let
    /// go when the last of them completed.
    held: Vec<(&'a CpuBuffer, Held<'a>, usize)>,
}

/// A point-to-point command's one view: a `send`'s, or a `recv`'s.
fn view_of(member: &Collective<Cpu>) -> Option<&View<Cpu>> {
    member.send.as_ref().or(member.recv.as_ref())
}

impl HostGroupViews for GroupViews<'_> {
    fn check(&mut self, index: usize) -> Result<()> {
        let member = self.members[index];
        if let Some(view) = view_of(member) {
            view.buffer().peek()?;
        }
        // A receive overlapping another member's view would be written
        // while that member's transfer reads or writes it.
        let Some(recv) = &member.recv else {
            return Ok(());
        };
        let clash = (self.members.iter().enumerate())
            .filter(|&(other, _)| other != index)
            .find(|(_, other)| view_of(other).is_some_and(|view| view.overlaps(recv)));
        match clash {
            None => Ok(()),
            Some((other, _)) => Err(CollectiveError::Invalid {
                rank: member.communicator.rank(),
                size: member.communicator.size(),
                op: member.op.name(),
                reason: format!(
                    "its receive view overlaps the view of command {} of its group of {} \
                     (sends and receives one after another in a batch run together, \
                     counted from 1): receive into memory no other of them uses, or put a \
                     signal between them",
                    other + 1,
                    self.members.len()
                ),
            }
            .into()),
        }
    }

    fn try_hold(&mut self, index: usize) -> Result<Option<(*const u8, *mut u8)>> {
        let member = self.members[index];
        let Some(view) = view_of(member) else {
            return Ok(Some((std::ptr::null(), std::ptr::null_mut())));
        };
        let buffer = view.buffer();
        match self.held.iter_mut().find(|(held, ..)| held.same_as(buffer)) {
            Some((.., users)) => *users += 1,
            None => {
                // Never waits: a buffer taken while another is held must
                // not block an `exec` that takes them in id order (a busy
                // one is asked for again).
                let Some(held) = buffer.try_lock_exclusive() else {
                    return Ok(None);
                };
                held.check(|| "the point-to-point command's buffer".into())?;
                self.held.push((buffer, held, 1));
            }
        }
        // SAFETY: the view lies in its buffer (checked when it was made),
        // so its offset is within the allocation.
        let first = unsafe { buffer.as_ptr().add(view.offset()) };
        Ok(Some(match member.send {
            Some(_) => (first.cast_const(), std::ptr::null_mut()),
            None => (std::ptr::null(), first),
        }))
    }

    fn release(&mut self, index: usize) {
        let Some(view) = view_of(self.members[index]) else {
            return;
        };
        let at = (self.held.iter()).position(|(held, ..)| held.same_as(view.buffer()));
        if let Some(at) = at {
            self.held[at].2 -= 1;
            if self.held[at].2 == 0 {
                drop(self.held.swap_remove(at));
            }
        }
    }

    fn lose(&mut self) {
        for (buffer, held, _) in &mut self.held {
            buffer.lose(held);
        }
    }
}
