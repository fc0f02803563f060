//! A Vulkan queue's recording thread: it settles each batch through the
//! ledger, turning its commands into submissions (`submit.rs`'s `flush`:
//! one per stretch between waits and host copies, with the stretch's
//! signal, each signalling the queue's progress semaphore; or, replaying,
//! the recording's command buffers: `replay.rs`), holds a wait on the host until a
//! submission that signals its value is on a `VkQueue`, and hands each
//! batch to the retire thread.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

use ash::vk;
use parking_lot::Mutex;

use super::commands::{Bound, Touched};
use super::context::Context;
use super::engine::{CommandSet, Job, Shared, release_queued};
use super::memory::VulkanBlock;
use super::retire::{Retire, count_retired, retire_one};
use super::submit::Waits;
use super::timing::Clock;
use super::{Vulkan, VulkanDevice};
use crate::error::{Error, Result};
use crate::profile::now_ns;
use crate::queue::{Batch, Command, Ledger, QueueKind, settled};
use crate::signal::TimelineSignal;
use crate::transfer::DownloadSink;
use crate::view::View;

/// At most this many batches wait in [`Recorder::deferred`].
const DEFERRED: usize = 32;

/// The recording thread's state.
pub(super) struct Recorder {
    /// The device: its pool gives the staging memory.
    pub(super) device: VulkanDevice,
    pub(super) context: Arc<Context>,
    pub(super) kind: QueueKind,
    pub(super) label: String,
    pub(super) pool: vk::CommandPool,
    /// The queue's own timeline: each submission signals the next value.
    pub(super) progress: vk::Semaphore,
    pub(super) next: u64,
    pub(super) shared: Arc<Shared>,
    /// The batch being recorded: what its submissions hold.
    pub(super) current: Option<Retire>,
    /// The command buffer being recorded, and the index of its first
    /// command (what fails if it cannot be submitted).
    pub(super) open: Option<(CommandSet, usize)>,
    /// Waits of the next submission.
    pub(super) waits: Waits,
    /// The retire thread, and the channel that hands it batches.
    pub(super) retire: Option<(Sender<Retire>, JoinHandle<()>)>,
    /// Batches settled on the owner's thread that hold nothing to release
    /// (signals and waits only), kept from the retire thread until a
    /// batch that does, a `synchronize`, the queue's end, or [`DEFERRED`]
    /// of them: a batch of signals only then wakes no thread but the
    /// driver's (what a raw submit and wait costs). A host `set` deferred
    /// behind one of their signals is applied only then; nothing waits
    /// for it meanwhile (`VulkanSignal::wait_submitted`).
    pub(super) deferred: Vec<Retire>,
    /// A 16-byte buffer bound for an empty view.
    pub(super) dummy: VulkanBlock,
    /// Device timestamps, where the queue's family has them.
    pub(super) clock: Option<Clock>,
    /// The query of the command being recorded, to close after it.
    pub(super) timing: Option<(vk::QueryPool, u32)>,
    /// What the open command buffer's commands touched since its last
    /// barrier.
    pub(super) touched: Touched,
    /// The pipeline and descriptor set the open command buffer has bound.
    pub(super) bound: Option<Bound>,
    /// Whether the open command buffer wrote memory the host reads once
    /// it completed (a download's staging range): it then ends with a
    /// barrier to the host (`submit.rs`, `ends_with_host_barrier`).
    pub(super) host_reads: bool,
    /// The recording the batch being settled records or replays
    /// (`replay.rs`), and those kept per replay key.
    pub(super) replay: Option<super::replay::Replay>,
    pub(super) recordings: std::collections::HashMap<u32, Vec<super::replay::Recording>>,
    /// The signal of the stretch being recorded, submitted with it (the
    /// highest of the stretch's signals of one semaphore, and the index of
    /// the first of them).
    pub(super) pending_signal: Option<(super::VulkanSignal, u64, usize)>,
    /// The first command a failed submission of this batch held: where its
    /// failure starts.
    pub(super) failed_from: Option<usize>,
    /// Dispatches recorded and recordings submitted again, since the queue
    /// was made (published to `Shared` after each batch).
    pub(super) kernels: u64,
    pub(super) programs: u64,
}

