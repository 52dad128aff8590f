//! `scatter` (from a tensor and of a value), `scatter_reduce` (sum, with
//! and without `include_self`) and `index_add` (with `alpha`) against
//! literal values and a naive reference written here, on contiguous and
//! strided operands of several dtypes, with repeated indices; and their
//! errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{set_host_device_count, DType, Device, IndexError, LayoutError, ScatterReduce, Tensor, TensorError};
use proptest::prelude::*;

const CPU: Device = Device::CPU;

/// Two logical host devices for the device-mismatch errors: every test asks
/// for them before its first tensor, whichever test runs first.
fn init() {
    set_host_device_count(2).expect("every test asks for the same count");
}

fn ids(values: &[i64], shape: &[usize]) -> Tensor {
    init();
    Tensor::from_slice_on(values, shape, CPU).unwrap()
}

fn f32s(values: &[f32], shape: &[usize]) -> Tensor {
    init();
    Tensor::from_slice_on(values, shape, CPU).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn coords(dims: &[usize], mut flat: usize) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for (slot, &size) in c.iter_mut().zip(dims).rev() {
        *slot = flat % size;
        flat /= size;
    }
    c
}

fn flat(dims: &[usize], c: &[usize]) -> usize {
    let mut at = 0;
    for (&size, &i) in dims.iter().zip(c) {
        at = at * size + i;
    }
    at
}

/// What a scatter does, in f64, element by element in the index's
/// row-major order.
#[derive(Clone, Copy)]
enum Mode {
    Assign,
    Sum { include_self: bool },
}

#[allow(clippy::too_many_arguments)]
fn naive_scatter(
    x: &[f64],
    dims: &[usize],
    dim: usize,
    index: &[i64],
    index_dims: &[usize],
    src: &[f64],
    src_dims: &[usize],
    mode: Mode,
) -> Vec<f64> {
    let mut out = x.to_vec();
    let mut touched = vec![false; x.len()];
    for (p, &id) in index.iter().enumerate() {
        let c = coords(index_dims, p);
        let value = src[flat(src_dims, &c)];
        let mut at = c.clone();
        at[dim] = id as usize;
        let at = flat(dims, &at);
        match mode {
            Mode::Assign => out[at] = value,
            Mode::Sum { include_self } => {
                if !include_self && !touched[at] {
                    out[at] = 0.0;
                }
                out[at] += value;
            }
        }
        touched[at] = true;
    }
    out
}

