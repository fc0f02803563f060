//! Recording a batch's device commands into the open command buffer:
//! copies, fills, uploads and downloads through staging ranges, execs with
//! their descriptor sets, and the barriers between dependent commands
//! (`begin`, `Touched`).

use ash::vk;

use super::Vulkan;
use super::engine::CommandSet;
use super::memory::VulkanBuffer;
use super::program::{Pipeline, VulkanProgram};
use super::recorder::Recorder;
use crate::buffer::Buffer;
use crate::error::Result;
use crate::params::ExecParams;
use crate::program::Scalar;
use crate::view::View;

/// Bytes of a `VkBuffer` a command touches: buffer, offset, length (0 for
/// the rest of the buffer, as a descriptor's `VK_WHOLE_SIZE`).
pub(super) type Bytes = (vk::Buffer, u64, u64);

/// Which pipeline stage a device command runs in, and the accesses it
/// makes there: a barrier names exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// An exec: the compute shader stage, shader reads and writes.
    Shader,
    /// A copy, fill or staged transfer: the transfer stage.
    Transfer,
}

impl Stage {
    fn bit(self) -> u8 {
        match self {
            Stage::Shader => 1,
            Stage::Transfer => 2,
        }
    }

    fn flags(self) -> vk::PipelineStageFlags {
        match self {
            Stage::Shader => vk::PipelineStageFlags::COMPUTE_SHADER,
            Stage::Transfer => vk::PipelineStageFlags::TRANSFER,
        }
    }

    fn write(self) -> vk::AccessFlags {
        match self {
            Stage::Shader => vk::AccessFlags::SHADER_WRITE,
            Stage::Transfer => vk::AccessFlags::TRANSFER_WRITE,
        }
    }

    fn read_write(self) -> vk::AccessFlags {
        match self {
            Stage::Shader => vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
            Stage::Transfer => vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE,
        }
    }
}

/// One access of the open command buffer that a later command of some
/// stage may still have to wait for.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Pending {
    bytes: Bytes,
    write: bool,
    stage: Stage,
}

/// The accesses of the open command buffer not yet ordered before each
/// stage that may follow, and what a new command needs to wait for.
///
/// A barrier names exactly the two sides (the stages and write accesses of
/// the earlier commands it waits for, the stage and accesses of the
/// command that waits): a dispatch after a dispatch is compute to compute,
/// `SHADER_WRITE` to `SHADER_READ | SHADER_WRITE`, as a hand-written
/// Vulkan program records it. Such a barrier orders the earlier work only
/// before that one stage, so the accesses are kept per stage that may
/// follow: a list per destination stage, which a barrier to that stage
/// empties (its sources are every stage in the list), so a chain of
/// dispatches scans one short list each (a copy after them, reading what
/// one wrote, still finds it in the transfer stage's list and gets its
/// compute-to-transfer barrier). A repeated access is kept once.
pub(super) struct Touched {
    /// Per destination stage ([`Stage::bit`] - 1), what it has yet to be
    /// ordered after.
    pending: [Vec<Pending>; 2],
    /// The stages ([`Stage::bit`]) the queue's commands run in.
    stages: u8,
}

impl Touched {
    /// For a queue whose commands run in `stages`.
    pub(super) fn new(stages: &[Stage]) -> Self {
        Self {
            pending: [Vec::new(), Vec::new()],
            stages: stages.iter().fold(0, |bits, stage| bits | stage.bit()),
        }
    }

    pub(super) fn clear(&mut self) {
        for list in &mut self.pending {
            list.clear();
        }
    }

    fn list(&self, stage: Stage) -> &Vec<Pending> {
        &self.pending[usize::from(stage.bit() - 1)]
    }

    /// The stages a command of `stage` reading `reads` and writing
    /// `writes` must wait for, or none (0): where it conflicts with an
    /// access not yet ordered before `stage` (read after write, write after
    /// write, write after read on overlapping bytes), every stage of those
    /// accesses, so the barrier orders them all.
    pub(super) fn conflicts(&self, stage: Stage, reads: &[Bytes], writes: &[Bytes]) -> u8 {
        let overlap = |a: &Bytes, b: &Bytes| {
            let end = |x: &Bytes| if x.2 == 0 { u64::MAX } else { x.1 + x.2 };
            a.0 == b.0 && a.1 < end(b) && b.1 < end(a)
        };
        let list = self.list(stage);
        let conflict = list.iter().any(|p| {
            writes.iter().any(|w| overlap(w, &p.bytes))
                || (p.write && reads.iter().any(|r| overlap(r, &p.bytes)))
        });
        if conflict {
            list.iter().fold(0, |stages, p| stages | p.stage.bit())
        } else {
            0
        }
    }

