//! The sequential reference model of two queues.

use hwqueue::cpu::CPU_LIMITS;
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

/// Elements `at..at + len` of buffer `buf`: a view (in range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) buf: usize,
    pub(crate) at: usize,
    pub(crate) len: usize,
}

impl Span {
    /// The elements, as a range of the buffer.
    pub(crate) fn range(self) -> std::ops::Range<usize> {
        self.at..self.at + self.len
    }
}

/// A command as recorded on a real queue.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    /// `exec`, or `exec_views` when `views` (each argument a [`Span`];
    /// with `exec`, whole buffers).
    Exec {
        kernel: Kernel,
        args: Vec<Span>,
        views: bool,
        scalars: Vec<u32>,
        params: ExecParams,
    },
    /// `copy` of whole buffers.
    Copy {
        dst: usize,
        src: usize,
    },
    /// `copy` between views.
    CopyRange {
        dst: Span,
        src: Span,
    },
    /// `fill` of bytes `at..at + len` of `buf` with the low `width` bytes
    /// of `value` (a `u64` pattern when `width` is 8).
    Fill {
        buf: usize,
        at: usize,
        len: usize,
        value: u32,
        width: usize,
    },
    /// `upload` (`upload_vec` when `owned`) of `data` into `dst`.
    Upload {
        dst: Span,
        data: Vec<u32>,
        owned: bool,
    },
    /// `download` of `src` into download `id` (the rig makes it, of
    /// `host_len` elements, where `id` first appears; a later command with
    /// the same `id` records it again).
    Download {
        src: Span,
        host_len: usize,
        id: usize,
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
    ViewMisaligned,
    CopySizeMismatch,
    CopyOverlap,
    InvalidFill,
    TransferSizeMismatch,
    DownloadReused,
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
                | (Rejection::ViewMisaligned, Error::ViewMisaligned { .. })
                | (Rejection::CopySizeMismatch, Error::CopySizeMismatch { .. })
                | (Rejection::CopyOverlap, Error::CopyOverlap { .. })
                | (Rejection::InvalidFill, Error::InvalidFill { .. })
                | (
                    Rejection::TransferSizeMismatch,
                    Error::TransferSizeMismatch { .. }
                )
                | (Rejection::DownloadReused, Error::DownloadReused)
                | (
                    Rejection::SignalValueOutOfRange,
                    Error::SignalValueOutOfRange { .. }
                )
        )
    }
}

/// Which command failed a batch at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// An `exec` (`KernelFailed`).
    Kernel,
    /// A `wait` on a failed signal (`SignalFailed`).
    Wait,
}

/// What the model expects of a download once every queue is synchronized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expected {
    /// Recorded; its batch not planned to the end yet.
    Pending,
    /// Exactly these elements.
    Data(Vec<u32>),
    /// Its batch was rejected: `BatchRejected`.
    Rejected,
    /// A command before it in its batch failed: that command's error.
    Failed(Failure),
}

impl Expected {
    /// Whether `got` (from `Download::take`) is what the model expects.
    pub(crate) fn matches(&self, got: &hwqueue::Result<Vec<u32>>) -> bool {
        match (self, got) {
            (Expected::Data(data), Ok(got)) => data == got,
            (Expected::Rejected, Err(Error::BatchRejected { .. }))
            | (Expected::Failed(Failure::Kernel), Err(Error::KernelFailed { .. }))
            | (Expected::Failed(Failure::Wait), Err(Error::SignalFailed { .. })) => true,
            _ => false,
        }
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
    /// Every download recorded, by id, in recording order.
    pub(crate) downloads: Vec<Expected>,
}

/// What the model predicts for one batch.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) commands: Vec<Command>,
    pub(crate) rejection: Option<Rejection>,
    /// The batch fails while running: the queue must be synchronized.
    pub(crate) fails: bool,
}

/// The buffers `op` reads and writes, as bit sets (a cross-queue
/// dependency is any overlap where one side writes).
pub(crate) fn buffer_sets(op: &QueueOp, n: usize) -> (u64, u64) {
    let bit = |index: usize| 1u64 << (index % n);
    match *op {
        QueueOp::Fill { buf, .. }
        | QueueOp::FillRange { buf, .. }
        | QueueOp::FillView { buf, .. }
        | QueueOp::Upload { buf, .. }
        | QueueOp::UploadWrongSize { buf }
        | QueueOp::WrongArity { buf } => (0, bit(buf)),
        QueueOp::Increment { src, dst, .. } => (bit(src), bit(dst)),
        QueueOp::Add { a, b, c, .. } => (bit(a) | bit(b), bit(c)),
        QueueOp::Copy { dst, src } | QueueOp::CopyRange { dst, src, .. } => (bit(src), bit(dst)),
        QueueOp::Download { buf, .. }
        | QueueOp::DownloadWrongSize { buf }
        | QueueOp::DownloadTwice { buf } => (bit(buf), 0),
        QueueOp::Explode { .. }
        | QueueOp::Barrier
        | QueueOp::Signal { .. }
        | QueueOp::SignalPastTheRange
        | QueueOp::Wait { .. }
        | QueueOp::WaitFailed
        | QueueOp::WaitPastTheRange => (0, 0),
    }
}

