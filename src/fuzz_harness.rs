//! Harnesses shared by the fuzz targets in `fuzz/`, the test that replays
//! their corpora (`tests/fuzz_replay.rs`) and the proptest model tests
//! (`tests/queue_model.rs`, `tests/signal_model.rs`). Not part of the API.
//!
//! Each harness decodes a small program from bytes (or takes one built by
//! proptest), runs it against the real code and against a tiny sequential
//! reference model, and panics on the first difference. Programs are built
//! so that nothing can block forever: every wait is on a value that work
//! submitted earlier sets (or on a signal already failed), and
//! `synchronize` is only called once every wait submitted can finish.
//!
//! | harness | fuzz target | what it checks |
//! |---------|-------------|----------------|
//! | [`device_spec`] | `device_spec` | parsing never panics; a parsed spec prints and re-parses to itself; acceptance matches a reference predicate |
//! | [`cpu_signal`] | `cpu_signal` | [`SignalOp`] sequences on a `CpuSignal` against a running max and failed ranges |
//! | [`cpu_queue`] | `cpu_queue` | [`QueueProgram`]s on two CPU queues against a sequential interpreter |
//! | [`event_ring`] | `event_ring` | [`RingOp`] sequences on an `EventRing` with a mock event against the records, a running max and failed ranges |

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::cpu::{CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal, KernelArgs, WorkGroup};
use crate::{
    Buffer, Device, DeviceSpec, Error, ExecParams, HardwareQueue, MAX_SIGNAL_VALUE, QueueFactory,
    SPEC_NAMES, SpecName, TimelineSignal, Timeout,
};

/// How long a wait that the model says must finish may block before the
/// harness calls it a mismatch (a hang would otherwise stall the fuzzer).
const MUST_FINISH: Duration = Duration::from_secs(10);

/// Reads bytes as a stream of small choices; past the end every read is 0.
struct Reader<'a> {
    data: &'a [u8],
}

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

// ---------------------------------------------------------------------------
// Device specs
// ---------------------------------------------------------------------------

/// The names of a build with every backend compiled in, so the fuzzer also
/// reaches the success path for `cuda`.
const ALL_COMPILED: &[SpecName] = &[
    SpecName {
        id: "cpu",
        aliases: &["host"],
        missing_feature: None,
    },
    SpecName {
        id: "cuda",
        aliases: &["gpu", "nvidia"],
        missing_feature: None,
    },
];

/// The reference predicate: what `input` should parse to against `names`
/// (`Err(true)`: a known backend that is not compiled in; `Err(false)`: not
/// a spec).
fn reference_spec(input: &str, names: &[SpecName]) -> Result<(&'static str, u32), bool> {
    let trimmed = input.trim();
    let (name, ordinal) = match trimmed.find(':') {
        Some(colon) => (&trimmed[..colon], Some(&trimmed[colon + 1..])),
        None => (trimmed, None),
    };
    let known = names
        .iter()
        .find(|n| {
            std::iter::once(&n.id)
                .chain(n.aliases)
                .any(|candidate| candidate.eq_ignore_ascii_case(name))
        })
        .ok_or(false)?;
    let ordinal = match ordinal {
        None => 0,
        Some(digits) => {
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return Err(false);
            }
            // Leading zeros are fine; the value must fit in a u32.
            let significant = digits.trim_start_matches('0');
            if significant.len() > 10 {
                return Err(false);
            }
            let value: u64 = if significant.is_empty() {
                0
            } else {
                significant.parse().map_err(|_| false)?
            };
            u32::try_from(value).map_err(|_| false)?
        }
    };
    if known.missing_feature.is_some() {
        return Err(true);
    }
    Ok((known.id, ordinal))
}

