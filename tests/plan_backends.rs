//! Plans over two backends (issue 44): the CPU beside a backend defined
//! outside the crate (the mock, in a `backend_set!` of the test's own, as
//! docs/backends.md shows) and beside Vulkan through `AnyBackend` (lavapipe
//! in CI). Runs are started back to back, several in flight, with a
//! failing run and a refused one among them; see
//! `hwqueue_testkit::two_backends`. The simulator's pair is in
//! `sim/tests/plan_backends.rs`.
#![cfg(not(loom))]

mod common;

use std::sync::Arc;

use common::mock::*;
use common::no_hang;
use hwqueue::cpu::CpuDevice;
use hwqueue::{Backend, View};
use hwqueue_testkit::check_plan_over_two_backends;

/// `data[i] += 1` (u32) over the view: the mock's `add` (its scalar is
/// always 1 in the harness; the mock passes no scalars to kernels).
fn add_one(views: &[View<Mock>]) {
    let view = &views[0];
    let mut memory = view.buffer().0.lock().unwrap();
    for word in memory[view.range()].chunks_exact_mut(4) {
        let value = u32::from_ne_bytes(word.try_into().unwrap()).wrapping_add(1);
        word.copy_from_slice(&value.to_ne_bytes());
    }
}

#[test]
fn a_plan_over_the_cpu_and_a_user_backend_runs_back_to_back() {
    no_hang("runs of a plan over the CPU and the mock", || {
        let cpu = Arc::new(MixedDevice::from(CpuDevice::new()));
        let mock = Arc::new(MixedDevice::from(Mock::open(4).unwrap()));
        // One scalar, as the harness passes (the mock's kernels see none).
        let add = MixedProgram::from(MockProgram {
            signature: hwqueue::KernelSignature::new("add", 1, 1),
            kernel: add_one,
        });
        check_plan_over_two_backends::<Mixed>(cpu, mock, Some(add));
    });
}

#[cfg(feature = "vulkan")]
#[test]
fn a_plan_over_the_cpu_and_vulkan_runs_back_to_back() {
    use hwqueue::vulkan::{VulkanDevice, VulkanProgram};
    use hwqueue::{AnyBackend, AnyDevice, AnyProgram};
    let devices = match hwqueue::vulkan::devices() {
        Ok(devices) => devices,
        Err(error) => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
                "HWQUEUE_REQUIRE_VULKAN is set, and no Vulkan driver ({error})"
            );
            println!("skipped: no Vulkan driver ({error})");
            return;
        }
    };
    let Some(usable) = devices.iter().find(|d| d.unusable.is_none()) else {
        assert!(
            std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
            "HWQUEUE_REQUIRE_VULKAN is set, and no usable Vulkan device ({devices:?})"
        );
        println!("skipped: no usable Vulkan device");
        return;
    };
    let ordinal = usable.spec.ordinal();
    no_hang("runs of a plan over the CPU and Vulkan", move || {
        let vulkan = VulkanDevice::open(ordinal).expect("a usable device opens");
        let add = VulkanProgram::from_wgsl("add", hwqueue_cts::ADD_WGSL, "add").unwrap();
        let cpu = Arc::new(AnyDevice::from(CpuDevice::new()));
        let other = Arc::new(AnyDevice::from(vulkan));
        assert_eq!(<AnyBackend as Backend>::ID, "any");
        check_plan_over_two_backends::<AnyBackend>(cpu, other, Some(AnyProgram::from(add)));
    });
}
