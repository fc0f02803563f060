//! [`MemoryStats`]: what a pool counts, kept beside the code that counts it.

use std::fmt;

/// A pool's figures at one moment ([`MemoryPool::stats`](super::MemoryPool::stats)).
///
/// Bytes are counted as the pool hands them out: each range rounded up to
/// the backend's alignment. `in_use + cached + stranded == reserved`. `reserved` is
/// what the backend really holds for the pool: every block is a multiple of
/// the backend's allocation unit (the page, on the CPU). The pool's own
/// records of its ranges are host memory, counted apart in
/// [`bookkeeping`](Self::bookkeeping).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of the ranges handed out and not yet returned.
    pub in_use: usize,
    /// Bytes asked for by those ranges (before rounding).
    pub requested: usize,
    /// The most `in_use` has been since the pool was made or
    /// [`reset_peak`](super::MemoryPool::reset_peak) was called.
    pub peak_in_use: usize,
    /// Bytes of the blocks held from the backend: in use, or cached.
    pub reserved: usize,
    /// The most `reserved` has been since the pool was made or the peaks
    /// were reset.
    pub peak_reserved: usize,
    /// Host bytes of the pool's records of its blocks' ranges (its offset
    /// allocators: 32 bytes for each range a block can track, at most 4,096
    /// a block, and about 1 KiB a block): bounded by 129 KiB a block, and
    /// not part of `reserved` or of the limit.
    pub bookkeeping: usize,
    /// Bytes reserved, not in use, and free to hand out again without
    /// asking the backend.
    pub cached: usize,
    /// Bytes reserved and not in use that no allocation can get: the free
    /// bytes of blocks whose offset allocator has no record left for
    /// another range (a block tracks at most 4,096), until a range of that
    /// block comes back. Many small ranges alive at once strand them;
    /// fewer, larger ones do not.
    pub stranded: usize,
    /// Ranges handed out and not yet returned.
    pub live_allocations: usize,
    /// Ranges handed out since the pool was made.
    pub allocations: u64,
    /// Blocks held from the backend.
    pub blocks: usize,
    /// Blocks asked of the backend since the pool was made.
    pub block_allocations: u64,
    /// Blocks given back to the backend (by `trim`, the release threshold,
    /// or an out-of-memory retry) since the pool was made.
    pub block_frees: u64,
    /// The largest range one allocation could get without a new block, in
    /// bytes: an `alloc` of this size takes no new block. Requests of at
    /// most [`SMALL_REQUEST`](super::SMALL_REQUEST) are served from small
    /// blocks only and larger ones from large blocks only, so this is the
    /// larger of the small blocks' largest free range (capped at
    /// `SMALL_REQUEST`) and the large blocks' (where it is above
    /// `SMALL_REQUEST`). A lower bound of the free bytes, exact to within
    /// one bin of the offset allocator (1/8 of the size).
    pub largest_free_range: usize,
    /// Times a backend's out-of-memory made the pool free its cache and
    /// retry.
    pub oom_retries: u64,
    /// Allocations refused for want of memory: after the retry, or at once
    /// where the request is larger than any range may be.
    pub oom_failures: u64,
    /// The most bytes kept cached; above it, emptied blocks go back to the
    /// backend at once.
    pub release_threshold: usize,
    /// The most bytes the pool may reserve, if limited.
    pub limit: Option<usize>,
}

impl MemoryStats {
    /// `peak_reserved / peak_in_use`: the most the pool held, for the most
    /// that was in use (1.0 is no overhead), over the same period (since
    /// the pool was made or the peaks were reset); `None` before any
    /// allocation. What is reserved now, after a `trim` for instance, does
    /// not enter it.
    pub fn peak_reserved_per_peak_in_use(&self) -> Option<f64> {
        (self.peak_in_use > 0).then(|| self.peak_reserved as f64 / self.peak_in_use as f64)
    }
}

/// Bytes as a person reads them: `512 B`, `4.0 KiB`, `20.0 MiB`.
pub(crate) struct Bytes(pub(crate) usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

/// A summary a person can read, one line per group (bytes stranded in
/// blocks out of range records, when there are any, end the first):
///
/// ```text
/// in use 20.0 MiB (peak 24.0 MiB) in 12 ranges; reserved 42.0 MiB (peak 42.0 MiB) in 3 blocks, 22.0 MiB cached; bookkeeping 387.4 KiB
/// 1043 allocations, 5 blocks allocated, 2 freed; largest free range 18.0 MiB; 0 out-of-memory retries
/// ```
impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "in use {} (peak {}) in {} ranges; reserved {} (peak {}) in {} blocks, {} cached; \
             bookkeeping {}",
            Bytes(self.in_use),
            Bytes(self.peak_in_use),
            self.live_allocations,
            Bytes(self.reserved),
            Bytes(self.peak_reserved),
            self.blocks,
            Bytes(self.cached),
            Bytes(self.bookkeeping),
        )?;
        if self.stranded > 0 {
            write!(
                f,
                "; {} stranded in blocks out of range records",
                Bytes(self.stranded)
            )?;
        }
        writeln!(f)?;
        write!(
            f,
            "{} allocations, {} blocks allocated, {} freed; largest free range {}; {} \
             out-of-memory retries, {} failures",
            self.allocations,
            self.block_allocations,
            self.block_frees,
            Bytes(self.largest_free_range),
            self.oom_retries,
            self.oom_failures,
        )?;
        if let Some(limit) = self.limit {
            write!(f, "; limit {}", Bytes(limit))?;
        }
        if self.release_threshold != super::DEFAULT_RELEASE_THRESHOLD {
            write!(f, "; release threshold {}", Bytes(self.release_threshold))?;
        }
        Ok(())
    }
}
