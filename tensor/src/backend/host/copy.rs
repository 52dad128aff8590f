//! The host's copies and fills: dtype conversion into a new contiguous
//! tensor, strided copies between views, and fills of a view.

use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::Result;
use crate::ops::elementwise::{Cost, Plan};
use crate::storage::lock_storages;
use crate::tensor::Tensor;

/// See [`crate::backend::Backend::cast`]; `device` is any host device
/// (moving between logical host devices is a copy in one address space).
///
/// Large casts run on rayon's threads, in chunks of the output, like the
/// element-wise ops: autocast casts every weight and every weight gradient
/// of a step, and on one thread those casts stayed the same length while
/// the products shrank with the cores (on 16 Xeon cores `wide_mlp`'s bf16
/// step ran at half its f32 speed).
pub(super) fn cast(x: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
    let out = Tensor::uninit_like(x, dtype, device)?;
    let plan = Plan::new(x.dims(), &[x.layout()]);
    let stride = plan.inner_stride(0);
    dispatch_dtype!(x.dtype(), S => dispatch_dtype!(dtype, D => {
        let src = x.storage().read::<S>("copy")?;
        // SAFETY: `Plan::run` hands every row of the output to the closure,
        // which writes each of its elements (`convert_row`), reading none.
        unsafe {
            out.init_with::<D>("copy", |dst| {
                plan.run(dst, Cost::Cheap, |starts, row| {
                    convert_row(&src, starts[0], stride, row);
                    Ok(())
                })
            })
        }
    }))
}

/// Writes `out[i] = src[start + i * stride]` converted to `D`, a slice at a
/// time (the vectorised half <-> f32 conversions) where the row is
/// contiguous. The plan keeps every index inside the source's storage.
fn convert_row<S: WithDType, D: WithDType>(src: &[S], start: usize, stride: isize, out: &mut [D]) {
    if stride == 1 {
        let run = &src[start..start + out.len()];
        if S::DTYPE == D::DTYPE {
            // SAFETY: S and D are the same type when their dtypes are equal.
            let same: &[D] = unsafe { std::slice::from_raw_parts(run.as_ptr() as *const D, run.len()) };
            out.copy_from_slice(same);
        } else {
            // Equal lengths: the only refusal `convert_slice` has.
            let converted = crate::convert_slice(run, out);
            debug_assert!(converted.is_ok());
        }
    } else {
        let mut at = start as isize;
        for o in out.iter_mut() {
            *o = src[at as usize].cast::<D>();
            at += stride;
        }
    }
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

/// Copy between two layouts of the same shape, a contiguous run at a time
/// where both sides allow: runs as long as the largest length that divides
/// both sides' runs (a transposed-then-reshaped gradient copied into a
/// narrowed slice has runs of a head's width on one side and of the slice's
/// width on the other), element by element only when that length is 1.
fn copy_runs<T: WithDType>(from: &[T], src: &Tensor, to: &mut [T], dst: &Tensor) {
    let dst_runs = dst.layout().contiguous_runs();
    let src_runs = src.layout().contiguous_runs();
    let common = gcd(dst_runs.run_len(), src_runs.run_len());
    if common > 1 {
        let chunks = move |runs: crate::layout::ContiguousRuns| {
            runs.flat_map(move |run| run.step_by(common).map(move |start| start..start + common))
        };
        for (d, s) in chunks(dst_runs).zip(chunks(src_runs)) {
            to[d].copy_from_slice(&from[s]);
        }
    } else {
        for (d, s) in dst.layout().offsets().zip(src.layout().offsets()) {
            to[d] = from[s];
        }
    }
}

/// The greatest common divisor (`gcd(0, n) = n`). Runs are products of
/// trailing dims, so one length usually divides the other; gcd covers any.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
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

#[cfg(test)]
mod tests {
    use super::gcd;
    use crate::{DType, Tensor};

    /// The values of `t` in row-major order, through the contiguous path.
    fn values(t: &Tensor) -> Vec<f32> {
        t.contiguous().unwrap().to_vec::<f32>().unwrap()
    }

    #[test]
    fn gcd_of_run_lengths() {
        assert_eq!(gcd(256, 64), 64);
        assert_eq!(gcd(6, 4), 2);
        assert_eq!(gcd(7, 3), 1);
        assert_eq!(gcd(0, 5), 5);
    }

    #[test]
    fn copy_between_runs_of_different_lengths_keeps_every_element_in_place() {
        // Source runs of 6 (a transposed [2, 3, 4, 6] read as [2, 4, 3, 6]),
        // destination runs of 18 (a narrowed [2, 4, 30] viewed as [2, 4, 3, 6]).
        let source = Tensor::arange(0.0, 144.0, 1.0, DType::F32).unwrap().reshape(&[2, 3, 4, 6]).unwrap();
        let src = source.transpose(1, 2).unwrap();
        let big = Tensor::zeros([2, 4, 30], DType::F32).unwrap();
        let dst = big.narrow(2, 6, 18).unwrap().reshape(&[2, 4, 3, 6]).unwrap();
        dst.copy_(&src).unwrap();
        assert_eq!(values(&dst), values(&src));
        // `dst` is a view: the values landed in `big`.
        assert_eq!(values(&big.narrow(2, 6, 18).unwrap()), values(&src.reshape(&[2, 4, 18]).unwrap()));
        let untouched = [big.narrow(2, 0, 6).unwrap(), big.narrow(2, 24, 6).unwrap()];
        for part in untouched {
            assert!(values(&part).iter().all(|&v| v == 0.0));
        }
    }
}
