//! `backend_set!` expands in the user's module, with the user's imports in
//! scope: its generated code must name every trait method by its path, or a
//! trait of the user's with a method of the same name makes the call
//! ambiguous (E0034). This file compiles only if it does (issue 24, defect 1:
//! `hwqueue::queue::ForeignWait` in scope broke `is_reached`). Beside it,
//! `Shadow` gives every type a method of each name the generated code
//! calls on the variants' queues, signals, buffers, devices and views (the
//! queue impl still called `q.fill(..)`, `q.reject(..)` and 20 more by
//! name, and failed to compile here on 88eb526).

#![allow(unused_imports)]

use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::queue::ForeignWait;
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory, TimelineSignal};

/// A user's trait, implemented for every type, whose methods share names
/// with hwqueue's traits: a call by name in generated code is ambiguous.
#[allow(dead_code)]
trait Shadow {
    fn kind(&self) {}
    fn wait(&mut self) {}
    fn signal(&mut self) {}
    fn exec(&mut self) {}
    fn exec_views(&mut self) {}
    fn copy(&mut self) {}
    fn fill(&mut self) {}
    fn upload(&mut self) {}
    fn upload_vec(&mut self) {}
    fn download(&mut self) {}
    fn memory_barrier(&mut self) {}
    fn alloca(&mut self) {}
    fn dealloca(&mut self) {}
    fn wait_foreign(&mut self) {}
    fn reject(&mut self) {}
    fn recorded(&self) {}
    fn discard(&mut self) {}
    fn submit(&mut self) {}
    fn synchronize(&mut self) {}
    fn set_profiling(&mut self) {}
    fn profiling(&self) {}
    fn take_profile(&mut self) {}
    fn view_parts(&self) {}
    fn size(&self) {}
    fn same_as(&self) {}
    fn write_at(&self) {}
    fn read_at(&self) {}
    fn value(&self) {}
    fn set(&self) {}
    fn fail(&self) {}
    fn watch(&self) {}
    fn spec(&self) {}
    fn name(&self) {}
    fn limits(&self) {}
    fn alloc(&self) {}
    fn alloc_uninit(&self) {}
    fn new_signal(&self) {}
    fn compute_queue(&self) {}
    fn copy_queue(&self) {}
    fn health(&self) {}
}

impl<T: ?Sized> Shadow for T {}

/// `TimelineSignal::wait` takes `&self`, `HardwareQueue::wait` `&mut self`:
/// a shadow of each receiver, or one of them is never ambiguous.
#[allow(dead_code)]
trait ShadowRef {
    fn wait(&self) {}
}

impl<T: ?Sized> ShadowRef for T {}

hwqueue::backend_set! {
    /// The CPU alone, declared where `ForeignWait` is in scope.
    pub backend Hygienic {
        id: "hygienic",
        device: HygienicDevice,
        queue: HygienicQueue,
        signal: HygienicSignal,
        buffer: HygienicBuffer,
        program: HygienicProgram,
    }
    variants {
        Cpu(as_cpu, as_cpu_mut): Cpu {
            device: CpuDevice,
            queue: CpuQueue,
            signal: CpuSignal,
            buffer: CpuBuffer,
            program: CpuProgram,
        },
    }
}

#[test]
fn a_set_declared_beside_foreign_wait_compiles_and_works() {
    // Called by path here too: `Shadow` shadows every name.
    let device = HygienicDevice::Cpu(CpuDevice::with_threads(1));
    let signal = QueueFactory::new_signal(&device, 0).unwrap();
    let mut queue = QueueFactory::compute_queue(&device).unwrap();
    let buffer = Device::alloc(&device, 8).unwrap();
    HardwareQueue::fill(&mut queue, &buffer, 7u8);
    HardwareQueue::signal(&mut queue, &signal, 3);
    HardwareQueue::submit(&mut queue).unwrap();
    HardwareQueue::synchronize(&mut queue).unwrap();
    assert!(TimelineSignal::is_reached(&signal, 3));
    assert_eq!(Buffer::size(&buffer), 8);
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![7; 8]);
}
