//! How a plan's runs are ordered when one is refused or rebinds its slots:
//! a refused run fails only its own values, in each queue's order (the host
//! stage's too), never a run still in flight; a slot rebound to bytes that
//! overlap what it had, shifted, waits for the run still using them.
//! Kernels that must be held are gated on flags the test sets, so the
//! order each test needs is forced, not hoped for.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use common::{LONG, no_hang};
use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::executor::{Plan, Schedule};
use hwqueue::{Buffer, BufferId, Device, Error, ExecParams, QueueKind, View};

/// Spins until `gate` is set.
fn hold(gate: &AtomicBool) {
    while !gate.load(Ordering::Acquire) {
        thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A plan on `device` of one exec of `program` (one buffer) writing the
/// 64-byte slot `s` whole, and that slot.
fn one_writer(device: Arc<CpuDevice>, program: &CpuProgram) -> (Plan<Cpu>, BufferId) {
    let mut schedule = Schedule::<Cpu>::new();
    let d = schedule.add_device(device);
    let slot = schedule.add_slot(d, "s", 64);
    schedule
        .exec(
            "write s",
            d,
            program,
            &[slot],
            &[],
            ExecParams::new_1d(1, 1),
        )
        .writes(slot, ..);
    (schedule.plan().unwrap(), slot)
}

/// Two CPU devices: a cross-device copy (so the plan has a host stage), an
/// exec on device 1 after it, and an exec on device 0 over a slot bound to
/// a misaligned view, which device 0's queue refuses. The host stage's
/// values were neither set nor failed, so device 1's queue, submitted
/// already, waited on them forever: `take_profile` hung (issue 35, defect
/// 1; hung on e24445a).
#[test]
fn a_refused_run_fails_the_host_stage_s_values_so_nothing_waits_forever() {
    no_hang("take_profile after a refused run", || {
        let mut schedule = Schedule::<Cpu>::new();
        let d0 = schedule.add_device(Arc::new(CpuDevice::new()));
        let d1 = schedule.add_device(Arc::new(CpuDevice::new()));
        let a = schedule.add_buffer(d0, "a", CpuDevice::new().alloc(64).unwrap());
        let b = schedule.add_buffer(d1, "b", CpuDevice::new().alloc(64).unwrap());
        let touch = CpuProgram::from_fn("touch", 1, 0, |_, _| {});
        schedule.copy("a to b", b, a);
        schedule
            .exec("on d1", d1, &touch, &[b], &[], ExecParams::new_1d(1, 1))
            .reads(b, ..);
        let slot = schedule.add_slot(d0, "s", 64);
        schedule
            .exec("on d0", d0, &touch, &[slot], &[], ExecParams::new_1d(1, 1))
            .writes(slot, ..);
        let mut plan = schedule.plan().unwrap();
        let labels = plan.queue_labels().join(", ");
        assert!(labels.contains("host"), "no host stage: {labels}");
        let big = CpuDevice::new().alloc(128).unwrap();
        plan.bind(slot, &View::new(&big, 4, 64).unwrap()).unwrap();
        let error = plan.run().unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::ViewMisaligned { .. }),
            "{error}"
        );
        // The error names the run, the operation and the binding.
        let text = error.to_string();
        for part in [
            "run 0",
            "`on d0`",
            "slot `s` bound to bytes 4..68 of a buffer of 128",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        plan.take_profile();
        // Bound to aligned bytes, the next run runs whole.
        plan.bind(slot, &View::new(&big, 64, 64).unwrap()).unwrap();
        plan.run().unwrap().wait(LONG).unwrap();
    });
}

static HOLD_RUN_0: AtomicBool = AtomicBool::new(false);

/// Run 0's kernel (held until the test says) writes 7; the slot is rebound
/// to a misaligned view, and run 1 is refused at submit. Run 0 must still
/// succeed: the refusal failed `base + count` of every queue at once, which
/// covered run 0's values not yet reached, so `run0.wait()` returned run
/// 1's refusal though its kernel ran (issue 35, defect 3; failed on
/// e24445a).
#[test]
fn a_refused_run_never_fails_the_run_in_flight_before_it() {
    fn write_7(_: &WorkGroup, args: &KernelArgs<'_>) {
        hold(&HOLD_RUN_0);
        // SAFETY: one work-group: nothing else touches the buffer.
        unsafe { args.buffer(0).slice_mut::<u32>(0..1)[0] = 7 };
    }
    no_hang("a refused run after one in flight", || {
        let program = CpuProgram::from_fn("write_7", 1, 0, write_7);
        let (mut plan, slot) = one_writer(Arc::new(CpuDevice::new()), &program);
        let out = CpuDevice::new().alloc(128).unwrap();
        plan.bind(slot, &View::new(&out, 0, 64).unwrap()).unwrap();
        let run0 = plan.run().unwrap();
        plan.bind(slot, &View::new(&out, 4, 64).unwrap()).unwrap();
        let error = plan.run().unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::ViewMisaligned { .. }),
            "{error}"
        );
        HOLD_RUN_0.store(true, Ordering::Release);
        run0.wait(LONG).unwrap();
        assert_eq!(out.to_vec::<u32>().unwrap()[0], 7);
    });
}

