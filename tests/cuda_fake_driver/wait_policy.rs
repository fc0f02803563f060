//! Issue 47's waits that do not oversleep, on the fake driver: a host wait
//! on a CUDA signal spins (polls its event) for a short adaptive budget,
//! then sleeps; `WaitPolicy::Spin` never sleeps, `WaitPolicy::Sleep`
//! sleeps at once; a failure wakes a spinning waiter; `wait_any`,
//! `wait_all` and a CPU queue's `wait_foreign` follow the policy.
//!
//! The fake's `HWQUEUE_FAKE_EVENT_DELAY_US` makes each recorded event
//! complete that long after its record, and `cuEventSynchronize` really
//! sleeps until then, so spinning and sleeping differ in the waiting
//! thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), which is what the tests
//! assert on, never wall-clock time alone: a thread that sleeps has an
//! upper bound on its CPU time however loaded the machine is, and a thread
//! that spins is only asserted to have used a large part of its wait's
//! length (best of several tries, for a machine shared with other tests).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hwqueue::cpu::CpuDevice;
use hwqueue::cuda::{CudaDevice, CudaSignal};
use hwqueue::{
    Error, HardwareQueue, QueueFactory, TimelineSignal, Timeout, WaitPolicy, wait_all, wait_any,
};

use super::{Outcome, on_a_12_2_device, report, run_scenario};

/// The calling thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the call writes the one `timespec` passed, which lives across
    // it; CLOCK_THREAD_CPUTIME_ID exists on every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Runs `wait` on this thread; its result, the thread's CPU time it took,
/// and its wall-clock time.
fn measured<R>(wait: impl FnOnce() -> R) -> (R, Duration, Duration) {
    let (cpu, wall) = (thread_cpu(), Instant::now());
    let result = wait();
    (result, thread_cpu() - cpu, wall.elapsed())
}

/// A signal at 0 and the next value a queue of `device` signals on it
/// (recorded as an event, which the fake completes after its delay).
fn signalled(device: &CudaDevice, queue: &mut hwqueue::cuda::CudaQueue, value: u64) -> CudaSignal {
    let signal = device.new_signal(0).unwrap();
    queue.signal(&signal, value).submit().unwrap();
    signal
}

fn micros(duration: Duration) -> String {
    duration.as_micros().to_string()
}

const TRIES: usize = 5;
const LONG: Duration = Duration::from_secs(10);

/// The child's half: `case` names what to measure (the event delay is the
/// scenario's `HWQUEUE_FAKE_EVENT_DELAY_US`). Each case waits [`TRIES`]
/// times for a fresh signal and reports the waits' CPU and wall times, in
/// µs, comma-separated (`cpu`, `wall`), and each wait's outcome
/// (`outcome`: `ok`, or the error's variant).
pub(super) fn run(device: &CudaDevice, case: &str) {
    let mut queue = device.compute_queue().unwrap();
    // A first wait, not measured: loads and binds what the first use of a
    // queue and a signal needs. Polled, not a `wait`, so that it does not
    // count into the device's average: a 1 ms warm-up wait had raised it
    // over `MAX_SPIN` and cut the default spin to 20 µs, so (c) could not
    // tell `Sleep` from the default.
    let warm = signalled(device, &mut queue, 1);
    while !warm.is_reached(1) {
        std::thread::sleep(Duration::from_micros(50));
    }
    report("budget_before", &micros(device.wait_tuning().spin_budget()));
    let policy = match case {
        "spin" | "fail_spinning" => WaitPolicy::Spin,
        "sleep" => WaitPolicy::Sleep,
        _ => WaitPolicy::Adaptive,
    };
    device.set_wait_policy(policy);
    report("policy", &format!("{:?}", device.wait_policy()));
    let mut cpu = Vec::new();
    let mut wall = Vec::new();
    let mut outcome = Vec::new();
    // One more than reported: the first wait of a kind does first-time
    // work (allocations, lazy set-up) that would blur its CPU share.
    for attempt in 0..=TRIES {
        let (result, spent, took) = match case {
            "adaptive" | "spin" | "sleep" | "wait_foreign" => {
                let signal = signalled(device, &mut queue, 1);
                measured(|| signal.wait(1, Timeout::Forever))
            }
            // A finite timeout spins too, then polls.
            "adaptive_timed" => {
                let signal = signalled(device, &mut queue, 1);
                measured(|| signal.wait(1, LONG))
            }
            // Waits that time out long before their event completes.
            "timed_out" => {
                let signal = signalled(device, &mut queue, 1);
                measured(|| signal.wait(1, Duration::from_micros(50)))
            }
            "fail_spinning" => fail_while_waiting(device, &mut queue, false),
            "fail_timed" => fail_while_waiting(device, &mut queue, true),
            "wait_any" => {
                let (pending, never) = (
                    signalled(device, &mut queue, 1),
                    device.new_signal(0).unwrap(),
                );
                measured(|| {
                    wait_any(&[(&never, 1), (&pending, 1)], Timeout::Forever).map(|index| {
                        assert_eq!(index, 1);
                    })
                })
            }
            "wait_all" => {
                let first = signalled(device, &mut queue, 1);
                let second = signalled(device, &mut queue, 2);
                measured(|| wait_all(&[(&first, 1), (&second, 2)], Timeout::Forever))
            }
            other => panic!("no wait-policy case `{other}`"),
        };
        if attempt == 0 {
            continue;
        }
        cpu.push(micros(spent));
        wall.push(micros(took));
        outcome.push(match result {
            Ok(()) => "ok".to_owned(),
            Err(Error::SignalFailed { .. }) => "SignalFailed".to_owned(),
            Err(Error::Timeout { .. }) => "Timeout".to_owned(),
            Err(error) => format!("{error}"),
        });
    }
    report("cpu", &cpu.join(","));
    report("wall", &wall.join(","));
    report("outcome", &outcome.join(","));
    report("average", &micros(device.wait_tuning().average()));
    if case == "wait_foreign" {
        wait_foreign(device, &mut queue);
    }
}

