//! Meta devices: the handle that keeps one alive ([`MetaDevice`]), the
//! registry that maps a meta device to its state (what it imitates, a
//! [`MemoryTarget`], and its caching allocator), and the ledger of what is
//! alive on it for plans.
//!
//! Each meta device owns a real [`CachingAllocator`] over a
//! [`VirtualBackend`] with the target's capacity, page granularity and
//! allocator configuration, so rounding, pools, splitting, segments and the
//! out-of-memory ladder are the target's own. Tensors on it have shapes,
//! dtypes and accounted storage, and no values.

use crate::backend::target::MemoryTarget;
use crate::device::Device;
use crate::error::{Result, TensorError};
use brasa_alloc::{CachingAllocator, MemoryCategory, VirtualBackend};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// A tensor alive on a meta device: what made it and what it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveTensor {
    /// Bytes asked for (elements × dtype size).
    pub bytes: usize,
    /// Bytes of the allocator's block (the request rounded).
    pub block_bytes: usize,
    /// The dtype's name.
    pub dtype: String,
    /// The op that allocated it.
    pub op: String,
    /// Its category.
    pub category: MemoryCategory,
}

/// What a meta device remembers of its allocations for a plan: the live
/// tensors, and those live at the peak of allocated bytes.
#[derive(Default)]
pub(crate) struct Ledger {
    next_id: u64,
    live: BTreeMap<u64, LiveTensor>,
    allocated: usize,
    peak: usize,
    at_peak: Vec<LiveTensor>,
    first_failure: Option<FailedAllocation>,
    assumptions: Vec<PlanAssumption>,
}

/// Where a plan modelled something the real run may do differently, said
/// rather than guessed silently: which op, what was assumed, how many of
/// its calls assumed it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PlanAssumption {
    /// The op.
    pub op: String,
    /// What the plan took it to do, and how the run can differ.
    pub assumption: String,
    /// How many of the op's calls were planned so.
    pub calls: usize,
}

/// The first allocation a meta device refused: what the target would have
/// answered with an out-of-memory error.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailedAllocation {
    /// The op that asked.
    pub op: String,
    /// Bytes asked for.
    pub requested: usize,
    /// Its category.
    pub category: MemoryCategory,
    /// Bytes allocated when it was asked for.
    pub allocated: usize,
    /// Bytes reserved when it was asked for.
    pub reserved: usize,
    /// The allocator's message.
    pub message: String,
}

impl Ledger {
    pub(crate) fn first_failure(&self) -> Option<FailedAllocation> {
        self.first_failure.clone()
    }

    pub(crate) fn peak_tensors(&self) -> Vec<LiveTensor> {
        self.at_peak.clone()
    }

    pub(crate) fn live_tensors(&self) -> Vec<LiveTensor> {
        self.live.values().cloned().collect()
    }

    pub(crate) fn assumptions(&self) -> Vec<PlanAssumption> {
        self.assumptions.clone()
    }
}

pub(crate) struct MetaState {
    pub(crate) target: MemoryTarget,
    /// Behind an `Arc` so that `crate::memory` can hold it while it reads.
    pub(crate) allocator: Arc<CachingAllocator<VirtualBackend>>,
    pub(crate) ledger: Mutex<Ledger>,
}

impl MetaState {
    /// Records a new storage of `block_bytes` (the allocator's block) and returns its ledger id.
    pub(crate) fn record(&self, tensor: LiveTensor, block_bytes: usize) -> u64 {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let id = ledger.next_id;
        ledger.next_id += 1;
        ledger.live.insert(id, tensor);
        ledger.allocated += block_bytes;
        if ledger.allocated > ledger.peak {
            ledger.peak = ledger.allocated;
            ledger.at_peak = ledger.live.values().cloned().collect();
        }
        id
    }

