//! [`MemoryPool`]: blocks from a [`BlockSource`], ranges handed out of
//! them, statistics, trim and the out-of-memory retry.

use std::fmt;

use offset_allocator::Allocation;

use super::blocks::{Class, MAX_UNITS, Returned, State};
use super::stats::{Bytes, MemoryStats};
use super::{
    BLOCK_GRANULE, BlockError, BlockSource, DEDICATED_REQUEST, LARGE_BLOCK, SMALL_BLOCK,
    SMALL_REQUEST, ZeroError,
};
use crate::error::{Error, Result};
use crate::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering};

/// A device's memory pool: blocks from its [`BlockSource`], sub-allocated
/// into ranges. Cheap to clone; clones are handles to one pool. Every range
/// handed out holds a handle, so the pool (and its blocks) outlive every
/// buffer made from it, whatever is dropped first.
///
/// See [the module docs](super) for the design.
pub struct MemoryPool<S: BlockSource> {
    shared: Arc<Shared<S>>,
}

struct Shared<S: BlockSource> {
    source: S,
    state: Mutex<State<S::Block>>,
    /// Ranges given back while `state` was held by someone else: merged by
    /// the next holder of `state` ([`MemoryPool::lock`]), so a range's
    /// return never waits for the pool's lock (an engine returning a
    /// `dealloca`'s range on a queue's critical path, while the host
    /// allocates).
    ///
    /// | field | meaning | written by | read by |
    /// |-------|---------|------------|---------|
    /// | `returned` | the ranges waiting | `give_back`, under its own lock | `lock`, under `state` and its own lock |
    /// | `pending` | `returned` may be non-empty | `give_back`, `Release`, after pushing | `lock`: a `Relaxed` load, then `swap(false, Acquire)` when set, so whoever locks `state` after observing something the giver did after `give_back` (a signal it set) finds the range merged |
    returned: Mutex<Vec<Returned>>,
    pending: AtomicBool,
}

/// A range of a pool's block, handed out as a buffer's memory. Dropping it
/// returns the range to the pool.
pub struct PooledRange<S: BlockSource> {
    pool: MemoryPool<S>,
    range: Range<S::Address>,
}

/// A range as the pool records it, without a handle to the pool: an
/// [`Allocation`](super::Allocation) holds one beside the pool's handle it
/// keeps anyway (one reference count per buffer, not two), and gives it
/// back with [`MemoryPool::give_back_range`].
pub(crate) struct Range<A> {
    address: A,
    /// Bytes asked for.
    len: usize,
    /// Bytes taken from the block (`len` rounded up to the alignment).
    taken: usize,
    block: u32,
    allocation: Allocation<u32>,
}

impl<A: Copy> Range<A> {
    /// The address of the first byte.
    #[inline]
    pub(crate) fn address(&self) -> A {
        self.address
    }
}

impl<S: BlockSource> PooledRange<S> {
    /// The address of the first byte.
    #[inline]
    pub fn address(&self) -> S::Address {
        self.range.address
    }

    /// Bytes asked for (the range may take more of its block: see
    /// [`taken`](Self::taken)).
    #[inline]
    pub fn len(&self) -> usize {
        self.range.len
    }

    /// Whether the range is empty (never: a pool hands out no empty range).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.range.len == 0
    }

    /// Bytes of the block the range takes: its length rounded up to the
    /// pool's alignment.
    #[inline]
    pub fn taken(&self) -> usize {
        self.range.taken
    }

    /// The pool the range belongs to.
    #[inline]
    pub fn pool(&self) -> &MemoryPool<S> {
        &self.pool
    }
}

impl<S: BlockSource> Drop for PooledRange<S> {
    fn drop(&mut self) {
        let range = Range {
            allocation: self.range.allocation,
            ..self.range
        };
        self.pool.give_back_range(range);
    }
}

impl<S: BlockSource> fmt::Debug for PooledRange<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledRange")
            .field("len", &self.range.len)
            .field("taken", &self.range.taken)
            .field("block", &self.range.block)
            .finish_non_exhaustive()
    }
}

