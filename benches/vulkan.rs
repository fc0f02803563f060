//! The Vulkan backend against raw `ash` doing the same work on the same
//! `VkDevice` and `VkQueue`, in the same run.
//!
//! | group | `hwqueue` | `raw_ash` (baseline) |
//! |-------|-----------|----------------------|
//! | `vulkan_roundtrip` | `signal(s, v)` + `submit`, then `wait(v)` | an empty command buffer submitted with a timeline signal, then `vkWaitSemaphores` |
//! | `vulkan_dispatch` | 1,000 `exec`s of a tiny kernel (64 invocations, each adding a push constant to its word) in one batch, a signal, submit, wait | the same 1,000 dispatches recorded into one command buffer, each after a compute-to-compute barrier (they touch the same words, so hwqueue puts one there too), submitted with a timeline signal, `vkWaitSemaphores` |
//! | `vulkan_transfer` | a 16 MiB `upload_vec` (of an `Arc` the host keeps) + `download` (into the last iteration's vector, `Download::from_vec`) of one buffer, submitted, the download taken; `hwqueue_borrowed` (no target) with `upload(&[u32])` and `Download::new` | 16 MiB copied into mapped, host-visible memory and back out into one vector |
//! | `vulkan_transfer_small` (no target) | the transfer's hwqueue case at 4 KiB: what a batch costs besides its copies | the baseline's copies at 4 KiB |
//! | `plan_replay_vulkan` (issue 45; here rather than in `benches/executor.rs`, beside `Raw`) | `Plan::run` + wait of a chain of 64 dependent kernels (`x += 1` over 64 words) with replay; `hwqueue_rerecorded` (no target) with replay off; `hwqueue_rebound` (no target) with replay, bound to the next of eight buffers each run | the same 64 dispatches and barriers recorded into one command buffer once, resubmitted with a timeline signal and waited for (`raw_ash_prerecorded`) |
//! | `vulkan_dispatch_paired`, `vulkan_roundtrip_paired`, `vulkan_transfer_paired`, `plan_replay_vulkan_paired` | `hwqueue_over_raw_ash`: each group's hwqueue case, each iteration timed next to one of its baseline; criterion reports the ratio of the two (`x`), not a time | (in the ratio); `raw_ash_over_raw_ash` (dispatch and transfer) is the method's control, the baseline against itself; `rebound_over_unchanged` (plan replay): `hwqueue_rebound` timed next to `hwqueue` |
//!
//! The baseline runs on hwqueue's own `VkDevice` and compute `VkQueue`
//! (`VulkanDevice::raw_device`, `with_compute_queue`): see `Raw`.
//!
//! Built only with `--features vulkan` (`required-features`); without a
//! Vulkan driver it prints `skipped: no Vulkan driver` and measures
//! nothing. `HWQUEUE_VULKAN_DEVICE=N` picks `vulkan:N` (default 0, which
//! is a GPU where one is present).

mod support;

use std::sync::Arc;

use ash::vk;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use hwqueue::vulkan::{VulkanDevice, VulkanProgram};
use hwqueue::{
    Device, Download, ExecParams, HardwareQueue, QueueFactory, Scalar, TimelineSignal, Timeout,
};

use support::{Profile, Ratio};

const DISPATCHES: usize = 1_000;
const WORDS: usize = 64;
const TRANSFER: usize = 16 << 20;
const SMALL_TRANSFER: usize = 4 << 10;
/// The kernels of `plan_replay_vulkan`'s chain.
const PLAN_KERNELS: usize = 64;

/// The tiny kernel both sides dispatch: a fixed work-group size, so both
/// run the same SPIR-V.
const ADD: &str = "
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
var<immediate> n: u32;
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) id: vec3<u32>) {
    data[id.x] = data[id.x] + n;
}
";

fn device() -> Option<VulkanDevice> {
    let ordinal = std::env::var("HWQUEUE_VULKAN_DEVICE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    match VulkanDevice::open(ordinal) {
        Ok(device) => {
            println!("vulkan:{ordinal}: {} ({})", device.name(), device.driver());
            Some(device)
        }
        Err(error) => {
            println!("skipped: no Vulkan driver ({error})");
            None
        }
    }
}

