//! Two CPU queues against a sequential interpreter.

use std::fmt::Write as _;

mod kernels;
mod model;
mod rig;

use std::time::{Duration, Instant};

use hwqueue::{Buffer, Error, HardwareQueue, MAX_SIGNAL_VALUE, TimelineSignal};

use crate::MUST_FINISH;
use crate::reader::Reader;
use crate::signal::*;
use kernels::*;
use model::*;
use rig::*;

/// A program for two CPU queues: buffers of `u32`, then steps in a global
/// order. See [`check_queue_program`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProgram {
    /// Queue 1 is a copy queue (it refuses `exec`) instead of a compute queue.
    pub copy_queue_1: bool,
    /// Element counts of the buffers (1 to 4 buffers; an empty list means one
    /// buffer of 1). Buffer indices in ops are taken modulo this length.
    pub buffer_lens: Vec<usize>,
    /// What happens, in order.
    pub steps: Vec<Step>,
}

/// One step of a [`QueueProgram`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Record `ops` on queue `queue % 2`, then `submit`.
    Batch {
        /// Which queue.
        queue: usize,
        /// What to record.
        ops: Vec<QueueOp>,
    },
    /// `synchronize` queue `queue % 2`.
    Synchronize {
        /// Which queue.
        queue: usize,
    },
}

/// A command in a [`Step::Batch`]. Buffer indices are taken modulo the
/// number of buffers. An `exec` of `global` items in groups of `local`
/// fails at run time (every work-group panics before writing) when a
/// buffer (or view) holds fewer than `global` elements.
///
/// Ranges are clamped so that every view is in range: an offset `at` into
/// a buffer of `size` elements (or bytes, for [`FillRange`](Self::FillRange))
/// is taken modulo `size + 1`, and a length modulo what is left after it
/// plus one (so empty views occur).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOp {
    /// `buf[i] = value` for `i < global`.
    Fill {
        /// Buffer.
        buf: usize,
        /// Value written.
        value: u32,
        /// Global size.
        global: u32,
        /// Local size.
        local: u32,
    },
    /// `dst[i] = src[i] + 1` (wrapping) for `i < global`.
    Increment {
        /// Source buffer.
        src: usize,
        /// Destination buffer.
        dst: usize,
        /// Global size.
        global: u32,
        /// Local size.
        local: u32,
    },
    /// `c[i] = a[i] + b[i]` (wrapping) for `i < global`.
    Add {
        /// First operand.
        a: usize,
        /// Second operand.
        b: usize,
        /// Result.
        c: usize,
        /// Global size.
        global: u32,
        /// Local size.
        local: u32,
    },
    /// A kernel that panics in every work-group.
    Explode {
        /// Global size.
        global: u32,
        /// Local size.
        local: u32,
    },
    /// `fill` with two buffers instead of one: rejects the batch.
    WrongArity {
        /// Buffer passed twice.
        buf: usize,
    },
    /// `copy(dst, src)` of whole buffers: rejects the batch when the sizes
    /// differ (`CopySizeMismatch`), or when both are one buffer
    /// (`CopyOverlap`).
    Copy {
        /// Destination.
        dst: usize,
        /// Source.
        src: usize,
    },
    /// `copy` between views: `dst[dst_at..][..len] = src[src_at..][..len]`
    /// (elements). `len` is clamped to what is left of both buffers, so the
    /// lengths always match; overlapping non-empty ranges of one buffer
    /// reject the batch (`CopyOverlap`).
    CopyRange {
        /// Destination buffer.
        dst: usize,
        /// First destination element.
        dst_at: usize,
        /// Source buffer.
        src: usize,
        /// First source element.
        src_at: usize,
        /// Elements copied.
        len: usize,
    },
    /// `fill` of the view of *bytes* `at..at + len` of `buf` with the low
    /// `width` bytes of `value`: a `u8`, `u16` or `u32` pattern for a width
    /// of 1, 2 or 4; any other width is a `u64` pattern (8 bytes), which the
    /// core refuses. A view whose offset or length is not a multiple of the
    /// width, or a `u64` pattern, rejects the batch (`InvalidFill`).
    FillRange {
        /// Buffer.
        buf: usize,
        /// First byte.
        at: usize,
        /// Bytes filled.
        len: usize,
        /// The pattern (truncated to the width).
        value: u32,
        /// The pattern's width in bytes: 1, 2, 4 (8 otherwise).
        width: u8,
    },
    /// `upload` of `len` deterministic elements (made from `seed`) into
    /// `buf[at..][..len]`; an odd `seed` uses `upload_vec` instead.
    Upload {
        /// Buffer.
        buf: usize,
        /// First element.
        at: usize,
        /// Elements uploaded.
        len: usize,
        /// What the data is made from.
        seed: u32,
    },
    /// `upload` of one element more than `buf` holds: rejects the batch
    /// (`TransferSizeMismatch`).
    UploadWrongSize {
        /// Buffer.
        buf: usize,
    },
    /// `download` of `buf[at..][..len]` into a `Download<u32>` of `len`
    /// elements. After the last step it must hold what the model's buffer
    /// held at that point of the sequential order, or fail: with
    /// `BatchRejected` when its batch was rejected, with the error of the
    /// command that failed before it in its batch otherwise.
    Download {
        /// Buffer.
        buf: usize,
        /// First element.
        at: usize,
        /// Elements downloaded.
        len: usize,
    },
    /// `download` of all of `buf` into a `Download<u32>` one element
    /// longer: rejects the batch (`TransferSizeMismatch`), and the download
    /// fails.
    DownloadWrongSize {
        /// Buffer.
        buf: usize,
    },
    /// `download` of all of `buf`, then the same `Download` recorded again:
    /// rejects the batch (`DownloadReused`), and the download fails.
    DownloadTwice {
        /// Buffer.
        buf: usize,
    },
    /// The fill kernel through `exec_views` on the view of `buf` from
    /// element `at` to its end: `buf[at + i] = value` for `i < global`. A
    /// view whose byte offset is not a multiple of the CPU's
    /// `view_alignment` (16) rejects the batch (`ViewMisaligned`, after the
    /// checks every `exec` makes); one of fewer than `global` elements
    /// fails at run time.
    FillView {
        /// Buffer.
        buf: usize,
        /// First element of the view.
        at: usize,
        /// Value written.
        value: u32,
        /// Global size.
        global: u32,
        /// Local size.
        local: u32,
    },
    /// `memory_barrier()`.
    Barrier,
    /// `signal` this queue's own user signal to `value`.
    Signal {
        /// The value.
        value: u64,
    },
    /// `signal` with a value past the range: rejects the batch.
    SignalPastTheRange,
    /// `wait` on user signal `signal % 2` for a value at most `value`: the
    /// harness lowers it to one that work before it in the global order
    /// surely sets (so the wait cannot block forever or race a failure).
    Wait {
        /// Whose user signal.
        signal: usize,
        /// The most it waits for.
        value: u64,
    },
    /// `wait` on a signal the host failed: fails the batch at run time.
    WaitFailed,
    /// `wait` with a value past the range: rejects the batch.
    WaitPastTheRange,
}

