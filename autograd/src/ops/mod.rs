//! Differentiable operations on [`crate::Var`], one file per family,
//! mirroring brasa-tensor's ops. Each records a node (see
//! [`crate::var::record`]) whose backward uses tensor ops only.

mod activation;
mod adaptive_pool;
mod attention;
mod binary;
mod concat;
mod conv;
mod conv1d;
mod conv_transpose;
mod dropout;
mod index;
mod matmul;
mod pool;
mod reduce;
mod scatter;
mod softmax;
mod unary;
mod views;

pub use attention::SdpaOptions;

use crate::error::Result;
use brasa_tensor::{DType, Tensor};

/// Sums a broadcast gradient back to `dims` (the shape of the input that was
/// broadcast) and converts it to `dtype`.
pub(crate) fn sum_to(grad: &Tensor, dims: &[usize], dtype: DType) -> Result<Tensor> {
    let mut g = grad.clone();
    if g.dims() != dims {
        let lead = g.rank() - dims.len();
        let mut reduce: Vec<isize> = (0..lead as isize).collect();
        for (i, &d) in dims.iter().enumerate() {
            if d == 1 && g.dims()[lead + i] != 1 {
                reduce.push((lead + i) as isize);
            }
        }
        if !reduce.is_empty() {
            g = g.sum(&reduce, true)?;
        }
        let shape: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
        g = g.reshape(&shape)?;
    }
    if g.dtype() != dtype {
        g = g.to_dtype(dtype)?;
    }
    Ok(g)
}

/// A bool mask as 0/1 in `dtype`.
pub(crate) fn mask_as(mask: &Tensor, dtype: DType) -> Result<Tensor> {
    Ok(mask.to_dtype(dtype)?)
}
