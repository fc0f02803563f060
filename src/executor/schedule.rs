//! The input of the planner: devices, buffers and operations in program
//! order.

use std::ops::{Bound, RangeBounds};

use super::*;

/// What the bytes of a whole buffer of a schedule (a root) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// A caller's buffer, given to [`Schedule::add_buffer`] (or an arena
    /// the planner made).
    Buffer,
    /// A transient the planner places in its device's arena
    /// ([`Schedule::add_tensor`]).
    Tensor,
    /// A caller's buffer bound per run ([`Schedule::add_slot`],
    /// [`Plan::bind`]).
    Slot,
}

pub(super) struct BufferSlot<B: Backend> {
    pub(super) name: String,
    pub(super) device: DeviceId,
    /// Its length in bytes.
    pub(super) len: usize,
    /// The bytes: a whole buffer, or a view of another slot's. `None`
    /// until known: a tensor's until `plan` placed it, a slot's until
    /// [`Plan::bind`].
    pub(super) buffer: Option<View<B>>,
    /// The slot of the whole buffer these bytes are part of (itself for a
    /// whole buffer): hazards compare bytes of it.
    pub(super) root: BufferId,
    /// Where these bytes start in the root's.
    pub(super) offset: usize,
    /// What the root's bytes are.
    pub(super) origin: Origin,
}

impl<B: Backend> BufferSlot<B> {
    /// Byte `range` of this slot as an access to its root buffer.
    pub(super) fn access(&self, range: std::ops::Range<usize>) -> Access {
        Access {
            buffer: self.root,
            range: self.offset + range.start..self.offset + range.end,
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
    /// A collective over a communicator (`collective.rs`).
    Collective(CollectiveWork),
}

/// A collective of a schedule: what [`HardwareQueue::collective`] records,
/// with buffers of the schedule for views.
pub(super) struct CollectiveWork {
    pub(super) communicator: crate::collective::Communicator,
    pub(super) op: crate::collective::CollectiveOp,
    pub(super) element: crate::collective::Element,
    /// What it reads on this rank, if anything.
    pub(super) send: Option<BufferId>,
    /// What it writes on this rank, if anything.
    pub(super) recv: Option<BufferId>,
}

pub(super) struct Op<B: Backend> {
    pub(super) name: String,
    pub(super) device: DeviceId,
    pub(super) kind: QueueKind,
    pub(super) work: Work<B>,
    /// `None`: not declared; an exec then reads and writes every argument whole.
    pub(super) reads: Option<Vec<Access>>,
    pub(super) writes: Option<Vec<Access>>,
    /// Scalars an exec takes per run from the plan's scalar slots:
    /// (position in its scalars, slot). `plan` refuses them on any other
    /// operation.
    pub(super) bound_scalars: Vec<(usize, ScalarId)>,
}

/// Operations over buffers on devices, in program order: the input of the
/// planner.
///
/// Names are how plans and errors speak of things, so each operation's
/// must differ from every other operation's, each buffer's (buffer,
/// tensor, slot or view) from every other buffer's, and each scalar
/// slot's from every other's; [`plan`](Self::plan) refuses a schedule
/// where two share one.
pub struct Schedule<B: Backend> {
    pub(super) devices: Vec<Arc<B::Device>>,
    pub(super) buffers: Vec<BufferSlot<B>>,
    pub(super) ops: Vec<Op<B>>,
    /// Scalar slots: name and value (its type fixed by the first).
    pub(super) scalars: Vec<(String, Scalar)>,
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
            scalars: Vec::new(),
        }
    }

    /// Adds a device operations can run on.
    pub fn add_device(&mut self, device: Arc<B::Device>) -> DeviceId {
        self.devices.push(device);
        DeviceId(self.devices.len() - 1)
    }

    /// Adds a buffer living on `device`, named for plans and errors: a
    /// caller's memory the plan uses every run (weights, state that
    /// outlives a run).
    ///
    /// A buffer added already (another handle of it) names the same
    /// memory: the new id is a whole view of the first, so the planner
    /// orders work on the two as work on one buffer.
    pub fn add_buffer(
        &mut self,
        device: DeviceId,
        name: impl Into<String>,
        buffer: B::Buffer,
    ) -> BufferId {
        let view = View::whole(&buffer);
        let added = self.buffers.iter().position(|slot| {
            slot.origin == Origin::Buffer
                && slot.buffer.as_ref().is_some_and(|held| {
                    held.offset() == 0
                        && held.len() == view.len()
                        && crate::buffer::Buffer::same_as(held.buffer(), &buffer)
                })
        });
        if let Some(first) = added {
            let root = &self.buffers[first];
            let alias = BufferSlot {
                name: name.into(),
                // The caller's: work on it goes to that device's queues,
                // and the planner checks it as given.
                device,
                len: root.len,
                buffer: Some(view),
                root: root.root,
                offset: root.offset,
                origin: Origin::Buffer,
            };
            self.buffers.push(alias);
            return BufferId(self.buffers.len() - 1);
        }
        self.push_root(device, name.into(), view.len(), Some(view), Origin::Buffer)
    }

