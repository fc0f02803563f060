//! The input of the planner: devices, buffers and operations in program
//! order.

use std::ops::{Bound, RangeBounds};

use super::*;

pub(super) struct BufferSlot<B: Backend> {
    pub(super) name: String,
    pub(super) device: DeviceId,
    /// The bytes: a whole buffer, or a view of another slot's.
    pub(super) buffer: View<B>,
    /// The slot of the whole buffer these bytes are part of (itself for a
    /// whole buffer): hazards compare bytes of it.
    pub(super) root: BufferId,
}

impl<B: Backend> BufferSlot<B> {
    /// Byte `range` of this slot as an access to its root buffer.
    pub(super) fn access(&self, range: std::ops::Range<usize>) -> Access {
        let offset = self.buffer.offset();
        Access {
            buffer: self.root,
            range: offset + range.start..offset + range.end,
        }
    }
}

pub(super) enum Work<B: Backend> {
    Exec {
        program: B::Program,
        buffers: Vec<BufferId>,
        scalars: Vec<Scalar>,
        params: ExecParams,
    },
    Copy {
        dst: BufferId,
        src: BufferId,
    },
    Fill {
        dst: BufferId,
        /// The pattern's bytes: the first `width` of these.
        pattern: [u8; 4],
        width: u8,
    },
    /// Host data staged per run ([`Plan::upload`]) into `dst`.
    Upload {
        dst: BufferId,
    },
    /// `src` into a [`Download`](crate::Download) staged per run
    /// ([`Plan::download`]).
    Download {
        src: BufferId,
    },
}

pub(super) struct Op<B: Backend> {
    pub(super) name: String,
    pub(super) device: DeviceId,
    pub(super) kind: QueueKind,
    pub(super) work: Work<B>,
    /// `None`: not declared; an exec then reads and writes every argument whole.
    pub(super) reads: Option<Vec<Access>>,
    pub(super) writes: Option<Vec<Access>>,
}

/// Operations over buffers on devices, in program order: the input of the
/// planner.
pub struct Schedule<B: Backend> {
    pub(super) devices: Vec<Arc<B::Device>>,
    pub(super) buffers: Vec<BufferSlot<B>>,
    pub(super) ops: Vec<Op<B>>,
}

impl<B: Backend> Default for Schedule<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> Schedule<B> {
    /// An empty schedule.
    pub fn new() -> Self {
        Self {
            devices: Vec::new(),
            buffers: Vec::new(),
            ops: Vec::new(),
        }
    }

    /// Adds a device operations can run on.
    pub fn add_device(&mut self, device: Arc<B::Device>) -> DeviceId {
        self.devices.push(device);
        DeviceId(self.devices.len() - 1)
    }

    /// Adds a buffer living on `device`, named for plans and errors.
    pub fn add_buffer(
        &mut self,
        device: DeviceId,
        name: impl Into<String>,
        buffer: B::Buffer,
    ) -> BufferId {
        let id = BufferId(self.buffers.len());
        self.buffers.push(BufferSlot {
            name: name.into(),
            device,
            buffer: View::whole(&buffer),
            root: id,
        });
        id
    }

    /// Adds `len` bytes from byte `offset` of schedule buffer `of` (a
    /// buffer, or a view itself) as a buffer of its own, named for plans
    /// and errors: a tensor placed in an arena. Operations take it wherever
    /// they take a buffer (an `exec` argument gets the view, a copy or fill
    /// the view's bytes), and the planner orders work by the bytes of the
    /// arena each touches: two kernels writing disjoint views of one arena
    /// need no wait.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for an unknown `of`;
    /// [`Error::ViewOutOfRange`] when the range does not lie in it.
    pub fn add_view(
        &mut self,
        name: impl Into<String>,
        of: BufferId,
        offset: usize,
        len: usize,
    ) -> Result<BufferId> {
        let parent = self
            .buffers
            .get(of.0)
            .ok_or_else(|| Error::InvalidSchedule {
                reason: format!("`add_view` names unknown buffer {}", of.0),
            })?;
        let slot = BufferSlot {
            name: name.into(),
            device: parent.device,
            buffer: parent.buffer.view(offset, len)?,
            root: parent.root,
        };
        self.buffers.push(slot);
        Ok(BufferId(self.buffers.len() - 1))
    }

