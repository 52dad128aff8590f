//! Bad input at the extremes gets an `Err` naming the problem: sizes that
//! overflow, integer arithmetic at its limits, values that do not fit the
//! dtype, constructors whose arguments contradict each other, 0-d tensors,
//! and in-place writes into views whose elements share memory. Never a
//! panic, a hang or a silently wrong result. The last test throws random
//! shapes (with sizes 0, 1 and huge) at every constructor and shape op.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, LayoutError, Tensor, TensorError};
use std::sync::mpsc;
use std::time::Duration;

const CPU: Device = Device::CPU;
const HUGE: usize = 1 << 62;

/// Runs `f` on another thread and fails the test if it has not returned
/// within a few seconds (so a hang is a failure, not a stuck test run).
fn returns_in_time<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(f());
    });
    receiver.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{what} did not return"))
}

fn err<T: std::fmt::Debug>(result: Result<T, TensorError>) -> TensorError {
    result.expect_err("expected an error")
}

/// Whether `error` is a [`LayoutError::TooLarge`] naming `dims`.
fn too_large(error: &TensorError, dims: &[usize]) -> bool {
    matches!(error, TensorError::Layout(LayoutError::TooLarge { shape }) if shape.dims() == dims)
}

fn ints(values: &[i64]) -> Tensor {
    Tensor::from_slice_on(values, [values.len()], CPU).unwrap()
}

fn scalar() -> Tensor {
    Tensor::scalar_on(3.0f32, CPU).unwrap()
}

// ----- 1. sizes whose element or byte count overflows ---------------------------

#[test]
fn shapes_whose_element_count_overflows_are_errors() {
    for dims in [vec![usize::MAX, 2], vec![1 << 32, 1 << 32], vec![HUGE, 4], vec![0, usize::MAX], vec![3, 0, HUGE, 4]] {
        for dtype in [DType::U8, DType::F32] {
            let error = err(Tensor::zeros_on(dims.as_slice(), dtype, CPU));
            assert!(too_large(&error, &dims), "{dims:?}: {error:?}");
            assert!(Tensor::full_on(dims.as_slice(), 1.0, dtype, CPU).is_err());
            assert!(Tensor::ones_on(dims.as_slice(), dtype, CPU).is_err());
        }
        assert!(Tensor::rand_on(dims.as_slice(), DType::F32, CPU).is_err());
        assert!(Tensor::randn_on(dims.as_slice(), DType::F16, CPU).is_err());
        assert!(Tensor::bernoulli_on(dims.as_slice(), 0.5, DType::Bool, CPU).is_err());
        assert!(Tensor::from_slice_on(&[1f32], dims.as_slice(), CPU).is_err());
    }
    // A count that fits but whose bytes do not: 2^62 f32 are 2^64 bytes.
    let error = err(Tensor::zeros_on([HUGE], DType::F32, CPU));
    assert!(matches!(error, TensorError::Invalid { .. }), "{error:?}");
    // The variant says no more: the message names the count and the dtype.
    assert!(error.to_string().contains("4611686018427387904 elements of f32"), "{error}");
    // A count whose bytes fit a usize but no memory: out of memory.
    let error = Tensor::zeros_on([HUGE], DType::U8, CPU).unwrap_err();
    assert!(error.as_out_of_memory().is_some(), "{error}");
}

