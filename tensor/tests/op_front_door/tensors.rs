//! Random tensors: how their elements, dtypes, shapes and views are drawn.

use super::*;

/// How a tensor's elements are made.
#[derive(Debug, Clone)]
pub(super) enum Values {
    /// Normal samples times a scale, cast to the dtype.
    Randn(f64),
    /// One value everywhere (NaN and infinities included; one the dtype
    /// cannot hold falls back to zeros).
    Full(f64),
    /// These integers, repeated, cast to the dtype (indices, in and out of range).
    Ints(Vec<i64>),
}

/// A view applied to a tensor (skipped when it fails).
#[derive(Debug, Clone)]
pub(super) enum View {
    Transpose(isize, isize),
    /// Dims in reverse order.
    Reverse,
    /// Any order (often not a permutation: an error).
    Permute(Vec<usize>),
    Narrow(isize, usize, usize),
    Select(isize, usize),
    Unsqueeze(isize),
    /// The `which`-th size-1 dim (or a new leading one) expanded to `size`.
    Expand(usize, usize),
}

/// A random tensor: base shape, dtype, device, values, then views.
#[derive(Debug, Clone)]
pub(super) struct Spec {
    pub(super) dims: Vec<usize>,
    pub(super) dtype: DType,
    pub(super) device: usize,
    pub(super) values: Values,
    pub(super) views: Vec<View>,
}

pub(super) fn any_dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

pub(super) fn float_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![
        6 => proptest::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16]),
        1 => any_dtype(),
    ]
}

pub(super) fn any_scalar() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => (-4i32..5).prop_map(f64::from),
        2 => Just(0.5),
        1 => Just(-0.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(1e300),
        1 => Just(65520.0),
        1 => Just(i64::MIN as f64),
        1 => Just(1.8446744073709552e19),
        1 => any::<f64>(),
    ]
}

pub(super) fn any_index() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -3i64..6, 1 => Just(i64::MIN), 1 => Just(i64::MAX), 1 => Just(1 << 40)]
}

pub(super) fn any_dim() -> impl Strategy<Value = isize> {
    prop_oneof![12 => -5isize..5, 1 => Just(isize::MIN), 1 => Just(isize::MAX)]
}

/// A size for narrow/select/split/one_hot: mostly small, sometimes huge.
pub(super) fn any_count() -> impl Strategy<Value = usize> {
    prop_oneof![10 => 0usize..5, 1 => Just(1 << 40), 1 => Just(usize::MAX)]
}

/// The size an expanded dim takes: small, or huge (whose products stay
/// huge: every op making such an output must fail, and fast).
pub(super) fn expand_size() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 4 => 2usize..4, 1 => Just(1 << 40), 1 => Just(isize::MAX as usize), 1 => Just(usize::MAX)]
}

pub(super) fn any_values() -> impl Strategy<Value = Values> {
    prop_oneof![
        4 => prop_oneof![Just(1.0), Just(3.0), Just(100.0)].prop_map(Values::Randn),
        2 => any_scalar().prop_map(Values::Full),
        2 => proptest::collection::vec(any_index(), 1..6).prop_map(Values::Ints),
    ]
}

pub(super) fn any_view() -> impl Strategy<Value = View> {
    prop_oneof![
        3 => (any_dim(), any_dim()).prop_map(|(a, b)| View::Transpose(a, b)),
        2 => Just(View::Reverse),
        1 => proptest::collection::vec(0usize..5, 0..5).prop_map(View::Permute),
        3 => (any_dim(), 0usize..3, any_count()).prop_map(|(d, s, l)| View::Narrow(d, s, l)),
        1 => (any_dim(), any_count()).prop_map(|(d, i)| View::Select(d, i)),
        1 => any_dim().prop_map(View::Unsqueeze),
        3 => (0usize..4, expand_size()).prop_map(|(w, s)| View::Expand(w, s)),
    ]
}

