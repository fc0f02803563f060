//! NCCL collectives through a CUDA queue against cudarc's own `Comm`, on
//! one rank (NCCL cannot put two ranks on one GPU): issue 48's "a one-rank
//! NCCL all-reduce through hwqueue against cudarc's `Comm::all_reduce` on
//! the same stream: <= 1.10 host time".
//!
//! | group | cases | what is timed |
//! |-------|-------|---------------|
//! | `nccl_all_reduce_host` | `hwqueue` (a blocking communicator: `all_reduce` of 1 KiB of f32 + `submit`), `hwqueue_nonblocking` (the same over an `NcclConfig::nonblocking` communicator; left out, saying why, on an NCCL older than 2.27), `cudarc` (`Comm::all_reduce` on the queue's stream, event tracking off) | the host's time to issue [`BURST`] all-reduces; the stream is synchronized after each burst, untimed |
//! | `nccl_all_reduce_paired` | `hwqueue_over_cudarc`, `nonblocking_over_cudarc` | the same bursts, each timed next to one of cudarc's (`support::paired`): criterion reports the ratio (`x`), not a time |
//!
//! Built with `--features nccl` (`required-features`); without a CUDA
//! driver and device it prints `skipped: no CUDA driver`, without NCCL
//! `skipped: no NCCL`, and measures nothing.
//!
//! **Instruction counts** (`BENCH=nccl bash benches/callgrind.sh`), which
//! need no GPU: with `HWQUEUE_NCCL_COUNT=CASE` and `HWQUEUE_NCCL_ITERS=N`
//! the binary runs only CASE, N times, without criterion, inside
//! `support::repeat` (the function callgrind collects in, on the calling
//! thread only), on whatever `libcuda` and `libnccl` it loads (the script
//! puts the fake ones first: `tests/fake_cuda/`). Cases: `all_reduce_hwqueue`,
//! `all_reduce_hwqueue_nonblocking` and `all_reduce_cudarc`, one 1 KiB
//! all-reduce each. The fake NCCL's all-reduce is a `memmove` and its
//! group calls nearly nothing, where the real one does its launch's
//! work: the counts show hwqueue's own host work per collective (the
//! difference), not the ratio a GPU would show.

mod support;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use cudarc::nccl::safe::{Comm, ReduceOp};
use hwqueue::collective::{CollectiveError, Communicator, NcclConfig, NcclId, Reduction};
use hwqueue::cuda::{Cuda, CudaBuffer, CudaDevice, CudaQueue};
use hwqueue::{Backend, Device, Error, HardwareQueue, QueueFactory};

use support::{Profile, Ratio};

/// How many all-reduces are issued between two synchronizations.
const BURST: usize = 64;
/// The all-reduce's length: 1 KiB of f32.
const WORDS: usize = 256;

/// The three ways to issue one all-reduce, over the same buffers' sizes.
struct Setup {
    blocking: Issuer,
    /// `None` where the NCCL loaded cannot make one (older than 2.27).
    nonblocking: Option<Issuer>,
    cudarc: CudarcIssuer,
}

/// hwqueue: a queue, a communicator, and the views it reduces.
struct Issuer {
    queue: CudaQueue,
    comm: Communicator,
    send: CudaBuffer,
    recv: CudaBuffer,
}

/// What a case issues, and how its stream is drained.
trait Issue {
    /// One all-reduce.
    fn issue(&mut self);
    /// Waits for every all-reduce issued.
    fn finish(&mut self);

    /// The host's time to issue `iters` all-reduces, in bursts of
    /// [`BURST`] each followed by an untimed `finish`.
    fn bursts(&mut self, iters: u64) -> Duration {
        let mut spent = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let burst = left.min(BURST as u64);
            let start = Instant::now();
            for _ in 0..burst {
                self.issue();
            }
            spent += start.elapsed();
            self.finish();
            left -= burst;
        }
        spent
    }

    /// One burst and its `finish`.
    fn burst(&mut self) {
        (0..BURST).for_each(|_| self.issue());
        self.finish();
    }
}

impl Issuer {
    fn new(device: &CudaDevice, comm: Communicator) -> Self {
        Self {
            queue: device.compute_queue().expect("queue"),
            comm,
            send: device.alloc(WORDS * 4).expect("send"),
            recv: device.alloc(WORDS * 4).expect("recv"),
        }
    }
}

impl Issue for Issuer {
    fn issue(&mut self) {
        self.queue
            .all_reduce::<f32, _, _>(&self.comm, Reduction::Sum, &self.send, &self.recv)
            .submit()
            .expect("submit");
    }

    fn finish(&mut self) {
        self.queue.synchronize().expect("ran");
    }
}

/// cudarc: its `Comm` of one rank on the blocking issuer's stream.
struct CudarcIssuer {
    comm: Comm,
    send: cudarc::driver::CudaSlice<f32>,
    recv: cudarc::driver::CudaSlice<f32>,
}