#[test]
fn huge_ranges_and_identities_are_errors() {
    // arange's element count does not fit (PyTorch: "invalid size, possible overflow").
    let overflow: fn(&TensorError) -> bool = |error| matches!(error, TensorError::Invalid { op: "arange", .. });
    let out_of_memory: fn(&TensorError) -> bool = |error| error.as_out_of_memory().is_some();
    let count_too_large: fn(&TensorError) -> bool = |error| too_large(error, &[usize::MAX]);
    let square_too_large: fn(&TensorError) -> bool =
        |error| too_large(error, &[1 << 32, 1 << 32]) || too_large(error, &[usize::MAX, usize::MAX]);
    for (result, expected) in [
        (Tensor::arange_on(0.0, 1e30, 1.0, DType::F32, CPU), overflow),
        (Tensor::arange_on(0.0, 1.0, 1e-30, DType::F32, CPU), overflow),
        (Tensor::arange_on(0.0, HUGE as f64, 1.0, DType::U8, CPU), out_of_memory),
        (Tensor::linspace_on(0.0, 1.0, usize::MAX, DType::F32, CPU), count_too_large),
        (Tensor::linspace_on(0.0, 1.0, HUGE, DType::U8, CPU), out_of_memory),
        (Tensor::eye_on(1 << 32, DType::F32, CPU), square_too_large),
        (Tensor::eye_on(usize::MAX, DType::U8, CPU), square_too_large),
    ] {
        let error = result.unwrap_err();
        assert!(expected(&error), "{error:?}");
    }
}

#[test]
fn views_expanded_to_huge_shapes() {
    let one = scalar();
    // The element count itself overflows: refused when the view is made.
    let error = err(one.expand([1 << 40, 1 << 40]));
    assert!(too_large(&error, &[1 << 40, 1 << 40]), "{error:?}");
    assert!(one.expand([usize::MAX]).is_err());
    let row = Tensor::zeros_on([1, 3], DType::F32, CPU).unwrap();
    assert!(row.expand([usize::MAX / 2, 3]).is_err());
    // Broadcasting two valid views to a shape that is not.
    let column = one.expand([1 << 40, 1]).unwrap();
    let line = one.expand([1, 1 << 40]).unwrap();
    let error = err(&column + &line);
    assert!(
        matches!(&error, TensorError::OpLayout { op: "add", source } if matches!(**source, LayoutError::TooLarge { .. })),
        "{error:?}"
    );
    assert!(column.maximum(&line).is_err());
    assert!(column.lt(&line).is_err());
    assert!(column.add_(&line).is_err());
    // A count that fits: the view exists, but materialising it is out of memory.
    let wide = one.expand([HUGE]).unwrap();
    assert_eq!(wide.numel(), HUGE);
    assert!(wide.contiguous().is_err());
    assert!(wide.to_vec::<f32>().is_err());
    assert!(wide.exp().is_err());
    assert!((&wide + 1.0).is_err());
    assert!(wide.reshape(&[2, -1]).unwrap().dims() == [2, HUGE / 2]);
    assert!(Tensor::cat(&[&wide, &wide], 0).is_err(), "2^63 elements");
    assert!(wide.unsqueeze(0).unwrap().expand([4, HUGE]).is_err());
    // Reductions of it read the one element: the exact answers.
    assert_eq!(wide.sum_all().unwrap().item::<f32>().unwrap(), 3.0 * HUGE as f32);
    assert_eq!(wide.mean_all().unwrap().item::<f32>().unwrap(), 3.0);
    assert_eq!(wide.max(&[], false).unwrap().item::<f32>().unwrap(), 3.0);
    assert_eq!(wide.argmax(&[], false).unwrap().item::<i64>().unwrap(), 0);
    let counts = ints(&[1, 2]).unsqueeze(1).unwrap().expand([2, HUGE / 2]).unwrap();
    assert_eq!(counts.sum(&[1], false).unwrap().to_vec::<i64>().unwrap(), [HUGE as i64 / 2, HUGE as i64]);
    assert_eq!(counts.sum_all().unwrap().item::<i64>().unwrap(), 3 * (HUGE as i64 / 2));
    assert!(ints(&[1, 2]).unsqueeze(1).unwrap().expand([2, HUGE]).is_err(), "2^63 elements");
}

