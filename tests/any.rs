//! The Any* enums: a user set mixing the CPU with an outside backend, the
//! mixed-backend rules, and the crate's own set.

#![cfg(not(loom))]

mod common;

use std::sync::Mutex;

use common::mock::*;
use common::{LONG, fill_program};
use hwqueue::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{
    AnyBackend, AnyBuffer, AnyDevice, AnyQueue, AnySignal, Backend, Buffer, Device, Error,
    ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout,
};

/// What ran, in order, across both backends (this file's pipeline test only).
static LOG: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

fn cpu_first(_: &WorkGroup, _: &KernelArgs<'_>) {
    LOG.lock().unwrap().push("cpu 1");
}
fn cpu_last(_: &WorkGroup, _: &KernelArgs<'_>) {
    LOG.lock().unwrap().push("cpu 2");
}
fn mock_middle(_: &[hwqueue::View<Mock>]) {
    LOG.lock().unwrap().push("mock");
}

fn mock_device() -> MixedDevice {
    MixedDevice::from(Mock::open(4).unwrap())
}

fn cpu_device() -> MixedDevice {
    MixedDevice::from(CpuDevice::new())
}

#[test]
fn a_vec_of_queues_of_two_backends_runs_an_ordered_pipeline_with_waits_both_ways() {
    let (cpu, mock) = (cpu_device(), mock_device());
    let mut queues: Vec<MixedQueue> =
        vec![cpu.compute_queue().unwrap(), mock.compute_queue().unwrap()];
    assert_eq!(queues[0].backend_id(), "cpu");
    assert_eq!(queues[1].backend_id(), "mock");
    let signals: Vec<MixedSignal> = vec![cpu.new_signal(0).unwrap(), mock.new_signal(0).unwrap()];
    // Each queue produces its own signal (see `TimelineSignal`).
    let head: MixedSignal = cpu.new_signal(0).unwrap();
    let gate = cpu.new_signal(0).unwrap();
    let first = MixedProgram::from(CpuProgram::from_fn("cpu_first", 0, 0, cpu_first));
    let last = MixedProgram::from(CpuProgram::from_fn("cpu_last", 0, 0, cpu_last));
    let middle = MixedProgram::from(MockProgram::new("mock_middle", 0, mock_middle));
    let one = ExecParams::new_1d(1, 1);

    // Submitted in reverse order of execution; only the signals order them.
    queues[0]
        .wait(&signals[1], 1) // CPU waits on the mock signal: cross-backend
        .exec(&last, &[], &[], one)
        .signal(&signals[0], 2)
        .submit()
        .unwrap();
    queues[1]
        .wait(&head, 1) // mock waits on the CPU signal: cross-backend
        .exec(&middle, &[], &[], one)
        .signal(&signals[1], 1)
        .submit()
        .unwrap();
    let mut cpu_head = cpu.compute_queue().unwrap();
    cpu_head
        .wait(&gate, 1) // native
        .exec(&first, &[], &[], one)
        .signal(&head, 1)
        .submit()
        .unwrap();
    assert!(LOG.lock().unwrap().is_empty());
    gate.set(1);
    signals[0].wait(2, LONG).unwrap();
    assert_eq!(*LOG.lock().unwrap(), ["cpu 1", "mock", "cpu 2"]);
    for queue in &mut queues {
        queue.synchronize().unwrap();
    }
}

#[test]
fn a_buffer_of_another_backend_is_rejected_at_submit_naming_both() {
    let (cpu, mock) = (cpu_device(), mock_device());
    let mut queue = cpu.compute_queue().unwrap();
    let cpu_buffer = cpu.alloc(16).unwrap();
    let mock_buffer = mock.alloc(16).unwrap();
    let done = cpu.new_signal(0).unwrap();
    let fill = MixedProgram::from(fill_program());
    let error = queue
        .exec(
            &fill,
            &[&mock_buffer],
            &[1u32.into()],
            ExecParams::new_1d(4, 4),
        )
        .signal(&done, 1)
        .submit()
        .unwrap_err();
    let message = error.to_string();
    assert!(matches!(
        error.root_cause(),
        Error::BackendMismatch {
            queue: "cpu",
            resource: "mock",
            ..
        }
    ));
    assert!(
        message.contains("`mock`") && message.contains("`cpu`"),
        "{message}"
    );
    assert!(message.contains("buffer 0 of exec `fill`"), "{message}");
    // Nothing ran, nobody hangs.
    assert!(matches!(
        done.wait(1, Timeout::Forever),
        Err(Error::SignalFailed { .. })
    ));
    // The same exec with the right buffer runs.
    queue
        .exec(
            &fill,
            &[&cpu_buffer],
            &[3u32.into()],
            ExecParams::new_1d(4, 4),
        )
        .signal(&done, 2)
        .submit()
        .unwrap();
    done.wait(2, LONG).unwrap();
    assert_eq!(cpu_buffer.to_vec::<u32>().unwrap(), vec![3; 4]);
}

/// Records one command on a queue.
type Recorder<'a> = Box<dyn Fn(&mut MixedQueue) + 'a>;

