//! Replay: a batch marked with a key (`Engine::replay_next`, a plan's run on
//! this queue) is recorded once into command buffers that stay (no
//! `ONE_TIME_SUBMIT`; `SIMULTANEOUS_USE`, since the next run may be
//! submitted while the last is pending), and a later batch under the same
//! key whose commands match submits them again with its own semaphore
//! waits and signals (`VkTimelineSemaphoreSubmitInfo` carries the values:
//! nothing in a command buffer names one).
//!
//! **What must match** (`fingerprint`): the device commands (kernels and
//! their scalars and work sizes, copies, fills) over the same bytes of the
//! same `VkBuffer`s, in the same groups between boundaries (`Shape`): a
//! wait, a host copy, or a signal of another semaphore than the one the
//! stretch signals (signals of one semaphore in a row are submitted as one
//! with the stretch). The groups are the recording's **segments**, one
//! command buffer each. Both walks flush at every boundary that follows
//! device work, also where the plain path would have gone on recording (a
//! wait found reached, a signal already submitted), so a recording and its
//! replays split the same way whatever the values are at run time.
//!
//! **What replays**: the commands are not recorded again; the queue walks
//! the batch as usual (waits held on the host until submitted, host copies
//! in queue order, signals noted) and, at the end of each segment, submits
//! its command buffer with the stretch's waits and signal. A failure in a
//! segment not yet submitted fails the batch from the segment's start: its
//! command buffer holds commands after the failure, so none of it runs,
//! and none of its values is set.
//!
//! **What does not**: a profiled batch (device timestamps are recorded per
//! run), one whose transfers take new staging ranges each run (unmapped
//! memory: `HWQUEUE_VULKAN_MEMORY=unmapped`, or a fill whose pattern is
//! staged), and one naming buffers made by `alloca` (their block may go
//! back to the driver once a `dealloca` completed, and a new `VkBuffer`
//! take its handle's number): those run the plain way, and
//! `Launches::fallback` says why.
//!
//! **Another binding** (an exec over another buffer or offset): where the
//! device allows it and a kept recording of the key is idle, its
//! descriptor sets are rewritten for the bindings that changed and it is
//! submitted again (`rebind.rs` says when; `Launches::patched` counts
//! them). Otherwise, and for another scalar, shape, or copy's buffer, the
//! batch is recorded again, and the last [`VARIANTS`] recordings of a key
//! are kept, so plans that alternate between a few of them replay each
//! (runs started back to back, while the last is pending, too). A
//! recording holds the buffers and
//! programs it names, so no `VkBuffer` or pipeline it records is destroyed
//! under it; that memory stays allocated until the recording is dropped
//! (pushed out by newer ones, or with the queue: a plan's queues go with
//! the plan).

use std::sync::atomic::Ordering;

use ash::vk;
use ash::vk::Handle;

use super::Vulkan;
use super::engine::CommandSet;
use super::program::VulkanProgram;
use super::rebind::{BoundSet, Range, Structure};
use super::recorder::Recorder;
use crate::error::Result;
use crate::program::Scalar;
use crate::queue::{Batch, Command};
use crate::view::View;

/// Recordings kept per key (the most recently used first).
pub(super) const VARIANTS: usize = 4;

/// The word that stands for a boundary between segments.
const BOUNDARY: u64 = u64::MAX;

/// A batch recorded into command buffers, one per segment.
pub(super) struct Recording {
    /// What the batch's commands were (see `fingerprint`), where its
    /// buffer ranges are in that, and what must match for a rebinding
    /// (made at the first that looks).
    words: Vec<u64>,
    ranges: Vec<Range>,
    structure: Option<Structure>,
    /// The descriptor sets its execs bound.
    sets: Vec<BoundSet>,
    /// The queue's progress value once its last submission completed.
    last: u64,
    /// Per segment, its command buffer (`None` while lent to the queue
    /// being submitted, or where the segment recorded nothing).
    pub(super) segments: Vec<Option<CommandSet>>,
    /// What the command buffers name, kept alive with them (never read).
    _buffers: Vec<View<Vulkan>>,
    _programs: Vec<VulkanProgram>,
}

impl Recording {
    /// Hands the command sets back (to be recorded anew once the work
    /// that may still use them retired).
    pub(super) fn into_sets(self) -> impl Iterator<Item = CommandSet> {
        self.segments.into_iter().flatten()
    }
}

/// Whether the batch being settled records a recording or replays one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Recording,
    Replaying,
}

