//! The reducer: DDP's gradient synchronisation during backward (PyTorch's
//! `reducer.cpp`, in brasa's terms).
//!
//! Forward prepares a step: every parameter's `.grad` is its slice of a
//! bucket, each bucket expects all its parameters, parameters the graph
//! does not reach are found from brasa's own autograd graph. In backward,
//! each parameter's post-accumulate hook marks it ready; a bucket whose
//! last parameter became ready is all-reduced at once, non-blocking, while
//! backward goes on — strictly in bucket order so that every rank issues
//! the same collectives in the same order. The first hook queues a callback
//! that runs when backward ends: it launches what is left, waits for every
//! bucket and leaves averaged gradients in place, so `loss.backward()`
//! returns with gradients synced and optimizers need to know nothing.

use super::buckets::{assign_buckets, Bucket};
use super::config::{Compression, DdpConfig, ZeroStage};
use super::stats::DdpStats;
use crate::collective::ReduceOp;
use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use crate::work::Work;
use brasa_autograd::{leaves_reached, no_grad, queue_callback, Var};
use brasa_tensor::{DType, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// A bucket's all-reduce in flight.
struct InFlight {
    bucket: usize,
    work: Work,
    /// The bf16 copy on the wire, when compressing.
    compressed: Option<Tensor>,
}

#[derive(Default)]
struct StepState {
    /// Whether forward prepared a synchronising backward.
    expecting_backward: bool,
    /// Per bucket: parameters not ready yet.
    pending: Vec<usize>,
    /// Per parameter: ready this step.
    ready: Vec<bool>,
    ready_count: usize,
    /// The next bucket to launch (launches go strictly in order).
    next_bucket: usize,
    in_flight: Vec<InFlight>,
    callback_queued: bool,
    /// Parameters in the order their gradients became ready (kept from the
    /// first step for the bucket rebuild).
    ready_order: Vec<usize>,
    stats: DdpStats,
    backward_started: Option<Instant>,
}

struct Layout {
    buckets: Vec<Bucket>,
    /// Per parameter: (bucket, slot in the bucket).
    place: Vec<(usize, usize)>,
}

/// This rank's part of one bucket under ZeRO: the parameters it updates
/// (a view of the flat parameter buffer) and their averaged gradient.
#[derive(Clone)]
pub(crate) struct Shard {
    /// The flat parameter buffer of the bucket (every rank's shards).
    pub(crate) flat_param: Tensor,
    /// This rank's shard of it, as a leaf for the inner optimizer.
    pub(crate) param: Var,
    /// Its gradient: a view of the gradient bucket (stage 1) or the buffer
    /// the reduce-scatter writes (stage 2).
    pub(crate) grad: Tensor,
}

pub(crate) struct Reducer {
    pub(crate) comm: Communicator,
    pub(crate) params: Vec<Var>,
    pub(crate) names: Vec<String>,
    pub(crate) config: DdpConfig,
    /// How many `no_sync` guards are alive: while any is, gradients
    /// accumulate locally. A count, so guards may drop in any order.
    pub(crate) no_sync_guards: AtomicUsize,
    layout: Mutex<Layout>,
    step: Mutex<StepState>,
    /// Whether the buckets were rebuilt from the observed order.
    rebuilt: AtomicBool,
    steps_done: Mutex<u64>,
    /// Under ZeRO: this rank's shard of every bucket.
    pub(crate) shards: Vec<Shard>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reducer {
    /// Buckets in reverse parameter order (the order gradients usually
    /// become ready), the first-defined parameters in the small last bucket
    /// — PyTorch's initial assignment.
    pub(crate) fn initial_assignment(params: &[Var], config: &DdpConfig) -> Vec<Vec<usize>> {
        let sizes: Vec<(usize, DType)> = params.iter().map(|p| (p.numel(), p.dtype())).collect();
        let forward_order: Vec<usize> = (0..params.len()).collect();
        let mut assignment = assign_buckets(&sizes, &forward_order, config.first_bucket_bytes, config.bucket_cap_bytes);
        assignment.reverse();
        assignment
    }

    /// Gradient buckets following `assignment` and hooks on every
    /// parameter; under ZeRO, `flat_params` are the parameter buffers of
    /// the same buckets.
    pub(crate) fn new(
        comm: Communicator,
        params: Vec<Var>,
        names: Vec<String>,
        config: DdpConfig,
        assignment: Vec<Vec<usize>>,
        flat_params: Vec<Tensor>,
    ) -> Result<Arc<Reducer>> {
        let pad_to = if config.zero.is_some() { comm.world_size() } else { 1 };
        let layout = build_layout(&params, assignment, pad_to)?;
        let shards = match config.zero {
            None => Vec::new(),
            Some(stage) => {
                let (rank, world) = (comm.rank(), comm.world_size());
                layout
                    .buckets
                    .iter()
                    .zip(&flat_params)
                    .map(|(bucket, flat_param)| {
                        let len = bucket.numel / world;
                        let grad = match stage {
                            ZeroStage::One => bucket.flat.narrow(0, rank * len, len)?,
                            ZeroStage::Two => {
                                super::buckets::gradient_buffer(len, bucket.flat.dtype(), bucket.flat.device())?
                            }
                        };
                        let param = Var::param(flat_param.narrow(0, rank * len, len)?)?;
                        Ok(Shard { flat_param: flat_param.clone(), param, grad })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let reducer = Arc::new(Reducer {
            comm,
            params,
            names,
            config,
            no_sync_guards: AtomicUsize::new(0),
            layout: Mutex::new(layout),
            step: Mutex::new(StepState::default()),
            rebuilt: AtomicBool::new(false),
            steps_done: Mutex::new(0),
            shards,
        });
        for (index, param) in reducer.params.iter().enumerate() {
            let weak = Arc::downgrade(&reducer);
            param.register_post_accumulate_grad_hook(move |_| match weak.upgrade() {
                Some(reducer) => reducer.mark_ready(index).map_err(Into::into),
                None => Ok(()), // the DDP wrapper is gone: plain local gradients
            })?;
        }
        Ok(reducer)
    }

    /// Whether backward passes synchronise (no `no_sync` guard is alive).
    pub(crate) fn is_syncing(&self) -> bool {
        self.no_sync_guards.load(Ordering::Acquire) == 0
    }

    /// Bytes of gradient buckets currently allocated.
    pub(crate) fn allocated_bucket_bytes(&self) -> usize {
        lock(&self.layout).buckets.iter().filter(|b| !b.is_released()).map(Bucket::bytes).sum()
    }

    /// Bytes of each bucket, in launch order.
    pub(crate) fn bucket_bytes(&self) -> Vec<usize> {
        lock(&self.layout).buckets.iter().map(Bucket::bytes).collect()
    }

    /// Parameter indices of each bucket, in launch order.
    pub(crate) fn bucket_params(&self) -> Vec<Vec<usize>> {
        lock(&self.layout).buckets.iter().map(|b| b.params.clone()).collect()
    }

    pub(crate) fn stats(&self) -> DdpStats {
        lock(&self.step).stats.clone()
    }

    pub(crate) fn has_rebuilt(&self) -> bool {
        self.rebuilt.load(Ordering::Acquire)
    }

    /// Whether this forward must rebuild the buckets first: once, after the
    /// first synchronised step, unless unused parameters are searched (then
    /// the ready order can change from step to step).
    fn should_rebuild(&self) -> bool {
        self.config.rebuild_buckets
            && self.config.zero.is_none()
            && !self.config.find_unused_parameters
            && !self.has_rebuilt()
            && *lock(&self.steps_done) >= 1
    }

    /// Start of a forward. Rebuilds the buckets if due (a collective: every
    /// rank does it at the same step), allocates released buckets again and
    /// resets the step's bookkeeping. Gradients move into their bucket
    /// slices as they become ready (see [`Reducer::adopt`]).
    /// `expect_backward` is false for forwards that record no graph.
    pub(crate) fn prepare_forward(&self, expect_backward: bool) -> Result<()> {
        if self.should_rebuild() {
            self.rebuild()?;
        }
        let _no_grad = no_grad();
        let mut layout = lock(&self.layout);
        for bucket in layout.buckets.iter_mut().filter(|b| b.is_released()) {
            bucket.restore()?;
        }
        let pending = layout.buckets.iter().map(|b| b.params.len()).collect();
        drop(layout);
        *lock(&self.step) = StepState {
            expecting_backward: expect_backward && self.is_syncing(),
            pending,
            ready: vec![false; self.params.len()],
            ..StepState::default()
        };
        Ok(())
    }

    /// Makes parameter `index`'s `.grad` its bucket slice, keeping its
    /// value: a gradient backward just made is copied in (one pass, and its
    /// own memory goes back to the cache), a missing one is zeros, a slice
    /// that is already there stays. Copying on readiness instead of zeroing
    /// every slice before backward and adding into it saves two passes over
    /// the gradients per step.
    fn adopt(&self, layout: &Layout, index: usize) -> Result<()> {
        let _no_grad = no_grad();
        let (bucket, slot) = layout.place[index];
        let view = layout.buckets[bucket].view(&self.params, slot)?;
        let param = &self.params[index];
        match param.grad() {
            Some(grad) if grad.shares_storage_with(&view) && grad.layout() == view.layout() => return Ok(()),
            Some(grad) => view.copy_(&grad)?,
            None => view.zero_()?,
        }
        param.set_grad(Some(view))?;
        Ok(())
    }

    /// After forward: parameters the output does not reach would never
    /// become ready. An error naming them, or (with `find_unused_parameters`)
    /// marked ready now so their buckets still go out.
    pub(crate) fn check_unused(&self, output: &Var) -> Result<()> {
        if !lock(&self.step).expecting_backward {
            return Ok(());
        }
        let reached = leaves_reached(&[output], &self.params);
        let unused: Vec<usize> = reached.iter().enumerate().filter(|(_, r)| !**r).map(|(i, _)| i).collect();
        if unused.is_empty() {
            return Ok(());
        }
        if !self.config.find_unused_parameters {
            lock(&self.step).expecting_backward = false;
            return Err(ParallelError::UnusedParameters {
                rank: self.comm.rank(),
                names: unused.iter().map(|&i| self.names[i].clone()).collect(),
            });
        }
        let layout = lock(&self.layout);
        let mut step = lock(&self.step);
        for index in unused {
            self.adopt(&layout, index)?;
            step.ready[index] = true;
            step.ready_count += 1;
            step.pending[layout.place[index].0] -= 1;
        }
        Ok(())
    }

    /// A parameter's gradient was accumulated (its post-accumulate hook).
    fn mark_ready(self: &Arc<Self>, index: usize) -> Result<()> {
        let layout = lock(&self.layout);
        let mut step = lock(&self.step);
        if !step.expecting_backward {
            return Ok(()); // inside no_sync, or a backward DDP's forward did not prepare
        }
        if step.ready[index] {
            return Err(ParallelError::invalid(
                "DistributedDataParallel",
                format!(
                    "parameter {} got a gradient twice in one step (a second backward through the same forward, \
                     or a parameter shared in a way autograd reports twice); run forward again before each backward",
                    self.names[index]
                ),
            ));
        }
        self.adopt(&layout, index)?;
        step.ready[index] = true;
        step.ready_count += 1;
        step.ready_order.push(index);
        step.backward_started.get_or_insert_with(Instant::now);
        step.pending[layout.place[index].0] -= 1;
        if !step.callback_queued {
            step.callback_queued = true;
            let reducer = Arc::clone(self);
            queue_callback(move || reducer.finish_backward().map_err(Into::into))?;
        }
        // The launch made by the last gradient is not overlapped with anything.
        let overlapped = step.ready_count < self.params.len();
        self.launch_ready(&layout, &mut step, overlapped)
    }

    /// Launches, in order, every bucket whose parameters are all ready.
    fn launch_ready(&self, layout: &Layout, step: &mut StepState, overlapped: bool) -> Result<()> {
        while step.next_bucket < layout.buckets.len() && step.pending[step.next_bucket] == 0 {
            let index = step.next_bucket;
            let bucket = &layout.buckets[index];
            let (work, compressed) = match (self.config.zero, self.config.compression) {
                (Some(ZeroStage::Two), _) => {
                    (self.comm.reduce_scatter_async(&self.shards[index].grad, &bucket.flat, ReduceOp::Avg), None)
                }
                (_, Compression::None) => (self.comm.all_reduce_async(&bucket.flat, ReduceOp::Avg), None),
                (_, Compression::Bf16) => {
                    // PyTorch's bf16_compress_hook: divide, narrow, sum.
                    let _no_grad = no_grad();
                    let wire = bucket.flat.mul_scalar(1.0 / self.comm.world_size() as f64)?.to_dtype(DType::BF16)?;
                    (self.comm.all_reduce_async(&wire, ReduceOp::Sum), Some(wire))
                }
            };
            let bytes = bucket.bytes();
            step.stats.total_bytes += bytes;
            if overlapped {
                step.stats.overlapped_bytes += bytes;
            }
            step.in_flight.push(InFlight { bucket: index, work, compressed });
            step.next_bucket += 1;
        }
        Ok(())
    }

    /// End of backward: launch the rest, wait for everything, write back
    /// compressed results.
    fn finish_backward(&self) -> Result<()> {
        let in_flight = {
            let layout = lock(&self.layout);
            let mut step = lock(&self.step);
            self.launch_ready(&layout, &mut step, false)?;
            step.expecting_backward = false;
            if step.next_bucket < layout.buckets.len() {
                let missing: Vec<String> =
                    (0..self.params.len()).filter(|&i| !step.ready[i]).map(|i| self.names[i].clone()).collect();
                // Let what was launched finish before reporting, so the
                // communicator is not left with work nobody waits for.
                for flight in std::mem::take(&mut step.in_flight) {
                    let _ = flight.work.wait();
                }
                return Err(ParallelError::UnusedParameters { rank: self.comm.rank(), names: missing });
            }
            std::mem::take(&mut step.in_flight)
        };
        let wait_start = Instant::now();
        let mut first_error = None;
        for flight in in_flight {
            let outcome = flight.work.wait();
            match (outcome, flight.compressed) {
                (Ok(()), Some(wire)) => {
                    let _no_grad = no_grad();
                    let layout = lock(&self.layout);
                    layout.buckets[flight.bucket]
                        .flat
                        .copy_(&wire.to_dtype(layout.buckets[flight.bucket].flat.dtype())?)?;
                }
                (Ok(()), None) => {}
                (Err(error), _) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        if self.config.zero == Some(ZeroStage::Two) {
            // Every gradient now lives in its owner's shard: release the
            // full buffers (the next forward allocates them again).
            for param in &self.params {
                param.set_grad(None)?;
            }
            for bucket in lock(&self.layout).buckets.iter_mut() {
                bucket.release()?;
            }
        }
        let mut step = lock(&self.step);
        step.stats.wait_after_backward = wait_start.elapsed();
        step.stats.backward = step.backward_started.map(|t| wait_start.duration_since(t)).unwrap_or_default();
        step.stats.buckets = lock(&self.layout).buckets.len();
        *lock(&self.steps_done) += 1;
        Ok(())
    }

    /// Rebuilds the buckets from the order gradients became ready in the
    /// first step (rank 0's order, broadcast, so all ranks agree), keeping
    /// the gradients' current values. Like the initial assignment, the
    /// small first-limit bucket takes the *last* gradients to become ready:
    /// its all-reduce is the one nothing overlaps, so it should be short.
    /// (PyTorch's rebuild puts the small bucket first instead; on the
    /// 32-layer MLP of `parallel.ddp_overlap` that leaves a 6-MiB tail and
    /// 0.81 of the bytes overlapped, against 0.97 this way, at the same
    /// step time.)
    fn rebuild(&self) -> Result<()> {
        let order = lock(&self.step).ready_order.clone();
        let n = self.params.len();
        let mut ranked: Vec<i64> = order.iter().map(|&i| i as i64).collect();
        // Parameters that never became ready (unused) go last, in reverse order.
        for i in (0..n).rev() {
            if !order.contains(&i) {
                ranked.push(i as i64);
            }
        }
        let shared = Tensor::from_vec_on(ranked.clone(), [n], self.comm.device())?;
        self.comm.broadcast(&shared, 0)?;
        let order: Vec<usize> = if shared.device().is_meta() {
            // A plan (meta devices) has no values: every rank runs the same
            // step, so rank 0's order is this rank's own.
            ranked.iter().map(|&i| i as usize).collect()
        } else {
            shared.to_vec::<i64>()?.into_iter().map(|i| i as usize).collect()
        };
        let mut seen = vec![false; n];
        for &i in &order {
            if i >= n || std::mem::replace(&mut seen[i], true) {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel",
                    "rank 0's bucket order is not a permutation",
                ));
            }
        }
        let sizes: Vec<(usize, DType)> = self.params.iter().map(|p| (p.numel(), p.dtype())).collect();
        let last_ready_first: Vec<usize> = order.iter().rev().copied().collect();
        let mut assignment =
            assign_buckets(&sizes, &last_ready_first, self.config.first_bucket_bytes, self.config.bucket_cap_bytes);
        assignment.reverse();
        let layout = build_layout(&self.params, assignment, 1)?;
        {
            let _no_grad = no_grad();
            for (index, param) in self.params.iter().enumerate() {
                let (bucket, slot) = layout.place[index];
                let view = layout.buckets[bucket].view(&self.params, slot)?;
                if let Some(grad) = param.grad() {
                    view.copy_(&grad)?;
                }
                param.set_grad(Some(view))?;
            }
        }
        *lock(&self.layout) = layout;
        lock(&self.step).ready_order.clear();
        self.rebuilt.store(true, Ordering::Release);
        Ok(())
    }

    /// Reduces the gradients accumulated without synchronising (every
    /// backward of the step under `no_sync`) as a synchronised backward
    /// would have: each gradient moves into its bucket slot, every bucket
    /// is reduced in order, and under ZeRO-2 the full buffers are released.
    /// `AutoMicroBatch` reduces this way, so that a backward which runs out
    /// of memory can never leave peers inside a half-launched reduction.
    pub(crate) fn reduce_accumulated(&self) -> Result<()> {
        {
            let mut layout = lock(&self.layout);
            for bucket in layout.buckets.iter_mut().filter(|b| b.is_released()) {
                bucket.restore()?;
            }
            for index in 0..self.params.len() {
                self.adopt(&layout, index)?;
            }
            *lock(&self.step) = StepState {
                expecting_backward: true,
                pending: vec![0; layout.buckets.len()],
                ready: vec![true; self.params.len()],
                ready_count: self.params.len(),
                ..StepState::default()
            };
        }
        self.finish_backward()
    }

    /// A rank that ran out of data mirrors one step of the others'
    /// collectives with zero gradients (see `DistributedDataParallel::join`).
    pub(crate) fn shadow_step(&self) -> Result<()> {
        if self.should_rebuild() {
            self.rebuild()?;
        }
        let mut layout = lock(&self.layout);
        for (index, bucket) in layout.buckets.iter_mut().enumerate() {
            if bucket.is_released() {
                bucket.restore()?;
            }
            bucket.flat.zero_()?;
            match (self.config.zero, self.config.compression) {
                (Some(ZeroStage::Two), _) => {
                    self.comm.reduce_scatter(&self.shards[index].grad, &bucket.flat, ReduceOp::Avg)?
                }
                (_, Compression::None) => self.comm.all_reduce(&bucket.flat, ReduceOp::Avg)?,
                (_, Compression::Bf16) => {
                    let wire = Tensor::zeros_on([bucket.flat.numel()], DType::BF16, self.comm.device())?;
                    self.comm.all_reduce(&wire, ReduceOp::Sum)?
                }
            }
        }
        drop(layout);
        *lock(&self.steps_done) += 1;
        Ok(())
    }
}

fn build_layout(params: &[Var], assignment: Vec<Vec<usize>>, pad_to: usize) -> Result<Layout> {
    let mut place = vec![(0, 0); params.len()];
    let mut buckets = Vec::with_capacity(assignment.len());
    for (b, members) in assignment.into_iter().enumerate() {
        for (slot, &p) in members.iter().enumerate() {
            place[p] = (b, slot);
        }
        buckets.push(Bucket::new(params, members, pad_to)?);
    }
    Ok(Layout { buckets, place })
}
