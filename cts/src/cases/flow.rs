//! Work across commands, queues and the host: transfers in queue order,
//! multi-signal waits, cross-queue waits, failure and recovery, profiling,
//! executor plans and memory.

use std::sync::{Arc, Barrier};

use hwqueue::{
    Buffer, Category, Device, Download, Error, ExecParams, FailureScope, HardwareQueue,
    QueueFactory, Scalar, Schedule, TimelineSignal, wait_all, wait_any,
};

use crate::cx::{broke, check, setup};
use crate::rules::{COMMANDS, FAILURE, MEMORY, ORDER, PROFILE, SETTLED, WAIT};
use crate::{Cx, Kernel, LONG, SHORT, Target};

/// Uploads and downloads run in queue order with the commands around
/// them: each download sees exactly what came before it.
pub fn transfer_uploads_and_downloads_run_in_queue_order<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let data = cx.buffer(&[0; 4]);
    let first = Download::<u32>::new(4);
    let second = Download::<u32>::new(4);
    let mut queue = cx.queue();
    queue
        .upload(&data, &[1u32, 2, 3, 4])
        .exec(&add, &[&data], &[Scalar::U32(10)], ExecParams::new_1d(4, 4))
        .download(&data, &first)
        .upload(&data, &[9u32; 4])
        .download(&data, &second);
    setup("submit", queue.submit());
    let got = [first.take(LONG), second.take(LONG)];
    match got {
        [Ok(first), Ok(second)] => {
            check(first == [11, 12, 13, 14], ORDER, || {
                format!("upload 1..=4, add 10, download gave {first:?}")
            });
            check(second == [9; 4], ORDER, || {
                format!("a second upload then download gave {second:?}")
            });
        }
        other => broke(SETTLED, format!("the downloads gave {other:?}")),
    }
    setup("synchronize", queue.synchronize());
    check(cx.read(&data) == [9; 4], COMMANDS, || {
        format!(
            "the buffer ends as {:?}, not the last upload",
            cx.read(&data)
        )
    });
}

/// `wait_any` returns the index of a signal that reached its value;
/// `wait_all` returns once all did; both time out while none (or not all)
/// did.
pub fn wait_all_and_wait_any_over_signals<T: Target>(cx: &Cx<T>) {
    let a = cx.signal(0);
    let b = cx.signal(0);
    let waits = [(&a, 1), (&b, 1)];
    check(
        matches!(wait_any(&waits, SHORT), Err(Error::Timeout { .. })),
        WAIT,
        || "wait_any over two unset signals did not time out".into(),
    );
    let started = Barrier::new(2);
    let any = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            started.wait();
            wait_any(&waits, LONG)
        });
        started.wait();
        b.set(1);
        waiter.join()
    });
    match any {
        Ok(Ok(1)) => {}
        other => broke(
            WAIT,
            format!("wait_any, then b reached 1: {other:?}, not Ok(1)"),
        ),
    }
    check(
        matches!(wait_all(&waits, SHORT), Err(Error::Timeout { .. })),
        WAIT,
        || "wait_all returned with one of two signals unreached".into(),
    );
    a.set(1);
    if let Err(error) = wait_all(&waits, LONG) {
        broke(WAIT, format!("wait_all with both reached: {error}"));
    }
}

/// A queue's `wait` on another queue's signal holds it until that queue
/// got there: the second queue's copy sees the first queue's fill.
pub fn cross_queue_wait_orders_two_queues<T: Target>(cx: &Cx<T>) {
    let filled = cx.signal(0);
    let copied = cx.signal(0);
    let src = cx.buffer(&[0; 4]);
    let dst = cx.buffer(&[0; 4]);
    let mut producer = cx.queue();
    let mut consumer = match setup("copy_queue", cx.device.copy_queue()) {
        Some(queue) => queue,
        None => cx.queue(),
    };
    consumer
        .wait(&filled, 1)
        .copy(&dst, &src)
        .signal(&copied, 1);
    setup("submit the consumer", consumer.submit());
    if copied.wait(1, SHORT).is_ok() {
        broke(
            ORDER,
            "the consumer ran past its wait before the producer signalled",
        );
    }
    producer.fill(&src, 7u32).signal(&filled, 1);
    setup("submit the producer", producer.submit());
    if let Err(error) = copied.wait(1, LONG) {
        broke(SETTLED, format!("the consumer's signal: {error}"));
    }
    check(cx.read(&dst) == [7; 4], ORDER, || {
        format!(
            "the consumer copied {:?}, not the producer's 7s",
            cx.read(&dst)
        )
    });
    setup("synchronize", producer.synchronize());
    setup("synchronize", consumer.synchronize());
}

