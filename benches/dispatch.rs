//! What the generic design costs: the same batch recorded through the
//! concrete `CpuQueue`, through a generic `fn<Q: HardwareQueue>`, and through
//! a `Box<dyn ...>` trait object (the baseline a `dyn` design would pay);
//! and what passing `exec` arguments as [`View`]s costs over whole buffers.
//!
//! One iteration records 64 commands (32 × `signal`, `memory_barrier`), then
//! discards the batch with [`HardwareQueue::discard`], so the worker thread
//! never runs and only the recording path is measured. The signal is
//! already at the recorded value, so discarding has nothing to fail. The
//! cases run one after another, each dropping its queue before the next
//! one claims the signal (a signal has one producing queue at a time).
//!
//! Each case is one function listed in [`CASES`]: `direct`, `generic`, `dyn`
//! and `enum` (the crate's `AnyQueue`, recorded through the same generic
//! function). Another case is one more function and one more entry.
//! `vulkan_direct` and `vulkan_enum` (with the `vulkan` feature and a
//! Vulkan driver) record the same batch on a Vulkan queue, the last
//! variant of the default set, directly and through `AnyQueue`.
//!
//! Two more cases record 64 `exec`s instead (the same program, scalars and
//! parameters each time, two buffer arguments), then discard: `exec` on the
//! whole buffers, and `views` through [`HardwareQueue::exec_views`] on
//! `View::whole` of the same buffers. `views / exec` is what a compiler
//! pays for handing the queue views rather than buffers when a kernel runs
//! again on the same tensors (the queue then shares the last `exec`'s
//! stored arguments). `exec_swapped` and `views_swapped` swap the two
//! arguments every `exec`, so each stores and checks its own:
//! `views_swapped / exec_swapped` is the price for arguments that change.
//!
//! For instruction counts, the same binary runs one case a fixed number of
//! times under callgrind instead of criterion:
//!
//! ```text
//! HWQUEUE_DISPATCH_COUNT=generic HWQUEUE_DISPATCH_ITERS=10000 \
//!     valgrind --tool=callgrind target/.../dispatch-HASH
//! ```
//!
//! `benches/callgrind.sh` does this for every case and prints the
//! instructions per iteration.

mod support;

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use hwqueue::cpu::{
    Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal, KernelArgs, WorkGroup,
};
use hwqueue::{
    AnyQueue, AnySignal, Backend, Device, ExecParams, HardwareQueue, QueueFactory, Scalar,
    SignalOf, View,
};

use support::Profile;

/// `signal` + `memory_barrier` pairs per iteration: 64 commands.
const PAIRS: usize = 32;

/// The signal value every case records (the signal starts there).
const VALUE: u64 = 1;

/// `exec`s per iteration of the `exec` and `views` cases: as many commands
/// as the signal cases record.
const EXECS: usize = 2 * PAIRS;

/// The scalar arguments of every `exec`: one, so that the scalar path is
/// part of what is counted.
const SCALARS: [Scalar; 1] = [Scalar::U32(7)];

/// The work size of every `exec`: one work-group of one item.
fn params() -> ExecParams {
    ExecParams::new_1d(1, 1)
}

