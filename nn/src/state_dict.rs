//! [`StateDict`]: named tensors (a model's parameters and buffers, or an
//! optimizer's state) saved as safetensors with the names and layouts
//! PyTorch's `safetensors.torch.save_file(model.state_dict(), ...)` writes for
//! the same model, so weights cross over in both directions.
//!
//! ```
//! use brasa_nn::{Linear, ModuleExt, StateDict};
//! use brasa_tensor::Device;
//!
//! let a = Linear::new(3, 2, Device::CPU)?;
//! let b = Linear::new(3, 2, Device::CPU)?;
//! let bytes = a.state_dict().to_bytes()?;
//! b.load_state_dict(&StateDict::from_bytes(&bytes)?, true)?;
//! assert_eq!(a.weight.tensor().to_vec::<f32>()?, b.weight.tensor().to_vec::<f32>()?);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use brasa_autograd::no_grad;
use brasa_tensor::{DType, Device, Tensor};
use half::{bf16, f16};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// Tensors by name, in insertion order.
#[derive(Clone, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
}

/// What a non-strict [`crate::ModuleExt::load_state_dict`] could not load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Names the model has but the state dict lacks (left unchanged).
    pub missing: Vec<String>,
    /// Names in the state dict the model does not have (ignored).
    pub unexpected: Vec<String>,
    /// Names present in both whose shape or dtype differ, with both (left unchanged).
    pub mismatched: Vec<String>,
}

impl LoadReport {
    /// True when everything matched.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_clean() {
            return write!(f, "all keys matched");
        }
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing keys: {}", self.missing.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected keys: {}", self.unexpected.join(", ")));
        }
        if !self.mismatched.is_empty() {
            parts.push(format!("size or dtype mismatch: {}", self.mismatched.join("; ")));
        }
        write!(f, "{}", parts.join("; "))
    }
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Adds `tensor` under `name`, replacing an earlier tensor of that name.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        let name = name.into();
        match self.entries.iter_mut().find(|(existing, _)| *existing == name) {
            Some(slot) => slot.1 = tensor,
            None => self.entries.push((name, tensor)),
        }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(existing, _)| existing == name).map(|(_, tensor)| tensor)
    }

    /// Removes and returns the tensor named `name`.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        let index = self.entries.iter().position(|(existing, _)| existing == name)?;
        Some(self.entries.remove(index).1)
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names, in insertion order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(name, _)| name.as_str())
    }

    /// `(name, tensor)` pairs, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(name, tensor)| (name.as_str(), tensor))
    }

    /// The safetensors encoding (with PyTorch's `{"format": "pt"}` metadata).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut owned = Vec::with_capacity(self.entries.len());
        for (name, tensor) in &self.entries {
            owned.push((
                name.as_str(),
                safetensors_dtype(tensor.dtype()),
                tensor.dims().to_vec(),
                tensor_bytes(tensor)?,
            ));
        }
        let mut views = Vec::with_capacity(owned.len());
        for (name, dtype, shape, bytes) in &owned {
            let view = TensorView::new(*dtype, shape.clone(), bytes).map_err(|e| NnError::safetensors(*name, e))?;
            views.push((*name, view));
        }
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize(views, Some(metadata)).map_err(|e| NnError::safetensors("encoding", e))
    }

    /// Decodes safetensors bytes into host tensors (`Device::CPU`). A
    /// truncated or corrupt buffer, or an unsupported dtype, is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<StateDict> {
        StateDict::from_bytes_on(bytes, Device::CPU)
    }

    /// Decodes safetensors bytes into tensors on `device`.
    pub fn from_bytes_on(bytes: &[u8], device: Device) -> Result<StateDict> {
        let file = SafeTensors::deserialize(bytes).map_err(|e| NnError::safetensors("not valid safetensors", e))?;
        // Safetensors lays tensors out by alignment, not in the writer's order: sort by name.
        let mut named: Vec<(String, TensorView<'_>)> = file.tensors();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let mut dict = StateDict::new();
        for (name, view) in named {
            let tensor = tensor_from_view(&name, &view, device)?;
            dict.insert(name, tensor);
        }
        Ok(dict)
    }

    /// Writes the safetensors file at `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let bytes = self.to_bytes()?;
        std::fs::write(path.as_ref(), bytes).map_err(|e| NnError::file_error(path, "", e))
    }

    /// Reads the safetensors file at `path` into host tensors.
    pub fn load(path: impl AsRef<Path>) -> Result<StateDict> {
        let bytes = std::fs::read(path.as_ref()).map_err(|e| NnError::file_error(&path, "", e))?;
        StateDict::from_bytes(&bytes).map_err(|e| NnError::file_error(&path, "", e))
    }
}

