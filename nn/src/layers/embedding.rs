//! [`Embedding`]: a lookup table of `num_embeddings` vectors of size
//! `embedding_dim`, PyTorch's `nn.Embedding` (weight `[num, dim]`
//! initialised from `N(0, 1)`, optionally with a `padding_idx` row that is
//! zeros at first and gets no gradient). Its input is a tensor of `i64` ids.

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
///
/// Cloning gives a handle on the same table (a `Var` is shared, not copied).
#[derive(crate::Parameters, Clone, Debug)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Var,
    /// The row that gets no gradient (already resolved if given negative).
    #[module(skip)]
    padding_idx: Option<usize>,
}

/// `padding_idx` as a row of a table of `num_embeddings` rows: PyTorch's
/// range `[-num_embeddings, num_embeddings)`, negative counting from the end.
fn resolve_padding_idx(padding_idx: i64, num_embeddings: usize) -> Result<usize> {
    let n = num_embeddings as i64;
    if !(-n..n).contains(&padding_idx) {
        return Err(NnError::invalid(
            "Embedding",
            format!(
                "padding_idx {padding_idx} is out of range for {num_embeddings} embeddings (allowed: -{num_embeddings} \
                 to {})",
                n - 1
            ),
        ));
    }
    Ok(if padding_idx < 0 { (padding_idx + n) as usize } else { padding_idx as usize })
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
        Ok(Embedding { weight: Var::param(weight)?, padding_idx: None })
    }

    /// An f32 table initialised from `N(0, 1)` except the row `padding_idx`,
    /// which is zeros and gets no gradient (PyTorch's `nn.Embedding(num,
    /// dim, padding_idx=p)`; a negative `padding_idx` counts from the end).
    ///
    /// ```
    /// use brasa_nn::{Embedding, Module};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{Device, Tensor};
    ///
    /// let table = Embedding::with_padding_idx(10, 4, 0, Device::CPU)?;
    /// let ids = Tensor::from_vec(vec![0i64, 3, 0], [3])?;
    /// let rows = table.lookup(&ids)?;
    /// assert_eq!(rows.tensor().narrow(0, 0, 1)?.to_vec::<f32>()?, [0.0; 4]); // the padding row
    /// assert!(Embedding::with_padding_idx(10, 4, 10, Device::CPU).is_err());
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    pub fn with_padding_idx(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: i64,
        device: Device,
    ) -> Result<Embedding> {
        let row = resolve_padding_idx(padding_idx, num_embeddings)?;
        let weight = Tensor::randn_on([num_embeddings, embedding_dim], DType::F32, device)?;
        weight.narrow(0, row, 1)?.zero_()?;
        Ok(Embedding { weight: Var::param(weight)?, padding_idx: Some(row) })
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
        let weight = Var::from_tensor(weight, !freeze)?;
        // A module's table is a parameter's memory, frozen or not.
        weight.tensor().storage().set_category(brasa_tensor::memory::MemoryCategory::Parameter);
        Ok(Embedding { weight, padding_idx: None })
    }

    /// [`Embedding::from_pretrained`] whose row `padding_idx` gets no
    /// gradient; the row keeps its pretrained values, as in PyTorch's
    /// `from_pretrained(..., padding_idx=p)`.
    pub fn from_pretrained_padded(weight: Tensor, freeze: bool, padding_idx: i64) -> Result<Embedding> {
        let mut table = Embedding::from_pretrained(weight, freeze)?;
        table.padding_idx = Some(resolve_padding_idx(padding_idx, table.num_embeddings())?);
        Ok(table)
    }

    /// The row that gets no gradient, if any.
    pub fn padding_idx(&self) -> Option<usize> {
        self.padding_idx
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
        Ok(Var::embedding_padded(&self.weight, ids, self.padding_idx)?)
    }
}

impl Module for Embedding {
    /// The embeddings of the ids in `input` (a `Var` wrapping an `i64`
    /// tensor; it gets no gradient).
    fn forward(&self, input: &Var) -> Result<Var> {
        self.lookup(input.tensor())
    }
}
