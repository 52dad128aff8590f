//! Datasets: what a [`DataLoader`](super::DataLoader) reads batches from.
//!
//! A [`Dataset`] hands out a whole batch for a list of indices at once, so an
//! in-memory dataset gathers its rows with one `index_select` per tensor
//! instead of building a tensor per sample and stacking them (PyTorch's
//! default `Dataset.__getitem__` + `collate_fn` path). [`TensorDataset`] is
//! the in-memory case: a features tensor `[N, ...]` and a labels tensor
//! `[N]`. [`Subset`] and [`random_split`] select part of any dataset without
//! copying it; [`TensorDataset::split`] makes a fixed, seeded train/test
//! split that owns compact tensors. [`collate`] stacks per-sample tensors for
//! datasets that only know how to read one sample at a time.

use super::sample_order::permutation;
use crate::error::{NnError, Result};
use brasa_tensor::Tensor;
use std::sync::Arc;

/// A source of batches, read by index. `Send + Sync` so that a
/// [`DataLoader`](super::DataLoader)'s worker threads can share it.
pub trait Dataset: Send + Sync {
    /// What one batch is, for example `(features, labels)`.
    type Batch: Send + 'static;

    /// The number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batch of samples `indices`, in that order. Every index is below
    /// [`Dataset::len`] (an index that is not must be an error, not a panic).
    fn get_batch(&self, indices: &[usize]) -> Result<Self::Batch>;
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Batch = D::Batch;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Self::Batch> {
        (**self).get_batch(indices)
    }
}

impl<D: Dataset + ?Sized> Dataset for Box<D> {
    type Batch = D::Batch;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Self::Batch> {
        (**self).get_batch(indices)
    }
}

/// An error unless every index is below `len`.
fn check_indices(what: &'static str, indices: &[usize], len: usize) -> Result<()> {
    match indices.iter().find(|&&i| i >= len) {
        Some(i) => Err(NnError::invalid(what, format!("index {i} is out of range for a dataset of {len} samples"))),
        None => Ok(()),
    }
}

/// `indices` as the `i64` tensor that `index_select` takes, on `tensor`'s device.
fn index_tensor(indices: &[usize], tensor: &Tensor) -> Result<Tensor> {
    let ids: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Ok(Tensor::from_vec_on(ids, [indices.len()], tensor.device())?)
}

/// Features `[N, ...]` and labels `[N, ...]` held in memory
/// (`torch.utils.data.TensorDataset` for the common pair): a batch is
/// `(features[indices], labels[indices])`, gathered with one
/// `index_select` per tensor into new contiguous tensors.
#[derive(Clone, Debug)]
pub struct TensorDataset {
    features: Tensor,
    labels: Tensor,
}

impl TensorDataset {
    /// A dataset over `features` (`[N, ...]`) and `labels` (`[N]`, or
    /// `[N, ...]` for targets with more dims); both must have the same first
    /// dim and live on the same device. Strided tensors are made contiguous
    /// once here, so that no batch has to.
    pub fn new(features: Tensor, labels: Tensor) -> Result<TensorDataset> {
        const WHAT: &str = "TensorDataset::new";
        if features.rank() == 0 || labels.rank() == 0 {
            return Err(NnError::invalid(
                WHAT,
                format!(
                    "features and labels need a first (sample) dim, got shapes {:?} and {:?}",
                    features.dims(),
                    labels.dims()
                ),
            ));
        }
        if features.dims()[0] != labels.dims()[0] {
            return Err(NnError::invalid(
                WHAT,
                format!(
                    "features have {} samples (shape {:?}) but labels have {} (shape {:?})",
                    features.dims()[0],
                    features.dims(),
                    labels.dims()[0],
                    labels.dims()
                ),
            ));
        }
        if features.device() != labels.device() {
            return Err(NnError::invalid(
                WHAT,
                format!("features are on {} but labels are on {}", features.device(), labels.device()),
            ));
        }
        Ok(TensorDataset { features: features.contiguous()?, labels: labels.contiguous()? })
    }

    /// The features, `[N, ...]`.
    pub fn features(&self) -> &Tensor {
        &self.features
    }

    /// The labels, `[N]` (or `[N, ...]`).
    pub fn labels(&self) -> &Tensor {
        &self.labels
    }

    /// The features and labels.
    pub fn into_parts(self) -> (Tensor, Tensor) {
        (self.features, self.labels)
    }

    /// The samples `indices`, in that order, copied into new compact tensors
    /// (repeats allowed). An index out of range is an error.
    pub fn subset(&self, indices: &[usize]) -> Result<TensorDataset> {
        check_indices("TensorDataset::subset", indices, self.len())?;
        let (features, labels) = self.get_batch(indices)?;
        Ok(TensorDataset { features, labels })
    }

