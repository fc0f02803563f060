//! The CUDA backend against raw cudarc, on the same work.
//!
//! | group | `hwqueue` | `cudarc` (baseline) |
//! |-------|-----------|---------------------|
//! | `cuda_launch` | 1,000 `exec`s of an empty kernel on a `CudaQueue`, then a signal waited for | 1,000 `launch_builder(..).launch(..)` on a cudarc stream, then `synchronize` |
//! | `cuda_signal` | `signal(s, v)` + `submit`, then polling `is_reached(v)` until true | `CudaEvent::record` on the stream, then polling `try_is_complete` until true |
//! | `cuda_alloc` | `alloc_uninit(1 MiB)` and drop: the caching pool | `cuMemAlloc_v2` + `cuMemFree_v2` of 1 MiB |
//! | `cuda_signal_wait` | a 20 µs `spin` kernel + `signal` + `submit`, then `wait(v, Forever)` (a `CU_EVENT_BLOCKING_SYNC` event: the host thread sleeps) | the same launch, an event with timing off recorded, then `synchronize` (the host thread spins) |
//!
//! Built only with `--features cuda` (`required-features`); without a CUDA
//! driver and device it prints `skipped: no CUDA driver` and measures nothing.

mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use hwqueue::cuda::{Cuda, CudaDevice, CudaProgram};
use hwqueue::{
    Backend, Device, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal, Timeout,
};
use hwqueue_testkit::cuda_kernels::{EMPTY, TESTS, test_signature};

use support::Profile;

const LAUNCHES: usize = 1_000;

fn device() -> Option<CudaDevice> {
    match Cuda::probe() {
        Ok(devices) if !devices.is_empty() => Some(Cuda::open(0).expect("a probed device opens")),
        _ => {
            println!("skipped: no CUDA driver");
            None
        }
    }
}

fn cuda_launch(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("cuda_launch");
    support::configure(&mut group, Profile::Latency);
    let one = ExecParams::new_1d(1, 1);

    group.bench_function("hwqueue", |b| {
        let program = CudaProgram::from_cuda_c(&device, EMPTY, "empty", 0, 0).expect("compile");
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let mut value = 0;
        b.iter(|| {
            for _ in 0..LAUNCHES {
                queue.exec(&program, &[], &[], one);
            }
            value += 1;
            queue.signal(&done, value).submit().expect("submit");
            done.wait(value, Timeout::Forever).expect("ran");
        });
    });

    group.bench_function("cudarc", |b| {
        let context = device.context();
        let stream = context.new_stream().expect("stream");
        let ptx = cudarc::nvrtc::compile_ptx(EMPTY).expect("compile");
        let function = context
            .load_module(ptx)
            .expect("module")
            .load_function("empty")
            .expect("function");
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        b.iter(|| {
            for _ in 0..LAUNCHES {
                let mut launch = stream.launch_builder(&function);
                // SAFETY: `empty` takes no parameters and touches no memory.
                unsafe { launch.launch(config) }.expect("launch");
            }
            stream.synchronize().expect("synchronize");
        });
    });
    group.finish();
}

fn cuda_signal(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("cuda_signal");
    support::configure(&mut group, Profile::Latency);

    group.bench_function("hwqueue", |b| {
        let mut queue = device.compute_queue().expect("queue");
        let signal = device.new_signal(0).expect("signal");
        let mut value = 0;
        b.iter(|| {
            value += 1;
            queue.signal(&signal, value).submit().expect("submit");
            while !signal.is_reached(value) {
                std::hint::spin_loop();
            }
        });
    });

    group.bench_function("cudarc", |b| {
        let context = device.context();
        let stream = context.new_stream().expect("stream");
        // The flags hwqueue's signal events use (timing off).
        let event = context
            .new_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))
            .expect("event");
        b.iter(|| {
            event.record(&stream).expect("record");
            while !event.try_is_complete().expect("query") {
                std::hint::spin_loop();
            }
        });
    });
    group.finish();
}

/// The pool against the driver's allocator: a buffer taken and given back
/// (issue 37's target: the pool at most 0.2x of `cuMemAlloc`/`cuMemFree`).
fn cuda_alloc(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("cuda_alloc");
    support::configure(&mut group, Profile::Latency);
    const SIZE: usize = 1 << 20;

    group.bench_function("hwqueue_pool", |b| {
        b.iter(|| drop(device.alloc_uninit(SIZE).expect("alloc")));
    });

    group.bench_function("cuMemAlloc_cuMemFree", |b| {
        device.context().bind_to_thread().expect("context");
        b.iter(|| {
            // SAFETY: the context is current on this thread; the pointer
            // is freed once, right after, and never used.
            unsafe {
                let pointer = cudarc::driver::result::malloc_sync(SIZE).expect("cuMemAlloc");
                cudarc::driver::result::free_sync(pointer).expect("cuMemFree");
            }
        });
    });
    group.finish();
}

/// Cycles of the `spin` kernel the wait group waits for: about 20 µs.
const SPIN_CYCLES: u64 = 35_000;

/// A host thread waiting, unbounded, for a short kernel: hwqueue's signal
/// events are `CU_EVENT_BLOCKING_SYNC`, so `wait(Forever)` sleeps in the
/// driver; the baseline is a cudarc event with timing off only, whose
/// `synchronize` spins a core. The ratio is the wake-up cost of sleeping.
fn cuda_signal_wait(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("cuda_signal_wait");
    support::configure(&mut group, Profile::Latency);
    let (buffers, scalars) = test_signature("spin");
    let spin = CudaProgram::from_cuda_c(&device, TESTS, "spin", buffers, scalars).expect("spin");
    let one = ExecParams::new_1d(1, 1);

    group.bench_function("hwqueue_blocking_sync", |b| {
        let mut queue = device.compute_queue().expect("queue");
        let signal = device.new_signal(0).expect("signal");
        let mut value = 0;
        b.iter(|| {
            value += 1;
            queue
                .exec(&spin, &[], &[Scalar::U64(SPIN_CYCLES)], one)
                .signal(&signal, value)
                .submit()
                .expect("submit");
            signal.wait(value, Timeout::Forever).expect("ran");
        });
    });

    group.bench_function("cudarc_spinning", |b| {
        let context = device.context();
        let stream = context.new_stream().expect("stream");
        let function = context
            .load_module(cudarc::nvrtc::compile_ptx(TESTS).expect("compile"))
            .expect("module")
            .load_function("spin")
            .expect("function");
        let event = context
            .new_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))
            .expect("event");
        b.iter(|| {
            let mut launch = stream.launch_builder(&function);
            launch.arg(&SPIN_CYCLES);
            // SAFETY: `spin` takes one `unsigned long long` and touches no
            // memory.
            unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.expect("launch");
            event.record(&stream).expect("record");
            event.synchronize().expect("synchronize");
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    cuda_launch,
    cuda_signal,
    cuda_alloc,
    cuda_signal_wait
);
criterion_main!(benches);
