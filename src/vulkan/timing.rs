//! Device timestamps for profiles: a query pool per command buffer, two
//! timestamps around each device command, mapped onto the host's clock by
//! one calibration per queue (`Clock`).

use ash::vk;

use super::engine::QUERIES;
use super::recorder::Recorder;
use crate::error::Result;
use crate::profile::now_ns;

/// How device timestamps map onto the host's clock (`now_ns`): nanoseconds
/// per tick, and the host time of tick 0, measured once per queue by
/// writing a timestamp between two host readings (their midpoint; the
/// clocks' drift over a process's life is not corrected).
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) period: f64,
    pub(super) zero_ns: f64,
}

impl Clock {
    pub(super) fn host_ns(self, ticks: u64) -> u64 {
        (self.zero_ns + ticks as f64 * self.period).max(0.0) as u64
    }
}

/// How long a queue's creation waits for its calibration's timestamp.
pub(super) const CALIBRATION_TIMEOUT_NS: u64 = 5_000_000_000;

/// Where a queue resets its timestamp queries before reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QueryReset {
    /// `vkResetQueryPool` on the host (`hostQueryReset`).
    Host,
    /// `vkCmdResetQueryPool` in the command buffer.
    InCommands,
}

/// Where a queue of a family with `flags` resets its timestamp queries,
/// the device having `hostQueryReset` or not: on the host where it can,
/// else in a command buffer, which only a compute or graphics family may
/// record (VUID-vkCmdResetQueryPool-commandBuffer-cmdpool); `None` for a
/// transfer-only family without host resets, which then has no device
/// timestamps.
pub(super) fn query_reset(host_query_reset: bool, flags: vk::QueueFlags) -> Option<QueryReset> {
    if host_query_reset {
        Some(QueryReset::Host)
    } else if flags.intersects(vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS) {
        Some(QueryReset::InCommands)
    } else {
        None
    }
}

