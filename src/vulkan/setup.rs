//! A queue's recorder made and unmade. What [`Recorder::new`] makes (its
//! command pool, progress semaphore and dummy buffer) is freed on every
//! failure path of the queue's creation, not only at the queue's end: a
//! program that retries a queue whose creation failed (a busy device whose
//! calibration timed out, memory short) must not leak a pool, a semaphore
//! and a buffer each time.

use std::sync::Arc;
use std::sync::mpsc;

use ash::vk;

use super::VulkanDevice;
use super::commands::{Stage, Touched};
use super::context::Context;
use super::engine::Shared;
use super::memory::{free_buffer, make_buffer};
use super::recorder::Recorder;
use super::retire::retire_all;
use super::submit::Waits;
use crate::error::Result;
use crate::queue::{Ledger, QueueKind, queue_label};

/// What `Recorder::new` made before the recorder holds it: destroyed on
/// drop, so that a step that fails (`?`) leaves nothing behind.
struct Made<'a> {
    context: &'a Context,
    pool: Option<vk::CommandPool>,
    progress: Option<vk::Semaphore>,
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        // SAFETY: nothing was submitted with them yet (the recorder that
        // would submit does not exist), so no pending work uses them.
        unsafe {
            if let Some(progress) = self.progress.take() {
                freed(progress);
                self.context.device.destroy_semaphore(progress, None);
            }
            if let Some(pool) = self.pool.take() {
                freed(pool);
                self.context.device.destroy_command_pool(pool, None);
            }
        }
    }
}

impl Recorder {
    pub(super) fn new(
        owner: VulkanDevice,
        family: u32,
        kind: QueueKind,
        shared: Arc<Shared>,
        ledger: &Ledger,
    ) -> Result<Self> {
        let context = owner.context().clone();
        let device = &context.device;
        let mut made = Made {
            context: &context,
            pool: None,
            progress: None,
        };
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        // SAFETY: create-infos live across the calls; what is made is
        // destroyed by `made` on failure, else when the recording thread
        // ends (`free_objects`).
        unsafe {
            let pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(|e| context.error("vkCreateCommandPool", e))?;
            made.pool = Some(pool);
            creating(pool);
            let progress = injected("vkCreateSemaphore")
                .and_then(|()| {
                    device.create_semaphore(
                        &vk::SemaphoreCreateInfo::default().push_next(&mut timeline),
                        None,
                    )
                })
                .map_err(|e| context.error("vkCreateSemaphore", e))?;
            made.progress = Some(progress);
            creating(progress);
        }
        let dummy = injected("vkCreateBuffer")
            .map_err(|e| ("vkCreateBuffer".to_owned(), e))
            .and_then(|()| make_buffer(&context, 16, context.memory.device, false))
            .map_err(|(call, e)| context.error(&call, e))?;
        creating(dummy.buffer());
        let (pool, progress) = (made.pool.take(), made.progress.take());
        drop(made);
        let mut recorder = Self {
            label: queue_label(ledger.id(), kind),
            device: owner,
            context,
            kind,
            pool: pool.expect("made above"),
            progress: progress.expect("made above"),
            next: 0,
            shared,
            current: None,
            open: None,
            waits: Waits::default(),
            retire: None,
            deferred: Vec::new(),
            dummy,
            clock: None,
            timing: None,
            // A copy queue records transfers only; a compute queue both.
            touched: Touched::new(match kind {
                QueueKind::Copy => &[Stage::Transfer],
                QueueKind::Compute => &[Stage::Shader, Stage::Transfer],
            }),
            bound: None,
            host_reads: false,
            replay: None,
            recordings: std::collections::HashMap::new(),
            pending_signal: None,
            failed_from: None,
            kernels: 0,
            programs: 0,
        };
        let bits = recorder.context.physical.families[family as usize].timestamp_valid_bits;
        let period = f64::from(recorder.context.limits().timestamp_period);
        if bits > 0 && period > 0.0 && recorder.query_resets(family) {
            // Without a clock, profiles use the host's times. A calibration
            // that fails (the device did not answer in 5 s, or is lost)
            // fails the queue's creation with why.
            match recorder.calibrate(period, super::timing::CALIBRATION_TIMEOUT_NS) {
                Ok(clock) => recorder.clock = Some(clock),
                Err(error) => {
                    recorder.discard();
                    return Err(error);
                }
            }
        }
        Ok(recorder)
    }

