//! `CpuSignal` against a running max and failed ranges.

use std::time::Duration;

use hwqueue::cpu::CpuSignal;
use hwqueue::{Error, MAX_SIGNAL_VALUE, TimelineSignal, Timeout};

use crate::MUST_FINISH;
use crate::reader::Reader;

/// One operation on a `CpuSignal`, for [`check_signal_ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// `set(v)`.
    Set(u64),
    /// `wait(v, ..)`: a zero timeout where the model says it would block,
    /// a bounded one otherwise (so a wrong implementation fails, not hangs).
    Wait(u64),
    /// `is_reached(v)`.
    IsReached(u64),
    /// `value()`.
    Value,
    /// `fail(upto, cause)`, with a cause numbered by its position.
    Fail(u64),
    /// `wait` on a target past [`MAX_SIGNAL_VALUE`].
    WaitPastTheRange,
}

/// The reference model of a timeline signal: a running max, and the
/// failures recorded while they were above it.
#[derive(Debug, Default)]
pub(crate) struct SignalModel {
    pub(crate) value: u64,
    /// `(above, upto, cause)`: values in `above + 1 ..= upto` failed, in
    /// the order recorded. The narrowest `upto` covering a target names its
    /// cause, the first recorded among equal ones.
    pub(crate) failures: Vec<(u64, u64, usize)>,
}

/// What a non-blocking wait returns, per the model.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Reached,
    Failed { current: u64, cause: usize },
    Timeout { current: u64 },
    OutOfRange,
}

impl SignalModel {
    pub(crate) fn set(&mut self, value: u64) {
        self.value = self.value.max(value);
    }

    /// A failure of the values up to `upto` that are not reached.
    pub(crate) fn fail(&mut self, upto: u64, cause: usize) {
        self.fail_above(self.value, upto, cause);
    }

    /// A failure of the values in `above + 1 ..= upto` (`above` at least
    /// the value): what a ring records when recorded work stands for the
    /// values up to `above`.
    pub(crate) fn fail_above(&mut self, above: u64, upto: u64, cause: usize) {
        let covered = self
            .failures
            .iter()
            .any(|(a, u, _)| *u == upto && *a <= above);
        if upto > above && !covered {
            self.failures.push((above, upto, cause));
        }
    }

    pub(crate) fn wait(&self, target: u64) -> WaitOutcome {
        if target <= self.value {
            return WaitOutcome::Reached;
        }
        if target > MAX_SIGNAL_VALUE {
            return WaitOutcome::OutOfRange;
        }
        // The cause of the narrowest failure covering the target.
        match self
            .failures
            .iter()
            .filter(|(above, upto, _)| *above < target && target <= *upto)
            .min_by_key(|(_, upto, _)| *upto)
        {
            Some(&(_, _, cause)) => WaitOutcome::Failed {
                current: self.value,
                cause,
            },
            None => WaitOutcome::Timeout {
                current: self.value,
            },
        }
    }
}

/// A numbered cause of failure, as the model names it.
pub(crate) fn cause(id: usize) -> Error {
    Error::KernelFailed {
        program: "model".into(),
        message: format!("cause {id}"),
    }
}

pub(crate) fn observed_wait(result: hwqueue::Result<()>) -> WaitOutcome {
    match result {
        Ok(()) => WaitOutcome::Reached,
        Err(Error::SignalFailed { current, cause, .. }) => match &*cause {
            Error::KernelFailed { message, .. } => WaitOutcome::Failed {
                current,
                cause: message
                    .strip_prefix("cause ")
                    .and_then(|id| id.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected cause {message:?}")),
            },
            other => panic!("unexpected cause {other:?}"),
        },
        Err(Error::Timeout { current, .. }) => WaitOutcome::Timeout { current },
        Err(Error::SignalValueOutOfRange { .. }) => WaitOutcome::OutOfRange,
        Err(other) => panic!("unexpected wait error {other:?}"),
    }
}

/// Runs `ops` on a new `CpuSignal` at `initial` and on the model, comparing
/// every result.
///
/// # Panics
/// On the first difference, naming the step.
pub fn check_signal_ops(initial: u64, ops: &[SignalOp]) {
    let signal = CpuSignal::new(initial);
    let mut model = SignalModel {
        value: initial,
        ..SignalModel::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let context = || format!("step {step} ({op:?}) of {ops:?} from {initial}");
        match *op {
            SignalOp::Set(value) => {
                signal.set(value);
                model.set(value);
                assert_eq!(signal.value(), model.value, "{}", context());
            }
            SignalOp::Wait(target) => {
                let expected = model.wait(target);
                let timeout = match expected {
                    WaitOutcome::Timeout { .. } => Duration::ZERO,
                    _ => MUST_FINISH,
                };
                let observed = observed_wait(signal.wait(target, timeout));
                assert_eq!(observed, expected, "{}", context());
            }
            SignalOp::IsReached(target) => {
                assert_eq!(
                    signal.is_reached(target),
                    target <= model.value,
                    "{}",
                    context()
                );
            }
            SignalOp::Value => assert_eq!(signal.value(), model.value, "{}", context()),
            SignalOp::Fail(upto) => {
                signal.fail(upto, cause(step));
                model.fail(upto, step);
                assert_eq!(signal.value(), model.value, "{}", context());
            }
            SignalOp::WaitPastTheRange => {
                let observed = observed_wait(signal.wait(MAX_SIGNAL_VALUE + 1, Timeout::Forever));
                assert_eq!(observed, WaitOutcome::OutOfRange, "{}", context());
            }
        }
    }
    // Every value the model knows about answers as it says.
    let mut probes: Vec<u64> = ops
        .iter()
        .filter_map(|op| match *op {
            SignalOp::Set(v) | SignalOp::Wait(v) | SignalOp::IsReached(v) | SignalOp::Fail(v) => {
                Some(v)
            }
            _ => None,
        })
        .flat_map(|v| [v, v.saturating_add(1)])
        .filter(|v| *v <= MAX_SIGNAL_VALUE)
        .collect();
    probes.extend([0, initial, model.value.saturating_add(1)]);
    for target in probes {
        let observed = observed_wait(signal.wait(target, Duration::ZERO));
        assert_eq!(
            observed,
            model.wait(target),
            "final probe {target} of {ops:?}"
        );
    }
}

/// Decodes a signal program from `data` and runs [`check_signal_ops`].
/// Values are small, so sets, waits and failures collide.
///
/// # Panics
/// On a difference from the model.
pub fn cpu_signal(data: &[u8]) {
    let mut reader = Reader { data };
    let initial = u64::from(reader.byte() % 8);
    let mut ops = Vec::new();
    while !reader.is_empty() && ops.len() < 64 {
        let tag = reader.byte();
        let value = u64::from(reader.byte() % 24);
        ops.push(match tag % 6 {
            0 | 1 => SignalOp::Set(value),
            2 => SignalOp::Wait(value),
            3 => SignalOp::IsReached(value),
            4 => SignalOp::Fail(value),
            _ if tag & 0x80 != 0 => SignalOp::WaitPastTheRange,
            _ => SignalOp::Value,
        });
    }
    check_signal_ops(initial, &ops);
}
