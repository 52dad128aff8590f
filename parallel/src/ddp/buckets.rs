//! Gradient buckets: which parameters share one flat buffer (PyTorch's
//! `compute_bucket_assignment_by_size`), and the buffers themselves, whose
//! slices *are* the parameters' gradients (gradient memory 1×, not 2×).

use crate::error::Result;
use brasa_autograd::Var;
use brasa_tensor::memory::{category_scope, MemoryCategory};
use brasa_tensor::{DType, Device, Tensor};

/// Default size of the first bucket (`kDefaultFirstBucketBytes`).
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;
/// Default cap of every later bucket (`bucket_cap_mb = 25`).
pub const BUCKET_CAP_BYTES: usize = 25 << 20;

/// Groups parameters, taken in `order`, into buckets: one dtype per bucket,
/// a bucket closes once it holds at least its limit (it can overshoot by
/// one tensor), the first bucket of each dtype is limited to `first_bytes`
/// and later ones to `cap_bytes`. Returns parameter indices per bucket, in
/// the order the buckets closed.
pub fn assign_buckets(
    sizes: &[(usize, DType)],
    order: &[usize],
    first_bytes: usize,
    cap_bytes: usize,
) -> Vec<Vec<usize>> {
    struct Open {
        dtype: DType,
        params: Vec<usize>,
        bytes: usize,
        closed_before: bool,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut buckets = Vec::new();
    for &index in order {
        let (numel, dtype) = sizes[index];
        let slot = match open.iter().position(|o| o.dtype == dtype) {
            Some(slot) => slot,
            None => {
                open.push(Open { dtype, params: Vec::new(), bytes: 0, closed_before: false });
                open.len() - 1
            }
        };
        let bucket = &mut open[slot];
        bucket.params.push(index);
        bucket.bytes += numel * dtype.size_in_bytes();
        let limit = if bucket.closed_before { cap_bytes } else { first_bytes };
        if bucket.bytes >= limit {
            buckets.push(std::mem::take(&mut bucket.params));
            bucket.bytes = 0;
            bucket.closed_before = true;
        }
    }
    buckets.extend(open.into_iter().filter(|o| !o.params.is_empty()).map(|o| o.params));
    buckets
}

/// One flat gradient buffer and the parameters whose gradients live in it.
pub(crate) struct Bucket {
    /// The flat buffer (1-D, the parameters' dtype and device).
    pub(crate) flat: Tensor,
    /// Parameter indices, in layout order.
    pub(crate) params: Vec<usize>,
    /// Each parameter's element offset in `flat`.
    pub(crate) offsets: Vec<usize>,
    /// Elements of the buffer (the parameters', padded to a multiple of the
    /// world size when sharding).
    pub(crate) numel: usize,
}

impl Bucket {
    /// A zeroed buffer for `params` (indices into `all`), its length
    /// padded to a multiple of `pad_to`.
    pub(crate) fn new(all: &[Var], params: Vec<usize>, pad_to: usize) -> Result<Bucket> {
        let first = &all[params[0]];
        let mut offsets = Vec::with_capacity(params.len());
        let mut numel = 0;
        for &p in &params {
            offsets.push(numel);
            numel += all[p].numel();
        }
        let numel = numel.div_ceil(pad_to.max(1)) * pad_to.max(1);
        let flat = gradient_buffer(numel, first.dtype(), first.device())?;
        Ok(Bucket { flat, params, offsets, numel })
    }

    /// Whether the buffer was released (ZeRO-2 after backward).
    pub(crate) fn is_released(&self) -> bool {
        self.flat.numel() != self.numel
    }

    /// Releases the buffer's memory (its gradients were reduce-scattered).
    pub(crate) fn release(&mut self) -> Result<()> {
        self.flat = Tensor::zeros_on([0], self.flat.dtype(), self.flat.device())?;
        Ok(())
    }

    /// Allocates a zeroed buffer again after [`Bucket::release`].
    pub(crate) fn restore(&mut self) -> Result<()> {
        self.flat = gradient_buffer(self.numel, self.flat.dtype(), self.flat.device())?;
        Ok(())
    }

    /// The slice of the buffer that is parameter `params[slot]`'s gradient.
    pub(crate) fn view(&self, all: &[Var], slot: usize) -> Result<Tensor> {
        let param = &all[self.params[slot]];
        let dims: Vec<isize> = param.dims().iter().map(|d| *d as isize).collect();
        Ok(self.flat.narrow(0, self.offsets[slot], param.numel())?.reshape(&dims)?)
    }

    /// Bytes of the buffer.
    pub(crate) fn bytes(&self) -> usize {
        self.numel * self.flat.dtype().size_in_bytes()
    }
}

/// A zeroed 1-D buffer counted as gradients by the device's allocator
/// (memory statistics, snapshots and plans show it as such).
pub(crate) fn gradient_buffer(numel: usize, dtype: DType, device: Device) -> Result<Tensor> {
    let _gradients = category_scope(MemoryCategory::Gradient);
    Ok(Tensor::zeros_on([numel], dtype, device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn first_bucket_is_small_and_later_ones_capped() {
        // Ten 1-MiB f32 tensors in order: [0] closes the 1-MiB bucket, then
        // buckets of 3 MiB.
        let sizes = vec![(MIB / 4, DType::F32); 10];
        let order: Vec<usize> = (0..10).collect();
        let buckets = assign_buckets(&sizes, &order, MIB, 3 * MIB);
        assert_eq!(buckets, vec![vec![0], vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
    }

    #[test]
    fn dtypes_never_share_a_bucket_and_small_tensors_pack() {
        let sizes = vec![(10, DType::F32), (10, DType::BF16), (10, DType::F32), (MIB, DType::BF16)];
        let buckets = assign_buckets(&sizes, &[3, 2, 1, 0], MIB, 25 * MIB);
        assert_eq!(buckets, vec![vec![3], vec![1], vec![2, 0]]); // open buckets close at the end, by dtype first seen
        for bucket in &buckets {
            assert!(bucket.iter().all(|&i| sizes[i].1 == sizes[bucket[0]].1));
        }
    }

    #[test]
    fn every_parameter_lands_in_exactly_one_bucket() {
        let sizes: Vec<(usize, DType)> = (0..57).map(|i| ((i * 7919) % 300_000 + 1, DType::F32)).collect();
        let order: Vec<usize> = (0..57).rev().collect();
        let mut seen: Vec<usize> = assign_buckets(&sizes, &order, MIB, 2 * MIB).concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..57).collect::<Vec<_>>());
    }
}
