//! The executor: planner expectations, runs, failure, replays, staging.

#![cfg(not(loom))]

mod common;

use std::sync::Arc;

use common::mock::*;
use common::{LONG, fill_program, no_hang, quiet_injected_failures};
use hwqueue::cpu::CpuSignal;
use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{
    Backend, Buffer, Device, Error, ExecParams, HardwareQueue, Hazard, OpId, Plan, QueueFactory,
    QueueKind, Schedule, TimelineSignal,
};
use proptest::prelude::*;

/// `buf[i] += scalar 0` over the whole buffer (u32), one work-group.
fn add_scalar(_: &WorkGroup, args: &KernelArgs<'_>) {
    let value: u32 = args.scalar(0);
    let view = args.buffer(0);
    // SAFETY: one work-group.
    for x in unsafe { view.slice_mut::<u32>(0..view.len::<u32>()) } {
        *x = x.wrapping_add(value);
    }
}

/// `dst[i] = dst[i] * 3 + src[i]` (u32), one work-group; buffers distinct.
fn mix(_: &WorkGroup, args: &KernelArgs<'_>) {
    let (src, dst) = (args.buffer(0), args.buffer(1));
    // SAFETY: one work-group; src is only read, dst only by us.
    unsafe {
        let s = src.as_slice::<u32>();
        for (d, s) in dst.slice_mut::<u32>(0..dst.len::<u32>()).iter_mut().zip(s) {
            *d = d.wrapping_mul(3).wrapping_add(*s);
        }
    }
}

/// Panics when its flag buffer holds a non-zero value.
fn maybe_fail(_: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: one work-group, read only.
    if unsafe { args.buffer(0).as_slice::<u32>()[0] } != 0 {
        panic!("the flag is set");
    }
}

struct Setup {
    schedule: Schedule<Cpu>,
    device: hwqueue::DeviceId,
}

fn setup() -> Setup {
    let mut schedule = Schedule::<Cpu>::new();
    let device = schedule.add_device(Arc::new(CpuDevice::new()));
    Setup { schedule, device }
}

fn buffer(s: &mut Setup, name: &str, bytes: usize) -> hwqueue::BufferId {
    let b = CpuDevice::new().alloc(bytes).unwrap();
    s.schedule.add_buffer(s.device, name, b)
}

fn noop(_: &WorkGroup, _: &KernelArgs<'_>) {}

fn exec_program() -> CpuProgram {
    CpuProgram::from_fn("noop", 1, 0, noop)
}

/// An exec on the compute queue touching `buf` as declared.
fn touch(
    s: &mut Setup,
    name: &str,
    buf: hwqueue::BufferId,
    read: Option<std::ops::Range<usize>>,
    write: Option<std::ops::Range<usize>>,
) -> OpId {
    let program = exec_program();
    let mut op = s.schedule.exec(
        name,
        s.device,
        &program,
        &[buf],
        &[],
        ExecParams::new_1d(1, 1),
    );
    if let Some(r) = read {
        op = op.reads(buf, r);
    }
    if let Some(w) = write {
        op = op.writes(buf, w);
    }
    op.id()
}

/// A copy-queue op that touches `buf` through a copy into a scratch buffer
/// of the same size (so it lands on the other queue).
fn copy_touch(s: &mut Setup, name: &str, dst: hwqueue::BufferId, src: hwqueue::BufferId) -> OpId {
    s.schedule.copy(name, dst, src).on(QueueKind::Copy).id()
}

/// The waits within one run, as (awaited op, waiting op, hazard). The
/// text for people says the same as the typed hazard.
fn waits(plan: &Plan<Cpu>) -> Vec<(usize, usize, Hazard)> {
    plan.waits()
        .filter(|(_, w)| !w.previous_run)
        .map(|(op, w)| {
            let reason = plan.reason(op, w).to_string();
            assert!(reason.starts_with(&w.hazard.to_string()), "{reason}");
            (w.after.index(), op.index(), w.hazard)
        })
        .collect()
}

#[test]
fn read_after_write_across_queues_waits() {
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 64), buffer(&mut s, "staging", 64));
    copy_touch(&mut s, "upload", x, staging);
    touch(&mut s, "use", x, Some(0..64), None);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 1, Hazard::ReadAfterWrite)]);
    assert_eq!(plan.queue_labels(), ["cpu:0 copy", "cpu:0 compute"]);
}

/// An exec whose declarations name only some of its arguments still
/// reads and writes the others whole: on 9eae564 the undeclared argument
/// `w` got no hazard, so the kernel did not wait for the copy queue's
/// write of it (no wait at all), nor the copy after it for the kernel
/// (helper-78).
#[test]
fn an_argument_no_declaration_names_is_read_and_written_whole() {
    let mut s = setup();
    let (x, w, h) = (
        buffer(&mut s, "x", 64),
        buffer(&mut s, "w", 64),
        buffer(&mut s, "h", 64),
    );
    let staging = buffer(&mut s, "staging", 64);
    copy_touch(&mut s, "upload w", w, staging);
    let program = CpuProgram::from_fn("noop", 3, 0, noop);
    s.schedule
        .exec(
            "use",
            s.device,
            &program,
            &[x, w, h],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .reads(x, 0..64)
        .writes(h, 0..64);
    copy_touch(&mut s, "overwrite w", w, staging);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(
        waits(&plan),
        [
            (0, 1, Hazard::ReadAfterWrite),
            (1, 2, Hazard::WriteAfterRead)
        ]
    );
}

/// A wait names the buffer and the bytes the two operations share.
#[test]
fn a_wait_names_the_buffer_and_the_bytes_in_conflict() {
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 64), buffer(&mut s, "staging", 64));
    copy_touch(&mut s, "upload", x, staging);
    let user = touch(&mut s, "use", x, Some(8..24), None);
    let plan = s.schedule.plan().unwrap();
    let wait = &plan.waits_of(user)[0];
    assert_eq!((wait.buffer, wait.range.clone()), (x, 8..24));
    assert_eq!(wait.hazard, Hazard::ReadAfterWrite);
}

/// Two handles to one device spec in a schedule get labels that tell their
/// queues apart.
#[test]
fn two_devices_of_one_spec_are_told_apart_in_a_plan() {
    let mut schedule = Schedule::<Cpu>::new();
    let first = schedule.add_device(Arc::new(CpuDevice::new()));
    let second = schedule.add_device(Arc::new(CpuDevice::new()));
    let program = exec_program();
    for (device, name) in [(first, "a"), (second, "b")] {
        let buffer = schedule.add_buffer(device, name, CpuDevice::new().alloc(4).unwrap());
        schedule.exec(
            name,
            device,
            &program,
            &[buffer],
            &[],
            ExecParams::new_1d(1, 1),
        );
    }
    let plan = schedule.plan().unwrap();
    assert_eq!(
        plan.queue_labels(),
        ["cpu:0 (device 0) compute", "cpu:0 (device 1) compute"]
    );
    assert!(plan.to_string().contains("cpu:0 (device 1) compute"));
}

#[test]
fn write_after_read_across_queues_waits() {
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 64), buffer(&mut s, "staging", 64));
    touch(&mut s, "read x", x, Some(0..64), None);
    copy_touch(&mut s, "overwrite x", x, staging);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 1, Hazard::WriteAfterRead)]);
}

#[test]
fn write_after_write_on_overlapping_ranges_waits() {
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 16), buffer(&mut s, "staging", 16));
    touch(&mut s, "write [0,9)", x, None, Some(0..9));
    copy_touch(&mut s, "copy into x", x, staging);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 1, Hazard::WriteAfterWrite)]);

    // [0,9) and [8,16) overlap in byte 8.
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 16), buffer(&mut s, "staging", 16));
    let scratch = buffer(&mut s, "scratch", 16);
    touch(&mut s, "write [0,9)", x, None, Some(0..9));
    s.schedule
        .copy("copy", scratch, staging)
        .on(QueueKind::Copy)
        .writes(x, 8..16);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 1, Hazard::WriteAfterWrite)]);
    assert!(
        plan.to_string().contains("write-after-write on `x` [8, 9)"),
        "{plan}"
    );
}

