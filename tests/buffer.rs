//! `CpuBuffer`: alignment, host access, bounds.

use hwqueue::cpu::{CPU_BUFFER_ALIGN, CpuDevice, CpuProgram, KernelArgs, WorkGroup};
use hwqueue::{Buffer, Device, Error, ExecParams, HardwareQueue, QueueFactory};

#[test]
fn a_new_buffer_is_zeroed_and_sized() {
    let buffer = CpuDevice::new().alloc(100).unwrap();
    assert_eq!(buffer.size(), 100);
    assert_eq!(buffer.to_vec::<u8>().unwrap(), vec![0; 100]);
}

#[test]
fn host_writes_and_reads_round_trip() {
    let buffer = CpuDevice::new().alloc(64).unwrap();
    let data: Vec<f64> = (0..8).map(|i| i as f64 * 1.5).collect();
    buffer.write_from(&data).unwrap();
    let mut back = vec![0f64; 8];
    buffer.read_into(&mut back).unwrap();
    assert_eq!(back, data);
    buffer.write_at(8, &[100u32, 200]).unwrap();
    let mut two = [0u32; 2];
    buffer.read_at(8, &mut two).unwrap();
    assert_eq!(two, [100, 200]);
}

#[test]
fn out_of_bounds_host_access_is_an_error_and_touches_nothing() {
    let buffer = CpuDevice::new().alloc(16).unwrap();
    let error = buffer.write_from(&[1u32; 5]).unwrap_err();
    assert!(matches!(
        error,
        Error::HostAccessOutOfBounds {
            offset: 0,
            len: 20,
            size: 16
        }
    ));
    assert!(buffer.write_at(usize::MAX, &[1u8]).is_err());
    assert_eq!(buffer.to_vec::<u32>().unwrap(), vec![0; 4]);
    let mut big = [0u32; 5];
    assert!(buffer.read_into(&mut big).is_err());
}

#[test]
fn zero_sized_buffers_work() {
    let buffer = CpuDevice::new().alloc(0).unwrap();
    assert_eq!(buffer.size(), 0);
    buffer.write_from::<u32>(&[]).unwrap();
    assert!(buffer.to_vec::<u32>().unwrap().is_empty());
}

#[test]
fn an_impossible_allocation_is_an_error() {
    let error = CpuDevice::new().alloc(usize::MAX - 8).unwrap_err();
    assert!(matches!(error, Error::OutOfMemory { .. }), "{error}");
}

#[test]
fn kernels_see_64_byte_aligned_memory() {
    fn record_alignment(_: &WorkGroup, args: &KernelArgs<'_>) {
        let [data, out] = [args.buffer(0), args.buffer(1)];
        let align = (data.as_ptr::<u8>() as usize % CPU_BUFFER_ALIGN) as u32;
        // SAFETY: one work-group.
        unsafe { out.slice_mut::<u32>(0..1)[0] = align + 1 };
    }
    let device = CpuDevice::new();
    let mut queue = device.compute_queue().unwrap();
    let program = CpuProgram::from_fn("record_alignment", 2, 0, record_alignment);
    for size in [1, 3, 64, 100, 4096] {
        let data = device.alloc(size).unwrap();
        let out = device.alloc(4).unwrap();
        queue
            .exec(&program, &[&data, &out], &[], ExecParams::new_1d(1, 1))
            .submit()
            .unwrap();
        queue.synchronize().unwrap();
        assert_eq!(out.to_vec::<u32>().unwrap(), vec![1], "size {size}");
    }
}
