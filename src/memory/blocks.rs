//! What a [`MemoryPool`](super::MemoryPool) keeps behind its lock: its
//! blocks, each with the offset allocator that hands out its ranges, the two
//! classes of block, the free lists of small ranges kept for reuse, and the
//! counters; and what is done to them under the lock (find a range, take
//! one back, give empty blocks up). `pool.rs` is the pool around it: the
//! lock, the block source, growing, the out-of-memory retry and the public
//! calls.

use offset_allocator::{Allocation, Allocator};

use super::stats::MemoryStats;
use super::{DEFAULT_RELEASE_THRESHOLD, SMALL_REQUEST};

/// The most ranges one block's offset allocator tracks. Its bookkeeping is
/// [`NODE_BYTES`] a range, allocated with the block (128 KiB of host memory
/// a block); a block with no node left is skipped like a full one.
pub(super) const MAX_RANGES_PER_BLOCK: u32 = 4096;

/// Ranges up to this many bytes are kept for the next request of their
/// exact size when given back (a free list per size, in front of the
/// offset allocator, as glibc's tcache is in front of its bins): the small
/// path then costs a push and a pop instead of the allocator's bin search
/// and neighbour merge (about 500 instructions a cycle).
pub(super) const RECYCLE_BYTES: usize = 4096;

/// The most bytes kept in those free lists; past it, ranges go back to
/// their allocator.
pub(super) const RECYCLE_CAP: usize = 1 << 20;

/// Host bytes of an offset allocator's record per range it can track: a
/// 28-byte node (offset, size, four links, a flag) and a 4-byte free-list
/// entry.
pub(crate) const NODE_BYTES: usize = 32;

/// Host bytes of an offset allocator beside its nodes: 256 bin heads of 4
/// bytes, 32 bin masks and its counters, rounded up.
pub(super) const ALLOCATOR_BYTES: usize = 1152;

/// The most units one range may take: past it, rounding a request up to the
/// offset allocator's bins (a float of 3 mantissa bits) passes `u32::MAX`
/// and the allocator cannot serve it. `0xF000_0000` is itself a bin's size
/// (mantissa 7, exponent 29), so every request up to it rounds to at most
/// it.
pub(super) const MAX_UNITS: u32 = 0xF000_0000;

/// The nodes a block of `units` gets: one per range it can hold plus the
/// free region around them, at most [`MAX_RANGES_PER_BLOCK`].
fn nodes_for(units: u32) -> u32 {
    units.saturating_add(2).min(MAX_RANGES_PER_BLOCK)
}

/// Host bytes of the bookkeeping of a block with `nodes` nodes.
fn bookkeeping_of(nodes: u32) -> usize {
    ALLOCATOR_BYTES + nodes as usize * NODE_BYTES
}

/// A range given back while the pool's lock was held.
pub(super) struct Returned {
    pub(super) block: u32,
    pub(super) allocation: Allocation<u32>,
    pub(super) len: usize,
    pub(super) taken: usize,
}

/// Everything behind the pool's lock.
pub(super) struct State<K> {
    /// The blocks, by id (an index that stays put while the block lives);
    /// `None` where a block was freed.
    pub(super) blocks: Vec<Option<Block<K>>>,
    /// Ids of `None` entries of `blocks`, for the next block.
    pub(super) vacant: Vec<u32>,
    /// The ids of each class's blocks, in the order they are searched (the
    /// oldest first, so ranges pack towards the first blocks and later ones
    /// empty out for `trim`).
    pub(super) classes: [Vec<u32>; 2],
    /// Per block id, the largest range its allocator can still hand out,
    /// in units (its `storage_report`, which is exactly what `allocate` can
    /// serve): `find` passes over a block that cannot fit a request without
    /// touching its allocator.
    pub(super) largest_free: Vec<u32>,
    /// The counters (`cached` and `largest_free_range` are worked out when
    /// read).
    pub(super) stats: MemoryStats,
    /// Small ranges given back and kept for a request of their size, by
    /// size in units less one: still taken in their block's allocator, but
    /// counted neither in use nor in their block's `live` (so cached, in
    /// the statistics). Everything that looks at the allocators or frees
    /// blocks ([`take_empty_blocks`](State::take_empty_blocks), `stats`,
    /// `grow`) first gives them back ([`flush_recycled`](State::flush_recycled)).
    pub(super) recycled: Vec<Vec<(u32, Allocation<u32>)>>,
    /// Bytes in `recycled`.
    pub(super) recycled_bytes: usize,
    /// The source's `ALIGNMENT`: the bytes of a unit.
    pub(super) align: usize,
}

