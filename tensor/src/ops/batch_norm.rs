//! Batch normalisation's fused passes (PyTorch's `batch_norm_stats`,
//! `batch_norm_elemt`, `batch_norm_backward_reduce` and
//! `batch_norm_backward_elemt`): an input `[N, C, ...]` is seen as
//! `[N, C, S]` (a channels-last one as `[N·H·W, C, 1]`, and its results
//! stay channels-last), and each pass is one trip over its memory on the device
//! ([`crate::backend::DeviceOps::batch_norm_stats`] and friends) rather than a
//! chain of broadcast elementwise ops and reductions. Inputs of any float
//! dtype are read as they are — a bf16 activation is never widened into a
//! copy — and computed in f32 (f64 for f64); per-channel results are `[C]`
//! in that compute dtype, elementwise results in the input's dtype.
//!
//! ```
//! use brasa_tensor::{DType, Tensor};
//! // N = 2, C = 2: columns are the channels.
//! let x = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], [2, 2])?;
//! let (mean, var) = x.batch_norm_stats()?;
//! assert_eq!(mean.to_vec::<f32>()?, [2.0, 20.0]);
//! assert_eq!(var.to_vec::<f32>()?, [1.0, 100.0]);
//! let invstd = var.rsqrt()?;
//! let y = x.batch_norm_elemt(&mean, &invstd, None, None)?;
//! assert_eq!(y.to_vec::<f32>()?, [-1.0, -1.0, 1.0, 1.0]);
//! // The gradient of Σ y is 0 (each channel of y sums to 0).
//! let ones = Tensor::ones([2, 2], DType::F32)?;
//! let (sum_dy, sum_dy_xmu) = ones.batch_norm_backward_reduce(&x, &mean)?;
//! assert_eq!(sum_dy.to_vec::<f32>()?, [2.0, 2.0]);
//! let dx = ones.batch_norm_backward_elemt(&x, &mean, &invstd, None, &sum_dy, &sum_dy_xmu)?;
//! assert!(dx.to_vec::<f32>()?.iter().all(|d| d.abs() < 1e-6));
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::{ops_for, BatchNormBackwardElemt};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::{expect_float, same_device};
use crate::ops::memory_format::{TO_NCHW, TO_NHWC};
use crate::tensor::Tensor;

/// The dtype a normalisation of `dtype` computes in.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `(N, C, S)` of an input `[N, C, ...]`.
fn channel_dims(op: &'static str, x: &Tensor) -> Result<[usize; 3]> {
    expect_float(op, x)?;
    let dims = x.dims();
    if dims.len() < 2 {
        return Err(TensorError::invalid(
            op,
            format!("expected an input of shape [N, C, ...] (rank 2 or more), got {dims:?}"),
        ));
    }
    Ok([dims[0], dims[1], dims[2..].iter().product()])
}

/// How the passes see an input `[N, C, ...]`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// As a row-major `[N, C, S]`.
    Ncs,
    /// A channels-last `[N, C, H, W]` as `[N·H·W, C, 1]`: the same
    /// per-channel passes over the same memory in NHWC order, so a
    /// channels-last activation is neither copied into NCHW nor handed on
    /// row-major (PyTorch's batch norm keeps the memory format too).
    Nhwc,
}

impl Seen {
    /// How the passes see `x`, an input or a gradient of its shape.
    fn of(x: &Tensor) -> Seen {
        if x.is_strictly_channels_last() {
            Seen::Nhwc
        } else {
            Seen::Ncs
        }
    }

    /// `x` (`[N, C, ...]`, of `(N, C, S)` dims) as a contiguous tensor of
    /// `dtype` the passes take (a view when it already is one; a copy in
    /// this order otherwise).
    fn view(self, x: &Tensor, [n, c, s]: [usize; 3], dtype: DType) -> Result<Tensor> {
        match self {
            Seen::Ncs => x.reshape(&[n as isize, c as isize, s as isize])?.to_dtype(dtype)?.contiguous(),
            Seen::Nhwc => {
                x.to_dtype(dtype)?.permute(&TO_NHWC)?.reshape(&[(n * s) as isize, c as isize, 1])?.contiguous()
            }
        }
    }

    /// An element-wise pass's result, seen again with `like`'s shape
    /// (channels-last for [`Seen::Nhwc`]).
    fn back(self, y: Tensor, like: &Tensor) -> Result<Tensor> {
        let dims = like.dims();
        match self {
            Seen::Ncs => y.reshape(&dims.iter().map(|&d| d as isize).collect::<Vec<_>>()),
            Seen::Nhwc => y.reshape(&[dims[0], dims[2], dims[3], dims[1]].map(|d| d as isize))?.permute(&TO_NCHW),
        }
    }
}

