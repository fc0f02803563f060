//! Plan replay on CUDA (issue 45): the kernel launches of a batch marked
//! for replay ([`HardwareQueue::replay_as`](crate::HardwareQueue::replay_as))
//! become CUDA graphs, built once and launched for every later batch under
//! the same key whose launches match.
//!
//! **What is recorded.** Each run of two or more `exec`s with nothing
//! between them but memory barriers and signals (a *segment*: a plan
//! signals its queue's timeline after every operation) becomes one graph: a
//! chain of kernel nodes, each after the one before it, as the stream would
//! have run them, made with the explicit node API (`cuGraphAddKernelNode`)
//! so that every node's handle is known, and instantiated once. The
//! segment's signals are recorded after the graph's launch, each signal
//! once, at the highest value the segment gives it: a value is reached when
//! the whole segment has run (later than kernel by kernel, never earlier),
//! and a wait on a lower one waits for that record, the smallest at or
//! above it. Everything else in the batch stays on the stream around the
//! graph's launch: waits (`cuStreamWaitEvent`, or the worker's host wait),
//! copies, fills, uploads and downloads (their page-locked staging is new
//! each run). So a run's signals and waits keep their meaning, with nothing
//! in the graph to update for them.
//!
//! **Matching.** A segment is found again by its key and the index of its
//! first command in the batch, and matches where its kernels, grids,
//! blocks, shared memory and parameter counts are the same. A parameter's
//! value (a buffer's device address, a scalar) may differ: that node alone
//! gets its new values by `cuGraphExecKernelNodeSetParams`, which never
//! re-instantiates (a rebind, or a scalar set per run, costs one driver
//! call per changed kernel). Up to [`VARIANTS`] graphs of different shapes
//! are kept per segment (two plans on one queue), [`GRAPHS`] per queue; the
//! least recently used goes.
//!
//! **Repeating.** A later batch may name a batch's graphs instead of
//! recording their kernels again: `super::repeat`.
//!
//! **Fallback.** A segment the driver refuses to build or patch runs kernel
//! by kernel, as without replay, with the reason in
//! [`Launches::fallback`](crate::Launches). A build refused for good (no
//! graph entry points, a kernel's shared memory) is not tried again for
//! that shape; one refused for want of memory is, after [`RETRY_FIRST`]
//! more segments marked for replay on the queue, then after twice as many
//! each time it is refused again, up to [`RETRY_LAST`]. A driver error that
//! poisons the context (a fault seen while building or patching) fails the
//! batch and marks the device lost, as a launch's would. A profiling queue
//! launches kernel by kernel too, so that each is timed.

use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{DriverError, sys};

use crate::error::Result;
use crate::queue::{Batch, Command};
use crate::sync::Ordering;

use super::repeat::Template;

use super::device::PARAMETER_BYTES;
use super::launch;
use super::launches::parameter_values;
use super::stream::Shared;
use super::{Cuda, CudaProgram};

/// Graphs of different shapes kept for one segment.
pub(super) const VARIANTS: usize = 4;
/// Graphs kept per queue.
pub(super) const GRAPHS: usize = 32;
/// Segments of fewer kernels launch plainly: a graph launch of one kernel
/// costs what the kernel's own launch does.
pub(super) const MIN_KERNELS: usize = 2;
/// Segments marked for replay on a queue after which a graph the driver
/// refused for want of memory is built again; doubled at each refusal.
pub(super) const RETRY_FIRST: u64 = 8;
/// The longest wait between two tries of such a graph, in segments.
pub(super) const RETRY_LAST: u64 = 1024;
/// The most parameters a kernel takes (`check_exec` bounds them).
const CELLS: usize = PARAMETER_BYTES / 8;

/// A kernel node's launch, but for its parameters' values.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    /// The `CUfunction`'s address: the graph holds its program.
    function: usize,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    /// How many 8-byte parameter cells it takes.
    cells: u32,
}

/// A queue's graphs, and the segment being matched. Taken only by the
/// thread enqueueing the queue's batches (one at a time, in queue order).
#[derive(Default)]
pub(super) struct Replays {
    graphs: Vec<Graph>,
    /// Stamps `Graph::used`.
    clock: u64,
    /// The segment being matched: its kernels, and their parameters' values
    /// one after another.
    shapes: Vec<Shape>,
    cells: Vec<u64>,
    /// The indices of its signals in the batch.
    signals: Vec<usize>,
    /// Why the last segment marked for replay launched plainly.
    pub(super) fallback: Option<String>,
    /// Per key, the template of the last batch marked with it (made at its
    /// `submit`, filled as it is enqueued); at most [`GRAPHS`].
    pub(super) templates: Vec<Arc<Template>>,
    /// The template `replay_recorded` found for the batch submitted next.
    pub(super) next: Option<Arc<Template>>,
}