/// A tensor of `dims` in `dtype` with small whole values, maybe seen through
/// a transposed copy so that it is not contiguous.
fn source(dims: &[usize], dtype: DType, strided: bool, salt: usize) -> Tensor {
    init();
    let numel: usize = dims.iter().product();
    let data: Vec<f64> = (0..numel).map(|i| ((i * 7 + salt) % 23) as f64).collect();
    let t = Tensor::from_vec_on(data, dims.to_vec(), CPU).unwrap().to_dtype(dtype).unwrap();
    if strided && dims.len() >= 2 {
        let last = dims.len() - 1;
        t.transpose(0, last).unwrap().contiguous().unwrap().transpose(0, last).unwrap()
    } else {
        t
    }
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn scatters_match_naive(
        dims in prop::collection::vec(1usize..5, 1..4),
        shrink in prop::collection::vec(0usize..2, 3),
        dim_pick in 0usize..3,
        seed in any::<u64>(),
        dtype in dtype(),
        strided: bool,
    ) {
        let d = dim_pick % dims.len();
        let x = source(&dims, dtype, strided, 0);
        let index_dims: Vec<usize> = dims.iter().zip(&shrink).enumerate()
            .map(|(a, (&s, &k))| if a == d { 1 + (seed as usize % 5) } else { s - k.min(s - 1) })
            .collect();
        // src one larger than the index in dim 0: only the covered part is read.
        let mut src_dims = index_dims.clone();
        src_dims[0] += 1;
        let count: usize = index_dims.iter().product();
        let mut state = seed;
        let raw: Vec<i64> = (0..count).map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % dims[d] as u64) as i64
        }).collect();
        let index = ids(&raw, &index_dims);
        let src = source(&src_dims, dtype, !strided, 5);
        let (xv, sv) = (values(&x), values(&src));
        let expect = |mode| naive_scatter(&xv, &dims, d, &raw, &index_dims, &sv, &src_dims, mode);

        let assigned = x.scatter(d, &index, &src).unwrap();
        prop_assert_eq!(assigned.dims(), &dims[..]);
        prop_assert_eq!(assigned.dtype(), dtype);
        prop_assert_eq!(values(&assigned), expect(Mode::Assign));
        for include_self in [true, false] {
            let reduced = x.scatter_reduce(d, &index, &src, ScatterReduce::Sum, include_self).unwrap();
            prop_assert_eq!(values(&reduced), expect(Mode::Sum { include_self }));
            let inplace = x.zeros_like().unwrap();
            inplace.copy_(&x).unwrap();
            inplace.scatter_reduce_(d, &index, &src, ScatterReduce::Sum, include_self).unwrap();
            prop_assert_eq!(values(&inplace), expect(Mode::Sum { include_self }));
        }
        // In place through a strided view writes through to its storage.
        let target = source(&dims, dtype, true, 0);
        target.scatter_(d, &index, &src).unwrap();
        prop_assert_eq!(values(&target), expect(Mode::Assign));
        prop_assert_eq!(values(&x), xv, "the out-of-place forms leave self alone");
    }

    #[test]
    fn index_add_matches_naive(
        dims in prop::collection::vec(1usize..5, 1..4),
        dim_pick in 0usize..3,
        raw in prop::collection::vec(0i64..4, 0..6),
        alpha in prop::sample::select(vec![1.0, -2.0, 3.0]),
        dtype in dtype(),
        strided: bool,
    ) {
        let d = dim_pick % dims.len();
        let x = source(&dims, dtype, strided, 0);
        let raw: Vec<i64> = raw.into_iter().map(|i| i % dims[d] as i64).collect();
        let mut source_dims = dims.clone();
        source_dims[d] = raw.len();
        let src = source(&source_dims, dtype, !strided, 3);
        let out = x.index_add(d, &ids(&raw, &[raw.len()]), &src, alpha).unwrap();
        let (mut expect, sv) = (values(&x), values(&src));
        for (p, v) in sv.iter().enumerate() {
            let mut c = coords(&source_dims, p);
            c[d] = raw[c[d]] as usize;
            expect[flat(&dims, &c)] += alpha * v;
        }
        prop_assert_eq!(values(&out), expect);
    }
}

