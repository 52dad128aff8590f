//! Gradients of `scatter_add`, `scatter`, `scatter_reduce` (sum) and
//! `index_add` on `Var`: literal values from PyTorch's derivatives
//! (`derivatives.yaml`) worked out by hand, with repeated indices; f64
//! gradchecks on contiguous and non-contiguous inputs; errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_tensor::{manual_seed, DType, IndexError, LayoutError, ScatterReduce, Tensor, TensorError};

fn f64s(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

fn ids(values: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

fn grad(v: &Var) -> Vec<f64> {
    v.grad().unwrap().to_vec::<f64>().unwrap()
}

/// Backward of `Σ w ⊙ out` for weights `w` of the output's shape: the
/// output gradient is `w`.
fn backward_weighted(out: &Var, w: &[f64]) {
    out.mul(&Var::new(f64s(w, out.dims()))).unwrap().sum_all().unwrap().backward().unwrap();
}

// x [2, 3], dim 1, index [[2, 2], [0, 1]] (row 0 repeats column 2), src [2, 2].
const X: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
const SRC: [f64; 4] = [10.0, 20.0, 30.0, 40.0];
const INDEX: [i64; 4] = [2, 2, 0, 1];
const W: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];

fn operands() -> (Var, Var, Tensor) {
    (Var::param(f64s(&X, &[2, 3])).unwrap(), Var::param(f64s(&SRC, &[2, 2])).unwrap(), ids(&INDEX, &[2, 2]))
}

#[test]
fn scatter_add_gradients() {
    let (x, src, index) = operands();
    let out = x.scatter_add(1, &index, &src).unwrap();
    assert_eq!(out.tensor().to_vec::<f64>().unwrap(), [1.0, 2.0, 33.0, 34.0, 45.0, 6.0]);
    backward_weighted(&out, &W);
    // self: g; src: g.gather(1, index) = [[w02, w02], [w10, w11]].
    assert_eq!(grad(&x), W);
    assert_eq!(grad(&src), [3.0, 3.0, 4.0, 5.0]);
}

#[test]
fn scatter_gradients() {
    let (x, src, index) = operands();
    let out = x.scatter(1, &index, &src).unwrap();
    assert_eq!(out.tensor().to_vec::<f64>().unwrap(), [1.0, 2.0, 20.0, 30.0, 40.0, 6.0]);
    backward_weighted(&out, &W);
    // self: g zeroed where written ([0][2], [1][0], [1][1]); src: gathered,
    // the losing repeat included (PyTorch's formula).
    assert_eq!(grad(&x), [1.0, 2.0, 0.0, 0.0, 0.0, 6.0]);
    assert_eq!(grad(&src), [3.0, 3.0, 4.0, 5.0]);
}

#[test]
fn scatter_reduce_sum_gradients() {
    for (include_self, self_grad) in [(true, W), (false, [1.0, 2.0, 0.0, 0.0, 0.0, 6.0])] {
        let (x, src, index) = operands();
        let out = x.scatter_reduce(1, &index, &src, ScatterReduce::Sum, include_self).unwrap();
        let expect = if include_self { [1.0, 2.0, 33.0, 34.0, 45.0, 6.0] } else { [1.0, 2.0, 30.0, 30.0, 40.0, 6.0] };
        assert_eq!(out.tensor().to_vec::<f64>().unwrap(), expect);
        backward_weighted(&out, &W);
        assert_eq!(grad(&x), self_grad, "include_self {include_self}");
        assert_eq!(grad(&src), [3.0, 3.0, 4.0, 5.0]);
    }
}

#[test]
fn index_add_gradients() {
    // Rows 2, 0, 2 of a [3, 2]; alpha 3.
    let x = Var::param(f64s(&[0.0; 6], &[3, 2])).unwrap();
    let source = Var::param(f64s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])).unwrap();
    let out = x.index_add(0, &ids(&[2, 0, 2], &[3]), &source, 3.0).unwrap();
    assert_eq!(out.tensor().to_vec::<f64>().unwrap(), [9.0, 12.0, 0.0, 0.0, 18.0, 24.0]);
    backward_weighted(&out, &W);
    assert_eq!(grad(&x), W);
    // alpha · g.index_select(0, [2, 0, 2]).
    assert_eq!(grad(&source), [15.0, 18.0, 3.0, 6.0, 15.0, 18.0]);
}

