//! Runs a random plan ([`check_plan_schedule`](crate::check_plan_schedule))
//! back to back, its slots rebound between runs and a kernel failed on
//! purpose now and then, against a sequential model of the bytes the
//! slots are bound to.
//!
//! Each run, for each slot, the data chooses where it is bound: fresh
//! bytes (disjoint from everything before), the very bytes it had
//! (identical), bytes of the same buffer shifted by a multiple of 16
//! (overlapping what the run before, maybe still in flight, used), or, for
//! an input, a view 4 bytes off the CPU's 16-byte alignment (misaligned:
//! the run is refused at `run` when a kernel takes it). And whether a
//! kernel of the run fails. The runs are recorded without waiting; then:
//!
//! - a refused run's error names the run and a misaligned slot;
//! - a run with a failed kernel fails with an error naming that kernel's
//!   operation and this run's injected failure;
//! - every other run completes: its kernels read what their producers
//!   wrote in that run (the canary kernels check it, and would fail the
//!   run), so no run ever reports another's failure;
//! - the slots' bytes hold what running the runs one after another would
//!   leave: each successful run's words where it bound its slots; bytes
//!   a failed or refused run wrote are unknown until a later run writes
//!   them again;
//! - nothing hangs: every wait is bounded.
//!
//! Under cargo-fuzz (built with `panic=abort`) no kernel is failed: a CPU
//! kernel fails by panicking, which would end the fuzzer. `cargo test`
//! replays the corpus with them.

use std::sync::Arc;

use hwqueue::{
    Backend, Buffer, BufferId, BufferOf, Device, DeviceOf, Error, OpId, Plan, ScalarId, Timeout,
    View,
};

use crate::plans::{Holds, injected_failure};
use crate::reader::Reader;

/// A slot of a random schedule.
pub(crate) struct RunSlot {
    pub(crate) id: BufferId,
    pub(crate) name: String,
    /// Its device id (0 or 1).
    pub(crate) device: usize,
    pub(crate) words: usize,
    /// What a run leaves in it.
    pub(crate) holds: Holds,
    /// For an input: the operation that uploads it each run.
    pub(crate) upload: Option<OpId>,
    /// For an input: whether a kernel takes it (then a misaligned binding
    /// is refused).
    pub(crate) read_by_kernel: bool,
}

/// The scalar slots of a random schedule.
#[derive(Clone, Copy)]
pub(crate) struct Scalars {
    /// The run's number.
    pub(crate) step: ScalarId,
    /// The id of the kernel to fail in this run (0: none).
    pub(crate) fail: ScalarId,
}

/// Bytes a slot is bound to in one run: `words` words at byte `offset` of
/// buffer `buffer` of the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Place {
    buffer: usize,
    offset: usize,
    words: usize,
}

impl Place {
    fn overlaps(&self, other: &Place) -> bool {
        self.buffer == other.buffer
            && self.offset < other.offset + other.words * 4
            && other.offset < self.offset + self.words * 4
    }

    fn aligned(&self) -> bool {
        self.offset.is_multiple_of(16)
    }
}

/// Room past a slot's bytes in each buffer, for shifted bindings.
const SLACK: usize = 64;

/// The buffers slots are bound to, each of the device of its slot, and
/// what the model says each word holds (`None`: unknown, or never
/// written).
struct Pool<'a, S: Backend> {
    devices: &'a [Arc<DeviceOf<S>>; 2],
    buffers: Vec<BufferOf<S>>,
    model: Vec<Vec<Option<u32>>>,
}

impl<S: Backend> Pool<'_, S> {
    fn fresh(&mut self, device: usize, words: usize, offset: usize) -> Place {
        self.buffers.push(
            self.devices[device]
                .alloc(words * 4 + SLACK)
                .expect("a slot's buffer"),
        );
        self.model.push(vec![None; words + SLACK / 4]);
        Place {
            buffer: self.buffers.len() - 1,
            offset,
            words,
        }
    }

    /// Where a slot of `words` words is bound this run, as `choice` says,
    /// after `previous`; never sharing bytes with `taken` (this run's
    /// other bindings), never misaligned unless `may_misalign`.
    fn choose(
        &mut self,
        device: usize,
        choice: u8,
        previous: Option<Place>,
        words: usize,
        taken: &[Place],
        may_misalign: bool,
    ) -> Place {
        let place = match (choice % 8, previous) {
            (3, Some(previous)) => previous,
            (4 | 5, Some(previous)) => {
                // From the aligned offset at or below the last one, a
                // multiple of 16 either way, within the slack.
                let shift = 16 * (1 + usize::from(choice / 8) % 4);
                let base = previous.offset / 16 * 16;
                let up = (base + shift <= SLACK).then_some(base + shift);
                let down = base.checked_sub(shift);
                let offset = if choice.is_multiple_of(2) {
                    down.or(up)
                } else {
                    up.or(down)
                };
                Place {
                    offset: offset.unwrap_or(0),
                    ..previous
                }
            }
            (6, _) if may_misalign => return self.fresh(device, words, 4),
            _ => return self.fresh(device, words, 0),
        };
        if taken.iter().any(|other| other.overlaps(&place)) {
            self.fresh(device, words, 0)
        } else {
            place
        }
    }

    fn view(&self, place: Place) -> View<S> {
        View::new(&self.buffers[place.buffer], place.offset, place.words * 4).expect("a view")
    }

    /// Sets the model's words of `place` to `word` (`None`: unknown).
    fn record(&mut self, place: Place, word: Option<u32>) {
        let start = place.offset / 4;
        self.model[place.buffer][start..start + place.words].fill(word);
    }
}

