//! Every tensor constructor and shape op, called with random shapes (sizes
//! 0, 1, small and huge, some overflowing), dtypes, dims and scalars,
//! returns `Ok` or `Err`: a panic fails the property with the call that
//! made it. Tensors live on a logical host device limited to 64 MiB, so a
//! shape that fits in a `usize` but not in memory is an out-of-memory
//! error, not gigabytes of work.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{set_host_device_count, set_host_memory_limit, DType, Device, Tensor, TensorError};
use proptest::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// cpu:1, limited to 64 MiB ([`setup`] makes it before any tensor exists).
const LIMITED: Device = Device::Cpu(1);

/// Two host devices, the second limited; every test calls this first.
fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        set_host_device_count(2).unwrap();
        set_host_memory_limit(1, Some(64 << 20)).unwrap();
    });
}

fn ints(values: &[i64]) -> Tensor {
    Tensor::from_slice_on(values, [values.len()], LIMITED).unwrap()
}

/// Sizes a dim takes in the property test: empty, one, small, and huge.
fn any_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => Just(0usize),
        3 => Just(1usize),
        4 => 2usize..5,
        // Huge: any product with another huge size overflows, and none
        // fits in memory (so nothing materialises gigabytes).
        1 => Just(1usize << 40),
        1 => Just(1usize << 62),
        1 => Just(isize::MAX as usize),
        1 => Just(usize::MAX),
        1 => (1usize << 40)..,
    ]
}

fn any_shape() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(any_size(), 0..5)
}

fn any_dim() -> impl Strategy<Value = isize> {
    prop_oneof![-6isize..6, Just(isize::MIN), Just(isize::MAX)]
}

fn any_scalar() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(1.0),
        Just(-1.0),
        Just(0.5),
        Just(300.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(1e300),
        Just(i64::MIN as f64),
        any::<f64>(),
    ]
}

fn any_dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

/// Runs one call; a panic becomes a test failure naming the call.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T, TensorError>) -> Result<Option<T>, TestCaseError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => Ok(result.ok()),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(TestCaseError::fail(format!("{what} panicked: {message}")))
        }
    }
}

#[test]
fn constructors_and_shape_ops_never_panic() {
    setup();
    // 256 cases, or PROPTEST_CASES.
    let config = ProptestConfig::default();
    proptest!(config, |(
        dims in any_shape(),
        other in any_shape(),
        dtype in any_dtype(),
        value in any_scalar(),
        step in any_scalar(),
        (d0, d1) in (any_dim(), any_dim()),
        count in any_size(),
    )| {
        let shape = dims.as_slice();
        let spec: Vec<isize> = other.iter().map(|&d| d as isize).collect();
        no_panic("zeros", || Tensor::zeros_on(shape, dtype, LIMITED))?;
        no_panic("full", || Tensor::full_on(shape, value, dtype, LIMITED))?;
        no_panic("rand", || Tensor::rand_on(shape, dtype, LIMITED))?;
        no_panic("randn", || Tensor::randn_on(shape, dtype, LIMITED))?;
        no_panic("uniform", || Tensor::uniform_on(shape, value, step, dtype, LIMITED))?;
        no_panic("bernoulli", || Tensor::bernoulli_on(shape, value, dtype, LIMITED))?;
        no_panic("arange", || Tensor::arange_on(value, step, 1.0, dtype, LIMITED))?;
        no_panic("arange step", || Tensor::arange_on(0.0, value, step, dtype, LIMITED))?;
        no_panic("linspace", || Tensor::linspace_on(value, step, count, dtype, LIMITED))?;
        no_panic("eye", || Tensor::eye_on(count, dtype, LIMITED))?;
        no_panic("from_slice", || Tensor::from_slice_on(&[1f32, 2.0], shape, LIMITED))?;
        // A real tensor (when the shape fits in memory) and a scalar expanded
        // to the shape (when the count fits), then every shape op on each.
        let small = no_panic("zeros", || Tensor::zeros_on(shape, dtype, LIMITED))?;
        let expanded = no_panic("expand", || Tensor::full_on((), 2.0, dtype, LIMITED)?.expand(shape))?;
        for x in small.iter().chain(expanded.iter()) {
            no_panic("reshape", || x.reshape(&spec))?;
            no_panic("reshape -1", || x.reshape(&[-1]))?;
            no_panic("view", || x.view(&spec))?;
            no_panic("flatten", || x.flatten(d0, d1))?;
            no_panic("transpose", || x.transpose(d0, d1))?;
            no_panic("t", || x.t())?;
            no_panic("permute", || x.permute(&other))?;
            no_panic("narrow", || x.narrow(d0, count, 1))?;
            no_panic("narrow huge", || x.narrow(d0, 1, count))?;
            no_panic("select", || x.select(d0, count))?;
            no_panic("squeeze", || x.squeeze(d0))?;
            no_panic("unsqueeze", || x.unsqueeze(d1))?;
            no_panic("expand", || x.expand(other.as_slice()))?;
            no_panic("split", || x.split(count, d0))?;
            no_panic("chunk", || x.chunk(count, d1))?;
            no_panic("cat", || Tensor::cat(&[x, x], d0))?;
            no_panic("stack", || Tensor::stack(&[x, x], d0))?;
            no_panic("sum", || x.sum(&[d0], false))?;
            no_panic("sum all", || x.sum_all())?;
            no_panic("mean", || x.mean(&[d0, d1], true))?;
            no_panic("max", || x.max(&[d1], false))?;
            no_panic("argmin", || x.argmin(&[d0], true))?;
            no_panic("var", || x.var(&[], false))?;
            no_panic("softmax", || x.softmax(d0))?;
            no_panic("contiguous", || x.contiguous())?;
            no_panic("to_dtype", || x.to_dtype(DType::F32))?;
            no_panic("add", || x + x)?;
            no_panic("pow", || x.pow(x))?;
            no_panic("powf", || x.powf(value))?;
            no_panic("add_scalar", || x.add_scalar(value))?;
            no_panic("gt_scalar", || x.gt_scalar(value))?;
            no_panic("clamp", || x.clamp(Some(value), Some(step)))?;
            no_panic("full_like", || x.full_like(value))?;
            no_panic("fill_", || x.fill_(value))?;
            no_panic("copy_", || x.copy_(x))?;
            no_panic("add_", || x.add_(x))?;
            no_panic("index_select", || x.index_select(d0, &ints(&[0])))?;
            no_panic("one_hot", || x.to_dtype(DType::I64)?.one_hot(count))?;
            no_panic("display", || Ok(format!("{x}")))?;
        }
    });
}