/// One block and the ranges handed out of it.
pub(super) struct Block<K> {
    pub(super) block: K,
    /// Bytes.
    pub(super) size: usize,
    pub(super) class: Class,
    /// Host bytes of `ranges`' records, counted in
    /// [`MemoryStats::bookkeeping`].
    pub(super) bookkeeping: usize,
    /// Offsets and sizes in units of `BlockSource::ALIGNMENT`.
    pub(super) ranges: Allocator<u32>,
    /// Ranges handed out and not returned.
    pub(super) live: usize,
    /// Bytes below this offset may have been written since the block was
    /// allocated; above it they are as the backend handed them over (zero,
    /// where `BlockSource::ZEROED_BLOCKS`).
    pub(super) dirty_end: usize,
}

/// Which blocks a request is served from: small requests never split a
/// large block (PyTorch's two pools), so a long-lived small tensor cannot
/// pin a 20 MiB block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Small = 0,
    Large = 1,
}

impl Class {
    pub(super) fn of(size: usize) -> Self {
        if size <= SMALL_REQUEST {
            Class::Small
        } else {
            Class::Large
        }
    }
}

impl<K> State<K> {
    /// An empty state, for a source of `align`-byte units.
    pub(super) fn new(align: usize) -> Self {
        Self {
            blocks: Vec::new(),
            vacant: Vec::new(),
            classes: [Vec::new(), Vec::new()],
            largest_free: Vec::new(),
            stats: MemoryStats {
                release_threshold: DEFAULT_RELEASE_THRESHOLD,
                ..MemoryStats::default()
            },
            recycled: Vec::new(),
            recycled_bytes: 0,
            align,
        }
    }

