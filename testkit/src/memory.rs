//! The CPU device's memory pool, driven by [`PoolOp`] sequences, against a
//! reference model of every buffer's lifecycle.
//!
//! Every batch a queue submits starts by waiting on that queue's *gate*,
//! which only [`PoolOp::Sync`] opens, one queue after the other: between
//! two `Sync`s nothing runs, so the model knows exactly which batch ran,
//! failed or was skipped, and which range is held. After every operation
//! the harness checks:
//!
//! - `in_use`, `requested` and `live_allocations` equal the model's, and
//!   `cached == reserved - in_use`;
//! - no two held ranges share a byte, and each is aligned;
//! - every buffer the host may read still holds its tag at its first and
//!   last byte (nobody else was handed its bytes, and no queue wrote to it
//!   late);
//! - each buffer's lifecycle phase is the model's, and `submit` and
//!   `synchronize` succeed, fail or reject exactly as the model says (a
//!   `dealloca` of a buffer `alloca` did not make, or twice; work on a
//!   buffer whose `dealloca` is recorded; a kernel that fails);
//! - and at the end, once every handle is dropped and every queue
//!   synchronised, nothing is in use (nothing stranded), and `trim` gives
//!   every block back.
//!
//! The lifecycle it models (see `hwqueue::memory::QueueOrdered`): a batch
//! that names a buffer holds it, and holds a *use* of one `alloca` made,
//! until the batch is let go; a `dealloca` that runs moves the buffer to
//! `Ran`, and its range goes back once no batch uses it; a `dealloca` whose
//! batch never runs (rejected, discarded, stopped by a failing kernel, or
//! skipped after an earlier failure) leaves the buffer live.

use hwqueue::cpu::{CPU_BUFFER_ALIGN, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
use hwqueue::memory::Phase;
use hwqueue::{Buffer, Device, Error, ExecParams, HardwareQueue, QueueFactory, TimelineSignal};

use crate::reader::Reader;

/// Queues of the harness.
pub const POOL_QUEUES: usize = 2;

/// One operation on the pool, for [`check_pool_ops`]. Indices pick a buffer
/// among those made so far, modulo their count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolOp {
    /// `Device::alloc` (zeroed) or `alloc_uninit`, then the tag written to
    /// the first and last byte.
    Alloc {
        /// Bytes.
        size: usize,
        /// `alloc` rather than `alloc_uninit`.
        zeroed: bool,
    },
    /// `alloca` on a queue, then the tag written as for `Alloc`.
    Alloca {
        /// The queue.
        queue: usize,
        /// Bytes.
        size: usize,
    },
    /// Drops the host's handle.
    Drop {
        /// The buffer.
        index: usize,
    },
    /// Records `dealloca` on a queue (valid only for a buffer made by
    /// `alloca` and not deallocated yet; else the batch is rejected).
    Dealloca {
        /// The buffer.
        index: usize,
        /// The queue.
        queue: usize,
    },
    /// Records a `fill` of the whole buffer with its tag (rejected once its
    /// `dealloca` was recorded).
    Fill {
        /// The buffer.
        index: usize,
        /// The queue.
        queue: usize,
    },
    /// Records an `exec` of a kernel that fails on a queue: when the batch
    /// runs, its later commands do not, and the queue's later batches
    /// submitted before its owner learns of it are skipped.
    Fail {
        /// The queue.
        queue: usize,
    },
    /// `discard` on a queue: its recorded batch is let go unrun.
    Discard {
        /// The queue.
        queue: usize,
    },
    /// `submit` on a queue.
    Submit {
        /// The queue.
        queue: usize,
    },
    /// Runs what every queue submitted (each queue's batches wait on its
    /// gate until now), one queue after the other, and synchronises each.
    Sync,
    /// `trim`.
    Trim,
    /// `set_release_threshold`.
    Threshold {
        /// Bytes kept cached.
        bytes: usize,
    },
}

/// A command of a batch, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    /// A fill of buffer `.0` (the batch holds a use of it, if `alloca` made
    /// it).
    Fill(usize),
    /// A `dealloca` of buffer `.0`.
    Dealloca(usize),
    /// The failing kernel.
    Fail,
}

