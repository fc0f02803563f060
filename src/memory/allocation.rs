//! [`Allocation`]: one buffer's memory, as every backend's buffer holds it —
//! its identity, its range of the pool, and, for a buffer made by
//! [`alloca`](crate::HardwareQueue::alloca), the lifecycle that decides when
//! the range may go to another buffer ([`QueueOrdered`]).
//!
//! See [`QueueOrdered`] for the lifecycle, and [`Allocation`] for
//! identity.

use std::fmt;

use super::BlockSource;
use super::pool::{MemoryPool, Range};
use crate::error::{Error, Result};
use crate::queue::QueueId;
use crate::sync::{Arc, AtomicU64, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Names one allocation while any handle to it lives: distinct for every
/// live allocation, empty ones included (it is the address of the
/// allocation's shared record, which every allocation has, so it costs
/// nothing to make; a later allocation may reuse an id once every handle
/// of the earlier one is gone). What ordering locks and de-duplicating
/// buffers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocationId(usize);

impl AllocationId {
    /// The id as a number (never 0).
    #[inline]
    pub fn get(self) -> usize {
        self.0
    }
}

/// One buffer's memory: a range of its device's [`MemoryPool`] (none for
/// an empty buffer), with a distinct [`AllocationId`] and, for `alloca`'s
/// buffers, a [`QueueOrdered`] lifecycle. Clones are handles to one
/// allocation; the range goes back to the pool when the last handle is
/// dropped, or earlier when a `dealloca` of it ran and no batch uses it.
///
/// Backends' buffers wrap it and nothing more: what a buffer needs of its
/// device beside the memory (CUDA its device handle) is the allocation's
/// `tag` (`T`, `()` by default), so a buffer stays one pointer. Every
/// access to the bytes goes through its lock:
/// [`read`](Self::read) (shared) and [`write`](Self::write) (exclusive),
/// which refuse once a `dealloca` ran.
///
/// # Identity
///
/// Every allocation gets an [`AllocationId`] of its own, an empty one
/// (which has no range) included. Queues order the locks of the buffers a
/// command holds by it, and de-duplicate by it: never by address, which an
/// empty buffer does not have and two buffers on one freed range may share
/// over time.
///
pub struct Allocation<S: BlockSource, T = ()> {
    inner: Arc<Inner<S, T>>,
}

struct Inner<S: BlockSource, T> {
    size: usize,
    /// The first byte; `None` for an empty allocation.
    address: Option<S::Address>,
    pool: MemoryPool<S>,
    /// Guards the bytes, and holds the range until it is returned.
    memory: RwLock<Memory<S>>,
    /// For `alloca`'s allocations.
    ordered: Option<QueueOrdered>,
    tag: T,
}

/// What an allocation holds of its pool.
pub(crate) enum Memory<S: BlockSource> {
    /// No bytes: an empty allocation.
    Empty,
    /// A range, which the allocation gives back (when it is dropped, or by
    /// [`Allocation::give_back`]).
    Range(Range<S::Address>),
    /// A `dealloca` ran and the range went back to the pool.
    Returned,
    /// An engine handed the range to a transfer it cannot cancel (an MPI
    /// collective that timed out), which may still read or write it: the
    /// range is never given back, and nothing reaches it again
    /// ([`Allocation::lose`]).
    Lost(Range<S::Address>),
}

impl<S: BlockSource> Memory<S> {
    /// The range, leaving `Returned`; `None` for an empty allocation or one
    /// whose range went back already.
    fn take_range(&mut self) -> Option<Range<S::Address>> {
        match std::mem::replace(self, Memory::Returned) {
            Memory::Range(range) => Some(range),
            other => {
                *self = other;
                None
            }
        }
    }

    /// `Err` once the range went back to the pool, or was lost to a
    /// transfer; `what` names the buffer.
    #[inline]
    pub(crate) fn check(&self, what: impl FnOnce() -> String) -> Result<()> {
        match self {
            Memory::Returned => Err(Error::UseAfterDealloca {
                what: what(),
                detail: returned("on a queue"),
            }),
            Memory::Lost(_) => Err(Error::MemoryLost { what: what() }),
            Memory::Empty | Memory::Range(_) => Ok(()),
        }
    }
}

/// What a buffer whose `dealloca` (on `queue`) ran is refused with.
fn returned(queue: &str) -> String {
    format!(
        "was deallocated by a `dealloca` {queue}, which ran: its memory may belong to another \
         buffer now. Record the work before the `dealloca`, or allocate a new buffer for it"
    )
}

impl<S: BlockSource, T> Clone for Allocation<S, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: BlockSource> Allocation<S> {
    /// `size` bytes of `pool`, zeroed or not (none, and nothing taken from
    /// the pool, for `size` 0), for [`Device::alloc`](crate::Device::alloc)
    /// and `alloc_uninit`.
    ///
    /// # Errors
    /// What [`MemoryPool::alloc_zeroed`] and
    /// [`alloc_uninit`](MemoryPool::alloc_uninit) report.
    pub fn new(pool: &MemoryPool<S>, size: usize, zeroed: bool) -> Result<Self> {
        Self::tagged(pool, size, zeroed, false, ())
    }

    /// `size` bytes of `pool`, not zeroed, with a [`QueueOrdered`]
    /// lifecycle: what an engine's [`alloca`](crate::queue::Engine::alloca)
    /// returns.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn new_alloca(pool: &MemoryPool<S>, size: usize) -> Result<Self> {
        Self::tagged(pool, size, false, true, ())
    }
}

