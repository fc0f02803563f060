//! A Vulkan queue's submissions: what the recorder recorded since the last
//! `signal` or wait (the open command buffer, the waits gathered) handed
//! to its `VkQueue` with the timeline values it waits for and signals,
//! and which stages its barriers order. The recorder (`recorder.rs`,
//! `commands.rs`) decides what goes in; this file only submits it.

use std::sync::atomic::Ordering;

use ash::vk;
use parking_lot::Mutex;

use super::recorder::Recorder;
use crate::error::Result;
use crate::profile::now_ns;
use crate::queue::QueueKind;

impl Recorder {
    /// The `VkQueue` this queue submits to.
    pub(super) fn queue(&self) -> &Mutex<vk::Queue> {
        match self.kind {
            QueueKind::Copy => self
                .context
                .transfer_queue
                .unwrap_or(self.context.compute_queue),
            QueueKind::Compute => self.context.compute_queue,
        }
    }

    /// The stages this queue's barriers order: what runs on its
    /// `VkQueue`. A copy queue on a transfer-only family runs transfers
    /// only; one on the compute family (where the device has no transfer
    /// family) shares its `VkQueue` with compute work, so its barriers
    /// order it after earlier compute work too, as the interop rules
    /// promise (`interop.rs`): transfer alone left a copy unordered with a
    /// dispatch submitted before it.
    pub(super) fn stages(&self) -> vk::PipelineStageFlags {
        queue_stages(self.kind, self.context.transfer_family.is_some())
    }

    /// Submits what is recorded, the waits gathered and the stretch's
    /// signal (`pending_signal`), signalling the progress semaphore too.
    /// Where it fails, `failed_from` names the first command it held.
    pub(super) fn flush(&mut self) -> Result<()> {
        if self.open.is_none() && self.waits.is_empty() && self.pending_signal.is_none() {
            return Ok(());
        }
        let pending = self.pending_signal.take();
        let held_from = [
            self.open.as_ref().map(|(_, first)| *first),
            pending.as_ref().map(|(_, _, first)| *first),
        ]
        .into_iter()
        .flatten()
        .min();
        let outcome = self.submit_stretch(pending.as_ref().map(|(s, v, _)| (s.semaphore(), *v)));
        match &outcome {
            Ok(()) => {
                if let Some((signal, value, _)) = pending {
                    signal.note_submitted(value);
                    self.current
                        .as_mut()
                        .expect("a batch is recording")
                        .signals
                        .push((signal.semaphore(), value));
                }
            }
            Err(_) => {
                if let Some((signal, _, _)) = &pending {
                    signal.note_dropped();
                }
                if let Some(from) = held_from {
                    self.failed_from = Some(self.failed_from.map_or(from, |f| f.min(from)));
                }
            }
        }
        outcome
    }

