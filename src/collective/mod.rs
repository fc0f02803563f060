//! Collectives: a [`Communicator`] is one rank of a group on an existing
//! distributed engine (MPI, or NCCL on CUDA), and a collective over it is a
//! *command*, recorded into a queue like a copy and ordered by the queue
//! and its signals, never a host call between two waits (as IREE's
//! `hal/channel.h` and `collective` command, and PyTorch's c10d).
//!
//! # How a collective enters a queue
//!
//! One command, [`Command::Collective`](crate::queue::Command::Collective),
//! holds a boxed [`Collective`] (the variant is one pointer): the
//! communicator, the [`CollectiveOp`], the [`Element`] type, the views it
//! reads and writes, and its place in the communicator's recording order.
//! Recording ([`Queue::all_reduce`](crate::Queue::all_reduce) and the
//! rest) checks what one rank can check (view lengths against the element
//! size and the group's size, roots and peers in range, the queue's
//! device) and asks the engine whether it runs collectives over the
//! communicator's engine ([`Engine::check_collective`](crate::Engine::check_collective)):
//! a bad one rejects the batch at `submit`, naming the rank and the sizes.
//!
//! Each engine matches the command: the CPU backend runs it on its queue's
//! worker over MPI; the CUDA backend puts it on its queue's stream over
//! NCCL (below); every other engine (Vulkan, the simulator, test mocks),
//! and CPU and CUDA queues given the other engine's (or another device's)
//! communicator, refuse it at record time ([`CollectiveError::Unsupported`],
//! `DeviceMismatch`). A refused collective still takes its place once its
//! batch is submitted, so no peer pairs it with this rank's next: over NCCL
//! that breaks the communicator ([`CollectiveError::Broken`]); over MPI the
//! peers' call fails (at the timeout where the queue cannot forfeit it).
//!
//! # On the CPU, over MPI
//!
//! The worker that reaches the command first makes sure the ranks agree:
//! they exchange a description of the collective (operation, element
//! type, counts, root, its place in the recording order), so ranks that
//! disagree fail with [`CollectiveError::Mismatch`] naming both sides
//! instead of corrupting data or hanging. Each rank's description message
//! has room for 1 KiB of its send view: a collective that small finishes in
//! the exchange itself, each rank combining the gathered contributions in
//! rank order (`small.rs`), with no second MPI call; its views are copied
//! through staging memory the communicator keeps. (A `send` or `recv`
//! exchanges with its peer alone, and one whose peer runs no matching
//! command waits for it until the timeout: `p2p.rs`. One that this rank
//! will not run, its batch refused or failed before it, still meets its
//! peer's, described failed, so the peer fails at once rather than pair
//! its receive with this rank's next send.)
//!
//! A larger one runs over the views' own memory: the worker holds their buffers
//! (as a kernel does) from the moment the ranks agreed, starts MPI's
//! non-blocking collective (`MPI_Iallreduce`, ...) on them and polls it
//! (`MPI_Test`) until it completes or the communicator's timeout passes; no
//! copies (but one for an `all_reduce` in place: rsmpi has no `MPI_IN_PLACE`,
//! so MPI sends a staging copy of the view and writes the result into it). A
//! peer that died or never comes fails the batch with
//! [`CollectiveError::Timeout`]. MPI cannot cancel a started collective, so the
//! communicator is broken ([`CollectiveError::Broken`]) from then on, and what
//! MPI may still read or write is given up to it: staging memory is leaked, and
//! a view's buffer is *lost*: every later access to it fails with
//! [`Error::MemoryLost`](crate::Error::MemoryLost), and its memory is never
//! reused.
//!
//! 16-bit floats (`half::f16` and `half::bf16`, the `half` feature) have
//! no MPI type: they move as `MPI_UINT16_T`, and `all_reduce` and
//! `reduce_scatter` combine them with user-defined MPI operations
//! (`MPI_Op_create`, commutative; `mpi_types.rs`) that compute each step
//! in `f32` and round back, as the host does for collectives of up to
//! 1 KiB (see [`CollectiveElement`]).
//!
//! Workers of several queues call MPI at once, so MPI must provide
//! `MPI_THREAD_MULTIPLE` (`Mpi::init` checks it; `Mpi::threading` reports
//! it). The collectives of one communicator must run in the same order on
//! every rank: record them on one queue, or order the queues by signals
//! (the description exchange catches the rest). Sends and receives one
//! after another in a batch run as one group (`p2p.rs`).
//!
//! # On CUDA, over NCCL (the `nccl` feature)
//!
//! An NCCL communicator is one rank on one CUDA device:
//! `Communicator::nccl_single` (rank 0 of 1, `ncclCommInitAll`),
//! `Communicator::nccl` (rank and size given, with an `NcclId` one
//! rank made and handed to the others; `ncclCommInitRank`), or, with the
//! `mpi` feature too, `Communicator::nccl_over` (rank and size from an
//! MPI world, so from `mpirun`; rank 0's id broadcast over it); the last
//! two are blocking, and `nccl_with`/`nccl_over_with` make them as an
//! `NcclConfig` says. A CUDA queue of that device runs its collectives
//! ([`Engine::check_collective`](crate::Engine::check_collective) refuses
//! another device's with [`Error::DeviceMismatch`](crate::Error::DeviceMismatch)):
//! the worker that enqueues the batch calls `ncclAllReduce`,
//! `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast`, `ncclSend` or
//! `ncclRecv` on the queue's own CUDA stream, so the collective is ordered
//! after the commands before it and its signals are recorded after it, as
//! for a kernel; no host thread waits for it. Consecutive collectives of a
//! batch over one communicator go in one `ncclGroupStart`/`ncclGroupEnd`
//! (NCCL then launches them together). A signal between two collectives
//! ends the group, and a plan records one after each operation, so a
//! plan's collectives run one group each; a rank that sends to and
//! receives from the same peer must record the two with nothing between
//! them on one queue, or NCCL deadlocks. A communicator's calls are
//! serialised across the queues that share it (NCCL forbids concurrent
//! calls on one). An NCCL error fails the batch from the command that
//! failed, with [`CollectiveError::Nccl`] (the group is ended first); one
//! this rank skips (its batch refused or failed before it) breaks the
//! communicator here ([`CollectiveError::Skipped`]). A profile times a
//! group as one entry, under its first collective.
//! `Communicator::split` is `ncclCommSplit` (NCCL 2.18 or newer; the
//! color `None` is `NCCL_SPLIT_NOCOLOR`, and gets no communicator), with
//! the MPI split's rule: every rank calls it from the host at the same
//! place of the communicator's order. A blocking communicator's creation,
//! splits and launches (NCCL connects lazily, in `ncclGroupEnd`) wait for
//! peers unbounded; a non-blocking one's are bounded by the timeout.
//!
//! **The timeout.** NCCL has none of its own: a peer that dies or never
//! runs its side leaves the collective's kernel spinning, and the stream
//! with it. So each communicator has a watchdog thread, as PyTorch's
//! `ProcessGroupNCCL` does (`nccl_watchdog.rs`): each group is followed
//! by an event on the stream, and a group whose event has not completed
//! within the communicator's [timeout](Communicator::timeout), counted
//! from when it was put on the stream (so including the work ahead of it
//! there), breaks the communicator. The signals and downloads after the
//! group in its batch fail with [`CollectiveError::Timeout`] (those after
//! the communicator's other groups not done yet, on any queue, with
//! [`CollectiveError::Broken`]), even though their events are recorded;
//! each such queue's next `submit` or `synchronize` reports it; then
//! `ncclCommAbort` (once no launch holds the communicator) makes NCCL's
//! kernels exit, so the stream moves on. Every later collective over it
//! fails at once with [`CollectiveError::Broken`]. An asynchronous NCCL
//! error (`ncclCommGetAsyncError`, asked every 10 ms while a group is in
//! flight) breaks it the same way, with [`CollectiveError::Nccl`]. The
//! launch path pays an event record per group, and nothing per kernel.
//! Work of *later* batches already on the stream runs once the abort lets
//! it, over whatever the aborted collective left: under the queue's
//! cascade ([`FailureScope::Queue`](crate::FailureScope), the default) its
//! signals and downloads fail all the same, with
//! [`Error::RanBehindAbandoned`](crate::Error::RanBehindAbandoned) naming
//! the cause, as do batches the queue had not reached yet (the stream
//! hands each group what it enqueues behind it: `nccl_behind.rs`); under
//! `FailureScope::Batch` they keep their values: only its batch fails.
//! A CUDA queue's settled wait on a value the break failed, enqueued
//! after it, waits on the device for the aborted group to exit (a plan's
//! next run goes on after it, never beside it): for as long as the abort
//! waits, so for good behind a blocking launch that never returns. What
//! it does not cover: a value not recorded yet when the group timed out
//! (its batch waited on something else first), or failed already by
//! something else, whose settled waiters go on at once, and a CPU queue's
//! or the host's settled wait, which never waits on the device. A device wait another queue enqueued *before* the
//! failure is not told either: once the abort lets the group's event
//! complete, that queue's work runs over what the collective left, and
//! its signals are set. Where a timeout must stop the work behind a
//! collective on other queues, wait on its signal itself (not settled).
//!
//! NCCL is loaded at run time, like the CUDA driver: every constructor
//! probes it first, and answers [`CollectiveError::NoNccl`] with how to
//! install it where it is absent (cudarc would panic). cudarc opens
//! `libnccl.so` (or `libnccl.so.12` and the like), which only NCCL's
//! development package installs: the runtime's `libnccl.so.2` must be
//! linked as `libnccl.so` on the library path, as the error says.
//!
//! # Use (the `mpi` feature; run under `mpirun -np 4 ...`)
//!
//! ```ignore
//! use hwqueue::collective::{Mpi, Reduction};
//! let mpi = Mpi::init()?;                 // MPI_THREAD_MULTIPLE, or an error
//! let world = mpi.world(None)?;           // rank and size from mpirun
//! let device = hwqueue::cpu::CpuDevice::new();
//! let (grads, summed) = (device.alloc(4096)?, device.alloc(4096)?);
//! let (computed, reduced) = (device.new_signal(0)?, device.new_signal(0)?);
//! let mut queue = device.compute_queue()?;
//! queue
//!     .wait(&computed, 1) // set by the queue that computes `grads`
//!     .all_reduce::<f32, _, _>(&world, Reduction::Sum, &grads, &summed)
//!     .signal(&reduced, 1)
//!     .submit()?;         // returns at once; the queue's worker runs it
//! ```
//!
//! # In plans
//!
//! A [`Schedule`](crate::Schedule) holds collectives as operations
//! ([`Schedule::all_reduce`](crate::Schedule::all_reduce) and the others):
//! each reads its send buffer and writes its receive buffer, so the
//! planner orders it against kernels and transfers by the same hazards,
//! and every [`Plan::run`](crate::Plan::run) records it on its queue with
//! [`HardwareQueue::collective`](crate::HardwareQueue::collective). A
//! communicator's collectives must share a queue in a plan, so that every
//! rank runs them in one order.
//!
//! `tests/collective_mpi.rs` runs every operation this way under
//! `mpirun`, and plans with collectives run back to back; `.ci/run` runs
//! it, and `examples/distributed.rs` (the demo's MLP, data parallel).

