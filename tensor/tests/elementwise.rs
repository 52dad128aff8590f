//! Elementwise ops against naive references: unary functions, binary
//! arithmetic with broadcasting and promotion, comparisons, `where_cond`, and
//! in-place arithmetic, on random shapes (zero-size dims included), random
//! layouts (transposed, permuted, narrowed, expanded) and every dtype; the
//! error messages; and the promise that in-place ops allocate nothing.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};
use proptest::prelude::*;
use std::sync::Once;

const CPU: Device = Device::CPU;
/// Used by the device-mismatch tests.
const OTHER: Device = Device::cpu(1);
/// Used only by the allocation test, so other tests do not disturb its counters.
const QUIET: Device = Device::cpu(2);

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| set_host_device_count(3).expect("host device count is set before any tensor"));
}

// ----- helpers -------------------------------------------------------------------

/// The elements as f64 (exact for every value these tests use).
fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// How a test operand is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum View {
    Contiguous,
    /// Last two dims stored swapped.
    Transposed,
    /// All dims stored in reverse order.
    Permuted,
    /// A window of a wider buffer (non-zero offset, padded rows).
    Narrowed,
}

fn any_view() -> impl Strategy<Value = View> {
    prop_oneof![Just(View::Contiguous), Just(View::Transposed), Just(View::Permuted), Just(View::Narrowed)]
}

/// Padding value around narrowed views, checked to survive in-place ops.
const PAD: f64 = 99.0;

/// A tensor with these row-major `data` and `shape` in `dtype`, laid out as
/// `view`; for a narrowed view also the padded buffer it is a window of.
fn make(data: &[f64], shape: &[usize], dtype: DType, view: View) -> (Tensor, Option<Tensor>) {
    let t = Tensor::from_slice_on(data, shape, CPU).unwrap().to_dtype(dtype).unwrap();
    let rank = shape.len();
    match view {
        View::Transposed if rank >= 2 => {
            let base = t.transpose(-1, -2).unwrap().contiguous().unwrap();
            (base.transpose(-1, -2).unwrap(), None)
        }
        View::Permuted if rank >= 2 => {
            let order: Vec<usize> = (0..rank).rev().collect();
            let base = t.permute(&order).unwrap().contiguous().unwrap();
            (base.permute(&order).unwrap(), None)
        }
        View::Narrowed if rank >= 1 => {
            let mut padded = shape.to_vec();
            padded[rank - 1] += 2;
            let base = Tensor::full_on(padded, PAD, dtype, CPU).unwrap();
            let window = base.narrow(-1, 1, shape[rank - 1]).unwrap();
            window.copy_(&t).unwrap();
            (window, Some(base))
        }
        _ => (t, None),
    }
}

/// Whether the padding around a narrowed view is untouched.
fn padding_intact(base: Option<&Tensor>) -> bool {
    let Some(base) = base else { return true };
    let last = base.dims()[base.rank() - 1];
    let left = values(&base.narrow(-1, 0, 1).unwrap());
    let right = values(&base.narrow(-1, last - 1, 1).unwrap());
    left.iter().chain(&right).all(|&v| v == PAD)
}

/// Deterministic test values for `dtype`, exactly representable in every
/// dtype they may be promoted to: eighths in [-4, 4] for floats, [-50, 50]
/// for i64, [0, 255] for u8, 0/1 for bool.
fn random_values(n: usize, dtype: DType, seed: u64) -> Vec<f64> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let r = state >> 11;
            match dtype {
                DType::Bool => (r % 2) as f64,
                DType::U8 => (r % 256) as f64,
                DType::I64 => (r % 101) as f64 - 50.0,
                _ => ((r % 65) as f64 - 32.0) / 8.0,
            }
        })
        .collect()
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        index[d] = i % shape[d];
        i /= shape[d];
    }
    index
}

/// The row-major position in an operand of `shape` of output element
/// `index` under NumPy broadcasting.
fn broadcast_position(index: &[usize], shape: &[usize]) -> usize {
    let lead = index.len() - shape.len();
    shape.iter().enumerate().fold(0, |pos, (d, &size)| pos * size + if size == 1 { 0 } else { index[lead + d] })
}

/// NumPy's broadcast shape, written out independently.
fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], d: usize| if d + s.len() >= rank { s[d + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|d| match (at(a, d), at(b, d)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// A shape and two shapes that broadcast to it (leading dims dropped, some
/// dims set to 1); dims of 0 appear now and then.
fn broadcast_shapes_strategy(max_rank: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
    let dim = prop_oneof![1 => Just(0usize), 8 => 1usize..=4];
    (prop::collection::vec(dim, 0..=max_rank), 0usize..=4, 0usize..=4, any::<u16>(), any::<u16>()).prop_map(
        |(out, drop_a, drop_b, ones_a, ones_b)| {
            let derive = |drop: usize, ones: u16| -> Vec<usize> {
                let kept = &out[drop.min(out.len())..];
                kept.iter()
                    .enumerate()
                    .map(|(d, &s)| if ones >> (d % 16) & 1 == 1 && d % 3 == 0 { 1 } else { s })
                    .collect()
            };
            let a = derive(drop_a, ones_a);
            let b = derive(drop_b, ones_b.rotate_left(5));
            (out, a, b)
        },
    )
}

fn any_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn float_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16])
}