impl Recorder {
    /// Writes one timestamp between two readings of the host's clock: the
    /// device's tick 0 on the host's clock. The device has `timeout_ns`
    /// ([`CALIBRATION_TIMEOUT_NS`]) to run it: a calibration not seen
    /// complete by then fails, its progress value counted as signalled
    /// (the next submission signals past it) and its command buffer and
    /// query pool kept rather than freed while the device may use them.
    pub(super) fn calibrate(&mut self, period: f64, timeout_ns: u64) -> Result<Clock> {
        let queries = super::setup::injected("vkCreateQueryPool")
            .map_err(|e| self.context.error("vkCreateQueryPool", e))
            .and_then(|()| self.query_pool())?;
        super::setup::creating(queries);
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let device = &self.context.device;
        // SAFETY: the pool is this thread's; the command buffer records one
        // timestamp, is submitted once, waited for, and freed; the query
        // pool is destroyed after its result is read, or where no command
        // buffer could be had for it.
        unsafe {
            let allocated = super::setup::injected("vkAllocateCommandBuffers")
                .and_then(|()| device.allocate_command_buffers(&info));
            let buffer = match allocated {
                Ok(buffers) => buffers[0],
                Err(e) => {
                    super::setup::freed(queries);
                    device.destroy_query_pool(queries, None);
                    return Err(self.context.error("vkAllocateCommandBuffers", e));
                }
            };
            let on_host = self.reset_queries(queries, 1);
            let recorded = device
                .begin_command_buffer(buffer, &vk::CommandBufferBeginInfo::default())
                .and_then(|()| {
                    if !on_host {
                        device.cmd_reset_query_pool(buffer, queries, 0, 1);
                    }
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
                super::setup::injected("vkQueueSubmit")
                    .and_then(|()| device.queue_submit(*queue, &[submit], vk::Fence::null()))
            });
            let before = now_ns();
            let outcome = submitted.and_then(|()| {
                let semaphores = [self.progress];
                let values = [value];
                device.wait_semaphores(
                    &vk::SemaphoreWaitInfo::default()
                        .semaphores(&semaphores)
                        .values(&values),
                    timeout_ns,
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
            if submitted.is_ok() {
                // Submitted, it signals `value` whatever the wait saw: the
                // next submission signals past it.
                self.next = value;
            }
            if outcome.is_ok() || submitted.is_err() {
                device.free_command_buffers(self.pool, &[buffer]);
                super::setup::freed(queries);
                device.destroy_query_pool(queries, None);
            }
            // Else the submission may still be pending (the wait timed out
            // or failed): its command buffer and query pool are never
            // freed, rather than freed in use.
            read.map_err(|e| self.context.error("calibrating the queue's timestamps", e))?;
            let midpoint = (before as f64 + after as f64) / 2.0;
            Ok(Clock {
                period,
                zero_ns: midpoint - ticks[0] as f64 * period,
            })
        }
    }

    /// Resets `count` queries of `pool`, which no pending work uses, on
    /// the host where the device allows it (`hostQueryReset`, enabled
    /// where supported): `true`. `false`: reset them in the command
    /// buffer, which `query_resets` said this queue's family may.
    pub(super) fn reset_queries(&self, pool: vk::QueryPool, count: u32) -> bool {
        if !self.context.host_query_reset {
            return false;
        }
        // SAFETY: the pool is alive, `count` is within it, and no pending
        // submission uses it (a new pool, or a command set's whose last
        // use retired).
        unsafe { self.context.device.reset_query_pool(pool, 0, count) };
        true
    }

    /// Whether this queue can reset timestamp queries at all
    /// ([`query_reset`]); without, it has no device timestamps.
    pub(super) fn query_resets(&self, family: u32) -> bool {
        let flags = self.context.physical.families[family as usize].queue_flags;
        query_reset(self.context.host_query_reset, flags).is_some()
    }

    /// A pool of [`QUERIES`] timestamps.
    pub(super) fn query_pool(&self) -> Result<vk::QueryPool> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(QUERIES);
        // SAFETY: the create-info lives across the call.
        unsafe { self.context.device.create_query_pool(&info, None) }
            .map_err(|e| self.context.error("vkCreateQueryPool", e))
    }

    /// While profiling with a clock: a timestamp before the command about
    /// to be recorded (its pair is written by `close_timing`).
    pub(super) fn open_timing(&mut self, buffer: vk::CommandBuffer) -> Result<()> {
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
        let (queries, first_use) = (set.queries, set.written == 0);
        // Reset when the command set is opened (its last use retired).
        if first_use && !self.reset_queries(queries, QUERIES) {
            // SAFETY: the command buffer records; the queries are in range;
            // `query_resets` said the family resets queries in commands.
            unsafe {
                self.context
                    .device
                    .cmd_reset_query_pool(buffer, queries, 0, QUERIES);
            }
        }
        let (set, _) = self.open.as_mut().expect("begun");
        let device = &self.context.device;
        // SAFETY: the command buffer records; the queries are in range.
        unsafe {
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
    pub(super) fn close_timing(&mut self, index: usize) {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::queue::{Ledger, QueueKind};
    use crate::vulkan::engine::Shared;
    use crate::vulkan::retire::wait_all_semaphores;
    use crate::vulkan::testing::{BusyQueue, device};

    /// Issue 46, defect 1: calibration and profiled command buffers
    /// recorded `vkCmdResetQueryPool` on every family, a transfer-only one
    /// included, which may not (VUID-vkCmdResetQueryPool-commandBuffer-
    /// cmdpool). An H100's families: graphics (0), transfer-only (1), and
    /// compute-only (2).
    #[test]
    fn only_a_compute_or_graphics_family_resets_queries_in_commands() {
        let graphics =
            vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER;
        let transfer = vk::QueueFlags::TRANSFER | vk::QueueFlags::SPARSE_BINDING;
        let compute = vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER;
        for flags in [graphics, compute] {
            assert_eq!(query_reset(false, flags), Some(QueryReset::InCommands));
        }
        assert_eq!(
            query_reset(false, transfer),
            None,
            "a transfer-only family without hostQueryReset has no timestamps"
        );
        for flags in [graphics, transfer, compute] {
            assert_eq!(query_reset(true, flags), Some(QueryReset::Host));
        }
    }

    /// Issue 46, defect 2: a calibration the device did not run in time
    /// (here the shared `VkQueue` is busy behind a wait of the test's) was
    /// abandoned while pending: the queue's progress value stayed where it
    /// was, so its next submission signalled the same value again
    /// (VUID-VkSubmitInfo-pSignalSemaphores-03242), and its command buffer
    /// and query pool were freed in use. It counts its value as signalled,
    /// keeps what it used, and says why it failed.
    #[test]
    fn a_calibration_that_times_out_fails_and_counts_its_value_as_signalled() {
        let Some(device) = device() else { return };
        let context = device.context().clone();
        let ledger = Ledger::new();
        let shared = Arc::new(Shared::default());
        let family = context.compute_family;
        let mut recorder =
            Recorder::new(device.clone(), family, QueueKind::Compute, shared, &ledger).unwrap();
        if recorder.clock.is_none() {
            println!("skipped: the compute family has no timestamps");
            return;
        }
        let period = f64::from(context.limits().timestamp_period);
        let busy = BusyQueue::new(&context);
        let before = recorder.next;
        let error = recorder.calibrate(period, 1_000_000).unwrap_err();
        assert!(
            error.to_string().contains("calibrating"),
            "the error says what timed out: {error}"
        );
        assert_eq!(
            recorder.next,
            before + 1,
            "the pending calibration signals its value once it runs: the next submission \
             must signal past it"
        );
        busy.release();
        // The calibration ran after all, and signalled the value counted.
        wait_all_semaphores(&context, &[(recorder.progress, recorder.next)]).unwrap();
        // A calibration in time still works after it.
        assert!(recorder.calibrate(period, CALIBRATION_TIMEOUT_NS).is_ok());
        assert_eq!(recorder.next, before + 2);
    }
}
