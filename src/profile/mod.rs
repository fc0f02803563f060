//! Profiling: what each command of a queue did and when, on one host
//! timeline, and kernel timing for tuners.
//!
//! Off by default, per queue ([`HardwareQueue::set_profiling`]). When off,
//! recording a command costs exactly what it did before (the dispatch
//! instruction counts of `benches/callgrind.sh` are unchanged) and the
//! engines test one flag per batch. When on:
//!
//! - every command's start and end **on the device** is kept: the CPU
//!   worker takes one timestamp per command, at its end (which is the next
//!   command's start: a batch's commands run back to back), from the
//!   time-stamp counter where it is invariant, mapped onto the host clock
//!   read when the batch starts and ends (see `clock.rs`), and names
//!   events with process-wide interned names ([`Name`]), so an event
//!   allocates nothing and counts no reference; CUDA records a
//!   pair of timing events around it on the stream (not the signal ring's
//!   events, which keep timing off) and reads them with
//!   `cuEventElapsedTime` against a reference event whose host time was
//!   taken when profiling was turned on;
//! - a `wait` is an event of its own (category [`Category::Wait`]): how
//!   long the queue stood blocked, and on which value;
//! - the host's `submit` and `synchronize` on the queue are events too
//!   ([`Category::Host`]).
//!
//! [`HardwareQueue::take_profile`] hands over the events of the work that
//! completed, and [`chrome_trace`] writes them as Chrome trace event JSON,
//! which Perfetto (<https://ui.perfetto.dev>) and `chrome://tracing` open:
//! one track per queue, plus one per queue for the host's calls.
//!
//! All times are nanoseconds since the process's first call to [`now_ns`]
//! (its *epoch*).

mod clock;
mod name;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::params::ExecParams;
use crate::program::Program;
use crate::program::Scalar;
use crate::queue::{Command, HardwareQueue};
use crate::signal::{Producer, TimelineSignal};
use crate::{BufferOf, ProgramOf};

pub(crate) use clock::BatchClock;
pub use name::Name;

/// The instant all profile times count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Now, on hwqueue's host timeline: nanoseconds since the epoch.
#[inline]
pub fn now_ns() -> u64 {
    let since = Instant::now().saturating_duration_since(epoch());
    // In `u64` (no `u128` product): exact for 584 years.
    since
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(since.subsec_nanos()))
}

/// A `wait`'s or `signal`'s detail: which signal (an id stable across its
/// clones, and the queue that produces it) and the value.
pub(crate) fn signal_detail(producer: &Producer, relation: &str, value: u64) -> String {
    let id = std::ptr::from_ref(producer) as usize;
    match producer.queue() {
        Some(queue) => format!("signal {id:#x} (produced by {queue}) {relation} {value}"),
        None => format!("signal {id:#x} {relation} {value}"),
    }
}

/// Moves `events` to the end of `out`: by handing the vector over when
/// `out` is empty (the usual case: a queue's events taken since the last
/// take), so a batch's events are not copied once more on their way out.
pub(crate) fn move_events(out: &mut Vec<ProfileEvent>, events: &mut Vec<ProfileEvent>) {
    if out.is_empty() {
        std::mem::swap(out, events);
    } else {
        out.append(events);
    }
}

/// The names an engine's events use, at hand: [`Name::new`] takes a
/// process-wide lock, so an engine keeps the names it met (at most
/// [`MAX`](Self::MAX); past that, each further event interns its name
/// anew) and hands out copies, which cost no allocation and no atomic
/// operation.
#[derive(Debug, Default)]
pub struct EventNames {
    /// The last name handed out: a batch of one kernel's `exec`s finds it
    /// first.
    last: Option<Name>,
    names: HashSet<Name>,
}

impl EventNames {
    /// The most names kept.
    pub const MAX: usize = 256;

    /// No name yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `name`, interned.
    pub fn get(&mut self, name: &str) -> Name {
        if let Some(last) = &self.last
            && **last == *name
        {
            return last.clone();
        }
        let interned = match self.names.get(name) {
            Some(known) => known.clone(),
            None => {
                let new = Name::new(name);
                if self.names.len() < Self::MAX {
                    self.names.insert(new.clone());
                }
                new
            }
        };
        self.last = Some(interned.clone());
        interned
    }
}

/// A command as a profile event names it: one description for every
/// backend ([`describe`]). An engine that profiles describes each command
/// it runs, times it, and makes the event with
/// [`into_event`](Self::into_event).
#[derive(Debug, Clone)]
pub struct Described {
    /// The kernel's for an `exec`, else the command's.
    pub name: Name,
    /// What kind of work it is.
    pub category: Category,
    /// What it touched (`4096 bytes`, `signal 0x.. = 3`).
    pub detail: String,
    /// An `exec`'s sizes, formatted only when a trace is written.
    pub params: Option<ExecParams>,
}