#[test]
fn disjoint_ranges_do_not_wait() {
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 16), buffer(&mut s, "staging", 16));
    let scratch = buffer(&mut s, "scratch", 16);
    touch(&mut s, "write [0,8)", x, None, Some(0..8));
    s.schedule
        .copy("copy", scratch, staging)
        .on(QueueKind::Copy)
        .writes(x, 8..16);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), []);
}

#[test]
fn reads_after_reads_and_same_queue_dependencies_do_not_wait() {
    let mut s = setup();
    let (x, y) = (buffer(&mut s, "x", 16), buffer(&mut s, "y", 16));
    touch(&mut s, "write x", x, None, Some(0..16));
    touch(&mut s, "read x", x, Some(0..16), None); // same queue: ordered already
    copy_touch(&mut s, "copy x to y", y, x); // waits: reads x written on compute
    touch(&mut s, "read x again", x, Some(0..16), None); // read after read: nothing
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 2, Hazard::ReadAfterWrite)]);
}

#[test]
fn a_wait_implied_by_an_earlier_one_is_not_repeated() {
    let mut s = setup();
    let (x, y, sx, sy) = (
        buffer(&mut s, "x", 16),
        buffer(&mut s, "y", 16),
        buffer(&mut s, "sx", 16),
        buffer(&mut s, "sy", 16),
    );
    copy_touch(&mut s, "upload x", x, sx); // copy value 1
    copy_touch(&mut s, "upload y", y, sy); // copy value 2
    touch(&mut s, "read y", y, Some(0..16), None); // waits copy >= 2
    touch(&mut s, "read x", x, Some(0..16), None); // needs copy >= 1: implied
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(1, 2, Hazard::ReadAfterWrite)]);
}

