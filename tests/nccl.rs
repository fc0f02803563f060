//! NCCL under CUDA queues on a real GPU and a real NCCL (issue 48): one
//! rank (NCCL cannot put two ranks on one GPU). Without a CUDA driver the
//! tests print `skipped: no CUDA driver`, without NCCL `skipped: no NCCL`
//! (with the error, which says how to install it), and return; with
//! `HWQUEUE_REQUIRE_NCCL` set, a missing NCCL fails them instead.
//! `tests/cuda_fake_driver/nccl.rs` covers the same path on the fake
//! driver and a fake NCCL.
#![cfg(feature = "nccl")]

mod common;

use common::LONG;
use hwqueue::collective::{CollectiveError, Communicator, NcclConfig, NcclId, Reduction};
use hwqueue::cuda::CudaDevice;
use hwqueue::{Device, Download, Error, HardwareQueue, QueueFactory, TimelineSignal};

/// Device 0 and a communicator of one rank on it, or why the test skips.
fn single_rank() -> Option<(CudaDevice, Communicator)> {
    let device = common::cuda_device()?;
    match Communicator::nccl_single(&device) {
        Ok(comm) => Some((device, comm)),
        Err(Error::Collective(error @ CollectiveError::NoNccl { .. })) => {
            assert!(
                std::env::var_os("HWQUEUE_REQUIRE_NCCL").is_none(),
                "HWQUEUE_REQUIRE_NCCL is set but: {error}"
            );
            println!("skipped: no NCCL ({error})");
            None
        }
        Err(error) => panic!("making an NCCL communicator: {error}"),
    }
}

#[test]
fn one_rank_collectives_run_between_an_upload_and_a_download() {
    let Some((device, comm)) = single_rank() else {
        return;
    };
    assert_eq!((comm.engine(), comm.rank(), comm.size()), ("nccl", 0, 1));
    let data: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5 - 7.0).collect();
    let bytes = data.len() * 4;
    let buffer = || device.alloc(bytes).unwrap();
    let (input, summed, gathered, scattered, shared) =
        (buffer(), buffer(), buffer(), buffer(), buffer());
    let (uploaded, done) = (device.new_signal(0).unwrap(), device.new_signal(0).unwrap());
    let mut uploads = device.compute_queue().unwrap();
    uploads
        .upload(&input, &data)
        .upload(&shared, &data)
        .signal(&uploaded, 1)
        .submit()
        .unwrap();
    let mut queue = device.compute_queue().unwrap();
    let downloads: Vec<Download<f32>> = (0..4).map(|_| Download::new(data.len())).collect();
    queue
        .wait(&uploaded, 1)
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &summed)
        .all_gather::<f32, _, _>(&comm, &input, &gathered)
        .reduce_scatter::<f32, _, _>(&comm, Reduction::Max, &input, &scattered)
        .broadcast::<f32, _>(&comm, 0, &shared)
        .signal(&done, 1)
        .download(&summed, &downloads[0])
        .download(&gathered, &downloads[1])
        .download(&scattered, &downloads[2])
        .download(&shared, &downloads[3])
        .submit()
        .unwrap();
    done.wait(1, LONG).unwrap();
    for (name, download) in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
        .into_iter()
        .zip(&downloads)
    {
        assert_eq!(download.take(LONG).unwrap(), data, "{name} of one rank");
    }
    queue.synchronize().unwrap();
}