/// A per-channel operand as a contiguous `[C]` tensor in `dtype`, checked.
fn per_channel(op: &'static str, what: &str, t: &Tensor, channels: usize, dtype: DType) -> Result<Tensor> {
    expect_float(op, t)?;
    if t.numel() != channels || t.rank() > 1 {
        return Err(TensorError::invalid(
            op,
            format!("{what} must have shape [{channels}] (one value per channel), got {:?}", t.dims()),
        ));
    }
    t.reshape(&[channels as isize])?.to_dtype(dtype)?.contiguous()
}

impl Tensor {
    /// Per channel (dim 1) of `self` (`[N, C, ...]`), the mean and the
    /// biased variance over every other dim, as two `[C]` tensors in f32
    /// (f64 for f64 input). Unlike PyTorch's `batch_norm_stats`, which
    /// returns `invstd` for one `eps`, this returns the variance, from which
    /// both `invstd` and the running (unbiased) variance follow exactly.
    pub fn batch_norm_stats(&self) -> Result<(Tensor, Tensor)> {
        const OP: &str = "batch_norm_stats";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let dims = channel_dims(OP, self)?;
        let device = same_device(OP, &[self])?;
        let x = Seen::of(self).view(self, dims, self.dtype())?;
        ops_for(device)?.batch_norm_stats(&x)
    }

    /// `y = (x − mean) · invstd · weight + bias` per channel (dim 1) of
    /// `self`, in `self`'s dtype, computed in f32 (f64 for f64). `mean`,
    /// `invstd`, `weight` and `bias` hold one value per channel (`[C]`, any
    /// float dtype); a missing weight is 1, a missing bias 0.
    pub fn batch_norm_elemt(
        &self,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        const OP: &str = "batch_norm_elemt";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let dims = channel_dims(OP, self)?;
        let operands: Vec<&Tensor> = [self, mean, invstd].into_iter().chain(weight).chain(bias).collect();
        let device = same_device(OP, &operands)?;
        let (c, dtype) = (dims[1], compute_dtype(self.dtype()));
        let mean = per_channel(OP, "mean", mean, c, dtype)?;
        let mut scale = per_channel(OP, "invstd", invstd, c, dtype)?;
        if let Some(w) = weight {
            scale = scale.mul(&per_channel(OP, "weight", w, c, dtype)?)?;
        }
        let shift = match bias {
            Some(b) => per_channel(OP, "bias", b, c, dtype)?,
            None => Tensor::zeros_on([c], dtype, device)?,
        };
        let seen = Seen::of(self);
        let x = seen.view(self, dims, self.dtype())?;
        let y = ops_for(device)?.batch_norm_elemt(&x, &mean, &scale, &shift)?;
        seen.back(y, self)
    }

    /// From `self`, the gradient of a batch normalisation's output, and its
    /// `input` and per-channel `mean`: per channel `Σ dy` (the bias's
    /// gradient) and `Σ dy · (x − mean)` (times `invstd`, the weight's), as
    /// `[C]` tensors in the compute dtype (PyTorch's
    /// `batch_norm_backward_reduce`).
    pub fn batch_norm_backward_reduce(&self, input: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)> {
        const OP: &str = "batch_norm_backward_reduce";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let dims = check_gradient(OP, self, input)?;
        let device = same_device(OP, &[self, input, mean])?;
        let dtype = compute_dtype(input.dtype());
        let mean = per_channel(OP, "mean", mean, dims[1], dtype)?;
        // Both in the input's order (a gradient laid out otherwise is copied).
        let seen = Seen::of(input);
        let (dy, x) = (seen.view(self, dims, input.dtype())?, seen.view(input, dims, input.dtype())?);
        ops_for(device)?.batch_norm_backward_reduce(&dy, &x, &mean)
    }

