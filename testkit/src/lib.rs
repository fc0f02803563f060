//! Test scaffolding shared by the fuzz targets in `fuzz/`, the test that replays
//! their corpora (`tests/fuzz_replay.rs`) and the proptest model tests
//! (`tests/queue_model.rs`, `tests/signal_model.rs`, `tests/memory_model.rs`). Not part of the API.
//!
//! Each harness decodes a small program from bytes (or takes one built by
//! proptest), runs it against the real code and against a tiny sequential
//! reference model, and panics on the first difference. Programs are built
//! so that nothing can block forever: every wait is on a value that work
//! submitted earlier sets (or on a signal already failed), and
//! `synchronize` is only called once every wait submitted can finish.
//!
//! | harness | fuzz target | what it checks |
//! |---------|-------------|----------------|
//! | [`device_spec`] | `device_spec` | parsing never panics; a parsed spec prints and re-parses to itself; acceptance matches a reference predicate |
//! | [`cpu_signal`] | `cpu_signal` | [`SignalOp`] sequences on a `CpuSignal` against a running max and failed ranges |
//! | [`cpu_queue`] | `cpu_queue` | [`QueueProgram`]s on two CPU queues against a sequential interpreter |
//! | [`event_ring`] | `event_ring` | [`RingOp`] sequences on an `EventRing` with a mock event against the records, a running max and failed ranges |
//! | [`memory_pool`] | `memory_pool` | [`PoolOp`] sequences on a CPU device's pool and two queues against which ranges are surely, possibly or no longer live |
//! | [`ptx_params`] | `ptx_params` | the PTX `.entry` reader never panics, and gives back each parameter's size from PTX rendered from a random list |
//! | [`plan_schedule`] | `plan_schedule` | a random schedule of tensors, slots, kernels, copies and fills: placement never overlaps tensors live together, arena ≥ lower bound, and back-to-back runs with canary kernels read what was written |
//!
//! This crate is part of hwqueue's workspace and never part of a normal
//! build of the library: `tests/`, `loom_tests/` and `fuzz/` depend on it.
//! Besides the harnesses it holds [`mock_event::MockDevice`], the one mock of a
//! device's events that the ring's tests, loom models and fuzz harness use,
//! [`log_uniform_sizes`], the allocation sizes of the memory bench and
//! example, and the [`mlp_schedule`] and [`transformer_block_schedule`] of
//! the memory planner's example and tests.

// Under `cfg(loom)` only the mock event is built: the loom models use it,
// and the harnesses (real threads, timeouts) have no place in a model.
#[cfg(not(loom))]
pub mod cuda_kernels;
#[cfg(not(loom))]
pub mod memory;
pub mod mock_event;
#[cfg(not(loom))]
pub mod plans;

#[cfg(not(loom))]
mod plan_runs;
#[cfg(not(loom))]
mod ptx;
#[cfg(not(loom))]
pub mod queue;
#[cfg(not(loom))]
mod reader;
#[cfg(not(loom))]
pub mod ring;
#[cfg(not(loom))]
mod signal;
#[cfg(not(loom))]
mod sizes;
#[cfg(not(loom))]
mod spec;
#[cfg(not(loom))]
pub mod two_backends;

#[cfg(not(loom))]
pub use memory::{PoolOp, check_pool_ops, decode_pool_ops, memory_pool};
#[cfg(not(loom))]
pub use plans::{
    check_plan_runs, check_plan_runs_over_two_backends, check_plan_schedule, mlp_schedule,
    plan_schedule, transformer_block_schedule,
};
#[cfg(not(loom))]
pub use ptx::ptx_params;
#[cfg(not(loom))]
pub use queue::{
    QueueOp, QueueProgram, Step, check_queue_program, cpu_queue, decode_queue_program,
};
#[cfg(not(loom))]
pub use ring::{RingOp, check_ring_ops, event_ring};
#[cfg(not(loom))]
pub use signal::{SignalOp, check_signal_ops, cpu_signal};
#[cfg(not(loom))]
pub use sizes::log_uniform_sizes;
#[cfg(not(loom))]
pub use spec::{ALL_COMPILED, device_spec};
#[cfg(not(loom))]
pub use two_backends::check_plan_over_two_backends;

/// How long a wait that the model says must finish may block before the
/// harness calls it a mismatch (a hang would otherwise stall the fuzzer).
#[cfg(not(loom))]
pub(crate) const MUST_FINISH: std::time::Duration = std::time::Duration::from_secs(10);
