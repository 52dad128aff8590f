//! Reductions and softmax against naive references: random shapes (with
//! size-0 and size-1 dims), views (transposed, narrowed, expanded,
//! permuted), every dtype, negative dims, keepdim.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, LayoutError, Tensor, TensorError};
use proptest::prelude::*;

const CPU: Device = Device::CPU;

/// A tensor of `dims` from small values exact in every dtype, seen through
/// one of several views.
#[derive(Clone, Debug)]
struct Case {
    dims: Vec<usize>,
    values: Vec<i32>,
    dtype: DType,
    view: usize,
}

fn case(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Case> {
    let dtypes =
        prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8, DType::Bool]);
    (prop::collection::vec(0..=max_dim, 0..=max_rank), dtypes, 0usize..5).prop_flat_map(|(dims, dtype, view)| {
        let numel = dims.iter().product::<usize>();
        prop::collection::vec(-32i32..32, numel).prop_map(move |values| Case {
            dims: dims.clone(),
            values,
            dtype,
            view,
        })
    })
}

impl Case {
    /// The tensor, viewed as the case says.
    fn tensor(&self) -> Tensor {
        self.shifted(0.0)
    }

    /// The tensor with `shift` added to every (float) value, viewed as the case says.
    fn shifted(&self, shift: f64) -> Tensor {
        let base = typed(&self.values, &self.dims, self.dtype, shift);
        let rank = base.rank();
        match self.view {
            1 if rank >= 2 => base.transpose(0, -1).unwrap(),
            2 if rank >= 1 && base.dims()[0] > 1 => base.narrow(0, 1, base.dims()[0] - 1).unwrap(),
            3 => {
                let mut dims = vec![3];
                dims.extend_from_slice(base.dims());
                base.unsqueeze(0).unwrap().expand(dims).unwrap()
            }
            4 if rank >= 2 => base.permute(&(0..rank).rev().collect::<Vec<_>>()).unwrap(),
            _ => base,
        }
    }
}

/// A contiguous tensor of `dims` and `dtype` from small integers: exact in
/// every dtype (floats are `v / 8 + shift`, `u8` is `v + 32`, `bool` is `v > 0`).
fn typed(values: &[i32], dims: &[usize], dtype: DType, shift: f64) -> Tensor {
    let values: Vec<f64> = values
        .iter()
        .map(|&v| match dtype {
            DType::U8 => (v + 32) as f64,
            DType::I64 => v as f64,
            DType::Bool => (v > 0) as i32 as f64,
            _ => v as f64 / 8.0 + shift,
        })
        .collect();
    Tensor::from_vec_on(values, dims.to_vec(), CPU).unwrap().to_dtype(dtype).unwrap()
}

/// A tensor expanded from one with size 1 in the dims marked `broadcast`
/// (stride 0 after the expand), and maybe its dims reversed so that the
/// broadcast dims move.
#[derive(Clone, Debug)]
struct BroadcastCase {
    dims: Vec<usize>,
    broadcast: Vec<bool>,
    values: Vec<i32>,
    dtype: DType,
    reversed: bool,
}

fn broadcast_case(max_rank: usize, max_dim: usize) -> impl Strategy<Value = BroadcastCase> {
    let dtypes =
        prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8, DType::Bool]);
    let dims = prop::collection::vec(0..=max_dim, 1..=max_rank);
    let broadcast = prop::collection::vec(any::<bool>(), max_rank);
    (dims, broadcast, dtypes, any::<bool>()).prop_flat_map(|(dims, broadcast, dtype, reversed)| {
        let broadcast: Vec<bool> = broadcast[..dims.len()].to_vec();
        let numel: usize = dims.iter().zip(&broadcast).map(|(&d, &b)| if b { 1 } else { d }).product();
        // Few distinct values, so ties (and ties across broadcast copies) are common.
        prop::collection::vec(-4i32..4, numel).prop_map(move |values| BroadcastCase {
            dims: dims.clone(),
            broadcast: broadcast.clone(),
            values,
            dtype,
            reversed,
        })
    })
}

impl BroadcastCase {
    fn tensor(&self) -> Tensor {
        let base_dims: Vec<usize> =
            self.dims.iter().zip(&self.broadcast).map(|(&d, &b)| if b { 1 } else { d }).collect();
        let x = typed(&self.values, &base_dims, self.dtype, 0.0).expand(self.dims.clone()).unwrap();
        if self.reversed {
            x.permute(&(0..x.rank()).rev().collect::<Vec<_>>()).unwrap()
        } else {
            x
        }
    }
}

