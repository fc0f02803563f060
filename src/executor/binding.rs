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
//!   still in flight (the last run's output bound as this run's input), or
//!   that the same slot used at other offsets (rebound to overlapping,
//!   shifted bytes): the back-to-back waits order a slot only with itself,
//!   by its own offsets. The first run with such bindings waits, on every
//!   queue, for that run to finish; other rebindings add no wait.
//!
//! A run in flight keeps the buffers it was recorded with, so binding
//! while it runs is safe.

use super::ordering::same_bytes;
use super::plan::Plan;
use super::schedule::*;
use super::*;
use crate::view::AsView;

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
    /// Binding the view a slot holds already changes nothing: a run after
    /// it may still repeat what the last run recorded (see
    /// [`launches`](Self::launches)), so binding every slot before every
    /// run costs nothing more.
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
        // The view bound already: nothing changes (a caller binding its
        // buffers before every run keeps the run's recording).
        if let Some(current) = &target.buffer
            && crate::buffer::Buffer::same_as(current.buffer(), buffer)
            && current.offset() == offset
        {
            return Ok(());
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
        self.edits += 1;
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
        // By bits, not `==`: -0.0 is another value than 0.0 to a kernel,
        // and the same NaN set again is no change.
        if self.scalar_values[slot.0].to_ne_bytes() != value.to_ne_bytes() {
            self.scalar_values[slot.0] = value;
            self.edits += 1;
        }
        Ok(())
    }

    /// Before a run: every slot bound, no bindings sharing bytes the plan
    /// writes, and the run to wait for where a binding takes bytes another
    /// slot used in a run still in flight. Returns that run.
    pub(super) fn check_bindings(&mut self) -> Result<Option<u64>> {
        let (facts, in_flight) = (&*self.facts, &self.in_flight);
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
            let fixed = bindings
                .buffers
                .iter()
                .filter_map(|&id| Some((id, buffers[id.0].buffer.as_ref()?)));
            for (index, (slot, view)) in views.iter().enumerate() {
                let others = views[index + 1..].iter().map(|(id, v)| (*id, v));
                if let Some((other, _)) = others
                    .chain(fixed.clone())
                    .find(|&other| bindings.clash((*slot, view), other))
                {
                    let what = match buffers[other.0].origin {
                        Origin::Slot => "slot",
                        Origin::Buffer | Origin::Tensor => "buffer",
                    };
                    return Err(Error::InvalidBinding {
                        slot: buffers[slot.0].name.clone(),
                        reason: format!(
                            "it shares bytes with {what} `{}` of the plan, and one of the two \
                             is written; the plan orders them as different memory, so bind \
                             them to disjoint bytes",
                            buffers[other.0].name
                        ),
                    });
                }
            }
            // A new epoch; the runs of the old one may be in flight.
            if let (old, Some(last_run)) = std::mem::replace(&mut bindings.current, (views, None)) {
                bindings.history.push_back((old, last_run));
            }
        }
        // Bindings whose runs settled order nothing: let the caller's
        // buffers go, every run (not only at the next rebinding, which
        // may never come).
        bindings
            .history
            .retain(|(_, run)| in_flight.in_flight(facts, *run));
        if bindings.changed {
            let current = &bindings.current.0;
            bindings.barrier = bindings
                .history
                .iter()
                .filter(|(old, _)| {
                    current.iter().any(|(slot, view)| {
                        old.iter().any(|(other, was)| {
                            // A slot bound to the very bytes it had is
                            // ordered by the back-to-back waits, which
                            // compare the slot's offsets; bound to other
                            // bytes that overlap them (shifted), those
                            // offsets no longer name the same bytes.
                            let same = other == slot && same_bytes(view, was);
                            !same && bindings.clash((*slot, view), (*other, was))
                        })
                    })
                })
                .map(|(_, run)| *run)
                .max();
            bindings.changed = false;
        }
        Ok(bindings
            .barrier
            .filter(|run| in_flight.in_flight(facts, *run)))
    }

    /// Notes that run `run` used the current bindings. Only the first run
    /// of an epoch waits for the barrier: the later ones follow it on
    /// every queue.
    pub(super) fn bindings_used(&mut self, run: u64) {
        self.bindings.current.1 = Some(run);
        self.bindings.barrier = None;
    }
}
