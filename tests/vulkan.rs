//! The Vulkan backend on a real driver (Mesa's lavapipe in CI; any Vulkan
//! 1.2 driver elsewhere). Each test prints `skipped: no Vulkan driver` and
//! returns where there is none. The conformance suite (`tests/cts.rs`)
//! runs the backend through the whole queue contract; these check what is
//! Vulkan's own.
#![cfg(feature = "vulkan")]

mod common;

use std::time::Duration;

use common::LONG;
use hwqueue::cpu::{CpuDevice, CpuSignal};
use hwqueue::vulkan::{STAGING_KEEP, Vulkan, VulkanDevice, VulkanProgram};
use hwqueue::{
    Backend, Buffer, Device, Download, Error, ExecParams, HardwareQueue, QueueFactory, Scalar,
    TimelineSignal, View,
};

/// The first usable Vulkan device, or `None` (printing why the test skips;
/// failing instead where `HWQUEUE_REQUIRE_VULKAN` is set, as CI sets it).
fn device() -> Option<VulkanDevice> {
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
    let Some(usable) = devices.iter().find(|d| d.unusable.is_none()) else {
        return skip(format!(
            "no Vulkan driver with a usable device ({devices:?})"
        ));
    };
    Some(VulkanDevice::open(usable.spec.ordinal()).expect("a usable device opens"))
}

const ADD: &str = "
override local_x: u32 = 64;
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
var<immediate> n: u32;
@compute @workgroup_size(local_x)
fn add(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) {
        data[id.x] = data[id.x] + n;
    }
}
";

const AXPY: &str = "
struct Params { a: f32, count: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
var<immediate> p: Params;
@compute @workgroup_size(32)
fn axpy(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < p.count) {
        y[id.x] = p.a * x[id.x] + y[id.x];
    }
}
";

#[test]
fn a_wgsl_kernel_runs_with_buffers_and_push_constant_scalars() {
    let Some(device) = device() else { return };
    let axpy = VulkanProgram::from_wgsl("axpy", AXPY, "axpy").unwrap();
    assert_eq!(axpy.workgroup_size(), Some([32, 1, 1]));
    let x = device.alloc(64 * 4).unwrap();
    let y = device.alloc(64 * 4).unwrap();
    x.write_at(0, &(0..64).map(|i| i as f32).collect::<Vec<_>>())
        .unwrap();
    y.write_at(0, &[1.0f32; 64]).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(
            &axpy,
            &[&x, &y],
            &[Scalar::F32(2.0), Scalar::U32(64)],
            ExecParams::new_1d(64, 32),
        )
        .signal(&done, 1);
    queue.submit().unwrap();
    done.wait(1, LONG).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..64).map(|i| 2.0 * i as f32 + 1.0).collect();
    assert_eq!(got, want);
}

/// An exec of the pipeline and bytes the command buffer has bound binds
/// nothing again; one of another pipeline (work-group size), buffer or
/// view, or after a fill, binds its own: every step's result is the one
/// a kernel-by-kernel replay in Rust gives.
#[test]
fn consecutive_execs_rebind_only_what_changed() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let a = device.alloc(256 * 4).unwrap();
    let b = device.alloc(256 * 4).unwrap();
    let a_tail = View::whole(&a).view(128 * 4, 128 * 4).unwrap();
    let mut want_a = vec![0u32; 256];
    let mut want_b = vec![0u32; 256];
    let mut queue = device.compute_queue().unwrap();
    for step in 1..=24u32 {
        // (what, local size): a and b whole, a's upper half, and a fill.
        let local = if step % 5 == 0 { 32 } else { 64 };
        let params = ExecParams::new_1d(256, local);
        match step % 4 {
            0 | 1 => {
                queue.exec(&add, &[&a], &[Scalar::U32(step)], params);
                want_a.iter_mut().for_each(|x| *x += step);
            }
            2 => {
                queue.exec(&add, &[&b], &[Scalar::U32(step)], params);
                want_b.iter_mut().for_each(|x| *x += step);
            }
            _ => {
                queue.exec_views(&add, &[&a_tail], &[Scalar::U32(step)], params);
                want_a[128..].iter_mut().for_each(|x| *x += step);
                if step % 8 == 7 {
                    queue.fill(&b, step);
                    want_b.iter_mut().for_each(|x| *x = step);
                }
            }
        }
    }
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    assert_eq!(a.to_vec::<u32>().unwrap(), want_a);
    assert_eq!(b.to_vec::<u32>().unwrap(), want_b);
}

#[test]
fn a_spirv_module_runs_as_given_and_its_interface_is_read_from_it() {
    let Some(device) = device() else { return };
    let compiled = VulkanProgram::from_wgsl("axpy", AXPY, "axpy").unwrap();
    let axpy = VulkanProgram::from_spirv("axpy (SPIR-V)", compiled.spirv(), "axpy").unwrap();
    assert_eq!(
        (
            hwqueue::Program::signature(&axpy).buffers,
            hwqueue::Program::signature(&axpy).scalars
        ),
        (2, 2)
    );
    half_of_three_each(&device, &axpy);
    // Not a module at all.
    let error = VulkanProgram::from_spirv("junk", &[1, 2, 3], "main").unwrap_err();
    assert!(matches!(error, Error::InvalidProgram { .. }), "{error}");
}

/// Runs `axpy` (`AXPY`'s interface) with a = 0.5 over x = 3 and y = 0,
/// and checks y = 1.5.
fn half_of_three_each(device: &VulkanDevice, axpy: &VulkanProgram) {
    let x = device.alloc(32 * 4).unwrap();
    let y = device.alloc(32 * 4).unwrap();
    x.write_at(0, &[3.0f32; 32]).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.exec(
        axpy,
        &[&x, &y],
        &[Scalar::F32(0.5), Scalar::U32(32)],
        ExecParams::new_1d(32, 32),
    );
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5f32; 32]);
}

/// A malformed module that panics naga's SPIR-V reader (a type whose
/// width it cannot lay out) is an error, not a panic of the caller.
#[test]
fn a_spirv_module_that_panics_naga_is_refused_with_an_error() {
    let compiled = VulkanProgram::from_wgsl("axpy", AXPY, "axpy").unwrap();
    let mut words = compiled.spirv().to_vec();
    // Found by mutating each word: naga unwraps a `LayoutError` here.
    words[41] = u32::MAX;
    let error = VulkanProgram::from_spirv("mutated", &words, "axpy").unwrap_err();
    assert!(matches!(error, Error::InvalidProgram { .. }), "{error}");
}

/// The words of the `OpMemberDecorate .. Offset` of the struct whose
/// member 1 sits at `second` bytes: (index of member 0's offset word).
fn member_zero_offset(words: &[u32], second: u32) -> usize {
    const MEMBER_DECORATE: u32 = 72;
    const OFFSET: u32 = 35;
    let mut decorations = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let (count, opcode) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        if opcode == MEMBER_DECORATE && count == 5 && words[at + 3] == OFFSET {
            decorations.push((words[at + 1], words[at + 2], at + 4));
        }
        at += count.max(1);
    }
    let params = decorations
        .iter()
        .find(|&&(_, member, word)| member == 1 && words[word] == second)
        .map(|&(id, ..)| id)
        .expect("a struct with member 1 at `second`");
    decorations
        .iter()
        .find(|&&(id, member, _)| id == params && member == 0)
        .map(|&(.., word)| word)
        .expect("its member 0's offset")
}

