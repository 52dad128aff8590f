//! Tensor errors keep the error below them and carry structured fields:
//! a broadcast failure has the `LayoutError` (shapes and dim) as its
//! source, a kernel or index failure its kernel error, a float-only op on
//! integers names the dtype as a field, and an out of memory is reached
//! by walking `std::error::Error::source`.

use brasa_alloc::OutOfMemory;
use brasa_tensor::{
    set_host_device_count, set_host_memory_limit, DType, Device, IndexError, LayoutError, Shape, Tensor, TensorError,
};
use std::error::Error;

/// Two host devices, set before any test of this file makes a tensor.
fn devices() {
    let _ = set_host_device_count(2);
}

/// Every error in `error`'s source chain, `error` first.
fn chain<'a>(error: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source()).collect()
}

#[test]
fn a_broadcast_failure_keeps_the_layout_error_with_its_shapes() {
    devices();
    let a = Tensor::zeros([3, 1], DType::F32).unwrap();
    let b = Tensor::zeros([2, 2], DType::F32).unwrap();
    let error = a.add(&b).unwrap_err();
    assert!(matches!(error, TensorError::OpLayout { op: "add", .. }), "{error:?}");
    let layout = error.source().and_then(|e| e.downcast_ref::<LayoutError>()).unwrap();
    let LayoutError::IncompatibleShapes { a, b, dim, size_a, size_b } = layout else { panic!("{layout:?}") };
    assert_eq!((a, b), (&Shape::from([3, 1]), &Shape::from([2, 2])));
    assert_eq!((*dim, *size_a, *size_b), (-2, 3, 2));
    assert!(error.to_string().starts_with("add: cannot broadcast shapes [3, 1] and [2, 2] together"), "{error}");
}

#[test]
fn a_float_only_op_on_integers_names_the_dtype_as_a_field() {
    devices();
    let x = Tensor::zeros([4], DType::I64).unwrap();
    let error = x.gelu().unwrap_err();
    let TensorError::UnsupportedDType { op, dtype, .. } = &error else { panic!("{error:?}") };
    assert_eq!((*op, *dtype), ("gelu", DType::I64));
    assert_eq!(error.to_string(), "gelu: needs a floating-point tensor, got i64; convert it with to_dtype first");
    // A rank problem is a structured error too.
    let rank = Tensor::zeros([4], DType::F32).unwrap().conv2d_backward_bias().unwrap_err();
    assert!(matches!(&rank, TensorError::RankMismatch { expected: 4, got, .. } if got == &[4]), "{rank:?}");
}

#[test]
fn a_bad_index_keeps_the_kernel_error_with_its_position() {
    devices();
    let x = Tensor::zeros([2, 3], DType::F32).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 5], [2]).unwrap();
    let error = x.index_select(0, &ids).unwrap_err();
    assert!(matches!(error, TensorError::Index { .. }), "{error:?}");
    let index = error.source().and_then(|e| e.downcast_ref::<IndexError>()).unwrap();
    assert!(matches!(index, IndexError::OutOfRange { position: 1, index: 5, size: 2 }), "{index:?}");
}

#[test]
fn an_out_of_memory_is_reached_by_walking_the_source_chain() {
    devices();
    set_host_memory_limit(1, Some(1 << 20)).unwrap();
    let error = Tensor::zeros_on([1 << 20], DType::F32, Device::cpu(1)).unwrap_err();
    let oom = chain(&error).into_iter().find_map(|e| e.downcast_ref::<OutOfMemory>()).unwrap();
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:1", 4 << 20));
}
