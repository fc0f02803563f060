//! The crate's one error type.
//!
//! Each variant carries the facts of the failure (the target, the value, the
//! sizes, the names) and its message ends with what to do about it. Errors are
//! `Clone` because one failure fans out: a failed batch hands the same error to
//! every waiter of every signal it would have set.

use std::sync::Arc;
use std::time::Duration;

use crate::queue::QueueKind;

/// The result type of every fallible hwqueue call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in hwqueue.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
        "copy size mismatch: destination is {dst} bytes, source is {src} bytes; copies move whole \
         buffers, so allocate both with the same size"
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

    /// The owner is told of a failure of work it submitted before.
    #[error("a batch submitted earlier on this queue failed: {cause}; the queue is usable again")]
    QueueFailed {
        /// The failure.
        cause: Arc<Error>,
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
         fix the kernel that faulted, then restart the process"
    )]
    DeviceLost {
        /// The device spec, printed.
        device: String,
        /// What the device reported.
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

    /// Memory could not be allocated.
    #[error("cannot allocate {size} bytes on `{device}`: {detail}; free buffers or allocate less")]
    OutOfMemory {
        /// The device spec, printed.
        device: String,
        /// Bytes asked for.
        size: usize,
        /// What the allocator said.
        detail: String,
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

    /// A schedule that cannot be planned.
    #[error("invalid schedule: {reason}")]
    InvalidSchedule {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// C kernel source that the system C compiler rejected, or whose library
    /// does not load.
    #[error(
        "C kernel `{program}` did not compile with `{compiler}`; fix the source or \
         `CompileOptions::flags`. The compiler said:\n{output}"
    )]
    Compile {
        /// The kernel's name.
        program: String,
        /// The compiler command.
        compiler: String,
        /// What the compiler printed (its errors, with file and line).
        output: String,
    },

    /// A backend-specific failure (a driver call, a compiler).
    #[error("{backend}: {message}")]
    Backend {
        /// The backend id.
        backend: &'static str,
        /// The backend's message, with what to do.
        message: String,
    },
}

/// The message of a caught panic (a kernel's, a backend open's).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "it panicked with a non-string payload".to_owned()
    }
}

impl Error {
    /// The deepest cause of a chain of wrapped errors (`SignalFailed`,
    /// `QueueFailed`, …): the failure that started it.
    pub fn root_cause(&self) -> &Error {
        let mut error = self;
        loop {
            match error {
                Error::SignalFailed { cause, .. }
                | Error::EarlierBatchFailed { cause }
                | Error::QueueFailed { cause }
                | Error::BatchRejected { cause }
                | Error::OperationFailed { cause, .. } => error = cause,
                _ => return error,
            }
        }
    }
}