/// The elements of `t` as f64, row-major.
fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// Reference reduction: for each output (kept coordinates in row-major
/// order), `f` of the reduced elements in row-major order of the reduced dims.
fn naive(
    data: &[f64],
    dims: &[usize],
    mask: &[bool],
    keepdim: bool,
    f: &dyn Fn(&[f64]) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let out_dims: Vec<usize> =
        dims.iter().zip(mask).filter_map(|(&d, &m)| if m { keepdim.then_some(1) } else { Some(d) }).collect();
    let kept: Vec<usize> = (0..dims.len()).filter(|&d| !mask[d]).collect();
    let reduced: Vec<usize> = (0..dims.len()).filter(|&d| mask[d]).collect();
    let strides: Vec<usize> = (0..dims.len()).map(|d| dims[d + 1..].iter().product()).collect();
    let count = |axes: &[usize]| axes.iter().map(|&d| dims[d]).product::<usize>();
    let coords = |axes: &[usize], mut flat: usize| {
        let mut c = vec![0; axes.len()];
        for (slot, &d) in c.iter_mut().zip(axes).rev() {
            *slot = flat % dims[d];
            flat /= dims[d];
        }
        c
    };
    let mut out = Vec::new();
    for o in 0..count(&kept) {
        let kc = coords(&kept, o);
        let base: usize = kept.iter().zip(&kc).map(|(&d, &c)| c * strides[d]).sum();
        let group: Vec<f64> = (0..count(&reduced))
            .map(|r| {
                let rc = coords(&reduced, r);
                data[base + reduced.iter().zip(&rc).map(|(&d, &c)| c * strides[d]).sum::<usize>()]
            })
            .collect();
        out.push(f(&group));
    }
    (out_dims, out)
}

/// A random dims list for rank `rank` (each dim maybe, maybe negative) and the mask it means.
fn dims_list(rank: usize, picks: &[(bool, bool)]) -> (Vec<isize>, Vec<bool>) {
    let mut list = Vec::new();
    let mut mask = vec![false; rank];
    for (d, &(take, negative)) in picks.iter().enumerate().take(rank) {
        if take {
            list.push(if negative { d as isize - rank as isize } else { d as isize });
            mask[d] = true;
        }
    }
    if list.is_empty() {
        mask = vec![true; rank];
    }
    (list, mask)
}

/// The dtype's rounding of an exact value, as f64.
fn round_to(dtype: DType, value: f64) -> f64 {
    values(&Tensor::from_vec_on(vec![value], [1], CPU).unwrap().to_dtype(dtype).unwrap())[0]
}

fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::F32 => 1e-6,
        _ => 1e-12,
    }
}

fn first_arg(group: &[f64], max: bool) -> f64 {
    let mut best = 0;
    for (i, &v) in group.iter().enumerate() {
        if (max && v > group[best]) || (!max && v < group[best]) {
            best = i;
        }
    }
    best as f64
}

