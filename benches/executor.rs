//! A replayed executor plan against the same work recorded by hand.
//!
//! | group | `hwqueue` | baseline |
//! |-------|-----------|----------|
//! | `executor_replay` | `Plan::run` + `Run::wait` of a 4-operation schedule over a copy and a compute queue | `manual`: the same commands, waits and signals recorded by hand on two `CpuQueue`s |
//! | `rebind_run` | `rebound`: `Plan::bind` of the input slot to the other of two buffers, then `run` + `wait` | `unchanged`: `run` + `wait` of the same plan, nothing rebound |
//!
//! The kernels are tiny, so this measures what the executor adds per run:
//! recording from the plan, one submit per queue, the host's wait.

mod support;

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{Device, ExecParams, HardwareQueue, QueueFactory, Schedule, TimelineSignal, Timeout};

use support::Profile;

/// `buf[i] += scalar 0` (u32), one work-group.
fn add_scalar(_: &WorkGroup, args: &KernelArgs<'_>) {
    let value: u32 = args.scalar(0);
    let view = args.buffer(0);
    // SAFETY: one work-group touches the buffer.
    for x in unsafe { view.slice_mut::<u32>(0..view.len::<u32>()) } {
        *x = x.wrapping_add(value);
    }
}

/// `dst[i] = 3 * dst[i] + src[i]` (u32), one work-group.
fn mix(_: &WorkGroup, args: &KernelArgs<'_>) {
    let (src, dst) = (args.buffer(0), args.buffer(1));
    // SAFETY: one work-group; `src` is only read, `dst` only written here.
    unsafe {
        let src = src.as_slice::<u32>();
        for (d, s) in dst
            .slice_mut::<u32>(0..dst.len::<u32>())
            .iter_mut()
            .zip(src)
        {
            *d = d.wrapping_mul(3).wrapping_add(*s);
        }
    }
}

const BYTES: usize = 256;

fn executor_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("executor_replay");
    support::configure(&mut group, Profile::Latency);
    let device = Arc::new(CpuDevice::new());
    let add = CpuProgram::from_fn("add_scalar", 1, 1, add_scalar);
    let mixp = CpuProgram::from_fn("mix", 2, 0, mix);
    let one = ExecParams::new_1d(1, 1);
    let [staging, x, y, out] = [0; 4].map(|_| device.alloc(BYTES).expect("alloc"));

    group.bench_function("hwqueue", |b| {
        let mut schedule = Schedule::<Cpu>::new();
        let d = schedule.add_device(device.clone());
        let [bs, bx, by, bo] = [("staging", &staging), ("x", &x), ("y", &y), ("out", &out)]
            .map(|(name, buffer)| schedule.add_buffer(d, name, buffer.clone()));
        schedule.copy("upload", bx, bs);
        schedule.exec("x += 5", d, &add, &[bx], &[5u32.into()], one);
        schedule
            .exec("y = 3y + x", d, &mixp, &[bx, by], &[], one)
            .reads(bx, ..)
            .reads(by, ..)
            .writes(by, ..);
        schedule.copy("download", bo, by);
        let mut plan = schedule.plan().expect("plan");
        b.iter(|| {
            plan.run()
                .expect("run")
                .wait(Timeout::Forever)
                .expect("ran")
        });
    });

    group.bench_function("manual", |b| {
        let mut copy = device.copy_queue().expect("queue").expect("a copy queue");
        let mut compute = device.compute_queue().expect("queue");
        let copied = device.new_signal(0).expect("signal");
        let computed = device.new_signal(0).expect("signal");
        let mut run = 0u64;
        b.iter(|| {
            run += 1;
            copy.copy(&x, &staging).signal(&copied, 2 * run - 1);
            compute
                .wait(&copied, 2 * run - 1)
                .exec(&add, &[&x], &[5u32.into()], one)
                .exec(&mixp, &[&x, &y], &[], one)
                .signal(&computed, run);
            copy.wait(&computed, run)
                .copy(&out, &y)
                .signal(&copied, 2 * run);
            copy.submit().expect("submit");
            compute.submit().expect("submit");
            copied.wait(2 * run, Timeout::Forever).expect("ran");
        });
    });
    group.finish();
}

/// A plan over an input slot, a tensor and an output slot: binding must
/// not re-plan or re-record more than the commands that name the slot.
fn rebind_run(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebind_run");
    support::configure(&mut group, Profile::Latency);
    let device = Arc::new(CpuDevice::new());
    let add = CpuProgram::from_fn("add_scalar", 1, 1, add_scalar);
    let mixp = CpuProgram::from_fn("mix", 2, 0, mix);
    let one = ExecParams::new_1d(1, 1);
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let input = schedule.add_slot(d, "in", BYTES);
    let output = schedule.add_slot(d, "out", BYTES);
    let t = schedule.add_tensor(d, "t", BYTES);
    schedule.copy("stage", t, input);
    schedule.exec("t += 5", d, &add, &[t], &[5u32.into()], one);
    schedule
        .exec("out = 3 out + t", d, &mixp, &[t, output], &[], one)
        .reads(t, ..)
        .reads(output, ..)
        .writes(output, ..);
    let mut plan = schedule.plan().expect("plan");
    let inputs = [0; 2].map(|_| device.alloc(BYTES).expect("alloc"));
    let out = device.alloc(BYTES).expect("alloc");
    plan.bind(input, &inputs[0]).expect("bind");
    plan.bind(output, &out).expect("bind");

    group.bench_function("unchanged", |b| {
        b.iter(|| {
            plan.run()
                .expect("run")
                .wait(Timeout::Forever)
                .expect("ran")
        });
    });
    let mut turn = 0;
    group.bench_function("rebound", |b| {
        b.iter(|| {
            turn ^= 1;
            plan.bind(input, &inputs[turn]).expect("bind");
            plan.run()
                .expect("run")
                .wait(Timeout::Forever)
                .expect("ran")
        });
    });
    group.finish();
}

criterion_group!(benches, executor_replay, rebind_run);
criterion_main!(benches);