impl<S: BlockSource, T: Send + Sync + 'static> Allocation<S, T> {
    /// As [`Allocation::new`] (`alloca` false) or
    /// [`Allocation::new_alloca`] (`alloca` true, `zeroed` ignored), with
    /// `tag` kept beside the memory.
    ///
    /// # Errors
    /// As [`Allocation::new`].
    pub fn tagged(
        pool: &MemoryPool<S>,
        size: usize,
        zeroed: bool,
        alloca: bool,
        tag: T,
    ) -> Result<Self> {
        let (address, memory) = if size == 0 {
            (None, Memory::Empty)
        } else {
            let range = pool.allocate_range(size, zeroed && !alloca)?;
            (Some(range.address()), Memory::Range(range))
        };
        Ok(Self {
            inner: Arc::new(Inner {
                size,
                address,
                pool: pool.clone(),
                memory: RwLock::new(memory),
                ordered: alloca.then(QueueOrdered::new),
                tag,
            }),
        })
    }

    /// What the backend keeps beside the memory.
    #[inline]
    pub fn tag(&self) -> &T {
        &self.inner.tag
    }

    /// The allocation's identity.
    #[inline]
    pub fn id(&self) -> AllocationId {
        AllocationId(Arc::as_ptr(&self.inner) as usize)
    }

    /// Bytes asked for.
    #[inline]
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The first byte's address; `None` for an empty allocation. Reaching
    /// the bytes through it is the caller's to order: it stays the range's
    /// until the range is returned.
    #[inline]
    pub fn address(&self) -> Option<S::Address> {
        self.inner.address
    }

    /// The pool the allocation is of.
    #[inline]
    pub fn pool(&self) -> &MemoryPool<S> {
        &self.inner.pool
    }

    /// Whether the allocation is of `pool`.
    #[inline]
    pub fn is_of(&self, pool: &MemoryPool<S>) -> bool {
        self.inner.pool.same_as(pool)
    }

    /// Whether two handles name one allocation.
    #[inline]
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// For `alloca`'s allocations: the lifecycle.
    #[inline]
    pub fn queue_ordered(&self) -> Option<&QueueOrdered> {
        self.inner.ordered.as_ref()
    }

    /// Holds the bytes shared (a read), for `by`.
    ///
    /// # Errors
    /// [`Error::UseAfterDealloca`], naming the buffer `what`: for the host,
    /// once a `dealloca` of the allocation ran; for a queue, once the range
    /// was returned (never, for work recorded before the `dealloca`: its
    /// batch holds a use).
    pub fn read(&self, by: Access, what: impl FnOnce() -> String) -> Result<ReadAccess<'_, S>> {
        let guard = self.inner.memory.read();
        self.check(by, &guard, what)?;
        Ok(ReadAccess {
            _guard: guard,
            address: self.inner.address,
        })
    }

    /// Holds the bytes exclusively (a write), for `by`.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn write(&self, by: Access, what: impl FnOnce() -> String) -> Result<WriteAccess<'_, S>> {
        let guard = self.inner.memory.write();
        self.check(by, &guard, what)?;
        Ok(WriteAccess {
            _guard: guard,
            address: self.inner.address,
        })
    }

    /// `Err` once the range was returned; for the host, once a `dealloca`
    /// ran (the range may be returned any moment, when the last batch of
    /// another queue lets its use go).
    fn check(&self, by: Access, memory: &Memory<S>, what: impl FnOnce() -> String) -> Result<()> {
        if by == Access::Host
            && let Some(ordered) = &self.inner.ordered
            && ordered.phase() >= Phase::Ran
        {
            return Err(Error::UseAfterDealloca {
                what: what(),
                detail: ordered.refusal(),
            });
        }
        memory.check(what)
    }

    /// [`Memory::check`] of the allocation now, for `by`, where no writer
    /// holds it (`Ok` where one does: a later access checks again). For
    /// an engine that asks before it holds the memory, without waiting.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub(crate) fn peek(&self, by: Access, what: impl FnOnce() -> String) -> Result<()> {
        match self.inner.memory.try_read() {
            Some(guard) => self.check(by, &guard, what),
            None => Ok(()),
        }
    }

    /// The lock, held exclusively, for an engine that runs queue work on
    /// the host (the CPU's): queue work holds a use, so the range is never
    /// returned under it; check [`Memory::check`] anyway.
    #[inline]
    pub(crate) fn lock_exclusive(&self) -> RwLockWriteGuard<'_, Memory<S>> {
        self.inner.memory.write()
    }

    /// [`lock_exclusive`](Self::lock_exclusive), or `None` at once where
    /// the lock is held.
    #[inline]
    pub(crate) fn try_lock_exclusive(&self) -> Option<RwLockWriteGuard<'_, Memory<S>>> {
        self.inner.memory.try_write()
    }

    /// Gives the range up to a transfer that may still use it (an MPI
    /// collective that timed out, which MPI cannot cancel), under the
    /// caller's exclusive hold `held` of this allocation: from now on every
    /// access is refused with [`Error::MemoryLost`], and the range, with
    /// the pool it is of, is never given back (one handle is leaked), so no
    /// other buffer ever gets these bytes.
    pub(crate) fn lose(&self, held: &mut Memory<S>) {
        // An empty allocation has no bytes to lose; a returned one was
        // under no transfer.
        *held = match std::mem::replace(held, Memory::Empty) {
            Memory::Range(range) => Memory::Lost(range),
            other => other,
        };
        std::mem::forget(self.clone());
    }

    /// Returns the range to the pool: called once, by the queue core or
    /// [`dealloca_completed`](super::dealloca_completed), when the
    /// lifecycle says so (the `dealloca` ran and no batch uses the buffer:
    /// [`Phase::Returned`]). Anywhere else (a buffer not made by `alloca`,
    /// or one still live or in use) it does nothing: work already on a
    /// device may still write the range, which must not go to another
    /// buffer. Waits only for a host access in progress.
    pub fn give_back(&self) {
        if self.queue_ordered().map(QueueOrdered::phase) != Some(Phase::Returned) {
            return;
        }
        // The pool's lock is taken after the allocation's is dropped.
        let range = self.inner.memory.write().take_range();
        if let Some(range) = range {
            self.inner.pool.give_back_range(range);
        }
    }
}