// SAFETY: the handles are plain Vulkan handles. Those that need external
// synchronisation (the command pool, descriptor pools) are used only by
// whoever holds the `Mutex<Recorder>` (the recording thread, or the owner
// settling a batch at once or handing over kept batches), one at a time;
// the semaphores and buffers go through calls that are thread-safe.
unsafe impl Send for Recorder {}

impl Recorder {
    /// Settles one batch through the ledger (records and submits it) and
    /// hands it to the retire thread: on the recording thread, or on the
    /// owner's when nothing is queued before it and it cannot block
    /// ([`can_settle_at_once`]). `on_owner`: it is settled on the owner's thread,
    /// and may be kept back if it holds nothing (see `deferred`); the
    /// recording thread never keeps one back, since the owner may be in
    /// `synchronize` already, past its hand-over.
    pub(super) fn settle(
        &mut self,
        ledger: &Ledger,
        Job {
            batch,
            profile,
            replay,
        }: Job,
        on_owner: bool,
    ) {
        self.current = Some(Retire {
            batch: Batch::default(),
            progress: None,
            sets: Vec::new(),
            staging: Vec::new(),
            downloads: Vec::new(),
            signals: Vec::new(),
            submitted_ns: vec![0; if profile { batch.commands().len() } else { 0 }],
            held_ns: vec![(0, 0); if profile { batch.commands().len() } else { 0 }],
            stamped: 0,
            upto: 0,
            ran: 0,
            timed: Vec::new(),
            profile,
        });
        // Nothing of an earlier batch carries over, even past a panic.
        self.failed_from = None;
        self.pending_signal = None;
        self.begin_replay(&batch, replay, profile);
        {
            // A batch-scoped failure drains the batch's later waits on the
            // host, values only the caller may set among them.
            let _held = ledger.independent().then(|| self.holding());
            let (mut ran, mut ran_upto) = (None, 0);
            ledger.settle(&batch, |batch| {
                let outcome = self.run_batch(batch);
                ran = Some(outcome.is_ok());
                // Skipped: none ran. (A panic leaves it 0 too, completing
                // no `dealloca`: their buffers stay live, the safe side.)
                ran_upto = outcome
                    .as_ref()
                    .map_or_else(|(from, _)| *from, |()| usize::MAX);
                outcome
            });
            self.end_replay(ran);
            self.drop_unsubmitted();
            if let Some(current) = self.current.as_mut() {
                current.ran = ran_upto;
            }
        }
        // One writer (whoever holds the recorder): plain stores.
        self.shared.kernels.store(self.kernels, Ordering::Relaxed);
        self.shared.programs.store(self.programs, Ordering::Relaxed);
        let mut done = self.current.take().expect("set above");
        done.batch = batch;
        if self.retire.is_none() {
            // No retire thread: wait here.
            let what = "a Vulkan queue, retiring a batch that completed";
            let retired = ledger.letting_go(what, || {
                retire_one(&self.context, self.progress, &self.shared, None, done)
            });
            if let Some(error) = retired {
                ledger.fail_unbatched(error);
            }
            count_retired(&self.shared);
        } else if on_owner && done.holds_nothing() && self.deferred.len() < DEFERRED {
            self.deferred.push(done);
        } else {
            self.retire_deferred();
            if let Some((retire, _)) = &self.retire {
                let _ = retire.send(done);
            }
        }
    }

    /// Hands the deferred batches to the retire thread (a `synchronize`
    /// waits for them to retire).
    pub(super) fn retire_deferred(&mut self) {
        if let Some((retire, _)) = &self.retire {
            for earlier in self.deferred.drain(..) {
                let _ = retire.send(earlier);
            }
        }
    }

    /// The recording thread: settles each batch handed over, in order,
    /// until the engine is dropped; then waits for the retire thread and
    /// frees what it made.
    pub(super) fn run(this: &Mutex<Self>, ledger: &Ledger, jobs: Receiver<Job>) {
        let shared = this.lock().shared.clone();
        for job in jobs {
            this.lock().settle(ledger, job, false);
            // After the lock is let go: the owner, seeing none queued, may
            // settle its next batch itself.
            release_queued(&shared);
        }
        let mut this = this.lock();
        this.retire_deferred();
        let kept = super::replay::all_sets(&mut this.recordings);
        this.shared.free.lock().extend(kept);
        if let Some((retire, thread)) = this.retire.take() {
            drop(retire);
            let _ = thread.join();
        }
        ledger.retire();
        let device = &this.context.device;
        // SAFETY: every submission completed (the retire thread waited for
        // each), so nothing uses these objects any more; the engine is
        // gone, so no batch is settled after this.
        unsafe {
            for set in this.shared.free.lock().drain(..) {
                for pool in set.pools {
                    device.destroy_descriptor_pool(pool, None);
                }
                if set.queries != vk::QueryPool::null() {
                    device.destroy_query_pool(set.queries, None);
                }
            }
        }
        this.free_objects();
    }

