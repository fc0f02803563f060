//! The CPU device's memory pool, driven by [`PoolOp`] sequences, against a
//! reference model of which ranges are live.
//!
//! The model knows, for every buffer made, whether its range is surely in
//! use (the host holds it and no `dealloca` of it ran, or a batch still
//! being recorded holds it), in limbo (only a submitted batch that may have
//! run holds it, or a submitted `dealloca` may have run), or surely free
//! (every handle gone and every batch holding it synchronised, or its
//! `dealloca` ran). After every operation the harness checks:
//!
//! - no two surely-live buffers share a byte, and each is aligned;
//! - every surely-live buffer still holds its tag at its first and last byte
//!   (nobody else was handed its bytes, and no queue wrote to it late);
//! - `in_use` and `live_allocations` lie between the sure and the possible
//!   figures, `cached == reserved - in_use`, and a zeroed allocation reads
//!   as zeros;
//! - submits succeed or are rejected exactly as the model says (a
//!   `dealloca` of a buffer not made by `alloca`, or twice; work on a
//!   buffer whose `dealloca` was recorded);
//! - and at the end, once every handle is dropped and every queue
//!   synchronised, nothing is in use, and `trim` gives every block back.

use hwqueue::cpu::{CPU_BUFFER_ALIGN, CpuBuffer, CpuDevice, CpuQueue};
use hwqueue::{Buffer, Device, Error, HardwareQueue, QueueFactory};

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
    /// `submit` on a queue.
    Submit {
        /// The queue.
        queue: usize,
    },
    /// `submit`, then `synchronize`, on every queue.
    Sync,
    /// `trim`.
    Trim,
    /// `set_release_threshold`.
    Threshold {
        /// Bytes kept cached.
        bytes: usize,
    },
}

/// Whether the range of a buffer made is (or may be) held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dealloca {
    /// None recorded.
    None,
    /// Recorded in the batch queue `.0` is recording.
    Recorded(usize),
    /// Submitted on queue `.0`: it runs at some point.
    Submitted(usize),
    /// Its batch was rejected: it never runs.
    Orphaned,
    /// It ran (its queue was synchronised after its submit).
    Ran,
    /// Its queue was synchronised but reported a failure: it may have run
    /// or not.
    Unknown,
}

struct Made {
    handle: Option<CpuBuffer>,
    at: usize,
    size: usize,
    taken: usize,
    tag: u8,
    alloca: bool,
    dealloca: Dealloca,
    /// Whether the batch each queue is recording holds it.
    recording: [bool; POOL_QUEUES],
    /// Whether a batch each queue submitted since its last synchronisation
    /// holds it (it may have run and let go).
    submitted: [bool; POOL_QUEUES],
}

impl Made {
    /// The range is surely held. A submitted `dealloca` may run at once,
    /// whatever other queues hold (using the buffer there unordered with
    /// the `dealloca` is a misuse their batches fail on).
    fn sure(&self) -> bool {
        match self.dealloca {
            Dealloca::Submitted(_) | Dealloca::Ran | Dealloca::Unknown => false,
            Dealloca::None | Dealloca::Recorded(_) | Dealloca::Orphaned => {
                self.handle.is_some() || self.recording.contains(&true)
            }
        }
    }

    /// The range may be held.
    fn possible(&self) -> bool {
        if self.dealloca == Dealloca::Ran {
            return false;
        }
        self.handle.is_some() || self.recording.contains(&true) || self.submitted.contains(&true)
    }

    /// The host may read and write it (no `dealloca` recorded).
    fn usable(&self) -> bool {
        self.handle.is_some() && self.dealloca == Dealloca::None
    }
}

struct Harness {
    device: CpuDevice,
    queues: Vec<CpuQueue>,
    /// Whether each queue's recording batch will be rejected.
    rejected: [bool; POOL_QUEUES],
    /// Whether a batch of each queue since its last synchronisation may
    /// fail: it uses a buffer whose `dealloca` another queue recorded,
    /// unordered with it.
    may_fail: [bool; POOL_QUEUES],
    /// Whether each queue reported a failure since its last
    /// synchronisation (at a `submit`, which then keeps the batch recorded).
    failed: [bool; POOL_QUEUES],
    made: Vec<Made>,
    next_tag: u8,
}

