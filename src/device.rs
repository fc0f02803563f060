//! Opened devices and the factories of their queues and signals.

use crate::backend::{Backend, BufferOf, QueueOf, SignalOf};
use crate::error::Result;
use crate::params::Limits;
use crate::queue::HardwareQueue;
use crate::signal::TimelineSignal;
use crate::spec::DeviceSpec;

/// Makes queues and signals. Callers generic over a factory name its queue
/// and signal through the associated types.
pub trait QueueFactory {
    /// The queues this factory makes.
    type Queue: HardwareQueue;
    /// The signals this factory makes.
    type Signal: TimelineSignal;

    /// A new compute queue: runs every command.
    ///
    /// # Errors
    /// When the backend cannot create one (a stream, a thread).
    fn compute_queue(&self) -> Result<Self::Queue>;

    /// A new copy queue (`wait`, `signal`, `copy`, `memory_barrier`; `exec` is
    /// an error), or `None` when the device has no separate copy engine.
    ///
    /// # Errors
    /// When the backend cannot create one.
    fn copy_queue(&self) -> Result<Option<Self::Queue>>;

    /// A new timeline signal starting at `initial`.
    ///
    /// # Errors
    /// When the backend cannot create one, or `initial` is past
    /// [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE).
    fn new_signal(&self, initial: u64) -> Result<Self::Signal>;
}

/// An opened device: allocates buffers, and through [`QueueFactory`] makes
/// queues and signals. Programs are loaded by backend-specific constructors
/// (a Rust function, C source, PTX), since their sources differ by backend.
pub trait Device:
    QueueFactory<Queue = QueueOf<Self::Backend>, Signal = SignalOf<Self::Backend>> + Send + Sync
{
    /// The backend this device belongs to.
    type Backend: Backend<Device = Self>;

    /// The spec this device was opened for.
    fn spec(&self) -> DeviceSpec;

    /// A human-readable name.
    fn name(&self) -> String;

    /// What one `exec` may ask for.
    fn limits(&self) -> Limits;

    /// Allocates `size` bytes of device memory, zero-filled.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory).
    fn alloc(&self, size: usize) -> Result<BufferOf<Self::Backend>>;

    /// Whether the device can still run work. The registry asks before it
    /// hands out a device it opened earlier.
    ///
    /// # Errors
    /// [`Error::DeviceLost`](crate::Error::DeviceLost) once a fault made
    /// the device unusable for the rest of the process (CUDA's sticky
    /// errors: an illegal address, a launch failure). The default never
    /// fails.
    fn health(&self) -> Result<()> {
        Ok(())
    }
}