/// Runs `program` on two real CPU queues and on the sequential model,
/// comparing the result of every `submit` and `synchronize` (which batches
/// are rejected, and why; which failures are reported), and at the end the
/// buffer contents, what every download received (or why it failed), and
/// every signal's value and failed values.
///
/// The harness adds what keeps the real run equivalent to the sequential
/// one without any timing assumption: each batch ends by signalling its
/// queue's progress signal, a batch that touches buffers of a batch that
/// completed on the other queue first waits for that batch's progress
/// value, and after a batch that the model says fails while running both
/// queues are synchronized (so the failure is reported at a known point).
///
/// # Panics
/// On the first difference.
pub fn check_queue_program(program: &QueueProgram) {
    quiet_expected_panics();
    let lens: Vec<usize> = if program.buffer_lens.is_empty() {
        vec![1]
    } else {
        program
            .buffer_lens
            .iter()
            .take(4)
            .map(|len| (*len).clamp(1, 64))
            .collect()
    };
    let initial: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(b, len)| (0..*len).map(|i| (b * 100 + i) as u32).collect())
        .collect();
    let mut model = QueueModel {
        copy_queue_1: program.copy_queue_1,
        buffers: initial.clone(),
        user: Default::default(),
        progress: Default::default(),
        batches: [0; 2],
        unreported: [false; 2],
        completed: Vec::new(),
        downloads: Vec::new(),
    };
    let mut rig = Rig::new(program, &initial);
    let mut log = String::new();

    let synchronize = |rig: &mut Rig, model: &mut QueueModel, queue: usize, log: &String| {
        // Every batch ends by signalling (or failing, in queue order) its
        // progress value, so once the last one is settled the queue is
        // idle. A bounded wait turns a hang (a lost wake-up in the worker)
        // into a reported mismatch rather than a stuck fuzzer; a wait that
        // returns only at its deadline slept through its wake-up (it then
        // re-checks and finds the value), which is the same bug on the host.
        let last = model.batches[queue];
        let start = Instant::now();
        let settled = rig.progress[queue].wait(last, MUST_FINISH);
        if matches!(settled, Err(Error::Timeout { .. })) || start.elapsed() >= MUST_FINISH {
            panic!(
                "queue {queue}: progress {last} not settled within {MUST_FINISH:?} \
                 ({settled:?}): a hang or a lost wake-up\n{log}"
            );
        }
        let expect_failure = model.synchronize(queue);
        match rig.queues[queue].synchronize() {
            Ok(()) if !expect_failure => {}
            Err(Error::QueueFailed { .. }) if expect_failure => {}
            other => panic!(
                "synchronize queue {queue}: got {other:?}, the model expects {}\n{log}",
                if expect_failure { "QueueFailed" } else { "Ok" }
            ),
        }
    };

    for (index, step) in program.steps.iter().enumerate() {
        match step {
            Step::Batch { queue, ops } => {
                let queue = queue % 2;
                let plan = model.plan(queue, ops);
                let _ = writeln!(log, "step {index}: queue {queue} {plan:?}");
                rig.record(queue, &plan.commands);
                let result = rig.queues[queue].submit();
                match (&result, plan.rejection) {
                    (Ok(()), None) => {}
                    (Err(Error::BatchRejected { cause }), Some(why)) if why.matches(cause) => {}
                    _ => panic!(
                        "step {index}: submit on queue {queue} gave {result:?}, the model expects {:?}\n{log}",
                        plan.rejection
                    ),
                }
                if plan.fails {
                    for queue in 0..2 {
                        synchronize(&mut rig, &mut model, queue, &log);
                    }
                }
            }
            Step::Synchronize { queue } => {
                let _ = writeln!(log, "step {index}: synchronize {}", queue % 2);
                synchronize(&mut rig, &mut model, queue % 2, &log);
            }
        }
    }
    for queue in 0..2 {
        synchronize(&mut rig, &mut model, queue, &log);
    }
    for (b, buffer) in rig.buffers.iter().enumerate() {
        let data = buffer.to_vec::<u32>().expect("read");
        assert_eq!(data, model.buffers[b], "buffer {b}\n{log}");
    }
    // Every queue is idle, so every download settled: no waiting.
    assert_eq!(
        rig.downloads.len(),
        model.downloads.len(),
        "downloads\n{log}"
    );
    for (id, (download, expected)) in rig.downloads.iter().zip(&model.downloads).enumerate() {
        let got = download.take(Duration::ZERO);
        assert!(
            expected.matches(&got),
            "download {id}: got {got:?}, the model expects {expected:?}\n{log}"
        );
    }
    let timelines = [
        (&rig.user[0], &model.user[0], "user 0"),
        (&rig.user[1], &model.user[1], "user 1"),
        (&rig.progress[0], &model.progress[0], "progress 0"),
        (&rig.progress[1], &model.progress[1], "progress 1"),
    ];
    for (signal, expected, name) in timelines {
        assert_eq!(signal.value(), expected.value, "{name} value\n{log}");
        // Every value up to just past the end value and the failed mark, and
        // the edges of the range. Failures past the end value were above
        // the value when they came, so these answers are deterministic.
        let mark = expected.failed_upto.min(MAX_SIGNAL_VALUE);
        let probes = (0..=expected.value.max(mark.min(64)) + 1).chain([
            mark,
            mark + 1,
            MAX_SIGNAL_VALUE,
            MAX_SIGNAL_VALUE + 1,
        ]);
        for target in probes {
            let observed = match observed_wait_any(signal.wait(target, Duration::ZERO)) {
                WaitOutcome::Failed { current, .. } => WaitOutcome::Failed { current, cause: 0 },
                other => other,
            };
            assert_eq!(
                observed,
                expected.wait(target),
                "{name} probe {target}\n{log}"
            );
        }
    }
}