impl Described {
    /// The command's event: command `index` of batch `batch` (its
    /// [`Batch::sequence`](crate::queue::Batch::sequence)) of `queue` (its
    /// [`queue_label`](crate::queue::queue_label)), from `start_ns` to
    /// `end_ns` on the [`now_ns`] timeline (never before `start_ns`).
    pub fn into_event(
        self,
        queue: Name,
        batch: u64,
        index: usize,
        start_ns: u64,
        end_ns: u64,
    ) -> ProfileEvent {
        ProfileEvent {
            name: self.name,
            category: self.category,
            queue,
            batch,
            index,
            start_ns,
            end_ns: end_ns.max(start_ns),
            detail: self.detail,
            params: self.params,
        }
    }
}

/// How a profile event names and describes `command`, its name interned
/// in `names`. Only a `wait`'s, a `signal`'s and a transfer's detail is
/// formatted (an `exec` allocates nothing once its kernel's name is
/// interned).
pub fn describe<B: crate::Backend>(command: &Command<B>, names: &mut EventNames) -> Described {
    let (name, category, detail, params): (&str, _, _, _) = match command {
        Command::Wait { signal, value } => (
            "wait",
            Category::Wait,
            signal_detail(signal.producer(), ">=", *value),
            None,
        ),
        Command::WaitSettled { signal, value } => (
            "wait_settled",
            Category::Wait,
            signal_detail(signal.producer(), ">=", *value),
            None,
        ),
        Command::WaitForeign { value, .. } => (
            "wait_foreign",
            Category::Wait,
            format!("another backend's signal >= {value}"),
            None,
        ),
        Command::Signal { signal, value } => (
            "signal",
            Category::Signal,
            signal_detail(signal.producer(), "=", *value),
            None,
        ),
        Command::Exec {
            program, params, ..
        } => (
            program.name(),
            Category::Kernel,
            String::new(),
            Some(*params),
        ),
        Command::Copy { src, .. } => ("copy", Category::Copy, format!("{} bytes", src.len()), None),
        Command::Fill { dst, width, .. } => (
            "fill",
            Category::Copy,
            format!("{} bytes, {width}-byte pattern", dst.len()),
            None,
        ),
        Command::Upload { dst, .. } => (
            "upload",
            Category::Copy,
            format!("{} bytes", dst.len()),
            None,
        ),
        Command::Download { src, .. } => (
            "download",
            Category::Copy,
            format!("{} bytes", src.len()),
            None,
        ),
        Command::Collective(collective) => (
            collective.op.name(),
            Category::Collective,
            collective.describe(),
            None,
        ),
        Command::Barrier => ("barrier", Category::Barrier, String::new(), None),
        Command::Replay { index } => (
            "replay",
            Category::Kernel,
            format!("device program {index}"),
            None,
        ),
        Command::Alloca { buffer } => (
            "alloca",
            Category::Memory,
            format!("{} bytes", crate::Buffer::size(buffer)),
            None,
        ),
        Command::Dealloca { buffer } => (
            "dealloca",
            Category::Memory,
            format!("{} bytes", crate::Buffer::size(buffer)),
            None,
        ),
    };
    Described {
        name: names.get(name),
        category,
        detail,
        params,
    }
}

/// What kind of work an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// An `exec`; the event's name is the kernel's.
    Kernel,
    /// A `copy`, `fill`, `upload` or `download`.
    Copy,
    /// A `signal`.
    Signal,
    /// A `memory_barrier`.
    Barrier,
    /// An `alloca` or `dealloca`.
    Memory,
    /// A `wait` or `wait_foreign`: the queue stood blocked.
    Wait,
    /// A collective (`all_reduce`, ...): the queue moved data between ranks.
    Collective,
    /// A host call on the queue: `submit`, `synchronize`.
    Host,
}

impl Category {
    /// Its name in a trace.
    pub const fn name(self) -> &'static str {
        match self {
            Category::Kernel => "kernel",
            Category::Copy => "copy",
            Category::Signal => "signal",
            Category::Barrier => "barrier",
            Category::Memory => "memory",
            Category::Wait => "wait",
            Category::Collective => "collective",
            Category::Host => "host",
        }
    }
}

/// One command's (or host call's) span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileEvent {
    /// The kernel's name for an `exec`; the command's or call's name
    /// otherwise (`copy`, `signal`, `barrier`, `wait`, `submit`, …).
    /// Interned ([`Name`]): the events of one kernel share one.
    pub name: Name,
    /// What kind of work it is.
    pub category: Category,
    /// The queue it ran on: its id as errors name it and its kind
    /// (`queue #3 (compute)`), or its label in a [`Plan`](crate::Plan)
    /// (`cpu:0 compute`). Interned, like the name.
    pub queue: Name,
    /// The batch: the queue's `submit` count when it was submitted (1 for
    /// the first batch). Host events carry the batch they submitted, or 0.
    pub batch: u64,
    /// The command's index in its batch (host events: 0).
    pub index: usize,
    /// When it started, on the host timeline ([`now_ns`]).
    pub start_ns: u64,
    /// When it ended (`>= start_ns`).
    pub end_ns: u64,
    /// More about it: for a wait or a signal, which signal (an id, and
    /// the queue that produces it) and the value; why it failed, if it did.
    pub detail: String,
    /// An `exec`'s work sizes (`None` for other commands).
    pub params: Option<ExecParams>,
}