#[test]
fn pooling_and_convolution_windows_too_large_to_count_are_errors() {
    let x = Tensor::ones_on([1, 1, 1, 1], DType::F32, CPU).unwrap();
    // Padding at most half the kernel makes a huge kernel legal on a 1x1
    // input; its window has more elements than a usize counts.
    let k = (1usize << 40) + 1;
    let error = err(x.max_pool2d((k, k), (1, 1), (1 << 39, 1 << 39)));
    assert!(matches!(error, TensorError::Invalid { op: "max_pool2d", .. }), "{error:?}");
    assert!(error.to_string().contains("kernel (1099511627777, 1099511627777)"), "{error}");
    assert!(x.avg_pool2d((k, k), (1, 1), (1 << 39, 1 << 39), true).is_err());
    let w = Tensor::ones_on([1, 1, 1, 1], DType::F32, CPU).unwrap();
    let padded = brasa_tensor::Conv2dParams::default().with_padding((1 << 40, 1 << 40));
    let error = err(x.conv2d(&w, None, padded));
    assert!(matches!(error, TensorError::Shape { op: "conv2d", .. }), "{error:?}");
    assert!(error.to_string().contains("overflows"), "{error}");
    let huge = [1usize, 1, 1 << 40, 1 << 40];
    assert!(x.conv2d_backward_input(&w, huge, brasa_tensor::Conv2dParams::default()).is_err());
}

#[test]
fn reshapes_of_empty_tensors_to_huge_shapes_are_errors() {
    let empty = Tensor::zeros_on([0], DType::F32, CPU).unwrap();
    assert!(empty.reshape(&[0, isize::MAX, isize::MAX]).is_err());
    assert!(empty.view(&[isize::MAX, 0, 4]).is_err());
    assert_eq!(empty.reshape(&[0, isize::MAX]).unwrap().dims(), [0, isize::MAX as usize]);
    assert!(ints(&[1]).one_hot(usize::MAX).is_err());
    assert!(ints(&[1, 2]).one_hot(HUGE).is_err());
}

// ----- 2. integer arithmetic at the extremes --------------------------------------

#[test]
fn integer_powers_at_the_extremes_return() {
    let (got, negative) = returns_in_time("pow with i64::MIN", || {
        let base = ints(&[-1, 1, 2, 0, -1, 3, i64::MIN]);
        let exponent = ints(&[i64::MIN, i64::MIN, i64::MIN, i64::MIN, i64::MAX, i64::MAX, 2]);
        (base.pow(&exponent).map(|t| t.to_vec::<i64>().unwrap()), ints(&[-1, 2]).powf(-1.0))
    });
    // PyTorch's integer power: negative exponents give 1 / base^|e| truncated.
    assert_eq!(got.unwrap(), [1, 1, 0, 0, -1, pow_wrapping(3, i64::MAX), 0]);
    // With a scalar exponent PyTorch refuses negative integers.
    let error = negative.unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "powf", .. }), "{error:?}");
    // PyTorch's words.
    assert!(error.to_string().contains("Integers to negative integer powers are not allowed"), "{error}");
    for exponent in [-1.0, i64::MIN as f64, -1e300] {
        assert!(ints(&[2]).powf(exponent).is_err(), "{exponent}");
        assert!(Tensor::from_slice_on(&[7u8], [1], CPU).unwrap().powf(exponent).is_err());
        assert!(Tensor::from_slice_on(&[true], [1], CPU).unwrap().powf(exponent).is_err());
    }
    // Beyond i64 an integral exponent cannot stand for an integer.
    assert!(ints(&[2]).powf(1e300).is_err());
    assert_eq!(ints(&[-1, 2]).powf(-0.5).unwrap().dtype(), DType::F32, "fractional: a float power");
    assert_eq!(ints(&[3]).powf(i64::MAX as f64 / 2.0).unwrap().dtype(), DType::I64);
}

/// `base^exponent` in wrapping i64 arithmetic, by repeated squaring.
fn pow_wrapping(base: i64, mut exponent: i64) -> i64 {
    let (mut acc, mut b) = (1i64, base);
    while exponent > 0 {
        if exponent & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        exponent >>= 1;
    }
    acc
}