/// PyTorch's result dtype, written out independently of the crate.
fn expected_dtype(a: DType, a_rank: usize, b: DType, b_rank: usize) -> DType {
    let category = |d: DType| {
        if d.is_float() {
            2
        } else if d.is_bool() {
            0
        } else {
            1
        }
    };
    match (a_rank == 0, b_rank == 0) {
        (true, false) if category(a) <= category(b) => b,
        (false, true) if category(b) <= category(a) => a,
        (true, false) => a,
        (false, true) => b,
        _ => DType::promote(a, b),
    }
}

/// Equal, with NaN equal to NaN.
fn same(x: f64, y: f64) -> bool {
    x == y || (x.is_nan() && y.is_nan())
}

/// Builds the expected tensor from reference values computed in f64 (float
/// dtypes) or i64 (integer and bool dtypes, wrapping like the crate).
fn expected_tensor(shape: &[usize], dtype: DType, float: Vec<f64>, int: Vec<i64>) -> Vec<f64> {
    let t = if dtype.is_float() {
        Tensor::from_vec_on(float, shape, CPU).unwrap()
    } else {
        Tensor::from_vec_on(int, shape, CPU).unwrap()
    };
    values(&t.to_dtype(dtype).unwrap())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

fn apply(op: Arith, a: &Tensor, b: &Tensor) -> brasa_tensor::Result<Tensor> {
    match op {
        Arith::Add => a + b,
        Arith::Sub => a - b,
        Arith::Mul => a * b,
        Arith::Div => a / b,
        Arith::Maximum => a.maximum(b),
        Arith::Minimum => a.minimum(b),
    }
}

fn reference_float(op: Arith, x: f64, y: f64) -> f64 {
    match op {
        Arith::Add => x + y,
        Arith::Sub => x - y,
        Arith::Mul => x * y,
        Arith::Div => x / y,
        Arith::Maximum if x.is_nan() || y.is_nan() => f64::NAN,
        Arith::Minimum if x.is_nan() || y.is_nan() => f64::NAN,
        Arith::Maximum => x.max(y),
        Arith::Minimum => x.min(y),
    }
}

fn reference_int(op: Arith, dtype: DType, x: i64, y: i64) -> i64 {
    if dtype.is_bool() {
        let (p, q) = (x != 0, y != 0);
        return i64::from(match op {
            Arith::Add | Arith::Maximum => p || q,
            _ => p && q,
        });
    }
    match op {
        Arith::Add => x.wrapping_add(y),
        Arith::Sub => x.wrapping_sub(y),
        Arith::Mul => x.wrapping_mul(y),
        Arith::Maximum => x.max(y),
        Arith::Minimum => x.min(y),
        Arith::Div => unreachable!("true division is float"),
    }
}

// ----- high-precision GELU reference ----------------------------------------------

/// erf(x) for |x| < 3 by `2/√π e^(-x²) Σ 2^n x^(2n+1) / (2n+1)!!` (all terms
/// positive, so accurate to a few ulp).
fn erf_series(x: f64) -> f64 {
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-18 * sum.abs() {
        term *= 2.0 * x * x / (2.0 * n + 3.0);
        sum += term;
        n += 1.0;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp()
}

/// erfc(x) for x >= 1 by its continued fraction (Lentz).
fn erfc_continued_fraction(x: f64) -> f64 {
    let (mut f, mut c, mut d) = (x, x, 0.0);
    for k in 1..5000 {
        let a = k as f64 / 2.0;
        d = 1.0 / (x + a * d);
        c = x + a / c;
        f *= c * d;
        if (c * d - 1.0).abs() < 1e-17 {
            break;
        }
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / f
}

/// `x Φ(x)` to ~1e-13 relative, in the far tails too.
fn gelu_reference(x: f64) -> f64 {
    let z = -x / std::f64::consts::SQRT_2;
    // The continued fraction from z = 1 on: there 1 - erf(z) would cancel.
    let erfc = if z >= 1.0 {
        erfc_continued_fraction(z)
    } else if z <= -2.5 {
        2.0 - erfc_continued_fraction(-z)
    } else {
        1.0 - erf_series(z)
    };
    0.5 * x * erfc
}

// ----- unary -------------------------------------------------------------------------

type UnaryFn = fn(&Tensor) -> brasa_tensor::Result<Tensor>;

/// A unary op, its reference, whether it needs positive input, and whether
/// its rounding error scales with |x| too (cancellation inside the formula).
struct UnaryCase(&'static str, UnaryFn, fn(f64) -> f64, bool, bool);

fn unary_cases() -> Vec<UnaryCase> {
    vec![
        UnaryCase("neg", |t| t.neg(), |x| -x, false, false),
        UnaryCase("abs", |t| t.abs(), f64::abs, false, false),
        UnaryCase("exp", |t| t.exp(), f64::exp, false, false),
        UnaryCase("log", |t| t.log(), f64::ln, true, false),
        UnaryCase("sqrt", |t| t.sqrt(), f64::sqrt, true, false),
        UnaryCase("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), true, false),
        UnaryCase("sin", |t| t.sin(), f64::sin, false, true),
        UnaryCase("cos", |t| t.cos(), f64::cos, false, true),
        UnaryCase("tanh", |t| t.tanh(), f64::tanh, false, false),
        UnaryCase("sigmoid", |t| t.sigmoid(), |x| 1.0 / (1.0 + (-x).exp()), false, false),
        UnaryCase("relu", |t| t.relu(), |x| x.max(0.0), false, false),
        UnaryCase("gelu", |t| t.gelu(), gelu_reference, false, false),
        UnaryCase(
            "gelu_tanh",
            |t| t.gelu_tanh(),
            |x| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
            false,
            true,
        ),
        UnaryCase("silu", |t| t.silu(), |x| x / (1.0 + (-x).exp()), false, false),
        UnaryCase("powf(2.5)", |t| t.powf(2.5), |x| x.powf(2.5), true, false),
        UnaryCase("powf(2)", |t| t.powf(2.0), |x| x * x, false, false),
        UnaryCase("clamp", |t| t.clamp(Some(-1.25), Some(2.0)), |x| x.clamp(-1.25, 2.0), false, false),
        UnaryCase("affine", |t| t.affine(-1.5, 0.25), |x| x * -1.5 + 0.25, false, true),
        UnaryCase("add_scalar", |t| t.add_scalar(0.375), |x| x + 0.375, false, false),
        UnaryCase("mul_scalar", |t| t.mul_scalar(3.0), |x| x * 3.0, false, false),
        UnaryCase("div_scalar", |t| t.div_scalar(3.0), |x| x / 3.0, false, false),
    ]
}

/// Relative tolerance and absolute floor for results rounded to `dtype`.
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-300),
        DType::F32 => (2e-6, 1e-30),
        DType::F16 => (1.5e-3, 1e-7),
        _ => (1e-2, 1e-30),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn unary_ops_match_references(
        (shape, _, _) in broadcast_shapes_strategy(3),
        dtype in float_dtype(),
        view in any_view(),
        seed in any::<u64>(),
    ) {
        setup();
        for UnaryCase(name, op, reference, positive, scales_with_x) in unary_cases() {
            let data: Vec<f64> = random_values(numel(&shape), dtype, seed)
                .into_iter()
                .map(|x| if positive { x.abs() + 0.125 } else { x })
                .collect();
            let (x, _) = make(&data, &shape, dtype, view);
            let out = op(&x).unwrap();
            prop_assert_eq!(out.dims(), &shape[..], "{}", name);
            prop_assert_eq!(out.dtype(), dtype, "{}", name);
            prop_assert!(out.is_contiguous());
            let (rel, abs) = tolerance(dtype);
            for (&x, got) in data.iter().zip(values(&out)) {
                let want = reference(x);
                let scale = want.abs() + if scales_with_x { x.abs() } else { 0.0 };
                prop_assert!((got - want).abs() <= rel * scale + abs, "{} {:?}({}) = {} vs {}", name, dtype, x, got, want);
            }
        }
    }

    #[test]
    fn binary_ops_broadcast_promote_and_match_references(
        (_, shape_a, shape_b) in broadcast_shapes_strategy(4),
        dtype_a in any_dtype(),
        dtype_b in any_dtype(),
        view_a in any_view(),
        view_b in any_view(),
        seed in any::<u64>(),
    ) {
        setup();
        let a_data = random_values(numel(&shape_a), dtype_a, seed);
        let b_data = random_values(numel(&shape_b), dtype_b, seed.rotate_left(17) ^ 0x9e37);
        let (a, _) = make(&a_data, &shape_a, dtype_a, view_a);
        let (b, _) = make(&b_data, &shape_b, dtype_b, view_b);
        let shape = broadcast_shape(&shape_a, &shape_b).unwrap();
        for op in [Arith::Add, Arith::Sub, Arith::Mul, Arith::Div, Arith::Maximum, Arith::Minimum] {
            let mut dtype = expected_dtype(dtype_a, shape_a.len(), dtype_b, shape_b.len());
            if op == Arith::Div && !dtype.is_float() {
                dtype = DType::F32;
            }
            if op == Arith::Sub && dtype == DType::Bool {
                let err = apply(op, &a, &b).unwrap_err().to_string();
                prop_assert!(err.starts_with("sub: subtracting bool tensors"), "{}", err);
                continue;
            }
            let out = apply(op, &a, &b).unwrap();
            prop_assert_eq!(out.dims(), &shape[..], "{:?}", op);
            prop_assert_eq!(out.dtype(), dtype, "{:?} of {} and {}", op, dtype_a, dtype_b);
            // The operands in the compute dtype, element by element.
            let (ca, cb) = (values(&a.to_dtype(dtype).unwrap()), values(&b.to_dtype(dtype).unwrap()));
            let pairs: Vec<(f64, f64)> = (0..numel(&shape))
                .map(|i| {
                    let index = unravel(i, &shape);
                    (ca[broadcast_position(&index, &shape_a)], cb[broadcast_position(&index, &shape_b)])
                })
                .collect();
            let float: Vec<f64> = pairs.iter().map(|&(x, y)| reference_float(op, x, y)).collect();
            let int: Vec<i64> = if dtype.is_float() {
                Vec::new()
            } else {
                pairs.iter().map(|&(x, y)| reference_int(op, dtype, x as i64, y as i64)).collect()
            };
            let want = expected_tensor(&shape, dtype, float, int);
            let got = values(&out);
            for i in 0..want.len() {
                prop_assert!(same(got[i], want[i]), "{:?} {} {:?}: at {} got {} want {}", op, dtype, pairs[i], i, got[i], want[i]);
            }
        }
    }

    #[test]
    fn comparisons_and_where_match_references(
        (_, shape_a, shape_b) in broadcast_shapes_strategy(3),
        dtype_a in any_dtype(),
        dtype_b in any_dtype(),
        view_a in any_view(),
        view_b in any_view(),
        seed in any::<u64>(),
        scalar_eighths in -40i32..40,
    ) {
        setup();
        let a_data = random_values(numel(&shape_a), dtype_a, seed);
        let b_data = random_values(numel(&shape_b), dtype_b, !seed);
        let (a, _) = make(&a_data, &shape_a, dtype_a, view_a);
        let (b, _) = make(&b_data, &shape_b, dtype_b, view_b);
        let shape = broadcast_shape(&shape_a, &shape_b).unwrap();
        type Cmp = fn(&Tensor, &Tensor) -> brasa_tensor::Result<Tensor>;
        type CmpScalar = fn(&Tensor, f64) -> brasa_tensor::Result<Tensor>;
        type Predicate = fn(f64, f64) -> bool;
        let cases: [(Cmp, CmpScalar, Predicate); 6] = [
            (|a, b| a.eq(b), |a, s| a.eq_scalar(s), |x, y| x == y),
            (|a, b| a.ne(b), |a, s| a.ne_scalar(s), |x, y| x != y),
            (|a, b| a.lt(b), |a, s| a.lt_scalar(s), |x, y| x < y),
            (|a, b| a.le(b), |a, s| a.le_scalar(s), |x, y| x <= y),
            (|a, b| a.gt(b), |a, s| a.gt_scalar(s), |x, y| x > y),
            (|a, b| a.ge(b), |a, s| a.ge_scalar(s), |x, y| x >= y),
        ];
        // Compared in the promoted dtype (a 0-d i64 meeting a u8 tensor wraps
        // to u8, as in PyTorch); the converted values are exact in f64.
        let dtype = expected_dtype(dtype_a, shape_a.len(), dtype_b, shape_b.len());
        let (ca, cb) = (values(&a.to_dtype(dtype).unwrap()), values(&b.to_dtype(dtype).unwrap()));
        let scalar = scalar_eighths as f64 / 8.0;
        for (op, op_scalar, reference) in cases {
            let out = op(&a, &b).unwrap();
            prop_assert_eq!(out.dtype(), DType::Bool);
            prop_assert_eq!(out.dims(), &shape[..]);
            let got = out.to_vec::<bool>().unwrap();
            for (i, &g) in got.iter().enumerate() {
                let index = unravel(i, &shape);
                let (x, y) = (ca[broadcast_position(&index, &shape_a)], cb[broadcast_position(&index, &shape_b)]);
                prop_assert_eq!(g, reference(x, y), "{} vs {} in {}", x, y, dtype);
            }
            // Against a scalar the comparison is exact whatever the dtype.
            let got = op_scalar(&a, scalar).unwrap().to_vec::<bool>().unwrap();
            let want: Vec<bool> = values(&a).iter().map(|&x| reference(x, scalar)).collect();
            prop_assert_eq!(got, want);
        }
        // where_cond: the condition broadcasts with both values.
        let cond = a.gt(&b).unwrap();
        let cond_shape = shape.clone();
        let out = cond.where_cond(&a, &b).unwrap();
        prop_assert_eq!(out.dtype(), dtype);
        let (va, vb) = (ca, cb);
        let picked = values(&out);
        let c = cond.to_vec::<bool>().unwrap();
        for (i, &p) in picked.iter().enumerate() {
            let index = unravel(i, &cond_shape);
            let x = va[broadcast_position(&index, &shape_a)];
            let y = vb[broadcast_position(&index, &shape_b)];
            let want = if c[i] { x } else { y };
            prop_assert!(same(p, want), "{} vs {}", p, want);
        }
    }

    #[test]
    fn in_place_ops_match_out_of_place_references(
        (shape, _, rhs_shape) in broadcast_shapes_strategy(3),
        dtype in float_dtype(),
        rhs_dtype in float_dtype(),
        view in any_view(),
        rhs_view in any_view(),
        seed in any::<u64>(),
    ) {
        setup();
        let data = random_values(numel(&shape), dtype, seed);
        let rhs_data: Vec<f64> =
            random_values(numel(&rhs_shape), rhs_dtype, seed ^ 0x5555).into_iter().map(|v| if v == 0.0 { 0.5 } else { v }).collect();
        let (rhs, _) = make(&rhs_data, &rhs_shape, rhs_dtype, rhs_view);
        // rhs in the destination's dtype, broadcast to its shape, as the ops see it.
        let r: Vec<f64> = {
            let converted = values(&rhs.to_dtype(dtype).unwrap());
            (0..numel(&shape)).map(|i| converted[broadcast_position(&unravel(i, &shape), &rhs_shape)]).collect()
        };
        type InPlace = fn(&Tensor, &Tensor) -> brasa_tensor::Result<()>;
        type Reference = fn(f64, f64) -> f64;
        let cases: [(&str, InPlace, Reference); 10] = [
            ("add_", |x, r| x.add_(r), |d, r| d + r),
            ("sub_", |x, r| x.sub_(r), |d, r| d - r),
            ("mul_", |x, r| x.mul_(r), |d, r| d * r),
            ("div_", |x, r| x.div_(r), |d, r| d / r),
            ("add_scaled_", |x, r| x.add_scaled_(-0.5, r), |d, r| d - 0.5 * r),
            ("addcmul_", |x, r| x.addcmul_(0.25, r, r), |d, r| d + 0.25 * r * r),
            ("addcdiv_", |x, r| x.addcdiv_(2.0, r, &r.abs()?.add_scalar(1.0)?), |d, r| d + 2.0 * r / (r.abs() + 1.0)),
            ("lerp_", |x, r| x.lerp_(r, 0.25), |d, r| d + 0.25 * (r - d)),
            ("add_scalar_", |x, _| x.add_scalar_(1.5), |d, _| d + 1.5),
            ("clamp_", |x, _| x.clamp_(Some(-1.0), Some(0.5)), |d, _| d.clamp(-1.0, 0.5)),
        ];
        let (rel, abs) = tolerance(dtype);
        for (name, op, reference) in cases {
            let (x, base) = make(&data, &shape, dtype, view);
            let version = x.version();
            op(&x, &rhs).unwrap();
            prop_assert_eq!(x.version(), version + 1, "{}", name);
            prop_assert!(padding_intact(base.as_ref()), "{} wrote outside its view", name);
            let got = values(&x);
            for i in 0..got.len() {
                let want = reference(data[i], r[i]);
                // One rounding to the dtype per intermediate result.
                let scale = want.abs() + data[i].abs() + r[i].abs();
                prop_assert!((got[i] - want).abs() <= rel * scale + abs, "{} {:?}: {} vs {}", name, dtype, got[i], want);
            }
        }
    }
}

// ----- fixed cases -------------------------------------------------------------------

#[test]
fn gelu_is_accurate_against_a_high_precision_reference() {
    setup();
    let xs: Vec<f64> = (-1000..=1000).map(|i| i as f64 / 100.0).collect();
    let x32 = Tensor::from_vec_on(xs.iter().map(|&x| x as f32).collect::<Vec<_>>(), [xs.len()], CPU).unwrap();
    let x64 = Tensor::from_slice_on(&xs, [xs.len()], CPU).unwrap();
    let (g32, g64) = (x32.gelu().unwrap().to_vec::<f32>().unwrap(), x64.gelu().unwrap().to_vec::<f64>().unwrap());
    for (i, &x) in xs.iter().enumerate() {
        let want32 = gelu_reference(f64::from(x as f32));
        let err32 = (f64::from(g32[i]) - want32).abs();
        assert!(err32 <= 1e-6 * want32.abs() + 1e-40, "f32 gelu({x}) = {} vs {want32:e}", g32[i]);
        let want = gelu_reference(x);
        // Rounding x/√2 costs up to ~x² ulp in the far tail.
        assert!(
            (g64[i] - want).abs() <= (1e-13 + x * x * 4e-16) * want.abs() + 1e-300,
            "f64 gelu({x}) = {} vs {want:e}",
            g64[i]
        );
    }
    // The tail keeps its relative accuracy where 1 + erf would cancel to 0.
    assert!(g32[0] < 0.0 && g32[0] > -1e-22, "gelu(-10) = {}", g32[0]);
}

#[test]
fn broadcasting_shapes_scalars_and_views() {
    setup();
    let a = Tensor::arange_on(0.0, 6.0, 1.0, DType::F32, CPU).unwrap().reshape(&[2, 1, 3]).unwrap();
    let b = Tensor::from_vec_on(vec![10.0f32, 20.0, 30.0, 40.0], [4, 1], CPU).unwrap();
    let c = (&a + &b).unwrap();
    assert_eq!(c.dims(), [2, 4, 3]);
    let got = c.to_vec::<f32>().unwrap();
    assert_eq!(got[..6], [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
    assert_eq!(got[12..15], [13.0, 14.0, 15.0]);
    // A zero-dimensional tensor broadcasts everywhere.
    let s = Tensor::scalar_on(0.5f32, CPU).unwrap();
    assert_eq!((&s * &a).unwrap().dims(), [2, 1, 3]);
    assert_eq!((&s + &s).unwrap().dims(), [0usize; 0]);
    assert_eq!((&s + &s).unwrap().item::<f32>().unwrap(), 1.0);
    // Expanded and transposed operands read through their strides.
    let row = Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0], [1, 3], CPU).unwrap().expand([2, 3]).unwrap();
    let m = Tensor::arange_on(0.0, 6.0, 1.0, DType::F32, CPU).unwrap().reshape(&[3, 2]).unwrap().t().unwrap();
    assert_eq!((&row * &m).unwrap().to_vec::<f32>().unwrap(), [0.0, 4.0, 12.0, 1.0, 6.0, 15.0]);
    // Zero-size dims broadcast to zero-size results.
    let e = Tensor::zeros_on([0, 3], DType::F32, CPU).unwrap();
    let out = (&e + &row.narrow(0, 0, 1).unwrap()).unwrap();
    assert_eq!(out.dims(), [0, 3]);
    assert!(out.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn promotion_follows_pytorch() {
    setup();
    let i = Tensor::from_vec_on(vec![1i64, 2], [2], CPU).unwrap();
    let f = Tensor::from_vec_on(vec![0.5f32, 0.25], [2], CPU).unwrap();
    assert_eq!((&i + &f).unwrap().dtype(), DType::F32);
    let h = Tensor::ones_on([2], DType::F16, CPU).unwrap();
    let bh = Tensor::ones_on([2], DType::BF16, CPU).unwrap();
    assert_eq!((&h + &bh).unwrap().dtype(), DType::F32);
    let flag = Tensor::from_vec_on(vec![true, false], [2], CPU).unwrap();
    let u = Tensor::from_vec_on(vec![7u8, 255], [2], CPU).unwrap();
    let sum = (&flag + &u).unwrap();
    assert_eq!(sum.dtype(), DType::U8);
    assert_eq!(sum.to_vec::<u8>().unwrap(), [8, 255]);
    assert_eq!((&u + &u).unwrap().to_vec::<u8>().unwrap(), [14, 254], "u8 wraps");
    // Zero-dimensional operands do not widen their category...
    let f64_scalar = Tensor::scalar_on(2.0f64, CPU).unwrap();
    assert_eq!((&h * &f64_scalar).unwrap().dtype(), DType::F16);
    assert_eq!((&f * &f64_scalar).unwrap().dtype(), DType::F32);
    // ...but lift a lower category to theirs.
    assert_eq!((&i * &f64_scalar).unwrap().dtype(), DType::F64);
    assert_eq!((&i / &i).unwrap().dtype(), DType::F32, "true division");
    assert_eq!(i.exp().unwrap().dtype(), DType::F32, "float functions promote integers");
    assert_eq!((&i * 2.0).unwrap().dtype(), DType::I64, "an integral scalar keeps integers");
    assert_eq!((&i * 2.5).unwrap().dtype(), DType::F32);
    assert_eq!((&h * 1e6).unwrap().dtype(), DType::F16, "a scalar does not widen a float tensor");
}

#[test]
fn pow_and_operators() {
    setup();
    let x = Tensor::from_vec_on(vec![2.0f32, 3.0, 0.5], [3], CPU).unwrap();
    let e = Tensor::from_vec_on(vec![3.0f32, 0.5, -1.0], [3], CPU).unwrap();
    let p = x.pow(&e).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(p[0], 8.0);
    assert!((p[1] - 3.0f32.sqrt()).abs() < 1e-6 && p[2] == 2.0);
    let i = Tensor::from_vec_on(vec![2i64, -3, 5], [3], CPU).unwrap();
    let k = Tensor::from_vec_on(vec![10i64, 3, -1], [3], CPU).unwrap();
    assert_eq!(i.pow(&k).unwrap().to_vec::<i64>().unwrap(), [1024, -27, 0]);
    let y = ((&x + &x).unwrap() * &x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [8.0, 18.0, 0.5]);
    assert_eq!((-&x).unwrap().to_vec::<f32>().unwrap(), [-2.0, -3.0, -0.5]);
    assert_eq!((x.clone() - 1.0).unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0, -0.5]);
    assert_eq!((1.0 - &x).unwrap().to_vec::<f32>().unwrap(), [-1.0, -2.0, 0.5]);
    assert_eq!((6.0 / &x).unwrap().to_vec::<f32>().unwrap(), [3.0, 2.0, 12.0]);
    assert_eq!((&x / 2.0).unwrap().to_vec::<f32>().unwrap(), [1.0, 1.5, 0.25]);
}

#[test]
fn large_tensors_take_the_parallel_paths_correctly() {
    setup();
    // Above the parallel thresholds (2^18 elements for cheap ops); rows of
    // 333 split across chunk boundaries mid-row.
    let (rows, cols) = (1000, 333);
    let x = Tensor::arange_on(0.0, (rows * cols) as f64, 1.0, DType::F32, CPU)
        .unwrap()
        .reshape(&[rows as isize, cols as isize])
        .unwrap();
    let bias = Tensor::arange_on(0.0, cols as f64, 1.0, DType::F32, CPU).unwrap();
    let got = (&x + &bias).unwrap().to_vec::<f32>().unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == (i + i % cols) as f32));
    // A transposed operand and an expensive op.
    let t = x.t().unwrap();
    let e = t.mul_scalar(1e-5).unwrap().exp().unwrap().to_vec::<f32>().unwrap();
    for (i, &v) in e.iter().enumerate().step_by(997) {
        let (r, c) = (i / rows, i % rows);
        let want = ((c * cols + r) as f32 * 1e-5).exp();
        assert!((v - want).abs() <= 2e-7 * want, "{v} vs {want}");
    }
    // In place: contiguous (parallel) and narrowed (strided walk).
    let acc = Tensor::zeros_on([rows, cols], DType::F32, CPU).unwrap();
    acc.add_(&x).unwrap();
    acc.add_scaled_(-1.0, &bias).unwrap();
    let got = acc.to_vec::<f32>().unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == (i - i % cols) as f32));
    let window = acc.narrow(1, 1, cols - 2).unwrap();
    window.mul_scalar_(0.0).unwrap();
    let got = acc.to_vec::<f32>().unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &v)| v == if i % cols == 0 || i % cols == cols - 1 { (i - i % cols) as f32 } else { 0.0 }));
    // where_cond over a big broadcast condition.
    let cond = bias.gt_scalar(100.0).unwrap();
    let picked = cond.where_cond(&x, &Tensor::scalar_on(-1.0f32, CPU).unwrap()).unwrap().to_vec::<f32>().unwrap();
    assert!(picked.iter().enumerate().all(|(i, &v)| v == if i % cols > 100 { i as f32 } else { -1.0 }));
}