#[cfg(feature = "mpi")]
mod description;
mod error;
mod host;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod mpi_types;
mod naming;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
mod nccl_behind;
#[cfg(feature = "nccl")]
mod nccl_create;
#[cfg(feature = "nccl")]
mod nccl_watchdog;
mod p2p;
#[cfg(feature = "mpi")]
mod small;
#[cfg(feature = "mpi")]
mod staging;

use std::fmt;
use std::time::Duration;

use crate::backend::Backend;
use crate::buffer::Pod;
use crate::error::Result;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::view::View;

pub use error::CollectiveError;
#[cfg_attr(not(feature = "mpi"), allow(unused_imports))]
pub(crate) use host::{HostData, HostGroupViews, HostViews};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
#[doc(hidden)]
pub use naming::count_of;
pub(crate) use naming::describe;
#[cfg(feature = "nccl")]
pub use nccl::NcclId;
#[cfg(feature = "nccl")]
pub(crate) use nccl::enqueue_run as enqueue_nccl_run;
#[cfg(feature = "nccl")]
pub(crate) use nccl_behind::StreamWatch;
#[cfg(feature = "nccl")]
pub use nccl_create::NcclConfig;

/// How `all_reduce` and `reduce_scatter` combine the ranks' elements.
///
/// `Min` and `Max` of floats holding a NaN are not defined across ranks:
/// the engines compare (`<`, `>`) in their own order, so a NaN is kept or
/// dropped depending on which rank holds it. Check for NaNs separately
/// (a `Sum` of a per-rank flag) where they matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The sum.
    Sum,
    /// The product.
    Product,
    /// The smallest.
    Min,
    /// The largest.
    Max,
}

