//! With a profiler running, tensor ops show up as ranges and their memory as
//! allocator events of the right device.

use brasa_profile::Profiler;
use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};

#[test]
fn a_profile_sees_ops_and_their_memory() {
    set_host_device_count(2).unwrap();
    let dev = Device::cpu(1);
    let a = Tensor::ones_on([64, 64], DType::F32, dev).unwrap();
    let profiler = Profiler::builder().profile_memory(true).record_shapes(true).start().unwrap();
    let b = a.matmul(&a).unwrap().relu().unwrap();
    let result = profiler.stop();
    let table = result.key_averages();
    assert_eq!(table.get("matmul").map(|row| row.count), Some(1));
    assert_eq!(table.get("relu").map(|row| row.count), Some(1));
    let events: Vec<i64> = result.memory.iter().filter(|m| m.event.device.index == 1).map(|m| m.event.bytes).collect();
    assert!(events.contains(&(64 * 64 * 4)), "the outputs' allocations are recorded: {events:?}");
    assert!(events.contains(&-(64 * 64 * 4)), "the matmul output, freed after relu, is recorded: {events:?}");
    assert_eq!(memory::allocated(dev).unwrap(), 2 * 64 * 64 * 4);
    drop(b);
}

#[test]
fn utilization_lists_host_devices_in_use() {
    set_host_device_count(2).unwrap();
    // cpu:0: the other test here counts the bytes of cpu:1.
    let dev = Device::cpu(0);
    let t = Tensor::ones_on([256, 256], DType::F32, dev).unwrap();
    let snapshot = brasa_profile::utilization();
    let line = snapshot.devices.iter().find(|d| d.device.index == 0).expect("cpu:0 is listed");
    assert!(line.memory_used.unwrap() >= (256 * 256 * 4) as u64);
    assert!(line.memory_total.unwrap() >= line.memory_used.unwrap());
    assert!(snapshot.to_string().contains("cpu:0"), "{snapshot}");
    drop(t);
}
