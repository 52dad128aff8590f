//! The host's layer normalisation: rows split over rayon's threads, each
//! row one call of `brasa_kernels::norm`. The parameter gradients are summed
//! per fixed group of rows and the groups' partial sums added in order, so
//! results do not depend on how many threads ran.

use crate::backend::host::PARALLEL_MIN_WORK;
use crate::backend::LayerNormBackward;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::norm::{layer_norm_backward_row, layer_norm_row, NormFloat, RowGrads};
use brasa_kernels::scalar::{Accumulator, Float};
use rayon::prelude::*;

const OP: &str = "layer_norm";
const BACKWARD: &str = "layer_norm_backward";

/// Rows whose parameter gradients one partial sum holds: a fixed number, so
/// the order of additions is the same on any number of threads.
const ROWS_PER_PARTIAL: usize = 64;

/// A row of the input and the same row of the output.
type RowPair<'a, F> = (&'a [F], &'a mut [F]);

/// 0 in `F` (named through the kernels' trait: `WithDType` has one too).
fn zero<F: NormFloat>() -> F {
    <F as Accumulator>::ZERO
}

/// The elements of contiguous `t`, as `F`.
pub(super) fn elements<'a, F: WithDType>(op: &'static str, t: &Tensor, data: &'a [F]) -> Result<&'a [F]> {
    let offset = t.layout().offset();
    data.get(offset..offset + t.numel())
        .ok_or_else(|| TensorError::internal(op, format!("{offset}+{} is past {}", t.numel(), data.len())))
}

/// See [`crate::backend::DeviceOps::layer_norm`].
pub(super) fn layer_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    match x.dtype() {
        DType::F32 => forward::<f32>(x, weight, bias, eps),
        DType::F64 => forward::<f64>(x, weight, bias, eps),
        other => Err(TensorError::internal(OP, format!("computes in f32 or f64, got {other}"))),
    }
}

fn forward<F: NormFloat + WithDType>(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let [rows, width] = [x.dims()[0], x.dims()[1]];
    let (xs, ws, bs) = (
        x.storage().read::<F>(OP)?,
        weight.map(|w| w.storage().read::<F>(OP)).transpose()?,
        bias.map(|b| b.storage().read::<F>(OP)).transpose()?,
    );
    let xs = elements(OP, x, &xs)?;
    let w = match (&ws, weight) {
        (Some(data), Some(t)) => Some(elements(OP, t, data)?),
        _ => None,
    };
    let b = match (&bs, bias) {
        (Some(data), Some(t)) => Some(elements(OP, t, data)?),
        _ => None,
    };
    let eps = <F as Float>::from_f64(eps);
    let mut stats = vec![(zero::<F>(), zero::<F>()); rows];
    let out = UninitTensor::like(x, x.dtype(), x.device())?;
    let out = if width == 0 || rows == 0 {
        // Nothing to normalise; each (empty) row's statistics as the kernel gives them.
        for s in &mut stats {
            *s = layer_norm_row(&[], None, None, eps, &mut []).map_err(|e| TensorError::kernel(OP, e))?;
        }
        // SAFETY: an empty output has no element to write.
        unsafe { out.init_with::<F>(OP, |_| Ok(()))? }
    } else {
        let row = |((x, out), stat): (RowPair<'_, F>, &mut (F, F))| {
            *stat = layer_norm_row(x, w, b, eps, out).map_err(|e| TensorError::kernel(OP, e))?;
            Ok::<(), TensorError>(())
        };
        // SAFETY: the rows tile the output and each call writes its whole row.
        unsafe {
            out.init_with::<F>(OP, |out| {
                if xs.len() < PARALLEL_MIN_WORK {
                    xs.chunks(width).zip(out.chunks_mut(width)).zip(stats.iter_mut()).try_for_each(row)
                } else {
                    let per_task = (1usize << 14).div_ceil(width).max(1);
                    xs.par_chunks(width)
                        .zip(out.par_chunks_mut(width))
                        .zip(stats.par_iter_mut())
                        .with_min_len(per_task)
                        .try_for_each(row)
                }
            })?
        }
    };
    let (mean, rstd): (Vec<F>, Vec<F>) = stats.into_iter().unzip();
    let mean = UninitTensor::new([rows], x.dtype(), x.device())?.copy_from_slice(OP, &mean)?;
    let rstd = UninitTensor::new([rows], x.dtype(), x.device())?.copy_from_slice(OP, &rstd)?;
    Ok((out, mean, rstd))
}