/// One segment's graph.
struct Graph {
    key: u32,
    /// The index of the segment's first command in its batch.
    start: usize,
    shapes: Vec<Shape>,
    /// The parameters' values its executable graph holds.
    cells: Vec<u64>,
    /// The kernel node of each shape, in order.
    nodes: Vec<sys::CUgraphNode>,
    made: Arc<Executable>,
    used: u64,
    /// For a build refused for want of memory: the clock from which it is
    /// tried again, and the wait it was given (`None`: refused for good,
    /// or built).
    retry: Option<(u64, u64)>,
}

/// A graph's driver handles, shared by the cache and the templates that
/// launch it again.
pub(super) struct Executable {
    /// The programs its nodes launch, kept loaded.
    programs: Vec<CudaProgram>,
    graph: sys::CUgraph,
    /// Null where the driver refused to build it: the segment launches
    /// plainly, without trying again.
    exec: sys::CUgraphExec,
}

// SAFETY: CUDA's graph handles may be used from any thread. An
// `Executable` is launched and patched only by the thread enqueueing its
// queue's batches (one at a time, in queue order, under the `Replays` lock
// or from a batch's template), and only dropped otherwise.
unsafe impl Send for Executable {}
// SAFETY: as above: shared handles are only read, by one thread at a time.
unsafe impl Sync for Executable {}

// SAFETY: the node handles are only used through the `Replays` lock, by
// one thread at a time.
unsafe impl Send for Graph {}