/// A buffer made, as the model knows it.
struct Made {
    handle: Option<CpuBuffer>,
    at: usize,
    size: usize,
    taken: usize,
    tag: u8,
    alloca: bool,
    /// `Live`, `DeallocaRecorded`, `Ran` or `Returned` (only for `alloca`'s).
    phase: Phase,
}

/// A queue's batches, as the model knows them.
#[derive(Default)]
struct QueueModel {
    /// The batch being recorded.
    recording: Vec<Recorded>,
    /// Whether it will be rejected at `submit`.
    rejected: bool,
    /// Batches submitted since the last `Sync`, in order.
    submitted: Vec<Vec<Recorded>>,
}

impl QueueModel {
    fn batches(&self) -> impl Iterator<Item = &Vec<Recorded>> {
        self.submitted
            .iter()
            .chain(std::iter::once(&self.recording))
    }
}

struct Harness {
    device: CpuDevice,
    queues: Vec<CpuQueue>,
    gates: Vec<CpuSignal>,
    /// The value each gate opens at next.
    epoch: u64,
    models: Vec<QueueModel>,
    fail: CpuProgram,
    made: Vec<Made>,
    next_tag: u8,
}

/// Panics in work-group 1: the harness's failing kernel.
fn explode(group: &hwqueue::cpu::WorkGroup, _: &hwqueue::cpu::KernelArgs<'_>) {
    if group.id()[0] == 1 {
        panic!("the harness's failing kernel");
    }
}

/// Runs `ops` on a fresh CPU device's pool and two of its queues, checking
/// the model after each; panics on the first difference.
pub fn check_pool_ops(ops: &[PoolOp]) {
    let device = CpuDevice::with_threads(1);
    let queues = (0..POOL_QUEUES)
        .map(|_| device.compute_queue().expect("a queue"))
        .collect();
    let gates = (0..POOL_QUEUES)
        .map(|_| device.new_signal(0).expect("a signal"))
        .collect();
    let mut harness = Harness {
        device,
        queues,
        gates,
        epoch: 1,
        models: (0..POOL_QUEUES).map(|_| QueueModel::default()).collect(),
        fail: CpuProgram::from_fn("fail", 0, 0, explode),
        made: Vec::new(),
        next_tag: 1,
    };
    for queue in 0..POOL_QUEUES {
        harness.arm(queue);
    }
    for (step, op) in ops.iter().enumerate() {
        harness.apply(op);
        harness.check(&format!("after step {step} ({op:?})"));
    }
    harness.finish();
}

/// Decodes bytes into pool operations and checks them: the `memory_pool`
/// fuzz target. Sizes stay small enough for a fuzzer's pace (at most 3 MiB,
/// and a few dedicated-block sizes).
pub fn memory_pool(data: &[u8]) {
    check_pool_ops(&decode_pool_ops(data));
}

/// The operations a byte string stands for (at most 64).
pub fn decode_pool_ops(data: &[u8]) -> Vec<PoolOp> {
    let mut reader = Reader { data };
    let mut ops = Vec::new();
    while !reader.is_empty() && ops.len() < 64 {
        let kind = reader.byte();
        let a = usize::from(reader.byte());
        let b = usize::from(reader.byte());
        let queue = a % POOL_QUEUES;
        let size = || decode_size(a, b);
        ops.push(match kind % 12 {
            0 | 1 => PoolOp::Alloc {
                size: size(),
                zeroed: kind & 0x10 != 0,
            },
            2 => PoolOp::Alloca {
                queue: (kind as usize >> 4) % POOL_QUEUES,
                size: size(),
            },
            3 => PoolOp::Drop { index: b },
            4 => PoolOp::Dealloca { index: b, queue },
            5 => PoolOp::Fill { index: b, queue },
            6 => PoolOp::Submit { queue },
            7 => PoolOp::Sync,
            8 => PoolOp::Trim,
            9 => PoolOp::Fail { queue },
            10 => PoolOp::Discard { queue },
            _ => PoolOp::Threshold {
                bytes: [0, 1 << 20, 2 << 20, usize::MAX][a % 4],
            },
        });
    }
    ops
}

