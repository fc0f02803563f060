//! The real side: a device, two queues, buffers and signals.

use hwqueue::cpu::{CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::{
    Buffer, Device, Error, HardwareQueue, MAX_SIGNAL_VALUE, QueueFactory, TimelineSignal,
};

use super::kernels::*;
use super::model::*;
use super::*;

/// The real side: a device, two queues, the buffers and signals.
pub(crate) struct Rig {
    pub(crate) queues: [CpuQueue; 2],
    pub(crate) buffers: Vec<CpuBuffer>,
    pub(crate) user: [CpuSignal; 2],
    pub(crate) progress: [CpuSignal; 2],
    pub(crate) failed: CpuSignal,
    pub(crate) programs: [CpuProgram; 4],
}

impl Rig {
    pub(crate) fn new(program: &QueueProgram, initial: &[Vec<u32>]) -> Self {
        let device = CpuDevice::with_threads(2);
        let second = if program.copy_queue_1 {
            device
                .copy_queue()
                .expect("copy queue")
                .expect("the CPU has a copy queue")
        } else {
            device.compute_queue().expect("compute queue")
        };
        let buffers = initial
            .iter()
            .map(|data| {
                let buffer = device.alloc(data.len() * 4).expect("alloc");
                buffer.write_from(data).expect("write");
                buffer
            })
            .collect();
        let failed = CpuSignal::new(0);
        failed.fail(
            MAX_SIGNAL_VALUE,
            Error::KernelFailed {
                program: "host".into(),
                message: "failed by the host".into(),
            },
        );
        Self {
            queues: [device.compute_queue().expect("compute queue"), second],
            buffers,
            user: [CpuSignal::new(0), CpuSignal::new(0)],
            progress: [CpuSignal::new(0), CpuSignal::new(0)],
            failed,
            programs: [
                CpuProgram::from_fn("fill", 1, 1, fill_kernel),
                CpuProgram::from_fn("increment", 2, 0, increment_kernel),
                CpuProgram::from_fn("add", 3, 0, add_kernel),
                CpuProgram::from_fn("explode", 0, 0, explode_kernel),
            ],
        }
    }

    pub(crate) fn signal(&self, name: SignalName) -> &CpuSignal {
        match name {
            SignalName::User(q) => &self.user[q],
            SignalName::Progress(q) => &self.progress[q],
            SignalName::Failed => &self.failed,
        }
    }

    pub(crate) fn record(&mut self, queue: usize, commands: &[Command]) {
        for command in commands {
            match command {
                Command::Exec {
                    kernel,
                    buffers,
                    scalars,
                    params,
                } => {
                    let program = &self.programs[*kernel as usize];
                    let buffers: Vec<&CpuBuffer> =
                        buffers.iter().map(|b| &self.buffers[*b]).collect();
                    let scalars: Vec<hwqueue::Scalar> =
                        scalars.iter().map(|s| (*s).into()).collect();
                    self.queues[queue].exec(program, &buffers, &scalars, *params);
                }
                Command::Copy { dst, src } => {
                    self.queues[queue].copy(&self.buffers[*dst], &self.buffers[*src]);
                }
                Command::Barrier => {
                    self.queues[queue].memory_barrier();
                }
                Command::Signal { signal, value } => {
                    let signal = self.signal(*signal).clone();
                    self.queues[queue].signal(&signal, *value);
                }
                Command::Wait { signal, value } => {
                    let signal = self.signal(*signal).clone();
                    self.queues[queue].wait(&signal, *value);
                }
            }
        }
    }
}