/// Parses `data` (as UTF-8, lossily) as a [`DeviceSpec`], against this
/// build's names and against a build with every backend compiled in.
///
/// # Panics
/// If parsing panics, if a parsed spec does not print as
/// `backend:ordinal` and re-parse to itself, or if acceptance differs from
/// the reference predicate.
pub fn device_spec(data: &[u8]) {
    let input = String::from_utf8_lossy(data);
    for names in [SPEC_NAMES, ALL_COMPILED] {
        let parsed = DeviceSpec::parse_with(&input, names);
        let expected = reference_spec(&input, names);
        match (&parsed, expected) {
            (Ok(spec), Ok((backend, ordinal))) => {
                assert_eq!(
                    (spec.backend(), spec.ordinal()),
                    (backend, ordinal),
                    "{input:?}"
                );
                let printed = spec.to_string();
                assert_eq!(printed, format!("{backend}:{ordinal}"), "{input:?}");
                let reparsed = DeviceSpec::parse_with(&printed, names)
                    .unwrap_or_else(|e| panic!("{input:?} printed as {printed:?}: {e}"));
                assert_eq!(reparsed, *spec, "{input:?} printed as {printed:?}");
            }
            (Err(Error::BackendNotCompiled { .. }), Err(true)) => {}
            (Err(Error::InvalidDeviceSpec { .. }), Err(false)) => {}
            (parsed, expected) => {
                panic!("{input:?}: parsed {parsed:?}, the reference says {expected:?}")
            }
        }
        if let Err(error) = &parsed {
            // Every error says how to fix it.
            assert!(!error.to_string().is_empty());
        }
    }
}

// ---------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------

/// One operation on a `CpuSignal`, for [`check_signal_ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// `set(v)`.
    Set(u64),
    /// `wait(v, ..)`: a zero timeout where the model says it would block,
    /// a bounded one otherwise (so a wrong implementation fails, not hangs).
    Wait(u64),
    /// `is_reached(v)`.
    IsReached(u64),
    /// `value()`.
    Value,
    /// `fail(upto, cause)`, with a cause numbered by its position.
    Fail(u64),
    /// `wait` on a target past [`MAX_SIGNAL_VALUE`].
    WaitPastTheRange,
}

/// The reference model of a timeline signal: a running max, and the
/// failures recorded while they were above it.
#[derive(Debug, Default)]
struct SignalModel {
    value: u64,
    /// `(upto, cause)`, for every failure that was above the value when it
    /// came; the first cause for an `upto` wins.
    failures: Vec<(u64, usize)>,
}

/// What a non-blocking wait returns, per the model.
#[derive(Debug, PartialEq, Eq)]
enum WaitOutcome {
    Reached,
    Failed { current: u64, cause: usize },
    Timeout { current: u64 },
    OutOfRange,
}

impl SignalModel {
    fn set(&mut self, value: u64) {
        self.value = self.value.max(value);
    }

    fn fail(&mut self, upto: u64, cause: usize) {
        if upto > self.value && !self.failures.iter().any(|(u, _)| *u == upto) {
            self.failures.push((upto, cause));
        }
    }

    fn wait(&self, target: u64) -> WaitOutcome {
        if target <= self.value {
            return WaitOutcome::Reached;
        }
        if target > MAX_SIGNAL_VALUE {
            return WaitOutcome::OutOfRange;
        }
        // The cause of the narrowest failure covering the target.
        match self
            .failures
            .iter()
            .filter(|(upto, _)| *upto >= target)
            .min_by_key(|(upto, _)| *upto)
        {
            Some(&(_, cause)) => WaitOutcome::Failed {
                current: self.value,
                cause,
            },
            None => WaitOutcome::Timeout {
                current: self.value,
            },
        }
    }
}

fn cause(id: usize) -> Error {
    Error::Backend {
        backend: "model",
        message: format!("cause {id}"),
    }
}