    /// A barrier from `sources` (stage bits) to `stage` was recorded: what
    /// those stages did is now ordered before `stage`.
    fn ordered(&mut self, sources: u8, stage: Stage) {
        self.pending[usize::from(stage.bit() - 1)].retain(|p| p.stage.bit() & sources == 0);
    }

    /// Records a command of `stage`'s accesses, for each stage the queue
    /// runs to be ordered after.
    pub(super) fn add(&mut self, stage: Stage, reads: &[Bytes], writes: &[Bytes]) {
        let accesses = reads
            .iter()
            .map(|bytes| (bytes, false))
            .chain(writes.iter().map(|bytes| (bytes, true)));
        for (bytes, write) in accesses {
            let access = Pending {
                bytes: *bytes,
                write,
                stage,
            };
            for destination in [Stage::Shader, Stage::Transfer] {
                if self.stages & destination.bit() == 0 {
                    continue;
                }
                let list = &mut self.pending[usize::from(destination.bit() - 1)];
                if !list.contains(&access) {
                    list.push(access);
                }
            }
        }
    }

    /// The barrier from `sources` (stage bits) to `stage`: source stages,
    /// their write accesses, destination stage, its accesses.
    fn barrier(
        sources: u8,
        stage: Stage,
    ) -> (
        vk::PipelineStageFlags,
        vk::AccessFlags,
        vk::PipelineStageFlags,
        vk::AccessFlags,
    ) {
        let mut src_stages = vk::PipelineStageFlags::empty();
        let mut src_access = vk::AccessFlags::empty();
        for source in [Stage::Shader, Stage::Transfer] {
            if sources & source.bit() != 0 {
                src_stages |= source.flags();
                src_access |= source.write();
            }
        }
        (src_stages, src_access, stage.flags(), stage.read_write())
    }
}

/// What the open command buffer has bound: an exec of the same pipeline
/// over the same bytes records only its push constants and its dispatch.
/// Bindings are a command buffer's state, kept across barriers, copies
/// and fills, so a run of execs of one kernel (a loop's body, a benchmark's
/// 1,000) allocates, writes and binds one descriptor set, not one each;
/// `begin` forgets it when it opens a command buffer.
pub(super) struct Bound {
    pipeline: vk::Pipeline,
    infos: Vec<vk::DescriptorBufferInfo>,
}

impl Bound {
    /// Whether `pipeline` is bound with a set of exactly `infos`.
    fn holds(&self, pipeline: vk::Pipeline, infos: &[vk::DescriptorBufferInfo]) -> bool {
        let key = |i: &vk::DescriptorBufferInfo| (i.buffer, i.offset, i.range);
        self.pipeline == pipeline
            && self.infos.len() == infos.len()
            && self.infos.iter().zip(infos).all(|(a, b)| key(a) == key(b))
    }
}

impl Recorder {
    /// The `VkBuffer` and offset of `view`: a block's buffer, or the dummy
    /// for an empty buffer.
    pub(super) fn device_range(&self, view: &View<Vulkan>) -> Result<(vk::Buffer, u64)> {
        Ok(match view.buffer().queue_address()? {
            // An empty view binds the dummy, as an empty buffer does: its
            // buffer's `VkBuffer` is the whole pool block, and a binding of
            // the rest of it (`WHOLE_SIZE`) would reach other buffers.
            Some(address) if !view.is_empty() => {
                (address.buffer, address.offset + view.offset() as u64)
            }
            _ => (self.dummy.buffer(), 0),
        })
    }

    /// `len` bytes (more than 0) of staging memory, a range of the
    /// device's staging pool held until the batch retires: where the device sees
    /// it, and its index in the batch's staging list.
    pub(super) fn staging(&mut self, len: usize) -> Result<((vk::Buffer, u64), usize)> {
        let range = VulkanBuffer::allocate(self.device.staging_pool(), len, false, false)?;
        let address = range
            .queue_address()?
            .expect("a range of more than 0 bytes has an address");
        let current = self.current.as_mut().expect("a batch is recording");
        current.staging.push(range);
        Ok(((address.buffer, address.offset), current.staging.len() - 1))
    }

    pub(super) fn upload(&mut self, index: usize, dst: &View<Vulkan>, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (from, at) = self.staging(bytes.len())?;
        let current = self.current.as_ref().expect("a batch is recording");
        current.staging[at].write_at(0, bytes)?;
        let to = self.device_range(dst)?;
        self.copy(index, from, to, bytes.len())
    }