/// A SPIR-V module whose push-constant members are not in offset order
/// (member 0 after member 1, as a SPIR-V writer may lay them out): the
/// push constants span both (they were sized by the last member alone,
/// and the exec panicked at record time slicing past them).
#[test]
fn push_constant_members_out_of_offset_order_are_placed_where_the_module_says() {
    let Some(device) = device() else { return };
    let compiled = VulkanProgram::from_wgsl("axpy", AXPY, "axpy").unwrap();
    let mut words = compiled.spirv().to_vec();
    let word = member_zero_offset(&words, 4);
    assert_eq!(words[word], 0);
    words[word] = 8;
    let axpy = VulkanProgram::from_spirv("axpy (a at 8)", &words, "axpy").unwrap();
    half_of_three_each(&device, &axpy);
}

#[test]
fn a_shader_that_does_not_compile_says_where_and_why() {
    let error = VulkanProgram::from_wgsl(
        "broken",
        "@compute @workgroup_size(1)\nfn main() {\n    let x: u32 = nope;\n}\n",
        "main",
    )
    .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::Compile { .. }), "{text}");
    assert!(text.contains("line 3") && text.contains("nope"), "{text}");
    let error = VulkanProgram::from_wgsl("add", ADD, "main").unwrap_err();
    assert!(error.to_string().contains("add"), "{error}");
}

#[test]
fn an_exec_s_arguments_are_checked_against_the_shader_when_recorded() {
    let Some(device) = device() else { return };
    let axpy = VulkanProgram::from_wgsl("axpy", AXPY, "axpy").unwrap();
    let x = device.alloc(128).unwrap();
    let mut queue = device.compute_queue().unwrap();
    // A scalar of the wrong type.
    queue.exec(
        &axpy,
        &[&x, &x.clone()],
        &[Scalar::U32(2), Scalar::U32(32)],
        ExecParams::new_1d(32, 32),
    );
    let error = queue.submit().unwrap_err();
    assert!(error.to_string().contains("f32"), "{error}");
    // A local size the shader fixes otherwise.
    queue.exec(
        &axpy,
        &[&x, &x.clone()],
        &[Scalar::F32(2.0), Scalar::U32(32)],
        ExecParams::new_1d(32, 16),
    );
    let error = queue.submit().unwrap_err();
    assert!(error.to_string().contains("@workgroup_size"), "{error}");
}

/// lavapipe has one `VkQueue`: a submission waiting on a value nobody
/// submitted would stall every submission behind it. The queue waiting on
/// an unset signal holds its batch on the host instead, and the other
/// queue's independent work completes.
#[test]
fn a_queue_blocked_on_an_unset_signal_does_not_stall_another() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let gate = device.new_signal(0).unwrap();
    let (blocked_done, free_done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let a = device.alloc(64 * 4).unwrap();
    let b = device.alloc(64 * 4).unwrap();
    let mut blocked = device.compute_queue().unwrap();
    blocked
        .wait(&gate, 1)
        .exec(&add, &[&a], &[Scalar::U32(1)], ExecParams::new_1d(64, 64))
        .signal(&blocked_done, 1);
    blocked.submit().unwrap();
    let mut free = device.compute_queue().unwrap();
    free.exec(&add, &[&b], &[Scalar::U32(7)], ExecParams::new_1d(64, 64))
        .signal(&free_done, 1);
    free.submit().unwrap();
    free_done.wait(1, LONG).unwrap();
    assert_eq!(b.to_vec::<u32>().unwrap(), vec![7; 64]);
    assert!(matches!(
        blocked_done.wait(1, Duration::ZERO),
        Err(Error::Timeout { .. })
    ));
    gate.set(1);
    blocked_done.wait(1, LONG).unwrap();
    assert_eq!(a.to_vec::<u32>().unwrap(), vec![1; 64]);
}

/// A Vulkan queue waits for a CPU signal, and a CPU queue for a Vulkan one.
#[test]
fn waits_cross_between_vulkan_and_cpu_signals_both_ways() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let cpu = CpuDevice::new();
    let host_ready = CpuSignal::new(0);
    let vulkan_done = device.new_signal(0).unwrap();
    let data = device.alloc(16 * 4).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait_foreign(&host_ready, 1)
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(3)],
            ExecParams::new_1d(16, 16),
        )
        .signal(&vulkan_done, 1);
    queue.submit().unwrap();
    let cpu_done = CpuSignal::new(0);
    let mut cpu_queue = cpu.compute_queue().unwrap();
    cpu_queue.wait_foreign(&vulkan_done, 1).signal(&cpu_done, 1);
    cpu_queue.submit().unwrap();
    assert!(matches!(
        cpu_done.wait(1, Duration::from_millis(20)),
        Err(Error::Timeout { .. })
    ));
    host_ready.set(1);
    cpu_done.wait(1, LONG).unwrap();
    assert_eq!(data.to_vec::<u32>().unwrap(), vec![3; 16]);
}

/// A failed value wakes a Vulkan signal's waiters; a queue waiting on it
/// fails its own values, and reports the failure once.
#[test]
fn a_failed_value_fails_the_waiting_batch_and_its_signals() {
    let Some(device) = device() else { return };
    let gate = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.wait(&gate, 1).signal(&done, 1);
    queue.submit().unwrap();
    gate.fail(
        1,
        Error::Abandoned {
            reason: "failed by the test",
        },
    );
    let error = done.wait(1, LONG).unwrap_err();
    assert!(matches!(error, Error::SignalFailed { .. }), "{error}");
    assert!(matches!(
        queue.synchronize(),
        Err(Error::QueueFailed { .. })
    ));
    queue.synchronize().unwrap();
}

/// Selection never picks a software device: `probe` lists hardware only.
#[test]
fn probe_lists_no_software_device_so_selection_prefers_the_cpu_backend() {
    let Ok(all) = hwqueue::vulkan::devices() else {
        println!("skipped: no Vulkan driver");
        return;
    };
    let probed = Vulkan::probe().unwrap();
    for info in &probed {
        let listed = all.iter().find(|d| d.spec == info.spec).unwrap();
        assert!(!listed.kind.contains("CPU"), "{listed:?}");
    }
    for listed in &all {
        println!("{listed:?}");
        if listed.kind.contains("CPU") {
            assert!(probed.iter().all(|p| p.spec != listed.spec));
        }
    }
}

#[test]
fn memory_is_pooled_and_out_of_memory_says_how_much() {
    let Some(device) = device() else { return };
    let a = device.alloc(1000).unwrap();
    assert_eq!(a.to_vec::<u8>().unwrap(), vec![0; 1000]);
    assert!(device.memory_stats().in_use >= 1000);
    device.set_memory_limit(Some(1 << 20));
    let error = device.alloc(4 << 20).unwrap_err();
    assert!(matches!(error, Error::OutOfMemory { .. }), "{error}");
    device.set_memory_limit(None);
    drop(a);
    device.trim_memory();
}

/// With profiling on, each command has one event; device commands are
/// timed by timestamp queries mapped onto the host's clock: in queue
/// order, each ending no earlier than it starts.
#[test]
fn profiled_commands_carry_device_times_in_queue_order() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let data = device.alloc(1 << 16).unwrap();
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.set_profiling(true);
    for n in 1..=3u32 {
        queue.exec(
            &add,
            &[&data],
            &[Scalar::U32(n)],
            ExecParams::new_1d(1 << 14, 64),
        );
    }
    queue.signal(&done, 1);
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    let events: Vec<_> = queue
        .take_profile()
        .into_iter()
        .filter(|e| e.name.contains("add"))
        .collect();
    assert_eq!(events.len(), 3, "{events:?}");
    for pair in events.windows(2) {
        assert!(pair[1].start_ns >= pair[0].start_ns, "{pair:?}");
    }
    for event in &events {
        assert!(event.end_ns >= event.start_ns, "{event:?}");
    }
    assert_eq!(data.to_vec::<u32>().unwrap()[0], 6);
}

