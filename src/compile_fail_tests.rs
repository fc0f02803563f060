//! What the static API refuses, each beside a twin that compiles.
//!
//! A buffer of one backend handed to the concrete queue of another:
//! ```compile_fail
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{AnyBuffer, Device, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue = device.compute_queue().unwrap();
//! let other: AnyBuffer = device.alloc(4).unwrap().into();
//! queue.copy(&other, &other); // a CpuQueue takes CpuBuffers only
//! ```
//! ```
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{Device, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue = device.compute_queue().unwrap();
//! let buffer = device.alloc(4).unwrap();
//! queue.copy(&buffer, &buffer);
//! ```
//!
//! A signal of another backend on the native `wait` (cross-backend waits go
//! through `wait_foreign` or the Any* enums, which choose it):
//! ```compile_fail
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{AnySignal, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue = device.compute_queue().unwrap();
//! let signal: AnySignal = device.new_signal(0).unwrap().into();
//! queue.wait(&signal, 1);
//! ```
//! ```
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{AnySignal, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue = device.compute_queue().unwrap();
//! let signal: AnySignal = device.new_signal(0).unwrap().into();
//! queue.wait_foreign(&signal, 1);
//! ```
//!
//! Generic code cannot mix two backends' types:
//! ```compile_fail
//! use hwqueue::{Backend, BufferOf, HardwareQueue, QueueOf};
//! fn mixed<B: Backend, C: Backend>(queue: &mut QueueOf<B>, buffer: &BufferOf<C>) {
//!     queue.copy(buffer, buffer);
//! }
//! ```
//! ```
//! use hwqueue::{Backend, BufferOf, HardwareQueue, QueueOf};
//! fn same<B: Backend>(queue: &mut QueueOf<B>, buffer: &BufferOf<B>) {
//!     queue.copy(buffer, buffer);
//! }
//! ```
//!
//! An Any* queue takes Any* arguments, not a backend's own:
//! ```compile_fail
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{AnyQueue, Device, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue: AnyQueue = device.compute_queue().unwrap().into();
//! let buffer = device.alloc(4).unwrap();
//! queue.copy(&buffer, &buffer);
//! ```
//! ```
//! use hwqueue::cpu::CpuDevice;
//! use hwqueue::{AnyBuffer, AnyQueue, Device, HardwareQueue, QueueFactory};
//! let device = CpuDevice::new();
//! let mut queue: AnyQueue = device.compute_queue().unwrap().into();
//! let buffer: AnyBuffer = device.alloc(4).unwrap().into();
//! queue.copy(&buffer, &buffer);
//! ```
//!
//! A backend set whose listed types are not the backend's own does not
//! compile (here the CPU's queue is listed as its device):
//! ```compile_fail
//! use hwqueue::cpu::*;
//! hwqueue::backend_set! {
//!     pub backend Wrong {
//!         id: "wrong", device: WrongDevice, queue: WrongQueue, signal: WrongSignal,
//!         buffer: WrongBuffer, program: WrongProgram,
//!     }
//!     variants {
//!         Cpu(as_cpu, as_cpu_mut): Cpu {
//!             device: CpuQueue, queue: CpuQueue, signal: CpuSignal,
//!             buffer: CpuBuffer, program: CpuProgram,
//!         },
//!     }
//! }
//! ```
//! ```
//! use hwqueue::cpu::*;
//! hwqueue::backend_set! {
//!     pub backend Right {
//!         id: "right", device: RightDevice, queue: RightQueue, signal: RightSignal,
//!         buffer: RightBuffer, program: RightProgram,
//!     }
//!     variants {
//!         Cpu(as_cpu, as_cpu_mut): Cpu {
//!             device: CpuDevice, queue: CpuQueue, signal: CpuSignal,
//!             buffer: CpuBuffer, program: CpuProgram,
//!         },
//!     }
//! }
//! ```
//!
//! Input of another form than the macro's (here the variant lacks its
//! `as_*_mut` accessor and its types) is a compile error that shows the
//! expected form, not `no rules expected ...`; the twin above compiles.
//! ```compile_fail
//! hwqueue::backend_set! {
//!     pub backend Short {
//!         id: "short", device: ShortDevice, queue: ShortQueue, signal: ShortSignal,
//!         buffer: ShortBuffer, program: ShortProgram,
//!     }
//!     variants {
//!         Cpu(as_cpu): hwqueue::cpu::Cpu,
//!     }
//! }
//! ```
