//! A small test-only backend, defined outside the crate, to show a user set
//! mixing it with the CPU: `Mock` runs each batch on a thread of its own,
//! in submission order, with host memory behind a mutex.
#![allow(dead_code)]

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::{
    Backend, Buffer, Device, DeviceInfo, DeviceSpec, Error, ExecParams, HardwareQueue, Limits, Pod,
    Program, QueueFactory, QueueKind, Registry, Result, Scalar, TimelineSignal, Timeout,
};

pub const MOCK_DEVICES: u32 = 9;
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

pub static OPENS: [AtomicUsize; MOCK_DEVICES as usize] =
    [const { AtomicUsize::new(0) }; MOCK_DEVICES as usize];
pub static SLOW_OPENING: AtomicBool = AtomicBool::new(false);
pub static FLAKY_FAILED: AtomicBool = AtomicBool::new(false);

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
                return Err(Error::Backend {
                    backend: Self::ID,
                    message: "first open fails".into(),
                });
            }
            NESTED_ORDINAL => {
                global_registry().acquire("cpu")?;
            }
            PANIC_ORDINAL => panic!("the mock's open of device {PANIC_ORDINAL} panics"),
            SELF_ORDINAL => {
                global_registry().acquire("mock:5")?;
            }
            _ => {}
        }
        Ok(MockDevice { ordinal })
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

/// Stamps out a mock backend's types, each pointing back to backend `$B`.
macro_rules! mock_types {
    ($B:ident, $Device:ident, $Queue:ident, $Signal:ident, $Buffer:ident, $Program:ident, $Command:ident) => {
        #[derive(Debug, Clone)]
        pub struct $Device {
            pub ordinal: u32,
        }

        impl QueueFactory for $Device {
            type Queue = $Queue;
            type Signal = $Signal;

            fn compute_queue(&self) -> Result<$Queue> {
                Ok($Queue::default())
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
            pub name: &'static str,
            pub kernel: fn(&[$Buffer]),
        }

        impl Program for $Program {
            type Backend = $B;
            fn name(&self) -> &str {
                self.name
            }
        }

        enum $Command {
            Wait(Box<dyn Fn() -> Result<()> + Send>),
            Signal($Signal, u64),
            Exec($Program, Vec<$Buffer>),
            Copy($Buffer, $Buffer),
        }

        /// Each submitted batch runs on its own thread after the previous one.
        #[derive(Default)]
        pub struct $Queue {
            commands: Vec<$Command>,
            rejected: Option<Error>,
            last: Option<JoinHandle<Result<()>>>,
        }

        impl fmt::Debug for $Queue {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "$Queue({} recorded)", self.commands.len())
            }
        }

        impl HardwareQueue for $Queue {
            type Backend = $B;

            fn kind(&self) -> QueueKind {
                QueueKind::Compute
            }

            fn wait(&mut self, signal: &$Signal, value: u64) -> &mut Self {
                self.wait_foreign(signal, value)
            }

            fn signal(&mut self, signal: &$Signal, value: u64) -> &mut Self {
                self.commands.push($Command::Signal(signal.clone(), value));
                self
            }

            fn exec(
                &mut self,
                program: &$Program,
                buffers: &[&$Buffer],
                _scalars: &[Scalar],
                _params: ExecParams,
            ) -> &mut Self {
                self.commands.push($Command::Exec(
                    program.clone(),
                    buffers.iter().map(|b| (*b).clone()).collect(),
                ));
                self
            }

            fn copy(&mut self, dst: &$Buffer, src: &$Buffer) -> &mut Self {
                if dst.size() != src.size() {
                    return self.reject(Error::CopySizeMismatch {
                        dst: dst.size(),
                        src: src.size(),
                    });
                }
                self.commands.push($Command::Copy(dst.clone(), src.clone()));
                self
            }

            fn memory_barrier(&mut self) -> &mut Self {
                self
            }

            fn wait_foreign<S: TimelineSignal>(&mut self, signal: &S, value: u64) -> &mut Self {
                let signal = signal.clone();
                self.commands.push($Command::Wait(Box::new(move || {
                    signal.wait(value, Timeout::Forever)
                })));
                self
            }

            fn reject(&mut self, error: Error) -> &mut Self {
                self.rejected.get_or_insert(error);
                self
            }

            fn submit(&mut self) -> Result<()> {
                let commands = std::mem::take(&mut self.commands);
                if let Some(error) = self.rejected.take() {
                    let cause = std::sync::Arc::new(error);
                    for command in &commands {
                        if let $Command::Signal(signal, value) = command {
                            signal.fail(
                                *value,
                                Error::BatchRejected {
                                    cause: cause.clone(),
                                },
                            );
                        }
                    }
                    return Err(Error::BatchRejected { cause });
                }
                let previous = self.last.take();
                self.last = Some(std::thread::spawn(move || {
                    if let Some(previous) = previous {
                        previous.join().expect("mock batch thread panicked")?;
                    }
                    for (index, command) in commands.iter().enumerate() {
                        let outcome = match command {
                            $Command::Wait(wait) => wait(),
                            $Command::Signal(signal, value) => {
                                signal.set(*value);
                                Ok(())
                            }
                            $Command::Exec(program, buffers) => {
                                (program.kernel)(buffers);
                                Ok(())
                            }
                            $Command::Copy(dst, src) => {
                                let data = src.0.lock().unwrap().clone();
                                *dst.0.lock().unwrap() = data;
                                Ok(())
                            }
                        };
                        if let Err(error) = outcome {
                            for command in &commands[index..] {
                                if let $Command::Signal(signal, value) = command {
                                    signal.fail(*value, error.clone());
                                }
                            }
                            return Err(error);
                        }
                    }
                    Ok(())
                }));
                Ok(())
            }

            fn synchronize(&mut self) -> Result<()> {
                match self.last.take() {
                    Some(handle) => handle.join().expect("mock batch thread panicked"),
                    None => Ok(()),
                }
            }
        }
    };
}

mock_types!(
    Mock,
    MockDevice,
    MockQueue,
    MockSignal,
    MockBuffer,
    MockProgram,
    MockCommand
);
mock_types!(
    Absent,
    AbsentDevice,
    AbsentQueue,
    AbsentSignal,
    AbsentBuffer,
    AbsentProgram,
    AbsentCommand
);
