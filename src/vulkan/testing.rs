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

/// A new program (so no pipeline of it is cached yet) adding 1 to each
/// word of its one buffer, 4 invocations a work group.
pub(super) fn add_one() -> super::VulkanProgram {
    super::VulkanProgram::from_wgsl(
        "add_one",
        "@group(0) @binding(0) var<storage, read_write> data: array<u32>;
         @compute @workgroup_size(4)
         fn main(@builtin(global_invocation_id) id: vec3<u32>) {
             data[id.x] = data[id.x] + 1u;
         }",
        "main",
    )
    .expect("the add_one kernel compiles")
}

/// A submission on the shared compute `VkQueue` that waits for value 1
/// of a timeline semaphore of the test's (`open`), with a fence that says
/// when it completed: what is submitted after it stays pending until then.
pub(super) struct Gate {
    semaphore: vk::Semaphore,
    fence: vk::Fence,
}

impl Gate {
    pub(super) fn submit(context: &Context) -> Self {
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline);
        // SAFETY: the create-infos and the chain live across the calls;
        // `finish` destroys both objects.
        let (semaphore, fence) = unsafe {
            (
                context.device.create_semaphore(&info, None),
                context
                    .device
                    .create_fence(&vk::FenceCreateInfo::default(), None),
            )
        };
        let (semaphore, fence) = (
            semaphore.expect("vkCreateSemaphore"),
            fence.expect("vkCreateFence"),
        );
        let gates = [semaphore];
        let open = [1u64];
        let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
        let mut values = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&open);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&gates)
            .wait_dst_stage_mask(&stages)
            .push_next(&mut values);
        let queue = context.compute_queue.lock();
        // SAFETY: the queue's lock is held; the infos live across the call;
        // `open` signals what it waits for.
        unsafe { context.device.queue_submit(*queue, &[submit], fence) }.expect("vkQueueSubmit");
        Self { semaphore, fence }
    }

    /// Lets the submission (and what the queue holds behind it) run.
    pub(super) fn open(&self, context: &Context) {
        let signal = vk::SemaphoreSignalInfo::default()
            .semaphore(self.semaphore)
            .value(1);
        // SAFETY: a host signal of the gate, above its counter of 0 (a
        // second `open` of the same value is never made: see `BusyQueue`).
        unsafe { context.device.signal_semaphore(&signal) }.expect("vkSignalSemaphore");
    }

    /// Waits for the submission to complete (it must be open), and frees
    /// what it used. The queue's lock is not held meanwhile: another
    /// test's gate submitted after this one may still be closed, and that
    /// test may need the lock to submit before it opens it (a
    /// `vkQueueWaitIdle` under the lock here deadlocked two tests: the CI
    /// run of `895dc75`).
    /// The wait is bounded (30 s): where the submission has not completed
    /// by then (an earlier gate some test never opened), both objects are
    /// leaked rather than destroyed in use, and the test goes on to fail
    /// on its own account instead of hanging the run.
    pub(super) fn finish(self, context: &Context) {
        // SAFETY: the fence was handed to the submission; once it is
        // signalled the submission completed, and nothing else names the
        // two objects; unsignalled, they are not destroyed.
        unsafe {
            let waited = context
                .device
                .wait_for_fences(&[self.fence], true, 30_000_000_000);
            if waited.is_ok() {
                context.device.destroy_fence(self.fence, None);
                context.device.destroy_semaphore(self.semaphore, None);
            }
        }
    }
}

/// Whether a test holds a [`BusyQueue`]: one at a time in the process, so
/// that no test's pending work waits behind another test's gate too.
static BUSY: Mutex<bool> = Mutex::new(false);
static BUSY_FREED: parking_lot::Condvar = parking_lot::Condvar::new();

/// The compute `VkQueue` held behind a [`Gate`] until `release` (or the
/// drop, so that a failing test never leaves the queue held): what is
/// submitted after it stays pending. One at a time ([`BUSY`]).
pub(super) struct BusyQueue<'a> {
    context: &'a Context,
    gate: Option<Gate>,
    released: std::cell::Cell<bool>,
}