    /// Whether `batch` can be settled on the owner's thread: nothing in it
    /// blocks the host (every wait's value is submitted on this device,
    /// no wait on another backend's signal, and no host copy that would
    /// wait for device work: host copies only at the batch's start, on a
    /// queue whose earlier submissions all completed).
    /// It also needs the retire thread (without it, `settle` waits for the
    /// device), and a queue whose failures are not batch-scoped (a failed
    /// batch of `FailureScope::Batch` drains its later waits on the host).
    pub(super) fn can_settle_at_once(
        &self,
        ledger: &Ledger,
        batch: &Batch<Vulkan>,
        profile: bool,
    ) -> bool {
        if self.retire.is_none() || ledger.independent() {
            return false;
        }
        let host_copies = self.copies_on_host(profile);
        // Whether a command before this one gives the device work, which a
        // host copy after it would wait for.
        let mut device_work = false;
        let mut copies = false;
        for command in batch.commands() {
            match command {
                Command::Upload { .. } | Command::Download { .. } if host_copies => {
                    if device_work {
                        return false;
                    }
                    copies = true;
                }
                Command::Wait { signal, value } | Command::WaitSettled { signal, value } => {
                    if !(signal.is_of(&self.context) && signal.is_submitted(*value)) {
                        return false;
                    }
                    device_work = true;
                }
                Command::WaitForeign { .. } => return false,
                _ => device_work = true,
            }
        }
        !copies || self.is_idle()
    }

    /// Whether every submission of this queue completed (a host copy then
    /// waits for nothing).
    pub(super) fn is_idle(&self) -> bool {
        if self.next == 0 {
            return true;
        }
        // SAFETY: the progress semaphore lives as long as the recorder.
        let reached = unsafe {
            self.context
                .device
                .get_semaphore_counter_value(self.progress)
        };
        reached.is_ok_and(|value| value >= self.next)
    }

    pub(super) fn run_batch(
        &mut self,
        batch: &Batch<Vulkan>,
    ) -> std::result::Result<(), (usize, Error)> {
        for (index, command) in batch.commands().iter().enumerate() {
            self.current.as_mut().expect("a batch is recording").upto = index + 1;
            // A replay records no device command: its recording holds them.
            let outcome = if self.replay_step(index, command) {
                self.command(batch, index, command)
            } else {
                Ok(())
            }
            .and_then(|()| self.replay_boundary_done());
            self.close_timing(index);
            if let Err(error) = outcome {
                // A replay's segment in progress holds commands after the
                // failure too: it is not submitted, and fails from its
                // start, with the stretch's signal.
                self.abandon_replayed_segment();
                // What was recorded before the failure still runs; where it
                // cannot be submitted (now, or in a flush the command made),
                // it fails too.
                let _ = self.flush();
                let from = self
                    .failed_from
                    .take()
                    .map_or(index, |from| from.min(index));
                self.settle_in_queue_order(batch);
                return Err((from, error));
            }
        }
        self.replay_end_of_batch();
        if let Err(error) = self.flush() {
            let from = self.failed_from.take().unwrap_or(0);
            self.settle_in_queue_order(batch);
            return Err((from, error));
        }
        Ok(())
    }

    /// Before a batch's failure is reported, the work submitted before it
    /// completes (a waiter the failure lets through comes after it; every
    /// submission waits on values submitted, a lost device ends the wait):
    /// the queue's progress, the signals the batch (and `deferred`)
    /// submitted, and each of the batch's signals at its highest value
    /// submitted (an earlier batch's, say). A submission's semaphores are
    /// signalled in no set order (lavapipe's one by one, progress first).
    fn settle_in_queue_order(&self, batch: &Batch<Vulkan>) {
        if self.next == 0 {
            return;
        }
        let mut waits = vec![(self.progress, self.next)];
        for retire in self.deferred.iter().chain(self.current.as_ref()) {
            waits.extend_from_slice(&retire.signals);
        }
        for command in batch.commands() {
            if let Command::Signal { signal, .. } = command
                && signal.is_of(&self.context)
            {
                waits.push((signal.semaphore(), signal.submitted()));
            }
        }
        let _ = super::retire::wait_all_semaphores(&self.context, &waits);
    }

