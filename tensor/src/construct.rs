//! Constructors: filled tensors, ranges, identity, from Rust data, and random
//! tensors from the process-wide seeded generator.
//!
//! Constructors without a device use [`default_device`]; the `*_on` forms name
//! one. Random tensors draw element `i` from `(seed, offset + i)` of a
//! Philox4x32-10 stream, so the same seed gives the same numbers on every
//! device and thread count.

use crate::backend::{ops_for, runtime_for, Distribution, Sequence};
use crate::default_generator::with_generator;
use crate::device::{default_device, Device};
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::scalar::checked_scalar;
use crate::shape::Shape;
use crate::tensor::Tensor;

fn require_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(TensorError::UnsupportedDType { op, dtype, needs: "a floating-point dtype", hint: "" })
    }
}

/// A tensor of `shape` drawn from `dist` on `device` (float dtypes; any for
/// Bernoulli). The arguments are checked first (a draw of no elements), so a
/// bad one is an error before anything is allocated or drawn.
fn random(op: &'static str, dist: Distribution, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
    if !matches!(dist, Distribution::Bernoulli { .. }) {
        require_float(op, dtype)?;
    }
    with_generator(|g| match dist {
        Distribution::Uniform { low, high } if dtype == DType::F64 => g.fill_uniform_f64_at(&mut [], 0, low, high),
        Distribution::Uniform { low, high } => g.fill_uniform_f32_at(&mut [], 0, low as f32, high as f32),
        Distribution::Normal { mean, std } if dtype == DType::F64 => g.fill_normal_f64_at(&mut [], 0, mean, std),
        Distribution::Normal { mean, std } => g.fill_normal_f32_at(&mut [], 0, mean as f32, std as f32),
        Distribution::Bernoulli { p } => g.fill_bernoulli_at::<u8>(&mut [], 0, p),
    })?;
    ops_for(device)?.random(op, dist, &shape, dtype, device)
}

/// A tensor of `shape` and `dtype` holding `sequence`, written on `device`
/// itself (computed in f64, converted to the dtype: truncated for
/// integers). For an integer dtype the first and last values are checked to
/// fit it, without the wrapping of negative integers that u8 fill values
/// get (`arange(-3, 0)` in u8 is an error, not 253, 254, 255); sequences
/// are monotonic (eye holds only 0 and 1), so every value between fits too.
fn sequence(op: &'static str, shape: &[usize], dtype: DType, device: Device, sequence: Sequence) -> Result<Tensor> {
    // Made first: this is where the element count is checked.
    let out = Tensor::uninit(shape, dtype, device)?;
    let (n, cols) = (out.numel(), shape.last().copied().unwrap_or(1));
    if n > 0 && dtype.is_integral() {
        for end in [sequence.value(0, n, cols), sequence.value(n - 1, n, cols)] {
            if !dtype.can_hold(end) || (dtype == DType::U8 && end <= -1.0) {
                return Err(TensorError::ValueOutOfRange { op, value: end, dtype });
            }
        }
    }
    ops_for(device)?.sequence(op, out, sequence)
}

impl Tensor {
    /// A tensor of `shape` with every element `value` (converted to `dtype`).
    ///
    /// A value the dtype cannot hold is an error, as in PyTorch
    /// ([`DType::can_hold`]): NaN, an infinity or an out-of-range value for
    /// an integer dtype (`full(300, u8)`), a finite value beyond a float
    /// dtype's largest (`full(1e6, f16)`). A fraction truncates into an
    /// integer dtype (`full(1.9, i64)` is 1), and an integer from -255 to -1
    /// wraps into u8 (`-1` is 255), as PyTorch does.
    pub fn full_on(shape: impl Into<Shape>, value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        // The value as the dtype stores it (`-1` into u8 is 255), filled on the device.
        let value = dispatch_dtype!(dtype, T => checked_scalar::<T>("full", value)?.to_f64());
        ops_for(device)?.full("full", shape.into(), dtype, device, value)
    }

