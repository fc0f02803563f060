//! Queue submission (IREE's `submission_test`): order, settlement, what
//! `submit` leaves behind, discards, and a kernel run.

use hwqueue::{Error, ExecParams, HardwareQueue, Scalar, TimelineSignal};

use crate::cx::{broke, check, setup};
use crate::rules::{COMMANDS, MONOTONIC, ORDER, SETTLED};
use crate::{Cx, Kernel, LONG, SHORT, Target};

/// A queue's `signal` is set only once every command before it completed:
/// a batch held at a `wait` on a gate the host has not opened sets
/// nothing, then everything once the gate opens.
pub fn queue_signal_comes_after_the_work_before_it<T: Target>(cx: &Cx<T>) {
    let gate = cx.signal(0);
    let done = cx.signal(0);
    let data = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.wait(&gate, 1).fill(&data, 7u32).signal(&done, 1);
    setup("submit", queue.submit());
    if done.wait(1, SHORT).is_ok() {
        broke(
            ORDER,
            "the queue's signal was set while the `wait` before it still blocked (the gate was never opened)",
        );
    }
    gate.set(1);
    if let Err(error) = done.wait(1, LONG) {
        broke(
            ORDER,
            format!("the gate opened, but the signal after the fill: {error}"),
        );
    }
    check(cx.read(&data) == [7; 4], COMMANDS, || {
        format!("the fill before the signal left {:?}", cx.read(&data))
    });
}

/// Dropping a queue whose batch waits on a value nobody set yet returns
/// without waiting for it (the batch drains on its own, as the queue's
/// docs say), and the batch still runs once the value comes: a drop must
/// not block on a value only its caller can set.
pub fn queue_dropped_while_its_batch_waits_returns_and_the_batch_runs<T: Target>(cx: &Cx<T>) {
    let gate = cx.signal(0);
    let done = cx.signal(0);
    let data = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.wait(&gate, 1).fill(&data, 3u32).signal(&done, 1);
    setup("submit", queue.submit());
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(queue);
        let _ = sender.send(());
    });
    let returned = receiver.recv_timeout(LONG).is_ok();
    // Opened either way, so a drop that waited for it ends too.
    gate.set(1);
    check(returned, SETTLED, || {
        format!(
            "dropping a queue whose batch waits on a value not yet set did not return in {LONG:?}"
        )
    });
    if let Err(error) = done.wait(1, LONG) {
        broke(
            SETTLED,
            format!("the dropped queue's batch, once its gate opened: {error}"),
        );
    }
    check(cx.read(&data) == [3; 4], COMMANDS, || {
        format!("the dropped queue's fill left {:?}", cx.read(&data))
    });
}

/// Batches run in the order submitted: the second batch copies what the
/// first wrote.
pub fn queue_batches_run_in_submission_order<T: Target>(cx: &Cx<T>) {
    let done = cx.signal(0);
    let first = cx.buffer(&[0; 4]);
    let second = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.fill(&first, 1u32).signal(&done, 1);
    setup("submit batch 1", queue.submit());
    queue.copy(&second, &first).signal(&done, 2);
    setup("submit batch 2", queue.submit());
    if let Err(error) = done.wait(2, LONG) {
        broke(SETTLED, format!("the second batch's signal: {error}"));
    }
    setup("synchronize", queue.synchronize());
    let copied = cx.read(&second);
    check(copied == [1; 4], ORDER, || {
        format!(
            "batch 2 copied {copied:?} from what batch 1 fills with 1s: batch 2 ran before batch 1"
        )
    });
}

/// Every batch submitted settles: eight batches each signal their number,
/// and the last number is reached (or failed), never left hanging.
pub fn queue_every_submitted_batch_settles<T: Target>(cx: &Cx<T>) {
    const BATCHES: u64 = 8;
    let done = cx.signal(0);
    let data = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    for n in 1..=BATCHES {
        queue.fill(&data, n as u32).signal(&done, n);
        setup("submit", queue.submit());
    }
    match done.wait(BATCHES, LONG) {
        Ok(()) => {}
        Err(Error::Timeout { current, .. }) => broke(
            SETTLED,
            format!(
                "after {BATCHES} batches each signalling its number, the signal stood at {current} for {LONG:?}, none failed: a batch was dropped"
            ),
        ),
        Err(error) => broke(SETTLED, format!("batch {BATCHES}'s signal failed: {error}")),
    }
    setup("synchronize", queue.synchronize());
}