    /// The input's gradient of a batch normalisation that used the batch's
    /// own statistics: `dx = invstd · w · (dy − Σdy/M − (x − mean) · invstd² ·
    /// Σdy(x − mean)/M)` with `M = N · S` (PyTorch's
    /// `batch_norm_backward_elemt`), from `self` (`dy`) and what
    /// [`Tensor::batch_norm_backward_reduce`] returned; in `input`'s dtype.
    /// (With running statistics the gradient is `dy · invstd · w`:
    /// [`Tensor::batch_norm_elemt`] of `dy` with a zero mean.)
    pub fn batch_norm_backward_elemt(
        &self,
        input: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        sum_dy: &Tensor,
        sum_dy_xmu: &Tensor,
    ) -> Result<Tensor> {
        const OP: &str = "batch_norm_backward_elemt";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let dims = check_gradient(OP, self, input)?;
        let operands: Vec<&Tensor> =
            [self, input, mean, invstd, sum_dy, sum_dy_xmu].into_iter().chain(weight).collect();
        let device = same_device(OP, &operands)?;
        let (c, dtype) = (dims[1], compute_dtype(input.dtype()));
        let count = (dims[0] * dims[2]) as f64;
        let mean = per_channel(OP, "mean", mean, c, dtype)?;
        let invstd = per_channel(OP, "invstd", invstd, c, dtype)?;
        let scale = match weight {
            Some(w) => invstd.mul(&per_channel(OP, "weight", w, c, dtype)?)?,
            None => invstd.clone(),
        };
        let mean_dy = per_channel(OP, "sum_dy", sum_dy, c, dtype)?.mul_scalar(1.0 / count)?;
        let k =
            per_channel(OP, "sum_dy_xmu", sum_dy_xmu, c, dtype)?.mul(&invstd.mul(&invstd)?)?.mul_scalar(1.0 / count)?;
        let seen = Seen::of(input);
        let (dy, x) = (seen.view(self, dims, input.dtype())?, seen.view(input, dims, input.dtype())?);
        let args = BatchNormBackwardElemt { dy: &dy, x: &x, mean: &mean, scale: &scale, mean_dy: &mean_dy, k: &k };
        let dx = ops_for(device)?.batch_norm_backward_elemt(args)?;
        seen.back(dx, input)
    }
}

