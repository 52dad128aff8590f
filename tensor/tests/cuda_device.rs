//! CUDA-only behaviour (feature `cuda`, a GPU present; each test skips with
//! one line otherwise): side streams and the scoped current stream, CUDA
//! events (ordering, query, elapsed time), sequence constructors written on
//! the device, and `utilization()` listing the GPU with the driver's memory.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{synchronize, DType, Device, Event, Stream, Tensor};

mod support;
use support::gpu;

#[test]
fn work_on_a_side_stream_is_ordered_by_events() {
    let Some(gpu) = gpu() else { return };
    let side = Stream::new(gpu).unwrap();
    let a = Tensor::randn_on([1024, 1024], DType::F32, gpu).unwrap();
    // Produced on the side stream, consumed on the default one after an event.
    let produced = {
        let _on_side = side.make_current();
        assert_eq!(Stream::current(gpu).id(), side.id());
        let mut x = a.matmul(&a).unwrap();
        for _ in 0..4 {
            x = x.mul_scalar(0.5).unwrap();
        }
        x
    };
    assert_eq!(Stream::current(gpu).id(), Stream::default_for(gpu).id(), "the guard restored the default stream");
    let done = side.record_event(false).unwrap();
    Stream::current(gpu).wait_event(&done).unwrap();
    let on_default = produced.add_scalar(1.0).unwrap();
    let expect = a.to(Device::CPU).unwrap();
    let expect = expect.matmul(&expect).unwrap().mul_scalar(1.0 / 16.0).unwrap().add_scalar(1.0).unwrap();
    let got = on_default.to(Device::CPU).unwrap().to_vec::<f32>().unwrap();
    for (g, e) in got.iter().zip(expect.to_vec::<f32>().unwrap()) {
        assert!((g - e).abs() <= 1e-3 * e.abs().max(1.0), "{g} vs {e}");
    }
    done.synchronize().unwrap();
    assert!(done.query());
    side.synchronize().unwrap();
}

#[test]
fn events_time_device_work() {
    let Some(gpu) = gpu() else { return };
    let stream = Stream::current(gpu);
    let a = Tensor::randn_on([2048, 2048], DType::F32, gpu).unwrap();
    let start = stream.record_event(true).unwrap();
    for _ in 0..10 {
        drop(a.matmul(&a).unwrap());
    }
    let end = stream.record_event(true).unwrap();
    end.synchronize().unwrap();
    let ms = start.elapsed_time(&end).unwrap();
    // 10 products of 2·2048³ flop: more than 1 µs on any GPU, less than a minute.
    assert!(ms > 0.001 && ms < 60_000.0, "{ms} ms");
    let untimed = Event::new(false);
    assert!(untimed.elapsed_time(&end).is_err());
    synchronize(gpu).unwrap();
}

#[test]
fn sequences_are_written_on_the_device_as_on_the_host() {
    let Some(gpu) = gpu() else { return };
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8] {
        let pairs = [
            (Tensor::arange_on(0.0, 37.0, 1.5, dtype, gpu), Tensor::arange_on(0.0, 37.0, 1.5, dtype, Device::CPU)),
            (Tensor::linspace_on(0.0, 9.0, 19, dtype, gpu), Tensor::linspace_on(0.0, 9.0, 19, dtype, Device::CPU)),
            (Tensor::eye_on(7, dtype, gpu), Tensor::eye_on(7, dtype, Device::CPU)),
        ];
        for (on_gpu, on_host) in pairs {
            let (on_gpu, on_host) = (on_gpu.unwrap(), on_host.unwrap());
            assert_eq!(on_gpu.device(), gpu);
            assert_eq!(on_gpu.dims(), on_host.dims());
            let back = on_gpu.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            assert_eq!(back, on_host.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), "{dtype}");
        }
    }
    assert!(Tensor::arange_on(-3.0, 0.0, 1.0, DType::U8, gpu).is_err(), "checked before the device is asked");
}

#[test]
fn utilization_lists_the_gpu_with_driver_memory() {
    let Some(gpu) = gpu() else { return };
    let _x = Tensor::zeros_on([1 << 20], DType::F32, gpu).unwrap();
    let report = brasa_profile::utilization();
    let line = report
        .devices
        .iter()
        .find(|d| d.device == brasa_profile::DeviceId::cuda(0))
        .unwrap_or_else(|| panic!("no cuda:0 line in {report}"));
    let (used, total) = (line.memory_used.unwrap(), line.memory_total.unwrap());
    assert!(used >= 4 << 20 && used <= total, "{used} of {total}");
    assert!(line.name.starts_with("cuda:0"), "{}", line.name);
    eprintln!("{report}");
}