    /// Adds a transient tensor of `bytes` bytes on `device`, named for
    /// plans and errors, whose place the planner chooses: [`plan`](Self::plan)
    /// puts every tensor of a device in one arena from the device's memory
    /// pool, at an offset aligned as the device's kernels need
    /// ([`Limits::view_alignment`](crate::Limits::view_alignment)), so that
    /// tensors live at the same time never share a byte and tensors that
    /// are not may (see [`Plan::memory`]).
    ///
    /// A tensor lives within one run, from the first operation that
    /// touches it to the last: that first operation must write it (an
    /// upload, a fill, a copy into it, or an exec that does not declare it
    /// read-only), or `plan` refuses the schedule. State that outlives a
    /// run belongs in [`add_buffer`](Self::add_buffer) or a slot.
    pub fn add_tensor(
        &mut self,
        device: DeviceId,
        name: impl Into<String>,
        bytes: usize,
    ) -> BufferId {
        self.push_root(device, name.into(), bytes, None, Origin::Tensor)
    }

    /// Adds a slot of `bytes` bytes on `device`, named for plans and
    /// errors: an input or output whose buffer the caller binds per run
    /// with [`Plan::bind`], with no copy and no re-planning (IREE's binding
    /// tables). A binding stays until rebound; a run with a slot unbound is
    /// refused.
    pub fn add_slot(
        &mut self,
        device: DeviceId,
        name: impl Into<String>,
        bytes: usize,
    ) -> BufferId {
        self.push_root(device, name.into(), bytes, None, Origin::Slot)
    }

    /// Adds a scalar slot, named for errors, holding `initial` until
    /// [`Plan::set_scalar`] changes it: a shape or a step counter an exec
    /// takes per run (see [`OpBuilder::scalar`]). Its type is `initial`'s.
    pub fn add_scalar(&mut self, name: impl Into<String>, initial: impl Into<Scalar>) -> ScalarId {
        self.scalars.push((name.into(), initial.into()));
        ScalarId(self.scalars.len() - 1)
    }

    fn push_root(
        &mut self,
        device: DeviceId,
        name: String,
        len: usize,
        buffer: Option<View<B>>,
        origin: Origin,
    ) -> BufferId {
        let id = BufferId(self.buffers.len());
        self.buffers.push(BufferSlot {
            name,
            device,
            len,
            buffer,
            root: id,
            offset: 0,
            origin,
        });
        id
    }

