//! [`SimEngine`]: runs a queue's batches asynchronously on a device thread
//! of its own, the way a GPU's command processor does.
//!
//! `submit` hands the batch to the thread and returns at once; the thread
//! owns the batch (and so every buffer and program its commands name)
//! until it has settled it through the [`Ledger`] ([`Ledger::settle`], on
//! the device thread: admitted, run command by command with each `signal`
//! set as its command completes, and failed from the command that failed).
//! The finished batch comes back, cleared, for the queue to record into
//! again.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};

use hwqueue::error::panic_message;
use hwqueue::memory::Access;
use hwqueue::profile::{EventNames, describe, now_ns};
use hwqueue::queue::{Batch, Command, Engine, Ledger, queue_label};
use hwqueue::{
    Error, ExecParams, Limits, ProfileEvent, Program, QueueKind, Result, Scalar, TimelineSignal,
    Timeout, View,
};

use crate::buffer::SimBuffer;
use crate::memory::lock;
use crate::program::{KernelArgs, SimProgram};
use crate::replay::{Mark, Template};
use crate::{Defect, Sim, SimDevice};

/// A batch handed to the device thread.
struct Job {
    batch: Batch<Sim>,
    profile: bool,
    mark: Mark,
}

/// Templates kept per queue (one per key; the oldest goes).
const TEMPLATES: usize = 32;

/// What the owner and the device thread share.
#[derive(Default)]
struct Shared {
    /// Batches handed over and batches settled.
    progress: Mutex<(u64, u64)>,
    settled: Condvar,
    /// Finished batches, cleared, for `submit` to hand back.
    recycled: Mutex<Vec<Batch<Sim>>>,
    events: Mutex<Vec<ProfileEvent>>,
    /// Kernels run one by one, and recorded programs run again
    /// (`hwqueue::Launches`).
    kernels: AtomicU64,
    repeats: AtomicU64,
}

/// The engine of a simulated device's queue: see the module docs.
pub struct SimEngine {
    ledger: Ledger,
    device: SimDevice,
    kind: QueueKind,
    /// To the device thread, which ends once this is dropped and it ran
    /// what it was sent.
    jobs: Sender<Job>,
    shared: Arc<Shared>,
    profiling: bool,
    /// [`Defect::SwapBatches`]: the batch held back to run after the next.
    held: Option<(Batch<Sim>, Mark)>,
    submitted: u64,
    /// The replay key of the batch `submit` takes next.
    replay_key: Option<u32>,
    /// The template of the last batch marked with each key (`crate::replay`).
    templates: Vec<Arc<Template>>,
    /// The programs `replay_recorded` found for the batch submitted next.
    next: Option<(u32, Arc<Vec<Vec<crate::replay::Kernel>>>)>,
}

impl SimEngine {
    pub(crate) fn new(device: SimDevice, kind: QueueKind) -> Result<Self> {
        let ledger = Ledger::new();
        let shared = Arc::new(Shared::default());
        let (jobs, receiver) = mpsc::channel();
        let thread = DeviceThread {
            device: device.clone(),
            label: queue_label(ledger.id(), kind),
            queue: None,
            shared: shared.clone(),
            names: EventNames::new(),
        };
        std::thread::Builder::new()
            .name(format!("hwqueue-sim {}", thread.label))
            .spawn({
                let ledger = ledger.clone();
                move || thread.run(&ledger, receiver)
            })
            .map_err(|error| Error::System {
                what: "spawning a simulated device thread",
                detail: error.to_string(),
            })?;
        Ok(Self {
            ledger,
            device,
            kind,
            jobs,
            shared,
            profiling: false,
            held: None,
            submitted: 0,
            replay_key: None,
            templates: Vec::new(),
            next: None,
        })
    }

    fn defect(&self) -> Option<Defect> {
        self.device.config().defect
    }

    /// Hands `batch` to the device thread.
    fn send(&mut self, batch: Batch<Sim>, mark: Mark) {
        lock(&self.shared.progress).0 += 1;
        let job = Job {
            batch,
            profile: self.profiling,
            mark,
        };
        // The thread only ends once this sender is dropped: it receives.
        let _ = self.jobs.send(job);
    }

