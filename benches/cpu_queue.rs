//! `CpuQueue` against the plain-Rust ways of doing the same work.
//!
//! | group | `hwqueue` | baseline |
//! |-------|-----------|----------|
//! | `queue_roundtrip` | submit one `signal`, the host waits for it | `crossbeam_channel`: a message to a worker thread over a crossbeam channel, and its reply; `rayon_spawn`: `rayon::spawn` of a task that replies over one; `channel`: the same over `std::sync::mpsc` |
//! | `queue_throughput` | 1,000 one-work-group `exec`s in one batch, submitted and waited for | `crossbeam_worker`: 1,000 `Box<dyn FnOnce>` jobs sent to a worker thread over a crossbeam channel, and waited for; `boxed_closures`: the same over `std::sync::mpsc` |
//! | `exec_bandwidth` | one `exec` of `c = a + b` over 16 Mi `f32` | `scoped_threads`: the same loop split over the cores with `std::thread::scope` |
//! | `copy_bandwidth` | one `copy` of a 64 MiB buffer | `copy_from_slice` on the calling thread |
//! | `exec_launch_wide` | 200 `exec`s of a 64-work-group kernel (each group adds 1 to 64 floats) in one batch, submitted and waited for | `rayon`: 200 `par_chunks_mut(64)` passes over the same floats |
//! | `exec_matmul` | a 256×256×256 `f32` matmul, one work-group per row of the result | `rayon`: `par_chunks_mut` by rows |
//! | `exec_matmul_16_rows` | the same, 16 work-groups of 16 rows | `rayon`: `par_chunks_mut` by 16 rows |
//! | `fill_bandwidth` | one `fill` of a 64 MiB buffer with a `u32` pattern | `slice_fill`: `slice::fill` of a 64 MiB `Vec<u32>` on the calling thread |
//! | `transfer_roundtrip` | `upload_vec` of 64 MiB into a buffer, then `download` of it, in one batch, and `take` of the data | `copy_from_slice`: two 64 MiB `copy_from_slice`s, into a `Vec` and back |
//! | `exec_views` | `views`: `queue_throughput`'s 1,000 one-group `exec`s, each on two views (`exec_views`) | `whole`: the same on the two whole buffers (`exec`) |
//! | `profile_overhead` | `on`: `queue_throughput`'s 1,000 one-group `exec`s with profiling on, the events taken each iteration | `off`: the same with profiling off |
//!
//! The queue cases include the hand-off to the queue's worker thread and the
//! host's wait for the final signal, as a user would see them; the baselines
//! include their own hand-off and wait. Both sides of the rayon groups call
//! the same `#[inline(never)]` loop bodies on the same number of threads
//! (the device's default, rayon's global pool: one per core).

mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hwqueue::cpu::{CpuDevice, CpuProgram, CpuQueue, CpuSignal, KernelArgs, WorkGroup};
use hwqueue::{
    Buffer, Device, Download, ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout,
    View,
};
use rayon::prelude::*;

use support::Profile;

/// Jobs per `queue_throughput` iteration.
const JOBS: usize = 1_000;
/// Elements of each `exec_bandwidth` vector: 16 Mi `f32`, 64 MiB.
const ADD_LEN: usize = 16 << 20;
/// Work-items per work-group of `exec_bandwidth`.
const ADD_LOCAL: u32 = 1024;
/// Bytes of each `copy_bandwidth` buffer.
const COPY_BYTES: usize = 64 << 20;
/// `exec`s per `exec_launch_wide` iteration.
const LAUNCHES: usize = 200;
/// Work-groups per `exec_launch_wide` launch, and floats per group.
const WIDE_GROUPS: usize = 64;
const WIDE_LOCAL: usize = 64;
/// The side of the `exec_matmul` matrices.
const N: usize = 256;

/// Submits what `record` recorded plus a signal, and waits for the signal.
fn submit_and_wait(queue: &mut CpuQueue, done: &CpuSignal, value: u64) {
    queue.signal(done, value).submit().expect("submit");
    done.wait(value, Timeout::Forever).expect("the batch ran");
}

