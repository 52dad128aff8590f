//! [`autocast`]: a scoped, thread-local, nestable mixed-precision region.
//!
//! Inside a region, operations that ask the precision hook
//! (`brasa_autograd::autocast_inputs`) compute in the dtype the region's
//! [`Policy`] for their device gives them. As `torch.autocast(device_type=
//! ...)`, the policy is chosen by the device the inputs live on:
//! [`Policy::cuda`] for CUDA tensors (matrix products, linear layers and
//! convolutions in the low dtype; softmax, exp/log, pow, sums and means,
//! losses and norms in f32; `cat`/`stack` in the widest input dtype) and
//! [`Policy::cpu`] for host tensors (PyTorch's CPU lists: products,
//! convolutions and attention in the low dtype; losses in f32; softmax,
//! exp/log and batch norm follow their inputs). [`Autocast::policy`],
//! [`Autocast::cpu_policy`] and [`Autocast::cuda_policy`] override them.
//! Everything unlisted runs in its inputs' dtype. The casts are differentiable, so
//! backward runs each operation in the dtype its forward used and every
//! leaf receives its gradient in its own dtype (f32 for f32 parameters).
//! One difference from PyTorch, in precision's favour: on the host, a
//! `linear` layer's f32 weight gets its gradient as the f32 sums of the
//! half products, not rounded to half and converted back.
//!
//! As in PyTorch:
//! - the state is per thread: a region on one thread does not change another;
//! - regions nest: the innermost decides, and [`autocast_disabled`] turns
//!   autocast off inside a region (for a part that must run in f32);
//! - the low-precision casts of parameters (leaves that require grad) are
//!   cached until the outermost region ends, so a weight used by several
//!   operations, or several micro-batches, is converted once. A cast is
//!   made again if the parameter changed in place since (an optimizer
//!   step inside the region), which PyTorch's cache does not notice;
//! - in-place operations and explicit conversions (`Var::to_dtype`) are not
//!   autocast, nor are f64 tensors and operations without float inputs;
//! - a region whose dtype is neither f16 nor bf16 is a disabled region.
//!
//! Each region installs a hook object that carries its dtype and policy, so
//! code that captures `brasa_autograd::precision_hook()` during forward and
//! reinstalls it later (a recomputation in backward) computes in the same
//! dtypes.
//!
//! ```
//! use brasa_amp::{autocast, autocast_disabled};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let w = Var::param(Tensor::randn([4, 3], DType::F32)?)?;
//! let x = Var::new(Tensor::randn([2, 4], DType::F32)?);
//! let loss = {
//!     let _amp = autocast(DType::BF16);
//!     let h = x.matmul(&w)?;                     // bf16
//!     assert_eq!(h.dtype(), DType::BF16);
//!     {
//!         let _f32 = autocast_disabled();
//!         assert_eq!(x.matmul(&w)?.dtype(), DType::F32);
//!     }
//!     h.log_softmax(-1)?.mean_all()?             // mean: f32 (brasa's addition)
//! };
//! assert_eq!(loss.dtype(), DType::F32);
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().dtype(), DType::F32);
//! # Ok::<(), brasa_amp::AmpError>(())
//! ```