/// Raw `ash` on the `VkDevice` and compute `VkQueue` hwqueue opened
/// (`VulkanDevice::raw_device`, `with_compute_queue`): one command pool
/// and buffer, one timeline semaphore. Both sides run on the same driver
/// objects and its threads: on lavapipe, two `VkDevice`s in one process
/// run the same work at speeds 1.2–1.35x apart (the one made first is
/// slower; measured with this group's paired form, raw against raw), which
/// a baseline on a device of its own would count as hwqueue's.
struct Raw {
    owner: VulkanDevice,
    device: ash::Device,
    memory: vk::PhysicalDeviceMemoryProperties,
    pool: vk::CommandPool,
    command: vk::CommandBuffer,
    semaphore: vk::Semaphore,
    value: u64,
}

impl Raw {
    fn on(owner: &VulkanDevice) -> Self {
        let device = owner.raw_device().clone();
        // SAFETY: every handle made below is destroyed in `Drop`, after
        // the device is idle; `owner` keeps the device alive until then.
        unsafe {
            let pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(owner.compute_family())
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .expect("vkCreateCommandPool");
            let command = device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .command_buffer_count(1),
                )
                .expect("vkAllocateCommandBuffers")[0];
            let mut timeline = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk::SemaphoreType::TIMELINE)
                .initial_value(0);
            let semaphore = device
                .create_semaphore(
                    &vk::SemaphoreCreateInfo::default().push_next(&mut timeline),
                    None,
                )
                .expect("vkCreateSemaphore");
            let memory = owner
                .raw_instance()
                .get_physical_device_memory_properties(owner.raw_physical_device());
            Self {
                owner: owner.clone(),
                device,
                memory,
                pool,
                command,
                semaphore,
                value: 0,
            }
        }
    }

    /// Records the command buffer afresh with `record`, to be submitted
    /// once.
    fn record(&self, record: impl FnOnce(&ash::Device, vk::CommandBuffer)) {
        self.record_for(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, record);
    }

    /// Records the command buffer afresh with `record`, for `usage`.
    fn record_for(
        &self,
        usage: vk::CommandBufferUsageFlags,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) {
        // SAFETY: the buffer is not pending (every submit is waited for).
        unsafe {
            self.device
                .begin_command_buffer(
                    self.command,
                    &vk::CommandBufferBeginInfo::default().flags(usage),
                )
                .expect("vkBeginCommandBuffer");
            record(&self.device, self.command);
            self.device
                .end_command_buffer(self.command)
                .expect("vkEndCommandBuffer");
        }
    }

    /// Submits the command buffer with the next timeline value and waits.
    fn submit_and_wait(&mut self) {
        self.value += 1;
        let values = [self.value];
        let semaphores = [self.semaphore];
        let commands = [self.command];
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let submit = vk::SubmitInfo::default()
            .command_buffers(&commands)
            .signal_semaphores(&semaphores)
            .push_next(&mut timeline);
        // SAFETY: the queue's lock is held; the command buffer is recorded
        // and not pending.
        unsafe {
            self.owner.with_compute_queue(|queue| {
                self.device
                    .queue_submit(queue, &[submit], vk::Fence::null())
                    .expect("vkQueueSubmit")
            });
            self.device
                .wait_semaphores(
                    &vk::SemaphoreWaitInfo::default()
                        .semaphores(&semaphores)
                        .values(&values),
                    u64::MAX,
                )
                .expect("vkWaitSemaphores");
        }
    }

    /// A buffer of `size` bytes in host-visible, coherent memory (device
    /// local too where a type is both), mapped.
    fn mapped_buffer(&self, size: usize) -> (vk::Buffer, vk::DeviceMemory, *mut u8) {
        // SAFETY: the buffer and memory are destroyed by `free` before the
        // device.
        unsafe {
            let buffer = self
                .device
                .create_buffer(
                    &vk::BufferCreateInfo::default().size(size as u64).usage(
                        vk::BufferUsageFlags::STORAGE_BUFFER
                            | vk::BufferUsageFlags::TRANSFER_SRC
                            | vk::BufferUsageFlags::TRANSFER_DST,
                    ),
                    None,
                )
                .expect("vkCreateBuffer");
            let needs = self.device.get_buffer_memory_requirements(buffer);
            let wanted =
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
            let types = &self.memory.memory_types[..self.memory.memory_type_count as usize];
            let fits = |i: usize, flags: vk::MemoryPropertyFlags| {
                needs.memory_type_bits & (1 << i) != 0 && types[i].property_flags.contains(flags)
            };
            let index = (0..types.len())
                .find(|&i| fits(i, wanted | vk::MemoryPropertyFlags::DEVICE_LOCAL))
                .or_else(|| (0..types.len()).find(|&i| fits(i, wanted)))
                .expect("a host-visible, coherent memory type");
            let memory = self
                .device
                .allocate_memory(
                    &vk::MemoryAllocateInfo::default()
                        .allocation_size(needs.size)
                        .memory_type_index(index as u32),
                    None,
                )
                .expect("vkAllocateMemory");
            self.device
                .bind_buffer_memory(buffer, memory, 0)
                .expect("vkBindBufferMemory");
            let pointer = self
                .device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .expect("vkMapMemory")
                .cast::<u8>();
            (buffer, memory, pointer)
        }
    }

    fn free(&self, buffer: vk::Buffer, memory: vk::DeviceMemory) {
        // SAFETY: no submission that uses them is pending.
        unsafe {
            self.device.destroy_buffer(buffer, None);
            self.device.free_memory(memory, None);
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: every submission was waited for (`submit_and_wait`);
        // the device is hwqueue's, alive while `owner` is.
        unsafe {
            self.device.destroy_semaphore(self.semaphore, None);
            self.device.destroy_command_pool(self.pool, None);
        }
    }
}

