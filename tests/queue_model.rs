//! Model test of `CpuQueue`: random batches of exec (on buffers and views) /
//! copy (of buffers and views) / fill / upload / download / signal / wait /
//! barrier on two queues (the second sometimes a copy queue), against a
//! sequential interpreter (in `hwqueue_testkit`, shared with the
//! `cpu_queue` fuzz target). Compares which batches are rejected and why,
//! which failures `synchronize` reports, the final buffers, what every
//! download received, and every signal's value and failed values.

use hwqueue_testkit::{QueueOp, QueueProgram, Step, check_queue_program};
use proptest::prelude::*;

/// Work sizes: mostly valid, sometimes zero or not a multiple.
fn sizes() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        4 => (1u32..=4, 1u32..=2).prop_map(|(local, groups)| (local * groups, local)),
        1 => (0u32..=8, 0u32..=4),
    ]
}

/// An element offset or length (buffers hold up to 6 elements; the model
/// clamps).
fn element() -> impl Strategy<Value = usize> {
    0usize..8
}

fn op() -> impl Strategy<Value = QueueOp> {
    let buf = 0usize..4;
    prop_oneof![
        4 => (buf.clone(), any::<u32>(), sizes())
            .prop_map(|(buf, value, (global, local))| QueueOp::Fill { buf, value, global, local }),
        2 => (buf.clone(), buf.clone(), sizes())
            .prop_map(|(src, dst, (global, local))| QueueOp::Increment { src, dst, global, local }),
        2 => (buf.clone(), buf.clone(), buf.clone(), sizes())
            .prop_map(|(a, b, c, (global, local))| QueueOp::Add { a, b, c, global, local }),
        1 => sizes().prop_map(|(global, local)| QueueOp::Explode { global, local }),
        1 => buf.clone().prop_map(|buf| QueueOp::WrongArity { buf }),
        3 => (buf.clone(), buf.clone()).prop_map(|(dst, src)| QueueOp::Copy { dst, src }),
        3 => (buf.clone(), element(), buf.clone(), element(), element()).prop_map(
            |(dst, dst_at, src, src_at, len)| QueueOp::CopyRange { dst, dst_at, src, src_at, len }
        ),
        3 => (
            buf.clone(),
            0usize..28,
            0usize..28,
            any::<u32>(),
            prop::sample::select(vec![1u8, 2, 4, 8]),
        )
            .prop_map(|(buf, at, len, value, width)| QueueOp::FillRange {
                buf,
                at,
                len,
                value,
                width
            }),
        3 => (buf.clone(), element(), element(), any::<u32>())
            .prop_map(|(buf, at, len, seed)| QueueOp::Upload { buf, at, len, seed }),
        3 => (buf.clone(), element(), element())
            .prop_map(|(buf, at, len)| QueueOp::Download { buf, at, len }),
        3 => (buf.clone(), prop_oneof![Just(0usize), Just(4), element()], any::<u32>(), sizes())
            .prop_map(|(buf, at, value, (global, local))| QueueOp::FillView {
                buf,
                at,
                value,
                global,
                local
            }),
        1 => buf.clone().prop_map(|buf| QueueOp::UploadWrongSize { buf }),
        1 => buf.clone().prop_map(|buf| QueueOp::DownloadWrongSize { buf }),
        1 => buf.prop_map(|buf| QueueOp::DownloadTwice { buf }),
        1 => Just(QueueOp::Barrier),
        3 => (0u64..16).prop_map(|value| QueueOp::Signal { value }),
        3 => (0usize..2, 0u64..16).prop_map(|(signal, value)| QueueOp::Wait { signal, value }),
        1 => Just(QueueOp::WaitFailed),
        1 => Just(QueueOp::SignalPastTheRange),
        1 => Just(QueueOp::WaitPastTheRange),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0usize..2, proptest::collection::vec(op(), 1..6))
            .prop_map(|(queue, ops)| Step::Batch { queue, ops }),
        1 => (0usize..2).prop_map(|queue| Step::Synchronize { queue }),
    ]
}

fn program() -> impl Strategy<Value = QueueProgram> {
    (
        proptest::bool::weighted(0.2),
        proptest::collection::vec(1usize..=6, 1..=4),
        proptest::collection::vec(step(), 0..16),
    )
        .prop_map(|(copy_queue_1, buffer_lens, steps)| QueueProgram {
            copy_queue_1,
            buffer_lens,
            steps,
        })
}

proptest! {
    // 64 cases unless PROPTEST_CASES says otherwise (to stress it). A hang
    // shows as a 10 s bounded wait failing: cap the shrinking time.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(64),
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn two_cpu_queues_match_the_sequential_model(program in program()) {
        check_queue_program(&program);
    }
}