/// `at` clamped into a buffer of `size` units (`0..=size`), then `len`
/// into what is left after it (`0..=size - at`).
pub(crate) fn clamp(size: usize, at: usize, len: usize) -> (usize, usize) {
    let at = at % (size + 1);
    (at, len % (size - at + 1))
}

/// The width in bytes of a [`QueueOp::FillRange`] pattern.
pub(crate) fn fill_width(width: u8) -> usize {
    match width {
        1 | 2 | 4 => usize::from(width),
        _ => 8,
    }
}

/// The `len` elements an [`QueueOp::Upload`] with `seed` carries.
pub(crate) fn upload_data(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| seed.wrapping_mul(0x9E37_79B9) ^ i.wrapping_mul(0x0100_0193))
        .collect()
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
        // Whole buffers as views, for `exec`.
        let whole = |buf: usize| Span {
            buf: buf % n,
            at: 0,
            len: lens[buf % n],
        };
        // `exec`'s checks, in the core's order: the queue's kind, the work
        // sizes, the argument counts, then (`exec_views`) each view's
        // alignment.
        let exec = |kernel: Kernel,
                    args: Vec<Span>,
                    views: bool,
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
            } else if args.len() != wanted {
                reject(Rejection::InvalidArguments);
            } else if args
                .iter()
                .any(|span| !(span.at * 4).is_multiple_of(CPU_LIMITS.view_alignment))
            {
                reject(Rejection::ViewMisaligned);
            }
            Command::Exec {
                kernel,
                args,
                views,
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
                    vec![whole(buf)],
                    false,
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
                    vec![whole(src), whole(dst)],
                    false,
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
                    vec![whole(a), whole(b), whole(c)],
                    false,
                    vec![],
                    global,
                    local,
                    &mut reject,
                ),
                QueueOp::Explode { global, local } => exec(
                    Kernel::Explode,
                    vec![],
                    false,
                    vec![],
                    global,
                    local,
                    &mut reject,
                ),
                QueueOp::WrongArity { buf } => exec(
                    Kernel::Fill,
                    vec![whole(buf), whole(buf)],
                    false,
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
                QueueOp::CopyRange {
                    dst,
                    dst_at,
                    src,
                    src_at,
                    len,
                } => {
                    let (dst, src) = (dst % n, src % n);
                    let dst_at = dst_at % (lens[dst] + 1);
                    let src_at = src_at % (lens[src] + 1);
                    let len = len % ((lens[dst] - dst_at).min(lens[src] - src_at) + 1);
                    let dst = Span {
                        buf: dst,
                        at: dst_at,
                        len,
                    };
                    let src = Span {
                        buf: src,
                        at: src_at,
                        len,
                    };
                    if dst.buf == src.buf && dst.at < src.at + src.len && src.at < dst.at + dst.len
                    {
                        reject(Rejection::CopyOverlap);
                    }
                    Command::CopyRange { dst, src }
                }
                QueueOp::FillRange {
                    buf,
                    at,
                    len,
                    value,
                    width,
                } => {
                    let buf = buf % n;
                    let (at, len) = clamp(lens[buf] * 4, at, len);
                    let width = fill_width(width);
                    if width == 8 || !at.is_multiple_of(width) || !len.is_multiple_of(width) {
                        reject(Rejection::InvalidFill);
                    }
                    Command::Fill {
                        buf,
                        at,
                        len,
                        value,
                        width,
                    }
                }
                QueueOp::Upload { buf, at, len, seed } => {
                    let buf = buf % n;
                    let (at, len) = clamp(lens[buf], at, len);
                    Command::Upload {
                        dst: Span { buf, at, len },
                        data: upload_data(seed, len),
                        owned: seed % 2 == 1,
                    }
                }
                QueueOp::UploadWrongSize { buf } => {
                    reject(Rejection::TransferSizeMismatch);
                    let dst = whole(buf);
                    Command::Upload {
                        dst,
                        data: upload_data(0, dst.len + 1),
                        owned: false,
                    }
                }
                QueueOp::Download { buf, at, len } => {
                    let buf = buf % n;
                    let (at, len) = clamp(lens[buf], at, len);
                    self.downloads.push(Expected::Pending);
                    Command::Download {
                        src: Span { buf, at, len },
                        host_len: len,
                        id: self.downloads.len() - 1,
                    }
                }
                QueueOp::DownloadWrongSize { buf } => {
                    reject(Rejection::TransferSizeMismatch);
                    let src = whole(buf);
                    self.downloads.push(Expected::Pending);
                    Command::Download {
                        src,
                        host_len: src.len + 1,
                        id: self.downloads.len() - 1,
                    }
                }
                QueueOp::DownloadTwice { buf } => {
                    let src = whole(buf);
                    self.downloads.push(Expected::Pending);
                    let first = Command::Download {
                        src,
                        host_len: src.len,
                        id: self.downloads.len() - 1,
                    };
                    commands.push(first.clone());
                    // The second recording is refused (not recorded); the
                    // first is, and fails with the batch.
                    reject(Rejection::DownloadReused);
                    first
                }
                QueueOp::FillView {
                    buf,
                    at,
                    value,
                    global,
                    local,
                } => {
                    let buf = buf % n;
                    let at = at % (lens[buf] + 1);
                    exec(
                        Kernel::Fill,
                        vec![Span {
                            buf,
                            at,
                            len: lens[buf] - at,
                        }],
                        true,
                        vec![value],
                        global,
                        local,
                        &mut reject,
                    )
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
            // Nothing runs; every signal and download of the batch fails,
            // in order.
            self.fail_signals(&commands);
            for command in &commands {
                if let Command::Download { id, .. } = *command {
                    self.downloads[id] = Expected::Rejected;
                }
            }
            return Plan {
                commands,
                rejection,
                fails: false,
            };
        }
        let failed_at = self.run(&commands);
        if let Some((index, failure)) = failed_at {
            self.fail_signals(&commands[index..]);
            for command in &commands[index..] {
                if let Command::Download { id, .. } = *command {
                    self.downloads[id] = Expected::Failed(failure);
                }
            }
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

    /// Runs commands in order; the index of the one that fails, if any,
    /// and how.
    pub(crate) fn run(&mut self, commands: &[Command]) -> Option<(usize, Failure)> {
        for (index, command) in commands.iter().enumerate() {
            match command {
                Command::Wait { signal, value } => match self.timeline(*signal) {
                    None => return Some((index, Failure::Wait)),
                    Some(timeline) => match timeline.wait(*value) {
                        WaitOutcome::Reached => {}
                        WaitOutcome::Failed { .. } => return Some((index, Failure::Wait)),
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
                Command::CopyRange { dst, src } => {
                    let data = self.buffers[src.buf][src.range()].to_vec();
                    self.buffers[dst.buf][dst.range()].copy_from_slice(&data);
                }
                Command::Fill {
                    buf,
                    at,
                    len,
                    value,
                    width,
                } => {
                    // As bytes: the pattern is the value's low `width`
                    // native-endian bytes (a `u8`, `u16` or `u32`).
                    let pattern: Vec<u8> = match width {
                        1 => vec![*value as u8],
                        2 => (*value as u16).to_ne_bytes().to_vec(),
                        _ => value.to_ne_bytes().to_vec(),
                    };
                    let buffer = &mut self.buffers[*buf];
                    let mut bytes: Vec<u8> = buffer.iter().flat_map(|e| e.to_ne_bytes()).collect();
                    for chunk in bytes[*at..*at + *len].chunks_exact_mut(*width) {
                        chunk.copy_from_slice(&pattern);
                    }
                    *buffer = bytes
                        .chunks_exact(4)
                        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                }
                Command::Upload { dst, data, .. } => {
                    self.buffers[dst.buf][dst.range()].copy_from_slice(data);
                }
                Command::Download { src, id, .. } => {
                    self.downloads[*id] =
                        Expected::Data(self.buffers[src.buf][src.range()].to_vec());
                }
                Command::Exec {
                    kernel,
                    args,
                    scalars,
                    params,
                    ..
                } => {
                    let global = params.global()[0] as usize;
                    if *kernel == Kernel::Explode || args.iter().any(|span| span.len < global) {
                        return Some((index, Failure::Kernel));
                    }
                    // Element `i` of argument `k`, as (buffer, index).
                    let at = |k: usize, i: usize| (args[k].buf, args[k].at + i);
                    for i in 0..global {
                        match kernel {
                            Kernel::Fill => {
                                let (b, j) = at(0, i);
                                self.buffers[b][j] = scalars[0];
                            }
                            Kernel::Increment => {
                                let ((s, si), (d, di)) = (at(0, i), at(1, i));
                                self.buffers[d][di] = self.buffers[s][si].wrapping_add(1);
                            }
                            Kernel::Add => {
                                let ((a, ai), (b, bi), (c, ci)) = (at(0, i), at(1, i), at(2, i));
                                self.buffers[c][ci] =
                                    self.buffers[a][ai].wrapping_add(self.buffers[b][bi]);
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
