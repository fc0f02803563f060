//! The simulator's replay form, from outside the crate (issue 45): a plan
//! whose bindings and scalars did not change since its last recorded run
//! names its recorded programs (`HardwareQueue::replay_recorded`,
//! `replay_program`) instead of recording its kernels, and computes what
//! the same plan with replay off computes, run after run, with its slots
//! bound before every run and bound elsewhere (and its scalar changed) one
//! run in three. The kernels really compute here, so the downloads and the
//! buffers' bytes show it.

use std::sync::Arc;

use hwqueue::{
    Buffer, Device, Download, ExecParams, HardwareQueue, Plan, QueueFactory, Scalar, Schedule,
    TimelineSignal, Timeout,
};
use hwqueue_sim::{KernelArgs, Sim, SimConfig, SimDevice, SimProgram};

const WORDS: usize = 64;
const RUNS: u32 = 300;

/// `a[i] = a[i] * 3 + b[i] + k` (u32, wrapping).
fn mix(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let k = match args.scalars() {
        [Scalar::U32(k)] => *k,
        other => return Err(format!("mix takes one u32 scalar, not {other:?}")),
    };
    let (mut a, b): (Vec<u32>, Vec<u32>) = (args.read(0), args.read(1));
    for (a, b) in a.iter_mut().zip(&b) {
        *a = a.wrapping_mul(3).wrapping_add(*b).wrapping_add(k);
    }
    args.write(0, &a);
    Ok(())
}

/// A plan of an upload into a tensor, four `mix`es over it and two slots
/// (one taking the scalar slot), and the output's download; with the
/// buffers its slots are bound to, three inputs and three outputs.
struct Mixer {
    plan: Plan<Sim>,
    slots: [hwqueue::BufferId; 2],
    k: hwqueue::ScalarId,
    up: hwqueue::OpId,
    down: hwqueue::OpId,
    buffers: Vec<hwqueue_sim::SimBuffer>,
}

impl Mixer {
    fn new(device: &Arc<SimDevice>, replay: bool) -> Self {
        let program = SimProgram::new("mix", 2, 1, mix);
        let mut schedule = Schedule::<Sim>::new();
        let d = schedule.add_device(device.clone());
        let input = schedule.add_slot(d, "in", WORDS * 4);
        let output = schedule.add_slot(d, "out", WORDS * 4);
        let t = schedule.add_tensor(d, "t", WORDS * 4);
        let k = schedule.add_scalar("k", 0u32);
        let grid = ExecParams::new_1d(WORDS as u32, 64);
        let up = schedule.upload("upload t", t).id();
        schedule
            .exec("t += in", d, &program, &[t, input], &[Scalar::U32(0)], grid)
            .scalar(0, k);
        schedule.exec(
            "out += t",
            d,
            &program,
            &[output, t],
            &[Scalar::U32(7)],
            grid,
        );
        schedule
            .exec(
                "out += in",
                d,
                &program,
                &[output, input],
                &[Scalar::U32(0)],
                grid,
            )
            .scalar(0, k);
        schedule.exec(
            "t += out",
            d,
            &program,
            &[t, output],
            &[Scalar::U32(1)],
            grid,
        );
        let down = schedule.download("download out", output).id();
        let mut plan = schedule.plan().unwrap();
        plan.set_replay(replay);
        let buffers = (0..6u32)
            .map(|b| {
                let buffer = device.alloc(WORDS * 4).unwrap();
                buffer.write_at(0, &vec![b * 1000; WORDS]).unwrap();
                buffer
            })
            .collect();
        Self {
            plan,
            slots: [input, output],
            k,
            up,
            down,
            buffers,
        }
    }

    /// One run over input `i` and output `o` (of three each), scalar `k`
    /// where given, upload `seed`: what it downloaded.
    fn run(&mut self, i: usize, o: usize, k: Option<u32>, seed: u32) -> Vec<u32> {
        self.plan.bind(self.slots[0], &self.buffers[i]).unwrap();
        self.plan.bind(self.slots[1], &self.buffers[3 + o]).unwrap();
        if let Some(k) = k {
            self.plan.set_scalar(self.k, k).unwrap();
        }
        let data: Vec<u32> = (0..WORDS as u32).map(|w| w ^ seed).collect();
        self.plan.upload(self.up, &data).unwrap();
        let out = Download::<u32>::new(WORDS);
        self.plan.download(self.down, &out).unwrap();
        self.plan.run().unwrap().wait(Timeout::Forever).unwrap();
        out.take(Timeout::Forever).unwrap()
    }
}

