//! Every tensor's memory comes from its device's caching allocator: freed when
//! the last owner drops, cached until `empty_cache`, limited per logical device.
//! Each test uses its own logical device, since tests run in parallel.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{memory, set_host_device_count, set_host_memory_limit, DType, Device, Tensor, TensorError};

fn devices() {
    set_host_device_count(8).expect("every test asks for the same count");
}

#[test]
fn allocated_returns_to_its_start_when_a_scope_ends_and_reserved_stays_until_empty_cache() {
    devices();
    let dev = Device::cpu(1);
    let start = memory::allocated(dev).unwrap();
    {
        let a = Tensor::zeros_on([256, 1024], DType::F32, dev).unwrap(); // 1 MiB: small pool
        let b = Tensor::ones_on([3, 1 << 20], DType::F32, dev).unwrap(); // 12 MiB: large pool
        let view = b.narrow(0, 1, 1).unwrap();
        drop(b);
        assert_eq!(memory::allocated(dev).unwrap(), start + (1 << 20) + (12 << 20), "the view keeps b's storage");
        assert_eq!(view.to_vec::<f32>().unwrap().len(), 1 << 20);
        drop((a, view));
    }
    assert_eq!(memory::allocated(dev).unwrap(), start);
    assert!(memory::reserved(dev).unwrap() >= (2 << 20) + (12 << 20), "cached, not returned");
    assert_eq!(memory::max_allocated(dev).unwrap(), start + (13 << 20));
    memory::empty_cache(dev).unwrap();
    assert_eq!(memory::reserved(dev).unwrap(), 0);
    memory::reset_peak(dev).unwrap();
    assert_eq!(memory::max_allocated(dev).unwrap(), 0);
    assert!(memory::summary(dev).unwrap().contains("device cpu:1"));
    assert_eq!(memory::stats(dev).unwrap().num_ooms, 0);
}

#[test]
fn a_limited_logical_device_runs_out_with_a_recoverable_error() {
    devices();
    let dev = Device::cpu(2);
    set_host_memory_limit(2, Some(64 << 20)).unwrap();
    let keep = Tensor::zeros_on([40 << 20], DType::U8, dev).unwrap();
    let error = Tensor::zeros_on([40 << 20], DType::U8, dev).unwrap_err();
    let oom = error.as_out_of_memory().expect("an out-of-memory error");
    assert!(matches!(error, TensorError::Alloc(brasa_alloc::AllocError::OutOfMemory(_))), "{error:?}");
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 40 << 20));
    drop(keep);
    // After freeing, the same request succeeds: the error was recoverable.
    let again = Tensor::zeros_on([40 << 20], DType::U8, dev).unwrap();
    assert_eq!(again.numel(), 40 << 20);
    assert_eq!(memory::stats(dev).unwrap().num_ooms, 1);
    // The limit cannot change once the device has memory.
    assert!(set_host_memory_limit(2, None).is_err());
}

#[test]
fn devices_that_do_not_exist_say_so() {
    devices();
    let error = Tensor::zeros_on([4], DType::F32, Device::cpu(8)).unwrap_err();
    assert!(matches!(error, TensorError::Device(_)));
    assert!(error.to_string().contains("cpu:8 does not exist: 8 host device(s)"), "{error}");
    assert!(set_host_device_count(3).is_err(), "the count is fixed once devices exist");
    let cuda = Tensor::zeros_on([4], DType::F32, Device::cuda(0));
    if cfg!(feature = "cuda") {
        // A tensor where there is a GPU; else the CUDA backend's refusal
        // (no driver, no device), naming the device.
        match cuda {
            Ok(t) => assert_eq!(t.device(), Device::cuda(0)),
            Err(TensorError::Alloc(brasa_alloc::AllocError::Backend { device, .. })) => assert_eq!(device, "cuda:0"),
            Err(other) => panic!("expected the CUDA backend's refusal, got {other:?}"),
        }
    } else {
        let cuda = cuda.unwrap_err();
        assert!(matches!(cuda, TensorError::Device(_)), "{cuda:?}");
        assert!(cuda.to_string().contains("cuda:0"), "{cuda}");
    }
}

#[test]
fn copies_between_logical_devices_land_on_the_target_allocator() {
    devices();
    let (a, b) = (Device::cpu(3), Device::cpu(4));
    let x = Tensor::arange_on(0.0, 1024.0, 1.0, DType::F32, a).unwrap();
    let before = memory::allocated(b).unwrap();
    let y = x.to(b).unwrap();
    assert_eq!(y.device(), b);
    assert_eq!(memory::allocated(b).unwrap(), before + 4096);
    assert_eq!(y.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[test]
fn history_and_snapshot_are_available_per_device() {
    devices();
    let dev = Device::cpu(5);
    memory::record_history(dev, 16).unwrap();
    let t = Tensor::zeros_on([1000], DType::F32, dev).unwrap();
    let snapshot = memory::snapshot(dev).unwrap();
    assert_eq!(snapshot.device, "cpu:5");
    assert!(snapshot.device_traces.iter().any(|e| e.requested_size == 4000));
    drop(t);
    assert_eq!(memory::fragmentation(dev).unwrap().free_cached_bytes, 2 << 20);
}