#[test]
fn one_rank_all_reduce_in_place_of_each_element_type_on_two_queues() {
    let Some((device, comm)) = single_rank() else {
        return;
    };
    // Two queues share the communicator; a signal orders them.
    let (mut first, mut second) = (
        device.compute_queue().unwrap(),
        device.compute_queue().unwrap(),
    );
    let between = device.new_signal(0).unwrap();
    let words = device.alloc(64 * 4).unwrap();
    let doubles = device.alloc(64 * 8).unwrap();
    let ints: Vec<i32> = (-32..32).collect();
    let floats: Vec<f64> = (0..64).map(|i| f64::from(i) / 3.0).collect();
    let (ints_back, floats_back) = (Download::<i32>::new(64), Download::<f64>::new(64));
    first
        .upload(&words, &ints)
        .upload(&doubles, &floats)
        .all_reduce::<i32, _, _>(&comm, Reduction::Min, &words, &words)
        .signal(&between, 1)
        .submit()
        .unwrap();
    second
        .wait(&between, 1)
        .all_reduce::<f64, _, _>(&comm, Reduction::Product, &doubles, &doubles)
        .all_reduce::<u32, _, _>(&comm, Reduction::Max, &words, &words)
        .download(&words, &ints_back)
        .download(&doubles, &floats_back)
        .submit()
        .unwrap();
    assert_eq!(ints_back.take(LONG).unwrap(), ints);
    assert_eq!(floats_back.take(LONG).unwrap(), floats);
    first.synchronize().unwrap();
    second.synchronize().unwrap();
}

/// `split` of one rank: a color gives rank 0 of 1 on the same device, over
/// which an `all_reduce` runs; no color gives none. An NCCL older than
/// 2.18 (no `ncclCommSplit`) answers `Invalid` saying so: the test skips.
#[test]
fn one_rank_split_gives_rank_0_of_1_and_none_without_a_color() {
    let Some((device, comm)) = single_rank() else {
        return;
    };
    let half = match comm.split(Some(0), 0) {
        Ok(Some(half)) => half,
        Err(Error::Collective(CollectiveError::Invalid { reason, .. }))
            if reason.contains("no `ncclCommSplit`") =>
        {
            println!("skipped: {reason}");
            return;
        }
        other => panic!("split with a color: {other:?}"),
    };
    assert_eq!((half.engine(), half.rank(), half.size()), ("nccl", 0, 1));
    assert!(half.nccl_device().unwrap().same_as(&device));
    assert!(comm.split(None, 0).unwrap().is_none());
    let data: Vec<u32> = (0..256).collect();
    let (input, output) = (device.alloc(1024).unwrap(), device.alloc(1024).unwrap());
    let back = Download::<u32>::new(data.len());
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&input, &data)
        .all_reduce::<u32, _, _>(&half, Reduction::Sum, &input, &output)
        .download(&output, &back)
        .submit()
        .unwrap();
    assert_eq!(back.take(LONG).unwrap(), data);
    queue.synchronize().unwrap();
}

/// A non-blocking communicator of one rank (`ncclCommInitRankConfig`,
/// `blocking = 0`): its creation, a group's launch and a split settle on
/// NCCL's threads, polled for within the timeout; the data still moves.
#[test]
fn one_rank_nonblocking_communicator_runs_a_collective_and_splits() {
    let Some((device, _)) = single_rank() else {
        return;
    };
    let config = NcclConfig::nonblocking().with_timeout(LONG);
    let comm = match Communicator::nccl_with(&device, NcclId::new().unwrap(), 0, 1, config) {
        Ok(comm) => comm,
        // An NCCL older than 2.18 says so; nothing to run then.
        Err(Error::Collective(error @ CollectiveError::Invalid { .. })) => {
            println!("skipped: {error}");
            return;
        }
        Err(error) => panic!("making a non-blocking NCCL communicator: {error}"),
    };
    let data: Vec<f32> = (0..256).map(|i| i as f32 - 100.0).collect();
    let (input, output) = (device.alloc(1024).unwrap(), device.alloc(1024).unwrap());
    let back = Download::<f32>::new(data.len());
    let mut queue = device.compute_queue().unwrap();
    queue
        .upload(&input, &data)
        .all_reduce::<f32, _, _>(&comm, Reduction::Sum, &input, &output)
        .download(&output, &back)
        .submit()
        .unwrap();
    assert_eq!(back.take(LONG).unwrap(), data);
    queue.synchronize().unwrap();
    let half = comm.split(Some(0), 0).unwrap().expect("a color's group");
    assert_eq!((half.rank(), half.size(), half.timeout()), (0, 1, LONG));
    assert!(comm.split(None, 0).unwrap().is_none());
}