#[test]
fn scatter_literal_values_and_repeated_indices() {
    // dim 1 of [2, 3]; row 0 writes columns 2 then 2 again (the last wins).
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let index = ids(&[2, 2, 0, 1], &[2, 2]);
    let src = f32s(&[10.0, 20.0, 30.0, 40.0], &[2, 2]);
    assert_eq!(x.scatter(1, &index, &src).unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0, 20.0, 30.0, 40.0, 6.0]);
    let sum = x.scatter_reduce(1, &index, &src, ScatterReduce::Sum, true).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), [1.0, 2.0, 33.0, 34.0, 45.0, 6.0]);
    let sum = x.scatter_reduce(1, &index, &src, ScatterReduce::Sum, false).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), [1.0, 2.0, 30.0, 30.0, 40.0, 6.0]);
    // Overwriting copies exactly: -0.0, NaN and infinities arrive as they are.
    let special = f32s(&[-0.0, f32::NAN, f32::INFINITY, 7.0], &[2, 2]);
    let out = x.scatter(1, &ids(&[0, 1, 1, 2], &[2, 2]), &special).unwrap().to_vec::<f32>().unwrap();
    assert!(out[0] == 0.0 && out[0].is_sign_negative() && out[1].is_nan(), "{out:?}");
    assert_eq!(out[2..], [3.0, 4.0, f32::INFINITY, 7.0]);
    // Of one value; in place on a transposed view.
    let filled = x.scatter_value(0, &ids(&[1, 0, 1], &[1, 3]), -1.0).unwrap();
    assert_eq!(filled.to_vec::<f32>().unwrap(), [1.0, -1.0, 3.0, -1.0, 5.0, -1.0]);
    let base = x.zeros_like().unwrap();
    base.copy_(&x).unwrap();
    let view = base.t().unwrap(); // [3, 2], view[i][j] = base[j][i]
    view.scatter_value_(0, &ids(&[2], &[1, 1]), 0.5).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), [1.0, 2.0, 0.5, 4.0, 5.0, 6.0]);
    // An empty index leaves everything as it was.
    let none = x.scatter(0, &ids(&[], &[0, 2]), &src).unwrap();
    assert_eq!(none.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    // 0-d tensors are 1-d of size 1.
    let s = Tensor::scalar_on(3.0f32, CPU).unwrap();
    let out = s.scatter(0, &ids(&[0], &[]), &Tensor::scalar_on(9.0f32, CPU).unwrap()).unwrap();
    assert_eq!((out.dims().len(), out.item::<f32>().unwrap()), (0, 9.0));
    // bool and u8 overwrite too.
    let flags = Tensor::from_vec_on(vec![false; 3], [3], CPU).unwrap();
    let set = flags.scatter(0, &ids(&[2, 0], &[2]), &Tensor::from_vec_on(vec![true, true], [2], CPU).unwrap());
    assert_eq!(set.unwrap().to_vec::<bool>().unwrap(), [true, false, true]);
}

#[test]
fn index_add_literal_values() {
    // Rows 2, 0, 2 of a [3, 2] receive alpha · source rows; row 2 twice.
    let x = f32s(&[1.0; 6], &[3, 2]);
    let source = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let out = x.index_add(0, &ids(&[2, 0, 2], &[3]), &source, 2.0).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), [7.0, 9.0, 1.0, 1.0, 13.0, 17.0]);
    // Along dim 1 of a transposed (non-contiguous) source, in place.
    let y = f32s(&[0.0; 4], &[2, 2]);
    let cols = f32s(&[1.0, 2.0, 3.0, 10.0, 20.0, 30.0], &[2, 3]); // [2, 3]
    let strided = cols.t().unwrap().contiguous().unwrap().t().unwrap();
    y.index_add_(1, &ids(&[1, 1, 0], &[3]), &strided, 1.0).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 3.0, 30.0, 30.0]);
    // Integers with a whole alpha, a 0-d index.
    let n = Tensor::from_vec_on(vec![1i64, 2, 3], [3], CPU).unwrap();
    let out = n.index_add(0, &ids(&[1], &[]), &Tensor::from_vec_on(vec![5i64], [1], CPU).unwrap(), -3.0).unwrap();
    assert_eq!(out.to_vec::<i64>().unwrap(), [1, -13, 3]);
}