/// How a run ended, as the model expects it.
enum Expected {
    Completes,
    /// Kernel `id` (operation `name`) was failed on purpose.
    Fails {
        id: u32,
        name: String,
    },
}

/// Runs `plan` `runs` times back to back, the data in `r` choosing each
/// run's bindings and failed kernel, and checks every run and the slots'
/// bytes against the model (see the module docs).
pub(crate) fn run_and_check<S: Backend>(
    plan: &mut Plan<S>,
    devices: &[Arc<DeviceOf<S>>; 2],
    scalars: Scalars,
    slots: &[RunSlot],
    kernels: &[(u32, String)],
    runs: u32,
    r: &mut Reader<'_>,
) {
    let mut pool = Pool {
        devices,
        buffers: Vec::new(),
        model: Vec::new(),
    };
    let mut previous: Vec<Option<Place>> = vec![None; slots.len()];
    let mut started = Vec::new();
    // Per run, in order: where its slots were bound and whether it may
    // have written them unlike the model (failed or refused).
    let mut history: Vec<(Vec<Place>, bool)> = Vec::new();
    for run in 0..runs {
        let mut places: Vec<Place> = Vec::new();
        for (index, slot) in slots.iter().enumerate() {
            let choice = r.byte();
            let place = pool.choose(
                slot.device,
                choice,
                previous[index],
                slot.words,
                &places,
                slot.upload.is_some(),
            );
            plan.bind(slot.id, &pool.view(place)).expect("bind a slot");
            if let Some(upload) = slot.upload {
                plan.upload(upload, &vec![slot.holds.word(run); slot.words])
                    .expect("stage an input");
            }
            places.push(place);
        }
        previous = places.iter().copied().map(Some).collect();
        let fail = (r.byte() % 3 == 2 && !kernels.is_empty())
            .then(|| &kernels[usize::from(r.byte()) % kernels.len()])
            // Under cargo-fuzz panics abort, and a kernel fails by
            // panicking: none is failed there (the corpus, replayed by
            // `cargo test`, fails them).
            .filter(|_| !cfg!(fuzzing));
        plan.set_scalar(scalars.step, run).expect("run number");
        plan.set_scalar(scalars.fail, fail.map_or(0, |(id, _)| *id))
            .expect("kernel to fail");
        let misaligned: Vec<&str> = slots
            .iter()
            .zip(&places)
            .filter(|(slot, place)| slot.read_by_kernel && !place.aligned())
            .map(|(slot, _)| slot.name.as_str())
            .collect();
        match plan.run() {
            Ok(_) if !misaligned.is_empty() => {
                panic!(
                    "run {run}: bound {misaligned:?} to misaligned views, it was not refused\n{plan}"
                )
            }
            Ok(handle) => {
                let expected = match fail {
                    Some((id, name)) => Expected::Fails {
                        id: *id,
                        name: name.clone(),
                    },
                    None => Expected::Completes,
                };
                history.push((places, fail.is_some()));
                started.push((run, handle, expected));
            }
            Err(error) if !misaligned.is_empty() => {
                let text = error.to_string();
                assert!(
                    text.contains(&format!("run {run} "))
                        && misaligned
                            .iter()
                            .any(|name| text.contains(&format!("`{name}`"))),
                    "run {run}: the refusal names neither the run nor a misaligned binding \
                     {misaligned:?}: {text}"
                );
                history.push((places, true));
            }
            Err(error) => panic!("run {run}: {error}\n{plan}"),
        }
    }
    for (run, handle, expected) in started {
        let outcome = handle.wait(Timeout::After(crate::MUST_FINISH));
        match (expected, outcome) {
            (Expected::Completes, Ok(())) => {}
            (Expected::Completes, Err(error)) => panic!("run {run} failed: {error}\n{plan}"),
            (Expected::Fails { name, .. }, Ok(())) => {
                panic!("run {run}: kernel `{name}` was to fail, the run completed\n{plan}")
            }
            (Expected::Fails { id, name }, Err(error)) => {
                let own = injected_failure(id, run);
                let names_it = matches!(&error, Error::OperationFailed { operation, .. } if *operation == name);
                assert!(
                    names_it
                        && matches!(error.root_cause(), Error::KernelFailed { message, .. } if *message == own),
                    "run {run}: failed with {error}, not naming its own failed kernel `{name}` \
                     ({own})\n{plan}"
                );
            }
        }
    }
    // The slots' bytes, as the runs one after another leave them.
    for (run, (places, unknown)) in history.iter().enumerate() {
        for (slot, place) in slots.iter().zip(places) {
            let word = (!unknown).then(|| slot.holds.word(run as u32));
            pool.record(*place, word);
        }
    }
    for (index, buffer) in pool.buffers.iter().enumerate() {
        let mut got = vec![0u32; pool.model[index].len()];
        buffer.read_at(0, &mut got).expect("read a slot's buffer");
        for (at, (got, expected)) in got.iter().zip(&pool.model[index]).enumerate() {
            if let Some(expected) = expected {
                assert_eq!(
                    got, expected,
                    "word {at} of slot buffer {index} holds {got:#x}, expected {expected:#x}\n{plan}"
                );
            }
        }
    }
}
