//! [`Cx`]: what a case gets, with the setup steps every case takes. A setup
//! step that fails is a failure of the case too, saying which step.

use std::fmt::Display;
use std::sync::Arc;

use hwqueue::{
    Backend, Buffer, BufferOf, Device, DeviceOf, ProgramOf, QueueFactory, QueueOf, SignalOf,
};

use crate::{Kernel, Target};

/// A case's device, and the setup steps cases share.
pub struct Cx<T: Target> {
    /// The device under test.
    pub device: Arc<DeviceOf<T::Backend>>,
}

/// Unwraps a setup step's result, naming the step in the panic.
pub(crate) fn setup<V, E: Display>(step: &str, result: Result<V, E>) -> V {
    result.unwrap_or_else(|error| panic!("setup step `{step}` failed: {error}"))
}

impl<T: Target> Cx<T> {
    pub(crate) fn new(device: Arc<DeviceOf<T::Backend>>) -> Self {
        Self { device }
    }

    /// A compute queue.
    pub fn queue(&self) -> QueueOf<T::Backend> {
        setup("compute_queue", self.device.compute_queue())
    }

    /// A signal at `initial`.
    pub fn signal(&self, initial: u64) -> SignalOf<T::Backend> {
        setup("new_signal", self.device.new_signal(initial))
    }

    /// A buffer holding `data`.
    pub fn buffer(&self, data: &[u32]) -> BufferOf<T::Backend> {
        let buffer = setup("alloc", self.device.alloc(size_of_val(data)));
        setup("write_at", buffer.write_at(0, data));
        buffer
    }

    /// `buffer`'s contents.
    pub fn read(&self, buffer: &BufferOf<T::Backend>) -> Vec<u32> {
        setup("to_vec", buffer.to_vec::<u32>())
    }

    /// The suite's kernel `kernel`.
    pub fn program(&self, kernel: Kernel) -> ProgramOf<T::Backend> {
        setup("Target::program", T::program(&self.device, kernel))
    }

    /// The backend's id, for messages.
    pub fn backend(&self) -> &'static str {
        <T::Backend as Backend>::ID
    }
}

/// Fails the case: `rule` (one of [`rules`](crate::rules)) was broken, as
/// `detail` says.
#[track_caller]
pub(crate) fn broke(rule: &str, detail: impl Display) -> ! {
    panic!("rule broken: {rule}: {detail}")
}

/// Checks `condition`, else fails the case with `rule` and `detail`.
#[track_caller]
pub(crate) fn check(condition: bool, rule: &str, detail: impl FnOnce() -> String) {
    if !condition {
        broke(rule, detail());
    }
}