/// `step` once run: hwqueue makes some objects at their first use (a
/// pipeline at a program's first exec, a queue's first command buffer and
/// descriptor pool), which the baseline makes in its setup, and a fresh
/// mapping takes its page faults at its first copy.
fn warmed(mut step: impl FnMut()) -> impl FnMut() {
    step();
    step
}

/// Case `name` of `group`: `step`, set up once for all of criterion's
/// samples (it calls a case's function for each) and warmed.
fn case(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, step: impl FnMut()) {
    let mut step = warmed(step);
    group.bench_function(name, |b| b.iter(&mut step));
}

/// Paired case `name` of `group`: `ours` timed next to `baseline`
/// ([`support::paired`]), both set up once and warmed.
fn pair(
    group: &mut BenchmarkGroup<'_, Ratio>,
    name: &str,
    ours: impl FnMut(),
    baseline: impl FnMut(),
) {
    let (mut ours, mut baseline) = (warmed(ours), warmed(baseline));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| support::paired(iters, &mut ours, &mut baseline))
    });
}

/// hwqueue's roundtrip: a signal submitted, then waited for.
fn roundtrip_hwqueue(device: &VulkanDevice) -> impl FnMut() + use<> {
    let mut queue = device.compute_queue().expect("queue");
    let signal = device.new_signal(0).expect("signal");
    let mut value = 0;
    move || {
        value += 1;
        queue.signal(&signal, value).submit().expect("submit");
        signal.wait(value, Timeout::Forever).expect("reached");
    }
}

/// The baseline's: an empty command buffer submitted with a timeline
/// signal, then `vkWaitSemaphores`.
fn roundtrip_raw(device: &VulkanDevice) -> impl FnMut() + use<> {
    let mut raw = Raw::on(device);
    move || {
        raw.record(|_, _| {});
        raw.submit_and_wait();
    }
}

fn vulkan_roundtrip(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("vulkan_roundtrip");
    support::configure(&mut group, Profile::Latency);
    case(&mut group, "hwqueue", roundtrip_hwqueue(&device));
    case(&mut group, "raw_ash", roundtrip_raw(&device));
    group.finish();
}

/// hwqueue's dispatches: 1,000 `exec`s in one batch, a signal, submit,
/// wait.
fn dispatch_hwqueue(device: &VulkanDevice) -> impl FnMut() + use<> {
    let program = VulkanProgram::from_wgsl("add", ADD, "add").expect("compiles");
    let buffer = device.alloc(WORDS * 4).expect("alloc");
    let mut queue = device.compute_queue().expect("queue");
    let signal = device.new_signal(0).expect("signal");
    let mut value = 0;
    move || {
        for _ in 0..DISPATCHES {
            queue.exec(
                &program,
                &[&buffer],
                &[Scalar::U32(1)],
                ExecParams::new_1d(WORDS as u32, 64),
            );
        }
        value += 1;
        queue.signal(&signal, value).submit().expect("submit");
        signal.wait(value, Timeout::Forever).expect("ran");
    }
}