#[test]
fn errors_name_the_op_and_what_was_wrong() {
    setup();
    let a = Tensor::zeros_on([2, 3], DType::F32, CPU).unwrap();
    let b = Tensor::zeros_on([4], DType::F32, CPU).unwrap();
    assert_eq!(
        a.add(&b).unwrap_err().to_string(),
        "add: cannot broadcast shapes [2, 3] and [4] together: at dim -1 the sizes are 3 and 4 (they must match or one must be 1)"
    );
    assert!(a
        .mul_(&b)
        .unwrap_err()
        .to_string()
        .starts_with("mul_: operand of shape [4] cannot be broadcast to the destination's shape [2, 3]"));
    let elsewhere = Tensor::zeros_on([2, 3], DType::F32, OTHER).unwrap();
    assert_eq!(
        a.add(&elsewhere).unwrap_err().to_string(),
        "add: operands are on different devices, cpu:0 and cpu:1; move one with .to(&device)"
    );
    assert_eq!(
        a.add_(&elsewhere).unwrap_err().to_string(),
        "add_: operands are on different devices, cpu:0 and cpu:1; move one with .to(&device)"
    );
    assert!(a.bool_cond_where(&elsewhere).starts_with("where_cond: operands are on different devices"));
    let i = Tensor::zeros_on([2], DType::I64, CPU).unwrap();
    assert_eq!(
        i.silu().unwrap_err().to_string(),
        "silu: needs a floating-point tensor, got i64; convert it with to_dtype first"
    );
    assert_eq!(
        a.where_cond(&a, &a).unwrap_err().to_string(),
        "where_cond: the condition must be a bool tensor, got f32; compare it (e.g. ne_scalar(0.0)) first"
    );
    assert_eq!(
        i.add_(&a).unwrap_err().to_string(),
        "add_: the result has dtype f32, which cannot be stored in place in a tensor of dtype i64"
    );
    assert!(a.clamp(None, None).unwrap_err().to_string().starts_with("clamp: at least one of min and max"));
    let flags = Tensor::zeros_on([2], DType::Bool, CPU).unwrap();
    assert!((&flags - &flags).unwrap_err().to_string().starts_with("sub: subtracting bool tensors"));
    assert!(flags.pow(&flags).unwrap_err().to_string().starts_with("pow: is not supported for bool"));
    assert!(a
        .expand([4, 2, 3])
        .unwrap()
        .add_scalar_(1.0)
        .unwrap_err()
        .to_string()
        .starts_with("add_scalar_: unsupported operation: more than one element of the written-to tensor"));
}

