//! The CUDA backend. GPU tests begin by probing: without a CUDA driver or
//! device they print `skipped: no CUDA driver` and return. The tests at the
//! top need no GPU and run wherever the feature is on.
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::LONG;
use cudarc::driver::sys::CUdevice_attribute;
use hwqueue::cpu::CpuSignal;
use hwqueue::cuda::{Cuda, CudaBuffer, CudaDevice, CudaProgram, CudaSignal};
use hwqueue::ring::RING_SLOTS;
use hwqueue::{
    Backend, Buffer, Device, Error, ExecParams, HardwareQueue, QueueFactory, Scalar,
    TimelineSignal, Timeout,
};
use hwqueue_testkit::cuda_kernels::{TESTS, test_signature};

/// Opens device 0, or says why the test is skipped.
fn device() -> Option<CudaDevice> {
    common::cuda_device()
}

/// Test kernel `name`, loaded with the signature testkit declares for it.
fn kernel(device: &CudaDevice, name: &str) -> CudaProgram {
    let (buffers, scalars) = test_signature(name);
    CudaProgram::from_cuda_c(device, TESTS, name, buffers, scalars)
        .unwrap_or_else(|e| panic!("compiling `{name}`: {e}"))
}

fn u32_buffer(device: &CudaDevice, len: usize) -> CudaBuffer {
    device.alloc(len * 4).unwrap()
}

/// Kernel cycles for about `duration` at the device's clock.
fn cycles_for(device: &CudaDevice, duration: Duration) -> u64 {
    let khz = device
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .unwrap();
    u64::try_from(khz).unwrap() * duration.as_millis() as u64
}

// ---------------------------------------------------------------------------
// No GPU needed.

#[test]
fn probe_and_open_answer_without_panicking() {
    match Cuda::probe() {
        Ok(devices) => {
            for (ordinal, info) in devices.iter().enumerate() {
                assert_eq!(info.spec.to_string(), format!("cuda:{ordinal}"));
            }
        }
        Err(error) => {
            assert!(matches!(
                error,
                Error::NoDriver {
                    backend: "cuda",
                    ..
                }
            ));
            assert!(error.to_string().contains("install"), "{error}");
        }
    }
    match Cuda::open(u32::MAX) {
        Err(Error::NoDriver { .. } | Error::NoSuchDevice { .. }) => {}
        other => panic!("opening cuda:{} gave {other:?}", u32::MAX),
    }
}

#[test]
fn a_signal_works_from_the_host_without_a_device() {
    let signal = CudaSignal::new(1);
    assert_eq!(signal.value(), 1);
    assert!(!signal.is_reached(2));
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || signal.wait(3, LONG))
    };
    thread::sleep(Duration::from_millis(20));
    signal.set(3);
    signal.set(2);
    waiter.join().unwrap().unwrap();
    assert_eq!(signal.value(), 3);
    assert!(matches!(
        signal.wait(4, Duration::from_millis(10)),
        Err(Error::Timeout {
            target: 4,
            current: 3,
            ..
        })
    ));
    signal.fail(
        5,
        Error::KernelFailed {
            program: "k".into(),
            message: "boom".into(),
        },
    );
    assert!(matches!(
        signal.wait(5, Timeout::Forever),
        Err(Error::SignalFailed { target: 5, .. })
    ));
}

// ---------------------------------------------------------------------------
// GPU.

#[test]
fn vector_add_matches_the_host() {
    let Some(device) = device() else { return };
    const N: u32 = 1 << 20;
    let a_host: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let b_host: Vec<f32> = (0..N).map(|i| 0.5 * i as f32).collect();
    let expected: Vec<f32> = a_host.iter().zip(&b_host).map(|(a, b)| a + b).collect();
    let a = device.alloc(N as usize * 4).unwrap();
    let b = device.alloc(N as usize * 4).unwrap();
    a.write_from(&a_host).unwrap();
    b.write_from(&b_host).unwrap();

    let compiled = kernel(&device, "add");
    // The same kernel again, loaded from the PTX NVRTC produced beside
    // the cubin. A driver older than the NVRTC refuses that PTX (issue 24,
    // defect 4): then the error must say so and how to fix it, and the
    // cubin above is what ran.
    let mut programs = vec![compiled.clone()];
    let ptx = compiled.ptx().expect("NVRTC writes PTX beside a cubin");
    match CudaProgram::from_ptx(&device, ptx, "add", 3, 1) {
        Ok(program) => programs.push(program),
        Err(error)
            if error
                .to_string()
                .contains("is newer than this driver can load") =>
        {
            let text = error.to_string();
            assert!(text.contains("update the GPU driver"), "{text}");
            println!("the driver predates NVRTC's PTX, and said so: {text}");
        }
        Err(error) => panic!("loading NVRTC's PTX: {error}"),
    }
    let mut queue = device.compute_queue().unwrap();
    for (round, program) in programs.iter().enumerate() {
        let c = device.alloc(N as usize * 4).unwrap();
        let done = device.new_signal(0).unwrap();
        queue
            .exec(
                program,
                &[&a, &b, &c],
                &[Scalar::U32(N)],
                ExecParams::new_1d(N, 256),
            )
            .signal(&done, 1)
            .submit()
            .unwrap();
        done.wait(1, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), expected, "round {round}");
    }
    queue.synchronize().unwrap();
}