/// How many runs' `held` kernels may pass, and how many have started.
static RUNS_LET_THROUGH: AtomicUsize = AtomicUsize::new(0);
static HELD_STARTED: AtomicUsize = AtomicUsize::new(0);

/// Slot `S` bound to `X[0..64]`, rebound to `X[32..96]` while run 0 is in
/// flight: run 0 reads `S[32..64]` (= `X[32..64]`) in a kernel held behind
/// another, and the copy queue fills `S[0..32]`, which in run 1 is
/// `X[32..64]`: run 0's input. The back-to-back waits compare the slot's
/// offsets, and the binding barrier skipped the same slot, so run 1's fill
/// overwrote run 0's input before it was read (issue 35, defect 2: run 0
/// read 0x22 instead of 0x11 on e24445a). The test holds run 0's kernels
/// until run 1's fill had every chance to run (or, fixed, is seen to wait),
/// and each run's kernels until the one before was checked.
#[test]
fn a_slot_rebound_to_overlapping_shifted_bytes_waits_for_the_run_using_them() {
    fn held(_: &WorkGroup, _: &KernelArgs<'_>) {
        let me = HELD_STARTED.fetch_add(1, Ordering::AcqRel);
        while RUNS_LET_THROUGH.load(Ordering::Acquire) <= me {
            thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    fn copy_out(_: &WorkGroup, args: &KernelArgs<'_>) {
        // SAFETY: one work-group; the input is only read, the output only
        // written, and they are different buffers.
        unsafe {
            let input = args.buffer(0).as_slice::<u8>();
            args.buffer(1)
                .slice_mut::<u8>(0..input.len())
                .copy_from_slice(input);
        }
    }
    no_hang("a shifted rebinding", || {
        let mut schedule = Schedule::<Cpu>::new();
        let device = schedule.add_device(Arc::new(CpuDevice::new()));
        let x = CpuDevice::new().alloc(128).unwrap();
        x.write_from(&[0x11u8; 128]).unwrap();
        let dummy = schedule.add_buffer(device, "dummy", CpuDevice::new().alloc(4).unwrap());
        let out_buffer = CpuDevice::new().alloc(32).unwrap();
        let out = schedule.add_buffer(device, "out", out_buffer.clone());
        let slot = schedule.add_slot(device, "s", 64);
        let upper = schedule.add_view("s[32..64]", slot, 32, 32).unwrap();
        let lower = schedule.add_view("s[0..32]", slot, 0, 32).unwrap();
        let (held, copy_out) = (
            CpuProgram::from_fn("held", 1, 0, held),
            CpuProgram::from_fn("copy_out", 2, 0, copy_out),
        );
        schedule
            .exec(
                "held",
                device,
                &held,
                &[dummy],
                &[],
                ExecParams::new_1d(1, 1),
            )
            .writes(dummy, ..);
        schedule
            .exec(
                "read s[32..64]",
                device,
                &copy_out,
                &[upper, out],
                &[],
                ExecParams::new_1d(1, 1),
            )
            .reads(upper, ..)
            .writes(out, ..);
        schedule
            .fill("fill s[0..32]", lower, 0x22u8)
            .on(QueueKind::Copy);
        let mut plan = schedule.plan().unwrap();
        plan.bind(slot, &View::new(&x, 0, 64).unwrap()).unwrap();
        let run0 = plan.run().unwrap();
        plan.bind(slot, &View::new(&x, 32, 64).unwrap()).unwrap();
        let run1 = plan.run().unwrap();
        // Give run 1's fill every chance to overtake run 0's read: look for
        // its bytes for a while (bounded), then let run 0 go.
        for _ in 0..200 {
            if x.to_vec::<u8>().unwrap()[32] == 0x22 {
                break;
            }
            thread::sleep(std::time::Duration::from_millis(1));
        }
        RUNS_LET_THROUGH.store(1, Ordering::Release);
        run0.wait(LONG).unwrap();
        assert_eq!(
            out_buffer.to_vec::<u8>().unwrap(),
            vec![0x11; 32],
            "run 0 read bytes run 1 wrote"
        );
        RUNS_LET_THROUGH.store(2, Ordering::Release);
        run1.wait(LONG).unwrap();
        // Run 1 read its own `S[32..64]` = `X[64..96]`, untouched.
        assert_eq!(out_buffer.to_vec::<u8>().unwrap(), vec![0x11; 32]);
        assert_eq!(x.to_vec::<u8>().unwrap()[32..64], [0x22; 32]);
    });
}

static FAILED: AtomicBool = AtomicBool::new(false);
static LET_READ_X: AtomicBool = AtomicBool::new(false);
/// The first byte `read_x` saw, each time it ran.
static READS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Three queues: an upload of `x` (device 0's copy queue), a kernel reading
/// `x` on device 0 (behind one held until the test says), and on device 1 a kernel
/// that fails, then one that reads what the first kernel wrote. The next
/// run's upload of `x` must wait for the held kernel of this run; the
/// planner kept only its wait on device 1's second kernel, which implies
/// the held one. Device 1 failed before it waited, so that value failed,
/// the new run skipped the wait, and the upload overwrote `x` under the
/// held kernel (issue 35, defect 4: the kernel read run 1's 0x22 on
/// 4d88083).
#[test]
fn after_a_failed_run_its_surviving_operations_still_order_the_next_run() {
    fn held(_: &WorkGroup, _: &KernelArgs<'_>) {
        hold(&LET_READ_X);
    }
    fn read_x(_: &WorkGroup, args: &KernelArgs<'_>) {
        // SAFETY: one work-group; `x` is only read.
        let first = unsafe { args.buffer(0).as_slice::<u8>()[0] };
        READS.lock().unwrap().push(first);
    }
    fn fail(_: &WorkGroup, _: &KernelArgs<'_>) {
        FAILED.store(true, Ordering::Release);
        panic!("device 1's kernel fails");
    }
    no_hang("a run after a failed one", || {
        let mut schedule = Schedule::<Cpu>::new();
        let d0 = schedule.add_device(Arc::new(CpuDevice::new()));
        let d1 = schedule.add_device(Arc::new(CpuDevice::new()));
        let alloc = |n| CpuDevice::new().alloc(n).unwrap();
        let x_bytes = alloc(64);
        let x = schedule.add_buffer(d0, "x", x_bytes.clone());
        let seen = schedule.add_buffer(d0, "seen", alloc(64));
        let scratch = schedule.add_buffer(d1, "scratch", alloc(4));
        let after = schedule.add_buffer(d1, "after", alloc(4));
        let dummy = schedule.add_buffer(d0, "dummy", alloc(4));
        let (held, read_x, fail, touch) = (
            CpuProgram::from_fn("held", 1, 0, held),
            CpuProgram::from_fn("read_x", 2, 0, read_x),
            CpuProgram::from_fn("fail", 1, 0, fail),
            CpuProgram::from_fn("touch", 1, 0, |_, _| {}),
        );
        let upload = schedule.upload("upload x", x).id();
        schedule
            .exec("fail", d1, &fail, &[scratch], &[], ExecParams::new_1d(1, 1))
            .writes(scratch, ..);
        schedule
            .exec("held", d0, &held, &[dummy], &[], ExecParams::new_1d(1, 1))
            .writes(dummy, ..);
        schedule
            .exec(
                "read x",
                d0,
                &read_x,
                &[x, seen],
                &[],
                ExecParams::new_1d(1, 1),
            )
            .reads(x, ..)
            .writes(seen, ..);
        schedule
            .exec("after", d1, &touch, &[after], &[], ExecParams::new_1d(1, 1))
            .reads(seen, ..)
            .reads(x, ..)
            .writes(after, ..);
        let mut plan = schedule.plan().unwrap();
        plan.upload(upload, &[0x11u8; 64]).unwrap();
        let run0 = plan.run().unwrap();
        // Device 1's kernel failed before the next run is recorded (its
        // value failing follows within microseconds; either order is
        // correct, this one is the case that broke); device 0's kernels
        // are still held. Device 1's later values settle only after the
        // held read, which its last operation waits for.
        hold(&FAILED);
        thread::sleep(std::time::Duration::from_millis(20));
        assert!(!run0.is_complete());
        assert!(READS.lock().unwrap().is_empty());
        plan.upload(upload, &[0x22u8; 64]).unwrap();
        let run1 = plan.run().unwrap();
        // Give run 1's upload every chance to overtake run 0's held read.
        for _ in 0..200 {
            if x_bytes.to_vec::<u8>().unwrap()[0] == 0x22 {
                break;
            }
            thread::sleep(std::time::Duration::from_millis(1));
        }
        LET_READ_X.store(true, Ordering::Release);
        // Run 0 failed on its own; run 1 ran whole.
        let error = run0.wait(LONG).unwrap_err();
        assert!(error.to_string().contains("`fail`"), "{error}");
        let error = run1.wait(LONG).unwrap_err();
        assert!(error.to_string().contains("`fail`"), "{error}");
        plan.take_profile();
        let reads = READS.lock().unwrap().clone();
        assert_eq!(reads, [0x11, 0x22], "run 0's read saw run 1's upload");
        assert_eq!(x_bytes.to_vec::<u8>().unwrap(), vec![0x22; 64]);
    });
}

static LET_RUN_0_FAIL: AtomicBool = AtomicBool::new(false);

/// An upload, a kernel that adds one to each byte (and fails when its
/// scalar slot says so, once `LET_RUN_0_FAIL` is set), a download: run 0
/// fails, run 1 is recorded back to back before run 0's kernel even ran.
/// Run 1's batches waited on run 0's values and were skipped behind its
/// failure, so run 1 reported run 0's kernel error (found with the queue
/// core's cascade; failed on 7d514ab). Run 0's own failure must stay
/// reported after run 1 raised the queues' values past it.
#[test]
fn a_run_recorded_right_after_a_failing_one_runs_and_the_failure_stays_its_own() {
    fn add_one(_: &WorkGroup, args: &KernelArgs<'_>) {
        if args.scalar::<u32>(0) == 1 {
            hold(&LET_RUN_0_FAIL);
            panic!("run 0's kernel fails");
        }
        // SAFETY: one work-group; `x` is only read, `y` only written.
        let (x, y) = unsafe {
            (
                args.buffer(0).as_slice::<u8>(),
                args.buffer(1).slice_mut::<u8>(0..64),
            )
        };
        for (y, x) in y.iter_mut().zip(x) {
            *y = x + 1;
        }
    }
    no_hang("a run after a failing one", || {
        let mut schedule = Schedule::<Cpu>::new();
        let d0 = schedule.add_device(Arc::new(CpuDevice::new()));
        let x = schedule.add_buffer(d0, "x", CpuDevice::new().alloc(64).unwrap());
        let y = schedule.add_buffer(d0, "y", CpuDevice::new().alloc(64).unwrap());
        let fail = schedule.add_scalar("fail", 0u32);
        let upload = schedule.upload("upload x", x).id();
        schedule
            .exec(
                "add one",
                d0,
                &CpuProgram::from_fn("add_one", 2, 1, add_one),
                &[x, y],
                &[0u32.into()],
                ExecParams::new_1d(1, 1),
            )
            .reads(x, ..)
            .writes(y, ..)
            .scalar(0, fail);
        let download = schedule.download("download y", y).id();
        let mut plan = schedule.plan().unwrap();
        let outputs = [
            hwqueue::Download::<u8>::new(64),
            hwqueue::Download::<u8>::new(64),
        ];
        let mut runs = Vec::new();
        for (run, output) in outputs.iter().enumerate() {
            plan.set_scalar(fail, u32::from(run == 0)).unwrap();
            plan.upload(upload, &[run as u8 * 10; 64]).unwrap();
            plan.download(download, output).unwrap();
            runs.push(plan.run().unwrap());
        }
        LET_RUN_0_FAIL.store(true, Ordering::Release);
        runs[1].wait(LONG).unwrap();
        assert_eq!(outputs[1].take(LONG).unwrap(), vec![11u8; 64]);
        let error = runs[0].wait(LONG).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error.root_cause(), Error::KernelFailed { .. }) && text.contains("add one"),
            "{text}"
        );
        assert!(outputs[0].take(LONG).is_err());
        // The next run, once everything settled, runs too.
        let output = hwqueue::Download::<u8>::new(64);
        plan.set_scalar(fail, 0u32).unwrap();
        plan.upload(upload, &[4u8; 64]).unwrap();
        plan.download(download, &output).unwrap();
        plan.run().unwrap().wait(LONG).unwrap();
        assert_eq!(output.take(LONG).unwrap(), vec![5u8; 64]);
    });
}

static LET_RUN_0_END: AtomicBool = AtomicBool::new(false);

/// Run 0 is held; run 1 is refused (a slot bound to a misaligned view);
/// run 2, rebound, is recorded while run 0 still runs. Run 1's values
/// fail only after run 0's, in queue order; run 2 waited on them and
/// reported run 1's refusal (failed on 7d514ab).
#[test]
fn a_run_recorded_while_a_refused_one_s_values_are_pending_runs() {
    fn held_copy(_: &WorkGroup, args: &KernelArgs<'_>) {
        hold(&LET_RUN_0_END);
        // SAFETY: one work-group; `s` is only read, `out` only written.
        let (s, out) = unsafe {
            (
                args.buffer(0).as_slice::<u8>(),
                args.buffer(1).slice_mut::<u8>(0..64),
            )
        };
        out.copy_from_slice(&s[..64]);
    }
    no_hang("a run after a refused one", || {
        let mut schedule = Schedule::<Cpu>::new();
        let d0 = schedule.add_device(Arc::new(CpuDevice::new()));
        let slot = schedule.add_slot(d0, "s", 64);
        let out = schedule.add_buffer(d0, "out", CpuDevice::new().alloc(64).unwrap());
        let upload = schedule.upload("upload s", slot).id();
        schedule
            .exec(
                "copy s",
                d0,
                &CpuProgram::from_fn("held_copy", 2, 0, held_copy),
                &[slot, out],
                &[],
                ExecParams::new_1d(1, 1),
            )
            .reads(slot, ..)
            .writes(out, ..);
        let download = schedule.download("download out", out).id();
        let mut plan = schedule.plan().unwrap();
        let alloc = |n| CpuDevice::new().alloc(n).unwrap();
        let (good, big) = (alloc(64), alloc(128));
        let outputs = [
            hwqueue::Download::<u8>::new(64),
            hwqueue::Download::<u8>::new(64),
            hwqueue::Download::<u8>::new(64),
        ];
        plan.bind(slot, &good).unwrap();
        plan.upload(upload, &[1u8; 64]).unwrap();
        plan.download(download, &outputs[0]).unwrap();
        let run0 = plan.run().unwrap();
        plan.bind(slot, &View::new(&big, 4, 64).unwrap()).unwrap();
        plan.upload(upload, &[2u8; 64]).unwrap();
        plan.download(download, &outputs[1]).unwrap();
        let refused = plan.run().unwrap_err();
        assert!(
            matches!(refused.root_cause(), Error::ViewMisaligned { .. }),
            "{refused}"
        );
        plan.bind(slot, &good).unwrap();
        plan.upload(upload, &[3u8; 64]).unwrap();
        plan.download(download, &outputs[2]).unwrap();
        let run2 = plan.run().unwrap();
        LET_RUN_0_END.store(true, Ordering::Release);
        run0.wait(LONG).unwrap();
        assert_eq!(outputs[0].take(LONG).unwrap(), vec![1u8; 64]);
        run2.wait(LONG).unwrap();
        assert_eq!(outputs[2].take(LONG).unwrap(), vec![3u8; 64]);
        // Run 1's download was recorded on the copy queue, submitted before
        // the compute queue refused the run: it fails in that queue's order.
        let error = outputs[1].take(LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::ViewMisaligned { .. }),
            "{error}"
        );
    });
}