fn observed_wait(result: crate::Result<()>) -> WaitOutcome {
    match result {
        Ok(()) => WaitOutcome::Reached,
        Err(Error::SignalFailed { current, cause, .. }) => match &*cause {
            Error::Backend { message, .. } => WaitOutcome::Failed {
                current,
                cause: message
                    .strip_prefix("cause ")
                    .and_then(|id| id.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected cause {message:?}")),
            },
            other => panic!("unexpected cause {other:?}"),
        },
        Err(Error::Timeout { current, .. }) => WaitOutcome::Timeout { current },
        Err(Error::SignalValueOutOfRange { .. }) => WaitOutcome::OutOfRange,
        Err(other) => panic!("unexpected wait error {other:?}"),
    }
}

/// Runs `ops` on a new `CpuSignal` at `initial` and on the model, comparing
/// every result.
///
/// # Panics
/// On the first difference, naming the step.
pub fn check_signal_ops(initial: u64, ops: &[SignalOp]) {
    let signal = CpuSignal::new(initial);
    let mut model = SignalModel {
        value: initial,
        ..SignalModel::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let context = || format!("step {step} ({op:?}) of {ops:?} from {initial}");
        match *op {
            SignalOp::Set(value) => {
                signal.set(value);
                model.set(value);
                assert_eq!(signal.value(), model.value, "{}", context());
            }
            SignalOp::Wait(target) => {
                let expected = model.wait(target);
                let timeout = match expected {
                    WaitOutcome::Timeout { .. } => Duration::ZERO,
                    _ => MUST_FINISH,
                };
                let observed = observed_wait(signal.wait(target, timeout));
                assert_eq!(observed, expected, "{}", context());
            }
            SignalOp::IsReached(target) => {
                assert_eq!(
                    signal.is_reached(target),
                    target <= model.value,
                    "{}",
                    context()
                );
            }
            SignalOp::Value => assert_eq!(signal.value(), model.value, "{}", context()),
            SignalOp::Fail(upto) => {
                signal.fail(upto, cause(step));
                model.fail(upto, step);
                assert_eq!(signal.value(), model.value, "{}", context());
            }
            SignalOp::WaitPastTheRange => {
                let observed = observed_wait(signal.wait(MAX_SIGNAL_VALUE + 1, Timeout::Forever));
                assert_eq!(observed, WaitOutcome::OutOfRange, "{}", context());
            }
        }
    }
    // Every value the model knows about answers as it says.
    let mut probes: Vec<u64> = ops
        .iter()
        .filter_map(|op| match *op {
            SignalOp::Set(v) | SignalOp::Wait(v) | SignalOp::IsReached(v) | SignalOp::Fail(v) => {
                Some(v)
            }
            _ => None,
        })
        .flat_map(|v| [v, v.saturating_add(1)])
        .filter(|v| *v <= MAX_SIGNAL_VALUE)
        .collect();
    probes.extend([0, initial, model.value.saturating_add(1)]);
    for target in probes {
        let observed = observed_wait(signal.wait(target, Duration::ZERO));
        assert_eq!(
            observed,
            model.wait(target),
            "final probe {target} of {ops:?}"
        );
    }
}

/// Decodes a signal program from `data` and runs [`check_signal_ops`].
/// Values are small, so sets, waits and failures collide.
///
/// # Panics
/// On a difference from the model.
pub fn cpu_signal(data: &[u8]) {
    let mut reader = Reader { data };
    let initial = u64::from(reader.byte() % 8);
    let mut ops = Vec::new();
    while !reader.is_empty() && ops.len() < 64 {
        let tag = reader.byte();
        let value = u64::from(reader.byte() % 24);
        ops.push(match tag % 6 {
            0 | 1 => SignalOp::Set(value),
            2 => SignalOp::Wait(value),
            3 => SignalOp::IsReached(value),
            4 => SignalOp::Fail(value),
            _ if tag & 0x80 != 0 => SignalOp::WaitPastTheRange,
            _ => SignalOp::Value,
        });
    }
    check_signal_ops(initial, &ops);
}

// ---------------------------------------------------------------------------
// Queues
// ---------------------------------------------------------------------------

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
/// buffer holds fewer than `global` elements.
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
    /// `copy(dst, src)`: rejects the batch when the sizes differ.
    Copy {
        /// Destination.
        dst: usize,
        /// Source.
        src: usize,
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

/// A kernel of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Fill,
    Increment,
    Add,
    Explode,
}

/// How the harness's kernels start their panic messages: these panics are
/// expected (the queue turns them into a failed batch), so the hook from
/// [`quiet_expected_panics`] lets them unwind without a report, and without
/// the abort that libFuzzer's hook turns every panic into.
const EXPECTED_PANIC: &str = "expected kernel failure";

/// Installs, once per process, a panic hook that passes the harness
/// kernels' panics over and hands every other panic to the hook before it.
fn quiet_expected_panics() {
    // Test-only code, never run under loom: a plain `Once` is fine here.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if !message.is_some_and(|message| message.starts_with(EXPECTED_PANIC)) {
                previous(info);
            }
        }));
    });
}