    fn wait_settled(&self) {
        let mut progress = lock(&self.shared.progress);
        while progress.1 < progress.0 {
            progress = self
                .shared
                .settled
                .wait(progress)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// How the batch `submit` takes goes (`crate::replay`): a repeat of
    /// the programs `replay_recorded` found where it names them, else,
    /// marked with a key, a new template for the key.
    fn mark(&mut self, batch: &Batch<Sim>) -> Mark {
        let Some(key) = self.replay_key.take() else {
            return Mark::Plain;
        };
        if let Some((pinned, programs)) = self.next.take()
            && pinned == key
            && (batch.commands().iter()).any(|c| matches!(c, Command::Replay { .. }))
        {
            return Mark::Repeat(programs);
        }
        let template = Arc::new(Template::new(key));
        self.templates.retain(|other| other.key != key);
        if self.templates.len() >= TEMPLATES {
            self.templates.remove(0);
        }
        self.templates.push(template.clone());
        Mark::Record(template)
    }

    fn recycled(&self) -> Batch<Sim> {
        lock(&self.shared.recycled).pop().unwrap_or_default()
    }
}

impl Engine for SimEngine {
    type Backend = Sim;

    fn kind(&self) -> QueueKind {
        self.kind
    }

    fn limits(&self) -> &Limits {
        &crate::SIM_LIMITS
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn check_exec(
        &self,
        _program: &SimProgram,
        buffers: &[View<Sim>],
        _scalars: &[Scalar],
        _params: &ExecParams,
    ) -> Result<()> {
        buffers
            .iter()
            .try_for_each(|view| self.check_buffer("a kernel argument", view.buffer()))
    }

    fn check_buffer(&self, what: &'static str, buffer: &SimBuffer) -> Result<()> {
        if buffer.is_of(self.device.pool()) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                what: what.into(),
                resource: format!("{} (another simulated device)", buffer.device()),
                queue: hwqueue::Device::spec(&self.device).to_string(),
            })
        }
    }

    fn alloca(&mut self, size: usize) -> Result<SimBuffer> {
        // The memory is valid at once: no queue-ordered allocator to ask.
        SimBuffer::allocate(self.device.pool(), size, false, true)
    }

    fn check_dealloca(&self, buffer: &SimBuffer) -> Result<()> {
        if buffer.is_of(self.device.pool()) {
            Ok(())
        } else {
            Err(Error::InvalidDealloca {
                reason: "the buffer is of another simulated device's pool; record the \
                         `dealloca` on a queue of the device whose queue made it"
                    .into(),
            })
        }
    }

    fn submit(&mut self, batch: Batch<Sim>) -> Batch<Sim> {
        self.submitted += 1;
        let mark = self.mark(&batch);
        match self.defect() {
            Some(Defect::DropBatch) if self.submitted.is_multiple_of(2) => {
                // Broken on purpose: never run, never failed.
                drop(batch);
            }
            Some(Defect::SwapBatches) => match self.held.take() {
                None => self.held = Some((batch, mark)),
                Some((earlier, earlier_mark)) => {
                    self.send(batch, mark);
                    self.send(earlier, earlier_mark);
                }
            },
            _ => self.send(batch, mark),
        }
        self.recycled()
    }

    fn replay_next(&mut self, key: Option<u32>) {
        if key.is_none() {
            self.next = None;
        }
        self.replay_key = key;
    }

    fn replay_recorded(&mut self, key: u32, kernels: &[u32]) -> bool {
        let found = (self.templates.iter())
            .find(|template| template.key == key)
            .and_then(|template| template.matching(kernels));
        // Kept for the next batch, or none kept: never another key's.
        self.next = found.map(|programs| (key, programs));
        if self.next.is_some() {
            self.replay_key = Some(key);
        }
        self.next.is_some()
    }

    fn check_replay(&self, index: u32) -> Result<()> {
        let recorded = self
            .next
            .as_ref()
            .map_or(0, |(_, programs)| programs.len() as u32);
        if index < recorded {
            Ok(())
        } else {
            Err(Error::ReplayNotRecorded { index, recorded })
        }
    }

