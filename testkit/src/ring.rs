//! `EventRing` with a mock event against a model.

use std::time::Duration;

use hwqueue::{Error, MAX_SIGNAL_VALUE, Timeout};

use crate::mock_event::{MockDevice, MockEvent, Recording};
use crate::reader::Reader;
use crate::signal::*;

/// One operation on an [`EventRing`](hwqueue::ring::EventRing), for
/// [`check_ring_ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// `record(v)`: a new record, nothing (a value reached already), or,
    /// with every slot pending, the device runs up to the oldest record
    /// first.
    Record(u64),
    /// `record` past [`MAX_SIGNAL_VALUE`]: an error, nothing recorded.
    RecordPastTheRange,
    /// The device completes the `i % n`th of the `n` records not completed
    /// yet, in record order (pending or passed by the value).
    Complete(usize),
    /// `set(v)` from the host.
    Set(u64),
    /// `fail(upto, cause)`, with a cause numbered by its position.
    Fail(u64),
    /// `value()`.
    Value,
    /// `is_reached(v)`.
    IsReached(u64),
    /// `wait(v)` with a zero timeout: never blocks.
    Poll(u64),
    /// `wait(v, Forever)` on a value the model says is reached, completed
    /// or set (the target is lowered to the value): must return at once.
    WaitReached(u64),
    /// `dependency(v)`: which event a queue would wait for.
    Dependency(u64),
    /// `wait_dependency(v)` with a zero timeout.
    PollDependency(u64),
}

/// One record, as the reference model keeps it.
#[derive(Debug)]
pub(crate) struct ModelRecord {
    pub(crate) value: u64,
    pub(crate) recording: Recording,
    pub(crate) complete: bool,
}

/// The reference model of a ring: the signal model (the value is the
/// highest value completed or set; failures as for any signal) and every
/// record in order.
#[derive(Debug)]
pub(crate) struct RingModel {
    pub(crate) signal: SignalModel,
    pub(crate) records: Vec<ModelRecord>,
    pub(crate) slots: usize,
}

impl RingModel {
    /// Records the ring still waits for (not complete, above the value),
    /// oldest first.
    pub(crate) fn pending(&self) -> Vec<usize> {
        (0..self.records.len())
            .filter(|&i| !self.records[i].complete && self.records[i].value > self.signal.value)
            .collect()
    }

    pub(crate) fn complete(&mut self, index: usize) {
        self.records[index].complete = true;
        self.signal.set(self.records[index].value);
    }

    /// The record a queue waits on for `target` (above the value, not
    /// failed): the smallest recorded value `>= target`, the older on a tie.
    pub(crate) fn dependency(&self, target: u64) -> Option<usize> {
        (0..self.records.len())
            .filter(|&i| {
                self.records[i].value >= target && self.records[i].value > self.signal.value
            })
            .min_by_key(|&i| self.records[i].value)
    }
}

/// What `dependency` returns, reduced to what the model can predict.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DependencyOutcome {
    Reached,
    Event(usize),
    Unrecorded,
    Failed { current: u64, cause: usize },
    Timeout,
}

pub(crate) fn observed_dependency(
    result: hwqueue::Result<Option<hwqueue::ring::Dependency<MockEvent>>>,
) -> DependencyOutcome {
    match result {
        Ok(Some(hwqueue::ring::Dependency::Reached)) => DependencyOutcome::Reached,
        Ok(Some(hwqueue::ring::Dependency::Event(event))) => DependencyOutcome::Event(event.id()),
        Ok(None) => DependencyOutcome::Unrecorded,
        Err(Error::Timeout { .. }) => DependencyOutcome::Timeout,
        Err(error) => match observed_wait(Err(error)) {
            WaitOutcome::Failed { current, cause } => DependencyOutcome::Failed { current, cause },
            other => panic!("unexpected dependency outcome {other:?}"),
        },
    }
}

