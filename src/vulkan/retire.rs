//! The retire thread of a Vulkan queue: waits for each batch's
//! submissions, then completes its downloads, gives its staging ranges and
//! command buffers back, and files its profile events.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::Receiver;

use ash::vk;

use super::Vulkan;
use super::context::Context;
use super::engine::{CommandSet, Shared};
use super::memory::VulkanBuffer;
use super::timing::Clock;
use crate::buffer::Buffer;
use crate::error::{Error, Result, panic_message};
use crate::profile::{EventNames, describe, now_ns};
use crate::queue::{Batch, Command, Ledger};

/// What the retire thread waits for and then releases, for one batch.
pub(super) struct Retire {
    pub(super) batch: Batch<Vulkan>,
    /// The progress value of the batch's last submission (`None`: it
    /// submitted nothing).
    pub(super) progress: Option<u64>,
    pub(super) sets: Vec<CommandSet>,
    /// Staging ranges of the device's own pool (no allocation of the
    /// driver's a transfer), going back to it when the batch retired.
    pub(super) staging: Vec<VulkanBuffer>,
    /// Downloads: the command's index and the staging range (an index into
    /// `staging`) holding its bytes.
    pub(super) downloads: Vec<(usize, usize)>,
    /// The signals its submissions set: the retire thread sees each reached
    /// (a submission's semaphores are signalled in no set order, so the
    /// progress value alone does not say the others are).
    pub(super) signals: Vec<(vk::Semaphore, u64)>,
    /// Per command, when its submission was handed to the `VkQueue`
    /// (profiling only).
    pub(super) submitted_ns: Vec<u64>,
    /// Per command, for a wait that the recording thread held on the host
    /// (profiling only): when it reached the wait and when the wait let
    /// it go; `(0, 0)` for every other command.
    pub(super) held_ns: Vec<(u64, u64)>,
    /// Commands `stamped..upto` are recorded and not yet submitted.
    pub(super) stamped: usize,
    pub(super) upto: usize,
    /// How many of its commands ran (`usize::MAX`: all): those after a
    /// failure, or all of a batch skipped or rejected, did not, and their
    /// `dealloca`s leave their buffers live.
    pub(super) ran: usize,
    /// Commands timed on the device: index, query pool, first query.
    pub(super) timed: Vec<(usize, vk::QueryPool, u32)>,
    pub(super) profile: bool,
}

impl Retire {
    /// Whether retiring the batch releases nothing but its signals: it
    /// has only signals and waits (so no command buffer, staging, download
    /// or queue-ordered range), and no profile events.
    pub(super) fn holds_nothing(&self) -> bool {
        !self.profile && self.batch.commands().iter().all(Command::only_synchronises)
    }
}

/// The retire thread: each batch in order, once its submissions completed.
/// A wait that fails with the device not lost is reported to the owner,
/// and what that batch holds is never released (see `retire_one`).
pub(super) fn retire_all(
    context: &Context,
    progress: vk::Semaphore,
    shared: &Shared,
    label: &crate::profile::Name,
    clock: Option<Clock>,
    ledger: &Ledger,
    batches: Receiver<Retire>,
) {
    let mut names = EventNames::new();
    for batch in batches {
        // A panic here (a bug, or the `Drop` of an owner `upload_vec`
        // took) must not end the thread: `synchronize` and the queue's drop
        // wait for every batch to retire. The batch counts as retired (see
        // `Retired`), what it held is let go, and the owner hears of it.
        // An upload owner's panicking drop is contained and told by
        // `letting_go`; any other panic ends `retire_one`, caught here.
        let what = "a Vulkan queue's retire thread, retiring a batch that completed";
        let retired = ledger.letting_go(what, || {
            catch_unwind(AssertUnwindSafe(|| {
                retire_one(
                    context,
                    progress,
                    shared,
                    Some((label, &mut names, clock)),
                    batch,
                )
            }))
        });
        if let Ok(Some(error)) = &retired {
            ledger.fail_unbatched(error.clone());
        }
        if let Err(payload) = retired {
            // Told before the batch counts as retired: a `synchronize`
            // that sees it retired reports the panic.
            ledger.fail_unbatched(Error::EnginePanicked {
                message: format!(
                    "the retire thread of Vulkan queue {label}, retiring a batch that completed: \
                     {}",
                    panic_message(payload)
                ),
            });
        }
        count_retired(shared);
    }
}

