//! Replay: a batch submitted again and again with the same commands (a
//! plan's run on one queue: new timeline values and host data each time,
//! the same kernels over the same bytes) is recorded once into the
//! engine's own replay form and submitted again, where the engine has one.
//!
//! The queue's owner marks such a batch with a key
//! ([`HardwareQueue::replay_as`](super::HardwareQueue::replay_as)); the
//! engine compares its commands with what it recorded under that key, and
//! resubmits the recording where they match (see [`Engine`](super::Engine)).
//! [`Launches`] counts what was recorded against what was replayed, so a
//! test can tell that replay is really used.
//!
//! Matching still costs a command per kernel recorded into each batch. An
//! owner that knows a batch would be the same as the key's last (a plan
//! whose bindings and scalars did not change) skips that:
//! [`replay_recorded`](super::HardwareQueue::replay_recorded) asks whether
//! the engine holds the device programs it recorded from that batch (one
//! per run of two or more `exec`s), and
//! [`replay_program`](super::HardwareQueue::replay_program) names one
//! instead of recording its kernels ([`Command::Replay`](super::Command));
//! [`Launches::repeats`] counts them. CUDA offers its graphs so, and the
//! simulator (`hwqueue-sim`) its recorded kernels; Vulkan matches each
//! batch against its command buffers instead.

/// What a queue's engine recorded into device programs and what it
/// replayed, since the queue was made: a plan's statistics sum them
/// ([`Plan::launches`](crate::Plan::launches)).
///
/// `non_exhaustive`: an engine outside hwqueue starts from `default()`
/// and sets the counts it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Launches {
    /// Kernel launches recorded or issued one by one: each `exec` the
    /// engine turned into a device command (a dispatch recorded into a
    /// command buffer, a kernel launched on a stream, a work-group grid
    /// run on the CPU).
    pub kernels: u64,
    /// Recorded programs submitted again instead of recording their
    /// commands (each a command buffer or a graph: one launch for all
    /// the kernels in it).
    pub programs: u64,
    /// Of `programs`, those a batch named without recording their kernels
    /// again ([`HardwareQueue::replay_program`](super::HardwareQueue::replay_program):
    /// a plan's run whose bindings and scalars had not changed since one
    /// that recorded them), so the host recorded one command for all their
    /// kernels and the engine matched nothing.
    pub repeats: u64,
    /// Recorded programs that took a run's new bindings in place instead
    /// of being recorded again: CUDA graphs whose kernel nodes were
    /// given the new parameters, Vulkan command buffers whose descriptor
    /// sets were rewritten (only the bindings that changed).
    pub patched: u64,
    /// Why the last batch marked for replay ran the plain way, where one
    /// did (the engine has no replay form, the batch profiles, its
    /// transfers take new staging memory each time, …); `None` where
    /// every marked batch replayed or was recorded to be.
    pub fallback: Option<String>,
}

impl Launches {
    /// Adds `other`'s counts to these (a later fallback reason wins).
    pub fn add(&mut self, other: &Launches) {
        self.kernels += other.kernels;
        self.programs += other.programs;
        self.repeats += other.repeats;
        self.patched += other.patched;
        if other.fallback.is_some() {
            self.fallback.clone_from(&other.fallback);
        }
    }
}