/// A queue's `signal` of a value below the signal's leaves it where it was.
pub fn queue_signal_never_lowers_a_value<T: Target>(cx: &Cx<T>) {
    let signal = cx.signal(0);
    signal.set(5);
    let mut queue = cx.queue();
    queue.signal(&signal, 3);
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    check(signal.value() == 5, MONOTONIC, || {
        format!(
            "a queue's signal(3) on a signal at 5 left it at {}",
            signal.value()
        )
    });
}

/// After `submit` nothing is recorded, and the next batch records afresh:
/// three batches, each one `add` of a distinct power of ten to the whole
/// buffer, each runs its own once. An `add` run twice, or a batch that
/// still held an earlier one's command, shows in the sum (a fill, which
/// the case used before, would not: run twice, it writes the same).
/// (The queue core clears what the engine hands back; the sum and the
/// signals show the engine ran each batch once.)
pub fn queue_submit_leaves_an_empty_batch_to_record_into<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let done = cx.signal(0);
    let data = cx.buffer(&[0; 16]);
    let mut queue = cx.queue();
    setup("an empty submit", queue.submit());
    for n in 0..3u32 {
        queue
            .exec(
                &add,
                &[&data],
                &[Scalar::U32(10u32.pow(n))],
                ExecParams::new_1d(16, 16),
            )
            .signal(&done, u64::from(n) + 1);
        check(queue.recorded() == 2, COMMANDS, || {
            format!(
                "after recording 2 commands into batch {}, recorded() is {}",
                n + 1,
                queue.recorded()
            )
        });
        setup("submit", queue.submit());
        check(queue.recorded() == 0, COMMANDS, || {
            format!("after submit, recorded() is {}", queue.recorded())
        });
    }
    setup("synchronize", queue.synchronize());
    check(done.value() == 3, SETTLED, || {
        format!(
            "three batches signalled 1, 2, 3; the signal reads {}",
            done.value()
        )
    });
    check(cx.read(&data) == [111; 16], COMMANDS, || {
        format!(
            "three batches adding 1, 10 and 100 once each left {:?}, not 111 each (a digit above 1 is a command run again)",
            cx.read(&data)
        )
    });
}

/// A discarded batch runs nothing, and its signals fail (in queue order)
/// rather than leave a waiter hanging; the queue then works.
pub fn queue_discard_fails_the_signals_it_would_set<T: Target>(cx: &Cx<T>) {
    let done = cx.signal(0);
    let data = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.fill(&data, 9u32).signal(&done, 1);
    queue.discard();
    match done.wait(1, LONG) {
        Err(Error::SignalFailed { .. }) => {}
        other => broke(
            SETTLED,
            format!("the signal of a discarded batch gave {other:?}, not SignalFailed"),
        ),
    }
    queue.signal(&done, 2);
    setup("submit after discard", queue.submit());
    setup("synchronize", queue.synchronize());
    check(cx.read(&data) == [0; 4], COMMANDS, || {
        format!("a discarded fill ran: {:?}", cx.read(&data))
    });
    check(done.value() == 2, SETTLED, || {
        format!(
            "the batch after the discard signalled 2; it reads {}",
            done.value()
        )
    });
}

/// `exec` runs the kernel over the grid: `add` adds its scalar to each
/// element, and two `exec`s in one batch run one after the other.
pub fn queue_exec_runs_the_kernel_over_the_grid<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let data = cx.buffer(&(0..64).collect::<Vec<u32>>());
    let mut queue = cx.queue();
    queue
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(5)],
            ExecParams::new_1d(64, 16),
        )
        .exec(
            &add,
            &[&data],
            &[Scalar::U32(100)],
            ExecParams::new_1d(64, 32),
        );
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    let expected: Vec<u32> = (105..169).collect();
    let got = cx.read(&data);
    check(got == expected, COMMANDS, || {
        format!("add 5 then add 100 over 0..64 gave {got:?}")
    });
}
