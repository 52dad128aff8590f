//! Transposed and 1-d convolutions on `Var`: f64 gradcheck of
//! `conv_transpose2d`, `conv1d` and `conv_transpose1d` in input, weight and
//! bias (groups, stride 2, dilation 2, padding, output padding, including
//! an output padding past the stride), on contiguous, strided and unbatched
//! inputs; backward's gradients against the tensor-level ones; and
//! `conv2d` on an unbatched input (a regression).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Result, Var};
use brasa_tensor::{
    manual_seed, Conv1dParams, ConvTranspose1dParams, ConvTranspose2dParams, DType, Tensor, TensorError,
};

const EPS: f64 = 1e-6;
const ATOL: f64 = 1e-6;
const RTOL: f64 = 1e-5;

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, DType::F64).expect("randn")
}

fn check(f: impl Fn(&[Var]) -> Result<Var>, inputs: &[Tensor]) {
    if let Err(e) = gradcheck(f, inputs, EPS, ATOL, RTOL) {
        panic!("{e}");
    }
}

/// `t` with its last two dims swapped in memory: same values, not contiguous.
fn strided(t: &Tensor) -> Tensor {
    let r = t.rank();
    let s = t.transpose(r - 2, r - 1).unwrap().contiguous().unwrap().transpose(r - 2, r - 1).unwrap();
    assert!(!s.is_contiguous());
    s
}

#[test]
fn conv_transpose2d_gradcheck() {
    manual_seed(3);
    // Groups 2, stride 2, dilation 2, padding, output padding: in = 4, out = 6.
    let p = ConvTranspose2dParams::new()
        .with_stride((2, 2))
        .with_padding((1, 2))
        .with_output_padding((1, 0))
        .with_dilation((2, 2))
        .with_groups(2);
    let (x, w, b) = (randn(&[2, 4, 3, 4]), randn(&[4, 3, 2, 3]), randn(&[6]));
    check(|v| v[0].conv_transpose2d(&v[1], Some(&v[2]), p), &[x.clone(), w.clone(), b.clone()]);
    check(|v| v[0].conv_transpose2d(&v[1], Some(&v[2]), p), &[strided(&x), w.clone(), b.clone()]);
    // Output padding at or past the stride (allowed below the dilation).
    let past = ConvTranspose2dParams::new()
        .with_stride((1, 2))
        .with_padding((1, 1))
        .with_output_padding((2, 2))
        .with_dilation((3, 3));
    check(
        |v| v[0].conv_transpose2d(&v[1], Some(&v[2]), past),
        &[randn(&[1, 2, 3, 3]), randn(&[2, 2, 2, 2]), randn(&[2])],
    );
    // Unbatched, no bias.
    check(|v| v[0].conv_transpose2d(&v[1], None, p.with_groups(1)), &[randn(&[2, 3, 3]), randn(&[2, 3, 3, 2])]);
}

#[test]
fn conv1d_gradcheck() {
    manual_seed(4);
    let p = Conv1dParams::new().with_stride(2).with_padding(2).with_dilation(2).with_groups(2);
    let (x, w, b) = (randn(&[2, 4, 9]), randn(&[6, 2, 3]), randn(&[6]));
    check(|v| v[0].conv1d(&v[1], Some(&v[2]), p), &[x.clone(), w.clone(), b.clone()]);
    check(|v| v[0].conv1d(&v[1], Some(&v[2]), p), &[strided(&x), w, b]);
    check(|v| v[0].conv1d(&v[1], None, Conv1dParams::new()), &[randn(&[3, 7]), randn(&[2, 3, 4])]);
}

