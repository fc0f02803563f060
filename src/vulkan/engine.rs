//! [`VulkanEngine`]: a logical queue's batches as command buffers on a
//! `VkQueue`, ordered by timeline semaphores.
//!
//! `submit` settles the batch on the owner's thread when nothing is queued
//! before it and nothing in it blocks the host (its waits' values are
//! submitted on this device, and its host copies, if any, come first on a
//! queue whose earlier submissions completed); otherwise it hands
//! it to the queue's **recording thread**. Either settles it through the
//! [`Ledger`] as the CPU engine does: it records
//! the commands into command buffers and submits them, one submission per
//! stretch between waits and host copies (a timeline semaphore is
//! signalled at the end of a submission: signals of one semaphore in a row
//! are the stretch's one signal, the highest; a signal of another
//! semaphore ends the stretch). A batch marked for replay is recorded once
//! and its command buffers submitted again (`replay.rs`). A same-backend `wait` becomes a semaphore
//! wait of the next submission once some submission that signals the
//! value is on a `VkQueue`; until then the thread holds the batch on the
//! host, since on a shared `VkQueue` (lavapipe has one) a submission whose
//! wait no signal was submitted for would stall every submission behind
//! it, the independent queue's too. Every submission also signals the
//! queue's own **progress** semaphore; the **retire thread** waits on it,
//! then completes the batch's downloads, gives its staging ranges back to
//! the device's staging pool (uploads and downloads go through ranges of
//! it, or, where the memory is mapped (cached or, as resizable BAR's,
//! write-combined), are host copies in queue order), hands its command buffers back, records its profile
//! events and lets its buffers go. A batch settled on the owner's thread
//! that holds nothing to release (signals and waits only) is handed over
//! later: with the next batch that does, at `synchronize`, at the queue's
//! end, or 32 at a time.
//!
//! Barriers: the first command of a command buffer opens with a global
//! memory barrier (compute and transfer writes to reads and writes; a copy
//! queue on a transfer-only family, transfer alone), which orders it after
//! the earlier submissions of the `VkQueue`. Within the buffer, a command
//! that touches bytes an earlier one wrote (or writes bytes an earlier one
//! read) waits behind a barrier naming exactly both sides: the stages and
//! write accesses of the earlier commands, the stage and accesses of this
//! one (`commands::Touched`); commands on other bytes wait for nothing.
//! A submission ends with a barrier to the host where the host reads what
//! it wrote (mapped buffers, a download's staging range: `submit.rs`), so
//! downloads and host reads see the device's writes. Between queues, and queues of
//! different families, the semaphores order the work.
//!
//! The files: this one holds the engine and what it shares with its
//! threads; `recorder.rs` the recording thread (batches in, submissions
//! out), `commands.rs` recording device commands and their barriers,
//! `submit.rs` handing a recorded stretch to the `VkQueue`, `timing.rs`
//! device timestamps, `retire.rs` the retire thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};

use ash::vk;
use parking_lot::{Condvar, Mutex};

use super::context::Context;
use super::memory::{VulkanBuffer, mismatch};
use super::program::VulkanProgram;
use super::recorder::Recorder;
use super::{Vulkan, VulkanDevice, VulkanSignal};
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};
use crate::profile::ProfileEvent;
use crate::program::{Program, Scalar};
use crate::queue::{Batch, Engine, Ledger, QueueKind, queue_label};
use crate::view::View;

/// The engine of a Vulkan queue: see the module docs.
pub struct VulkanEngine {
    pub(super) ledger: Ledger,
    pub(super) kind: QueueKind,
    pub(super) profiling: bool,
    /// The rest, boxed: an `AnyQueue` holds its engine inline.
    pub(super) state: Box<EngineState>,
}

pub(super) struct EngineState {
    pub(super) device: VulkanDevice,
    /// The device's context, held here so that a check at recording
    /// reaches it in one step.
    pub(super) context: Arc<Context>,
    pub(super) jobs: Option<Sender<Job>>,
    pub(super) shared: Arc<Shared>,
    /// The recording state: the recording thread's, and the owner's for a
    /// batch it settles itself.
    pub(super) recorder: Arc<Mutex<Recorder>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    /// The replay key of the next batch submitted (`replay_next`).
    pub(super) replay_next: Option<u32>,
}

pub(super) struct Job {
    pub(super) batch: Batch<Vulkan>,
    pub(super) profile: bool,
    /// The batch's replay key (`replay.rs`), where it has one.
    pub(super) replay: Option<u32>,
}

