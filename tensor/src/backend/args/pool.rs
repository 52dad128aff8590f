//! A pooling's checked windows, as the devices see them.

use crate::shape::Shape;
use brasa_kernels::pool::Pool2dGeometry;

/// The pooling of one tensor (built by `crate::ops::pool`, which checks
/// it): its planes, their geometry, the window.
pub(crate) struct PoolPlan {
    /// The leading (batch and channel) dims.
    pub lead: Vec<usize>,
    /// One plane's geometry.
    pub geometry: Pool2dGeometry,
    /// Window elements per output element, for task sizing.
    pub window: usize,
    /// Window size, (height, width) (read by the CUDA kernels; the host's
    /// geometry carries it inside).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub kernel: (usize, usize),
    /// Window step, (height, width).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub stride: (usize, usize),
    /// Implicit padding, (height, width).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub padding: (usize, usize),
}

impl PoolPlan {
    /// The leading dims and the pooled plane.
    pub(crate) fn output_shape(&self) -> Shape {
        let (h, w) = self.geometry.output();
        Shape::from([self.lead.as_slice(), &[h, w]].concat())
    }

    /// The leading dims and the input plane.
    pub(crate) fn input_shape(&self) -> Shape {
        let (h, w) = self.geometry.input();
        Shape::from([self.lead.as_slice(), &[h, w]].concat())
    }
}
