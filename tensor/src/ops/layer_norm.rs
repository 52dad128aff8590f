//! Layer normalisation as one fused op per direction (PyTorch's
//! `native_layer_norm` and `native_layer_norm_backward`): the input is seen
//! as `[rows, width]` with `width` the product of `normalized_shape`, and
//! each row is normalised in one pass by the device
//! ([`crate::backend::DeviceOps::layer_norm`]) rather than by a dozen
//! elementwise ops and reductions. f16 and bf16 are computed in f32, f64 in
//! f64; the output has the input's dtype, the statistics the compute dtype.
//!
//! ```
//! use brasa_tensor::{DType, Tensor};
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 6.0, 8.0], [2, 3])?;
//! let (y, mean, rstd) = x.native_layer_norm(&[3], None, None, 0.0)?;
//! assert_eq!(mean.dims(), [2, 1]);
//! assert_eq!(mean.to_vec::<f32>()?, [2.0, 6.0]);
//! let row = y.to_vec::<f32>()?;
//! assert!((row[0] + 1.2247449).abs() < 1e-6 && row[1].abs() < 1e-6);
//! // The gradient of Σ y is 0 (each row of y sums to 0).
//! let ones = Tensor::ones([2, 3], DType::F32)?;
//! let (dx, _, db) = ones.native_layer_norm_backward(&x, &[3], &mean, &rstd, None, [true, false, true])?;
//! assert!(dx.unwrap().to_vec::<f32>()?.iter().all(|d| d.abs() < 1e-6));
//! assert_eq!(db.unwrap().to_vec::<f32>()?, [2.0, 2.0, 2.0]);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::{ops_for, LayerNormBackward};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::{expect_float, same_device};
use crate::tensor::Tensor;

const OP: &str = "layer_norm";
const BACKWARD: &str = "layer_norm_backward";

/// The dtype a normalisation of `dtype` computes in.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `(rows, width)` of `input` normalised over its trailing `normalized_shape`.
fn rows_and_width(op: &'static str, input: &Tensor, normalized_shape: &[usize]) -> Result<(usize, usize)> {
    let dims = input.dims();
    let k = normalized_shape.len();
    if k == 0 || k > dims.len() || dims[dims.len() - k..] != *normalized_shape {
        return Err(TensorError::invalid(
            op,
            format!(
                "normalized_shape {normalized_shape:?} must be non-empty and match the trailing dims of the input, got input of shape {dims:?}"
            ),
        ));
    }
    let width: usize = normalized_shape.iter().product();
    Ok((input.numel() / width.max(1), width))
}

/// The statistics' shape: the leading dims, then a 1 per normalised dim.
fn stat_dims(input: &Tensor, k: usize) -> Vec<isize> {
    let dims = input.dims();
    dims[..dims.len() - k].iter().map(|&d| d as isize).chain(std::iter::repeat_n(1, k)).collect()
}

/// `t` as a contiguous `[width]` (or `[rows, width]`) tensor in `dtype`.
fn prepared(t: &Tensor, shape: &[isize], dtype: DType) -> Result<Tensor> {
    t.reshape(shape)?.to_dtype(dtype)?.contiguous()
}

/// A per-element parameter's check: float, `normalized_shape`.
fn check_param(op: &'static str, what: &str, param: Option<&Tensor>, normalized_shape: &[usize]) -> Result<()> {
    if let Some(p) = param {
        expect_float(op, p)?;
        if p.dims() != normalized_shape {
            return Err(TensorError::invalid(
                op,
                format!("{what} must have shape {normalized_shape:?}, got {:?}", p.dims()),
            ));
        }
    }
    Ok(())
}

