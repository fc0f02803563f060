//! Kernels and helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use hwqueue::cpu::{CpuProgram, KernelArgs, WorkGroup};

/// Generous bound for waits that must succeed: a hang fails the test instead
/// of blocking CI. Not a speed assertion.
pub const LONG: Duration = Duration::from_secs(30);

/// Runs `f` on a thread of its own and returns what it returns; fails the
/// test, naming `what`, if it has not finished within [`LONG`] (a hang
/// guard, not a timing assertion) or if it panicked.
pub fn no_hang<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(f());
    });
    match receiver.recv_timeout(LONG) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no progress in {LONG:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what}: failed (see above)")
        }
    }
}

/// `buf[i] = value` for every element of the group's 1-D range.
pub fn fill(group: &WorkGroup, args: &KernelArgs<'_>) {
    let value: u32 = args.scalar(0);
    // SAFETY: each group writes only its own range.
    let out = unsafe { args.buffer(0).slice_mut::<u32>(group.global_range(0)) };
    out.fill(value);
}

pub fn fill_program() -> CpuProgram {
    CpuProgram::from_fn("fill", 1, 1, fill)
}

/// `c[i] = a[i] + b[i]` (f32) over the group's 1-D range.
pub fn add(group: &WorkGroup, args: &KernelArgs<'_>) {
    let range = group.global_range(0);
    // SAFETY: a and b are only read; each group writes only its range of c.
    let (a, b, c) = unsafe {
        (
            &args.buffer(0).as_slice::<f32>()[range.clone()],
            &args.buffer(1).as_slice::<f32>()[range.clone()],
            args.buffer(2).slice_mut::<f32>(range),
        )
    };
    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
        *c = a + b;
    }
}

pub fn add_program() -> CpuProgram {
    CpuProgram::from_fn("add", 3, 0, add)
}

/// Appends scalar 0 to a log: `buf[0]` counts entries, `buf[1 + n]` holds
/// entry n. Run with one work-group.
pub fn append(_group: &WorkGroup, args: &KernelArgs<'_>) {
    let entry: u32 = args.scalar(0);
    let log = args.buffer(0);
    // SAFETY: one work-group: nothing else touches the log.
    let log = unsafe { log.slice_mut::<u32>(0..log.len::<u32>()) };
    let n = log[0] as usize;
    log[1 + n] = entry;
    log[0] += 1;
}

pub fn append_program() -> CpuProgram {
    CpuProgram::from_fn("append", 1, 1, append)
}

/// `dst[0] = src[0] + 1` (u32), one work-group.
pub fn increment(_group: &WorkGroup, args: &KernelArgs<'_>) {
    // SAFETY: one work-group; src and dst are distinct buffers.
    unsafe {
        let value = args.buffer(0).as_slice::<u32>()[0];
        args.buffer(1).slice_mut::<u32>(0..1)[0] = value + 1;
    }
}

pub fn increment_program() -> CpuProgram {
    CpuProgram::from_fn("increment", 2, 0, increment)
}

/// Panics in work-group 1.
pub fn explode(group: &WorkGroup, _args: &KernelArgs<'_>) {
    if group.id()[0] == 1 {
        panic!("boom in group 1");
    }
}

pub fn explode_program() -> CpuProgram {
    CpuProgram::from_fn("explode", 0, 0, explode)
}

/// `buf[global linear index] += 1` over a 3-D grid (u32).
pub fn count_3d(group: &WorkGroup, args: &KernelArgs<'_>) {
    let [gx, gy, _] = group.global_size();
    let view = args.buffer(0);
    for z in group.global_range(2) {
        for y in group.global_range(1) {
            let row = (z * gy + y) * gx;
            let xs = group.global_range(0);
            // SAFETY: groups cover disjoint index boxes, so each row segment
            // belongs to this group alone.
            let seg = unsafe { view.slice_mut::<u32>(row + xs.start..row + xs.end) };
            for v in seg {
                *v += 1;
            }
        }
    }
}

pub fn count_3d_program() -> CpuProgram {
    CpuProgram::from_fn("count_3d", 1, 0, count_3d)
}
/// Keeps the kernels failed on purpose from printing a panic message each
/// (hundreds a run of this test); every other panic prints as usual.
pub fn quiet_injected_failures() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map_or("", String::as_str);
            if !message.starts_with("injected failure") {
                default(info);
            }
        }));
    });
}

pub mod mock;

/// CUDA device 0, or `None` (printing `skipped: no CUDA driver`) where the
/// driver or a device is missing. A GPU job sets `HWQUEUE_REQUIRE_GPU`, so
/// that a missing driver fails the run instead of passing every test
/// without running it.
#[cfg(feature = "cuda")]
pub fn cuda_device() -> Option<hwqueue::cuda::CudaDevice> {
    use hwqueue::Backend;
    match hwqueue::cuda::Cuda::probe() {
        Ok(devices) if !devices.is_empty() => {
            Some(hwqueue::cuda::Cuda::open(0).expect("a probed CUDA device opens"))
        }
        _ => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_GPU").is_none(),
                "HWQUEUE_REQUIRE_GPU is set but no CUDA device was found"
            );
            println!("skipped: no CUDA driver");
            None
        }
    }
}