/// A gradient must have its input's shape; returns the input's `(N, C, S)`.
fn check_gradient(op: &'static str, dy: &Tensor, input: &Tensor) -> Result<[usize; 3]> {
    expect_float(op, dy)?;
    let dims = channel_dims(op, input)?;
    if dy.dims() != input.dims() {
        return Err(TensorError::invalid(
            op,
            format!("the gradient has shape {:?} but the input {:?}", dy.dims(), input.dims()),
        ));
    }
    Ok(dims)
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

    /// Channels-last inputs give the row-major passes' values (to the
    /// rounding of a different summation order) and channels-last results;
    /// a gradient in the other layout is taken too.
    #[test]
    fn channels_last_inputs_stay_channels_last() {
        let x = Tensor::randn([6, 5, 7, 9], DType::F32).unwrap().mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap();
        let g = Tensor::randn([6, 5, 7, 9], DType::F32).unwrap();
        let w = Tensor::randn([5], DType::F32).unwrap();
        let b = Tensor::randn([5], DType::F32).unwrap();
        let (xc, gc) = (x.to_channels_last().unwrap(), g.to_channels_last().unwrap());
        let close = |a: &Tensor, want: &Tensor, tol: f64| close(a, &want.to_dtype(DType::F64).unwrap(), tol);
        let (m, v) = x.batch_norm_stats().unwrap();
        let (mc, vc) = xc.batch_norm_stats().unwrap();
        close(&mc, &m, 1e-5);
        close(&vc, &v, 1e-5);
        let invstd = v.add_scalar(1e-5).unwrap().rsqrt().unwrap();
        let y = x.batch_norm_elemt(&m, &invstd, Some(&w), Some(&b)).unwrap();
        let yc = xc.batch_norm_elemt(&m, &invstd, Some(&w), Some(&b)).unwrap();
        assert!(yc.is_channels_last() && !yc.is_contiguous(), "strides {:?}", yc.strides());
        close(&yc, &y, 1e-5);
        let (sum_dy, sum_dy_xmu) = g.batch_norm_backward_reduce(&x, &m).unwrap();
        for dy in [&gc, &g] {
            let (sc, sxc) = dy.batch_norm_backward_reduce(&xc, &m).unwrap();
            close(&sc, &sum_dy, 1e-4);
            close(&sxc, &sum_dy_xmu, 1e-4);
            let dx = g.batch_norm_backward_elemt(&x, &m, &invstd, Some(&w), &sum_dy, &sum_dy_xmu).unwrap();
            let dxc = dy.batch_norm_backward_elemt(&xc, &m, &invstd, Some(&w), &sum_dy, &sum_dy_xmu).unwrap();
            assert!(dxc.is_channels_last() && !dxc.is_contiguous(), "strides {:?}", dxc.strides());
            close(&dxc, &dx, 1e-5);
        }
    }

    /// The passes against the composed ops in f64, for `[N, C]`,
    /// `[N, C, L]` and `[N, C, H, W]`, in every float dtype (half inputs
    /// against the reference of their rounded values), large enough for the
    /// parallel paths too.
    #[test]
    fn fused_passes_match_the_composition() {
        for shape in [vec![64usize, 5], vec![4, 3, 7], vec![16, 8, 24, 24]] {
            let x =
                Tensor::randn(shape.as_slice(), DType::F64).unwrap().mul_scalar(2.0).unwrap().add_scalar(3.0).unwrap();
            let g = Tensor::randn(shape.as_slice(), DType::F64).unwrap();
            let c = shape[1];
            let w = Tensor::randn([c], DType::F64).unwrap();
            let b = Tensor::randn([c], DType::F64).unwrap();
            let reduce: Vec<isize> = (0..shape.len() as isize).filter(|&d| d != 1).collect();
            let mut bshape = vec![1isize; shape.len()];
            bshape[1] = c as isize;
            let per = |t: &Tensor| t.reshape(&bshape).unwrap();
            for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-4), (DType::BF16, 2e-2), (DType::F16, 5e-3)] {
                let xd = x.to_dtype(dtype).unwrap();
                let gd = g.to_dtype(dtype).unwrap();
                let (x64, g64) = (xd.to_dtype(DType::F64).unwrap(), gd.to_dtype(DType::F64).unwrap());
                let mean = x64.mean(&reduce, true).unwrap();
                let var = x64.var_with_correction(&reduce, 0, true).unwrap();
                let invstd = var.add_scalar(1e-5).unwrap().rsqrt().unwrap();
                let xhat = x64.sub(&mean).unwrap().mul(&invstd).unwrap();

                let (m, v) = xd.batch_norm_stats().unwrap();
                assert_eq!(m.dtype(), if dtype == DType::F64 { DType::F64 } else { DType::F32 });
                close(&m, &mean.reshape(&[c as isize]).unwrap(), tol);
                close(&v, &var.reshape(&[c as isize]).unwrap(), tol);

                let inv = invstd.reshape(&[c as isize]).unwrap();
                let m64 = mean.reshape(&[c as isize]).unwrap();
                let y = xd.batch_norm_elemt(&m64, &inv, Some(&w), Some(&b)).unwrap();
                assert_eq!(y.dtype(), dtype);
                close(&y, &xhat.mul(&per(&w)).unwrap().add(&per(&b)).unwrap(), tol);

                let (sum_dy, sum_dy_xmu) = gd.batch_norm_backward_reduce(&xd, &m64).unwrap();
                close(&sum_dy, &g64.sum(&reduce, false).unwrap(), tol * 10.0);
                let want_xmu = g64.mul(&x64.sub(&mean).unwrap()).unwrap().sum(&reduce, false).unwrap();
                close(&sum_dy_xmu, &want_xmu, tol * 10.0);

                let dx = gd.batch_norm_backward_elemt(&xd, &m64, &inv, Some(&w), &sum_dy, &sum_dy_xmu).unwrap();
                assert_eq!(dx.dtype(), dtype);
                // dx = w·invstd·(g − mean(g) − x̂·mean(g·x̂)).
                let want = g64
                    .sub(&g64.mean(&reduce, true).unwrap())
                    .unwrap()
                    .sub(&xhat.mul(&g64.mul(&xhat).unwrap().mean(&reduce, true).unwrap()).unwrap())
                    .unwrap()
                    .mul(&per(&w).mul(&invstd).unwrap())
                    .unwrap();
                close(&dx, &want, tol * 10.0);
            }
        }
    }

    #[test]
    fn bad_operands_are_named() {
        let x = Tensor::zeros([4, 3], DType::F32).unwrap();
        let error =
            invalid(Tensor::zeros([4], DType::F32).unwrap().batch_norm_stats().unwrap_err(), "batch_norm_stats");
        assert!(error.contains("rank 2 or more") && error.contains("[4]"), "{error}");
        let two = Tensor::zeros([2], DType::F32).unwrap();
        let three = Tensor::ones([3], DType::F32).unwrap();
        let error = invalid(x.batch_norm_elemt(&two, &three, None, None).unwrap_err(), "batch_norm_elemt");
        assert!(error.contains("mean must have shape [3]") && error.contains("[2]"), "{error}");
        let error = invalid(x.batch_norm_elemt(&three, &three, Some(&two), None).unwrap_err(), "batch_norm_elemt");
        assert!(error.contains("weight must have shape [3]"), "{error}");
        let g = Tensor::zeros([3, 4], DType::F32).unwrap();
        let error = invalid(g.batch_norm_backward_reduce(&x, &three).unwrap_err(), "batch_norm_backward_reduce");
        assert!(error.contains("gradient has shape [3, 4]"), "{error}");
        let ints = Tensor::zeros([4, 3], DType::I64).unwrap();
        let error = ints.batch_norm_stats().unwrap_err();
        assert!(matches!(error, TensorError::UnsupportedDType { dtype: DType::I64, .. }), "{error:?}");
        // Empty batches: statistics of nothing are 0 here (callers refuse them).
        let (m, _) = Tensor::zeros([0, 3], DType::F32).unwrap().batch_norm_stats().unwrap();
        assert_eq!(m.dims(), [3]);
    }
}
