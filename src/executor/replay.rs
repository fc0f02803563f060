//! A plan's runs repeated without recording their kernels again.
//!
//! A run whose bindings and scalars did not change since the last run that
//! recorded its `exec`s under replay gives its device queues the same
//! kernels over the same bytes: only the signal and wait values differ.
//! Under replay, a stretch's waits on the run before are recorded before
//! its first kernel, whichever of them a run finds pending, so every run
//! gives the engine the same runs of kernels. On
//! such a run, a queue whose engine still holds the device programs it
//! recorded from that batch ([`HardwareQueue::replay_recorded`]) gets one
//! [`HardwareQueue::replay_program`] per run of kernels instead of an `exec`
//! per kernel, and one `signal` at the run's last value instead of one per
//! kernel: the engine matches nothing, and the host's cost of a run grows
//! with its runs of kernels, not its kernels. Everything else (waits,
//! copies, fills, uploads, downloads, single kernels) is recorded as on any
//! run. A rebinding, a new scalar value, turning replay or profiling on or
//! off, or a refused run makes the next run record its `exec`s again
//! (through which the engine patches or rebuilds its programs).

use std::ops::Range;

use super::ordering::PlannedOp;
use super::schedule::{Schedule, Work};
use crate::backend::Backend;

/// A device queue's runs of kernels, as its engine records them.
#[derive(Debug, Default)]
pub(super) struct Stretches {
    /// Positions in the queue's operations: each run of two or more
    /// `exec`s with no wait before any of them but the first, other than
    /// on the run before (a run records those before the stretch's first
    /// kernel, so nothing but their signals stands between its kernels'
    /// commands in a batch).
    pub(super) at: Vec<Range<usize>>,
    /// How many kernels each runs: what `replay_recorded` compares.
    pub(super) kernels: Vec<u32>,
    /// Per stretch, its operations after the first that wait (on the run
    /// before): their waits go before its first kernel. Mostly empty.
    pub(super) waiting: Vec<Vec<usize>>,
    /// The plan's edit count when the queue last submitted a run that
    /// recorded its `exec`s under replay; `None`: none since it was
    /// refused, or replay is off.
    pub(super) recorded_at: Option<u64>,
}

impl Stretches {
    /// The runs of kernels among `ops`, a queue's operations in order.
    pub(super) fn of<B: Backend>(
        ops: &[usize],
        schedule: &Schedule<B>,
        facts: &[PlannedOp],
    ) -> Self {
        let mut stretches = Self::default();
        let exec = |op: usize| matches!(schedule.ops[op].work, Work::Exec { .. });
        let mut position = 0;
        while position < ops.len() {
            let start = position;
            position += 1;
            if !exec(ops[start]) {
                continue;
            }
            let within = |op: usize| facts[op].waits.iter().all(|wait| wait.previous_run);
            while position < ops.len() && exec(ops[position]) && within(ops[position]) {
                position += 1;
            }
            if position - start >= 2 {
                let waiting = ops[start + 1..position].iter().copied();
                (stretches.waiting)
                    .push(waiting.filter(|&op| !facts[op].waits.is_empty()).collect());
                stretches.at.push(start..position);
                stretches
                    .kernels
                    .push(u32::try_from(position - start).unwrap_or(u32::MAX));
            }
        }
        stretches
    }
}
