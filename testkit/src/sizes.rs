//! Allocation sizes for the memory bench and example: drawn log-uniformly
//! (as tensor sizes of a model spread over orders of magnitude) with a fixed
//! seed, so every run sees the same list.

/// `count` sizes drawn log-uniformly from `[low, high]` with splitmix64
/// seeded by `seed`.
pub fn log_uniform_sizes(count: usize, low: usize, high: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(SPLITMIX_GAMMA);
        splitmix64(state)
    };
    let (low, high) = ((low as f64).ln(), (high as f64).ln());
    (0..count)
        .map(|_| {
            let unit = (next() >> 11) as f64 / (1u64 << 53) as f64;
            (low + unit * (high - low)).exp().round() as usize
        })
        .collect()
}

/// splitmix64's increment.
pub(crate) const SPLITMIX_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's output mix of `z` (the state after adding
/// [`SPLITMIX_GAMMA`]).
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