#[derive(Default)]
pub(super) struct Shared {
    /// Batches submitted, batches retired.
    pub(super) progress: Mutex<(u64, u64)>,
    /// Host waits in progress for a value that may come only from the
    /// queue's caller (a `wait` held until its value is submitted, a wait
    /// on another backend's signal): a dropped engine does not wait for
    /// its work while there is one. Changed under `progress`'s lock.
    pub(super) holding: AtomicUsize,
    /// Batches handed to the recording thread and not yet settled by it:
    /// while any is, the owner hands it the next one too (queue order).
    pub(super) queued: AtomicUsize,
    pub(super) retired: Condvar,
    pub(super) recycled: Mutex<Vec<Batch<Vulkan>>>,
    /// Command buffers whose work completed, for the recording thread.
    pub(super) free: Mutex<Vec<CommandSet>>,
    pub(super) events: Mutex<Vec<ProfileEvent>>,
    /// Dispatches recorded, recordings submitted again (the recorder's
    /// counts, published once per batch, so a dispatch pays no atomic
    /// read-modify-write for them), and why the last batch marked for
    /// replay ran the plain way ([`crate::Launches`]).
    pub(super) kernels: AtomicU64,
    pub(super) programs: AtomicU64,
    /// Recordings whose descriptor sets took a run's new bindings
    /// (`replay.rs`'s rebinding; rare: counted where it happens).
    pub(super) patched: AtomicU64,
    pub(super) fallback: Mutex<Option<String>>,
}

/// A command buffer and the descriptor pools its execs allocate from.
pub(super) struct CommandSet {
    pub(super) buffer: vk::CommandBuffer,
    pub(super) pools: Vec<vk::DescriptorPool>,
    /// How many of `pools` this recording used.
    pub(super) used: usize,
    /// Timestamps around each command while profiling (made on first
    /// use), and how many this recording wrote.
    pub(super) queries: vk::QueryPool,
    pub(super) written: u32,
}

/// Says the recording thread settled a batch handed to it.
pub(super) fn release_queued(shared: &Shared) {
    shared.queued.fetch_sub(1, Ordering::Release);
}

/// Timestamps a command buffer holds: two per timed command.
pub(super) const QUERIES: u32 = 512;

impl VulkanEngine {
    pub(super) fn new(device: VulkanDevice, kind: QueueKind) -> Result<Self> {
        let ledger = Ledger::new();
        let shared = Arc::new(Shared::default());
        let context = device.context().clone();
        let family = match kind {
            QueueKind::Copy => context.transfer_family.unwrap_or(context.compute_family),
            QueueKind::Compute => context.compute_family,
        };
        let mut recorder = Recorder::new(device.clone(), family, kind, shared.clone(), &ledger)?;
        recorder.start_retiring(&ledger);
        let recorder = Arc::new(Mutex::new(recorder));
        let (jobs, receiver) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("hwqueue-vulkan {}", queue_label(ledger.id(), kind)))
            .spawn({
                let ledger = ledger.clone();
                let recorder = recorder.clone();
                move || Recorder::run(&recorder, &ledger, receiver)
            });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(error) => {
                // The closure, and its handle, went with the failed spawn:
                // what the recorder made is freed, not leaked.
                if let Ok(recorder) = Arc::try_unwrap(recorder) {
                    recorder.into_inner().discard();
                }
                return Err(Error::System {
                    what: "spawning a Vulkan queue's recording thread",
                    detail: error.to_string(),
                });
            }
        };
        Ok(Self {
            ledger,
            kind,
            profiling: false,
            state: Box::new(EngineState {
                context: device.context().clone(),
                device,
                jobs: Some(jobs),
                shared,
                recorder,
                thread: Some(thread),
                replay_next: None,
            }),
        })
    }
}

impl Engine for VulkanEngine {
    type Backend = Vulkan;

    fn kind(&self) -> QueueKind {
        self.kind
    }