#[test]
fn a_simulated_plan_repeats_its_programs_and_computes_what_it_computes_without_replay() {
    let device = Arc::new(SimDevice::new(0, SimConfig::default()));
    let (mut replayed, mut plain) = (Mixer::new(&device, true), Mixer::new(&device, false));
    let mut state = 0x2545_f491_u32;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let (mut i, mut o) = (0, 0);
    for run in 0..RUNS {
        let r = next();
        let rebind = run == 0 || r % 3 == 0;
        let k = rebind.then_some((r >> 8) % 5);
        if rebind {
            (i, o) = (((r >> 12) % 3) as usize, ((r >> 16) % 3) as usize);
        }
        let seed = next();
        let want = plain.run(i, o, k, seed);
        let got = replayed.run(i, o, k, seed);
        assert_eq!(got, want, "run {run}: in {i}, out {o}, k {k:?}");
    }
    for (a, b) in replayed.buffers.iter().zip(&plain.buffers) {
        assert_eq!(a.to_vec::<u32>().unwrap(), b.to_vec::<u32>().unwrap());
    }
    let (on, off) = (replayed.plan.launches(), plain.plan.launches());
    // About two runs in three repeat their one program of four kernels.
    assert!(on.repeats >= u64::from(RUNS) / 2, "{on:?}");
    assert_eq!(on.programs, on.repeats);
    assert_eq!(
        on.kernels + 4 * on.repeats,
        off.kernels,
        "{on:?} against {off:?}"
    );
    assert_eq!(off.repeats, 0);
}

/// The queue-level contract on the simulator: programs are offered only
/// for the kernel counts they run, and a batch naming one the queue does
/// not offer is rejected when submitted.
#[test]
fn the_simulator_offers_its_programs_only_as_recorded() {
    let device = SimDevice::new(0, SimConfig::default());
    let program = SimProgram::new("mix", 2, 1, mix);
    let (a, b) = (
        device.alloc(WORDS * 4).unwrap(),
        device.alloc(WORDS * 4).unwrap(),
    );
    let signal = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    let grid = ExecParams::new_1d(WORDS as u32, 64);
    assert!(!queue.replay_recorded(3, &[2]), "nothing recorded yet");
    queue
        .exec(&program, &[&a, &b], &[Scalar::U32(1)], grid)
        .signal(&signal, 1)
        .exec(&program, &[&b, &a], &[Scalar::U32(2)], grid)
        .signal(&signal, 2)
        .replay_as(3)
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert!(!queue.replay_recorded(3, &[3]), "other counts");
    assert!(!queue.replay_recorded(4, &[2]), "another key");
    assert!(queue.replay_recorded(3, &[2]));
    queue
        .replay_program(0)
        .signal(&signal, 3)
        .replay_as(3)
        .submit()
        .unwrap();
    signal.wait(3, Timeout::Forever).unwrap();
    assert_eq!(queue.launches().repeats, 1);
    let refused = queue.replay_program(1).signal(&signal, 4).submit();
    assert!(
        matches!(&refused, Err(hwqueue::Error::BatchRejected { cause })
            if matches!(&**cause, hwqueue::Error::ReplayNotRecorded { index: 1, .. })),
        "{refused:?}"
    );
    // Offered, then asked again for other counts: nothing is kept, so a
    // batch naming program 0 is rejected.
    assert!(queue.replay_recorded(3, &[2]));
    assert!(!queue.replay_recorded(3, &[3]));
    let stale = queue.replay_program(0).signal(&signal, 4).submit();
    assert!(
        matches!(&stale, Err(hwqueue::Error::BatchRejected { .. })),
        "{stale:?}"
    );
}

/// `data[i] += 1` (u32).
fn bump(args: &mut KernelArgs<'_>) -> Result<(), String> {
    let mut data: Vec<u32> = args.read(0);
    for word in &mut data {
        *word = word.wrapping_add(1);
    }
    args.write(0, &data);
    Ok(())
}

