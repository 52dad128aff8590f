//! Activation offload (`torch.autograd.graph.save_on_cpu`): while the guard
//! of [`save_on_host`] lives, each tensor an operation saves for backward is
//! copied to page-locked host memory, and the graph keeps that copy instead
//! of the device's memory; when backward reaches the operation, the tensor
//! is copied back to its device for that backward only. The device then
//! holds the activations of one operation at a time rather than of the
//! whole forward pass, for two copies of each. A tensor saved by several
//! operations (a relu's output, saved by the relu and by the next matrix
//! product) is copied to the host once.
//!
//! ```
//! use brasa_autograd::{save_on_host, Var};
//! use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};
//!
//! set_host_device_count(2)?;
//! let dev = Device::cpu(1); // a logical host device with its own allocator, standing in for a GPU
//! let w = Var::param(Tensor::randn_on([128, 128], DType::F32, dev)?)?;
//! let x = Var::new(Tensor::randn_on([64, 128], DType::F32, dev)?);
//! let pinned = memory::pinned_stats()?.allocated_bytes.all.current;
//! let loss = {
//!     let _offload = save_on_host(); // what the forward saves goes to pinned host memory
//!     x.matmul(&w)?.relu()?.matmul(&w)?.relu()?.mean_all()?
//! };
//! assert!(memory::pinned_stats()?.allocated_bytes.all.current > pinned);
//! loss.backward()?; // copied back to cpu:1 one operation at a time
//! drop(loss);
//! assert_eq!(memory::pinned_stats()?.allocated_bytes.all.current, pinned); // all returned
//! assert_eq!(w.grad().map(|g| g.device()), Some(dev));
//! # Ok::<(), brasa_autograd::AutogradError>(())
//! ```
//!
//! What stays where it is, as it would without offload:
//! - **parameters** (storages counted as [`MemoryCategory::Parameter`], as
//!   [`Var::param`](crate::Var::param) makes them): the model holds them on
//!   the device for the whole step anyway, so a copy would free nothing
//!   and cost two transfers;
//! - tensors **already in host memory of the pinned pool's device**
//!   (`Device::CPU`, `cpu:0`), and tensors already pinned: a copy would
//!   stay in the same memory;
//! - **tiny tensors**, under [`OffloadOptions::min_bytes`]: the copies'
//!   fixed cost (two allocations, on a GPU a synchronisation) is not worth
//!   the few bytes;
//! - tensors on a meta device, which holds no values (a memory plan of a
//!   step under offload therefore counts the saved tensors on the device:
//!   an upper bound).
//!
//! Copies: to the host synchronously (the host copy must be complete
//! before the device memory can be reused); back to the device with
//! [`Tensor::to_non_blocking`], which from pinned memory to a CUDA device
//! is queued on the current stream, ahead of the backward's kernels that
//! read it. From a CUDA device the tensor goes through pageable host
//! memory before it is pinned (brasa-tensor has no direct device-to-pinned
//! copy yet). A saved tensor that is a transpose or permutation of a
//! contiguous one comes back with its strides, so backward runs the same
//! kernels and the gradients are bit for bit those without offload; a
//! strided view of a larger storage comes back contiguous (only its own
//! elements are copied).
//!
//! Pinning that fails (locked memory is capped by `RLIMIT_MEMLOCK` where
//! no device driver pins it; see [`Tensor::pin_memory`]) is the pack hook's
//! error; [`save_on_host_with`] with `pin_memory: false` offloads to
//! pageable host memory instead (PyTorch's `save_on_cpu(pin_memory=False)`).
//! The host copies are counted as [`MemoryCategory::Activation`] in
//! [`brasa_tensor::memory::pinned_stats`] (or `cpu:0`'s statistics when not
//! pinned), and are freed when the node's saved tensors are released.

use crate::error::{AutogradError, Result};
use crate::saved_hooks::{install_saved_tensor_hooks, Packed, SavedTensorHooks, SavedTensorsHooksGuard};
use brasa_tensor::memory::{category_scope, MemoryCategory};
use brasa_tensor::{Device, Storage, Tensor};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

