//! `hwqueue-sim`: a simulated accelerator for hwqueue, and the proof that a
//! backend can be written outside the crate.
//!
//! It depends on `hwqueue` only through its public API, as a third-party
//! backend would, and follows the path the guide
//! (`docs/backends.md`) describes: hwqueue's queue core
//! ([`Queue`]) over an [`Engine`](hwqueue::Engine) of its own
//! ([`SimEngine`]), hwqueue's caching [`MemoryPool`] over blocks of its
//! own memory ([`memory::SimBlocks`]), and a timeline signal built from
//! hwqueue's public pieces ([`SimSignal`]).
//!
//! # The simulated device
//!
//! Each queue is a **device thread**: `submit` hands a batch over and
//! returns; the thread runs it, each command after the one before, and
//! settles it through the queue's [`Ledger`](hwqueue::queue::Ledger), so
//! the host sees the device's asynchrony as it would a GPU's. The device
//! has **its own memory**, an arena of [`SimConfig::memory`] bytes that the
//! host reaches only by copies, and that runs out like a GPU's. Kernels are
//! Rust functions ([`SimProgram`]) over the views an `exec` passes. Each
//! command that does device work takes [`SimConfig::latency`], and
//! [`SimConfig::fail_exec`] makes a chosen `exec` fail as a device fault
//! would: compiler authors test their recovery paths without hardware.
//!
//! ```
//! use hwqueue::{Buffer, Device, ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout};
//! use hwqueue_sim::{SimConfig, SimDevice, SimProgram};
//!
//! # fn main() -> hwqueue::Result<()> {
//! let device = SimDevice::new(0, SimConfig::default());
//! let buffer = device.alloc(4 * 4)?;
//! let double = SimProgram::new("double", 1, 0, |args| {
//!     let values: Vec<u32> = args.read(0);
//!     args.write(0, &values.iter().map(|v| v * 2).collect::<Vec<_>>());
//!     Ok(())
//! });
//! let done = device.new_signal(0)?;
//! let mut queue = device.compute_queue()?;
//! queue
//!     .upload(&buffer, &[1u32, 2, 3, 4])
//!     .exec(&double, &[&buffer], &[], ExecParams::new_1d(4, 4))
//!     .signal(&done, 1)
//!     .submit()?;                          // returns at once: the device thread runs it
//! done.wait(1, Timeout::Forever)?;
//! assert_eq!(buffer.to_vec::<u32>()?, [2, 4, 6, 8]);
//! # Ok(())
//! # }
//! ```
//!
//! # Deliberately broken variants
//!
//! [`Defect`] makes the engine break one rule of the
//! [`Engine::submit`](hwqueue::Engine::submit) contract. They exist to
//! prove that the conformance suite (`hwqueue-cts`) catches each: see
//! the `broken` module of `sim/tests/cts.rs`.

mod buffer;
mod engine;
pub mod memory;
mod program;
mod replay;
mod signal;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hwqueue::memory::MemoryPool;
use hwqueue::{
    Backend, Device, DeviceInfo, DeviceSpec, Error, Limits, Queue, QueueFactory, QueueKind, Result,
};

pub use buffer::SimBuffer;
pub use engine::SimEngine;
pub use program::{KernelArgs, SimKernelFn, SimProgram};
pub use signal::SimSignal;

use memory::{Arena, SimBlocks};

/// How many devices [`Sim::probe`] reports.
pub const SIM_DEVICES: u32 = 2;

/// What one `exec` may ask for on a simulated device.
pub const SIM_LIMITS: Limits = Limits {
    max_local_size: [1024, 1024, 64],
    max_local_count: 1024,
    max_groups: [u32::MAX, 65535, 65535],
    max_buffers: 32,
    max_shared_memory: 0,
    view_alignment: 16,
};

/// The simulated accelerator backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Sim;

impl Backend for Sim {
    const ID: &'static str = "sim";
    /// Above the CPU (0), below CUDA (100): in a set with both, automatic
    /// selection takes a GPU where there is one, else the simulator, as a
    /// compiler testing its accelerator path without hardware wants.
    const PRECEDENCE: u32 = 50;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;
    const ALIASES: &'static [&'static str] = &["simulator"];

    type Device = SimDevice;
    type Queue = SimQueue;
    type Signal = SimSignal;
    type Buffer = SimBuffer;
    type Program = SimProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        let config = SimConfig::default();
        Ok((0..SIM_DEVICES)
            .map(|ordinal| DeviceInfo {
                spec: DeviceSpec::new(Self::ID, ordinal),
                name: device_name(ordinal, &config),
                memory: Some(config.memory as u64),
                compute_units: Some(1),
            })
            .collect())
    }

    /// Device `ordinal` with [`SimConfig::default`]; [`SimDevice::new`]
    /// takes another configuration.
    fn open(ordinal: u32) -> Result<SimDevice> {
        if ordinal >= SIM_DEVICES {
            return Err(Error::NoSuchDevice {
                backend: Self::ID,
                ordinal,
                count: SIM_DEVICES,
            });
        }
        Ok(SimDevice::new(ordinal, SimConfig::default()))
    }
}

/// A simulated device's queue: hwqueue's recording core over [`SimEngine`].
pub type SimQueue = Queue<SimEngine>;

/// A rule of the [`Engine::submit`](hwqueue::Engine::submit) contract that
/// a deliberately broken engine breaks, to test the conformance suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Defect {
    /// A queue's `signal` stores its value even when lower than the
    /// signal's (rule 3: signals only rise).
    LowerSignal,
    /// Each pair of batches runs second first (rule 1: batches run in
    /// submission order).
    SwapBatches,
    /// Every second batch is dropped: never run, its signals never set nor
    /// failed (rule 2: every batch is settled).
    DropBatch,
}