use crate::policy::Policy;
use brasa_autograd::{apply, set_precision_hook, Function, FunctionCtx, PrecisionHook, Var};
use brasa_tensor::{DType, Device, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

/// How a region is entered: [`Autocast::new`], then options, then
/// [`Autocast::enter`]. [`autocast`] is `Autocast::new(dtype).enter()`.
///
/// ```
/// use brasa_amp::{Autocast, Category, Policy};
/// use brasa_tensor::DType;
///
/// let policy = Policy::cpu().with("softmax", Category::Float32);
/// let _amp = Autocast::new(DType::BF16).policy(policy).cache(false).enter();
/// assert_eq!(brasa_amp::autocast_dtype(), Some(DType::BF16));
/// ```
#[derive(Clone, Debug)]
pub struct Autocast {
    dtype: DType,
    enabled: bool,
    cache: bool,
    policies: DevicePolicies,
}

/// A region's tables, one per device type.
#[derive(Clone, Debug)]
struct DevicePolicies {
    /// For tensors in host memory (`cpu:N`).
    cpu: Arc<Policy>,
    /// For tensors on CUDA devices.
    cuda: Arc<Policy>,
}

impl DevicePolicies {
    /// PyTorch's choice: the CPU lists for host tensors, the CUDA lists for CUDA ones.
    fn defaults() -> DevicePolicies {
        static CPU: OnceLock<Arc<Policy>> = OnceLock::new();
        static CUDA: OnceLock<Arc<Policy>> = OnceLock::new();
        DevicePolicies {
            cpu: Arc::clone(CPU.get_or_init(|| Arc::new(Policy::cpu()))),
            cuda: Arc::clone(CUDA.get_or_init(|| Arc::new(Policy::cuda()))),
        }
    }

    fn for_device(&self, device: Device) -> &Arc<Policy> {
        match device {
            Device::Cpu(_) => &self.cpu,
            Device::Cuda(_) => &self.cuda,
            // A meta device casts as the device it imitates.
            Device::Meta(_) => match brasa_tensor::MemoryTarget::like(device).map(|target| target.kind()) {
                Ok(brasa_tensor::TargetKind::Cuda) => &self.cuda,
                _ => &self.cpu,
            },
        }
    }
}

impl Autocast {
    /// A region computing low-precision operations in `dtype` (f16 or
    /// bf16; another dtype makes a disabled region, as PyTorch does), with
    /// each device type's default [`Policy`] ([`Policy::cpu`] for host
    /// tensors, [`Policy::cuda`] for CUDA ones) and the weight-cast cache on.
    pub fn new(dtype: DType) -> Autocast {
        Autocast { dtype, enabled: true, cache: true, policies: DevicePolicies::defaults() }
    }

    /// Enabled (the default) or a region that turns autocast off.
    pub fn enabled(self, enabled: bool) -> Autocast {
        Autocast { enabled, ..self }
    }

    /// Whether parameter casts are cached in this region (default true;
    /// PyTorch's `cache_enabled`).
    pub fn cache(self, cache: bool) -> Autocast {
        Autocast { cache, ..self }
    }

    /// The table this region consults for tensors on every device.
    pub fn policy(self, policy: impl Into<Arc<Policy>>) -> Autocast {
        let policy = policy.into();
        Autocast { policies: DevicePolicies { cpu: Arc::clone(&policy), cuda: policy }, ..self }
    }

    /// The table for host tensors (default [`Policy::cpu`]).
    pub fn cpu_policy(mut self, policy: impl Into<Arc<Policy>>) -> Autocast {
        self.policies.cpu = policy.into();
        self
    }

    /// The table for CUDA tensors (default [`Policy::cuda`]).
    pub fn cuda_policy(mut self, policy: impl Into<Arc<Policy>>) -> Autocast {
        self.policies.cuda = policy.into();
        self
    }

    /// Enters the region; it lasts until the guard is dropped.
    pub fn enter(self) -> AutocastGuard {
        let enabled = self.enabled && matches!(self.dtype, DType::F16 | DType::BF16);
        push(enabled, AmpHook { dtype: self.dtype, cache: self.cache, policies: self.policies })
    }
}

/// Enters an autocast region computing in `dtype` (f16 or bf16) with the
/// default policy; see the module docs.
pub fn autocast(dtype: DType) -> AutocastGuard {
    Autocast::new(dtype).enter()
}

/// Enters a region with autocast off (nested in an autocast region: the
/// part that must run in the inputs' own dtypes). Casts cached by the
/// enclosing region are kept.
pub fn autocast_disabled() -> AutocastGuard {
    let dtype = autocast_dtype().unwrap_or(DType::F16);
    Autocast::new(dtype).enabled(false).enter()
}

/// Whether autocast is on in this thread's innermost region.
pub fn is_autocast_enabled() -> bool {
    autocast_dtype().is_some()
}

/// The low dtype of this thread's innermost region, or `None` when
/// autocast is off.
pub fn autocast_dtype() -> Option<DType> {
    STATE.with(|state| state.borrow().frames.last().and_then(|f| f.hook.as_ref()).map(|h| h.dtype))
}

/// The policy this thread's innermost enabled region applies to tensors on
/// `device`.
pub fn autocast_policy(device: Device) -> Option<Arc<Policy>> {
    STATE.with(|state| {
        let state = state.borrow();
        let hook = state.frames.last().and_then(|f| f.hook.as_ref())?;
        Some(Arc::clone(hook.policies.for_device(device)))
    })
}

/// Parameter casts held by this thread's cache.
pub fn cached_casts() -> usize {
    STATE.with(|state| state.borrow().cache.len())
}

/// Drops this thread's cached parameter casts now (PyTorch's
/// `torch.clear_autocast_cache`); the outermost region does it on exit.
pub fn clear_autocast_cache() {
    // Dropped outside the borrow: freeing tensors runs no amp code, but
    // keep the state's borrow as short as possible anyway.
    let cache = STATE.with(|state| std::mem::take(&mut state.borrow_mut().cache));
    drop(cache);
}

/// Keeps a region open; dropping it leaves the region (and, for the
/// outermost one, empties the cast cache and removes the precision hook).
/// Not `Send`: the region belongs to the thread that entered it.
#[must_use = "the region ends when the guard is dropped"]
pub struct AutocastGuard {
    /// The id of the frame this guard opened (found by id, not by depth: a
    /// frame closed early by an outer guard may have been replaced since by
    /// a new region at the same depth, which this guard must not close).
    id: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let (restore, cache) = STATE.with(|state| {
            let mut state = state.borrow_mut();
            let Some(depth) = state.frames.iter().position(|frame| frame.id == self.id) else {
                // Closed already, by an outer guard dropped first.
                return (None, HashMap::new());
            };
            // Out-of-order drops also close the regions entered after this one.
            let closed = state.frames.split_off(depth);
            let previous = closed.into_iter().next().map(|frame| frame.previous);
            let cache = if state.frames.is_empty() { std::mem::take(&mut state.cache) } else { HashMap::new() };
            (previous, cache)
        });
        if let Some(previous) = restore {
            set_precision_hook(previous);
        }
        drop(cache);
    }
}