/// The round-trip baselines: a request to a worker thread over a channel
/// made by `$channel` (`mpsc::channel` or `crossbeam_channel::unbounded`,
/// which share the API), and its reply, per iteration.
macro_rules! channel_roundtrip {
    ($b:expr, $channel:path) => {{
        let (request, requests) = $channel();
        let (reply, replies) = $channel();
        let worker = std::thread::spawn(move || {
            for value in requests {
                reply.send(value).expect("the host is listening");
            }
        });
        let mut value: u64 = 0;
        $b.iter(|| {
            value += 1;
            request.send(value).expect("the worker is running");
            replies.recv().expect("the worker replies")
        });
        drop(request);
        worker.join().expect("the worker exits");
    }};
}

/// The throughput baselines: `JOBS` boxed closures sent to one worker
/// thread over a channel made by `$channel`, then one that replies over
/// another, per iteration.
macro_rules! channel_jobs {
    ($b:expr, $channel:path) => {{
        let (submit, jobs) = $channel();
        let worker = std::thread::spawn(move || {
            for job in jobs {
                let job: Job = job;
                job();
            }
        });
        let count = Arc::new(AtomicU32::new(0));
        let (finished, finish) = $channel();
        $b.iter(|| {
            for _ in 0..JOBS {
                let count = count.clone();
                let job: Job = Box::new(move || {
                    // Not a read-modify-write: one thread runs the jobs, as
                    // one work-group runs each `bump`.
                    count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                });
                submit.send(job).expect("the worker is running");
            }
            let finished = finished.clone();
            let last: Job = Box::new(move || finished.send(()).expect("the host is listening"));
            submit.send(last).expect("the worker is running");
            finish.recv().expect("the worker ran the jobs");
        });
        drop(submit);
        worker.join().expect("the worker exits");
        black_box(count.load(Ordering::Relaxed));
    }};
}

fn queue_roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue_roundtrip");
    support::configure(&mut group, Profile::Latency);

    group.bench_function("hwqueue", |b| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let mut value = 0;
        b.iter(|| {
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    // The same request/reply over crossbeam's channels, which spin briefly
    // before they park (its `Backoff`).
    group.bench_function("crossbeam_channel", |b| {
        channel_roundtrip!(b, crossbeam_channel::unbounded)
    });

    // A task on rayon's pool, and its reply over a crossbeam channel: rayon's
    // workers spin before they sleep.
    group.bench_function("rayon_spawn", |b| {
        let (reply, replies) = crossbeam_channel::unbounded::<u64>();
        let mut value = 0;
        b.iter(|| {
            value += 1;
            let reply = reply.clone();
            rayon::spawn(move || reply.send(value).expect("the host is listening"));
            replies.recv().expect("the task replies")
        });
    });

    group.bench_function("channel", |b| channel_roundtrip!(b, mpsc::channel));

    group.finish();
}

/// One work-group adds 1 to `buf[0]`: the smallest kernel that still
/// touches memory.
fn bump(_group: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: one work-group per exec: nothing else touches the buffer.
    let count = unsafe { args.buffer(0).slice_mut::<u32>(0..1) };
    count[0] = count[0].wrapping_add(1);
}

/// `JOBS` one-group `bump` execs in one batch, submitted and waited for;
/// with `profiling`, the queue times each and the events are taken every
/// iteration.
fn bump_jobs(b: &mut criterion::Bencher<'_>, profiling: bool) {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().expect("queue");
    queue.set_profiling(profiling);
    let done = device.new_signal(0).expect("signal");
    let count = device.alloc(64).expect("buffer");
    let program = CpuProgram::from_fn("bump", 1, 0, bump);
    let params = ExecParams::new_1d(1, 1);
    let mut value = 0;
    b.iter(|| {
        for _ in 0..JOBS {
            queue.exec(&program, &[&count], &[], params);
        }
        value += 1;
        submit_and_wait(&mut queue, &done, value);
        black_box(queue.take_profile());
    });
}

type Job = Box<dyn FnOnce() + Send>;

fn queue_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue_throughput");
    support::configure(&mut group, Profile::Latency);
    group.throughput(Throughput::Elements(JOBS as u64));

    group.bench_function("hwqueue", |b| bump_jobs(b, false));

    // The same jobs over a crossbeam channel to one worker thread.
    group.bench_function("crossbeam_worker", |b| {
        channel_jobs!(b, crossbeam_channel::unbounded)
    });

    group.bench_function("boxed_closures", |b| channel_jobs!(b, mpsc::channel));

    group.finish();
}

/// `c[i] = a[i] + b[i]` over the group's range.
fn add(group: &WorkGroup, args: &KernelArgs<'_>) {
    let range = group.global_range(0);
    // SAFETY: a and b are only read; each work-group writes only its range of c.
    let (a, b, c) = unsafe {
        (
            &args.buffer(0).as_slice::<f32>()[range.clone()],
            &args.buffer(1).as_slice::<f32>()[range.clone()],
            args.buffer(2).slice_mut::<f32>(range),
        )
    };
    add_slices(a, b, c);
}

/// The loop both `exec_bandwidth` cases run.
#[inline]
fn add_slices(a: &[f32], b: &[f32], c: &mut [f32]) {
    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
        *c = a + b;
    }
}