#[test]
fn programs_copies_and_signals_of_another_backend_are_rejected() {
    let (cpu, mock) = (cpu_device(), mock_device());
    let mut queue = cpu.compute_queue().unwrap();
    let (a, b) = (cpu.alloc(8).unwrap(), mock.alloc(8).unwrap());
    let program = MixedProgram::from(MockProgram::new("mock_middle", 0, mock_middle));
    let cases: [(&str, Recorder); 4] = [
        (
            "program `mock_middle`",
            Box::new(|q| {
                q.exec(&program, &[], &[], ExecParams::new_1d(1, 1));
            }),
        ),
        (
            "copy destination",
            Box::new(|q| {
                q.copy(&b, &a);
            }),
        ),
        (
            "copy source",
            Box::new(|q| {
                q.copy(&a, &b);
            }),
        ),
        (
            "the signal of `signal(_, 1)`; signal one of the queue's own backend",
            Box::new(|q| {
                q.signal(&mock.new_signal(0).unwrap(), 1);
            }),
        ),
    ];
    for (what, record) in cases {
        record(&mut queue);
        let error = queue.submit().unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(
                error.root_cause(),
                Error::BackendMismatch {
                    queue: "cpu",
                    resource: "mock",
                    ..
                }
            ),
            "{message}"
        );
        assert!(message.contains(what), "{what}: {message}");
    }
}

/// A settled wait on another backend's signal is a foreign wait that a
/// failure settles (issue 44: a plan over two backends orders each run
/// after the one before with it; it was rejected before). Both ways: a
/// CPU queue on a mock signal, a mock queue on a CPU signal.
#[test]
fn a_settled_wait_on_another_backends_signal_waits_and_a_failure_settles_it() {
    let (cpu, mock) = (cpu_device(), mock_device());
    for (waiter, setter) in [(&cpu, &mock), (&mock, &cpu)] {
        let mut queue = waiter.compute_queue().unwrap();
        let (awaited, done) = (setter.new_signal(0).unwrap(), waiter.new_signal(0).unwrap());
        queue
            .wait_settled(&awaited, 1)
            .signal(&done, 1)
            .wait_settled(&awaited, 2)
            .signal(&done, 2)
            .submit()
            .unwrap();
        assert!(matches!(
            done.wait(1, std::time::Duration::from_millis(50)),
            Err(Error::Timeout { .. })
        ));
        awaited.set(1);
        done.wait(1, LONG).unwrap();
        // A failure of the awaited value passes the wait: the work after it runs.
        awaited.fail(
            2,
            Error::KernelFailed {
                program: "elsewhere".into(),
                message: "failed on its own account".into(),
            },
        );
        done.wait(2, LONG).unwrap();
        queue.synchronize().unwrap();
        // A plain wait on the same failed value fails the batch.
        let failed = waiter.new_signal(0).unwrap();
        queue.wait(&awaited, 2).signal(&failed, 1).submit().unwrap();
        assert!(matches!(
            failed.wait(1, LONG),
            Err(Error::SignalFailed { .. })
        ));
    }
}

#[test]
fn accessors_and_from_round_trip() {
    let cpu = cpu_device();
    assert!(cpu.as_cpu().is_some() && cpu.as_mock().is_none());
    let buffer = cpu.alloc(4).unwrap();
    assert_eq!(buffer.backend_id(), "cpu");
    assert_eq!(buffer.as_cpu().unwrap().size(), 4);
    let mut queue = cpu.compute_queue().unwrap();
    assert!(queue.as_cpu_mut().is_some());
    let signal = MixedSignal::from(hwqueue::cpu::CpuSignal::new(3));
    assert_eq!(signal.value(), 3);
    assert_eq!(format!("{signal:?}"), "MixedSignal::Cpu");
}

#[test]
fn the_crate_set_runs_a_cpu_pipeline() {
    let device = hwqueue::acquire("cpu").unwrap();
    assert_eq!(device.spec().to_string(), "cpu:0");
    let buffer: AnyBuffer = device.alloc(64 * 4).unwrap();
    let done: AnySignal = device.new_signal(0).unwrap();
    let mut queue: AnyQueue = device.compute_queue().unwrap();
    let fill = hwqueue::AnyProgram::from(fill_program());
    queue
        .exec(
            &fill,
            &[&buffer],
            &[7u32.into()],
            ExecParams::new_1d(64, 16),
        )
        .signal(&done, 1)
        .submit()
        .unwrap();
    done.wait(1, LONG).unwrap();
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![7; 64]);
    let _: &AnyDevice = &device;
    assert_eq!(<AnyBackend as Backend>::ID, "any");
}

#[test]
fn a_generic_pipeline_runs_on_the_enum_and_the_concrete_backend() {
    fn pipeline<D: Device>(device: &D, program: &hwqueue::ProgramOf<D::Backend>) -> Vec<u32> {
        let buffer = device.alloc(16).unwrap();
        let done = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        queue
            .exec(
                program,
                &[&buffer],
                &[5u32.into()],
                ExecParams::new_1d(4, 2),
            )
            .signal(&done, 1)
            .submit()
            .unwrap();
        done.wait(1, LONG).unwrap();
        buffer.to_vec().unwrap()
    }
    assert_eq!(pipeline(&CpuDevice::new(), &fill_program()), vec![5; 4]);
    assert_eq!(
        pipeline(&cpu_device(), &MixedProgram::from(fill_program())),
        vec![5; 4]
    );
}

#[test]
#[should_panic(expected = "two backends share an id")]
fn duplicate_ids_are_refused() {
    hwqueue::any::check_backend_list(&["cpu", "cpu"], &[0, 1]);
}

#[test]
#[should_panic(expected = "share a precedence")]
fn precedence_ties_are_refused() {
    hwqueue::any::check_backend_list(&["cpu", "mock"], &[3, 3]);
}