#[test]
fn upload_download_round_trip() {
    let Some(device) = device() else { return };
    let buffer = device.alloc(4096).unwrap();
    assert_eq!(buffer.size(), 4096);
    // Fresh memory is zeroed.
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![0u8; 4096]);
    let data: Vec<u32> = (0..100).map(|i| i * 7 + 1).collect();
    buffer.write_at(100, &data).unwrap();
    let mut back = vec![0u32; 100];
    buffer.read_at(100, &mut back).unwrap();
    assert_eq!(back, data);
    let bytes = buffer.to_vec::<u8>().unwrap();
    assert!(bytes[..100].iter().all(|&b| b == 0));
    assert!(bytes[500..].iter().all(|&b| b == 0));
    // Out of bounds: an error, and nothing is written.
    assert!(matches!(
        buffer.write_at(4000, &[0u64; 13]),
        Err(Error::HostAccessOutOfBounds {
            offset: 4000,
            len: 104,
            size: 4096
        })
    ));
    assert!(
        buffer.to_vec::<u8>().unwrap()[4000..]
            .iter()
            .all(|&b| b == 0)
    );
    let mut too_long = vec![0u8; 4097];
    assert!(matches!(
        buffer.read_into(&mut too_long),
        Err(Error::HostAccessOutOfBounds { .. })
    ));
    // An empty buffer works too.
    let empty = device.alloc(0).unwrap();
    assert_eq!(empty.size(), 0);
    assert!(empty.to_vec::<u32>().unwrap().is_empty());
}

#[test]
fn a_long_kernel_is_not_reached_until_it_completes() {
    let Some(device) = device() else { return };
    let spin = kernel(&device, "spin");
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let cycles = cycles_for(&device, Duration::from_millis(500));
    let start = Instant::now();
    queue
        .exec(&spin, &[], &[Scalar::U64(cycles)], ExecParams::new_1d(1, 1))
        .signal(&done, 1)
        .submit()
        .unwrap();
    // The event is recorded, the kernel is running: not reached.
    while start.elapsed() < Duration::from_millis(200) {
        assert!(!done.is_reached(1), "reached after {:?}", start.elapsed());
        assert!(done.value() < 1);
        thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(
        done.wait(1, Duration::from_millis(10)),
        Err(Error::Timeout {
            target: 1,
            current: 0,
            ..
        })
    ));
    done.wait(1, LONG).unwrap();
    assert!(done.is_reached(1));
    assert_eq!(done.value(), 1);
    assert!(start.elapsed() >= Duration::from_millis(200));
}

/// Uploads `0..n` to a staging buffer; the copy queue copies it to `mid`,
/// the compute queue waits for the copy's signal and writes `mid + 1` to
/// `out`.
fn copy_then_increment(submit_compute_first: bool) {
    let Some(device) = device() else { return };
    // 64 MiB, so the copy takes long enough for a missing wait to show.
    const N: usize = 16 << 20;
    let staging = u32_buffer(&device, N);
    let mid = u32_buffer(&device, N);
    let out = u32_buffer(&device, N);
    let host: Vec<u32> = (0..N as u32).collect();
    staging.write_from(&host).unwrap();

    let increment = kernel(&device, "increment");
    let spin = kernel(&device, "spin");
    let mut copy_queue = device.copy_queue().unwrap().expect("CUDA has a copy queue");
    let mut compute = device.compute_queue().unwrap();
    let mut spinner = device.compute_queue().unwrap();
    let gate = device.new_signal(0).unwrap();
    let copied = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    // The producer (the copy) stands behind a 300 ms kernel on a third
    // stream: a compute queue that ran past its wait would find `mid`
    // still zero, not a race it might win.
    spinner
        .exec(
            &spin,
            &[],
            &[Scalar::U64(cycles_for(&device, Duration::from_millis(300)))],
            ExecParams::new_1d(1, 1),
        )
        .signal(&gate, 1)
        .submit()
        .unwrap();

    let submit_copy = |queue: &mut hwqueue::cuda::CudaQueue| {
        queue
            .wait(&gate, 1)
            .copy(&mid, &staging)
            .signal(&copied, 1)
            .submit()
            .unwrap()
    };
    let submit_compute = |queue: &mut hwqueue::cuda::CudaQueue| {
        queue
            .wait(&copied, 1)
            .exec(
                &increment,
                &[&mid, &out],
                &[],
                ExecParams::new_1d(N as u32, 256),
            )
            .signal(&done, 1)
            .submit()
            .unwrap()
    };
    if submit_compute_first {
        // Wait before signal: the compute queue defers its wait on the host
        // until the copy's value is recorded.
        submit_compute(&mut compute);
        thread::sleep(Duration::from_millis(20));
        assert!(!done.is_reached(1));
        submit_copy(&mut copy_queue);
    } else {
        submit_copy(&mut copy_queue);
        submit_compute(&mut compute);
    }
    done.wait(1, LONG).unwrap();
    assert!(copied.is_reached(1));
    let result = out.to_vec::<u32>().unwrap();
    assert!(
        result.iter().enumerate().all(|(i, &v)| v == i as u32 + 1),
        "the kernel ran before the copy finished"
    );
    compute.synchronize().unwrap();
    copy_queue.synchronize().unwrap();
    spinner.synchronize().unwrap();
}