/// The recording the batch being settled records or replays, and where
/// in it the batch is.
pub(super) struct Replay {
    pub(super) key: u32,
    pub(super) mode: Mode,
    pub(super) recording: Recording,
    /// The segment the next device command belongs to.
    pub(super) segment: usize,
    /// Whether a device command came since the last boundary.
    in_segment: bool,
    /// How many segments have a command set: replaying, as many as the
    /// recording had; recording, as many as it kept (see `end_replay`).
    present: usize,
    /// The first command of the segment, for errors.
    first: usize,
    /// The segment whose command set the queue's open slot holds.
    pub(super) lent: Option<usize>,
    shape: Shape,
    /// Whether the command being settled ends a segment.
    at_boundary: bool,
    /// Recording: how many exec ranges came before the next exec.
    ranges: u32,
}

impl Replay {
    fn new(key: u32, mode: Mode, recording: Recording) -> Self {
        Self {
            key,
            mode,
            present: recording.segments.iter().flatten().count(),
            recording,
            segment: 0,
            in_segment: false,
            first: 0,
            lent: None,
            shape: Shape::default(),
            at_boundary: false,
            ranges: 0,
        }
    }
}

/// How a command takes part in a recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Recorded into the segment's command buffer.
    Device,
    /// Ends the segment: a wait, a host copy, or a signal of another
    /// semaphore than the stretch's (the recorder submits the stretch
    /// there).
    Boundary,
    /// Neither: a signal of the stretch's semaphore (submitted with the
    /// stretch), a barrier, an alloca or dealloca.
    Neutral,
}

/// Walks a batch's commands as the recorder splits them into stretches:
/// from the batch alone, so that a recording and its replays split the
/// same way whatever the signals' values are at run time.
#[derive(Default)]
struct Shape {
    /// The semaphore the stretch's signals signal, since its start.
    signalling: Option<vk::Semaphore>,
}

impl Shape {
    fn part(&mut self, command: &Command<Vulkan>) -> Part {
        match command {
            Command::Exec { .. } | Command::Copy { .. } | Command::Fill { .. } => Part::Device,
            Command::Signal { signal, .. } => {
                let semaphore = signal.semaphore();
                match self.signalling.replace(semaphore) {
                    Some(other) if other != semaphore => Part::Boundary,
                    _ => Part::Neutral,
                }
            }
            Command::Wait { .. }
            | Command::WaitSettled { .. }
            | Command::WaitForeign { .. }
            | Command::Upload { .. }
            | Command::Download { .. }
            | Command::Replay { .. }
            | Command::Collective(_) => {
                self.signalling = None;
                Part::Boundary
            }
            Command::Barrier | Command::Alloca { .. } | Command::Dealloca { .. } => Part::Neutral,
        }
    }
}

fn scalar_word(scalar: &Scalar) -> u64 {
    match *scalar {
        Scalar::U32(v) => u64::from(v),
        Scalar::I32(v) => u64::from(v as u32) | 1 << 32,
        Scalar::U64(v) => v,
        Scalar::I64(v) => v as u64,
        Scalar::F32(v) => u64::from(v.to_bits()) | 2 << 32,
        Scalar::F64(v) => v.to_bits(),
        #[cfg(feature = "half")]
        Scalar::F16(v) => u64::from(v.to_bits()) | 3 << 32,
        #[cfg(feature = "half")]
        Scalar::BF16(v) => u64::from(v.to_bits()) | 4 << 32,
    }
}