impl Reduction {
    /// Its name: `sum`, `product`, `min`, `max`.
    pub const fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Product => "product",
            Reduction::Min => "min",
            Reduction::Max => "max",
        }
    }
}

/// The element type of a collective.
///
/// `F16` and `BF16` exist with the `half` feature only, as
/// [`Scalar`](crate::Scalar)'s `F16` and `BF16` do: a build without it
/// has no variant it could not move or reduce, and a match over `Element`
/// gates their arms with `#[cfg(feature = "half")]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// `half::f16` (IEEE binary16; the `half` feature). Reductions compute
    /// in `f32` and round back to `f16` at each step.
    #[cfg(feature = "half")]
    F16,
    /// `half::bf16` (bfloat16; the `half` feature). Reductions compute in
    /// `f32` and round back to `bf16` at each step.
    #[cfg(feature = "half")]
    BF16,
}

impl Element {
    /// Its size in bytes.
    pub const fn size(self) -> usize {
        match self {
            Element::F32 | Element::I32 | Element::U32 => 4,
            Element::F64 => 8,
            #[cfg(feature = "half")]
            Element::F16 | Element::BF16 => 2,
        }
    }

    /// Its Rust name.
    pub const fn name(self) -> &'static str {
        match self {
            Element::F32 => "f32",
            Element::F64 => "f64",
            Element::I32 => "i32",
            Element::U32 => "u32",
            #[cfg(feature = "half")]
            Element::F16 => "f16",
            #[cfg(feature = "half")]
            Element::BF16 => "bf16",
        }
    }
}

