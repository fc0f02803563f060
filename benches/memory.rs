//! The CPU device's memory pool against the system allocator.
//!
//! One *cycle* is: allocate, write one byte per 4 KiB page (the first touch
//! a kernel would make), free. Each iteration runs 10,000 cycles over a
//! fixed list of sizes drawn log-uniformly with a fixed seed.
//!
//! | group | sizes |
//! |-------|-------|
//! | `alloc_free_mixed` | 256 B – 16 MiB |
//! | `alloc_free_small` | 64 B – 4 KiB |
//!
//! | function | what allocates |
//! |----------|----------------|
//! | `pooled_uninit` | the pool, uninitialised (`Device::alloc_uninit`) |
//! | `pooled_zeroed` | the pool, zeroed (`Device::alloc`) |
//! | `system_uninit` | `std::alloc::alloc`, 64-byte aligned: glibc's `malloc` (the peer a CPU pool must beat) |
//! | `device_alloc` | what `CpuDevice::alloc` did before the pool: `std::alloc::alloc_zeroed`, 64-byte aligned, and the buffer's shared handle |
//! | `touch_only` | nothing: the same touches on one buffer allocated and faulted in before timing (the floor every allocator pays) |
//!
//! Targets (ratios of medians, same run): `pooled_uninit/system_uninit` ≤ 1.0
//! in both groups; `pooled_uninit/device_alloc` ≤ 0.10 on the mixed sizes;
//! `pooled_zeroed/device_alloc` ≤ 1.0 in both. `touch_only` shows what no
//! allocator can go below: where `touch_only/device_alloc` is above 0.10
//! (on this project's 2-core VMs the touches alone cost about a fifth of
//! `device_alloc`), the 0.10 target is out of any allocator's reach there,
//! and `pooled_uninit/touch_only` is the figure that says how close the
//! pool gets. `benches/report.py` prints
//! them; the loop-shaped trace's `peak reserved / peak in use` is printed by
//! `cargo run --release --example memory`.

mod support;

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hwqueue::cpu::{CPU_BUFFER_ALIGN, CpuDevice};
use hwqueue::{Buffer, Device};
use hwqueue_testkit::log_uniform_sizes;

use support::Profile;

/// Cycles per iteration.
const CYCLES: usize = 10_000;
/// The page a first touch lands on.
const PAGE: usize = 4096;

/// Writes one byte per page of `size` bytes from `ptr`.
///
/// # Safety
/// `ptr` is valid for writes of `size` bytes.
#[inline]
unsafe fn touch(ptr: *mut u8, size: usize) {
    let mut offset = 0;
    while offset < size {
        // SAFETY: `offset < size`, inside the caller's allocation.
        unsafe { ptr.add(offset).write_volatile(1) };
        offset += PAGE;
    }
}

fn cycles(c: &mut Criterion, group: &str, sizes: &[usize]) {
    let mut group = c.benchmark_group(group);
    support::configure(&mut group, Profile::Bandwidth);
    let device = CpuDevice::new();

    group.bench_function("pooled_uninit", |b| {
        b.iter(|| {
            for &size in sizes {
                let buffer = device.alloc_uninit(size).expect("alloc_uninit");
                // SAFETY: nothing else uses the buffer: it was just made.
                unsafe { touch(buffer.as_ptr(), size) };
                black_box(buffer);
            }
        });
    });

    group.bench_function("pooled_zeroed", |b| {
        b.iter(|| {
            for &size in sizes {
                let buffer = device.alloc(size).expect("alloc");
                // SAFETY: nothing else uses the buffer: it was just made.
                unsafe { touch(buffer.as_ptr(), size) };
                black_box(buffer);
            }
        });
    });

    group.bench_function("system_uninit", |b| {
        b.iter(|| {
            for &size in sizes {
                let layout = Layout::from_size_align(size, CPU_BUFFER_ALIGN).expect("layout");
                // SAFETY: `size` is not zero.
                let ptr = unsafe { alloc(layout) };
                assert!(!ptr.is_null());
                // SAFETY: the allocation is `size` bytes, ours alone; it is
                // freed with its own layout.
                unsafe {
                    touch(ptr, size);
                    dealloc(black_box(ptr), layout);
                }
            }
        });
    });

    // The floor: the same first touches on memory allocated once and
    // touched before, so no allocator and no page fault is timed.
    let floor = device.alloc(16 << 20).expect("alloc");
    // SAFETY: the buffer is ours alone; this faults its pages in once.
    unsafe { touch(floor.as_ptr(), floor.size()) };
    group.bench_function("touch_only", |b| {
        b.iter(|| {
            for &size in sizes {
                // SAFETY: `size` is at most 16 MiB, the buffer's size; the
                // buffer is ours alone.
                unsafe { touch(floor.as_ptr(), size) };
            }
        });
    });
    drop(floor);

    group.bench_function("device_alloc", |b| {
        b.iter(|| {
            for &size in sizes {
                let layout = Layout::from_size_align(size, CPU_BUFFER_ALIGN).expect("layout");
                // SAFETY: `size` is not zero.
                let ptr = unsafe { alloc_zeroed(layout) };
                assert!(!ptr.is_null());
                // The buffer's shared handle, as `CpuBuffer` made one.
                let handle = Arc::new((ptr as usize, size, parking_lot::RwLock::new(())));
                // SAFETY: as above.
                unsafe {
                    touch(ptr, size);
                    drop(black_box(handle));
                    dealloc(ptr, layout);
                }
            }
        });
    });

    group.finish();
    black_box(device.memory_stats());
}

fn alloc_free_mixed(c: &mut Criterion) {
    cycles(
        c,
        "alloc_free_mixed",
        &log_uniform_sizes(CYCLES, 256, 16 << 20, 7),
    );
}

fn alloc_free_small(c: &mut Criterion) {
    cycles(
        c,
        "alloc_free_small",
        &log_uniform_sizes(CYCLES, 64, 4096, 11),
    );
}

criterion_group!(benches, alloc_free_mixed, alloc_free_small);
criterion_main!(benches);