/// A batch that fails (its `wait` fails) fails its signals, and the batch
/// submitted after it fails too (it depended on it by queue order); the
/// owner is told once (`QueueFailed`), and the queue then runs new work.
pub fn failure_propagates_and_the_queue_recovers<T: Target>(cx: &Cx<T>) {
    let gate = cx.signal(0);
    let done = cx.signal(0);
    let first = cx.buffer(&[0; 4]);
    let second = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.wait(&gate, 1).fill(&first, 5u32).signal(&done, 1);
    setup("submit batch 1", queue.submit());
    queue.fill(&second, 6u32).signal(&done, 2);
    setup("submit batch 2", queue.submit());
    gate.fail(
        1,
        Error::Abandoned {
            reason: "failed by the conformance suite",
        },
    );
    for value in [1, 2] {
        match done.wait(value, LONG) {
            Err(ref error @ Error::SignalFailed { .. })
                if matches!(error.root_cause(), Error::Abandoned { .. }) => {}
            other => broke(
                FAILURE,
                format!(
                    "value {value} of a failed batch (or the one after it) gave {other:?}, not SignalFailed rooted in the gate's failure"
                ),
            ),
        }
    }
    match queue.synchronize() {
        Err(Error::QueueFailed { .. }) => {}
        other => broke(
            FAILURE,
            format!("the first synchronize after the failure gave {other:?}, not QueueFailed"),
        ),
    }
    if let Err(error) = queue.synchronize() {
        broke(FAILURE, format!("the failure was reported twice: {error}"));
    }
    queue.fill(&second, 8u32).signal(&done, 3);
    setup("submit after recovery", queue.submit());
    setup("synchronize after recovery", queue.synchronize());
    check(done.value() == 3, FAILURE, || {
        format!(
            "the batch after recovery signalled 3; the signal reads {}",
            done.value()
        )
    });
    check(
        cx.read(&first) == [0; 4] && cx.read(&second) == [8; 4],
        FAILURE,
        || {
            format!(
                "the failed batches ran ({:?}, {:?}), or the recovered one did not",
                cx.read(&first),
                cx.read(&second)
            )
        },
    );
}

/// With `FailureScope::Batch` a failed batch fails only itself: the batch
/// submitted after it runs; a failed batch still honours the waits after
/// its failed command before failing the signals after them; and a
/// `wait_settled` passes a failed value.
pub fn failure_scoped_to_its_batch_drains_and_settles<T: Target>(cx: &Cx<T>) {
    let gate = cx.signal(0);
    let later = cx.signal(0);
    let done = cx.signal(0);
    let drained = cx.signal(0);
    let second = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    setup(
        "set_failure_scope",
        queue.set_failure_scope(FailureScope::Batch),
    );
    queue
        .wait(&gate, 1)
        .signal(&done, 1)
        .wait(&later, 1)
        .signal(&drained, 1);
    setup("submit batch 1", queue.submit());
    queue.fill(&second, 6u32).signal(&done, 2);
    setup("submit batch 2", queue.submit());
    let mut settled = cx.queue();
    let after = cx.signal(0);
    settled.wait_settled(&gate, 1).signal(&after, 1);
    setup("submit the settled wait", settled.submit());
    gate.fail(
        1,
        Error::Abandoned {
            reason: "failed by the conformance suite",
        },
    );
    match done.wait(1, LONG) {
        Err(Error::SignalFailed { .. }) => {}
        other => broke(
            FAILURE,
            format!("value 1 of the failed batch gave {other:?}"),
        ),
    }
    match drained.wait(1, SHORT) {
        Err(Error::Timeout { .. }) => {}
        other => broke(
            FAILURE,
            format!(
                "the failed batch's value after its unset wait settled before that wait: {other:?} (FailureScope::Batch drains in order)"
            ),
        ),
    }
    later.set(1);
    match drained.wait(1, LONG) {
        Err(Error::SignalFailed { .. }) => {}
        other => broke(
            FAILURE,
            format!("the failed batch's last value, once its wait was met, gave {other:?}"),
        ),
    }
    if let Err(error) = done.wait(2, LONG) {
        broke(
            FAILURE,
            format!("the batch after a failed one did not run with FailureScope::Batch: {error}"),
        );
    }
    check(cx.read(&second) == [6; 4], FAILURE, || {
        format!(
            "the batch after the failed one wrote {:?}",
            cx.read(&second)
        )
    });
    if let Err(error) = after.wait(1, LONG) {
        broke(
            FAILURE,
            format!("a wait_settled on a failed value did not pass: {error}"),
        );
    }
    // The failure is reported to the owner once, here (every submit came
    // before it), and the queue runs on.
    match queue.synchronize() {
        Err(Error::QueueFailed { .. }) => {}
        other => broke(
            FAILURE,
            format!("the first synchronize after a failed batch gave {other:?}, not QueueFailed"),
        ),
    }
    if let Err(error) = queue.synchronize() {
        broke(
            FAILURE,
            format!("a failure reported once was reported again: {error}"),
        );
    }
    setup("synchronize", settled.synchronize());
}

