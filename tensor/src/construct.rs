//! Constructors: filled tensors, ranges, identity, from Rust data, and random
//! tensors from the process-wide seeded generator.
//!
//! Constructors without a device use [`default_device`]; the `*_on` forms name
//! one. Random tensors draw element `i` from `(seed, offset + i)` of a
//! Philox4x32-10 stream, so the same seed gives the same numbers on every
//! device and thread count.

use crate::device::{default_device, Device};
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::rng::{Generator, GeneratorState};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::sync::Mutex;

/// Elements per parallel chunk of a random fill: large enough to pay for a task.
const RNG_CHUNK: usize = 1 << 16;

static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);

fn with_generator<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    let mut slot = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    f(slot.get_or_insert_with(|| Generator::new(0)))
}

/// Seeds the process-wide generator (`torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    with_generator(|g| *g = Generator::new(seed));
}

/// The generator's state, to repeat draws later (checkpointing uses it).
pub fn rng_state() -> GeneratorState {
    with_generator(|g| g.state())
}

/// Restores a state from [`rng_state`].
pub fn set_rng_state(state: GeneratorState) {
    with_generator(|g| g.set_state(state));
}

/// Fills `out` in parallel chunks from a reserved range of the generator.
fn parallel_fill<T: Send>(
    out: &mut [T],
    fill: impl Fn(&Generator, &mut [T], u64) -> std::result::Result<(), crate::rng::RngError> + Sync,
) -> Result<()> {
    let generator = with_generator(|g| {
        let snapshot = Generator::from_state(g.state());
        g.reserve(out.len() as u64);
        snapshot
    });
    let base = generator.offset();
    out.par_chunks_mut(RNG_CHUNK)
        .enumerate()
        .try_for_each(|(i, chunk)| fill(&generator, chunk, base + (i * RNG_CHUNK) as u64))?;
    Ok(())
}

fn require_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(TensorError::invalid(op, format!("needs a floating-point dtype, got {dtype}")))
    }
}

/// Fills with `draw` in f32 (or f64 for f64 tensors), converting to the dtype.
fn random(
    op: &'static str,
    shape: Shape,
    dtype: DType,
    device: Device,
    draw32: impl Fn(&Generator, &mut [f32], u64) -> std::result::Result<(), crate::rng::RngError> + Sync,
    draw64: impl Fn(&Generator, &mut [f64], u64) -> std::result::Result<(), crate::rng::RngError> + Sync,
) -> Result<Tensor> {
    require_float(op, dtype)?;
    let numel = shape.numel();
    let values = match dtype {
        DType::F64 => {
            let mut values = vec![0f64; numel];
            parallel_fill(&mut values, draw64)?;
            Tensor::from_vec_on(values, shape, device)?
        }
        _ => {
            let mut values = vec![0f32; numel];
            parallel_fill(&mut values, draw32)?;
            Tensor::from_vec_on(values, shape, device)?.to_dtype(dtype)?
        }
    };
    Ok(values)
}

impl Tensor {
    /// A tensor of `shape` with every element `value` (converted to `dtype`).
    pub fn full_on(shape: impl Into<Shape>, value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let storage = Storage::uninit(device, dtype, shape.numel())?;
        dispatch_dtype!(dtype, T => {
            // SAFETY: the storage is new and ours alone.
            let data = unsafe { storage.host_slice_mut::<T>("full")? };
            let value = T::from_f64(value);
            data.par_chunks_mut(RNG_CHUNK).for_each(|chunk| chunk.fill(value));
        });
        Ok(Tensor::from_storage(storage, shape))
    }

