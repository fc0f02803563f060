//! The CUDA backend against raw cudarc, on the same work.
//!
//! | group | `hwqueue` | `cudarc` (baseline) |
//! |-------|-----------|---------------------|
//! | `cuda_launch` | 1,000 `exec`s of an empty kernel on a `CudaQueue`, then a signal waited for | 1,000 `launch_builder(..).launch(..)` on a cudarc stream, then `synchronize` |
//! | `cuda_signal` | `signal(s, v)` + `submit`, then polling `is_reached(v)` until true | `CudaEvent::record` on the stream, then polling `try_is_complete` until true |
//! | `cuda_alloc` | `alloc_uninit(1 MiB)` and drop: the caching pool | `cuMemAlloc_v2` + `cuMemFree_v2` of 1 MiB |
//! | `cuda_signal_wait` | a 20 µs `spin` kernel + `signal` + `submit`, then `wait(v, Forever)` (the device's `WaitPolicy`, by default a spin of 20–200 µs before sleeping on its `CU_EVENT_BLOCKING_SYNC` event) | the same launch, an event with timing off recorded, then `synchronize` (the host thread spins) |
//! | `cuda_roundtrip` | one empty kernel: `exec` + `signal` + `submit`, then `wait(v, Forever)`, under each `WaitPolicy` (`hwqueue_adaptive`, `hwqueue_spin`, `hwqueue_sleep`) | the same launch through cudarc, an event with timing off recorded, then `synchronize` (the driver spins) |
//! | `plan_replay_cuda` | `Plan::run` + wait of a chain of 64 `x[i] += 1` kernels over 256 words, replayed as a CUDA graph (`hwqueue`), and with replay off (`hwqueue_rerecorded`); `hwqueue_enqueue` times `Plan::run` alone | the same chain captured once through cudarc's `begin_capture`/`end_capture`, event tracking off, then `launch` + `synchronize` (`cudarc_graph`); `cudarc_graph_enqueue` times `launch` alone |
//!
//! Built only with `--features cuda` (`required-features`); without a CUDA
//! driver and device it prints `skipped: no CUDA driver` and measures nothing.
//!
//! **Instruction counts** (`benches/callgrind.sh`, `BENCH=cuda`), which
//! need no GPU: with `HWQUEUE_CUDA_COUNT=CASE` and `HWQUEUE_CUDA_ITERS=N`
//! the binary runs only CASE, N times, without criterion, inside
//! `support::repeat` (the function callgrind collects in), on whatever
//! `libcuda` it loads (the script puts the fake driver,
//! `tests/fake_cuda/libcuda.c`, first). Cases: `plan_replay` and
//! `plan_plain`, one `Plan::run` + wait of the 64-kernel chain each, with
//! replay on and off; the kernel is loaded from PTX (its body is `ret`),
//! so no NVRTC is needed.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use hwqueue::cuda::{Cuda, CudaBuffer, CudaDevice, CudaProgram};
use hwqueue::{
    Backend, Device, ExecParams, HardwareQueue, Plan, QueueFactory, Scalar, Schedule,
    TimelineSignal, Timeout, WaitPolicy,
};
use hwqueue_testkit::cuda_kernels::{EMPTY, TESTS, test_signature};

use support::Profile;

const LAUNCHES: usize = 1_000;

fn cuda_launch(c: &mut Criterion) {
    let Some(device) = support::cuda_device() else {
        return;
    };
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
    let Some(device) = support::cuda_device() else {
        return;
    };
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
    let Some(device) = support::cuda_device() else {
        return;
    };
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
/// events are `CU_EVENT_BLOCKING_SYNC`, and `wait(Forever)` polls the event
/// for the device's adaptive spin budget before it sleeps in the driver
/// (`WaitPolicy::Adaptive`); the baseline is a cudarc event with timing
/// off only, whose `synchronize` spins a core. Before the spin (issue 47)
/// the ratio was the wake-up cost of sleeping (2.51 on an H200).
fn cuda_signal_wait(c: &mut Criterion) {
    let Some(device) = support::cuda_device() else {
        return;
    };
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

/// Issue 47's round trip: one empty kernel, `exec` + `signal` + `submit`,
/// then `wait(v, Forever)` on the host, under each [`WaitPolicy`] of the
/// device (`hwqueue_adaptive`, the default; `hwqueue_spin`;
/// `hwqueue_sleep`, the old behaviour: asleep in `cuEventSynchronize` on a
/// blocking-sync event). The baseline launches the kernel through cudarc,
/// records an event with timing off and `synchronize`s it (the driver
/// spins). Measured on an H200 before the policy: 27.3 µs (sleeping)
/// against 8.8 µs; with it (driver 580.159.04, criterion medians):
/// adaptive 11.4 µs, spin 10.6 µs, sleep 43.3 µs, cudarc 8.36 µs.
fn cuda_roundtrip(c: &mut Criterion) {
    let Some(device) = support::cuda_device() else {
        return;
    };
    let mut group = c.benchmark_group("cuda_roundtrip");
    support::configure(&mut group, Profile::Latency);
    let empty = CudaProgram::from_cuda_c(&device, EMPTY, "empty", 0, 0).expect("compile");
    let one = ExecParams::new_1d(1, 1);
    let policies = [
        ("hwqueue_adaptive", WaitPolicy::Adaptive),
        ("hwqueue_spin", WaitPolicy::Spin),
        ("hwqueue_sleep", WaitPolicy::Sleep),
    ];
    for (name, policy) in policies {
        group.bench_function(name, |b| {
            device.set_wait_policy(policy);
            let mut queue = device.compute_queue().expect("queue");
            let signal = device.new_signal(0).expect("signal");
            let mut value = 0;
            b.iter(|| {
                value += 1;
                queue
                    .exec(&empty, &[], &[], one)
                    .signal(&signal, value)
                    .submit()
                    .expect("submit");
                signal.wait(value, Timeout::Forever).expect("ran");
            });
        });
    }
    device.set_wait_policy(WaitPolicy::default());

    group.bench_function("cudarc_spinning", |b| {
        let context = device.context();
        let stream = context.new_stream().expect("stream");
        let function = context
            .load_module(cudarc::nvrtc::compile_ptx(EMPTY).expect("compile"))
            .expect("module")
            .load_function("empty")
            .expect("function");
        let event = context
            .new_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))
            .expect("event");
        b.iter(|| {
            let mut launch = stream.launch_builder(&function);
            // SAFETY: `empty` takes no parameters and touches no memory.
            unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.expect("launch");
            event.record(&stream).expect("record");
            event.synchronize().expect("synchronize");
        });
    });
    group.finish();
}