/// Panics (failing the `exec`) unless every buffer holds the global size.
fn check_bounds(group: &WorkGroup, args: &KernelArgs<'_>) -> usize {
    let global = group.global_size()[0];
    for index in 0..args.buffer_count() {
        let len = args.buffer(index).len::<u32>();
        if global > len {
            panic!(
                "{EXPECTED_PANIC}: global size {global} is past buffer {index} of {len} elements"
            );
        }
    }
    global
}

fn fill_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let value: u32 = args.scalar(0);
    let out = args.buffer(0).as_ptr::<u32>();
    for i in group.global_range(0) {
        // SAFETY: `i` is below the global size, which is within the buffer
        // (checked above); work-groups cover disjoint ranges.
        unsafe { out.add(i).write(value) };
    }
}

fn increment_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let (src, dst) = (
        args.buffer(0).as_ptr::<u32>(),
        args.buffer(1).as_ptr::<u32>(),
    );
    for i in group.global_range(0) {
        // SAFETY: `i` is within both buffers (checked above); element `i`
        // is touched by this work-group alone, read before it is written,
        // with raw pointers, so `src == dst` is fine.
        unsafe { dst.add(i).write(src.add(i).read().wrapping_add(1)) };
    }
}

fn add_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let [a, b, c] = [0, 1, 2].map(|index| args.buffer(index).as_ptr::<u32>());
    for i in group.global_range(0) {
        // SAFETY: as in `increment_kernel`: in bounds, one work-group per
        // element, raw reads before the raw write, so aliasing is fine.
        unsafe {
            c.add(i)
                .write(a.add(i).read().wrapping_add(b.add(i).read()))
        };
    }
}

fn explode_kernel(group: &WorkGroup, _args: &KernelArgs<'_>) {
    panic!("{EXPECTED_PANIC}: explode in work-group {:?}", group.id());
}

/// Which signal a command names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SignalName {
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
enum Command {
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
struct TimelineModel {
    value: u64,
    failed_upto: u64,
    poisoned: Vec<(u64, u64)>,
}

impl TimelineModel {
    fn set(&mut self, value: u64) {
        self.value = self.value.max(value);
    }

    fn fail(&mut self, upto: u64) {
        if upto > self.value {
            self.poisoned.push((self.value, upto));
            self.failed_upto = self.failed_upto.max(upto);
        }
    }

