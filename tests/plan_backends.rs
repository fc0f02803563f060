//! Plans over two backends (issue 44): the CPU beside a backend defined
//! outside the crate (the mock, in a `backend_set!` of the test's own, as
//! docs/backends.md shows) and beside Vulkan through `AnyBackend` (lavapipe
//! in CI). Runs are started back to back, several in flight, with a
//! failing run and a refused one among them; see
//! `hwqueue_testkit::two_backends`. The simulator's pair is in
//! `sim/tests/plan_backends.rs`.
#![cfg(not(loom))]

mod common;

use std::sync::Arc;

use common::mock::*;
use common::no_hang;
use hwqueue::cpu::CpuDevice;
use hwqueue::{Backend, View};
use hwqueue_testkit::check_plan_over_two_backends;

/// `data[i] += 1` (u32) over the view: the mock's `add` (its scalar is
/// always 1 in the harness; the mock passes no scalars to kernels).
fn add_one(views: &[View<Mock>]) {
    let view = &views[0];
    let mut memory = view.buffer().0.lock().unwrap();
    for word in memory[view.range()].chunks_exact_mut(4) {
        let value = u32::from_ne_bytes(word.try_into().unwrap()).wrapping_add(1);
        word.copy_from_slice(&value.to_ne_bytes());
    }
}

#[test]
fn a_plan_over_the_cpu_and_a_user_backend_runs_back_to_back() {
    no_hang("runs of a plan over the CPU and the mock", || {
        let cpu = Arc::new(MixedDevice::from(CpuDevice::new()));
        let mock = Arc::new(MixedDevice::from(Mock::open(4).unwrap()));
        // One scalar, as the harness passes (the mock's kernels see none).
        let add = MixedProgram::from(MockProgram {
            signature: hwqueue::KernelSignature::new("add", 1, 1),
            kernel: add_one,
        });
        check_plan_over_two_backends::<Mixed>(cpu, mock, Some(add));
    });
}

/// CPU + Vulkan through `AnyBackend`, on whatever driver is there
/// (lavapipe in CI).
#[cfg(feature = "vulkan")]
mod vulkan {
    use std::sync::{Arc, OnceLock};

    use super::common::{LONG, no_hang};
    use hwqueue::cpu::{CpuDevice, CpuProgram, CpuSignal, KernelArgs, WorkGroup};
    use hwqueue::memory::Phase;
    use hwqueue::vulkan::{VulkanDevice, VulkanProgram};
    use hwqueue::{
        AnyBackend, AnyBuffer, AnyDevice, AnyProgram, Backend, Buffer, Device, ExecParams,
        HardwareQueue, QueueFactory, Schedule, TimelineSignal,
    };
    use hwqueue_testkit::check_plan_over_two_backends;

