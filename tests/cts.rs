//! The conformance suite (`hwqueue-cts`) on the crate's own backends: the
//! CPU, and CUDA with the `cuda` feature (every case prints `skipped: no
//! CUDA driver` without a GPU). The simulator runs it in
//! `sim/tests/cts.rs`, with the broken variants the suite must catch.
#![cfg(not(loom))]

/// The CPU backend, its `add` kernel a Rust function.
mod cpu {
    use hwqueue::cpu::{Cpu, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
    use hwqueue_cts::{Kernel, Skip, Target};

    fn add(group: &WorkGroup, args: &KernelArgs<'_>) {
        let n: u32 = args.scalar(0);
        let data = args.buffer(0);
        let range = group.global_range(0);
        let end = range.end.min(data.len::<u32>());
        let start = range.start.min(end);
        // SAFETY: each work-group writes only the elements of its own
        // global range (disjoint from every other group's), clamped to the
        // buffer.
        for value in unsafe { data.slice_mut::<u32>(start..end) } {
            *value = value.wrapping_add(n);
        }
    }

    pub struct CpuTarget;

    impl Target for CpuTarget {
        type Backend = Cpu;

        fn device() -> Result<CpuDevice, Skip> {
            Ok(CpuDevice::new())
        }

        fn program(_device: &CpuDevice, kernel: Kernel) -> hwqueue::Result<CpuProgram> {
            match kernel {
                Kernel::Add => Ok(CpuProgram::from_fn("add", 1, 1, add)),
                other => unimplemented!("the CPU target has no {other:?}"),
            }
        }
    }

    hwqueue_cts::cts_suite!(CpuTarget);
}

/// The CUDA backend, its `add` kernel `hwqueue_cts::ADD_CUDA_C` compiled
/// by NVRTC; skipping without a driver or a device.
#[cfg(feature = "cuda")]
mod cuda {
    use hwqueue::Backend;
    use hwqueue::cuda::{Cuda, CudaDevice, CudaProgram};
    use hwqueue_cts::{Kernel, Skip, Target};

    pub struct CudaTarget;

    impl Target for CudaTarget {
        type Backend = Cuda;

        fn device() -> Result<CudaDevice, Skip> {
            let why = match Cuda::probe() {
                Ok(devices) if !devices.is_empty() => {
                    return Ok(Cuda::open(0).expect("a probed CUDA device opens"));
                }
                Ok(_) => "no CUDA device".to_owned(),
                Err(hwqueue::Error::NoDriver { .. }) => "no CUDA driver".to_owned(),
                // A driver that is there but fails says why.
                Err(error) => format!("the CUDA driver's probe failed: {error}"),
            };
            // A GPU job sets this so that a missing driver fails the run
            // instead of skipping every case.
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_GPU").is_none(),
                "HWQUEUE_REQUIRE_GPU is set but no CUDA device was found: {why}"
            );
            Err(Skip(why))
        }

        fn program(device: &CudaDevice, kernel: Kernel) -> hwqueue::Result<CudaProgram> {
            match kernel {
                Kernel::Add => {
                    CudaProgram::from_cuda_c(device, hwqueue_cts::ADD_CUDA_C, "add", 1, 1)
                }
                other => unimplemented!("the CUDA target has no {other:?}"),
            }
        }
    }

    hwqueue_cts::cts_suite!(CudaTarget);
}

/// The Vulkan backend on whatever driver is there (lavapipe in CI), its
/// `add` kernel WGSL compiled by naga; skipping without a driver.
#[cfg(feature = "vulkan")]
mod vulkan {
    use hwqueue::vulkan::{Vulkan, VulkanDevice, VulkanProgram};
    use hwqueue_cts::{Kernel, Skip, Target};

    pub struct VulkanTarget;

    impl Target for VulkanTarget {
        type Backend = Vulkan;

        /// Skips without a driver, but where `HWQUEUE_REQUIRE_VULKAN` is
        /// set (`.ci/run`, which installs lavapipe) fails instead.
        fn device() -> Result<VulkanDevice, Skip> {
            let found = hwqueue::vulkan::devices()
                .map_err(|error| format!("no Vulkan driver ({error})"))
                .and_then(|devices| {
                    devices
                        .iter()
                        .find(|d| d.unusable.is_none())
                        .map(|usable| usable.spec.ordinal())
                        .ok_or_else(|| format!("no usable Vulkan device ({devices:?})"))
                })
                .and_then(|ordinal| {
                    VulkanDevice::open(ordinal)
                        .map_err(|error| format!("the Vulkan device did not open ({error})"))
                });
            found.map_err(|why| {
                assert!(
                    std::env::var_os("HWQUEUE_REQUIRE_VULKAN").is_none(),
                    "HWQUEUE_REQUIRE_VULKAN is set, and {why}"
                );
                Skip(why)
            })
        }

        fn program(_device: &VulkanDevice, kernel: Kernel) -> hwqueue::Result<VulkanProgram> {
            match kernel {
                Kernel::Add => VulkanProgram::from_wgsl("add", hwqueue_cts::ADD_WGSL, "add"),
                other => unimplemented!("the Vulkan target has no {other:?}"),
            }
        }
    }

    hwqueue_cts::cts_suite!(VulkanTarget);
}
