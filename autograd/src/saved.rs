//! What an operation keeps for its backward: [`SavedTensors`], each tensor
//! as it was saved, or what the saved-tensor hooks active at save time
//! packed it into (see [`crate::saved_tensors_hooks`]); with each, the
//! storage version it had, so that backward refuses a tensor changed in
//! place since.
//!
//! The tensors kept as they are count towards [`crate::saved_tensor_bytes`]
//! once per storage, however many views of it are saved: each storage
//! counts the saved tensors holding it ([`Storage::add_saved_ref`]), and a
//! storage's bytes join the process-wide total when its first one is saved
//! and leave it when its last one is released. Saving and releasing take no
//! process-wide lock (several threads record and run graphs at once in
//! data-parallel training).

use crate::error::{AutogradError, Result, SavedTensorHookStage};
use crate::saved_hooks::{current_hooks, without_hooks, Packed, SavedTensorHooks};
use brasa_tensor::memory::MemoryCategory;
use brasa_tensor::{DType, Device, Storage, Tensor};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

static SAVED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes of distinct storages held by saved tensors in this process.
pub(crate) fn saved_byte_count() -> usize {
    SAVED_BYTES.load(Ordering::Relaxed)
}

/// A storage's identity while it lives (graph statistics count each once).
pub(crate) fn storage_key(t: &Tensor) -> usize {
    Arc::as_ptr(t.storage()) as usize
}

fn register_saved(t: &Tensor) {
    // Kept for backward: an activation, unless it is already counted as
    // something that outlives the step (a parameter, an input batch).
    let storage = t.storage();
    if matches!(storage.category(), MemoryCategory::Other | MemoryCategory::Temporary) {
        storage.set_category(MemoryCategory::Activation);
    }
    if storage.add_saved_ref() {
        SAVED_BYTES.fetch_add(storage.size_in_bytes(), Ordering::Relaxed);
    }
}

fn unregister_saved(t: &Tensor) {
    let storage = t.storage();
    if storage.remove_saved_ref() {
        SAVED_BYTES.fetch_sub(storage.size_in_bytes(), Ordering::Relaxed);
    }
}

/// One saved tensor.
enum Saved {
    /// Kept as it is (no hooks, or the hooks said [`Packed::Keep`]).
    Kept { tensor: Tensor, version: u64 },
    /// What `hooks` packed it into.
    Packed {
        value: Box<dyn Any + Send + Sync>,
        hooks: Arc<dyn SavedTensorHooks>,
        dims: Vec<usize>,
        dtype: DType,
        device: Device,
        /// The saved tensor's storage, to check its version at unpack while
        /// it lives; not kept alive by the graph (that is the point).
        storage: Weak<Storage>,
        version: u64,
    },
}

/// Tensors an operation keeps for its backward, with the storage version
/// each had when saved.
pub(crate) struct SavedTensors {
    saved: Vec<Saved>,
    /// A pack hook's error: backward through the node returns it.
    failed: Option<AutogradError>,
}

impl SavedTensors {
    /// `tensors`, saved by `op`: kept, or packed by this thread's hooks.
    pub(crate) fn new(op: &'static str, tensors: Vec<Tensor>) -> Result<Self> {
        let hooks = current_hooks();
        // Built as it goes, so that an error releases what was saved so far.
        let mut out = SavedTensors { saved: Vec::with_capacity(tensors.len()), failed: None };
        for tensor in tensors {
            let version = tensor.version();
            let packed = match &hooks {
                Some(hooks) => without_hooks(|| hooks.pack(&tensor)).map_err(|e| hook_error(op, Stage::Pack, e))?,
                None => Packed::Keep,
            };
            out.saved.push(match (packed, &hooks) {
                (Packed::Value(value), Some(hooks)) => Saved::Packed {
                    value,
                    hooks: Arc::clone(hooks),
                    dims: tensor.dims().to_vec(),
                    dtype: tensor.dtype(),
                    device: tensor.device(),
                    storage: Arc::downgrade(tensor.storage()),
                    version,
                },
                _ => {
                    register_saved(&tensor);
                    Saved::Kept { tensor, version }
                }
            });
        }
        Ok(out)
    }

    /// Nothing saved, and backward returns `error` (a pack hook's, when the
    /// operation could not return it itself).
    pub(crate) fn failed(error: AutogradError) -> Self {
        SavedTensors { saved: Vec::new(), failed: Some(error) }
    }

