//! Repeating a batch's recorded graphs without recording them again
//! (issue 45), beside `super::replay`, which records them.
//!
//! **Templates.** Each batch marked with a key gets a [`Template`]: the
//! graphs its segments launched, in order, and the views its kernels took.
//! Once it is enqueued whole, with every segment of two or more kernels a
//! graph, a later batch under the key may name those graphs by index
//! ([`Command::Replay`], after
//! [`HardwareQueue::replay_recorded`](crate::HardwareQueue::replay_recorded)
//! said they match): a plan's run with unchanged bindings records a command
//! per graph, not an `exec` per kernel, and nothing is matched.
//!
//! **Order.** A batch under the key that records `exec`s again replaces
//! the template at its `submit`, not when it is enqueued, so
//! `replay_recorded` never offers the graphs of a batch older than the
//! key's last: while that one waits at the worker, it offers none. A
//! repeat is enqueued before any later batch that patches its graphs (the
//! queue enqueues in order), and a launch keeps the values it was made
//! with.
//!
//! **Lifetimes.** A repeating batch holds nothing the stream uses, so it
//! needs no completion event of its own (`Shared::finish`): its template is
//! the key's until a later batch replaces it (or makes room: at most
//! [`GRAPHS`] keys), and that batch keeps it until the stream passed it,
//! and so every repeat of it ahead in the queue (`Mark::Record`); a batch
//! that never runs keeps it behind an event of its own (`Shared::hold`).
//!
//! **Queue-ordered memory.** A template whose batch named a buffer
//! `alloca` made is not repeated: a repeat takes no use of the buffers it
//! runs over, so such a batch's kernels are recorded every time, each
//! taking its use (and meeting `UseAfterDealloca` where it must).

use std::sync::Arc;

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::queue::{Batch, Command};
use crate::sync::{Mutex, Ordering};
use crate::view::View;

use super::Cuda;
use super::replay::{Executable, GRAPHS};
use super::stream::Shared;

/// What a batch marked for replay recorded: the graphs its segments
/// launched, in order, for later batches under its key to launch again.
/// Made at the batch's `submit`, filled as it is enqueued.
pub(super) struct Template {
    key: u32,
    state: Mutex<Recorded>,
}

impl Template {
    /// A segment of the batch launched plainly: nothing to repeat.
    pub(super) fn broken(&self) {
        self.state.lock().broken = true;
    }

    /// The batch's next segment launched `made`, a graph of `kernels`
    /// kernels.
    pub(super) fn push(&self, made: Arc<Executable>, kernels: u32) {
        self.state.lock().programs.push((made, kernels));
    }

    /// The batch it records is enqueued whole: unless a segment launched
    /// plainly, later batches under the key may repeat its graphs, over
    /// its views (kept here).
    pub(super) fn finish(&self, batch: &Batch<Cuda>) {
        let mut state = self.state.lock();
        let ordered = (batch.buffers().iter()).any(|view| view.buffer().queue_ordered().is_some());
        if !state.broken && !ordered {
            state.views.extend_from_slice(batch.buffers());
            state.done = true;
        }
    }
}

#[derive(Default)]
struct Recorded {
    /// Each segment's graph and how many kernels it runs, in batch order.
    programs: Vec<(Arc<Executable>, u32)>,
    /// The views the batch's kernels took: a repeat runs over them.
    views: Vec<View<Cuda>>,
    /// The whole batch is enqueued.
    done: bool,
    /// A segment launched plainly, or the batch failed: nothing to repeat.
    broken: bool,
}

/// How a batch goes on the stream, as its `submit` marked it.
#[derive(Clone, Default)]
pub(super) enum Mark {
    /// Command by command.
    #[default]
    Plain,
    /// Its segments launch as graphs under the key, into the template;
    /// with the key's template before it (or one it made room for), which
    /// it keeps until the stream passed it (and with it every batch that
    /// repeated that template's graphs: they are ahead in the queue).
    Record(u32, Arc<Template>, Option<Arc<Template>>),
    /// Its [`Command::Replay`]s launch the template's graphs. It holds
    /// nothing the stream uses: the template stays the key's, or a later
    /// batch's to keep (`Record`), until the stream passed this one.
    Repeat(Arc<Template>),
}

impl Mark {
    /// What a batch of this mark keeps until the stream passed it.
    pub(super) fn held(self) -> Option<Arc<Template>> {
        match self {
            Mark::Record(_, _, previous) => previous,
            Mark::Plain | Mark::Repeat(_) => None,
        }
    }
}

impl Shared {
    /// Launches graph `index` of the template a repeated batch holds
    /// (`Command::Replay`); an error fails the batch there.
    pub(super) fn repeat(&self, mark: &Mark, index: u32) -> Result<()> {
        let Mark::Repeat(template) = mark else {
            return Err(Error::ReplayNotRecorded { index, recorded: 0 });
        };
        let made = {
            let state = template.state.lock();
            match state.programs.get(index as usize) {
                Some((made, _)) => made.clone(),
                None => {
                    return Err(Error::ReplayNotRecorded {
                        index,
                        recorded: u32::try_from(state.programs.len()).unwrap_or(u32::MAX),
                    });
                }
            }
        };
        // Counted before the signals after it are recorded.
        self.programs.fetch_add(1, Ordering::Relaxed);
        self.repeats.fetch_add(1, Ordering::Relaxed);
        self.launch_graph(&made)
    }

    /// The mark of a batch `submit` takes under `key`: a repeat of the
    /// template `replay_recorded` found where the batch names its graphs,
    /// else a new template for the key, replacing the one before (so no
    /// later repeat launches graphs this batch may patch).
    pub(super) fn mark(&self, key: u32, batch: &Batch<Cuda>) -> Mark {
        let mut replays = self.replays.lock();
        if let Some(next) = replays.next.take()
            && next.key == key
            && batch
                .commands()
                .iter()
                .any(|command| matches!(command, Command::Replay { .. }))
        {
            return Mark::Repeat(next);
        }
        let template = Arc::new(Template {
            key,
            state: Mutex::new(Recorded::default()),
        });
        let templates = &mut replays.templates;
        let previous = match templates.iter().position(|other| other.key == key) {
            Some(at) => Some(templates.remove(at)),
            None if templates.len() >= GRAPHS => Some(templates.remove(0)),
            None => None,
        };
        templates.push(template.clone());
        Mark::Record(key, template, previous)
    }

    /// Whether `key`'s template is whole, its graphs running `kernels`
    /// kernels each in order: then it is kept for the next batch submitted.
    pub(super) fn recorded(&self, key: u32, kernels: &[u32]) -> bool {
        let mut replays = self.replays.lock();
        let Some(template) = replays.templates.iter().find(|t| t.key == key).cloned() else {
            return false;
        };
        let matches = {
            let state = template.state.lock();
            state.done
                && !state.broken
                && state.programs.len() == kernels.len()
                && state
                    .programs
                    .iter()
                    .zip(kernels)
                    .all(|((_, count), kernels)| count == kernels)
        };
        // Kept for the next batch, or none kept: never another key's.
        replays.next = matches.then_some(template);
        matches
    }

    /// How many graphs the template kept for the batch being recorded has.
    pub(super) fn kept(&self) -> u32 {
        self.replays.lock().next.as_ref().map_or(0, |template| {
            u32::try_from(template.state.lock().programs.len()).unwrap_or(u32::MAX)
        })
    }
}