impl std::fmt::Debug for AutocastGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AutocastGuard({})", self.id)
    }
}

// ----- the thread's state -------------------------------------------------------------

/// One region.
struct Frame {
    /// Its guard's id.
    id: u64,
    /// The hook this region installed (`None`: autocast off).
    hook: Option<Arc<AmpHook>>,
    /// The hook it replaced, put back when it ends.
    previous: Option<Arc<dyn PrecisionHook>>,
}

/// A cached low-precision copy of a parameter's tensor.
struct CacheEntry {
    /// The parameter's tensor: keeps its storage (the key) alive and is
    /// compared by layout.
    source: Tensor,
    /// The storage version the copy was made at.
    version: u64,
    cast: Tensor,
}

/// Storage address, offset and target dtype: the identity of the data a
/// parameter holds (two `Var`s over the same data share one cast; each
/// still gets its own gradient).
type CacheKey = (usize, usize, DType);

#[derive(Default)]
struct State {
    frames: Vec<Frame>,
    /// The id of the next frame.
    next_id: u64,
    cache: HashMap<CacheKey, CacheEntry>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Installs the region's hook (none for a disabled region) and records
/// the one it replaces.
fn push(enabled: bool, hook: AmpHook) -> AutocastGuard {
    let hook = enabled.then(|| Arc::new(hook));
    let previous = set_precision_hook(hook.clone().map(|h| h as Arc<dyn PrecisionHook>));
    let id = STATE.with(|state| {
        let mut state = state.borrow_mut();
        let id = state.next_id;
        state.next_id += 1;
        state.frames.push(Frame { id, hook, previous });
        id
    });
    AutocastGuard { id, _not_send: PhantomData }
}

/// The precision hook a region installs: its policy and dtype decide, and
/// parameter casts go through the thread's cache. It carries the region's
/// whole state, so code that captures the hook
/// (`brasa_autograd::precision_hook`) and reinstalls it later (a
/// recomputation in backward) computes in the same dtypes.
struct AmpHook {
    dtype: DType,
    cache: bool,
    policies: DevicePolicies,
}

impl PrecisionHook for AmpHook {
    fn target(&self, op: &str, inputs: &[DType], device: Device) -> Option<DType> {
        self.policies.for_device(device).target(op, inputs, self.dtype)
    }

    fn cast(&self, var: &Var, dtype: DType) -> brasa_autograd::Result<Var> {
        if !self.cacheable(var, dtype) {
            return var.to_dtype(dtype);
        }
        let cast = cached_tensor(var.tensor(), dtype)?;
        apply(CachedCast { cast: Some(cast) }, &[var])
    }