/// A type collectives move and reduce: `f32`, `f64`, `i32`, `u32`, and
/// with the `half` feature `half::f16` and `half::bf16`.
///
/// 16-bit floats reduce as PyTorch and NCCL reduce them: each step
/// computes in `f32` and rounds the result back to nearest (even), so a
/// sum of many is rounded many times, in the order the engine combines
/// the ranks (rank order for collectives of up to 1 KiB; MPI's own order
/// above that). Min and max compare the values exactly.
pub trait CollectiveElement: Pod + sealed::Sealed {
    /// Which.
    const ELEMENT: Element;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! collective_elements {
    ($($ty:ty => $element:ident),*) => {$(
        impl sealed::Sealed for $ty {}
        impl CollectiveElement for $ty {
            const ELEMENT: Element = Element::$element;
        }
    )*};
}
collective_elements!(f32 => F32, f64 => F64, i32 => I32, u32 => U32);
#[cfg(feature = "half")]
collective_elements!(half::f16 => F16, half::bf16 => BF16);

/// What a collective does. Counts are in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// Every rank's send view combined element-wise into every rank's
    /// receive view (of the send view's length).
    AllReduce(Reduction),
    /// Every rank's send view, in rank order, into every rank's receive
    /// view (`size` times the send view's length).
    AllGather,
    /// The send views (`size` times the receive view's length) combined
    /// element-wise; rank `r` receives the `r`th part.
    ReduceScatter(Reduction),
    /// Rank `root`'s view into every other rank's (in place: one view).
    Broadcast {
        /// The rank whose view is sent.
        root: usize,
    },
    /// The send view to rank `peer`, whose matching `recv` receives it.
    Send {
        /// The receiving rank.
        peer: usize,
    },
    /// Rank `peer`'s matching `send`, into the receive view.
    Recv {
        /// The sending rank.
        peer: usize,
    },
}

impl CollectiveOp {
    /// Its name: `all_reduce`, `all_gather`, ...
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce(_) => "all_reduce",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::ReduceScatter(_) => "reduce_scatter",
            CollectiveOp::Broadcast { .. } => "broadcast",
            CollectiveOp::Send { .. } => "send",
            CollectiveOp::Recv { .. } => "recv",
        }
    }

    /// The peer of a `send` or `recv` (a point-to-point command, between
    /// two ranks only: it takes no place in the order every rank shares,
    /// and runs in a group with those right after it); `None` for a
    /// collective of the whole group.
    pub const fn peer(self) -> Option<usize> {
        match self {
            CollectiveOp::Send { peer } | CollectiveOp::Recv { peer } => Some(peer),
            _ => None,
        }
    }
}