impl ProfileEvent {
    /// How long it took.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(self.start_ns))
    }
}

/// The events as Chrome trace event JSON (the "JSON object format": a
/// `traceEvents` array of complete events, `"ph": "X"`, times in
/// microseconds), one track (`tid`) per queue and one per queue's host
/// calls, each named by a metadata event. Perfetto and `chrome://tracing`
/// open it.
pub fn chrome_trace(events: &[ProfileEvent]) -> String {
    let mut tracks: Vec<String> = Vec::new();
    let mut track_of = |name: String| match tracks.iter().position(|track| *track == name) {
        Some(index) => index + 1,
        None => {
            tracks.push(name);
            tracks.len()
        }
    };
    let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
    let mut first = true;
    for event in events {
        let track = if event.category == Category::Host {
            format!("{} (host)", event.queue)
        } else {
            event.queue.to_string()
        };
        let tid = track_of(track);
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(
            out,
            "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"pid\":1,\"tid\":{tid},\"ts\":{},\"dur\":{},\
             \"args\":{{\"batch\":{},\"index\":{},\"detail\":{}",
            json_string(&event.name),
            event.category.name(),
            micros(event.start_ns),
            micros(event.end_ns.saturating_sub(event.start_ns)),
            event.batch,
            event.index,
            json_string(&event.detail),
        );
        if let Some(params) = &event.params {
            let _ = write!(out, ",\"params\":{}", json_string(&params.to_string()));
        }
        out.push_str("}}");
    }
    for (index, track) in tracks.iter().enumerate() {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":{}}}}}",
            index + 1,
            json_string(track)
        );
    }
    out.push_str("]}\n");
    out
}

/// Nanoseconds as microseconds with three decimals.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What [`time_exec`] measured: one device-side duration per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTiming {
    /// The runs' durations, in run order.
    pub samples: Vec<Duration>,
}

impl KernelTiming {
    /// The shortest run.
    pub fn min(&self) -> Duration {
        self.samples.iter().copied().min().unwrap_or_default()
    }

    /// The median run (the lower middle one for an even count).
    pub fn median(&self) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        sorted
            .get(sorted.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default()
    }
}

/// Runs one `exec` `warmup` times, then `runs` times, on `queue`, and
/// returns the `runs` device-measured durations: what a tuner compares
/// kernel variants by. Works on every backend, and through the `Any*`
/// enums. The queue's profiling is turned on for the measurement and back
/// to what it was after; events of the queue's earlier work that were not
/// taken yet are dropped.
///
/// # Errors
/// [`Error::InvalidArguments`] for `runs == 0`; whatever `submit` or
/// `synchronize` reports (the exec's own errors included).
pub fn time_exec<Q: HardwareQueue>(
    queue: &mut Q,
    program: &ProgramOf<Q::Backend>,
    buffers: &[&BufferOf<Q::Backend>],
    scalars: &[Scalar],
    params: ExecParams,
    warmup: usize,
    runs: usize,
) -> Result<KernelTiming> {
    if runs == 0 {
        return Err(Error::InvalidArguments {
            program: program.name().to_owned(),
            reason: "time_exec needs at least one run; ask for runs >= 1".into(),
        });
    }
    let was_on = queue.profiling();
    queue.synchronize()?;
    queue.set_profiling(true);
    let _ = queue.take_profile();
    let outcome = (|| {
        for _ in 0..warmup {
            queue.exec(program, buffers, scalars, params);
        }
        queue.submit()?;
        queue.synchronize()?;
        let _ = queue.take_profile();
        for _ in 0..runs {
            queue.exec(program, buffers, scalars, params);
        }
        queue.submit()?;
        queue.synchronize()?;
        let samples: Vec<Duration> = queue
            .take_profile()
            .iter()
            .filter(|event| event.category == Category::Kernel)
            .map(ProfileEvent::duration)
            .collect();
        if samples.len() != runs {
            return Err(Error::System {
                what: "timing a kernel",
                detail: format!(
                    "the queue reported {} of {runs} runs: its backend does not time its \
                     commands (profiling is implemented by the CPU and CUDA backends)",
                    samples.len()
                ),
            });
        }
        Ok(KernelTiming { samples })
    })();
    queue.set_profiling(was_on);
    outcome
}
