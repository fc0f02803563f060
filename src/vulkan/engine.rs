//! [`VulkanEngine`]: a logical queue's batches as command buffers on a
//! `VkQueue`, ordered by timeline semaphores.
//!
//! `submit` hands the batch to the queue's **recording thread**, which
//! settles it through the [`Ledger`] as the CPU engine does: it records
//! the commands into command buffers and submits them, one submission per
//! stretch between `signal`s and waits (a timeline semaphore is signalled
//! at the end of a submission). A same-backend `wait` becomes a semaphore
//! wait of the next submission once some submission that signals the
//! value is on a `VkQueue`; until then the thread holds the batch on the
//! host, since on a shared `VkQueue` (lavapipe has one) a submission whose
//! wait no signal was submitted for would stall every submission behind
//! it, the independent queue's too. Every submission also signals the
//! queue's own **progress** semaphore; the **retire thread** waits on it,
//! then completes the batch's downloads, gives its staging ranges back to
//! the device's pool (uploads and downloads go through ranges of it), hands
//! its command buffers back, records its profile events and lets its
//! buffers go.
//!
//! Barriers: a global memory barrier (compute and transfer, writes to
//! reads and writes) before each command, which also orders it after the
//! earlier submissions of the `VkQueue`, and one to the host at the end of
//! each submission, so downloads and host reads see the device's writes.
//! Between queues of different families, the semaphores order the work.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};

use ash::vk;
use parking_lot::{Condvar, Mutex};

use super::context::Context;
use super::memory::{VulkanBlock, VulkanBuffer, free_buffer, make_buffer, mismatch};
use super::program::{Pipeline, VulkanProgram};
use super::{Vulkan, VulkanDevice};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::params::{ExecParams, Limits};
use crate::profile::{EventNames, ProfileEvent, describe, now_ns};
use crate::program::{Program, Scalar};
use crate::queue::{Batch, Command, Engine, Ledger, QueueKind, queue_label, settled};
use crate::signal::TimelineSignal;
use crate::view::View;

/// The engine of a Vulkan queue: see the module docs.
pub struct VulkanEngine {
    ledger: Ledger,
    kind: QueueKind,
    profiling: bool,
    /// The rest, boxed: an `AnyQueue` holds its engine inline.
    state: Box<EngineState>,
}

struct EngineState {
    device: VulkanDevice,
    jobs: Option<Sender<Job>>,
    shared: Arc<Shared>,
    recorder: Option<std::thread::JoinHandle<()>>,
}

struct Job {
    batch: Batch<Vulkan>,
    profile: bool,
}

#[derive(Default)]
struct Shared {
    /// Batches handed over, batches retired.
    progress: Mutex<(u64, u64)>,
    retired: Condvar,
    recycled: Mutex<Vec<Batch<Vulkan>>>,
    /// Command buffers whose work completed, for the recording thread.
    free: Mutex<Vec<CommandSet>>,
    events: Mutex<Vec<ProfileEvent>>,
}

/// A command buffer and the descriptor pools its execs allocate from.
struct CommandSet {
    buffer: vk::CommandBuffer,
    pools: Vec<vk::DescriptorPool>,
    /// How many of `pools` this recording used.
    used: usize,
    /// Timestamps around each command while profiling (made on first
    /// use), and how many this recording wrote.
    queries: vk::QueryPool,
    written: u32,
}

/// Timestamps a command buffer holds: two per timed command.
const QUERIES: u32 = 512;