/// A recorded collective: what [`Command::Collective`](crate::queue::Command::Collective)
/// holds (boxed, so the command stays small).
pub struct Collective<B: Backend> {
    /// The group it runs in, as this rank.
    pub communicator: Communicator,
    /// What it does.
    pub op: CollectiveOp,
    /// Its element type.
    pub element: Element,
    /// Its place in the order collectives were submitted on this
    /// communicator by this rank (0, 1, ...; taken when its batch is
    /// submitted; `send` and `recv` take none: 0). Ranks compare it to find
    /// collectives that run out of order.
    pub sequence: u64,
    /// Whether it took its `sequence`: its batch was submitted (a batch
    /// discarded, or dropped with its queue, takes none). A CPU queue's
    /// worker still exchanges a numbered collective it will not run
    /// (`cpu::queue::collective::forfeit_collective`).
    pub(crate) numbered: bool,
    /// A collective refused when recorded keeps no views, only its place
    /// (`Queue::forfeit_place`), and this: the count its views asked for.
    pub(crate) refused_count: usize,
    /// The view it reads, if any (`recv` reads none; a broadcast reads its
    /// one view on the root only).
    pub send: Option<View<B>>,
    /// The view it writes, if any (`send` writes none; a broadcast writes
    /// its one view on every rank but the root).
    pub recv: Option<View<B>>,
}

impl<B: Backend> Collective<B> {
    /// How many elements each rank contributes: the send view's (the
    /// receive view's for `recv` and `reduce_scatter`); for a collective
    /// refused when recorded, which keeps only its place, what its views
    /// asked for.
    pub fn count(&self) -> usize {
        match (&self.send, &self.recv) {
            (None, None) => self.refused_count,
            (send, recv) => count_of(
                self.op,
                self.element,
                send.as_ref().map(View::len),
                recv.as_ref().map(View::len),
            ),
        }
    }

    /// The collective in words, as errors and profiles name it:
    /// `all_reduce (sum) of 256 f32, submitted #3`.
    pub fn describe(&self) -> String {
        describe(self.op, self.element, self.count(), self.sequence)
    }
}

impl<B: Backend> fmt::Debug for Collective<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The timeout a communicator starts with: a minute.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One rank of a group of `size` ranks on a distributed engine: what
/// collectives run over. Cheap to clone (a handle); every clone is the same
/// rank of the same group, and commands hold one until they ran.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
}

struct Shared {
    rank: usize,
    size: usize,
    /// The timeout in nanoseconds: written by `set_timeout` (any thread),
    /// read by each collective when it starts; `Relaxed` suffices, as the
    /// value orders nothing else.
    timeout_ns: AtomicU64,
    /// The next recording sequence number: taken by each collective when
    /// recorded (`Relaxed`: only its uniqueness and the recording thread's
    /// own order matter).
    recorded: AtomicU64,
    transport: Transport,
}

/// The engine a communicator runs on; a variant per engine, each gated by
/// its feature.
enum Transport {
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiComm),
    #[cfg(feature = "nccl")]
    Nccl(nccl::NcclComm),
}

impl Communicator {
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
    fn new(rank: usize, size: usize, transport: Transport) -> Self {
        Self {
            shared: Arc::new(Shared {
                rank,
                size,
                timeout_ns: AtomicU64::new(duration_ns(DEFAULT_TIMEOUT)),
                recorded: AtomicU64::new(0),
                transport,
            }),
        }
    }

