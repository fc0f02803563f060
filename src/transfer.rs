//! Host transfers in queue order: what an upload carries, and where a
//! download lands.
//!
//! [`upload`](crate::HardwareQueue::upload) takes its data when it is
//! recorded (a copy into the batch), and
//! [`upload_vec`](crate::HardwareQueue::upload_vec) takes ownership of a
//! vector (no copy), so the caller's memory is free again at once and the
//! bytes land in the buffer when the queue reaches the command, after the
//! commands before it. [`download`](crate::HardwareQueue::download) copies
//! a buffer's bytes, when the queue reaches it, into a [`Download`]: host
//! memory the caller waits on (or whose readiness a later `signal` of the
//! same batch tells), then takes.
//!
//! Neither needs `unsafe`: the queue owns the host memory while the
//! transfer is pending. A download whose batch does not run (rejected,
//! discarded, failed before it, or dropped) fails with the reason, so a
//! waiter never hangs.

use std::fmt;
use std::time::Instant;

use crate::buffer::{Pod, bytes_of, bytes_of_mut};
use crate::error::{Error, Result};
use crate::signal::Timeout;
use crate::sync::{Condvar, Mutex, MutexGuard};
// `std`'s `Arc` (loom's cannot hold a trait object): downloads are not part
// of the loom models.
use std::sync::Arc;

/// The data of an upload, owned by the batch.
///
/// The bytes of [`upload`](crate::HardwareQueue::upload) live in the
/// batch's byte arena (read them with
/// [`Batch::host_bytes`](crate::queue::Batch::host_bytes)); those of
/// [`upload_vec`](crate::HardwareQueue::upload_vec) in the caller's vector,
/// moved in.
pub struct HostBytes(pub(crate) HostBytesInner);

pub(crate) enum HostBytesInner {
    /// A range of the batch's arena.
    Inline(std::ops::Range<usize>),
    /// A vector the caller handed over. A trait object so that a batch
    /// holds vectors of any element type; it is read once, by the engine,
    /// off the path of a kernel launch.
    Owned(Box<dyn OwnedBytes>),
}

/// A vector of `Pod` elements, as bytes.
pub(crate) trait OwnedBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

/// Host data of element type `T` held as `O` (a `Vec<T>`, `Box<[T]>`,
/// `Arc<[T]>`, ...). `None` only while it drops.
struct Owned<T, O>(Option<O>, std::marker::PhantomData<fn() -> T>);

impl<T: Pod, O: AsRef<[T]> + Send + Sync> OwnedBytes for Owned<T, O> {
    fn bytes(&self) -> &[u8] {
        self.0
            .as_ref()
            .map_or(&[], |owner| bytes_of(owner.as_ref()))
    }
}

/// The owner is the caller's, dropped wherever the batch is let go (a
/// queue's worker, a device's retire thread): a drop of it that panics
/// ends here, not the thread, nor the drop of the batch's other commands
/// (which would leak). Its message waits on this thread for the engine
/// that let the batch go, which tells the queue's owner
/// ([`take_contained_panic`]).
impl<T, O> Drop for Owned<T, O> {
    fn drop(&mut self) {
        if let Some(owner) = self.0.take() {
            let dropped =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(owner)));
            if let Err(payload) = dropped {
                contain_panic(crate::error::panic_message(payload));
            }
        }
    }
}

thread_local! {
    /// The message of the last panic an upload owner's drop raised on this
    /// thread, contained by `Owned`'s drop.
    static CONTAINED: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// For an engine that let batches go on this thread: the message of a
/// panic an upload owner's drop raised meanwhile (contained there), once.
/// Engines report it to the queue's owner as
/// [`Error::EnginePanicked`](crate::Error::EnginePanicked), as any panic
/// on their threads; they take it before letting a batch go too, so that
/// one left by other work on the thread is not counted as theirs.
pub(crate) fn take_contained_panic() -> Option<String> {
    CONTAINED.with(std::cell::Cell::take)
}

/// Leaves `message`, of a panic caught on this thread while a batch was
/// let go, for [`take_contained_panic`].
pub(crate) fn contain_panic(message: String) {
    CONTAINED.with(|contained| contained.set(Some(message)));
}

/// `data`, of any element type and owner, as bytes behind one type: what
/// a batch's `upload_vec` holds, and what the executor stages per run.
pub(crate) fn owned_bytes<T, O>(data: O) -> Box<dyn OwnedBytes>
where
    T: Pod,
    O: AsRef<[T]> + Send + Sync + 'static,
{
    Box::new(Owned(Some(data), std::marker::PhantomData))
}

/// Erased bytes are themselves an owner of bytes, so the executor hands
/// them to `upload_vec` as they are.
impl AsRef<[u8]> for Box<dyn OwnedBytes> {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            HostBytesInner::Inline(range) => write!(f, "HostBytes::Inline({range:?})"),
            HostBytesInner::Owned(bytes) => {
                write!(f, "HostBytes::Owned({} bytes)", bytes.bytes().len())
            }
        }
    }
}