#[test]
fn a_wait_implied_through_a_third_queue_is_not_repeated() {
    // Three queues: cpu copy (A), cpu compute (B), and a second cpu device's
    // compute queue (C). C waits on B, which waited on A: C needs no wait on A.
    let mut schedule = Schedule::<Cpu>::new();
    let d0 = schedule.add_device(Arc::new(CpuDevice::new()));
    let d1 = schedule.add_device(Arc::new(CpuDevice::new()));
    let alloc = |n| CpuDevice::new().alloc(n).unwrap();
    let (x, sx, y) = (
        schedule.add_buffer(d0, "x", alloc(16)),
        schedule.add_buffer(d0, "sx", alloc(16)),
        schedule.add_buffer(d0, "y", alloc(16)),
    );
    let p = exec_program();
    schedule.copy("upload x", x, sx).on(QueueKind::Copy); // A1
    schedule
        .exec("y from x", d0, &p, &[x], &[], ExecParams::new_1d(1, 1))
        .reads(x, ..)
        .writes(y, ..); // B1 waits A1
    // An exec on device 1 may only name its own buffers; declare accesses to
    // device 0's buffers to model a consumer of both.
    let z = schedule.add_buffer(d1, "z", alloc(16));
    schedule
        .exec(
            "z from x and y",
            d1,
            &p,
            &[z],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .reads(x, ..)
        .reads(y, ..)
        .writes(z, ..);
    let plan = schedule.plan().unwrap();
    let w: Vec<_> = plan
        .waits()
        .filter(|(_, w)| !w.previous_run)
        .map(|(op, w)| (w.after.index(), op.index()))
        .collect();
    assert_eq!(w, [(0, 1), (1, 2)], "{plan}");
}

#[test]
fn a_chain_split_across_copy_and_compute_gets_exactly_its_cross_queue_waits() {
    let mut s = setup();
    let names = ["x", "w", "h", "sx", "sw", "out"];
    let [x, w, h, sx, sw, out] = names.map(|n| buffer(&mut s, n, 64));
    copy_touch(&mut s, "upload x", x, sx); // copy 1
    copy_touch(&mut s, "upload w", w, sw); // copy 2
    let p = CpuProgram::from_fn("matmul", 3, 0, |_, _| {});
    s.schedule
        .exec(
            "matmul",
            s.device,
            &p,
            &[x, w, h],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .reads(x, ..)
        .reads(w, ..)
        .writes(h, ..); // compute 1: waits copy >= 2 once
    let relu = CpuProgram::from_fn("relu", 1, 0, |_, _| {});
    s.schedule
        .exec("relu", s.device, &relu, &[h], &[], ExecParams::new_1d(1, 1)); // compute 2: same queue
    copy_touch(&mut s, "download", out, h); // copy 3: waits compute >= 2
    let plan = s.schedule.plan().unwrap();
    assert_eq!(
        waits(&plan),
        [
            (1, 2, Hazard::ReadAfterWrite),
            (3, 4, Hazard::ReadAfterWrite)
        ]
    );
    let text = plan.to_string();
    assert!(
        text.contains("plan: 5 operations on 2 queues, 2 waits"),
        "{text}"
    );
    assert!(
        text.contains("wait queue 0 >= 2  (read-after-write on `w` [0, 64) after `upload w`)"),
        "{text}"
    );
}

#[test]
fn invalid_schedules_are_errors_that_say_why() {
    let mut s = setup();
    let (a, b) = (buffer(&mut s, "a", 16), buffer(&mut s, "b", 32));
    s.schedule.copy("bad copy", a, b);
    let error = s.schedule.plan().unwrap_err();
    assert!(error.to_string().contains("sizes differ"), "{error}");

    let mut s = setup();
    let a = buffer(&mut s, "a", 16);
    touch(&mut s, "past the end", a, Some(0..17), None);
    assert!(
        s.schedule
            .plan()
            .unwrap_err()
            .to_string()
            .contains("holds 16 bytes")
    );

    let mut s = setup();
    let a = buffer(&mut s, "a", 16);
    let p = exec_program();
    s.schedule
        .exec(
            "exec on copy",
            s.device,
            &p,
            &[a],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .on(QueueKind::Copy);
    assert!(
        s.schedule
            .plan()
            .unwrap_err()
            .to_string()
            .contains("copy queue")
    );
}

/// y = 3 * y + x, with x += 5 first and an upload, run many times.
fn pipeline() -> (
    Plan<Cpu>,
    hwqueue::cpu::CpuBuffer,
    hwqueue::cpu::CpuBuffer,
    hwqueue::cpu::CpuBuffer,
) {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let [staging, x, y] = [0; 3].map(|_| device.alloc(16).unwrap());
    staging.write_from(&[1u32, 2, 3, 4]).unwrap();
    let (bs, bx, by) = (
        schedule.add_buffer(d, "staging", staging.clone()),
        schedule.add_buffer(d, "x", x.clone()),
        schedule.add_buffer(d, "y", y.clone()),
    );
    let add = CpuProgram::from_fn("add_scalar", 1, 1, add_scalar);
    let mixp = CpuProgram::from_fn("mix", 2, 0, mix);
    schedule.copy("upload", bx, bs);
    schedule.exec(
        "x += 5",
        d,
        &add,
        &[bx],
        &[5u32.into()],
        ExecParams::new_1d(1, 1),
    );
    schedule
        .exec(
            "y = 3y + x",
            d,
            &mixp,
            &[bx, by],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .reads(bx, ..)
        .writes(by, ..)
        .reads(by, ..);
    (schedule.plan().unwrap(), staging, x, y)
}

#[test]
fn a_thousand_replays_give_identical_results() {
    let (mut plan, _, x, y) = pipeline();
    for run in 0..1000 {
        y.write_from(&[0u32; 4]).unwrap();
        let handle = plan.run().unwrap();
        handle.wait(LONG).unwrap();
        assert!(handle.is_complete(), "run {run}");
        assert_eq!(x.to_vec::<u32>().unwrap(), [6, 7, 8, 9], "run {run}");
        assert_eq!(y.to_vec::<u32>().unwrap(), [6, 7, 8, 9], "run {run}");
    }
    assert_eq!(plan.runs(), 1000);
}

#[test]
fn a_failing_kernel_fails_the_run_with_its_name_and_the_next_run_works() {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let [flag, x, staging, out] = [0; 4].map(|_| device.alloc(16).unwrap());
    let (bf, bx, _, bo) = (
        schedule.add_buffer(d, "flag", flag.clone()),
        schedule.add_buffer(d, "x", x.clone()),
        schedule.add_buffer(d, "staging", staging.clone()),
        schedule.add_buffer(d, "out", out.clone()),
    );
    let fill = fill_program();
    let check = CpuProgram::from_fn("maybe_fail", 1, 0, maybe_fail);
    schedule.exec(
        "fill x",
        d,
        &fill,
        &[bx],
        &[7u32.into()],
        ExecParams::new_1d(4, 4),
    );
    schedule.exec("the check", d, &check, &[bf], &[], ExecParams::new_1d(1, 1));
    schedule.exec(
        "refill x",
        d,
        &fill,
        &[bx],
        &[9u32.into()],
        ExecParams::new_1d(4, 4),
    );
    schedule.copy("download", bo, bx); // copy queue: waits on compute
    let mut plan = schedule.plan().unwrap();

    flag.write_from(&[1u32]).unwrap();
    let error = plan.run().unwrap().wait(LONG).unwrap_err();
    match &error {
        Error::OperationFailed { operation, .. } => assert_eq!(operation, "the check"),
        other => panic!("expected OperationFailed, got {other}"),
    }
    assert!(error.to_string().contains("the flag is set"), "{error}");
    // Downstream did not run: `out` is untouched, `x` holds the first fill.
    assert_eq!(out.to_vec::<u32>().unwrap(), [0; 4]);
    assert_eq!(x.to_vec::<u32>().unwrap(), [7; 4]);

    flag.write_from(&[0u32]).unwrap();
    plan.run().unwrap().wait(LONG).unwrap();
    assert_eq!(out.to_vec::<u32>().unwrap(), [9; 4]);
}

#[test]
fn a_copy_between_devices_that_cannot_see_each_other_is_staged_through_the_host() {
    let cpu = Arc::new(MixedDevice::from(CpuDevice::new()));
    let mock = Arc::new(MixedDevice::from(Mock::open(4).unwrap()));
    let mut schedule = Schedule::<Mixed>::new();
    let (dc, dm) = (
        schedule.add_device(cpu.clone()),
        schedule.add_device(mock.clone()),
    );
    let (on_mock, on_cpu) = (mock.alloc(16).unwrap(), cpu.alloc(16).unwrap());
    on_mock.write_from(&[4u32, 3, 2, 1]).unwrap();
    let bm = schedule.add_buffer(dm, "on mock", on_mock);
    let bc = schedule.add_buffer(dc, "on cpu", on_cpu.clone());
    schedule.copy("mock to cpu", bc, bm);
    let add = MixedProgram::from(CpuProgram::from_fn("add_scalar", 1, 1, add_scalar));
    schedule.exec(
        "add 10",
        dc,
        &add,
        &[bc],
        &[10u32.into()],
        ExecParams::new_1d(1, 1),
    );
    let mut plan = schedule.plan().unwrap();
    assert_eq!(plan.queue_labels(), ["host", "cpu:0 compute"]);
    for _ in 0..3 {
        on_cpu.write_from(&[0u32; 4]).unwrap();
        plan.run().unwrap().wait(LONG).unwrap();
        assert_eq!(on_cpu.to_vec::<u32>().unwrap(), [14, 13, 12, 11]);
    }
}

/// One operation of a random schedule over three u32[4] buffers.
#[derive(Debug, Clone)]
enum RandomOp {
    Add {
        buf: usize,
        value: u32,
    },
    Mix {
        src: usize,
        dst: usize,
    },
    Copy {
        src: usize,
        dst: usize,
        copy_queue: bool,
    },
    /// Per-run data (see `upload_data`) into `buf`.
    Upload {
        buf: usize,
    },
    /// `buf` to the host.
    Download {
        buf: usize,
    },
}

/// What the upload at op `op` carries in run `run`.
fn upload_data(run: usize, op: usize) -> [u32; 4] {
    let base = (run * 1000 + op * 10) as u32;
    [base, base + 1, base + 2, base + 3]
}

fn random_op() -> impl Strategy<Value = RandomOp> {
    prop_oneof![
        (0..3usize, 1..100u32).prop_map(|(buf, value)| RandomOp::Add { buf, value }),
        (0..3usize, 0..3usize).prop_filter_map("distinct", |(s, d)| (s != d)
            .then_some(RandomOp::Mix { src: s, dst: d })),
        (0..3usize, 0..3usize, any::<bool>()).prop_filter_map("distinct", |(s, d, q)| (s != d)
            .then_some(RandomOp::Copy {
                src: s,
                dst: d,
                copy_queue: q
            })),
        (0..3usize).prop_map(|buf| RandomOp::Upload { buf }),
        (0..3usize).prop_map(|buf| RandomOp::Download { buf }),
    ]
}

/// Runs `ops` as run `run` would; returns what each download saw, in
/// program order.
fn interpret(ops: &[RandomOp], state: &mut [[u32; 4]; 3], run: usize) -> Vec<[u32; 4]> {
    let mut downloads = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        match *op {
            RandomOp::Add { buf, value } => state[buf]
                .iter_mut()
                .for_each(|x| *x = x.wrapping_add(value)),
            RandomOp::Mix { src, dst } => {
                let source = state[src];
                for (d, s) in state[dst].iter_mut().zip(source) {
                    *d = d.wrapping_mul(3).wrapping_add(s);
                }
            }
            RandomOp::Copy { src, dst, .. } => state[dst] = state[src],
            RandomOp::Upload { buf } => state[buf] = upload_data(run, index),
            RandomOp::Download { buf } => downloads.push(state[buf]),
        }
    }
    downloads
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Planned runs equal a sequential interpreter, run after run: each
    /// run waited for, then three started back to back (their uploads and
    /// downloads staged up front), each download checked.
    #[test]
    fn runs_match_a_sequential_interpreter(ops in proptest::collection::vec(random_op(), 1..12)) {
        let device = Arc::new(CpuDevice::new());
        let mut schedule = Schedule::<Cpu>::new();
        let d = schedule.add_device(device.clone());
        let buffers: Vec<_> = (0..3).map(|_| device.alloc(16).unwrap()).collect();
        let ids: Vec<_> = buffers.iter().enumerate().map(|(i, b)| schedule.add_buffer(d, format!("b{i}"), b.clone())).collect();
        let add = CpuProgram::from_fn("add_scalar", 1, 1, add_scalar);
        let mixp = CpuProgram::from_fn("mix", 2, 0, mix);
        let mut op_ids = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let name = format!("op{i}");
            op_ids.push(match *op {
                RandomOp::Add { buf, value } => {
                    schedule.exec(name, d, &add, &[ids[buf]], &[value.into()], ExecParams::new_1d(1, 1)).id()
                }
                RandomOp::Mix { src, dst } => {
                    schedule.exec(name, d, &mixp, &[ids[src], ids[dst]], &[], ExecParams::new_1d(1, 1))
                        .reads(ids[src], ..).reads(ids[dst], ..).writes(ids[dst], ..).id()
                }
                RandomOp::Copy { src, dst, copy_queue } => {
                    let kind = if copy_queue { QueueKind::Copy } else { QueueKind::Compute };
                    schedule.copy(name, ids[dst], ids[src]).on(kind).id()
                }
                RandomOp::Upload { buf } => schedule.upload(name, ids[buf]).id(),
                RandomOp::Download { buf } => schedule.download(name, ids[buf]).id(),
            });
        }
        let mut plan = schedule.plan().unwrap();
        // Stages run `run`'s transfers; returns its downloads in op order.
        let stage = |plan: &mut Plan<Cpu>, run: usize| {
            let mut downloads = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let id = op_ids[i];
                match op {
                    RandomOp::Upload { .. } => plan.upload(id, &upload_data(run, i)).unwrap(),
                    RandomOp::Download { .. } => {
                        let into = hwqueue::Download::<u32>::new(4);
                        plan.download(id, &into).unwrap();
                        downloads.push(into);
                    }
                    _ => {}
                }
            }
            downloads
        };
        let initial = [[1u32, 2, 3, 4], [10, 20, 30, 40], [7, 7, 7, 7]];
        for (b, init) in buffers.iter().zip(&initial) {
            b.write_from(init).unwrap();
        }
        let mut expected = initial;
        let mut run = 0;
        for _ in 0..2 {
            let want = interpret(&ops, &mut expected, run);
            let downloads = stage(&mut plan, run);
            plan.run().unwrap().wait(LONG).unwrap();
            run += 1;
            for (b, want) in buffers.iter().zip(&expected) {
                prop_assert_eq!(&b.to_vec::<u32>().unwrap()[..], &want[..], "{}", plan);
            }
            let got: Vec<Vec<u32>> = downloads.iter().map(|d| d.take(LONG).unwrap()).collect();
            prop_assert_eq!(got, want.iter().map(|w| w.to_vec()).collect::<Vec<_>>(), "{}", plan);
        }
        // Back to back: nothing waits between the runs but the plan's own
        // waits (against the previous run's operations included).
        let mut started = Vec::new();
        for _ in 0..3 {
            let want = interpret(&ops, &mut expected, run);
            let downloads = stage(&mut plan, run);
            started.push((plan.run().unwrap(), downloads, want));
            run += 1;
        }
        for (handle, downloads, want) in started {
            handle.wait(LONG).unwrap();
            let got: Vec<Vec<u32>> = downloads.iter().map(|d| d.take(LONG).unwrap()).collect();
            prop_assert_eq!(got, want.iter().map(|w| w.to_vec()).collect::<Vec<_>>(), "{}", plan);
        }
        for (b, want) in buffers.iter().zip(&expected) {
            prop_assert_eq!(&b.to_vec::<u32>().unwrap()[..], &want[..], "{}", plan);
        }
    }
}

/// The waits against the previous run, as (awaited op, waiting op).
fn previous_run_waits(plan: &Plan<Cpu>) -> Vec<(usize, usize)> {
    plan.waits()
        .filter(|(_, w)| w.previous_run)
        .map(|(op, w)| (w.after.index(), op.index()))
        .collect()
}

#[test]
fn hazards_against_the_previous_run_get_waits_and_implied_ones_do_not() {
    // upload x (copy) then read x (compute): the next run's upload must not
    // overwrite x while this run's read still reads it.
    let mut s = setup();
    let (x, staging) = (buffer(&mut s, "x", 64), buffer(&mut s, "staging", 64));
    copy_touch(&mut s, "upload", x, staging);
    touch(&mut s, "use", x, Some(0..64), None);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(previous_run_waits(&plan), [(1, 0)]);
    assert!(
        plan.to_string().contains("after `use` of the previous run"),
        "{plan}"
    );

    // With a download after the compute, the next upload is ordered behind
    // it on the copy queue already: no previous-run wait.
    let mut s = setup();
    let (x, staging, out) = (
        buffer(&mut s, "x", 64),
        buffer(&mut s, "staging", 64),
        buffer(&mut s, "out", 64),
    );
    copy_touch(&mut s, "upload", x, staging);
    touch(&mut s, "use", x, Some(0..64), Some(0..64));
    copy_touch(&mut s, "download", out, x);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(previous_run_waits(&plan), []);
    assert_eq!(
        waits(&plan),
        [
            (0, 1, Hazard::ReadAfterWrite),
            (1, 2, Hazard::ReadAfterWrite)
        ]
    );
}

/// `buf[0] += 1`, slowly, so a missing wait would let the next run's copy
/// read a stale value.
fn slow_increment(_: &WorkGroup, args: &KernelArgs<'_>) {
    std::thread::sleep(std::time::Duration::from_micros(200));
    // SAFETY: one work-group.
    unsafe { args.buffer(0).slice_mut::<u32>(0..1)[0] += 1 };
}

#[test]
fn back_to_back_runs_without_waiting_stay_correct() {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let [x, y] = [0; 2].map(|_| device.alloc(4).unwrap());
    let (bx, by) = (
        schedule.add_buffer(d, "x", x.clone()),
        schedule.add_buffer(d, "y", y.clone()),
    );
    let increment = CpuProgram::from_fn("slow_increment", 1, 0, slow_increment);
    // y <- x on the copy queue, then x += 1 on the compute queue: the next
    // run's copy must see this run's increment (a previous-run wait).
    schedule.copy("y <- x", by, bx);
    schedule.exec(
        "x += 1",
        d,
        &increment,
        &[bx],
        &[],
        ExecParams::new_1d(1, 1),
    );
    let mut plan = schedule.plan().unwrap();
    assert_eq!(
        plan.waits().filter(|(_, w)| w.previous_run).count(),
        1,
        "{plan}"
    );
    const RUNS: u32 = 50;
    let runs: Vec<_> = (0..RUNS).map(|_| plan.run().unwrap()).collect();
    runs.last().unwrap().wait(LONG).unwrap();
    assert!(runs.iter().all(|r| r.is_complete()));
    assert_eq!(x.to_vec::<u32>().unwrap(), [RUNS]);
    assert_eq!(y.to_vec::<u32>().unwrap(), [RUNS - 1]);
}

/// `buf[i][0] = i` for each of its 20 buffers.
fn number_buffers(_: &WorkGroup, args: &KernelArgs<'_>) {
    for i in 0..args.buffer_count() {
        // SAFETY: one work-group; distinct buffers.
        unsafe { args.buffer(i).slice_mut::<u32>(0..1)[0] = i as u32 };
    }
}

#[test]
fn an_exec_with_more_buffers_than_fit_on_the_stack_runs() {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let buffers: Vec<_> = (0..20).map(|_| device.alloc(4).unwrap()).collect();
    let ids: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| schedule.add_buffer(d, format!("b{i}"), b.clone()))
        .collect();
    let program = CpuProgram::from_fn("number_buffers", 20, 0, number_buffers);
    schedule.exec("number", d, &program, &ids, &[], ExecParams::new_1d(1, 1));
    let mut plan = schedule.plan().unwrap();
    plan.run().unwrap().wait(LONG).unwrap();
    for (i, b) in buffers.iter().enumerate() {
        assert_eq!(b.to_vec::<u32>().unwrap(), [i as u32]);
    }
}