/// See [`crate::backend::DeviceOps::layer_norm_backward`].
pub(super) fn layer_norm_backward(args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]> {
    match args.x.dtype() {
        DType::F32 => backward::<f32>(args, needs),
        DType::F64 => backward::<f64>(args, needs),
        other => Err(TensorError::internal(BACKWARD, format!("computes in f32 or f64, got {other}"))),
    }
}

/// One group of rows' parameter-gradient partial sums.
struct Partial<F> {
    dw: Vec<F>,
    db: Vec<F>,
}

fn backward<F: NormFloat + WithDType>(args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]> {
    let LayerNormBackward { grad, x, mean, rstd, weight } = args;
    let [rows, width] = [x.dims()[0], x.dims()[1]];
    let reads = (
        grad.storage().read::<F>(BACKWARD)?,
        x.storage().read::<F>(BACKWARD)?,
        mean.storage().read::<F>(BACKWARD)?,
        rstd.storage().read::<F>(BACKWARD)?,
    );
    let (gs, xs, means, rstds) = (
        elements(BACKWARD, grad, &reads.0)?,
        elements(BACKWARD, x, &reads.1)?,
        elements(BACKWARD, mean, &reads.2)?,
        elements(BACKWARD, rstd, &reads.3)?,
    );
    let ws = weight.map(|w| w.storage().read::<F>(BACKWARD)).transpose()?;
    let w = match (&ws, weight) {
        (Some(data), Some(t)) => Some(elements(BACKWARD, t, data)?),
        _ => None,
    };
    let kernel = |e| TensorError::kernel(BACKWARD, e);
    let row_range = |r: usize| r * width..(r + 1) * width;

    let dx = if needs[0] {
        let out = UninitTensor::like(x, x.dtype(), x.device())?;
        let row = |(r, dx): (usize, &mut [F])| {
            let grads = RowGrads { dx: Some(dx), dw: None, db: None };
            layer_norm_backward_row(&gs[row_range(r)], &xs[row_range(r)], means[r], rstds[r], w, grads).map_err(kernel)
        };
        // SAFETY: the rows tile the output and each call overwrites its whole row.
        let dx = unsafe {
            out.init_with::<F>(BACKWARD, |out| {
                if width == 0 {
                    Ok(())
                } else if xs.len() < PARALLEL_MIN_WORK {
                    out.chunks_mut(width).enumerate().try_for_each(row)
                } else {
                    let per_task = (1usize << 14).div_ceil(width).max(1);
                    out.par_chunks_mut(width).enumerate().with_min_len(per_task).try_for_each(row)
                }
            })?
        };
        Some(dx)
    } else {
        None
    };

    let (want_dw, want_db) = (needs[1] && weight.is_some(), needs[2]);
    let (mut dw, mut db) = (None, None);
    if want_dw || want_db {
        let groups = rows.div_ceil(ROWS_PER_PARTIAL);
        let group = |g: usize| -> Result<Partial<F>> {
            let mut partial = Partial {
                dw: if want_dw { vec![zero::<F>(); width] } else { Vec::new() },
                db: if want_db { vec![zero::<F>(); width] } else { Vec::new() },
            };
            for r in g * ROWS_PER_PARTIAL..((g + 1) * ROWS_PER_PARTIAL).min(rows) {
                let grads = RowGrads {
                    dx: None,
                    dw: want_dw.then_some(&mut partial.dw[..]),
                    db: want_db.then_some(&mut partial.db[..]),
                };
                layer_norm_backward_row(&gs[row_range(r)], &xs[row_range(r)], means[r], rstds[r], w, grads)
                    .map_err(kernel)?;
            }
            Ok(partial)
        };
        let partials: Vec<Partial<F>> = if xs.len() < PARALLEL_MIN_WORK {
            (0..groups).map(group).collect::<Result<_>>()?
        } else {
            (0..groups).into_par_iter().map(group).collect::<Result<_>>()?
        };
        let total = |pick: fn(&Partial<F>) -> &Vec<F>| {
            let mut sum = vec![zero::<F>(); width];
            for p in &partials {
                for (s, &v) in sum.iter_mut().zip(pick(p)) {
                    *s = *s + v;
                }
            }
            sum
        };
        if want_dw {
            dw = Some(UninitTensor::new([width], x.dtype(), x.device())?.copy_from_slice(BACKWARD, &total(|p| &p.dw))?);
        }
        if want_db {
            db = Some(UninitTensor::new([width], x.dtype(), x.device())?.copy_from_slice(BACKWARD, &total(|p| &p.db))?);
        }
    }
    Ok([dx, dw, db])
}