    /// The first usable Vulkan device's ordinal, or `None` (printing why
    /// the test skips; failing where `HWQUEUE_REQUIRE_VULKAN` is set).
    fn ordinal() -> Option<u32> {
        let skip = |why: String| {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
                "HWQUEUE_REQUIRE_VULKAN is set, and {why}"
            );
            println!("skipped: {why}");
            None
        };
        let devices = match hwqueue::vulkan::devices() {
            Ok(devices) => devices,
            Err(error) => return skip(format!("no Vulkan driver ({error})")),
        };
        match devices.iter().find(|d| d.unusable.is_none()) {
            Some(usable) => Some(usable.spec.ordinal()),
            None => skip(format!("no usable Vulkan device ({devices:?})")),
        }
    }

    /// The harness over a CPU device and a Vulkan handle of `ordinal`,
    /// opened here.
    fn run_the_harness(ordinal: u32) {
        let vulkan = VulkanDevice::open(ordinal).expect("a usable device opens");
        let add = VulkanProgram::from_wgsl("add", hwqueue_cts::ADD_WGSL, "add").unwrap();
        let cpu = Arc::new(AnyDevice::from(CpuDevice::new()));
        let other = Arc::new(AnyDevice::from(vulkan));
        check_plan_over_two_backends::<AnyBackend>(cpu, other, Some(AnyProgram::from(add)));
    }

    #[test]
    fn a_plan_over_the_cpu_and_vulkan_runs_back_to_back() {
        let Some(ordinal) = ordinal() else { return };
        assert_eq!(<AnyBackend as Backend>::ID, "any");
        no_hang("runs of a plan over the CPU and Vulkan", move || {
            run_the_harness(ordinal)
        });
    }

    /// As a process serving several models does: four threads, each with
    /// its own CPU device and Vulkan handle (one `VkDevice` under them
    /// all), run the harness's plan at once.
    #[test]
    fn plans_over_the_cpu_and_vulkan_run_in_four_threads_at_once() {
        let Some(ordinal) = ordinal() else { return };
        no_hang("four threads of plans over the CPU and Vulkan", move || {
            let threads: Vec<_> = (0..4)
                .map(|_| std::thread::spawn(move || run_the_harness(ordinal)))
                .collect();
            for thread in threads {
                thread.join().expect("a thread's plan failed (see above)");
            }
        });
    }

    /// Plans over the CPU and Vulkan (`AnyBackend`), in four threads at
    /// once, each with its own CPU device and Vulkan handle (one
    /// `VkDevice` under them all): every run binds the Vulkan slot to the
    /// next of six buffers, two kernels add to it, the host stage copies
    /// it to the CPU and the plan downloads it there. Every download is
    /// what the buffer held plus 3; where the driver rewrites descriptors,
    /// each thread's rebound runs patched its recording instead of
    /// recording again (CI runs this on Mesa 25's lavapipe with
    /// `HWQUEUE_REQUIRE_REBIND`, and every test here under the validation
    /// layer's core validation; not under its synchronization validation,
    /// whose tracking of timelines the host signals stalls the waits in
    /// bookworm's layer, 1.3.239: see `.ci/run`).
    #[test]
    fn plans_over_the_cpu_and_vulkan_rebound_every_run_in_four_threads() {
        use hwqueue::{Download, Scalar, Timeout};
        const WORDS: usize = 256;
        let Some(ordinal) = ordinal() else { return };
        let rewrites = VulkanDevice::open(ordinal).unwrap().rebinds_in_place();
        assert!(rewrites || std::env::var_os("HWQUEUE_REQUIRE_REBIND").is_none());
        let thread = move |seed: u32| {
            let vulkan = Arc::new(AnyDevice::from(VulkanDevice::open(ordinal).unwrap()));
            let cpu = Arc::new(AnyDevice::from(CpuDevice::new()));
            let add = VulkanProgram::from_wgsl("add", hwqueue_cts::ADD_WGSL, "add").unwrap();
            let add = AnyProgram::from(add);
            let mut s = Schedule::<AnyBackend>::new();
            let (d_vulkan, d_cpu) = (s.add_device(vulkan.clone()), s.add_device(cpu));
            let slot = s.add_slot(d_vulkan, "v", WORDS * 4);
            let grid = ExecParams::new_1d(WORDS as u32, 64);
            s.exec("add 1", d_vulkan, &add, &[slot], &[Scalar::U32(1)], grid);
            s.exec("add 2", d_vulkan, &add, &[slot], &[Scalar::U32(2)], grid);
            let y = s.add_tensor(d_cpu, "y", WORDS * 4);
            s.copy("v to y", y, slot);
            let down = s.download("y", y).id();
            let mut plan = s.plan().unwrap();
            let mut held: Vec<u32> = (0..6).map(|b| seed * 1000 + b * 100).collect();
            let buffers: Vec<_> = held
                .iter()
                .map(|&value| {
                    let buffer = vulkan.alloc(WORDS * 4).unwrap();
                    buffer.write_at(0, &[value; WORDS]).unwrap();
                    buffer
                })
                .collect();
            for run in 0..60 {
                let b = run % buffers.len();
                plan.bind(slot, &buffers[b]).unwrap();
                let out = Download::<u32>::new(WORDS);
                plan.download(down, &out).unwrap();
                plan.run().unwrap().wait(LONG).unwrap();
                held[b] += 3;
                let got = out.take(Timeout::Forever).unwrap();
                assert_eq!(got, vec![held[b]; WORDS], "thread {seed}, run {run}");
            }
            plan.launches()
        };
        let threads: Vec<_> = (0..4)
            .map(|seed| std::thread::spawn(move || thread(seed)))
            .collect();
        for handle in threads {
            let launches = handle.join().expect("a thread's plan failed (see above)");
            if rewrites {
                assert!(launches.patched >= 50, "{launches:?}");
            }
        }
    }

    /// Gates the CPU kernel of the host-stage tests waits at, by the
    /// index its scalar names.
    fn gates() -> &'static [CpuSignal; 2] {
        static GATES: OnceLock<[CpuSignal; 2]> = OnceLock::new();
        GATES.get_or_init(|| [CpuSignal::new(0), CpuSignal::new(0)])
    }

    /// Waits until gate `scalar 0` is set.
    fn gated(_: &WorkGroup, args: &KernelArgs<'_>) {
        let gate: u32 = args.scalar(0);
        gates()[gate as usize]
            .wait(1, LONG)
            .expect("the test opens the gate");
    }

    /// The host stage copying between the CPU and a Vulkan buffer made by
    /// `alloca`, whose `dealloca` runs after `run()` and before the copy
    /// (held behind a gated CPU kernel on the CPU side): the copy holds a
    /// use, so it reads (or writes) the buffer's bytes through Vulkan's
    /// `queue_read_at`/`queue_write_at`, and the range goes back only
    /// once it is done. `tests/executor.rs` has the CPU + mock pair.
    fn host_stage_and_a_vulkan_dealloca(ordinal: u32, vulkan_is_source: bool, gate: u32) {
        let vulkan = VulkanDevice::open(ordinal).expect("a usable device opens");
        let mut alloca_queue = vulkan.compute_queue().unwrap();
        let ordered = alloca_queue.alloca(16).unwrap();
        let done = vulkan.new_signal(0).unwrap();
        alloca_queue
            .upload(&ordered, &[1u32, 2, 3, 4])
            .signal(&done, 1)
            .submit()
            .unwrap();
        done.wait(1, LONG).unwrap();

        let cpu = Arc::new(AnyDevice::from(CpuDevice::new()));
        let other = Arc::new(AnyDevice::from(vulkan));
        let mut schedule = Schedule::<AnyBackend>::new();
        let (dc, dv) = (schedule.add_device(cpu.clone()), schedule.add_device(other));
        let on_cpu = cpu.alloc(16).unwrap();
        on_cpu.write_from(&[5u32, 6, 7, 8]).unwrap();
        let c = schedule.add_buffer(dc, "on cpu", on_cpu.clone());
        let slot = schedule.add_slot(dv, "ordered", 16);
        let wait = AnyProgram::from(CpuProgram::from_fn("gated", 1, 1, gated));
        schedule.exec(
            "gate",
            dc,
            &wait,
            &[c],
            &[gate.into()],
            ExecParams::new_1d(1, 1),
        );
        if vulkan_is_source {
            schedule.copy("vulkan to cpu", c, slot);
        } else {
            schedule.copy("cpu to vulkan", slot, c);
        }
        let mut plan = schedule.plan().unwrap();
        assert!(plan.queue_labels().contains(&"host"), "{plan}");
        plan.bind(slot, &AnyBuffer::from(ordered.clone())).unwrap();
        let run = plan.run().unwrap();
        alloca_queue
            .dealloca(&ordered)
            .signal(&done, 2)
            .submit()
            .unwrap();
        done.wait(2, LONG).unwrap();
        alloca_queue.synchronize().unwrap();
        let phase = || Buffer::queue_ordered(&ordered).unwrap().phase();
        assert_eq!(phase(), Phase::Ran, "the recorded copy holds a use");
        gates()[gate as usize].set(1);
        run.wait(LONG)
            .expect("a run recorded before the dealloca works on the buffer's bytes");
        if vulkan_is_source {
            assert_eq!(on_cpu.to_vec::<u32>().unwrap(), [1, 2, 3, 4]);
        }
        drop(plan);
        assert_eq!(phase(), Phase::Returned, "the range went back");
    }

    #[test]
    fn the_host_stage_reads_a_vulkan_source_deallocated_after_run() {
        let Some(ordinal) = ordinal() else { return };
        no_hang(
            "the host stage and a dealloca of a Vulkan source",
            move || host_stage_and_a_vulkan_dealloca(ordinal, true, 0),
        );
    }

    #[test]
    fn the_host_stage_writes_a_vulkan_destination_deallocated_after_run() {
        let Some(ordinal) = ordinal() else { return };
        no_hang(
            "the host stage and a dealloca of a Vulkan destination",
            move || host_stage_and_a_vulkan_dealloca(ordinal, false, 1),
        );
    }
}