/// `VK_ERROR_DEVICE_LOST` is sticky: once lost, every later submission
/// fails with `DeviceLost` naming the call that lost it, and `health` says
/// so. (No driver loses a device on demand: the loss is simulated.)
#[test]
fn a_lost_device_fails_every_later_submission() {
    let Some(device) = device() else { return };
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.signal(&done, 1);
    queue.submit().unwrap();
    done.wait(1, LONG).unwrap();
    device.health().unwrap();
    // Made before the loss: with unmapped memory, zeroing it is a device
    // command, which fails on a lost device too.
    let buffer = device.alloc(16).unwrap();
    device.simulate_device_loss();
    assert!(
        device.host_mapped() || matches!(device.alloc(16).map(drop), Err(Error::DeviceLost { .. })),
        "a zeroed allocation needs the device where the host cannot map it"
    );
    for value in [2, 3] {
        queue.signal(&done, value);
        queue.submit().unwrap();
        let error = done.wait(value, LONG).unwrap_err();
        assert!(
            matches!(error.root_cause(), Error::DeviceLost { .. }),
            "{error}"
        );
        let _ = queue.synchronize();
    }
    // Transfers too, however they run (host copies where the memory is
    // host-cached, as on lavapipe; before the fix a download there still
    // delivered bytes from the lost device).
    let back = Download::<u32>::new(4);
    queue
        .upload(&buffer, &[1u32; 4])
        .download(&buffer, &back)
        .submit()
        .unwrap();
    let error = back.take(LONG).unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::DeviceLost { .. }),
        "{error}"
    );
    let error = device.health().unwrap_err();
    assert!(
        error.to_string().contains("simulate_device_loss"),
        "{error}"
    );
}

/// `wait_any` and `wait_all` over Vulkan signals of one device block in
/// `vkWaitSemaphores` (any / all): they return once a queue's submission
/// signals the values, and report a value failed on the host.
#[test]
fn wait_any_and_wait_all_over_vulkan_signals() {
    let Some(device) = device() else { return };
    let gate = device.new_signal(0).unwrap();
    let (a, b) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut queue = device.compute_queue().unwrap();
    queue.wait(&gate, 1).signal(&b, 1).signal(&a, 1);
    queue.submit().unwrap();
    let waits = [(&a, 1), (&b, 1)];
    assert!(matches!(
        hwqueue::wait_any(&waits, Duration::from_millis(20)),
        Err(Error::Timeout { .. })
    ));
    let opener = std::thread::spawn({
        let gate = gate.clone();
        move || gate.set(1)
    });
    let first = hwqueue::wait_any(&waits, LONG).unwrap();
    assert!(first < 2);
    hwqueue::wait_all(&waits, LONG).unwrap();
    opener.join().unwrap();
    let failed = device.new_signal(0).unwrap();
    failed.fail(
        1,
        Error::Abandoned {
            reason: "failed by the test",
        },
    );
    let error = hwqueue::wait_all(&[(&a, 1), (&failed, 1)], LONG).unwrap_err();
    assert!(matches!(error, Error::SignalFailed { .. }), "{error}");
}

/// Where the pool's memory is host-cached (lavapipe's), uploads and
/// downloads are host copies in queue order: an upload after a wait on an
/// unset value lands only once the value is reached, the kernel of another
/// queue waiting on it sees the upload, and a download after that kernel
/// (on its queue) reads what the kernel wrote; a download before a later
/// upload of the same queue reads the bytes before it.
#[test]
fn uploads_and_downloads_keep_queue_order_across_waits() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let data = device.alloc(16).unwrap();
    let gate = device.new_signal(0).unwrap();
    let done = device.new_signal(0).unwrap();
    let (mut a, mut b) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let (before, after, last) = (
        Download::<u32>::new(4),
        Download::<u32>::new(4),
        Download::<u32>::new(4),
    );
    a.download(&data, &before)
        .wait(&gate, 1)
        .upload(&data, &[1u32, 2, 3, 4])
        .signal(&done, 1)
        .submit()
        .unwrap();
    b.wait(&done, 1)
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(10)],
            ExecParams::new_1d(64, 64),
        )
        .download(&data, &after)
        .upload(&data, &[7u32; 4])
        .download(&data, &last)
        .submit()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!after.is_ready(), "ran before the gate was set");
    gate.set(1);
    assert_eq!(before.take(LONG).unwrap(), [0; 4]);
    assert_eq!(after.take(LONG).unwrap(), [11, 12, 13, 14]);
    assert_eq!(last.take(LONG).unwrap(), [7; 4]);
    b.synchronize().unwrap();
}

/// Where the host cannot map a device's memory (a discrete GPU without
/// resizable BAR; here any device opened so), buffers are still zeroed,
/// written and read by the host, and uploads, downloads and kernels see
/// the same bytes: through staging ranges of host memory, a chunk (16 MiB)
/// at a time, which the buffers' statistics do not count.
#[test]
fn unmapped_memory_is_reached_through_staging() {
    let Some(mapped) = device() else { return };
    let device = VulkanDevice::open_unmapped(mapped.spec().ordinal()).unwrap();
    assert!(!device.host_mapped());
    // More than one chunk, at an offset and of a length no multiple of 4.
    let len = (16 << 20) + 4096 + 3;
    let buffer = device.alloc(len + 5).unwrap();
    let mut zeros = vec![1u8; len + 5];
    buffer.read_at(0, &mut zeros).unwrap();
    assert!(zeros.iter().all(|&b| b == 0), "a zeroed buffer reads zeros");
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    buffer.write_at(5, &data).unwrap();
    let mut back = vec![0u8; len];
    buffer.read_at(5, &mut back).unwrap();
    assert!(back == data, "bytes written through staging read back");
    let mut head = [9u8; 6];
    buffer.read_at(0, &mut head).unwrap();
    assert_eq!(head, [0, 0, 0, 0, 0, 0], "the bytes before the write");
    let stats = device.memory_stats();
    assert_eq!(
        stats.requested,
        len + 5,
        "staging is not the buffers' memory: {stats:?}"
    );

    // In queue order: an upload, a kernel, a download, then the host.
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let words = device.alloc(256 * 4).unwrap();
    let input: Vec<u32> = (0..256).collect();
    let out = Download::<u32>::new(256);
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&words, &input)
        .exec(
            &add,
            &[&words],
            &[Scalar::U32(7)],
            ExecParams::new_1d(256, 64),
        )
        .download(&words, &out)
        .signal(&done, 1);
    queue.submit().unwrap();
    let want: Vec<u32> = (7..263).collect();
    assert_eq!(out.take(LONG).unwrap(), want);
    done.wait(1, LONG).unwrap();
    assert_eq!(words.to_vec::<u32>().unwrap(), want);
}

/// Staging held by queued uploads goes back once they complete, and no
/// more than `STAGING_KEEP` of it stays cached for the next.
#[test]
fn staging_beyond_what_is_kept_goes_back_when_transfers_complete() {
    let Some(mapped) = device() else { return };
    let device = VulkanDevice::open_unmapped(mapped.spec().ordinal()).unwrap();
    let len = 24 << 20;
    let buffers: Vec<_> = (0..6).map(|_| device.alloc_uninit(len).unwrap()).collect();
    let data = vec![7u8; len];
    let mut queue = device
        .copy_queue()
        .unwrap()
        .expect("Vulkan has copy queues");
    for buffer in &buffers {
        queue.upload(buffer, &data);
    }
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    let after = device.staging_stats();
    assert!(
        after.peak_reserved >= 6 * len,
        "each queued upload held its staging: {after:?}"
    );
    assert_eq!(
        after.in_use, 0,
        "completed uploads hold no staging: {after:?}"
    );
    assert!(
        after.reserved <= STAGING_KEEP,
        "at most {STAGING_KEEP} bytes of staging stay cached: {after:?}"
    );
    assert!(buffers[5].to_vec::<u8>().unwrap() == data);
    device.trim_memory();
    assert_eq!(
        device.staging_stats().reserved,
        0,
        "trim gives staging back"
    );
}

