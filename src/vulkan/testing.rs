//! What the Vulkan backend's unit tests share: the device they run on,
//! and a way to keep the shared compute `VkQueue` busy while they look at
//! what a queue does with work still pending on it.

use ash::vk;
use parking_lot::Mutex;

use super::VulkanDevice;
use super::context::Context;

/// The first usable Vulkan device (lavapipe in CI), or `None` with
/// `skipped: …` printed; a failure where `HWQUEUE_REQUIRE_VULKAN` is set.
pub(super) fn device() -> Option<VulkanDevice> {
    let usable = super::devices()
        .ok()
        .and_then(|devices| devices.into_iter().find(|d| d.unusable.is_none()));
    match usable {
        Some(info) => Some(VulkanDevice::open(info.spec.ordinal()).expect("a usable device opens")),
        None => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
                "HWQUEUE_REQUIRE_VULKAN is set, and no usable Vulkan device was found"
            );
            println!("skipped: no Vulkan driver with a usable device");
            None
        }
    }
}

/// The compute `VkQueue` held behind a submission waiting on a timeline
/// semaphore of the test's, until `release` (or the drop, so that a
/// failing test never leaves the queue held): what is submitted after it
/// stays pending.
pub(super) struct BusyQueue<'a> {
    context: &'a Context,
    gate: vk::Semaphore,
    released: std::cell::Cell<bool>,
}

impl<'a> BusyQueue<'a> {
    pub(super) fn new(context: &'a Context) -> Self {
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline);
        // SAFETY: the create-info and its chain live across the call;
        // `drop` destroys the semaphore.
        let gate =
            unsafe { context.device.create_semaphore(&info, None) }.expect("vkCreateSemaphore");
        let gates = [gate];
        let open = [1u64];
        let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
        let mut values = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&open);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&gates)
            .wait_dst_stage_mask(&stages)
            .push_next(&mut values);
        let queue = context.compute_queue.lock();
        // SAFETY: the queue's lock is held; the infos live across the call;
        // `release` signals what it waits for.
        unsafe {
            context
                .device
                .queue_submit(*queue, &[submit], vk::Fence::null())
        }
        .expect("vkQueueSubmit");
        Self {
            context,
            gate,
            released: std::cell::Cell::new(false),
        }
    }

    /// Lets the queue go.
    pub(super) fn release(&self) {
        if self.released.replace(true) {
            return;
        }
        let signal = vk::SemaphoreSignalInfo::default()
            .semaphore(self.gate)
            .value(1);
        // SAFETY: a host signal of the gate, above its counter of 0.
        unsafe { self.context.device.signal_semaphore(&signal) }.expect("vkSignalSemaphore");
    }
}

impl Drop for BusyQueue<'_> {
    fn drop(&mut self) {
        self.release();
        let queue = self.context.compute_queue.lock();
        // SAFETY: the queue's lock is held; once it is idle the submission
        // that waited on the gate completed, and nothing else names it.
        unsafe {
            let _ = self.context.device.queue_wait_idle(*queue);
            self.context.device.destroy_semaphore(self.gate, None);
        }
    }
}

/// Vulkan calls a test made fail on one queue (named by its progress
/// semaphore), as a driver's may (lavapipe's fail only by a loss).
/// With how many times each failed.
static FAILING_CALLS: Mutex<Vec<(&'static str, vk::Semaphore, usize)>> = Mutex::new(Vec::new());

/// `Err` where a test made `call` fail on the queue whose progress
/// semaphore is `progress` ([`FailingCall`]).
pub(super) fn injected(call: &str, progress: vk::Semaphore) -> Result<(), vk::Result> {
    let mut failing = FAILING_CALLS.lock();
    match failing
        .iter_mut()
        .find(|(name, queue, _)| *name == call && *queue == progress)
    {
        Some((_, _, failed)) => {
            *failed += 1;
            Err(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)
        }
        None => Ok(()),
    }
}

/// Makes `call` fail on the queue of `progress` until it drops (so that
/// a failing test never leaves it failing).
pub(super) struct FailingCall(&'static str, vk::Semaphore);

impl FailingCall {
    pub(super) fn new(call: &'static str, progress: vk::Semaphore) -> Self {
        FAILING_CALLS.lock().push((call, progress, 0));
        Self(call, progress)
    }

    /// How many times the call failed so far.
    pub(super) fn failed(&self) -> usize {
        FAILING_CALLS
            .lock()
            .iter()
            .find(|(name, queue, _)| (*name, *queue) == (self.0, self.1))
            .map_or(0, |&(_, _, failed)| failed)
    }
}

impl Drop for FailingCall {
    fn drop(&mut self) {
        FAILING_CALLS
            .lock()
            .retain(|&(name, queue, _)| (name, queue) != (self.0, self.1));
    }
}
