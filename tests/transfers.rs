//! Host transfers in queue order: uploads taken at record time, downloads
//! the host gets once the batch ran, on the CPU backend and on the mock
//! backend of `tests/common`; a download that will never arrive fails with
//! the reason instead of hanging.

#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::mock::*;
use common::{LONG, increment_program};
use hwqueue::cpu::{Cpu, CpuDevice};
use hwqueue::{
    Backend, Buffer, Device, DeviceOf, Download, Error, ExecParams, HardwareQueue, Pod,
    QueueFactory, SignalOf, TimelineSignal, Zeroable,
};

/// Upload, then download, both behind a wait on a host signal: nothing
/// moves until the host opens the gate, then both land in queue order.
fn ordered_round_trip<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(64).unwrap();
    buffer.write_from(&[1u32; 16]).unwrap();
    let gate: SignalOf<B> = device.new_signal(0).unwrap();
    let done: SignalOf<B> = device.new_signal(0).unwrap();
    let before = Download::<u32>::new(16);
    let after = Download::<u32>::new(4);
    let mut data: Vec<u32> = (100..104).collect();
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait(&gate, 1)
        .download(&buffer, &before)
        .upload(&buffer.view(16, 16).unwrap(), &data)
        .download(&buffer.view(16, 16).unwrap(), &after)
        .signal(&done, 1)
        .submit()
        .unwrap();
    // The data was taken when it was recorded: the caller's memory is free.
    data.fill(0);
    // The queue stands at the gate: nothing has moved, even after a wait.
    assert!(matches!(
        after.wait(Duration::from_millis(1)),
        Err(Error::DownloadIncomplete { .. })
    ));
    assert!(!before.is_ready() && !after.is_ready());
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![1; 16]);
    gate.set(1);
    assert_eq!(before.take(LONG).unwrap(), vec![1; 16]);
    done.wait(1, LONG).unwrap();
    // The signal after the download tells it is ready.
    assert!(after.is_ready());
    assert_eq!(
        after.take(Duration::ZERO).unwrap(),
        vec![100, 101, 102, 103]
    );
    queue.synchronize().unwrap();
    let mut expected = vec![1u32; 16];
    expected[4..8].copy_from_slice(&[100, 101, 102, 103]);
    assert_eq!(buffer.to_vec::<u32>().unwrap(), expected);
}

#[test]
fn an_upload_and_a_download_run_in_queue_order_on_the_cpu() {
    ordered_round_trip::<Cpu>(&CpuDevice::new());
}

#[test]
fn an_upload_and_a_download_run_in_queue_order_on_the_mock_backend() {
    ordered_round_trip::<Mock>(&Mock::open(0).unwrap());
}

/// `upload_vec` hands the vector over; `Download::from_vec` reuses memory.
fn owned_transfers<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(4096).unwrap();
    let data: Vec<u16> = (0..2048).collect();
    let download = Download::from_vec(vec![0u16; 2048]);
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload_vec(&buffer, data)
        .download(&buffer, &download)
        .submit()
        .unwrap();
    assert_eq!(
        download.take(LONG).unwrap(),
        (0..2048).collect::<Vec<u16>>()
    );
    // Taken once: a second take says so.
    assert!(matches!(
        download.take(Duration::ZERO),
        Err(Error::DownloadIncomplete { .. })
    ));
    queue.synchronize().unwrap();
}

#[test]
fn owned_transfers_on_the_cpu() {
    owned_transfers::<Cpu>(&CpuDevice::new());
}

#[test]
fn owned_transfers_on_the_mock_backend() {
    owned_transfers::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn a_kernel_between_an_upload_and_a_download_sees_the_upload() {
    let device = CpuDevice::new();
    let (a, b) = (device.alloc(16).unwrap(), device.alloc(16).unwrap());
    let out = Download::<u32>::new(1);
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&a.view(0, 4).unwrap(), &[41u32])
        .exec(
            &increment_program(),
            &[&a, &b],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .download(&b.view(0, 4).unwrap(), &out)
        .submit()
        .unwrap();
    assert_eq!(out.take(LONG).unwrap(), vec![42]);
}

/// A type of the user's own, deriving `Pod` through the re-export.
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[repr(C)]
struct Particle {
    position: [f32; 3],
    id: u32,
}

#[test]
fn a_users_own_pod_type_moves_through_buffers_views_and_transfers() {
    let device = CpuDevice::new();
    let buffer = device.alloc(4 * 16).unwrap();
    let particles: Vec<Particle> = (0..3)
        .map(|i| Particle {
            position: [i as f32, 0.5, -1.0],
            id: i,
        })
        .collect();
    let back = Download::<Particle>::new(3);
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&buffer.view(16, 48).unwrap(), &particles)
        .download(&buffer.view(16, 48).unwrap(), &back)
        .submit()
        .unwrap();
    assert_eq!(back.take(LONG).unwrap(), particles);
    assert_eq!(
        buffer.view(16, 48).unwrap().to_vec::<Particle>().unwrap(),
        particles
    );
}

#[cfg(feature = "half")]
#[test]
fn half_precision_moves_through_transfers() {
    use hwqueue::half::{bf16, f16};
    let device = CpuDevice::new();
    let buffer = device.alloc(16).unwrap();
    let halves = [f16::from_f32(1.5), f16::from_f32(-2.0)];
    let brains = [bf16::from_f32(3.0), bf16::from_f32(0.25)];
    let (h, b) = (Download::<f16>::new(2), Download::<bf16>::new(2));
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&buffer.view(0, 4).unwrap(), &halves)
        .upload(&buffer.view(4, 4).unwrap(), &brains)
        .download(&buffer.view(0, 4).unwrap(), &h)
        .download(&buffer.view(4, 4).unwrap(), &b)
        .submit()
        .unwrap();
    assert_eq!(h.take(LONG).unwrap(), halves);
    assert_eq!(b.take(LONG).unwrap(), brains);
}