impl Drop for Executable {
    fn drop(&mut self) {
        // SAFETY: handles this graph made and nothing else holds. The
        // driver frees an executable graph still running once it
        // completes; the batches that launched it keep their programs
        // until then. Errors leave nothing to do.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// What [`Shared::replay`] did with the segment starting at an `exec`.
pub(super) enum Replayed {
    /// Its graph is launched: enqueueing goes on at this index.
    Graph(usize),
    /// Its kernels launch one by one, up to this index.
    Plain(usize),
    /// Its graph is launched, but a signal after it could not be
    /// recorded: the batch fails at this index, inside the segment, so the
    /// batch is kept (with its buffers) until the stream passed the graph.
    Failed(usize, crate::error::Error),
}

/// A driver call of a graph's, failed: why the segment falls back.
fn refused(what: &str, error: DriverError) -> String {
    format!(
        "the driver refused {what} ({error}); the segment's kernels launch one by one, as \
         without replay"
    )
}

impl Shared {
    /// Launches the segment of `batch` that starts at the exec `start` as
    /// its graph (built on first sight) where `key` has one that matches,
    /// or says to launch it plainly. An error is the graph launch's: the
    /// batch fails at `start`.
    pub(super) fn replay(
        &self,
        batch: &Batch<Cuda>,
        key: u32,
        template: Option<&Template>,
        start: usize,
    ) -> Result<Replayed> {
        let mut replays = self.replays.lock();
        let replays = &mut *replays;
        replays.shapes.clear();
        replays.cells.clear();
        replays.signals.clear();
        let mut end = start;
        for command in &batch.commands()[start..] {
            match command {
                Command::Exec {
                    program,
                    buffers,
                    scalars,
                    params,
                } => {
                    let buffers = &batch.buffers()[buffers.clone()];
                    let scalars = &batch.scalars()[scalars.clone()];
                    let config = launch::launch_config(params);
                    replays.shapes.push(Shape {
                        function: program.function().cu_function() as usize,
                        grid: config.grid_dim,
                        block: config.block_dim,
                        shared: config.shared_mem_bytes,
                        cells: (buffers.len() + scalars.len()) as u32,
                    });
                    replays.cells.extend(parameter_values(buffers, scalars));
                }
                Command::Signal { .. } => replays.signals.push(end),
                Command::Barrier => {}
                _ => break,
            }
            end += 1;
        }
        if replays.shapes.len() < MIN_KERNELS {
            return Ok(Replayed::Plain(end));
        }
        replays.clock += 1;
        let clock = replays.clock;
        let mut found = replays.find(key, start);
        // A graph refused for want of memory, due to be tried again.
        let mut wait = RETRY_FIRST;
        if let Some((at, _)) = found
            && let Some((due, waited)) = replays.graphs[at].retry
            && clock >= due
        {
            wait = (waited * 2).min(RETRY_LAST);
            replays.graphs.swap_remove(at);
            found = None;
        }
        // The segment launches plainly unless a graph launches below.
        let broken = |template: Option<&Template>| {
            if let Some(template) = template {
                template.broken();
            }
        };
        let at = match found {
            Some((at, _)) => at,
            None => {
                let graph = self.build(replays, batch, (key, start, end), wait)?;
                replays.make_room(key, start);
                replays.graphs.push(graph);
                replays.graphs.len() - 1
            }
        };
        let Replays {
            graphs,
            shapes,
            cells,
            signals,
            fallback,
            ..
        } = replays;
        let graph = &mut graphs[at];
        graph.used = clock;
        if graph.made.exec.is_null() {
            broken(template);
            return Ok(Replayed::Plain(end));
        }
        if let Some((_, exact)) = found {
            if !exact && let Err(error) = graph.patch(shapes, cells) {
                graphs.swap_remove(at);
                broken(template);
                if launch::is_sticky(error.0) {
                    return Err(self.fault("patching a plan's CUDA graph", error));
                }
                *fallback = Some(refused("new kernel parameters for a graph", error));
                return Ok(Replayed::Plain(end));
            }
            if !exact {
                self.patched.fetch_add(1, Ordering::Relaxed);
            }
            self.programs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.kernels
                .fetch_add(shapes.len() as u64, Ordering::Relaxed);
        }
        self.launch_graph(&graph.made)?;
        if let Some(template) = template {
            let kernels = u32::try_from(shapes.len()).unwrap_or(u32::MAX);
            template.push(graph.made.clone(), kernels);
        }
        if let Err(error) = self.record_last(batch, signals) {
            return Ok(Replayed::Failed(start + 1, error));
        }
        Ok(Replayed::Graph(end))
    }

    /// Launches `made`, a live executable graph (not refused) on the stream.
    pub(super) fn launch_graph(&self, made: &Executable) -> Result<()> {
        // SAFETY: a live executable graph of this stream's context (current:
        // `enqueue`), whose nodes launch programs it holds, over buffers
        // the batch (or, repeated, its template) holds until the stream
        // passed it.
        unsafe { sys::cuGraphLaunch(made.exec, self.stream.cu_stream()) }
            .result()
            .map_err(|e| self.fault("launching a plan's CUDA graph", e))
    }

    /// Records each signal of the commands at `signals` once, at its last
    /// (highest) value among them. An error fails the segment from its
    /// start: its lower values were never recorded.
    fn record_last(&self, batch: &Batch<Cuda>, signals: &[usize]) -> Result<()> {
        let commands = batch.commands();
        let signal_at = |at: usize| match &commands[at] {
            Command::Signal { signal, value } => Some((signal, *value)),
            _ => None,
        };
        for (position, &at) in signals.iter().enumerate().rev() {
            let Some((signal, value)) = signal_at(at) else {
                continue;
            };
            let later = signals[position + 1..]
                .iter()
                .filter_map(|&later| signal_at(later))
                .any(|(other, _)| other.same_as(signal));
            if !later {
                signal.record(value, &self.stream)?;
            }
        }
        Ok(())
    }

    /// The graph of the segment in `replays.shapes`, on the driver: a
    /// refused one (null `exec`) where the driver would not build it, the
    /// reason in `replays.fallback`; one refused for want of memory is
    /// tried again `wait` segments on.
    ///
    /// # Errors
    /// A driver error that poisons the context (the device is lost).
    fn build(
        &self,
        replays: &mut Replays,
        batch: &Batch<Cuda>,
        (key, start, end): (u32, usize, usize),
        wait: u64,
    ) -> Result<Graph> {
        let mut made = Executable {
            programs: Vec::with_capacity(replays.shapes.len()),
            graph: ptr::null_mut(),
            exec: ptr::null_mut(),
        };
        let mut nodes = Vec::with_capacity(replays.shapes.len());
        let mut opted_in = true;
        for command in &batch.commands()[start..end] {
            if let Command::Exec {
                program, params, ..
            } = command
            {
                // Raised on the function before it is in a graph, as
                // before a launch; an error here is the plain launch's too.
                if program.opt_in_shared(params.shared_memory()).is_err() {
                    replays.fallback =
                        Some("a kernel could not opt in to its shared memory".to_owned());
                    opted_in = false;
                    break;
                }
                made.programs.push(program.clone());
            }
        }
        let mut retry = None;
        if opted_in
            && let Err((reason, code)) = made.make(&replays.shapes, &replays.cells, &mut nodes)
        {
            nodes.clear();
            match code {
                Some(error) if launch::is_sticky(error.0) => {
                    return Err(self.fault("building a plan's CUDA graph", error));
                }
                Some(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                    retry = Some((replays.clock + wait, wait));
                }
                _ => {}
            }
            replays.fallback = Some(reason);
        }
        Ok(Graph {
            key,
            start,
            shapes: replays.shapes.clone(),
            cells: replays.cells.clone(),
            nodes,
            made: Arc::new(made),
            used: 0,
            retry,
        })
    }
}

impl Replays {
    /// The graph of `key`'s segment at `start` with the shapes being
    /// matched, and whether it holds these very values: one that does
    /// where there is one, else the least recently used, to patch.
    fn find(&self, key: u32, start: usize) -> Option<(usize, bool)> {
        let mut best: Option<usize> = None;
        for (at, graph) in self.graphs.iter().enumerate() {
            if graph.key != key || graph.start != start || graph.shapes != self.shapes {
                continue;
            }
            if graph.cells == self.cells {
                return Some((at, true));
            }
            if best.is_none_or(|best| self.graphs[best].used > graph.used) {
                best = Some(at);
            }
        }
        best.map(|at| (at, false))
    }

    /// Drops the least recently used graph of the segment where it has
    /// [`VARIANTS`], else of the queue where it has [`GRAPHS`].
    fn make_room(&mut self, key: u32, start: usize) {
        let same = |graph: &Graph| graph.key == key && graph.start == start;
        let full = if self.graphs.iter().filter(|g| same(g)).count() >= VARIANTS {
            Some(true)
        } else if self.graphs.len() >= GRAPHS {
            Some(false)
        } else {
            None
        };
        let Some(segment) = full else { return };
        if let Some(at) = self
            .graphs
            .iter()
            .enumerate()
            .filter(|(_, g)| !segment || same(g))
            .min_by_key(|(_, g)| g.used)
            .map(|(at, _)| at)
        {
            self.graphs.swap_remove(at);
        }
    }

    /// Drops every graph (the stream is idle: `Shared::shut_down`).
    pub(super) fn clear(&mut self) {
        self.graphs.clear();
        self.templates.clear();
        self.next = None;
    }
}

/// `cuda.h`'s `CUDA_KERNEL_NODE_PARAMS_v2` (12.0): the v1 fields, then
/// `kern` and `ctx`. Declared here because cudarc's bindings name one
/// layout per CUDA version (v1 for 11.x), and the crate builds against each.
#[repr(C)]
struct NodeParams {
    func: sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    kern: *mut c_void,
    ctx: sys::CUcontext,
}

type AddKernelNode = unsafe extern "C" fn(
    *mut sys::CUgraphNode,
    sys::CUgraph,
    *const sys::CUgraphNode,
    usize,
    *const NodeParams,
) -> sys::CUresult;
type SetKernelNodeParams =
    unsafe extern "C" fn(sys::CUgraphExec, sys::CUgraphNode, *const NodeParams) -> sys::CUresult;

/// The driver's kernel node entry points: the `_v2` forms (12.0 and
/// newer), else the unversioned ones (11.x), which read the v1 prefix of
/// [`NodeParams`].
struct Entries {
    add: AddKernelNode,
    set: SetKernelNodeParams,
}

/// [`Entries`], looked up once; `None` where the driver has neither form.
fn entries() -> Option<&'static Entries> {
    static ENTRIES: OnceLock<Option<Entries>> = OnceLock::new();
    ENTRIES
        .get_or_init(|| {
            // SAFETY: a device is open, so cudarc loaded libcuda; each
            // symbol, where present, has the signature `cuda.h` gives it,
            // which the types above spell out (the unversioned forms take
            // the v1 parameters, a prefix of `NodeParams`).
            unsafe {
                let library = sys::culib();
                let add = library
                    .get::<AddKernelNode>(b"cuGraphAddKernelNode_v2\0")
                    .or_else(|_| library.get::<AddKernelNode>(b"cuGraphAddKernelNode\0"))
                    .ok()?;
                let set = library
                    .get::<SetKernelNodeParams>(b"cuGraphExecKernelNodeSetParams_v2\0")
                    .or_else(|_| {
                        library.get::<SetKernelNodeParams>(b"cuGraphExecKernelNodeSetParams\0")
                    })
                    .ok()?;
                Some(Entries {
                    add: *add,
                    set: *set,
                })
            }
        })
        .as_ref()
}

impl Executable {
    /// Creates the graph, its chain of kernel nodes (into `nodes`) and its
    /// executable graph, for kernels of `shapes` taking `cells`; the error
    /// says what the driver refused.
    fn make(
        &mut self,
        shapes: &[Shape],
        cells: &[u64],
        nodes: &mut Vec<sys::CUgraphNode>,
    ) -> std::result::Result<(), (String, Option<DriverError>)> {
        let Some(entries) = entries() else {
            return Err((
                "the driver has no cuGraphAddKernelNode; the segment's kernels launch \
                        one by one, as without replay"
                    .to_owned(),
                None,
            ));
        };
        // SAFETY: writes a new graph's handle, which `Drop` destroys.
        unsafe { sys::cuGraphCreate(&mut self.graph, 0) }
            .result()
            .map_err(|e| (refused("to create a graph", e), Some(e)))?;
        let mut offset = 0;
        for (at, shape) in shapes.iter().enumerate() {
            let count = shape.cells as usize;
            let mut node = ptr::null_mut();
            let previous = nodes.last().copied();
            let (dependencies, count_of) = match &previous {
                Some(previous) => (ptr::from_ref(previous), 1),
                None => (ptr::null(), 0),
            };
            with_params(
                &self.programs[at],
                shape,
                &cells[offset..offset + count],
                |params| {
                    // SAFETY: a live graph; the dependency is a node of it;
                    // the parameters' pointers are live for the call, and
                    // the driver copies what they point at.
                    unsafe { (entries.add)(&mut node, self.graph, dependencies, count_of, params) }
                        .result()
                },
            )
            .map_err(|e| (refused("to add a kernel node to a graph", e), Some(e)))?;
            nodes.push(node);
            offset += count;
        }
        // SAFETY: a live graph of kernel nodes; writes the executable
        // graph's handle, which `Drop` destroys.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut self.exec, self.graph, 0) }
            .result()
            .map_err(|e| {
                self.exec = ptr::null_mut();
                (refused("to instantiate a graph", e), Some(e))
            })
    }
}

impl Graph {
    /// Gives the executable graph's nodes whose values differ from `cells`
    /// those values, one `cuGraphExecKernelNodeSetParams` each.
    fn patch(&mut self, shapes: &[Shape], cells: &[u64]) -> std::result::Result<(), DriverError> {
        // A graph was made, so the entry points were found.
        let Some(entries) = entries() else {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED));
        };
        let mut offset = 0;
        for (at, shape) in shapes.iter().enumerate() {
            let range = offset..offset + shape.cells as usize;
            offset = range.end;
            if self.cells[range.clone()] == cells[range.clone()] {
                continue;
            }
            let node = self.nodes[at];
            let exec = self.made.exec;
            with_params(
                &self.made.programs[at],
                shape,
                &cells[range.clone()],
                |params| {
                    // SAFETY: a node of the graph `exec` was instantiated from,
                    // of the same kernel and shape; the parameters' pointers are
                    // live for the call, and the driver copies what they point
                    // at. A launch already made keeps its old values.
                    unsafe { (entries.set)(exec, node, params) }.result()
                },
            )?;
            self.cells[range.clone()].copy_from_slice(&cells[range]);
        }
        Ok(())
    }
}

/// Calls `call` with a kernel node's parameters: `program`'s function in
/// `shape`, its parameter cells holding `cells`.
fn with_params<T>(
    program: &CudaProgram,
    shape: &Shape,
    cells: &[u64],
    call: impl FnOnce(&NodeParams) -> T,
) -> T {
    let mut values = [0u64; CELLS];
    let mut pointers = [ptr::null_mut::<c_void>(); CELLS];
    let count = cells.len().min(CELLS);
    values[..count].copy_from_slice(&cells[..count]);
    for (pointer, value) in pointers.iter_mut().zip(values.iter_mut()).take(count) {
        *pointer = ptr::from_mut(value).cast();
    }
    let params = NodeParams {
        func: program.function().cu_function(),
        grid: [shape.grid.0, shape.grid.1, shape.grid.2],
        block: [shape.block.0, shape.block.1, shape.block.2],
        shared_bytes: shape.shared,
        kernel_params: pointers.as_mut_ptr(),
        extra: ptr::null_mut(),
        kern: ptr::null_mut(),
        ctx: ptr::null_mut(),
    };
    call(&params)
}