    /// The largest value `<= wanted` that is reached and was never
    /// poisoned.
    fn safe_target(&self, wanted: u64) -> u64 {
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

    fn wait(&self, target: u64) -> WaitOutcome {
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
enum Rejection {
    UnsupportedCommand,
    InvalidExecParams,
    InvalidArguments,
    CopySizeMismatch,
    SignalValueOutOfRange,
}

impl Rejection {
    fn matches(self, error: &Error) -> bool {
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
struct Completed {
    queue: usize,
    progress: u64,
    reads: u64,
    writes: u64,
}

/// The sequential interpreter: runs batches one after the other in the
/// global order, which is what the two real queues must be equivalent to.
#[derive(Debug)]
struct QueueModel {
    copy_queue_1: bool,
    buffers: Vec<Vec<u32>>,
    user: [TimelineModel; 2],
    progress: [TimelineModel; 2],
    batches: [u64; 2],
    /// A run-time failure not yet reported to the queue's owner.
    unreported: [bool; 2],
    completed: Vec<Completed>,
}

/// What the model predicts for one batch.
#[derive(Debug)]
struct Plan {
    commands: Vec<Command>,
    rejection: Option<Rejection>,
    /// The batch fails while running: the queue must be synchronized.
    fails: bool,
}

fn buffer_sets(op: &QueueOp, n: usize) -> (u64, u64) {
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
    fn lens(&self) -> Vec<usize> {
        self.buffers.iter().map(Vec::len).collect()
    }

    /// Turns `ops` for queue `queue` into commands and predicts their
    /// outcome, updating the model as if the batch ran.
    fn plan(&mut self, queue: usize, ops: &[QueueOp]) -> Plan {
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
                    if lens[dst % n] != lens[src % n] {
                        reject(Rejection::CopySizeMismatch);
                    }
                    Command::Copy {
                        dst: dst % n,
                        src: src % n,
                    }
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

    fn timeline(&mut self, signal: SignalName) -> Option<&mut TimelineModel> {
        match signal {
            SignalName::User(q) => Some(&mut self.user[q]),
            SignalName::Progress(q) => Some(&mut self.progress[q]),
            SignalName::Failed => None,
        }
    }

    fn fail_signals(&mut self, commands: &[Command]) {
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
    fn run(&mut self, commands: &[Command]) -> Option<usize> {
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
    fn synchronize(&mut self, queue: usize) -> bool {
        self.completed.retain(|c| c.queue != queue);
        std::mem::take(&mut self.unreported[queue])
    }
}

/// The real side: a device, two queues, the buffers and signals.
struct Rig {
    queues: [CpuQueue; 2],
    buffers: Vec<CpuBuffer>,
    user: [CpuSignal; 2],
    progress: [CpuSignal; 2],
    failed: CpuSignal,
    programs: [CpuProgram; 4],
}

impl Rig {
    fn new(program: &QueueProgram, initial: &[Vec<u32>]) -> Self {
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
            Error::Backend {
                backend: "model",
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

    fn signal(&self, name: SignalName) -> &CpuSignal {
        match name {
            SignalName::User(q) => &self.user[q],
            SignalName::Progress(q) => &self.progress[q],
            SignalName::Failed => &self.failed,
        }
    }

    fn record(&mut self, queue: usize, commands: &[Command]) {
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
                    let scalars: Vec<crate::Scalar> = scalars.iter().map(|s| (*s).into()).collect();
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

/// Runs `program` on two real CPU queues and on the sequential model,
/// comparing the result of every `submit` and `synchronize` (which batches
/// are rejected, and why; which failures are reported), and at the end the
/// buffer contents and every signal's value and failed values.
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
fn observed_wait_any(result: crate::Result<()>) -> WaitOutcome {
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
fn decode_sizes(reader: &mut Reader<'_>) -> (u32, u32) {
    let byte = reader.byte();
    if byte & 0x80 == 0 {
        let local = 1 + u32::from(byte % 4);
        (local * (1 + u32::from((byte >> 2) % 2)), local)
    } else {
        (u32::from(byte % 9), u32::from((byte >> 4) % 5))
    }
}

fn decode_op(reader: &mut Reader<'_>) -> QueueOp {
    let tag = reader.byte();
    let index = |reader: &mut Reader<'_>| usize::from(reader.byte() % 4);
    match tag % 12 {
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
        _ => match reader.byte() % 3 {
            0 => QueueOp::WaitFailed,
            1 => QueueOp::SignalPastTheRange,
            _ => QueueOp::WaitPastTheRange,
        },
    }
}

/// Decodes a queue program from `data` and runs [`check_queue_program`].
///
/// # Panics
/// On a difference from the model.
pub fn cpu_queue(data: &[u8]) {
    check_queue_program(&decode_queue_program(data));
}

// ---------------------------------------------------------------------------
// Event rings
// ---------------------------------------------------------------------------

/// One operation on an [`EventRing`](crate::ring::EventRing), for
/// [`check_ring_ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// `record(v)`: a new record, nothing (a value reached already), or,
    /// with every slot pending, the device runs up to the oldest record
    /// first.
    Record(u64),
    /// `record` past [`MAX_SIGNAL_VALUE`]: an error, nothing recorded.
    RecordPastTheRange,
    /// The device completes the `i % n`th of the `n` records not completed
    /// yet, in record order (pending or passed by the value).
    Complete(usize),
    /// `set(v)` from the host.
    Set(u64),
    /// `fail(upto, cause)`, with a cause numbered by its position.
    Fail(u64),
    /// `value()`.
    Value,
    /// `is_reached(v)`.
    IsReached(u64),
    /// `wait(v)` with a zero timeout: never blocks.
    Poll(u64),
    /// `wait(v, Forever)` on a value the model says is reached, completed
    /// or set (the target is lowered to the value): must return at once.
    WaitReached(u64),
    /// `dependency(v)`: which event a queue would wait for.
    Dependency(u64),
    /// `wait_dependency(v)` with a zero timeout.
    PollDependency(u64),
}

/// The device behind the harness's events: per event, the generation of
/// its latest recording and the latest generation completed. Test-only
/// code, never run under loom: plain `std` locks are fine here.
#[derive(Debug, Default)]
struct RingDevice {
    /// `(recorded, completed)` generations, per event id.
    events: Vec<(u64, u64)>,
}

type SharedRingDevice = std::sync::Arc<std::sync::Mutex<RingDevice>>;

fn lock_device(device: &SharedRingDevice) -> std::sync::MutexGuard<'_, RingDevice> {
    device
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A harness event: an id into the [`RingDevice`].
struct HarnessEvent {
    id: usize,
    device: SharedRingDevice,
}

impl crate::ring::RingEvent for HarnessEvent {
    fn is_complete(&self) -> crate::Result<bool> {
        let (recorded, completed) = lock_device(&self.device).events[self.id];
        Ok(completed >= recorded)
    }

    /// Single-threaded: "blocking" runs the device up to this event (the
    /// ring only blocks on an event when every slot is pending).
    fn synchronize(&self) -> crate::Result<()> {
        let mut device = lock_device(&self.device);
        let event = &mut device.events[self.id];
        event.1 = event.0;
        Ok(())
    }
}

/// Creates harness events and records them; remembers the last recording
/// as `(event id, generation)`.
struct HarnessRecorder {
    device: SharedRingDevice,
    last: Option<(usize, u64)>,
}

impl crate::ring::EventRecorder<HarnessEvent> for HarnessRecorder {
    fn create(&mut self) -> crate::Result<HarnessEvent> {
        let mut device = lock_device(&self.device);
        device.events.push((0, 0));
        Ok(HarnessEvent {
            id: device.events.len() - 1,
            device: self.device.clone(),
        })
    }

    fn record(&mut self, event: &HarnessEvent) -> crate::Result<()> {
        let mut device = lock_device(&self.device);
        let generations = &mut device.events[event.id];
        generations.0 += 1;
        self.last = Some((event.id, generations.0));
        Ok(())
    }
}

/// One record, as the reference model keeps it.
#[derive(Debug)]
struct ModelRecord {
    value: u64,
    event: usize,
    generation: u64,
    complete: bool,
}

/// The reference model of a ring: the signal model (the value is the
/// highest value completed or set; failures as for any signal) and every
/// record in order.
#[derive(Debug)]
struct RingModel {
    signal: SignalModel,
    records: Vec<ModelRecord>,
    slots: usize,
}

impl RingModel {
    /// Records the ring still waits for (not complete, above the value),
    /// oldest first.
    fn pending(&self) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&i| !self.records[i].complete && self.records[i].value > self.signal.value)
            .collect()
    }

    fn complete(&mut self, index: usize) {
        self.records[index].complete = true;
        self.signal.set(self.records[index].value);
    }

    /// The record a queue waits on for `target` (above the value, not
    /// failed): the smallest recorded value `>= target`, the older on a tie.
    fn dependency(&self, target: u64) -> Option<usize> {
        (0..self.records.len())
            .filter(|&i| {
                self.records[i].value >= target && self.records[i].value > self.signal.value
            })
            .min_by_key(|&i| self.records[i].value)
    }
}

/// What `dependency` returns, reduced to what the model can predict.
#[derive(Debug, PartialEq, Eq)]
enum DependencyOutcome {
    Reached,
    Event(usize),
    Unrecorded,
    Failed { current: u64, cause: usize },
    Timeout,
}

fn observed_dependency(
    result: crate::Result<Option<crate::ring::Dependency<HarnessEvent>>>,
) -> DependencyOutcome {
    match result {
        Ok(Some(crate::ring::Dependency::Reached)) => DependencyOutcome::Reached,
        Ok(Some(crate::ring::Dependency::Event(event))) => DependencyOutcome::Event(event.id),
        Ok(None) => DependencyOutcome::Unrecorded,
        Err(Error::Timeout { .. }) => DependencyOutcome::Timeout,
        Err(error) => match observed_wait(Err(error)) {
            WaitOutcome::Failed { current, cause } => DependencyOutcome::Failed { current, cause },
            other => panic!("unexpected dependency outcome {other:?}"),
        },
    }
}

/// Runs `ops` on a new `EventRing` at `initial` with `slots` slots (clamped
/// to 1..=[`RING_SLOTS`](crate::ring::RING_SLOTS)) and on the model,
/// comparing every result.
///
/// Checks: the value is the highest value completed or set (recording
/// never moves it); waits, `is_reached` and failures answer as for any
/// timeline signal; `dependency` names the event of the smallest recorded
/// value `>= target`; a full ring runs the device up to its oldest record;
/// a record of a reached value records nothing; events are reused (never
/// more events than slots, since nothing else holds them).
///
/// # Panics
/// On the first difference, naming the step.
pub fn check_ring_ops(initial: u64, slots: usize, ops: &[RingOp]) {
    use crate::ring::EventRing;

    let slots = slots.clamp(1, crate::ring::RING_SLOTS);
    let device = SharedRingDevice::default();
    let ring = EventRing::<HarnessEvent>::with_slots(initial, slots);
    let mut model = RingModel {
        signal: SignalModel {
            value: initial,
            ..SignalModel::default()
        },
        records: Vec::new(),
        slots,
    };
    let mut recorder = HarnessRecorder {
        device: device.clone(),
        last: None,
    };
    for (step, op) in ops.iter().enumerate() {
        let context =
            || format!("step {step} ({op:?}) of {ops:?} from {initial} with {slots} slots");
        match *op {
            RingOp::Record(value) => {
                recorder.last = None;
                let pending = model.pending();
                if value > model.signal.value && pending.len() == model.slots {
                    // The ring blocks on (so the device runs up to) its
                    // oldest pending record.
                    model.complete(pending[0]);
                }
                ring.record(value, &mut recorder)
                    .unwrap_or_else(|e| panic!("{}: {e}", context()));
                match recorder.last {
                    None => assert!(
                        value <= model.signal.value,
                        "nothing recorded: {}",
                        context()
                    ),
                    Some((event, generation)) => {
                        assert!(
                            value > model.signal.value,
                            "recorded a reached value: {}",
                            context()
                        );
                        model.records.push(ModelRecord {
                            value,
                            event,
                            generation,
                            complete: false,
                        });
                    }
                }
            }
            RingOp::RecordPastTheRange => {
                recorder.last = None;
                let result = ring.record(MAX_SIGNAL_VALUE + 1, &mut recorder);
                assert!(
                    matches!(result, Err(Error::SignalValueOutOfRange { .. })),
                    "{result:?}: {}",
                    context()
                );
                assert!(recorder.last.is_none(), "{}", context());
            }
            RingOp::Complete(pick) => {
                let incomplete: Vec<usize> = (0..model.records.len())
                    .filter(|&i| !model.records[i].complete)
                    .collect();
                if !incomplete.is_empty() {
                    let index = incomplete[pick % incomplete.len()];
                    let record = &model.records[index];
                    let mut device = lock_device(&device);
                    let generations = &mut device.events[record.event];
                    generations.1 = generations.1.max(record.generation);
                    drop(device);
                    model.complete(index);
                }
            }
            RingOp::Set(value) => {
                ring.set(value);
                model.signal.set(value);
            }
            RingOp::Fail(upto) => {
                ring.fail(upto, cause(step));
                model.signal.fail(upto, step);
            }
            RingOp::Value => assert_eq!(ring.value(), model.signal.value, "{}", context()),
            RingOp::IsReached(target) => assert_eq!(
                ring.is_reached(target),
                target <= model.signal.value,
                "{}",
                context()
            ),
            RingOp::Poll(target) => assert_eq!(
                observed_wait(ring.wait(target, Duration::ZERO)),
                model.signal.wait(target),
                "{}",
                context()
            ),
            RingOp::WaitReached(target) => {
                let target = target % (model.signal.value + 1);
                assert_eq!(
                    observed_wait(ring.wait(target, Timeout::Forever)),
                    WaitOutcome::Reached,
                    "{}",
                    context()
                );
            }
            RingOp::Dependency(target) | RingOp::PollDependency(target) => {
                let expected = match model.signal.wait(target) {
                    WaitOutcome::Reached => DependencyOutcome::Reached,
                    WaitOutcome::Failed { current, cause } => {
                        DependencyOutcome::Failed { current, cause }
                    }
                    WaitOutcome::Timeout { .. } => match model.dependency(target) {
                        Some(index) => DependencyOutcome::Event(model.records[index].event),
                        None if matches!(op, RingOp::Dependency(_)) => {
                            DependencyOutcome::Unrecorded
                        }
                        None => DependencyOutcome::Timeout,
                    },
                    WaitOutcome::OutOfRange => unreachable!("targets are small"),
                };
                let observed = match op {
                    RingOp::Dependency(_) => observed_dependency(ring.dependency(target)),
                    _ => {
                        observed_dependency(ring.wait_dependency(target, Duration::ZERO).map(Some))
                    }
                };
                assert_eq!(observed, expected, "{}", context());
            }
        }
        assert!(ring.slots_in_use() <= slots, "{}", context());
        // Nothing holds events between operations, so every event is
        // reused: never more than one per slot.
        assert!(lock_device(&device).events.len() <= slots, "{}", context());
    }
    assert_eq!(ring.value(), model.signal.value, "final value of {ops:?}");
    // Every value around the ones the ops named answers as the model says.
    let end = model
        .signal
        .value
        .max(model.records.iter().map(|r| r.value).max().unwrap_or(0));
    for target in 0..=end.saturating_add(2).min(MAX_SIGNAL_VALUE) {
        assert_eq!(
            observed_wait(ring.wait(target, Duration::ZERO)),
            model.signal.wait(target),
            "final probe {target} of {ops:?}"
        );
    }
}

/// Decodes a ring program from `data` and runs [`check_ring_ops`]. Values
/// are small and rings have one to four slots, so records, sets, failures
/// and wrap-around collide.
///
/// # Panics
/// On a difference from the model.
pub fn event_ring(data: &[u8]) {
    let mut reader = Reader { data };
    let head = reader.byte();
    let initial = u64::from(head % 8);
    let slots = 1 + usize::from((head >> 3) % 4);
    let mut ops = Vec::new();
    while !reader.is_empty() && ops.len() < 96 {
        let tag = reader.byte();
        let byte = reader.byte();
        let value = u64::from(byte % 40);
        ops.push(match tag % 10 {
            0..=2 => RingOp::Record(1 + value),
            3 | 4 => RingOp::Complete(usize::from(byte)),
            5 => RingOp::Set(value),
            6 => RingOp::Fail(value),
            7 if tag & 0x80 != 0 => RingOp::Poll(value),
            7 => RingOp::IsReached(value),
            8 if tag & 0x80 != 0 => RingOp::Dependency(value),
            8 => RingOp::PollDependency(value),
            _ => match (tag >> 4) % 4 {
                0 => RingOp::Value,
                1 | 2 => RingOp::WaitReached(value),
                _ => RingOp::RecordPastTheRange,
            },
        });
    }
    check_ring_ops(initial, slots, &ops);
}
