//! Pinned host memory and non-blocking host → device copies
//! (`Tensor::pin_memory`, `Tensor::to_non_blocking`). The GPU tests need the
//! `cuda` feature and a device and skip with one line otherwise; the fallback
//! test runs where there is no CUDA.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{memory, synchronize, DType, Device, Stream, Tensor, TensorError};
use std::sync::{Mutex, MutexGuard};

mod support;
use support::gpu;

/// The pinned pool is process-wide: tests that look at its addresses run alone.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps `gpu`'s current stream busy for a while (products of 4096² matrices:
/// tens of milliseconds each on any GPU) so that work queued next is still
/// pending when the test looks.
fn keep_busy(gpu: Device, products: usize) {
    let a = Tensor::randn_on([4096, 4096], DType::F32, gpu).unwrap();
    for _ in 0..products {
        drop(a.matmul(&a).unwrap());
    }
}

#[test]
fn without_cuda_pinning_falls_back_to_locked_host_memory_and_synchronous_copies() {
    if brasa_tensor::cuda_device_count() > 0 {
        eprintln!("skipped: a CUDA device is present (the GPU tests cover pinning)");
        return;
    }
    let _lock = exclusive();
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32).unwrap();
    match x.pin_memory() {
        Ok(pinned) => {
            assert!(pinned.is_pinned());
            assert_eq!(memory::pinned_memory_driver().unwrap(), None, "mlock, not a device driver");
            // No CUDA device to copy to: the build's refusal (without the
            // `cuda` feature) or the CUDA backend's (no driver, no device).
            let error = pinned.to_non_blocking(Device::cuda(0)).unwrap_err();
            let refused = match &error {
                TensorError::Device(message) => message.starts_with("cuda:0"),
                TensorError::Alloc(brasa_alloc::AllocError::Backend { device, .. }) => device == "cuda:0",
                _ => false,
            };
            assert!(refused, "{error:?}");
            assert_eq!(pinned.to_non_blocking(Device::CPU).unwrap().to_vec::<f32>().unwrap(), [0., 1., 2., 3., 4., 5.]);
        }
        Err(error) => assert!(error.to_string().contains("RLIMIT_MEMLOCK"), "{error}"),
    }
}

#[test]
fn pinned_memory_is_registered_with_cuda() {
    let Some(_gpu) = gpu() else { return };
    let _lock = exclusive();
    let x = Tensor::arange(0.0, 1000.0, 1.0, DType::F32).unwrap().pin_memory().unwrap();
    assert!(x.is_pinned());
    assert_eq!(memory::pinned_memory_driver().unwrap().as_deref(), Some("CUDA (cuMemHostRegister)"));
}

#[test]
fn non_blocking_copies_carry_the_values() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8] {
        let host = Tensor::arange(0.0, 96.0, 1.0, dtype).unwrap().reshape(&[8, 12]).unwrap();
        let pinned = host.pin_memory().unwrap();
        let on_gpu = pinned.to_non_blocking(gpu).unwrap();
        assert_eq!((on_gpu.device(), on_gpu.dtype(), on_gpu.dims()), (gpu, dtype, &[8usize, 12][..]));
        let back = on_gpu.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(back, (0..96).map(f64::from).collect::<Vec<_>>(), "{dtype:?}");
    }
    let pinned = Tensor::arange(0.0, 100.0, 1.0, DType::F32).unwrap().pin_memory().unwrap();
    // A contiguous view at an offset goes asynchronously too; a transposed
    // one falls back to the synchronous copy; both carry the values.
    let window = pinned.narrow(0, 10, 20).unwrap().to_non_blocking(gpu).unwrap();
    assert_eq!(
        window.to(Device::CPU).unwrap().to_vec::<f32>().unwrap(),
        (10..30).map(|v| v as f32).collect::<Vec<_>>()
    );
    let grid = pinned.reshape(&[10, 10]).unwrap().transpose(0, 1).unwrap();
    let moved = grid.to_non_blocking(gpu).unwrap();
    assert_eq!(moved.to(Device::CPU).unwrap().to_vec::<f32>().unwrap(), grid.to_vec::<f32>().unwrap());
    let empty = Tensor::zeros([0, 3], DType::F32).unwrap().pin_memory().unwrap().to_non_blocking(gpu).unwrap();
    assert_eq!(empty.dims(), &[0, 3]);
    // Not pinned: the synchronous copy.
    let pageable = Tensor::arange(0.0, 5.0, 1.0, DType::F32).unwrap();
    assert_eq!(
        pageable.to_non_blocking(gpu).unwrap().to(Device::CPU).unwrap().to_vec::<f32>().unwrap(),
        [0., 1., 2., 3., 4.]
    );
    synchronize(gpu).unwrap();
}

#[test]
fn the_copy_returns_before_it_runs_and_later_work_on_the_stream_sees_the_data() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    let side = Stream::new(gpu).unwrap();
    let _on_side = side.make_current();
    let pinned = Tensor::arange(0.0, 4096.0, 1.0, DType::F32).unwrap().pin_memory().unwrap();
    keep_busy(gpu, 8);
    let on_gpu = pinned.to_non_blocking(gpu).unwrap();
    let copied = side.record_event(false).unwrap();
    assert!(!copied.query(), "to_non_blocking waited for the stream: the copy is not asynchronous");
    // Queued after the copy on the same stream: it reads the copied values.
    let doubled = on_gpu.mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap();
    let got = doubled.to(Device::CPU).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, (0..4096).map(|v| 2.0 * v as f32 + 1.0).collect::<Vec<_>>());
    side.synchronize().unwrap();
}

#[test]
fn a_pinned_block_is_reused_only_after_the_copy_from_it_ran() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    synchronize(gpu).unwrap();
    memory::pinned_empty_cache().unwrap(); // a fresh segment: predictable best-fit addresses
    let elements = (3 << 20) / 4 + 128; // 3 MiB and a half kilobyte of f32
    let source = Tensor::full([elements], 7.0, DType::F32).unwrap().pin_memory().unwrap();
    let source_at = source.host_bytes().unwrap().as_ptr() as usize;
    keep_busy(gpu, 40);
    let copy = source.to_non_blocking(gpu).unwrap();
    let copied = Stream::current(gpu).record_event(false).unwrap();
    drop(source); // freed while the copy is queued
    let while_pending = Tensor::zeros([elements], DType::F32).unwrap().pin_memory().unwrap();
    let other_at = while_pending.host_bytes().unwrap().as_ptr() as usize;
    assert!(!copied.query(), "the GPU ran the busy work before the test could look; make keep_busy longer");
    assert_ne!(other_at, source_at, "the source block was reused while a copy from it was queued");
    let stats = memory::pinned_stats().unwrap();
    assert!(
        stats.active_bytes.all.current > stats.allocated_bytes.all.current,
        "the freed source is active, awaiting its event: {stats:?}"
    );
    drop(while_pending);
    copied.synchronize().unwrap();
    let after = Tensor::zeros([elements], DType::F32).unwrap().pin_memory().unwrap();
    assert_eq!(after.host_bytes().unwrap().as_ptr() as usize, source_at, "reusable once the event completed");
    let values = copy.to(Device::CPU).unwrap().to_vec::<f32>().unwrap();
    assert!(values.iter().all(|&v| v == 7.0), "the copy read the source before it was reused");
}