/// Every reduction of `x` (of `dtype`) over the dims `picks` selects,
/// against the naive reference.
fn check_reductions(x: &Tensor, dtype: DType, picks: &[(bool, bool)], keepdim: bool) -> Result<(), TestCaseError> {
    let data = values(x);
    let (list, mask) = dims_list(x.rank(), picks);
    let dims = x.dims().to_vec();
    let float = dtype.is_float();

    let sum = x.sum(&list, keepdim).unwrap();
    let (shape, expect) = naive(&data, &dims, &mask, keepdim, &|g| g.iter().sum());
    prop_assert_eq!(sum.dims(), &shape[..]);
    prop_assert_eq!(sum.dtype(), if float { dtype } else { DType::I64 });
    let got = values(&sum);
    for (g, e) in got.iter().zip(&expect) {
        // The data is exact in every dtype and the sums are exact in f32: only the final rounding differs.
        prop_assert_eq!(*g, if float { round_to(dtype, *e) } else { *e });
    }

    let reduced_any_empty = dims.iter().zip(&mask).any(|(&s, &m)| m && s == 0);
    for (max, op) in [(true, "max"), (false, "min")] {
        let values_result = if max { x.max(&list, keepdim) } else { x.min(&list, keepdim) };
        let arg_result = if max { x.argmax(&list, keepdim) } else { x.argmin(&list, keepdim) };
        if reduced_any_empty {
            let error = values_result.unwrap_err();
            prop_assert!(matches!(&error, TensorError::Shape { op: name, .. } if *name == op), "{:?}", error);
            let error = arg_result.unwrap_err();
            let arg_op = if max { "argmax" } else { "argmin" };
            prop_assert!(matches!(&error, TensorError::Shape { op: name, .. } if *name == arg_op), "{:?}", error);
            continue;
        }
        let extreme = values_result.unwrap();
        prop_assert_eq!(extreme.dtype(), dtype);
        let (shape, expect) = naive(&data, &dims, &mask, keepdim, &|g| {
            g.iter().copied().fold(if max { f64::MIN } else { f64::MAX }, if max { f64::max } else { f64::min })
        });
        prop_assert_eq!(extreme.dims(), &shape[..]);
        prop_assert_eq!(values(&extreme), expect);
        let arg = arg_result.unwrap();
        prop_assert_eq!(arg.dtype(), DType::I64);
        let (_, expect) = naive(&data, &dims, &mask, keepdim, &|g| first_arg(g, max));
        prop_assert_eq!(values(&arg), expect);
    }

    if float {
        let mean = x.mean(&list, keepdim).unwrap();
        let (_, expect) = naive(&data, &dims, &mask, keepdim, &|g| g.iter().sum::<f64>() / g.len() as f64);
        for (g, e) in values(&mean).iter().zip(&expect) {
            prop_assert!(
                e.is_nan() && g.is_nan() || (g - e).abs() <= 2.0 * epsilon(dtype) * (1.0 + e.abs()),
                "{} vs {}",
                g,
                e
            );
        }
        for correction in [0usize, 1, 2] {
            let var = x.var_with_correction(&list, correction, keepdim).unwrap();
            let (_, expect) = naive(&data, &dims, &mask, keepdim, &|g| {
                let m = g.iter().sum::<f64>() / g.len() as f64;
                g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len().saturating_sub(correction)) as f64
            });
            for (g, e) in values(&var).iter().zip(&expect) {
                let same =
                    (g.is_nan() && e.is_nan()) || g == e || (g - e).abs() <= 4.0 * epsilon(dtype) * (1.0 + e.abs());
                prop_assert!(same, "var correction {}: {} vs {}", correction, g, e);
            }
        }
    } else {
        prop_assert!(x.mean(&list, keepdim).is_err());
        prop_assert!(x.var(&list, keepdim).is_err());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn reductions_match_naive(c in case(4, 5), picks in prop::collection::vec(any::<(bool, bool)>(), 4), keepdim: bool) {
        check_reductions(&c.tensor(), c.dtype, &picks, keepdim)?;
    }

    #[test]
    fn reductions_of_broadcast_tensors_match_naive(
        c in broadcast_case(4, 5),
        picks in prop::collection::vec(any::<(bool, bool)>(), 4),
        keepdim: bool,
    ) {
        let x = c.tensor();
        check_reductions(&x, c.dtype, &picks, keepdim)?;
        // The same values, contiguous: the same results (sums exactly, for these values).
        let copy = x.contiguous().unwrap();
        let (list, _) = dims_list(x.rank(), &picks);
        prop_assert_eq!(values(&x.sum(&list, keepdim).unwrap()), values(&copy.sum(&list, keepdim).unwrap()));
        if x.numel() > 0 {
            prop_assert_eq!(values(&x.argmin(&list, keepdim).unwrap()), values(&copy.argmin(&list, keepdim).unwrap()));
        }
    }

    #[test]
    fn softmax_matches_naive_f64(c in case(3, 6), dim_pick in 0usize..3, negative: bool, shift in prop::sample::select(vec![0.0, 1000.0, -1000.0])) {
        prop_assume!(c.dtype.is_float() && !c.dims.is_empty());
        let x = c.shifted(shift);
        let rank = x.rank();
        let d = dim_pick % rank;
        let dim = if negative { d as isize - rank as isize } else { d as isize };
        let soft = x.softmax(dim).unwrap();
        let log = x.log_softmax(dim).unwrap();
        prop_assert_eq!(soft.dtype(), c.dtype);
        prop_assert_eq!(soft.dims(), x.dims());
        // Reference in f64 from the same (rounded) inputs, slice by slice.
        let moved = x.transpose(d, -1).unwrap();
        let data = values(&moved);
        let n = moved.dims()[rank - 1];
        let soft_moved = values(&soft.transpose(d, -1).unwrap());
        let log_moved = values(&log.transpose(d, -1).unwrap());
        let tolerance = 4.0 * epsilon(c.dtype).max(1e-6);
        for (i, row) in data.chunks(n.max(1)).enumerate().filter(|_| n > 0) {
            let m = row.iter().copied().fold(f64::MIN, f64::max);
            let total: f64 = row.iter().map(|v| (v - m).exp()).sum();
            let mut row_sum = 0.0;
            for (k, v) in row.iter().enumerate() {
                let p = (v - m).exp() / total;
                let got = soft_moved[i * n + k];
                row_sum += got;
                prop_assert!((got - p).abs() <= tolerance, "softmax {} vs {}", got, p);
                let lp = (v - m) - total.ln();
                let got_log = log_moved[i * n + k];
                prop_assert!((got_log - lp).abs() <= tolerance * (1.0 + lp.abs()), "log_softmax {} vs {}", got_log, lp);
                // log_softmax = log(softmax) where softmax is not tiny.
                if got > 1e-3 {
                    prop_assert!((got.ln() - got_log).abs() <= 2.0 * tolerance * (1.0 + lp.abs()) / got.min(1.0));
                }
            }
            prop_assert!((row_sum - 1.0).abs() <= tolerance * n as f64, "row sums to {}", row_sum);
        }
    }
}