impl<S: BlockSource, T> Drop for Inner<S, T> {
    fn drop(&mut self) {
        // The last handle is gone: nobody else holds the lock.
        let range = self.memory.write().take_range();
        if let Some(range) = range {
            self.pool.give_back_range(range);
        }
    }
}

impl<S: BlockSource, T> fmt::Debug for Allocation<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("id", &(Arc::as_ptr(&self.inner) as usize))
            .field("size", &self.inner.size)
            .field("device", &self.inner.pool.source().device())
            .field("ordered", &self.inner.ordered)
            .finish()
    }
}

/// Who reaches an allocation's bytes: the host (a buffer's `write_at` and
/// `read_at`), or a queue's command, run by an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The host: refused once a `dealloca` ran.
    Host,
    /// A command of a batch, which holds a use of the buffer: refused only
    /// once the range was returned, which a use prevents.
    Queue,
}

/// Shared access to an allocation's bytes: no `dealloca` can return the
/// range while it is held.
pub struct ReadAccess<'a, S: BlockSource> {
    _guard: RwLockReadGuard<'a, Memory<S>>,
    address: Option<S::Address>,
}

/// Exclusive access to an allocation's bytes.
pub struct WriteAccess<'a, S: BlockSource> {
    _guard: RwLockWriteGuard<'a, Memory<S>>,
    address: Option<S::Address>,
}

impl<S: BlockSource> ReadAccess<'_, S> {
    /// The first byte; `None` for an empty allocation.
    pub fn address(&self) -> Option<S::Address> {
        self.address
    }
}

impl<S: BlockSource> WriteAccess<'_, S> {
    /// The first byte; `None` for an empty allocation.
    pub fn address(&self) -> Option<S::Address> {
        self.address
    }
}

