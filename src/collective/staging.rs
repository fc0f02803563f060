//! Host memory a collective's data goes through over MPI, kept by each
//! communicator for its next collectives.
//!
//! Collectives that ride along the description exchange (`small.rs`) and
//! the host's own (an NCCL id's broadcast) move through staging memory, as
//! does what an `all_reduce` in place sends (MPI would need
//! `MPI_IN_PLACE`, which rsmpi does not export): a collective
//! that times out leaks what MPI may still write (`mpi.rs`), and the views
//! stay locked only while they are copied. (Other collectives run over
//! the views' own memory: `cpu/queue/collective.rs`.) Fresh memory of a
//! large collective costs a page fault per page on every call (an
//! all_reduce of 64 MiB faulted 128 MiB in each time), so a communicator
//! keeps up to [`KEEP`] buffers, the largest it used, until it is dropped.

use std::ffi::c_void;

use crate::sync::Mutex;

/// How many buffers a communicator keeps: a collective's send and receive
/// memory, for two at once (collectives and a `send`/`recv` pair run
/// concurrently on different queues).
const KEEP: usize = 4;

/// Memory a collective's data goes through, 8-byte aligned (for `f64`).
pub(super) struct Staging {
    words: Vec<u64>,
    len: usize,
}

impl Staging {
    /// Its `len` bytes.
    pub(super) fn bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// Its first byte, for MPI.
    pub(super) fn ptr(&mut self) -> *mut c_void {
        self.words.as_mut_ptr().cast()
    }
}

/// A communicator's staging memory between collectives.
#[derive(Default)]
pub(super) struct StagingPool {
    /// Buffers not in use, at most [`KEEP`].
    free: Mutex<Vec<Vec<u64>>>,
}

impl StagingPool {
    /// Staging of `len` bytes: the smallest kept buffer that holds them,
    /// else a new one. Its bytes are whatever the last user left (the
    /// collective overwrites them before anyone reads them).
    pub(super) fn take(&self, len: usize) -> Staging {
        let words = len.div_ceil(8);
        let kept = if words == 0 {
            None
        } else {
            let mut free = self.free.lock();
            let best = (free.iter().enumerate())
                .filter(|(_, kept)| kept.len() >= words)
                .min_by_key(|(_, kept)| kept.len())
                .map(|(at, _)| at);
            best.map(|at| free.swap_remove(at))
        };
        Staging {
            words: kept.unwrap_or_else(|| vec![0; words]),
            len,
        }
    }

    /// Keeps `staging` for a later collective, or the largest [`KEEP`]
    /// buffers of those kept and it. Only for staging MPI no longer uses.
    pub(super) fn give_back(&self, staging: Staging) {
        if staging.words.is_empty() {
            return;
        }
        let mut free = self.free.lock();
        free.push(staging.words);
        if free.len() > KEEP
            && let Some((smallest, _)) = free.iter().enumerate().min_by_key(|(_, kept)| kept.len())
        {
            free.swap_remove(smallest);
        }
    }
}