/// The baseline's pipeline and the objects it needs, destroyed before
/// their device.
struct RawPipeline {
    raw: Raw,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    shader: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    descriptors: vk::DescriptorPool,
    set: vk::DescriptorSet,
}

impl Drop for RawPipeline {
    fn drop(&mut self) {
        // SAFETY: every submission was waited for.
        unsafe {
            let d = &self.raw.device;
            d.destroy_descriptor_pool(self.descriptors, None);
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            d.destroy_shader_module(self.shader, None);
        }
        self.raw.free(self.buffer, self.memory);
    }
}

/// The baseline's dispatches: the same 1,000 recorded into one command
/// buffer, submitted with a timeline signal, `vkWaitSemaphores`.
fn dispatch_raw(device: &VulkanDevice) -> impl FnMut() + use<> {
    let mut state = raw_pipeline(device);
    move || {
        let (layout, pipeline, set) = (state.layout, state.pipeline, state.set);
        state.raw.record(|d, command| {
            record_chain(d, command, (layout, pipeline, set), DISPATCHES);
        });
        state.raw.submit_and_wait();
    }
}

/// `count` dispatches of the baseline's pipeline (one work-group of 64
/// words each), each after a compute-to-compute barrier from the one
/// before, as hwqueue's recorder separates dependent dispatches.
fn record_chain(
    d: &ash::Device,
    command: vk::CommandBuffer,
    (layout, pipeline, set): (vk::PipelineLayout, vk::Pipeline, vk::DescriptorSet),
    count: usize,
) {
    let barrier = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    // SAFETY: the command buffer is recording; the pipeline, layout and
    // set are alive.
    unsafe {
        d.cmd_bind_pipeline(command, vk::PipelineBindPoint::COMPUTE, pipeline);
        d.cmd_bind_descriptor_sets(
            command,
            vk::PipelineBindPoint::COMPUTE,
            layout,
            0,
            &[set],
            &[],
        );
        for i in 0..count {
            if i > 0 {
                d.cmd_pipeline_barrier(
                    command,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                );
            }
            d.cmd_push_constants(
                command,
                layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &1u32.to_ne_bytes(),
            );
            d.cmd_dispatch(command, 1, 1, 1);
        }
    }
}

/// The baseline's pipeline over a buffer of [`WORDS`], with its
/// descriptor set written.
fn raw_pipeline(device: &VulkanDevice) -> RawPipeline {
    let raw = Raw::on(device);
    let (buffer, memory, _) = raw.mapped_buffer(WORDS * 4);
    // The SPIR-V hwqueue hands the driver: the same shader both sides.
    let spirv = VulkanProgram::from_wgsl("add", ADD, "add")
        .expect("compiles")
        .spirv()
        .to_vec();
    // SAFETY: every object is made from `raw.device` and destroyed
    // below, after the last submission was waited for.
    let (shader, set_layout, layout, pipeline, descriptors, set) = unsafe {
        let d = &raw.device;
        let shader = d
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&spirv), None)
            .expect("vkCreateShaderModule");
        let bindings = [vk::DescriptorSetLayoutBinding::default()
            .binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(1)
            .stage_flags(vk::ShaderStageFlags::COMPUTE)];
        let set_layout = d
            .create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )
            .expect("vkCreateDescriptorSetLayout");
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(4)];
        let set_layouts = [set_layout];
        let layout = d
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default()
                    .set_layouts(&set_layouts)
                    .push_constant_ranges(&ranges),
                None,
            )
            .expect("vkCreatePipelineLayout");
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(shader)
            .name(c"add");
        let pipeline = d
            .create_compute_pipelines(
                vk::PipelineCache::null(),
                &[vk::ComputePipelineCreateInfo::default()
                    .stage(stage)
                    .layout(layout)],
                None,
            )
            .expect("vkCreateComputePipelines")[0];
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(1)];
        let descriptors = d
            .create_descriptor_pool(
                &vk::DescriptorPoolCreateInfo::default()
                    .max_sets(1)
                    .pool_sizes(&sizes),
                None,
            )
            .expect("vkCreateDescriptorPool");
        let set = d
            .allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(descriptors)
                    .set_layouts(&set_layouts),
            )
            .expect("vkAllocateDescriptorSets")[0];
        let info = [vk::DescriptorBufferInfo::default()
            .buffer(buffer)
            .range(vk::WHOLE_SIZE)];
        d.update_descriptor_sets(
            &[vk::WriteDescriptorSet::default()
                .dst_set(set)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(&info)],
            &[],
        );
        (shader, set_layout, layout, pipeline, descriptors, set)
    };
    RawPipeline {
        raw,
        buffer,
        memory,
        shader,
        set_layout,
        layout,
        pipeline,
        descriptors,
        set,
    }
}

