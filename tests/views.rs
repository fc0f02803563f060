//! Views: sub-ranges of buffers as `exec` arguments, copy ends and fill
//! targets, on the CPU backend and on the mock backend of `tests/common`;
//! and every bad view an error that says how to fix it, with nothing of
//! its batch run.

#![cfg(not(loom))]

mod common;

use common::mock::*;
use common::{LONG, fill_program};
use hwqueue::cpu::{Cpu, CpuDevice};
use hwqueue::{
    AnyQueue, Backend, Buffer, BufferOf, Device, DeviceOf, Error, ExecParams, HardwareQueue,
    QueueFactory, QueueOf, SignalOf, TimelineSignal, View,
};

/// A buffer of `n` u32s holding `0, 1, 2, ...`.
fn counting<B: Backend>(device: &DeviceOf<B>, n: u32) -> BufferOf<B> {
    let buffer = device.alloc(n as usize * 4).unwrap();
    buffer.write_from(&(0..n).collect::<Vec<u32>>()).unwrap();
    buffer
}

/// Runs what `record` records on a fresh queue, then waits for it.
fn run<B: Backend>(device: &DeviceOf<B>, record: impl FnOnce(&mut QueueOf<B>)) {
    let mut queue = device.compute_queue().unwrap();
    record(&mut queue);
    queue.submit().unwrap();
    queue.synchronize().unwrap();
}

/// Partial copies between two buffers and within one buffer (disjoint
/// ranges), and a whole buffer into a view of a larger one.
fn partial_copies<B: Backend>(device: &DeviceOf<B>) {
    let a = counting::<B>(device, 16);
    let b = device.alloc(64).unwrap();
    let small = counting::<B>(device, 2);
    run::<B>(device, |q| {
        // a[4..8] -> b[8..12]; a[0..2] -> a[12..14]; small -> b[0..2].
        q.copy(&b.view(32, 16).unwrap(), &a.view(16, 16).unwrap())
            .copy(&a.view(48, 8).unwrap(), &a.view(0, 8).unwrap())
            .copy(&b.view(0, 8).unwrap(), &small);
    });
    let got = b.to_vec::<u32>().unwrap();
    assert_eq!(&got[8..12], &[4, 5, 6, 7]);
    assert_eq!(&got[0..2], &[0, 1]);
    assert!(
        got[2..8].iter().chain(&got[12..]).all(|&x| x == 0),
        "{got:?}"
    );
    let a = a.to_vec::<u32>().unwrap();
    assert_eq!(&a[12..14], &[0, 1], "{a:?}");
    assert_eq!(&a[..12], &(0..12).collect::<Vec<u32>>()[..]);
}

/// Fills of each width, on views at offsets, leave the rest alone.
fn fills<B: Backend>(device: &DeviceOf<B>) {
    let buffer = counting::<B>(device, 8);
    run::<B>(device, |q| {
        q.fill(&buffer.view(4, 4).unwrap(), 0xABu8)
            .fill(&buffer.view(8, 8).unwrap(), 0x1234u16)
            .fill(&buffer.view(20, 8).unwrap(), 7.5f32);
    });
    let got = buffer.to_vec::<u32>().unwrap();
    assert_eq!(got[0], 0);
    assert_eq!(got[1], u32::from_ne_bytes([0xAB; 4]));
    let half = 0x1234u16.to_ne_bytes();
    assert_eq!(
        got[2],
        u32::from_ne_bytes([half[0], half[1], half[0], half[1]])
    );
    assert_eq!(
        got[3],
        u32::from_ne_bytes(half.repeat(2).try_into().unwrap())
    );
    assert_eq!(got[4], 4);
    assert_eq!(&got[5..7], &[7.5f32.to_bits(); 2]);
    assert_eq!(got[7], 7);
    // A whole buffer takes a fill too.
    run::<B>(device, |q| {
        q.fill(&buffer, 0u32);
    });
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![0; 8]);
}