/// How a simulated device behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// The device time of each command that does device work (an `exec`, a
    /// copy, a fill, a transfer); waits and signals take none. Default 0.
    pub latency: Duration,
    /// The device's memory, in bytes. Default 256 MiB.
    pub memory: usize,
    /// The `exec` (counting from 1, over the device's queues) that fails as
    /// a device fault would ([`Error::KernelFailed`]). Default none.
    pub fail_exec: Option<u64>,
    /// A contract rule the engine breaks on purpose. Default none.
    pub defect: Option<Defect>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            memory: 256 << 20,
            fail_exec: None,
            defect: None,
        }
    }
}

impl SimConfig {
    /// With [`latency`](Self::latency) per command.
    #[must_use]
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// With [`memory`](Self::memory) bytes.
    #[must_use]
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = bytes;
        self
    }

    /// Failing the `n`th `exec` ([`fail_exec`](Self::fail_exec)).
    #[must_use]
    pub fn fail_exec(mut self, n: u64) -> Self {
        self.fail_exec = Some(n);
        self
    }

    /// Breaking the contract as `defect` says.
    #[must_use]
    pub fn defect(mut self, defect: Defect) -> Self {
        self.defect = Some(defect);
        self
    }
}

fn device_name(ordinal: u32, config: &SimConfig) -> String {
    format!(
        "hwqueue simulated accelerator {ordinal} ({} MiB, {:?} a command)",
        config.memory >> 20,
        config.latency
    )
}

/// A simulated device. Cheap to clone; clones share one device.
#[derive(Clone)]
pub struct SimDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ordinal: u32,
    config: SimConfig,
    pool: MemoryPool<SimBlocks>,
    /// `exec`s run, for [`SimConfig::fail_exec`].
    execs: AtomicU64,
}

impl SimDevice {
    /// A device of its own (two calls make two devices, whatever the
    /// ordinal), behaving as `config` says.
    pub fn new(ordinal: u32, config: SimConfig) -> Self {
        let source = SimBlocks {
            arena: Arc::new(Arena::new(config.memory)),
            ordinal,
        };
        Self {
            inner: Arc::new(DeviceInner {
                ordinal,
                config,
                pool: MemoryPool::new(source),
                execs: AtomicU64::new(0),
            }),
        }
    }

    /// How the device behaves.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    pub(crate) fn pool(&self) -> &MemoryPool<SimBlocks> {
        &self.inner.pool
    }

    pub(crate) fn arena(&self) -> &Arena {
        &self.inner.pool.source().arena
    }

    /// Counts an `exec`; whether it is the one to fail.
    pub(crate) fn inject_fault(&self) -> bool {
        let n = self.inner.execs.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.config.fail_exec == Some(n)
    }
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl QueueFactory for SimDevice {
    type Queue = SimQueue;
    type Signal = SimSignal;

    fn compute_queue(&self) -> Result<SimQueue> {
        Ok(Queue::new(SimEngine::new(
            self.clone(),
            QueueKind::Compute,
        )?))
    }

    /// A copy queue: a device thread of its own that refuses `exec`.
    fn copy_queue(&self) -> Result<Option<SimQueue>> {
        Ok(Some(Queue::new(SimEngine::new(
            self.clone(),
            QueueKind::Copy,
        )?)))
    }

    fn new_signal(&self, initial: u64) -> Result<SimSignal> {
        SimSignal::new(initial)
    }
}

impl Device for SimDevice {
    type Backend = Sim;

    fn spec(&self) -> DeviceSpec {
        DeviceSpec::new(Sim::ID, self.inner.ordinal)
    }

    fn name(&self) -> String {
        device_name(self.inner.ordinal, &self.inner.config)
    }

    fn limits(&self) -> Limits {
        SIM_LIMITS
    }

    fn alloc(&self, size: usize) -> Result<SimBuffer> {
        SimBuffer::allocate(self.pool(), size, true, false)
    }

    fn alloc_uninit(&self, size: usize) -> Result<SimBuffer> {
        SimBuffer::allocate(self.pool(), size, false, false)
    }

    hwqueue::pooled_device_memory!(self => self.pool());
}

hwqueue::backend_set! {
    /// The CPU, the simulator and (with the `cuda` feature) CUDA, side by
    /// side: what a compiler holds to run on whichever is there.
    pub backend SimSet {
        id: "sim-set",
        device: SimSetDevice,
        queue: SimSetQueue,
        signal: SimSetSignal,
        buffer: SimSetBuffer,
        program: SimSetProgram,
    }
    variants {
        Cpu(as_cpu, as_cpu_mut): hwqueue::cpu::Cpu {
            device: hwqueue::cpu::CpuDevice,
            queue: hwqueue::cpu::CpuQueue,
            signal: hwqueue::cpu::CpuSignal,
            buffer: hwqueue::cpu::CpuBuffer,
            program: hwqueue::cpu::CpuProgram,
        },
        Sim(as_sim, as_sim_mut): Sim {
            device: SimDevice,
            queue: SimQueue,
            signal: SimSignal,
            buffer: SimBuffer,
            program: SimProgram,
        },
        #[cfg(feature = "cuda")]
        Cuda(as_cuda, as_cuda_mut): hwqueue::cuda::Cuda {
            device: hwqueue::cuda::CudaDevice,
            queue: hwqueue::cuda::CudaQueue,
            signal: hwqueue::cuda::CudaSignal,
            buffer: hwqueue::cuda::CudaBuffer,
            program: hwqueue::cuda::CudaProgram,
        },
    }
}
