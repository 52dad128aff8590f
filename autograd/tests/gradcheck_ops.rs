//! `gradcheck` on every differentiable op, in f64, on shapes with
//! broadcasting and non-contiguous (transposed, narrowed) inputs.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Result, Var};
use brasa_tensor::{manual_seed, Conv2dParams, DType, Tensor};
use proptest::prelude::*;

const EPS: f64 = 1e-6;
const ATOL: f64 = 1e-6;
const RTOL: f64 = 1e-5;

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, DType::F64).expect("randn")
}

/// Values in `[0.5, 2)`: positive, away from kinks.
fn positive(shape: &[usize]) -> Tensor {
    Tensor::uniform_on(shape, 0.5, 2.0, DType::F64, brasa_tensor::Device::CPU).expect("uniform")
}

fn check(f: impl Fn(&[Var]) -> Result<Var>, inputs: &[Tensor]) {
    if let Err(e) = gradcheck(f, inputs, EPS, ATOL, RTOL) {
        panic!("{e}");
    }
}

#[test]
fn unary_ops() {
    manual_seed(1);
    let x = randn(&[3, 4]);
    let xt = randn(&[4, 3]).t().expect("t"); // non-contiguous
    for input in [x, xt] {
        let one = std::slice::from_ref(&input);
        check(|v| v[0].neg(), one);
        check(|v| v[0].exp(), one);
        check(|v| v[0].sin(), one);
        check(|v| v[0].cos(), one);
        check(|v| v[0].tanh(), one);
        check(|v| v[0].sigmoid(), one);
        check(|v| v[0].gelu(), one);
        check(|v| v[0].gelu_tanh(), one);
        check(|v| v[0].silu(), one);
        check(|v| v[0].affine(-2.0, 0.5), one);
        check(|v| v[0].add_scalar(3.0)?.mul_scalar(2.0)?.sub_scalar(1.0)?.div_scalar(4.0)?.rsub_scalar(1.0), one);
        check(|v| v[0].clamp(Some(-0.5), Some(0.5)), one);
        check(|v| v[0].clamp(None, Some(0.2)), one);
    }
    // Away from zero for abs/relu kinks, positive for log/sqrt/rsqrt/powf.
    let p = positive(&[2, 5]);
    let signed = p.mul(&Tensor::from_vec(vec![1.0f64, -1.0, 1.0, -1.0, 1.0], [5]).expect("v")).expect("mul");
    check(|v| v[0].abs(), std::slice::from_ref(&signed));
    check(|v| v[0].relu(), std::slice::from_ref(&signed));
    check(|v| v[0].log(), std::slice::from_ref(&p));
    check(|v| v[0].sqrt(), std::slice::from_ref(&p));
    check(|v| v[0].rsqrt(), std::slice::from_ref(&p));
    check(|v| v[0].powf(2.5), std::slice::from_ref(&p));
}

#[test]
fn binary_ops_with_broadcast() {
    manual_seed(2);
    let a = randn(&[2, 3, 4]);
    let b = randn(&[3, 1]);
    let pa = positive(&[2, 3, 4]);
    let pb = positive(&[4]);
    check(|v| v[0].add(&v[1]), &[a.clone(), b.clone()]);
    check(|v| v[0].sub(&v[1]), &[a.clone(), b.clone()]);
    check(|v| v[0].mul(&v[1]), &[a.clone(), b.clone()]);
    check(|v| v[0].div(&v[1]), &[a.clone(), pb.clone()]);
    check(|v| v[0].pow(&v[1]), &[pa.clone(), pb.clone()]);
    check(|v| v[0].maximum(&v[1]), &[a.clone(), b.clone()]);
    check(|v| v[0].minimum(&v[1]), &[a.clone(), b.clone()]);
    let cond = a.gt_scalar(0.0).expect("gt");
    check(|v| Var::where_cond(&cond, &v[0], &v[1]), &[a.clone(), b.clone()]);
    // A non-contiguous operand.
    let at = randn(&[4, 3]).t().expect("t");
    check(|v| v[0].mul(&v[1]), &[at, randn(&[1, 4])]);
    check(|v| v[0].mul(&v[0]), &[b]);
}

#[test]
fn reductions() {
    manual_seed(3);
    let x = randn(&[3, 4, 2]);
    let one = std::slice::from_ref(&x);
    check(|v| v[0].sum(&[1], false), one);
    check(|v| v[0].sum(&[0, 2], true), one);
    check(|v| v[0].sum_all(), one);
    check(|v| v[0].mean(&[-1], false), one);
    check(|v| v[0].mean_all(), one);
    check(|v| v[0].var(&[1], 1, false), one);
    check(|v| v[0].var(&[], 0, false), one);
    check(|v| v[0].std(&[2], 1, true), one);
    check(|v| v[0].max(&[1], false), one);
    check(|v| v[0].min(&[0, 2], true), one);
    check(|v| v[0].max(&[], false), one);
    let xt = randn(&[4, 3]).t().expect("t");
    check(|v| v[0].sum(&[0], false), std::slice::from_ref(&xt));
}