impl VulkanEngine {
    pub(super) fn new(device: VulkanDevice, kind: QueueKind) -> Result<Self> {
        let ledger = Ledger::new();
        let shared = Arc::new(Shared::default());
        let context = device.context().clone();
        let family = match kind {
            QueueKind::Copy => context.transfer_family.unwrap_or(context.compute_family),
            QueueKind::Compute => context.compute_family,
        };
        let recorder = Recorder::new(device.clone(), family, kind, shared.clone(), &ledger)?;
        let (jobs, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("hwqueue-vulkan {}", queue_label(ledger.id(), kind)))
            .spawn({
                let ledger = ledger.clone();
                move || recorder.run(&ledger, receiver)
            })
            .map_err(|error| Error::System {
                what: "spawning a Vulkan queue's recording thread",
                detail: error.to_string(),
            })?;
        Ok(Self {
            ledger,
            kind,
            profiling: false,
            state: Box::new(EngineState {
                device,
                jobs: Some(jobs),
                shared,
                recorder: Some(thread),
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
        let max = self
            .state
            .device
            .context()
            .limits()
            .max_storage_buffer_range as usize;
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

    fn submit(&mut self, batch: Batch<Vulkan>) -> Batch<Vulkan> {
        self.state.shared.progress.lock().0 += 1;
        if let Some(jobs) = &self.state.jobs {
            // The thread ends only once this sender is dropped.
            let _ = jobs.send(Job {
                batch,
                profile: self.profiling,
            });
        }
        self.state.shared.recycled.lock().pop().unwrap_or_default()
    }

    fn synchronize(&mut self) {
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
}

impl Drop for VulkanEngine {
    /// Lets the work already submitted finish, then the threads end.
    fn drop(&mut self) {
        self.state.jobs = None;
        if let Some(thread) = self.state.recorder.take() {
            let _ = thread.join();
        }
    }
}

/// What the retire thread waits for and then releases, for one batch.
struct Retire {
    batch: Batch<Vulkan>,
    /// The progress value of the batch's last submission (`None`: it
    /// submitted nothing).
    progress: Option<u64>,
    sets: Vec<CommandSet>,
    /// Staging ranges of the device's own pool (no allocation of the
    /// driver's a transfer), going back to it when the batch retired.
    staging: Vec<VulkanBuffer>,
    /// Downloads: the command's index and the staging range (an index into
    /// `staging`) holding its bytes.
    downloads: Vec<(usize, usize)>,
    /// The signals its submissions set: the retire thread sees each reached
    /// (a submission's semaphores are signalled in no set order, so the
    /// progress value alone does not say the others are).
    signals: Vec<(vk::Semaphore, u64)>,
    /// Per command, when its submission was handed to the `VkQueue`
    /// (profiling only).
    submitted_ns: Vec<u64>,
    /// Commands `stamped..upto` are recorded and not yet submitted.
    stamped: usize,
    upto: usize,
    /// Commands timed on the device: index, query pool, first query.
    timed: Vec<(usize, vk::QueryPool, u32)>,
    profile: bool,
}

/// How device timestamps map onto the host's clock (`now_ns`): nanoseconds
/// per tick, and the host time of tick 0, measured once per queue by
/// writing a timestamp between two host readings (their midpoint; the
/// clocks' drift over a process's life is not corrected).
#[derive(Clone, Copy)]
struct Clock {
    period: f64,
    zero_ns: f64,
}

impl Clock {
    fn host_ns(self, ticks: u64) -> u64 {
        (self.zero_ns + ticks as f64 * self.period).max(0.0) as u64
    }
}

/// The recording thread's state.
struct Recorder {
    /// The device: its pool gives the staging memory.
    device: VulkanDevice,
    context: Arc<Context>,
    kind: QueueKind,
    label: String,
    pool: vk::CommandPool,
    /// The queue's own timeline: each submission signals the next value.
    progress: vk::Semaphore,
    next: u64,
    shared: Arc<Shared>,
    /// The batch being recorded: what its submissions hold.
    current: Option<Retire>,
    /// The command buffer being recorded, and the index of its first
    /// command (what fails if it cannot be submitted).
    open: Option<(CommandSet, usize)>,
    /// Waits of the next submission.
    waits: Vec<(vk::Semaphore, u64)>,
    /// A 16-byte buffer bound for an empty view.
    dummy: VulkanBlock,
    /// Device timestamps, where the queue's family has them.
    clock: Option<Clock>,
    /// The query of the command being recorded, to close after it.
    timing: Option<(vk::QueryPool, u32)>,
    /// What the open command buffer's commands touched since its last
    /// barrier.
    touched: Touched,
}

/// Bytes of a `VkBuffer` a command touches: buffer, offset, length (0 for
/// the rest of the buffer, as a descriptor's `VK_WHOLE_SIZE`).
type Bytes = (vk::Buffer, u64, u64);

/// The bytes read and written since a barrier.
#[derive(Default)]
struct Touched {
    reads: Vec<Bytes>,
    writes: Vec<Bytes>,
    /// The command buffer was just begun: its first command gets a barrier.
    fresh: bool,
}

impl Touched {
    fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
    }

    /// Whether a command reading `reads` and writing `writes` must wait
    /// for what was touched: read after write, write after write, write
    /// after read.
    fn conflicts(&self, reads: &[Bytes], writes: &[Bytes]) -> bool {
        let overlap = |a: &Bytes, b: &Bytes| {
            let end = |x: &Bytes| if x.2 == 0 { u64::MAX } else { x.1 + x.2 };
            a.0 == b.0 && a.1 < end(b) && b.1 < end(a)
        };
        let any = |mine: &[Bytes], theirs: &[Bytes]| {
            mine.iter().any(|a| theirs.iter().any(|b| overlap(a, b)))
        };
        any(reads, &self.writes) || any(writes, &self.writes) || any(writes, &self.reads)
    }

    fn add(&mut self, reads: &[Bytes], writes: &[Bytes]) {
        self.reads.extend_from_slice(reads);
        self.writes.extend_from_slice(writes);
    }
}

// SAFETY: the handles are plain Vulkan handles, used only on the
// recording thread (the pool and descriptor pools, which need external
// synchronisation) or, for the semaphores and buffers, through calls
// that are thread-safe.
unsafe impl Send for Recorder {}

impl Recorder {
    fn new(
        owner: VulkanDevice,
        family: u32,
        kind: QueueKind,
        shared: Arc<Shared>,
        ledger: &Ledger,
    ) -> Result<Self> {
        let context = owner.context().clone();
        let device = &context.device;
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        // SAFETY: create-infos live across the calls; what is made is
        // destroyed when the recording thread ends.
        let (pool, progress) = unsafe {
            let pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(|e| context.error("vkCreateCommandPool", e))?;
            let progress = match device.create_semaphore(
                &vk::SemaphoreCreateInfo::default().push_next(&mut timeline),
                None,
            ) {
                Ok(semaphore) => semaphore,
                Err(e) => {
                    device.destroy_command_pool(pool, None);
                    return Err(context.error("vkCreateSemaphore", e));
                }
            };
            (pool, progress)
        };
        let dummy = make_buffer(&context, 16).map_err(|(call, e)| context.error(&call, e))?;
        let mut recorder = Self {
            label: queue_label(ledger.id(), kind),
            device: owner,
            context,
            kind,
            pool,
            progress,
            next: 0,
            shared,
            current: None,
            open: None,
            waits: Vec::new(),
            dummy,
            clock: None,
            timing: None,
            touched: Touched::default(),
        };
        let bits = recorder.context.physical.families[family as usize].timestamp_valid_bits;
        let period = f64::from(recorder.context.limits().timestamp_period);
        if bits > 0 && period > 0.0 {
            // Without a clock, profiles use the host's times.
            recorder.clock = recorder.calibrate(period).ok();
        }
        Ok(recorder)
    }

    /// Writes one timestamp between two readings of the host's clock: the
    /// device's tick 0 on the host's clock.
    fn calibrate(&mut self, period: f64) -> Result<Clock> {
        let queries = self.query_pool()?;
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let device = &self.context.device;
        // SAFETY: the pool is this thread's; the command buffer records one
        // timestamp, is submitted once, waited for, and freed; the query
        // pool is destroyed after its result is read.
        unsafe {
            let buffer = device
                .allocate_command_buffers(&info)
                .map_err(|e| self.context.error("vkAllocateCommandBuffers", e))?[0];
            let recorded = device
                .begin_command_buffer(buffer, &vk::CommandBufferBeginInfo::default())
                .and_then(|()| {
                    device.cmd_reset_query_pool(buffer, queries, 0, 1);
                    device.cmd_write_timestamp(
                        buffer,
                        vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                        queries,
                        0,
                    );
                    device.end_command_buffer(buffer)
                });
            let value = self.next + 1;
            let submitted = recorded.and_then(|()| {
                let buffers = [buffer];
                let signals = [self.progress];
                let values = [value];
                let mut timeline =
                    vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
                let submit = vk::SubmitInfo::default()
                    .command_buffers(&buffers)
                    .signal_semaphores(&signals)
                    .push_next(&mut timeline);
                let queue = self.queue().lock();
                device.queue_submit(*queue, &[submit], vk::Fence::null())
            });
            let before = now_ns();
            let outcome = submitted.and_then(|()| {
                let semaphores = [self.progress];
                let values = [value];
                device.wait_semaphores(
                    &vk::SemaphoreWaitInfo::default()
                        .semaphores(&semaphores)
                        .values(&values),
                    5_000_000_000,
                )
            });
            let after = now_ns();
            let mut ticks = [0u64; 1];
            let read = outcome.and_then(|()| {
                device.get_query_pool_results(
                    queries,
                    0,
                    &mut ticks,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            });
            if outcome.is_ok() {
                self.next = value;
            }
            device.free_command_buffers(self.pool, &[buffer]);
            device.destroy_query_pool(queries, None);
            read.map_err(|e| self.context.error("calibrating the queue's timestamps", e))?;
            let midpoint = (before as f64 + after as f64) / 2.0;
            Ok(Clock {
                period,
                zero_ns: midpoint - ticks[0] as f64 * period,
            })
        }
    }

    /// A pool of [`QUERIES`] timestamps.
    fn query_pool(&self) -> Result<vk::QueryPool> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(QUERIES);
        // SAFETY: the create-info lives across the call.
        unsafe { self.context.device.create_query_pool(&info, None) }
            .map_err(|e| self.context.error("vkCreateQueryPool", e))
    }

    /// The `VkQueue` this queue submits to.
    fn queue(&self) -> &Mutex<vk::Queue> {
        match self.kind {
            QueueKind::Copy => self
                .context
                .transfer_queue
                .as_ref()
                .unwrap_or(&self.context.compute_queue),
            QueueKind::Compute => &self.context.compute_queue,
        }
    }

    /// Settles each batch in order until the engine is dropped; then
    /// waits for the retire thread and frees what it made.
    fn run(mut self, ledger: &Ledger, jobs: Receiver<Job>) {
        let (retire, retiring) = mpsc::channel::<Retire>();
        let retirer = {
            let context = self.context.clone();
            let shared = self.shared.clone();
            let progress = self.progress;
            let label: crate::profile::Name = self.label.as_str().into();
            let clock = self.clock;
            std::thread::Builder::new()
                .name(format!("hwqueue-vulkan-retire {}", self.label))
                .spawn(move || retire_all(&context, progress, &shared, &label, clock, retiring))
        };
        for Job { batch, profile } in jobs {
            self.current = Some(Retire {
                batch: Batch::default(),
                progress: None,
                sets: Vec::new(),
                staging: Vec::new(),
                downloads: Vec::new(),
                signals: Vec::new(),
                submitted_ns: vec![0; if profile { batch.commands().len() } else { 0 }],
                stamped: 0,
                upto: 0,
                timed: Vec::new(),
                profile,
            });
            ledger.settle(&batch, |batch| self.run_batch(batch));
            let mut done = self.current.take().expect("set above");
            done.batch = batch;
            match &retirer {
                Ok(_) => {
                    let _ = retire.send(done);
                }
                // No retire thread: wait here.
                Err(_) => retire_one(&self.context, self.progress, &self.shared, None, done),
            }
        }
        drop(retire);
        if let Ok(thread) = retirer {
            let _ = thread.join();
        }
        ledger.retire();
        let device = &self.context.device;
        // SAFETY: every submission completed (the retire thread waited for
        // each), so nothing uses these objects any more.
        unsafe {
            for set in self.shared.free.lock().drain(..) {
                for pool in set.pools {
                    device.destroy_descriptor_pool(pool, None);
                }
                if set.queries != vk::QueryPool::null() {
                    device.destroy_query_pool(set.queries, None);
                }
            }
            device.destroy_command_pool(self.pool, None);
            device.destroy_semaphore(self.progress, None);
        }
        free_buffer(&self.context, &self.dummy);
    }

    fn run_batch(&mut self, batch: &Batch<Vulkan>) -> std::result::Result<(), (usize, Error)> {
        for (index, command) in batch.commands().iter().enumerate() {
            self.current.as_mut().expect("a batch is recording").upto = index + 1;
            let outcome = self.command(batch, index, command);
            self.close_timing(index);
            if let Err(error) = outcome {
                // What was recorded before the failure still runs; where it
                // cannot be submitted, it fails too.
                let from = self.open.as_ref().map_or(index, |(_, first)| *first);
                return Err(match self.flush(None) {
                    Ok(()) => (index, error),
                    Err(_) => (from, error),
                });
            }
        }
        if self.open.is_some() || !self.waits.is_empty() {
            let from = self.open.as_ref().map_or(0, |(_, first)| *first);
            self.flush(None).map_err(|error| (from, error))?;
        }
        Ok(())
    }

    fn command(
        &mut self,
        batch: &Batch<Vulkan>,
        index: usize,
        command: &Command<Vulkan>,
    ) -> Result<()> {
        match command {
            Command::Wait { signal, value } => self.wait(signal, *value, false),
            Command::WaitSettled { signal, value } => self.wait(signal, *value, true),
            Command::WaitForeign { signal, value } => {
                self.flush(None)?;
                signal.wait_forever(*value)
            }
            Command::Signal { signal, value } => {
                if signal.is_submitted(*value) {
                    // At or below what it holds or is promised: values only
                    // rise (a timeline semaphore must not be signalled
                    // lower), so this signal does nothing.
                    return Ok(());
                }
                self.flush(Some((signal.semaphore(), *value)))?;
                signal.note_submitted(*value);
                self.current
                    .as_mut()
                    .expect("a batch is recording")
                    .signals
                    .push((signal.semaphore(), *value));
                Ok(())
            }
            Command::Exec {
                program,
                buffers,
                scalars,
                params,
            } => self.exec(
                index,
                program,
                &batch.buffers()[buffers.clone()],
                &batch.scalars()[scalars.clone()],
                params,
            ),
            Command::Copy { dst, src } => {
                let (from, to) = (self.device_range(src)?, self.device_range(dst)?);
                self.copy(index, from, to, src.len())
            }
            Command::Fill {
                dst,
                pattern,
                width,
            } => self.fill(index, dst, pattern, *width),
            Command::Upload { dst, data } => self.upload(index, dst, batch.host_bytes(data)),
            Command::Download { src, .. } => {
                let len = src.len();
                let staging = self.staging(len.max(4))?;
                let from = self.device_range(src)?;
                self.copy(index, from, staging.0, len)?;
                self.current
                    .as_mut()
                    .expect("a batch is recording")
                    .downloads
                    .push((index, staging.1));
                Ok(())
            }
            // Every command is preceded by a full barrier already.
            Command::Barrier | Command::Alloca { .. } => Ok(()),
            // The buffer's range goes back once the batch retired: every
            // command before this one completed by then.
            Command::Dealloca { .. } => Ok(()),
        }
    }

    /// A wait on a Vulkan signal: a semaphore wait of the next submission,
    /// once a submission signalling the value is on a `VkQueue`.
    fn wait(&mut self, signal: &super::VulkanSignal, value: u64, is_settled: bool) -> Result<()> {
        if signal.is_reached(value) {
            return Ok(());
        }
        // The work recorded so far must not wait.
        self.flush(None)?;
        if !signal.is_of(&self.context) {
            // Another device's semaphore cannot be waited on here: the
            // host waits for it, as for another backend's signal.
            let waited = signal.wait(value, crate::signal::Timeout::Forever);
            return if is_settled { settled(waited) } else { waited };
        }
        match signal.wait_submitted(value) {
            Ok(()) => {
                self.waits.push((signal.semaphore(), value));
                Ok(())
            }
            Err(error) if is_settled => settled(Err(error)),
            Err(error) => Err(error),
        }
    }

    /// The `VkBuffer` and offset of `view`: a block's buffer, or the dummy
    /// for an empty buffer.
    fn device_range(&self, view: &View<Vulkan>) -> Result<(vk::Buffer, u64)> {
        Ok(match view.buffer().queue_address()? {
            Some(address) => (address.buffer, address.offset + view.offset() as u64),
            None => (self.dummy.buffer(), 0),
        })
    }

    /// `len` bytes (more than 0) of staging memory, a range of the
    /// device's pool held until the batch retires: where the device sees
    /// it, and its index in the batch's staging list.
    fn staging(&mut self, len: usize) -> Result<((vk::Buffer, u64), usize)> {
        let range = VulkanBuffer::allocate(self.device.pool(), len, false, false)?;
        let address = range
            .queue_address()?
            .expect("a range of more than 0 bytes has an address");
        let current = self.current.as_mut().expect("a batch is recording");
        current.staging.push(range);
        Ok(((address.buffer, address.offset), current.staging.len() - 1))
    }

    fn upload(&mut self, index: usize, dst: &View<Vulkan>, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (from, at) = self.staging(bytes.len())?;
        let current = self.current.as_ref().expect("a batch is recording");
        current.staging[at].write_at(0, bytes)?;
        let to = self.device_range(dst)?;
        self.copy(index, from, to, bytes.len())
    }

    /// Records a copy of `len` bytes (none for 0) from `from` to `to`
    /// (each a `VkBuffer` and an offset), for command `index`.
    fn copy(
        &mut self,
        index: usize,
        from: (vk::Buffer, u64),
        to: (vk::Buffer, u64),
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let len64 = len as u64;
        let cb = self.begin(index, &[(from.0, from.1, len64)], &[(to.0, to.1, len64)])?;
        let region = [vk::BufferCopy {
            src_offset: from.1,
            dst_offset: to.1,
            size: len as u64,
        }];
        // SAFETY: both ranges lie in live buffers the batch holds (views
        // checked at record time, staging buffers held until it retires);
        // the command buffer records.
        unsafe {
            self.context
                .device
                .cmd_copy_buffer(cb, from.0, to.0, &region);
        }
        Ok(())
    }

    fn fill(
        &mut self,
        index: usize,
        dst: &View<Vulkan>,
        pattern: &[u8; 4],
        width: u8,
    ) -> Result<()> {
        let len = dst.len();
        if len == 0 {
            return Ok(());
        }
        let (buffer, offset) = self.device_range(dst)?;
        if offset.is_multiple_of(4) && len.is_multiple_of(4) {
            // A pattern of 1 or 2 bytes repeats within a word.
            let mut word = [0u8; 4];
            for (at, byte) in word.iter_mut().enumerate() {
                *byte = pattern[at % usize::from(width)];
            }
            let cb = self.begin(index, &[], &[(buffer, offset, len as u64)])?;
            // SAFETY: the range lies in a live buffer, offset and size are
            // multiples of 4.
            unsafe {
                self.context.device.cmd_fill_buffer(
                    cb,
                    buffer,
                    offset,
                    len as u64,
                    u32::from_ne_bytes(word),
                );
            }
            return Ok(());
        }
        let bytes: Vec<u8> = pattern[..usize::from(width)]
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect();
        self.upload(index, dst, &bytes)
    }

    fn exec(
        &mut self,
        index: usize,
        program: &VulkanProgram,
        views: &[View<Vulkan>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        let pipeline = program.pipeline(&self.context, params.local())?;
        let push = program.push_constants(scalars)?;
        let mut infos = Vec::with_capacity(views.len());
        for view in views {
            let (buffer, offset) = self.device_range(view)?;
            let range = if view.is_empty() {
                vk::WHOLE_SIZE
            } else {
                view.len() as u64
            };
            infos.push(vk::DescriptorBufferInfo {
                buffer,
                offset,
                range,
            });
        }
        let whole = |info: &vk::DescriptorBufferInfo| {
            let len = if info.range == vk::WHOLE_SIZE {
                0
            } else {
                info.range
            };
            (info.buffer, info.offset, len)
        };
        let reads: Vec<Bytes> = infos.iter().map(whole).collect();
        let writes: Vec<Bytes> = infos
            .iter()
            .enumerate()
            .filter(|(at, _)| program.writes(*at))
            .map(|(_, info)| whole(info))
            .collect();
        let cb = self.begin(index, &reads, &writes)?;
        let set = self.descriptor_set(&pipeline, views.len())?;
        let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
            .iter()
            .enumerate()
            .map(|(binding, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(binding as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(std::slice::from_ref(info))
            })
            .collect();
        let groups = params.groups();
        let device = &self.context.device;
        // SAFETY: the set is fresh from a pool of this thread's, the
        // buffers live (the batch holds them), the command buffer records;
        // the pipeline is held by the program, which the batch holds.
        unsafe {
            device.update_descriptor_sets(&writes, &[]);
            device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            device.cmd_bind_descriptor_sets(
                cb,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.layout,
                0,
                &[set],
                &[],
            );
            if !push.is_empty() {
                device.cmd_push_constants(
                    cb,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    &push,
                );
            }
            device.cmd_dispatch(cb, groups[0], groups[1], groups[2]);
        }
        Ok(())
    }

    /// A descriptor set of `pipeline`'s layout from the open command
    /// set's pools (a new pool where they are full).
    fn descriptor_set(&mut self, pipeline: &Pipeline, buffers: usize) -> Result<vk::DescriptorSet> {
        let device = &self.context.device;
        let (set, _) = self.open.as_mut().expect("begun");
        let layouts = [pipeline.set_layout];
        loop {
            if set.used < set.pools.len() {
                let info = vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(set.pools[set.used])
                    .set_layouts(&layouts);
                // SAFETY: the pool is this thread's, the layout alive.
                match unsafe { device.allocate_descriptor_sets(&info) } {
                    Ok(sets) => return Ok(sets[0]),
                    Err(
                        vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL,
                    ) => {
                        set.used += 1;
                        continue;
                    }
                    Err(e) => return Err(self.context.error("vkAllocateDescriptorSets", e)),
                }
            }
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: (64 * buffers.max(8)) as u32,
            }];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(64)
                .pool_sizes(&sizes);
            // SAFETY: the create-info lives across the call.
            let pool = unsafe { device.create_descriptor_pool(&info, None) }
                .map_err(|e| self.context.error("vkCreateDescriptorPool", e))?;
            set.pools.push(pool);
        }
    }

    /// The open command buffer (begun if none is) for command `index`,
    /// which reads `reads` and writes `writes`: with a barrier before it
    /// where it must come after a command of the buffer since the last
    /// barrier (it reads or writes bytes one wrote, or writes bytes one
    /// read), and always at the start of a buffer, which orders it after
    /// the `VkQueue`'s earlier submissions.
    fn begin(
        &mut self,
        index: usize,
        reads: &[Bytes],
        writes: &[Bytes],
    ) -> Result<vk::CommandBuffer> {
        let device = &self.context.device;
        if self.open.is_none() {
            let mut set = match self.shared.free.lock().pop() {
                Some(set) => set,
                None => {
                    let info = vk::CommandBufferAllocateInfo::default()
                        .command_pool(self.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1);
                    // SAFETY: the pool is this thread's.
                    let buffers = unsafe { device.allocate_command_buffers(&info) }
                        .map_err(|e| self.context.error("vkAllocateCommandBuffers", e))?;
                    CommandSet {
                        buffer: buffers[0],
                        pools: Vec::new(),
                        used: 0,
                        queries: vk::QueryPool::null(),
                        written: 0,
                    }
                }
            };
            // SAFETY: the set's work completed (the retire thread handed it
            // back, or it is new); its pools and buffer are this thread's.
            unsafe {
                for &pool in &set.pools {
                    device
                        .reset_descriptor_pool(pool, vk::DescriptorPoolResetFlags::empty())
                        .map_err(|e| self.context.error("vkResetDescriptorPool", e))?;
                }
                device
                    .begin_command_buffer(
                        set.buffer,
                        &vk::CommandBufferBeginInfo::default()
                            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                    )
                    .map_err(|e| self.context.error("vkBeginCommandBuffer", e))?;
            }
            set.used = 0;
            set.written = 0;
            self.open = Some((set, index));
            self.touched.clear();
            self.touched.fresh = true;
        }
        let buffer = self.open.as_ref().expect("just opened").0.buffer;
        let hazard = self.touched.fresh || self.touched.conflicts(reads, writes);
        self.touched.fresh = false;
        if !hazard {
            self.touched.add(reads, writes);
            self.open_timing(buffer)?;
            return Ok(buffer);
        }
        self.touched.clear();
        self.touched.add(reads, writes);
        let stages = self.stages();
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)];
        // SAFETY: the command buffer records.
        unsafe {
            device.cmd_pipeline_barrier(
                buffer,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
        }
        self.open_timing(buffer)?;
        Ok(buffer)
    }

    /// While profiling with a clock: a timestamp before the command about
    /// to be recorded (its pair is written by `close_timing`).
    fn open_timing(&mut self, buffer: vk::CommandBuffer) -> Result<()> {
        let profiling = self.current.as_ref().is_some_and(|c| c.profile);
        if !profiling || self.clock.is_none() || self.timing.is_some() {
            return Ok(());
        }
        let (set, _) = self.open.as_mut().expect("begun");
        if set.queries == vk::QueryPool::null() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(QUERIES);
            // SAFETY: the create-info lives across the call; the pool is
            // destroyed with the command set.
            set.queries = unsafe { self.context.device.create_query_pool(&info, None) }
                .map_err(|e| self.context.error("vkCreateQueryPool", e))?;
        }
        if set.written + 2 > QUERIES {
            // Full: later commands of this buffer keep the host's times.
            return Ok(());
        }
        let device = &self.context.device;
        // SAFETY: the command buffer records; the queries are in range.
        unsafe {
            if set.written == 0 {
                device.cmd_reset_query_pool(buffer, set.queries, 0, QUERIES);
            }
            device.cmd_write_timestamp(
                buffer,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                set.queries,
                set.written,
            );
        }
        self.timing = Some((set.queries, set.written));
        set.written += 2;
        Ok(())
    }

    /// Ends the timing `open_timing` began for command `index`.
    fn close_timing(&mut self, index: usize) {
        let Some((queries, first)) = self.timing.take() else {
            return;
        };
        if let Some((set, _)) = &self.open {
            // SAFETY: the command buffer records (the command just recorded
            // into it); the query is in range.
            unsafe {
                self.context.device.cmd_write_timestamp(
                    set.buffer,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    queries,
                    first + 1,
                );
            }
            if let Some(current) = self.current.as_mut() {
                current.timed.push((index, queries, first));
            }
        }
    }

    /// The stages a queue of this kind runs.
    fn stages(&self) -> vk::PipelineStageFlags {
        match self.kind {
            QueueKind::Compute => {
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER
            }
            QueueKind::Copy => vk::PipelineStageFlags::TRANSFER,
        }
    }

    /// Submits what is recorded and the waits gathered, signalling the
    /// progress semaphore and, where given, a signal.
    fn flush(&mut self, signal: Option<(vk::Semaphore, u64)>) -> Result<()> {
        if self.open.is_none() && self.waits.is_empty() && signal.is_none() {
            return Ok(());
        }
        if let Err(lost) = self.context.health() {
            // Nothing more runs on a lost device: the recorded buffer goes
            // back unsubmitted.
            self.waits.clear();
            if let Some((set, _)) = self.open.take() {
                // SAFETY: the command buffer records; ending it lets its
                // next `begin` reset it.
                let _ = unsafe { self.context.device.end_command_buffer(set.buffer) };
                self.shared.free.lock().push(set);
            }
            return Err(lost);
        }
        let device = &self.context.device;
        let open = self.open.take();
        if let Some((set, _)) = &open {
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)];
            // SAFETY: the command buffer records; it ends here.
            unsafe {
                device.cmd_pipeline_barrier(
                    set.buffer,
                    self.stages(),
                    vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                );
                device
                    .end_command_buffer(set.buffer)
                    .map_err(|e| self.context.error("vkEndCommandBuffer", e))?;
            }
        }
        let value = self.next + 1;
        let waits: Vec<vk::Semaphore> = self.waits.iter().map(|w| w.0).collect();
        let wait_values: Vec<u64> = self.waits.iter().map(|w| w.1).collect();
        let wait_stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; waits.len()];
        let mut signals = vec![self.progress];
        let mut signal_values = vec![value];
        if let Some((semaphore, at)) = signal {
            signals.push(semaphore);
            signal_values.push(at);
        }
        let buffers: Vec<vk::CommandBuffer> = open.iter().map(|(set, _)| set.buffer).collect();
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&waits)
            .wait_dst_stage_mask(&wait_stages)
            .command_buffers(&buffers)
            .signal_semaphores(&signals)
            .push_next(&mut timeline);
        let outcome = {
            let queue = self.queue().lock();
            // SAFETY: the queue is locked (submits need external
            // synchronisation); every semaphore and the command buffer
            // live until the retire thread saw `value`.
            unsafe { device.queue_submit(*queue, &[submit], vk::Fence::null()) }
        };
        self.waits.clear();
        let current = self.current.as_mut().expect("a batch is recording");
        match outcome {
            Ok(()) => {
                self.next = value;
                current.progress = Some(value);
                if current.profile {
                    let now = now_ns();
                    let (from, to) = (current.stamped, current.upto);
                    for stamp in current.submitted_ns.get_mut(from..to).unwrap_or_default() {
                        *stamp = now;
                    }
                    current.stamped = to;
                }
                if let Some((set, _)) = open {
                    current.sets.push(set);
                }
                Ok(())
            }
            Err(e) => {
                if let Some((set, _)) = open {
                    // Never submitted: reusable at once.
                    self.shared.free.lock().push(set);
                }
                Err(self.context.error("vkQueueSubmit", e))
            }
        }
    }
}