/// Where a [`QueueOrdered`] allocation is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Queues may record work on it.
    Live,
    /// A `dealloca` is recorded and has not run.
    DeallocaRecorded,
    /// The `dealloca` ran; the range goes back once no batch uses it.
    Ran,
    /// The range went back to the pool.
    Returned,
}

/// The lifecycle of a buffer made by [`alloca`](crate::HardwareQueue::alloca):
/// its phase and the batches using it.
///
/// # The lifecycle
///
/// | phase | entered when | new queue work | host access | the range |
/// |-------|--------------|----------------|-------------|-----------|
/// | live | `alloca` returns | recorded | yes | held |
/// | `dealloca` recorded | a queue records its `dealloca` | refused | yes | held |
/// | `dealloca` ran | that command completed | refused | refused | held while an earlier batch of another queue still uses it |
/// | returned | the last such use settled | refused | refused | back in the pool |
///
/// A `dealloca` whose batch does not run (discarded, rejected, abandoned by
/// a failure, or stopped by an earlier command's failure) leaves the buffer
/// live again once the batch is let go, and a new `dealloca` may be
/// recorded.
///
/// **Uses.** Every batch that names the buffer holds a *use* from the
/// moment a command on it is recorded until the engine lets the batch go
/// (after it settled: ran, failed, or was skipped; or when it is discarded).
/// The range goes back to the pool only once the `dealloca` ran **and** no
/// batch holds a use: so a batch of queue B recorded before queue A's
/// `dealloca` runs on its bytes even if A's `dealloca` runs first, and no
/// range is handed to another buffer under it (PyTorch's `record_stream`,
/// with the batch's settlement as the event). Uses the `dealloca`'s own
/// batch holds are folded into the `dealloca` when it is recorded: they are
/// ordered before it in that batch, so a synchronous engine (the CPU's)
/// returns the range the moment the `dealloca` runs, and an asynchronous
/// one (CUDA's, Vulkan's) once it sees its batch completed on the device
/// (the queue's next `submit` or `synchronize` looks; a signal set after
/// the `dealloca` may be reached a little before). Nothing on this path
/// waits on the host.
///
/// # The record
///
/// | field | meaning | written by | ordering |
/// |-------|---------|------------|----------|
/// | `state` | bits 62–63: the [`Phase`]; bits 0–31: batches holding a use | the queue core (record, let go), engines (`dealloca_ran`) | `AcqRel` read-modify-writes: a use begun is seen by the `dealloca` that would return the range, and the return sees every use let go |
/// | `dealloca_queue` | the queue that recorded the `dealloca`, for messages | the recording queue, before `state` moves | `Relaxed`: read only to word an error |
#[derive(Debug)]
pub struct QueueOrdered {
    state: AtomicU64,
    dealloca_queue: AtomicU64,
}

const PHASE_SHIFT: u32 = 62;
const USES: u64 = (1 << 32) - 1;

fn phase_of(state: u64) -> Phase {
    match state >> PHASE_SHIFT {
        0 => Phase::Live,
        1 => Phase::DeallocaRecorded,
        2 => Phase::Ran,
        _ => Phase::Returned,
    }
}

fn with_phase(state: u64, phase: Phase) -> u64 {
    (state & USES) | ((phase as u64) << PHASE_SHIFT)
}