#[test]
fn pairwise_sum_of_ten_million_tenths() {
    // Pairwise (blocked) summation keeps the error near log2(n) roundings; a
    // running f32 sum of these 10^7 values drifts to 1087937.
    let x = Tensor::full_on([10_000_000], 0.1, DType::F32, CPU).unwrap();
    let total = x.sum_all().unwrap().item::<f64>().unwrap();
    assert!((total - 1e6).abs() < 1.0, "sum of 1e7 x 0.1f32 = {total}");
    let mean = x.mean_all().unwrap().item::<f64>().unwrap();
    assert!((mean - 0.1).abs() < 1e-7, "mean = {mean}");
    // Reducing an outer dim is pairwise over rows too.
    let columns = x.reshape(&[5_000_000, 2]).unwrap().sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
    for c in columns {
        assert!((c as f64 - 5e5).abs() < 1.0, "column sum = {c}");
    }
}

#[test]
fn nan_propagates_and_is_found_first() {
    let x = Tensor::from_vec_on(vec![1.0f32, f32::NAN, 3.0, 4.0, 2.0, f32::NAN], [2, 3], CPU).unwrap();
    assert!(x.max(&[1], false).unwrap().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
    assert_eq!(x.argmax(&[1], false).unwrap().to_vec::<i64>().unwrap(), [1, 2]);
    assert_eq!(x.argmin(&[0], false).unwrap().to_vec::<i64>().unwrap(), [0, 0, 1]);
    let sums = x.sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
    assert!(sums[0] == 5.0 && sums[1].is_nan() && sums[2].is_nan());
}

#[test]
fn large_reductions_use_every_path() {
    // Big enough for the parallel paths: rows, columns and the copied fallback.
    let x = Tensor::randn_on([64, 300, 40], DType::F32, CPU).unwrap();
    let data = values(&x);
    let dims = x.dims().to_vec();
    for (list, mask) in [
        (vec![2], [false, false, true]),
        (vec![0], [true, false, false]),
        (vec![1], [false, true, false]),
        (vec![0, 2], [true, false, true]),
    ] {
        let (_, expect) = naive(&data, &dims, &mask, false, &|g| g.iter().sum());
        let got = values(&x.sum(&list, false).unwrap());
        for (g, e) in got.iter().zip(&expect) {
            assert!((g - e).abs() < 1e-3, "sum over {list:?}: {g} vs {e}");
        }
        let (_, expect) = naive(&data, &dims, &mask, false, &|g| first_arg(g, true));
        assert_eq!(values(&x.argmax(&list, false).unwrap()), expect, "argmax over {list:?}");
        let (_, expect) = naive(&data, &dims, &mask, false, &|g| {
            let m = g.iter().sum::<f64>() / g.len() as f64;
            g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() - 1) as f64
        });
        for (g, e) in values(&x.var(&list, false).unwrap()).iter().zip(&expect) {
            assert!((g - e).abs() < 1e-4 * (1.0 + e), "var over {list:?}: {g} vs {e}");
        }
    }
    let soft = x.softmax(1).unwrap().sum(&[1], false).unwrap();
    assert!(values(&soft).iter().all(|s| (s - 1.0).abs() < 1e-5));
    let soft = x.to_dtype(DType::BF16).unwrap().softmax(-1).unwrap().sum(&[-1], false).unwrap();
    assert!(values(&soft).iter().all(|s| (s - 1.0).abs() < 0.05));
}