#[test]
fn integer_scalars_beyond_i64_are_errors() {
    let x = ints(&[1, 2]);
    for value in [1e19, -1e19, 1e300, 9_223_372_036_854_775_808.0] {
        assert!(x.add_scalar(value).is_err(), "{value}");
        assert!(x.mul_scalar(value).is_err(), "{value}");
        assert!(x.affine(value, 0.0).is_err(), "{value}");
        assert!(x.sub_scalar(value).is_err(), "{value}");
        assert!(x.add_scalar_(value).is_err(), "{value}");
        assert!(x.add_scaled_(value, &x).is_err(), "{value}");
    }
    assert_eq!(x.to_vec::<i64>().unwrap(), [1, 2], "nothing written");
    // Float scalars (NaN, infinities, fractions) make a float result.
    assert!(x.add_scalar(f64::NAN).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(x.add_scalar(f64::INFINITY).unwrap().dtype(), DType::F32);
    assert_eq!(
        x.add_scalar(-9_223_372_036_854_775_808.0).unwrap().to_vec::<i64>().unwrap(),
        [i64::MIN + 1, i64::MIN + 2]
    );
}

// ----- 3. values that do not fit the dtype ------------------------------------------

#[test]
fn fill_values_that_do_not_fit_the_dtype_are_errors() {
    let cases: [(f64, DType); 12] = [
        (f64::NAN, DType::I64),
        (f64::INFINITY, DType::I64),
        (f64::NEG_INFINITY, DType::U8),
        (300.0, DType::U8),
        (256.0, DType::U8),
        (-256.0, DType::U8),
        (-0.5, DType::U8),
        (255.5, DType::U8),
        (9_223_372_036_854_775_808.0, DType::I64),
        (-1e19, DType::I64),
        (1e6, DType::F16),
        (1e39, DType::F32),
    ];
    for (value, dtype) in cases {
        let error = err(Tensor::full_on([2], value, dtype, CPU));
        assert!(
            matches!(
                error,
                TensorError::ValueOutOfRange { op: "full", value: v, dtype: d }
                    if d == dtype && (v == value || v.is_nan() && value.is_nan())
            ),
            "{value} into {dtype}: {error:?}"
        );
        let target = Tensor::zeros_on([2], dtype, CPU).unwrap();
        assert!(target.full_like(value).is_err());
        assert!(target.new_full([3], value).is_err());
        assert!(target.fill_(value).is_err());
        assert_eq!(target.version(), 0, "nothing written");
        assert_eq!(target.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), [0.0, 0.0]);
    }
    // What PyTorch accepts: fractions truncate, integers -1..=-255 wrap into
    // u8 (two's complement), anything goes into bool, and float dtypes take
    // NaN and the infinities.
    assert_eq!(Tensor::full_on([2], 1.9, DType::I64, CPU).unwrap().to_vec::<i64>().unwrap(), [1, 1]);
    assert_eq!(Tensor::full_on([2], -2.5, DType::I64, CPU).unwrap().to_vec::<i64>().unwrap(), [-2, -2]);
    assert_eq!(Tensor::full_on([1], -1.0, DType::U8, CPU).unwrap().to_vec::<u8>().unwrap(), [255]);
    assert_eq!(Tensor::full_on([1], 255.0, DType::U8, CPU).unwrap().to_vec::<u8>().unwrap(), [255]);
    assert_eq!(Tensor::full_on([1], -255.0, DType::U8, CPU).unwrap().to_vec::<u8>().unwrap(), [1]);
    assert_eq!(Tensor::full_on([1], i64::MIN as f64, DType::I64, CPU).unwrap().to_vec::<i64>().unwrap(), [i64::MIN]);
    assert_eq!(Tensor::full_on([1], f64::NAN, DType::Bool, CPU).unwrap().to_vec::<bool>().unwrap(), [true]);
    assert_eq!(Tensor::full_on([1], 1e300, DType::Bool, CPU).unwrap().to_vec::<bool>().unwrap(), [true]);
    assert!(Tensor::full_on([1], f64::NAN, DType::F16, CPU).unwrap().to_vec::<half::f16>().unwrap()[0].is_nan());
    let inf = Tensor::full_on([1], f64::NEG_INFINITY, DType::BF16, CPU).unwrap();
    assert_eq!(inf.to_vec::<half::bf16>().unwrap(), [half::bf16::NEG_INFINITY]);
    assert_eq!(
        Tensor::full_on([1], 65504.0, DType::F16, CPU).unwrap().to_vec::<half::f16>().unwrap(),
        [half::f16::MAX]
    );
    let t = Tensor::zeros_on([2], DType::U8, CPU).unwrap();
    t.fill_(7.0).unwrap();
    assert_eq!(t.to_vec::<u8>().unwrap(), [7, 7]);
}

