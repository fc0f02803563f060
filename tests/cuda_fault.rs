//! A CUDA kernel that faults. A binary of its own: the fault is sticky, so
//! the device stays lost for the rest of this process, which would fail
//! every other GPU test beside it. Without a GPU it prints `skipped: no
//! CUDA driver`.
#![cfg(feature = "cuda")]

mod common;

use hwqueue_testkit::cuda_kernels::FAULT;

use common::LONG;
use hwqueue::cuda::{Cuda, CudaProgram};
use hwqueue::{
    AnyBackend, Backend, Device, Error, ExecParams, HardwareQueue, QueueFactory, Registry,
    TimelineSignal,
};

#[test]
fn an_illegal_address_loses_the_device_for_the_process_and_everything_says_so() {
    match Cuda::probe() {
        Ok(devices) if !devices.is_empty() => {}
        _ => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_GPU").is_none(),
                "HWQUEUE_REQUIRE_GPU is set but no CUDA device was found"
            );
            println!("skipped: no CUDA driver");
            return;
        }
    }
    let registry = Registry::<AnyBackend>::new();
    let any = registry.acquire("cuda:0").unwrap();
    let device = any.as_cuda().expect("cuda:0 is a CUDA device").clone();
    let program = CudaProgram::from_cuda_c(&device, FAULT, "write_through", 1, 0).unwrap();
    let out = device.alloc(1024).unwrap();
    let done = device.new_signal(0).unwrap();
    let later = device.new_signal(0).unwrap();
    let mut queue = device.compute_queue().unwrap();
    queue
        .exec(&program, &[&out], &[], ExecParams::new_1d(32, 32))
        .signal(&done, 1)
        .submit()
        .unwrap();
    // The waiter learns of the fault: the signal fails, it does not hang.
    let error = done.wait(1, LONG).unwrap_err();
    println!("waiter: {error}");
    assert!(matches!(error, Error::SignalFailed { .. }), "{error:?}");
    assert!(
        matches!(error.root_cause(), Error::DeviceLost { .. }),
        "{error:?}"
    );
    assert!(!done.is_reached(1));
    // Later work on the device is refused with the same answer.
    let error = queue
        .exec(&program, &[&out], &[], ExecParams::new_1d(32, 32))
        .signal(&later, 1)
        .submit()
        .unwrap_err();
    println!("submit: {error}");
    assert!(
        matches!(error.root_cause(), Error::DeviceLost { .. }),
        "{error:?}"
    );
    assert!(
        error.root_cause().to_string().contains("restart"),
        "{error}"
    );
    // The registry and a reopen answer the same: only a new process helps.
    let error = registry.acquire("cuda:0").unwrap_err();
    assert!(matches!(error, Error::DeviceLost { .. }), "{error:?}");
    let error = Cuda::open(0).unwrap_err();
    assert!(matches!(error, Error::DeviceLost { .. }), "{error:?}");
}