#[test]
fn a_compute_queue_waits_on_a_copy_queue_signal() {
    copy_then_increment(false);
}

#[test]
fn a_compute_queue_waits_on_a_copy_signal_submitted_later() {
    copy_then_increment(true);
}

#[test]
fn more_records_in_flight_than_ring_slots_with_waiters_on_old_values() {
    let Some(device) = device() else { return };
    let spin = kernel(&device, "spin_and_mark");
    let cycles = cycles_for(&device, Duration::from_millis(5));
    let signal = device.new_signal(0).unwrap();
    let mark = Arc::new(u32_buffer(&device, 1));
    let total = RING_SLOTS as u64 * 3;
    // Waiters on old and new values, parked before anything is recorded.
    // Each reads the witness the kernels write: the value of the last
    // kernel that finished, which must be at least its target once the
    // wait returns (kernels of one stream run in order).
    let waiters: Vec<_> = (1..=total)
        .filter(|v| v % 7 == 1 || *v == total)
        .map(|target| {
            let signal = signal.clone();
            let mark = mark.clone();
            thread::spawn(move || {
                signal.wait(target, Timeout::Forever)?;
                let witness = u64::from(mark.to_vec::<u32>()?[0]);
                Ok::<_, Error>((target, witness))
            })
        })
        .collect();
    let mut queue = device.compute_queue().unwrap();
    for value in 1..=total {
        queue
            .exec(
                &spin,
                &[&mark],
                &[Scalar::U64(cycles), Scalar::U32(value as u32)],
                ExecParams::new_1d(1, 1),
            )
            .signal(&signal, value);
    }
    // One submit records 3x the ring's slots: the recorder waits for the
    // oldest records to complete as it goes.
    queue.submit().unwrap();
    for waiter in waiters {
        let (target, witness) = waiter.join().unwrap().unwrap();
        assert!(
            witness >= target,
            "wait({target}) returned when kernel {witness} was the last to finish"
        );
    }
    signal.wait(total, LONG).unwrap();
    assert_eq!(signal.value(), total);
    queue.synchronize().unwrap();
}

#[test]
fn a_queue_waits_on_a_cpu_signal_through_wait_foreign() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let gate = CpuSignal::new(0);
    let done = device.new_signal(0).unwrap();
    let buffer = u32_buffer(&device, 1024);
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait_foreign(&gate, 1)
        .exec(
            &fill,
            &[&buffer],
            &[Scalar::U32(42)],
            ExecParams::new_1d(1024, 256),
        )
        .signal(&done, 1)
        .submit()
        .unwrap();
    // The queue stands at the gate until the host sets it: given time to
    // run, the kernel still has not.
    assert!(matches!(
        done.wait(1, Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![0; 1024]);
    gate.set(1);
    done.wait(1, LONG).unwrap();
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![42; 1024]);
    queue.synchronize().unwrap();
}

#[test]
fn a_failed_wait_fails_the_batch_signals_and_reports_to_the_owner() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let upstream = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let buffer = u32_buffer(&device, 256);
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait(&upstream, 1)
        .exec(
            &fill,
            &[&buffer],
            &[Scalar::U32(7)],
            ExecParams::new_1d(256, 256),
        )
        .signal(&done, 1)
        .submit()
        .unwrap();
    upstream.fail(
        1,
        Error::KernelFailed {
            program: "upstream".into(),
            message: "boom".into(),
        },
    );
    let error = done.wait(1, LONG).unwrap_err();
    assert!(
        matches!(error, Error::SignalFailed { target: 1, .. }),
        "{error:?}"
    );
    assert!(matches!(error.root_cause(), Error::KernelFailed { .. }));
    assert!(matches!(
        queue.synchronize(),
        Err(Error::QueueFailed { .. })
    ));
    // The queue works again.
    let again = device.new_signal(0).unwrap();
    queue
        .exec(
            &fill,
            &[&buffer],
            &[Scalar::U32(9)],
            ExecParams::new_1d(256, 256),
        )
        .signal(&again, 1)
        .submit()
        .unwrap();
    again.wait(1, LONG).unwrap();
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![9; 256]);
}

