//! `Tensor::matmul` against a naive triple loop: random shapes (empty ones
//! included), vectors, broadcast batch dims, transposed / narrowed / permuted /
//! expanded operands, every float dtype; and its error messages.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{set_host_device_count, DType, Device, Tensor, TensorError};
use proptest::prelude::*;

/// Two logical host devices, for the device-mismatch error; every test
/// calls this before making a tensor.
fn init() {
    set_host_device_count(2).unwrap();
}

/// Values `k / 8` with `|k| <= 8`: exact in every float dtype, so products
/// and their sums are exact in f32 accumulation and the only error left is
/// the rounding of the result to the output dtype.
fn values(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 17) as f64 - 8.0) / 8.0
        })
        .collect()
}

/// How an operand is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum View {
    Contiguous,
    /// The last two dims swapped (a transposed matrix).
    Transposed,
    /// A slice of a wider last dim.
    Narrowed,
    /// All dims reversed in memory.
    Permuted,
    /// The first dim broadcast from size 1 (stride 0).
    Expanded,
    /// A view at a non-zero storage offset.
    Offset,
}

const VIEWS: [View; 6] =
    [View::Contiguous, View::Transposed, View::Narrowed, View::Permuted, View::Expanded, View::Offset];

/// A tensor of logical shape `shape` laid out as `view`.
fn make(shape: &[usize], dtype: DType, view: View, seed: u64) -> Tensor {
    init();
    let base = |dims: &[usize]| {
        let numel = dims.iter().product();
        Tensor::from_vec_on(values(numel, seed), dims.to_vec(), Device::CPU).unwrap().to_dtype(dtype).unwrap()
    };
    let rank = shape.len();
    let t = match view {
        View::Transposed if rank >= 2 => {
            let mut dims = shape.to_vec();
            dims.swap(rank - 2, rank - 1);
            base(&dims).transpose(-2, -1).unwrap()
        }
        View::Narrowed if rank >= 1 => {
            let mut dims = shape.to_vec();
            dims[rank - 1] += 3;
            base(&dims).narrow(-1, 2, shape[rank - 1]).unwrap()
        }
        View::Permuted if rank >= 2 => {
            let reversed: Vec<usize> = shape.iter().rev().copied().collect();
            let order: Vec<usize> = (0..rank).rev().collect();
            base(&reversed).permute(&order).unwrap()
        }
        View::Expanded if rank >= 3 => {
            let mut dims = shape.to_vec();
            dims[0] = 1;
            base(&dims).expand(shape.to_vec()).unwrap()
        }
        View::Offset => {
            let mut dims = vec![2];
            dims.extend_from_slice(shape);
            base(&dims).select(0, 1).unwrap()
        }
        _ => base(shape),
    };
    assert_eq!(t.dims(), shape);
    t
}

/// PyTorch's matmul written out: promote vectors, broadcast batch dims by
/// hand, triple loop in f64. Returns the output shape and values.
fn reference(a: &Tensor, b: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let av = a.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let bv = b.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let mut ad = a.dims().to_vec();
    let mut bd = b.dims().to_vec();
    if ad.len() == 1 {
        ad.insert(0, 1);
    }
    if bd.len() == 1 {
        bd.push(1);
    }
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    assert_eq!(k, bd[bd.len() - 2]);
    let (a_batch, b_batch) = (&ad[..ad.len() - 2], &bd[..bd.len() - 2]);
    let rank = a_batch.len().max(b_batch.len());
    let pad = |d: &[usize]| [vec![1; rank - d.len()], d.to_vec()].concat();
    let (pa, pb) = (pad(a_batch), pad(b_batch));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| if x == 1 { y } else { x }).collect();
    let count: usize = batch.iter().product();
    let mut out = Vec::new();
    for index in 0..count {
        // Unravel `index` over `batch`, then ravel over each operand's dims
        // with broadcast dims pinned to 0.
        let (mut ia, mut ib, mut rest) = (0, 0, index);
        let mut digits = vec![0; rank];
        for d in (0..rank).rev() {
            digits[d] = rest % batch[d];
            rest /= batch[d];
        }
        for d in 0..rank {
            ia = ia * pa[d] + if pa[d] == 1 { 0 } else { digits[d] };
            ib = ib * pb[d] + if pb[d] == 1 { 0 } else { digits[d] };
        }
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0;
                for p in 0..k {
                    sum += av[ia * m * k + i * k + p] * bv[ib * k * n + p * n + j];
                }
                out.push(sum);
            }
        }
    }
    let mut shape = batch;
    if a.rank() > 1 {
        shape.push(m);
    }
    if b.rank() > 1 {
        shape.push(n);
    }
    (shape, out)
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