/// The kernel of the `exec` cases. It never runs: every batch is discarded.
fn never_runs(_group: &WorkGroup, _args: &KernelArgs<'_>) {}

/// The batch, through the concrete type.
#[inline(never)]
fn record_direct(queue: &mut CpuQueue, signal: &CpuSignal) {
    for _ in 0..PAIRS {
        queue.signal(signal, VALUE).memory_barrier();
    }
}

/// The batch, through a generic function: what a compiler generic over
/// `B: Backend` runs.
#[inline(never)]
fn record_generic<Q: HardwareQueue>(queue: &mut Q, signal: &SignalOf<Q::Backend>) {
    for _ in 0..PAIRS {
        queue.signal(signal, VALUE).memory_barrier();
    }
}

/// `EXECS` `exec`s on whole buffers.
#[inline(never)]
fn record_exec(queue: &mut CpuQueue, program: &CpuProgram, buffers: [&CpuBuffer; 2]) {
    for _ in 0..EXECS {
        queue.exec(program, &buffers, &SCALARS, params());
    }
}

/// The same `exec`s, with views as the buffer arguments.
#[inline(never)]
fn record_views(queue: &mut CpuQueue, program: &CpuProgram, views: [&View<Cpu>; 2]) {
    for _ in 0..EXECS {
        queue.exec_views(program, &views, &SCALARS, params());
    }
}

/// `exec`s whose two buffers swap places each time, so no `exec` repeats
/// the last one's arguments: every one stores and checks its own.
#[inline(never)]
fn record_exec_swapped(queue: &mut CpuQueue, program: &CpuProgram, [a, b]: [&CpuBuffer; 2]) {
    for index in 0..EXECS {
        let buffers = if index % 2 == 0 { [a, b] } else { [b, a] };
        queue.exec(program, &buffers, &SCALARS, params());
    }
}

/// The same swapped `exec`s, with views as the buffer arguments.
#[inline(never)]
fn record_views_swapped(queue: &mut CpuQueue, program: &CpuProgram, [a, b]: [&View<Cpu>; 2]) {
    for index in 0..EXECS {
        let views = if index % 2 == 0 { [a, b] } else { [b, a] };
        queue.exec_views(program, &views, &SCALARS, params());
    }
}

/// The queue a `dyn` design would hand around. `HardwareQueue` is not
/// object safe (generic `wait_foreign`, `&mut Self` returns, `Sized`), so a
/// type-erased queue needs a trait of its own, like this one.
trait ObjectQueue<B: Backend> {
    fn signal(&mut self, signal: &SignalOf<B>, value: u64);
    fn memory_barrier(&mut self);
    fn discard(&mut self);
}

/// Any queue, behind [`ObjectQueue`].
struct Erased<Q>(Q);

impl<Q: HardwareQueue> ObjectQueue<Q::Backend> for Erased<Q> {
    fn signal(&mut self, signal: &SignalOf<Q::Backend>, value: u64) {
        self.0.signal(signal, value);
    }

    fn memory_barrier(&mut self) {
        self.0.memory_barrier();
    }

    fn discard(&mut self) {
        self.0.discard();
    }
}

/// The batch, through a trait object: one indirect call per command.
#[inline(never)]
fn record_dyn(queue: &mut dyn ObjectQueue<Cpu>, signal: &CpuSignal) {
    for _ in 0..PAIRS {
        queue.signal(signal, VALUE);
        queue.memory_barrier();
    }
}

/// What every case starts from.
struct Fixture {
    device: CpuDevice,
    signal: CpuSignal,
    /// The `exec` cases' program (two buffers, one scalar) and buffers.
    program: CpuProgram,
    buffers: [CpuBuffer; 2],
    /// The Vulkan cases' device and signal (`None`: no Vulkan driver, and
    /// the two cases are left out).
    #[cfg(feature = "vulkan")]
    vulkan: Option<(hwqueue::vulkan::VulkanDevice, hwqueue::vulkan::VulkanSignal)>,
}

impl Fixture {
    fn new() -> Self {
        let device = CpuDevice::new();
        let buffers = [(); 2].map(|_| device.alloc(1024).expect("buffer"));
        Self {
            device,
            signal: CpuSignal::new(VALUE),
            program: CpuProgram::from_fn("never_runs", 2, SCALARS.len(), never_runs),
            buffers,
            #[cfg(feature = "vulkan")]
            vulkan: match hwqueue::vulkan::VulkanDevice::open(0) {
                Ok(device) => {
                    let signal = device.new_signal(VALUE).expect("signal");
                    Some((device, signal))
                }
                Err(error) => {
                    println!("vulkan_direct, vulkan_enum: skipped: no Vulkan driver ({error})");
                    None
                }
            },
        }
    }

    fn queue(&self) -> CpuQueue {
        self.device.compute_queue().expect("queue")
    }
}

/// Where a case's routine runs: under criterion, or a fixed number of
/// times for callgrind.
enum Runner<'a, 'g> {
    Criterion(&'a mut BenchmarkGroup<'g, WallTime>),
    Count { case: String, iters: u64 },
}

impl Runner<'_, '_> {
    fn run(&mut self, name: &str, mut routine: impl FnMut()) {
        match self {
            Runner::Criterion(group) => {
                group.bench_function(name, |b| b.iter(&mut routine));
            }
            Runner::Count { case, iters } => {
                if case == name {
                    support::repeat(*iters, routine);
                }
            }
        }
    }
}

fn direct(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    runner.run("direct", || {
        record_direct(&mut queue, &fixture.signal);
        queue.discard();
    });
}

fn generic(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    runner.run("generic", || {
        record_generic(&mut queue, &fixture.signal);
        queue.discard();
    });
}

fn dyn_object(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    // `black_box` hides the concrete type, so the calls stay indirect.
    let mut queue: Box<dyn ObjectQueue<Cpu>> = black_box(Box::new(Erased(fixture.queue())));
    runner.run("dyn", || {
        record_dyn(&mut *queue, &fixture.signal);
        queue.discard();
    });
}

fn any_enum(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = AnyQueue::from(fixture.queue());
    let signal = AnySignal::from(fixture.signal.clone());
    runner.run("enum", || {
        record_generic(&mut queue, &signal);
        queue.discard();
    });
}

/// The `signal` + `memory_barrier` batch on a Vulkan queue (recorded,
/// never submitted), through the concrete type: the last variant of the
/// default set, against `vulkan_enum`.
#[cfg(feature = "vulkan")]
fn vulkan_direct(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let Some((device, signal)) = &fixture.vulkan else {
        return;
    };
    let mut queue = device.compute_queue().expect("queue");
    runner.run("vulkan_direct", || {
        record_generic(&mut queue, signal);
        queue.discard();
    });
}

/// The same batch through `AnyQueue`.
#[cfg(feature = "vulkan")]
fn vulkan_enum(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let Some((device, signal)) = &fixture.vulkan else {
        return;
    };
    let mut queue = AnyQueue::from(device.compute_queue().expect("queue"));
    let signal = AnySignal::from(signal.clone());
    runner.run("vulkan_enum", || {
        record_generic(&mut queue, &signal);
        queue.discard();
    });
}

fn exec_whole(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    let [a, b] = &fixture.buffers;
    runner.run("exec", || {
        record_exec(&mut queue, &fixture.program, [a, b]);
        queue.discard();
    });
}

fn exec_views(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    // Made once, outside the loop, as a compiler holds the views of its
    // tensors: only what `exec_views` does with them is counted.
    let [a, b] = fixture.buffers.each_ref().map(View::whole);
    runner.run("views", || {
        record_views(&mut queue, &fixture.program, [&a, &b]);
        queue.discard();
    });
}

fn exec_swapped(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    let [a, b] = &fixture.buffers;
    runner.run("exec_swapped", || {
        record_exec_swapped(&mut queue, &fixture.program, [a, b]);
        queue.discard();
    });
}

fn views_swapped(runner: &mut Runner<'_, '_>, fixture: &Fixture) {
    let mut queue = fixture.queue();
    let [a, b] = fixture.buffers.each_ref().map(View::whole);
    runner.run("views_swapped", || {
        record_views_swapped(&mut queue, &fixture.program, [&a, &b]);
        queue.discard();
    });
}

type Case = fn(&mut Runner<'_, '_>, &Fixture);

/// Every case, in the order criterion runs them.
const CASES: &[Case] = &[
    direct,
    generic,
    dyn_object,
    any_enum,
    exec_whole,
    exec_views,
    exec_swapped,
    views_swapped,
    #[cfg(feature = "vulkan")]
    vulkan_direct,
    #[cfg(feature = "vulkan")]
    vulkan_enum,
];

fn dispatch(c: &mut Criterion) {
    let fixture = Fixture::new();
    let mut group = c.benchmark_group("dispatch");
    support::configure(&mut group, Profile::Latency);
    let mut runner = Runner::Criterion(&mut group);
    for case in CASES.iter().copied() {
        case(&mut runner, &fixture);
    }
    group.finish();
}

/// `HWQUEUE_DISPATCH_COUNT=CASE`: run only that case,
/// `HWQUEUE_DISPATCH_ITERS` times (default 10,000), without criterion.
fn count(case: String) {
    let iters = support::count_iters("HWQUEUE_DISPATCH_ITERS", 10_000);
    let fixture = Fixture::new();
    let mut runner = Runner::Count { case, iters };
    for case in CASES.iter().copied() {
        case(&mut runner, &fixture);
    }
}

fn main() {
    if let Ok(case) = std::env::var("HWQUEUE_DISPATCH_COUNT") {
        count(case);
        return;
    }
    let mut criterion = Criterion::default().configure_from_args();
    dispatch(&mut criterion);
    criterion.final_summary();
}
