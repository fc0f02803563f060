//! The timing of a profiled batch on the worker: a tick per command while
//! it runs, the events made after it settled.

use crate::error::Result;
use crate::profile::{BatchClock, Category, EventNames, Name, ProfileEvent, describe};
use crate::program::Program;
use crate::queue::{Batch, Command};

use super::Shared;
use crate::cpu::Cpu;

/// The timing of one batch, while it runs: one tick per command, and why
/// the last one failed, if it did. The events are made once the batch
/// settled ([`finish`](Self::finish)), so that a host waiting on the
/// batch's signal is not also waiting on them.
pub(super) struct BatchProfile<'t> {
    clock: BatchClock,
    /// When the batch started, then when each command ended (the next
    /// one's start: commands run back to back on the worker), in the
    /// clock's ticks. The worker's, reused across batches.
    ticks: &'t mut Vec<u64>,
    failure: Option<String>,
}

impl<'t> BatchProfile<'t> {
    pub(super) fn new(batch: &Batch<Cpu>, ticks: &'t mut Vec<u64>) -> Self {
        let clock = BatchClock::start();
        ticks.clear();
        ticks.reserve(batch.commands().len() + 1);
        ticks.push(clock.tick());
        Self {
            clock,
            ticks,
            failure: None,
        }
    }

    /// The next command ended with `result`.
    pub(super) fn record(&mut self, result: &Result<()>) {
        // In order even if the worker moved to a core whose counter lags.
        let last = self.ticks.last().copied().unwrap_or(0);
        self.ticks.push(self.clock.tick().max(last));
        if let Err(error) = result {
            self.failure = Some(error.to_string());
        }
    }

    /// The events of the commands of `batch` that ran (all but those after
    /// a failure), timed on the host timeline.
    pub(super) fn finish(
        self,
        shared: &Shared,
        batch: &Batch<Cpu>,
        names: &mut EventNames,
    ) -> Vec<ProfileEvent> {
        let map = self.clock.finish();
        let queue = shared.label();
        let (ran, sequence) = (self.ticks.len() - 1, batch.sequence());
        let mut events = Vec::with_capacity(ran);
        // The last kernel's name and where its program keeps it: while the
        // batch holds its programs, the same address is the same name, so a
        // run of one kernel's `exec`s looks its name up once.
        let mut kernel: Option<(*const u8, Name)> = None;
        let mut start = map.ns(self.ticks[0]);
        let commands = batch.commands().iter().zip(&self.ticks[1..]);
        for (index, (command, &tick)) in commands.enumerate() {
            let end = map.ns(tick);
            let failed = index + 1 == ran && self.failure.is_some();
            let event = match command {
                Command::Exec {
                    program, params, ..
                } if !failed => {
                    let name = program.name();
                    let name = match &kernel {
                        Some((at, interned))
                            if *at == name.as_ptr() && interned.len() == name.len() =>
                        {
                            interned.clone()
                        }
                        _ => kernel.insert((name.as_ptr(), names.get(name))).1.clone(),
                    };
                    ProfileEvent {
                        name,
                        category: Category::Kernel,
                        queue: queue.clone(),
                        batch: sequence,
                        index,
                        start_ns: start,
                        end_ns: end,
                        detail: String::new(),
                        params: Some(*params),
                    }
                }
                _ => {
                    let mut described = describe(command, names);
                    if let Some(failure) = self.failure.as_ref().filter(|_| failed) {
                        described.detail = format!("{}; failed: {failure}", described.detail);
                    }
                    described.into_event(queue.clone(), sequence, index, start, end)
                }
            };
            events.push(event);
            start = end;
        }
        events
    }
}