    /// Takes a new block of `size` bytes (a source's `block`) of `class`
    /// into the pool; returns its id.
    pub(super) fn insert_block(&mut self, block: K, size: usize, class: Class) -> u32 {
        // Past `u32::MAX` units the allocator still manages the first
        // `u32::MAX`: a request never needs more than `MAX_UNITS`.
        let units = u32::try_from(size / self.align).unwrap_or(u32::MAX);
        let nodes = nodes_for(units);
        let entry = Block {
            block,
            size,
            class,
            bookkeeping: bookkeeping_of(nodes),
            ranges: Allocator::with_max_allocs(units, nodes),
            live: 0,
            dirty_end: 0,
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                self.blocks[id as usize] = Some(entry);
                id
            }
            None => {
                self.blocks.push(Some(entry));
                self.largest_free.push(0);
                (self.blocks.len() - 1) as u32
            }
        };
        self.refresh(id);
        self.classes[class as usize].push(id);
        let stats = &mut self.stats;
        stats.bookkeeping += bookkeeping_of(nodes);
        stats.reserved += size;
        stats.peak_reserved = stats.peak_reserved.max(stats.reserved);
        stats.blocks += 1;
        stats.block_allocations += 1;
        id
    }

    /// A range of exactly `units` kept for reuse, if any.
    #[inline]
    pub(super) fn take_recycled(&mut self, units: u32) -> Option<(u32, Allocation<u32>)> {
        let found = self
            .recycled
            .get_mut((units as usize).checked_sub(1)?)?
            .pop()?;
        self.recycled_bytes -= units as usize * self.align;
        Some(found)
    }

    /// Gives every range kept for reuse back to its allocator; whether
    /// there was any.
    pub(super) fn flush_recycled(&mut self) -> bool {
        if self.recycled_bytes == 0 {
            return false;
        }
        for list in &mut self.recycled {
            for (block, allocation) in list.drain(..) {
                if let Some(entry) = self.blocks[block as usize].as_mut() {
                    entry.ranges.free(allocation);
                    self.largest_free[block as usize] =
                        entry.ranges.storage_report().largest_free_region;
                }
            }
        }
        self.recycled_bytes = 0;
        true
    }

    /// Takes a range back; returns the blocks the release threshold lets
    /// go, for the caller to free once the lock is dropped.
    pub(super) fn return_range(&mut self, range: Returned) -> Vec<(K, usize)> {
        let align = self.align;
        let Returned {
            block,
            allocation,
            len,
            taken,
        } = range;
        let Some(entry) = self.blocks.get_mut(block as usize).and_then(Option::as_mut) else {
            // A live range keeps its block: unreachable, and nothing to free.
            debug_assert!(false, "a range of block {block} outlived its block");
            return Vec::new();
        };
        entry.live -= 1;
        let emptied = entry.live == 0;
        let units = taken / align;
        let recycle = taken <= RECYCLE_BYTES
            && self.recycled_bytes + taken <= RECYCLE_CAP
            && self.stats.release_threshold == DEFAULT_RELEASE_THRESHOLD;
        if recycle {
            if self.recycled.len() < units {
                self.recycled.resize_with(units, Vec::new);
            }
            self.recycled[units - 1].push((block, allocation));
            self.recycled_bytes += taken;
        } else {
            entry.ranges.free(allocation);
            self.refresh(block);
        }
        let stats = &mut self.stats;
        stats.in_use -= taken;
        stats.requested -= len;
        stats.live_allocations -= 1;
        let threshold = stats.release_threshold;
        if emptied && stats.reserved - stats.in_use > threshold {
            self.take_empty_blocks(threshold)
        } else {
            Vec::new()
        }
    }

    /// A range of `units` from an existing block of `class`.
    #[inline]
    pub(super) fn find(&mut self, units: u32, class: Class) -> Option<(u32, Allocation<u32>)> {
        let (blocks, largest_free) = (&mut self.blocks, &mut self.largest_free);
        self.classes[class as usize].iter().find_map(|&id| {
            if largest_free[id as usize] < units {
                return None;
            }
            let entry = blocks[id as usize].as_mut()?;
            let allocation = entry.ranges.allocate(units)?;
            largest_free[id as usize] = entry.ranges.storage_report().largest_free_region;
            Some((id, allocation))
        })
    }

    /// Updates `largest_free` for block `id` after its allocator changed.
    pub(super) fn refresh(&mut self, id: u32) {
        if let Some(entry) = &self.blocks[id as usize] {
            self.largest_free[id as usize] = entry.ranges.storage_report().largest_free_region;
        }
    }

    pub(super) fn block_mut(&mut self, id: u32) -> &mut Block<K> {
        self.blocks[id as usize]
            .as_mut()
            .unwrap_or_else(|| unreachable!("block {id} was just found or made"))
    }

    /// The ids of blocks with no range in use.
    pub(super) fn empty_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.blocks.iter().enumerate().filter_map(|(id, entry)| {
            entry
                .as_ref()
                .filter(|entry| entry.live == 0)
                .map(|_| id as u32)
        })
    }

    /// Takes empty blocks out of the pool, the largest first, until at most
    /// `keep` bytes stay cached; returns them (with their sizes) for the
    /// caller to free once the lock is dropped.
    pub(super) fn take_empty_blocks(&mut self, keep: usize) -> Vec<(K, usize)> {
        self.flush_recycled();
        let mut empty: Vec<(u32, usize)> = self
            .empty_blocks()
            .map(|id| (id, self.blocks[id as usize].as_ref().map_or(0, |b| b.size)))
            .collect();
        empty.sort_unstable_by_key(|&(id, size)| (std::cmp::Reverse(size), id));
        let mut freed = Vec::new();
        for (id, _) in empty {
            if self.stats.reserved - self.stats.in_use <= keep {
                break;
            }
            freed.extend(self.take_block(id));
        }
        freed
    }

    /// Takes block `id` (which has no range in use) out of the pool; returns
    /// it, with its size, for the caller to free once the lock is dropped.
    pub(super) fn take_block(&mut self, id: u32) -> Option<(K, usize)> {
        let entry = self.blocks[id as usize].take()?;
        self.classes[entry.class as usize].retain(|&other| other != id);
        self.vacant.push(id);
        self.stats.reserved -= entry.size;
        self.stats.bookkeeping -= entry.bookkeeping;
        self.stats.blocks -= 1;
        self.stats.block_frees += 1;
        Some((entry.block, entry.size))
    }
}