    fn cast_tensor(&self, var: &Var, dtype: DType) -> brasa_autograd::Result<Tensor> {
        if !self.cacheable(var, dtype) {
            return Ok(var.tensor().to_dtype(dtype)?);
        }
        cached_tensor(var.tensor(), dtype)
    }
}

impl AmpHook {
    /// As PyTorch: only f32 leaves that require grad (parameters), cast to a
    /// half type, are cached; activations change every step.
    fn cacheable(&self, var: &Var, dtype: DType) -> bool {
        var.is_leaf()
            && var.requires_grad()
            && var.dtype() == DType::F32
            && matches!(dtype, DType::F16 | DType::BF16)
            && self.cache
            // Only while a region is open here, so the cache is emptied when it ends.
            && STATE.with(|state| !state.borrow().frames.is_empty())
    }
}

/// The cached cast of `source` to `dtype`, made (again) when absent or stale.
fn cached_tensor(source: &Tensor, dtype: DType) -> brasa_autograd::Result<Tensor> {
    let key: CacheKey = (Arc::as_ptr(source.storage()) as usize, source.layout().offset(), dtype);
    let fresh = |entry: &CacheEntry| entry.source.layout() == source.layout() && entry.version == source.version();
    let hit = STATE.with(|state| state.borrow().cache.get(&key).filter(|e| fresh(e)).map(|e| e.cast.clone()));
    if let Some(cast) = hit {
        return Ok(cast);
    }
    let cast = source.to_dtype(dtype)?;
    let entry = CacheEntry { source: source.clone(), version: source.version(), cast: cast.clone() };
    let stale = STATE.with(|state| state.borrow_mut().cache.insert(key, entry));
    drop(stale);
    Ok(cast)
}

/// A parameter's cached cast as an operation of its own: a fresh graph node
/// per use (so every backward finds one, however many steps share the
/// cached tensor), handing the gradient back in the parameter's dtype.
struct CachedCast {
    cast: Option<Tensor>,
}

impl Function for CachedCast {
    fn name(&self) -> &'static str {
        "to_dtype"
    }

    fn forward(&mut self, _ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        match self.cast.take() {
            Some(cast) => Ok(cast),
            None => Ok(inputs[0].clone()),
        }
    }

    fn backward(
        &mut self,
        _saved: &[Tensor],
        grad_output: &Tensor,
        _needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        // `apply` converts the gradient to the parameter's dtype.
        Ok(vec![Some(grad_output.clone())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_autograd::precision_hook;

    #[test]
    fn guards_nest_and_restore() {
        assert!(!is_autocast_enabled());
        assert!(precision_hook().is_none());
        {
            let _outer = autocast(DType::F16);
            assert_eq!(autocast_dtype(), Some(DType::F16));
            assert!(precision_hook().is_some());
            {
                let _inner = autocast(DType::BF16);
                assert_eq!(autocast_dtype(), Some(DType::BF16));
                let _off = autocast_disabled();
                assert!(!is_autocast_enabled());
            }
            assert_eq!(autocast_dtype(), Some(DType::F16));
        }
        assert!(!is_autocast_enabled());
        assert!(precision_hook().is_none());
    }

    #[test]
    fn a_captured_hook_carries_the_region() -> brasa_autograd::Result<()> {
        use brasa_autograd::set_precision_hook;
        let w = Var::param(Tensor::ones([2, 2], DType::F32)?)?;
        let captured = {
            let _amp = autocast(DType::BF16);
            precision_hook().expect("installed")
        };
        assert!(precision_hook().is_none());
        // Reinstalled outside any region (a recomputation in backward): the
        // same dtypes, and nothing left in the cache afterwards.
        let previous = set_precision_hook(Some(captured));
        assert_eq!(w.matmul(&w)?.dtype(), DType::BF16);
        assert_eq!(w.softmax(-1)?.dtype(), DType::F32);
        set_precision_hook(previous);
        assert_eq!(cached_casts(), 0);
        Ok(())
    }

    #[test]
    fn out_of_order_drops_close_inner_regions() {
        let outer = autocast(DType::F16);
        let inner = autocast(DType::BF16);
        drop(outer);
        assert!(!is_autocast_enabled());
        assert!(precision_hook().is_none());
        drop(inner);
        assert!(precision_hook().is_none());
    }

    #[test]
    fn a_stale_guard_does_not_close_a_newer_region_at_its_depth() {
        let outer = autocast(DType::F16);
        let inner = autocast(DType::BF16);
        drop(outer); // closes both regions
        let again = autocast(DType::BF16);
        let newer = autocast(DType::F16); // at the depth `inner` had
        drop(inner); // closed already: must leave `newer` alone
        assert_eq!(autocast_dtype(), Some(DType::F16));
        drop(newer);
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        drop(again);
        assert!(!is_autocast_enabled() && precision_hook().is_none());
    }

    #[test]
    fn unsupported_dtype_is_a_disabled_region() {
        let _amp = autocast(DType::F32);
        assert!(!is_autocast_enabled());
    }

    #[test]
    fn regions_are_per_thread() {
        let _amp = autocast(DType::BF16);
        let other = std::thread::spawn(is_autocast_enabled).join().unwrap();
        assert!(!other);
        assert!(is_autocast_enabled());
    }
}