impl Issue for CudarcIssuer {
    fn issue(&mut self) {
        self.comm
            .all_reduce(&self.send, &mut self.recv, &ReduceOp::Sum)
            .expect("all_reduce");
    }

    fn finish(&mut self) {
        self.comm.stream().synchronize().expect("ran");
    }
}

/// Everything [`Setup`] holds, or `None` after printing why the bench
/// skips (no NCCL).
fn setup(device: &CudaDevice) -> Option<Setup> {
    let blocking = match Communicator::nccl_single(device) {
        Ok(comm) => comm,
        Err(Error::Collective(error @ CollectiveError::NoNccl { .. })) => {
            println!("skipped: no NCCL ({error})");
            return None;
        }
        Err(error) => panic!("an NCCL communicator: {error}"),
    };
    let id = NcclId::new().expect("an NCCL id");
    let nonblocking = match Communicator::nccl_with(device, id, 0, 1, NcclConfig::nonblocking()) {
        Ok(comm) => Some(comm),
        Err(Error::Collective(error @ CollectiveError::Invalid { .. })) => {
            println!("skipped: the non-blocking cases ({error})");
            None
        }
        Err(error) => panic!("a non-blocking NCCL communicator: {error}"),
    };
    let blocking = Issuer::new(device, blocking);
    let stream = blocking.queue.engine().stream().clone();
    // As a runtime that orders its own streams runs cudarc.
    // SAFETY: cudarc's slices below are used on this one stream only.
    unsafe { stream.context().disable_event_tracking() };
    let comm = Comm::from_devices(vec![stream.clone()])
        .expect("cudarc's communicator")
        .pop()
        .expect("one rank");
    let cudarc = CudarcIssuer {
        comm,
        send: stream.alloc_zeros::<f32>(WORDS).expect("send"),
        recv: stream.alloc_zeros::<f32>(WORDS).expect("recv"),
    };
    Some(Setup {
        nonblocking: nonblocking.map(|comm| Issuer::new(device, comm)),
        blocking,
        cudarc,
    })
}

fn nccl_all_reduce(c: &mut Criterion) {
    let Some(device) = support::cuda_device() else {
        return;
    };
    let Some(mut setup) = setup(&device) else {
        return;
    };
    let mut group = c.benchmark_group("nccl_all_reduce_host");
    support::configure(&mut group, Profile::Latency);
    group.bench_function("hwqueue", |b| {
        b.iter_custom(|iters| setup.blocking.bursts(iters))
    });
    if let Some(nonblocking) = &mut setup.nonblocking {
        group.bench_function("hwqueue_nonblocking", |b| {
            b.iter_custom(|iters| nonblocking.bursts(iters))
        });
    }
    group.bench_function("cudarc", |b| {
        b.iter_custom(|iters| setup.cudarc.bursts(iters))
    });
    group.finish();

    let mut ratio = Criterion::default()
        .with_measurement(Ratio)
        .configure_from_args();
    let mut group = ratio.benchmark_group("nccl_all_reduce_paired");
    support::configure(&mut group, Profile::Latency);
    let Setup {
        blocking,
        nonblocking,
        cudarc,
    } = &mut setup;
    let cases = [
        ("hwqueue_over_cudarc", Some(blocking)),
        ("nonblocking_over_cudarc", nonblocking.as_mut()),
    ];
    for (name, ours) in cases {
        let Some(ours) = ours else { continue };
        group.bench_function(name, |b| {
            // One burst of each per paired iteration.
            b.iter_custom(|iters| {
                support::paired(iters, &mut || ours.burst(), &mut || cudarc.burst())
            });
        });
    }
    group.finish();
}

/// `HWQUEUE_NCCL_COUNT=CASE`: runs only that case, `HWQUEUE_NCCL_ITERS`
/// times (default 100), without criterion (see the module docs).
fn count(case: &str) {
    let iters = support::count_iters("HWQUEUE_NCCL_ITERS", 100);
    let device = Cuda::open(0).expect("a CUDA device, or the fake driver");
    let mut setup = setup(&device).expect("NCCL, or the fake one");
    match case {
        "all_reduce_hwqueue" => {
            setup.blocking.issue();
            support::repeat(iters, || setup.blocking.issue());
            setup.blocking.finish();
        }
        "all_reduce_hwqueue_nonblocking" => {
            let nonblocking = setup.nonblocking.as_mut().expect("NCCL 2.27+, or the fake");
            nonblocking.issue();
            support::repeat(iters, || nonblocking.issue());
            nonblocking.finish();
        }
        "all_reduce_cudarc" => {
            setup.cudarc.issue();
            support::repeat(iters, || setup.cudarc.issue());
            setup.cudarc.finish();
        }
        other => panic!(
            "no case `{other}`: all_reduce_hwqueue, all_reduce_hwqueue_nonblocking or \
             all_reduce_cudarc"
        ),
    }
}

criterion_group!(benches, nccl_all_reduce);

fn main() {
    if let Ok(case) = std::env::var("HWQUEUE_NCCL_COUNT") {
        count(&case);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