/// [`PLAN_KERNELS`] dependent `x += 1` kernels over `x`.
fn add_chain(
    schedule: &mut hwqueue::Schedule<hwqueue::vulkan::Vulkan>,
    d: hwqueue::DeviceId,
    x: hwqueue::BufferId,
    program: &VulkanProgram,
) {
    for k in 0..PLAN_KERNELS {
        schedule.exec(
            format!("add {k}"),
            d,
            program,
            &[x],
            &[Scalar::U32(1)],
            ExecParams::new_1d(WORDS as u32, 64),
        );
    }
}

/// Issue 45: a plan of [`PLAN_KERNELS`] dependent kernels (`x += 1` over
/// 64 words, one work-group each), run and waited for: with replay (its
/// recording submitted again), and with replay off (every run recorded).
fn plan_hwqueue(device: &VulkanDevice, replay: bool) -> impl FnMut() + use<> {
    use hwqueue::{Plan, Schedule};
    let program = VulkanProgram::from_wgsl("add", ADD, "add").expect("compiles");
    let buffer = device.alloc(WORDS * 4).expect("alloc");
    let mut schedule = Schedule::<hwqueue::vulkan::Vulkan>::new();
    let d = schedule.add_device(Arc::new(device.clone()));
    let x = schedule.add_buffer(d, "x", buffer);
    add_chain(&mut schedule, d, x, &program);
    let mut plan: Plan<hwqueue::vulkan::Vulkan> = schedule.plan().expect("plans");
    plan.set_replay(replay);
    move || {
        plan.run()
            .expect("runs")
            .wait(Timeout::Forever)
            .expect("completes");
    }
}

/// `plan_hwqueue` with replay over a slot bound to the next of eight
/// buffers before each run, more than the four recordings a queue keeps:
/// where the driver writes descriptors after binding
/// (`VulkanDevice::rebinds_in_place`), each run rewrites the recording's
/// one changed descriptor; elsewhere each run records its 64 dispatches.
fn plan_hwqueue_rebound(device: &VulkanDevice) -> impl FnMut() + use<> {
    use hwqueue::{Plan, Schedule};
    let program = VulkanProgram::from_wgsl("add", ADD, "add").expect("compiles");
    let buffers: Vec<_> = (0..8)
        .map(|_| device.alloc(WORDS * 4).expect("alloc"))
        .collect();
    let mut schedule = Schedule::<hwqueue::vulkan::Vulkan>::new();
    let d = schedule.add_device(Arc::new(device.clone()));
    let x = schedule.add_slot(d, "x", WORDS * 4);
    add_chain(&mut schedule, d, x, &program);
    let mut plan: Plan<hwqueue::vulkan::Vulkan> = schedule.plan().expect("plans");
    let mut next = 0;
    move || {
        next = (next + 1) % buffers.len();
        plan.bind(x, &buffers[next]).expect("binds");
        plan.run()
            .expect("runs")
            .wait(Timeout::Forever)
            .expect("completes");
    }
}