const OP: &str = "save_on_host";

/// How [`save_on_host_with`] offloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadOptions {
    /// Copy into page-locked host memory ([`Tensor::pin_memory`]), from which
    /// the copy back to a GPU is asynchronous; `false`: pageable host memory
    /// (`Device::CPU`). Default `true`.
    pub pin_memory: bool,
    /// Tensors of fewer bytes stay where they are. Default
    /// [`OffloadOptions::DEFAULT_MIN_BYTES`].
    pub min_bytes: usize,
}

impl OffloadOptions {
    /// The default [`OffloadOptions::min_bytes`]: 1 KiB.
    pub const DEFAULT_MIN_BYTES: usize = 1 << 10;
}

impl Default for OffloadOptions {
    fn default() -> Self {
        OffloadOptions { pin_memory: true, min_bytes: OffloadOptions::DEFAULT_MIN_BYTES }
    }
}

/// Offloads the tensors saved for backward on this thread to pinned host
/// memory until the guard drops (see the module docs).
pub fn save_on_host() -> SavedTensorsHooksGuard {
    save_on_host_with(OffloadOptions::default())
}

/// [`save_on_host`] with options.
pub fn save_on_host_with(options: OffloadOptions) -> SavedTensorsHooksGuard {
    install_saved_tensor_hooks(Arc::new(SaveOnHost { options, copies: Mutex::default() }))
}

/// The hooks of [`save_on_host`].
struct SaveOnHost {
    options: OffloadOptions,
    /// The host copies these hooks made, by the view they copied, so that
    /// a tensor saved by several operations (a relu's output, saved by the
    /// relu and by the next matrix product) is copied once.
    copies: Mutex<Copies>,
}

/// A view: its storage's address, offset, shape and strides.
type ViewKey = (usize, usize, Vec<usize>, Vec<isize>);

#[derive(Default)]
struct Copies {
    /// The storage copied (to tell a reused address from it), its version
    /// then, and the copy while a graph holds it.
    by_view: HashMap<ViewKey, (Weak<Storage>, u64, Weak<OnHost>)>,
    /// Entries when dead ones were last dropped.
    live_after_sweep: usize,
}

impl Copies {
    fn find(&self, key: &ViewKey, t: &Tensor) -> Option<Arc<OnHost>> {
        let (storage, version, copy) = self.by_view.get(key)?;
        let same = storage.upgrade().is_some_and(|s| Arc::ptr_eq(&s, t.storage())) && *version == t.version();
        same.then(|| copy.upgrade()).flatten()
    }

    fn insert(&mut self, key: ViewKey, t: &Tensor, copy: &Arc<OnHost>) {
        self.by_view.insert(key, (Arc::downgrade(t.storage()), t.version(), Arc::downgrade(copy)));
        // Entries whose copies are gone, dropped once the map has doubled.
        if self.by_view.len() > 2 * self.live_after_sweep.max(32) {
            self.by_view.retain(|_, (storage, _, copy)| storage.strong_count() > 0 && copy.strong_count() > 0);
            self.live_after_sweep = self.by_view.len();
        }
    }
}

/// A saved tensor on the host.
struct OnHost {
    host: Tensor,
    /// Where it came from, and goes back to.
    device: Device,
    /// The permutation that gives the saved tensor's strides back.
    order: Option<Vec<usize>>,
}

impl SaveOnHost {
    /// Whether a copy of `t` to the host frees device memory worth it.
    fn moves(&self, t: &Tensor) -> bool {
        let bytes = t.numel() * t.dtype().size_in_bytes();
        let device = t.device();
        bytes >= self.options.min_bytes
            && device != Device::CPU
            && !device.is_meta()
            && !t.is_pinned()
            && t.storage().category() != MemoryCategory::Parameter
    }