trait WhereOnDevices {
    fn bool_cond_where(&self, other: &Tensor) -> String;
}

impl WhereOnDevices for Tensor {
    /// `where_cond` with the condition here and the values on `other`'s device.
    fn bool_cond_where(&self, other: &Tensor) -> String {
        let cond = self.gt_scalar(0.0).unwrap();
        cond.where_cond(self, other).unwrap_err().to_string()
    }
}

#[test]
fn in_place_ops_allocate_nothing() {
    setup();
    for n in [16usize, 1 << 19] {
        let p = Tensor::ones_on([n], DType::F32, QUIET).unwrap();
        let g = Tensor::full_on([n], 0.5, DType::F32, QUIET).unwrap();
        let m = Tensor::zeros_on([n], DType::F32, QUIET).unwrap();
        let v = Tensor::ones_on([n], DType::F32, QUIET).unwrap();
        let row = Tensor::ones_on([4, n / 4], DType::F32, QUIET).unwrap();
        let bias = Tensor::ones_on([n / 4], DType::F32, QUIET).unwrap();
        let before = memory::stats(QUIET).unwrap().allocation.all.allocated;
        // One Adam-like step plus gradient accumulation, all in place.
        for _ in 0..3 {
            p.add_(&g).unwrap();
            m.mul_scalar_(0.9).unwrap();
            m.add_scaled_(0.1, &g).unwrap();
            v.mul_(&v).unwrap();
            v.addcmul_(0.001, &g, &g).unwrap();
            p.addcdiv_(-1e-3, &m, &v).unwrap();
            m.lerp_(&g, 0.1).unwrap();
            p.sub_(&g).unwrap();
            p.div_(&v).unwrap();
            p.clamp_(Some(-10.0), Some(10.0)).unwrap();
            p.add_scalar_(1.0).unwrap();
            p.affine_(0.5, 0.5).unwrap();
            row.add_(&bias).unwrap();
        }
        let after = memory::stats(QUIET).unwrap().allocation.all.allocated;
        assert_eq!(after, before, "in-place ops on {n} elements allocated {} blocks", after - before);
        assert_eq!(p.version(), 3 * 7, "seven in-place ops on p per step");
        // Sanity: an out-of-place op does allocate, so the counter is live.
        let _sum = (&p + &g).unwrap();
        assert_eq!(memory::stats(QUIET).unwrap().allocation.all.allocated, after + 1);
    }
}

#[test]
fn relu_backward_passes_the_gradient_where_the_output_is_positive() {
    setup();
    let grad = Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], CPU).unwrap();
    let out = Tensor::from_vec_on(vec![0.5f32, 0.0, -1.0, f32::NAN], [2, 2], CPU).unwrap();
    assert_eq!(grad.relu_backward(&out).unwrap().to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 0.0]);
    // Broadcast and promoted like any binary op; integers work, bools are refused.
    let row = Tensor::from_vec_on(vec![1.0f64, -1.0], [2], CPU).unwrap();
    assert_eq!(grad.relu_backward(&row).unwrap().to_vec::<f64>().unwrap(), [1.0, 0.0, 3.0, 0.0]);
    let ints = Tensor::from_vec_on(vec![5i64, 6], [2], CPU).unwrap();
    assert_eq!(
        ints.relu_backward(&Tensor::from_vec_on(vec![1i64, 0], [2], CPU).unwrap()).unwrap().to_vec::<i64>().unwrap(),
        [5, 0]
    );
    let flags = Tensor::from_vec_on(vec![true, false], [2], CPU).unwrap();
    assert!(flags.relu_backward(&flags).is_err());
}