// ---- Views of one arena as schedule buffers.

#[test]
fn two_ops_on_disjoint_views_of_one_arena_need_no_wait_and_overlapping_ones_do() {
    let mut s = setup();
    let arena = buffer(&mut s, "arena", 256);
    let a = s.schedule.add_view("a", arena, 0, 64).unwrap();
    let b = s.schedule.add_view("b", arena, 64, 64).unwrap();
    touch(&mut s, "write a", a, None, None);
    s.schedule.fill("clear b", b, 0u32);
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [], "{plan}");

    let mut s = setup();
    let arena = buffer(&mut s, "arena", 256);
    let b = s.schedule.add_view("b", arena, 64, 64).unwrap();
    // b's second half, a view of a view: bytes 96..128 of the arena.
    let b_tail = s.schedule.add_view("b tail", b, 32, 32).unwrap();
    touch(&mut s, "write b", b, None, None);
    let fill = s.schedule.fill("clear b tail", b_tail, 0u8).id();
    let plan = s.schedule.plan().unwrap();
    assert_eq!(waits(&plan), [(0, 1, Hazard::WriteAfterRead)], "{plan}");
    // The wait names the arena and the bytes the two share.
    let wait = &plan.waits_of(fill)[0];
    assert_eq!((wait.buffer, wait.range.clone()), (arena, 96..128));
}