    /// This rank, in `0..size`.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// How many ranks the group has.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The engine it runs on: `"mpi"` or `"nccl"`.
    pub fn engine(&self) -> &'static str {
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(_) => "mpi",
            #[cfg(feature = "nccl")]
            Transport::Nccl(_) => "nccl",
        }
    }

    /// Whether it moves host memory (so CPU queues run its collectives):
    /// MPI's do; NCCL's move memory of their CUDA device.
    pub fn on_host(&self) -> bool {
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(_) => true,
            #[cfg(feature = "nccl")]
            Transport::Nccl(_) => false,
        }
    }

    /// How long a collective may take, from when its queue reaches it,
    /// before its batch fails with [`CollectiveError::Timeout`]
    /// ([`DEFAULT_TIMEOUT`] at first).
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.shared.timeout_ns.load(Ordering::Relaxed))
    }

    /// Sets the timeout for the collectives that start from now on.
    pub fn set_timeout(&self, timeout: Duration) {
        let nanos = duration_ns(timeout);
        self.shared.timeout_ns.store(nanos, Ordering::Relaxed);
    }

    /// Whether two handles are the same communicator.
    pub fn same_as(&self, other: &Communicator) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Splits the group: the ranks that give the same `color` form a new
    /// communicator, ranked by `key` (ties by their rank here); a rank
    /// giving `None` joins none and gets `None` (`MPI_Comm_split`,
    /// `ncclCommSplit`). Every rank calls it, from the host, at the same
    /// place of this communicator's order of collectives: synchronise the
    /// queues that record collectives on it first. The new communicator is
    /// of the same engine (NCCL's on the same device, as blocking as this
    /// one), with this one's timeout.
    ///
    /// Over MPI and a non-blocking NCCL communicator ([`NcclConfig`]) it
    /// is bounded by the timeout: a rank that never calls it fails the
    /// others with [`CollectiveError::Timeout`] (over MPI the
    /// `MPI_Comm_split` after the ranks agreed too: a rank that came just
    /// as its peers timed out fails at its own deadline). A blocking NCCL
    /// one's is
    /// `ncclCommSplit` (NCCL 2.18+), which waits for every rank: one that
    /// never calls it blocks the others inside NCCL.
    ///
    /// # Errors
    /// [`CollectiveError::Timeout`], [`CollectiveError::Mismatch`] (a rank
    /// ran a collective where this one splits), [`CollectiveError::Mpi`];
    /// [`CollectiveError::Nccl`] (NCCL's split failed),
    /// [`CollectiveError::Invalid`] (a color or key above `i32::MAX`,
    /// which NCCL cannot take, or an NCCL without `ncclCommSplit`),
    /// [`CollectiveError::Broken`] (a collective on it timed out before).
    #[cfg(any(feature = "mpi", feature = "nccl"))]
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>> {
        let split = match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(ref comm) => comm.split(self, color, key),
            #[cfg(feature = "nccl")]
            Transport::Nccl(ref comm) => comm.split((self.size(), self.timeout()), color, key),
        }?;
        Ok(split.inspect(|split| split.set_timeout(self.timeout())))
    }

    /// The next recording sequence number.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.shared.recorded.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `collective` over host memory on the calling thread (a CPU
    /// queue's worker): `read` fills the send staging from the send view,
    /// `write` copies the result out to the receive view. Returns when it
    /// completed, failed, or timed out.
    ///
    /// # Errors
    /// [`CollectiveError`]s: a mismatch, a timeout, a broken communicator,
    /// an MPI error; `read`'s and `write`'s own.
    pub(crate) fn run_on_host(
        &self,
        plan: &HostCollective,
        read: &mut dyn FnMut(&mut [u8]) -> Result<()>,
        write: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let _ = (&plan, &read, &write);
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(ref comm) => comm.run(self, plan, HostData::Staged { read, write }),
            // CPU queues refuse device communicators when recording.
            #[cfg(feature = "nccl")]
            Transport::Nccl(_) => Err(CollectiveError::unsupported("cpu", self).into()),
        }
    }

    /// Whether a collective of `plan`'s shape goes through staging memory
    /// ([`run_on_host`](Self::run_on_host)): over MPI, one small enough to
    /// ride along the description exchange (`small.rs`); the others run
    /// over the views' own memory
    /// ([`run_on_host_direct`](Self::run_on_host_direct)).
    pub(crate) fn stages(&self, plan: &HostCollective) -> bool {
        let _ = plan;
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(_) => small::fits(plan.op, plan.element, plan.count, self.size()),
            #[cfg(feature = "nccl")]
            Transport::Nccl(_) => true,
        }
    }

    /// As [`run_on_host`](Self::run_on_host), over the views' own memory:
    /// `views` is held from after the ranks agreed until the data moved,
    /// and lost ([`HostViews::lose`]) when it may still be MPI's.
    ///
    /// # Errors
    /// As [`run_on_host`](Self::run_on_host).
    pub(crate) fn run_on_host_direct(
        &self,
        plan: &HostCollective,
        views: &mut dyn HostViews,
    ) -> Result<()> {
        let _ = (&plan, &views);
        match self.shared.transport {
            #[cfg(feature = "mpi")]
            Transport::Mpi(ref comm) => comm.run(self, plan, HostData::Direct(views)),
            #[cfg(feature = "nccl")]
            Transport::Nccl(_) => Err(CollectiveError::unsupported("cpu", self).into()),
        }
    }
}

/// What a host engine runs: a collective's shape without its views.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) struct HostCollective {
    pub(crate) op: CollectiveOp,
    pub(crate) element: Element,
    /// Elements each rank contributes.
    pub(crate) count: usize,
    pub(crate) sequence: u64,
}

impl HostCollective {
    pub(crate) fn of<B: Backend>(collective: &Collective<B>) -> Self {
        Self {
            op: collective.op,
            element: collective.element,
            count: collective.count(),
            sequence: collective.sequence,
        }
    }

    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn describe(&self) -> String {
        describe(self.op, self.element, self.count, self.sequence)
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("engine", &self.engine())
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish_non_exhaustive()
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
