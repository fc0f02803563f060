//! Buffers and scalars bound per run: a plan's slots.
//!
//! A slot ([`Schedule::add_slot`]) is planned like any buffer: its own
//! bytes, its own hazards. [`Plan::bind`] points it at a caller's buffer;
//! a binding stays until rebound, and a rebinding records nothing and
//! re-plans nothing: the next run's commands name the new buffer.
//!
//! Two things the hazards of the plan cannot see are checked instead:
//!
//! - **Within a run**, two slots bound to shared bytes (or a slot bound to
//!   bytes of a schedule buffer) where either is written: the planner
//!   ordered them as different memory. `run` refuses that
//!   ([`Error::InvalidBinding`]); bindings that are only read may share.
//! - **Across runs**, a slot bound to bytes that another slot used in a run
//!   still in flight (the last run's output bound as this run's input): the
//!   back-to-back waits order a slot only with itself. The first run with
//!   such bindings waits, on every queue, for that run to finish; other
//!   rebindings add no wait.
//!
//! A run in flight keeps the buffers it was recorded with, so binding
//! while it runs is safe.

use std::collections::VecDeque;

use super::plan::{Plan, PlanFacts};
use super::schedule::*;
use super::*;
use crate::view::AsView;

/// The bindings of some runs: each slot's view.
struct Epoch<B: Backend> {
    views: Vec<(BufferId, View<B>)>,
    /// The last run that used them; `None` until one did.
    last_run: Option<u64>,
}

pub(super) struct Bindings<B: Backend> {
    /// The roots that are slots.
    slots: Vec<BufferId>,
    /// The roots that are buffers of the schedule (arenas included).
    buffers: Vec<BufferId>,
    /// Per root: whether some operation writes it, reads it.
    written: Vec<bool>,
    read: Vec<bool>,
    /// Whether a binding changed since the last run.
    changed: bool,
    /// The bindings of the runs since the last change.
    current: Epoch<B>,
    /// Earlier bindings whose runs may be in flight.
    history: VecDeque<Epoch<B>>,
    /// The run the next run must wait for, whole.
    barrier: Option<u64>,
}

impl<B: Backend> Bindings<B> {
    pub(super) fn new(schedule: &Schedule<B>, accesses: &[(Vec<Access>, Vec<Access>)]) -> Self {
        let roots = |origin: Origin| -> Vec<BufferId> {
            (0..schedule.buffers.len())
                .map(BufferId)
                .filter(|id| {
                    let slot = &schedule.buffers[id.0];
                    slot.root == *id && slot.origin == origin
                })
                .collect()
        };
        let mut written = vec![false; schedule.buffers.len()];
        let mut read = vec![false; schedule.buffers.len()];
        for (reads, writes) in accesses {
            for access in reads {
                read[access.buffer.0] = true;
            }
            for access in writes {
                written[access.buffer.0] = true;
            }
        }
        let slots = roots(Origin::Slot);
        Self {
            changed: !slots.is_empty(),
            slots,
            buffers: roots(Origin::Buffer),
            written,
            read,
            current: Epoch {
                views: Vec::new(),
                last_run: None,
            },
            history: VecDeque::new(),
            barrier: None,
        }
    }
}

impl<B: Backend> Bindings<B> {
    /// Gives back a barrier `check_bindings` returned, for a run refused
    /// before it recorded anything.
    pub(super) fn restore_barrier(&mut self, barrier: Option<u64>) {
        if barrier.is_some() {
            self.barrier = barrier;
        }
    }
}

impl<B: Backend> Plan<B> {
    /// Binds slot `slot` ([`Schedule::add_slot`]) to `view` (a buffer or
    /// a [`View`] of one, of exactly the slot's size) for the next run and
    /// those after it, until rebound. Kernels that take the slot, or a
    /// view of it, get the caller's bytes: no copy, nothing re-planned.
    /// A run in flight keeps what it was recorded with.
    ///
    /// A buffer of another device of the backend is refused by that
    /// device's queue at [`run`](Self::run) ([`Error::DeviceMismatch`]);
    /// on the CPU, every device's memory is the host's.
    ///
    /// # Errors
    /// [`Error::InvalidBinding`] when `slot` is not a slot of this plan or
    /// `view` is not its size.
    pub fn bind(&mut self, slot: BufferId, view: &impl AsView<B>) -> Result<()> {
        let name = |id: BufferId| match self.schedule.buffers.get(id.0) {
            Some(s) => s.name.clone(),
            None => format!("buffer {}", id.0),
        };
        let Some(target) = self.schedule.buffers.get(slot.0) else {
            return Err(Error::InvalidBinding {
                slot: name(slot),
                reason: "no such buffer in this plan; bind an id `Schedule::add_slot` returned"
                    .into(),
            });
        };
        if target.origin != Origin::Slot || target.root != slot {
            let what = match (target.origin, target.root == slot) {
                (_, false) => "a view",
                (Origin::Tensor, true) => "a tensor, placed by the planner",
                (_, true) => "a buffer of the schedule",
            };
            return Err(Error::InvalidBinding {
                slot: name(slot),
                reason: format!(
                    "it is {what}, not a slot; declare what is bound per run with \
                     `Schedule::add_slot`, and bind the slot itself"
                ),
            });
        }
        let (buffer, offset, len) = view.view_parts();
        if len != target.len {
            return Err(Error::InvalidBinding {
                slot: name(slot),
                reason: format!(
                    "the slot holds {} bytes but the view given has {len}; bind a buffer or \
                     view of exactly the slot's size",
                    target.len
                ),
            });
        }
        let bound = crate::view::View::new(buffer, offset, len)?;
        for id in 0..self.schedule.buffers.len() {
            let part = &self.schedule.buffers[id];
            if part.root == slot {
                let view = bound.view(part.offset, part.len)?;
                self.schedule.buffers[id].buffer = Some(view);
            }
        }
        self.bindings.changed = true;
        Ok(())
    }