// ----- 4. constructors whose arguments contradict each other ---------------------------

#[test]
fn contradictory_constructor_arguments_are_errors() {
    for (start, end, step) in [(0.0, 10.0, -1.0), (10.0, 0.0, 1.0), (0.0, 10.0, 0.0), (0.0, -1e-300, 1.0)] {
        let error = err(Tensor::arange_on(start, end, step, DType::F32, CPU));
        assert!(matches!(error, TensorError::Invalid { op: "arange", .. }), "{start} {end} {step}: {error:?}");
    }
    for (start, end, step) in [(f64::NAN, 1.0, 1.0), (0.0, f64::INFINITY, 1.0), (0.0, 1.0, f64::NAN)] {
        assert!(Tensor::arange_on(start, end, step, DType::F32, CPU).is_err());
    }
    // Equal bounds give an empty range whatever the step's sign.
    assert_eq!(Tensor::arange_on(5.0, 5.0, -1.0, DType::F32, CPU).unwrap().dims(), [0]);
    assert_eq!(Tensor::arange_on(3.0, 0.0, -1.0, DType::I64, CPU).unwrap().to_vec::<i64>().unwrap(), [3, 2, 1]);
    for (low, high) in [(1.0, 0.0), (f64::NAN, 1.0), (0.0, f64::INFINITY), (0.0, 1e39)] {
        assert!(Tensor::uniform_on([2], low, high, DType::F32, CPU).is_err(), "{low} {high}");
    }
    for p in [-0.1, 1.5, f64::NAN] {
        assert!(Tensor::bernoulli_on([2], p, DType::F32, CPU).is_err(), "{p}");
    }
    for dtype in [DType::I64, DType::U8, DType::Bool] {
        assert!(Tensor::rand_on([2], dtype, CPU).is_err());
        assert!(Tensor::randn_on([2], dtype, CPU).is_err());
    }
    // Values that do not fit an integer dtype.
    assert!(Tensor::arange_on(0.0, 300.0, 1.0, DType::U8, CPU).is_err());
    assert!(Tensor::linspace_on(0.0, 1e30, 3, DType::I64, CPU).is_err());
    assert!(Tensor::linspace_on(f64::NAN, 1.0, 3, DType::I64, CPU).is_err());
    assert_eq!(Tensor::arange_on(0.0, 256.0, 1.0, DType::U8, CPU).unwrap().dims(), [256]);
}

// ----- 5. 0-d tensors ------------------------------------------------------------

