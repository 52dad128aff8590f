//! 2-d pooling layers: [`MaxPool2d`] and [`AvgPool2d`] over `[N, C, H, W]`
//! (or `[C, H, W]`) inputs, PyTorch's `nn.MaxPool2d` / `nn.AvgPool2d`: a
//! kernel, a stride (by default the kernel, so windows do not overlap),
//! zero padding on each side, and `ceil_mode` (output sizes rounded up, the
//! last window clipped).

use crate::error::{NnError, Result};
use crate::layers::pair::IntoPair;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::Pool2dParams;

/// A pooling geometry: kernel, stride and padding, each (height, width),
/// and whether output sizes round up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    ceil_mode: bool,
}

impl Window {
    /// Stride = kernel, no padding.
    fn new(layer: &'static str, kernel: (usize, usize)) -> Result<Window> {
        Window { kernel, stride: kernel, padding: (0, 0), ceil_mode: false }.checked(layer)
    }

    /// The window if PyTorch accepts it, else an error naming `layer`.
    fn checked(self, layer: &'static str) -> Result<Window> {
        let Window { kernel, stride, padding, .. } = self;
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
        Ok(self)
    }

    /// As the tensor ops take it.
    fn params(self) -> Pool2dParams {
        let Window { kernel, stride, padding, ceil_mode } = self;
        Pool2dParams { kernel, stride, padding, ceil_mode }
    }
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

/// The builder methods both pooling layers share (`stride`, `padding`,
/// `ceil_mode`, `geometry`, `params`); `$layer` has a `window: Window` field.
macro_rules! window_builders {
    ($layer:ident, $padding_doc:literal) => {
        impl $layer {
            /// With this stride.
            pub fn stride(mut self, stride: impl IntoPair) -> Result<$layer> {
                self.window = Window { stride: stride.into_pair(), ..self.window }.checked(stringify!($layer))?;
                Ok(self)
            }

            #[doc = $padding_doc]
            pub fn padding(mut self, padding: impl IntoPair) -> Result<$layer> {
                self.window = Window { padding: padding.into_pair(), ..self.window }.checked(stringify!($layer))?;
                Ok(self)
            }

            /// Rounding output sizes up (`true`: PyTorch's `ceil_mode=True`, a
            /// last window may run past the padded input and is clipped) or
            /// down (`false`, the default).
            pub fn ceil_mode(mut self, ceil_mode: bool) -> $layer {
                self.window.ceil_mode = ceil_mode;
                self
            }

            /// `(kernel, stride, padding)`, each (height, width).
            pub fn geometry(&self) -> ((usize, usize), (usize, usize), (usize, usize)) {
                let Window { kernel, stride, padding, .. } = self.window;
                (kernel, stride, padding)
            }

            /// The whole window, `ceil_mode` included, as the tensor ops take it.
            pub fn params(&self) -> Pool2dParams {
                self.window.params()
            }
        }
    };
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
/// // ceil_mode: a 5x5 input gives 3x3, the last windows clipped to one row / column.
/// let ceil = MaxPool2d::new(2)?.ceil_mode(true);
/// assert_eq!(ceil.forward(&Var::new(Tensor::zeros([1, 3, 5, 5], DType::F32)?))?.dims(), &[1, 3, 3, 3]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    #[module(skip)]
    window: Window,
}

impl MaxPool2d {
    /// Pooling over `kernel` windows (`2` or `(2, 3)`), stride = kernel, no padding.
    pub fn new(kernel: impl IntoPair) -> Result<MaxPool2d> {
        Ok(MaxPool2d { window: Window::new("MaxPool2d", kernel.into_pair())? })
    }
}

window_builders!(MaxPool2d, "With this padding (at most half the kernel; padding never wins the maximum).");

impl Module for MaxPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("MaxPool2d", input)?;
        Ok(input.max_pool2d_with(self.window.params())?)
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
    window: Window,
    #[module(skip)]
    count_include_pad: bool,
}

impl AvgPool2d {
    /// Averaging over `kernel` windows, stride = kernel, no padding,
    /// counting padding in the divisor.
    pub fn new(kernel: impl IntoPair) -> Result<AvgPool2d> {
        Ok(AvgPool2d { window: Window::new("AvgPool2d", kernel.into_pair())?, count_include_pad: true })
    }

    /// Whether padded zeros count in the divisor (PyTorch's `count_include_pad`).
    pub fn count_include_pad(self, include: bool) -> AvgPool2d {
        AvgPool2d { count_include_pad: include, ..self }
    }
}

window_builders!(AvgPool2d, "With this zero padding (at most half the kernel).");

impl Module for AvgPool2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("AvgPool2d", input)?;
        Ok(input.avg_pool2d_with(self.window.params(), self.count_include_pad)?)
    }
}