#[test]
fn invalid_commands_reject_the_batch_and_fail_its_signals() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let small = u32_buffer(&device, 16);
    let large = u32_buffer(&device, 32);
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let error = queue
        .copy(&large, &small)
        .signal(&done, 1)
        .submit()
        .unwrap_err();
    assert!(matches!(
        error.root_cause(),
        Error::CopySizeMismatch { dst: 128, src: 64 }
    ));
    assert!(matches!(
        done.wait(1, Duration::ZERO),
        Err(Error::SignalFailed { .. })
    ));
    // Wrong argument counts, and a grid that does not divide.
    assert!(
        queue
            .exec(&fill, &[&small], &[], ExecParams::new_1d(16, 16))
            .submit()
            .is_err()
    );
    assert!(
        queue
            .exec(
                &fill,
                &[&small],
                &[Scalar::U32(1)],
                ExecParams::new_1d(16, 5)
            )
            .submit()
            .is_err()
    );
    let mut copy_queue = device.copy_queue().unwrap().unwrap();
    assert!(matches!(
        copy_queue
            .exec(
                &fill,
                &[&small],
                &[Scalar::U32(1)],
                ExecParams::new_1d(16, 16)
            )
            .submit(),
        Err(Error::BatchRejected { .. })
    ));
}

#[test]
fn an_nvrtc_compile_error_carries_the_compiler_log() {
    let Some(device) = device() else { return };
    let source = r#"extern "C" __global__ void broken(float *out) { out[0] = undefined_thing; }"#;
    let error = CudaProgram::from_cuda_c(&device, source, "broken", 1, 0).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(&error, Error::Compile { compiler, .. } if compiler == "NVRTC"),
        "{error:?}"
    );
    assert!(message.contains("undefined_thing"), "{message}");
    assert!(message.contains("broken"), "{message}");
}

#[test]
fn many_host_waiters_on_one_signal_all_wake() {
    let Some(device) = device() else { return };
    let spin = kernel(&device, "spin");
    let cycles = cycles_for(&device, Duration::from_millis(50));
    let signal = Arc::new(device.new_signal(0).unwrap());
    let waiters: Vec<_> = (0..8)
        .map(|i| {
            let signal = signal.clone();
            thread::spawn(move || {
                if i % 2 == 0 {
                    signal.wait(1, Timeout::Forever)
                } else {
                    signal.wait(1, LONG)
                }
            })
        })
        .collect();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(&spin, &[], &[Scalar::U64(cycles)], ExecParams::new_1d(1, 1))
        .signal(&signal, 1)
        .submit()
        .unwrap();
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
    assert!(signal.is_reached(1));
}

