//! A small test-only backend, defined outside the crate, to show a user set
//! mixing it with the CPU: `Mock` runs each batch on a thread of its own,
//! in submission order, with host memory behind a mutex.
#![allow(dead_code)]

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::queue::{Batch, Command, Engine, Ledger};
use hwqueue::{
    Backend, Buffer, Device, DeviceInfo, DeviceSpec, Error, KernelSignature, Limits, Pod, Producer,
    Program, Queue, QueueFactory, QueueKind, Registry, Result, TimelineSignal, Timeout, View,
};

pub const MOCK_DEVICES: u32 = 12;
/// Opened by the 8-thread race test only.
pub const RACE_ORDINAL: u32 = 6;
/// Its open blocks until `SLOW_GATE` is set.
pub const SLOW_ORDINAL: u32 = 1;
/// Its first open fails.
pub const FLAKY_ORDINAL: u32 = 2;
/// Its open acquires `cpu` from `global_registry()`.
pub const NESTED_ORDINAL: u32 = 3;
/// Its open acquires itself from `global_registry()`.
pub const SELF_ORDINAL: u32 = 5;
/// Its open panics.
pub const PANIC_ORDINAL: u32 = 8;
/// Its open panics with a payload whose own `Drop` panics.
pub const BAD_PAYLOAD_ORDINAL: u32 = 9;
/// Reports itself lost (`Device::health`) once `LOST` is set.
pub const LOST_ORDINAL: u32 = 7;
/// Two devices whose opens each acquire the other's spec from
/// `global_registry()`; the first two opens meet at `ABBA_BARRIER` first,
/// so that both are opening (later ones, retries, do not wait).
pub const ABBA_ORDINALS: [u32; 2] = [10, 11];
pub static ABBA_BARRIER: std::sync::Barrier = std::sync::Barrier::new(2);
pub static ABBA_OPENS: AtomicUsize = AtomicUsize::new(0);
pub static LOST: AtomicBool = AtomicBool::new(false);

/// A panic payload that panics again when dropped.
pub struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("the payload's drop panics too");
    }
}

pub static OPENS: [AtomicUsize; MOCK_DEVICES as usize] =
    [const { AtomicUsize::new(0) }; MOCK_DEVICES as usize];
pub static SLOW_OPENING: AtomicBool = AtomicBool::new(false);
pub static FLAKY_FAILED: AtomicBool = AtomicBool::new(false);

/// A mock device's [`on_ledger`](MockDevice::on_ledger) hook.
#[derive(Clone)]
pub struct LedgerHook(pub Arc<dyn Fn(&Ledger) + Send + Sync>);

impl fmt::Debug for LedgerHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LedgerHook")
    }
}

pub fn slow_gate() -> &'static CpuSignal {
    static GATE: OnceLock<CpuSignal> = OnceLock::new();
    GATE.get_or_init(CpuSignal::default)
}

pub fn global_registry() -> &'static Registry<Mixed> {
    static REGISTRY: OnceLock<Registry<Mixed>> = OnceLock::new();
    REGISTRY.get_or_init(Registry::new)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mock;