#[test]
fn zero_dim_tensors_go_through_every_shape_routine() {
    let s = scalar();
    assert_eq!(s.flatten(0, -1).unwrap().dims(), [1]);
    assert_eq!(s.flatten(0, 0).unwrap().dims(), [1]);
    assert_eq!(s.flatten(-1, -1).unwrap().to_vec::<f32>().unwrap(), [3.0]);
    assert!(s.flatten(1, 1).is_err());
    assert_eq!(s.reshape(&[-1]).unwrap().dims(), [1]);
    assert_eq!(s.reshape(&[1, -1, 1]).unwrap().dims(), [1, 1, 1]);
    assert_eq!(s.view(&[]).unwrap().dims(), [] as [usize; 0]);
    assert_eq!(s.squeeze(0).unwrap().dims(), [] as [usize; 0]);
    assert_eq!(s.squeeze(-1).unwrap().dims(), [] as [usize; 0]);
    assert!(s.squeeze(1).is_err());
    assert_eq!(s.unsqueeze(0).unwrap().dims(), [1]);
    assert_eq!(s.unsqueeze(-1).unwrap().dims(), [1]);
    assert!(s.unsqueeze(1).is_err());
    assert_eq!(s.transpose(0, -1).unwrap().dims(), [] as [usize; 0]);
    assert!(s.transpose(0, 1).is_err());
    assert_eq!(s.t().unwrap().dims(), [] as [usize; 0]);
    assert_eq!(ints(&[1, 2]).t().unwrap().dims(), [2]);
    assert_eq!(s.permute(&[]).unwrap().dims(), [] as [usize; 0]);
    assert!(s.permute(&[0]).is_err());
    assert!(s.narrow(0, 0, 1).is_err());
    assert!(s.select(0, 0).is_err());
    assert_eq!(s.expand([2, 3]).unwrap().to_vec::<f32>().unwrap(), [3.0; 6]);
    assert_eq!(s.expand(()).unwrap().dims(), [] as [usize; 0]);
    assert!(Tensor::cat(&[&s, &s], 0).is_err());
    assert_eq!(Tensor::stack(&[&s, &s], 0).unwrap().to_vec::<f32>().unwrap(), [3.0, 3.0]);
    assert!(s.split(1, 0).is_err());
    assert!(s.chunk(1, 0).is_err());
    for keepdim in [false, true] {
        for dims in [&[][..], &[0], &[-1]] {
            assert_eq!(s.sum(dims, keepdim).unwrap().dims(), [] as [usize; 0]);
            assert_eq!(s.max(dims, keepdim).unwrap().item::<f32>().unwrap(), 3.0);
            assert_eq!(s.argmax(dims, keepdim).unwrap().item::<i64>().unwrap(), 0);
            assert_eq!(s.argmin(dims, keepdim).unwrap().dims(), [] as [usize; 0]);
            assert_eq!(s.mean(dims, keepdim).unwrap().item::<f32>().unwrap(), 3.0);
        }
    }
    assert!(s.sum(&[1], false).is_err());
    let error = err(s.sum(&[0, -1], false));
    assert!(matches!(error, TensorError::Invalid { op: "sum", .. }), "{error:?}");
    assert!(s.var(&[], false).unwrap().item::<f32>().unwrap().is_nan());
    assert_eq!(s.softmax(-1).unwrap().item::<f32>().unwrap(), 1.0);
    assert_eq!(s.log_softmax(0).unwrap().item::<f32>().unwrap(), 0.0);
    let index = Tensor::scalar_on(0i64, CPU).unwrap();
    assert_eq!(s.index_select(0, &index).unwrap().dims(), [] as [usize; 0]);
    assert_eq!(s.index_select(-1, &ints(&[0])).unwrap().item::<f32>().unwrap(), 3.0);
    let error = err(s.index_select(0, &ints(&[0, 0])));
    assert!(matches!(error, TensorError::Shape { op: "index_select", .. }), "{error:?}");
    assert!(s.index_select(0, &ints(&[1])).is_err());
    assert!(s.index_select(1, &index).is_err());
    assert_eq!(s.gather(0, &index).unwrap().item::<f32>().unwrap(), 3.0);
    assert_eq!(index.one_hot(3).unwrap().to_vec::<i64>().unwrap(), [1, 0, 0]);
    let table = Tensor::zeros_on([2, 4], DType::F32, CPU).unwrap();
    assert_eq!(Tensor::embedding(&table, &index).unwrap().dims(), [4]);
    let target = Tensor::scalar_on(1.0f32, CPU).unwrap();
    target.scatter_add_(0, &index, &s).unwrap();
    assert_eq!(target.item::<f32>().unwrap(), 4.0);
    target.copy_(&s).unwrap();
    assert_eq!(target.item::<f32>().unwrap(), 3.0);
    assert!(s.matmul(&s).is_err());
    assert_eq!(s.to_string(), "tensor(3.0000, shape=[], dtype=f32, device=cpu:0)");
}