#[cfg(feature = "half")]
#[test]
fn a_kernel_reads_half_precision_scalars() {
    use hwqueue::cpu::{CpuProgram, KernelArgs, WorkGroup};
    use hwqueue::half::{bf16, f16};
    fn scale(_: &WorkGroup, args: &KernelArgs<'_>) {
        let (h, b): (f16, bf16) = (args.scalar(0), args.scalar(1));
        // SAFETY: one work-group.
        let out = unsafe { args.buffer(0).slice_mut::<f32>(0..2) };
        out.copy_from_slice(&[h.to_f32(), b.to_f32()]);
    }
    let device = CpuDevice::new();
    let buffer = device.alloc(8).unwrap();
    let scalars: [hwqueue::Scalar; 2] = [f16::from_f32(0.5).into(), bf16::from_f32(-4.0).into()];
    assert_eq!(scalars[0].type_name(), "f16");
    assert_eq!(scalars[1].to_ne_bytes().1, 2);
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(
            &CpuProgram::from_fn("scale", 1, 2, scale),
            &[&buffer],
            &scalars,
            ExecParams::new_1d(1, 1),
        )
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert_eq!(buffer.to_vec::<f32>().unwrap(), vec![0.5, -4.0]);
}

// ---- Bad input and failure: a clear error, nothing hangs.

fn wrong_sizes<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(16).unwrap();
    let marker = device.alloc(4).unwrap();
    let download = Download::<u32>::new(3);
    let mut queue = device.compute_queue().unwrap();
    queue.fill(&marker, 0xFFu8).download(&buffer, &download);
    match queue.submit() {
        Err(Error::BatchRejected { cause }) => assert!(
            matches!(
                &*cause,
                Error::TransferSizeMismatch {
                    what: "download",
                    host: 12,
                    device: 16
                }
            ),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    // The download learns why, at once.
    match download.take(LONG) {
        Err(Error::BatchRejected { cause }) => {
            assert!(matches!(&*cause, Error::TransferSizeMismatch { .. }))
        }
        other => panic!("{other:?}"),
    }
    queue.upload(&buffer, &[1u8; 15]);
    match queue.submit() {
        Err(Error::BatchRejected { cause }) => assert!(
            matches!(
                &*cause,
                Error::TransferSizeMismatch {
                    what: "upload",
                    host: 15,
                    device: 16
                }
            ),
            "{cause}"
        ),
        other => panic!("{other:?}"),
    }
    queue.synchronize().unwrap();
    assert_eq!(marker.to_vec::<u8>().unwrap(), vec![0; 4], "nothing ran");
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![0; 16], "nothing ran");
}

#[test]
fn a_download_into_the_wrong_size_rejects_the_batch_on_the_cpu() {
    wrong_sizes::<Cpu>(&CpuDevice::new());
}

#[test]
fn a_download_into_the_wrong_size_rejects_the_batch_on_the_mock_backend() {
    wrong_sizes::<Mock>(&Mock::open(0).unwrap());
}

fn failures<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(16).unwrap();
    // Failed before it: the wait's failure.
    let failed: SignalOf<B> = device.new_signal(0).unwrap();
    failed.fail(
        1,
        Error::Abandoned {
            reason: "failed by the test",
        },
    );
    let after_failure = Download::<u8>::new(16);
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait(&failed, 1)
        .download(&buffer, &after_failure)
        .submit()
        .unwrap();
    assert!(matches!(
        after_failure.take(LONG),
        Err(Error::SignalFailed { .. })
    ));
    assert!(queue.synchronize().is_err());
    // Discarded: abandoned.
    let discarded = Download::<u8>::new(16);
    queue.download(&buffer, &discarded).discard();
    assert!(matches!(discarded.take(LONG), Err(Error::Abandoned { .. })));
    // Left recorded when the queue is dropped: abandoned.
    let dropped = Download::<u8>::new(16);
    queue.download(&buffer, &dropped);
    drop(queue);
    assert!(matches!(dropped.take(LONG), Err(Error::Abandoned { .. })));
    // Never recorded: says so at once.
    assert!(matches!(
        Download::<u8>::new(1).wait(LONG),
        Err(Error::DownloadIncomplete { .. })
    ));
    // Recorded twice: the second rejects its batch.
    let once = Download::<u8>::new(16);
    let mut queue = device.compute_queue().unwrap();
    queue.download(&buffer, &once).submit().unwrap();
    queue.download(&buffer, &once);
    assert!(matches!(
        queue.submit(),
        Err(Error::BatchRejected { cause }) if matches!(&*cause, Error::DownloadReused)
    ));
    assert_eq!(once.take(LONG).unwrap(), vec![0; 16]);
}

#[test]
fn a_download_that_will_never_arrive_fails_with_the_reason_on_the_cpu() {
    failures::<Cpu>(&CpuDevice::new());
}

#[test]
fn a_download_that_will_never_arrive_fails_with_the_reason_on_the_mock_backend() {
    failures::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn a_copy_queue_takes_transfers_and_fills() {
    let device = CpuDevice::new();
    let mut queue = device.copy_queue().unwrap().unwrap();
    let buffer = device.alloc(8).unwrap();
    let out = Download::<u32>::new(2);
    queue
        .fill(&buffer, 3u32)
        .upload(&buffer.view(4, 4).unwrap(), &[9u32])
        .download(&buffer, &out)
        .submit()
        .unwrap();
    assert_eq!(out.take(LONG).unwrap(), vec![3, 9]);
}
