//! [`MemoryStats`]: what a pool counts, kept beside the code that counts it.

use std::fmt;

/// A pool's figures at one moment ([`MemoryPool::stats`](super::MemoryPool::stats)).
///
/// Bytes are counted as the pool hands them out: each range rounded up to
/// the backend's alignment. `in_use + cached == reserved`.
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
    /// Bytes reserved and not in use: what the pool can hand out again
    /// without asking the backend.
    pub cached: usize,
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
    /// bytes. A lower bound, exact to within one bin of the offset allocator
    /// (1/8 of the size).
    pub largest_free_range: usize,
    /// Times a backend's out-of-memory made the pool free its cache and
    /// retry.
    pub oom_retries: u64,
    /// Allocations refused for want of memory, after the retry.
    pub oom_failures: u64,
    /// The most bytes kept cached; above it, emptied blocks go back to the
    /// backend at once.
    pub release_threshold: usize,
    /// The most bytes the pool may reserve, if limited.
    pub limit: Option<usize>,
}

impl MemoryStats {
    /// `reserved / peak_in_use`: how much the pool holds for what was used
    /// at most (1.0 is no overhead); `None` before any allocation.
    pub fn reserved_per_peak(&self) -> Option<f64> {
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

/// A summary a person can read, one line per group:
///
/// ```text
/// in use 20.0 MiB (peak 24.0 MiB) in 12 ranges; reserved 42.0 MiB (peak 42.0 MiB) in 3 blocks, 22.0 MiB cached
/// 1043 allocations, 5 blocks allocated, 2 freed; largest free range 18.0 MiB; 0 out-of-memory retries
/// ```
impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "in use {} (peak {}) in {} ranges; reserved {} (peak {}) in {} blocks, {} cached",
            Bytes(self.in_use),
            Bytes(self.peak_in_use),
            self.live_allocations,
            Bytes(self.reserved),
            Bytes(self.peak_reserved),
            self.blocks,
            Bytes(self.cached),
        )?;
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