/// A value failed on the host while a thread waits for it: the signal's
/// event stands for a higher value (5, recorded), the waiter waits for 3,
/// and the host fails up to 4 two milliseconds in. Returns the waiter's
/// result and times; panics if the event had completed by then (the
/// failure, not the event, must have woken it). `timed`: the waiter
/// waits with a finite timeout.
fn fail_while_waiting(
    device: &CudaDevice,
    queue: &mut hwqueue::cuda::CudaQueue,
    timed: bool,
) -> (Result<(), Error>, Duration, Duration) {
    let signal = signalled(device, queue, 5);
    let waiting = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            waiting.store(true, Ordering::Release);
            measured(|| {
                if timed {
                    signal.wait(3, LONG)
                } else {
                    signal.wait(3, Timeout::Forever)
                }
            })
        });
        // A new thread may take a while to run on a busy machine: the
        // failure comes once it is about to wait.
        while !waiting.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2));
        signal.fail(
            4,
            Error::Abandoned {
                reason: "failed by the test",
            },
        );
        let measured = waiter.join().unwrap();
        assert!(
            !signal.is_reached(5),
            "the event completed before the failure woke the waiter: the test proves nothing"
        );
        measured
    })
}

/// A CPU queue waits on the delayed CUDA signal, then signals a CPU
/// signal: reported as `foreign_before` (whether the CPU signal was set
/// before the CUDA event completed: must not be) and `foreign`.
fn wait_foreign(device: &CudaDevice, queue: &mut hwqueue::cuda::CudaQueue) {
    let cpu = CpuDevice::new();
    let mut cpu_queue = cpu.compute_queue().unwrap();
    let done = cpu.new_signal(0).unwrap();
    let pending = signalled(device, queue, 1);
    cpu_queue
        .wait_foreign(&pending, 1)
        .signal(&done, 1)
        .submit()
        .unwrap();
    report("foreign_before", &done.is_reached(1).to_string());
    let waited = done.wait(1, LONG);
    report(
        "foreign",
        &format!("{:?} cuda_reached={}", waited, pending.is_reached(1)),
    );
}

/// Runs `case` in a child over a fake device whose events complete
/// `delay_us` after their record.
fn case(case: &str, delay_us: &str) -> Option<Outcome> {
    let scenario = format!("wait_policy:{case}");
    let outcome = run_scenario(&on_a_12_2_device(
        &scenario,
        &[("HWQUEUE_FAKE_EVENT_DELAY_US", delay_us)],
    ))?;
    assert_eq!(outcome.field("device"), "ok", "{outcome:#?}");
    Some(outcome)
}

/// A report line of comma-separated µs, as durations.
fn times(outcome: &Outcome, key: &str) -> Vec<Duration> {
    outcome
        .field(key)
        .split(',')
        .map(|us| Duration::from_micros(us.parse().unwrap()))
        .collect()
}

fn assert_all_ok(outcome: &Outcome) {
    let expected = ["ok"; TRIES].join(",");
    assert_eq!(outcome.field("outcome"), expected, "{outcome:#?}");
}