    /// Adds a fill of `dst` with `pattern` (1, 2 or 4 bytes; `dst`'s
    /// offset and length multiples of its width) on the copy queue of its
    /// device. It writes all of `dst`.
    pub fn fill<T: Pod>(
        &mut self,
        name: impl Into<String>,
        dst: BufferId,
        pattern: T,
    ) -> OpBuilder<'_, B> {
        let device = self.device_of(dst);
        let (bytes, width) = crate::buffer::pattern_bytes(&pattern);
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Copy,
            work: Work::Fill {
                dst,
                pattern: bytes,
                // A width the queue refuses (0, 3, 8, ...) stays visible:
                // the planner names it.
                width: u8::try_from(width).unwrap_or(u8::MAX),
            },
            reads: None,
            writes: None,
        })
    }

    /// Adds an upload of host data into `dst` (all of it), in queue order,
    /// on the copy queue of its device: the model's inputs. The data is
    /// not known yet; each run takes what [`Plan::upload`] or
    /// [`Plan::upload_vec`] staged for this operation's id before it, so
    /// the planner orders it like any write of `dst` (after the previous
    /// run's last read of it, say).
    pub fn upload(&mut self, name: impl Into<String>, dst: BufferId) -> OpBuilder<'_, B> {
        let device = self.device_of(dst);
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Copy,
            work: Work::Upload { dst },
            reads: None,
            writes: None,
        })
    }

    /// Adds a download of all of `src` to host memory, in queue order, on
    /// the copy queue of its device: the model's outputs. Each run lands
    /// it in the [`Download`](crate::Download) that [`Plan::download`]
    /// staged for this operation's id before it.
    pub fn download(&mut self, name: impl Into<String>, src: BufferId) -> OpBuilder<'_, B> {
        let device = self.device_of(src);
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Copy,
            work: Work::Download { src },
            reads: None,
            writes: None,
        })
    }

    /// The device of `buffer`; an unknown buffer gets an unknown device,
    /// which `plan` reports along with the buffer.
    fn device_of(&self, buffer: BufferId) -> DeviceId {
        self.buffers
            .get(buffer.0)
            .map_or(DeviceId(usize::MAX), |b| b.device)
    }

    /// Adds a kernel launch on `device`'s compute queue. Unless narrowed with
    /// [`OpBuilder::reads`]/[`OpBuilder::writes`], it reads and writes every
    /// buffer argument whole.
    pub fn exec(
        &mut self,
        name: impl Into<String>,
        device: DeviceId,
        program: &B::Program,
        buffers: &[BufferId],
        scalars: &[Scalar],
        params: ExecParams,
    ) -> OpBuilder<'_, B> {
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Compute,
            work: Work::Exec {
                program: program.clone(),
                buffers: buffers.to_vec(),
                scalars: scalars.to_vec(),
                params,
            },
            reads: None,
            writes: None,
        })
    }

    /// Adds a whole-buffer copy (sizes must match). It runs on the copy queue
    /// of the destination's device when both buffers share a device, and on
    /// the host stage otherwise. It reads all of `src` and writes all of `dst`.
    pub fn copy(
        &mut self,
        name: impl Into<String>,
        dst: BufferId,
        src: BufferId,
    ) -> OpBuilder<'_, B> {
        let device = self.device_of(dst);
        self.push(Op {
            name: name.into(),
            device,
            kind: QueueKind::Copy,
            work: Work::Copy { dst, src },
            reads: None,
            writes: None,
        })
    }

    fn push(&mut self, op: Op<B>) -> OpBuilder<'_, B> {
        self.ops.push(op);
        let index = self.ops.len() - 1;
        OpBuilder {
            schedule: self,
            index,
        }
    }

    /// Plans the schedule: queues, dependencies, waits, timeline values.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for unknown ids, ranges past a buffer's end,
    /// an exec whose buffers live on another device, a copy between buffers
    /// of different sizes; any error creating queues or signals.
    pub fn plan(self) -> Result<Plan<B>> {
        planner::plan(self)
    }
}

/// Narrows what an operation touches, or moves it to another queue kind.
pub struct OpBuilder<'a, B: Backend> {
    pub(super) schedule: &'a mut Schedule<B>,
    pub(super) index: usize,
}

impl<B: Backend> OpBuilder<'_, B> {
    /// The operation's id.
    pub fn id(&self) -> OpId {
        OpId(self.index)
    }

    /// Declares that the operation reads `range` (bytes) of `buffer`.
    pub fn reads(self, buffer: BufferId, range: impl RangeBounds<usize>) -> Self {
        let access = self.access(buffer, range);
        self.schedule.ops[self.index]
            .reads
            .get_or_insert_with(Vec::new)
            .push(access);
        self
    }

    /// Declares that the operation writes `range` (bytes) of `buffer`.
    pub fn writes(self, buffer: BufferId, range: impl RangeBounds<usize>) -> Self {
        let access = self.access(buffer, range);
        self.schedule.ops[self.index]
            .writes
            .get_or_insert_with(Vec::new)
            .push(access);
        self
    }

    /// Runs the operation on a queue of `kind` (a copy on the compute queue,
    /// say). An exec on a copy queue is an error at `plan`.
    pub fn on(self, kind: QueueKind) -> Self {
        self.schedule.ops[self.index].kind = kind;
        self
    }

    fn access(&self, buffer: BufferId, range: impl RangeBounds<usize>) -> Access {
        let size = self
            .schedule
            .buffers
            .get(buffer.0)
            .map_or(0, |b| b.buffer.len());
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => size,
        };
        Access {
            buffer,
            range: start..end,
        }
    }
}
