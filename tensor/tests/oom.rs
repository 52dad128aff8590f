//! An out of memory on a logical host device with a byte limit is a value a
//! program can inspect: `as_out_of_memory()` names the device and the bytes
//! asked for, and the `source()` chain leads to the same report.

use brasa_alloc::find_out_of_memory;
use brasa_tensor::{memory, set_host_device_count, set_host_memory_limit, DType, Device, Tensor};

const MIB: usize = 1 << 20;

#[test]
fn a_tensor_op_past_the_limit_reports_device_and_bytes() {
    set_host_device_count(2).unwrap();
    set_host_memory_limit(1, Some(20 * MIB)).unwrap();
    let dev = Device::cpu(1);
    // Requests of 10 MiB and more take segments of their own size (smaller
    // ones share 2 or 20 MiB segments).
    let a = Tensor::ones_on([3 * MIB], DType::F32, dev).unwrap(); // 12 MiB
    let error = a.add(&a).unwrap_err();
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!(oom.device, "cpu:1");
    assert_eq!(oom.requested_bytes, 12 * MIB);
    let found = find_out_of_memory(&error).expect("the source chain leads to the report");
    assert_eq!(found, oom);
    // Recoverable: free, empty the cache, and a smaller op fits.
    drop(a);
    memory::empty_cache(dev).unwrap();
    let small = Tensor::ones_on([MIB / 8], DType::F32, dev).unwrap();
    assert_eq!(small.add(&small).unwrap().numel(), MIB / 8);
}

#[test]
fn errors_that_are_not_out_of_memory_say_none() {
    set_host_device_count(2).unwrap();
    let a = Tensor::ones_on([3], DType::F32, Device::cpu(0)).unwrap();
    let b = Tensor::ones_on([4], DType::F32, Device::cpu(0)).unwrap();
    let error = a.add(&b).unwrap_err();
    assert!(error.as_out_of_memory().is_none(), "{error}");
    assert!(find_out_of_memory(&error).is_none(), "{error}");
}
