//! An out of memory on one replica of a `DataParallel` comes back as
//! `ParallelError::Replica`, whose `as_out_of_memory` gives the replica's
//! device and the bytes it asked for; inside an autograd error (as a DDP
//! hook's failure) it is found too.

use brasa_autograd::{AutogradError, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::{Linear, NnError};
use brasa_parallel::{DataParallel, ParallelError};
use brasa_tensor::{set_host_memory_limit, DType, Device, Tensor};

const MIB: usize = 1 << 20;

#[test]
fn a_replica_out_of_memory_names_its_device_and_bytes() {
    brasa_parallel::ensure_host_devices(2).unwrap();
    set_host_memory_limit(1, Some(20 * MIB)).unwrap();
    let devices = [Device::cpu(0), Device::cpu(1)];
    let mut dp = DataParallel::new(
        &devices,
        |dev| Linear::new(64, 64, dev),
        |params| Sgd::new(params, SgdConfig { lr: 0.1, ..Default::default() }),
    )
    .unwrap();
    // 16 MiB of input per replica: replica 1's copy fits, its output does not.
    let rows = MIB / 8;
    let input = Tensor::zeros_on([rows, 64], DType::F32, Device::cpu(0)).unwrap();
    let target = Tensor::from_vec_on((0..rows).map(|r| (r % 64) as i64).collect(), [rows], Device::cpu(0)).unwrap();
    let error = dp.forward_backward(&input, &target, |out: &Var, y: &Tensor| cross_entropy(out, y)).unwrap_err();
    assert!(matches!(&error, ParallelError::Replica { rank: 1, .. }), "{error:?}");
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:1", 16 * MIB));
    assert_eq!(brasa_alloc::find_out_of_memory(&error), Some(oom));

    // The same error as a hook's failure inside an autograd error, and
    // inside an nn error made of that.
    let inside = AutogradError::from(error.clone());
    assert_eq!(inside.as_out_of_memory(), Some(oom));
    let nn = NnError::from(error.clone());
    assert_eq!(nn.as_out_of_memory(), Some(oom));
}

#[test]
fn other_parallel_errors_are_not_out_of_memory() {
    assert!(ParallelError::invalid("all_reduce", "no").as_out_of_memory().is_none());
}