#[test]
fn large_broadcast_reductions_match_their_contiguous_copies() {
    // Big enough for the parallel row and column paths; broadcast dims in
    // every position, alone and together.
    let full = [64, 300, 40];
    for base in [[1, 300, 40], [64, 1, 40], [64, 300, 1], [1, 300, 1], [1, 1, 1]] {
        let x = Tensor::randn_on(base, DType::F32, CPU).unwrap().expand(full).unwrap();
        let copy = x.contiguous().unwrap();
        let data = values(&copy);
        for (list, mask) in [
            (vec![0], [true, false, false]),
            (vec![1], [false, true, false]),
            (vec![2], [false, false, true]),
            (vec![0, 2], [true, false, true]),
            (vec![], [true, true, true]),
        ] {
            let what = format!("{base:?} expanded, over {list:?}");
            // Float sums differ by their roundings: a few f32 ulps of the sum of magnitudes.
            let (_, magnitude) = naive(&data, &full, &mask, false, &|g| g.iter().map(|v| v.abs()).sum());
            let close = |got: &Tensor, want: &Tensor, scale: &dyn Fn(f64) -> f64| {
                for ((g, w), m) in values(got).iter().zip(values(want)).zip(&magnitude) {
                    assert!((g - w).abs() <= 1e-5 * scale(*m) + 1e-6, "{what}: {g} vs {w}");
                }
            };
            let count = (full.iter().product::<usize>() / magnitude.len()) as f64;
            close(&x.sum(&list, false).unwrap(), &copy.sum(&list, false).unwrap(), &|m| m);
            close(&x.mean(&list, false).unwrap(), &copy.mean(&list, false).unwrap(), &|m| m / count);
            close(&x.var(&list, false).unwrap(), &copy.var(&list, false).unwrap(), &|m| m * m / count);
            assert_eq!(values(&x.max(&list, false).unwrap()), values(&copy.max(&list, false).unwrap()), "{what}");
            assert_eq!(values(&x.min(&list, false).unwrap()), values(&copy.min(&list, false).unwrap()), "{what}");
            assert_eq!(values(&x.argmax(&list, true).unwrap()), values(&copy.argmax(&list, true).unwrap()), "{what}");
            assert_eq!(values(&x.argmin(&list, false).unwrap()), values(&copy.argmin(&list, false).unwrap()), "{what}");
        }
    }
}

#[test]
fn errors_name_the_op_and_the_problem() {
    let x = Tensor::zeros_on([2, 3], DType::F32, CPU).unwrap();
    let error = x.sum(&[2], false).unwrap_err();
    assert!(
        matches!(error, TensorError::Layout(LayoutError::DimOutOfRange { op: "sum", dim: 2, rank: 2 })),
        "{error:?}"
    );
    let error = x.sum(&[0, -2], false).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "sum", .. }), "{error:?}");
    assert!(error.to_string().contains("appears more than once"), "{error}");
    let ints = Tensor::zeros_on([2], DType::U8, CPU).unwrap();
    for (error, name) in [
        (ints.mean_all().unwrap_err(), "mean"),
        (ints.softmax(0).unwrap_err(), "softmax"),
        (ints.log_softmax(1).unwrap_err(), "log_softmax"),
    ] {
        assert!(
            matches!(&error, TensorError::UnsupportedDType { op, dtype: DType::U8, .. } if *op == name),
            "{error:?}"
        );
    }
    let empty = Tensor::zeros_on([0, 3], DType::F32, CPU).unwrap();
    let error = empty.argmax(&[], false).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "argmax", .. }), "{error:?}");
    assert!(error.to_string().contains("dim 0 of size 0"), "{error}");
    let scalar = Tensor::scalar_on(2.5f64, CPU).unwrap();
    assert_eq!(scalar.sum(&[0], true).unwrap().item::<f64>().unwrap(), 2.5);
    assert_eq!(scalar.var_with_correction(&[], 0, false).unwrap().item::<f64>().unwrap(), 0.0);
    assert!(scalar.var(&[], false).unwrap().item::<f64>().unwrap().is_nan());
}