/// Host reads and writes through views touch only the view's bytes.
fn host_access<B: Backend>(device: &DeviceOf<B>) {
    let buffer = counting::<B>(device, 8);
    let view = buffer.view(8, 16).unwrap();
    view.write_from(&[70u32, 71]).unwrap();
    assert_eq!(view.to_vec::<u32>().unwrap(), vec![70, 71, 4, 5]);
    let inner = view.view(4, 8).unwrap();
    assert_eq!((inner.offset(), inner.len()), (12, 8));
    assert_eq!(inner.to_vec::<u32>().unwrap(), vec![71, 4]);
    match view.write_from(&[0u32; 5]) {
        Err(Error::HostAccessOutOfBounds {
            len: 20, size: 16, ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        buffer.to_vec::<u32>().unwrap(),
        vec![0, 1, 70, 71, 4, 5, 6, 7]
    );
}

#[test]
fn partial_copies_on_the_cpu() {
    partial_copies::<Cpu>(&CpuDevice::new());
}

#[test]
fn partial_copies_on_the_mock_backend() {
    partial_copies::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn fills_on_the_cpu() {
    fills::<Cpu>(&CpuDevice::new());
}

#[test]
fn fills_on_the_mock_backend() {
    fills::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn host_access_through_views_on_the_cpu() {
    host_access::<Cpu>(&CpuDevice::new());
}

#[test]
fn host_access_through_views_on_the_mock_backend() {
    host_access::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn an_exec_on_views_sees_only_its_range_and_two_kernels_share_one_arena() {
    let device = CpuDevice::new();
    // One arena, two tensors of 16 u32s at bytes 64 and 192, guards around.
    let arena = device.alloc(320).unwrap();
    arena.write_from(&vec![9u32; 80]).unwrap();
    let (x, y) = (arena.view(64, 64).unwrap(), arena.view(192, 64).unwrap());
    let fill = fill_program();
    run::<Cpu>(&device, |q| {
        q.exec_views(&fill, &[&x], &[1u32.into()], ExecParams::new_1d(16, 4))
            .exec_views(&fill, &[&y], &[2u32.into()], ExecParams::new_1d(16, 8));
    });
    let got = arena.to_vec::<u32>().unwrap();
    assert!(got[..16].iter().all(|&v| v == 9), "{got:?}");
    assert!(got[16..32].iter().all(|&v| v == 1), "{got:?}");
    assert!(got[32..48].iter().all(|&v| v == 9), "{got:?}");
    assert!(got[48..64].iter().all(|&v| v == 2), "{got:?}");
    assert!(got[64..].iter().all(|&v| v == 9), "{got:?}");
}

#[test]
fn a_kernel_reading_past_its_view_fails_the_batch_instead_of_touching_the_neighbour() {
    let device = CpuDevice::new();
    let arena = device.alloc(128).unwrap();
    let view = arena.view(0, 16).unwrap(); // 4 u32s
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec_views(
            &fill_program(),
            &[&view],
            &[5u32.into()],
            ExecParams::new_1d(8, 8),
        )
        .signal(&done, 1)
        .submit()
        .unwrap();
    assert!(matches!(
        done.wait(1, LONG),
        Err(Error::SignalFailed { .. })
    ));
    assert!(matches!(
        queue.synchronize(),
        Err(Error::QueueFailed { .. })
    ));
    assert_eq!(arena.to_vec::<u32>().unwrap(), vec![0; 32]);
}

#[test]
fn the_mock_kernel_gets_the_views() {
    fn kernel(views: &[View<Mock>]) {
        for view in views {
            view.buffer().0.lock().unwrap()[view.range()].fill(0xEE);
        }
    }
    let device = Mock::open(0).unwrap();
    let buffer = device.alloc(64).unwrap();
    let program = MockProgram::new("mark", 2, kernel);
    let (a, b) = (buffer.view(16, 16).unwrap(), buffer.view(48, 16).unwrap());
    run::<Mock>(&device, |q| {
        q.exec_views(&program, &[&a, &b], &[], ExecParams::new_1d(1, 1));
    });
    let got = buffer.to_vec::<u8>().unwrap();
    assert!(got[16..32].iter().chain(&got[48..]).all(|&x| x == 0xEE));
    assert!(got[..16].iter().chain(&got[32..48]).all(|&x| x == 0));
}

// ---- Bad input: a clear error, nothing of the batch runs, nothing hangs.

/// Records a fill of `marker` and a signal, then `bad`, submits, and checks
/// that the batch was rejected with an error `check` accepts, that the
/// marker buffer was not touched and the signal failed.
fn rejected<B: Backend>(
    device: &DeviceOf<B>,
    bad: impl FnOnce(&mut QueueOf<B>),
    check: impl FnOnce(&Error) -> bool,
) {
    let marker = device.alloc(16).unwrap();
    let done: SignalOf<B> = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.fill(&marker, 0xFFu8).signal(&done, 1);
    bad(&mut queue);
    match queue.submit() {
        Err(Error::BatchRejected { cause }) => assert!(check(&cause), "{cause}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    queue.synchronize().unwrap();
    assert!(matches!(
        done.wait(1, LONG),
        Err(Error::SignalFailed { .. })
    ));
    assert_eq!(marker.to_vec::<u8>().unwrap(), vec![0; 16], "nothing ran");
}

#[test]
fn a_view_out_of_range_is_an_error_naming_the_range_and_the_size() {
    let device = CpuDevice::new();
    let buffer = device.alloc(64).unwrap();
    for (offset, len) in [(60, 8), (65, 0), (usize::MAX, 2)] {
        let error = buffer.view(offset, len).unwrap_err();
        assert!(
            matches!(error, Error::ViewOutOfRange { size: 64, .. }),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&offset.to_string()) && text.contains("64 bytes"),
            "{text}"
        );
    }
    let view = buffer.view(32, 16).unwrap();
    let error = view.view(8, 16).unwrap_err();
    assert!(
        matches!(
            error,
            Error::ViewOutOfRange {
                offset: 8,
                len: 16,
                size: 16
            }
        ),
        "{error:?}"
    );
    // The mock backend's buffers check the same way.
    let mock = Mock::open(0).unwrap().alloc(8).unwrap();
    assert!(mock.view(4, 8).is_err());
}

#[test]
fn a_misaligned_exec_view_rejects_the_batch() {
    let device = CpuDevice::new();
    let buffer = device.alloc(64).unwrap();
    let view = buffer.view(4, 32).unwrap();
    rejected::<Cpu>(
        &device,
        |q| {
            q.exec_views(
                &fill_program(),
                &[&view],
                &[1u32.into()],
                ExecParams::new_1d(8, 8),
            );
        },
        |e| {
            matches!(
                e,
                Error::ViewMisaligned {
                    offset: 4,
                    alignment: 16,
                    ..
                }
            ) && e.to_string().contains("buffer 0 of exec `fill`")
        },
    );
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![0; 16]);
}

#[test]
fn an_exec_on_the_last_execs_views_skips_no_check_a_new_view_needs() {
    // An `exec` on the same views as the one before shares its checked
    // range; one on a view at another offset of the same buffer is
    // checked again.
    let device = CpuDevice::new();
    let buffer = device.alloc(64).unwrap();
    let (aligned, misaligned) = (buffer.view(16, 32).unwrap(), buffer.view(20, 32).unwrap());
    let (program, params) = (fill_program(), ExecParams::new_1d(8, 8));
    rejected::<Cpu>(
        &device,
        |q| {
            q.exec_views(&program, &[&aligned], &[1u32.into()], params)
                .exec_views(&program, &[&aligned], &[1u32.into()], params)
                .exec_views(&program, &[&misaligned], &[1u32.into()], params);
        },
        |e| {
            matches!(
                e,
                Error::ViewMisaligned {
                    offset: 20,
                    alignment: 16,
                    ..
                }
            )
        },
    );
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![0; 16]);
}

fn overlapping_copy<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(64).unwrap();
    let (a, b) = (buffer.view(0, 32).unwrap(), buffer.view(16, 32).unwrap());
    rejected::<B>(
        device,
        |q| {
            q.copy(&a, &b);
        },
        |e| matches!(e, Error::CopyOverlap { size: 64, .. }) && e.to_string().contains("16..48"),
    );
    rejected::<B>(
        device,
        |q| {
            q.copy(&buffer, &buffer);
        },
        |e| matches!(e, Error::CopyOverlap { .. }),
    );
    rejected::<B>(
        device,
        |q| {
            q.copy(&a, &buffer);
        },
        |e| matches!(e, Error::CopySizeMismatch { dst: 32, src: 64 }),
    );
}

#[test]
fn an_overlapping_copy_rejects_the_batch_on_the_cpu() {
    overlapping_copy::<Cpu>(&CpuDevice::new());
}

#[test]
fn an_overlapping_copy_rejects_the_batch_on_the_mock_backend() {
    overlapping_copy::<Mock>(&Mock::open(0).unwrap());
}

fn bad_fills<B: Backend>(device: &DeviceOf<B>) {
    let buffer = device.alloc(64).unwrap();
    rejected::<B>(
        device,
        |q| {
            q.fill(&buffer, 1u64);
        },
        |e| matches!(e, Error::InvalidFill { .. }) && e.to_string().contains("8 bytes"),
    );
    let odd = buffer.view(2, 8).unwrap();
    rejected::<B>(
        device,
        |q| {
            q.fill(&odd, 1u32);
        },
        |e| {
            matches!(e, Error::InvalidFill { offset: 2, .. }) && e.to_string().contains("multiples")
        },
    );
    let short = buffer.view(0, 6).unwrap();
    rejected::<B>(
        device,
        |q| {
            q.fill(&short, 1u32);
        },
        |e| matches!(e, Error::InvalidFill { len: 6, .. }),
    );
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![0; 64]);
}

#[test]
fn a_bad_fill_rejects_the_batch_on_the_cpu() {
    bad_fills::<Cpu>(&CpuDevice::new());
}

#[test]
fn a_bad_fill_rejects_the_batch_on_the_mock_backend() {
    bad_fills::<Mock>(&Mock::open(0).unwrap());
}

#[test]
fn a_view_of_another_backends_buffer_rejects_the_batch() {
    let (cpu, mock) = (
        MixedDevice::from(CpuDevice::new()),
        MixedDevice::from(Mock::open(0).unwrap()),
    );
    let foreign = mock.alloc(64).unwrap();
    let foreign_view = foreign.view(16, 16).unwrap();
    let own = cpu.alloc(64).unwrap();
    let marker = cpu.alloc(16).unwrap();
    let done = cpu.new_signal(0).unwrap();
    let program = MixedProgram::from(fill_program());
    type Record<'a> = Box<dyn Fn(&mut MixedQueue) + 'a>;
    let cases: Vec<Record<'_>> = vec![
        Box::new(|q| {
            q.copy(&own.view(0, 16).unwrap(), &foreign_view);
        }),
        Box::new(|q| {
            q.fill(&foreign_view, 0u8);
        }),
        Box::new(|q| {
            q.upload(&foreign_view, &[0u32; 4]);
        }),
        Box::new(|q| {
            q.exec_views(
                &program,
                &[&foreign_view],
                &[1u32.into()],
                ExecParams::new_1d(4, 4),
            );
        }),
    ];
    for (index, bad) in cases.iter().enumerate() {
        let mut queue = cpu.compute_queue().unwrap();
        queue.fill(&marker, 0xFFu8).signal(&done, index as u64 + 1);
        bad(&mut queue);
        match queue.submit() {
            Err(Error::BatchRejected { cause }) => assert!(
                matches!(
                    &*cause,
                    Error::BackendMismatch {
                        queue: "cpu",
                        resource: "mock",
                        ..
                    }
                ),
                "case {index}: {cause}"
            ),
            other => panic!("case {index}: {other:?}"),
        }
        queue.synchronize().unwrap();
        assert!(done.wait(index as u64 + 1, LONG).is_err());
    }
    assert_eq!(marker.to_vec::<u8>().unwrap(), vec![0; 16]);
    assert_eq!(foreign.to_vec::<u8>().unwrap(), vec![0; 64]);
    // A download from a foreign view fails the download with the reason.
    let download = hwqueue::Download::<u32>::new(4);
    let mut queue = cpu.compute_queue().unwrap();
    queue.download(&foreign_view, &download);
    assert!(queue.submit().is_err());
    assert!(matches!(
        download.take(LONG),
        Err(Error::BackendMismatch {
            resource: "mock",
            ..
        })
    ));
}

#[test]
fn the_crates_any_queue_runs_views_on_the_cpu() {
    let device = hwqueue::AnyDevice::from(CpuDevice::new());
    let buffer = device.alloc(64).unwrap();
    let mut queue: AnyQueue = device.compute_queue().unwrap();
    let program = hwqueue::AnyProgram::from(fill_program());
    queue
        .exec_views(
            &program,
            &[&buffer.view(16, 16).unwrap()],
            &[3u32.into()],
            ExecParams::new_1d(4, 4),
        )
        .copy(&buffer.view(48, 16).unwrap(), &buffer.view(16, 16).unwrap())
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert_eq!(
        buffer.to_vec::<u32>().unwrap(),
        [[0; 4], [3; 4], [0; 4], [3; 4]].concat()
    );
}

/// `buffer i [0] = i` for each buffer argument.
fn number_views(_: &hwqueue::cpu::WorkGroup, args: &hwqueue::cpu::KernelArgs<'_>) {
    for i in 0..args.buffer_count() {
        // SAFETY: one work-group; the views are disjoint.
        unsafe { args.buffer(i).slice_mut::<u32>(0..1)[0] = i as u32 };
    }
}

#[test]
fn the_any_enums_pass_views_on_the_stack_and_past_it_and_name_a_foreign_one() {
    let cpu = MixedDevice::from(CpuDevice::new());
    let mock = MixedDevice::from(Mock::open(4).unwrap());
    for count in [3usize, 16, 17, 20] {
        let arena = cpu.alloc(count * 16).unwrap();
        let views: Vec<_> = (0..count)
            .map(|i| arena.view(i * 16, 16).unwrap())
            .collect();
        let program = MixedProgram::from(hwqueue::cpu::CpuProgram::from_fn(
            "number_views",
            count,
            0,
            number_views,
        ));
        let mut queue = cpu.compute_queue().unwrap();
        let refs: Vec<_> = views.iter().collect();
        queue
            .exec_views(&program, &refs, &[], ExecParams::new_1d(1, 1))
            .submit()
            .unwrap();
        queue.synchronize().unwrap();
        let got = arena.to_vec::<u32>().unwrap();
        let firsts: Vec<u32> = got.chunks(4).map(|c| c[0]).collect();
        assert_eq!(
            firsts,
            (0..count as u32).collect::<Vec<_>>(),
            "{count} views"
        );

        // The last view of another backend: rejected, naming it.
        let foreign = mock.alloc(16).unwrap();
        let foreign_view = foreign.view(0, 16).unwrap();
        let mut refs = refs;
        refs[count - 1] = &foreign_view;
        queue.exec_views(&program, &refs, &[], ExecParams::new_1d(1, 1));
        match queue.submit() {
            Err(Error::BatchRejected { cause }) => {
                let message = cause.to_string();
                assert!(
                    message.contains(&format!("buffer {} of exec", count - 1)),
                    "{message}"
                );
            }
            other => panic!("{count} views: {other:?}"),
        }
    }
}

#[test]
fn an_empty_view_overlaps_nothing_as_documented() {
    let buffer = CpuDevice::new().alloc(64).unwrap();
    let (empty, around) = (buffer.view(5, 0).unwrap(), buffer.view(0, 10).unwrap());
    assert!(!empty.overlaps(&around) && !around.overlaps(&empty));
    assert!(!empty.overlaps(&empty));
    // Non-empty ranges still overlap where they share a byte.
    assert!(around.overlaps(&buffer.view(9, 4).unwrap()));
    assert!(!around.overlaps(&buffer.view(10, 4).unwrap()));
}