/// Runs `ops` on a fresh CPU device's pool and two of its queues, checking
/// the model after each; panics on the first difference.
pub fn check_pool_ops(ops: &[PoolOp]) {
    let device = CpuDevice::with_threads(1);
    let queues = (0..POOL_QUEUES)
        .map(|_| device.compute_queue().expect("a queue"))
        .collect();
    let mut harness = Harness {
        device,
        queues,
        rejected: [false; POOL_QUEUES],
        may_fail: [false; POOL_QUEUES],
        failed: [false; POOL_QUEUES],
        made: Vec::new(),
        next_tag: 1,
    };
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
        ops.push(match kind % 10 {
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
            dealloca: Dealloca::None,
            // `alloca` records nothing a batch holds (its command is
            // recorded only while profiling, which this harness never
            // turns on).
            recording: [false; POOL_QUEUES],
            submitted: [false; POOL_QUEUES],
        });
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
                assert!(buffer.queue_ordered().is_some(), "alloca marks its buffer");
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
                if made.alloca && made.dealloca == Dealloca::None {
                    made.dealloca = Dealloca::Recorded(queue);
                    for other in 0..POOL_QUEUES {
                        if other != queue && (made.recording[other] || made.submitted[other]) {
                            self.may_fail[other] = true;
                        }
                    }
                    made.recording[queue] = true;
                } else {
                    self.rejected[queue] = true;
                }
            }
            PoolOp::Fill { index, queue } => {
                let Some(index) = self.pick(index) else {
                    return;
                };
                let made = &mut self.made[index];
                let Some(buffer) = &made.handle else { return };
                self.queues[queue].fill(buffer, made.tag);
                if made.dealloca == Dealloca::None {
                    made.recording[queue] = true;
                } else {
                    self.rejected[queue] = true;
                }
            }
            PoolOp::Submit { queue } => self.submit(queue),
            PoolOp::Sync => {
                for queue in 0..POOL_QUEUES {
                    self.submit(queue);
                    let failed = self.synchronize(queue);
                    for made in &mut self.made {
                        made.submitted[queue] = false;
                        if made.dealloca == Dealloca::Submitted(queue) {
                            made.dealloca = if failed {
                                Dealloca::Unknown
                            } else {
                                Dealloca::Ran
                            };
                        }
                    }
                }
            }
            PoolOp::Trim => {
                self.device.trim_memory();
            }
            PoolOp::Threshold { bytes } => self.device.set_memory_release_threshold(bytes),
        }
    }

    /// Synchronises a queue; whether a batch failed (only where the model
    /// allows it).
    fn synchronize(&mut self, queue: usize) -> bool {
        let outcome = self.queues[queue].synchronize();
        let may_fail = std::mem::take(&mut self.may_fail[queue]);
        let failed = std::mem::take(&mut self.failed[queue]);
        match outcome {
            Ok(()) => failed,
            Err(e) if may_fail && matches!(e.root_cause(), Error::UseAfterDealloca { .. }) => true,
            Err(e) => panic!("synchronize on queue {queue}: {e}, which nothing here should fail"),
        }
    }

    fn submit(&mut self, queue: usize) {
        let mut outcome = self.queues[queue].submit();
        if let Err(e @ Error::QueueFailed { .. }) = &outcome {
            // An earlier batch failed, and `submit` says so first, keeping
            // this batch recorded: submit it again.
            assert!(
                self.may_fail[queue] && matches!(e.root_cause(), Error::UseAfterDealloca { .. }),
                "submit on queue {queue}: {e}, which nothing here should fail"
            );
            self.failed[queue] = true;
            outcome = self.queues[queue].submit();
        }
        let rejected = std::mem::take(&mut self.rejected[queue]);
        match (&outcome, rejected) {
            (Ok(()), false) => {}
            (Err(Error::BatchRejected { cause }), true) => assert!(
                matches!(
                    **cause,
                    Error::InvalidDealloca { .. } | Error::UseAfterDealloca { .. }
                ),
                "rejected for an unexpected reason: {cause}"
            ),
            _ => panic!(
                "submit on queue {queue}: got {outcome:?}, the model expected rejected={rejected}"
            ),
        }
        for made in &mut self.made {
            if std::mem::take(&mut made.recording[queue]) && !rejected {
                // A rejected batch is dropped at once (it has no signal to
                // fail); a submitted one is held until it ran.
                made.submitted[queue] = true;
            }
            if made.dealloca == Dealloca::Recorded(queue) {
                made.dealloca = if rejected {
                    Dealloca::Orphaned
                } else {
                    Dealloca::Submitted(queue)
                };
            }
        }
    }

    fn check(&self, when: &str) {
        let stats = self.device.memory_stats();
        let sum = |keep: fn(&Made) -> bool| -> (usize, usize) {
            self.made
                .iter()
                .filter(|made| keep(made) && made.size > 0)
                .fold((0, 0), |(bytes, count), made| {
                    (bytes + made.taken, count + 1)
                })
        };
        let (sure, sure_count) = sum(Made::sure);
        let (possible, possible_count) = sum(Made::possible);
        assert!(
            sure <= stats.in_use && stats.in_use <= possible,
            "{when}: in use {} outside [{sure}, {possible}]\n{stats}\n{}",
            stats.in_use,
            self.describe()
        );
        assert!(
            sure_count <= stats.live_allocations && stats.live_allocations <= possible_count,
            "{when}: {} live outside [{sure_count}, {possible_count}]",
            stats.live_allocations
        );
        assert_eq!(stats.cached, stats.reserved - stats.in_use, "{when}");
        let live: Vec<&Made> = self
            .made
            .iter()
            .filter(|made| made.sure() && made.size > 0)
            .collect();
        for (i, a) in live.iter().enumerate() {
            assert_eq!(a.at % CPU_BUFFER_ALIGN, 0, "{when}: misaligned");
            for b in &live[i + 1..] {
                assert!(
                    a.at + a.size <= b.at || b.at + b.size <= a.at,
                    "{when}: live ranges {:#x}+{} and {:#x}+{} overlap",
                    a.at,
                    a.size,
                    b.at,
                    b.size
                );
            }
        }
        for made in live.iter().filter(|made| made.usable()) {
            let buffer = made.handle.as_ref().expect("usable");
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
        self.made
            .iter()
            .enumerate()
            .map(|(i, made)| {
                format!(
                    "#{i}: {} bytes at {:#x}, handle {}, alloca {}, dealloca {:?}, recording \
                     {:?}, submitted {:?}, sure {}, possible {}\n",
                    made.size,
                    made.at,
                    made.handle.is_some(),
                    made.alloca,
                    made.dealloca,
                    made.recording,
                    made.submitted,
                    made.sure(),
                    made.possible()
                )
            })
            .collect()
    }

    /// Drops everything and synchronises: nothing may stay in use, and trim
    /// gives every block back.
    fn finish(mut self) {
        for made in &mut self.made {
            made.handle = None;
        }
        for queue in 0..POOL_QUEUES {
            self.submit(queue);
            self.synchronize(queue);
        }
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
