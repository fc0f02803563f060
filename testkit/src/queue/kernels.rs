//! The harness's kernels.

use hwqueue::cpu::{KernelArgs, WorkGroup};

/// A kernel of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    Fill,
    Increment,
    Add,
    Explode,
}

/// How the harness's kernels start their panic messages: these panics are
/// expected (the queue turns them into a failed batch), so the hook from
/// [`quiet_expected_panics`] lets them unwind without a report, and without
/// the abort that libFuzzer's hook turns every panic into.
pub(crate) const EXPECTED_PANIC: &str = "expected kernel failure";

/// Installs, once per process, a panic hook that passes the harness
/// kernels' panics over and hands every other panic to the hook before it.
pub(crate) fn quiet_expected_panics() {
    // Test-only code, never run under loom: a plain `Once` is fine here.
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if !message.is_some_and(|message| message.starts_with(EXPECTED_PANIC)) {
                previous(info);
            }
        }));
    });
}

/// Panics (failing the `exec`) unless every buffer holds the global size.
pub(crate) fn check_bounds(group: &WorkGroup, args: &KernelArgs<'_>) -> usize {
    let global = group.global_size()[0];
    for index in 0..args.buffer_count() {
        let len = args.buffer(index).len::<u32>();
        if global > len {
            panic!(
                "{EXPECTED_PANIC}: global size {global} is past buffer {index} of {len} elements"
            );
        }
    }
    global
}

pub(crate) fn fill_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let value: u32 = args.scalar(0);
    let out = args.buffer(0).as_ptr::<u32>();
    for i in group.global_range(0) {
        // SAFETY: `i` is below the global size, which is within the buffer
        // (checked above); work-groups cover disjoint ranges.
        unsafe { out.add(i).write(value) };
    }
}

pub(crate) fn increment_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let (src, dst) = (
        args.buffer(0).as_ptr::<u32>(),
        args.buffer(1).as_ptr::<u32>(),
    );
    for i in group.global_range(0) {
        // SAFETY: `i` is within both buffers (checked above); element `i`
        // is touched by this work-group alone, read before it is written,
        // with raw pointers, so `src == dst` is fine.
        unsafe { dst.add(i).write(src.add(i).read().wrapping_add(1)) };
    }
}

pub(crate) fn add_kernel(group: &WorkGroup, args: &KernelArgs<'_>) {
    check_bounds(group, args);
    let [a, b, c] = [0, 1, 2].map(|index| args.buffer(index).as_ptr::<u32>());
    for i in group.global_range(0) {
        // SAFETY: as in `increment_kernel`: in bounds, one work-group per
        // element, raw reads before the raw write, so aliasing is fine.
        unsafe {
            c.add(i)
                .write(a.add(i).read().wrapping_add(b.add(i).read()))
        };
    }
}

pub(crate) fn explode_kernel(group: &WorkGroup, _args: &KernelArgs<'_>) {
    panic!("{EXPECTED_PANIC}: explode in work-group {:?}", group.id());
}