impl<S: BlockSource> Clone for MemoryPool<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: BlockSource> MemoryPool<S> {
    /// An empty pool over `source`: no block is allocated until the first
    /// range is asked for.
    pub fn new(source: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                source,
                state: Mutex::new(State::new(S::ALIGNMENT)),
                returned: Mutex::new(Vec::new()),
                pending: AtomicBool::new(false),
            }),
        }
    }

    /// The backend's block source.
    pub fn source(&self) -> &S {
        &self.shared.source
    }

    /// Whether two handles name the same pool.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// A range of `size` bytes whose contents are whatever the bytes last
    /// held (zeros if the block never handed them out, where the backend's
    /// blocks come zeroed).
    ///
    /// # Errors
    /// [`Error::InvalidAllocation`] for `size` 0 (an empty buffer takes no
    /// range: `Device::alloc(0)` makes one); [`Error::OutOfMemory`], with
    /// the pool's and the device's figures, when the size cannot be rounded
    /// to the alignment or no block can be had even after the cache was
    /// freed; what the backend reports otherwise.
    pub fn alloc_uninit(&self, size: usize) -> Result<PooledRange<S>> {
        self.allocate(size, false)
    }

    /// A range of `size` bytes that reads as zeros. Bytes the block never
    /// handed out cost nothing; others are zeroed by the backend
    /// ([`BlockSource::zero`]).
    ///
    /// # Errors
    /// As [`alloc_uninit`](Self::alloc_uninit), and what zeroing reports.
    pub fn alloc_zeroed(&self, size: usize) -> Result<PooledRange<S>> {
        self.allocate(size, true)
    }

    /// [`alloc_zeroed`](Self::alloc_zeroed) or
    /// [`alloc_uninit`](Self::alloc_uninit), as `zeroed` says.
    pub(crate) fn allocate(&self, size: usize, zeroed: bool) -> Result<PooledRange<S>> {
        Ok(PooledRange {
            pool: self.clone(),
            range: self.allocate_range(size, zeroed)?,
        })
    }

    /// [`allocate`](Self::allocate), as the pool's record of the range,
    /// which the caller gives back with
    /// [`give_back_range`](Self::give_back_range).
    pub(crate) fn allocate_range(&self, size: usize, zeroed: bool) -> Result<Range<S::Address>> {
        if size == 0 {
            return Err(Error::InvalidAllocation {
                size,
                reason: "a pool hands out no empty range; an empty buffer takes no memory from \
                         the pool (`Device::alloc(0)` makes one), so ask for at least one byte"
                    .into(),
            });
        }
        let align = S::ALIGNMENT;
        let max_range = MAX_UNITS as usize * align;
        let taken = size
            .checked_next_multiple_of(align)
            .filter(|&taken| taken <= max_range)
            .ok_or_else(|| {
                let mut state = self.lock();
                state.stats.oom_failures += 1;
                self.out_of_memory(
                    &state,
                    size,
                    format!(
                        "one range holds at most {} ({max_range} bytes: the pool's offset \
                         allocator counts {align}-byte units in 32 bits); split the tensor \
                         across buffers",
                        Bytes(max_range)
                    ),
                )
            })?;
        let units = (taken / align) as u32;
        let mut state = self.lock();
        let found = match state.take_recycled(units) {
            Some(found) => Some(found),
            None => state.find(units, Class::of(size)),
        };
        let (block, allocation) = match found {
            Some(found) => found,
            None => self.grow(&mut state, size, units)?,
        };
        let entry = state.block_mut(block);
        let offset = allocation.offset as usize * align;
        let address = self.shared.source.address(&entry.block, offset);
        // Only the bytes below the block's high-water mark may hold data.
        let dirty = if S::ZEROED_BLOCKS {
            entry.dirty_end.saturating_sub(offset).min(size)
        } else {
            size
        };
        entry.dirty_end = entry.dirty_end.max(offset + size);
        entry.live += 1;
        let stats = &mut state.stats;
        stats.in_use += taken;
        stats.requested += size;
        stats.peak_in_use = stats.peak_in_use.max(stats.in_use);
        stats.live_allocations += 1;
        stats.allocations += 1;
        drop(state);
        let range = Range {
            address,
            len: size,
            taken,
            block,
            allocation,
        };
        if zeroed && dirty > 0 {
            // SAFETY: the first `dirty <= size` bytes from `address` lie in
            // the range just taken from a live block of this source (the
            // block stays until the range is given back), and nobody else
            // has the range yet.
            match unsafe { self.shared.source.zero(address, dirty) } {
                Ok(()) => {}
                Err(ZeroError::Failed(error)) => {
                    self.give_back_range(range);
                    return Err(error);
                }
                // Kept for the process: never given back, so still taken,
                // counted in use and holding its block, which the pool's
                // drop keeps too (`Shared::drop`); the pool's other blocks
                // go back as usual (a handle of the pool kept with it held
                // every block, and the cache, for the process).
                Err(ZeroError::StillWriting(error)) => return Err(error),
            }
        }
        Ok(range)
    }

    /// A new block for a request of `size` bytes (`units` of the alignment,
    /// at most [`MAX_UNITS`]) that no block could serve, and the range from
    /// it; out of memory, frees the cache and tries once more.
    fn grow(
        &self,
        state: &mut MutexGuard<'_, State<S::Block>>,
        size: usize,
        units: u32,
    ) -> Result<(u32, Allocation<u32>)> {
        let class = Class::of(size);
        // Ranges kept for reuse may be what stands in the way.
        if state.flush_recycled()
            && let Some(found) = state.find(units, class)
        {
            return Ok(found);
        }
        let mut retried = false;
        loop {
            let mut refused = None;
            for block_size in self.block_sizes(state, size, units, class) {
                match self.new_block(state, block_size, class) {
                    Ok(block) => {
                        if let Some(allocation) = state.block_mut(block).ranges.allocate(units) {
                            state.refresh(block);
                            return Ok((block, allocation));
                        }
                        // Unreachable: the block is at least `units` rounded
                        // up to a bin, with nodes to spare. Give it back
                        // rather than keep a block nothing can use.
                        debug_assert!(false, "a fresh block of {block_size} could not hold it");
                        let freed = state.take_block(block);
                        self.free_blocks(freed.into_iter().collect());
                        return Err(Error::InvalidAllocation {
                            size,
                            reason: format!(
                                "a fresh block of {block_size} bytes could not hold it; this is a \
                                 bug in hwqueue's pool, please report it"
                            ),
                        });
                    }
                    Err(BlockError::OutOfMemory(detail)) => refused = Some(detail),
                    Err(BlockError::Other(error)) => return Err(error),
                }
            }
            let detail = refused.unwrap_or_default();
            // Ranges given back while this held the lock (a buffer dropped
            // on another thread) wait in `returned`: they count first.
            let returned = self.take_returned(state);
            self.free_blocks(returned);
            // They may have made room in a block still partly in use.
            state.flush_recycled();
            if let Some(found) = state.find(units, class) {
                return Ok(found);
            }
            if retried || state.empty_blocks().next().is_none() {
                state.stats.oom_failures += 1;
                return Err(self.out_of_memory(state, size, detail));
            }
            retried = true;
            state.stats.oom_retries += 1;
            let freed = state.take_empty_blocks(0);
            self.free_blocks(freed);
        }
    }

    /// The block sizes to ask the source for, in order, for a request of
    /// `size` bytes (`units` of the alignment) of `class`: the class's
    /// usual block (PyTorch's sizes); under a limit it would pass, the
    /// largest block that still fits under it, so small requests go on
    /// sharing blocks; and at least the smallest block that can serve the
    /// request. Every size is a multiple of the source's
    /// [`granularity`](BlockSource::granularity), so `reserved` counts what
    /// the source really holds.
    fn block_sizes(
        &self,
        state: &State<S::Block>,
        size: usize,
        units: u32,
        class: Class,
    ) -> impl Iterator<Item = usize> + use<S> {
        let granule = self.shared.source.granularity().max(S::ALIGNMENT);
        let round = move |bytes: usize| bytes.checked_next_multiple_of(granule);
        // The smallest block the offset allocator can serve `units` from: its
        // bins are a small float, so the request rounded up to a bin
        // (`units <= MAX_UNITS` keeps that within `u32`).
        let fits_units = offset_allocator::ext::min_allocator_size(units).max(units);
        let fits = round(fits_units as usize * S::ALIGNMENT);
        let preferred = match class {
            Class::Small => Some(SMALL_BLOCK),
            Class::Large if size <= DEDICATED_REQUEST => Some(LARGE_BLOCK),
            Class::Large => size.checked_next_multiple_of(BLOCK_GRANULE),
        }
        .and_then(round)
        .map(|preferred| preferred.max(fits.unwrap_or(0)));
        // Under a limit the preferred block would pass: what room is left,
        // rounded down to the granule, if it can still serve the request.
        let under_limit = state.stats.limit.and_then(|limit| {
            let room = limit.saturating_sub(state.stats.reserved);
            let room = room - room % granule;
            (preferred.is_some_and(|p| p > room) && fits.is_some_and(|f| f <= room)).then_some(room)
        });
        let mut sizes = [preferred, under_limit, fits];
        // Each size once, in order.
        for i in 1..sizes.len() {
            if sizes[..i].contains(&sizes[i]) {
                sizes[i] = None;
            }
        }
        sizes.into_iter().flatten()
    }

    /// Asks the source for a block of `size` bytes of `class`, within the
    /// limit.
    fn new_block(
        &self,
        state: &mut State<S::Block>,
        size: usize,
        class: Class,
    ) -> std::result::Result<u32, BlockError> {
        if let Some(limit) = state.stats.limit
            && state.stats.reserved.saturating_add(size) > limit
        {
            return Err(BlockError::OutOfMemory(format!(
                "a block of {} would pass the pool's limit of {}",
                Bytes(size),
                Bytes(limit)
            )));
        }
        let block = self.shared.source.allocate(size)?;
        Ok(state.insert_block(block, size, class))
    }

    /// Takes a range back (a [`PooledRange`]'s drop, an allocation's
    /// return): at once when the pool's lock is free, else to `returned`,
    /// for the lock's holder or the next one to merge, without waiting.
    pub(crate) fn give_back_range(&self, range: Range<S::Address>) {
        let returned = Returned {
            block: range.block,
            allocation: range.allocation,
            len: range.len,
            taken: range.taken,
        };
        let Some(mut state) = self.shared.state.try_lock() else {
            self.shared.returned.lock().push(returned);
            self.shared.pending.store(true, Ordering::Release);
            // The holder may have looked before the push and be gone now:
            // take the lock (without waiting) to merge it, so the range is
            // not left waiting until the pool's next use.
            if let Some(state) = self.shared.state.try_lock() {
                self.merge_returned(state);
            }
            return;
        };
        let freed = state.return_range(returned);
        drop(state);
        self.free_blocks(freed);
    }

    /// Merges the ranges given back while the lock was held, then drops
    /// the lock and frees what the release threshold lets go.
    fn merge_returned(&self, mut state: MutexGuard<'_, State<S::Block>>) {
        let freed = self.take_returned(&mut state);
        drop(state);
        self.free_blocks(freed);
    }

    /// Merges the ranges given back while the lock was held; returns the
    /// blocks the release threshold lets go, for the caller to free once
    /// the lock is dropped.
    fn take_returned(&self, state: &mut State<S::Block>) -> Vec<(S::Block, usize)> {
        let mut freed = Vec::new();
        // A load first: on the usual path nothing is pending, and a swap
        // would write the line every allocation. Whoever observed something
        // the giver did after its `Release` store sees `true` here.
        if self.shared.pending.load(Ordering::Relaxed)
            && self.shared.pending.swap(false, Ordering::Acquire)
        {
            let returned = std::mem::take(&mut *self.shared.returned.lock());
            for range in returned {
                freed.extend(state.return_range(range));
            }
        }
        freed
    }

    /// The pool's figures now.
    pub fn stats(&self) -> MemoryStats {
        let mut state = self.lock();
        state.flush_recycled();
        let mut stats = state.stats;
        // Free bytes a block's allocator can still hand out; a block with
        // no record left for another range reports none (its
        // `storage_report`), so its free bytes are stranded, not cached.
        let free: usize = (state.blocks.iter().flatten())
            .map(|entry| entry.ranges.storage_report().total_free_space as usize * S::ALIGNMENT)
            .sum();
        stats.cached = free.min(stats.reserved - stats.in_use);
        stats.stranded = stats.reserved - stats.in_use - stats.cached;
        // A request of at most `SMALL_REQUEST` is served from small blocks
        // only, a larger one from large blocks only: the largest one
        // allocation can get is the larger of the two classes' figures,
        // the small one capped at what a small request may be.
        let largest = |class: Class| {
            state.classes[class as usize]
                .iter()
                .map(|&id| state.largest_free[id as usize] as usize * S::ALIGNMENT)
                .max()
                .unwrap_or(0)
        };
        let small = largest(Class::Small).min(SMALL_REQUEST);
        let large = largest(Class::Large);
        // A large block's free range of at most `SMALL_REQUEST` serves no
        // request: a request that small goes to the small blocks.
        let large = if large > SMALL_REQUEST { large } else { 0 };
        stats.largest_free_range = small.max(large);
        stats
    }

    /// Starts the peaks over from what is in use and reserved now.
    pub fn reset_peak(&self) {
        let mut state = self.lock();
        let stats = &mut state.stats;
        stats.peak_in_use = stats.in_use;
        stats.peak_reserved = stats.reserved;
    }

    /// Gives every cached block (one with no range in use) back to the
    /// backend; returns how many bytes that released.
    pub fn trim(&self) -> usize {
        let freed = self.lock().take_empty_blocks(0);
        let bytes = freed.iter().map(|(_, size)| size).sum();
        self.free_blocks(freed);
        bytes
    }

    /// Keeps at most `bytes` cached: above it, a block that empties goes back
    /// to the backend at once. Applies now too (as a partial `trim`). The
    /// default, [`DEFAULT_RELEASE_THRESHOLD`](super::DEFAULT_RELEASE_THRESHOLD), keeps everything.
    pub fn set_release_threshold(&self, bytes: usize) {
        let mut state = self.lock();
        state.stats.release_threshold = bytes;
        let freed = state.take_empty_blocks(bytes);
        drop(state);
        self.free_blocks(freed);
    }

    /// Limits the bytes the pool may reserve from the backend (`None`: no
    /// limit but the device's). A request that would pass it frees the cache
    /// and retries, then fails with [`Error::OutOfMemory`]. Lowering it
    /// below what is reserved frees nothing in use; cached blocks go.
    pub fn set_limit(&self, limit: Option<usize>) {
        let mut state = self.lock();
        state.stats.limit = limit;
        if let Some(limit) = limit {
            let keep = limit.saturating_sub(state.stats.in_use);
            let freed = state.take_empty_blocks(keep);
            drop(state);
            self.free_blocks(freed);
        }
    }

    /// The pool's state, with every range given back so far merged in.
    /// Blocks the release threshold lets go on the way are freed under the
    /// lock (only where a threshold is set, and only then).
    fn lock(&self) -> MutexGuard<'_, State<S::Block>> {
        let mut state = self.shared.state.lock();
        let freed = self.take_returned(&mut state);
        self.free_blocks(freed);
        state
    }

    fn free_blocks(&self, blocks: Vec<(S::Block, usize)>) {
        for (block, _) in blocks {
            self.shared.source.free(block);
        }
    }

    /// The out-of-memory error for `size` bytes, with the pool's figures and
    /// the device's where the backend knows them.
    fn out_of_memory(&self, state: &State<S::Block>, size: usize, detail: String) -> Error {
        super::out_of_memory(
            self.shared.source.device(),
            size,
            detail,
            (state.stats.in_use, state.stats.reserved),
            self.shared.source.device_memory(),
        )
    }
}

impl<S: BlockSource> Drop for Shared<S> {
    fn drop(&mut self) {
        // Every range handed out holds the pool, so none is left but those
        // given back while the lock was held (merged here) and those kept
        // for the process, whose zero fill may still write
        // (`ZeroError::StillWriting`): their blocks are kept too.
        let mut state = self.state.lock();
        for returned in std::mem::take(&mut *self.returned.lock()) {
            for (block, _) in state.return_range(returned) {
                self.source.free(block);
            }
        }
        let blocks = std::mem::take(&mut state.blocks);
        drop(state);
        for entry in blocks.into_iter().flatten() {
            if entry.live > 0 {
                std::mem::forget(entry.block);
            } else {
                self.source.free(entry.block);
            }
        }
    }
}

impl<S: BlockSource> fmt::Debug for MemoryPool<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPool")
            .field("device", &self.shared.source.device())
            .field("stats", &self.stats())
            .finish()
    }
}