    /// `tensor`'s values in host memory.
    fn copy(&self, tensor: &Tensor) -> Result<OnHost> {
        let (dense, order) = dense_permutation(tensor)?;
        let host = if !self.options.pin_memory {
            dense.to(Device::CPU)?
        } else {
            let readable = if dense.device().is_cpu() { dense } else { dense.to(Device::CPU)? };
            readable.pin_memory().map_err(|e| match e.as_out_of_memory() {
                // Kept as it is, so that a step wrapper sees an out-of-memory.
                Some(_) => AutogradError::Tensor(e),
                None => AutogradError::invalid(
                    OP,
                    format!(
                        "{e}; offload to pageable host memory with save_on_host_with(OffloadOptions {{ pin_memory: \
                         false, .. }})"
                    ),
                ),
            })?
        };
        host.storage().set_category(MemoryCategory::Activation);
        Ok(OnHost { host, device: tensor.device(), order })
    }
}

impl SavedTensorHooks for SaveOnHost {
    fn pack(&self, tensor: &Tensor) -> Result<Packed> {
        if !self.moves(tensor) {
            return Ok(Packed::Keep);
        }
        let key = (
            Arc::as_ptr(tensor.storage()) as usize,
            tensor.layout().offset(),
            tensor.dims().to_vec(),
            tensor.strides().to_vec(),
        );
        if let Some(copy) = lock(&self.copies).find(&key, tensor) {
            return Ok(Packed::value(copy));
        }
        let copy = Arc::new(self.copy(tensor)?);
        lock(&self.copies).insert(key, tensor, &copy);
        Ok(Packed::value(copy))
    }

    fn unpack(&self, packed: &(dyn Any + Send + Sync)) -> Result<Tensor> {
        let saved = Packed::downcast_ref::<Arc<OnHost>>(packed, OP)?;
        let back = {
            let _activation = category_scope(MemoryCategory::Activation);
            saved.host.to_non_blocking(saved.device)?
        };
        Ok(match &saved.order {
            Some(order) => back.permute(order)?,
            None => back,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `t` with its dimensions reordered so that it is contiguous, and the
/// order that gives `t`'s strides back, when `t` is a permutation of a
/// contiguous tensor (a transpose); `t` itself otherwise.
fn dense_permutation(t: &Tensor) -> Result<(Tensor, Option<Vec<usize>>)> {
    if t.is_contiguous() {
        return Ok((t.clone(), None));
    }
    let strides = t.strides();
    let mut by_stride: Vec<usize> = (0..t.rank()).collect();
    by_stride.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
    let dense = t.permute(&by_stride)?;
    if !dense.is_contiguous() {
        return Ok((t.clone(), None));
    }
    // Dimension d of `t` is dimension `back[d]` of `dense`.
    let mut back = vec![0; by_stride.len()];
    for (i, &d) in by_stride.iter().enumerate() {
        back[d] = i;
    }
    Ok((dense, Some(back)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::DType;

    #[test]
    fn permutations_come_back_with_their_strides() -> Result<()> {
        let t = Tensor::arange(0.0, 24.0, 1.0, DType::F32)?.reshape(&[2, 3, 4])?;
        let p = t.permute(&[2, 0, 1])?;
        let (dense, order) = dense_permutation(&p)?;
        assert!(dense.is_contiguous() && dense.shares_storage_with(&t));
        let order = order.unwrap_or_default();
        let back = dense.contiguous()?.permute(&order)?;
        assert_eq!(back.dims(), p.dims());
        assert_eq!(back.strides(), p.strides());
        assert_eq!(back.to_vec::<f32>()?, p.to_vec::<f32>()?);
        // A narrow of a larger tensor is copied as it is.
        let n = t.narrow(2, 1, 2)?;
        assert!(dense_permutation(&n)?.1.is_none());
        assert!(dense_permutation(&t)?.1.is_none());
        Ok(())
    }

    #[test]
    fn what_stays_where_it_is() -> Result<()> {
        let hooks = SaveOnHost { options: OffloadOptions::default(), copies: Mutex::default() };
        let host = Tensor::zeros([1024], DType::F32)?;
        assert!(!hooks.moves(&host), "cpu:0 is the pinned pool's device");
        assert!(matches!(hooks.pack(&host)?, Packed::Keep));
        Ok(())
    }
}