/// The baseline: the same [`PLAN_KERNELS`] dispatches and barriers
/// recorded into one command buffer once, submitted again each iteration
/// with the next timeline value and waited for.
fn plan_raw_prerecorded(device: &VulkanDevice) -> impl FnMut() + use<> {
    let mut state = raw_pipeline(device);
    let (layout, pipeline, set) = (state.layout, state.pipeline, state.set);
    // Submitted again only once the last submission completed.
    state
        .raw
        .record_for(vk::CommandBufferUsageFlags::empty(), |d, command| {
            record_chain(d, command, (layout, pipeline, set), PLAN_KERNELS);
        });
    move || state.raw.submit_and_wait()
}

/// Issue 45's `plan_replay_vulkan`: `Plan::run` + wait of a 64-kernel
/// chain with replay, against one command buffer recorded once and
/// resubmitted (`raw_ash_prerecorded`); `hwqueue_rerecorded` (replay off)
/// shows what replay saves, and `hwqueue_rebound` what a rebinding costs.
fn plan_replay_vulkan(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("plan_replay_vulkan");
    support::configure(&mut group, Profile::Latency);
    case(&mut group, "hwqueue", plan_hwqueue(&device, true));
    case(
        &mut group,
        "hwqueue_rerecorded",
        plan_hwqueue(&device, false),
    );
    case(&mut group, "hwqueue_rebound", plan_hwqueue_rebound(&device));
    case(
        &mut group,
        "raw_ash_prerecorded",
        plan_raw_prerecorded(&device),
    );
    group.finish();
}

fn vulkan_dispatch(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("vulkan_dispatch");
    support::configure(&mut group, Profile::Latency);
    case(&mut group, "hwqueue", dispatch_hwqueue(&device));
    case(&mut group, "raw_ash", dispatch_raw(&device));
    group.finish();
}

/// hwqueue's transfer, the same two copies as the baseline: the input
/// handed over without a copy (an `Arc` the host keeps, `upload_vec`) and
/// the output landing in the previous iteration's vector
/// (`Download::from_vec`).
fn transfer_hwqueue(device: &VulkanDevice, data: &Arc<[u32]>) -> impl FnMut() + use<> {
    let len = data.len();
    let buffer = device.alloc_uninit(4 * len).expect("alloc");
    let mut queue = device.compute_queue().expect("queue");
    let input = data.clone();
    let mut out = vec![0u32; len];
    move || {
        let back = Download::from_vec(std::mem::take(&mut out));
        queue
            .upload_vec(&buffer, input.clone())
            .download(&buffer, &back)
            .submit()
            .expect("submit");
        out = back.take(Timeout::Forever).expect("downloaded");
        assert_eq!(out.len(), input.len());
    }
}

/// The baseline's: 16 MiB copied into mapped, host-visible memory and
/// back out into one vector.
fn transfer_raw(device: &VulkanDevice, data: &Arc<[u32]>) -> impl FnMut() + use<> {
    /// The mapped buffer, freed before its device.
    struct Mapped {
        raw: Raw,
        buffer: vk::Buffer,
        memory: vk::DeviceMemory,
        pointer: *mut u8,
    }
    impl Drop for Mapped {
        fn drop(&mut self) {
            self.raw.free(self.buffer, self.memory);
        }
    }
    let raw = Raw::on(device);
    let bytes = 4 * data.len();
    let (buffer, memory, pointer) = raw.mapped_buffer(bytes);
    let mapped = Mapped {
        raw,
        buffer,
        memory,
        pointer,
    };
    let input = data.clone();
    let mut out = vec![0u32; data.len()];
    move || {
        // The whole of `mapped`, not only its pointer, goes into the
        // closure (a closure captures only the fields it names).
        let mapped = &mapped;
        // SAFETY: `pointer` maps `bytes` bytes, coherent, which no
        // submission uses; `input` and `out` hold as many.
        unsafe {
            std::ptr::copy_nonoverlapping(input.as_ptr().cast::<u8>(), mapped.pointer, bytes);
            std::ptr::copy_nonoverlapping(mapped.pointer, out.as_mut_ptr().cast::<u8>(), bytes);
        }
        assert_eq!(out.len(), input.len());
    }
}