fn check(a: &Tensor, b: &Tensor) -> Result<(), TestCaseError> {
    let c = a.matmul(b).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (shape, expected) = reference(a, b);
    prop_assert_eq!(c.dims(), shape.as_slice(), "{:?} x {:?}", a.dims(), b.dims());
    prop_assert_eq!(c.dtype(), a.dtype());
    let got = c.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let tol = tolerance(a.dtype());
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        prop_assert!(
            (g - e).abs() <= tol * e.abs() + 1e-9,
            "element {}: {} vs {} ({:?} x {:?})",
            i,
            g,
            e,
            a.dims(),
            b.dims()
        );
    }
    Ok(())
}

/// `matmul_out_dtype(.., F32)` of half operands: the f32 sums, exactly the
/// f64 reference (the values are multiples of 1/64 whose sums f32 holds
/// exactly, and bf16 or f16 would not: a rounded result fails).
fn check_f32_out(a: &Tensor, b: &Tensor) -> Result<(), TestCaseError> {
    let c = a.matmul_out_dtype(b, DType::F32).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (shape, expected) = reference(a, b);
    prop_assert_eq!(c.dims(), shape.as_slice(), "{:?} x {:?}", a.dims(), b.dims());
    prop_assert_eq!(c.dtype(), DType::F32);
    let got = c.to_vec::<f32>().unwrap();
    for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
        prop_assert_eq!(f64::from(g), e, "element {}: {:?} x {:?} ({})", i, a.dims(), b.dims(), a.dtype());
    }
    Ok(())
}