/// Counts a batch retired, and wakes `synchronize` and the queue's drop.
pub(super) fn count_retired(shared: &Shared) {
    shared.progress.lock().1 += 1;
    shared.retired.notify_all();
}

pub(super) fn retire_one(
    context: &Context,
    progress: vk::Semaphore,
    shared: &Shared,
    profile: Option<(&crate::profile::Name, &mut EventNames, Option<Clock>)>,
    mut done: Retire,
) -> Option<Error> {
    // The queue's progress, then every signal the batch set: a
    // submission's semaphores are signalled in no set order.
    let mut waits: Vec<(vk::Semaphore, u64)> = done
        .progress
        .map(|value| (progress, value))
        .into_iter()
        .collect();
    waits.extend_from_slice(&done.signals);
    let lost = wait_all_semaphores(context, &waits).err();
    if let Some(error) = lost
        .as_ref()
        .filter(|e| !matches!(e, Error::DeviceLost { .. }))
    {
        // The wait failed and the device is not lost, so it may still run
        // the batch: nothing the batch holds (command buffers, staging,
        // buffers and their ranges) may be reused. Its downloads fail, the
        // owner hears of it, and the rest is kept for the process.
        for command in done.batch.commands() {
            if let Command::Download { sink, .. } = command {
                sink.fail(error);
            }
        }
        let error = error.clone();
        std::mem::forget(done);
        return Some(error);
    }
    // A host `set` deferred behind these signals is signalled now.
    for command in done.batch.commands() {
        if let Command::Signal { signal, .. } = command {
            signal.apply_deferred();
        }
    }
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
    done.batch.complete_deallocas(done.ran);
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
            let held = done
                .held_ns
                .get(index)
                .copied()
                .filter(|&(start, _)| start != 0);
            let (start, end) = match (device_times[index], last_end) {
                (Some((start, end)), Some(last)) => (start.max(last), end.max(start.max(last))),
                (Some(times), None) => times,
                // A wait the host held spans what it held, in queue order.
                (None, last) if held.is_some() => {
                    let (from, to) = held.expect("matched");
                    let start = from.max(last.unwrap_or(0));
                    (start, to.max(start))
                }
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
    None
}

/// Blocks until every semaphore of `waits` reached its value; the error of
/// a failed wait (a lost device). The semaphores must live across the call.
pub(super) fn wait_all_semaphores(context: &Context, waits: &[(vk::Semaphore, u64)]) -> Result<()> {
    if waits.is_empty() {
        return Ok(());
    }
    #[cfg(test)]
    if let Some(error) = tests::injected(waits) {
        return Err(context.error("vkWaitSemaphores (a batch's completion)", error));
    }
    #[cfg(test)]
    if tests::seen_at_once(waits) {
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
            // A device lost elsewhere (another call saw it) never gets here.
            Err(vk::Result::TIMEOUT) => context.health()?,
            Err(e) => return Err(context.error("vkWaitSemaphores (a batch's completion)", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use ash::vk;
    use parking_lot::Mutex;

    use crate::device::{Device, QueueFactory};
    use crate::error::Error;
    use crate::queue::HardwareQueue;
    use crate::vulkan::testing::device;

    /// Semaphores whose waits fail with an error that is no device loss,
    /// as a driver's `vkWaitSemaphores` may (lavapipe's fails only by a
    /// loss).
    static FAILING: Mutex<Vec<vk::Semaphore>> = Mutex::new(Vec::new());

    /// The error `wait_all_semaphores` fails with instead of waiting, where
    /// a test made waits on one of `waits` fail.
    pub(super) fn injected(waits: &[(vk::Semaphore, u64)]) -> Option<vk::Result> {
        let failing = FAILING.lock();
        waits
            .iter()
            .any(|(semaphore, _)| failing.contains(semaphore))
            .then_some(vk::Result::ERROR_OUT_OF_HOST_MEMORY)
    }

    /// Semaphores a wait sees reached at once, where every semaphore it
    /// waits on is one: the window in which a driver made one semaphore
    /// of a submission visible before the others.
    static SEEN_AT_ONCE: Mutex<Vec<vk::Semaphore>> = Mutex::new(Vec::new());

    /// Whether `wait_all_semaphores` returns at once, as if every one of
    /// `waits` were reached (all are in [`SEEN_AT_ONCE`]).
    pub(super) fn seen_at_once(waits: &[(vk::Semaphore, u64)]) -> bool {
        let seen = SEEN_AT_ONCE.lock();
        waits.iter().all(|(semaphore, _)| seen.contains(semaphore))
    }

    /// `semaphore` in `list` until the drop: a test that fails in between
    /// leaves no entry behind for a later semaphore the driver gives the
    /// same handle.
    struct Listed(&'static Mutex<Vec<vk::Semaphore>>, vk::Semaphore);

    impl Listed {
        fn new(list: &'static Mutex<Vec<vk::Semaphore>>, semaphore: vk::Semaphore) -> Self {
            list.lock().push(semaphore);
            Self(list, semaphore)
        }
    }

    impl Drop for Listed {
        fn drop(&mut self) {
            self.0.lock().retain(|&s| s != self.1);
        }
    }

    /// A CPU signal whose value 1 failed elsewhere: a `wait_foreign` on
    /// it fails the batch there.
    fn failed_elsewhere() -> crate::cpu::CpuSignal {
        use crate::signal::TimelineSignal;
        let failed = crate::cpu::CpuSignal::new(0);
        failed.fail(
            1,
            Error::KernelFailed {
                program: "elsewhere".into(),
                message: "failed on its own account".into(),
            },
        );
        failed
    }

    /// Value 1 of a signal, then a batch that fails before value 2: in
    /// one batch, or (`split`) in two, the first handed to the retire
    /// thread already. The failure of 2 must not be seen before 1 is
    /// reached. The window is made certain: the progress semaphore is
    /// seen reached at once while the `VkQueue` is held.
    fn a_failure_waits_for_value_1(split: bool) {
        use std::time::Duration;

        use crate::signal::TimelineSignal;
        use crate::vulkan::testing::BusyQueue;

        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let signal = device.new_signal(0).unwrap();
        let failed = failed_elsewhere();
        let mut queue = device.compute_queue().unwrap();
        let progress = queue.engine().state.recorder.lock().progress;
        let busy = BusyQueue::new(device.context());
        let seen_at_once = Listed::new(&SEEN_AT_ONCE, progress);
        queue.fill(&buffer, 7u32).signal(&signal, 1);
        if split {
            queue.submit().unwrap();
        }
        queue
            .wait_foreign(&failed, 1)
            .signal(&signal, 2)
            .submit()
            .unwrap();
        let early = signal.wait(2, Duration::from_millis(300));
        drop(seen_at_once);
        busy.release();
        assert!(
            matches!(early, Err(Error::Timeout { .. })),
            "value 2 failed while value 1, submitted before it (split: {split}), \
             was not reached: {early:?}"
        );
        assert!(matches!(
            signal.wait(2, Duration::from_secs(30)),
            Err(Error::SignalFailed { .. })
        ));
        assert!(signal.is_reached(1));
        assert!(queue.synchronize().is_err());
    }

    /// A batch failed after a signal it submitted: the failure of the
    /// signal's later value was published once the queue's progress
    /// semaphore was seen reached, though a submission's semaphores are
    /// signalled in no set order: a waiter on the failed value saw it
    /// fail while the lower value, submitted before it, was not reached
    /// (CI on `aab2f53`, under load, on lavapipe). The failure now waits
    /// for the batch's signals too.
    #[test]
    fn a_failure_waits_for_the_signals_submitted_before_it_not_only_progress() {
        a_failure_waits_for_value_1(false);
    }

    /// The same across batches (helper-65): the lower value was signalled
    /// by an earlier batch, handed to the retire thread already, so it was
    /// neither the failed batch's signal nor a deferred one's. The failure
    /// waits for each of the batch's signals at the highest value
    /// submitted for it now.
    #[test]
    fn a_failure_waits_for_a_lower_value_an_earlier_batch_signals() {
        a_failure_waits_for_value_1(true);
    }

    /// Runs `f` (which may hang on a defect) on a thread of its own, and
    /// fails the test where it has not returned within 30 s.
    fn within_30_s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("hung: not returned within 30 s")
    }

    /// A host `set` deferred behind a queue's pending signal raised the
    /// signal's `submitted`, which 0d0e8ab's failure path then waited for:
    /// no submission signals that value (`apply_deferred` does, on the
    /// retire thread, once the kept-back batch before it retires), so a
    /// failed batch behind a batch kept back on the owner's thread waited
    /// forever, holding the recorder (helper-66). It waits for the values
    /// submissions signal.
    #[test]
    fn a_failure_never_waits_for_a_deferred_host_set() {
        use crate::signal::TimelineSignal;
        use crate::vulkan::testing::BusyQueue;

        let Some(device) = device() else { return };
        let signal = device.new_signal(0).unwrap();
        let failed = failed_elsewhere();
        let mut queue = device.compute_queue().unwrap();
        let busy = BusyQueue::new(device.context());
        // Signals only: settled on the owner's thread and kept back.
        queue.signal(&signal, 1).submit().unwrap();
        // A queue's signal is pending: deferred.
        signal.set(5);
        queue
            .wait_foreign(&failed, 1)
            .signal(&signal, 6)
            .submit()
            .unwrap();
        busy.release();
        let waited = signal.clone();
        let outcome = within_30_s(move || {
            let synchronized = queue.synchronize();
            (
                synchronized,
                waited.wait(5, std::time::Duration::from_secs(20)),
            )
        });
        assert!(outcome.0.is_err(), "the failure is reported: {outcome:?}");
        assert!(
            outcome.1.is_ok(),
            "the deferred set is applied: {outcome:?}"
        );
        assert!(matches!(
            signal.wait(6, std::time::Duration::ZERO),
            Err(Error::SignalFailed { .. })
        ));
    }

    /// A host `set` deferred behind a queue's pending signal, where that
    /// queue's batch (signals only) is kept back on its owner's thread:
    /// another queue's batch, held on the host until value 5 was submitted,
    /// took the deferred set for a submission and waited for 5 on the
    /// device; `apply_deferred` signals it only once the kept-back batch
    /// retires, which waits for the first queue's next hand-over, so the
    /// second queue's `synchronize` (and the shared `VkQueue` behind the
    /// wait) hung while the first queue was left alone (helper-68). The
    /// value is reached for every waiter (`value`): no device wait is made.
    #[test]
    fn a_queue_waits_for_no_host_set_deferred_behind_a_kept_back_batch() {
        use std::sync::atomic::Ordering;
        use std::time::{Duration, Instant};

        use crate::buffer::Buffer;
        use crate::signal::TimelineSignal;
        use crate::vulkan::testing::BusyQueue;

        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let signal = device.new_signal(0).unwrap();
        let mut first = device.compute_queue().unwrap();
        let mut second = device.compute_queue().unwrap();
        let shared = second.engine().state.shared.clone();
        let busy = BusyQueue::new(device.context());
        // Signals only: settled on the owner's thread and kept back, its
        // signal pending behind the held `VkQueue`.
        first.signal(&signal, 1).submit().unwrap();
        // Held on the host by the recording thread until 5 is submitted.
        second
            .wait(&signal, 5)
            .fill(&buffer, 7u32)
            .submit()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while shared.holding.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "the wait was never held");
            std::thread::yield_now();
        }
        // The first queue's signal is pending: deferred, and seen at once
        // by a host waiter.
        signal.set(5);
        assert!(signal.is_reached(5));
        busy.release();
        drop(busy);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = tx.send(second.synchronize());
            second
        });
        let synchronized = rx.recv_timeout(Duration::from_secs(30));
        // Hands the kept-back batch over, which applies the set: a hung
        // second queue ends, and the test fails rather than hang.
        first.synchronize().unwrap();
        let _second = waiter.join().unwrap();
        let synchronized = synchronized.expect(
            "hung: the second queue waited on the device for a host set deferred behind a \
             batch kept back on the first queue's owner",
        );
        synchronized.unwrap();
        assert_eq!(buffer.to_vec::<u32>().unwrap(), [7; 4]);
        signal.wait(5, Duration::ZERO).unwrap();
    }

    /// A submission that failed (`note_dropped`) set the signal's queued
    /// value to `submitted`, which a deferred host `set` had raised: the
    /// deferred value was then never signalled (`apply_deferred` saw it as
    /// queued), and 0d0e8ab's failure path waited for it forever, in the
    /// owner's `submit` (helper-66). The queued value goes back to what
    /// submissions signal.
    #[test]
    fn a_failed_submission_leaves_a_deferred_host_set_to_be_applied() {
        use crate::signal::TimelineSignal;
        use crate::vulkan::testing::{BusyQueue, FailingCall};

        let Some(device) = device() else { return };
        let buffer = device.alloc(16).unwrap();
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let progress = queue.engine().state.recorder.lock().progress;
        let busy = BusyQueue::new(device.context());
        // Holds a command buffer: handed to the retire thread.
        queue
            .fill(&buffer, 1u32)
            .signal(&signal, 1)
            .submit()
            .unwrap();
        signal.set(5);
        let failing = FailingCall::new("vkEndCommandBuffer", progress);
        let (waited, written) = (signal.clone(), buffer.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Settled here, on the owner's thread: its failure waits for
            // the first batch, which the held `VkQueue` keeps pending.
            let submitted = queue.fill(&written, 2u32).signal(&waited, 6).submit();
            let synchronized = queue.synchronize();
            let applied = waited.wait(5, std::time::Duration::from_secs(20));
            let _ = tx.send((submitted, synchronized, applied));
        });
        // Released once the submission failed, so that the first batch
        // is still pending then (no sleep: the hook counts its failures).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while failing.failed() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the submission never ended"
            );
            std::thread::yield_now();
        }
        busy.release();
        let outcome = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("hung: the failed submission waited for the deferred set");
        drop(failing);
        assert!(
            outcome.0.is_err() || outcome.1.is_err(),
            "the failed end is reported: {outcome:?}"
        );
        assert!(
            outcome.2.is_ok(),
            "the deferred set is applied: {outcome:?}"
        );
    }

    /// Issue 46, defect 7: a wait for a batch's completion that failed
    /// with the device not lost released what the batch held (its command
    /// buffer back to be recorded again, its staging and buffers back to
    /// their pools) while the device might still run it. It releases
    /// nothing now, and the owner hears of the error.
    #[test]
    fn a_failed_wait_that_is_no_loss_releases_nothing_the_batch_holds() {
        let Some(device) = device() else { return };
        let source = device.alloc(256).unwrap();
        let copy = device.alloc(256).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let state = &queue.engine().state;
        let (progress, shared) = (state.recorder.lock().progress, state.shared.clone());
        assert!(
            shared.free.lock().is_empty(),
            "a new queue has recorded nothing"
        );
        let failing = Listed::new(&FAILING, progress);
        queue.copy(&copy, &source).submit().unwrap();
        let error = queue.synchronize().unwrap_err();
        drop(failing);
        assert!(
            !matches!(error, Error::DeviceLost { .. })
                && error.to_string().contains("vkWaitSemaphores"),
            "the owner hears of the failed wait: {error}"
        );
        assert!(
            shared.free.lock().is_empty(),
            "the batch's command buffer, which the device may still run, is not recorded again"
        );
        // The copy ran after all; the queue's drop waits for nothing more.
        let next = queue.engine().state.recorder.lock().next;
        super::wait_all_semaphores(device.context(), &[(progress, next)]).unwrap();
    }
}