/// What the CPU kernel of the next test saw of the CUDA signal when it ran.
static CUDA_DONE: std::sync::OnceLock<hwqueue::AnySignal> = std::sync::OnceLock::new();
static CPU_SAW_CUDA_DONE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn record_cuda_progress(_: &hwqueue::cpu::WorkGroup, _: &hwqueue::cpu::KernelArgs<'_>) {
    let reached = CUDA_DONE.get().is_some_and(|s| s.is_reached(1));
    CPU_SAW_CUDA_DONE.store(
        if reached { 2 } else { 1 },
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Through the crate's Any* set: a CUDA queue waits on a CPU signal, and a
/// CPU queue waits on the CUDA queue's signal; neither runs past its wait
/// before the other side's work completed. A CUDA buffer on the CPU queue is
/// rejected naming both backends.
#[test]
fn cpu_and_cuda_queues_wait_on_each_other_through_the_any_enums() {
    use hwqueue::cpu::{CpuDevice, CpuProgram};
    use hwqueue::{AnyBuffer, AnyDevice, AnyProgram, AnyQueue, AnySignal};
    let Some(cuda) = device() else { return };
    let spin = AnyProgram::from(kernel(&cuda, "spin"));
    let cycles = cycles_for(&cuda, Duration::from_millis(300));
    let cuda = AnyDevice::from(cuda);
    let cpu = AnyDevice::from(CpuDevice::new());
    let mut queues: Vec<AnyQueue> =
        vec![cpu.compute_queue().unwrap(), cuda.compute_queue().unwrap()];
    let gate: AnySignal = cpu.new_signal(0).unwrap();
    let cuda_done: AnySignal = cuda.new_signal(0).unwrap();
    let cpu_done: AnySignal = cpu.new_signal(0).unwrap();
    assert!(CUDA_DONE.set(cuda_done.clone()).is_ok(), "set once");
    let record = AnyProgram::from(CpuProgram::from_fn(
        "record_cuda_progress",
        0,
        0,
        record_cuda_progress,
    ));

    // Submitted consumer first: only the signals order the work.
    queues[0]
        .wait(&cuda_done, 1) // CPU waits on CUDA: the worker blocks on the ring
        .exec(&record, &[], &[], ExecParams::new_1d(1, 1))
        .signal(&cpu_done, 1)
        .submit()
        .unwrap();
    queues[1]
        .wait(&gate, 1) // CUDA waits on CPU: enqueueing is deferred to the worker
        .exec(&spin, &[], &[Scalar::U64(cycles)], ExecParams::new_1d(1, 1))
        .signal(&cuda_done, 1)
        .submit()
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    assert!(!cuda_done.is_reached(1) && !cpu_done.is_reached(1));
    gate.set(1);
    cpu_done.wait(1, LONG).unwrap();
    assert_eq!(
        CPU_SAW_CUDA_DONE.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the CPU kernel ran before the CUDA kernel completed"
    );
    for queue in &mut queues {
        queue.synchronize().unwrap();
    }

    let on_gpu: AnyBuffer = cuda.alloc(16).unwrap();
    let fill = AnyProgram::from(CpuProgram::from_fn("fill", 1, 1, common::fill));
    let error = queues[0]
        .exec(
            &fill,
            &[&on_gpu],
            &[Scalar::U32(1)],
            ExecParams::new_1d(4, 4),
        )
        .submit()
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("`cuda`") && message.contains("`cpu`"),
        "{message}"
    );
}

#[test]
fn nvrtc_targets_the_device_so_sm60_features_compile_and_run() {
    let Some(device) = device() else { return };
    let sum = kernel(&device, "sum_f64");
    let total = device.alloc(8).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(
            &sum,
            &[&total],
            &[Scalar::F64(0.5)],
            ExecParams::new_1d(256, 64),
        )
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert_eq!(total.to_vec::<f64>().unwrap(), vec![128.0]);
}

#[test]
fn dynamic_shared_memory_above_48_kib_is_opted_in_and_used() {
    let Some(device) = device() else { return };
    let limit = device.limits().max_shared_memory;
    println!("opt-in shared memory per block: {limit} bytes");
    assert!(
        limit >= 64 << 10,
        "every GPU since Volta opts in to more than 64 KiB"
    );
    let program = kernel(&device, "shared_sum");
    let out = u32_buffer(&device, 1);
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(
            &program,
            &[&out],
            &[],
            ExecParams::new_1d(256, 256).with_shared_memory(64 << 10),
        )
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert_eq!(out.to_vec::<u32>().unwrap(), vec![16383 * 16384 / 2]);
    // More than the device has is refused at submit, and nothing runs.
    let error = queue
        .exec(
            &program,
            &[&out],
            &[],
            ExecParams::new_1d(256, 256).with_shared_memory(limit + 1),
        )
        .submit()
        .unwrap_err();
    match error.root_cause() {
        Error::InvalidExecParams { reason, .. } => assert!(
            reason.contains(&format!("exceed this device's limit of {limit} bytes")),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn kernel_parameters_are_checked_against_the_declared_abi() {
    let Some(device) = device() else { return };
    // `add` takes three pointers and a count: the count is checked first,
    // then each parameter's width (first run on an H100: this asked for
    // "parameter 2" from a count mismatch, which the count check answers).
    for (buffers, scalars) in [(2, 1), (3, 0)] {
        let error = CudaProgram::from_cuda_c(&device, TESTS, "add", buffers, scalars).unwrap_err();
        assert!(
            matches!(&error, Error::InvalidProgram { .. })
                && error.to_string().contains("takes 4 parameters"),
            "{error}"
        );
    }
    let error = CudaProgram::from_cuda_c(&device, TESTS, "add", 4, 0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("parameter 3 is declared a buffer"),
        "{error}"
    );
    // A scalar of the wrong width is refused at submit.
    let add = kernel(&device, "add");
    let buffers: Vec<_> = (0..3).map(|_| u32_buffer(&device, 256)).collect();
    let mut queue = device.compute_queue().unwrap();
    let error = queue
        .exec(
            &add,
            &[&buffers[0], &buffers[1], &buffers[2]],
            &[Scalar::U64(256)],
            ExecParams::new_1d(256, 256),
        )
        .submit()
        .unwrap_err();
    assert!(error.to_string().contains("scalar 0 is a u64"), "{error}");
}

#[test]
fn buffers_and_programs_dropped_right_after_submit_stay_alive_for_the_work() {
    let Some(device) = device() else { return };
    const N: usize = 1 << 20;
    let out = u32_buffer(&device, N);
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    {
        let spin = kernel(&device, "spin");
        let fill = kernel(&device, "fill");
        let scratch = u32_buffer(&device, N);
        queue
            .exec(
                &spin,
                &[],
                &[Scalar::U64(cycles_for(&device, Duration::from_millis(100)))],
                ExecParams::new_1d(1, 1),
            )
            .exec(
                &fill,
                &[&scratch],
                &[Scalar::U32(7)],
                ExecParams::new_1d(N as u32, 256),
            )
            .copy(&out, &scratch)
            .signal(&done, 1)
            .submit()
            .unwrap();
        // The program and the scratch buffer go here, while the spin runs.
    }
    done.wait(1, LONG).unwrap();
    assert!(out.to_vec::<u32>().unwrap().iter().all(|v| *v == 7));
    queue.synchronize().unwrap();
}

#[test]
fn a_queue_waits_on_a_value_the_host_sets_later() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let out = u32_buffer(&device, 256);
    let gate: CudaSignal = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait(&gate, 1)
        .exec(
            &fill,
            &[&out],
            &[Scalar::U32(9)],
            ExecParams::new_1d(256, 256),
        )
        .signal(&done, 1)
        .submit()
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    assert!(!done.is_reached(1));
    assert_eq!(out.to_vec::<u32>().unwrap(), vec![0; 256]);
    gate.set(1);
    done.wait(1, LONG).unwrap();
    assert_eq!(out.to_vec::<u32>().unwrap(), vec![9; 256]);
    queue.synchronize().unwrap();
}

#[test]
fn a_profiled_kernel_measures_its_device_time_within_the_host_bounds() {
    let Some(device) = device() else { return };
    let spin = kernel(&device, "spin");
    let cycles = Scalar::U64(cycles_for(&device, Duration::from_millis(20)));
    let mut queue = device.compute_queue().unwrap();
    queue.set_profiling(true);
    let before = hwqueue::profile::now_ns();
    queue
        .exec(&spin, &[], &[cycles], ExecParams::new_1d(1, 1))
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    let after = hwqueue::profile::now_ns();
    let events = queue.take_profile();
    println!("{events:#?}");
    let kernel = events
        .iter()
        .find(|event| event.category == hwqueue::Category::Kernel)
        .expect("the exec is in the profile");
    assert_eq!(&*kernel.name, "spin");
    // The clock rate is the maximum: a kernel may run slower, never faster.
    assert!(kernel.duration() >= Duration::from_millis(19), "{kernel:?}");
    // What placement guarantees (issue 24, defect 11): never before the
    // submit; late by at most the reference wait's wake-up, so the end may
    // pass `after`, but a 20 ms kernel's start cannot.
    assert!(
        before <= kernel.start_ns && kernel.start_ns <= after,
        "{kernel:?}"
    );
    let timing = hwqueue::time_exec(
        &mut queue,
        &spin,
        &[],
        &[Scalar::U64(1000)],
        ExecParams::new_1d(1, 1),
        2,
        5,
    )
    .unwrap();
    println!("spin(1000 cycles): {timing:?}");
    assert_eq!(timing.samples.len(), 5);
}

// ---------------------------------------------------------------------------
// Views, fills and host transfers in stream order (GPU).

#[test]
fn views_fills_and_transfers_run_in_stream_order() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let arena = device.alloc(1 << 20).unwrap();
    // A large upload (through page-locked staging) and a small one (inline).
    let big: Vec<u32> = (0..65_536).collect();
    let (x, y, z) = (
        arena.view(0, 256 << 10).unwrap(),
        arena.view(256 << 10, 1024).unwrap(),
        arena.view((256 << 10) + 1024, 1024).unwrap(),
    );
    let gate = CpuSignal::new(0);
    let (back, filled, written) = (
        hwqueue::Download::<u32>::new(65_536),
        hwqueue::Download::<u16>::new(512),
        hwqueue::Download::<u32>::new(256),
    );
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait_foreign(&gate, 1)
        .upload(&x, &big)
        .download(&x, &back)
        .fill(&y, 0xBEEFu16)
        .download(&y, &filled)
        .exec_views(
            &fill,
            &[&z],
            &[Scalar::U32(7)],
            ExecParams::new_1d(256, 128),
        )
        .download(&z, &written)
        .submit()
        .unwrap();
    // Stopped at the gate: given time, nothing has arrived.
    assert!(matches!(
        written.wait(Duration::from_millis(50)),
        Err(Error::DownloadIncomplete { .. })
    ));
    assert!(!back.is_ready() && !written.is_ready());
    gate.set(1);
    assert_eq!(back.take(LONG).unwrap(), big);
    assert_eq!(filled.take(LONG).unwrap(), vec![0xBEEF; 512]);
    assert_eq!(written.take(LONG).unwrap(), vec![7; 256]);
    queue.synchronize().unwrap();
}

#[test]
fn a_misaligned_view_and_an_overlapping_copy_reject_the_batch_on_cuda() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let buffer = device.alloc(4096).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let odd = buffer.view(4, 1024).unwrap();
    queue.exec_views(
        &fill,
        &[&odd],
        &[Scalar::U32(1)],
        ExecParams::new_1d(256, 256),
    );
    assert!(matches!(
        queue.submit(),
        Err(Error::BatchRejected { cause }) if matches!(&*cause, Error::ViewMisaligned { alignment: 16, .. })
    ));
    queue.copy(&buffer.view(0, 64).unwrap(), &buffer.view(32, 64).unwrap());
    assert!(matches!(
        queue.submit(),
        Err(Error::BatchRejected { cause }) if matches!(&*cause, Error::CopyOverlap { .. })
    ));
    queue.synchronize().unwrap();
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![0; 4096]);
}