#[test]
fn softmax_family() {
    manual_seed(4);
    let x = randn(&[3, 5]);
    check(|v| v[0].softmax(-1), std::slice::from_ref(&x));
    check(|v| v[0].softmax(0), std::slice::from_ref(&x));
    check(|v| v[0].log_softmax(1), std::slice::from_ref(&x));
    check(|v| v[0].log_softmax(0), &[randn(&[5, 3]).t().expect("t")]);
}

#[test]
fn matmul_shapes() {
    manual_seed(5);
    check(|v| v[0].matmul(&v[1]), &[randn(&[3, 4]), randn(&[4, 2])]);
    check(|v| v[0].matmul(&v[1]), &[randn(&[4]), randn(&[4])]);
    check(|v| v[0].matmul(&v[1]), &[randn(&[4]), randn(&[2, 4, 3])]);
    check(|v| v[0].matmul(&v[1]), &[randn(&[2, 3, 4]), randn(&[4])]);
    check(|v| v[0].matmul(&v[1]), &[randn(&[2, 1, 3, 4]), randn(&[2, 4, 2])]);
    check(|v| v[0].matmul(&v[1]), &[randn(&[4, 3]).t().expect("t"), randn(&[2, 4]).t().expect("t")]);
    check(|v| v[0].linear(&v[1], Some(&v[2])), &[randn(&[3, 4]), randn(&[2, 4]), randn(&[2])]);
    check(|v| v[0].linear(&v[1], Some(&v[2])), &[randn(&[2, 3, 4]), randn(&[5, 4]), randn(&[5])]);
    check(|v| v[0].linear(&v[1], None), &[randn(&[4, 3]).t().expect("t"), randn(&[2, 4])]);
    check(|v| v[0].linear(&v[1], None), &[randn(&[4]), randn(&[2, 4])]);
    let (x, w) = (Var::new(randn(&[3, 4])), Var::new(randn(&[2, 5])));
    let err = x.linear(&w, None).unwrap_err();
    assert!(matches!(err, AutogradError::Invalid { op: "linear", .. }), "{err:?}");
    // The variant says no more: the message names the weight's shape.
    assert!(err.to_string().contains("weight [2, 5]"), "{err}");
}

#[test]
fn views() {
    manual_seed(6);
    let x = randn(&[2, 3, 4]);
    let one = std::slice::from_ref(&x);
    check(|v| v[0].reshape(&[6, -1]), one);
    check(|v| v[0].view(&[4, 6]), one);
    check(|v| v[0].flatten(1, 2), one);
    check(|v| v[0].transpose(0, 2)?.contiguous(), one);
    check(|v| v[0].permute(&[2, 0, 1]), one);
    check(|v| v[0].narrow(2, 1, 2), one);
    check(|v| v[0].select(1, 2), one);
    check(|v| v[0].unsqueeze(1)?.squeeze(1), one);
    check(|v| v[0].sum(&[1], true)?.expand([2, 5, 4]), one);
    check(|v| v[0].narrow(1, 1, 2)?.t_last()?.reshape(&[-1]), one);
    check(|v| v[0].select(0, 1)?.t(), one);
    // Strided slices: every other element, a step past the end, a slice of a transpose.
    check(|v| v[0].slice(2, 0, 4, 2), one);
    check(|v| v[0].slice(1, 1, 100, 3)?.mul(&v[0].slice(1, 0, 1, 1)?), one);
    check(|v| v[0].transpose(0, 2)?.slice(0, 1, 4, 2)?.sum_all(), one);
}

trait LastTwo {
    fn t_last(&self) -> Result<Var>;
}

impl LastTwo for Var {
    fn t_last(&self) -> Result<Var> {
        self.transpose(-2, -1)
    }
}

#[test]
fn concat_family() {
    manual_seed(7);
    let (a, b) = (randn(&[2, 3]), randn(&[2, 1]));
    check(|v| Var::cat(&[&v[0], &v[1]], 1), &[a.clone(), b]);
    check(|v| Var::stack(&[&v[0], &v[1]], 1), &[a.clone(), randn(&[2, 3])]);
    check(|v| Ok(v[0].split(2, 1)?.remove(1)), std::slice::from_ref(&a));
    check(|v| Ok(v[0].chunk(2, 1)?.remove(0)), std::slice::from_ref(&a));
}