    fn launches(&self) -> hwqueue::Launches {
        let repeats = self.shared.repeats.load(Ordering::Relaxed);
        // `Launches` may gain counts (it is `non_exhaustive`): the others 0.
        let mut launches = hwqueue::Launches::default();
        launches.kernels = self.shared.kernels.load(Ordering::Relaxed);
        launches.programs = repeats;
        launches.repeats = repeats;
        launches
    }

    fn synchronize(&mut self) {
        if let Some(held) = self.held.take() {
            self.send(held.0, held.1);
        }
        self.wait_settled();
    }

    fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    fn take_profile(&mut self, out: &mut Vec<ProfileEvent>) {
        out.append(&mut lock(&self.shared.events));
    }
}

impl Drop for SimEngine {
    /// Lets the work already submitted finish: the held batch goes over
    /// too; the sender drops after this, and the device thread drains its
    /// channel, then retires the queue's id and ends.
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.send(held.0, held.1);
        }
    }
}

/// The device thread of one queue.
struct DeviceThread {
    device: SimDevice,
    label: String,
    /// The label as profile events name the queue: interned for the
    /// process (`Name`), so only once the queue profiles.
    queue: Option<hwqueue::profile::Name>,
    shared: Arc<Shared>,
    /// The profile's interned names, the thread's own.
    names: EventNames,
}

impl DeviceThread {
    /// Settles each batch handed over, in order, until the engine is
    /// dropped and the channel drained; then retires the queue's id.
    fn run(mut self, ledger: &Ledger, jobs: Receiver<Job>) {
        for Job {
            batch,
            profile,
            mark,
        } in jobs
        {
            let mut whole = false;
            ledger.settle(&batch, |batch| {
                let outcome = self.run_batch(batch, profile, &mark);
                whole = outcome.is_ok();
                outcome
            });
            if let (Mark::Record(template), true) = (&mark, whole) {
                template.record(&batch);
            }
            self.finish(batch);
        }
        ledger.retire();
    }

    /// Counts the batch settled, and hands it back for reuse.
    fn finish(&self, mut batch: Batch<Sim>) {
        batch.clear();
        lock(&self.shared.recycled).push(batch);
        lock(&self.shared.progress).1 += 1;
        self.shared.settled.notify_all();
    }

    fn run_batch(
        &mut self,
        batch: &Batch<Sim>,
        profile: bool,
        mark: &Mark,
    ) -> std::result::Result<(), (usize, Error)> {
        // A template is filled before the first signal after the batch's
        // last kernel, not once the batch settled: a waiter that signal
        // lets through may submit the next run at once, which looks the
        // template up (filled after the signals, it was still empty for
        // every one of 40 runs on a loaded CI machine, at `8884bda`).
        // Its kernels all ran by then; `run` fills it again (the same
        // programs) where no such signal came.
        let last_exec =
            (batch.commands().iter()).rposition(|command| matches!(command, Command::Exec { .. }));
        for (index, command) in batch.commands().iter().enumerate() {
            if let (Mark::Record(template), Command::Signal { .. }) = (mark, command)
                && last_exec.is_none_or(|last| index > last)
            {
                template.record(batch);
            }
            let start = profile.then(now_ns);
            let outcome = self.run_command(batch, command, mark);
            if let Some(start) = start {
                let queue = self
                    .queue
                    .get_or_insert_with(|| self.label.as_str().into())
                    .clone();
                let event = describe(command, &mut self.names).into_event(
                    queue,
                    batch.sequence(),
                    index,
                    start,
                    now_ns(),
                );
                lock(&self.shared.events).push(event);
            }
            outcome.map_err(|error| (index, error))?;
        }
        Ok(())
    }