#[test]
fn a_plan_uploads_runs_and_downloads_on_views_of_one_arena() {
    let Some(device) = device() else { return };
    let increment = kernel(&device, "increment");
    let device = Arc::new(device);
    let mut schedule = hwqueue::Schedule::<Cuda>::new();
    let d = schedule.add_device(device.clone());
    let arena = schedule.add_buffer(d, "arena", device.alloc(1 << 20).unwrap());
    // A large input (page-locked staging) and a small output (4 KiB).
    let n = 65_536;
    let x = schedule.add_view("x", arena, 0, n * 4).unwrap();
    let y = schedule.add_view("y", arena, n * 4, n * 4).unwrap();
    let y_head = schedule.add_view("y head", arena, n * 4, 4096).unwrap();
    let up = schedule.upload("upload x", x).id();
    schedule.exec(
        "increment",
        d,
        &increment,
        &[x, y],
        &[],
        ExecParams::new_1d(n as u32, 256),
    );
    let down = schedule.download("download y head", y_head).id();
    let mut plan = schedule.plan().unwrap();
    // Three runs back to back, each with its own input and output.
    let started: Vec<_> = (0..3u32)
        .map(|run| {
            let input: Vec<u32> = (0..n as u32).map(|i| i * 10 + run).collect();
            plan.upload_vec(up, input).unwrap();
            let out = hwqueue::Download::<u32>::new(1024);
            plan.download(down, &out).unwrap();
            (run, plan.run().unwrap(), out)
        })
        .collect();
    for (run, handle, out) in started {
        handle.wait(LONG).unwrap();
        let want: Vec<u32> = (0..1024u32).map(|i| i * 10 + run + 1).collect();
        assert_eq!(out.take(LONG).unwrap(), want, "run {run}");
    }
}