fn inputs() -> (Vec<f32>, Vec<f32>) {
    let a = (0..ADD_LEN).map(|i| (i % 1000) as f32).collect();
    let b = (0..ADD_LEN).map(|i| (i % 7) as f32).collect();
    (a, b)
}

fn exec_bandwidth(c: &mut Criterion) {
    let mut group = c.benchmark_group("exec_bandwidth");
    support::configure(&mut group, Profile::Bandwidth);
    // Read a and b, write c.
    group.throughput(Throughput::Bytes(3 * (ADD_LEN * size_of::<f32>()) as u64));

    group.bench_function("hwqueue", |bencher| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let (a_host, b_host) = inputs();
        let [a, b, c] = [(); 3].map(|_| device.alloc(ADD_LEN * 4).expect("buffer"));
        a.write_from(&a_host).expect("write");
        b.write_from(&b_host).expect("write");
        c.write_from(&a_host).expect("write");
        let program = CpuProgram::from_fn("add", 3, 0, add);
        let params = ExecParams::new_1d(ADD_LEN as u32, ADD_LOCAL);
        let mut value = 0;
        bencher.iter(|| {
            queue.exec(&program, &[&a, &b, &c], &[], params);
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("scoped_threads", |bencher| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (a, b) = inputs();
        let mut c = a.clone();
        let part = ADD_LEN.div_ceil(threads);
        bencher.iter(|| {
            std::thread::scope(|scope| {
                let mut parts = c
                    .chunks_mut(part)
                    .zip(a.chunks(part))
                    .zip(b.chunks(part))
                    .map(|((c, a), b)| (a, b, c));
                let mine = parts.next();
                for (a, b, c) in parts {
                    scope.spawn(move || add_slices(a, b, c));
                }
                if let Some((a, b, c)) = mine {
                    add_slices(a, b, c);
                }
            });
            black_box(&mut c);
        });
    });

    group.finish();
}

fn copy_bandwidth(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy_bandwidth");
    support::configure(&mut group, Profile::Bandwidth);
    group.throughput(Throughput::Bytes(COPY_BYTES as u64));

    // Both sources are written first: a never-written zeroed allocation
    // reads from the kernel's shared zero page, which no real buffer does.
    let source: Vec<u8> = (0..COPY_BYTES).map(|i| i as u8).collect();

    group.bench_function("hwqueue", |b| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let src = device.alloc(COPY_BYTES).expect("buffer");
        let dst = device.alloc(COPY_BYTES).expect("buffer");
        src.write_from(&source).expect("write");
        dst.write_from(&source).expect("write");
        let mut value = 0;
        b.iter(|| {
            queue.copy(&dst, &src);
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("copy_from_slice", |b| {
        let src = source.clone();
        let mut dst = source.clone();
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        });
    });

    group.finish();
}

/// Adds 1 to each float: the body of one `exec_launch_wide` work-group.
#[inline(never)]
fn bump_floats(values: &mut [f32]) {
    for value in values {
        *value += 1.0;
    }
}

fn bump_group(group: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: each work-group writes only its own range.
    bump_floats(unsafe { args.buffer(0).slice_mut::<f32>(group.global_range(0)) });
}

fn exec_launch_wide(c: &mut Criterion) {
    let mut group = c.benchmark_group("exec_launch_wide");
    support::configure(&mut group, Profile::Latency);
    group.throughput(Throughput::Elements(LAUNCHES as u64));
    let len = WIDE_GROUPS * WIDE_LOCAL;

    group.bench_function("hwqueue", |b| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let values = device.alloc(len * 4).expect("buffer");
        let program = CpuProgram::from_fn("bump_floats", 1, 0, bump_group);
        let params = ExecParams::new_1d(len as u32, WIDE_LOCAL as u32);
        let mut value = 0;
        b.iter(|| {
            for _ in 0..LAUNCHES {
                queue.exec(&program, &[&values], &[], params);
            }
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("rayon", |b| {
        let mut values = vec![0f32; len];
        b.iter(|| {
            for _ in 0..LAUNCHES {
                values.par_chunks_mut(WIDE_LOCAL).for_each(bump_floats);
            }
            black_box(&mut values);
        });
    });

    group.finish();
}

/// Rows `first..first + c.len() / N` of `c = a * b` (`N`×`N`, row-major):
/// the body of one `exec_matmul` work-group.
#[inline(never)]
fn matmul_rows(a: &[f32], b: &[f32], c: &mut [f32], first: usize) {
    for (row, c_row) in c.chunks_exact_mut(N).enumerate() {
        c_row.fill(0.0);
        let a_row = &a[(first + row) * N..][..N];
        for (k, &a_ik) in a_row.iter().enumerate() {
            for (c, &b_kj) in c_row.iter_mut().zip(&b[k * N..][..N]) {
                *c += a_ik * b_kj;
            }
        }
    }
}

fn matmul_group(group: &WorkGroup, args: &KernelArgs<'_>) {
    // One work-item per row: the group's range is its rows.
    let rows = group.global_range(0);
    // SAFETY: a and b are only read; each work-group writes only its rows of c.
    let (a, b, c) = unsafe {
        (
            args.buffer(0).as_slice::<f32>(),
            args.buffer(1).as_slice::<f32>(),
            args.buffer(2)
                .slice_mut::<f32>(rows.start * N..rows.end * N),
        )
    };
    matmul_rows(a, b, c, rows.start);
}

fn matrices() -> (Vec<f32>, Vec<f32>) {
    let a = (0..N * N).map(|i| (i % 13) as f32 * 0.5).collect();
    let b = (0..N * N).map(|i| (i % 7) as f32 - 3.0).collect();
    (a, b)
}

/// One matmul group: `rows` rows of the result per work-group.
fn matmul_bench(c: &mut Criterion, name: &str, rows: usize) {
    let mut group = c.benchmark_group(name);
    support::configure(&mut group, Profile::Bandwidth);
    group.throughput(Throughput::Elements((2 * N * N * N) as u64));
    let (a_host, b_host) = matrices();

    group.bench_function("hwqueue", |bencher| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let [a, b, c] = [(); 3].map(|_| device.alloc(N * N * 4).expect("buffer"));
        a.write_from(&a_host).expect("write");
        b.write_from(&b_host).expect("write");
        let program = CpuProgram::from_fn("matmul_rows", 3, 0, matmul_group);
        let params = ExecParams::new_1d(N as u32, rows as u32);
        let mut value = 0;
        bencher.iter(|| {
            queue.exec(&program, &[&a, &b, &c], &[], params);
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("rayon", |bencher| {
        let mut c = vec![0f32; N * N];
        bencher.iter(|| {
            c.par_chunks_mut(rows * N)
                .enumerate()
                .for_each(|(index, c)| matmul_rows(&a_host, &b_host, c, index * rows));
            black_box(&mut c);
        });
    });

    group.finish();
}

fn exec_matmul(c: &mut Criterion) {
    matmul_bench(c, "exec_matmul", 1);
}

fn exec_matmul_16_rows(c: &mut Criterion) {
    matmul_bench(c, "exec_matmul_16_rows", 16);
}

fn profile_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("profile_overhead");
    support::configure(&mut group, Profile::Latency);
    group.throughput(Throughput::Elements(JOBS as u64));
    for (name, on) in [("off", false), ("on", true)] {
        group.bench_function(name, |b| bump_jobs(b, on));
    }
    group.finish();
}

fn fill_bandwidth(c: &mut Criterion) {
    let mut group = c.benchmark_group("fill_bandwidth");
    support::configure(&mut group, Profile::Bandwidth);
    group.throughput(Throughput::Bytes(COPY_BYTES as u64));

    group.bench_function("hwqueue", |b| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let buffer = device.alloc(COPY_BYTES).expect("buffer");
        buffer.write_from(&vec![1u8; COPY_BYTES]).expect("write");
        let mut value = 0;
        b.iter(|| {
            queue.fill(&buffer, black_box(value as u32));
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("slice_fill", |b| {
        let mut data = vec![1u32; COPY_BYTES / 4];
        let mut value = 0u32;
        b.iter(|| {
            data.fill(black_box(value));
            value += 1;
            black_box(&mut data);
        });
    });

    group.finish();
}

fn transfer_roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("transfer_roundtrip");
    support::configure(&mut group, Profile::Bandwidth);
    // Up and down.
    group.throughput(Throughput::Bytes(2 * COPY_BYTES as u64));
    let source: Vec<u32> = (0..COPY_BYTES as u32 / 4).collect();

    group.bench_function("hwqueue", |b| {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().expect("queue");
        let buffer = device.alloc(COPY_BYTES).expect("buffer");
        buffer.write_from(&source).expect("write");
        // The input is shared with the queue (`Arc<[u32]>`), and the
        // download lands in the memory the last one returned: each iteration
        // moves 64 MiB each way and allocates nothing.
        let input: std::sync::Arc<[u32]> = source.clone().into();
        let mut landing = source.clone();
        b.iter(|| {
            let download = Download::from_vec(std::mem::take(&mut landing));
            queue
                .upload_vec(&buffer, input.clone())
                .download(&buffer, &download)
                .submit()
                .expect("submit");
            landing = download.take(Timeout::Forever).expect("the batch ran");
            black_box(&landing);
        });
    });

    group.bench_function("copy_from_slice", |b| {
        let mut host = source.clone();
        let mut device_side = source.clone();
        b.iter(|| {
            device_side.copy_from_slice(black_box(&host));
            host.copy_from_slice(black_box(&device_side));
            black_box(&mut host);
        });
    });

    group.finish();
}

fn exec_views(c: &mut Criterion) {
    let mut group = c.benchmark_group("exec_views");
    support::configure(&mut group, Profile::Latency);
    group.throughput(Throughput::Elements(JOBS as u64));
    let device = CpuDevice::new();
    let [a, b] = [(); 2].map(|_| device.alloc(1024).expect("buffer"));
    let program = CpuProgram::from_fn("touch", 2, 0, touch);
    let params = ExecParams::new_1d(1, 1);

    group.bench_function("views", |bencher| {
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let (a, b) = (View::whole(&a), View::whole(&b));
        let mut value = 0;
        bencher.iter(|| {
            for _ in 0..JOBS {
                queue.exec_views(&program, &[&a, &b], &[], params);
            }
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.bench_function("whole", |bencher| {
        let mut queue = device.compute_queue().expect("queue");
        let done = device.new_signal(0).expect("signal");
        let mut value = 0;
        bencher.iter(|| {
            for _ in 0..JOBS {
                queue.exec(&program, &[&a, &b], &[], params);
            }
            value += 1;
            submit_and_wait(&mut queue, &done, value);
        });
    });

    group.finish();
}

/// `b[0] = a[0] + 1` (u32): one group, a few instructions.
fn touch(_group: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: one work-group; distinct buffers.
    unsafe {
        let value = args.buffer(0).as_slice::<u32>()[0];
        args.buffer(1).slice_mut::<u32>(0..1)[0] = value.wrapping_add(1);
    }
}

criterion_group!(
    benches,
    queue_roundtrip,
    queue_throughput,
    exec_bandwidth,
    copy_bandwidth,
    exec_launch_wide,
    exec_matmul,
    exec_matmul_16_rows,
    profile_overhead,
    fill_bandwidth,
    transfer_roundtrip,
    exec_views
);
criterion_main!(benches);