impl<'a> BusyQueue<'a> {
    pub(super) fn new(context: &'a Context) -> Self {
        let mut busy = BUSY.lock();
        while *busy {
            BUSY_FREED.wait(&mut busy);
        }
        *busy = true;
        drop(busy);
        Self {
            context,
            gate: Some(Gate::submit(context)),
            released: std::cell::Cell::new(false),
        }
    }

    /// Lets the queue go.
    pub(super) fn release(&self) {
        if self.released.replace(true) {
            return;
        }
        if let Some(gate) = &self.gate {
            gate.open(self.context);
        }
    }
}

impl Drop for BusyQueue<'_> {
    fn drop(&mut self) {
        self.release();
        if let Some(gate) = self.gate.take() {
            gate.finish(self.context);
        }
        *BUSY.lock() = false;
        BUSY_FREED.notify_one();
    }
}

/// A test's gate dropped while another gate, submitted after it, is
/// still closed: the drop waited for the whole queue to go idle, under the
/// queue's lock, so the other test could never submit the work after
/// which it opens its gate (two `retire` tests hung CI on `895dc75`).
#[test]
fn a_busy_queue_goes_without_waiting_for_a_later_gate() {
    let Some(device) = device() else { return };
    let context = device.context();
    let busy = BusyQueue::new(context);
    let later = Gate::submit(context);
    busy.release();
    let (dropped, rx) = std::sync::mpsc::channel();
    let had_to_open = std::thread::scope(|scope| {
        let later = &later;
        let opener = scope.spawn(move || {
            // Where the drop still waits after 30 s, the later gate is
            // opened so that it ends, and the test fails.
            let waited = rx.recv_timeout(std::time::Duration::from_secs(30));
            if waited.is_err() {
                later.open(context);
            }
            waited.is_err()
        });
        drop(busy);
        let _ = dropped.send(());
        opener.join().expect("the opener does not panic")
    });
    if !had_to_open {
        later.open(context);
    }
    later.finish(context);
    assert!(
        !had_to_open,
        "dropping a busy queue waited for a gate submitted after it"
    );
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

std::thread_local! {
    /// Vulkan calls a test made fail in queue creations on its thread
    /// ([`FailingCall::here`]): the queue's progress semaphore, which
    /// [`injected`] names it by, does not exist yet there.
    static FAILING_HERE: std::cell::RefCell<Vec<&'static str>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// Objects a queue's creation made on this thread and not yet
    /// destroyed on it (raw handles).
    static LIVE_HERE: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `Err` where a test made `call` fail in queue creations on this thread.
pub(super) fn injected_here(call: &str) -> Result<(), vk::Result> {
    let failing = FAILING_HERE.with(|failing| failing.borrow().contains(&call));
    if failing {
        Err(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)
    } else {
        Ok(())
    }
}

/// Notes an object made by a queue's creation on this thread.
pub(super) fn made(handle: u64) {
    LIVE_HERE.with(|live| live.borrow_mut().push(handle));
}

/// Notes an object of a queue destroyed (on this thread: one made on
/// another is not in its list).
pub(super) fn freed(handle: u64) {
    LIVE_HERE.with(|live| live.borrow_mut().retain(|&h| h != handle));
}

/// The objects queue creations on this thread made and did not destroy.
pub(super) fn live_here() -> Vec<u64> {
    LIVE_HERE.with(|live| live.borrow().clone())
}

impl FailingCall {
    /// Makes `call` fail in queue creations on this thread until the
    /// guard drops.
    pub(super) fn here(call: &'static str) -> FailingHere {
        FAILING_HERE.with(|failing| failing.borrow_mut().push(call));
        FailingHere(call)
    }
}

/// See [`FailingCall::here`].
pub(super) struct FailingHere(&'static str);

impl Drop for FailingHere {
    fn drop(&mut self) {
        FAILING_HERE.with(|failing| failing.borrow_mut().retain(|&call| call != self.0));
    }
}
