//! The memory pool over a loop-shaped trace, as a training or serving loop
//! makes one: every step allocates the same 40 tensors (sizes drawn
//! log-uniformly from 256 B to 16 MiB with a fixed seed) in order, the odd
//! ones in queue order (`alloca`, a `fill`, `dealloca`), and frees them in
//! reverse. It prints the pool's statistics and `peak reserved / peak in
//! use`,
//! and draws bytes in use and reserved over the trace into
//! `docs/memory.svg`.
//!
//! ```sh
//! cargo run --release --example memory
//! ```

use std::fmt::Write as _;

use hwqueue::cpu::CpuDevice;
use hwqueue::{Buffer, Device, HardwareQueue, QueueFactory, Result};
// The sizes of the memory bench, drawn the same way (the workspace's test
// scaffolding; a dev-dependency).
use hwqueue_testkit::log_uniform_sizes;

const STEPS: usize = 12;
const TENSORS: usize = 40;

/// The process's resident memory in bytes, where the system says
/// (`/proc/self/statm`: resident pages, times the page size).
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Prints the resident memory's growth since `before` beside what the
/// pool reserved (its blocks, and its bookkeeping), and whether they agree
/// within 10 % plus 4 MiB (the process's own allocations: the trace's
/// samples, the queues' threads).
fn compare_resident(what: &str, before: Option<usize>, device: &CpuDevice) {
    let stats = device.memory_stats();
    let held = stats.reserved + stats.bookkeeping;
    let mib = |bytes: usize| bytes as f64 / f64::from(1u32 << 20);
    match (before, resident()) {
        (Some(before), Some(now)) => {
            let growth = now.saturating_sub(before);
            let agree = growth.abs_diff(held) as f64 <= 0.10 * held as f64 + f64::from(4u32 << 20);
            println!(
                "{what}: resident memory grew {:.1} MiB; the pool reserves {:.1} MiB \
                 (+ {:.1} MiB bookkeeping); agree within 10% + 4 MiB: {}",
                mib(growth),
                mib(stats.reserved),
                mib(stats.bookkeeping),
                if agree { "yes" } else { "no" }
            );
        }
        _ => println!("{what}: resident memory is not readable here (no /proc/self/statm)"),
    }
}

fn main() -> Result<()> {
    let before = resident();
    let device = CpuDevice::new();
    let mut queue = device.compute_queue()?;
    let sizes = log_uniform_sizes(TENSORS, 256, 16 << 20, 3);
    // (in use, reserved) after every allocation and free.
    let mut samples: Vec<(usize, usize)> = Vec::new();
    let mut sample = |device: &CpuDevice| {
        let stats = device.memory_stats();
        samples.push((stats.in_use, stats.reserved));
    };
    for _ in 0..STEPS {
        let mut live = Vec::with_capacity(TENSORS);
        for (i, &size) in sizes.iter().enumerate() {
            let tensor = if i % 2 == 0 {
                device.alloc_uninit(size)?
            } else {
                queue.alloca(size)?
            };
            queue.fill(&tensor, 1u8);
            live.push(tensor);
            sample(&device);
        }
        queue.submit()?;
        while let Some(tensor) = live.pop() {
            if tensor.queue_ordered().is_some() {
                queue.dealloca(&tensor).submit()?;
                // The range goes back when the queue reaches the `dealloca`.
                queue.synchronize()?;
            }
            drop(tensor);
            sample(&device);
        }
    }
    queue.synchronize()?;

    let stats = device.memory_stats();
    println!("{stats}");
    compare_resident("loop-shaped trace", before, &device);
    // A peak of 0 would mean the trace allocated nothing: an error, not a
    // ratio that passes CI's check.
    let ratio = stats
        .peak_reserved_per_peak_in_use()
        .ok_or_else(|| hwqueue::Error::System {
            what: "the loop-shaped trace",
            detail: "nothing was ever in use, so there is no peak reserved / peak in use ratio"
                .into(),
        })?;
    println!(
        "loop-shaped trace: {STEPS} steps of {TENSORS} tensors; peak reserved / peak in use = \
         {ratio:.3} (target <= 1.25)"
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/memory.svg");
    std::fs::write(path, plot(&samples)).map_err(|e| hwqueue::Error::System {
        what: "writing docs/memory.svg",
        detail: e.to_string(),
    })?;
    println!("plot: {path}");
    println!("trimmed {} bytes back to the system", device.trim_memory());
    drop(queue);

    // Small buffers under a 1 MiB limit share blocks: reserved stays what
    // the process holds (it made one block per buffer, 44 MiB for 8,192).
    let device = CpuDevice::new();
    device.set_memory_limit(Some(1 << 20));
    let before = resident();
    let small: Vec<_> = (0..4000)
        .map(|_| {
            let buffer = device.alloc_uninit(128)?;
            buffer.write_from(&[1u8; 128])?;
            Ok(buffer)
        })
        .collect::<Result<_>>()?;
    println!("{}", device.memory_stats());
    compare_resident("4,000 small buffers under a 1 MiB limit", before, &device);
    drop(small);
    Ok(())
}

/// An SVG of bytes in use and reserved against the trace's operations.
fn plot(samples: &[(usize, usize)]) -> String {
    let (width, height, margin) = (900.0, 320.0, 50.0);
    let top = samples.iter().map(|s| s.1.max(s.0)).max().unwrap_or(1) as f64;
    let mib = top / f64::from(1u32 << 20);
    let x = |i: usize| margin + (width - 2.0 * margin) * i as f64 / samples.len().max(2) as f64;
    let y = |bytes: usize| height - margin - (height - 2.0 * margin) * bytes as f64 / top;
    let line = |pick: fn(&(usize, usize)) -> usize| {
        samples
            .iter()
            .enumerate()
            .fold(String::new(), |mut out, (i, s)| {
                let _ = write!(out, "{:.1},{:.1} ", x(i), y(pick(s)));
                out
            })
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{margin}\" y=\"20\" font-size=\"14\">hwqueue memory pool: a loop-shaped \
         trace ({STEPS} steps of {TENSORS} tensors, 256 B to 16 MiB)</text>\n"
    );
    let _ = write!(
        svg,
        "<line x1=\"{margin}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{margin}\" y1=\"{margin}\" x2=\"{margin}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"5\" y=\"{t}\">{mib:.0} MiB</text>\n<text x=\"5\" y=\"{b}\">0</text>\n\
         <text x=\"{r}\" y=\"{l}\" text-anchor=\"end\">allocations and frees, in order</text>\n",
        b = height - margin,
        r = width - margin,
        t = margin + 4.0,
        l = height - margin + 20.0,
    );
    let _ = write!(
        svg,
        "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"{}\"/>\n\
         <polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n\
         <text x=\"{lx}\" y=\"40\" fill=\"#d62728\">reserved from the system</text>\n\
         <text x=\"{lx}\" y=\"56\" fill=\"#1f77b4\">in use by buffers</text>\n</svg>\n",
        line(|s| s.1),
        line(|s| s.0),
        lx = width - 220.0,
    );
    svg
}
