//! The host's copies and fills: dtype conversion into a new contiguous
//! tensor, strided copies between views, and fills of a view.

use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::Result;
use crate::storage::lock_storages;
use crate::tensor::{copy_strided, Tensor};

/// See [`crate::backend::Backend::cast`]; `device` is any host device
/// (moving between logical host devices is a copy in one address space).
pub(super) fn cast(x: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
    let out = Tensor::uninit_like(x, dtype, device)?;
    dispatch_dtype!(x.dtype(), S => dispatch_dtype!(dtype, D => {
        let src = x.storage().read::<S>("copy")?;
        // SAFETY: `copy_strided` writes every element of `dst` (one per
        // element of the source's layout, which has `dst`'s shape), reading none.
        unsafe {
            out.init_with::<D>("copy", |dst| {
                copy_strided(&src, x.layout(), dst);
                Ok(())
            })
        }
    }))
}

/// See [`crate::backend::Backend::copy_into`].
pub(super) fn copy_into(name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
    let mut locks = lock_storages(&[src.storage()], &[dst.storage()]);
    dispatch_dtype!(dst.dtype(), T => {
        // The storages differ (the op copies a sharing source first).
        let (to, reads) = locks.write::<T>(dst.storage(), name)?;
        copy_runs::<T>(reads.read::<T>(src.storage(), name)?, src, to, dst);
    });
    Ok(())
}

/// Element-by-element copy between two layouts of the same shape, a
/// contiguous run at a time where both sides allow.
fn copy_runs<T: WithDType>(from: &[T], src: &Tensor, to: &mut [T], dst: &Tensor) {
    let dst_runs = dst.layout().contiguous_runs();
    let src_runs = src.layout().contiguous_runs();
    if dst_runs.run_len() == src_runs.run_len() {
        for (d, s) in dst_runs.zip(src_runs) {
            to[d].copy_from_slice(&from[s]);
        }
    } else {
        for (d, s) in dst.layout().offsets().zip(src.layout().offsets()) {
            to[d] = from[s];
        }
    }
}

/// See [`crate::backend::Backend::fill`].
pub(super) fn fill(name: &'static str, dst: &Tensor, value: f64) -> Result<()> {
    dispatch_dtype!(dst.dtype(), T => {
        let value = T::from_f64(value);
        // Broadcast dims repeat their element: walk each one once.
        let layout = dst.layout().without_broadcast_dims();
        let mut data = dst.storage().write::<T>(name)?;
        for run in layout.contiguous_runs() {
            data[run].fill(value);
        }
    });
    Ok(())
}