    /// Sets scalar slot `slot` ([`Schedule::add_scalar`]) for the next run
    /// and those after it.
    ///
    /// # Errors
    /// [`Error::InvalidBinding`] for an unknown slot or a value of another
    /// type than the slot's.
    pub fn set_scalar(&mut self, slot: ScalarId, value: impl Into<Scalar>) -> Result<()> {
        let value = value.into();
        let Some((name, initial)) = self.schedule.scalars.get(slot.0) else {
            return Err(Error::InvalidBinding {
                slot: format!("scalar {}", slot.0),
                reason: "no such scalar slot in this plan; use an id `Schedule::add_scalar` \
                         returned"
                    .into(),
            });
        };
        if std::mem::discriminant(initial) != std::mem::discriminant(&value) {
            return Err(Error::InvalidBinding {
                slot: name.clone(),
                reason: format!(
                    "the slot holds a {} but the value given is a {}; convert it first",
                    initial.type_name(),
                    value.type_name()
                ),
            });
        }
        self.scalar_values[slot.0] = value;
        Ok(())
    }

    /// Before a run: every slot bound, no bindings sharing bytes the plan
    /// writes, and the run to wait for where a binding takes bytes another
    /// slot used in a run still in flight. Returns that run.
    pub(super) fn check_bindings(&mut self) -> Result<Option<u64>> {
        let facts = self.facts.clone();
        let bindings = &mut self.bindings;
        if bindings.changed {
            let buffers = &self.schedule.buffers;
            let mut views = Vec::with_capacity(bindings.slots.len());
            for &slot in &bindings.slots {
                let Some(view) = &buffers[slot.0].buffer else {
                    return Err(Error::SlotUnbound {
                        slot: buffers[slot.0].name.clone(),
                    });
                };
                views.push((slot, view.clone()));
            }
            let used = |id: BufferId| bindings.written[id.0] || bindings.read[id.0];
            for (index, (slot, view)) in views.iter().enumerate() {
                if !used(*slot) {
                    continue;
                }
                let others = views[index + 1..].iter().map(|(id, v)| (*id, v)).chain(
                    bindings
                        .buffers
                        .iter()
                        .filter_map(|&id| Some((id, buffers[id.0].buffer.as_ref()?))),
                );
                for (other, other_view) in others {
                    let writes = bindings.written[slot.0] || bindings.written[other.0];
                    if used(other) && writes && view.overlaps(other_view) {
                        let what = if bindings.buffers.contains(&other) {
                            "buffer"
                        } else {
                            "slot"
                        };
                        return Err(Error::InvalidBinding {
                            slot: buffers[slot.0].name.clone(),
                            reason: format!(
                                "it shares bytes with {what} `{}` of the plan, and one of the \
                                 two is written; the plan orders them as different memory, so \
                                 bind them to disjoint bytes",
                                buffers[other.0].name
                            ),
                        });
                    }
                }
            }
            // A new epoch; the runs of the old one may be in flight.
            let old = std::mem::replace(
                &mut bindings.current,
                Epoch {
                    views,
                    last_run: None,
                },
            );
            if old.last_run.is_some() {
                bindings.history.push_back(old);
            }
            bindings
                .history
                .retain(|epoch| epoch.last_run.is_some_and(|run| !settled(&facts, run)));
            let current = &bindings.current.views;
            let written = &bindings.written;
            bindings.barrier = bindings
                .history
                .iter()
                .filter(|epoch| {
                    current.iter().any(|(slot, view)| {
                        epoch.views.iter().any(|(other, old)| {
                            other != slot
                                && (written[slot.0] || written[other.0])
                                && view.overlaps(old)
                        })
                    })
                })
                .filter_map(|epoch| epoch.last_run)
                .max();
            bindings.changed = false;
        }
        // Only the first run of an epoch waits: the later ones follow it
        // on every queue.
        let barrier = bindings.barrier.take().filter(|run| !settled(&facts, *run));
        Ok(barrier)
    }

    /// Notes that run `run` used the current bindings.
    pub(super) fn bindings_used(&mut self, run: u64) {
        self.bindings.current.last_run = Some(run);
    }
}

/// Whether run `run` ended on every queue: completed, or failed.
fn settled<B: Backend>(facts: &PlanFacts<B>, run: u64) -> bool {
    facts.signals.iter().enumerate().all(|(queue, signal)| {
        !matches!(
            signal.wait((run + 1) * facts.counts[queue], std::time::Duration::ZERO),
            Err(Error::Timeout { .. })
        )
    })
}