/// q and k as attention takes them from one packed projection
/// `[batch, seq, 3 * heads * dh]` (4, 96, 4 heads of 64): `[batch, heads,
/// seq, dh]` views whose batch and head strides do not merge.
fn packed_q_and_k(dtype: DType, seed: u64) -> (Tensor, Tensor) {
    let (batch, seq, heads, dh) = (4, 96, 4, 64);
    let numel = batch * seq * 3 * heads * dh;
    let packed = Tensor::from_vec_on(values(numel, seed), [batch, seq, 3 * heads * dh], Device::CPU).unwrap();
    let packed = packed.to_dtype(dtype).unwrap();
    let head_view = |part: usize| {
        let flat = packed.narrow(-1, part * heads * dh, heads * dh).unwrap();
        flat.reshape(&[batch as isize, seq as isize, heads as isize, dh as isize])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    (head_view(0), head_view(1))
}

#[derive(Debug, Clone)]
struct Case {
    a_shape: Vec<usize>,
    b_shape: Vec<usize>,
    a_view: View,
    b_view: View,
    dtype: DType,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let batch = prop::collection::vec(0usize..4, 0..=3);
    (batch, 0usize..4, 0usize..4, any::<u8>(), any::<u8>(), 0usize..7, 0usize..7, 0usize..7)
        .prop_flat_map(|(batch, ra, rb, mask_a, mask_b, m, k, n)| {
            let dims_for = |keep: usize, mask: u8| {
                let keep = keep.min(batch.len());
                let tail = &batch[batch.len() - keep..];
                // Some batch dims are 1, to broadcast against the other side.
                tail.iter().enumerate().map(|(i, &d)| if mask >> i & 1 == 1 { 1 } else { d }).collect::<Vec<_>>()
            };
            // Rank 0 here means "a vector".
            let a_shape = if ra == 0 { vec![k] } else { [dims_for(ra - 1, mask_a), vec![m, k]].concat() };
            let b_shape = if rb == 0 { vec![k] } else { [dims_for(rb - 1, mask_b), vec![k, n]].concat() };
            (
                Just(a_shape),
                Just(b_shape),
                prop::sample::select(VIEWS.to_vec()),
                prop::sample::select(VIEWS.to_vec()),
                prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16]),
                any::<u64>(),
            )
        })
        .prop_map(|(a_shape, b_shape, a_view, b_view, dtype, seed)| Case {
            a_shape,
            b_shape,
            a_view,
            b_view,
            dtype,
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_naive_loops(c in case()) {
        let a = make(&c.a_shape, c.dtype, c.a_view, c.seed);
        let b = make(&c.b_shape, c.dtype, c.b_view, c.seed ^ 0xABCD);
        check(&a, &b)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn half_products_into_f32_are_the_exact_sums(c in case(), bf16 in any::<bool>()) {
        let dtype = if bf16 { DType::BF16 } else { DType::F16 };
        let a = make(&c.a_shape, dtype, c.a_view, c.seed);
        let b = make(&c.b_shape, dtype, c.b_view, c.seed ^ 0xABCD);
        check_f32_out(&a, &b)?;
    }
}

#[test]
fn larger_half_products_into_f32_cross_tiles_and_threads() {
    // Tall products (a batch folded into rows), several matrices per call
    // shared out across threads, transposed operands, and attention's
    // per-head views of a packed projection.
    for (a_shape, b_shape, a_view, b_view) in [
        (vec![256, 300], vec![300, 128], View::Contiguous, View::Contiguous),
        (vec![3, 45, 270], vec![270, 50], View::Contiguous, View::Transposed),
        (vec![16, 96, 64], vec![16, 64, 96], View::Transposed, View::Offset),
        (vec![2, 3, 40, 33], vec![3, 33, 29], View::Permuted, View::Narrowed),
    ] {
        for dtype in [DType::BF16, DType::F16] {
            check_f32_out(&make(&a_shape, dtype, a_view, 3), &make(&b_shape, dtype, b_view, 4)).unwrap();
        }
    }
    let (q, k) = packed_q_and_k(DType::BF16, 9);
    check_f32_out(&q, &k.transpose(-1, -2).unwrap()).unwrap();
    // The operands' own dtype is a plain matmul; anything else is refused.
    let (a, b) = (make(&[3, 4], DType::BF16, View::Contiguous, 1), make(&[4, 2], DType::BF16, View::Contiguous, 2));
    assert_eq!(a.matmul_out_dtype(&b, DType::BF16).unwrap().dtype(), DType::BF16);
    let refused = a.matmul_out_dtype(&b, DType::F64).unwrap_err();
    assert!(matches!(refused, TensorError::Invalid { op: "matmul", .. }), "{refused:?}");
    let (x, y) = (make(&[3, 4], DType::F32, View::Contiguous, 1), make(&[4, 2], DType::F32, View::Contiguous, 2));
    assert!(x.matmul_out_dtype(&y, DType::F16).is_err());
}

#[test]
fn larger_products_cross_tiles_blocks_and_threads() {
    // Past the micro-tile (32 x 12), the depth block (~256) and the threading
    // threshold (16 MFLOP), with transposed operands and a batch.
    for (a_shape, b_shape, a_view, b_view) in [
        (vec![200, 300], vec![300, 100], View::Contiguous, View::Contiguous),
        (vec![256, 300], vec![300, 128], View::Contiguous, View::Contiguous),
        (vec![133, 301], vec![301, 77], View::Transposed, View::Transposed),
        (vec![3, 45, 270], vec![270, 50], View::Contiguous, View::Transposed),
        (vec![2, 3, 40, 33], vec![3, 33, 29], View::Permuted, View::Narrowed),
        (vec![4, 70, 64], vec![4, 64, 70], View::Offset, View::Expanded),
    ] {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let a = make(&a_shape, dtype, a_view, 1);
            let b = make(&b_shape, dtype, b_view, 2);
            check(&a, &b).unwrap();
        }
    }
}

#[test]
fn attention_heads_of_a_packed_projection() {
    // q and k as attention takes them from one packed projection
    // [batch, seq, 3 * heads * dh]: [batch, heads, seq, dh] views whose batch
    // and head strides do not merge, so the product runs as several batched
    // calls (4 of 4 heads here), shared out across threads (18.9 MFLOP).
    init();
    for dtype in [DType::F32, DType::BF16] {
        let (q, k) = packed_q_and_k(dtype, 7);
        assert!(!q.is_contiguous());
        check(&q, &k.transpose(-1, -2).unwrap()).unwrap();
    }
}

#[test]
fn transposed_operands_are_not_copied_and_vectors_squeeze() {
    init();
    let a = make(&[5, 4], DType::F32, View::Transposed, 3);
    assert!(!a.is_contiguous());
    let v = make(&[4], DType::F32, View::Contiguous, 4);
    assert_eq!(a.matmul(&v).unwrap().dims(), &[5]);
    assert_eq!(v.matmul(&a.t().unwrap()).unwrap().dims(), &[5]);
    assert_eq!(v.matmul(&v).unwrap().dims(), &[] as &[usize]);
    let batch = make(&[2, 3, 4, 5], DType::F64, View::Contiguous, 5);
    let w = make(&[5], DType::F64, View::Contiguous, 6);
    assert_eq!(batch.matmul(&w).unwrap().dims(), &[2, 3, 4]);
    assert_eq!(make(&[4], DType::F64, View::Contiguous, 7).matmul(&batch).unwrap().dims(), &[2, 3, 5]);
    // Empty inner dimension: zeros, not garbage.
    let a0 = make(&[3, 0], DType::F32, View::Contiguous, 8);
    let b0 = make(&[0, 2], DType::F32, View::Contiguous, 9);
    assert_eq!(a0.matmul(&b0).unwrap().to_vec::<f32>().unwrap(), [0.0; 6]);
}

#[test]
fn errors_say_what_was_expected_and_given() {
    init();
    let f = |shape: &[usize]| make(shape, DType::F32, View::Contiguous, 0);
    let msg = |r: brasa_tensor::Result<Tensor>| r.unwrap_err().to_string();
    assert_eq!(
        msg(f(&[2, 3]).matmul(&f(&[4, 5]))),
        "matmul: cannot multiply [2, 3] by [4, 5]: inner dimensions 3 and 4 differ"
    );
    assert_eq!(msg(f(&[3]).matmul(&f(&[4]))), "matmul: cannot multiply [3] by [4]: inner dimensions 3 and 4 differ");
    assert_eq!(
        msg(f(&[2, 2, 3]).matmul(&f(&[3, 3, 4]))),
        "matmul: cannot multiply [2, 2, 3] by [3, 3, 4]: batch dimensions [2] and [3] do not broadcast"
    );
    let scalar = Tensor::scalar_on(1.0f32, Device::CPU).unwrap();
    assert_eq!(
        msg(scalar.matmul(&f(&[3]))),
        "matmul: both operands need at least one dimension, got shapes [] and [3]"
    );
    let d = make(&[3, 2], DType::F64, View::Contiguous, 0);
    assert_eq!(msg(f(&[2, 3]).matmul(&d)), "matmul: expected dtype f32, got f64");
    let i = f(&[2, 2]).to_dtype(DType::I64).unwrap();
    assert_eq!(msg(i.matmul(&i)), "matmul: needs floating-point operands (f32, f64, f16 or bf16), got i64");
    let other = f(&[3, 2]).to(Device::cpu(1)).unwrap();
    assert_eq!(
        msg(f(&[2, 3]).matmul(&other)),
        "matmul: operands are on different devices, cpu:0 and cpu:1; move one with .to(&device)"
    );
    // Two tensors on the second logical device multiply there.
    let on_one = f(&[2, 3]).to(Device::cpu(1)).unwrap();
    assert_eq!(on_one.matmul(&other).unwrap().device(), Device::cpu(1));
}