    pub(super) fn command(
        &mut self,
        batch: &Batch<Vulkan>,
        index: usize,
        command: &Command<Vulkan>,
    ) -> Result<()> {
        // Nothing more runs on a lost device: a device command fails with
        // the loss before any driver call it would make (its pipeline, its
        // staging memory, a command buffer begun), as a submission does.
        if matches!(
            command,
            Command::Exec { .. }
                | Command::Copy { .. }
                | Command::Fill { .. }
                | Command::Upload { .. }
                | Command::Download { .. }
        ) {
            self.context.health()?;
        }
        match command {
            Command::Wait { signal, value } => {
                self.held(index, |this| this.wait(signal, *value, false))
            }
            Command::WaitSettled { signal, value } => {
                self.held(index, |this| this.wait(signal, *value, true))
            }
            Command::WaitForeign { signal, value } => self.held(index, |this| {
                this.flush()?;
                let _held = this.holding();
                signal.wait_forever(*value)
            }),
            Command::Signal { signal, value } => {
                if signal.is_submitted(*value) {
                    // At or below what it holds or is promised: values only
                    // rise (a timeline semaphore must not be signalled
                    // lower), so this signal does nothing.
                    return Ok(());
                }
                // Within the device's difference of the counter now, it
                // stays within it: the counter only rises.
                signal.check_value_difference(*value)?;
                // Signals of one semaphore in a row, with device commands
                // between them and no wait, are one: the highest, at the
                // end of the stretch (the next wait, host copy, signal of
                // another semaphore, or the batch's end), where the stretch
                // is submitted. A value reached says the lower ones were,
                // and no command of the stretch waits for them, so a chain
                // of kernels each followed by a signal is one submission,
                // not one each; another queue waiting on a lower value
                // sees it when the stretch completed.
                let same = |(pending, _, _): &(super::VulkanSignal, u64, usize)| {
                    pending.semaphore() == signal.semaphore()
                };
                if self.pending_signal.as_ref().is_some_and(|p| !same(p)) {
                    self.flush()?;
                }
                if !signal.note_queued(*value) {
                    // A host `set` reached or promised it meanwhile.
                    return Ok(());
                }
                // A pending signal here is of this semaphore (another was
                // flushed above): its handle stays, with the higher value.
                self.pending_signal = Some(match self.pending_signal.take() {
                    Some((pending, higher, first)) => (pending, higher.max(*value), first),
                    None => (signal.clone(), *value, index),
                });
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
            Command::Upload { dst, data } if self.copies_on_host(self.profiling()) => {
                self.host_upload(dst, batch.host_bytes(data))
            }
            Command::Upload { dst, data } => self.upload(index, dst, batch.host_bytes(data)),
            Command::Download { src, sink } if self.copies_on_host(self.profiling()) => {
                self.host_download(src, sink)
            }
            Command::Download { src, .. } => {
                let len = src.len();
                let staging = self.staging(len.max(4))?;
                let from = self.device_range(src)?;
                self.copy(index, from, staging.0, len)?;
                self.host_reads = true;
                self.current
                    .as_mut()
                    .expect("a batch is recording")
                    .downloads
                    .push((index, staging.1));
                Ok(())
            }
            // Refused at record time (`Engine::check_collective`'s default).
            Command::Collective(collective) => Err(
                crate::collective::CollectiveError::unsupported("vulkan", &collective.communicator)
                    .into(),
            ),
            // Every command is preceded by a full barrier already.
            Command::Barrier | Command::Alloca { .. } => Ok(()),
            // Vulkan resubmits whole recorded batches instead (`replay`):
            // `check_replay` refuses this at record time.
            Command::Replay { index } => Err(Error::ReplayNotRecorded {
                index: *index,
                recorded: 0,
            }),
            // The buffer's range goes back once the batch retired: every
            // command before this one completed by then.
            Command::Dealloca { .. } => Ok(()),
        }
    }

    /// Runs `wait`, the wait of command `index`; while profiling, notes
    /// when this thread reached it and when it let the thread go: its
    /// profile event spans what it held the queue on the host.
    fn held(&mut self, index: usize, wait: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let from = self.profiling().then(now_ns);
        let outcome = wait(self);
        if let Some(from) = from {
            let current = self.current.as_mut().expect("a batch is recording");
            if let Some(held) = current.held_ns.get_mut(index) {
                *held = (from, now_ns());
            }
        }
        outcome
    }

    /// Marks the queue as holding a batch on the host for a value that may
    /// come only from its caller, until the guard drops: a dropped engine
    /// does not wait for it then.
    fn holding(&self) -> Holding {
        Holding::begin(&self.shared)
    }

    /// Whether uploads and downloads copy on the host, in queue order: the
    /// pool's memory is mapped (lavapipe's and an integrated GPU's system
    /// memory, a discrete GPU's VRAM through resizable BAR: no staging, no
    /// device copy, no submission for a batch of transfers alone, as the
    /// `vulkan_transfer` benches' raw baseline copies), and no profile
    /// (`profile`) wants device times for them.
    pub(super) fn copies_on_host(&self, profile: bool) -> bool {
        self.context.memory.host_copies() && !profile
    }

    /// Whether the batch being recorded is profiled.
    fn profiling(&self) -> bool {
        self.current.as_ref().expect("a batch is recording").profile
    }

    /// Makes the host the next in queue order: submits what is recorded
    /// and the waits gathered, then waits until every submission of this
    /// queue completed (its last command buffer ends with a barrier making
    /// its writes visible to the host).
    fn host_turn(&mut self) -> Result<()> {
        // Nothing more runs on a lost device, host copies included (the
        // flush below looks only when it has something to submit).
        self.context.health()?;
        self.flush()?;
        if self.next == 0 {
            return Ok(());
        }
        super::retire::wait_all_semaphores(&self.context, &[(self.progress, self.next)])
    }

    /// An upload as a host copy into the mapped destination, once the work
    /// before it completed (a later submission sees host writes made
    /// before it).
    fn host_upload(&mut self, dst: &View<Vulkan>, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.host_turn()?;
        dst.buffer().queue_write(dst.offset(), bytes)
    }

    /// A download as a host copy out of the mapped source, once the work
    /// before it completed; the sink is complete at once.
    fn host_download(&mut self, src: &View<Vulkan>, sink: &DownloadSink) -> Result<()> {
        self.host_turn()?;
        sink.complete(|out| src.buffer().queue_read(src.offset(), &mut out[..src.len()]))
    }

    /// A wait on a Vulkan signal: a semaphore wait of the next submission,
    /// once a submission signalling the value is on a `VkQueue`.
    pub(super) fn wait(
        &mut self,
        signal: &super::VulkanSignal,
        value: u64,
        is_settled: bool,
    ) -> Result<()> {
        if signal.is_reached(value) {
            return Ok(());
        }
        // The work recorded so far must not wait.
        self.flush()?;
        if !signal.is_of(&self.context) {
            // Another device's semaphore cannot be waited on here: the
            // host waits for it, as for another backend's signal.
            let _held = self.holding();
            let waited = signal.wait(value, crate::signal::Timeout::Forever);
            return if is_settled { settled(waited) } else { waited };
        }
        // A hold only where the value is not submitted yet: the usual
        // cross-queue wait (submitted, not reached) takes no lock here.
        let _held = (!signal.is_submitted(value)).then(|| self.holding());
        // No device wait for a value only a deferred host `set` reached
        // (see `wait_submitted`): it is reached for this queue too.
        let waited = signal.wait_submitted(value).and_then(|on_device| {
            if on_device {
                signal.check_value_difference(value)?;
                self.waits.push(signal.semaphore(), value);
            }
            Ok(())
        });
        match waited {
            Ok(()) => Ok(()),
            Err(error) if is_settled => settled(Err(error)),
            Err(error) => Err(error),
        }
    }
}

/// See [`Recorder::holding`]. Its start and end each wake a dropped
/// engine waiting on `retired` (under the lock it looks under, so no
/// change is missed).
struct Holding(Arc<Shared>);

impl Holding {
    fn begin(shared: &Arc<Shared>) -> Self {
        let _progress = shared.progress.lock();
        shared.holding.fetch_add(1, Ordering::Relaxed);
        shared.retired.notify_all();
        Self(shared.clone())
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _progress = self.0.progress.lock();
        self.0.holding.fetch_sub(1, Ordering::Relaxed);
        self.0.retired.notify_all();
    }
}