impl Tensor {
    /// Layer normalisation over the trailing `normalized_shape` dims:
    /// `y = (x − mean) / √(var + eps) · weight + bias` per row, with the
    /// biased variance (PyTorch's `torch.native_layer_norm`). Returns `y`
    /// (the input's shape and dtype) and the per-row `mean` and `rstd =
    /// 1/√(var + eps)` (the leading dims followed by a 1 per normalised dim,
    /// in f32 — f64 for f64 input), which [`Tensor::native_layer_norm_backward`]
    /// takes back. `weight` and `bias` have shape `normalized_shape` and may
    /// be of another float dtype than the input (f32 norms in a bf16 model).
    pub fn native_layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        expect_float(OP, self)?;
        let (rows, width) = rows_and_width(OP, self, normalized_shape)?;
        check_param(OP, "weight", weight, normalized_shape)?;
        check_param(OP, "bias", bias, normalized_shape)?;
        if !eps.is_finite() || eps < 0.0 {
            return Err(TensorError::invalid(OP, format!("eps must be finite and non-negative, got {eps}")));
        }
        let operands: Vec<&Tensor> = std::iter::once(self).chain(weight).chain(bias).collect();
        let device = same_device(OP, &operands)?;
        let dtype = compute_dtype(self.dtype());
        let x = prepared(self, &[rows as isize, width as isize], dtype)?;
        let w = weight.map(|w| prepared(w, &[width as isize], dtype)).transpose()?;
        let b = bias.map(|b| prepared(b, &[width as isize], dtype)).transpose()?;
        let (out, mean, rstd) = ops_for(device)?.layer_norm(&x, w.as_ref(), b.as_ref(), eps)?;
        let stats = stat_dims(self, normalized_shape.len());
        let dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        Ok((out.reshape(&dims)?.to_dtype(self.dtype())?, mean.reshape(&stats)?, rstd.reshape(&stats)?))
    }

    /// The gradients of [`Tensor::native_layer_norm`] from `self`, the
    /// output's gradient: those of the input (its shape and dtype), the
    /// weight and the bias (`normalized_shape`, in the compute dtype), each
    /// computed only where `output_mask` asks (PyTorch's
    /// `native_layer_norm_backward`). `mean` and `rstd` are what the forward
    /// returned; `weight` is the forward's (the weight's gradient is `None`
    /// without one).
    pub fn native_layer_norm_backward(
        &self,
        input: &Tensor,
        normalized_shape: &[usize],
        mean: &Tensor,
        rstd: &Tensor,
        weight: Option<&Tensor>,
        output_mask: [bool; 3],
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _range = brasa_profile::record_op(BACKWARD, &[self.dims()]);
        expect_float(BACKWARD, self)?;
        expect_float(BACKWARD, input)?;
        if self.dims() != input.dims() {
            return Err(TensorError::invalid(
                BACKWARD,
                format!("the gradient has shape {:?} but the input {:?}", self.dims(), input.dims()),
            ));
        }
        let (rows, width) = rows_and_width(BACKWARD, input, normalized_shape)?;
        check_param(BACKWARD, "weight", weight, normalized_shape)?;
        for (what, stat) in [("mean", mean), ("rstd", rstd)] {
            if stat.numel() != rows {
                return Err(TensorError::invalid(
                    BACKWARD,
                    format!("{what} must hold one value per row ({rows}), got shape {:?}", stat.dims()),
                ));
            }
        }
        let operands: Vec<&Tensor> = [self, input, mean, rstd].into_iter().chain(weight).collect();
        let device = same_device(BACKWARD, &operands)?;
        let dtype = compute_dtype(input.dtype());
        let rows_shape = [rows as isize, width as isize];
        let (g, x) = (prepared(self, &rows_shape, dtype)?, prepared(input, &rows_shape, dtype)?);
        let (mean, rstd) = (prepared(mean, &[rows as isize], dtype)?, prepared(rstd, &[rows as isize], dtype)?);
        let w = weight.map(|w| prepared(w, &[width as isize], dtype)).transpose()?;
        let args = LayerNormBackward { grad: &g, x: &x, mean: &mean, rstd: &rstd, weight: w.as_ref() };
        let [dx, dw, db] = ops_for(device)?.layer_norm_backward(args, output_mask)?;
        let dims: Vec<isize> = input.dims().iter().map(|&d| d as isize).collect();
        let shape: Vec<isize> = normalized_shape.iter().map(|&d| d as isize).collect();
        let dx = dx.map(|dx| dx.reshape(&dims)?.to_dtype(input.dtype())).transpose()?;
        let dw = dw.map(|dw| dw.reshape(&shape)).transpose()?;
        let db = db.map(|db| db.reshape(&shape)).transpose()?;
        Ok((dx, dw, db))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::common::close;
    use crate::{DType, Tensor, TensorError};

    /// The message of `error`, after checking that it is an `Invalid` of
    /// `op`: each check below is on the operand and shape the message names.
    fn invalid(error: TensorError, op: &str) -> String {
        assert!(matches!(&error, TensorError::Invalid { op: o, .. } if *o == op), "{error:?}");
        error.to_string()
    }

    /// The composition the fused op replaces, in f64.
    fn composed(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
        let mean = x.mean(&[-1], true).unwrap();
        let var = x.var_with_correction(&[-1], 0, true).unwrap();
        let xhat = x.sub(&mean).unwrap().mul(&var.add_scalar(eps).unwrap().rsqrt().unwrap()).unwrap();
        xhat.mul(w).unwrap().add(b).unwrap()
    }

    #[test]
    fn fused_forward_matches_the_composition_in_every_float_dtype() {
        // Enough rows to take the parallel path too.
        for rows in [3usize, 600] {
            let x = Tensor::randn([rows, 2, 48], DType::F64).unwrap().mul_scalar(3.0).unwrap().add_scalar(5.0).unwrap();
            let w = Tensor::randn([2, 48], DType::F64).unwrap();
            let b = Tensor::randn([2, 48], DType::F64).unwrap();
            let flat = |t: &Tensor| t.reshape(&[-1, 96]).unwrap();
            let want = composed(&flat(&x), &flat(&w), &flat(&b), 1e-5).reshape(&[rows as isize, 2, 48]).unwrap();
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 5e-3)] {
                let xd = x.to_dtype(dtype).unwrap();
                let want = if dtype == DType::F64 {
                    want.clone()
                } else {
                    // The reference from the rounded input.
                    composed(&flat(&xd.to_dtype(DType::F64).unwrap()), &flat(&w), &flat(&b), 1e-5)
                        .reshape(&[rows as isize, 2, 48])
                        .unwrap()
                };
                // f32 weights with a narrower input, as a to_half model has
                // (f64 keeps its own, so the comparison stays exact).
                let wd = if dtype == DType::F64 { w.clone() } else { w.to_dtype(DType::F32).unwrap() };
                let (y, mean, rstd) = xd.native_layer_norm(&[2, 48], Some(&wd), Some(&b), 1e-5).unwrap();
                assert_eq!(y.dtype(), dtype);
                assert_eq!(mean.dims(), [rows, 1, 1]);
                assert_eq!(rstd.dtype(), if dtype == DType::F64 { DType::F64 } else { DType::F32 });
                close(&y, &want, tol);
            }
        }
    }

    #[test]
    fn fused_backward_matches_the_gradients_of_the_composition() {
        // Σ (y · g) differentiated by hand through the composition:
        // dx = rstd (ĝ − mean ĝ − x̂ mean(ĝ x̂)), dw = Σ g x̂, db = Σ g.
        let x = Tensor::randn([300, 40], DType::F64).unwrap();
        let g = Tensor::randn([300, 40], DType::F64).unwrap();
        let w = Tensor::randn([40], DType::F64).unwrap();
        let (_, mean, rstd) = x.native_layer_norm(&[40], Some(&w), None, 1e-5).unwrap();
        let (dx, dw, db) = g.native_layer_norm_backward(&x, &[40], &mean, &rstd, Some(&w), [true; 3]).unwrap();
        let xhat = x.sub(&mean).unwrap().mul(&rstd).unwrap();
        let gh = g.mul(&w).unwrap();
        let want_dx = gh
            .sub(&gh.mean(&[1], true).unwrap())
            .unwrap()
            .sub(&xhat.mul(&gh.mul(&xhat).unwrap().mean(&[1], true).unwrap()).unwrap())
            .unwrap()
            .mul(&rstd)
            .unwrap();
        close(&dx.unwrap(), &want_dx, 1e-10);
        close(&dw.unwrap(), &g.mul(&xhat).unwrap().sum(&[0], false).unwrap(), 1e-10);
        close(&db.unwrap(), &g.sum(&[0], false).unwrap(), 1e-10);
        // Only what is asked; no weight, no weight gradient.
        let (dx, dw, db) = g.native_layer_norm_backward(&x, &[40], &mean, &rstd, None, [false, true, false]).unwrap();
        assert!(dx.is_none() && dw.is_none() && db.is_none());
    }

    #[test]
    fn bad_operands_are_named() {
        let x = Tensor::zeros([2, 3], DType::F32).unwrap();
        let error = invalid(x.native_layer_norm(&[4], None, None, 1e-5).unwrap_err(), "layer_norm");
        assert!(error.contains("normalized_shape [4]") && error.contains("[2, 3]"), "{error}");
        let w = Tensor::zeros([4], DType::F32).unwrap();
        let error = invalid(x.native_layer_norm(&[3], Some(&w), None, 1e-5).unwrap_err(), "layer_norm");
        assert!(error.contains("weight must have shape [3], got [4]"), "{error}");
        let error = invalid(x.native_layer_norm(&[3], None, None, f64::NAN).unwrap_err(), "layer_norm");
        assert!(error.contains("eps"), "{error}");
        let ints = Tensor::zeros([2, 3], DType::I64).unwrap();
        let error = ints.native_layer_norm(&[3], None, None, 1e-5).unwrap_err();
        assert!(matches!(error, TensorError::UnsupportedDType { dtype: DType::I64, .. }), "{error:?}");
        let (_, mean, rstd) = x.native_layer_norm(&[3], None, None, 1e-5).unwrap();
        let g = Tensor::zeros([3, 2], DType::F32).unwrap();
        let error = g.native_layer_norm_backward(&x, &[3], &mean, &rstd, None, [true; 3]).unwrap_err();
        let error = invalid(error, "layer_norm_backward");
        assert!(error.contains("gradient has shape [3, 2]"), "{error}");
        let empty = Tensor::zeros([0, 3], DType::F32).unwrap();
        let (y, mean, _) = empty.native_layer_norm(&[3], None, None, 1e-5).unwrap();
        assert_eq!((y.dims(), mean.dims()), (&[0usize, 3][..], &[0usize, 1][..]));
    }
}