/// The raw handles are the device's own: a timeline semaphore made from
/// `raw_device` is signalled by a submit through `with_compute_queue`,
/// between two of hwqueue's batches on the same queue.
#[test]
fn raw_handles_submit_beside_hwqueue_s_own_work() {
    use hwqueue::vulkan::ash::vk;
    let Some(device) = device() else { return };
    let raw = device.raw_device();
    // SAFETY: a plain query of the instance's physical device.
    let families = unsafe {
        device
            .raw_instance()
            .get_physical_device_queue_family_properties(device.raw_physical_device())
    };
    assert!(
        families[device.compute_family() as usize]
            .queue_flags
            .contains(vk::QueueFlags::COMPUTE)
    );
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.signal(&done, 1).submit().unwrap();
    // Destroyed below, after its wait.
    let semaphore = raw_timeline_semaphore(raw);
    let semaphores = [semaphore];
    let values = [5u64];
    let mut signal = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
    let submit = vk::SubmitInfo::default()
        .signal_semaphores(&semaphores)
        .push_next(&mut signal);
    device.with_compute_queue(|queue| {
        // SAFETY: the queue's lock is held; the infos live across the call.
        unsafe { raw.queue_submit(queue, &[submit], vk::Fence::null()) }.unwrap();
    });
    queue.signal(&done, 2).submit().unwrap();
    // SAFETY: the semaphore is alive; the arrays live across the call.
    unsafe {
        raw.wait_semaphores(
            &vk::SemaphoreWaitInfo::default()
                .semaphores(&semaphores)
                .values(&values),
            LONG.as_nanos() as u64,
        )
    }
    .unwrap();
    done.wait(2, LONG).unwrap();
    // SAFETY: its only submission completed (waited for above).
    unsafe { raw.destroy_semaphore(semaphore, None) };
}

/// Batches of signals only are retired lazily (they hold nothing to
/// release): `synchronize` and the queue's drop still wait for every one,
/// and a later batch that holds memory retires after them, in order.
#[test]
fn signal_only_batches_retire_by_synchronize_and_drop() {
    let Some(device) = device() else { return };
    common::no_hang(
        "synchronize and drop after signal-only batches",
        move || {
            let signal = device.new_signal(0).unwrap();
            let mut queue = device.compute_queue().unwrap();
            // More than the queue keeps back at once.
            for value in 1..=100 {
                queue.signal(&signal, value).submit().unwrap();
            }
            queue.synchronize().unwrap();
            assert_eq!(signal.value(), 100);
            let buffer = device.alloc(64).unwrap();
            let back = Download::<u32>::new(16);
            for value in 101..=110 {
                queue.signal(&signal, value).submit().unwrap();
            }
            queue
                .upload(&buffer, &[7u32; 16])
                .download(&buffer, &back)
                .signal(&signal, 111)
                .submit()
                .unwrap();
            queue.signal(&signal, 112).submit().unwrap();
            assert_eq!(back.take(LONG).unwrap(), vec![7u32; 16]);
            drop(queue);
            assert_eq!(signal.value(), 112);
        },
    );
}

/// Issue 46: one `VkDevice` per physical device per process, shared by
/// every handle, as CUDA's primary context is: opening and dropping
/// handles never creates or destroys a `VkDevice` while another thread
/// drives one (NVIDIA's driver hung on that). Failed on 05d7d31: each open
/// made a `VkDevice` of its own.
#[test]
fn every_handle_of_a_physical_device_shares_one_vkdevice() {
    use hwqueue::vulkan::ash::vk::Handle;
    let Some(first) = device() else { return };
    let ordinal = first.spec().ordinal();
    let raw = first.raw_device().handle().as_raw();
    let second = VulkanDevice::open(ordinal).unwrap();
    assert_eq!(second.raw_device().handle().as_raw(), raw);
    let unmapped = VulkanDevice::open_unmapped(ordinal).unwrap();
    assert_eq!(unmapped.raw_device().handle().as_raw(), raw);
    assert!(!unmapped.host_mapped(), "the memory mode stays per handle");
    drop((first, second, unmapped));
    let later = std::thread::spawn(move || {
        VulkanDevice::open(ordinal)
            .unwrap()
            .raw_device()
            .handle()
            .as_raw()
    })
    .join()
    .unwrap();
    assert_eq!(later, raw, "the device outlives its handles");
}

/// One round of the stress test: open a handle (mapped or not), run a
/// kernel between an upload and a download on a queue of its own, check
/// the bytes, drop it all.
fn open_use_and_drop(ordinal: u32, thread: u32, round: u32) {
    let device = if (thread + round).is_multiple_of(3) {
        VulkanDevice::open_unmapped(ordinal)
    } else {
        VulkanDevice::open(ordinal)
    }
    .unwrap_or_else(|e| panic!("thread {thread} round {round}: open: {e}"));
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let buffer = device.alloc(64 * 4).unwrap();
    let input: Vec<u32> = (0..64).map(|i| thread * 1000 + round + i).collect();
    let back = Download::<u32>::new(64);
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&buffer, &input)
        .exec(
            &add,
            &[&buffer],
            &[Scalar::U32(7)],
            ExecParams::new_1d(64, 64),
        )
        .download(&buffer, &back)
        .submit()
        .unwrap();
    let got = back
        .take(LONG)
        .unwrap_or_else(|e| panic!("thread {thread} round {round}: {e}"));
    let want: Vec<u32> = input.iter().map(|v| v + 7).collect();
    assert_eq!(got, want, "thread {thread} round {round}");
    if round.is_multiple_of(2) {
        // Dropped with work just submitted, while other threads work.
        let done = device.new_signal(0).unwrap();
        queue
            .exec(
                &add,
                &[&buffer],
                &[Scalar::U32(1)],
                ExecParams::new_1d(64, 64),
            )
            .signal(&done, 1)
            .submit()
            .unwrap();
    }
}

/// Issue 46: sixteen threads opening, using and dropping handles of one
/// physical device for three seconds, every result checked, nothing hung.
#[test]
fn sixteen_threads_open_use_and_drop_devices_without_a_hang() {
    let Some(device) = device() else { return };
    let ordinal = device.spec().ordinal();
    drop(device);
    let (sender, receiver) = std::sync::mpsc::channel();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let threads: Vec<_> = (0..16)
        .map(|thread| {
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut round = 0;
                while round == 0 || std::time::Instant::now() < deadline {
                    open_use_and_drop(ordinal, thread, round);
                    round += 1;
                }
                let _ = sender.send(round);
            })
        })
        .collect();
    drop(sender);
    let mut rounds = 0;
    for _ in 0..16 {
        rounds += receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread hung, or failed (see above)");
    }
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(rounds >= 16, "{rounds} rounds");
    println!("{rounds} rounds of open, use and drop in 16 threads");
}

