//! The sequential reference model of two queues.

use hwqueue::{Error, ExecParams, MAX_SIGNAL_VALUE};

use super::kernels::*;
use super::*;
use crate::signal::*;

/// Which signal a command names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignalName {
    /// Queue `q`'s user signal (only queue `q` signals it).
    User(usize),
    /// Queue `q`'s progress signal: the harness signals it at the end of
    /// every batch and waits on it for cross-queue dependencies.
    Progress(usize),
    /// Failed by the host before anything runs.
    Failed,
}

/// A command as recorded on a real queue.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Exec {
        kernel: Kernel,
        buffers: Vec<usize>,
        scalars: Vec<u32>,
        params: ExecParams,
    },
    Copy {
        dst: usize,
        src: usize,
    },
    Barrier,
    Signal {
        signal: SignalName,
        value: u64,
    },
    Wait {
        signal: SignalName,
        value: u64,
    },
}

/// The model of one signal: its value, its failed-up-to mark, and the
/// ranges failures covered while the value was below them ("poisoned":
/// a wait there could see the failure or the later raise, so the harness
/// never waits there).
#[derive(Debug, Default, Clone)]
pub(crate) struct TimelineModel {
    pub(crate) value: u64,
    pub(crate) failed_upto: u64,
    pub(crate) poisoned: Vec<(u64, u64)>,
}

impl TimelineModel {
    pub(crate) fn set(&mut self, value: u64) {
        self.value = self.value.max(value);
    }

    pub(crate) fn fail(&mut self, upto: u64) {
        if upto > self.value {
            self.poisoned.push((self.value, upto));
            self.failed_upto = self.failed_upto.max(upto);
        }
    }

    /// The largest value `<= wanted` that is reached and was never
    /// poisoned.
    pub(crate) fn safe_target(&self, wanted: u64) -> u64 {
        let mut target = wanted.min(self.value);
        while let Some(&(low, _)) = self
            .poisoned
            .iter()
            .find(|(low, high)| target > *low && target <= *high)
        {
            target = low;
        }
        target
    }

    pub(crate) fn wait(&self, target: u64) -> WaitOutcome {
        if target <= self.value {
            WaitOutcome::Reached
        } else if target > MAX_SIGNAL_VALUE {
            WaitOutcome::OutOfRange
        } else if target <= self.failed_upto {
            WaitOutcome::Failed {
                current: self.value,
                cause: 0,
            }
        } else {
            WaitOutcome::Timeout {
                current: self.value,
            }
        }
    }
}

/// Why the model expects a batch to be rejected at `submit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    UnsupportedCommand,
    InvalidExecParams,
    InvalidArguments,
    CopySizeMismatch,
    CopyOverlap,
    SignalValueOutOfRange,
}

impl Rejection {
    pub(crate) fn matches(self, error: &Error) -> bool {
        matches!(
            (self, error),
            (
                Rejection::UnsupportedCommand,
                Error::UnsupportedCommand { .. }
            ) | (
                Rejection::InvalidExecParams,
                Error::InvalidExecParams { .. }
            ) | (Rejection::InvalidArguments, Error::InvalidArguments { .. })
                | (Rejection::CopySizeMismatch, Error::CopySizeMismatch { .. })
                | (Rejection::CopyOverlap, Error::CopyOverlap { .. })
                | (
                    Rejection::SignalValueOutOfRange,
                    Error::SignalValueOutOfRange { .. }
                )
        )
    }
}

/// A batch that ran to completion since its queue was last synchronized:
/// what it touched and the progress value it signalled.
#[derive(Debug)]
pub(crate) struct Completed {
    pub(crate) queue: usize,
    pub(crate) progress: u64,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
}

/// The sequential interpreter: runs batches one after the other in the
/// global order, which is what the two real queues must be equivalent to.
#[derive(Debug)]
pub(crate) struct QueueModel {
    pub(crate) copy_queue_1: bool,
    pub(crate) buffers: Vec<Vec<u32>>,
    pub(crate) user: [TimelineModel; 2],
    pub(crate) progress: [TimelineModel; 2],
    pub(crate) batches: [u64; 2],
    /// A run-time failure not yet reported to the queue's owner.
    pub(crate) unreported: [bool; 2],
    pub(crate) completed: Vec<Completed>,
}

/// What the model predicts for one batch.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) commands: Vec<Command>,
    pub(crate) rejection: Option<Rejection>,
    /// The batch fails while running: the queue must be synchronized.
    pub(crate) fails: bool,
}