#[test]
fn indexing() {
    manual_seed(8);
    let x = randn(&[4, 3]);
    let idx = Tensor::from_vec(vec![2i64, 0, 2], [3]).expect("idx");
    check(|v| v[0].index_select(0, &idx), std::slice::from_ref(&x));
    check(|v| v[0].index_select(1, &idx), std::slice::from_ref(&x));
    let gidx = Tensor::from_vec(vec![0i64, 2, 1, 1, 0, 0], [2, 3]).expect("gidx");
    check(|v| v[0].gather(0, &gidx), std::slice::from_ref(&x));
    let ids = Tensor::from_vec(vec![1i64, 3, 1, 0], [2, 2]).expect("ids");
    check(|v| Var::embedding(&v[0], &ids), std::slice::from_ref(&x));
}

#[test]
fn conv_and_pool() {
    manual_seed(9);
    let x = randn(&[2, 2, 5, 5]);
    let w = randn(&[3, 2, 3, 3]);
    let b = randn(&[3]);
    let params = Conv2dParams::default().with_stride((2, 1)).with_padding((1, 1));
    check(|v| v[0].conv2d(&v[1], Some(&v[2]), params), &[x.clone(), w.clone(), b]);
    let grouped = Conv2dParams::default().with_groups(2);
    check(|v| v[0].conv2d(&v[1], None, grouped), &[randn(&[1, 4, 4, 4]), randn(&[2, 2, 2, 2])]);
    check(|v| v[0].max_pool2d((2, 2), (2, 2), (0, 0)), std::slice::from_ref(&x));
    check(|v| v[0].avg_pool2d((3, 3), (2, 2), (1, 1), true), std::slice::from_ref(&x));
    check(|v| v[0].avg_pool2d((2, 2), (1, 1), (1, 1), false), std::slice::from_ref(&x));
}

#[test]
fn dtype_conversion() {
    manual_seed(10);
    // Through f32: a larger step, and f32's rounding in the tolerance.
    let through_f32 = |v: &[Var]| v[0].to_dtype(DType::F32)?.mul_scalar(2.0)?.to_dtype(DType::F64);
    gradcheck(through_f32, &[randn(&[3])], 1e-2, 1e-3, 1e-3).expect("to_dtype");
}

fn shape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..4, 1..4).prop_flat_map(|a| {
        let len = a.len();
        let b = prop::collection::vec(prop::bool::ANY, len).prop_map({
            let a = a.clone();
            move |keep| a.iter().zip(&keep).map(|(&d, &k)| if k { d } else { 1 }).collect::<Vec<_>>()
        });
        (Just(a), b, 0..len).prop_map(|(a, b, drop)| (a, b[drop..].to_vec()))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn broadcast_binary_gradients((a, b) in shape_pair(), seed in 0u64..1000) {
        manual_seed(seed);
        let (x, y) = (randn(&a), randn(&b));
        prop_assert!(gradcheck(|v| v[0].mul(&v[1])?.add(&v[1]), &[x.clone(), y.clone()], EPS, ATOL, RTOL).is_ok());
        prop_assert!(gradcheck(|v| v[1].sub(&v[0])?.tanh(), &[x, y], EPS, ATOL, RTOL).is_ok());
    }
}

/// GELU's fused backwards over a wide range (both tails, both sides of the
/// minimum near -0.75, exactly 0), broadcast and non-contiguous; and the
/// forward saves its input only.
#[test]
fn gelu_fused_backwards() {
    let wide = Tensor::linspace(-7.0, 7.0, 57, DType::F64).expect("linspace").reshape(&[3, 19]).expect("reshape");
    let narrow = Tensor::linspace(-1.2, -0.3, 10, DType::F64).expect("linspace");
    for input in [wide.clone(), wide.t().expect("t"), narrow] {
        let one = std::slice::from_ref(&input);
        check(|v| v[0].gelu(), one);
        check(|v| v[0].gelu_tanh(), one);
        check(|v| v[0].mul_scalar(3.0)?.gelu()?.mul(&v[0]), one);
    }
    // A broadcast input: the gradient sums over the broadcast dim.
    let row = Tensor::linspace(-3.0, 3.0, 7, DType::F64).expect("linspace");
    let rows = randn(&[4, 7]);
    check(|v| v[0].add(&v[1])?.gelu(), &[row.clone(), rows.clone()]);
    check(|v| v[0].add(&v[1])?.gelu_tanh(), &[row, rows]);

    let x = Var::param(randn(&[8, 16]).to_dtype(DType::F32).expect("f32")).expect("param");
    for y in [x.gelu().expect("gelu"), x.gelu_tanh().expect("gelu_tanh")] {
        let stats = y.graph_stats();
        assert_eq!(stats.saved_bytes, 8 * 16 * 4, "the input only, not also the output");
    }
}