    fn run_command(&self, batch: &Batch<Sim>, command: &Command<Sim>, mark: &Mark) -> Result<()> {
        let latency = self.device.config().latency;
        let device_work = !matches!(
            command,
            Command::Wait { .. }
                | Command::WaitSettled { .. }
                | Command::WaitForeign { .. }
                | Command::Signal { .. }
        );
        if device_work && !latency.is_zero() {
            std::thread::sleep(latency);
        }
        match command {
            Command::Wait { signal, value } => signal.wait(*value, Timeout::Forever),
            Command::WaitSettled { signal, value } => {
                hwqueue::queue::settled(signal.wait(*value, Timeout::Forever))
            }
            Command::WaitForeign { signal, value } => signal.wait_forever(*value),
            Command::Signal { signal, value } => {
                if self.device.config().defect == Some(Defect::LowerSignal) {
                    signal.store_even_if_lower(*value);
                } else {
                    signal.set(*value);
                }
                Ok(())
            }
            Command::Exec {
                program,
                buffers,
                scalars,
                params,
            } => {
                self.shared.kernels.fetch_add(1, Ordering::Relaxed);
                self.exec(
                    program,
                    &batch.buffers()[buffers.clone()],
                    &batch.scalars()[scalars.clone()],
                    params,
                )
            }
            Command::Copy { dst, src } => {
                let mut bytes = vec![0; src.len()];
                queue_read(src, &mut bytes)?;
                queue_write(dst, &bytes)
            }
            Command::Fill {
                dst,
                pattern,
                width,
            } => {
                let pattern = &pattern[..usize::from(*width)];
                let bytes: Vec<u8> = pattern.iter().copied().cycle().take(dst.len()).collect();
                queue_write(dst, &bytes)
            }
            Command::Upload { dst, data } => queue_write(dst, batch.host_bytes(data)),
            Command::Download { src, sink } => sink.complete(|out| queue_read(src, out)),
            // Refused at record time (`Engine::check_collective`'s default):
            // the simulated accelerator has no communicator.
            Command::Collective(collective) => Err(
                hwqueue::collective::CollectiveError::unsupported("sim", &collective.communicator)
                    .into(),
            ),
            Command::Barrier | Command::Alloca { .. } => Ok(()),
            // A program `replay_recorded` found (`crate::replay`): its
            // kernels, as they ran.
            Command::Replay { index } => {
                let Mark::Repeat(programs) = mark else {
                    return Err(Error::ReplayNotRecorded {
                        index: *index,
                        recorded: 0,
                    });
                };
                let Some(program) = programs.get(*index as usize) else {
                    return Err(Error::ReplayNotRecorded {
                        index: *index,
                        recorded: programs.len() as u32,
                    });
                };
                self.shared.repeats.fetch_add(1, Ordering::Relaxed);
                program.iter().try_for_each(|kernel| {
                    self.exec(
                        &kernel.program,
                        &kernel.views,
                        &kernel.scalars,
                        &kernel.params,
                    )
                })
            }
            Command::Dealloca { buffer } => {
                hwqueue::memory::dealloca_completed(buffer);
                Ok(())
            }
        }
    }

    fn exec(
        &self,
        program: &SimProgram,
        views: &[View<Sim>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        let name = &program.signature().name;
        if self.device.inject_fault() {
            return Err(Error::KernelFailed {
                program: name.clone(),
                message: "an injected fault (SimConfig::fail_exec)".into(),
            });
        }
        let ranges = views
            .iter()
            .map(|view| view.buffer().arena_range(view.range()))
            .collect::<Result<Vec<_>>>()?;
        let kernel = program.kernel();
        self.device
            .arena()
            .with_bytes(|memory| {
                let mut args = KernelArgs {
                    memory,
                    buffers: &ranges,
                    scalars,
                    params,
                };
                catch_unwind(AssertUnwindSafe(|| kernel(&mut args)))
                    .unwrap_or_else(|payload| Err(panic_message(payload)))
            })
            .map_err(|message| Error::KernelFailed {
                program: name.clone(),
                message,
            })
    }
}

/// Writes `bytes` (the view's length, checked at record time) to `view`,
/// as a command: its batch holds a use of the buffer.
fn queue_write(view: &View<Sim>, bytes: &[u8]) -> Result<()> {
    view.buffer()
        .with_range(Access::Queue, view.offset(), bytes.len(), |dst| {
            dst.copy_from_slice(bytes)
        })
}

/// Reads `view` into `out` (the view's length), as a command.
fn queue_read(view: &View<Sim>, out: &mut [u8]) -> Result<()> {
    view.buffer()
        .with_range(Access::Queue, view.offset(), out.len(), |src| {
            out.copy_from_slice(src)
        })
}
