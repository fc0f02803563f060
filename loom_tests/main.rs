//! loom models of hwqueue's concurrency, run against the real `src/` code:
//! under `--cfg loom` the crate's `sync` shim hands out loom's atomics,
//! mutexes, condvars, `Arc` and threads, so these models explore every
//! interleaving of the shipped `CpuSignal`, `CpuQueue`, the memory pool, `EventRing` (with
//! a mock event) and `Registry` (with a mock backend).
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom
//! ```
//!
//! Each model has a default preemption bound (see [`model`]); setting
//! `LOOM_MAX_PREEMPTIONS` overrides it for every model (`0` is not "none":
//! unset the variable and pass a large bound to explore exhaustively).
//!
//! Every model explores exhaustively by default except
//! `ring::host_set_racing_a_record_wakes_the_waiter` (four threads: bound 4
//! by default) and
//! `cpu_queue::one_failure_is_reported_once_whatever_the_owner_and_worker_race`
//! and `cpu_queue::a_batch_scoped_failure_never_fails_the_batches_after_it`
//! (bound 3; exhaustive takes minutes), and the `multi_wait` models (bound 2
//! or 3: see that file). The whole suite takes about three minutes on two
//! cores, plus about two minutes to build.
//!
//! A spin before a park (`SpinWait` in `src/sync.rs`) is one look under loom:
//! the models explore a partner acting between the spin and the park.
//!
//! A deadlock found in a model of the real code aborts the test binary
//! (SIGABRT: loom panics in the blocked thread, and unwinding the crate's
//! loom `Arc`s panics again) instead of failing one test; run the models one
//! at a time with `-- --exact NAME` to see which. The standalone
//! lost-wake-up model in `lost_wakeup.rs` leaks its signal so that its
//! expected deadlock fails cleanly under `#[should_panic]`.
//!
//! Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

mod cpu_queue;
mod cpu_signal;
mod lost_wakeup;
mod memory;
mod multi_wait;
mod registry;
mod ring;

/// A one-work-group CPU kernel that writes 42 to `buf[0]`: the write the
/// queue models look for.
pub fn write_42() -> hwqueue::cpu::CpuProgram {
    fn kernel(_group: &hwqueue::cpu::WorkGroup, args: &hwqueue::cpu::KernelArgs<'_>) {
        // SAFETY: one work-group: nothing else touches the buffer.
        unsafe { args.buffer(0).slice_mut::<u32>(0..1)[0] = 42 };
    }
    hwqueue::cpu::CpuProgram::from_fn("write_42", 1, 0, kernel)
}

/// Runs `f` under loom. `default_bound` is the preemption bound used when
/// `LOOM_MAX_PREEMPTIONS` is not set (`None`: exhaustive).
pub fn model<F>(default_bound: Option<usize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = default_bound;
    }
    let iterations = Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    // Shown with `--nocapture`: the size of the explored space.
    println!(
        "{}: {} executions, preemption bound {:?}",
        std::thread::current().name().unwrap_or("model"),
        iterations.load(Ordering::Relaxed),
        builder.preemption_bound
    );
}
