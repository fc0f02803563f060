//! The simulator's replay form (issue 45): a third backend, outside the
//! crate, offering what CUDA's graphs offer through the public `Engine`
//! contract (`replay_recorded`, `check_replay`, `Command::Replay`).
//!
//! Each batch marked with a key (`Engine::replay_next`) gets a [`Template`]
//! at its `submit`, which the device thread fills once it ran the batch
//! whole: each run of two or more `exec`s with nothing between them but
//! signals and barriers, as one program (the kernels, their views, scalars
//! and work sizes). A later batch under the key may name those programs
//! ([`Command::Replay`]) where `replay_recorded` found them whole with the
//! kernel counts asked for; the device thread runs each program's kernels
//! in order, as it ran them. Made at `submit`, so `replay_recorded` never
//! offers a batch older than the key's last; the template holds its views,
//! so the bytes they name stay allocated while it may run. A batch naming
//! a buffer `alloca` made is not offered (a repeat would take no use of
//! it).

use std::sync::{Arc, Mutex};

use hwqueue::queue::{Batch, Command};
use hwqueue::{Buffer, ExecParams, Scalar, View};

use crate::Sim;
use crate::memory::lock;
use crate::program::SimProgram;

/// One kernel of a recorded program.
pub(crate) struct Kernel {
    pub(crate) program: SimProgram,
    pub(crate) views: Vec<View<Sim>>,
    pub(crate) scalars: Vec<Scalar>,
    pub(crate) params: ExecParams,
}

/// What a batch marked with `key` ran, for later batches to run again.
pub(crate) struct Template {
    pub(crate) key: u32,
    /// Its programs, once the batch ran whole (`None` before, and where
    /// it did not or named a buffer `alloca` made).
    programs: Mutex<Option<Arc<Vec<Vec<Kernel>>>>>,
}

/// How a batch goes to the device thread, as its `submit` marked it.
#[derive(Clone, Default)]
pub(crate) enum Mark {
    #[default]
    Plain,
    /// It fills the template once it ran whole.
    Record(Arc<Template>),
    /// Its `Command::Replay`s run the template's programs.
    Repeat(Arc<Vec<Vec<Kernel>>>),
}

impl Template {
    pub(crate) fn new(key: u32) -> Self {
        Self {
            key,
            programs: Mutex::new(None),
        }
    }

    /// The batch ran whole: its runs of kernels become the programs.
    pub(crate) fn record(&self, batch: &Batch<Sim>) {
        let mut programs: Vec<Vec<Kernel>> = Vec::new();
        let mut current: Vec<Kernel> = Vec::new();
        let mut close = |current: &mut Vec<Kernel>| {
            if current.len() >= 2 {
                programs.push(std::mem::take(current));
            }
            current.clear();
        };
        for command in batch.commands() {
            match command {
                Command::Exec {
                    program,
                    buffers,
                    scalars,
                    params,
                } => {
                    let views = &batch.buffers()[buffers.clone()];
                    if views.iter().any(|v| v.buffer().queue_ordered().is_some()) {
                        return;
                    }
                    current.push(Kernel {
                        program: program.clone(),
                        views: views.to_vec(),
                        scalars: batch.scalars()[scalars.clone()].to_vec(),
                        params: *params,
                    });
                }
                Command::Signal { .. } | Command::Barrier => {}
                _ => close(&mut current),
            }
        }
        close(&mut current);
        *lock(&self.programs) = Some(Arc::new(programs));
    }

    /// Its programs, where the batch ran whole and they run `kernels`
    /// kernels each, in order.
    pub(crate) fn matching(&self, kernels: &[u32]) -> Option<Arc<Vec<Vec<Kernel>>>> {
        let programs = lock(&self.programs).clone()?;
        let same = programs.len() == kernels.len()
            && programs
                .iter()
                .zip(kernels)
                .all(|(program, &count)| program.len() == count as usize);
        same.then_some(programs)
    }
}