    /// Starts the retire thread (without one, each batch is waited for
    /// where it is settled).
    pub(super) fn start_retiring(&mut self, ledger: &Ledger) {
        let (retire, retiring) = mpsc::channel();
        let ledger = ledger.clone();
        let context = self.context.clone();
        let shared = self.shared.clone();
        let progress = self.progress;
        let label: crate::profile::Name = self.label.as_str().into();
        let clock = self.clock;
        if let Ok(thread) = std::thread::Builder::new()
            .name(format!("hwqueue-vulkan-retire {}", self.label))
            .spawn(move || {
                retire_all(
                    &context, progress, &shared, &label, clock, &ledger, retiring,
                );
            })
        {
            self.retire = Some((retire, thread));
        }
    }

    /// Frees what a recorder whose queue was never made holds (a later
    /// step of the queue's creation failed): it settled no batch, so only
    /// a calibration may have used its pool and progress semaphore. Where
    /// that calibration may still be pending (it was not seen complete:
    /// a timeout, a lost device), those two are kept for the process, as
    /// `calibrate` keeps its command buffer and query pool, rather than
    /// destroyed in use.
    pub(super) fn discard(mut self) {
        if let Some((retire, thread)) = self.retire.take() {
            drop(retire);
            let _ = thread.join();
        }
        if self.is_idle() {
            self.free_objects();
        } else {
            freed(self.dummy.buffer());
            free_buffer(&self.context, &self.dummy);
        }
    }

    /// Destroys the command pool, the progress semaphore and the dummy
    /// buffer. Every submission of the queue completed, and none is made
    /// after this.
    pub(super) fn free_objects(&self) {
        let device = &self.context.device;
        freed(self.pool);
        freed(self.progress);
        freed(self.dummy.buffer());
        // SAFETY: the caller's conditions: nothing pending uses them.
        unsafe {
            device.destroy_command_pool(self.pool, None);
            device.destroy_semaphore(self.progress, None);
        }
        free_buffer(&self.context, &self.dummy);
    }
}

/// `Err` where a test made `call` fail in queue creations on this thread
/// (`testing::FailingCall::here`); always `Ok` outside tests.
#[inline]
pub(super) fn injected(call: &str) -> std::result::Result<(), vk::Result> {
    #[cfg(test)]
    return super::testing::injected_here(call);
    #[cfg(not(test))]
    {
        let _ = call;
        Ok(())
    }
}

/// Notes an object a queue's creation made (tests count what is left).
#[inline]
pub(super) fn creating(handle: impl vk::Handle) {
    #[cfg(test)]
    super::testing::made(handle.as_raw());
    #[cfg(not(test))]
    let _ = handle;
}

/// Notes an object of a queue destroyed (tests count what is left).
#[inline]
pub(super) fn freed(handle: impl vk::Handle) {
    #[cfg(test)]
    super::testing::freed(handle.as_raw());
    #[cfg(not(test))]
    let _ = handle;
}

#[cfg(test)]
mod tests {
    use crate::device::QueueFactory;
    use crate::queue::HardwareQueue;
    use crate::vulkan::testing::{FailingCall, device, live_here};

    /// A queue's creation that failed after its first step left what it
    /// had made: the command pool where the progress semaphore failed was
    /// freed, but the pool and semaphore where the dummy buffer failed,
    /// those and the buffer where the calibration failed, and the
    /// calibration's query pool where its command buffer could not be
    /// had, were never destroyed (`?` returned past them; helper-68). Each
    /// step fails here in turn (on this thread only), and every object
    /// the creation made must be gone after it.
    #[test]
    fn a_queue_whose_creation_fails_destroys_what_it_made() {
        let Some(device) = device() else { return };
        // Made and dropped first: whether this queue family calibrates.
        let calibrates = device
            .compute_queue()
            .unwrap()
            .engine()
            .state
            .recorder
            .lock()
            .clock
            .is_some();
        let mut calls = vec!["vkCreateSemaphore", "vkCreateBuffer"];
        if calibrates {
            calls.extend([
                "vkCreateQueryPool",
                "vkAllocateCommandBuffers",
                "vkQueueSubmit",
            ]);
        } else {
            println!("the compute family has no timestamps: no calibration step fails");
        }
        for call in calls {
            let before = live_here();
            let failing = FailingCall::here(call);
            let made = device.compute_queue().map(drop);
            drop(failing);
            let error = made.expect_err("the creation fails");
            assert!(
                error.to_string().contains(call) || error.to_string().contains("calibrating"),
                "the error says what failed ({call}): {error}"
            );
            let left: Vec<u64> = live_here()
                .into_iter()
                .filter(|h| !before.contains(h))
                .collect();
            assert!(
                left.is_empty(),
                "{call} failed: {} object(s) the creation made are left",
                left.len()
            );
        }
        // A queue made after the failures works.
        let mut queue = device.compute_queue().unwrap();
        queue.synchronize().unwrap();
    }
}
