//! The crate's one error type.
//!
//! Each variant carries the facts of the failure (the target, the value, the
//! sizes, the names) and its message ends with what to do about it. Errors are
//! `Clone` because one failure fans out: a failed batch hands the same error to
//! every waiter of every signal it would have set.

mod cause;
mod external;
mod wording;

use std::sync::Arc;
use std::time::Duration;

use crate::queue::{QueueId, QueueKind};

pub use external::{BackendSource, panic_message};
use wording::{after_failure, memory_figures, refused_at};

/// The result type of every fallible hwqueue call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in hwqueue.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A communicator or a collective failed: see [`CollectiveError`](crate::collective::CollectiveError).
    #[error(transparent)]
    Collective(#[from] crate::collective::CollectiveError),

    /// The registry refused to select or open a device: see
    /// [`RegistryError`](crate::registry::RegistryError).
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),

    /// A `wait` ran out of time before its signal reached the target.
    #[error(
        "timed out after {waited:?} waiting for a signal to reach {target} (it is at {current}); \
         check that some queue or host thread signals {target}, or raise the timeout"
    )]
    Timeout {
        /// The value waited for.
        target: u64,
        /// The signal's value when the wait gave up.
        current: u64,
        /// How long the wait lasted.
        waited: Duration,
    },

    /// The work that would have raised a signal to `target` failed.
    #[error(
        "a signal will not reach {target} (it is at {current}): the work that would have set it failed: {cause}"
    )]
    SignalFailed {
        /// The value waited for.
        target: u64,
        /// The signal's value when the failure was seen.
        current: u64,
        /// Why the work failed.
        cause: Arc<Error>,
    },

    /// A signal value past [`MAX_SIGNAL_VALUE`](crate::MAX_SIGNAL_VALUE).
    #[error(
        "signal value {value} is past the largest timeline value {max}; timeline values must stay \
         below 2^63: start from 1 and count up"
    )]
    SignalValueOutOfRange {
        /// The value that was given.
        value: u64,
        /// The largest value a signal holds.
        max: u64,
    },

    /// A signal value further from the value its timeline semaphore holds
    /// than the device allows between values of one semaphore (Vulkan's
    /// `maxTimelineSemaphoreValueDifference`, at least 2^31 - 1).
    #[error(
        "signal value {value} is {} past the value the signal holds ({current}), more than \
         device `{device}` allows between values of one timeline semaphore ({max}, its \
         maxTimelineSemaphoreValueDifference); count up in smaller steps (signal or set values \
         in between first)",
        value - current
    )]
    SignalValueTooFarApart {
        /// The value that was given.
        value: u64,
        /// The value the signal held.
        current: u64,
        /// The device's largest difference.
        max: u64,
        /// The device.
        device: String,
    },

    /// [`wait_any`](crate::wait_any) on an empty list of signals.
    #[error(
        "`wait_any` got no signals to wait for, so there is no index to return; pass at least one \
         `(signal, value)` pair (skip the call when the list is empty)"
    )]
    EmptyWaitList,

    /// Work sizes that the backend cannot run.
    #[error("invalid exec parameters {params}: {reason}")]
    InvalidExecParams {
        /// The parameters, printed.
        params: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A copy between buffers of different sizes.
    #[error(
        "copy size mismatch: destination is {dst} bytes, source is {src} bytes; a copy moves the \
         whole source, so pass a destination (a buffer or a view) of the same length"
    )]
    CopySizeMismatch {
        /// Destination size in bytes.
        dst: usize,
        /// Source size in bytes.
        src: usize,
    },

    /// A host read or write that does not fit in a buffer.
    #[error(
        "host access of {len} bytes at offset {offset} does not fit in a buffer of {size} bytes; \
         pass a slice of at most {size} bytes in all"
    )]
    HostAccessOutOfBounds {
        /// Byte offset into the buffer.
        offset: usize,
        /// Bytes requested.
        len: usize,
        /// The buffer's size in bytes.
        size: usize,
    },

    /// A view whose byte range does not lie in its buffer (or, for a view
    /// of a view, in the outer view).
    #[error(
        "view of {len} bytes at offset {offset} does not fit in a buffer of {size} bytes; make it \
         end at or before byte {size}"
    )]
    ViewOutOfRange {
        /// Byte offset of the view.
        offset: usize,
        /// Its length in bytes.
        len: usize,
        /// The size of what it was cut from, in bytes.
        size: usize,
    },

    /// A view at an offset the command cannot use.
    #[error(
        "{what} is a view at byte offset {offset} (bytes {offset}..{end} of a buffer of {size} \
         bytes), which is not a multiple of {alignment}; place it at a multiple of {alignment}"
    )]
    ViewMisaligned {
        /// Which argument (`"buffer 1 of exec `gemm`"`, `"the fill destination"`).
        what: String,
        /// Byte offset of the view.
        offset: usize,
        /// Its end.
        end: usize,
        /// The buffer's size.
        size: usize,
        /// The alignment needed, in bytes.
        alignment: usize,
    },

    /// A copy whose source and destination share bytes of one buffer.
    #[error(
        "copy source bytes {src:?} and destination bytes {dst:?} overlap in one buffer of {size} \
         bytes; copy through a second buffer, or between disjoint ranges"
    )]
    CopyOverlap {
        /// Destination range.
        dst: std::ops::Range<usize>,
        /// Source range.
        src: std::ops::Range<usize>,
        /// The buffer's size.
        size: usize,
    },

    /// A `fill` whose pattern or destination does not fit the rules.
    #[error("invalid fill of {len} bytes at offset {offset}: {reason}")]
    InvalidFill {
        /// Byte offset of the destination.
        offset: usize,
        /// Its length.
        len: usize,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// An upload or download whose host data and device range differ in
    /// size.
    #[error(
        "{what}: the host side is {host} bytes but the device range is {device} bytes; pass host \
         data of exactly the view's length, or a view of the host data's length"
    )]
    TransferSizeMismatch {
        /// `"upload"` or `"download"`.
        what: &'static str,
        /// Host bytes.
        host: usize,
        /// Device bytes.
        device: usize,
    },

    /// A [`Download`](crate::Download) recorded a second time.
    #[error(
        "this Download was already recorded; a Download receives one transfer, so make a new one \
         (or `Download::from_vec` with the memory of a finished one)"
    )]
    DownloadReused,

    /// A [`Download`](crate::Download) whose data is not there to wait
    /// for: the wait timed out, it was never recorded, or its data was
    /// taken already. (A download whose batch was dropped unrun fails with
    /// [`Error::Abandoned`].)
    #[error("download not complete: {reason}")]
    DownloadIncomplete {
        /// Why, and what to do.
        reason: String,
    },

    /// An executor run with a slot ([`Schedule::add_slot`](crate::Schedule::add_slot))
    /// that has no buffer bound.
    #[error(
        "slot `{slot}` has no buffer bound; call `Plan::bind` with a buffer or view of its size \
         before `run` (a binding stays until rebound)"
    )]
    SlotUnbound {
        /// The slot's name.
        slot: String,
    },

    /// A binding of a plan's slot that [`Plan::bind`](crate::Plan::bind),
    /// [`Plan::set_scalar`](crate::Plan::set_scalar) or
    /// [`Plan::run`](crate::Plan::run) refuses: not a slot, the wrong size
    /// or type, or bytes shared with another slot or buffer of the plan in
    /// a way its hazards do not order.
    #[error("binding `{slot}`: {reason}")]
    InvalidBinding {
        /// The slot's name (or id, when it is not in the plan).
        slot: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// An executor run whose upload or download operation had nothing
    /// staged for it.
    #[error(
        "{what} `{operation}` has nothing staged for this run; call `Plan::{what}` with its \
         operation id before each `run` (a run consumes what was staged)"
    )]
    TransferNotStaged {
        /// The operation's name, as given to the schedule.
        operation: String,
        /// `"upload"` or `"download"`.
        what: &'static str,
    },

    /// An `exec` got the wrong number of buffers or scalars, or one twice.
    #[error("bad arguments for kernel `{program}`: {reason}")]
    InvalidArguments {
        /// The kernel's name.
        program: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A command the queue's kind cannot run (an `exec` on a copy queue).
    #[error(
        "a {kind} queue cannot run `{command}`; record it on a compute queue \
         (`QueueFactory::compute_queue`)"
    )]
    UnsupportedCommand {
        /// The queue's kind.
        kind: QueueKind,
        /// The command refused.
        command: &'static str,
    },

    /// A `replay_program` named a device program the engine does not
    /// hold for the batch.
    #[error(
        "device program {index} was named for replay, but the queue holds {recorded} recorded \
         for this batch; call `replay_recorded` first and record `replay_program` only where it \
         returned true, with an index below the number of kernel runs it was given"
    )]
    ReplayNotRecorded {
        /// The program named.
        index: u32,
        /// How many the engine holds for the batch (0: none, or no replay
        /// form).
        recorded: u32,
    },

    /// A backend without queue-ordered allocation was asked for an `alloca`
    /// or a `dealloca`.
    #[error(
        "the `{backend}` backend has no queue-ordered `{command}`; allocate with \
         `Device::alloc` and drop the buffer once the work using it completed instead"
    )]
    NoQueueOrderedMemory {
        /// The backend id.
        backend: &'static str,
        /// `"alloca"` or `"dealloca"`.
        command: &'static str,
    },

    /// A resource of one backend handed to a queue of another.
    #[error(
        "{what} belongs to the `{resource}` backend but the queue is `{queue}`; allocate it on the \
         queue's device, or copy it over through the host"
    )]
    BackendMismatch {
        /// The queue's backend id.
        queue: &'static str,
        /// The resource's backend id.
        resource: &'static str,
        /// Which argument (`"buffer 2 of exec"`, `"copy source"`).
        what: String,
    },

    /// A kernel panicked or reported failure while running.
    #[error("kernel `{program}` failed: {message}; the batch was abandoned and its signals failed")]
    KernelFailed {
        /// The kernel's name.
        program: String,
        /// The panic message or the kernel's own report.
        message: String,
    },

    /// An earlier batch of the same queue failed, so this one was not run.
    #[error(
        "not run: an earlier batch on this queue failed ({cause}); check `submit`/`synchronize` \
         errors and resubmit"
    )]
    EarlierBatchFailed {
        /// The first failure.
        cause: Arc<Error>,
    },

    /// This batch ran on the device behind an earlier batch's work that
    /// was then given up there (an NCCL collective its watchdog aborted),
    /// so over whatever that work left: its signals fail, though their
    /// events completed.
    #[error(
        "ran behind an earlier batch on this queue whose work was abandoned on the device \
         ({cause}), so over what that work left; check `submit`/`synchronize` errors and \
         resubmit"
    )]
    RanBehindAbandoned {
        /// The earlier batch's failure.
        cause: Arc<Error>,
    },

    /// The owner is told of a failure of work it submitted before.
    #[error(
        "a batch submitted earlier on this queue failed: {cause}; {}",
        after_failure(cause)
    )]
    QueueFailed {
        /// The failure.
        cause: Arc<Error>,
    },

    /// A `signal` on a signal that another live queue produces.
    #[error(
        "{queue} cannot signal this signal to {value}: {producer} produces it, and a signal has \
         one producing queue (so that a failure fails only the values that queue would set); \
         give each queue its own signal and let the others wait on it"
    )]
    SignalProducerConflict {
        /// The value of the refused `signal`.
        value: u64,
        /// The queue that produces the signal.
        producer: QueueId,
        /// The queue that tried to signal it.
        queue: QueueId,
    },

    /// A batch that will never run: discarded, or left recorded when its
    /// queue was dropped. Its signals fail with this.
    #[error("not run: {reason}")]
    Abandoned {
        /// What happened to the batch, and what to do.
        reason: &'static str,
    },

    /// Something other than a kernel panicked while a queue's engine ran a
    /// batch: a bug in hwqueue or in a backend. The batch failed; the
    /// queue keeps working.
    #[error(
        "the queue's engine panicked while running a batch: {message}; the batch was abandoned \
         and its signals failed. This is a bug: please report it with the message"
    )]
    EnginePanicked {
        /// The panic message.
        message: String,
    },

    /// A command was rejected when it was recorded; reported at `submit`.
    #[error("batch rejected, nothing in it ran: {cause}")]
    BatchRejected {
        /// Why the batch was rejected.
        cause: Arc<Error>,
    },

    /// A device spec that does not parse.
    #[error(
        "cannot parse device spec `{input}`: {reason}; accepted: {accepted} (optionally with \
         `:ORDINAL`, e.g. `cuda:1`)"
    )]
    InvalidDeviceSpec {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: String,
        /// The accepted names and aliases.
        accepted: String,
    },

    /// A backend named in a spec that this build does not contain.
    #[error(
        "the `{backend}` backend is not compiled in; rebuild with `--features {feature}` \
         (e.g. `cargo run --features {feature}`)"
    )]
    BackendNotCompiled {
        /// The backend id.
        backend: &'static str,
        /// The cargo feature that enables it.
        feature: &'static str,
    },

    /// A backend whose driver or runtime library is missing at run time.
    #[error("the `{backend}` backend found no driver: {detail}")]
    NoDriver {
        /// The backend id.
        backend: &'static str,
        /// What was missing and how to install it.
        detail: String,
    },

    /// The device faulted in a way that poisons it for the rest of the
    /// process (CUDA's sticky errors: an illegal address, a launch failure).
    #[error(
        "device `{device}` is lost: {detail}; no further work can run on it in this process: \
         find the command that faulted (a kernel's out-of-bounds access, or a copy through a \
         bad address), fix it, then restart the process"
    )]
    DeviceLost {
        /// The device spec, printed.
        device: String,
        /// What the device reported.
        detail: String,
    },

    /// A queue whose work on the device can no longer be proven done: a
    /// wait for its stream failed with an error that does not lose the
    /// device (the stream may still run that work), with many batches
    /// behind one whose completion could not be told either. What its
    /// work uses is kept for the process, and the queue takes no more:
    /// each later `submit` or `synchronize` fails with this, and lets the
    /// batch recorded go unrun.
    #[error(
        "{backend}: {what} failed: {detail}; the queue cannot prove its work done, so what that \
         work uses is kept for the rest of the process and the queue takes no more work: drop \
         it, and make a new queue (the device is not lost)"
    )]
    QueueStalled {
        /// The backend id.
        backend: &'static str,
        /// What was attempted.
        what: String,
        /// The driver's error.
        detail: String,
    },

    /// A device ordinal past the devices present.
    #[error(
        "no device `{backend}:{ordinal}`: the `{backend}` backend has {count} device(s); use an \
         ordinal below {count}"
    )]
    NoSuchDevice {
        /// The backend id.
        backend: &'static str,
        /// The ordinal asked for.
        ordinal: u32,
        /// How many devices there are.
        count: u32,
    },

    /// Memory could not be allocated, even after the device's pool gave
    /// its cached blocks back and tried again.
    #[error(
        "cannot allocate {size} bytes on `{device}`: {detail} ({}); free buffers (or drop \
         queues holding them), call `trim_memory`, raise the pool's limit, or allocate less",
        memory_figures(*.in_use, *.reserved, *.device_free, *.device_total)
    )]
    OutOfMemory {
        /// The device spec, printed.
        device: String,
        /// Bytes asked for.
        size: usize,
        /// What the allocator said.
        detail: String,
        /// Bytes the device's pool had handed out.
        in_use: usize,
        /// Bytes the device's pool held from the backend (in use or cached).
        reserved: usize,
        /// Bytes free on the device, where the backend knows.
        device_free: Option<u64>,
        /// Bytes the device has, where the backend knows.
        device_total: Option<u64>,
    },

    /// An allocation that can never succeed as asked.
    #[error("invalid allocation of {size} bytes: {reason}")]
    InvalidAllocation {
        /// Bytes asked for.
        size: usize,
        /// Why, and what to do.
        reason: String,
    },

    /// A `dealloca` that cannot be recorded: the buffer was not made by
    /// `alloca`, belongs to another device's pool, or was deallocated
    /// already. The batch is rejected.
    #[error("invalid dealloca: {reason}")]
    InvalidDealloca {
        /// Why, and what to do.
        reason: String,
    },

    /// A buffer was used after its `dealloca` was recorded (by a command) or
    /// ran (by the host). `detail` says which, on which queue, and how to
    /// order the work instead.
    #[error("{what} {detail}")]
    UseAfterDealloca {
        /// The buffer, as the command or call names it.
        what: String,
        /// What happened to it and what to do.
        detail: String,
    },

    /// A buffer whose memory a timed-out MPI collective, which cannot be
    /// cancelled, may still use: refused from then on, never reused.
    #[error(
        "{what} was lost to a timed-out collective, which MPI cannot cancel and which may still \
         use its memory (never reused now); allocate a new buffer, and a new communicator"
    )]
    MemoryLost {
        /// The buffer, as the command or call names it.
        what: String,
    },

    /// The operating system refused something (a thread, a library).
    #[error("{what} failed: {detail}")]
    System {
        /// What was attempted.
        what: &'static str,
        /// The system's message.
        detail: String,
    },

    /// An operation of an executor run failed; the run is abandoned and
    /// everything waiting on it woke with this error.
    #[error(
        "operation `{operation}` failed: {cause}; the run was abandoned (run the plan again once fixed)"
    )]
    OperationFailed {
        /// The operation's name, as given to the schedule.
        operation: String,
        /// What failed.
        cause: Arc<Error>,
    },

    /// A run of a plan that one of its queues refused when it was submitted
    /// (a command the backend rejects, such as a kernel over a binding it
    /// cannot take). The run's values that nothing sets fail, in each
    /// queue's order; runs before it are untouched.
    #[error(
        "run {run} of the plan was refused by queue `{queue}`{}: {cause}; the rest of the run \
         fails (earlier runs are untouched): fix it, then run the plan again",
        refused_at(operation.as_deref(), bindings)
    )]
    RunRefused {
        /// The run, counted from 0.
        run: u64,
        /// The queue that refused it, as the plan labels it.
        queue: String,
        /// The operation whose command was refused, where the queue said.
        operation: Option<String>,
        /// The slots that operation takes and what each was bound to.
        bindings: Vec<String>,
        /// Why.
        cause: Arc<Error>,
    },

    /// A schedule that cannot be planned.
    #[error("invalid schedule: {reason}")]
    InvalidSchedule {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// Kernel source that its compiler rejected (the system C compiler,
    /// NVRTC), or whose library does not load.
    #[error(
        "kernel `{program}` did not compile with `{compiler}`; fix the source or the compile \
         options. The compiler said:\n{output}"
    )]
    Compile {
        /// The kernel's name.
        program: String,
        /// The compiler command.
        compiler: String,
        /// What the compiler printed (its errors, with file and line).
        output: String,
    },

    /// A resource of one device handed to a queue of another device of the
    /// same backend.
    #[error(
        "{what} belongs to `{resource}` but the queue runs on `{queue}`; allocate or load it on \
         the queue's device, or copy it over through the host"
    )]
    DeviceMismatch {
        /// Which argument (`"buffer 2 of exec"`, `"the program"`).
        what: String,
        /// The resource's device spec.
        resource: String,
        /// The queue's device spec.
        queue: String,
    },

    /// A call into a backend's driver failed.
    #[error("{backend}: {what} failed: {detail}")]
    Driver {
        /// The backend id.
        backend: &'static str,
        /// What was attempted.
        what: String,
        /// The driver's error, with what to do where it is known.
        detail: String,
    },

    /// An error of a backend's own driver or runtime, kept as its source
    /// (`std::error::Error::source` returns it): for backends written
    /// outside this crate, whose errors hwqueue does not know. Build it
    /// with [`Error::backend`].
    #[error("{backend}: {what} failed: {source}")]
    Backend {
        /// The backend id.
        backend: &'static str,
        /// What was attempted (`"launching kernel `matmul`"`).
        what: String,
        /// The backend's own error.
        #[source]
        source: BackendSource,
    },

    /// A kernel's source or name that cannot be loaded as given.
    #[error("kernel `{program}` cannot be loaded: {reason}")]
    InvalidProgram {
        /// The kernel's name.
        program: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A loaded module or library with no function of the entry point's name.
    #[error(
        "kernel `{program}` has no entry point `{entry}` ({detail}); give the name of a \
         non-`static`, unmangled function of the source (`extern \"C\"` in CUDA C; \
         `HWQ_KERNEL` in C declares one)"
    )]
    EntryPointNotFound {
        /// The kernel's name.
        program: String,
        /// The entry point asked for.
        entry: String,
        /// What the loader said.
        detail: String,
    },
}
