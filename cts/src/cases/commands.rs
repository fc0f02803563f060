//! Commands on buffers (IREE's `command_buffer_copy_buffer_test`,
//! `command_buffer_fill_buffer_test`, `command_buffer_dispatch_test`):
//! views, partial copies, fills, and what they must reject.

use hwqueue::{Device, Error, ExecParams, HardwareQueue, Scalar, View};

use crate::cx::{broke, check, setup};
use crate::rules::{COMMANDS, VALIDATION};
use crate::{Cx, Kernel, Target};

/// Checks that `error` (from `submit`) is a rejection whose cause matches
/// `expected` (each caller checks that the batch's data was untouched).
fn rejected(what: &str, error: Result<(), Error>, expected: fn(&Error) -> bool) {
    match error {
        Err(ref error @ Error::BatchRejected { .. }) if expected(error.root_cause()) => {}
        other => broke(
            VALIDATION,
            format!("{what}: submit gave {other:?}, not BatchRejected with the documented cause"),
        ),
    }
}

/// An `exec` on a view sees the view as its buffer: the kernel touches the
/// view's elements and nothing around them.
pub fn view_exec_touches_only_its_range<T: Target>(cx: &Cx<T>) {
    let add = cx.program(Kernel::Add);
    let data = cx.buffer(&[0; 64]);
    // Elements 16..48: offset 64 bytes, a multiple of every backend's view
    // alignment.
    let view = setup("view", View::new(&data, 64, 128));
    let mut queue = cx.queue();
    queue.exec_views(
        &add,
        &[&view],
        &[Scalar::U32(3)],
        ExecParams::new_1d(32, 32),
    );
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    let got = cx.read(&data);
    let expected: Vec<u32> = (0..64)
        .map(|i| if (16..48).contains(&i) { 3 } else { 0 })
        .collect();
    check(got == expected, COMMANDS, || {
        format!("add 3 over a view of elements 16..48 left {got:?}")
    });
}

/// Copies of partial ranges, between buffers and within one (disjoint
/// ranges), at unaligned byte offsets.
pub fn copy_partial_ranges_between_and_within_buffers<T: Target>(cx: &Cx<T>) {
    let src = cx.buffer(&(1..=8).collect::<Vec<u32>>());
    let dst = cx.buffer(&[0; 8]);
    let mut queue = cx.queue();
    // Words 2..5 of src into words 4..7 of dst.
    queue.copy(
        &setup("dst view", View::new(&dst, 16, 12)),
        &setup("src view", View::new(&src, 8, 12)),
    );
    // Within src: its first word into its last.
    queue.copy(
        &setup("dst view", View::new(&src, 28, 4)),
        &setup("src view", View::new(&src, 0, 4)),
    );
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    check(cx.read(&dst) == [0, 0, 0, 0, 3, 4, 5, 0], COMMANDS, || {
        format!(
            "copying words 2..5 into words 4..7 left {:?}",
            cx.read(&dst)
        )
    });
    check(cx.read(&src) == [1, 2, 3, 4, 5, 6, 7, 1], COMMANDS, || {
        format!(
            "copying word 0 onto word 7 of one buffer left {:?}",
            cx.read(&src)
        )
    });
    // Bytes at odd offsets: byte 1..3 of word 0 into bytes 5..7.
    let bytes = setup("alloc", cx.device.alloc(8));
    setup(
        "write",
        hwqueue::Buffer::write_at(&bytes, 0, &[1u8, 2, 3, 4, 5, 6, 7, 8]),
    );
    queue.copy(
        &setup("dst view", View::new(&bytes, 5, 2)),
        &setup("src view", View::new(&bytes, 1, 2)),
    );
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    let got = setup("read", hwqueue::Buffer::to_vec::<u8>(&bytes));
    check(got == [1, 2, 3, 4, 5, 2, 3, 8], COMMANDS, || {
        format!("a 2-byte copy from offset 1 to offset 5 left {got:?}")
    });
}

/// Overlapping ranges of one buffer, and unequal lengths, reject the batch
/// and nothing of it runs.
pub fn copy_overlap_and_size_mismatch_reject_the_batch<T: Target>(cx: &Cx<T>) {
    let data = cx.buffer(&[1, 2, 3, 4]);
    let other = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.fill(&other, 9u32).copy(
        &setup("view", View::new(&data, 4, 8)),
        &setup("view", View::new(&data, 0, 8)),
    );
    rejected("an overlapping copy", queue.submit(), |e| {
        matches!(e, Error::CopyOverlap { .. })
    });
    queue
        .fill(&other, 9u32)
        .copy(&other, &setup("view", View::new(&data, 0, 8)));
    rejected("a 16-byte destination for 8 bytes", queue.submit(), |e| {
        matches!(e, Error::CopySizeMismatch { .. })
    });
    setup("synchronize", queue.synchronize());
    check(cx.read(&other) == [0; 4], VALIDATION, || {
        format!("the fill of a rejected batch ran: {:?}", cx.read(&other))
    });
}

/// Fills with 1-, 2- and 4-byte patterns write exactly their range.
pub fn fill_patterns_of_1_2_and_4_bytes<T: Target>(cx: &Cx<T>) {
    let bytes = setup("alloc", cx.device.alloc(16));
    let mut queue = cx.queue();
    queue
        .fill(&setup("view", View::new(&bytes, 1, 3)), 0xabu8)
        .fill(&setup("view", View::new(&bytes, 4, 4)), 0x1234u16)
        .fill(&setup("view", View::new(&bytes, 8, 4)), 0x0102_0304u32);
    setup("submit", queue.submit());
    setup("synchronize", queue.synchronize());
    let got = setup("read", hwqueue::Buffer::to_vec::<u8>(&bytes));
    let mut expected = vec![0u8, 0xab, 0xab, 0xab];
    expected.extend(0x1234u16.to_ne_bytes().repeat(2));
    expected.extend(0x0102_0304u32.to_ne_bytes());
    expected.extend([0; 4]);
    check(got == expected, COMMANDS, || {
        format!("fills of 1, 2 and 4 bytes left {got:?}, not {expected:?}")
    });
}

/// A fill whose offset is not a multiple of its width rejects the batch.
pub fn fill_misaligned_rejects_the_batch<T: Target>(cx: &Cx<T>) {
    let data = cx.buffer(&[0; 4]);
    let mut queue = cx.queue();
    queue.fill(&setup("view", View::new(&data, 2, 4)), 1u32);
    rejected("a 4-byte fill at offset 2", queue.submit(), |e| {
        matches!(e, Error::InvalidFill { .. })
    });
    setup("synchronize", queue.synchronize());
    check(cx.read(&data) == [0; 4], VALIDATION, || {
        format!("a rejected fill ran: {:?}", cx.read(&data))
    });
}