/// The same buffer added twice (two handles of it) is one memory: a kernel
/// writing it through one id on the compute queue and a download reading it
/// through the other on the copy queue are ordered by a wait. On `f9d6c0d`
/// the two ids were two roots, so the plan ordered them as different
/// memory: no wait, and the download could read while the kernel wrote.
#[test]
fn a_buffer_added_twice_is_one_memory_to_the_planner() {
    let mut schedule = Schedule::<Cpu>::new();
    let device = CpuDevice::new();
    let d = schedule.add_device(Arc::new(device.clone()));
    let buffer = device.alloc(64).unwrap();
    let first = schedule.add_buffer(d, "first", buffer.clone());
    let again = schedule.add_buffer(d, "again", buffer.clone());
    let write = CpuProgram::from_fn("write", 1, 0, |_, args: &KernelArgs<'_>| {
        // SAFETY: one work-group, the only access to the buffer.
        unsafe { args.buffer(0).slice_mut::<u32>(0..16) }.fill(7);
    });
    let writer = (schedule.exec("write", d, &write, &[first], &[], ExecParams::new_1d(1, 1)))
        .writes(first, ..)
        .id();
    let reader = schedule.download("read", again).on(QueueKind::Copy).id();
    let plan = schedule.plan().unwrap();
    assert_ne!(plan.queue_of(writer), plan.queue_of(reader), "{plan}");
    assert!(
        plan.waits_of(reader)
            .iter()
            .any(|wait| wait.after == writer && !wait.previous_run),
        "the download does not wait for the kernel:\n{plan}"
    );
}