// ----- 6. in-place writes into views whose elements share memory -----------------------

#[test]
fn writes_into_expanded_views_are_errors() {
    let base = Tensor::zeros_on([1, 3], DType::F32, CPU).unwrap();
    let expanded = base.expand([2, 3]).unwrap();
    let src = Tensor::arange_on(0.0, 6.0, 1.0, DType::F32, CPU).unwrap().reshape(&[2, 3]).unwrap();
    let error = err(expanded.copy_(&src));
    assert!(matches!(error, TensorError::Invalid { op: "copy_", .. }), "{error:?}");
    // PyTorch's words, and the view's shape and strides.
    let error = error.to_string();
    assert!(
        error.contains("more than one element of the written-to tensor refers to a single memory location"),
        "{error}"
    );
    assert!(error.contains("[2, 3]") && error.contains("[0, 1]"), "{error}");
    assert_eq!(base.to_vec::<f32>().unwrap(), [0.0; 3], "nothing written");
    assert_eq!(base.version(), 0);
    // Other in-place writers refuse the same view.
    assert!(expanded.add_(&src).is_err());
    assert!(expanded.exp_().is_err());
    assert!(expanded.clamp_(Some(0.0), None).is_err());
    let index = Tensor::zeros_on([2, 3], DType::I64, CPU).unwrap();
    assert!(expanded.scatter_add_(0, &index, &src).is_err());
    // A broadcast dim of size 1, or a source that is expanded, is fine.
    let row = base.expand([1, 3]).unwrap();
    row.copy_(&src.narrow(0, 1, 1).unwrap()).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), [3.0, 4.0, 5.0]);
    let dst = Tensor::zeros_on([2, 3], DType::F32, CPU).unwrap();
    dst.copy_(&expanded).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), [3.0, 4.0, 5.0, 3.0, 4.0, 5.0]);
    // fill_ writes one value, so PyTorch allows it on an expanded view.
    expanded.fill_(1.0).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), [1.0; 3]);
}

#[test]
fn strided_slices_are_views_with_python_bounds() {
    let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32).unwrap().reshape(&[3, 4]).unwrap();
    // x[:, 1::2]: columns 1 and 3, a view.
    let cols = x.slice(1, 1, usize::MAX, 2).unwrap();
    assert_eq!(cols.dims(), &[3, 2]);
    assert!(cols.shares_storage_with(&x));
    assert_eq!(cols.to_vec::<f32>().unwrap(), [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]);
    // x[::2] then a write through the view.
    let rows = x.slice(0, 0, 3, 2).unwrap();
    assert_eq!(rows.dims(), &[2, 4]);
    rows.fill_(-1.0).unwrap();
    assert_eq!(&x.to_vec::<f32>().unwrap()[..8], [-1.0, -1.0, -1.0, -1.0, 4.0, 5.0, 6.0, 7.0]);
    // Bounds past the size clamp; start past end is empty; a step past the end keeps one.
    assert_eq!(x.slice(1, 5, 9, 1).unwrap().dims(), &[3, 0]);
    assert_eq!(x.slice(1, 3, 1, 1).unwrap().dims(), &[3, 0]);
    assert_eq!(x.slice(1, 2, 4, 10).unwrap().to_vec::<f32>().unwrap(), [-1.0, 6.0, -1.0]);
    // A zero step and a bad dim are errors naming them.
    let error = x.slice(0, 0, 3, 0).unwrap_err();
    assert!(matches!(error, TensorError::Layout(LayoutError::SliceStep { dim: 0, step: 0 })), "{error:?}");
    assert!(x.slice(2, 0, 1, 1).is_err());
}