pub(crate) fn buffer_sets(op: &QueueOp, n: usize) -> (u64, u64) {
    let bit = |index: usize| 1u64 << (index % n);
    match *op {
        QueueOp::Fill { buf, .. } => (0, bit(buf)),
        QueueOp::Increment { src, dst, .. } => (bit(src), bit(dst)),
        QueueOp::Add { a, b, c, .. } => (bit(a) | bit(b), bit(c)),
        QueueOp::Copy { dst, src } => (bit(src), bit(dst)),
        QueueOp::WrongArity { buf } => (0, bit(buf)),
        _ => (0, 0),
    }
}

impl QueueModel {
    pub(crate) fn lens(&self) -> Vec<usize> {
        self.buffers.iter().map(Vec::len).collect()
    }

    /// Turns `ops` for queue `queue` into commands and predicts their
    /// outcome, updating the model as if the batch ran.
    pub(crate) fn plan(&mut self, queue: usize, ops: &[QueueOp]) -> Plan {
        let n = self.buffers.len();
        let lens = self.lens();
        let (reads, writes) = ops.iter().fold((0, 0), |(r, w), op| {
            let (or, ow) = buffer_sets(op, n);
            (r | or, w | ow)
        });
        let mut commands = Vec::new();
        // Cross-queue dependency: wait for the last batch of the other queue
        // that touched our buffers (one of us writing), if it completed.
        let other = 1 - queue;
        if let Some(dependency) = self.completed.iter().rev().find(|c| {
            c.queue == other && (c.writes & (reads | writes) != 0 || c.reads & writes != 0)
        }) {
            commands.push(Command::Wait {
                signal: SignalName::Progress(other),
                value: dependency.progress,
            });
        }
        // Record-time checks, in recording order: the first one rejects.
        let mut rejection = None;
        let mut reject = |why: Rejection| {
            rejection.get_or_insert(why);
        };
        let is_copy_queue = queue == 1 && self.copy_queue_1;
        let exec = |kernel: Kernel,
                    buffers: Vec<usize>,
                    scalars: Vec<u32>,
                    global: u32,
                    local: u32,
                    reject: &mut dyn FnMut(Rejection)| {
            let params = ExecParams::new_1d(global, local);
            let wanted = match kernel {
                Kernel::Fill => 1,
                Kernel::Increment => 2,
                Kernel::Add => 3,
                Kernel::Explode => 0,
            };
            if is_copy_queue {
                reject(Rejection::UnsupportedCommand);
            } else if global == 0 || local == 0 || !global.is_multiple_of(local) {
                reject(Rejection::InvalidExecParams);
            } else if buffers.len() != wanted {
                reject(Rejection::InvalidArguments);
            }
            Command::Exec {
                kernel,
                buffers,
                scalars,
                params,
            }
        };
        // User-signal waits are lowered against the model as it stands at
        // that point of the batch: sets earlier in the batch count.
        let mut user = self.user.clone();
        for op in ops {
            let command = match *op {
                QueueOp::Fill {
                    buf,
                    value,
                    global,
                    local,
                } => exec(
                    Kernel::Fill,
                    vec![buf % n],
                    vec![value],
                    global,
                    local,
                    &mut reject,
                ),
                QueueOp::Increment {
                    src,
                    dst,
                    global,
                    local,
                } => exec(
                    Kernel::Increment,
                    vec![src % n, dst % n],
                    vec![],
                    global,
                    local,
                    &mut reject,
                ),
                QueueOp::Add {
                    a,
                    b,
                    c,
                    global,
                    local,
                } => exec(
                    Kernel::Add,
                    vec![a % n, b % n, c % n],
                    vec![],
                    global,
                    local,
                    &mut reject,
                ),
                QueueOp::Explode { global, local } => {
                    exec(Kernel::Explode, vec![], vec![], global, local, &mut reject)
                }
                QueueOp::WrongArity { buf } => exec(
                    Kernel::Fill,
                    vec![buf % n, buf % n],
                    vec![1],
                    1,
                    1,
                    &mut reject,
                ),
                QueueOp::Copy { dst, src } => {
                    let (dst, src) = (dst % n, src % n);
                    // Lengths first, then the overlap (buffers are never
                    // empty, so a buffer onto itself overlaps).
                    if lens[dst] != lens[src] {
                        reject(Rejection::CopySizeMismatch);
                    } else if dst == src {
                        reject(Rejection::CopyOverlap);
                    }
                    Command::Copy { dst, src }
                }
                QueueOp::Barrier => Command::Barrier,
                QueueOp::Signal { value } => {
                    user[queue].set(value);
                    Command::Signal {
                        signal: SignalName::User(queue),
                        value,
                    }
                }
                QueueOp::SignalPastTheRange => {
                    reject(Rejection::SignalValueOutOfRange);
                    Command::Signal {
                        signal: SignalName::User(queue),
                        value: u64::MAX,
                    }
                }
                QueueOp::Wait { signal, value } => {
                    let signal = signal % 2;
                    Command::Wait {
                        signal: SignalName::User(signal),
                        value: user[signal].safe_target(value),
                    }
                }
                QueueOp::WaitFailed => Command::Wait {
                    signal: SignalName::Failed,
                    value: 1,
                },
                QueueOp::WaitPastTheRange => {
                    reject(Rejection::SignalValueOutOfRange);
                    Command::Wait {
                        signal: SignalName::User(queue),
                        value: MAX_SIGNAL_VALUE + 1,
                    }
                }
            };
            commands.push(command);
        }
        self.batches[queue] += 1;
        let progress = self.batches[queue];
        commands.push(Command::Signal {
            signal: SignalName::Progress(queue),
            value: progress,
        });

        if rejection.is_some() {
            // Nothing runs; every signal of the batch fails, in order.
            self.fail_signals(&commands);
            return Plan {
                commands,
                rejection,
                fails: false,
            };
        }
        let failed_at = self.run(&commands);
        if let Some(index) = failed_at {
            self.fail_signals(&commands[index..]);
            self.unreported[queue] = true;
        } else {
            self.completed.push(Completed {
                queue,
                progress,
                reads,
                writes,
            });
        }
        Plan {
            commands,
            rejection: None,
            fails: failed_at.is_some(),
        }
    }