/// The second-lowest CPU time of the waits: what the sleeping cases
/// bound, so that at least 2 of the [`TRIES`] must be under the bound (as
/// [`assert_spun`] asks of spinning ones). A wait can be charged
/// milliseconds of kernel time on a loaded machine: each poll's driver
/// call appends to the fake's call log (an open, a write, a close), which
/// says nothing of the policy. Seen: 5 ms of CPU for one 10 ms wait that
/// polled; and in a CI run with other builds on the 2 cores, 304, 2,023,
/// 3,044, 3,673 and 3,765 µs for five (the median, held to 3 ms before,
/// failed), where an idle machine reads 300–800 µs each. A policy that
/// spins does so in every wait.
fn low_cpu(outcome: &Outcome) -> Duration {
    let mut cpu = times(outcome, "cpu");
    cpu.sort_unstable();
    cpu[1]
}

/// Asserts that the waits spun: at least 2 of the [`TRIES`] were on the
/// CPU for more than `share` of their wall time. A waiter that sleeps,
/// even one polling with back-off, is at 10–60% for a 150 µs wait here and
/// under 5% for a 2 ms one, and one that sleeps in the driver uses about
/// 30 µs of a 10 ms wait (0.3%); one that spins is at 95–100% on an idle
/// machine, but only at 10–35% where two `yes >/dev/null` and another
/// test's child share 2 cores with it (held to 30%, `the_spin_policy_never_
/// sleeps` failed 2 runs in 10 so, all 3 tries short): long spins are held
/// to [`LONG_SPIN`].
fn assert_spun(outcome: &Outcome, share: f64) {
    let spun = spun(outcome, share);
    assert!(spun >= 2, "{spun} of {TRIES} waits spun: {outcome:#?}");
}

/// The share of its wall time a waiter of milliseconds is on the CPU for
/// at least, to count as spinning ([`assert_spun`]): twice a polling
/// waiter's, 30 times a sleeping one's, and under what a spinning one gets
/// on 2 cores shared with other busy work.
const LONG_SPIN: f64 = 0.1;

/// How many of the waits were on the CPU for more than `share` of their
/// wall time.
fn spun(outcome: &Outcome, share: f64) -> usize {
    let (cpu, wall) = (times(outcome, "cpu"), times(outcome, "wall"));
    cpu.iter()
        .zip(&wall)
        .filter(|(cpu, wall)| cpu.as_secs_f64() > share * wall.as_secs_f64())
        .count()
}

/// [`case`], run again (up to 3 times in all) while fewer than 2 of its
/// waits spun at `share`: the outcome to check. A machine busy with other
/// work can take the CPU from a spinning waiter for a whole short wait
/// (seen once: 0 of 5 while builds and valgrind ran beside the tests);
/// it never puts a sleeping one on the CPU for most of a wait, so a retry
/// cannot pass a policy that does not spin.
fn case_spinning(name: &str, delay_us: &str, share: f64) -> Option<Outcome> {
    let mut outcome = case(name, delay_us)?;
    for _ in 1..3 {
        if spun(&outcome, share) >= 2 {
            break;
        }
        outcome = case(name, delay_us)?;
    }
    Some(outcome)
}

/// (a) A short wait (an event 150 µs away) under the default policy ends
/// while spinning: the thread was on the CPU for most of the wait. Under
/// the old behaviour (sleep in `cuEventSynchronize` at once) its CPU time
/// was a few µs of a 150 µs wait.
#[test]
fn a_short_wait_spins_under_the_default_policy() {
    let Some(outcome) = case_spinning("adaptive", "150", 0.8) else {
        return;
    };
    assert_eq!(outcome.field("policy"), "Adaptive");
    assert_all_ok(&outcome);
    assert_spun(&outcome, 0.8);
}

/// (b) A 10 ms wait under the default policy spins at most its budget
/// (200 µs), then sleeps: well under 10 ms of CPU time, each time.
#[test]
fn a_10_ms_wait_sleeps_after_its_spin() {
    let Some(outcome) = case("adaptive", "10000") else {
        return;
    };
    assert_all_ok(&outcome);
    let cpu = low_cpu(&outcome);
    assert!(cpu < Duration::from_millis(3), "{cpu:?}: {outcome:#?}");
    // The measured waits counted into the device's average (at most 1 ms
    // each; the warm-up counts nothing, and left the first budget in full).
    assert_eq!(outcome.field("budget_before"), "200", "{outcome:#?}");
    let average: u64 = outcome.field("average").parse().unwrap();
    assert!(average > 200, "{outcome:#?}");
}