/// The retire thread: each batch in order, once its submissions completed.
fn retire_all(
    context: &Context,
    progress: vk::Semaphore,
    shared: &Shared,
    label: &crate::profile::Name,
    clock: Option<Clock>,
    batches: Receiver<Retire>,
) {
    let mut names = EventNames::new();
    for batch in batches {
        retire_one(
            context,
            progress,
            shared,
            Some((label, &mut names, clock)),
            batch,
        );
    }
}

fn retire_one(
    context: &Context,
    progress: vk::Semaphore,
    shared: &Shared,
    profile: Option<(&crate::profile::Name, &mut EventNames, Option<Clock>)>,
    mut done: Retire,
) {
    // The queue's progress, then every signal the batch set: a
    // submission's semaphores are signalled in no set order.
    let mut waits: Vec<(vk::Semaphore, u64)> = done
        .progress
        .map(|value| (progress, value))
        .into_iter()
        .collect();
    waits.extend_from_slice(&done.signals);
    let lost = wait_all_semaphores(context, &waits).err();
    let finished = now_ns();
    for &(index, at) in &done.downloads {
        if let Some(Command::Download { src, sink }) = done.batch.commands().get(index) {
            match &lost {
                Some(error) => sink.fail(error),
                None => {
                    // The device wrote the range before the progress value.
                    let staging = &done.staging[at];
                    let _ = sink.complete(|out| staging.read_at(0, &mut out[..src.len()]));
                }
            }
        }
    }
    for command in done.batch.commands() {
        if let Command::Dealloca { buffer } = command {
            crate::memory::dealloca_completed(buffer);
        }
    }
    if let (true, Some((label, names, clock))) = (done.profile, profile) {
        // Device times where the command was timed, else from its
        // submission to the host seeing it complete.
        let mut device_times = vec![None; done.batch.commands().len()];
        if let (Some(clock), None) = (clock, &lost) {
            for &(index, queries, first) in &done.timed {
                let mut ticks = [0u64; 2];
                // SAFETY: the pool lives (the batch's command set holds
                // it) and both timestamps were written: the submission
                // completed.
                let read = unsafe {
                    context.device.get_query_pool_results(
                        queries,
                        first,
                        &mut ticks,
                        vk::QueryResultFlags::TYPE_64,
                    )
                };
                if read.is_ok() && ticks[1] >= ticks[0] {
                    device_times[index] = Some((clock.host_ns(ticks[0]), clock.host_ns(ticks[1])));
                }
            }
        }
        let mut events = shared.events.lock();
        // Events start in queue order: a command without device times (a
        // wait, a signal) sits at the end of the one before it, and a
        // calibration error never puts a command before the one ahead.
        let mut last_end: Option<u64> = None;
        for (index, command) in done.batch.commands().iter().enumerate() {
            let host = || {
                let start = done.submitted_ns.get(index).copied().unwrap_or(finished);
                if start == 0 { finished } else { start }
            };
            let (start, end) = match (device_times[index], last_end) {
                (Some((start, end)), Some(last)) => (start.max(last), end.max(start.max(last))),
                (Some(times), None) => times,
                (None, Some(last)) => (last, last),
                (None, None) => (host(), host()),
            };
            last_end = Some(end);
            events.push(describe(command, names).into_event(
                label.clone(),
                done.batch.sequence(),
                index,
                start,
                end,
            ));
        }
    }
    done.staging.clear();
    shared.free.lock().append(&mut done.sets);
    done.batch.clear();
    shared.recycled.lock().push(done.batch);
    shared.progress.lock().1 += 1;
    shared.retired.notify_all();
}

/// Blocks until every semaphore of `waits` reached its value; the error of
/// a failed wait (a lost device). The semaphores must live across the call.
fn wait_all_semaphores(context: &Context, waits: &[(vk::Semaphore, u64)]) -> Result<()> {
    if waits.is_empty() {
        return Ok(());
    }
    let (semaphores, values): (Vec<vk::Semaphore>, Vec<u64>) = waits.iter().copied().unzip();
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&semaphores)
        .values(&values);
    loop {
        // SAFETY: the caller keeps the semaphores alive (the recording
        // thread's progress semaphore outlives the retire thread; a batch
        // holds its signals); the arrays live across the call.
        match unsafe { context.device.wait_semaphores(&info, 1_000_000_000) } {
            Ok(()) => return Ok(()),
            Err(vk::Result::TIMEOUT) => {}
            Err(e) => return Err(context.error("vkWaitSemaphores (a batch's completion)", e)),
        }
    }
}