    fn limits(&self) -> &Limits {
        self.state.device.limits_ref()
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn check_exec(
        &self,
        program: &VulkanProgram,
        buffers: &[View<Vulkan>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        for view in buffers {
            self.check_buffer("a kernel argument", view.buffer())?;
        }
        if let Some(size) = program.workgroup_size()
            && params.local() != size
        {
            return Err(Error::InvalidArguments {
                program: program.signature().name.clone(),
                reason: format!(
                    "the exec's local size is {:?} but the shader's @workgroup_size is {size:?}; \
                     a Vulkan shader's work-group size is fixed when it is compiled, so give \
                     the exec that local size",
                    params.local()
                ),
            });
        }
        let limits = self.state.device.context().limits();
        if program.push_size() > limits.max_push_constants_size {
            return Err(Error::InvalidArguments {
                program: program.signature().name.clone(),
                reason: format!(
                    "the shader's push constants span {} bytes, past the device's \
                     maxPushConstantsSize ({}); pass fewer scalars, or pass the rest in a buffer",
                    program.push_size(),
                    limits.max_push_constants_size
                ),
            });
        }
        let max = limits.max_storage_buffer_range as usize;
        if let Some(view) = buffers.iter().find(|v| v.len() > max) {
            return Err(Error::InvalidArguments {
                program: program.signature().name.clone(),
                reason: format!(
                    "a view of {} bytes is past the device's maxStorageBufferRange ({max}); \
                     split the work over smaller views",
                    view.len()
                ),
            });
        }
        program.push_constants(scalars).map(drop)
    }

    fn check_buffer(&self, what: &'static str, buffer: &VulkanBuffer) -> Result<()> {
        if buffer.is_of(self.state.device.pool()) {
            Ok(())
        } else {
            Err(mismatch(what, buffer, &self.state.device.context().spec))
        }
    }

    /// A signal of this device handle (see `check_signal`).
    #[inline]
    fn accepts_signal(&self, signal: &VulkanSignal) -> bool {
        signal.is_of(&self.state.context)
    }

    /// Another device's semaphore would reach `vkQueueSubmit` of this one
    /// (a Vulkan error, then a fault in the driver): refused. Waits on
    /// another device's signals work (the host waits for them). (A value
    /// further from the signal's than the device allows fails the batch
    /// when it is recorded into a submission: the recorder checks it.)
    fn check_signal(&self, signal: &VulkanSignal, value: u64) -> Result<()> {
        if self.accepts_signal(signal) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                what: format!(
                    "the signal of `signal(_, {value})` (a queue signals only its own device's \
                     signals; make it with this device's `new_signal`, and let the other \
                     device's queues `wait` on it)"
                ),
                resource: format!("{} (another Vulkan device handle)", signal.device_spec()),
                queue: self.state.context.spec.clone(),
            })
        }
    }

    fn alloca(&mut self, size: usize) -> Result<VulkanBuffer> {
        VulkanBuffer::allocate(self.state.device.pool(), size, false, true)
    }

    fn check_dealloca(&self, buffer: &VulkanBuffer) -> Result<()> {
        if buffer.is_of(self.state.device.pool()) {
            Ok(())
        } else {
            Err(Error::InvalidDealloca {
                reason: "the buffer is of another Vulkan device's pool; record the `dealloca` \
                         on a queue of the device whose queue made it"
                    .into(),
            })
        }
    }

    fn replay_next(&mut self, key: Option<u32>) {
        self.state.replay_next = key;
    }

    fn submit(&mut self, batch: Batch<Vulkan>) -> Batch<Vulkan> {
        let replay = self.state.replay_next.take();
        let state = &*self.state;
        state.shared.progress.lock().0 += 1;
        let job = Job {
            batch,
            profile: self.profiling,
            replay,
        };
        // Nothing queued before it (only this thread queues, so none can
        // be added meanwhile) and nothing in it blocks the host: settle it
        // here, without waking the recording thread (what a raw `ash`
        // submit costs, plus the recording).
        if state.shared.queued.load(Ordering::Acquire) == 0
            && let Some(mut recorder) = state.recorder.try_lock()
            && recorder.can_settle_at_once(&self.ledger, &job.batch, job.profile)
        {
            recorder.settle(&self.ledger, job, true);
        } else if let Some(jobs) = &state.jobs {
            state.shared.queued.fetch_add(1, Ordering::AcqRel);
            // The thread ends only once this sender is dropped.
            let _ = jobs.send(job);
        }
        state.shared.recycled.lock().pop().unwrap_or_default()
    }

    fn synchronize(&mut self) {
        // Batches kept from the retire thread retire now too.
        self.state.recorder.lock().retire_deferred();
        let shared = &self.state.shared;
        let mut progress = shared.progress.lock();
        while progress.1 < progress.0 {
            shared.retired.wait(&mut progress);
        }
    }

    fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    fn take_profile(&mut self, out: &mut Vec<ProfileEvent>) {
        out.append(&mut self.state.shared.events.lock());
    }

    fn launches(&self) -> crate::Launches {
        let shared = &self.state.shared;
        crate::Launches {
            kernels: shared.kernels.load(Ordering::Relaxed),
            programs: shared.programs.load(Ordering::Relaxed),
            // Vulkan matches each batch against its recording instead.
            repeats: 0,
            patched: shared.patched.load(Ordering::Relaxed),
            fallback: shared.fallback.lock().clone(),
        }
    }
}

impl Drop for VulkanEngine {
    /// Closes the queue: the recording thread ends once the work already
    /// submitted retired. The drop waits for that, and for the thread
    /// (dropping the last queue and device leaves no thread in a driver
    /// call behind), unless a batch is held on the host for a value that
    /// may come only from the caller: then the work drains on its own, as
    /// the CPU and CUDA queues' does, since the caller may set the value
    /// only after this drop returns (the conformance case
    /// `queue_dropped_while_its_batch_waits_returns_and_the_batch_runs`).
    fn drop(&mut self) {
        self.state.jobs = None;
        let shared = &self.state.shared;
        let retired = {
            let mut progress = shared.progress.lock();
            loop {
                if progress.1 >= progress.0 {
                    break true;
                }
                // Changed under this lock, with a wake-up (`Holding`).
                if shared.holding.load(Ordering::Relaxed) > 0 {
                    break false;
                }
                shared.retired.wait(&mut progress);
            }
        };
        if let Some(thread) = self.state.thread.take()
            && retired
        {
            let _ = thread.join();
        }
    }
}
