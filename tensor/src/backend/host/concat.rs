//! The host's concatenation: each input's contiguous runs copied into the
//! block of the output it fills.

use crate::backend::output;
use crate::dispatch::dispatch_dtype;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::index::copy_runs;

/// See [`crate::backend::DeviceOps::concat`].
pub(super) fn concat(tensors: &[&Tensor], d: usize, shape: &Shape) -> Result<Tensor> {
    const OP: &str = "cat";
    let total = shape.dims()[d];
    // Checks the size first: then the products below cannot overflow.
    let result = output(tensors[0].device(), tensors[0].dtype(), shape)?;
    let outer: usize = shape.dims()[..d].iter().product();
    let inner: usize = shape.dims()[d + 1..].iter().product();
    // SAFETY: the inputs' blocks tile the output: input `t` fills the
    // `t.dims()[d]` slices along `d` from `start` on, in every outer run,
    // and together they cover `0..total`; nothing is read from it.
    dispatch_dtype!(tensors[0].dtype(), T => unsafe {
        result.init_with::<T>(OP, |dst| {
            let mut start = 0usize;
            for t in tensors {
                let len = t.dims()[d];
                if t.numel() > 0 {
                    // The block of the output this input fills: `outer` runs of
                    // `len * inner` elements, `total * inner` apart.
                    let block = Layout::new([outer, len * inner], vec![(total * inner) as isize, 1], start * inner)?;
                    let src = t.storage().read::<T>(OP)?;
                    // The blocks were built from the checked shapes: a refusal is a bug.
                    copy_runs(&src, t.layout().contiguous_runs(), &mut *dst, block.contiguous_runs()).map_err(
                        |source| TensorError::internal(OP, format!("copying an input into its block failed: {source}")),
                    )?;
                }
                start += len;
            }
            Ok(())
        })
    })
}