impl Recorder {
    /// The words that say what `batch`'s commands are, as far as a
    /// recording of them goes; `Err(why)` where it cannot be replayed.
    fn fingerprint(
        &self,
        batch: &Batch<Vulkan>,
    ) -> std::result::Result<(Vec<u64>, Vec<Range>), String> {
        let host_copies = self.copies_on_host(false);
        let mut words = Vec::with_capacity(batch.commands().len() * 6);
        let mut ranges = Vec::with_capacity(batch.buffers().len());
        let mut mark = |words: &Vec<u64>, exec: bool| {
            let at = u32::try_from(words.len()).expect("a batch of fewer than 2^32 words") - 3;
            ranges.push(Range { at, exec });
        };
        let mut shape = Shape::default();
        let range = |view: &View<Vulkan>| -> std::result::Result<[u64; 3], String> {
            if crate::buffer::Buffer::queue_ordered(view.buffer()).is_some() {
                // Its block may go back to the driver once its `dealloca`
                // completed, and a new `VkBuffer` may take the handle's
                // number: a recording could not tell.
                return Err(
                    "it names buffers made by `alloca`, whose memory may change between runs"
                        .into(),
                );
            }
            let (buffer, offset) = self.device_range(view).map_err(|e| e.to_string())?;
            Ok([buffer.as_raw(), offset, view.len() as u64])
        };
        for command in batch.commands() {
            let part = shape.part(command);
            match command {
                Command::Exec {
                    program,
                    buffers,
                    scalars,
                    params,
                } => {
                    words.extend([1, program.identity() as u64]);
                    for view in &batch.buffers()[buffers.clone()] {
                        words.extend(range(view)?);
                        mark(&words, true);
                    }
                    words.push(scalars.len() as u64);
                    words.extend(batch.scalars()[scalars.clone()].iter().map(scalar_word));
                    let (groups, local) = (params.groups(), params.local());
                    words.extend(groups.iter().chain(&local).map(|&n| u64::from(n)));
                }
                Command::Copy { dst, src } => {
                    words.push(2);
                    words.extend(range(dst)?);
                    mark(&words, false);
                    words.extend(range(src)?);
                    mark(&words, false);
                }
                Command::Fill {
                    dst,
                    pattern,
                    width,
                } => {
                    // As `fill` decides: by the bytes' place in the `VkBuffer`.
                    let [buffer, offset, len] = range(dst)?;
                    if !(offset.is_multiple_of(4) && len.is_multiple_of(4)) {
                        return Err(
                            "a fill of bytes not aligned to 4 stages its pattern each run".into(),
                        );
                    }
                    words.extend([
                        3,
                        u64::from(u32::from_ne_bytes(*pattern)),
                        u64::from(*width),
                    ]);
                    words.extend([buffer, offset, len]);
                    mark(&words, false);
                }
                Command::Upload { .. } | Command::Download { .. } if !host_copies => {
                    return Err(
                        "its uploads and downloads take new staging ranges each run (buffers are \
                         not mapped)"
                            .into(),
                    );
                }
                Command::Barrier => words.push(4),
                Command::Alloca { .. } => words.push(5),
                Command::Dealloca { .. } => words.push(6),
                Command::Signal { .. } if part == Part::Neutral => words.push(7),
                _ => {
                    if words.last() != Some(&BOUNDARY) {
                        words.push(BOUNDARY);
                    }
                }
            }
        }
        Ok((words, ranges))
    }

    /// Before settling `batch`: where it is marked for replay and can be,
    /// the recording it replays (one of its key whose commands match) or a
    /// new one to record. A recording left out (more than [`VARIANTS`] of
    /// the key) is handed back with the batch, whose retirement frees it.
    pub(super) fn begin_replay(&mut self, batch: &Batch<Vulkan>, key: Option<u32>, profile: bool) {
        self.replay = None;
        let Some(key) = key else { return };
        // Nothing more runs on a lost device: no kept recording is looked
        // at or rewritten there (`rebind`); the batch takes the plain
        // path, whose first device command fails with the loss.
        if self.context.health().is_err() {
            return;
        }
        if profile {
            *self.shared.fallback.lock() =
                Some("the batch profiles: device timestamps are recorded per run".into());
            return;
        }
        let (words, ranges) = match self.fingerprint(batch) {
            Ok(found) => found,
            Err(why) => {
                *self.shared.fallback.lock() = Some(why);
                return;
            }
        };
        let kept = self.recordings.entry(key).or_default();
        if let Some(at) = kept.iter().position(|r| r.words == words) {
            let recording = kept.remove(at);
            self.replay = Some(Replay::new(key, Mode::Replaying, recording));
            return;
        }
        let rebound = self
            .context
            .physical
            .update_after_bind
            .then(|| self.rebind(key, &words, &ranges))
            .flatten();
        let mut buffers = Vec::new();
        let mut programs = Vec::new();
        for command in batch.commands() {
            match command {
                Command::Exec {
                    program,
                    buffers: views,
                    ..
                } => {
                    programs.push(program.clone());
                    buffers.extend(batch.buffers()[views.clone()].iter().cloned());
                }
                Command::Copy { dst, src } => buffers.extend([dst.clone(), src.clone()]),
                Command::Fill { dst, .. } => buffers.push(dst.clone()),
                _ => {}
            }
        }
        if let Some(mut recording) = rebound {
            recording.words = words;
            recording.ranges = ranges;
            recording._buffers = buffers;
            recording._programs = programs;
            self.replay = Some(Replay::new(key, Mode::Replaying, recording));
            return;
        }
        let recording = Recording {
            words,
            ranges,
            structure: None,
            sets: Vec::new(),
            last: 0,
            segments: Vec::new(),
            _buffers: buffers,
            _programs: programs,
        };
        self.replay = Some(Replay::new(key, Mode::Recording, recording));
    }

