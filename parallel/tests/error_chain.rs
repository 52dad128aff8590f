//! Parallel errors keep the error below them: a replica's failure is the
//! `source()` of `ParallelError::Replica` as a `ParallelError` (not a `Box`
//! that `downcast_ref` cannot see through), and a tensor error inside it
//! keeps its own source, down to the layout error or the out-of-memory
//! report.

use brasa_alloc::OutOfMemory;
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::Linear;
use brasa_parallel::{DataParallel, ParallelError};
use brasa_tensor::{set_host_memory_limit, DType, Device, LayoutError, Tensor};
use std::error::Error;

const MIB: usize = 1 << 20;

/// Every error in `error`'s source chain, `error` first.
fn chain<'a>(error: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source()).collect()
}

#[test]
fn a_replica_tensor_error_keeps_its_chain() {
    brasa_parallel::ensure_host_devices(3).unwrap();
    set_host_memory_limit(2, Some(20 * MIB)).unwrap();
    let devices = [Device::cpu(0), Device::cpu(1)];
    let mut dp =
        DataParallel::new(&devices, |dev| Linear::new(4, 3, dev), |params| Sgd::new(params, SgdConfig::default()))
            .unwrap();
    let input = Tensor::zeros([8, 4], DType::F32).unwrap();
    let target = Tensor::from_vec((0..8).map(|r| r % 3).collect::<Vec<i64>>(), [8]).unwrap();
    // Replica 1's loss adds tensors that do not broadcast.
    let loss = |out: &Var, y: &Tensor| {
        if out.device() == Device::cpu(1) {
            out.tensor().add(&Tensor::zeros_on([5, 7], DType::F32, out.device())?)?;
        }
        cross_entropy(out, y)
    };
    let error = dp.forward_backward(&input, &target, loss).unwrap_err();
    assert!(matches!(&error, ParallelError::Replica { rank: 1, .. }), "{error:?}");
    let links = chain(&error);
    let replica = links[1].downcast_ref::<ParallelError>().unwrap_or_else(|| panic!("{:?}", links[1]));
    assert!(matches!(replica, ParallelError::Nn(_) | ParallelError::Tensor(_)), "{replica:?}");
    let layout = links.iter().find_map(|e| e.downcast_ref::<LayoutError>()).unwrap_or_else(|| panic!("{links:?}"));
    assert!(matches!(layout, LayoutError::IncompatibleShapes { dim: -1, size_a: 3, size_b: 7, .. }), "{layout:?}");
}

#[test]
fn a_replica_out_of_memory_is_reached_through_source() {
    brasa_parallel::ensure_host_devices(3).unwrap();
    set_host_memory_limit(2, Some(20 * MIB)).unwrap();
    let devices = [Device::cpu(0), Device::cpu(2)];
    let mut dp =
        DataParallel::new(&devices, |dev| Linear::new(64, 64, dev), |params| Sgd::new(params, SgdConfig::default()))
            .unwrap();
    // 16 MiB of input per replica: replica 1's copy fits, its output does not.
    let rows = MIB / 8;
    let input = Tensor::zeros([rows, 64], DType::F32).unwrap();
    let target = Tensor::from_vec((0..rows).map(|r| (r % 64) as i64).collect::<Vec<_>>(), [rows]).unwrap();
    let error = dp.forward_backward(&input, &target, |out: &Var, y: &Tensor| cross_entropy(out, y)).unwrap_err();
    let links = chain(&error);
    assert!(links[1].downcast_ref::<ParallelError>().is_some(), "{:?}", links[1]);
    let oom = links.iter().find_map(|e| e.downcast_ref::<OutOfMemory>()).unwrap_or_else(|| panic!("{links:?}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 16 * MIB));
}