impl Backend for Mock {
    const ID: &'static str = "mock";
    const PRECEDENCE: u32 = 10;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;
    const ALIASES: &'static [&'static str] = &["fake"];

    type Device = MockDevice;
    type Queue = MockQueue;
    type Signal = MockSignal;
    type Buffer = MockBuffer;
    type Program = MockProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        Ok((0..MOCK_DEVICES)
            .map(|ordinal| DeviceInfo {
                spec: DeviceSpec::new(Self::ID, ordinal),
                name: format!("mock device {ordinal}"),
                memory: Some(1 << 20),
                compute_units: Some(1),
            })
            .collect())
    }

    fn open(ordinal: u32) -> Result<MockDevice> {
        if ordinal >= MOCK_DEVICES {
            return Err(Error::NoSuchDevice {
                backend: Self::ID,
                ordinal,
                count: MOCK_DEVICES,
            });
        }
        OPENS[ordinal as usize].fetch_add(1, Ordering::SeqCst);
        match ordinal {
            RACE_ORDINAL => std::thread::sleep(std::time::Duration::from_millis(50)),
            SLOW_ORDINAL => {
                SLOW_OPENING.store(true, Ordering::SeqCst);
                slow_gate().wait(1, super::LONG)?;
            }
            FLAKY_ORDINAL if !FLAKY_FAILED.swap(true, Ordering::SeqCst) => {
                return Err(Error::Driver {
                    backend: Self::ID,
                    what: "opening the flaky device".into(),
                    detail: "first open fails".into(),
                });
            }
            NESTED_ORDINAL => {
                global_registry().acquire("cpu")?;
            }
            BAD_PAYLOAD_ORDINAL => std::panic::panic_any(PanicsOnDrop),
            PANIC_ORDINAL => panic!("the mock's open of device {PANIC_ORDINAL} panics"),
            SELF_ORDINAL => {
                global_registry().acquire("mock:5")?;
            }
            ordinal if ABBA_ORDINALS.contains(&ordinal) => {
                if ABBA_OPENS.fetch_add(1, Ordering::SeqCst) < 2 {
                    ABBA_BARRIER.wait();
                }
                let other = ABBA_ORDINALS[usize::from(ordinal == ABBA_ORDINALS[0])];
                global_registry().acquire(&format!("mock:{other}"))?;
            }
            _ => {}
        }
        Ok(MockDevice {
            ordinal,
            gate: None,
            on_ledger: None,
        })
    }
}

/// A backend that is never present; opening it is a test failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Absent;

impl Backend for Absent {
    const ID: &'static str = "absent";
    const PRECEDENCE: u32 = 20;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;

    type Device = AbsentDevice;
    type Queue = AbsentQueue;
    type Signal = AbsentSignal;
    type Buffer = AbsentBuffer;
    type Program = AbsentProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        Err(Error::NoDriver {
            backend: Self::ID,
            detail: "libabsent.so not found".into(),
        })
    }

    fn open(_ordinal: u32) -> Result<AbsentDevice> {
        panic!("selection must not open a backend it does not return");
    }
}

/// A backend that finds a device it cannot open (a driver that lists a
/// GPU and then refuses it): selection goes on to the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Broken;

impl Backend for Broken {
    const ID: &'static str = "broken";
    const PRECEDENCE: u32 = 30;
    const DISPATCHES: bool = true;
    const REFERENCE_ORACLE: bool = false;

    type Device = BrokenDevice;
    type Queue = BrokenQueue;
    type Signal = BrokenSignal;
    type Buffer = BrokenBuffer;
    type Program = BrokenProgram;

    fn probe() -> Result<Vec<DeviceInfo>> {
        Ok(vec![DeviceInfo {
            spec: DeviceSpec::new(Self::ID, 0),
            name: "a device its driver refuses".into(),
            memory: None,
            compute_units: None,
        }])
    }

    fn open(_ordinal: u32) -> Result<BrokenDevice> {
        Err(Error::NoDriver {
            backend: Self::ID,
            detail: "the driver refused device 0".into(),
        })
    }
}

hwqueue::backend_set! {
    /// The CPU and the mock backend.
    pub backend Mixed {
        id: "mixed",
        device: MixedDevice,
        queue: MixedQueue,
        signal: MixedSignal,
        buffer: MixedBuffer,
        program: MixedProgram,
    }
    variants {
        Cpu(as_cpu, as_cpu_mut): Cpu {
            device: CpuDevice,
            queue: CpuQueue,
            signal: CpuSignal,
            buffer: CpuBuffer,
            program: CpuProgram,
        },
        Mock(as_mock, as_mock_mut): Mock {
            device: MockDevice,
            queue: MockQueue,
            signal: MockSignal,
            buffer: MockBuffer,
            program: MockProgram,
        },
    }
}