    /// `flush`'s submission, signalling `signal` where given.
    fn submit_stretch(&mut self, signal: Option<(vk::Semaphore, u64)>) -> Result<()> {
        if let Err(lost) = self.context.health() {
            // Nothing more runs on a lost device: the recorded buffer goes
            // back unsubmitted (a lent one to its recording).
            self.waits.clear();
            self.give_back_open();
            return Err(lost);
        }
        let device = &self.context.device;
        // A recording's command buffer lent for a replay was ended, with
        // its barriers, when it was recorded.
        let lent = self.open_is_lent();
        if !lent && let Some((set, _)) = &self.open {
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)];
            let to_host =
                ends_with_host_barrier(self.context.memory.host_copies(), self.host_reads);
            // SAFETY: the command buffer records; it ends here.
            let ended = unsafe {
                if to_host {
                    device.cmd_pipeline_barrier(
                        set.buffer,
                        self.stages(),
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &barrier,
                        &[],
                        &[],
                    );
                }
                device.end_command_buffer(set.buffer)
            };
            #[cfg(test)]
            let ended =
                ended.and_then(|()| super::testing::injected("vkEndCommandBuffer", self.progress));
            if let Err(e) = ended {
                // Never submitted, and no longer recording (invalid, which
                // its next `begin` resets): recorded again, not dropped
                // with its pools; the stretch's waits go with it, as a
                // failed submission's do.
                self.waits.clear();
                if let Some((set, _)) = self.open.take() {
                    self.shared.free.lock().push(set);
                }
                return Err(self.context.error("vkEndCommandBuffer", e));
            }
        }
        let open = self.open.take();
        let value = self.next + 1;
        // No allocation per submission: the waits are kept as Vulkan takes
        // them, the signals are the progress semaphore and at most one more.
        let (signal_semaphore, signal_value) = signal.unwrap_or((self.progress, value));
        let signals = [self.progress, signal_semaphore];
        let signal_values = [value, signal_value];
        let signalled = if signal.is_some() { 2 } else { 1 };
        let buffer = open.as_ref().map(|(set, _)| set.buffer);
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&self.waits.values)
            .signal_semaphore_values(&signal_values[..signalled]);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&self.waits.semaphores)
            .wait_dst_stage_mask(&self.waits.stages)
            .command_buffers(buffer.as_slice())
            .signal_semaphores(&signals[..signalled])
            .push_next(&mut timeline);
        // Published before the submission: a waiter its signals wake reads
        // `launches` with this submission counted (one published after it
        // read 99 runs' worth of 100 under the validation layer). One
        // writer (whoever holds the recorder): plain stores.
        let programs = self.programs + u64::from(lent);
        self.shared.kernels.store(self.kernels, Ordering::Relaxed);
        self.shared.programs.store(programs, Ordering::Relaxed);
        let outcome = {
            let queue = self.queue().lock();
            // SAFETY: the queue is locked (submits need external
            // synchronisation); every semaphore and the command buffer
            // live until the retire thread saw `value`.
            unsafe { device.queue_submit(*queue, &[submit], vk::Fence::null()) }
        };
        self.waits.clear();
        let mut open = open.map(|(set, _)| set);
        if lent && outcome.is_ok() {
            self.programs += 1;
        }
        // A recording keeps its command buffer (recorded, or lent back).
        let kept = self.keep_submitted(&mut open);
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
                if let Some(set) = open.filter(|_| !kept) {
                    current.sets.push(set);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(set) = open.filter(|_| !kept) {
                    // Never submitted: reusable at once.
                    self.shared.free.lock().push(set);
                }
                Err(self.context.error("vkQueueSubmit", e))
            }
        }
    }

    /// Gives the open command buffer back unsubmitted: a lent one to its
    /// recording, one recording (ended: its next `begin` resets it) to be
    /// recorded again, rather than dropped with its pools.
    fn give_back_open(&mut self) {
        if self.open_is_lent() {
            let mut lent = self.open.take().map(|(set, _)| set);
            self.keep_submitted(&mut lent);
        } else if let Some((set, _)) = self.open.take() {
            // SAFETY: the command buffer records; ending it lets its next
            // `begin` reset it.
            let _ = unsafe { self.context.device.end_command_buffer(set.buffer) };
            self.shared.free.lock().push(set);
        }
    }

    /// After a batch settled: what a panic while recording it (a caller's
    /// upload owner, say) left unsubmitted goes, so that none of it is
    /// submitted with the next batch, after this one retired and let its
    /// buffers, staging and semaphores go: the open command buffer (back,
    /// as `give_back_open`), the waits gathered, an open timing, and the
    /// stretch's signal (dropped, so that a host `set` is not deferred
    /// behind a queue signal that never comes). Where none panicked,
    /// nothing is left.
    pub(super) fn drop_unsubmitted(&mut self) {
        self.waits.clear();
        self.timing = None;
        if let Some((signal, _, _)) = self.pending_signal.take() {
            signal.note_dropped();
        }
        self.give_back_open();
    }
}

/// The stages a queue of `kind` orders its work after (see
/// `Recorder::stages`), on a device with a transfer-only family or not.
pub(super) fn queue_stages(kind: QueueKind, transfer_family: bool) -> vk::PipelineStageFlags {
    match (kind, transfer_family) {
        (QueueKind::Copy, true) => vk::PipelineStageFlags::TRANSFER,
        _ => vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
    }
}

/// Whether a submission ends with a barrier making its writes visible to
/// the host: where buffers are mapped (`mapped`: the host may read any
/// buffer once a signal says the work completed, and the queue's own
/// downloads are host reads), or where the command buffer wrote a
/// download's staging range (`staged_downloads`). Elsewhere the host
/// reaches device memory only through the one-shot copies
/// (`staged.rs`), which end with their own barrier, so a discrete GPU's
/// unmapped compute work orders nothing to the host stage.
pub(super) fn ends_with_host_barrier(mapped: bool, staged_downloads: bool) -> bool {
    mapped || staged_downloads
}

/// The waits of the next submission, in the three arrays `vkQueueSubmit`
/// takes, kept between submissions.
#[derive(Default)]
pub(super) struct Waits {
    semaphores: Vec<vk::Semaphore>,
    values: Vec<u64>,
    stages: Vec<vk::PipelineStageFlags>,
}

impl Waits {
    pub(super) fn push(&mut self, semaphore: vk::Semaphore, value: u64) {
        self.semaphores.push(semaphore);
        self.values.push(value);
        self.stages.push(vk::PipelineStageFlags::ALL_COMMANDS);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.semaphores.is_empty()
    }