/// As [`observed_wait`], for failures with any cause.
pub(crate) fn observed_wait_any(result: hwqueue::Result<()>) -> WaitOutcome {
    match result {
        Err(Error::SignalFailed { current, .. }) => WaitOutcome::Failed { current, cause: 0 },
        other => observed_wait(other),
    }
}

/// Decodes a [`QueueProgram`] from `data`.
pub fn decode_queue_program(data: &[u8]) -> QueueProgram {
    let mut reader = Reader { data };
    let flags = reader.byte();
    let buffer_count = 1 + usize::from(reader.byte() % 4);
    let buffer_lens = (0..buffer_count)
        .map(|_| 1 + usize::from(reader.byte() % 8))
        .collect();
    let mut steps = Vec::new();
    while !reader.is_empty() && steps.len() < 24 {
        let tag = reader.byte();
        let queue = usize::from((tag >> 3) & 1);
        if tag % 8 == 7 {
            steps.push(Step::Synchronize { queue });
            continue;
        }
        let count = 1 + usize::from((tag >> 4) % 6);
        let ops = (0..count).map(|_| decode_op(&mut reader)).collect();
        steps.push(Step::Batch { queue, ops });
    }
    QueueProgram {
        copy_queue_1: flags & 1 != 0,
        buffer_lens,
        steps,
    }
}