/// (b') The same with a finite timeout: spin, then polls with back-off.
#[test]
fn a_10_ms_wait_with_a_timeout_sleeps_after_its_spin() {
    let Some(outcome) = case("adaptive_timed", "10000") else {
        return;
    };
    assert_all_ok(&outcome);
    let cpu = low_cpu(&outcome);
    assert!(cpu < Duration::from_millis(3), "{cpu:?}: {outcome:#?}");
}

/// (b'') Waits that time out after 50 µs on 10 ms events never saw how
/// long their events took: they must not teach the device that its waits
/// are short (each counted its 50 µs, and the average fell from 100 µs).
#[test]
fn timed_out_waits_do_not_shorten_the_average() {
    let Some(outcome) = case("timed_out", "10000") else {
        return;
    };
    assert_eq!(outcome.field("budget_before"), "200", "{outcome:#?}");
    let timeouts = ["Timeout"; TRIES].join(",");
    assert_eq!(outcome.field("outcome"), timeouts, "{outcome:#?}");
    let average: u64 = outcome.field("average").parse().unwrap();
    assert!(average >= 100, "{outcome:#?}");
}

/// (c) `WaitPolicy::Sleep`: a 150 µs wait does not spin. The default
/// would spin all of it: waits that short keep its budget at 200 µs (a
/// 1 ms wait here, as this test had, raised the average past 200 µs on
/// the first, unreported, wait and cut the default's spin to 20 µs, so
/// the test passed with `Sleep` spinning as the default does).
#[test]
fn the_sleep_policy_never_spins() {
    let Some(outcome) = case("sleep", "150") else {
        return;
    };
    assert_eq!(outcome.field("policy"), "Sleep");
    assert_eq!(outcome.field("budget_before"), "200", "{outcome:#?}");
    assert_all_ok(&outcome);
    let cpu = low_cpu(&outcome);
    assert!(cpu < Duration::from_micros(75), "{cpu:?}: {outcome:#?}");
}

/// (d) `WaitPolicy::Spin`: a 10 ms wait spins all the way.
#[test]
fn the_spin_policy_never_sleeps() {
    let Some(outcome) = case_spinning("spin", "10000", LONG_SPIN) else {
        return;
    };
    assert_eq!(outcome.field("policy"), "Spin");
    assert_all_ok(&outcome);
    // 10 ms waits: a sleeping one uses about 30 µs of CPU.
    assert_spun(&outcome, LONG_SPIN);
}

/// (e) A value failed on the host while a thread spins on the event of a
/// higher value wakes it with `SignalFailed`, long before the event (100 ms
/// away) completes.
#[test]
fn a_failure_wakes_a_spinning_waiter() {
    let Some(outcome) = case_spinning("fail_spinning", "100000", LONG_SPIN) else {
        return;
    };
    assert_eq!(outcome.field("policy"), "Spin");
    let expected = ["SignalFailed"; TRIES].join(",");
    assert_eq!(outcome.field("outcome"), expected, "{outcome:#?}");
    // It was spinning (on the CPU for most of its wait), not asleep.
    assert_spun(&outcome, LONG_SPIN);
}

/// (e') The same under the default policy with a finite timeout: the spin
/// is over by the failure, and the polls after it see it.
#[test]
fn a_failure_wakes_a_waiter_polling_after_its_spin() {
    let Some(outcome) = case("fail_timed", "100000") else {
        return;
    };
    let expected = ["SignalFailed"; TRIES].join(",");
    assert_eq!(outcome.field("outcome"), expected, "{outcome:#?}");
}

/// (f) `wait_any` and `wait_all` over delayed CUDA signals complete under
/// the default policy: a short one spins, a long one sleeps after its
/// spin.
#[test]
fn multi_waits_on_cuda_signals_spin_then_sleep() {
    for multi in ["wait_any", "wait_all"] {
        let Some(short) = case_spinning(multi, "150", 0.8) else {
            return;
        };
        assert_all_ok(&short);
        assert_spun(&short, 0.8);
        let Some(long) = case(multi, "10000") else {
            return;
        };
        assert_all_ok(&long);
        let cpu = low_cpu(&long);
        assert!(
            cpu < Duration::from_millis(3),
            "{multi}: {cpu:?}: {long:#?}"
        );
    }
}

/// (f') A CPU queue's `wait_foreign` on a delayed CUDA signal holds the
/// CPU queue until the event completes.
#[test]
fn a_cpu_queue_waits_for_a_delayed_cuda_signal() {
    let Some(outcome) = case("wait_foreign", "10000") else {
        return;
    };
    assert_eq!(outcome.field("foreign_before"), "false", "{outcome:#?}");
    assert_eq!(
        outcome.field("foreign"),
        "Ok(()) cuda_reached=true",
        "{outcome:#?}"
    );
}