#[test]
fn conv_transpose1d_gradcheck() {
    manual_seed(5);
    let p = ConvTranspose1dParams::new()
        .with_stride(2)
        .with_padding(1)
        .with_output_padding(1)
        .with_dilation(2)
        .with_groups(2);
    let (x, w, b) = (randn(&[2, 4, 5]), randn(&[4, 3, 3]), randn(&[6]));
    check(|v| v[0].conv_transpose1d(&v[1], Some(&v[2]), p), &[x.clone(), w.clone(), b.clone()]);
    check(|v| v[0].conv_transpose1d(&v[1], Some(&v[2]), p), &[strided(&x), w, b]);
    let past = ConvTranspose1dParams::new().with_dilation(3).with_output_padding(2).with_padding(1);
    check(|v| v[0].conv_transpose1d(&v[1], None, past), &[randn(&[3, 4]), randn(&[3, 2, 2])]);
}

#[test]
fn backward_gives_the_tensor_gradients() -> Result<()> {
    manual_seed(6);
    let p = ConvTranspose2dParams::new().with_stride((2, 1)).with_padding((1, 0)).with_output_padding((1, 0));
    let (x, w, b) = (randn(&[2, 3, 4, 2]), randn(&[3, 2, 3, 2]), randn(&[2]));
    let (xv, wv, bv) = (Var::param(x.clone())?, Var::param(w.clone())?, Var::param(b)?);
    let y = xv.conv_transpose2d(&wv, Some(&bv), p)?;
    assert_eq!(y.dims(), &[2, 2, 8, 3]);
    assert_eq!(y.grad_fn_name(), Some("conv_transpose2d"));
    let r = randn(y.dims());
    y.mul(&Var::new(r.clone()))?.sum_all()?.backward()?;
    let gx = r.conv_transpose2d_backward_input(&w, x.dims(), p)?;
    let gw = x.conv_transpose2d_backward_weight(&r, w.dims(), p)?;
    let gb = r.conv2d_backward_bias()?;
    assert_eq!(xv.grad().unwrap().to_vec::<f64>()?, gx.to_vec::<f64>()?);
    assert_eq!(wv.grad().unwrap().to_vec::<f64>()?, gw.to_vec::<f64>()?);
    assert_eq!(bv.grad().unwrap().to_vec::<f64>()?, gb.to_vec::<f64>()?);
    // The 1-d ones record one node of their own name.
    let x1 = Var::param(randn(&[1, 3, 5]))?;
    assert_eq!(x1.conv1d(&Var::new(randn(&[2, 3, 2])), None, Conv1dParams::new())?.grad_fn_name(), Some("conv1d"));
    let t = x1.conv_transpose1d(&Var::new(randn(&[3, 2, 2])), None, ConvTranspose1dParams::new())?;
    assert_eq!(t.grad_fn_name(), Some("conv_transpose1d"));
    Ok(())
}

#[test]
fn errors_come_from_the_tensor_op() {
    let x = Var::new(Tensor::zeros([1, 4, 3, 3], DType::F64).unwrap());
    let w = Var::new(Tensor::zeros([4, 2, 3, 3], DType::F64).unwrap());
    let p = ConvTranspose2dParams::new().with_stride((2, 2)).with_output_padding((2, 0));
    let error = x.conv_transpose2d(&w, None, p).unwrap_err();
    assert!(matches!(error, AutogradError::Tensor(TensorError::Invalid { op: "conv_transpose2d", .. })), "{error:?}");
    // The variant says no more: the message names the axis and the values.
    assert!(
        error.to_string().contains("height: output_padding (2) must be smaller than either stride (2) or dilation (1)"),
        "{error}"
    );
}
/// Regression: `Var::conv2d` on an unbatched `[C_in, H, W]` input ran
/// forward but failed in backward (the gradients expect a batch).
#[test]
fn conv2d_unbatched_backward() {
    manual_seed(7);
    let p = brasa_tensor::Conv2dParams::new().with_padding((1, 0));
    check(|v| v[0].conv2d(&v[1], Some(&v[2]), p), &[randn(&[2, 4, 3]), randn(&[3, 2, 2, 2]), randn(&[3])]);
}