/// Runs `ops` on a new `EventRing` at `initial` with `slots` slots (clamped
/// to 1..=[`RING_SLOTS`](hwqueue::ring::RING_SLOTS)) and on the model,
/// comparing every result.
///
/// Checks: the value is the highest value completed or set (recording
/// never moves it); waits, `is_reached` and failures answer as for any
/// timeline signal; `dependency` names the event of the smallest recorded
/// value `>= target`; a full ring runs the device up to its oldest record;
/// a record of a reached value records nothing; events are reused (never
/// more events than slots, since nothing else holds them).
///
/// # Panics
/// On the first difference, naming the step.
pub fn check_ring_ops(initial: u64, slots: usize, ops: &[RingOp]) {
    use hwqueue::ring::EventRing;

    let slots = slots.clamp(1, hwqueue::ring::RING_SLOTS);
    // Single-threaded: when the ring blocks on an event (every slot
    // pending), the device runs up to it.
    let device = MockDevice::running_on_synchronize();
    let ring = EventRing::<MockEvent>::with_slots(initial, slots);
    let mut model = RingModel {
        signal: SignalModel {
            value: initial,
            ..SignalModel::default()
        },
        records: Vec::new(),
        slots,
    };
    let mut recorder = device.recorder();
    for (step, op) in ops.iter().enumerate() {
        let context =
            || format!("step {step} ({op:?}) of {ops:?} from {initial} with {slots} slots");
        match *op {
            RingOp::Record(value) => {
                recorder.last = None;
                let pending = model.pending();
                if value > model.signal.value && pending.len() == model.slots {
                    // The ring blocks on (so the device runs up to) its
                    // oldest pending record.
                    model.complete(pending[0]);
                }
                ring.record(value, &mut recorder)
                    .unwrap_or_else(|e| panic!("{}: {e}", context()));
                match recorder.last {
                    None => assert!(
                        value <= model.signal.value,
                        "nothing recorded: {}",
                        context()
                    ),
                    Some(recording) => {
                        assert!(
                            value > model.signal.value,
                            "recorded a reached value: {}",
                            context()
                        );
                        model.records.push(ModelRecord {
                            value,
                            recording,
                            complete: false,
                        });
                    }
                }
            }
            RingOp::RecordPastTheRange => {
                recorder.last = None;
                let result = ring.record(MAX_SIGNAL_VALUE + 1, &mut recorder);
                assert!(
                    matches!(result, Err(Error::SignalValueOutOfRange { .. })),
                    "{result:?}: {}",
                    context()
                );
                assert!(recorder.last.is_none(), "{}", context());
            }
            RingOp::Complete(pick) => {
                let incomplete: Vec<usize> = (0..model.records.len())
                    .filter(|&i| !model.records[i].complete)
                    .collect();
                if !incomplete.is_empty() {
                    let index = incomplete[pick % incomplete.len()];
                    model.records[index].recording.complete();
                    model.complete(index);
                }
            }
            RingOp::Set(value) => {
                ring.set(value);
                model.signal.set(value);
            }
            RingOp::Fail(upto) => {
                ring.fail(upto, cause(step));
                // Values a pending record stands for are its event's to
                // decide: the failure covers only what lies above them.
                let recorded = model
                    .pending()
                    .into_iter()
                    .map(|index| model.records[index].value)
                    .filter(|value| *value <= upto)
                    .max()
                    .unwrap_or(0);
                let above = recorded.max(model.signal.value);
                model.signal.fail_above(above, upto, step);
            }
            RingOp::Value => assert_eq!(ring.value(), model.signal.value, "{}", context()),
            RingOp::IsReached(target) => assert_eq!(
                ring.is_reached(target),
                target <= model.signal.value,
                "{}",
                context()
            ),
            RingOp::Poll(target) => assert_eq!(
                observed_wait(ring.wait(target, Duration::ZERO)),
                model.signal.wait(target),
                "{}",
                context()
            ),
            RingOp::WaitReached(target) => {
                let target = target % (model.signal.value + 1);
                assert_eq!(
                    observed_wait(ring.wait(target, Timeout::Forever)),
                    WaitOutcome::Reached,
                    "{}",
                    context()
                );
            }
            RingOp::Dependency(target) | RingOp::PollDependency(target) => {
                let expected = match model.signal.wait(target) {
                    WaitOutcome::Reached => DependencyOutcome::Reached,
                    WaitOutcome::Failed { current, cause } => {
                        DependencyOutcome::Failed { current, cause }
                    }
                    WaitOutcome::Timeout { .. } => match model.dependency(target) {
                        Some(index) => {
                            DependencyOutcome::Event(model.records[index].recording.event)
                        }
                        None if matches!(op, RingOp::Dependency(_)) => {
                            DependencyOutcome::Unrecorded
                        }
                        None => DependencyOutcome::Timeout,
                    },
                    WaitOutcome::OutOfRange => unreachable!("targets are small"),
                };
                let observed = match op {
                    RingOp::Dependency(_) => observed_dependency(ring.dependency(target)),
                    _ => {
                        observed_dependency(ring.wait_dependency(target, Duration::ZERO).map(Some))
                    }
                };
                assert_eq!(observed, expected, "{}", context());
            }
        }
        assert!(ring.slots_in_use() <= slots, "{}", context());
        // Nothing holds events between operations, so every event is
        // reused: never more than one per slot.
        assert!(device.created() <= slots, "{}", context());
    }
    assert_eq!(ring.value(), model.signal.value, "final value of {ops:?}");
    // Every value around the ones the ops named answers as the model says.
    let end = model
        .signal
        .value
        .max(model.records.iter().map(|r| r.value).max().unwrap_or(0));
    for target in 0..=end.saturating_add(2).min(MAX_SIGNAL_VALUE) {
        assert_eq!(
            observed_wait(ring.wait(target, Duration::ZERO)),
            model.signal.wait(target),
            "final probe {target} of {ops:?}"
        );
    }
}

/// Decodes a ring program from `data` and runs [`check_ring_ops`]. Values
/// are small and rings have one to four slots, so records, sets, failures
/// and wrap-around collide.
///
/// # Panics
/// On a difference from the model.
pub fn event_ring(data: &[u8]) {
    let mut reader = Reader { data };
    let head = reader.byte();
    let initial = u64::from(head % 8);
    let slots = 1 + usize::from((head >> 3) % 4);
    let mut ops = Vec::new();
    while !reader.is_empty() && ops.len() < 96 {
        let tag = reader.byte();
        let byte = reader.byte();
        let value = u64::from(byte % 40);
        ops.push(match tag % 10 {
            0..=2 => RingOp::Record(1 + value),
            3 | 4 => RingOp::Complete(usize::from(byte)),
            5 => RingOp::Set(value),
            6 => RingOp::Fail(value),
            7 if tag & 0x80 != 0 => RingOp::Poll(value),
            7 => RingOp::IsReached(value),
            8 if tag & 0x80 != 0 => RingOp::Dependency(value),
            8 => RingOp::PollDependency(value),
            _ => match (tag >> 4) % 4 {
                0 => RingOp::Value,
                1 | 2 => RingOp::WaitReached(value),
                _ => RingOp::RecordPastTheRange,
            },
        });
    }
    check_ring_ops(initial, slots, &ops);
}