    /// [`Tensor::full_on`] on the default device.
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType) -> Result<Tensor> {
        Self::full_on(shape, value, dtype, default_device())
    }

    /// Zeros.
    pub fn zeros_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        Ok(Tensor::from_storage(Storage::zeros(device, dtype, shape.numel())?, shape))
    }

    /// Zeros on the default device.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::zeros_on(shape, dtype, default_device())
    }

    /// Ones.
    pub fn ones_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Self::full_on(shape, 1.0, dtype, device)
    }

    /// Ones on the default device.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::ones_on(shape, dtype, default_device())
    }

    /// A 1-d tensor owning `data`, reshaped to `shape` (the element counts must match).
    pub fn from_vec_on<T: WithDType>(data: Vec<T>, shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        Self::from_slice_on(&data, shape, device)
    }

    /// [`Tensor::from_vec_on`] on the default device.
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_slice_on(&data, shape, default_device())
    }

    /// A copy of `data` with `shape` (the element counts must match).
    pub fn from_slice_on<T: WithDType>(data: &[T], shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(TensorError::shape(
                "from_slice",
                format!("shape {:?} holds {} elements but {} were given", shape.dims(), shape.numel(), data.len()),
            ));
        }
        if !device.is_cpu() {
            return Self::from_slice_on(data, shape, Device::CPU)?.to(device);
        }
        let storage = Storage::uninit(device, T::DTYPE, data.len())?;
        // SAFETY: the storage is new and ours alone.
        unsafe { storage.host_slice_mut::<T>("from_slice")? }.copy_from_slice(data);
        Ok(Tensor::from_storage(storage, shape))
    }

    /// [`Tensor::from_slice_on`] on the default device.
    pub fn from_slice<T: WithDType>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_slice_on(data, shape, default_device())
    }

    /// A one-element, zero-dimensional tensor.
    pub fn scalar_on<T: WithDType>(value: T, device: Device) -> Result<Tensor> {
        Self::from_slice_on(&[value], Shape::scalar(), device)
    }

    /// `start, start + step, ...` below `end` (PyTorch's `arange`).
    pub fn arange_on(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(TensorError::invalid(
                "arange",
                format!("start {start}, end {end}, step {step}: need finite values and a non-zero step"),
            ));
        }
        let count = ((end - start) / step).ceil().max(0.0) as usize;
        let values: Vec<f64> = (0..count).map(|i| start + i as f64 * step).collect();
        Tensor::from_vec_on(values, [count], device)?.to_dtype(dtype)
    }

    /// [`Tensor::arange_on`] on the default device.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        Self::arange_on(start, end, step, dtype, default_device())
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive.
    pub fn linspace_on(start: f64, end: f64, steps: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let values: Vec<f64> = match steps {
            0 => Vec::new(),
            1 => vec![start],
            _ => {
                let step = (end - start) / (steps - 1) as f64;
                // The second half counts back from `end` so both ends are exact, as PyTorch does.
                (0..steps)
                    .map(|i| if i < steps / 2 { start + step * i as f64 } else { end - step * (steps - 1 - i) as f64 })
                    .collect()
            }
        };
        Tensor::from_vec_on(values, [steps], device)?.to_dtype(dtype)
    }

    /// [`Tensor::linspace_on`] on the default device.
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Result<Tensor> {
        Self::linspace_on(start, end, steps, dtype, default_device())
    }

    /// The `n × n` identity matrix.
    pub fn eye_on(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let mut values = vec![0f64; n * n];
        for i in 0..n {
            values[i * n + i] = 1.0;
        }
        Tensor::from_vec_on(values, [n, n], device)?.to_dtype(dtype)
    }

    /// [`Tensor::eye_on`] on the default device.
    pub fn eye(n: usize, dtype: DType) -> Result<Tensor> {
        Self::eye_on(n, dtype, default_device())
    }

    /// Uniform in `[0, 1)` from the process-wide generator (floating dtypes).
    pub fn rand_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        random(
            "rand",
            shape.into(),
            dtype,
            device,
            |g, out, at| g.fill_uniform_f32_at(out, at, 0.0, 1.0),
            |g, out, at| g.fill_uniform_f64_at(out, at, 0.0, 1.0),
        )
    }

    /// [`Tensor::rand_on`] on the default device.
    pub fn rand(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::rand_on(shape, dtype, default_device())
    }

    /// Uniform in `[low, high)`.
    pub fn uniform_on(shape: impl Into<Shape>, low: f64, high: f64, dtype: DType, device: Device) -> Result<Tensor> {
        random(
            "uniform",
            shape.into(),
            dtype,
            device,
            |g, out, at| g.fill_uniform_f32_at(out, at, low as f32, high as f32),
            |g, out, at| g.fill_uniform_f64_at(out, at, low, high),
        )
    }

    /// Standard normal from the process-wide generator (floating dtypes).
    pub fn randn_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        random(
            "randn",
            shape.into(),
            dtype,
            device,
            |g, out, at| g.fill_normal_f32_at(out, at, 0.0, 1.0),
            |g, out, at| g.fill_normal_f64_at(out, at, 0.0, 1.0),
        )
    }

    /// [`Tensor::randn_on`] on the default device.
    pub fn randn(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::randn_on(shape, dtype, default_device())
    }

    /// 1 with probability `p`, else 0, in `dtype` (any dtype).
    pub fn bernoulli_on(shape: impl Into<Shape>, p: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let mut values = vec![0u8; shape.numel()];
        parallel_fill(&mut values, |g, out, at| g.fill_bernoulli_at(out, at, p))?;
        Tensor::from_vec_on(values, shape, device)?.to_dtype(dtype)
    }

    /// [`Tensor::bernoulli_on`] on the default device.
    pub fn bernoulli(shape: impl Into<Shape>, p: f64, dtype: DType) -> Result<Tensor> {
        Self::bernoulli_on(shape, p, dtype, default_device())
    }

    // ----- constructors that keep this tensor's dtype and device ----------------

    /// Zeros of this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Self::zeros_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// Ones of this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Self::ones_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// `value` everywhere, with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Self::full_on(self.shape().clone(), value, self.dtype(), self.device())
    }

    /// Uniform in `[0, 1)` with this tensor's shape, dtype and device.
    pub fn rand_like(&self) -> Result<Tensor> {
        Self::rand_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// Standard normal with this tensor's shape, dtype and device.
    pub fn randn_like(&self) -> Result<Tensor> {
        Self::randn_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// Zeros of another shape with this tensor's dtype and device.
    pub fn new_zeros(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::zeros_on(shape, self.dtype(), self.device())
    }

    /// Ones of another shape with this tensor's dtype and device.
    pub fn new_ones(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::ones_on(shape, self.dtype(), self.device())
    }

    /// `value` everywhere, another shape, this tensor's dtype and device.
    pub fn new_full(&self, shape: impl Into<Shape>, value: f64) -> Result<Tensor> {
        Self::full_on(shape, value, self.dtype(), self.device())
    }

    /// A copy of `data` converted to this tensor's dtype, on its device.
    pub fn new_tensor<T: WithDType>(&self, data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_slice_on(data, shape, self.device())?.to_dtype(self.dtype())
    }
}