impl std::fmt::Debug for StateDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(name, t)| (name, format!("{} {:?}", t.dtype(), t.dims()))))
            .finish()
    }
}

/// Copies `source` into the tensors of `target` (a model's live state dict).
pub(crate) fn load_into(target: &StateDict, source: &StateDict, strict: bool) -> Result<LoadReport> {
    let mut report = LoadReport::default();
    let mut pairs = Vec::new();
    for (name, dst) in target.iter() {
        match source.get(name) {
            None => report.missing.push(name.to_string()),
            Some(src) if src.dims() != dst.dims() || src.dtype() != dst.dtype() => report.mismatched.push(format!(
                "{name}: the model has {} {:?}, the state dict {} {:?}",
                dst.dtype(),
                dst.dims(),
                src.dtype(),
                src.dims()
            )),
            Some(src) => pairs.push((dst, src)),
        }
    }
    report.unexpected = source.names().filter(|name| target.get(name).is_none()).map(str::to_string).collect();
    if strict && !report.is_clean() {
        return Err(NnError::StateDict(format!("cannot load strictly: {report}")));
    }
    let _guard = no_grad();
    for (dst, src) in pairs {
        dst.copy_(src)?;
    }
    Ok(report)
}

fn safetensors_dtype(dtype: DType) -> StDtype {
    match dtype {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I64 => StDtype::I64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
    }
}

/// The tensor's elements in row-major order, little-endian, as safetensors stores them.
fn tensor_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    Ok(match tensor.dtype() {
        DType::Bool => tensor.to_vec::<bool>()?.into_iter().map(u8::from).collect(),
        DType::U8 => tensor.to_vec::<u8>()?,
        DType::I64 => bytemuck::cast_slice(&tensor.to_vec::<i64>()?).to_vec(),
        DType::F16 => bytemuck::cast_slice(&tensor.to_vec::<f16>()?).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&tensor.to_vec::<bf16>()?).to_vec(),
        DType::F32 => bytemuck::cast_slice(&tensor.to_vec::<f32>()?).to_vec(),
        DType::F64 => bytemuck::cast_slice(&tensor.to_vec::<f64>()?).to_vec(),
    })
}

fn tensor_from_view(name: &str, view: &TensorView<'_>, device: Device) -> Result<Tensor> {
    let shape = view.shape().to_vec();
    let data = view.data();
    // `pod_collect_to_vec` copies, so the file's buffer need not be aligned.
    let tensor = match view.dtype() {
        StDtype::BOOL => Tensor::from_vec_on(data.iter().map(|&b| b != 0).collect::<Vec<bool>>(), shape, device),
        StDtype::U8 => Tensor::from_vec_on(data.to_vec(), shape, device),
        StDtype::I64 => Tensor::from_vec_on(bytemuck::pod_collect_to_vec::<u8, i64>(data), shape, device),
        StDtype::F16 => Tensor::from_vec_on(bytemuck::pod_collect_to_vec::<u8, f16>(data), shape, device),
        StDtype::BF16 => Tensor::from_vec_on(bytemuck::pod_collect_to_vec::<u8, bf16>(data), shape, device),
        StDtype::F32 => Tensor::from_vec_on(bytemuck::pod_collect_to_vec::<u8, f32>(data), shape, device),
        StDtype::F64 => Tensor::from_vec_on(bytemuck::pod_collect_to_vec::<u8, f64>(data), shape, device),
        other => {
            return Err(NnError::StateDict(format!(
                "{name}: dtype {other:?} is not supported (brasa has bool, u8, i64, f16, bf16, f32, f64)"
            )))
        }
    };
    Ok(tensor?)
}