/// Issue 46, defect 3: a queue's `signal` of another device handle's
/// signal is refused at `submit` with a typed error, and the value fails
/// (its waiters learn why); a `wait` on it works. On 05d7d31 the foreign
/// semaphore reached `vkQueueSubmit` (VUID-VkSubmitInfo-commonparent under
/// the validation layer, then a fault inside the driver).
#[test]
fn a_queue_refuses_to_signal_another_device_s_signal_and_may_wait_on_it() {
    let Some(a) = device() else { return };
    let b = VulkanDevice::open(a.spec().ordinal()).unwrap();
    let foreign = b.new_signal(0).unwrap();
    let mut queue = a.compute_queue().unwrap();
    let error = queue.signal(&foreign, 1).submit().unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::DeviceMismatch { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("new_signal"), "{error}");
    // One sentence: on 9d056bd its lines were joined with their
    // indentation ("own device's                      signals").
    assert!(
        error.to_string().contains("own device's signals; make it"),
        "{error}"
    );
    assert!(matches!(
        foreign.wait(1, LONG),
        Err(Error::SignalFailed { .. })
    ));
    // Waiting on another device's signal works: the host waits for it.
    let (theirs, mine) = (b.new_signal(0).unwrap(), a.new_signal(0).unwrap());
    queue.wait(&theirs, 1).signal(&mine, 1).submit().unwrap();
    let mut other = b.compute_queue().unwrap();
    other.signal(&theirs, 1).submit().unwrap();
    mine.wait(1, LONG).unwrap();
}

/// A CPU signal that says when a thread starts waiting on it: the test
/// below sets its gate only once the queue's thread is inside the wait.
#[derive(Clone)]
struct Announcing {
    inner: CpuSignal,
    entered: CpuSignal,
}

impl TimelineSignal for Announcing {
    fn value(&self) -> u64 {
        self.inner.value()
    }
    fn set(&self, value: u64) {
        self.inner.set(value)
    }
    fn wait(&self, target: u64, timeout: impl Into<hwqueue::Timeout>) -> hwqueue::Result<()> {
        self.entered.set(1);
        self.inner.wait(target, timeout)
    }
    fn fail(&self, upto: u64, cause: Error) {
        self.inner.fail(upto, cause)
    }
    fn producer(&self) -> &hwqueue::Producer {
        self.inner.producer()
    }
}

/// Issue 46, defect 11: a profiled wait that held a Vulkan queue spans
/// what it held, as on the CPU: it starts no later than the moment its
/// gate was set (the queue's thread was inside the wait by then) and ends
/// no earlier. On 05d7d31 the event lasted 0 ns, stamped at the
/// submission after the wait.
#[test]
fn a_profiled_wait_spans_what_it_held_the_queue() {
    let Some(device) = device() else { return };
    let gate = Announcing {
        inner: CpuSignal::new(0),
        entered: CpuSignal::new(0),
    };
    let done = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.set_profiling(true);
    queue
        .wait_foreign(&gate, 1)
        .signal(&done, 1)
        .submit()
        .unwrap();
    gate.entered.wait(1, LONG).unwrap();
    let set_at = hwqueue::profile::now_ns();
    gate.set(1);
    done.wait(1, LONG).unwrap();
    queue.synchronize().unwrap();
    let events = queue.take_profile();
    let wait = events
        .iter()
        .find(|e| e.name.starts_with("wait"))
        .unwrap_or_else(|| panic!("no wait event: {events:?}"));
    assert!(
        wait.start_ns <= set_at && wait.end_ns >= set_at,
        "the wait [{}, {}] does not span the moment its gate was set ({set_at}): {wait:?}",
        wait.start_ns,
        wait.end_ns
    );
}

/// Issue 46, defect 6: a device lost while a batch is held on the host
/// (its wait's value not submitted yet): `synchronize` returns with the
/// loss, the batch's signal and download fail with it, and a host wait on
/// a value that will never come ends with the loss, not a timeout. On
/// 05d7d31 `synchronize` never returned and the waits timed out.
#[test]
fn a_device_lost_while_a_batch_is_held_fails_it_with_the_loss() {
    let Some(device) = device() else { return };
    let (gate, done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let buffer = device.alloc(16).unwrap();
    let back = Download::<u32>::new(4);
    let mut queue = device.compute_queue().unwrap();
    queue
        .wait(&gate, 1)
        .signal(&done, 1)
        .download(&buffer, &back)
        .submit()
        .unwrap();
    device.simulate_device_loss();
    let lost = |error: &Error| matches!(error.root_cause(), Error::DeviceLost { .. });
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let synchronized = queue.synchronize();
        let _ = sender.send(synchronized);
    });
    let synchronized = receiver
        .recv_timeout(LONG)
        .expect("synchronize returns once the device is lost");
    assert!(synchronized.as_ref().is_err_and(lost), "{synchronized:?}");
    let error = done.wait(1, LONG).unwrap_err();
    assert!(lost(&error), "{error}");
    let error = back.take(LONG).unwrap_err();
    assert!(lost(&error), "{error}");
    let error = gate.wait(1, LONG).unwrap_err();
    assert!(lost(&error), "{error}");
}

/// An upload's owner whose `Drop` panics: the queue drops it on its
/// retire thread, once the batch completed.
struct PanicsOnDrop(Vec<u32>);

impl AsRef<[u32]> for PanicsOnDrop {
    fn as_ref(&self) -> &[u32] {
        &self.0
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("the upload's owner panics when dropped");
    }
}

/// Issue 46, defect 10: a panic on a queue's worker thread (here the
/// retire thread, dropping an upload's owner whose `Drop` panics) leaves
/// neither `synchronize` nor the queue's drop waiting forever: they
/// return, and `synchronize` reports the panic. On 05d7d31 both hung.
#[test]
fn a_panic_on_a_queue_s_worker_thread_is_reported_not_hung_on() {
    let Some(device) = device() else { return };
    let buffer = device.alloc(16).unwrap();
    let done = device.new_signal(0).unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut queue = device.compute_queue().unwrap();
        queue
            .upload_vec(&buffer, PanicsOnDrop(vec![1, 2, 3, 4]))
            .signal(&done, 1)
            .submit()
            .unwrap();
        let synchronized = queue.synchronize();
        drop(queue);
        let _ = sender.send((synchronized, buffer.to_vec::<u32>()));
    });
    let (synchronized, data) = receiver
        .recv_timeout(LONG)
        .expect("synchronize and the queue's drop return");
    let error = synchronized.unwrap_err();
    assert!(
        matches!(error.root_cause(), Error::EnginePanicked { message } if message.contains("owner panics")),
        "{error}"
    );
    assert_eq!(data.unwrap(), [1, 2, 3, 4], "the batch itself completed");
}

/// Issue 46, defect 9: on a device without a transfer-only family
/// (lavapipe) a copy queue submits to the compute `VkQueue`, after
/// dispatches submitted before it (raw ones, by the interop rules, or
/// another queue's): its command buffer must open with a barrier from the
/// compute stage too. It named the transfer stage alone, so a copy read
/// what a dispatch wrote unordered. Neither lavapipe (it runs submissions
/// in order) nor Debian's validation layer (1.3.239: synchronisation
/// validation within a command buffer only, silent here even with no
/// opening barrier at all) shows that: the unit test `a_copy_queue_orders_
/// itself_after_compute_work_where_it_shares_the_compute_queue` (in
/// `src/vulkan/submit.rs`) fails with the fix reverted. This one checks the
/// bytes that cross, on any driver whose copy queue shares the compute
/// `VkQueue`.
#[test]
fn a_copy_queue_on_the_compute_family_follows_a_dispatch_submitted_before_it() {
    use hwqueue::vulkan::ash::vk;
    let Some(device) = device() else { return };
    // SAFETY: a plain query of the instance's physical device.
    let families = unsafe {
        device
            .raw_instance()
            .get_physical_device_queue_family_properties(device.raw_physical_device())
    };
    let compute_or_graphics = vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS;
    if families.iter().any(|f| {
        f.queue_flags.contains(vk::QueueFlags::TRANSFER)
            && !f.queue_flags.intersects(compute_or_graphics)
    }) {
        println!("skipped: the copy queue takes the transfer-only family here");
        return;
    }
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let data = device.alloc(64 * 4).unwrap();
    data.write_at(0, &(0..64u32).collect::<Vec<_>>()).unwrap();
    let out = device.alloc(64 * 4).unwrap();
    let mut compute = device.compute_queue().unwrap();
    let mut copy = device
        .copy_queue()
        .unwrap()
        .expect("a Vulkan device has a copy queue");
    // Both batches are submitted to the held `VkQueue` at their `submit`
    // (nothing queued before either, and neither waits), in this order.
    let hold = Hold::new(&device);
    compute
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(100)],
            ExecParams::new_1d(64, 64),
        )
        .submit()
        .unwrap();
    let back = Download::<u32>::new(64);
    copy.copy(&out, &data)
        .download(&out, &back)
        .submit()
        .unwrap();
    hold.release();
    copy.synchronize().unwrap();
    compute.synchronize().unwrap();
    assert_eq!(back.take(LONG).unwrap(), (100..164u32).collect::<Vec<_>>());
}

