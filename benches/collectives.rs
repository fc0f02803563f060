//! `all_reduce` (sum) of f32 through hwqueue's CPU queue against rsmpi's
//! own `all_reduce_into` on the same ranks, in the same run. Run under
//! `mpirun` (the `mpi` feature):
//!
//! ```text
//! cargo bench --features mpi --bench collectives --no-run
//! mpirun --allow-run-as-root --oversubscribe -np 4 target/release/deps/collectives-* --bench
//! ```
//!
//! | group | `hwqueue` | baseline |
//! |-------|-----------|----------|
//! | `all_reduce_1KiB`, `all_reduce_64MiB` | a CPU queue records `all_reduce` and a signal, submits, and the host waits on the signal | `rsmpi`: `all_reduce_into` (`MPI_Allreduce`) on `MPI_COMM_WORLD` from the host; `rsmpi_nonblocking`: `immediate_all_reduce_into` then `wait` (`MPI_Iallreduce` + `MPI_Wait`, the non-blocking collective hwqueue's engine starts, without the queue) |
//! | `all_reduce_ratio` | the two side by side in each iteration ([`support::paired`]): hwqueue's time over rsmpi's | |
//! | `all_reduce_added` | the two side by side at 1 KiB ([`support::paired_added`]): the time hwqueue adds to rsmpi's `all_reduce_into`, per all_reduce (issue 48's "added latency") | |
//!
//! # Lock step
//!
//! A collective needs every rank, so every rank must run the same
//! iterations in the same order. Criterion chooses its iteration counts
//! from its own timings, which differ between ranks; so only rank 0 runs
//! criterion, and each time criterion asks for `iters` iterations of a
//! case, rank 0 first broadcasts (case, `iters`) to the other ranks, which
//! run exactly that, then wait for the next. The numbers are rank 0's:
//! criterion's times (its median and confidence interval) of rank 0's
//! iterations, each a whole collective over all ranks.

mod support;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use hwqueue::collective::{Communicator, Mpi, Reduction};
use hwqueue::cpu::{CpuBuffer, CpuDevice, CpuQueue, CpuSignal};
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory, TimelineSignal, Timeout};
use mpi::collective::SystemOperation;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};

use support::{Added, Profile, Ratio};

/// The sizes measured: name and bytes.
const SIZES: [(&str, usize); 2] = [("1KiB", 1 << 10), ("64MiB", 64 << 20)];

/// What rank 0 asks the others to run: `[case, iters]`; a case of `DONE`
/// ends the run.
type Command = [u64; 2];
const DONE: u64 = u64::MAX;

/// The cases, as a [`Command`] names them.
#[derive(Clone, Copy)]
enum Case {
    Hwqueue(usize),
    Rsmpi(usize),
    RsmpiNonblocking(usize),
    Paired(usize),
    Added(usize),
}

impl Case {
    fn code(self) -> u64 {
        let (kind, size) = match self {
            Case::Hwqueue(size) => (0, size),
            Case::Rsmpi(size) => (1, size),
            Case::RsmpiNonblocking(size) => (2, size),
            Case::Paired(size) => (3, size),
            Case::Added(size) => (4, size),
        };
        (kind * SIZES.len() + size) as u64
    }

    fn from_code(code: u64) -> Self {
        let (kind, size) = (code as usize / SIZES.len(), code as usize % SIZES.len());
        match kind {
            0 => Case::Hwqueue(size),
            1 => Case::Rsmpi(size),
            2 => Case::RsmpiNonblocking(size),
            3 => Case::Paired(size),
            _ => Case::Added(size),
        }
    }
}

/// One size's buffers: hwqueue's (CPU buffers) and rsmpi's (vectors).
struct Buffers {
    send: CpuBuffer,
    recv: CpuBuffer,
    host_send: Vec<f32>,
    host_recv: Vec<f32>,
}

/// Everything a rank measures with.
struct Bench {
    world: SimpleCommunicator,
    comm: Communicator,
    queue: CpuQueue,
    done: CpuSignal,
    value: u64,
    buffers: Vec<Buffers>,
}

impl Bench {
    fn new(comm: Communicator) -> hwqueue::Result<Self> {
        let device = CpuDevice::new();
        let rank = comm.rank() as f32;
        let buffers = SIZES
            .iter()
            .map(|&(_, bytes)| {
                let len = bytes / size_of::<f32>();
                let data = vec![rank + 1.0; len];
                let send = device.alloc(bytes)?;
                send.write_from(&data)?;
                Ok(Buffers {
                    send,
                    recv: device.alloc(bytes)?,
                    host_send: data,
                    host_recv: vec![0.0; len],
                })
            })
            .collect::<hwqueue::Result<_>>()?;
        Ok(Self {
            world: SimpleCommunicator::world(),
            queue: device.compute_queue()?,
            done: device.new_signal(0)?,
            value: 0,
            comm,
            buffers,
        })
    }

    /// One all_reduce through hwqueue: recorded, submitted, waited for.
    fn hwqueue(&mut self, size: usize) {
        let b = &self.buffers[size];
        self.value += 1;
        self.queue
            .all_reduce::<f32, _, _>(&self.comm, Reduction::Sum, &b.send, &b.recv)
            .signal(&self.done, self.value);
        self.queue.submit().expect("the batch is accepted");
        self.done
            .wait(self.value, Timeout::Forever)
            .expect("the all_reduce completes");
    }

    /// One `all_reduce_into` through rsmpi.
    fn rsmpi(&mut self, size: usize) {
        let b = &mut self.buffers[size];
        self.world.all_reduce_into(
            &b.host_send[..],
            &mut b.host_recv[..],
            SystemOperation::sum(),
        );
    }