    pub(crate) fn forget(&self, id: u64, block_bytes: usize) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.live.remove(&id);
        ledger.allocated -= block_bytes;
    }

    pub(crate) fn recategorize(&self, id: u64, category: MemoryCategory) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tensor) = ledger.live.get_mut(&id) {
            tensor.category = category;
        }
    }

    /// Counts a call of `op` planned on `assumption`.
    pub(crate) fn assume(&self, op: &str, assumption: &str) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        match ledger.assumptions.iter_mut().find(|a| a.op == op && a.assumption == assumption) {
            Some(known) => known.calls += 1,
            None => ledger.assumptions.push(PlanAssumption {
                op: op.to_string(),
                assumption: assumption.to_string(),
                calls: 1,
            }),
        }
    }

    /// Remembers the first allocation the device refused.
    pub(crate) fn note_failure(&self, failure: FailedAllocation) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.first_failure.get_or_insert(failure);
    }

    pub(crate) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

static REGISTRY: RwLock<BTreeMap<usize, Arc<MetaState>>> = RwLock::new(BTreeMap::new());
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(0);

/// The state of meta device `device` (an error once its [`MetaDevice`] dropped).
pub(crate) fn meta_state(device: Device) -> Result<Arc<MetaState>> {
    let index = device.index();
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).get(&index).cloned().ok_or_else(|| {
        TensorError::Device(format!(
            "meta:{index} does not exist (any more): a meta device lives as long as its MetaDevice handle"
        ))
    })
}

/// A meta device: a [`Device::Meta`] that imitates a [`MemoryTarget`],
/// alive while this handle lives. Tensors made on [`MetaDevice::device`]
/// have shapes, dtypes and storage accounted by the target's allocator
/// policy, and no values; every op allocates what it would on the target
/// and computes nothing. Reading values (`to_vec`, `item`) is an error that
/// names the op.
///
/// ```
/// use brasa_tensor::{memory, DType, MemoryTarget, MetaDevice, Tensor};
///
/// let meta = MetaDevice::new(MemoryTarget::cuda(80 << 30))?;
/// let x = Tensor::zeros_on([8192, 8192], DType::F32, meta.device())?;   // 256 MiB, never touched
/// let y = x.matmul(&x)?;
/// assert_eq!(y.dims(), &[8192, 8192]);
/// assert_eq!(memory::allocated(meta.device())?, 512 << 20);
/// assert!(y.to_vec::<f32>().is_err());                                  // no values to read
/// # Ok::<(), brasa_tensor::TensorError>(())
/// ```
pub struct MetaDevice {
    device: Device,
    state: Arc<MetaState>,
}

impl MetaDevice {
    /// A new meta device imitating `target`.
    pub fn new(target: MemoryTarget) -> Result<MetaDevice> {
        let index = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
        let mut backend = VirtualBackend::new(format!("meta:{index} ({})", target.name()), target.capacity());
        if let Some(page) = target.granularity() {
            backend = backend.with_granularity(page);
        }
        let allocator = Arc::new(CachingAllocator::with_config(backend, target.config().clone()));
        // A plan's allocations reach a running profiler's memory timeline as the device's would.
        allocator.set_observer(Some(crate::profiling::allocator_observer(Device::Meta(index))));
        let state = Arc::new(MetaState { target, allocator, ledger: Mutex::new(Ledger::default()) });
        REGISTRY.write().unwrap_or_else(|e| e.into_inner()).insert(index, Arc::clone(&state));
        Ok(MetaDevice { device: Device::Meta(index), state })
    }

    /// The device to make tensors on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// What it imitates.
    pub fn target(&self) -> &MemoryTarget {
        &self.state.target
    }

    /// The tensors alive now, with the op that made each and its category.
    pub fn live_tensors(&self) -> Vec<LiveTensor> {
        self.state.ledger().live_tensors()
    }

    pub(crate) fn state(&self) -> &Arc<MetaState> {
        &self.state
    }
}

impl Drop for MetaDevice {
    fn drop(&mut self) {
        REGISTRY.write().unwrap_or_else(|e| e.into_inner()).remove(&self.device.index());
    }
}

impl std::fmt::Debug for MetaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaDevice").field("device", &self.device).field("target", &self.state.target).finish()
    }
}