    /// The tensors, unpacked where they were packed; an error when one was
    /// modified in place since it was saved, or a hook failed.
    pub(crate) fn unpack(&self, op: &'static str) -> Result<Vec<Tensor>> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.saved
            .iter()
            .map(|saved| match saved {
                Saved::Kept { tensor, version } => {
                    check_version(op, tensor.version(), *version)?;
                    Ok(tensor.clone())
                }
                Saved::Packed { value, hooks, dims, dtype, device, storage, version } => {
                    if let Some(storage) = storage.upgrade() {
                        check_version(op, storage.version(), *version)?;
                    }
                    let tensor =
                        without_hooks(|| hooks.unpack(value.as_ref())).map_err(|e| hook_error(op, Stage::Unpack, e))?;
                    if tensor.dims() != dims.as_slice() || tensor.dtype() != *dtype || tensor.device() != *device {
                        let message = format!(
                            "it returned a tensor of shape {:?} ({}, {}) for one saved as shape {dims:?} ({dtype}, \
                             {device})",
                            tensor.dims(),
                            tensor.dtype(),
                            tensor.device()
                        );
                        return Err(hook_error(op, Stage::Unpack, AutogradError::invalid(op, message)));
                    }
                    Ok(tensor)
                }
            })
            .collect()
    }

    /// (identity, bytes) of the storages the tensors kept as they are hold.
    pub(crate) fn kept_storages(&self) -> Vec<(usize, usize)> {
        self.saved
            .iter()
            .filter_map(|saved| match saved {
                Saved::Kept { tensor, .. } => Some((storage_key(tensor), tensor.storage().size_in_bytes())),
                Saved::Packed { .. } => None,
            })
            .collect()
    }
}

impl Drop for SavedTensors {
    fn drop(&mut self) {
        for saved in &self.saved {
            if let Saved::Kept { tensor, .. } = saved {
                unregister_saved(tensor);
            }
        }
    }
}

type Stage = SavedTensorHookStage;

fn hook_error(op: &'static str, stage: Stage, error: AutogradError) -> AutogradError {
    AutogradError::SavedTensorHook { op, stage, source: Box::new(error) }
}

fn check_version(op: &'static str, version: u64, expected: u64) -> Result<()> {
    if version == expected {
        Ok(())
    } else {
        Err(AutogradError::ModifiedInPlace { op, version, expected })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saved_hooks::saved_tensors_hooks;

    #[test]
    fn each_storage_counts_its_saves_once_per_save() -> Result<()> {
        let t = Tensor::ones([8, 8], DType::F32)?;
        let view = t.narrow(0, 2, 3)?;
        let storage = Arc::clone(t.storage());
        let a = SavedTensors::new("test", vec![t.clone(), view.clone()])?;
        assert_eq!(storage.saved_refs(), 2);
        assert_eq!(storage.category(), MemoryCategory::Activation);
        assert_eq!(a.kept_storages(), vec![(storage_key(&t), 256), (storage_key(&t), 256)]);
        let b = SavedTensors::new("test", vec![view])?;
        assert_eq!(storage.saved_refs(), 3);
        drop(a);
        assert_eq!(storage.saved_refs(), 1);
        drop(b);
        assert_eq!(storage.saved_refs(), 0);
        // An unpaired release changes nothing.
        assert!(!storage.remove_saved_ref());
        assert_eq!(storage.saved_refs(), 0);
        Ok(())
    }

    #[test]
    fn packed_tensors_are_not_counted_and_come_back_through_unpack() -> Result<()> {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3])?;
        let saved = {
            let _hooks = saved_tensors_hooks(
                |t| Ok(Packed::value(t.to_vec::<f32>()?)),
                |p| Ok(Tensor::from_vec(Packed::downcast_ref::<Vec<f32>>(p, "test")?.clone(), [3])?),
            );
            SavedTensors::new("test", vec![t.clone()])?
        };
        assert_eq!(t.storage().saved_refs(), 0);
        assert!(saved.kept_storages().is_empty());
        let back = saved.unpack("test")?;
        assert!(!back[0].shares_storage_with(&t));
        assert_eq!(back[0].to_vec::<f32>()?, [1.0, 2.0, 3.0]);
        // Changed in place while its storage lives: refused as without hooks.
        t.add_scalar_(1.0)?;
        assert!(matches!(saved.unpack("mul"), Err(AutogradError::ModifiedInPlace { op: "mul", .. })));
        Ok(())
    }

    #[test]
    fn a_failed_pack_releases_what_was_saved_and_fails_backward() -> Result<()> {
        let kept = Tensor::ones([4], DType::F32)?;
        let refused = Tensor::ones([5], DType::F32)?;
        let result = {
            let _hooks = saved_tensors_hooks(
                |t| if t.numel() == 4 { Ok(Packed::Keep) } else { Err(AutogradError::invalid("my_pack", "refused")) },
                |_| Err(AutogradError::invalid("test", "never unpacked")),
            );
            SavedTensors::new("linear", vec![kept.clone(), refused])
        };
        let error = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(error, "linear: the saved-tensor pack hook failed: my_pack: refused");
        assert_eq!(kept.storage().saved_refs(), 0);
        let failed = SavedTensors::failed(AutogradError::invalid("x", "y"));
        assert!(failed.unpack("x").is_err());
        Ok(())
    }
}