    /// A seeded random split into a first part of `floor(N * fraction)`
    /// samples and a second part of the rest (`fraction = 0.8` on 1,797
    /// samples gives 1,437 and 360). The same seed gives the same split on
    /// every run and machine; each sample lands in exactly one part.
    pub fn split(&self, fraction: f64, seed: u64) -> Result<(TensorDataset, TensorDataset)> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(NnError::invalid(
                "TensorDataset::split",
                format!("fraction must be in [0, 1], got {fraction}"),
            ));
        }
        let first = ((self.len() as f64) * fraction).floor() as usize;
        let mut parts = self.split_sizes(&[first, self.len() - first], seed)?.into_iter();
        match (parts.next(), parts.next()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(NnError::invalid("TensorDataset::split", "internal: expected two parts")),
        }
    }

    /// A seeded random split into parts of the given sizes, which must add up
    /// to the number of samples.
    pub fn split_sizes(&self, sizes: &[usize], seed: u64) -> Result<Vec<TensorDataset>> {
        split_indices("TensorDataset::split_sizes", self.len(), sizes, seed)?
            .iter()
            .map(|indices| self.subset(indices))
            .collect()
    }

    /// The same samples with each feature reshaped to `sample_shape` (a
    /// view, no copy): `[N, 64]` with `[1, 8, 8]` gives `[N, 1, 8, 8]`.
    pub fn reshape_features(&self, sample_shape: &[usize]) -> Result<TensorDataset> {
        let mut shape = Vec::with_capacity(sample_shape.len() + 1);
        shape.push(self.len() as isize);
        shape.extend(sample_shape.iter().map(|&d| d as isize));
        let per_sample: usize = self.features.dims()[1..].iter().product();
        if sample_shape.iter().product::<usize>() != per_sample {
            return Err(NnError::invalid(
                "TensorDataset::reshape_features",
                format!(
                    "a sample of shape {:?} ({per_sample} elements) cannot be seen as {sample_shape:?}",
                    &self.features.dims()[1..]
                ),
            ));
        }
        Ok(TensorDataset { features: self.features.reshape(&shape)?, labels: self.labels.clone() })
    }
}

impl Dataset for TensorDataset {
    type Batch = (Tensor, Tensor);

    fn len(&self) -> usize {
        self.features.dims()[0]
    }

    fn get_batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        // index_select checks the range too; checking here names the dataset.
        check_indices("TensorDataset::get_batch", indices, self.len())?;
        let ids = index_tensor(indices, &self.features)?;
        Ok((self.features.index_select(0, &ids)?, self.labels.index_select(0, &ids)?))
    }
}