/// A raw timeline semaphore at 0, the caller's to destroy.
fn raw_timeline_semaphore(
    raw: &hwqueue::vulkan::ash::Device,
) -> hwqueue::vulkan::ash::vk::Semaphore {
    use hwqueue::vulkan::ash::vk;
    let mut timeline = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    // SAFETY: the create-info and its chain live across the call; the
    // caller destroys the semaphore once no submission names it.
    unsafe {
        raw.create_semaphore(
            &vk::SemaphoreCreateInfo::default().push_next(&mut timeline),
            None,
        )
    }
    .unwrap()
}

/// The shared compute `VkQueue` of a device held behind a raw wait on a
/// timeline semaphore of the test's own, until [`release`](Self::release):
/// work submitted meanwhile is pending on the device, deterministically.
///
/// Its drop lets the queue go too, and frees the semaphore only once the
/// held submission completed (its fence): a test that fails while it holds
/// the queue (an `unwrap` or an assertion before `release`) must not leave
/// every other test of the binary behind a wait that never ends, nor
/// destroy a semaphore a pending submission still waits on (before, the
/// drop destroyed it at once, and a failure between `new` and `release`
/// held the queue forever: the next submission of every test hung).
struct Hold {
    raw: hwqueue::vulkan::ash::Device,
    semaphore: hwqueue::vulkan::ash::vk::Semaphore,
    fence: hwqueue::vulkan::ash::vk::Fence,
    released: std::cell::Cell<bool>,
}

impl Hold {
    fn new(device: &VulkanDevice) -> Self {
        use hwqueue::vulkan::ash::vk;
        let raw = device.raw_device().clone();
        // Destroyed by `drop`, once its wait completed.
        let semaphore = raw_timeline_semaphore(&raw);
        // SAFETY: the create-info lives across the call; `drop` destroys
        // the fence once it is signalled.
        let fence = unsafe { raw.create_fence(&vk::FenceCreateInfo::default(), None) }.unwrap();
        let semaphores = [semaphore];
        let values = [1u64];
        let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
        let mut wait = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&semaphores)
            .wait_dst_stage_mask(&stages)
            .push_next(&mut wait);
        device.with_compute_queue(|queue| {
            // SAFETY: the queue's lock is held; the infos live across the
            // call; `release` (or the drop) signals the semaphore.
            unsafe { raw.queue_submit(queue, &[submit], fence) }.unwrap();
        });
        Self {
            raw,
            semaphore,
            fence,
            released: std::cell::Cell::new(false),
        }
    }

    /// Lets the `VkQueue` go (once: later calls do nothing).
    fn release(&self) {
        use hwqueue::vulkan::ash::vk;
        if self.released.replace(true) {
            return;
        }
        // SAFETY: a host signal of the raw semaphore, above its counter of
        // 0 (once: `released` guards it).
        unsafe {
            self.raw.signal_semaphore(
                &vk::SemaphoreSignalInfo::default()
                    .semaphore(self.semaphore)
                    .value(1),
            )
        }
        .unwrap();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
        // The held submission completes once what was submitted before it
        // on the queue did (other tests' work, never waiting on a value
        // nobody sets): bounded all the same, so that a defect fails the
        // test rather than hanging it.
        // SAFETY: the fence was handed to the held submission, and lives
        // across the call.
        let done = unsafe {
            self.raw
                .wait_for_fences(&[self.fence], true, LONG.as_nanos() as u64)
        };
        if done.is_ok() {
            // SAFETY: the one submission that named them completed.
            unsafe {
                self.raw.destroy_fence(self.fence, None);
                self.raw.destroy_semaphore(self.semaphore, None);
            }
        } else {
            // Still pending: left alive (leaked), never destroyed in use.
            eprintln!("a Hold's submission did not complete within {LONG:?}: {done:?}");
        }
    }
}

/// A test that fails while it holds the queue (here a panic between
/// `Hold::new` and `release`): the queue goes on, and the next test's work
/// completes. Before `Hold`'s drop released it, the drop destroyed the
/// semaphore the held submission waited on, and every later submission of
/// the binary stayed pending for good (this test failed after 30 s, and
/// the queue's drop then hung).
#[test]
fn a_hold_dropped_by_a_failing_test_lets_the_queue_go() {
    let Some(device) = device() else { return };
    common::no_hang("work submitted after a failed test's hold", move || {
        let signal = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _hold = Hold::new(&device);
            panic!("a test failing while it holds the queue (expected)");
        }));
        assert!(failed.is_err());
        queue.signal(&signal, 1).submit().unwrap();
        signal
            .wait(1, LONG)
            .expect("the queue was left held by a failed test's hold");
        queue.synchronize().unwrap();
    });
}

/// Issue 46, defect 4: the host's `set` of a value above a queue's
/// signal of the same signal that is still pending (here the shared
/// `VkQueue` is held by a raw wait until the test lets it go) does not
/// lower the value when the queue's signal lands: it is seen at once and
/// signalled once the pending signal completed. On 05d7d31 the value read
/// 7, then 5 (and the layer reports VUID-VkSemaphoreSignalInfo-value-03259).
#[test]
fn a_host_set_above_a_pending_queue_signal_is_never_lowered_by_it() {
    let Some(device) = device() else { return };
    let signal = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    // The queue's signal of 5 goes to the VkQueue behind the hold.
    let hold = Hold::new(&device);
    queue.signal(&signal, 5).submit().unwrap();
    signal.set(7);
    assert_eq!(signal.value(), 7, "a set is seen at once");
    // Let the VkQueue go: the pending signal of 5 lands, then the set's 7.
    hold.release();
    queue.synchronize().unwrap();
    drop(hold);
    assert_eq!(
        signal.value(),
        7,
        "the queue's signal of 5 lowered the value"
    );
    signal.wait(7, LONG).unwrap();
    // A queue waiting on 7 on the device gets it too.
    let (after, mut other) = (
        device.new_signal(0).unwrap(),
        device.compute_queue().unwrap(),
    );
    other.wait(&signal, 7).signal(&after, 1).submit().unwrap();
    after.wait(1, LONG).unwrap();
}