/// A size from two bytes: mostly small, sometimes up to 3 MiB, rarely a
/// dedicated block's, sometimes 0.
fn decode_size(a: usize, b: usize) -> usize {
    match a % 16 {
        0 => 0,
        1..=9 => 1 + (b << 4) + (a >> 4),
        10..=13 => (b + 1) << 10,
        14 => (1 << 20) + (b << 13),
        _ => (10 << 20) + (b << 12),
    }
}

impl Harness {
    fn pick(&self, index: usize) -> Option<usize> {
        (!self.made.is_empty()).then(|| index % self.made.len())
    }

    fn tag(&mut self) -> u8 {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1).max(1);
        tag
    }

    /// Records a buffer just made, with its tag written.
    fn made(&mut self, buffer: CpuBuffer, alloca: bool) {
        let size = buffer.size();
        let tag = self.tag();
        if size > 0 {
            buffer.write_at(0, &[tag]).expect("write the first byte");
            buffer
                .write_at(size - 1, &[tag])
                .expect("write the last byte");
        }
        self.made.push(Made {
            at: buffer.as_ptr() as usize,
            handle: Some(buffer),
            size,
            taken: size.next_multiple_of(CPU_BUFFER_ALIGN),
            tag,
            alloca,
            phase: Phase::Live,
        });
    }

    /// Whether a batch not yet let go names buffer `index` (and so holds a
    /// handle to it), and whether one holds a use of it.
    fn named(&self, index: usize) -> (bool, bool) {
        let mut named = false;
        let mut used = false;
        for batch in self.models.iter().flat_map(QueueModel::batches) {
            for command in batch {
                match *command {
                    Recorded::Fill(i) if i == index => {
                        named = true;
                        used = true;
                    }
                    Recorded::Dealloca(i) if i == index => named = true,
                    _ => {}
                }
            }
        }
        (named, used)
    }

    /// Whether buffer `index`'s range is held now.
    fn held(&self, index: usize) -> bool {
        let made = &self.made[index];
        made.phase != Phase::Returned && (made.handle.is_some() || self.named(index).0)
    }

    /// After batches were let go: a buffer whose `dealloca` ran and which
    /// no batch uses is returned.
    fn settle_phases(&mut self) {
        for index in 0..self.made.len() {
            if self.made[index].phase == Phase::Ran && !self.named(index).1 {
                self.made[index].phase = Phase::Returned;
            }
        }
    }

    /// Lets a batch go that never ran from `from` on: its `dealloca`s from
    /// there are undone.
    fn let_go_unrun(&mut self, batch: &[Recorded]) {
        for command in batch {
            if let Recorded::Dealloca(index) = *command
                && self.made[index].phase == Phase::DeallocaRecorded
            {
                self.made[index].phase = Phase::Live;
            }
        }
    }

    fn apply(&mut self, op: &PoolOp) {
        match *op {
            PoolOp::Alloc { size, zeroed } => {
                let buffer = if zeroed {
                    self.device.alloc(size)
                } else {
                    self.device.alloc_uninit(size)
                }
                .expect("the pool has no limit: an allocation succeeds");
                if zeroed {
                    check_zeroed(&buffer);
                }
                self.made(buffer, false);
            }
            PoolOp::Alloca { queue, size } => {
                let buffer = self.queues[queue].alloca(size).expect("alloca");
                assert_eq!(buffer.queue_ordered().map(|o| o.phase()), Some(Phase::Live));
                self.made(buffer, true);
            }
            PoolOp::Drop { index } => {
                if let Some(index) = self.pick(index) {
                    self.made[index].handle = None;
                }
            }
            PoolOp::Dealloca { index, queue } => {
                let Some(index) = self.pick(index) else {
                    return;
                };
                let made = &mut self.made[index];
                let Some(buffer) = &made.handle else { return };
                self.queues[queue].dealloca(buffer);
                let model = &mut self.models[queue];
                if made.alloca && made.phase == Phase::Live {
                    made.phase = Phase::DeallocaRecorded;
                    // Its own batch's uses fold into it.
                    model.recording.retain(|c| *c != Recorded::Fill(index));
                    model.recording.push(Recorded::Dealloca(index));
                } else {
                    model.rejected = true;
                }
            }
            PoolOp::Fill { index, queue } => {
                let Some(index) = self.pick(index) else {
                    return;
                };
                let made = &self.made[index];
                let Some(buffer) = &made.handle else { return };
                self.queues[queue].fill(buffer, made.tag);
                let model = &mut self.models[queue];
                if made.phase == Phase::Live {
                    model.recording.push(Recorded::Fill(index));
                } else {
                    model.rejected = true;
                }
            }
            PoolOp::Fail { queue } => {
                self.queues[queue].exec(&self.fail, &[], &[], ExecParams::new_1d(2, 1));
                let model = &mut self.models[queue];
                if !model.rejected {
                    model.recording.push(Recorded::Fail);
                }
            }
            PoolOp::Discard { queue } => {
                self.queues[queue].discard();
                let model = &mut self.models[queue];
                model.rejected = false;
                let batch = std::mem::take(&mut model.recording);
                self.let_go_unrun(&batch);
                self.settle_phases();
                self.arm(queue);
            }
            PoolOp::Submit { queue } => {
                self.submit(queue);
                self.arm(queue);
            }
            PoolOp::Sync => self.sync(),
            PoolOp::Trim => {
                self.device.trim_memory();
            }
            PoolOp::Threshold { bytes } => self.device.set_memory_release_threshold(bytes),
        }
    }

    /// Records, in front of the queue's next commands, the wait on its gate
    /// that holds them until the next `Sync`.
    fn arm(&mut self, queue: usize) {
        let epoch = self.epoch;
        self.queues[queue].wait(&self.gates[queue], epoch);
    }

    /// Submits a queue's batch (which starts with its gate's wait); the
    /// caller arms the next.
    fn submit(&mut self, queue: usize) {
        let model = &mut self.models[queue];
        let outcome = self.queues[queue].submit();
        let rejected = std::mem::take(&mut model.rejected);
        let batch = std::mem::take(&mut model.recording);
        match (&outcome, rejected) {
            (Ok(()), false) => model.submitted.push(batch),
            (Err(Error::BatchRejected { cause }), true) => {
                assert!(
                    matches!(
                        **cause,
                        Error::InvalidDealloca { .. } | Error::UseAfterDealloca { .. }
                    ),
                    "rejected for an unexpected reason: {cause}"
                );
                self.let_go_unrun(&batch);
                self.settle_phases();
            }
            _ => panic!(
                "submit on queue {queue}: got {outcome:?}, the model expected rejected={rejected}"
            ),
        }
    }

    /// Submits what each queue recorded, then opens each queue's gate in
    /// turn and synchronises it: its batches run in order; the first failing
    /// kernel stops its batch, and the queue's later batches of this round
    /// are skipped (submitted before the owner learned of the failure).
    fn sync(&mut self) {
        for queue in 0..POOL_QUEUES {
            self.submit(queue);
        }
        let epoch = self.epoch;
        self.epoch += 1;
        for queue in 0..POOL_QUEUES {
            self.gates[queue].set(epoch);
            let outcome = self.queues[queue].synchronize();
            let batches = std::mem::take(&mut self.models[queue].submitted);
            let mut failed = false;
            for batch in &batches {
                if failed {
                    self.let_go_unrun(batch);
                    continue;
                }
                let stop = batch.iter().position(|c| *c == Recorded::Fail);
                for command in &batch[..stop.unwrap_or(batch.len())] {
                    if let Recorded::Dealloca(index) = *command {
                        self.made[index].phase = Phase::Ran;
                    }
                }
                if let Some(stop) = stop {
                    failed = true;
                    self.let_go_unrun(&batch[stop..]);
                }
            }
            match (&outcome, failed) {
                (Ok(()), false) => {}
                (Err(Error::QueueFailed { cause }), true) => assert!(
                    cause.to_string().contains("the harness's failing kernel"),
                    "queue {queue} failed for an unexpected reason: {cause}"
                ),
                _ => panic!(
                    "synchronize on queue {queue}: got {outcome:?}, the model expected \
                     failed={failed}"
                ),
            }
            self.settle_phases();
            self.arm(queue);
            // Before the next queue's gate opens: a range a `dealloca` here
            // gave back while the next queue's batches still use it shows.
            self.check(&format!("after queue {queue} ran its batches"));
        }
    }

    fn check(&self, when: &str) {
        let stats = self.device.memory_stats();
        let held: Vec<usize> = (0..self.made.len()).filter(|&i| self.held(i)).collect();
        let nonempty = || held.iter().map(|&i| &self.made[i]).filter(|m| m.size > 0);
        let in_use: usize = nonempty().map(|made| made.taken).sum();
        let requested: usize = nonempty().map(|made| made.size).sum();
        let count = nonempty().count();
        assert_eq!(
            (stats.in_use, stats.requested, stats.live_allocations),
            (in_use, requested, count),
            "{when}: the pool's (in use, requested, live) differ from the model's\n{stats}\n{}",
            self.describe()
        );
        assert_eq!(
            stats.in_use + stats.cached + stats.stranded,
            stats.reserved,
            "{when}"
        );
        for (index, made) in self.made.iter().enumerate() {
            if let Some(buffer) = &made.handle
                && made.alloca
            {
                assert_eq!(
                    buffer.queue_ordered().map(|o| o.phase()),
                    Some(made.phase),
                    "{when}: buffer #{index}'s phase\n{}",
                    self.describe()
                );
            }
        }
        let live: Vec<&Made> = nonempty().collect();
        for (i, a) in live.iter().enumerate() {
            assert_eq!(a.at % CPU_BUFFER_ALIGN, 0, "{when}: misaligned");
            for b in &live[i + 1..] {
                assert!(
                    a.at + a.size <= b.at || b.at + b.size <= a.at,
                    "{when}: held ranges {:#x}+{} and {:#x}+{} overlap",
                    a.at,
                    a.size,
                    b.at,
                    b.size
                );
            }
        }
        for made in &live {
            let Some(buffer) = &made.handle else { continue };
            if made.phase >= Phase::Ran {
                assert!(
                    buffer.read_at(0, &mut [0u8]).is_err(),
                    "{when}: a buffer whose dealloca ran was readable"
                );
                continue;
            }
            let (mut first, mut last) = ([0u8], [0u8]);
            buffer.read_at(0, &mut first).expect("read");
            buffer.read_at(made.size - 1, &mut last).expect("read");
            assert_eq!(
                (first[0], last[0]),
                (made.tag, made.tag),
                "{when}: a buffer's bytes changed under it"
            );
        }
    }

    /// The model's view of every buffer made, one per line.
    fn describe(&self) -> String {
        let mut out: String = self
            .made
            .iter()
            .enumerate()
            .map(|(i, made)| {
                format!(
                    "#{i}: {} bytes at {:#x}, handle {}, alloca {}, {:?}, named/used {:?}, held \
                     {}\n",
                    made.size,
                    made.at,
                    made.handle.is_some(),
                    made.alloca,
                    made.phase,
                    self.named(i),
                    self.held(i),
                )
            })
            .collect();
        for (queue, model) in self.models.iter().enumerate() {
            out += &format!(
                "queue {queue}: recording {:?} (rejected {}), submitted {:?}\n",
                model.recording, model.rejected, model.submitted
            );
        }
        out
    }

    /// Drops every handle, discards what is recorded and runs what was
    /// submitted: nothing may stay in use, and trim gives every block back.
    fn finish(mut self) {
        for made in &mut self.made {
            made.handle = None;
        }
        for queue in 0..POOL_QUEUES {
            self.apply(&PoolOp::Discard { queue });
        }
        self.sync();
        for queue in 0..POOL_QUEUES {
            self.apply(&PoolOp::Discard { queue });
        }
        self.check("at the end");
        let stats = self.device.memory_stats();
        assert_eq!(
            (stats.in_use, stats.live_allocations, stats.requested),
            (0, 0, 0),
            "at the end: {stats}"
        );
        self.device.trim_memory();
        let stats = self.device.memory_stats();
        assert_eq!(
            (stats.reserved, stats.blocks),
            (0, 0),
            "after trim: {stats}"
        );
    }
}

/// A zeroed buffer reads as zeros at its ends and in its middle.
fn check_zeroed(buffer: &CpuBuffer) {
    let size = buffer.size();
    if size == 0 {
        return;
    }
    let sample = size.min(64);
    for at in [0, size / 2, size - sample] {
        let at = at.min(size - sample);
        let mut bytes = vec![0xffu8; sample];
        buffer.read_at(at, &mut bytes).expect("read");
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a zeroed buffer of {size} bytes holds data at {at}"
        );
    }
}