hwqueue::backend_set! {
    /// The CPU and a backend whose probe finds nothing.
    pub backend CpuOrAbsent {
        id: "cpu-or-absent",
        device: CpuOrAbsentDevice,
        queue: CpuOrAbsentQueue,
        signal: CpuOrAbsentSignal,
        buffer: CpuOrAbsentBuffer,
        program: CpuOrAbsentProgram,
    }
    variants {
        Cpu(as_cpu, as_cpu_mut): Cpu {
            device: CpuDevice,
            queue: CpuQueue,
            signal: CpuSignal,
            buffer: CpuBuffer,
            program: CpuProgram,
        },
        Absent(as_absent, as_absent_mut): Absent {
            device: AbsentDevice,
            queue: AbsentQueue,
            signal: AbsentSignal,
            buffer: AbsentBuffer,
            program: AbsentProgram,
        },
    }
}

hwqueue::backend_set! {
    /// The CPU, a backend whose one device does not open, and the mock
    /// backend below it.
    pub backend BrokenFirst {
        id: "broken-first",
        device: BrokenFirstDevice,
        queue: BrokenFirstQueue,
        signal: BrokenFirstSignal,
        buffer: BrokenFirstBuffer,
        program: BrokenFirstProgram,
    }
    variants {
        Cpu(as_cpu, as_cpu_mut): Cpu {
            device: CpuDevice,
            queue: CpuQueue,
            signal: CpuSignal,
            buffer: CpuBuffer,
            program: CpuProgram,
        },
        Broken(as_broken, as_broken_mut): Broken {
            device: BrokenDevice,
            queue: BrokenQueue,
            signal: BrokenSignal,
            buffer: BrokenBuffer,
            program: BrokenProgram,
        },
        Mock(as_mock, as_mock_mut): Mock {
            device: MockDevice,
            queue: MockQueue,
            signal: MockSignal,
            buffer: MockBuffer,
            program: MockProgram,
        },
    }
}

