//! 2-d pooling layers: [`MaxPool2d`] and [`AvgPool2d`] over `[N, C, H, W]`
//! (or `[C, H, W]`) inputs, PyTorch's `nn.MaxPool2d` / `nn.AvgPool2d`: a
//! kernel, a stride (by default the kernel, so windows do not overlap) and
//! zero padding on each side.

use crate::error::{NnError, Result};
use crate::layers::pair::IntoPair;
use crate::module::Module;
use brasa_autograd::Var;

/// Checks a pooling geometry as PyTorch does.
fn check_geometry(
    layer: &'static str,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<()> {
    if kernel.0 == 0 || kernel.1 == 0 || stride.0 == 0 || stride.1 == 0 {
        return Err(NnError::invalid(
            layer,
            format!("kernel and stride must be positive, got kernel {kernel:?} and stride {stride:?}"),
        ));
    }
    if 2 * padding.0 > kernel.0 || 2 * padding.1 > kernel.1 {
        return Err(NnError::invalid(
            layer,
            format!("padding must be at most half the kernel, got padding {padding:?} for kernel {kernel:?}"),
        ));
    }
    Ok(())
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

/// The maximum of each window.
///
/// ```
/// use brasa_nn::{MaxPool2d, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// let pool = MaxPool2d::new(2)?;
/// let y = pool.forward(&Var::new(Tensor::zeros([8, 3, 32, 32], DType::F32)?))?;
/// assert_eq!(y.dims(), &[8, 3, 16, 16]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    #[module(skip)]
    kernel: (usize, usize),
    #[module(skip)]
    stride: (usize, usize),
    #[module(skip)]
    padding: (usize, usize),
}

impl MaxPool2d {
    /// Pooling over `kernel` windows (`2` or `(2, 3)`), stride = kernel, no padding.
    pub fn new(kernel: impl IntoPair) -> Result<MaxPool2d> {
        let kernel = kernel.into_pair();
        check_geometry("MaxPool2d", kernel, kernel, (0, 0))?;
        Ok(MaxPool2d { kernel, stride: kernel, padding: (0, 0) })
    }

    /// With this stride.
    pub fn stride(self, stride: impl IntoPair) -> Result<MaxPool2d> {
        let stride = stride.into_pair();
        check_geometry("MaxPool2d", self.kernel, stride, self.padding)?;
        Ok(MaxPool2d { stride, ..self })
    }

    /// With this padding (at most half the kernel; padding never wins the maximum).
    pub fn padding(self, padding: impl IntoPair) -> Result<MaxPool2d> {
        let padding = padding.into_pair();
        check_geometry("MaxPool2d", self.kernel, self.stride, padding)?;
        Ok(MaxPool2d { padding, ..self })
    }

    /// `(kernel, stride, padding)`, each (height, width).
    pub fn geometry(&self) -> ((usize, usize), (usize, usize), (usize, usize)) {
        (self.kernel, self.stride, self.padding)
    }
}

impl Module for MaxPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("MaxPool2d", input)?;
        Ok(input.max_pool2d(self.kernel, self.stride, self.padding)?)
    }
}

/// The mean of each window; with `count_include_pad` (the default) padded
/// zeros count in the divisor.
///
/// ```
/// use brasa_nn::{AvgPool2d, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// let pool = AvgPool2d::new(3)?.stride(1)?.padding(1)?;
/// let y = pool.forward(&Var::new(Tensor::ones([1, 2, 5, 5], DType::F32)?))?;
/// assert_eq!(y.dims(), &[1, 2, 5, 5]);
/// assert_eq!(y.tensor().to_vec::<f32>()?[0], 4.0 / 9.0); // a corner window holds 4 ones
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d {
    #[module(skip)]
    kernel: (usize, usize),
    #[module(skip)]
    stride: (usize, usize),
    #[module(skip)]
    padding: (usize, usize),
    #[module(skip)]
    count_include_pad: bool,
}

impl AvgPool2d {
    /// Averaging over `kernel` windows, stride = kernel, no padding,
    /// counting padding in the divisor.
    pub fn new(kernel: impl IntoPair) -> Result<AvgPool2d> {
        let kernel = kernel.into_pair();
        check_geometry("AvgPool2d", kernel, kernel, (0, 0))?;
        Ok(AvgPool2d { kernel, stride: kernel, padding: (0, 0), count_include_pad: true })
    }

    /// With this stride.
    pub fn stride(self, stride: impl IntoPair) -> Result<AvgPool2d> {
        let stride = stride.into_pair();
        check_geometry("AvgPool2d", self.kernel, stride, self.padding)?;
        Ok(AvgPool2d { stride, ..self })
    }

    /// With this zero padding (at most half the kernel).
    pub fn padding(self, padding: impl IntoPair) -> Result<AvgPool2d> {
        let padding = padding.into_pair();
        check_geometry("AvgPool2d", self.kernel, self.stride, padding)?;
        Ok(AvgPool2d { padding, ..self })
    }

    /// Whether padded zeros count in the divisor (PyTorch's `count_include_pad`).
    pub fn count_include_pad(self, include: bool) -> AvgPool2d {
        AvgPool2d { count_include_pad: include, ..self }
    }

    /// `(kernel, stride, padding)`, each (height, width).
    pub fn geometry(&self) -> ((usize, usize), (usize, usize), (usize, usize)) {
        (self.kernel, self.stride, self.padding)
    }
}

impl Module for AvgPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("AvgPool2d", input)?;
        Ok(input.avg_pool2d(self.kernel, self.stride, self.padding, self.count_include_pad)?)
    }
}