#[test]
fn errors_name_the_problem_and_write_nothing() {
    let x = f32s(&[0.0; 6], &[2, 3]);
    let src = f32s(&[1.0; 6], &[2, 3]);
    // An index out of range, named with its place, the dim and its size.
    let index = ids(&[0, 1, 2, 3], &[2, 2]);
    for (error, name) in [
        (x.scatter(1, &index, &src).unwrap_err(), "scatter"),
        (x.scatter_reduce(1, &index, &src, ScatterReduce::Sum, false).unwrap_err(), "scatter_reduce"),
        (x.scatter_value(1, &index, 1.0).unwrap_err(), "scatter_value"),
    ] {
        assert!(
            matches!(
                &error,
                TensorError::Index { op, source: IndexError::OutOfRange { position: 3, index: 3, size: 3 }, .. }
                    if *op == name
            ),
            "{error:?}"
        );
        // The position as coordinates in the index tensor, and the dim.
        let message = error.to_string();
        assert!(message.contains("index 3 at [1, 1]") && message.contains("dim 1 of size 3"), "{message}");
    }
    let inplace = f32s(&[5.0; 6], &[2, 3]);
    assert!(inplace.scatter_(1, &index, &src).is_err());
    assert!(inplace.scatter_reduce_(1, &index, &src, ScatterReduce::Sum, false).is_err());
    assert_eq!(inplace.to_vec::<f32>().unwrap(), [5.0; 6], "nothing written");
    let negative = x.scatter(0, &ids(&[-1], &[1, 1]), &src).unwrap_err();
    assert!(
        matches!(
            negative,
            TensorError::Index {
                op: "scatter",
                source: IndexError::OutOfRange { position: 0, index: -1, size: 2 },
                ..
            }
        ),
        "{negative:?}"
    );
    // Rank, shape and dtype.
    let error = x.scatter(1, &ids(&[0, 1], &[2]), &src).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "scatter", .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("index has shape [2] but self has shape [2, 3]") && message.contains("same rank"),
        "{message}"
    );
    let error = x.scatter(1, &ids(&[0; 8], &[2, 4]), &src).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "scatter", .. }), "{error:?}");
    assert!(error.to_string().contains("index has size 4 in dim 1 but src has size 3"), "{error}");
    let error = x.scatter(1, &ids(&[0], &[1, 1]), &src.to_dtype(DType::F64).unwrap()).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "scatter", expected: DType::F32, got: DType::F64 }),
        "{error:?}"
    );
    let error = x.scatter(1, &index.to_dtype(DType::F32).unwrap(), &src).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "scatter", expected: DType::I64, got: DType::F32 }),
        "{error:?}"
    );
    let error = x.scatter(2, &index, &src).unwrap_err();
    assert!(
        matches!(error, TensorError::Layout(LayoutError::DimOutOfRange { op: "scatter", dim: 2, rank: 2 })),
        "{error:?}"
    );
    let elsewhere = Tensor::zeros_on([2, 3], DType::F32, Device::Cpu(1)).unwrap();
    let error = x.scatter(1, &ids(&[0], &[1, 1]), &elsewhere).unwrap_err();
    assert!(matches!(error, TensorError::DeviceMismatch { op: "scatter", lhs: CPU, rhs: Device::Cpu(1) }), "{error:?}");
    // index_add: index rank, source shape, alpha for integers, bad index.
    let error = x.index_add(0, &ids(&[0, 1], &[1, 2]), &src, 1.0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "index_add_", .. }), "{error:?}");
    assert!(error.to_string().contains("index must be 0-d or 1-d, got shape [1, 2]"), "{error}");
    let error = x.index_add(0, &ids(&[0, 1, 1], &[3]), &src, 1.0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "index_add_", .. }), "{error:?}");
    assert!(
        error.to_string().contains("source has shape [2, 3] but self has shape [2, 3] and there are 3 indices"),
        "{error}"
    );
    let error = x.index_add(1, &ids(&[0, 1, 5], &[3]), &src, 1.0).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::Index {
                op: "index_add_",
                source: IndexError::OutOfRange { position: 2, index: 5, size: 3 },
                ..
            }
        ),
        "{error:?}"
    );
    let n = Tensor::zeros_on([2], DType::I64, CPU).unwrap();
    let error = n.index_add(0, &ids(&[0], &[1]), &Tensor::ones_on([1], DType::I64, CPU).unwrap(), 0.5).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "index_add_", .. }), "{error:?}");
    assert!(error.to_string().contains("alpha 0.5 does not fit a i64 tensor"), "{error}");
}
