//! [`Embedding`]: a lookup table of `num_embeddings` vectors of size
//! `embedding_dim`, PyTorch's `nn.Embedding` (weight `[num, dim]`
//! initialised from `N(0, 1)`). Its input is a tensor of `i64` ids.

use crate::error::{NnError, Result};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Tensor};

/// A table of embeddings looked up by `i64` id: ids of shape `[...]` give
/// `[..., embedding_dim]`; the gradient is added into the rows used.
///
/// ```
/// use brasa_nn::{Embedding, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{Device, Tensor};
///
/// let table = Embedding::new(100, 16, Device::CPU)?;
/// let ids = Var::new(Tensor::from_vec(vec![3i64, 14, 15, 92, 65, 35], [2, 3])?);
/// assert_eq!(table.forward(&ids)?.dims(), &[2, 3, 16]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Var,
}

impl Embedding {
    /// An f32 table initialised from `N(0, 1)` (the seeded generator).
    pub fn new(num_embeddings: usize, embedding_dim: usize, device: Device) -> Result<Embedding> {
        Embedding::with_dtype(num_embeddings, embedding_dim, DType::F32, device)
    }

    /// A table in `dtype` initialised from `N(0, 1)`.
    pub fn with_dtype(num_embeddings: usize, embedding_dim: usize, dtype: DType, device: Device) -> Result<Embedding> {
        if !dtype.is_float() {
            return Err(NnError::invalid("Embedding", format!("the weight must be floating point, got {dtype}")));
        }
        let weight = Tensor::randn_on([num_embeddings, embedding_dim], dtype, device)?;
        Ok(Embedding { weight: Var::param(weight)? })
    }

    /// A table holding `weight` (`[num_embeddings, embedding_dim]`), trained
    /// unless `freeze` (PyTorch's `Embedding.from_pretrained`).
    pub fn from_pretrained(weight: Tensor, freeze: bool) -> Result<Embedding> {
        if weight.rank() != 2 || !weight.dtype().is_float() {
            return Err(NnError::invalid(
                "Embedding",
                format!(
                    "a pretrained weight must be a 2-d floating-point tensor, got shape {:?} of {}",
                    weight.dims(),
                    weight.dtype()
                ),
            ));
        }
        Ok(Embedding { weight: Var::from_tensor(weight, !freeze)? })
    }

    /// `num_embeddings`.
    pub fn num_embeddings(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `embedding_dim`.
    pub fn embedding_dim(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The embeddings of `ids` (an `i64` tensor of any shape).
    pub fn lookup(&self, ids: &Tensor) -> Result<Var> {
        if ids.dtype() != DType::I64 {
            return Err(NnError::invalid(
                "Embedding",
                format!("expected i64 ids, got a {} tensor of shape {:?}", ids.dtype(), ids.dims()),
            ));
        }
        Ok(Var::embedding(&self.weight, ids)?)
    }
}

impl Module for Embedding {
    /// The embeddings of the ids in `input` (a `Var` wrapping an `i64`
    /// tensor; it gets no gradient).
    fn forward(&self, input: &Var) -> Result<Var> {
        self.lookup(input.tensor())
    }
}
