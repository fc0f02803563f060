//! The root trait: a backend is a zero-sized type naming a family of types.
//!
//! # Writing a backend
//!
//! A backend outside this crate takes one route: hwqueue's queue core,
//! [`Queue<E>`](crate::Queue), over an [`Engine`](crate::Engine) of its own.
//! The core records, validates, tracks producers and failures, and
//! profiles the host's calls; the engine only runs batches. What a backend
//! writes:
//!
//! 1. a zero-sized [`Backend`] type naming its device, queue, signal,
//!    buffer and program types;
//! 2. a [`Device`] and its [`QueueFactory`](crate::QueueFactory), whose
//!    queues are `Queue::new(engine)`;
//! 3. a [`Buffer`] (its memory: hwqueue's caching
//!    [`MemoryPool`](crate::memory::MemoryPool) over a
//!    [`BlockSource`](crate::memory::BlockSource) of the device's blocks
//!    is the usual way) and a [`Program`];
//! 4. a [`TimelineSignal`]: an existing one (below, the CPU's), or one of
//!    its own on [`Failures`](crate::signal::Failures),
//!    [`Producer`](crate::Producer) and
//!    [`SignalWaker`](crate::SignalWaker), as `hwqueue-sim` does;
//! 5. the [`Engine`](crate::Engine): `submit` runs each batch in order,
//!    settling it through the [`Ledger`](crate::queue::Ledger)
//!    ([`Ledger::settle`](crate::queue::Ledger::settle) on whichever thread
//!    runs it: in `submit`, as below, or on a device thread of the engine's
//!    own, as `hwqueue-sim` does; a device that reports the end later is
//!    [`admit`](crate::queue::Ledger::admit)ted, owns the batch until the
//!    work is done, then [`complete`](crate::queue::Ledger::complete)s
//!    it), and keeps the
//!    contract its docs state. Errors of the backend's own driver travel as
//!    [`Error::Backend`](crate::Error::Backend); profiling engines name
//!    their events with [`profile::describe`](crate::profile::describe)
//!    and [`queue_label`](crate::queue::queue_label).
//!
//! Then the conformance suite (`hwqueue-cts`, `docs/backends.md`) proves
//! it: `hwqueue_cts::cts_suite!(MyTarget)` is one `#[test]` per case. A
//! whole backend, synchronous, with one host-memory device, end to end:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use hwqueue::buffer::{bytes_of, bytes_of_mut, check_host_access};
//! use hwqueue::cpu::{CPU_LIMITS, CpuSignal};
//! use hwqueue::queue::{Batch, Command, Engine, Ledger};
//! use hwqueue::{
//!     Backend, Buffer, Device, DeviceInfo, DeviceSpec, Download, Error, ExecParams,
//!     HardwareQueue, KernelSignature, Limits, Pod, Program, Queue, QueueFactory, QueueKind,
//!     Result, TimelineSignal, Timeout, View,
//! };
//!
//! #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
//! struct Host;
//!
//! impl Backend for Host {
//!     const ID: &'static str = "host";
//!     const PRECEDENCE: u32 = 1;
//!     const DISPATCHES: bool = true;
//!     const REFERENCE_ORACLE: bool = false;
//!     type Device = HostDevice;
//!     type Queue = Queue<HostEngine>;
//!     type Signal = CpuSignal;
//!     type Buffer = HostBuffer;
//!     type Program = HostProgram;
//!
//!     fn probe() -> Result<Vec<DeviceInfo>> {
//!         Ok(vec![DeviceInfo {
//!             spec: DeviceSpec::new(Self::ID, 0),
//!             name: "host memory".into(),
//!             memory: None,
//!             compute_units: Some(1),
//!         }])
//!     }
//!
//!     fn open(ordinal: u32) -> Result<HostDevice> {
//!         match ordinal {
//!             0 => Ok(HostDevice),
//!             _ => Err(Error::NoSuchDevice { backend: Self::ID, ordinal, count: 1 }),
//!         }
//!     }
//! }
//!
//! struct HostDevice;
//!
//! impl QueueFactory for HostDevice {
//!     type Queue = Queue<HostEngine>;
//!     type Signal = CpuSignal;
//!     fn compute_queue(&self) -> Result<Queue<HostEngine>> {
//!         Ok(Queue::new(HostEngine { ledger: Ledger::new() }))
//!     }
//!     fn copy_queue(&self) -> Result<Option<Queue<HostEngine>>> {
//!         Ok(None)
//!     }
//!     fn new_signal(&self, initial: u64) -> Result<CpuSignal> {
//!         hwqueue::signal::check_value(initial)?;
//!         Ok(CpuSignal::new(initial))
//!     }
//! }
//!
//! impl Device for HostDevice {
//!     type Backend = Host;
//!     fn spec(&self) -> DeviceSpec {
//!         DeviceSpec::new(Host::ID, 0)
//!     }
//!     fn name(&self) -> String {
//!         "host memory".into()
//!     }
//!     fn limits(&self) -> Limits {
//!         CPU_LIMITS
//!     }
//!     fn alloc(&self, size: usize) -> Result<HostBuffer> {
//!         Ok(HostBuffer(Arc::new(Mutex::new(vec![0; size]))))
//!     }
//! }
//!
//! #[derive(Debug, Clone)]
//! struct HostBuffer(Arc<Mutex<Vec<u8>>>);
//!
//! impl Buffer for HostBuffer {
//!     type Backend = Host;
//!     fn size(&self) -> usize {
//!         self.0.lock().unwrap().len()
//!     }
//!     fn same_as(&self, other: &Self) -> bool {
//!         Arc::ptr_eq(&self.0, &other.0)
//!     }
//!     fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
//!         let data = bytes_of(data);
//!         let mut bytes = self.0.lock().unwrap();
//!         check_host_access(offset, data.len(), bytes.len())?;
//!         bytes[offset..offset + data.len()].copy_from_slice(data);
//!         Ok(())
//!     }
//!     fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
//!         let data = bytes_of_mut(data);
//!         let bytes = self.0.lock().unwrap();
//!         check_host_access(offset, data.len(), bytes.len())?;
//!         data.copy_from_slice(&bytes[offset..offset + data.len()]);
//!         Ok(())
//!     }
//! }
//!
//! /// A kernel: a function over its buffers' bytes.
//! #[derive(Clone)]
//! struct HostProgram(KernelSignature, fn(&mut [u8]));
//!
//! impl Program for HostProgram {
//!     type Backend = Host;
//!     fn signature(&self) -> &KernelSignature {
//!         &self.0
//!     }
//! }
//!
//! /// Runs each batch in `submit`, in order: a synchronous engine.
//! struct HostEngine {
//!     ledger: Ledger,
//! }
//!
//! impl Engine for HostEngine {
//!     type Backend = Host;
//!     fn kind(&self) -> QueueKind {
//!         QueueKind::Compute
//!     }
//!     fn limits(&self) -> &Limits {
//!         &CPU_LIMITS
//!     }
//!     fn ledger(&self) -> &Ledger {
//!         &self.ledger
//!     }
//!     fn submit(&mut self, batch: Batch<Host>) -> Batch<Host> {
//!         self.ledger.settle(&batch, |batch| {
//!             for (index, command) in batch.commands().iter().enumerate() {
//!                 run(batch, command).map_err(|error| (index, error))?;
//!             }
//!             Ok(())
//!         });
//!         batch // handed back for its memory: the queue clears it
//!     }
//!     fn synchronize(&mut self) {} // nothing runs after `submit` returns
//! }
//!
//! /// One command; every arm, so a new command is a compile error here.
//! fn run(batch: &Batch<Host>, command: &Command<Host>) -> Result<()> {
//!     match command {
//!         Command::Wait { signal, value } => signal.wait(*value, Timeout::Forever),
//!         Command::WaitSettled { signal, value } => {
//!             hwqueue::queue::settled(signal.wait(*value, Timeout::Forever))
//!         }
//!         Command::WaitForeign { signal, value } => signal.wait_forever(*value),
//!         Command::Signal { signal, value } => Ok(signal.set(*value)),
//!         Command::Exec { program, buffers, .. } => {
//!             for view in &batch.buffers()[buffers.clone()] {
//!                 (program.1)(&mut view.buffer().0.lock().unwrap()[view.range()]);
//!             }
//!             Ok(())
//!         }
//!         Command::Copy { dst, src } => dst.write_from(&src.to_vec::<u8>()?),
//!         Command::Fill { dst, pattern, width } => {
//!             let pattern = &pattern[..usize::from(*width)];
//!             let bytes: Vec<u8> = pattern.iter().copied().cycle().take(dst.len()).collect();
//!             dst.write_from(&bytes)
//!         }
//!         Command::Upload { dst, data } => dst.write_from(batch.host_bytes(data)),
//!         Command::Download { src, sink } => sink.complete(|out| src.read_into(out)),
//!         // No collectives (the default `Engine::check_collective` refuses).
//!         Command::Collective(c) => {
//!             Err(hwqueue::collective::CollectiveError::unsupported("host", &c.communicator).into())
//!         }
//!         // No queue-ordered memory (the default `Engine::alloca` refuses).
//!         Command::Barrier | Command::Alloca { .. } | Command::Dealloca { .. } => Ok(()),
//!         // No replay form: the default `Engine::check_replay` refuses
//!         // it when recorded.
//!         Command::Replay { index } => Err(Error::ReplayNotRecorded { index: *index, recorded: 0 }),
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! // Used as any backend is.
//! let device = Host::open(0)?;
//! let buffer = device.alloc(4)?;
//! let negate = HostProgram(KernelSignature::new("negate", 1, 0), |bytes| {
//!     bytes.iter_mut().for_each(|b| *b = b.wrapping_neg())
//! });
//! let done = device.new_signal(0)?;
//! let out = Download::<u8>::new(4);
//! let mut queue = device.compute_queue()?;
//! queue
//!     .upload(&buffer, &[1u8, 2, 3, 4])
//!     .exec(&negate, &[&buffer], &[], ExecParams::new_1d(1, 1))
//!     .download(&View::whole(&buffer), &out)
//!     .signal(&done, 1)
//!     .submit()?;
//! done.wait(1, Timeout::Forever)?;
//! assert_eq!(out.take(Timeout::Forever)?, [255, 254, 253, 252]);
//! # Ok(())
//! # }
//! ```

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