static HOLD_FIRST_BINDING: AtomicBool = AtomicBool::new(false);

/// A slot bound to `x`, run (held), rebound to `y` and run while the first
/// run is in flight: once both runs settled and the caller dropped `x`, its
/// memory goes back to the pool. The plan kept the first binding (to order
/// later rebindings against the run using it) until the slot was rebound
/// *again*, so a plan rebound once and then run with the same buffers held
/// `x` for as long as it lived.
#[test]
fn a_binding_replaced_and_settled_is_let_go() {
    fn held(_: &WorkGroup, _: &KernelArgs<'_>) {
        hold(&HOLD_FIRST_BINDING);
    }
    no_hang("a replaced binding let go", || {
        let device = Arc::new(CpuDevice::new());
        let program = CpuProgram::from_fn("held", 1, 0, held);
        let (mut plan, slot) = one_writer(device.clone(), &program);
        let live = || device.memory_stats().live_allocations;
        let x = device.alloc(64).unwrap();
        let y = device.alloc(64).unwrap();
        plan.bind(slot, &x).unwrap();
        let run0 = plan.run().unwrap();
        // Run 0 is held: the rebinding meets it in flight.
        plan.bind(slot, &y).unwrap();
        let run1 = plan.run().unwrap();
        HOLD_FIRST_BINDING.store(true, Ordering::Release);
        run0.wait(LONG).unwrap();
        run1.wait(LONG).unwrap();
        // More runs, the same binding.
        plan.run().unwrap().wait(LONG).unwrap();
        let before = live();
        drop(x);
        assert_eq!(
            live(),
            before - 1,
            "the plan still holds the replaced binding"
        );
        drop(y);
        assert_eq!(
            live(),
            before - 1,
            "the bound buffer is the plan's until rebound"
        );
    });
}