/// A fixed program that crosses queues: B increments what A filled, A
/// copies it back, a rejected batch and a failing one in between.
#[test]
fn a_fixed_cross_queue_program() {
    let program = QueueProgram {
        copy_queue_1: false,
        buffer_lens: vec![4, 4, 2],
        steps: vec![
            Step::Batch {
                queue: 0,
                ops: vec![
                    QueueOp::Fill {
                        buf: 0,
                        value: 7,
                        global: 4,
                        local: 2,
                    },
                    QueueOp::Signal { value: 3 },
                ],
            },
            Step::Batch {
                queue: 1,
                ops: vec![
                    QueueOp::Wait {
                        signal: 0,
                        value: 3,
                    },
                    QueueOp::Increment {
                        src: 0,
                        dst: 1,
                        global: 4,
                        local: 4,
                    },
                ],
            },
            Step::Batch {
                queue: 0,
                ops: vec![
                    QueueOp::Copy { dst: 2, src: 0 },
                    QueueOp::Signal { value: 9 },
                ],
            },
            Step::Batch {
                queue: 0,
                ops: vec![
                    QueueOp::Copy { dst: 0, src: 1 },
                    QueueOp::Explode {
                        global: 2,
                        local: 1,
                    },
                    QueueOp::Signal { value: 12 },
                ],
            },
            Step::Batch {
                queue: 1,
                ops: vec![QueueOp::Add {
                    a: 0,
                    b: 1,
                    c: 1,
                    global: 4,
                    local: 1,
                }],
            },
        ],
    };
    check_queue_program(&program);
}

mod in_order_failure {
    //! Found by the model: a batch that will not run (rejected at `submit`,
    //! or left recorded when the queue is dropped) failed its signals at
    //! once, so a waiter for a lower value that a batch submitted *before*
    //! it still had to set woke with `SignalFailed`, although that work
    //! then completed. The failure now keeps queue order.

    use std::time::Duration;

    use hwqueue::cpu::{CpuDevice, CpuQueue, CpuSignal};
    use hwqueue::{Buffer, Device, Error, HardwareQueue, QueueFactory, TimelineSignal};

    const LONG: Duration = Duration::from_secs(30);

    /// A queue held at `gate` by a batch that will signal `done` to 1.
    fn held_queue() -> (CpuDevice, CpuQueue, CpuSignal, CpuSignal) {
        let device = CpuDevice::new();
        let mut queue = device.compute_queue().unwrap();
        let gate = device.new_signal(0).unwrap();
        let done = device.new_signal(0).unwrap();
        queue.wait(&gate, 1).signal(&done, 1).submit().unwrap();
        (device, queue, gate, done)
    }

    #[test]
    fn a_rejected_batch_does_not_fail_what_earlier_batches_set() {
        let (device, mut queue, gate, done) = held_queue();
        let (small, big) = (device.alloc(4).unwrap(), device.alloc(8).unwrap());
        let error = queue
            .copy(&small, &big)
            .signal(&done, 2)
            .submit()
            .unwrap_err();
        assert!(matches!(error, Error::BatchRejected { .. }), "{error}");
        // 1 is still to be set by the held batch: pending, not failed.
        assert!(matches!(
            done.wait(1, Duration::ZERO),
            Err(Error::Timeout { .. })
        ));
        gate.set(1);
        done.wait(1, LONG).unwrap();
        // 2 fails, after the batch before it finished.
        assert!(matches!(
            done.wait(2, LONG),
            Err(Error::SignalFailed {
                target: 2,
                current: 1,
                ..
            })
        ));
        assert_eq!(small.to_vec::<u32>().unwrap(), vec![0]);
    }

    #[test]
    fn dropping_a_queue_does_not_fail_what_submitted_batches_set() {
        let (_device, mut queue, gate, done) = held_queue();
        queue.signal(&done, 2);
        drop(queue);
        assert!(matches!(
            done.wait(1, Duration::ZERO),
            Err(Error::Timeout { .. })
        ));
        gate.set(1);
        done.wait(1, LONG).unwrap();
        let error = done.wait(2, LONG).unwrap_err();
        assert!(error.to_string().contains("call `submit`"), "{error}");
    }

    #[test]
    fn a_discarded_batch_does_not_fail_what_submitted_batches_set() {
        let (_device, mut queue, gate, done) = held_queue();
        queue.signal(&done, 2).discard();
        assert!(matches!(
            done.wait(1, Duration::ZERO),
            Err(Error::Timeout { .. })
        ));
        gate.set(1);
        done.wait(1, LONG).unwrap();
        assert!(matches!(
            done.wait(2, LONG),
            Err(Error::SignalFailed { target: 2, .. })
        ));
        // The queue still works.
        queue.signal(&done, 3).submit().unwrap();
        done.wait(3, LONG).unwrap();
    }
}