    pub(crate) fn timeline(&mut self, signal: SignalName) -> Option<&mut TimelineModel> {
        match signal {
            SignalName::User(q) => Some(&mut self.user[q]),
            SignalName::Progress(q) => Some(&mut self.progress[q]),
            SignalName::Failed => None,
        }
    }

    pub(crate) fn fail_signals(&mut self, commands: &[Command]) {
        for command in commands {
            // A value past the range is refused at record time, not recorded.
            if let Command::Signal { signal, value } = *command
                && value <= MAX_SIGNAL_VALUE
                && let Some(timeline) = self.timeline(signal)
            {
                timeline.fail(value);
            }
        }
    }

    /// Runs commands in order; the index of the one that fails, if any.
    pub(crate) fn run(&mut self, commands: &[Command]) -> Option<usize> {
        for (index, command) in commands.iter().enumerate() {
            match command {
                Command::Wait { signal, value } => match self.timeline(*signal) {
                    None => return Some(index),
                    Some(timeline) => match timeline.wait(*value) {
                        WaitOutcome::Reached => {}
                        WaitOutcome::Failed { .. } => return Some(index),
                        other => panic!(
                            "harness bug: a wait the model cannot finish ({other:?}) in {commands:?}"
                        ),
                    },
                },
                Command::Signal { signal, value } => {
                    if let Some(timeline) = self.timeline(*signal) {
                        timeline.set(*value);
                    }
                }
                Command::Barrier => {}
                Command::Copy { dst, src } => {
                    let data = self.buffers[*src].clone();
                    self.buffers[*dst] = data;
                }
                Command::Exec {
                    kernel,
                    buffers,
                    scalars,
                    params,
                } => {
                    let global = params.global()[0] as usize;
                    if *kernel == Kernel::Explode
                        || buffers.iter().any(|b| self.buffers[*b].len() < global)
                    {
                        return Some(index);
                    }
                    for i in 0..global {
                        match kernel {
                            Kernel::Fill => self.buffers[buffers[0]][i] = scalars[0],
                            Kernel::Increment => {
                                self.buffers[buffers[1]][i] =
                                    self.buffers[buffers[0]][i].wrapping_add(1);
                            }
                            Kernel::Add => {
                                self.buffers[buffers[2]][i] = self.buffers[buffers[0]][i]
                                    .wrapping_add(self.buffers[buffers[1]][i]);
                            }
                            Kernel::Explode => unreachable!(),
                        }
                    }
                }
            }
        }
        None
    }

    /// `synchronize` on `queue`: whether it reports a failure.
    pub(crate) fn synchronize(&mut self, queue: usize) -> bool {
        self.completed.retain(|c| c.queue != queue);
        std::mem::take(&mut self.unreported[queue])
    }
}
