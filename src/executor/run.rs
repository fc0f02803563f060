//! One run of a plan: wait for it, or ask whether it finished.

use std::time::Instant;

use super::ordering::*;
use super::*;

/// One run of a plan: wait for it, or ask whether it finished.
pub struct Run<B: Backend> {
    pub(super) run: u64,
    pub(super) facts: Arc<PlanFacts>,
    pub(super) timelines: std::sync::Arc<Timelines<B>>,
}

impl<B: Backend> Run<B> {
    pub(super) fn target(&self, queue: usize) -> u64 {
        self.facts.end(&self.timelines, queue)
    }

    fn signals(&self) -> &[B::Signal] {
        &self.timelines.signals
    }

    /// Whether every operation of the run completed. Never blocks.
    pub fn is_complete(&self) -> bool {
        (0..self.signals().len()).all(|q| self.signals()[q].is_reached(self.target(q)))
    }

    /// Blocks until the run completed.
    ///
    /// # Errors
    /// [`Error::OperationFailed`] naming the operation that failed;
    /// [`Error::Timeout`] when `timeout` passes first.
    pub fn wait(&self, timeout: impl Into<Timeout>) -> Result<()> {
        let timeout = timeout.into();
        let start = Instant::now();
        let deadline = timeout.deadline_from(start);
        for queue in 0..self.signals().len() {
            let remaining = match deadline {
                Some(deadline) => {
                    Timeout::After(deadline.saturating_duration_since(Instant::now()))
                }
                None => Timeout::Forever,
            };
            match self.signals()[queue].wait(self.target(queue), remaining) {
                Ok(()) => {}
                Err(error @ Error::Timeout { .. }) => return Err(error),
                Err(error) => {
                    // Let every queue of the run settle (complete or fail:
                    // failures propagate, so this ends), so the next run
                    // finds each failure reported and starts clean.
                    for other in 0..self.signals().len() {
                        let _ = self.signals()[other].wait(self.target(other), remaining);
                    }
                    return Err(self.explain(error));
                }
            }
        }
        Ok(())
    }

    /// Names the operation behind a failure: the first unfinished operation
    /// whose own waits were met (it failed itself, rather than waiting on a
    /// failure), preferring one whose kernel the error names.
    fn explain(&self, error: Error) -> Error {
        let facts = &*self.facts;
        let timelines = &*self.timelines;
        let root = error.root_cause().clone();
        let failed_program = match &root {
            Error::KernelFailed { program, .. } => Some(program.clone()),
            _ => None,
        };
        let mut culprits = Vec::new();
        // Kernels after a culprit on its queue with no wait within the run
        // between: a repeated run of kernels sets only its last value
        // (`replay.rs`), so the one that failed may be any of them.
        let mut behind = Vec::new();
        for (queue, signal) in timelines.signals.iter().enumerate() {
            // In queue order: a queue's values rise in program order.
            let mut unfinished = facts.ops.iter().filter(|op| {
                op.queue == queue && !signal.is_reached(facts.value(timelines, queue, op.value))
            });
            if let Some(op) = unfinished.next() {
                // Its waits within the run were met (a wait on the run
                // before is settled: that run's failure is not this one's).
                let waits_met = op.waits.iter().filter(|w| !w.previous_run).all(|w| {
                    timelines.signals[w.queue].is_reached(facts.value(timelines, w.queue, w.value))
                });
                if waits_met {
                    culprits.push(op);
                    behind.extend(unfinished.take_while(|op| {
                        op.program.is_some() && op.waits.iter().all(|w| w.previous_run)
                    }));
                }
            }
        }
        let named = |op: &&&PlannedOp| failed_program.is_some() && op.program == failed_program;
        let culprit = (culprits.iter().find(named))
            .or_else(|| behind.iter().find(named))
            .or(culprits.first());
        match culprit {
            Some(op) => Error::OperationFailed {
                operation: op.name.clone(),
                cause: std::sync::Arc::new(root),
            },
            None => error,
        }
    }
}

impl<B: Backend> fmt::Debug for Run<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("run", &self.run)
            .field("complete", &self.is_complete())
            .finish()
    }
}