/// Work sizes: mostly valid (1 or 2 groups of 1 to 4), sometimes anything
/// small (zero, not a multiple).
pub(crate) fn decode_sizes(reader: &mut Reader<'_>) -> (u32, u32) {
    let byte = reader.byte();
    if byte & 0x80 == 0 {
        let local = 1 + u32::from(byte % 4);
        (local * (1 + u32::from((byte >> 2) % 2)), local)
    } else {
        (u32::from(byte % 9), u32::from((byte >> 4) % 5))
    }
}

/// Decodes one [`QueueOp`]: a tag byte (modulo 18), then its fields.
/// Element offsets and lengths are read modulo 9 (buffers hold at most 8
/// elements), byte ones modulo 33; the model clamps them further.
pub(crate) fn decode_op(reader: &mut Reader<'_>) -> QueueOp {
    let tag = reader.byte();
    let index = |reader: &mut Reader<'_>| usize::from(reader.byte() % 4);
    let element = |reader: &mut Reader<'_>| usize::from(reader.byte() % 9);
    match tag % 18 {
        0 | 1 => {
            let buf = index(reader);
            let value = u32::from(reader.byte());
            let (global, local) = decode_sizes(reader);
            QueueOp::Fill {
                buf,
                value,
                global,
                local,
            }
        }
        2 => {
            let (src, dst) = (index(reader), index(reader));
            let (global, local) = decode_sizes(reader);
            QueueOp::Increment {
                src,
                dst,
                global,
                local,
            }
        }
        3 => {
            let (a, b, c) = (index(reader), index(reader), index(reader));
            let (global, local) = decode_sizes(reader);
            QueueOp::Add {
                a,
                b,
                c,
                global,
                local,
            }
        }
        4 => {
            let (global, local) = decode_sizes(reader);
            QueueOp::Explode { global, local }
        }
        5 => QueueOp::WrongArity { buf: index(reader) },
        6 | 7 => QueueOp::Copy {
            dst: index(reader),
            src: index(reader),
        },
        8 => QueueOp::Barrier,
        9 => QueueOp::Signal {
            value: u64::from(reader.byte() % 16),
        },
        10 => {
            let byte = reader.byte();
            QueueOp::Wait {
                signal: usize::from(byte & 1),
                value: u64::from((byte >> 1) % 16),
            }
        }
        11 => match reader.byte() % 3 {
            0 => QueueOp::WaitFailed,
            1 => QueueOp::SignalPastTheRange,
            _ => QueueOp::WaitPastTheRange,
        },
        12 => QueueOp::CopyRange {
            dst: index(reader),
            dst_at: element(reader),
            src: index(reader),
            src_at: element(reader),
            len: element(reader),
        },
        13 => {
            let buf = index(reader);
            let (at, len) = (
                usize::from(reader.byte() % 33),
                usize::from(reader.byte() % 33),
            );
            let width = [1, 2, 4, 8][usize::from(reader.byte() % 4)];
            let value =
                u32::from_le_bytes([reader.byte(), reader.byte(), reader.byte(), reader.byte()]);
            QueueOp::FillRange {
                buf,
                at,
                len,
                value,
                width,
            }
        }
        14 => QueueOp::Upload {
            buf: index(reader),
            at: element(reader),
            len: element(reader),
            seed: u32::from(reader.byte()),
        },
        15 => QueueOp::Download {
            buf: index(reader),
            at: element(reader),
            len: element(reader),
        },
        16 => {
            let (buf, at) = (index(reader), element(reader));
            let value = u32::from(reader.byte());
            let (global, local) = decode_sizes(reader);
            QueueOp::FillView {
                buf,
                at,
                value,
                global,
                local,
            }
        }
        _ => {
            let buf = index(reader);
            match reader.byte() % 3 {
                0 => QueueOp::UploadWrongSize { buf },
                1 => QueueOp::DownloadWrongSize { buf },
                _ => QueueOp::DownloadTwice { buf },
            }
        }
    }
}

/// Decodes a queue program from `data` and runs [`check_queue_program`].
///
/// # Panics
/// On a difference from the model.
pub fn cpu_queue(data: &[u8]) {
    check_queue_program(&decode_queue_program(data));
}