/// A size for a pooling or convolution parameter: mostly small, sometimes huge.
fn any_param() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 0usize..4,
        1 => Just(1usize << 39),
        1 => Just((1usize << 40) + 1),
        1 => Just(usize::MAX / 2 + 1),
        1 => Just(usize::MAX),
    ]
}

fn any_pair() -> impl Strategy<Value = (usize, usize)> {
    (any_param(), any_param())
}

#[test]
fn ops_with_parameters_never_panic() {
    setup();
    // 256 cases, or PROPTEST_CASES.
    let config = ProptestConfig::default();
    proptest!(config, |(
        dims in proptest::collection::vec(0usize..4, 0..5),
        other in proptest::collection::vec(0usize..4, 0..5),
        (kernel, stride, padding, dilation) in (any_pair(), any_pair(), any_pair(), any_pair()),
        groups in any_param(),
        ids in proptest::collection::vec(prop_oneof![-2i64..4, Just(i64::MIN), Just(i64::MAX)], 0..4),
        (d0, count) in (any_dim(), any_size()),
        target in any_shape(),
    )| {
        let x = Tensor::ones_on(dims.as_slice(), DType::F32, LIMITED).unwrap();
        let y = Tensor::ones_on(other.as_slice(), DType::F32, LIMITED).unwrap();
        let index = ints(&ids);
        let params = brasa_tensor::Conv2dParams { stride, padding, dilation, groups };
        no_panic("max_pool2d", || x.max_pool2d(kernel, stride, padding))?;
        no_panic("avg_pool2d", || x.avg_pool2d(kernel, stride, padding, true))?;
        for shape in [other.as_slice(), target.as_slice()] {
            no_panic("avg_pool2d_backward", || x.avg_pool2d_backward(shape, kernel, stride, padding, false))?;
            no_panic("max_pool2d_backward", || x.max_pool2d_backward(&index, shape))?;
            no_panic("conv2d_backward_input", || x.conv2d_backward_input(&y, shape, params))?;
            no_panic("conv2d_backward_weight", || x.conv2d_backward_weight(&y, shape, params))?;
        }
        no_panic("conv2d", || x.conv2d(&y, None, params))?;
        no_panic("matmul", || x.matmul(&y))?;
        no_panic("index_select", || x.index_select(d0, &index))?;
        no_panic("gather", || x.gather(d0, &index))?;
        no_panic("scatter_add_", || x.scatter_add_(d0, &index, &y))?;
        no_panic("embedding", || Tensor::embedding(&x, &index))?;
        no_panic("one_hot", || index.one_hot(count))?;
        no_panic("where_cond", || x.gt_scalar(0.5)?.where_cond(&x, &y))?;
        no_panic("cat", || Tensor::cat(&[&x, &y], d0))?;
        no_panic("copy_", || x.copy_(&y))?;
        no_panic("scalar", || x.affine(kernel.0 as f64, -(stride.1 as f64)))?;
    });
}