#[test]
fn a_plan_runs_kernels_and_fills_on_views_of_one_arena() {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let memory = device.alloc(128).unwrap();
    memory.write_from(&[7u32; 32]).unwrap();
    let arena = schedule.add_buffer(d, "arena", memory.clone());
    let x = schedule.add_view("x", arena, 16, 32).unwrap();
    let y = schedule.add_view("y", arena, 64, 32).unwrap();
    let z = schedule.add_view("z", arena, 96, 32).unwrap();
    schedule.exec(
        "fill x",
        d,
        &fill_program(),
        &[x],
        &[5u32.into()],
        ExecParams::new_1d(8, 8),
    );
    schedule.fill("clear y", y, 0u16);
    schedule.copy("x to z", z, x).on(QueueKind::Compute);
    let mut plan = schedule.plan().unwrap();
    for _ in 0..2 {
        plan.run().unwrap().wait(LONG).unwrap();
    }
    let got = memory.to_vec::<u32>().unwrap();
    assert_eq!(&got[..4], &[7; 4]);
    assert_eq!(&got[4..12], &[5; 8]);
    assert_eq!(&got[12..16], &[7; 4]);
    assert_eq!(&got[16..24], &[0; 8]);
    assert_eq!(&got[24..], &[5; 8]);
}