/// Stamps out a mock backend's types, each pointing back to backend `$B`.
macro_rules! mock_types {
    ($B:ident, $Device:ident, $Queue:ident, $Engine:ident, $Signal:ident, $Buffer:ident, $Program:ident) => {
        #[derive(Debug, Clone)]
        pub struct $Device {
            pub ordinal: u32,
            /// When set, a queue's `n`th batch is not reached (admitted,
            /// run or failed) before this signal reaches `n`: tests order
            /// the engine against the owner with it.
            pub gate: Option<CpuSignal>,
            /// When set, called with the queue's ledger each time the
            /// queue core asks for it (as `submit` does before it reports
            /// an earlier failure): tests put engine events between two
            /// calls of the owner with it.
            pub on_ledger: Option<LedgerHook>,
        }

        impl $Device {
            /// A device whose queues hold each batch until `gate` allows.
            pub fn gated(gate: CpuSignal) -> Self {
                Self {
                    ordinal: 0,
                    gate: Some(gate),
                    on_ledger: None,
                }
            }
        }

        impl QueueFactory for $Device {
            type Queue = $Queue;
            type Signal = $Signal;

            fn compute_queue(&self) -> Result<$Queue> {
                Ok(Queue::new($Engine {
                    gate: self.gate.clone(),
                    on_ledger: self.on_ledger.clone(),
                    ..$Engine::default()
                }))
            }

            fn copy_queue(&self) -> Result<Option<$Queue>> {
                Ok(None)
            }

            fn new_signal(&self, initial: u64) -> Result<$Signal> {
                Ok($Signal(CpuSignal::new(initial)))
            }
        }

        impl Device for $Device {
            type Backend = $B;

            fn spec(&self) -> DeviceSpec {
                DeviceSpec::new($B::ID, self.ordinal)
            }

            fn name(&self) -> String {
                format!("mock device {}", self.ordinal)
            }

            fn limits(&self) -> Limits {
                hwqueue::cpu::CPU_LIMITS
            }

            fn alloc(&self, size: usize) -> Result<$Buffer> {
                Ok($Buffer(Arc::new(Mutex::new(vec![0; size]))))
            }

            fn health(&self) -> Result<()> {
                if self.ordinal == LOST_ORDINAL && LOST.load(Ordering::SeqCst) {
                    return Err(Error::DeviceLost {
                        device: self.spec().to_string(),
                        detail: "the mock device faulted".into(),
                    });
                }
                Ok(())
            }
        }

        /// A mock signal: a CPU signal under another type.
        #[derive(Debug, Clone)]
        pub struct $Signal(pub CpuSignal);

        impl TimelineSignal for $Signal {
            fn value(&self) -> u64 {
                self.0.value()
            }
            fn set(&self, value: u64) {
                self.0.set(value)
            }
            fn wait(&self, target: u64, timeout: impl Into<Timeout>) -> Result<()> {
                self.0.wait(target, timeout)
            }
            fn fail(&self, upto: u64, cause: Error) {
                self.0.fail(upto, cause)
            }
            fn producer(&self) -> &Producer {
                self.0.producer()
            }
        }

        #[derive(Clone)]
        pub struct $Buffer(pub Arc<Mutex<Vec<u8>>>);

        impl fmt::Debug for $Buffer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "$Buffer({} bytes)", self.size())
            }
        }

        impl Buffer for $Buffer {
            type Backend = $B;

            fn size(&self) -> usize {
                self.0.lock().unwrap().len()
            }

            fn same_as(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0)
            }

            fn write_at<T: Pod>(&self, offset: usize, data: &[T]) -> Result<()> {
                let bytes = hwqueue::buffer::bytes_of(data);
                let mut memory = self.0.lock().unwrap();
                let size = memory.len();
                let target = memory.get_mut(offset..offset + bytes.len()).ok_or(
                    Error::HostAccessOutOfBounds {
                        offset,
                        len: bytes.len(),
                        size,
                    },
                )?;
                target.copy_from_slice(bytes);
                Ok(())
            }

            fn read_at<T: Pod>(&self, offset: usize, data: &mut [T]) -> Result<()> {
                let bytes = hwqueue::buffer::bytes_of_mut(data);
                let memory = self.0.lock().unwrap();
                let source = memory.get(offset..offset + bytes.len()).ok_or(
                    Error::HostAccessOutOfBounds {
                        offset,
                        len: bytes.len(),
                        size: memory.len(),
                    },
                )?;
                bytes.copy_from_slice(source);
                Ok(())
            }
        }

        /// A mock kernel: a host function over the buffers' bytes.
        #[derive(Clone)]
        pub struct $Program {
            pub signature: KernelSignature,
            pub kernel: fn(&[View<$B>]),
        }

        impl $Program {
            /// Kernel `name` over `buffers` buffers and no scalars.
            pub fn new(name: &str, buffers: usize, kernel: fn(&[View<$B>])) -> Self {
                Self {
                    signature: KernelSignature::new(name, buffers, 0),
                    kernel,
                }
            }
        }

        impl Program for $Program {
            type Backend = $B;
            fn signature(&self) -> &KernelSignature {
                &self.signature
            }
        }

        /// The mock's queue: hwqueue's recording core over the mock engine.
        pub type $Queue = Queue<$Engine>;

        /// Runs each submitted batch on a thread of its own, after the
        /// previous one: all a backend writes is how it runs a batch.
        #[derive(Default)]
        pub struct $Engine {
            ledger: Ledger,
            last: Option<JoinHandle<()>>,
            gate: Option<CpuSignal>,
            on_ledger: Option<LedgerHook>,
            submitted: u64,
        }

        impl Engine for $Engine {
            type Backend = $B;

            fn kind(&self) -> QueueKind {
                QueueKind::Compute
            }

            fn limits(&self) -> &Limits {
                &hwqueue::cpu::CPU_LIMITS
            }

            fn ledger(&self) -> &Ledger {
                if let Some(hook) = &self.on_ledger {
                    (hook.0)(&self.ledger);
                }
                &self.ledger
            }

            fn submit(&mut self, batch: Batch<$B>) -> Batch<$B> {
                let previous = self.last.take();
                let ledger = self.ledger.clone();
                self.submitted += 1;
                let gate = self.gate.clone().map(|gate| (gate, self.submitted));
                self.last = Some(std::thread::spawn(move || {
                    if let Some(previous) = previous {
                        previous.join().expect("a mock batch thread panicked");
                    }
                    if let Some((gate, number)) = gate {
                        gate.wait(number, super::LONG)
                            .expect("the test opens the gate");
                    }
                    ledger.settle(&batch, |batch| {
                        for (index, command) in batch.commands().iter().enumerate() {
                            let outcome = match command {
                                Command::Wait { signal, value } => {
                                    signal.wait(*value, Timeout::Forever)
                                }
                                Command::WaitSettled { signal, value } => {
                                    hwqueue::queue::settled(signal.wait(*value, Timeout::Forever))
                                }
                                Command::WaitForeign { signal, value } => {
                                    signal.wait_forever(*value)
                                }
                                Command::Signal { signal, value } => {
                                    signal.set(*value);
                                    Ok(())
                                }
                                Command::Exec {
                                    program, buffers, ..
                                } if program.signature.name.starts_with("fail") => {
                                    let _ = buffers;
                                    Err(Error::KernelFailed {
                                        program: program.signature.name.clone(),
                                        message: "a mock kernel named `fail…` fails".into(),
                                    })
                                }
                                Command::Exec {
                                    program, buffers, ..
                                } => {
                                    (program.kernel)(&batch.buffers()[buffers.clone()]);
                                    Ok(())
                                }
                                Command::Copy { dst, src } => {
                                    src.to_vec::<u8>().and_then(|data| dst.write_from(&data))
                                }
                                Command::Fill {
                                    dst,
                                    pattern,
                                    width,
                                } => {
                                    let pattern = &pattern[..usize::from(*width)];
                                    dst.buffer().0.lock().unwrap()[dst.range()]
                                        .chunks_exact_mut(pattern.len())
                                        .for_each(|chunk| chunk.copy_from_slice(pattern));
                                    Ok(())
                                }
                                Command::Upload { dst, data } => {
                                    dst.write_from(batch.host_bytes(data))
                                }
                                Command::Download { src, sink } => {
                                    sink.complete(|out| src.read_into(out))
                                }
                                Command::Barrier => Ok(()),
                                // Refused at record time (the default
                                // `Engine::check_collective`).
                                Command::Collective(collective) => {
                                    Err(hwqueue::collective::CollectiveError::unsupported(
                                        "mock",
                                        &collective.communicator,
                                    )
                                    .into())
                                }
                                // The mock has no queue-ordered allocation:
                                // the core never records these for it.
                                Command::Alloca { .. } | Command::Dealloca { .. } => Ok(()),
                                // No replay form: refused at record time.
                                Command::Replay { index } => Err(Error::ReplayNotRecorded {
                                    index: *index,
                                    recorded: 0,
                                }),
                            };
                            outcome.map_err(|error| (index, error))?;
                        }
                        Ok(())
                    });
                }));
                Batch::default()
            }

            fn synchronize(&mut self) {
                if let Some(last) = self.last.take() {
                    last.join().expect("a mock batch thread panicked");
                }
            }
        }
    };
}

mock_types!(
    Mock,
    MockDevice,
    MockQueue,
    MockEngine,
    MockSignal,
    MockBuffer,
    MockProgram
);
mock_types!(
    Absent,
    AbsentDevice,
    AbsentQueue,
    AbsentEngine,
    AbsentSignal,
    AbsentBuffer,
    AbsentProgram
);
mock_types!(
    Broken,
    BrokenDevice,
    BrokenQueue,
    BrokenEngine,
    BrokenSignal,
    BrokenBuffer,
    BrokenProgram
);