/// The samples `indices` of another dataset, read through it without a copy
/// (`torch.utils.data.Subset`).
#[derive(Clone, Debug)]
pub struct Subset<D> {
    dataset: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// The samples `indices` of `dataset`, in that order. An index out of
    /// range is an error. Wrap the dataset in an `Arc` to share it between
    /// several subsets.
    pub fn new(dataset: D, indices: Vec<usize>) -> Result<Subset<D>> {
        check_indices("Subset::new", &indices, dataset.len())?;
        Ok(Subset { dataset, indices })
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The underlying dataset's indices of this subset's samples.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Batch = D::Batch;

    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get_batch(&self, indices: &[usize]) -> Result<D::Batch> {
        let mapped = indices
            .iter()
            .map(|&i| {
                self.indices.get(i).copied().ok_or_else(|| {
                    NnError::invalid(
                        "Subset::get_batch",
                        format!("index {i} is out of range for a subset of {} samples", self.indices.len()),
                    )
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        self.dataset.get_batch(&mapped)
    }
}

/// Splits `dataset` at random into subsets of the given sizes, which must
/// add up to its length (`torch.utils.data.random_split` with a seeded
/// generator). Nothing is copied: each part reads through the shared
/// dataset.
pub fn random_split<D: Dataset>(dataset: D, sizes: &[usize], seed: u64) -> Result<Vec<Subset<Arc<D>>>> {
    let parts = split_indices("random_split", dataset.len(), sizes, seed)?;
    let shared = Arc::new(dataset);
    Ok(parts.into_iter().map(|indices| Subset { dataset: Arc::clone(&shared), indices }).collect())
}

/// A seeded permutation of `0..len` cut into consecutive parts of `sizes`.
fn split_indices(what: &'static str, len: usize, sizes: &[usize], seed: u64) -> Result<Vec<Vec<usize>>> {
    let total = sizes.iter().try_fold(0usize, |sum, &s| sum.checked_add(s));
    if total != Some(len) {
        return Err(NnError::invalid(what, format!("sizes {sizes:?} do not add up to the {len} samples")));
    }
    let order = permutation(len, seed);
    let mut start = 0;
    Ok(sizes
        .iter()
        .map(|&size| {
            let part = order[start..start + size].to_vec();
            start += size;
            part
        })
        .collect())
}

/// Stacks per-sample `(features, label)` pairs into one batch along a new
/// first dim, for datasets that read one sample at a time (PyTorch's
/// `default_collate` for pairs). Every sample must have the same shapes.
pub fn collate(samples: &[(Tensor, Tensor)]) -> Result<(Tensor, Tensor)> {
    if samples.is_empty() {
        return Err(NnError::invalid("collate", "no samples to stack"));
    }
    let features: Vec<&Tensor> = samples.iter().map(|(x, _)| x).collect();
    let labels: Vec<&Tensor> = samples.iter().map(|(_, y)| y).collect();
    Ok((Tensor::stack(&features, 0)?, Tensor::stack(&labels, 0)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::DType;

    fn ramp(n: usize) -> TensorDataset {
        let x = Tensor::arange(0.0, (n * 3) as f64, 1.0, DType::F32).unwrap().reshape(&[n as isize, 3]).unwrap();
        let y = Tensor::from_vec((0..n as i64).collect::<Vec<_>>(), [n]).unwrap();
        TensorDataset::new(x, y).unwrap()
    }

    #[test]
    fn batches_gather_rows_in_order() {
        let data = ramp(5);
        let (x, y) = data.get_batch(&[4, 0, 4]).unwrap();
        assert_eq!(x.dims(), &[3, 3]);
        assert_eq!(x.to_vec::<f32>().unwrap(), [12.0, 13.0, 14.0, 0.0, 1.0, 2.0, 12.0, 13.0, 14.0]);
        assert_eq!(y.to_vec::<i64>().unwrap(), [4, 0, 4]);
        let error = data.get_batch(&[1, 5]).unwrap_err();
        assert!(matches!(error, NnError::Invalid { what: "TensorDataset::get_batch", .. }), "{error:?}");
        // The variant says no more: the message names the index and the length.
        assert!(error.to_string().contains("index 5 is out of range for a dataset of 5 samples"), "{error}");
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let x = Tensor::zeros([4, 2], DType::F32).unwrap();
        let y = Tensor::zeros([3], DType::I64).unwrap();
        let error = TensorDataset::new(x, y).unwrap_err();
        assert!(matches!(error, NnError::Invalid { what: "TensorDataset::new", .. }), "{error:?}");
        // The variant says no more: the messages name the counts, or the missing dim.
        assert!(error.to_string().contains("4 samples") && error.to_string().contains("have 3"), "{error}");
        let error = TensorDataset::new(Tensor::scalar_on(1.0f32, brasa_tensor::Device::CPU).unwrap(), ramp(1).labels)
            .unwrap_err();
        assert!(matches!(error, NnError::Invalid { what: "TensorDataset::new", .. }), "{error:?}");
        assert!(error.to_string().contains("first (sample) dim"), "{error}");
    }

    #[test]
    fn splits_partition_the_samples() {
        let data = ramp(10);
        let (a, b) = data.split(0.75, 3).unwrap();
        assert_eq!((a.len(), b.len()), (7, 3));
        let mut seen: Vec<i64> = a.labels().to_vec().unwrap();
        seen.extend(b.labels().to_vec::<i64>().unwrap());
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<i64>>());
        let (again, _) = data.split(0.75, 3).unwrap();
        assert_eq!(again.labels().to_vec::<i64>().unwrap(), a.labels().to_vec::<i64>().unwrap());
        assert!(data.split(1.5, 0).is_err());
        assert!(data.split_sizes(&[3, 3], 0).is_err());
    }

    #[test]
    fn subsets_read_through_without_copies() {
        let parts = random_split(ramp(6), &[4, 2], 9).unwrap();
        assert_eq!(parts[0].len() + parts[1].len(), 6);
        let (_, y) = parts[1].get_batch(&[1, 0]).unwrap();
        let indices = parts[1].indices();
        assert_eq!(y.to_vec::<i64>().unwrap(), [indices[1] as i64, indices[0] as i64]);
        assert!(parts[1].get_batch(&[2]).is_err());
        assert!(Subset::new(ramp(2), vec![0, 2]).is_err());
    }

    #[test]
    fn features_reshape_and_samples_collate() {
        let data = ramp(4).reshape_features(&[3, 1]).unwrap();
        assert_eq!(data.features().dims(), &[4, 3, 1]);
        assert!(ramp(4).reshape_features(&[2, 2]).is_err());
        let samples: Vec<(Tensor, Tensor)> = (0..2)
            .map(|i| {
                (
                    Tensor::full([2], i as f64, DType::F32).unwrap(),
                    Tensor::scalar_on(i as i64, brasa_tensor::Device::CPU).unwrap(),
                )
            })
            .collect();
        let (x, y) = collate(&samples).unwrap();
        assert_eq!((x.dims(), y.dims()), (&[2usize, 2][..], &[2usize][..]));
        assert!(collate(&[]).is_err());
    }
}