    /// One `MPI_Iallreduce` through rsmpi (`immediate_all_reduce_into`),
    /// then `MPI_Wait`: the non-blocking collective hwqueue's CPU engine
    /// starts, without the queue.
    fn rsmpi_nonblocking(&mut self, size: usize) {
        let b = &mut self.buffers[size];
        let world = &self.world;
        mpi::request::scope(|scope| {
            world
                .immediate_all_reduce_into(
                    scope,
                    &b.host_send[..],
                    &mut b.host_recv[..],
                    SystemOperation::sum(),
                )
                .wait();
        });
    }

    /// Runs `iters` iterations of `case`: the value criterion records.
    fn run(&mut self, case: Case, iters: u64) -> f64 {
        let start = Instant::now();
        match case {
            Case::Hwqueue(size) => (0..iters).for_each(|_| self.hwqueue(size)),
            Case::Rsmpi(size) => (0..iters).for_each(|_| self.rsmpi(size)),
            Case::RsmpiNonblocking(size) => (0..iters).for_each(|_| self.rsmpi_nonblocking(size)),
            Case::Paired(size) | Case::Added(size) => {
                // Both take two closures over one `self`.
                let this = std::cell::RefCell::new(self);
                let pair = match case {
                    Case::Paired(_) => support::paired,
                    _ => support::paired_added,
                };
                return pair(iters, &mut || this.borrow_mut().hwqueue(size), &mut || {
                    this.borrow_mut().rsmpi(size)
                });
            }
        }
        start.elapsed().as_secs_f64()
    }

    /// Rank 0: tells the others to run `case` `iters` times, and runs it.
    fn lead(&mut self, case: Case, iters: u64) -> f64 {
        let mut command: Command = [case.code(), iters];
        self.world
            .process_at_rank(0)
            .broadcast_into(&mut command[..]);
        self.run(case, iters)
    }

    /// The other ranks: runs what rank 0 says until it says it is done.
    fn follow(&mut self) {
        loop {
            let mut command: Command = [0; 2];
            self.world
                .process_at_rank(0)
                .broadcast_into(&mut command[..]);
            if command[0] == DONE {
                return;
            }
            self.run(Case::from_code(command[0]), command[1]);
        }
    }

    /// Checks one all_reduce of each size through each path: the sum of
    /// `rank + 1` over the ranks.
    fn check(&mut self) {
        let size = self.world.size() as f32;
        let want = size * (size + 1.0) / 2.0;
        for index in 0..SIZES.len() {
            self.hwqueue(index);
            let got = self.buffers[index].recv.to_vec::<f32>().expect("a buffer");
            assert!(got.iter().all(|&v| v == want), "hwqueue's sum is wrong");
            for run in [Self::rsmpi, Self::rsmpi_nonblocking] {
                self.buffers[index].host_recv.fill(0.0);
                run(self, index);
                let got = &self.buffers[index].host_recv;
                assert!(got.iter().all(|&v| v == want), "rsmpi's sum is wrong");
            }
        }
    }
}

fn benches(c: &mut Criterion, bench: &mut Bench) {
    for (index, &(name, bytes)) in SIZES.iter().enumerate() {
        let mut group = c.benchmark_group(format!("all_reduce_{name}"));
        let profile = if bytes > 1 << 20 {
            Profile::Bandwidth
        } else {
            Profile::Latency
        };
        support::configure(&mut group, profile);
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function("hwqueue", |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(bench.lead(Case::Hwqueue(index), iters)))
        });
        group.bench_function("rsmpi", |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(bench.lead(Case::Rsmpi(index), iters)))
        });
        group.bench_function("rsmpi_nonblocking", |b| {
            b.iter_custom(|iters| {
                Duration::from_secs_f64(bench.lead(Case::RsmpiNonblocking(index), iters))
            })
        });
        group.finish();
    }
    let mut ratio = Criterion::default()
        .with_measurement(Ratio)
        .configure_from_args();
    let mut group = ratio.benchmark_group("all_reduce_ratio");
    for (index, &(name, bytes)) in SIZES.iter().enumerate() {
        let profile = if bytes > 1 << 20 {
            Profile::Bandwidth
        } else {
            Profile::Latency
        };
        support::configure(&mut group, profile);
        group.bench_function(BenchmarkId::new("hwqueue_over_rsmpi", name), |b| {
            b.iter_custom(|iters| bench.lead(Case::Paired(index), iters))
        });
    }
    group.finish();
    // The added latency the issue states its 1 KiB target in.
    let mut added = Criterion::default()
        .with_measurement(Added)
        .configure_from_args();
    let mut group = added.benchmark_group("all_reduce_added");
    support::configure(&mut group, Profile::Latency);
    group.bench_function(BenchmarkId::new("hwqueue_minus_rsmpi", SIZES[0].0), |b| {
        b.iter_custom(|iters| bench.lead(Case::Added(0), iters))
    });
    group.finish();
}

fn main() {
    let mpi = Mpi::init().expect("MPI initialises (run under mpirun; see the file's docs)");
    let comm = mpi.world(None).expect("the world communicator");
    let rank = comm.rank();
    let mut bench = Bench::new(comm).expect("the bench's queue and buffers");
    bench.check();
    if rank == 0 {
        println!(
            "collectives bench: {} ranks, MPI thread support {}",
            bench.world.size(),
            mpi.threading()
        );
        let mut c = Criterion::default().configure_from_args();
        benches(&mut c, &mut bench);
        c.final_summary();
        let mut done: Command = [DONE, 0];
        bench.world.process_at_rank(0).broadcast_into(&mut done[..]);
    } else {
        bench.follow();
    }
    drop(bench);
    drop(mpi);
}