/// Checks that a transfer's host side (`host` bytes) and device range
/// (`device` bytes) are one size.
///
/// # Errors
/// [`Error::TransferSizeMismatch`] naming `what` (`"upload"` or
/// `"download"`) and both sizes.
pub(crate) fn check_transfer_len(what: &'static str, host: usize, device: usize) -> Result<()> {
    if host == device {
        Ok(())
    } else {
        Err(Error::TransferSizeMismatch { what, host, device })
    }
}

/// Where a download stands.
enum Status {
    /// Made, not recorded on a queue yet.
    Idle,
    /// Recorded; the queue has not reached it.
    Pending,
    /// The bytes arrived.
    Ready,
    /// It will never arrive, and why.
    Failed(Error),
    /// The data was taken.
    Taken,
}

struct Slot<T> {
    state: Mutex<(Status, Vec<T>)>,
    done: Condvar,
}

/// Host memory a [`download`](crate::HardwareQueue::download) lands in.
///
/// Make one of the download's length ([`new`](Self::new), or
/// [`from_vec`](Self::from_vec) to reuse memory), record it on a queue,
/// submit, then [`wait`](Self::wait) for it, or [`take`](Self::take) its
/// data (which waits first). Its readiness is also told by any signal the
/// batch sets after it: once that value is reached, `take` returns at once.
///
/// A download receives one transfer: recording it a second time rejects
/// the batch ([`Error::DownloadReused`]). When its batch does not run, or
/// fails before it, `wait` and `take` return that failure.
pub struct Download<T: Pod + Send> {
    slot: Arc<Slot<T>>,
}

impl<T: Pod + Send> Download<T> {
    /// Room for `len` elements (zeroed until the data arrives).
    ///
    /// # Panics
    /// As `vec![T::zeroed(); len]` does: where `len` elements exceed
    /// `isize::MAX` bytes ("capacity overflow"); a length the host cannot
    /// allocate aborts the process. A length from elsewhere is better
    /// checked first, or given as [`from_vec`](Self::from_vec)'s vector.
    pub fn new(len: usize) -> Self {
        Self::from_vec(vec![T::zeroed(); len])
    }

    /// Lands in `data`'s memory: the download's length is `data.len()`.
    pub fn from_vec(data: Vec<T>) -> Self {
        Self {
            slot: Arc::new(Slot {
                state: Mutex::new((Status::Idle, data)),
                done: Condvar::new(),
            }),
        }
    }

    /// The length in elements.
    pub fn len(&self) -> usize {
        self.slot.state.lock().1.len()
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the data arrived (and was not taken yet).
    pub fn is_ready(&self) -> bool {
        matches!(self.slot.state.lock().0, Status::Ready)
    }

    /// Blocks until the data arrived, or will never arrive.
    ///
    /// # Errors
    /// The failure that stopped it (the batch was rejected, discarded or
    /// failed before the download), passed on as it is;
    /// [`Error::DownloadIncomplete`] when `timeout` passed first, when it
    /// was never recorded, or when its data was taken already.
    pub fn wait(&self, timeout: impl Into<Timeout>) -> Result<()> {
        self.ready(timeout.into()).map(drop)
    }

    /// Waits as [`wait`](Self::wait), and returns the state still locked,
    /// ready: a `take` after it cannot race another `take`.
    fn ready(&self, timeout: Timeout) -> Result<MutexGuard<'_, (Status, Vec<T>)>> {
        let start = Instant::now();
        let deadline = timeout.deadline_from(start);
        let mut state = self.slot.state.lock();
        loop {
            match &state.0 {
                Status::Ready => return Ok(state),
                Status::Failed(error) => return Err(error.clone()),
                Status::Idle => {
                    return Err(Error::DownloadIncomplete {
                        reason: "it was never recorded on a queue; record it with \
                                 `download(&view, &this)` and submit the batch first"
                            .into(),
                    });
                }
                Status::Taken => {
                    return Err(Error::DownloadIncomplete {
                        reason: "its data was taken already".into(),
                    });
                }
                Status::Pending => {}
            }
            if let Some(deadline) = deadline
                && Instant::now() >= deadline
            {
                return Err(Error::DownloadIncomplete {
                    reason: format!(
                        "its batch had not run after {:?}; submit the batch (and any it waits \
                         on), or wait longer",
                        start.elapsed()
                    ),
                });
            }
            state = self.slot.done.wait_until(state, deadline);
        }
    }