/// Issue 46, defect 8: a program's pipelines are cached per `VkDevice`
/// (one per physical device), not per handle: two handles, and a third
/// opened after both dropped, share one pipeline, and the cache holds no
/// handle alive. On 05d7d31 each handle compiled its own, and the cache
/// held every handle's context for as long as the program lived.
#[test]
fn a_program_s_pipeline_is_made_once_per_physical_device() {
    let Some(first) = device() else { return };
    let ordinal = first.spec().ordinal();
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let run = |device: &VulkanDevice| {
        let buffer = device.alloc(64 * 4).unwrap();
        let done = device.new_signal(0).unwrap();
        let mut queue = device.compute_queue().unwrap();
        queue
            .exec(
                &add,
                &[&buffer],
                &[Scalar::U32(3)],
                ExecParams::new_1d(64, 64),
            )
            .signal(&done, 1)
            .submit()
            .unwrap();
        done.wait(1, LONG).unwrap();
        assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![3; 64]);
    };
    run(&first);
    let second = VulkanDevice::open(ordinal).unwrap();
    run(&second);
    assert_eq!(add.cached_pipelines(), 1);
    drop((first, second));
    run(&VulkanDevice::open_unmapped(ordinal).unwrap());
    assert_eq!(add.cached_pipelines(), 1);
}

/// Issue 46, defect 5: values of one timeline semaphore further apart
/// than the device's `maxTimelineSemaphoreValueDifference` (lowered here:
/// lavapipe's is too large to reach) fail their batch with a typed error
/// naming the limit, which its waiters and the owner see; a host `set`
/// that far gets there in steps. On
/// 05d7d31 the limit was never read, and such values reached the driver.
#[test]
fn values_further_apart_than_the_device_allows_are_refused_or_stepped() {
    let Some(device) = device() else { return };
    assert!(device.max_value_difference() >= (1 << 31) - 1);
    device.limit_value_difference(100);
    let signal = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue.signal(&signal, 1000).submit().unwrap();
    let too_far = |error: &Error| {
        matches!(
            error.root_cause(),
            Error::SignalValueTooFarApart {
                value: 1000,
                current: 0,
                max: 100,
                ..
            }
        )
    };
    let error = signal.wait(1000, LONG).unwrap_err();
    assert!(too_far(&error), "{error}");
    let error = queue.synchronize().unwrap_err();
    assert!(too_far(&error), "{error}");
    assert!(error.to_string().contains("smaller steps"), "{error}");
    let stepped = device.new_signal(0).unwrap();
    queue.signal(&stepped, 100).submit().unwrap();
    stepped.wait(100, LONG).unwrap();
    stepped.set(1050);
    assert_eq!(stepped.value(), 1050);
    queue.signal(&stepped, 1150).submit().unwrap();
    stepped.wait(1150, LONG).unwrap();
}

/// A batch failing at a foreign wait after device work it already
/// submitted: the values after the failure settle (fail) only once that
/// work completed, in queue order, so whoever waits on them (settled, as
/// a plan's next run does) comes after it. Found by four CPU + Vulkan
/// plans at once (`tests/plan_backends.rs`): the next run's upload landed
/// before the refused run's kernel, which then added to it. Failed before
/// the fix: the later value failed at once, the GPU still held.
#[test]
fn a_failed_value_settles_only_after_the_work_submitted_before_it() {
    let Some(device) = device() else { return };
    let buffer = device.alloc(16).unwrap();
    let signal = device.new_signal(0).unwrap();
    let failed = CpuSignal::new(0);
    failed.fail(
        1,
        Error::KernelFailed {
            program: "elsewhere".into(),
            message: "failed on its own account".into(),
        },
    );
    let mut queue = device.compute_queue().unwrap();
    let hold = Hold::new(&device);
    queue
        .fill(&buffer, 7u32)
        .signal(&signal, 1)
        .wait_foreign(&failed, 1)
        .signal(&signal, 2)
        .submit()
        .unwrap();
    // The fill (and value 1) wait on the GPU behind the hold: value 2,
    // after them in queue order, must not have settled either. (Let go
    // before asserting: a queue dropped while the GPU is held waits.)
    let early = signal.wait(2, Duration::from_millis(100));
    hold.release();
    assert!(
        matches!(early, Err(Error::Timeout { .. })),
        "value 2 settled before the work before it in its batch: {early:?}"
    );
    assert!(matches!(
        signal.wait(2, LONG),
        Err(Error::SignalFailed { .. })
    ));
    assert!(signal.is_reached(1));
    assert_eq!(buffer.to_vec::<u32>().unwrap(), [7; 4]);
    // The failure, reported; the queue passed the hold.
    assert!(queue.synchronize().is_err());
    drop(hold);
}

/// Issue 47 on Vulkan: an `exec` repeating the last one (same shader,
/// views, work sizes and scalar types) is recorded without its checks but
/// with its own scalar values; one whose scalar type differs is checked,
/// and refused by the shader's push-constant type.
#[test]
fn a_repeated_exec_runs_with_its_own_scalars_and_another_type_is_refused() {
    let Some(device) = device() else { return };
    let add = VulkanProgram::from_wgsl("add", ADD, "add").unwrap();
    let data = device.alloc(64 * 4).unwrap();
    let grid = ExecParams::new_1d(64, 64);
    let mut queue = device.compute_queue().unwrap();
    queue.exec(&add, &[&data], &[Scalar::U32(1)], grid).exec(
        &add,
        &[&data],
        &[Scalar::U32(2)],
        grid,
    );
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    assert_eq!(data.to_vec::<u32>().unwrap(), vec![3; 64]);
    queue.exec(&add, &[&data], &[Scalar::U32(1)], grid).exec(
        &add,
        &[&data],
        &[Scalar::F32(1.0)],
        grid,
    );
    let refused = queue.submit().unwrap_err().to_string();
    assert!(
        refused.contains("scalar 0 is a f32 but the shader's push constant there is a u32"),
        "{refused}"
    );
    assert_eq!(data.to_vec::<u32>().unwrap(), vec![3; 64]);
}

/// A `dealloca` that never ran, in a batch rejected at `submit` (its last
/// `dealloca` is of a buffer not made by `alloca`) or failed before it (a
/// wait on a failed value), leaves its buffer live, as on the CPU. On
/// fbc0795 the retire thread completed every `dealloca` of a batch
/// whatever ran: the buffer was `Returned`, its host access refused
/// (review helper-53).
#[test]
fn a_dealloca_of_a_rejected_or_failed_batch_leaves_the_buffer_live() {
    use hwqueue::memory::Phase;
    let Some(device) = device() else { return };
    let mut queue = device.compute_queue().unwrap();
    let phase = |buffer: &hwqueue::vulkan::VulkanBuffer| buffer.queue_ordered().unwrap().phase();

    let (rejected, signal) = (queue.alloca(256).unwrap(), device.new_signal(0).unwrap());
    let plain = device.alloc(64).unwrap();
    queue
        .dealloca(&rejected)
        .signal(&signal, 1)
        .dealloca(&plain);
    assert!(queue.submit().is_err(), "a dealloca of a plain buffer");
    assert!(signal.wait(1, LONG).is_err());
    let _ = queue.synchronize();
    assert_eq!(phase(&rejected), Phase::Live, "rejected");

    let (failed, bad) = (queue.alloca(256).unwrap(), device.new_signal(0).unwrap());
    bad.fail(1, Error::Abandoned { reason: "a test" });
    queue
        .wait(&bad, 1)
        .dealloca(&failed)
        .signal(&signal, 2)
        .submit()
        .unwrap();
    assert!(signal.wait(2, LONG).is_err());
    let _ = queue.synchronize();
    assert_eq!(phase(&failed), Phase::Live, "failed before it");
    failed
        .write_at(0, &[1u8; 4])
        .expect("a live buffer's host access");

    // One that ran still goes back.
    queue.dealloca(&failed).signal(&signal, 3).submit().unwrap();
    signal.wait(3, LONG).unwrap();
    queue.synchronize().unwrap();
    assert_eq!(phase(&failed), Phase::Returned);
}

