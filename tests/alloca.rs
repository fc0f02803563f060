//! The lifecycle of a buffer made by `alloca` (`hwqueue::memory::QueueOrdered`)
//! on the CPU, and empty buffers wherever a buffer may go: a `dealloca`
//! whose batch does not run leaves the buffer live; distinct identities
//! for empty buffers, so commands on them never deadlock.

mod common;

use common::{LONG, explode_program, fill_program, no_hang};
use hwqueue::cpu::{CpuBuffer, CpuDevice, CpuQueue};
use hwqueue::memory::Phase;
use hwqueue::{
    Buffer, Device, Download, Error, ExecParams, HardwareQueue, QueueFactory, TimelineSignal,
};

fn phase(buffer: &CpuBuffer) -> Phase {
    buffer.queue_ordered().unwrap().phase()
}

/// Copies between two empty buffers, each way on its own queue, 500 per
/// batch, submitted together. Every empty buffer had one address, and
/// copies locked their two buffers in address order: the two queues took
/// the locks in opposite orders and deadlocked (hung on 2ef88cc; issue 34,
/// defect 1). Locks are now taken in the order of the allocations' ids.
#[test]
fn copies_between_empty_buffers_both_ways_on_two_queues_do_not_deadlock() {
    no_hang("copies between empty buffers", || {
        let device = CpuDevice::new();
        let (e1, e2) = (device.alloc(0).unwrap(), device.alloc(0).unwrap());
        assert!(!e1.same_as(&e2));
        let mut compute = device.compute_queue().unwrap();
        let mut copy = device
            .copy_queue()
            .unwrap()
            .expect("the CPU has a copy queue");
        // Under Miri, a few rounds: enough to interleave, within the guard.
        let (rounds, copies) = if cfg!(miri) { (2, 20) } else { (20, 500) };
        for round in 0..rounds {
            for _ in 0..copies {
                compute.copy(&e1, &e2);
                copy.copy(&e2, &e1);
            }
            compute.submit().unwrap();
            copy.submit().unwrap();
            if round % 5 == 4 || cfg!(miri) {
                compute.synchronize().unwrap();
                copy.synchronize().unwrap();
            }
        }
        compute.synchronize().unwrap();
        copy.synchronize().unwrap();
    });
}

/// Zero-byte buffers wherever a buffer may go: copies both ways on two
/// queues, `exec` (two distinct empty buffers beside a real one: each is
/// locked once), views, fills, transfers, `alloca`/`dealloca` of 0 bytes.
#[test]
fn zero_byte_buffers_go_everywhere_a_buffer_may() {
    no_hang("zero-byte buffers", || {
        let device = CpuDevice::new();
        let mut a = device.compute_queue().unwrap();
        let mut b = device.copy_queue().unwrap().unwrap();
        let (e1, e2) = (device.alloc(0).unwrap(), device.alloc_uninit(0).unwrap());
        let scratch = a.alloca(0).unwrap();
        let real = device.alloc(16).unwrap();
        let (v1, v2) = (e1.view(0, 0).unwrap(), real.view(16, 0).unwrap());
        let download = Download::<u8>::new(0);
        let program = hwqueue::cpu::CpuProgram::from_fn("three", 3, 0, |_, _| {});
        a.exec(&program, &[&e1, &e2, &real], &[], ExecParams::new_1d(4, 2))
            .exec(
                &program,
                &[&scratch, &e1, &scratch],
                &[],
                ExecParams::new_1d(1, 1),
            )
            .copy(&e1, &scratch)
            .copy(&v2, &v1)
            .fill(&e2, 0u32)
            .upload(&scratch, &[0u8; 0])
            .download(&v1, &download);
        b.copy(&scratch, &e1).copy(&e2, &e1).copy(&v1, &v2);
        a.submit().unwrap();
        b.submit().unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        assert_eq!(download.take(LONG).unwrap(), Vec::<u8>::new());
        a.dealloca(&scratch).submit().unwrap();
        a.synchronize().unwrap();
        assert_eq!(phase(&scratch), Phase::Returned);
        assert_eq!(device.memory_stats().live_allocations, 1, "only `real`");
    });
}

/// A `dealloca` whose batch was discarded never ran: the buffer is live
/// again, every queue takes work on it, and a new `dealloca` may be
/// recorded. On 2ef88cc every queue refused the buffer as "deallocated",
/// a second `dealloca` was "recorded already", and its memory stayed in use
/// until the last handle went (issue 34, defect 4).
#[test]
fn a_discarded_dealloca_leaves_the_buffer_live() {
    let device = CpuDevice::new();
    let (mut a, mut b) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let x = a.alloca(256).unwrap();
    a.dealloca(&x);
    assert_eq!(phase(&x), Phase::DeallocaRecorded);
    a.discard();
    assert_eq!(phase(&x), Phase::Live);
    assert_eq!(device.memory_stats().in_use, 256);
    // Work on another queue, and host access.
    let done = device.new_signal(0).unwrap();
    b.fill(&x, 7u8).signal(&done, 1).submit().unwrap();
    done.wait(1, LONG).unwrap();
    assert_eq!(x.to_vec::<u8>().unwrap(), vec![7; 256]);
    // A new dealloca, which runs.
    a.dealloca(&x).submit().unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(phase(&x), Phase::Returned);
    assert_eq!(device.memory_stats().in_use, 0);
}

