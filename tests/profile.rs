//! Profiling: timestamps, kernel timing, the Chrome trace.

mod common;

use std::time::Duration;

use common::*;
use hwqueue::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::profile::now_ns;
use hwqueue::{
    AnyQueue, Buffer, Category, Device, ExecParams, HardwareQueue, QueueFactory, chrome_trace,
    time_exec,
};

/// Sleeps 20 ms (one work-group).
fn sleep_20ms(_: &WorkGroup, _: &KernelArgs<'_>) {
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn profiling_is_off_by_default_and_keeps_nothing() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let buffer = device.alloc(4 * 64).unwrap();
    assert!(!queue.profiling());
    queue
        .exec(
            &fill_program(),
            &[&buffer],
            &[1u32.into()],
            ExecParams::new_1d(64, 64),
        )
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    assert!(queue.take_profile().is_empty());
}

#[test]
fn timestamps_never_go_backwards_on_a_queue() {
    let device = CpuDevice::with_threads(2);
    let mut queue = device.compute_queue().unwrap();
    let signal = device.new_signal(0).unwrap();
    let buffer = device.alloc(4 * 4096).unwrap();
    queue.set_profiling(true);
    let mut value = 0;
    for _ in 0..20 {
        for _ in 0..5 {
            value += 1;
            queue
                .exec(
                    &fill_program(),
                    &[&buffer],
                    &[7u32.into()],
                    ExecParams::new_1d(4096, 64),
                )
                .memory_barrier()
                .signal(&signal, value);
        }
        queue.submit().unwrap();
    }
    queue.synchronize().unwrap();
    let events = queue.take_profile();
    let commands: Vec<_> = events
        .iter()
        .filter(|event| event.category != Category::Host)
        .collect();
    assert_eq!(commands.len(), 20 * 5 * 3);
    // In queue order (batch, then index), each command starts after the one
    // before it ended, and ends after it starts.
    let mut ordered = commands.clone();
    ordered.sort_by_key(|event| (event.batch, event.index));
    assert_eq!(ordered.first().unwrap().batch, 1);
    assert_eq!(ordered.last().unwrap().batch, 20);
    for pair in ordered.windows(2) {
        assert!(pair[0].end_ns >= pair[0].start_ns, "{:?}", pair[0]);
        assert!(
            pair[1].start_ns >= pair[0].end_ns,
            "went backwards: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    // Twenty submits and one synchronize on the host track.
    let host: Vec<_> = events
        .iter()
        .filter(|event| event.category == Category::Host)
        .map(|event| &*event.name)
        .collect();
    assert_eq!(host.iter().filter(|name| **name == "submit").count(), 20);
    assert_eq!(
        host.iter().filter(|name| **name == "synchronize").count(),
        1
    );
    // Taken once: a second take is empty.
    assert!(queue.take_profile().is_empty());
}

#[test]
fn a_kernel_that_sleeps_20ms_measures_at_least_that_within_the_host_bounds() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let program = CpuProgram::from_fn("sleep_20ms", 0, 0, sleep_20ms);
    queue.set_profiling(true);
    let before = now_ns();
    queue
        .exec(&program, &[], &[], ExecParams::new_1d(1, 1))
        .submit()
        .unwrap();
    queue.synchronize().unwrap();
    let after = now_ns();
    let events = queue.take_profile();
    let kernel = events
        .iter()
        .find(|event| event.category == Category::Kernel)
        .expect("the exec is in the profile");
    assert_eq!(&*kernel.name, "sleep_20ms");
    assert!(kernel.duration() >= Duration::from_millis(20), "{kernel:?}");
    assert!(
        before <= kernel.start_ns && kernel.end_ns <= after,
        "{kernel:?} outside [{before}, {after}]"
    );
}

#[test]
fn the_trace_json_has_one_event_per_command_and_the_wait_on_the_queue_that_waited() {
    let device = CpuDevice::new();
    let mut producer = device.compute_queue().unwrap();
    let mut consumer = device.compute_queue().unwrap();
    let ready = device.new_signal(0).unwrap();
    let buffer = device.alloc(4 * 256).unwrap();
    let sleep = CpuProgram::from_fn("sleep_20ms", 0, 0, sleep_20ms);
    producer.set_profiling(true);
    consumer.set_profiling(true);
    // The consumer waits (blocked ~20 ms) for the producer's kernel.
    consumer
        .wait(&ready, 1)
        .exec(
            &fill_program(),
            &[&buffer],
            &[3u32.into()],
            ExecParams::new_1d(256, 64),
        )
        .submit()
        .unwrap();
    producer
        .exec(&sleep, &[], &[], ExecParams::new_1d(1, 1))
        .signal(&ready, 1)
        .submit()
        .unwrap();
    producer.synchronize().unwrap();
    consumer.synchronize().unwrap();
    let mut events = producer.take_profile();
    events.extend(consumer.take_profile());
    let trace = chrome_trace(&events);
    let json: serde_json::Value = serde_json::from_str(&trace).expect("the trace is JSON");
    let all = json["traceEvents"].as_array().expect("a traceEvents array");
    let complete: Vec<_> = all.iter().filter(|event| event["ph"] == "X").collect();
    let named = |name: &str| {
        complete
            .iter()
            .filter(|event| event["name"] == name)
            .count()
    };
    // One complete event per command, named after its kernel.
    assert_eq!(named("sleep_20ms"), 1);
    assert_eq!(named("fill"), 1);
    assert_eq!(named("signal"), 1);
    assert_eq!(named("wait"), 1);
    // The wait is on the consumer's track, and lasted about the sleep.
    let track_name = |tid: &serde_json::Value| {
        all.iter()
            .find(|event| event["ph"] == "M" && &event["tid"] == tid)
            .and_then(|event| event["args"]["name"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let wait = complete
        .iter()
        .find(|event| event["name"] == "wait")
        .unwrap();
    assert_eq!(
        track_name(&wait["tid"]),
        format!("{} (compute)", consumer.id())
    );
    let kernel = complete
        .iter()
        .find(|event| event["name"] == "sleep_20ms")
        .unwrap();
    // Cause and effect, not speed: the wait ended no earlier than the
    // kernel it waited for (timestamps are microseconds, rounded).
    let end =
        |event: &serde_json::Value| event["ts"].as_f64().unwrap() + event["dur"].as_f64().unwrap();
    assert!(
        end(wait) + 1.0 >= end(kernel),
        "{wait} ended before {kernel}"
    );
    assert_eq!(
        track_name(&kernel["tid"]),
        format!("{} (compute)", producer.id())
    );
    assert_eq!(kernel["cat"], "kernel");
    assert!(kernel["ts"].as_f64().is_some() && kernel["dur"].as_f64().unwrap() >= 20_000.0);
    // Host calls are on a host track of their own.
    let submit = complete
        .iter()
        .find(|event| event["name"] == "submit")
        .unwrap();
    assert!(track_name(&submit["tid"]).ends_with("(host)"));
}

#[test]
fn kernel_timing_returns_n_samples_directly_and_through_the_any_enum() {
    let device = CpuDevice::new();
    let program = CpuProgram::from_fn("sleep_20ms", 0, 0, sleep_20ms);
    let mut queue = device.compute_queue().unwrap();
    let timing = time_exec(
        &mut queue,
        &program,
        &[],
        &[],
        ExecParams::new_1d(1, 1),
        1,
        3,
    )
    .unwrap();
    assert_eq!(timing.samples.len(), 3);
    assert!(timing.min() >= Duration::from_millis(20));
    // The queue's profiling is back off, and nothing is left behind.
    assert!(!queue.profiling());
    assert!(queue.take_profile().is_empty());

    let mut any = AnyQueue::from(device.compute_queue().unwrap());
    let any_program = hwqueue::AnyProgram::from(program);
    let timing = time_exec(
        &mut any,
        &any_program,
        &[],
        &[],
        ExecParams::new_1d(1, 1),
        0,
        2,
    )
    .unwrap();
    assert_eq!(timing.samples.len(), 2);
    // No runs is an error that says so.
    let error = time_exec(
        &mut any,
        &any_program,
        &[],
        &[],
        ExecParams::new_1d(1, 1),
        0,
        0,
    )
    .unwrap_err();
    assert!(error.to_string().contains("at least one run"), "{error}");
}

/// Issue 24, defect 3: a host event carries the batch it submitted, or 0
/// (a `synchronize`, an empty `submit`); it failed on `e666876`, where every
/// host event after the first submit carried the last batch's number.
#[test]
fn host_events_carry_the_batch_they_submitted_or_zero() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let signal = device.new_signal(0).unwrap();
    queue.set_profiling(true);
    queue.signal(&signal, 1).submit().unwrap(); // batch 1
    queue.synchronize().unwrap(); // no batch
    queue.submit().unwrap(); // empty: no batch
    queue.signal(&signal, 2).submit().unwrap(); // batch 2
    queue.synchronize().unwrap();
    let host: Vec<(String, u64)> = queue
        .take_profile()
        .into_iter()
        .filter(|e| e.category == Category::Host)
        .map(|e| (e.name.to_string(), e.batch))
        .collect();
    let expected: Vec<(String, u64)> = [
        ("submit", 1),
        ("synchronize", 0),
        ("submit", 0),
        ("submit", 2),
        ("synchronize", 0),
    ]
    .map(|(n, b)| (n.to_owned(), b))
    .into();
    assert_eq!(host, expected);
}

/// Panics (one work-group).
fn explode(_: &WorkGroup, _: &KernelArgs<'_>) {
    panic!("boom in the profiled kernel");
}

/// Does nothing (one work-group).
fn nothing(_: &WorkGroup, _: &KernelArgs<'_>) {}

/// The CPU worker keeps one tick per command while a batch runs and makes
/// the events after it: the commands that ran get theirs, named after
/// their kernels (a run of one kernel's, another's between), the failed
/// one says why, and nothing after it has one.
#[test]
fn a_failed_batch_profiles_the_commands_that_ran_and_says_why_the_last_failed() {
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let buffer = device.alloc(4 * 64).unwrap();
    let fill = fill_program();
    let nothing = CpuProgram::from_fn("nothing", 0, 0, nothing);
    let explode = CpuProgram::from_fn("explode", 0, 0, explode);
    let (params, one) = (ExecParams::new_1d(64, 64), ExecParams::new_1d(1, 1));
    queue.set_profiling(true);
    let before = now_ns();
    queue
        .exec(&fill, &[&buffer], &[1u32.into()], params)
        .exec(&fill, &[&buffer], &[2u32.into()], params)
        .exec(&nothing, &[], &[], one)
        .exec(&fill, &[&buffer], &[3u32.into()], params)
        .exec(&explode, &[], &[], one)
        .exec(&fill, &[&buffer], &[4u32.into()], params)
        .submit()
        .unwrap();
    queue.synchronize().unwrap_err();
    let after = now_ns();
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![3; 64]);
    let events = queue.take_profile();
    let commands: Vec<_> = events
        .iter()
        .filter(|e| e.category != Category::Host)
        .collect();
    let names: Vec<&str> = commands.iter().map(|e| &*e.name).collect();
    assert_eq!(
        names,
        ["fill", "fill", "nothing", "fill", "explode"],
        "{events:#?}"
    );
    assert_eq!(
        commands.iter().map(|e| e.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(commands[..4].iter().all(|e| e.detail.is_empty()));
    assert!(
        commands[4].detail.contains("failed:")
            && commands[4].detail.contains("boom in the profiled kernel"),
        "{:?}",
        commands[4].detail
    );
    assert!(commands.iter().all(|e| e.queue == commands[0].queue));
    assert!(
        commands
            .iter()
            .all(|e| before <= e.start_ns && e.start_ns <= e.end_ns && e.end_ns <= after),
        "an event outside the host's bounds {before}..{after}: {commands:#?}"
    );
}
