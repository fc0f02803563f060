//! The real side: a device, two queues, buffers and signals.

use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::{
    Buffer, Device, Download, Error, HardwareQueue, MAX_SIGNAL_VALUE, QueueFactory, TimelineSignal,
    View,
};

use super::kernels::*;
use super::model::*;
use super::*;

/// The real side: a device, two queues, the buffers, signals and
/// downloads.
pub(crate) struct Rig {
    pub(crate) queues: [CpuQueue; 2],
    pub(crate) buffers: Vec<CpuBuffer>,
    pub(crate) user: [CpuSignal; 2],
    pub(crate) progress: [CpuSignal; 2],
    pub(crate) failed: CpuSignal,
    pub(crate) programs: [CpuProgram; 4],
    /// Every download recorded, by the model's id.
    pub(crate) downloads: Vec<Download<u32>>,
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
            downloads: Vec::new(),
        }
    }

    pub(crate) fn signal(&self, name: SignalName) -> &CpuSignal {
        match name {
            SignalName::User(q) => &self.user[q],
            SignalName::Progress(q) => &self.progress[q],
            SignalName::Failed => &self.failed,
        }
    }

    /// The view of `span` (in range: the model clamps every span).
    fn view(&self, span: Span) -> View<Cpu> {
        View::new(&self.buffers[span.buf], span.at * 4, span.len * 4).expect("a span in range")
    }

    pub(crate) fn record(&mut self, queue: usize, commands: &[Command]) {
        for command in commands {
            match command {
                Command::Exec {
                    kernel,
                    args,
                    views,
                    scalars,
                    params,
                } => {
                    let program = &self.programs[*kernel as usize];
                    let scalars: Vec<hwqueue::Scalar> =
                        scalars.iter().map(|s| (*s).into()).collect();
                    if *views {
                        let views: Vec<View<Cpu>> = args.iter().map(|a| self.view(*a)).collect();
                        let views: Vec<&View<Cpu>> = views.iter().collect();
                        self.queues[queue].exec_views(program, &views, &scalars, *params);
                    } else {
                        let buffers: Vec<&CpuBuffer> =
                            args.iter().map(|a| &self.buffers[a.buf]).collect();
                        self.queues[queue].exec(program, &buffers, &scalars, *params);
                    }
                }
                Command::Copy { dst, src } => {
                    self.queues[queue].copy(&self.buffers[*dst], &self.buffers[*src]);
                }
                Command::CopyRange { dst, src } => {
                    let (dst, src) = (self.view(*dst), self.view(*src));
                    self.queues[queue].copy(&dst, &src);
                }
                Command::Fill {
                    buf,
                    at,
                    len,
                    value,
                    width,
                } => {
                    let view = View::new(&self.buffers[*buf], *at, *len).expect("a range in range");
                    let queue = &mut self.queues[queue];
                    match width {
                        1 => queue.fill(&view, *value as u8),
                        2 => queue.fill(&view, *value as u16),
                        4 => queue.fill(&view, *value),
                        _ => queue.fill(&view, u64::from(*value)),
                    };
                }
                Command::Upload { dst, data, owned } => {
                    let view = self.view(*dst);
                    if *owned {
                        self.queues[queue].upload_vec(&view, data.clone());
                    } else {
                        self.queues[queue].upload(&view, data);
                    }
                }
                Command::Download { src, host_len, id } => {
                    assert!(
                        *id <= self.downloads.len(),
                        "harness bug: download ids skip"
                    );
                    if *id == self.downloads.len() {
                        self.downloads.push(Download::new(*host_len));
                    }
                    let view = self.view(*src);
                    self.queues[queue].download(&view, &self.downloads[*id]);
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