pub(super) fn spec_with(
    dims: impl Strategy<Value = Vec<usize>>,
    dtype: impl Strategy<Value = DType>,
) -> impl Strategy<Value = Spec> {
    (
        dims,
        dtype,
        prop_oneof![1 => Just(0usize), 3 => Just(1usize)],
        any_values(),
        proptest::collection::vec(any_view(), 0..3),
    )
        .prop_map(|(dims, dtype, device, values, views)| Spec { dims, dtype, device, values, views })
}

pub(super) fn any_spec() -> impl Strategy<Value = Spec> {
    spec_with(
        proptest::collection::vec(prop_oneof![2 => Just(0usize), 3 => Just(1usize), 5 => 2usize..5], 0..5),
        any_dtype(),
    )
}

/// Index tensors: mostly i64, rank 0 to 2.
pub(super) fn index_spec() -> impl Strategy<Value = Spec> {
    (
        proptest::collection::vec(0usize..4, 0..3),
        prop_oneof![8 => Just(DType::I64), 1 => any_dtype()],
        prop_oneof![1 => Just(0usize), 4 => Just(1usize)],
        proptest::collection::vec(any_index(), 1..6),
        proptest::collection::vec(any_view(), 0..2),
    )
        .prop_map(|(dims, dtype, device, ints, views)| Spec {
            dims,
            dtype,
            device,
            values: Values::Ints(ints),
            views,
        })
}

pub(super) fn apply(t: &Tensor, view: &View) -> Result<Tensor, TensorError> {
    match view {
        View::Transpose(a, b) => t.transpose(*a, *b),
        View::Reverse => t.permute(&(0..t.rank()).rev().collect::<Vec<_>>()),
        View::Permute(order) => t.permute(order),
        View::Narrow(dim, start, len) => t.narrow(*dim, *start, *len),
        View::Select(dim, index) => t.select(*dim, *index),
        View::Unsqueeze(dim) => t.unsqueeze(*dim),
        View::Expand(which, size) => {
            let ones: Vec<usize> = (0..t.rank()).filter(|&d| t.dims()[d] == 1).collect();
            let (base, dim) = match ones.get(which % ones.len().max(1)) {
                Some(&d) => (t.clone(), d),
                None => (t.unsqueeze(0)?, 0),
            };
            let mut shape = base.dims().to_vec();
            shape[dim] = *size;
            base.expand(shape)
        }
    }
}

/// Makes the tensor of a spec (its construction and views are calls too).
pub(super) fn build(spec: &Spec) -> Result<Option<Tensor>, TestCaseError> {
    let ctx = Ctx(format!("{spec:?}"));
    let (dims, dtype, device) = (spec.dims.as_slice(), spec.dtype, DEVICES[spec.device]);
    let made = ctx.tensor("build", || match &spec.values {
        Values::Randn(scale) => Tensor::randn_on(dims, DType::F64, device)?.mul_scalar(*scale)?.to_dtype(dtype),
        Values::Full(value) => {
            Tensor::full_on(dims, *value, dtype, device).or_else(|_| Tensor::zeros_on(dims, dtype, device))
        }
        Values::Ints(ints) => {
            let data: Vec<i64> = ints.iter().copied().cycle().take(dims_numel(dims)).collect();
            Tensor::from_vec_on(data, dims, device)?.to_dtype(dtype)
        }
    })?;
    let Some(mut t) = made else { return Ok(None) };
    for view in &spec.views {
        if let Some(v) = ctx.tensor("view", || apply(&t, view))? {
            t = v;
        }
    }
    Ok(Some(t))
}

/// With `OP_FRONT_DOOR_COUNTS` set, prints how many calls of a property
/// returned `Ok` and `Err` (to see that the cases reach the ops' work).
pub(super) fn report(property: &str) {
    let ok = COUNTS[0].swap(0, std::sync::atomic::Ordering::Relaxed);
    let err = COUNTS[1].swap(0, std::sync::atomic::Ordering::Relaxed);
    if std::env::var_os("OP_FRONT_DOOR_COUNTS").is_some() {
        let message = format!("{property}: {ok} calls Ok, {err} Err\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), message.as_bytes());
    }
}

pub(super) fn config(cases: u32) -> Config {
    // PROPTEST_CASES, when set, overrides `cases` (in `proptest!`).
    Config { cases, failure_persistence: None, ..Config::default() }
}
