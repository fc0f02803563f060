//! The memory pool under a running queue: a range freed while a queue still
//! uses it is handed out again only once that use is over, whatever the
//! interleaving of the host and the queue's worker. The property is checked
//! on the bytes: a successor written by the host keeps what it wrote, so no
//! kernel of the earlier owner wrote into it late.

use hwqueue::cpu::{CpuBuffer, CpuDevice};
use hwqueue::{Buffer, Device, ExecParams, HardwareQueue, QueueFactory, TimelineSignal};

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{model, write_42};

fn address(buffer: &CpuBuffer) -> usize {
    buffer.as_ptr() as usize
}

/// The host drops its handle to a buffer right after submitting a kernel
/// that writes it, then allocates the same size: if it gets the same range,
/// the batch's signal was reached already, and in every case the kernel
/// never writes into what the host put in the successor.
#[test]
fn a_buffer_dropped_while_a_batch_uses_it_is_reused_only_after_the_batch() {
    // Interleavings where the range was reused: the check below must have
    // run in some (a std atomic, outside the model).
    static REUSED: AtomicUsize = AtomicUsize::new(0);
    model(None, || {
        let device = CpuDevice::with_threads(1);
        let buffer = device.alloc_uninit(64).unwrap();
        let at = address(&buffer);
        let done = device.new_signal(0).unwrap();
        let program = write_42();
        let mut queue = device.compute_queue().unwrap();
        queue
            .exec(&program, &[&buffer], &[], ExecParams::new_1d(1, 1))
            .signal(&done, 1)
            .submit()
            .unwrap();
        drop(buffer);
        let successor = device.alloc_uninit(64).unwrap();
        if address(&successor) == at {
            REUSED.fetch_add(1, Ordering::Relaxed);
            assert!(done.is_reached(1), "the range was reused before the batch");
        }
        successor.write_at(0, &[7u32]).unwrap();
        queue.synchronize().unwrap();
        assert_eq!(successor.to_vec::<u32>().unwrap()[0], 7);
    });
    assert!(
        REUSED.load(Ordering::Relaxed) > 0,
        "no interleaving reused the range"
    );
}

/// `alloca`, a kernel on it and its `dealloca` in one batch: the host's
/// next allocation may get the range as soon as the `dealloca` ran, and the
/// kernel, earlier in queue order, has then finished with it.
#[test]
fn a_dealloca_returns_the_range_only_after_earlier_work_on_its_queue() {
    static REUSED: AtomicUsize = AtomicUsize::new(0);
    model(None, || {
        let device = CpuDevice::with_threads(1);
        let program = write_42();
        let mut queue = device.compute_queue().unwrap();
        let scratch = queue.alloca(64).unwrap();
        let at = address(&scratch);
        queue
            .exec(&program, &[&scratch], &[], ExecParams::new_1d(1, 1))
            .dealloca(&scratch)
            .submit()
            .unwrap();
        drop(scratch);
        let successor = device.alloc_uninit(64).unwrap();
        if address(&successor) == at {
            REUSED.fetch_add(1, Ordering::Relaxed);
        }
        successor.write_at(0, &[7u32]).unwrap();
        queue.synchronize().unwrap();
        assert_eq!(successor.to_vec::<u32>().unwrap()[0], 7);
        assert_eq!(device.memory_stats().live_allocations, 1);
    });
    assert!(
        REUSED.load(Ordering::Relaxed) > 0,
        "no interleaving reused the range"
    );
}

/// Queue B records a kernel on an `alloca` buffer, then queue A records
/// and submits its `dealloca`, and the host drops its handle and allocates
/// the same size at once. Whatever the interleaving of the two workers and
/// the host, the range is handed out again only once B's batch was let go
/// (so B's signal after the kernel was reached), and B's kernel never
/// writes into the successor (issue 34: the cross-queue rule lives in the
/// core, not in the CPU buffer's lock).
#[test]
fn another_queue_s_earlier_kernel_holds_the_range_past_a_dealloca() {
    static REUSED: AtomicUsize = AtomicUsize::new(0);
    model(Some(2), || {
        let device = CpuDevice::with_threads(1);
        let program = write_42();
        let mut a = device.compute_queue().unwrap();
        let mut b = device.compute_queue().unwrap();
        let x = a.alloca(64).unwrap();
        let at = address(&x);
        let done = device.new_signal(0).unwrap();
        b.exec(&program, &[&x], &[], ExecParams::new_1d(1, 1))
            .signal(&done, 1)
            .submit()
            .unwrap();
        a.dealloca(&x).submit().unwrap();
        drop(x);
        let successor = device.alloc_uninit(64).unwrap();
        if address(&successor) == at {
            REUSED.fetch_add(1, Ordering::Relaxed);
            assert!(
                done.is_reached(1),
                "the range was handed out before the other queue's kernel was done"
            );
        }
        successor.write_at(0, &[7u32]).unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        assert_eq!(successor.to_vec::<u32>().unwrap()[0], 7);
    });
    assert!(
        REUSED.load(Ordering::Relaxed) > 0,
        "no interleaving reused the range"
    );
}