#[test]
fn bad_views_and_fills_in_a_schedule_are_errors_that_say_why() {
    let mut s = setup();
    let arena = buffer(&mut s, "arena", 64);
    assert!(matches!(
        s.schedule.add_view("past the end", arena, 48, 32),
        Err(Error::ViewOutOfRange {
            offset: 48,
            len: 32,
            size: 64
        })
    ));
    let a = s.schedule.add_view("a", arena, 0, 32).unwrap();
    let b = s.schedule.add_view("b", arena, 16, 32).unwrap();
    s.schedule.copy("a from b", a, b);
    match s.schedule.plan() {
        Err(Error::InvalidSchedule { reason }) => {
            assert!(reason.contains("ranges overlap"), "{reason}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut s = setup();
    let arena = buffer(&mut s, "arena", 64);
    let odd = s.schedule.add_view("odd", arena, 2, 8).unwrap();
    s.schedule.fill("fill odd", odd, 0u32);
    match s.schedule.plan() {
        Err(Error::InvalidSchedule { reason }) => {
            assert!(
                reason.contains("bytes 2..10")
                    && reason.contains("4-byte")
                    && reason.contains("multiples of that"),
                "{reason}"
            )
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

// ---- Uploads and downloads as operations, their host data staged per run.

/// upload x; x += 5 (compute); download x; all on views of one arena.
fn upload_add_download() -> (Plan<Cpu>, OpId, OpId) {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let arena = schedule.add_buffer(d, "arena", device.alloc(64).unwrap());
    let x = schedule.add_view("x", arena, 16, 16).unwrap();
    let up = schedule.upload("upload x", x).id();
    let add = CpuProgram::from_fn("add_scalar", 1, 1, add_scalar);
    schedule.exec(
        "add 5",
        d,
        &add,
        &[x],
        &[5u32.into()],
        ExecParams::new_1d(1, 1),
    );
    let down = schedule.download("download x", x).id();
    (schedule.plan().unwrap(), up, down)
}

#[test]
fn uploads_and_downloads_move_each_runs_data_in_queue_order() {
    let (mut plan, up, down) = upload_add_download();
    assert_eq!(plan.queue_labels(), ["cpu:0 copy", "cpu:0 compute"]);
    // Within a run: the exec waits for the upload, the download for the exec.
    assert_eq!(
        waits(&plan),
        [
            (0, 1, Hazard::ReadAfterWrite),
            (1, 2, Hazard::ReadAfterWrite)
        ],
        "{plan}"
    );
    // Back to back, without waiting in between: each run's own data, each
    // through a different kind of owner.
    let shared: Arc<[u32]> = Arc::from([200u32, 201, 202, 203]);
    let outputs: Vec<_> = (0..3u32)
        .map(|run| {
            match run {
                0 => plan.upload(up, &[10u32, 11, 12, 13]).unwrap(),
                1 => plan.upload_vec(up, vec![100u32, 101, 102, 103]).unwrap(),
                _ => plan.upload_vec(up, shared.clone()).unwrap(),
            }
            let out = hwqueue::Download::<u32>::new(4);
            plan.download(down, &out).unwrap();
            (plan.run().unwrap(), out)
        })
        .collect();
    let got: Vec<Vec<u32>> = outputs
        .iter()
        .map(|(run, out)| {
            run.wait(LONG).unwrap();
            // The run's end means the download landed.
            assert!(out.is_ready());
            out.take(LONG).unwrap()
        })
        .collect();
    assert_eq!(
        got,
        [
            vec![15, 16, 17, 18],
            vec![105, 106, 107, 108],
            vec![205, 206, 207, 208]
        ]
    );
}

#[test]
fn a_run_needs_every_transfer_staged_and_consumes_what_was() {
    let (mut plan, up, down) = upload_add_download();
    plan.upload(up, &[1u32; 4]).unwrap();
    // The download has nothing staged: the run is refused, nothing runs.
    match plan.run() {
        Err(Error::TransferNotStaged { operation, what }) => {
            assert_eq!((operation.as_str(), what), ("download x", "download"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan.runs(), 0);
    // What was staged stays staged for the next try.
    let out = hwqueue::Download::<u32>::new(4);
    plan.download(down, &out).unwrap();
    plan.run().unwrap().wait(LONG).unwrap();
    assert_eq!(out.take(LONG).unwrap(), [6; 4]);
    // The run consumed both: a second run does not repeat the last input.
    match plan.run() {
        Err(Error::TransferNotStaged { operation, what }) => {
            assert_eq!((operation.as_str(), what), ("upload x", "upload"));
        }
        other => panic!("{other:?}"),
    }
    let message = Error::TransferNotStaged {
        operation: "upload x".into(),
        what: "upload",
    }
    .to_string();
    assert!(
        message.contains("call `Plan::upload`") && message.contains("before each `run`"),
        "{message}"
    );
}

#[test]
fn staging_the_wrong_data_is_an_error_that_says_why() {
    let (mut plan, up, down) = upload_add_download();
    assert!(matches!(
        plan.upload(up, &[1u32; 3]),
        Err(Error::TransferSizeMismatch {
            what: "upload",
            host: 12,
            device: 16
        })
    ));
    assert!(matches!(
        plan.download(down, &hwqueue::Download::<u64>::new(4)),
        Err(Error::TransferSizeMismatch {
            what: "download",
            host: 32,
            device: 16
        })
    ));
    // An operation that is not of the kind staged for.
    match plan.upload(down, &[1u32; 4]) {
        Err(Error::InvalidSchedule { reason }) => {
            assert!(reason.contains("`download x` is not an upload"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // An id of another, longer schedule.
    let mut other = setup();
    let buf = buffer(&mut other, "buf", 4);
    let foreign = (0..10).map(|i| touch(&mut other, &format!("op {i}"), buf, None, None));
    let foreign = foreign.last().unwrap();
    match plan.download(foreign, &hwqueue::Download::<u32>::new(4)) {
        Err(Error::InvalidSchedule { reason }) => {
            assert!(
                reason.contains("operation 9 is not in this plan"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    // A download that already received a transfer.
    plan.upload(up, &[1u32; 4]).unwrap();
    let out = hwqueue::Download::<u32>::new(4);
    plan.download(down, &out).unwrap();
    plan.run().unwrap().wait(LONG).unwrap();
    assert!(matches!(
        plan.download(down, &out),
        Err(Error::DownloadReused)
    ));
    // Once its result was taken too: still reused, not a size mismatch
    // (taking left it empty; issue 24, defect 2).
    assert_eq!(out.take(LONG).unwrap().len(), 4);
    match plan.download(down, &out) {
        Err(Error::DownloadReused) => {}
        other => panic!("a taken download must be refused as reused, got {other:?}"),
    }
}

#[test]
fn a_failing_run_fails_its_staged_download_and_the_next_run_works() {
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let flag = schedule.add_buffer(d, "flag", device.alloc(4).unwrap());
    let up = schedule.upload("upload flag", flag).id();
    let check = CpuProgram::from_fn("maybe_fail", 1, 0, maybe_fail);
    schedule.exec("check", d, &check, &[flag], &[], ExecParams::new_1d(1, 1));
    let down = schedule.download("download flag", flag).id();
    let mut plan = schedule.plan().unwrap();

    plan.upload(up, &[1u32]).unwrap();
    let out = hwqueue::Download::<u32>::new(1);
    plan.download(down, &out).unwrap();
    let run = plan.run().unwrap();
    match run.wait(LONG) {
        Err(Error::OperationFailed { operation, .. }) => assert_eq!(operation, "check"),
        other => panic!("{other:?}"),
    }
    // The download after the failed kernel never ran: it fails, and says so.
    let failure = out.take(LONG).unwrap_err();
    assert!(
        matches!(failure.root_cause(), Error::KernelFailed { .. }),
        "{failure:?}"
    );

    plan.upload(up, &[0u32]).unwrap();
    let out = hwqueue::Download::<u32>::new(1);
    plan.download(down, &out).unwrap();
    plan.run().unwrap().wait(LONG).unwrap();
    assert_eq!(out.take(LONG).unwrap(), [0]);
}

#[test]
fn a_download_staged_for_a_refused_run_fails_with_the_reason() {
    // The compute queue refuses its batch at `run` (an exec short of a
    // scalar), after the download was taken from the staging and before
    // the copy queue recorded it.
    let device = Arc::new(CpuDevice::new());
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device.clone());
    let x = schedule.add_buffer(d, "x", device.alloc(16).unwrap());
    schedule.exec(
        "fill x",
        d,
        &fill_program(),
        &[x],
        &[], // one scalar missing: the queue refuses the exec
        ExecParams::new_1d(4, 4),
    );
    let down = schedule.download("download x", x).id();
    let mut plan = schedule.plan().unwrap();
    assert_eq!(plan.queue_labels(), ["cpu:0 compute", "cpu:0 copy"]);
    let out = hwqueue::Download::<u32>::new(4);
    plan.download(down, &out).unwrap();
    let error = plan.run().unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::InvalidArguments { .. }),
        "{error:?}"
    );
    let failure = out.take(LONG).unwrap_err();
    assert!(
        matches!(failure.root_cause(), Error::InvalidArguments { .. }),
        "{failure:?}"
    );
}

#[test]
fn uploads_and_downloads_run_on_the_mock_backend_beside_the_cpu() {
    let cpu = Arc::new(MixedDevice::from(CpuDevice::new()));
    let mock = Arc::new(MixedDevice::from(Mock::open(4).unwrap()));
    let mut schedule = Schedule::<Mixed>::new();
    let (dc, dm) = (
        schedule.add_device(cpu.clone()),
        schedule.add_device(mock.clone()),
    );
    let bm = schedule.add_buffer(dm, "on mock", mock.alloc(16).unwrap());
    let bc = schedule.add_buffer(dc, "on cpu", cpu.alloc(16).unwrap());
    let up = schedule.upload("upload to mock", bm).id();
    schedule.copy("mock to cpu", bc, bm);
    let add = MixedProgram::from(CpuProgram::from_fn("add_scalar", 1, 1, add_scalar));
    schedule.exec(
        "add 10",
        dc,
        &add,
        &[bc],
        &[10u32.into()],
        ExecParams::new_1d(1, 1),
    );
    let down = schedule.download("download from cpu", bc).id();
    let mut plan = schedule.plan().unwrap();
    for run in 0..3u32 {
        plan.upload(up, &[run, run + 1, run + 2, run + 3]).unwrap();
        let out = hwqueue::Download::<u32>::new(4);
        plan.download(down, &out).unwrap();
        plan.run().unwrap().wait(LONG).unwrap();
        assert_eq!(
            out.take(LONG).unwrap(),
            [run + 10, run + 11, run + 12, run + 13]
        );
    }
}

// ---- Issue 44: a submit reporting earlier failures, and the host stage's uses.

/// A one-op plan on a gated mock device whose kernel always fails.
fn failing_plan_on_a_gated_mock(device: MockDevice) -> Plan<Mixed> {
    let mock = Arc::new(MixedDevice::from(device));
    let mut schedule = Schedule::<Mixed>::new();
    let d = schedule.add_device(mock.clone());
    let x = schedule.add_buffer(d, "x", mock.alloc(16).unwrap());
    let boom = MixedProgram::from(MockProgram::new("fail", 1, |_| {}));
    schedule.exec("boom", d, &boom, &[x], &[], ExecParams::new_1d(1, 1));
    schedule.plan().unwrap()
}

/// Failed on 05d7d31: `Plan::run` retried a submit that reported an
/// earlier failure once, and took a second report (another run's failure,
/// recorded between the two calls) for a refusal of its own run. Here the
/// second failure lands exactly between them: the mock's ledger hook
/// releases run 1's batch, and waits until it failed, on the first call
/// after run 0's failure was reported.
#[test]
fn a_run_whose_submit_reports_two_earlier_failures_still_records() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let gate = CpuSignal::new(0);
    let armed = Arc::new(AtomicBool::new(false));
    let (hook_gate, hook_armed) = (gate.clone(), armed.clone());
    let mut device = MockDevice::gated(gate.clone());
    device.on_ledger = Some(LedgerHook(Arc::new(move |ledger| {
        // Run 0's failure was reported (by the first submit of run 2):
        // fail run 1 now, before the retry reports.
        if !ledger.has_unreported() && hook_armed.swap(false, Ordering::SeqCst) {
            hook_gate.set(2);
            let deadline = std::time::Instant::now() + LONG;
            while !ledger.has_unreported() {
                assert!(std::time::Instant::now() < deadline, "run 1 never failed");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    })));
    let mut plan = failing_plan_on_a_gated_mock(device);
    let run0 = plan.run().unwrap();
    let run1 = plan.run().unwrap();
    gate.set(1);
    assert!(run0.wait(LONG).is_err());
    armed.store(true, Ordering::SeqCst);
    let run2 = plan
        .run()
        .expect("a submit reporting earlier runs' failures is retried until it records");
    assert!(
        !armed.load(Ordering::SeqCst),
        "the hook ran between the submits"
    );
    gate.set(3);
    for (number, run) in [(1, run1), (2, run2)] {
        match run.wait(LONG) {
            Err(Error::OperationFailed { operation, .. }) if operation == "boom" => {}
            other => panic!("run {number}: {other:?}"),
        }
    }
    // The queue goes on: run 3 records and fails on its own account.
    gate.set(4);
    match plan.run().unwrap().wait(LONG) {
        Err(Error::OperationFailed { operation, .. }) if operation == "boom" => {}
        other => panic!("run 3: {other:?}"),
    }
}

/// `buf[0] = scalar`, or a panic naming the run when the scalar is odd.
fn stamp_or_fail(_: &WorkGroup, args: &KernelArgs<'_>) {
    let run: u32 = args.scalar(0);
    if run % 2 == 1 {
        panic!("injected failure of run {run}");
    }
    // SAFETY: one work-group.
    let out = unsafe { args.buffer(0).slice_mut::<u32>(0..1) };
    out[0] = run;
}

/// Failing runs back to back, up to 64 in flight, for two seconds: each
/// run is recorded (none refused), a failing run reports its own kernel's
/// failure, and every other run completes with its own output. On
/// 05d7d31 the window between the two submits was hit within seconds.
#[test]
fn failing_runs_back_to_back_are_never_refused_and_report_only_their_own() {
    quiet_injected_failures();
    no_hang_long("failing runs back to back", || {
        let device = Arc::new(CpuDevice::new());
        let mut schedule = Schedule::<Cpu>::new();
        let d = schedule.add_device(device.clone());
        let t = schedule.add_tensor(d, "t", 16);
        let step = schedule.add_scalar("run", 0u32);
        let program = CpuProgram::from_fn("stamp_or_fail", 1, 1, stamp_or_fail);
        schedule
            .exec(
                "stamp",
                d,
                &program,
                &[t],
                &[0u32.into()],
                ExecParams::new_1d(1, 1),
            )
            .scalar(0, step);
        let down = schedule.download("out", t).id();
        let mut plan = schedule.plan().unwrap();
        let check = |run: u32, handle: hwqueue::Run<Cpu>, out: hwqueue::Download<u32>| {
            let outcome = handle.wait(LONG);
            if run % 2 == 1 {
                let own = format!("injected failure of run {run}");
                match &outcome {
                    Err(error)
                        if matches!(error.root_cause(),
                        Error::KernelFailed { message, .. } if *message == own) => {}
                    other => panic!("run {run}: {other:?}"),
                }
                assert!(out.take(LONG).is_err(), "run {run}: its download must fail");
            } else {
                outcome.unwrap_or_else(|e| panic!("run {run}: {e}"));
                assert_eq!(out.take(LONG).unwrap()[0], run, "run {run}");
            }
        };
        let mut in_flight = std::collections::VecDeque::new();
        let start = std::time::Instant::now();
        let mut run = 0u32;
        // At least 256 runs, and for two seconds: the window needs runs,
        // and time on a loaded machine (no assertion on either).
        while run < 256 || start.elapsed() < std::time::Duration::from_secs(2) {
            plan.set_scalar(step, run).unwrap();
            let out = hwqueue::Download::<u32>::new(4);
            plan.download(down, &out).unwrap();
            let handle = plan
                .run()
                .unwrap_or_else(|e| panic!("run {run} refused: {e}"));
            in_flight.push_back((run, handle, out));
            if in_flight.len() == 64 {
                let (run, handle, out) = in_flight.pop_front().unwrap();
                check(run, handle, out);
            }
            run += 1;
        }
        for (run, handle, out) in in_flight {
            check(run, handle, out);
        }
    });
}

fn store_bits(_: &WorkGroup, args: &KernelArgs<'_>) {
    let value: f32 = args.scalar(0);
    // SAFETY: one work-group.
    let out = unsafe { args.buffer(0).slice_mut::<u32>(0..1) };
    out[0] = value.to_bits();
}

/// A scalar slot set to -0.0 after 0.0 gives the kernel -0.0: another
/// value, though `==` calls them equal. On 0ac2741 (`set_scalar` skipped
/// values equal to the last) the kernel got +0.0, replay on or off.
#[test]
fn a_scalar_slot_set_to_minus_zero_after_zero_gives_the_kernel_minus_zero() {
    for replay in [true, false] {
        let device = Arc::new(CpuDevice::new());
        let mut schedule = Schedule::<Cpu>::new();
        let d = schedule.add_device(device.clone());
        let t = schedule.add_tensor(d, "t", 16);
        let value = schedule.add_scalar("value", 0.0f32);
        let program = CpuProgram::from_fn("store_bits", 1, 1, store_bits);
        schedule
            .exec(
                "store",
                d,
                &program,
                &[t],
                &[0.0f32.into()],
                ExecParams::new_1d(1, 1),
            )
            .scalar(0, value);
        let down = schedule.download("out", t).id();
        let mut plan = schedule.plan().unwrap();
        plan.set_replay(replay);
        for (set, bits) in [(0.0f32, 0u32), (-0.0, 0x8000_0000), (0.0, 0)] {
            plan.set_scalar(value, set).unwrap();
            let out = hwqueue::Download::<u32>::new(4);
            plan.download(down, &out).unwrap();
            plan.run().unwrap().wait(LONG).unwrap();
            assert_eq!(out.take(LONG).unwrap()[0], bits, "{set:?}, replay {replay}");
        }
    }
}

/// As `common::no_hang`, with a minute to go.
fn no_hang_long(what: &str, f: impl FnOnce() + Send + 'static) {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = sender.send(());
    });
    match receiver.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no progress in 60 s"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: failed"),
    }
}

/// A plan copying between the CPU and a gated mock device (so through the
/// host stage), its CPU side a slot bound to a buffer from `alloca` on a
/// queue of its own; that queue's `dealloca` is recorded, and runs, after
/// `run()` and before the host stage's copy. Failed on 05d7d31: the
/// host stage held no use, so the range went back to the pool (phase
/// `Returned`) under the copy still to run, which the host then refuses
/// (`UseAfterDealloca`, as the issue saw).
fn host_stage_after_a_dealloca(cpu_is_source: bool) {
    let cpu = CpuDevice::new();
    let gate = CpuSignal::new(0);
    let mock = Arc::new(MixedDevice::from(MockDevice::gated(gate.clone())));
    let on_cpu = Arc::new(MixedDevice::from(cpu.clone()));
    let mut alloca_queue = cpu.compute_queue().unwrap();
    let ordered = alloca_queue.alloca(16).unwrap();
    let done = cpu.new_signal(0).unwrap();
    alloca_queue
        .upload(&ordered, &[1u32, 2, 3, 4])
        .signal(&done, 1)
        .submit()
        .unwrap();
    done.wait(1, LONG).unwrap();

    let mut schedule = Schedule::<Mixed>::new();
    let (dm, dc) = (
        schedule.add_device(mock.clone()),
        schedule.add_device(on_cpu.clone()),
    );
    let on_mock = mock.alloc(16).unwrap();
    on_mock.write_from(&[5u32, 6, 7, 8]).unwrap();
    let m = schedule.add_buffer(dm, "on mock", on_mock.clone());
    let slot = schedule.add_slot(dc, "ordered", 16);
    // The mock's fill comes first; the host stage's copy waits for it, so
    // for the gate.
    let nothing = MixedProgram::from(MockProgram::new("touch", 1, |_| {}));
    schedule.exec("touch", dm, &nothing, &[m], &[], ExecParams::new_1d(1, 1));
    if cpu_is_source {
        schedule.copy("cpu to mock", m, slot);
    } else {
        schedule.copy("mock to cpu", slot, m);
    }
    let mut plan = schedule.plan().unwrap();
    assert!(plan.queue_labels().contains(&"host"), "{plan}");
    plan.bind(slot, &MixedBuffer::from(ordered.clone()))
        .unwrap();
    let run = plan.run().unwrap();
    // The dealloca runs while the host stage's copy waits at the gate.
    alloca_queue
        .dealloca(&ordered)
        .signal(&done, 2)
        .submit()
        .unwrap();
    done.wait(2, LONG).unwrap();
    let phase = hwqueue::Buffer::queue_ordered(&ordered).unwrap().phase();
    assert_eq!(
        phase,
        hwqueue::memory::Phase::Ran,
        "the range stays while the recorded copy holds a use"
    );
    gate.set(1);
    run.wait(LONG)
        .expect("a run recorded before the dealloca works on the buffer's bytes");
    if cpu_is_source {
        assert_eq!(on_mock.to_vec::<u32>().unwrap(), [1, 2, 3, 4]);
    }
    drop(plan);
    let returned = hwqueue::Buffer::queue_ordered(&ordered).unwrap().phase();
    assert_eq!(
        returned,
        hwqueue::memory::Phase::Returned,
        "the range went back"
    );
}

#[test]
fn the_host_stage_reads_a_source_deallocated_after_run_as_it_was() {
    no_hang("the host stage and a dealloca on the source", || {
        host_stage_after_a_dealloca(true)
    });
}

#[test]
fn the_host_stage_writes_a_destination_deallocated_after_run() {
    no_hang("the host stage and a dealloca on the destination", || {
        host_stage_after_a_dealloca(false)
    });
}

/// A plan copying from a mock buffer to a CPU buffer (through the host
/// stage) whose copy panics: the mock buffer's lock is poisoned, so its
/// read panics. Each run fails with the panic, the next run too, and the
/// plan drops. On 60721ae the panic ended the host stage's thread: the
/// first run's copy signal was never set (its wait timed out), the
/// second `run` was refused ("its thread has exited") after its device
/// queues were submitted, waiting for values nothing would set.
#[test]
fn a_copy_that_panics_on_the_host_stage_fails_its_run_and_the_next() {
    no_hang("a panicking host-stage copy", || {
        let cpu = Arc::new(MixedDevice::from(CpuDevice::new()));
        let mock = Arc::new(MixedDevice::from(Mock::open(4).unwrap()));
        let mut schedule = Schedule::<Mixed>::new();
        let (dm, dc) = (
            schedule.add_device(mock.clone()),
            schedule.add_device(cpu.clone()),
        );
        let on_mock = mock.alloc(16).unwrap();
        let on_cpu = cpu.alloc(16).unwrap();
        let m = schedule.add_buffer(dm, "on mock", on_mock.clone());
        let c = schedule.add_buffer(dc, "on cpu", on_cpu.clone());
        schedule.copy("mock to cpu", c, m);
        let mut plan = schedule.plan().unwrap();
        assert!(plan.queue_labels().contains(&"host"), "{plan}");
        plan.run().unwrap().wait(LONG).unwrap();
        // Poisoned: the mock's read unwraps its lock.
        let inner = on_mock.as_mock().unwrap().0.clone();
        let _ = std::thread::spawn(move || {
            let _held = inner.lock().unwrap();
            panic!("poisoning the mock buffer's lock");
        })
        .join();
        for run in 0..2 {
            let waited = plan
                .run()
                .and_then(|run| run.wait(std::time::Duration::from_secs(5)));
            let error = waited.expect_err("the copy panicked");
            assert!(
                matches!(error.root_cause(), Error::EnginePanicked { .. }),
                "run {run}: {error:?}"
            );
            assert!(
                format!("{error}").contains("PoisonError"),
                "run {run}: {error}"
            );
        }
        drop(plan);
    });
}

/// The gate `a_host_copy_whose_first_wait_fails_honours_the_others` holds
/// its `gated` kernel behind, and what its `reader` kernel saw.
static HOST_GATE: std::sync::OnceLock<CpuSignal> = std::sync::OnceLock::new();
static HOST_SEEN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn gated(_: &WorkGroup, _: &KernelArgs<'_>) {
    HOST_GATE.get().unwrap().wait(1, LONG).unwrap();
}

fn read_first_word(_: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: one work-group, reading only.
    let seen = unsafe { args.buffer(0).as_slice::<u32>()[0] };
    HOST_SEEN.lock().unwrap().push(seen);
}

fn fails(_: &WorkGroup, _: &KernelArgs<'_>) {
    panic!("injected failure: {}", "a kernel that fails");
}

/// A host-stage copy (`a0` to `b1`, two devices) waits on a kernel that
/// fails (on device 0) and on device 1's queue, where a reader of `b1`
/// sits behind a gated kernel. The next run's upload into `b1` waits only
/// on the copy (its wait on the reader is implied by the copy's). The copy
/// must honour all its waits before failing, or the upload overwrites `b1`
/// before the first run's reader read it. On 2590841 the copy failed at
/// its first failed wait: the first run's reader saw the second run's 2
/// (review helper-56).
#[test]
fn a_host_copy_whose_first_wait_fails_honours_the_others() {
    quiet_injected_failures();
    no_hang("a host copy whose first wait fails", || {
        let gate = HOST_GATE.get_or_init(|| CpuSignal::new(0));
        let (d0, d1) = (Arc::new(CpuDevice::new()), Arc::new(CpuDevice::new()));
        let mut schedule = Schedule::<Cpu>::new();
        let (i0, i1) = (
            schedule.add_device(d0.clone()),
            schedule.add_device(d1.clone()),
        );
        let a0 = schedule.add_buffer(i0, "a0", d0.alloc(64).unwrap());
        let b1 = schedule.add_buffer(i1, "b1", d1.alloc(64).unwrap());
        let c1 = schedule.add_buffer(i1, "c1", d1.alloc(64).unwrap());
        let one = ExecParams::new_1d(1, 1);
        let program = |name, kernel| CpuProgram::from_fn(name, 1, 0, kernel);
        let up = schedule.upload("upload b1", b1).id();
        schedule
            .exec("fail", i0, &program("fail", fails), &[a0], &[], one)
            .writes(a0, ..);
        schedule.exec("gated", i1, &program("gated", gated), &[c1], &[], one);
        schedule
            .exec(
                "read b1",
                i1,
                &program("read", read_first_word),
                &[b1],
                &[],
                one,
            )
            .reads(b1, ..);
        schedule.copy("a0 to b1", b1, a0);
        let mut plan = schedule.plan().unwrap();
        assert!(plan.queue_labels().contains(&"host"), "{plan}");
        plan.upload(up, &[1u32; 16]).unwrap();
        let first = plan.run().unwrap();
        plan.upload(up, &[2u32; 16]).unwrap();
        let second = plan.run().unwrap();
        // Long enough for a copy that gave up at its failed wait to let
        // the second upload through (it then writes at once); a right
        // plan does not depend on it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        gate.set(1);
        assert!(first.wait(LONG).is_err(), "`fail` failed");
        assert!(second.wait(LONG).is_err(), "`fail` failed again");
        assert_eq!(*HOST_SEEN.lock().unwrap(), [1, 2], "each run's upload");
    });
}

/// A plan asked about an operation of another schedule says so, never
/// panics (on 2590841 `queue_of`, `waits_of` and a reason's display
/// indexed out of bounds; review helper-56).
#[test]
fn a_plan_asked_about_another_schedule_s_operation_answers_none() {
    let device = Arc::new(CpuDevice::new());
    let mut small = Schedule::<Cpu>::new();
    let d = small.add_device(device.clone());
    let x = small.add_tensor(d, "x", 16);
    small.fill("fill x", x, 0u32);
    // Two devices and a copy between them (the host stage), after fills.
    let mut large = Schedule::<Cpu>::new();
    let (d0, d1) = (
        large.add_device(device),
        large.add_device(Arc::new(CpuDevice::new())),
    );
    let (y0, y1) = (
        large.add_tensor(d0, "y0", 16),
        large.add_tensor(d1, "y1", 16),
    );
    for k in 0..4 {
        large.fill(format!("fill y0 {k}"), y0, k as u32);
    }
    large.copy("y0 to y1", y1, y0);
    let (small, large) = (small.plan().unwrap(), large.plan().unwrap());
    let (op, wait) = large.waits().last().expect("the copy waits");
    assert_eq!(small.queue_of(op), None);
    assert!(small.waits_of(op).is_empty());
    let text = small.reason(op, wait).to_string();
    assert!(text.contains("another plan"), "{text}");
}

/// `plan` refuses the schedule, with a reason containing every one of `words`.
fn refused_with(s: Setup, words: &[&str]) {
    match s.schedule.plan() {
        Err(Error::InvalidSchedule { reason }) => {
            for word in words {
                assert!(reason.contains(word), "`{word}` missing from: {reason}");
            }
        }
        other => panic!("planned: {:?}", other.map(|_| ())),
    }
}

#[test]
fn duplicate_names_are_refused_naming_the_duplicate() {
    // Two operations under one name.
    let mut s = setup();
    let buf = buffer(&mut s, "buf", 16);
    touch(&mut s, "step", buf, None, None);
    touch(&mut s, "other", buf, None, None);
    touch(&mut s, "step", buf, None, None);
    refused_with(s, &["`step`", "operations 0 and 2"]);

    // Two buffers of different kinds (a buffer and a tensor) under one name.
    let mut s = setup();
    let buf = buffer(&mut s, "x", 16);
    let tensor = s.schedule.add_tensor(s.device, "x", 16);
    s.schedule.copy("into tensor", tensor, buf);
    s.schedule.copy("back", buf, tensor);
    refused_with(s, &["`x`", "buffers 0 and 1"]);

    // A slot and a view under one name.
    let mut s = setup();
    let slot = s.schedule.add_slot(s.device, "io", 16);
    s.schedule.add_view("io", slot, 0, 8).unwrap();
    s.schedule.fill("clear", slot, 0u32);
    refused_with(s, &["`io`", "buffers 0 and 1"]);

    // Two scalar slots under one name.
    let mut s = setup();
    s.schedule.add_scalar("n", 0u32);
    s.schedule.add_scalar("n", 1u32);
    refused_with(s, &["`n`", "scalar slots 0 and 1"]);

    // An operation may share a name with a buffer: they are named apart.
    let mut s = setup();
    let buf = buffer(&mut s, "same", 16);
    touch(&mut s, "same", buf, None, None);
    assert!(s.schedule.plan().is_ok());
}
