//! The root trait: a backend is a zero-sized type naming a family of types.

use std::fmt;

use crate::buffer::Buffer;
use crate::device::Device;
use crate::error::Result;
use crate::program::Program;
use crate::queue::HardwareQueue;
use crate::signal::TimelineSignal;
use crate::spec::DeviceSpec;

/// A family of device types chosen at compile time.
///
/// Code generic over `B: Backend` is monomorphised per backend: a launch
/// through `QueueOf<B>` is a direct call, with no `dyn` on the way. Each
/// associated type points back here (`Queue: HardwareQueue<Backend = Self>`), so
/// a CUDA buffer cannot be handed to a CPU queue: that is a type error.
pub trait Backend: Copy + Default + fmt::Debug + Send + Sync + 'static {
    /// Canonical id, as in device specs (`"cpu"`, `"cuda"`). Unique per set.
    const ID: &'static str;
    /// Selection rank: among present backends that dispatch and are not
    /// reference oracles, the highest precedence wins. Unique per set.
    const PRECEDENCE: u32;
    /// Whether this backend runs work (false for a backend that only records).
    const DISPATCHES: bool;
    /// Whether this backend is a reference oracle other backends are tested
    /// against (never chosen by automatic selection).
    const REFERENCE_ORACLE: bool;
    /// Other names a device spec may use for this backend, lower case
    /// (`"gpu"` for CUDA). Matching ignores ASCII case.
    const ALIASES: &'static [&'static str] = &[];

    /// An opened device.
    type Device: Device<Backend = Self>;
    /// A command queue.
    type Queue: HardwareQueue<Backend = Self>;
    /// A timeline signal.
    type Signal: TimelineSignal;
    /// Device memory.
    type Buffer: Buffer<Backend = Self>;
    /// A loaded kernel.
    type Program: Program<Backend = Self>;

    /// Finds this backend's devices at run time, without panicking when a
    /// driver is absent.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) (with how to install it)
    /// when the backend's runtime is missing.
    fn probe() -> Result<Vec<DeviceInfo>>;

    /// Opens device `ordinal`. Registries call this once per spec and cache it.
    ///
    /// # Errors
    /// Whatever the driver reports, or
    /// [`Error::NoSuchDevice`](crate::Error::NoSuchDevice).
    fn open(ordinal: u32) -> Result<Self::Device>;
}

/// The device type of backend `B`.
pub type DeviceOf<B> = <B as Backend>::Device;
/// The queue type of backend `B`.
pub type QueueOf<B> = <B as Backend>::Queue;
/// The signal type of backend `B`.
pub type SignalOf<B> = <B as Backend>::Signal;
/// The buffer type of backend `B`.
pub type BufferOf<B> = <B as Backend>::Buffer;
/// The program type of backend `B`.
pub type ProgramOf<B> = <B as Backend>::Program;

/// What a probe found about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's spec.
    pub spec: DeviceSpec,
    /// A human-readable name (`"NVIDIA H100"`, the CPU model).
    pub name: String,
    /// Memory in bytes, where the backend knows it.
    pub memory: Option<u64>,
    /// Compute units (cores, SMs), where the backend knows them.
    pub compute_units: Option<u32>,
}