impl QueueOrdered {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            dealloca_queue: AtomicU64::new(0),
        }
    }

    /// The phase now.
    #[inline]
    pub fn phase(&self) -> Phase {
        phase_of(self.state.load(Ordering::Acquire))
    }

    /// Whether a `dealloca` of the buffer is recorded (or ran): queues
    /// refuse new work on it.
    #[inline]
    pub fn is_dealloca_recorded(&self) -> bool {
        self.phase() != Phase::Live
    }

    /// Batches holding a use now.
    pub fn uses(&self) -> u32 {
        (self.state.load(Ordering::Acquire) & USES) as u32
    }

    /// What a refused access is told: what happened to the buffer, and how
    /// to order the work instead.
    pub fn refusal(&self) -> String {
        let queue = self.queue_phrase();
        match self.phase() {
            Phase::Live => "is live".into(),
            Phase::DeallocaRecorded => format!(
                "has a `dealloca` recorded {queue}, and no work may be recorded on a buffer \
                 after its `dealloca`. Record the work before the `dealloca`; to go on using \
                 the memory after it, allocate a new buffer (on another queue, after a `wait` \
                 on a signal that the `dealloca`'s queue sets after it); if that `dealloca`'s \
                 batch is discarded or fails before it, the buffer is live again"
            ),
            Phase::Ran | Phase::Returned => returned(&queue),
        }
    }

    /// A batch takes a use of the buffer (a command on it was recorded).
    ///
    /// # Errors
    /// [`Error::UseAfterDealloca`] (naming it `what`) once a `dealloca` is
    /// recorded.
    pub(crate) fn begin_use(&self, what: impl FnOnce() -> String) -> Result<()> {
        self.update(|state| {
            debug_assert!(state & USES < USES, "over 4 billion batches hold a buffer");
            (phase_of(state) == Phase::Live).then_some(state + 1)
        })
        .map(drop)
        .map_err(|_| Error::UseAfterDealloca {
            what: what(),
            detail: self.refusal(),
        })
    }

    /// A batch lets `count` uses go (it settled, or was discarded).
    /// `true`: the `dealloca` ran and this was the last use, so the caller
    /// gives the range back ([`Allocation::give_back`]).
    pub(crate) fn end_uses(&self, count: u32) -> bool {
        let before = self.state.fetch_sub(u64::from(count), Ordering::AcqRel);
        debug_assert!(before & USES >= u64::from(count), "a use let go twice");
        self.return_if_done(before - u64::from(count))
    }

    /// Records the `dealloca` for `queue`, folding in `own_uses` uses that
    /// the same batch holds (they are ordered before it).
    ///
    /// # Errors
    /// [`Error::InvalidDealloca`] when one is recorded already or ran.
    pub(crate) fn record_dealloca(&self, queue: QueueId, own_uses: u32) -> Result<()> {
        let recorded = self.update(|state| {
            (phase_of(state) == Phase::Live)
                .then(|| with_phase(state - u64::from(own_uses), Phase::DeallocaRecorded))
        });
        match recorded {
            Ok(_) => {
                // For messages only: a refusal in between says "on a queue".
                self.dealloca_queue.store(queue.get(), Ordering::Relaxed);
                Ok(())
            }
            Err(state) => Err(Error::InvalidDealloca {
                reason: if phase_of(state) == Phase::DeallocaRecorded {
                    format!(
                        "a `dealloca` of this buffer is recorded already {} and has not run; \
                         record one per `alloca` (if that batch is discarded or fails before \
                         it, the buffer is live again and a new one may be recorded)",
                        self.queue_phrase()
                    )
                } else {
                    format!(
                        "the buffer was deallocated already, by a `dealloca` {} that ran; \
                         record one per `alloca`",
                        self.queue_phrase()
                    )
                },
            }),
        }
    }

    /// The `dealloca` completed: every earlier command of its queue did.
    /// Engines call it ([`dealloca_completed`](super::dealloca_completed)).
    /// `true`: no batch uses the buffer, so the caller gives the range back.
    pub(crate) fn dealloca_ran(&self) -> bool {
        match self.update(|state| {
            (phase_of(state) == Phase::DeallocaRecorded).then(|| with_phase(state, Phase::Ran))
        }) {
            Ok(before) => self.return_if_done(with_phase(before, Phase::Ran)),
            Err(_) => {
                debug_assert!(false, "a dealloca ran twice, or unrecorded");
                false
            }
        }
    }

    /// The batch holding the `dealloca` lets it go: if it never ran, the
    /// buffer is live again.
    pub(crate) fn dealloca_let_go(&self) {
        // Not recorded any more: it ran, and nothing is to undo.
        let _ = self.update(|state| {
            (phase_of(state) == Phase::DeallocaRecorded).then(|| with_phase(state, Phase::Live))
        });
    }

    /// Moves `state` by `next` (`None`: refuse) in one read-modify-write;
    /// the state before, or the state that refused.
    fn update(&self, next: impl FnMut(u64) -> Option<u64>) -> std::result::Result<u64, u64> {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, next)
    }

    /// With `state` just written: moves `Ran` with no use to `Returned`;
    /// `true` for the one caller that did.
    fn return_if_done(&self, state: u64) -> bool {
        if phase_of(state) != Phase::Ran || state & USES != 0 {
            return false;
        }
        self.state
            .compare_exchange(
                state,
                with_phase(state, Phase::Returned),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    fn queue_phrase(&self) -> String {
        match QueueId::from_raw(self.dealloca_queue.load(Ordering::Relaxed)) {
            Some(queue) => format!("on {queue}"),
            None => "on a queue".into(),
        }
    }
}