    /// [`Tensor::full_on`] on the default device.
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType) -> Result<Tensor> {
        Self::full_on(shape, value, dtype, default_device())
    }

    /// Zeros.
    pub fn zeros_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Self::full_on(shape, 0.0, dtype, device)
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
        let numel = shape.try_numel()?;
        if numel != data.len() {
            return Err(TensorError::shape(
                "from_slice",
                format!("shape {:?} holds {numel} elements but {} were given", shape.dims(), data.len()),
            ));
        }
        runtime_for(device)?
            .tensor_from_host("from_slice", shape, T::DTYPE, device, &mut |out| out.copy_from_slice("from_slice", data))
    }

    /// [`Tensor::from_slice_on`] on the default device.
    pub fn from_slice<T: WithDType>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_slice_on(data, shape, default_device())
    }

    /// A one-element, zero-dimensional tensor.
    pub fn scalar_on<T: WithDType>(value: T, device: Device) -> Result<Tensor> {
        Self::from_slice_on(&[value], Shape::scalar(), device)
    }

    /// `start, start + step, ...` up to `end` excluded (PyTorch's `arange`),
    /// computed in f64 and converted to `dtype`.
    ///
    /// Errors, as in PyTorch: bounds that are not finite, a step that is 0
    /// or not finite, a step whose sign points away from `end` ("upper bound
    /// and larger bound inconsistent with step sign"; equal bounds give an
    /// empty range whatever the step), more elements than a tensor can hold;
    /// and, where PyTorch would wrap, values an integer dtype cannot hold
    /// (`arange(0, 300)` in u8).
    pub fn arange_on(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        const OP: &str = "arange";
        let invalid = |message: String| Err(TensorError::invalid(OP, message));
        if !start.is_finite() || !end.is_finite() {
            return invalid(format!("unsupported range: {start} -> {end} (the bounds must be finite)"));
        }
        if step == 0.0 || !step.is_finite() {
            return invalid(format!("step must be nonzero and finite, got {step}"));
        }
        if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
            return invalid(format!(
                "upper bound and larger bound inconsistent with step sign: start {start}, end {end}, step {step}"
            ));
        }
        let count = ((end - start) / step).ceil();
        // Not finite when end - start overflows f64.
        if !(count.is_finite() && count <= Shape::MAX_NUMEL as f64) {
            return invalid(format!(
                "invalid size, possible overflow: start {start}, end {end}, step {step} give {count} elements"
            ));
        }
        sequence(OP, &[count as usize], dtype, device, Sequence::Arange { start, step })
    }

    /// [`Tensor::arange_on`] on the default device.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        Self::arange_on(start, end, step, dtype, default_device())
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive,
    /// computed in f64 and converted to `dtype`. More steps than a tensor
    /// can hold, and ends an integer dtype cannot hold (NaN, infinities,
    /// out of range), are errors.
    pub fn linspace_on(start: f64, end: f64, steps: usize, dtype: DType, device: Device) -> Result<Tensor> {
        // The second half counts back from `end` so both ends are exact, as PyTorch does.
        sequence("linspace", &[steps], dtype, device, Sequence::Linspace { start, end })
    }

    /// [`Tensor::linspace_on`] on the default device.
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Result<Tensor> {
        Self::linspace_on(start, end, steps, dtype, default_device())
    }

    /// The `n × n` identity matrix.
    pub fn eye_on(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        sequence("eye", &[n, n], dtype, device, Sequence::Eye)
    }

    /// [`Tensor::eye_on`] on the default device.
    pub fn eye(n: usize, dtype: DType) -> Result<Tensor> {
        Self::eye_on(n, dtype, default_device())
    }

    /// Uniform in `[0, 1)` from the process-wide generator (floating dtypes).
    pub fn rand_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        random("rand", Distribution::Uniform { low: 0.0, high: 1.0 }, shape.into(), dtype, device)
    }

    /// [`Tensor::rand_on`] on the default device.
    pub fn rand(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::rand_on(shape, dtype, default_device())
    }

    /// Uniform in `[low, high)`.
    pub fn uniform_on(shape: impl Into<Shape>, low: f64, high: f64, dtype: DType, device: Device) -> Result<Tensor> {
        random("uniform", Distribution::Uniform { low, high }, shape.into(), dtype, device)
    }

    /// Standard normal from the process-wide generator (floating dtypes).
    pub fn randn_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        random("randn", Distribution::Normal { mean: 0.0, std: 1.0 }, shape.into(), dtype, device)
    }

    /// [`Tensor::randn_on`] on the default device.
    pub fn randn(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::randn_on(shape, dtype, default_device())
    }

    /// 1 with probability `p`, else 0, in `dtype` (any dtype).
    pub fn bernoulli_on(shape: impl Into<Shape>, p: f64, dtype: DType, device: Device) -> Result<Tensor> {
        random("bernoulli", Distribution::Bernoulli { p }, shape.into(), dtype, device)
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
