//! Adaptive 2-d pooling layers: [`AdaptiveAvgPool2d`] and
//! [`AdaptiveMaxPool2d`], PyTorch's `nn.AdaptiveAvgPool2d` /
//! `nn.AdaptiveMaxPool2d`: the output size is fixed and the windows follow
//! from the input's (output row `i` of `out` pools input rows
//! `floor(i·H/out) .. ceil((i+1)·H/out)`, so they may be unequal and
//! overlap). The usual way to feed a classifier head whatever the image size.

use crate::error::{NnError, Result};
use crate::layers::pair::IntoPair;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::Tensor;

/// The output size if both sizes are positive, else an error naming `layer`.
fn checked_size(layer: &'static str, size: (usize, usize)) -> Result<(usize, usize)> {
    if size.0 == 0 || size.1 == 0 {
        return Err(NnError::invalid(layer, format!("output_size must be positive, got {size:?}")));
    }
    Ok(size)
}

/// Checks that the input is `[N, C, H, W]` or `[C, H, W]`.
fn check_input(layer: &'static str, input: &Var) -> Result<()> {
    let dims = input.dims();
    if dims.len() != 3 && dims.len() != 4 {
        return Err(NnError::invalid(
            layer,
            format!("expected an input of shape [N, C, H, W] or [C, H, W], got {dims:?} (rank {})", dims.len()),
        ));
    }
    Ok(())
}

/// The mean of each adaptive window: any `[.., H, W]` input becomes
/// `[.., out_h, out_w]`.
///
/// ```
/// use brasa_nn::{AdaptiveAvgPool2d, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// let pool = AdaptiveAvgPool2d::new(1)?; // global average pooling
/// let y = pool.forward(&Var::new(Tensor::ones([8, 3, 7, 5], DType::F32)?))?;
/// assert_eq!(y.dims(), &[8, 3, 1, 1]);
/// assert_eq!(AdaptiveAvgPool2d::new((3, 2))?.forward(&Var::new(Tensor::ones([3, 7, 5], DType::F32)?))?.dims(), &[3, 3, 2]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    #[module(skip)]
    output_size: (usize, usize),
}

impl AdaptiveAvgPool2d {
    /// Pooling to `output_size` (`7` or `(7, 5)`); zero sizes are an error.
    pub fn new(output_size: impl IntoPair) -> Result<AdaptiveAvgPool2d> {
        Ok(AdaptiveAvgPool2d { output_size: checked_size("AdaptiveAvgPool2d", output_size.into_pair())? })
    }

    /// The output (height, width).
    pub fn output_size(&self) -> (usize, usize) {
        self.output_size
    }
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("AdaptiveAvgPool2d", input)?;
        Ok(input.adaptive_avg_pool2d(self.output_size)?)
    }
}

/// The maximum of each adaptive window; [`AdaptiveMaxPool2d::forward_with_indices`]
/// also returns where each maximum was (PyTorch's `return_indices=True`).
///
/// ```
/// use brasa_nn::{AdaptiveMaxPool2d, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::Tensor;
///
/// let pool = AdaptiveMaxPool2d::new((1, 3))?;
/// let x = Var::new(Tensor::from_vec(vec![3f32, 1.0, 4.0, 1.0, 5.0], [1, 1, 5])?);
/// let (y, indices) = pool.forward_with_indices(&x)?;
/// assert_eq!(y.tensor().to_vec::<f32>()?, [3.0, 4.0, 5.0]);
/// assert_eq!(indices.to_vec::<i64>()?, [0, 2, 4]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool2d {
    #[module(skip)]
    output_size: (usize, usize),
}

impl AdaptiveMaxPool2d {
    /// Pooling to `output_size` (`7` or `(7, 5)`); zero sizes are an error.
    pub fn new(output_size: impl IntoPair) -> Result<AdaptiveMaxPool2d> {
        Ok(AdaptiveMaxPool2d { output_size: checked_size("AdaptiveMaxPool2d", output_size.into_pair())? })
    }

    /// The output (height, width).
    pub fn output_size(&self) -> (usize, usize) {
        self.output_size
    }

    /// The maxima and, as i64, their flat indices `h·W + w` in each input plane.
    pub fn forward_with_indices(&self, input: &Var) -> Result<(Var, Tensor)> {
        check_input("AdaptiveMaxPool2d", input)?;
        Ok(input.adaptive_max_pool2d(self.output_size)?)
    }
}

impl Module for AdaptiveMaxPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(self.forward_with_indices(input)?.0)
    }
}