fn vulkan_transfer(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("vulkan_transfer");
    support::configure(&mut group, Profile::Bandwidth);
    group.throughput(criterion::Throughput::Bytes(2 * TRANSFER as u64));
    let data: Arc<[u32]> = (0..(TRANSFER / 4) as u32).collect();

    case(&mut group, "hwqueue", transfer_hwqueue(&device, &data));

    // For information (no target): the borrowing calls, which copy the
    // input into the batch when recorded and land the output in a new,
    // zeroed vector: two more passes over 16 MiB than the baseline.
    let buffer = device.alloc_uninit(TRANSFER).expect("alloc");
    let mut queue = device.compute_queue().expect("queue");
    case(&mut group, "hwqueue_borrowed", || {
        let back = Download::<u32>::new(TRANSFER / 4);
        queue
            .upload(&buffer, &data)
            .download(&buffer, &back)
            .submit()
            .expect("submit");
        let out = back.take(Timeout::Forever).expect("downloaded");
        assert_eq!(out.len(), data.len());
    });

    case(&mut group, "raw_ash", transfer_raw(&device, &data));
    group.finish();
}

/// The transfer at 4 KiB: what an upload + download batch costs besides
/// its copies (no target; at 16 MiB the copies take milliseconds).
fn vulkan_transfer_small(c: &mut Criterion) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("vulkan_transfer_small");
    support::configure(&mut group, Profile::Latency);
    let data: Arc<[u32]> = (0..(SMALL_TRANSFER / 4) as u32).collect();
    case(&mut group, "hwqueue", transfer_hwqueue(&device, &data));
    case(&mut group, "raw_ash", transfer_raw(&device, &data));
    group.finish();
}

/// The three groups again, each iteration of hwqueue timed next
/// to one of the baseline ([`support::paired`]): criterion reports the
/// ratio (`x`), not a time.
fn vulkan_paired(c: &mut Criterion<Ratio>) {
    let Some(device) = device() else { return };
    let mut group = c.benchmark_group("vulkan_dispatch_paired");
    support::configure(&mut group, Profile::Latency);
    pair(
        &mut group,
        "hwqueue_over_raw_ash",
        dispatch_hwqueue(&device),
        dispatch_raw(&device),
    );
    // The method's control (no target): the baseline against itself, two
    // command buffers on the one device, reads 1.00 x within its spread.
    pair(
        &mut group,
        "raw_ash_over_raw_ash",
        dispatch_raw(&device),
        dispatch_raw(&device),
    );
    group.finish();

    let mut group = c.benchmark_group("vulkan_roundtrip_paired");
    support::configure(&mut group, Profile::Latency);
    pair(
        &mut group,
        "hwqueue_over_raw_ash",
        roundtrip_hwqueue(&device),
        roundtrip_raw(&device),
    );
    group.finish();

    // Issue 45's plan replay paired: the replayed 64-kernel plan against
    // the prerecorded buffer (the target, <= 1.10), and a run rebound to
    // another buffer against an unchanged one (what a rebinding costs).
    let mut group = c.benchmark_group("plan_replay_vulkan_paired");
    support::configure(&mut group, Profile::Latency);
    pair(
        &mut group,
        "hwqueue_over_raw_ash",
        plan_hwqueue(&device, true),
        plan_raw_prerecorded(&device),
    );
    pair(
        &mut group,
        "rebound_over_unchanged",
        plan_hwqueue_rebound(&device),
        plan_hwqueue(&device, true),
    );
    group.finish();

    let mut group = c.benchmark_group("vulkan_transfer_paired");
    support::configure(&mut group, Profile::Bandwidth);
    let data: Arc<[u32]> = (0..(TRANSFER / 4) as u32).collect();
    pair(
        &mut group,
        "hwqueue_over_raw_ash",
        transfer_hwqueue(&device, &data),
        transfer_raw(&device, &data),
    );
    // The control again: memory bandwidth moves with where each side's
    // pages lie, which differs from run to run.
    pair(
        &mut group,
        "raw_ash_over_raw_ash",
        transfer_raw(&device, &data),
        transfer_raw(&device, &data),
    );
    group.finish();
}

criterion_group!(
    benches,
    vulkan_roundtrip,
    vulkan_dispatch,
    vulkan_transfer,
    vulkan_transfer_small,
    plan_replay_vulkan
);
criterion_group! {
    name = paired;
    config = Criterion::default().with_measurement(Ratio);
    targets = vulkan_paired
}
criterion_main!(benches, paired);