/// Kernels in the replayed chain, and the words each runs over (one
/// block).
const CHAIN: usize = 64;
const CHAIN_WORDS: u32 = 256;

/// `x[i] += n`.
const ADD: &str = r#"
extern "C" __global__ void add(unsigned int *x, unsigned int n) {
    x[threadIdx.x] += n;
}
"#;

/// `add`'s `.entry` in PTX with an empty body, as NVRTC declares it: what
/// the instruction counts load on the fake driver, which runs no kernel.
const ADD_PTX: &str = "
.version 7.8
.target sm_70
.address_size 64

.visible .entry add(
\t.param .u64 add_param_0,
\t.param .u32 add_param_1
)
{
\tret;
}
";

/// A plan of [`CHAIN`] launches of `add(x, 1)`, replaying or not.
fn chain(device: &Arc<CudaDevice>, add: &CudaProgram, x: &CudaBuffer, replay: bool) -> Plan<Cuda> {
    let mut schedule = Schedule::<Cuda>::new();
    let d = schedule.add_device(device.clone());
    let x = schedule.add_buffer(d, "x", x.clone());
    for k in 0..CHAIN {
        let grid = ExecParams::new_1d(CHAIN_WORDS, CHAIN_WORDS);
        schedule.exec(format!("add {k}"), d, add, &[x], &[Scalar::U32(1)], grid);
    }
    let mut plan = schedule.plan().expect("plan");
    plan.set_replay(replay);
    plan
}

/// One run of `plan`, waited for.
fn run_once(plan: &mut Plan<Cuda>) {
    plan.run()
        .expect("run")
        .wait(Timeout::Forever)
        .expect("ran");
}

/// Issue 45: a plan of 64 small kernels against the same chain as a CUDA
/// graph captured through cudarc (the issue's table: 456 µs against
/// 73.9 µs on an H200 before replay).
fn plan_replay_cuda(c: &mut Criterion) {
    let Some(device) = support::cuda_device() else {
        return;
    };
    let device = Arc::new(device);
    let mut group = c.benchmark_group("plan_replay_cuda");
    support::configure(&mut group, Profile::Latency);
    let add = CudaProgram::from_cuda_c(&device, ADD, "add", 1, 1).expect("compile");
    let x = device.alloc((CHAIN_WORDS * 4) as usize).expect("x");

    for (name, replay) in [("hwqueue", true), ("hwqueue_rerecorded", false)] {
        group.bench_function(name, |b| {
            let mut plan = chain(&device, &add, &x, replay);
            b.iter(|| run_once(&mut plan));
        });
    }
    // The host's cost of a run: `Plan::run` alone, the wait untimed.
    group.bench_function("hwqueue_enqueue", |b| {
        let mut plan = chain(&device, &add, &x, true);
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let run = plan.run().expect("run");
                spent += start.elapsed();
                run.wait(Timeout::Forever).expect("ran");
            }
            spent
        });
    });

    let context = device.context();
    let stream = context.new_stream().expect("stream");
    let function = context
        .load_module(cudarc::nvrtc::compile_ptx(ADD).expect("compile"))
        .expect("module")
        .load_function("add")
        .expect("function");
    // As a runtime that orders its own streams runs cudarc. Turned back on
    // below: the context is the device's, which hwqueue shares.
    // SAFETY: the captured launches take a raw device pointer, no cudarc
    // slice whose events would need tracking.
    unsafe { context.disable_event_tracking() };
    stream
        .begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .expect("capture");
    let pointer = x.device_pointer();
    let config = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (CHAIN_WORDS, 1, 1),
        shared_mem_bytes: 0,
    };
    for _ in 0..CHAIN {
        let mut launch = stream.launch_builder(&function);
        launch.arg(&pointer).arg(&1u32);
        // SAFETY: `add` takes a pointer to 256 words, which `x` holds and
        // outlives the graph, and a `u32`.
        unsafe { launch.launch(config) }.expect("launch");
    }
    let graph = stream
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .expect("end capture")
        .expect("a graph");
    group.bench_function("cudarc_graph", |b| {
        b.iter(|| {
            graph.launch().expect("launch");
            stream.synchronize().expect("synchronize");
        });
    });
    group.bench_function("cudarc_graph_enqueue", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                graph.launch().expect("launch");
                spent += start.elapsed();
                stream.synchronize().expect("synchronize");
            }
            spent
        });
    });
    drop(graph);
    // SAFETY: as above; nothing of cudarc's is in flight.
    unsafe { context.enable_event_tracking() };
    group.finish();
}