/// With profiling on, each command of a completed batch has one event:
/// named, in order, on the queue's label, its end not before its start.
pub fn profile_events_name_each_command<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let data = cx.buffer(&[0; 16]);
    let other = cx.buffer(&[0; 16]);
    let done = cx.signal(0);
    let mut queue = cx.queue();
    queue.set_profiling(true);
    queue
        .fill(&data, 1u32)
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(1)],
            ExecParams::new_1d(16, 16),
        )
        .copy(&other, &data)
        .signal(&done, 1);
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    let events = queue.take_profile();
    let commands: Vec<_> = events
        .iter()
        .filter(|event| event.category != Category::Host)
        .collect();
    let names: Vec<&str> = commands.iter().map(|event| &*event.name).collect();
    let kernel_name = hwqueue::Program::signature(&add).name.clone();
    check(
        names == ["fill", kernel_name.as_str(), "copy", "signal"],
        PROFILE,
        || format!("the command events are {names:?}, not fill, {kernel_name}, copy, signal"),
    );
    for (index, event) in commands.iter().enumerate() {
        check(
            event.index == index && event.end_ns >= event.start_ns,
            PROFILE,
            || format!("event {index} is {event:?}"),
        );
        check(
            event.queue == commands[0].queue && event.batch == commands[0].batch,
            PROFILE,
            || format!("the events of one batch name different queues or batches: {commands:?}"),
        );
    }
    check(
        events
            .iter()
            .any(|event| &*event.name == "submit" && event.category == Category::Host),
        PROFILE,
        || format!("no host event for the submit among {events:?}"),
    );
}

/// An executor plan runs with its slot bound to a different buffer each
/// run, and its download sees that run's result.
pub fn plan_runs_with_a_buffer_bound_per_run<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let mut schedule = Schedule::<T::Backend>::new();
    let d = schedule.add_device(Arc::clone(&cx.device));
    let x = schedule.add_slot(d, "x", 16 * 4);
    schedule
        .exec(
            "add",
            d,
            &add,
            &[x],
            &[Scalar::U32(1)],
            ExecParams::new_1d(16, 16),
        )
        .reads(x, ..)
        .writes(x, ..);
    let download = schedule.download("download x", x).id();
    let mut plan = setup("plan", schedule.plan());
    for run in 0..3u32 {
        let input: Vec<u32> = (0..16).map(|i| i * 100 + run).collect();
        let bound = cx.buffer(&input);
        setup("bind", plan.bind(x, &bound));
        let result = Download::<u32>::new(16);
        setup("Plan::download", plan.download(download, &result));
        let finished = setup("run", plan.run());
        if let Err(error) = finished.wait(LONG) {
            broke(SETTLED, format!("run {run} of the plan: {error}"));
        }
        let expected: Vec<u32> = input.iter().map(|v| v + 1).collect();
        let got = setup("take", result.take(LONG));
        check(got == expected, COMMANDS, || {
            format!("run {run} downloaded {got:?}, not the bound buffer plus 1")
        });
        check(cx.read(&bound) == expected, COMMANDS, || {
            format!("run {run} left the bound buffer as {:?}", cx.read(&bound))
        });
    }
}