    /// A kept recording of `key` that takes the batch of `words` by
    /// rewriting its descriptor sets (`rebind.rs`), rewritten and taken out
    /// (its words and what it holds still the old batch's); the least
    /// recently used of those that can.
    fn rebind(&mut self, key: u32, words: &[u64], ranges: &[Range]) -> Option<Recording> {
        let kept = self.recordings.get_mut(&key)?;
        // SAFETY: the queue's own progress semaphore, alive with it.
        let completed = unsafe {
            self.context
                .device
                .get_semaphore_counter_value(self.progress)
        }
        .ok()?;
        let mut wanted = None;
        let at = kept.iter_mut().rposition(|recording| {
            if recording.last > completed || recording.sets.is_empty() {
                return false;
            }
            let wanted = wanted.get_or_insert_with(|| Structure::of(words, ranges));
            let structure = recording
                .structure
                .get_or_insert_with(|| Structure::of(&recording.words, &recording.ranges));
            structure == wanted
        })?;
        let recording = kept.remove(at);
        // SAFETY: the sets are this queue's recording's, from its command
        // sets' pools, made `UPDATE_AFTER_BIND` with their layouts where the
        // device has `update_after_bind`; every submission of the recording
        // completed (the progress semaphore passed its last); the buffers
        // the batch binds live while it does, and the recording takes them
        // before it is submitted again.
        let written = unsafe {
            super::rebind::rewrite(
                &self.context.device,
                &recording.sets,
                (&recording.words, &recording.ranges),
                (words, ranges),
            )
        };
        if written > 0 {
            self.shared.patched.fetch_add(1, Ordering::Relaxed);
        }
        Some(recording)
    }

    /// An exec recorded: the set it wrote and bound (`None` where it kept
    /// the one bound) and how many buffers it binds.
    pub(super) fn note_exec(&mut self, set: Option<vk::DescriptorSet>, bindings: usize) {
        let Some(replay) = self.replay.as_mut() else {
            return;
        };
        if replay.mode != Mode::Recording {
            return;
        }
        let count = bindings as u32;
        if let Some(set) = set {
            replay.recording.sets.push(BoundSet {
                set,
                first: replay.ranges,
                count,
            });
        }
        replay.ranges += count;
    }

    /// After settling the batch: a recording made or replayed goes back
    /// under its key, first; one that failed, and one past [`VARIANTS`],
    /// is freed once the batch retired.
    ///
    /// `ran`: `None` where the batch never ran (abandoned), else whether
    /// it settled without a failure.
    pub(super) fn end_replay(&mut self, ran: Option<bool>) {
        let Some(mut replay) = self.replay.take() else {
            return;
        };
        if let Some(at) = replay.lent.take()
            && let Some((set, _)) = self.open.take()
        {
            // Lent and never submitted (a failure before its flush).
            replay.recording.segments[at] = Some(set);
        }
        let mut recording = replay.recording;
        // Its submissions so far: none is later than the queue's last.
        recording.last = self.next;
        // Kept only whole: a segment lost (a panic between lending and
        // putting back) would be skipped by every later replay.
        let whole = recording.segments.iter().flatten().count() == replay.present;
        let keep = whole
            && match ran {
                None => replay.mode == Mode::Replaying,
                Some(settled) => settled,
            };
        let mut freed = Vec::new();
        if keep {
            let kept = self.recordings.entry(replay.key).or_default();
            kept.insert(0, recording);
            if kept.len() > VARIANTS {
                freed.extend(kept.pop().into_iter().flat_map(Recording::into_sets));
            }
        } else {
            freed.extend(recording.segments.drain(..).flatten());
        }
        if freed.is_empty() {
            return;
        }
        // Earlier runs' submissions of them may be pending: they go back
        // once everything this queue submitted so far completed.
        let next = self.next;
        if let Some(current) = self.current.as_mut() {
            current.sets.extend(freed);
            if next > 0 {
                current.progress = Some(current.progress.unwrap_or(0).max(next));
            }
        }
    }

