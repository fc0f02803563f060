//! The hwqueue demo: a small, honest pipeline on the CPU backend.
//!
//! A copy queue uploads two input vectors from staging buffers; a compute
//! queue waits on the copy queue's signal, runs two dependent kernels
//! (`c = a + b`, then `d = c * c`), and signals; the host waits on the final
//! signal, checks every element against plain Rust, and reports.

use std::time::Instant;

use hwqueue::cpu::{CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{Buffer, Device, ExecParams, HardwareQueue, QueueFactory, TimelineSignal, Timeout};

const N: usize = 1 << 22;
const LOCAL: u32 = 1024;

/// `c[i] = a[i] + b[i]`.
fn add(group: &WorkGroup, args: &KernelArgs<'_>) {
    let range = group.global_range(0);
    // SAFETY: a and b are only read; each work-group writes only its range of c.
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

/// `d[i] = c[i] * c[i]`.
fn square(group: &WorkGroup, args: &KernelArgs<'_>) {
    let range = group.global_range(0);
    // SAFETY: c is only read; each work-group writes only its range of d.
    let (c, d) = unsafe {
        (
            &args.buffer(0).as_slice::<f32>()[range.clone()],
            args.buffer(1).slice_mut::<f32>(range),
        )
    };
    for (d, c) in d.iter_mut().zip(c) {
        *d = c * c;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = CpuDevice::new();
    println!(
        "hwqueue demo on `{}` ({}, {} threads per exec)",
        device.spec(),
        device.name(),
        device.threads()
    );

    let bytes = N * size_of::<f32>();
    let a_host: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 * 0.5).collect();
    let b_host: Vec<f32> = (0..N).map(|i| 1.0 - (i % 7) as f32).collect();

    // Staging buffers filled by the host; device buffers filled by the copy queue.
    let staging_a = device.alloc(bytes)?;
    let staging_b = device.alloc(bytes)?;
    staging_a.write_from(&a_host)?;
    staging_b.write_from(&b_host)?;
    let [a, b, c, d] = [(); 4].map(|_| device.alloc(bytes));
    let (a, b, c, d) = (a?, b?, c?, d?);

    let uploaded = device.new_signal(0)?;
    let finished = device.new_signal(0)?;
    let mut copy = device
        .copy_queue()?
        .expect("the CPU backend has a copy queue");
    let mut compute = device.compute_queue()?;
    let add = CpuProgram::from_fn("add", 3, 0, add);
    let square = CpuProgram::from_fn("square", 2, 0, square);
    let params = ExecParams::new_1d(N as u32, LOCAL);

    let start = Instant::now();
    // Submit the consumer first: the signal, not submission order, orders them.
    compute
        .wait(&uploaded, 1)
        .exec(&add, &[&a, &b, &c], &[], params)
        .memory_barrier()
        .exec(&square, &[&c, &d], &[], params)
        .signal(&finished, 1)
        .submit()?;
    let submitted_compute = start.elapsed();
    copy.copy(&a, &staging_a)
        .copy(&b, &staging_b)
        .signal(&uploaded, 1)
        .submit()?;
    let submitted = start.elapsed();
    println!(
        "submitted: compute batch (wait uploaded>=1, exec add, barrier, exec square, signal finished=1) in {submitted_compute:?}; copy batch (2 copies of {} MiB, signal uploaded=1) by {submitted:?}",
        bytes >> 20
    );
    println!(
        "right after submit: uploaded={} finished={} (submit returns without waiting for the work)",
        uploaded.value(),
        finished.value()
    );

    finished.wait(1, Timeout::Forever)?;
    let elapsed = start.elapsed();
    compute.synchronize()?;
    copy.synchronize()?;
    println!(
        "after host wait:    uploaded={} finished={}",
        uploaded.value(),
        finished.value()
    );

    let result = d.to_vec::<f32>()?;
    let mismatches = a_host
        .iter()
        .zip(&b_host)
        .zip(&result)
        .filter(|((a, b), d)| (*a + *b) * (*a + *b) != **d)
        .count();
    if mismatches != 0 {
        return Err(format!("{mismatches} of {N} elements differ from plain Rust").into());
    }
    let moved = 2 * bytes + 3 * bytes + 2 * bytes;
    println!(
        "verified: all {N} elements of (a + b)^2 match plain Rust; pipeline took {elapsed:?} ({:.2} GB/s of memory traffic)",
        moved as f64 / elapsed.as_secs_f64() / 1e9
    );
    Ok(())
}