// ---------------------------------------------------------------------------
// Memory: the pool, zeroing behind the allocation fence, alloca/dealloca.

#[test]
fn pooled_buffers_are_zeroed_reused_and_counted_on_cuda() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let mut queue = device.compute_queue().unwrap();
    // 256 MiB: a memset that size takes long enough that a kernel not
    // ordered after it (no allocation fence) would see the old bytes.
    const SIZE: usize = 256 << 20;
    const WORDS: u32 = (SIZE / 4) as u32;
    let before = device.memory_stats();
    let a = device.alloc_uninit(SIZE).unwrap();
    assert_eq!(
        a.device_pointer() % hwqueue::cuda::CUDA_BUFFER_ALIGN as u64,
        0
    );
    queue
        .exec(
            &fill,
            &[&a],
            &[Scalar::U32(9)],
            ExecParams::new_1d(WORDS, 256),
        )
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    let at = a.device_pointer();
    drop(a);
    // The same range, zeroed by a memset behind the allocation fence: a
    // kernel submitted right away, with no synchronisation, sees zeros.
    let b = device.alloc(SIZE).unwrap();
    assert_eq!(b.device_pointer(), at, "the freed range is reused");
    let c = device.alloc(SIZE).unwrap();
    let increment = kernel(&device, "increment");
    queue
        .exec(&increment, &[&b, &c], &[], ExecParams::new_1d(WORDS, 256))
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert!(c.to_vec::<u32>().unwrap().iter().all(|&x| x == 1));
    let stats = device.memory_stats();
    assert_eq!(stats.in_use - before.in_use, 2 * SIZE);
    drop((b, c));
    assert!(device.trim_memory() > 0);
}

#[test]
fn alloca_and_dealloca_run_in_stream_order_on_cuda() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let mut queue = device.compute_queue().unwrap();
    let back = hwqueue::Download::<u32>::new(1024);
    let scratch = queue.alloca(4096).unwrap();
    queue
        .exec(
            &fill,
            &[&scratch],
            &[Scalar::U32(5)],
            ExecParams::new_1d(1024, 256),
        )
        .download(&scratch, &back)
        .dealloca(&scratch)
        .submit()
        .unwrap();
    assert_eq!(back.take(LONG).unwrap(), vec![5; 1024]);
    queue.synchronize().unwrap();
    // After the dealloca ran, the buffer is refused everywhere.
    assert!(matches!(
        scratch.to_vec::<u32>(),
        Err(Error::UseAfterDealloca { .. })
    ));
    let error = queue.fill(&scratch, 0u8).submit().unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::UseAfterDealloca { .. }),
        "{error}"
    );
    // An alloca dropped without a dealloca goes back to the pool with its
    // last handle (no batch holds it): the bytes in use go back to what
    // they were.
    let in_use = device.memory_stats().in_use;
    let dropped = queue.alloca(1 << 20).unwrap();
    dropped.write_at(0, &[1u32, 2, 3]).unwrap();
    assert_eq!(dropped.to_vec::<u32>().unwrap()[..3], [1, 2, 3]);
    assert!(device.memory_stats().in_use >= in_use + (1 << 20));
    drop(dropped);
    queue.synchronize().unwrap();
    assert_eq!(device.memory_stats().in_use, in_use);
}