/// An exec over an empty view of a buffer (and of nothing else) writes no
/// buffer's bytes: it binds the device's dummy, as an empty buffer does.
/// On 5de8a12 it bound the rest of the pool block from the view's offset
/// (one `VkBuffer` covers the block), so a kernel writing every element
/// below `arrayLength` overwrote the rest of `a` and all of `b` (review
/// helper-51).
#[test]
fn an_exec_over_an_empty_view_reaches_no_buffer() {
    let Some(device) = device() else { return };
    let zero = VulkanProgram::from_wgsl(
        "zero",
        "@group(0) @binding(0) var<storage, read_write> data: array<u32>;
         @compute @workgroup_size(64)
         fn zero(@builtin(global_invocation_id) id: vec3<u32>) {
             if (id.x < arrayLength(&data)) { data[id.x] = 0xdeadu; }
         }",
        "zero",
    )
    .unwrap();
    let (a, b) = (device.alloc(1024).unwrap(), device.alloc(1024).unwrap());
    a.write_at(0, &[7u32; 256]).unwrap();
    b.write_at(0, &[7u32; 256]).unwrap();
    let mut queue = device.compute_queue().unwrap();
    for at in [256, 1024] {
        let empty = View::whole(&a).view(at, 0).unwrap();
        queue.exec_views(&zero, &[&empty], &[], ExecParams::new_1d(1024, 64));
        queue.submit().unwrap();
        queue.synchronize().unwrap();
        assert_eq!(
            a.to_vec::<u32>().unwrap(),
            [7u32; 256],
            "a, empty view at {at}"
        );
        assert_eq!(
            b.to_vec::<u32>().unwrap(),
            [7u32; 256],
            "b, empty view at {at}"
        );
    }
}

/// A kernel whose push constants span more than the device's
/// `maxPushConstantsSize` (one 16-byte-aligned `u32` past it: 9 scalars
/// on lavapipe's 128 bytes) is refused when recorded, naming the limit. On
/// 5de8a12 the exec was recorded with a pipeline layout past the limit
/// (the validation layer's `VUID-VkPushConstantRange-size-00298`; lavapipe
/// happened to run it, and a driver may not) (review helper-51).
///
/// On a device with 256 bytes (Mesa 25's lavapipe, NVIDIA's drivers) no
/// WGSL kernel can go past the limit: naga 30's validator tracks
/// immediates in a 64-bit mask of words and panics past 256 bytes
/// (`valid/immediates.rs`, "attempt to shift left with overflow"), which
/// `from_wgsl` reports as an error; the case is skipped there. It was
/// required to compile 65 packed members there until 2026-11-30, and
/// failed (helper-76).
#[test]
fn push_constants_past_the_device_s_limit_are_refused() {
    let Some(device) = device() else { return };
    let limit = device.max_push_constant_bytes();
    assert_eq!(limit % 16, 0, "a push-constant limit of {limit} bytes");
    let count = limit / 16 + 1;
    let members: Vec<String> = (0..count)
        .map(|i| format!("@align(16) m{i}: u32"))
        .collect();
    let source = format!(
        "struct P {{ {} }}
         @group(0) @binding(0) var<storage, read_write> data: array<u32>;
         var<immediate> p: P;
         @compute @workgroup_size(1)
         fn main() {{ data[0] = p.m{}; }}",
        members.join(", "),
        count - 1
    );
    let program = match VulkanProgram::from_wgsl("wide", &source, "main") {
        Ok(program) => program,
        // Past 256 bytes naga cannot take it (see above): nothing to
        // record then. Below, where CI requires Vulkan, it must compile.
        Err(error) => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none() || limit >= 256,
                "{count} scalars do not compile: {error}"
            );
            return println!("skipped: {count} scalars do not compile ({error})");
        }
    };
    let out = device.alloc(16).unwrap();
    let scalars: Vec<Scalar> = (0..count).map(Scalar::U32).collect();
    let mut queue = device.compute_queue().unwrap();
    queue.exec(&program, &[&out], &scalars, ExecParams::new_1d(1, 1));
    let text = queue.submit().expect_err("past the limit").to_string();
    // The struct's size: its members' 16 bytes each.
    let span = format!("{} bytes", limit + 16);
    for phrase in [span.as_str(), "maxPushConstantsSize", "in a buffer"] {
        assert!(text.contains(phrase), "no `{phrase}` in {text}");
    }
    // One scalar fewer fits, and arrives.
    let fits: Vec<String> = (0..count - 1)
        .map(|i| format!("@align(16) m{i}: u32"))
        .collect();
    let source = source
        .replace(&members.join(", "), &fits.join(", "))
        .replace(&format!("p.m{}", count - 1), &format!("p.m{}", count - 2));
    let program = VulkanProgram::from_wgsl("fits", &source, "main").unwrap();
    queue.exec(
        &program,
        &[&out],
        &scalars[..scalars.len() - 1],
        ExecParams::new_1d(1, 1),
    );
    queue.submit().unwrap();
    queue.synchronize().unwrap();
    assert_eq!(out.to_vec::<u32>().unwrap()[0], count - 2);
}

/// A `signal` of another device handle's signal is refused (its batch
/// rejected); where a live queue of that handle produces the signal, the
/// rejected batch must not fail its values. On dc4df80 it recorded the
/// signal all the same and failed every value up to 5, so value 2, which
/// the producer set next, failed its waiters (review helper-55).
#[test]
fn a_refused_signal_of_another_handle_fails_nothing_its_producer_sets() {
    let Some(first) = device() else { return };
    let devices = hwqueue::vulkan::devices().unwrap();
    let usable = devices.iter().find(|d| d.unusable.is_none()).unwrap();
    // Another handle of the same device: its signals are not `first`'s.
    let second = VulkanDevice::open(usable.spec.ordinal()).unwrap();
    let signal = second.new_signal(0).unwrap();
    let mut producer = second.compute_queue().unwrap();
    producer.signal(&signal, 1).submit().unwrap();
    signal.wait(1, LONG).unwrap();
    let mut refusing = first.compute_queue().unwrap();
    let refused = refusing.signal(&signal, 5).submit().unwrap_err();
    assert!(
        matches!(refused.root_cause(), Error::DeviceMismatch { .. }),
        "{refused}"
    );
    let _ = refusing.synchronize();
    assert!(
        matches!(signal.wait(2, Duration::ZERO), Err(Error::Timeout { .. })),
        "value 2 is its producer's to set"
    );
    producer.signal(&signal, 2).submit().unwrap();
    signal.wait(2, LONG).expect("the producer's value");
    // Recorded before the producer's claim, submitted after it (the
    // record-time look alone missed this; review helper-57).
    let late = second.new_signal(0).unwrap();
    refusing.signal(&late, 5);
    let mut claimer = second.compute_queue().unwrap();
    claimer.signal(&late, 1).submit().unwrap();
    assert!(refusing.submit().is_err());
    let _ = refusing.synchronize();
    claimer.signal(&late, 2).submit().unwrap();
    late.wait(2, LONG).expect("the claimer's value");
}

/// `vk:0` names the Vulkan device through the registry too, as a
/// `DeviceSpec` parses it (on 5e55679 the registry answered "unknown
/// backend `vk`", and so did `demo --device vk:0`; review helper-60).
#[test]
fn the_vk_alias_opens_through_the_registry() {
    let Some(device) = device() else { return };
    let spec = format!("vk:{}", device.spec().ordinal());
    let opened = hwqueue::registry::acquire(&spec).expect("`vk` is Vulkan's alias");
    assert_eq!(opened.spec().backend(), "vulkan", "{spec}");
}