    /// Records a copy of `len` bytes (none for 0) from `from` to `to`
    /// (each a `VkBuffer` and an offset), for command `index`.
    pub(super) fn copy(
        &mut self,
        index: usize,
        from: (vk::Buffer, u64),
        to: (vk::Buffer, u64),
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let len64 = len as u64;
        let cb = self.begin(
            index,
            Stage::Transfer,
            &[(from.0, from.1, len64)],
            &[(to.0, to.1, len64)],
        )?;
        let region = [vk::BufferCopy {
            src_offset: from.1,
            dst_offset: to.1,
            size: len as u64,
        }];
        // SAFETY: both ranges lie in live buffers the batch holds (views
        // checked at record time, staging buffers held until it retires);
        // the command buffer records.
        unsafe {
            self.context
                .device
                .cmd_copy_buffer(cb, from.0, to.0, &region);
        }
        Ok(())
    }

    pub(super) fn fill(
        &mut self,
        index: usize,
        dst: &View<Vulkan>,
        pattern: &[u8; 4],
        width: u8,
    ) -> Result<()> {
        let len = dst.len();
        if len == 0 {
            return Ok(());
        }
        let (buffer, offset) = self.device_range(dst)?;
        if offset.is_multiple_of(4) && len.is_multiple_of(4) {
            // A pattern of 1 or 2 bytes repeats within a word.
            let mut word = [0u8; 4];
            for (at, byte) in word.iter_mut().enumerate() {
                *byte = pattern[at % usize::from(width)];
            }
            let cb = self.begin(index, Stage::Transfer, &[], &[(buffer, offset, len as u64)])?;
            // SAFETY: the range lies in a live buffer, offset and size are
            // multiples of 4.
            unsafe {
                self.context.device.cmd_fill_buffer(
                    cb,
                    buffer,
                    offset,
                    len as u64,
                    u32::from_ne_bytes(word),
                );
            }
            return Ok(());
        }
        let bytes: Vec<u8> = pattern[..usize::from(width)]
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect();
        self.upload(index, dst, &bytes)
    }