/// `alloc` is zeroed (a reused range too), `alloc(0)` is an empty buffer,
/// and where the backend counts memory the count follows the buffers.
pub fn memory_alloc_is_zeroed_and_counted<T: Target>(cx: &Cx<T>) {
    let dirty = cx.buffer(&[0xdead_beef; 256]);
    drop(dirty);
    let before = cx.device.memory_stats();
    let buffer = setup("alloc", cx.device.alloc(1024));
    check(cx.read(&buffer) == [0; 256], MEMORY, || {
        "alloc(1024) does not read as zeros (after a buffer of 0xdeadbeef was dropped)".into()
    });
    let after = cx.device.memory_stats();
    if after.live_allocations > 0 || after.in_use > 0 {
        check(after.in_use >= before.in_use + 1024, MEMORY, || {
            format!(
                "in use went from {} to {} over alloc(1024)",
                before.in_use, after.in_use
            )
        });
        drop(buffer);
        let freed = cx.device.memory_stats();
        check(freed.in_use == before.in_use, MEMORY, || {
            format!(
                "in use is {} after the buffer was dropped, {} before it",
                freed.in_use, before.in_use
            )
        });
    }
    let empty = setup("alloc(0)", cx.device.alloc(0));
    check(empty.size() == 0, MEMORY, || {
        format!("alloc(0) made {} bytes", empty.size())
    });
}

/// `alloca`'s buffer is usable by the commands after it, and by the host
/// until its `dealloca` runs (here: the batch held at a gate after the
/// fill); `dealloca` gives it back once they ran, after which the host's
/// access through a remaining handle is refused. A backend without queue-ordered memory
/// says so (`NoQueueOrderedMemory`), and the case checks only that.
pub fn memory_alloca_and_dealloca_in_queue_order<T: Target>(cx: &Cx<T>) {
    let mut queue = cx.queue();
    let scratch = match queue.alloca(16) {
        Ok(buffer) => buffer,
        Err(Error::NoQueueOrderedMemory { .. }) => {
            println!(
                "{} has no queue-ordered memory: alloca refused as documented",
                cx.backend()
            );
            return;
        }
        Err(error) => broke(MEMORY, format!("alloca(16): {error}")),
    };
    check(scratch.size() == 16, MEMORY, || {
        format!("alloca(16) made {} bytes", scratch.size())
    });
    let out = cx.buffer(&[0; 4]);
    let (filled, gate, done) = (cx.signal(0), cx.signal(0), cx.signal(0));
    queue
        .fill(&scratch, 4u32)
        .signal(&filled, 1)
        .wait(&gate, 1)
        .copy(&out, &scratch)
        .dealloca(&scratch)
        .signal(&done, 1);
    setup("submit", queue.submit());
    // Before the `dealloca` runs, the buffer is live: the host reads what
    // the queue wrote, and the queue has not run past the gate.
    setup("the wait for the fill", filled.wait(1, LONG));
    match scratch.to_vec::<u32>() {
        Ok(read) => check(read == [4; 4], MEMORY, || {
            format!("the host read {read:?} of alloca's buffer after its fill")
        }),
        Err(error) => broke(
            MEMORY,
            format!("a host read of alloca's buffer before its dealloca ran was refused: {error}"),
        ),
    }
    check(done.value() == 0, ORDER, || {
        "the batch ran past a wait on a gate never opened".into()
    });
    gate.set(1);
    setup("synchronize", queue.synchronize());
    check(cx.read(&out) == [4; 4], MEMORY, || {
        format!(
            "a fill of alloca's buffer, copied out, gave {:?}",
            cx.read(&out)
        )
    });
    check(
        matches!(
            scratch.write_at(0, &[1u32]),
            Err(Error::UseAfterDealloca { .. })
        ),
        MEMORY,
        || "a host write through a handle of a buffer whose dealloca ran was not refused".into(),
    );
}