/// Queue C records an exec on an `alloca` buffer while it is live and
/// submits it only after queue A's `dealloca` ran: C's batch holds a use,
/// so it runs on the buffer's bytes, and the range goes to no other buffer
/// until C's stream passed it (issue 34: `cuMemFreeAsync` on A's stream
/// was ordered after none of C's work). A's next `alloca` of the same size
/// gets other bytes meanwhile, and C's result is intact.
#[test]
fn a_batch_of_another_queue_recorded_before_a_dealloca_runs_on_its_bytes_on_cuda() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let (mut a, mut c) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let x = a.alloca(4096).unwrap();
    let x_at = x.device_pointer();
    let back = hwqueue::Download::<u32>::new(1024);
    c.exec(
        &fill,
        &[&x],
        &[Scalar::U32(4)],
        ExecParams::new_1d(1024, 256),
    )
    .download(&x, &back);
    a.dealloca(&x).submit().unwrap();
    a.synchronize().unwrap();
    // C's batch holds a use: A's next alloca of the size gets other bytes,
    // and writing them cannot reach C's.
    let y = a.alloca(4096).unwrap();
    assert_ne!(y.device_pointer(), x_at);
    a.fill(&y, 0xffu8).submit().unwrap();
    c.submit().unwrap();
    assert_eq!(back.take(LONG).unwrap(), vec![4; 1024]);
    c.synchronize().unwrap();
    a.synchronize().unwrap();
    // Once C's stream passed it, the range is back (the free range that
    // fits best: `y` is still held).
    let z = a.alloca(4096).unwrap();
    assert_eq!(z.device_pointer(), x_at);
    drop(y);
}

/// Issue 37's cross-stream reuse, with the order made certain by a gate:
/// queue B writes an `alloca` range, spins, then waits on a host gate
/// before reading it back; while B's work on the range is still pending,
/// queue A `dealloca`s it, `alloca`s the same size and writes the new
/// buffer, and runs to completion. Only then is the gate set. B must read
/// its own bytes: the range went to no other buffer while B's stream held
/// it (PyTorch's `record_stream` rule, here implied by the recorded use).
#[test]
fn a_range_deallocated_while_another_stream_s_kernel_runs_on_it_is_not_reused() {
    let Some(device) = device() else { return };
    let fill = kernel(&device, "fill");
    let spin = kernel(&device, "spin");
    let (mut a, mut b) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let gate: CudaSignal = device.new_signal(0).unwrap();
    let b_done: CudaSignal = device.new_signal(0).unwrap();
    let x = a.alloca(1 << 20).unwrap();
    let x_at = x.device_pointer();
    let back = hwqueue::Download::<u32>::new(1 << 18);
    b.exec(
        &fill,
        &[&x],
        &[Scalar::U32(4)],
        ExecParams::new_1d(1 << 18, 256),
    )
    .exec(
        &spin,
        &[],
        &[Scalar::U64(cycles_for(&device, Duration::from_millis(50)))],
        ExecParams::new_1d(1, 1),
    )
    .wait(&gate, 1)
    .download(&x, &back)
    .signal(&b_done, 1)
    .submit()
    .unwrap();
    a.dealloca(&x).submit().unwrap();
    let y = a.alloca(1 << 20).unwrap();
    assert_ne!(y.device_pointer(), x_at, "B's stream still holds the range");
    let y_back = hwqueue::Download::<u32>::new(1 << 18);
    a.fill(&y, 0xffu8).download(&y, &y_back).submit().unwrap();
    a.synchronize().unwrap();
    assert_eq!(y_back.take(LONG).unwrap(), vec![u32::MAX; 1 << 18]);
    // A ran to completion while B is held at its gate: B has not finished.
    assert!(!b_done.is_reached(1));
    gate.set(1);
    assert_eq!(back.take(LONG).unwrap(), vec![4; 1 << 18]);
    b_done.wait(1, LONG).unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    drop(y);
}

/// Large transfers go through pinned staging chunks, which a per-device
/// cache reuses; the cache is not observable from here, so this checks the
/// round trips only.
#[test]
fn repeated_large_transfers_round_trip() {
    let Some(device) = device() else { return };
    let buffer = device.alloc(4 << 20).unwrap();
    let data: Vec<u32> = (0..(1 << 20)).collect();
    let mut queue = device.compute_queue().unwrap();
    for _ in 0..8 {
        let back = hwqueue::Download::<u32>::new(1 << 20);
        queue
            .upload(&buffer, &data)
            .download(&buffer, &back)
            .submit()
            .unwrap();
        assert_eq!(back.take(LONG).unwrap(), data);
        queue.synchronize().unwrap();
    }
}

#[test]
fn device_memory_is_reported() {
    let Some(device) = device() else { return };
    let info = device
        .memory_info()
        .expect("cuMemGetInfo answers on a device");
    assert!(info.total > 0 && info.free <= info.total);
}