    /// Waits as [`wait`](Self::wait), then takes the data.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn take(&self, timeout: impl Into<Timeout>) -> Result<Vec<T>> {
        // One lock from the wait to the take: of two threads taking at
        // once, the second finds it taken (an error), never an empty `Vec`.
        let mut state = self.ready(timeout.into())?;
        state.0 = Status::Taken;
        Ok(std::mem::take(&mut state.1))
    }

    /// A second handle on the same download: the executor keeps one from
    /// staging until the run records it.
    pub(crate) fn handle(&self) -> Self {
        Self {
            slot: self.slot.clone(),
        }
    }

    /// Whether it was never recorded on a queue.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.slot.state.lock().0, Status::Idle)
    }

    /// Fails the download with `cause` if it was never recorded: staged
    /// for a run that did not get as far as recording it.
    pub(crate) fn fail_unrecorded(&self, cause: &Error) {
        let mut state = self.slot.state.lock();
        if matches!(state.0, Status::Idle) {
            state.0 = Status::Failed(cause.clone());
            drop(state);
            self.slot.done.notify_all();
        }
    }

    /// The queue's end of the download, when it is recorded.
    ///
    /// # Errors
    /// [`Error::DownloadReused`] when it was recorded before.
    pub(crate) fn arm(&self) -> Result<DownloadSink> {
        let mut state = self.slot.state.lock();
        if !matches!(state.0, Status::Idle) {
            return Err(Error::DownloadReused);
        }
        state.0 = Status::Pending;
        let bytes = size_of_val(state.1.as_slice());
        drop(state);
        Ok(DownloadSink {
            target: self.slot.clone(),
            bytes,
            owner: true,
        })
    }
}

impl<T: Pod + Send> fmt::Debug for Download<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.slot.state.lock();
        let status = match &state.0 {
            Status::Idle => "idle",
            Status::Pending => "pending",
            Status::Ready => "ready",
            Status::Failed(_) => "failed",
            Status::Taken => "taken",
        };
        f.debug_struct("Download")
            .field("len", &state.1.len())
            .field("status", &status)
            .finish()
    }
}

/// What a queue's end of a download does; a trait object so one batch
/// holds downloads of any element type (off the path of a kernel launch).
trait Target: Send + Sync {
    /// Runs `fill` on the host bytes; on `Ok`, the data is ready.
    fn complete(&self, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<()>;
    /// Fails the download with `cause`, if it is still pending.
    fn fail(&self, cause: &Error);
}

impl<T: Pod + Send> Target for Slot<T> {
    fn complete(&self, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<()> {
        let mut state = self.state.lock();
        if !matches!(state.0, Status::Pending) {
            return Ok(());
        }
        let outcome = fill(bytes_of_mut(&mut state.1));
        state.0 = match &outcome {
            Ok(()) => Status::Ready,
            Err(error) => Status::Failed(error.clone()),
        };
        drop(state);
        self.done.notify_all();
        outcome
    }

    fn fail(&self, cause: &Error) {
        let mut state = self.state.lock();
        if matches!(state.0, Status::Pending) {
            state.0 = Status::Failed(cause.clone());
            drop(state);
            self.done.notify_all();
        }
    }
}

/// The queue's end of a [`Download`], held by its command.
///
/// An engine calls [`complete`](Self::complete) with a function that
/// writes the bytes, when it reaches the command. If the command never
/// runs, the batch's failure fails it
/// ([`Batch::fail_signals`](crate::queue::Batch::fail_signals)), and if the
/// sink is dropped still pending (its batch dropped unrun), it fails with
/// [`Error::Abandoned`]: a waiter never hangs.
pub struct DownloadSink {
    target: Arc<dyn Target>,
    bytes: usize,
    /// Whether dropping this handle still pending fails the download: the
    /// batch's handle does; a [`share`](Self::share)d one does not, so the
    /// batch's failure, with its real cause, decides.
    owner: bool,
}

impl DownloadSink {
    /// The download's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the download is of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Runs `fill` on the host memory (of [`len`](Self::len) bytes), and
    /// then marks the download ready, or failed with `fill`'s error.
    ///
    /// # Errors
    /// `fill`'s.
    pub fn complete(&self, mut fill: impl FnMut(&mut [u8]) -> Result<()>) -> Result<()> {
        self.target.complete(&mut fill)
    }

    /// Fails the download with `cause`, if it is still pending.
    pub fn fail(&self, cause: &Error) {
        self.target.fail(cause);
    }

    /// A second handle on the same download, for a backend that completes
    /// it from elsewhere (CUDA: a callback on the stream). Whichever handle
    /// completes or fails it first counts; dropping the second one does
    /// nothing.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn share(&self) -> DownloadSink {
        DownloadSink {
            target: self.target.clone(),
            bytes: self.bytes,
            owner: false,
        }
    }
}

impl Drop for DownloadSink {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        self.target.fail(&Error::Abandoned {
            reason: "the batch holding this download was dropped before it ran; submit the batch \
                     and keep its queue alive until it ran",
        });
    }
}

impl fmt::Debug for DownloadSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DownloadSink")
            .field("bytes", &self.bytes)
            .finish()
    }
}