/// A rejected batch's `dealloca`, and one stopped by an earlier command's
/// failure, never ran either.
#[test]
fn a_dealloca_of_a_rejected_or_failed_batch_leaves_the_buffer_live() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let x = queue.alloca(256).unwrap();
    let plain = device.alloc(64).unwrap();
    // Rejected: the batch also deallocates a buffer `alloca` did not make.
    queue.dealloca(&x).dealloca(&plain);
    let error = queue.submit().unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::InvalidDealloca { .. }),
        "{error}"
    );
    assert_eq!(phase(&x), Phase::Live);
    // Failed before it: the kernel ahead of the `dealloca` fails.
    let done = device.new_signal(0).unwrap();
    queue
        .fill(&x, 1u8)
        .exec(&explode_program(), &[], &[], ExecParams::new_1d(2, 1))
        .dealloca(&x)
        .signal(&done, 1)
        .submit()
        .unwrap();
    let error = done.wait(1, LONG).unwrap_err();
    assert!(error.to_string().contains("explode"), "{error}");
    assert!(queue.synchronize().is_err());
    assert_eq!(phase(&x), Phase::Live);
    assert_eq!(x.to_vec::<u8>().unwrap(), vec![1; 256], "the fill ran");
    // Live: deallocated for real now.
    queue.dealloca(&x).submit().unwrap();
    queue.synchronize().unwrap();
    assert_eq!(phase(&x), Phase::Returned);
    assert_eq!(device.memory_stats().in_use, 64);
}

/// A second `dealloca` while the first is recorded is refused, saying
/// where the first is and that it may still not run.
#[test]
fn a_second_dealloca_says_where_the_first_is() {
    let device = CpuDevice::new();
    let (mut a, mut b) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let x = a.alloca(64).unwrap();
    a.dealloca(&x);
    let error = b.dealloca(&x).submit().unwrap_err();
    let text = error.to_string();
    assert!(text.contains(&format!("{}", a.id())), "{text}");
    assert!(text.contains("live again"), "{text}");
    a.submit().unwrap();
    a.synchronize().unwrap();
    let error = b.dealloca(&x).submit().unwrap_err();
    assert!(error.to_string().contains("deallocated already"), "{error}");
}

/// The cross-queue rule, gated deterministically: queue B's kernel on
/// `x`, recorded before A's `dealloca`, is held on a signal while A's
/// `dealloca` runs. The range must not be handed out until B's batch is
/// done, and B's kernel must see `x`'s bytes.
#[test]
fn a_range_is_not_handed_out_while_another_queue_s_earlier_batch_uses_it() {
    let device = CpuDevice::new();
    let (mut a, mut b) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let (gate, done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let x = a.alloca(4096).unwrap();
    let x_at = x.as_ptr() as usize;
    a.fill(&x, 5u8);
    let out = device.alloc(4096).unwrap();
    b.wait(&gate, 1).copy(&out, &x).signal(&done, 1);
    a.dealloca(&x).submit().unwrap();
    a.synchronize().unwrap();
    b.submit().unwrap();
    assert_eq!(phase(&x), Phase::Ran);
    assert_eq!(x.queue_ordered().unwrap().uses(), 1);
    // Everything allocated now lands elsewhere.
    let others: Vec<CpuBuffer> = (0..4).map(|_| device.alloc_uninit(4096).unwrap()).collect();
    assert!(others.iter().all(|o| o.as_ptr() as usize != x_at));
    let mut c: CpuQueue = device.compute_queue().unwrap();
    let y = c.alloca(4096).unwrap();
    assert_ne!(y.as_ptr() as usize, x_at);
    gate.set(1);
    done.wait(1, LONG).unwrap();
    b.synchronize().unwrap();
    assert_eq!(out.to_vec::<u8>().unwrap(), vec![5; 4096]);
    assert_eq!(phase(&x), Phase::Returned);
    let z = c.alloca(4096).unwrap();
    assert_eq!(z.as_ptr() as usize, x_at, "returned once B was done");
    drop((others, y, z, fill_program()));
}

/// `Buffer::give_back` is the queue core's, but public: called on a buffer
/// that a batch still uses (a fill behind a gate), it must not hand the
/// range to the next allocation. On fbc0795 the next `alloc` got the same
/// address while the fill was pending (review helper-53).
#[test]
fn give_back_outside_the_lifecycle_returns_nothing() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let gate = device.new_signal(0).unwrap();
    let plain = device.alloc(4096).unwrap();
    let ordered = queue.alloca(4096).unwrap();
    queue
        .wait(&gate, 1)
        .fill(&plain, 7u8)
        .fill(&ordered, 9u8)
        .submit()
        .unwrap();
    plain.give_back();
    ordered.give_back();
    let taken: Vec<_> = (0..4).map(|_| device.alloc(4096).unwrap()).collect();
    for buffer in &taken {
        assert_ne!(buffer.as_ptr(), plain.as_ptr(), "the plain buffer's range");
        assert_ne!(buffer.as_ptr(), ordered.as_ptr(), "the live alloca's range");
    }
    gate.set(1);
    queue.synchronize().unwrap();
    assert_eq!(plain.to_vec::<u8>().unwrap(), [7u8; 4096]);
    assert_eq!(phase(&ordered), Phase::Live);
    assert_eq!(ordered.to_vec::<u8>().unwrap(), [9u8; 4096]);
}