    /// Adds `len` bytes from byte `offset` of schedule buffer `of` (a
    /// buffer, a tensor, a slot, or a view itself) as a buffer of its own,
    /// named for plans and errors: a tensor placed in an arena by hand, or
    /// a part of one. Operations take it wherever they take a buffer (an
    /// `exec` argument gets the view, a copy or fill the view's bytes), and
    /// the planner orders work by the bytes each touches: two kernels
    /// writing disjoint views of one arena need no wait.
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
        let buffer = match &parent.buffer {
            Some(buffer) => Some(buffer.view(offset, len)?),
            None => {
                if offset.checked_add(len).is_none_or(|end| end > parent.len) {
                    return Err(Error::ViewOutOfRange {
                        offset,
                        len,
                        size: parent.len,
                    });
                }
                None
            }
        };
        let slot = BufferSlot {
            name: name.into(),
            device: parent.device,
            len,
            buffer,
            root: parent.root,
            offset: parent.offset + offset,
            origin: parent.origin,
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
            bound_scalars: Vec::new(),
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
            bound_scalars: Vec::new(),
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
            bound_scalars: Vec::new(),
        })
    }

    /// The device of `buffer`; an unknown buffer gets an unknown device,
    /// which `plan` reports along with the buffer.
    pub(super) fn device_of(&self, buffer: BufferId) -> DeviceId {
        self.buffers
            .get(buffer.0)
            .map_or(DeviceId(usize::MAX), |b| b.device)
    }

    /// Adds a kernel launch on `device`'s compute queue. It reads and
    /// writes every buffer argument whole, except those that
    /// [`OpBuilder::reads`]/[`OpBuilder::writes`] narrow to the ranges they
    /// declare (an argument no declaration names stays read and written
    /// whole).
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
            bound_scalars: Vec::new(),
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
            bound_scalars: Vec::new(),
        })
    }

    pub(super) fn push(&mut self, op: Op<B>) -> OpBuilder<'_, B> {
        self.ops.push(op);
        let index = self.ops.len() - 1;
        OpBuilder {
            schedule: self,
            index,
        }
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

    /// Makes the exec's scalar at `position` take scalar slot `slot`'s
    /// value in every run (set with [`Plan::set_scalar`]); the value given
    /// to [`Schedule::exec`] there only fixes the type, which must be the
    /// slot's (checked at `plan`). On an operation that is not an exec,
    /// `plan` refuses the schedule.
    pub fn scalar(self, position: usize, slot: ScalarId) -> Self {
        self.schedule.ops[self.index]
            .bound_scalars
            .push((position, slot));
        self
    }

    /// Runs the operation on a queue of `kind` (a copy on the compute queue,
    /// say). An exec on a copy queue is an error at `plan`.
    pub fn on(self, kind: QueueKind) -> Self {
        self.schedule.ops[self.index].kind = kind;
        self
    }

    fn access(&self, buffer: BufferId, range: impl RangeBounds<usize>) -> Access {
        let size = self.schedule.buffers.get(buffer.0).map_or(0, |b| b.len);
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

/// What `plan` checks of the names: no two operations, no two buffers
/// (buffers, tensors, slots and views together) and no two scalar slots
/// share one, as plans and errors name things by them. An operation and a
/// buffer may share a name (a kernel `gelu` writing tensor `gelu`).
pub(super) fn check_unique_names<B: Backend>(schedule: &Schedule<B>) -> Result<()> {
    let kinds: [(&str, &str, Vec<&str>); 3] = [
        (
            "operations",
            "operation",
            schedule.ops.iter().map(|op| op.name.as_str()).collect(),
        ),
        (
            "buffers",
            "buffer",
            (schedule.buffers.iter())
                .map(|slot| slot.name.as_str())
                .collect(),
        ),
        (
            "scalar slots",
            "scalar slot",
            (schedule.scalars.iter())
                .map(|(name, _)| name.as_str())
                .collect(),
        ),
    ];
    for (plural, singular, names) in kinds {
        let mut first: std::collections::HashMap<&str, usize> = Default::default();
        for (index, name) in names.into_iter().enumerate() {
            if let Some(earlier) = first.insert(name, index) {
                return Err(Error::InvalidSchedule {
                    reason: format!(
                        "{plural} {earlier} and {index} are both named `{name}`; plans and \
                         errors name things by these names: give each {singular} its own"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// For a hazard on an arena's bytes, which tensors the two operations
/// touch there: ` (`h`)`, or ` (`probs` reusing `h`)`; empty otherwise.
pub(super) fn write_tensors_at<B: Backend>(
    f: &mut std::fmt::Formatter<'_>,
    schedule: &Schedule<B>,
    later: &Op<B>,
    earlier: &Op<B>,
    buffer: BufferId,
    range: &Range<usize>,
) -> std::fmt::Result {
    let access = Access {
        buffer,
        range: range.clone(),
    };
    let name = |op: &Op<B>| {
        op_buffers(op).find_map(|id| {
            let slot = schedule.buffers.get(id.0)?;
            let touches =
                slot.origin == Origin::Tensor && slot.access(0..slot.len).overlaps(&access);
            touches.then_some(slot.name.as_str())
        })
    };
    match (name(later), name(earlier)) {
        (Some(a), Some(b)) if a == b => write!(f, " (`{a}`)"),
        (Some(a), Some(b)) => write!(f, " (`{a}` reusing `{b}`)"),
        _ => Ok(()),
    }
}

/// Every buffer an operation names.
pub(super) fn op_buffers<B: Backend>(op: &Op<B>) -> impl Iterator<Item = BufferId> + '_ {
    let declared = op
        .reads
        .iter()
        .chain(&op.writes)
        .flatten()
        .map(|a| a.buffer);
    named_buffers(op).into_iter().chain(declared)
}

/// The buffers an operation's command names (its arguments).
pub(super) fn named_buffers<B: Backend>(op: &Op<B>) -> Vec<BufferId> {
    match &op.work {
        Work::Exec { buffers, .. } => buffers.clone(),
        Work::Copy { dst, src } => vec![*dst, *src],
        Work::Fill { dst, .. } | Work::Upload { dst } => vec![*dst],
        Work::Download { src } => vec![*src],
        Work::Collective(collective) => collective
            .send
            .iter()
            .chain(&collective.recv)
            .copied()
            .collect(),
    }
}