#[test]
fn a_src_larger_than_the_index_gets_zeros_outside_it() {
    let x = Var::param(f64s(&[0.0; 3], &[3])).unwrap();
    let src = Var::param(f64s(&[1.0, 2.0, 3.0, 4.0], &[4])).unwrap();
    let out = x.scatter_add(0, &ids(&[1, 1], &[2]), &src).unwrap();
    assert_eq!(out.tensor().to_vec::<f64>().unwrap(), [0.0, 3.0, 0.0]);
    backward_weighted(&out, &[1.0, 2.0, 3.0]);
    assert_eq!(grad(&src), [2.0, 2.0, 0.0, 0.0]);
}

#[test]
fn gradchecks_on_contiguous_and_strided_inputs() {
    manual_seed(11);
    let x = Tensor::randn([3, 4], DType::F64).unwrap();
    let xt = Tensor::randn([4, 3], DType::F64).unwrap().t().unwrap();
    let src = Tensor::randn([3, 3], DType::F64).unwrap();
    let src_t = Tensor::randn([3, 3], DType::F64).unwrap().t().unwrap();
    assert!(!xt.is_contiguous() && !src_t.is_contiguous());
    // Repeats for the adds; distinct indices per row for the overwrite
    // (a repeat's loser does not reach the output, so it has no derivative).
    let repeated = ids(&[0, 3, 3, 1, 1, 1, 2, 0, 2], &[3, 3]);
    let distinct = ids(&[0, 3, 1, 2, 1, 0, 3, 2, 1], &[3, 3]);
    let (e, atol, rtol) = (1e-6, 1e-8, 1e-6);
    for (x, src) in [(&x, &src), (&xt, &src_t)] {
        let inputs = [x.clone(), src.clone()];
        gradcheck(|v| v[0].scatter_add(1, &repeated, &v[1]), &inputs, e, atol, rtol).unwrap();
        gradcheck(|v| v[0].scatter(-1, &distinct, &v[1]), &inputs, e, atol, rtol).unwrap();
        for include_self in [true, false] {
            gradcheck(
                |v| v[0].scatter_reduce(1, &repeated, &v[1], ScatterReduce::Sum, include_self)?.tanh(),
                &inputs,
                e,
                atol,
                rtol,
            )
            .unwrap();
        }
        // index_add along dim 1 of [3, 4] with a [3, 3] source, repeats.
        let index = ids(&[3, 0, 3], &[3]);
        gradcheck(|v| v[0].index_add(1, &index, &v[1], -1.5)?.exp(), &inputs, e, atol, rtol).unwrap();
        // Along dim 0 of [3, 4] with a [2, 4] source.
        let rows = Tensor::randn([2, 4], DType::F64).unwrap();
        gradcheck(|v| v[0].index_add(0, &ids(&[2, 2], &[2]), &v[1], 0.5), &[x.clone(), rows], e, atol, rtol).unwrap();
    }
}

#[test]
fn errors_reach_the_caller() {
    let (x, src, _) = operands();
    let error = x.scatter(1, &ids(&[0, 3], &[1, 2]), &src).unwrap_err();
    assert!(
        matches!(
            error,
            AutogradError::Tensor(TensorError::Index {
                op: "scatter",
                source: IndexError::OutOfRange { position: 1, index: 3, size: 3 },
                ..
            })
        ),
        "{error:?}"
    );
    // The message names the index by its place in the index tensor.
    assert!(error.to_string().contains("index 3 at [0, 1]"), "{error}");
    let error = x.scatter_add(2, &ids(&[0], &[1, 1]), &src).unwrap_err();
    assert!(
        matches!(
            error,
            AutogradError::Tensor(TensorError::Layout(LayoutError::DimOutOfRange {
                op: "scatter_add",
                dim: 2,
                rank: 2
            }))
        ),
        "{error:?}"
    );
    let error = x.index_add(0, &ids(&[0, 1], &[2]), &src, 1.0).unwrap_err();
    assert!(matches!(error, AutogradError::Tensor(TensorError::Shape { op: "index_add_", .. })), "{error:?}");
    // The variant says no more: the message names both shapes.
    assert!(error.to_string().contains("source has shape [2, 2] but self has shape [2, 3]"), "{error}");
    let floats = Var::new(f64s(&[0.0; 2], &[1, 2]));
    let error = x.scatter_reduce(1, &floats.tensor().clone(), &src, ScatterReduce::Sum, true).unwrap_err();
    assert!(
        matches!(
            error,
            AutogradError::Tensor(TensorError::DTypeMismatch {
                op: "scatter_reduce",
                expected: DType::I64,
                got: DType::F64
            })
        ),
        "{error:?}"
    );
}