    /// Called before command `index` is recorded: whether the queue
    /// records it (`false`: a replay skips a device command, which its
    /// recording holds). A boundary ends the segment: replaying, its
    /// command set is lent to the open slot so the boundary submits it
    /// where the plain path would have submitted what it recorded.
    pub(super) fn replay_step(&mut self, index: usize, command: &Command<Vulkan>) -> bool {
        let Some(replay) = self.replay.as_mut() else {
            return true;
        };
        let part = replay.shape.part(command);
        replay.at_boundary = part == Part::Boundary;
        match part {
            Part::Device => {
                if !replay.in_segment {
                    replay.in_segment = true;
                    replay.first = index;
                }
                replay.mode == Mode::Recording
            }
            Part::Neutral => true,
            Part::Boundary => {
                self.lend_segment();
                true
            }
        }
    }

    /// Ends the segment being walked: replaying, lends its command set to
    /// the open slot (submitted by the next flush).
    fn lend_segment(&mut self) {
        let Some(replay) = self.replay.as_mut() else {
            return;
        };
        if !replay.in_segment {
            return;
        }
        if replay.mode == Mode::Replaying
            && let Some(set) = replay
                .recording
                .segments
                .get_mut(replay.segment)
                .and_then(Option::take)
        {
            replay.lent = Some(replay.segment);
            self.open = Some((set, replay.first));
        }
    }

    /// After a boundary command ran: nothing of the segment is left
    /// unsubmitted across it (a reached wait or an already-submitted signal
    /// submits nothing), so the next segment starts a command buffer of
    /// its own, and the stretch's signal is not carried into another;
    /// then the next segment begins.
    pub(super) fn replay_boundary_done(&mut self) -> Result<()> {
        if !self.replay.as_ref().is_some_and(|r| r.at_boundary) {
            return Ok(());
        }
        if self.open.is_some() || self.pending_signal.is_some() {
            self.flush()?;
        }
        let replay = self.replay.as_mut().expect("looked at above");
        replay.at_boundary = false;
        if replay.in_segment {
            replay.segment += 1;
            replay.in_segment = false;
        }
        Ok(())
    }

    /// At the batch's end: the last segment, submitted by the batch's
    /// last flush (recording: kept as the segment it is).
    pub(super) fn replay_end_of_batch(&mut self) {
        self.lend_segment();
    }

    /// What a flush does with the command set it submitted: `true` where
    /// a recording keeps it (recording: as the segment's; replaying: back
    /// where it was lent from), `false` where the batch holds it until it
    /// retires (the plain path).
    pub(super) fn keep_submitted(&mut self, set: &mut Option<CommandSet>) -> bool {
        let Some(replay) = self.replay.as_mut() else {
            return false;
        };
        let Some(taken) = set.take() else {
            return false;
        };
        let at = match replay.lent.take() {
            Some(at) => at,
            None => replay.segment,
        };
        let segments = &mut replay.recording.segments;
        if segments.len() <= at {
            segments.resize_with(at + 1, || None);
        }
        if replay.mode == Mode::Recording {
            replay.present += 1;
        }
        segments[at] = Some(taken);
        true
    }

    /// After a failure in a replayed batch: a segment walked but not yet
    /// lent holds commands after the failure too, so it is not submitted,
    /// and the batch fails from the segment's start, the stretch's signal
    /// with it (never signalled without its work).
    pub(super) fn abandon_replayed_segment(&mut self) {
        let Some(replay) = self.replay.as_ref() else {
            return;
        };
        if replay.mode != Mode::Replaying || !replay.in_segment || replay.lent.is_some() {
            return;
        }
        let mut from = replay.first;
        if let Some((signal, _, first)) = self.pending_signal.take() {
            signal.note_dropped();
            from = from.min(first);
        }
        self.failed_from = Some(self.failed_from.map_or(from, |f| f.min(from)));
    }

    /// Whether the open command set is a recording's, lent for a replay
    /// (already ended; submitted as it is).
    pub(super) fn open_is_lent(&self) -> bool {
        self.replay.as_ref().is_some_and(|r| r.lent.is_some())
    }

    /// Whether the batch being recorded records a recording (its command
    /// buffers are submitted again: `SIMULTANEOUS_USE`, not one-time).
    pub(super) fn recording_for_replay(&self) -> bool {
        self.replay
            .as_ref()
            .is_some_and(|r| r.mode == Mode::Recording)
    }
}

/// The command sets of every recording, at the queue's end.
pub(super) fn all_sets(
    recordings: &mut std::collections::HashMap<u32, Vec<Recording>>,
) -> Vec<CommandSet> {
    recordings
        .drain()
        .flat_map(|(_, kept)| kept.into_iter().flat_map(Recording::into_sets))
        .collect()
}
