//! `backend_set!` expands in the user's module, with the user's imports in
//! scope: its generated code must name every trait method by its path, or a
//! trait of the user's with a method of the same name makes the call
//! ambiguous (E0034). This file compiles only if it does (issue 24, defect 1:
//! `hwqueue::queue::ForeignWait` in scope broke `is_reached`).

#![allow(unused_imports)]

use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::queue::ForeignWait;
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory, TimelineSignal};

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
    let device = HygienicDevice::Cpu(CpuDevice::with_threads(1));
    let signal = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.signal(&signal, 3).submit().unwrap();
    queue.synchronize().unwrap();
    assert!(TimelineSignal::is_reached(&signal, 3));
    assert_eq!(device.alloc(8).unwrap().size(), 8);
}