/// `HWQUEUE_CUDA_COUNT=CASE`: runs only that case, `HWQUEUE_CUDA_ITERS`
/// times (default 100), without criterion (see the module docs).
fn count(case: &str) {
    let iters = support::count_iters("HWQUEUE_CUDA_ITERS", 100);
    let device = Arc::new(Cuda::open(0).expect("a CUDA device, or the fake driver"));
    let one = ExecParams::new_1d(1, 1);
    match case {
        "plan_replay" | "plan_plain" => {
            let add = CudaProgram::from_ptx(&device, ADD_PTX, "add", 1, 1).expect("PTX");
            let x = device.alloc((CHAIN_WORDS * 4) as usize).expect("x");
            let mut plan = chain(&device, &add, &x, case == "plan_replay");
            // The first runs build the graphs.
            run_once(&mut plan);
            run_once(&mut plan);
            support::repeat(iters, || run_once(&mut plan));
            eprintln!("{case}: {:?}", plan.launches());
        }
        // Issue 47: 1,000 `exec`s of an empty kernel and a `submit`, against
        // 1,000 of cudarc's launches; per `exec`, the count / 1,000.
        "exec_hwqueue" => {
            let empty = CudaProgram::from_ptx(&device, EMPTY_PTX, "empty", 0, 0).expect("PTX");
            let mut queue = device.compute_queue().expect("queue");
            let mut batch = || {
                for _ in 0..LAUNCHES {
                    queue.exec(&empty, &[], &[], one);
                }
                queue.submit().expect("submit");
            };
            batch();
            support::repeat(iters, batch);
            queue.synchronize().expect("ran");
        }
        "exec_cudarc" => {
            let context = device.context();
            // As a runtime that orders its own streams runs cudarc.
            // SAFETY: the launches take no cudarc slice.
            unsafe { context.disable_event_tracking() };
            let stream = context.new_stream().expect("stream");
            let function = context
                .load_module(cudarc::nvrtc::Ptx::from_src(EMPTY_PTX))
                .expect("module")
                .load_function("empty")
                .expect("function");
            let config = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            let batch = || {
                for _ in 0..LAUNCHES {
                    let mut launch = stream.launch_builder(&function);
                    // SAFETY: `empty` takes no parameters.
                    unsafe { launch.launch(config) }.expect("launch");
                }
            };
            batch();
            support::repeat(iters, batch);
            stream.synchronize().expect("ran");
        }
        // Issue 47: `signal` + `submit`, polled until reached, against one
        // event recorded through cudarc, polled until complete.
        "signal_hwqueue" => {
            let mut queue = device.compute_queue().expect("queue");
            let signal = device.new_signal(0).expect("signal");
            let mut value = 0;
            let mut once = || {
                value += 1;
                queue.signal(&signal, value).submit().expect("submit");
                while !signal.is_reached(value) {
                    std::hint::spin_loop();
                }
            };
            once();
            support::repeat(iters, once);
        }
        "signal_cudarc" => {
            let context = device.context();
            let stream = context.new_stream().expect("stream");
            let event = context
                .new_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                ))
                .expect("event");
            let once = || {
                event.record(&stream).expect("record");
                while !event.try_is_complete().expect("query") {
                    std::hint::spin_loop();
                }
            };
            once();
            support::repeat(iters, once);
        }
        other => panic!(
            "no case `{other}`: plan_replay, plan_plain, exec_hwqueue, exec_cudarc, \
             signal_hwqueue or signal_cudarc"
        ),
    }
}

/// `empty` in PTX, for the instruction counts on the fake driver.
const EMPTY_PTX: &str = "
.version 7.8
.target sm_70
.address_size 64

.visible .entry empty()
{
\tret;
}
";

criterion_group!(
    benches,
    cuda_launch,
    cuda_signal,
    cuda_alloc,
    cuda_signal_wait,
    plan_replay_cuda,
    cuda_roundtrip
);

fn main() {
    if let Ok(case) = std::env::var("HWQUEUE_CUDA_COUNT") {
        count(&case);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
