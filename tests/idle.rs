//! Idle costs nothing: the CPU backend's threads spin only briefly before
//! they park (`SpinWait` in `src/sync.rs`: at most about 25 µs for a host
//! wait, 100 µs for a queue's worker or a pool helper, and less on a thread
//! whose spins stopped paying), so queues and the pool with no work keep
//! no core busy. A test of
//! its own binary, so no other test's threads run beside it.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use hwqueue::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{Device, ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout};

/// User plus system CPU time of the whole process so far.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `rusage` through the pointer, which
    // points to one; RUSAGE_SELF is always valid.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(status, 0, "getrusage failed");
    // SAFETY: `getrusage` succeeded, so it initialised the struct (which
    // was zeroed anyway, and is plain integers).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn touch(_group: &WorkGroup, _args: &KernelArgs<'_>) {}

#[test]
fn idle_queues_and_pool_keep_no_core_busy() {
    let device = CpuDevice::new();
    let mut compute = device.compute_queue().unwrap();
    let mut copy = device
        .copy_queue()
        .unwrap()
        .expect("the CPU has a copy queue");
    let done = device.new_signal(0).unwrap();
    let copied = device.new_signal(0).unwrap();
    let buffer = device.alloc(4096).unwrap();
    let other = device.alloc(4096).unwrap();
    let program = CpuProgram::from_fn("touch", 0, 0, touch);
    // A burst: round trips (the worker and the host waiter spin between
    // them), wide launches (the pool's helpers wake and spin), and a
    // second queue waiting on the first.
    for value in 1..=500 {
        compute
            .exec(&program, &[], &[], ExecParams::new_1d(64 * 64, 64))
            .signal(&done, value)
            .submit()
            .unwrap();
        copy.wait(&done, value)
            .copy(&other, &buffer)
            .signal(&copied, value)
            .submit()
            .unwrap();
        copied.wait(value, Timeout::Forever).unwrap();
    }
    // Idle: the queues, their workers and the pool stay alive.
    let (before, start) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let (used, elapsed) = (cpu_time() - before, start.elapsed());
    // One thread that kept spinning would use the whole second. A parked
    // thread uses nothing however loaded the machine is, so a tenth of the
    // time leaves a wide margin for the spin tails and the sleep's own
    // wake-up, and still catches a single spinning thread tenfold.
    assert!(
        used < elapsed / 10,
        "the process used {used:?} of CPU time over {elapsed:?} of idleness: a thread keeps spinning"
    );
    drop((compute, copy));
}