    fn clear(&mut self) {
        self.semaphores.clear();
        self.values.clear();
        self.stages.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use ash::vk;

    use super::{ends_with_host_barrier, queue_stages};
    use crate::buffer::Buffer;
    use crate::device::{Device, QueueFactory};
    use crate::error::Error;
    use crate::params::ExecParams;
    use crate::queue::{HardwareQueue, QueueKind};
    use crate::signal::TimelineSignal;
    use crate::vulkan::testing::{BusyQueue, FailingCall, add_one, device};

    /// Issue 46, defect 9: a copy queue on the compute family (a device
    /// without a transfer-only family, lavapipe) shares its `VkQueue` with
    /// dispatches, so its barriers order it after compute work too; they
    /// named the transfer stage alone.
    #[test]
    fn a_copy_queue_orders_itself_after_compute_work_where_it_shares_the_compute_queue() {
        let both = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        assert_eq!(queue_stages(QueueKind::Copy, false), both);
        assert_eq!(
            queue_stages(QueueKind::Copy, true),
            vk::PipelineStageFlags::TRANSFER,
            "on a transfer-only family, transfers alone run"
        );
        for transfer_family in [false, true] {
            assert_eq!(queue_stages(QueueKind::Compute, transfer_family), both);
        }
    }

    /// Issue 46: the barrier to the host only around host access. Every
    /// submission ended with one; on unmapped memory only a download's
    /// staging copy is read by the host after it.
    #[test]
    fn a_submission_orders_its_writes_before_the_host_only_where_the_host_reads_them() {
        assert!(ends_with_host_barrier(true, false), "mapped buffers");
        assert!(ends_with_host_barrier(false, true), "a staged download");
        assert!(
            !ends_with_host_barrier(false, false),
            "unmapped compute work"
        );
    }

    /// `submit_stretch` returned early where `vkEndCommandBuffer` failed,
    /// after taking the open command set: it was dropped, its descriptor
    /// pools kept for the device's life, and the stretch's waits stayed
    /// for the queue's next submission (naming semaphores the failed batch
    /// may have let go by then). It goes back to be recorded again, never
    /// submitted, and the waits go with it.
    #[test]
    fn a_command_buffer_that_fails_to_end_goes_back_and_its_waits_with_it() {
        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let signal = device.new_signal(0).unwrap();
        let mut other = device.compute_queue().unwrap();
        let mut queue = device.compute_queue().unwrap();
        let state = &queue.engine().state;
        let (recorder, shared) = (state.recorder.clone(), state.shared.clone());
        let progress = recorder.lock().progress;
        // Submitted and held pending: the batch's wait is one of its
        // submission's.
        let busy = BusyQueue::new(device.context());
        other.signal(&signal, 1).submit().unwrap();
        let failing = FailingCall::new("vkEndCommandBuffer", progress);
        queue.wait(&signal, 1).fill(&buffer, 7u32).submit().unwrap();
        let error = queue.synchronize().unwrap_err();
        drop(failing);
        busy.release();
        assert!(error.to_string().contains("vkEndCommandBuffer"), "{error}");
        assert_eq!(
            shared.free.lock().len(),
            1,
            "the command set that failed to end goes back, not dropped"
        );
        assert!(
            recorder.lock().waits.is_empty(),
            "the failed stretch's waits are not the next submission's"
        );
        other.synchronize().unwrap();
        queue.fill(&buffer, 9u32).submit().unwrap();
        queue.synchronize().unwrap();
        assert_eq!(buffer.to_vec::<u32>().unwrap(), [9; 4]);
        assert_eq!(shared.free.lock().len(), 1, "recorded again, not one more");
    }

    /// `begin` dropped the command set it took (or made) where
    /// `vkResetDescriptorPool` or `vkBeginCommandBuffer` failed: its
    /// buffer and descriptor pools were kept, unused, for the queue's
    /// life. It goes back.
    #[test]
    fn a_command_buffer_that_fails_to_begin_goes_back() {
        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let state = &queue.engine().state;
        let (progress, shared) = (state.recorder.lock().progress, state.shared.clone());
        let failing = FailingCall::new("vkBeginCommandBuffer", progress);
        queue.fill(&buffer, 7u32).submit().unwrap();
        let error = queue.synchronize().unwrap_err();
        drop(failing);
        assert!(
            error.to_string().contains("vkBeginCommandBuffer"),
            "{error}"
        );
        assert_eq!(
            shared.free.lock().len(),
            1,
            "the command set that failed to begin goes back, not dropped"
        );
        queue.fill(&buffer, 9u32).submit().unwrap();
        queue.synchronize().unwrap();
        assert_eq!(buffer.to_vec::<u32>().unwrap(), [9; 4]);
        assert_eq!(shared.free.lock().len(), 1, "recorded again, not one more");
    }

    /// An upload's owner that panics when the queue reads its bytes, once
    /// `armed` (the caller's `AsRef`: it runs on the recording thread).
    struct PanicsWhenRead(Arc<AtomicBool>, Vec<u32>);

    impl AsRef<[u32]> for PanicsWhenRead {
        fn as_ref(&self) -> &[u32] {
            assert!(
                !self.0.load(Ordering::Relaxed),
                "the upload's owner panics when read"
            );
            &self.1
        }
    }

    /// A panic while recording a batch (here a caller's `AsRef`) left the
    /// open command buffer and the stretch's signal in the recorder: the
    /// next batch recorded into that buffer and submitted it, running the
    /// failed batch's fill (its buffers and staging let go by then), and
    /// the signal stayed noted as queued, so a host `set` was deferred
    /// behind a queue signal that never came: the semaphore's counter
    /// never reached it. Neither carries over now.
    #[test]
    fn a_panic_while_recording_leaves_nothing_for_the_next_batch_to_submit() {
        let Some(device) = device() else { return };
        let (filled, uploaded) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        queue.fill(&filled, 1u32).submit().unwrap();
        queue.synchronize().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        queue
            .fill(&filled, 7u32)
            .signal(&signal, 1)
            .upload_vec(&uploaded, PanicsWhenRead(armed.clone(), vec![5; 4]));
        armed.store(true, Ordering::Relaxed);
        queue.submit().unwrap();
        let error = queue.synchronize().unwrap_err();
        armed.store(false, Ordering::Relaxed);
        assert!(
            matches!(error.root_cause(), Error::EnginePanicked { message } if message.contains("panics when read")),
            "{error}"
        );
        signal.set(2);
        assert_eq!(
            signal.counter(),
            2,
            "no queue signal is pending: the host signals the semaphore"
        );
        queue.fill(&uploaded, 9u32).submit().unwrap();
        queue.synchronize().unwrap();
        assert_eq!(uploaded.to_vec::<u32>().unwrap(), [9; 4]);
        assert_eq!(
            filled.to_vec::<u32>().unwrap(),
            [1; 4],
            "the failed batch's fill never runs"
        );
    }

    /// After a device loss, `begin` reused a free command set: it reset
    /// the set's descriptor pools and began its command buffer on the lost
    /// device, where a driver may fail either call with an error of its
    /// own (here `vkBeginCommandBuffer`, made to fail), so that the batch
    /// failed with that error rather than the loss (helper-68). It fails
    /// with the loss, as a submission or a host copy does, and calls
    /// nothing on the lost device.
    #[test]
    fn a_command_after_a_loss_fails_with_the_loss_before_reusing_a_command_set() {
        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let mut queue = device.compute_queue().unwrap();
        // Leaves a command set to reuse.
        queue.fill(&buffer, 1u32).submit().unwrap();
        queue.synchronize().unwrap();
        let state = &queue.engine().state;
        assert!(
            !state.shared.free.lock().is_empty(),
            "a command set is free"
        );
        let progress = state.recorder.lock().progress;
        let failing = FailingCall::new("vkBeginCommandBuffer", progress);
        device.simulate_device_loss();
        let submitted = queue.fill(&buffer, 2u32).submit();
        let error = submitted
            .err()
            .or_else(|| queue.synchronize().err())
            .expect("the batch fails on a lost device");
        assert_eq!(
            failing.failed(),
            0,
            "vkBeginCommandBuffer was called on the lost device: {error}"
        );
        assert!(
            matches!(error.root_cause(), Error::DeviceLost { .. }),
            "the batch fails with the loss: {error}"
        );
    }
    /// `exec` made its pipeline (a kernel's first use on the device, or
    /// its first of a local size: a set layout, a pipeline layout, a
    /// shader module and the pipeline) before `begin` looked at the
    /// device's health, so a batch after a loss still called the driver
    /// on the lost device (helper-76). It fails with the loss before
    /// any driver call: no pipeline is made.
    #[test]
    fn an_exec_after_a_loss_fails_with_the_loss_before_making_a_pipeline() {
        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let program = add_one();
        let mut queue = device.compute_queue().unwrap();
        device.simulate_device_loss();
        let submitted = queue
            .exec(&program, &[&buffer], &[], ExecParams::new_1d(4, 4))
            .submit();
        let error = submitted
            .err()
            .or_else(|| queue.synchronize().err())
            .expect("the batch fails on a lost device");
        assert_eq!(
            program.cached_pipelines(),
            0,
            "a pipeline was made on the lost device: {error}"
        );
        assert!(
            matches!(error.root_cause(), Error::DeviceLost { .. }),
            "the batch fails with the loss: {error}"
        );
    }
}