/// A stretch whose last kernel waits on the run before (it writes what
/// that run's download, on the copy queue, read): that wait goes before
/// the stretch's first kernel, so the stretch is one program whether the
/// wait is pending or not, and runs waited for one by one (the wait never
/// pending) and runs started back to back (pending) both repeat it. Before
/// (review of aca4c72) the plan split the stretch at that wait and the
/// engine did not (the wait was not recorded): 0 repeats in 20 runs.
#[test]
fn a_stretch_whose_later_kernel_waits_on_the_run_before_still_repeats() {
    let device = Arc::new(SimDevice::new(0, SimConfig::default()));
    let program = SimProgram::new("bump", 1, 0, bump);
    let mut schedule = Schedule::<Sim>::new();
    let d = schedule.add_device(device.clone());
    let z = schedule.add_slot(d, "z", 64);
    let y = schedule.add_slot(d, "y", 64);
    let grid = ExecParams::new_1d(16, 16);
    schedule.exec("z + 1", d, &program, &[z], &[], grid);
    schedule.exec("z + 2", d, &program, &[z], &[], grid);
    let last = schedule.exec("y + 1", d, &program, &[y], &[], grid).id();
    let down = schedule.download("download y", y).id();
    let mut plan = schedule.plan().unwrap();
    assert!(
        plan.waits_of(last).iter().any(|wait| wait.previous_run),
        "the schedule must give `y + 1` a wait on the run before: {plan}"
    );
    let (zb, yb) = (device.alloc(64).unwrap(), device.alloc(64).unwrap());
    plan.bind(z, &zb).unwrap();
    plan.bind(y, &yb).unwrap();
    let mut downloads = Vec::new();
    for run in 0..40u32 {
        let out = Download::<u32>::new(16);
        plan.download(down, &out).unwrap();
        let handle = plan.run().unwrap();
        // The first half waited for one by one, the second back to back.
        if run < 20 {
            handle.wait(Timeout::Forever).unwrap();
        }
        downloads.push((run, out, handle));
    }
    for (run, out, handle) in downloads {
        handle.wait(Timeout::Forever).unwrap();
        assert_eq!(
            out.take(Timeout::Forever).unwrap(),
            vec![run + 1; 16],
            "run {run}"
        );
    }
    assert_eq!(zb.to_vec::<u32>().unwrap(), vec![80; 16]);
    // Each of the first 20 runs, waited for, repeats the one before (19);
    // of the 20 started back to back, those whose run before was enqueued
    // in time do too, which a loaded machine may cut short (28 of 40 in a
    // fresh-clone CI sharing its cores with builds, against the 30 this
    // asked before). The defect gave 0.
    let launches = plan.launches();
    assert!(launches.repeats >= 19, "{launches:?}");
}

/// A stretch of three kernels, `a`, `b` and `c`, repeated as one program
/// (the second run names it instead of recording its kernels), whose
/// third kernel fails. The repeat sets the stretch's last value only, so
/// every kernel of it looks unfinished, and the run named the first one,
/// `a`, though the error named `c`'s kernel; without replay it names `c`.
#[test]
fn a_failure_inside_a_repeated_stretch_names_the_kernel_that_failed() {
    for replay in [false, true] {
        // Three `exec`s a run: the sixth is the second run's `c`.
        let device = Arc::new(SimDevice::new(0, SimConfig::default().fail_exec(6)));
        let mut schedule = Schedule::<Sim>::new();
        let d = schedule.add_device(device.clone());
        let z = schedule.add_slot(d, "z", 64);
        let grid = ExecParams::new_1d(16, 16);
        for name in ["a", "b", "c"] {
            let program = SimProgram::new(name, 1, 0, bump);
            schedule.exec(format!("bump {name}"), d, &program, &[z], &[], grid);
        }
        let mut plan = schedule.plan().unwrap();
        plan.set_replay(replay);
        plan.bind(z, &device.alloc(64).unwrap()).unwrap();
        plan.run().unwrap().wait(Timeout::Forever).unwrap();
        let error = plan.run().unwrap().wait(Timeout::Forever).unwrap_err();
        assert_eq!(
            plan.launches().repeats,
            u64::from(replay),
            "replay {replay}"
        );
        match &error {
            hwqueue::Error::OperationFailed { operation, .. } => {
                assert_eq!(operation, "bump c", "replay {replay}: {error}");
            }
            other => panic!("replay {replay}: {other}"),
        }
    }
}