    pub(super) fn exec(
        &mut self,
        index: usize,
        program: &VulkanProgram,
        views: &[View<Vulkan>],
        scalars: &[Scalar],
        params: &ExecParams,
    ) -> Result<()> {
        let pipeline = program.pipeline(&self.context, params.local())?;
        let push = program.push_constants(scalars)?;
        let mut infos = Vec::with_capacity(views.len());
        for view in views {
            let (buffer, offset) = self.device_range(view)?;
            let range = if view.is_empty() {
                vk::WHOLE_SIZE
            } else {
                view.len() as u64
            };
            infos.push(vk::DescriptorBufferInfo {
                buffer,
                offset,
                range,
            });
        }
        let whole = |info: &vk::DescriptorBufferInfo| {
            let len = if info.range == vk::WHOLE_SIZE {
                0
            } else {
                info.range
            };
            (info.buffer, info.offset, len)
        };
        let reads: Vec<Bytes> = infos.iter().map(whole).collect();
        let writes: Vec<Bytes> = infos
            .iter()
            .enumerate()
            .filter(|(at, _)| program.writes(*at))
            .map(|(_, info)| whole(info))
            .collect();
        let cb = self.begin(index, Stage::Shader, &reads, &writes)?;
        let rebind = self
            .bound
            .as_ref()
            .is_none_or(|bound| !bound.holds(pipeline.pipeline, &infos));
        let mut written = None;
        if rebind {
            let set = self.descriptor_set(&pipeline, views.len())?;
            written = Some(set);
            let device = &self.context.device;
            let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
                .iter()
                .enumerate()
                .map(|(binding, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(binding as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(std::slice::from_ref(info))
                })
                .collect();
            // SAFETY: the set is fresh from a pool of this thread's, the
            // buffers live (the batch holds them), the command buffer
            // records; the pipeline is held by the program, which the
            // batch holds.
            unsafe {
                device.update_descriptor_sets(&writes, &[]);
                device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
                device.cmd_bind_descriptor_sets(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    pipeline.layout,
                    0,
                    &[set],
                    &[],
                );
            }
            self.bound = Some(Bound {
                pipeline: pipeline.pipeline,
                infos,
            });
        }
        self.note_exec(written, views.len());
        let groups = params.groups();
        let device = &self.context.device;
        // SAFETY: the command buffer records, with the pipeline and a set
        // of these buffers bound (above, or by an earlier exec of it).
        unsafe {
            if !push.is_empty() {
                device.cmd_push_constants(
                    cb,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    &push,
                );
            }
            device.cmd_dispatch(cb, groups[0], groups[1], groups[2]);
        }
        self.kernels += 1;
        Ok(())
    }

    /// A descriptor set of `pipeline`'s layout from the open command
    /// set's pools (a new pool where they are full).
    pub(super) fn descriptor_set(
        &mut self,
        pipeline: &Pipeline,
        buffers: usize,
    ) -> Result<vk::DescriptorSet> {
        let device = &self.context.device;
        let (set, _) = self.open.as_mut().expect("begun");
        let layouts = [pipeline.set_layout];
        loop {
            if set.used < set.pools.len() {
                let info = vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(set.pools[set.used])
                    .set_layouts(&layouts);
                // SAFETY: the pool is this thread's, the layout alive.
                match unsafe { device.allocate_descriptor_sets(&info) } {
                    Ok(sets) => return Ok(sets[0]),
                    Err(
                        vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL,
                    ) => {
                        set.used += 1;
                        continue;
                    }
                    Err(e) => return Err(self.context.error("vkAllocateDescriptorSets", e)),
                }
            }
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: (64 * buffers.max(8)) as u32,
            }];
            let mut info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(64)
                .pool_sizes(&sizes);
            if self.context.physical.update_after_bind {
                // The layouts' sets come from such pools (`make_pipeline`).
                info = info.flags(vk::DescriptorPoolCreateFlags::UPDATE_AFTER_BIND);
            }
            // SAFETY: the create-info lives across the call.
            let pool = unsafe { device.create_descriptor_pool(&info, None) }
                .map_err(|e| self.context.error("vkCreateDescriptorPool", e))?;
            set.pools.push(pool);
        }
    }

    /// The open command buffer (begun if none is) for command `index`,
    /// which reads `reads` and writes `writes`: with a barrier before it
    /// where it must come after a command of the buffer since the last
    /// barrier (it reads or writes bytes one wrote, or writes bytes one
    /// read), and always at the start of a buffer, which orders it after
    /// the `VkQueue`'s earlier submissions.
    pub(super) fn begin(
        &mut self,
        index: usize,
        stage: Stage,
        reads: &[Bytes],
        writes: &[Bytes],
    ) -> Result<vk::CommandBuffer> {
        let device = &self.context.device;
        // A buffer's first command gets a barrier: it follows the
        // `VkQueue`'s earlier submissions.
        let opened = self.open.is_none();
        if opened {
            // Nothing more runs on a lost device: no free set is reset and
            // begun there (a driver may fail that with an error of its
            // own, hiding the loss), as no submission is made.
            self.context.health()?;
            let mut set = match self.shared.free.lock().pop() {
                Some(set) => set,
                None => {
                    let info = vk::CommandBufferAllocateInfo::default()
                        .command_pool(self.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1);
                    // SAFETY: the pool is this thread's.
                    let buffers = unsafe { device.allocate_command_buffers(&info) }
                        .map_err(|e| self.context.error("vkAllocateCommandBuffers", e))?;
                    CommandSet {
                        buffer: buffers[0],
                        pools: Vec::new(),
                        used: 0,
                        queries: vk::QueryPool::null(),
                        written: 0,
                    }
                }
            };
            // A recording for replay is submitted again, maybe while its
            // last submission is pending.
            let usage = if self.recording_for_replay() {
                vk::CommandBufferUsageFlags::SIMULTANEOUS_USE
            } else {
                vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT
            };
            // SAFETY: the set's work completed (the retire thread handed it
            // back, or it is new); its pools and buffer are this thread's.
            let began = unsafe {
                set.pools
                    .iter()
                    .try_for_each(|&pool| {
                        device
                            .reset_descriptor_pool(pool, vk::DescriptorPoolResetFlags::empty())
                            .map_err(|e| ("vkResetDescriptorPool", e))
                    })
                    .and_then(|()| {
                        #[cfg(test)]
                        super::testing::injected("vkBeginCommandBuffer", self.progress)
                            .map_err(|e| ("vkBeginCommandBuffer", e))?;
                        device
                            .begin_command_buffer(
                                set.buffer,
                                &vk::CommandBufferBeginInfo::default().flags(usage),
                            )
                            .map_err(|e| ("vkBeginCommandBuffer", e))
                    })
            };
            if let Err((call, e)) = began {
                // Neither recording nor pending: back as it came (a new one
                // too), not dropped with its pools for the queue's life.
                self.shared.free.lock().push(set);
                return Err(self.context.error(call, e));
            }
            set.used = 0;
            set.written = 0;
            self.open = Some((set, index));
            self.touched.clear();
            self.bound = None;
            self.host_reads = false;
        }
        let buffer = self.open.as_ref().expect("just opened").0.buffer;
        let barrier = if opened {
            // The buffer's first command follows the `VkQueue`'s earlier
            // submissions, of every stage this queue's family runs.
            let stages = self.stages();
            Some((
                stages,
                vk::AccessFlags::MEMORY_WRITE,
                stages,
                vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
            ))
        } else {
            match self.touched.conflicts(stage, reads, writes) {
                0 => None,
                sources => {
                    self.touched.ordered(sources, stage);
                    Some(Touched::barrier(sources, stage))
                }
            }
        };
        self.touched.add(stage, reads, writes);
        if let Some((src_stages, src_access, dst_stages, dst_access)) = barrier {
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(src_access)
                .dst_access_mask(dst_access)];
            // SAFETY: the command buffer records.
            unsafe {
                device.cmd_pipeline_barrier(
                    buffer,
                    src_stages,
                    dst_stages,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                );
            }
        }
        self.open_timing(buffer)?;
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk::Handle;

    fn bytes(buffer: u64, offset: u64, len: u64) -> Bytes {
        (vk::Buffer::from_raw(buffer), offset, len)
    }

    /// Issue 46: barriers as the two commands need, not compute and
    /// transfer `MEMORY_WRITE` to `MEMORY_READ | MEMORY_WRITE` every time.
    #[test]
    fn barriers_name_exactly_the_stages_and_accesses_of_both_commands() {
        let mut touched = Touched::new(&[Stage::Shader, Stage::Transfer]);
        let (a, b) = (bytes(1, 0, 256), bytes(2, 0, 256));
        // A dispatch writes `a`; a dispatch reading it waits, compute to
        // compute, shader writes to shader reads and writes.
        touched.add(Stage::Shader, &[a], &[a]);
        let sources = touched.conflicts(Stage::Shader, &[a], &[b]);
        assert_eq!(sources, Stage::Shader.bit());
        assert_eq!(
            Touched::barrier(sources, Stage::Shader),
            (
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::AccessFlags::SHADER_WRITE,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
            )
        );
        touched.ordered(sources, Stage::Shader);
        touched.add(Stage::Shader, &[a], &[b]);
        // That barrier ordered the first dispatch before compute only: a
        // copy reading `a` still waits, compute to transfer.
        let sources = touched.conflicts(Stage::Transfer, &[a], &[bytes(3, 0, 256)]);
        assert_eq!(sources, Stage::Shader.bit());
        assert_eq!(
            Touched::barrier(sources, Stage::Transfer),
            (
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::AccessFlags::SHADER_WRITE,
                vk::PipelineStageFlags::TRANSFER,
                vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE,
            )
        );
        touched.ordered(sources, Stage::Transfer);
        touched.add(Stage::Transfer, &[a], &[bytes(3, 0, 256)]);
        // Disjoint bytes, and reads after reads, need nothing.
        assert_eq!(touched.conflicts(Stage::Shader, &[bytes(4, 0, 16)], &[]), 0);
        assert_eq!(touched.conflicts(Stage::Transfer, &[a], &[]), 0);
        // Write after read: a fill of `a` waits for the copy that read it
        // (an execution dependency: transfer to transfer).
        assert_eq!(
            touched.conflicts(Stage::Transfer, &[], &[bytes(1, 128, 16)]),
            Stage::Transfer.bit()
        );
        // Overlap within a buffer only: other bytes of it do not wait.
        assert_eq!(
            touched.conflicts(Stage::Shader, &[bytes(3, 256, 16)], &[]),
            0
        );
    }

    /// A copy queue runs transfers only: an access ordered before the
    /// transfer stage is forgotten, so the list does not grow with the
    /// command buffer.
    #[test]
    fn a_copy_queue_forgets_what_a_barrier_ordered() {
        let mut touched = Touched::new(&[Stage::Transfer]);
        for at in 0..100 {
            let x = bytes(1, 0, 64);
            let sources = touched.conflicts(Stage::Transfer, &[x], &[x]);
            if at > 0 {
                assert_eq!(sources, Stage::Transfer.bit());
            }
            touched.ordered(sources, Stage::Transfer);
            touched.add(Stage::Transfer, &[x], &[x]);
            assert!(touched.pending.iter().all(|list| list.len() <= 2));
        }
    }
}
