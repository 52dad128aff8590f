//! The op front door: bytes → a program of public tensor ops on a small pool
//! of tensors, with random shapes (0, 1, small and huge dims), dtypes,
//! devices, views with odd strides (transpose, permute, narrow, select,
//! expand, reshape) and arguments (negative and out-of-range dims, NaN and
//! infinite scalars, zero strides and kernels).
//!
//! Every call must return `Ok` or `Err`: a panic, an abort or a hang is a
//! crash. Beyond that, answers are checked where being wrong would be
//! silent: an element-wise op on strided views (transposed, narrowed,
//! expanded, permuted) gives element for element what it gives on
//! contiguous copies of them; a result's element count matches its shape;
//! an in-place write into an expanded view (several elements on one memory
//! location) is an error; and once every tensor is dropped the host
//! allocator holds nothing.
//!
//! Host devices are limited to 64 MiB each, so a huge shape meets an
//! out-of-memory error instead of the fuzzer's RSS limit. Work is bounded so
//! that a legitimately long computation (summing 2^40 elements of an
//! expanded view) is not run: an op runs when its inputs are small, or when
//! its output alone cannot fit in the limit (then it must fail, and fast).
//!
//! To read a crash: `BRASA_FUZZ_TRACE=1 cargo +nightly fuzz run tensor_ops
//! <crash file>` prints each op of the program before it runs.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use brasa_tensor::{memory, Conv2dParams, DType, Device, Shape, Stream, Tensor};
use libfuzzer_sys::fuzz_target;
use std::sync::{Once, OnceLock};

/// The byte limit of each logical host device.
const DEVICE_LIMIT: usize = 64 << 20;
/// Elements an op may read or write when it is run for its result.
const WORK: usize = 1 << 16;
/// Multiply-adds a matrix product, convolution or pooling may do.
const FLOPS: usize = 1 << 21;
/// An output of at least this many elements (of at least one byte) cannot
/// be allocated under the limit: an op making it must fail.
const HOPELESS: usize = 2 * DEVICE_LIMIT;
/// Tensors kept at once.
const POOL: usize = 12;

/// A dim size: mostly 0..=4 and small, sometimes huge.
#[derive(Debug, Clone, Copy)]
struct Dim(usize);

impl<'a> Arbitrary<'a> for Dim {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let tag: u8 = u.arbitrary()?;
        Ok(Dim(match tag {
            0..=179 => usize::from(tag % 5),
            180..=229 => usize::from(tag - 175), // 5..=54
            230 => 1 << 31,
            231 => 1 << 32,
            232 => (1 << 40) + 1,
            233 => isize::MAX as usize,
            234 => isize::MAX as usize + 1,
            235 => usize::MAX,
            236 => 1 << 62,
            237 => 1 << 16,
            238 => 1 << 20,
            239 => 1 << 27,
            240 => 1 << 48,
            241 => usize::MAX / 2 + 7,
            _ => u.arbitrary::<u32>()? as usize,
        }))
    }
}

/// A shape of rank 0 to 6.
#[derive(Debug, Clone)]
struct Sh(Vec<usize>);

impl<'a> Arbitrary<'a> for Sh {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let rank = u.int_in_range(0..=6)?;
        let mut dims = Vec::with_capacity(rank);
        for _ in 0..rank {
            dims.push(u.arbitrary::<Dim>()?.0);
        }
        Ok(Sh(dims))
    }
}

/// A scalar argument: mostly ordinary numbers, sometimes NaN, infinities,
/// huge values or any bit pattern.
#[derive(Debug, Clone, Copy)]
struct Num(f64);

impl<'a> Arbitrary<'a> for Num {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let tag: u8 = u.arbitrary()?;
        Ok(Num(match tag {
            0..=127 => f64::from(tag % 9) - 3.0,
            128..=159 => f64::from(tag - 128) / 8.0,
            160 => f64::NAN,
            161 => f64::INFINITY,
            162 => f64::NEG_INFINITY,
            163 => 1e300,
            164 => -1e300,
            165 => -0.0,
            166 => f64::MIN_POSITIVE,
            167 => 65504.0,
            168 => 65520.0,
            169 => 9007199254740993.0,
            170 => 1.8446744073709552e19,
            171 => -9.223372036854776e18,
            172 => 256.0,
            _ => f64::from_bits(u.arbitrary()?),
        }))
    }
}

/// A dim index, negative ones included.
type Ax = i8;

/// Which tensor of the pool.
type Ix = u8;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dt {
    Bool,
    U8,
    I64,
    F16,
    Bf16,
    F32,
    F64,
}

impl Dt {
    fn get(self) -> DType {
        match self {
            Dt::Bool => DType::Bool,
            Dt::U8 => DType::U8,
            Dt::I64 => DType::I64,
            Dt::F16 => DType::F16,
            Dt::Bf16 => DType::BF16,
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dev {
    Cpu0,
    Cpu1,
    Cpu7,
    Cuda0,
}

impl Dev {
    fn get(self) -> Device {
        match self {
            Dev::Cpu0 => Device::CPU,
            Dev::Cpu1 => Device::cpu(1),
            Dev::Cpu7 => Device::cpu(7),
            Dev::Cuda0 => Device::cuda(0),
        }
    }
}

/// Ways to make a tensor from nothing.
#[derive(Arbitrary, Debug)]
enum Source {
    Zeros(Sh, Dt, Dev),
    Ones(Sh, Dt),
    Full(Sh, Num, Dt, Dev),
    Arange(Num, Num, Num, Dt),
    Linspace(Num, Num, Dim, Dt),
    Eye(Dim, Dt),
    Rand(Sh, Dt),
    Randn(Sh, Dt),
    Uniform(Sh, Num, Num, Dt),
    Bernoulli(Sh, Num, Dt),
    /// Elements from the input's bytes; the count may not fit the shape.
    Data(Dt, Sh, Vec<u8>),
    /// Small integers, good for indices.
    Indices(Sh, Vec<i8>),
    Scalar(Num, Dt),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Unary {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum UnaryInPlace {
    Neg,
    Abs,
    Relu,
    Sqrt,
    Rsqrt,
    Exp,
    Log,
    Log1p,
    Sigmoid,
    Tanh,
    LogSigmoid,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    ReluBackward,
    GeluBackward,
    GeluTanhBackward,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum BinaryInPlace {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Copy,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum WithScalar {
    EqScalar,
    NeScalar,
    LtScalar,
    LeScalar,
    GtScalar,
    GeScalar,
    Powf,
    AddScalar,
    SubScalar,
    MulScalar,
    DivScalar,
    FullLike,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ScalarInPlace {
    Fill,
    Zero,
    AddScalar,
    MulScalar,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Reduce {
    Sum,
    Mean,
    Var,
    Std,
    Max,
    Min,
    Argmax,
    Argmin,
}

/// One step of the program.
#[derive(Arbitrary, Debug)]
enum Op {
    New(Source),
    Drop(Ix),
    // Views.
    Transpose(Ix, Ax, Ax),
    T(Ix),
    Permute(Ix, Vec<u8>),
    Narrow(Ix, Ax, Dim, Dim),
    Select(Ix, Ax, Dim),
    Squeeze(Ix, Ax),
    Unsqueeze(Ix, Ax),
    Expand(Ix, Sh),
    Reshape(Ix, Vec<i64>, bool),
    ReshapeTo(Ix, Sh, bool),
    Flatten(Ix, Ax, Ax),
    Split(Ix, Dim, Ax),
    Chunk(Ix, Dim, Ax),
    // Copies.
    Contiguous(Ix),
    ToDtype(Ix, Dt),
    To(Ix, Dev),
    PinMemory(Ix),
    Like(Ix, u8, Sh, Num),
    // Element-wise.
    Unary(Unary, Ix),
    UnaryInPlace(UnaryInPlace, Ix),
    Binary(Binary, Ix, Ix),
    BinaryInPlace(BinaryInPlace, Ix, Ix),
    WithScalar(WithScalar, Ix, Num),
    ScalarInPlace(ScalarInPlace, Ix, Num),
    Affine(Ix, Num, Num, bool),
    Clamp(Ix, Option<Num>, Option<Num>, bool),
    Where(Ix, Ix, Ix),
    AddScaled(Ix, Num, Ix),
    Addcmul(Ix, Num, Ix, Ix, bool),
    Lerp(Ix, Ix, Num),
    // Reductions.
    Reduce(Reduce, Ix, Vec<Ax>, bool),
    VarCorrection(Ix, Vec<Ax>, Dim, bool, bool),
    ReduceAll(Ix, bool),
    Softmax(Ix, Ax, bool),
    // Products, indexing, joins.
    Matmul(Ix, Ix),
    Cat(Vec<Ix>, Ax, bool),
    IndexSelect(Ix, Ax, Ix),
    Embedding(Ix, Ix),
    Gather(Ix, Ax, Ix),
    ScatterAdd(Ix, Ax, Ix, Ix, bool),
    OneHot(Ix, Dim),
    // Convolution and pooling.
    Conv2d(Ix, Ix, Option<Ix>, (u8, u8), (u8, u8), (u8, u8), u8),
    Conv2dBackwardInput(Ix, Ix, Sh, (u8, u8), (u8, u8), (u8, u8), u8),
    Conv2dBackwardWeight(Ix, Ix, Sh, (u8, u8), (u8, u8), (u8, u8), u8),
    Conv2dBackwardBias(Ix),
    MaxPool2d(Ix, (u8, u8), (u8, u8), (u8, u8)),
    MaxPool2dBackward(Ix, Ix, Sh),
    AvgPool2d(Ix, (u8, u8), (u8, u8), (u8, u8), bool),
    AvgPool2dBackward(Ix, Sh, (u8, u8), (u8, u8), (u8, u8), bool),
    // Data out, streams, memory.
    ToVec(Ix),
    Item(Ix),
    RecordStream(Ix, Dev),
    MemoryReport(Dev),
}

fn dims_numel(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// Small enough to compute with.
fn small(t: &Tensor) -> bool {
    t.numel() <= WORK
}

/// An output of `numel` elements is either cheap or sure to fail allocation.
fn cheap_or_hopeless(numel: usize) -> bool {
    numel <= WORK || numel >= HOPELESS
}

fn pair((a, b): (u8, u8)) -> (usize, usize) {
    (usize::from(a % 6), usize::from(b % 6))
}

fn conv_params(stride: (u8, u8), padding: (u8, u8), dilation: (u8, u8), groups: u8) -> Conv2dParams {
    Conv2dParams::new()
        .with_stride(pair(stride))
        .with_padding(pair(padding))
        .with_dilation(pair(dilation))
        .with_groups(usize::from(groups % 5))
}

/// Multiply-adds of a convolution of `input` by `weight`, when they fit.
fn conv_flops(input: &[usize], weight: &[usize], params: Conv2dParams) -> usize {
    match params.output_shape(input, weight) {
        Ok(out) => out.numel().saturating_mul(dims_numel(&weight[1..])),
        Err(_) => 0,
    }
}

/// Multiply-adds of a pooling of `input` with this window, roughly.
fn pool_flops(input: &[usize], kernel: (usize, usize), stride: (usize, usize), padding: (usize, usize)) -> usize {
    if input.len() < 2 || stride.0 == 0 || stride.1 == 0 {
        return 0;
    }
    let (h, w) = (input[input.len() - 2], input[input.len() - 1]);
    let out = |size: usize, k: usize, s: usize, p: usize| {
        size.saturating_add(2 * p).checked_sub(k).map_or(0, |span| (span / s).saturating_add(1))
    };
    let planes = dims_numel(&input[..input.len() - 2]);
    planes
        .saturating_mul(out(h, kernel.0, stride.0, padding.0))
        .saturating_mul(out(w, kernel.1, stride.1, padding.1))
        .saturating_mul(kernel.0.max(1) * kernel.1.max(1))
}

/// The element count of the broadcast of these shapes (saturating), or 0
/// when they do not broadcast (the op then fails on shapes, cheaply).
fn broadcast_numel(shapes: &[&Tensor]) -> usize {
    let mut out = Shape::new(Vec::<usize>::new());
    for t in shapes {
        match brasa_tensor::broadcast_shapes(&out, t.shape()) {
            Ok(shape) => out = shape,
            Err(_) => return 0,
        }
    }
    dims_numel(out.dims())
}

/// Checks what can be checked of any tensor an op returned.
fn check(t: &Tensor) {
    assert_eq!(t.numel(), dims_numel(t.dims()), "numel of {:?}", t.dims());
    assert_eq!(t.strides().len(), t.rank());
}

/// The elements of a tensor, for comparing two results: floats as bits
/// with every NaN the same, everything else exactly.
fn elements(t: &Tensor) -> Option<Vec<u64>> {
    let nan_or = |bits: u64, nan: bool| if nan { u64::MAX } else { bits };
    Some(match t.dtype() {
        DType::Bool => t.to_vec::<bool>().ok()?.into_iter().map(u64::from).collect(),
        DType::U8 => t.to_vec::<u8>().ok()?.into_iter().map(u64::from).collect(),
        DType::I64 => t.to_vec::<i64>().ok()?.into_iter().map(|v| v as u64).collect(),
        DType::F16 => t.to_vec::<half::f16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect(),
        DType::BF16 => t.to_vec::<half::bf16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect(),
        DType::F32 => t.to_vec::<f32>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect(),
        DType::F64 => t.to_vec::<f64>().ok()?.into_iter().map(|v| nan_or(v.to_bits(), v.is_nan())).collect(),
    })
}

/// The differential check of an element-wise op: on strided inputs (views
/// with transposed, narrowed, expanded or permuted strides) it must give
/// what it gives on contiguous copies of them, element for element (the
/// same function of the same values), and succeed or fail alike.
fn agrees_with_contiguous(
    what: &dyn std::fmt::Debug,
    inputs: &[&Tensor],
    result: &brasa_tensor::Result<Tensor>,
    op: impl Fn(&[Tensor]) -> brasa_tensor::Result<Tensor>,
) {
    if inputs.iter().all(|t| t.is_contiguous()) || !inputs.iter().all(|t| small(t)) {
        return;
    }
    let Ok(copies) = inputs.iter().map(|t| t.contiguous()).collect::<brasa_tensor::Result<Vec<Tensor>>>() else {
        return;
    };
    let layouts: Vec<_> = inputs.iter().map(|t| (t.dims().to_vec(), t.strides().to_vec(), t.dtype())).collect();
    match (result, op(&copies)) {
        (Ok(strided), Ok(contiguous)) => {
            assert_eq!(strided.dims(), contiguous.dims(), "{what:?} on {layouts:?}: shapes differ");
            assert_eq!(strided.dtype(), contiguous.dtype(), "{what:?} on {layouts:?}: dtypes differ");
            if let (Some(a), Some(b)) = (elements(strided), elements(&contiguous)) {
                assert!(a == b, "{what:?} on strided inputs {layouts:?} differs from contiguous copies");
            }
        }
        (Err(_), Err(_)) => {}
        (Ok(_), Err(error)) => panic!("{what:?} on {layouts:?}: strided Ok, contiguous copies fail: {error}"),
        (Err(error), Ok(_)) => panic!("{what:?} on {layouts:?}: strided fails ({error}), contiguous copies Ok"),
    }
}

struct Machine {
    pool: Vec<Tensor>,
}

impl Machine {
    fn get(&self, i: Ix) -> Option<Tensor> {
        if self.pool.is_empty() {
            None
        } else {
            Some(self.pool[usize::from(i) % self.pool.len()].clone())
        }
    }

    fn keep(&mut self, result: brasa_tensor::Result<Tensor>) {
        if let Ok(t) = result {
            check(&t);
            if self.pool.len() >= POOL {
                self.pool.remove(0);
            }
            self.pool.push(t);
        }
    }

    fn keep_all(&mut self, result: brasa_tensor::Result<Vec<Tensor>>) {
        if let Ok(pieces) = result {
            for piece in pieces.into_iter().take(4) {
                self.keep(Ok(piece));
            }
        }
    }

    /// An in-place write: into an expanded view it must fail (silently
    /// writing several values to one memory location is a wrong answer).
    fn in_place(&self, op: &str, target: &Tensor, result: brasa_tensor::Result<()>) {
        if target.layout().has_internal_overlap() {
            assert!(result.is_err(), "{op} into an expanded view {:?} / {:?} succeeded", target.dims(), target.strides());
        }
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::New(source) => {
                let t = make(source);
                self.keep(t);
            }
            Op::Drop(i) => {
                if !self.pool.is_empty() {
                    let i = usize::from(i) % self.pool.len();
                    self.pool.remove(i);
                }
            }
            Op::Transpose(i, a, b) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.transpose(a as isize, b as isize));
            }
            Op::T(i) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.t());
            }
            Op::Permute(i, order) => {
                let Some(t) = self.get(i) else { return };
                let order: Vec<usize> = order.iter().take(8).map(|&d| usize::from(d % 8)).collect();
                self.keep(t.permute(&order));
            }
            Op::Narrow(i, dim, start, len) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.narrow(dim as isize, start.0, len.0));
            }
            Op::Select(i, dim, index) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.select(dim as isize, index.0));
            }
            Op::Squeeze(i, dim) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.squeeze(dim as isize));
            }
            Op::Unsqueeze(i, dim) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.unsqueeze(dim as isize));
            }
            Op::Expand(i, shape) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.expand(shape.0));
            }
            Op::Reshape(i, spec, view) => {
                let Some(t) = self.get(i) else { return };
                let spec: Vec<isize> = spec.iter().take(7).map(|&d| (d % 7) as isize).collect();
                self.reshape(&t, &spec, view);
            }
            Op::ReshapeTo(i, shape, view) => {
                let Some(t) = self.get(i) else { return };
                let spec: Vec<isize> = shape.0.iter().map(|&d| d as isize).collect();
                self.reshape(&t, &spec, view);
            }
            Op::Flatten(i, a, b) => {
                let Some(t) = self.get(i) else { return };
                // Flattening may copy (a non-viewable layout).
                if small(&t) || t.is_contiguous() || t.numel() >= HOPELESS {
                    self.keep(t.flatten(a as isize, b as isize));
                }
            }
            Op::Split(i, size, dim) => {
                let Some(t) = self.get(i) else { return };
                let along = t.dim(dim as isize).unwrap_or(0);
                if size.0 == 0 || along / size.0 <= 64 {
                    self.keep_all(t.split(size.0, dim as isize));
                }
            }
            Op::Chunk(i, chunks, dim) => {
                let Some(t) = self.get(i) else { return };
                if chunks.0 <= 64 {
                    self.keep_all(t.chunk(chunks.0, dim as isize));
                }
            }
            Op::Contiguous(i) => {
                let Some(t) = self.get(i) else { return };
                if t.is_contiguous() || cheap_or_hopeless(t.numel()) {
                    self.keep(t.contiguous());
                }
            }
            Op::ToDtype(i, dtype) => {
                let Some(t) = self.get(i) else { return };
                if cheap_or_hopeless(t.numel()) {
                    let result = t.to_dtype(dtype.get());
                    if let Ok(out) = &result {
                        assert_eq!(out.dtype(), dtype.get());
                        assert_eq!(out.dims(), t.dims());
                    }
                    agrees_with_contiguous(&dtype, &[&t], &result, |c| c[0].to_dtype(dtype.get()));
                    self.keep(result);
                }
            }
            Op::To(i, device) => {
                let Some(t) = self.get(i) else { return };
                if cheap_or_hopeless(t.numel()) {
                    let result = t.to(device.get());
                    if let Ok(out) = &result {
                        assert_eq!(out.device(), device.get());
                    }
                    self.keep(result);
                }
            }
            Op::PinMemory(i) => {
                let Some(t) = self.get(i) else { return };
                // Pinned memory has no limit of ours (only RLIMIT_MEMLOCK).
                if t.numel() <= WORK {
                    self.keep(t.pin_memory());
                }
            }
            Op::Like(i, kind, shape, value) => {
                let Some(t) = self.get(i) else { return };
                let result = match kind % 8 {
                    0 if cheap_or_hopeless(t.numel()) => t.zeros_like(),
                    1 if cheap_or_hopeless(t.numel()) => t.ones_like(),
                    2 if cheap_or_hopeless(t.numel()) => t.rand_like(),
                    3 if cheap_or_hopeless(t.numel()) => t.randn_like(),
                    4 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_zeros(shape.0),
                    5 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_ones(shape.0),
                    6 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_full(shape.0, value.0),
                    7 => t.new_tensor(&[value.0 as f32, 1.0, 2.0], shape.0),
                    _ => return,
                };
                self.keep(result);
            }
            Op::Unary(kind, i) => {
                let Some(t) = self.get(i) else { return };
                if !cheap_or_hopeless(t.numel()) {
                    return;
                }
                let run = |t: &Tensor| match kind {
                    Unary::Neg => t.neg(),
                    Unary::Abs => t.abs(),
                    Unary::Exp => t.exp(),
                    Unary::Log => t.log(),
                    Unary::Sqrt => t.sqrt(),
                    Unary::Rsqrt => t.rsqrt(),
                    Unary::Sin => t.sin(),
                    Unary::Cos => t.cos(),
                    Unary::Tanh => t.tanh(),
                    Unary::Sigmoid => t.sigmoid(),
                    Unary::Relu => t.relu(),
                    Unary::Gelu => t.gelu(),
                    Unary::GeluTanh => t.gelu_tanh(),
                    Unary::Silu => t.silu(),
                };
                let result = run(&t);
                if let Ok(out) = &result {
                    assert_eq!(out.dims(), t.dims(), "{kind:?}");
                }
                agrees_with_contiguous(&kind, &[&t], &result, |c| run(&c[0]));
                self.keep(result);
            }
            Op::UnaryInPlace(kind, i) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) && !t.layout().has_internal_overlap() {
                    return;
                }
                let result = match kind {
                    UnaryInPlace::Neg => t.neg_(),
                    UnaryInPlace::Abs => t.abs_(),
                    UnaryInPlace::Relu => t.relu_(),
                    UnaryInPlace::Sqrt => t.sqrt_(),
                    UnaryInPlace::Rsqrt => t.rsqrt_(),
                    UnaryInPlace::Exp => t.exp_(),
                    UnaryInPlace::Log => t.log_(),
                    UnaryInPlace::Log1p => t.log1p_(),
                    UnaryInPlace::Sigmoid => t.sigmoid_(),
                    UnaryInPlace::Tanh => t.tanh_(),
                    UnaryInPlace::LogSigmoid => t.log_sigmoid_(),
                };
                self.in_place(&format!("{kind:?}_"), &t, result);
            }
            Op::Binary(kind, a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                let out = broadcast_numel(&[&a, &b]);
                if !(cheap_or_hopeless(out) && small(&a) && small(&b) || out >= HOPELESS) {
                    return;
                }
                let run = |a: &Tensor, b: &Tensor| match kind {
                    Binary::Add => a.add(b),
                    Binary::Sub => a.sub(b),
                    Binary::Mul => a.mul(b),
                    Binary::Div => a.div(b),
                    Binary::Pow => a.pow(b),
                    Binary::ReluBackward => a.relu_backward(b),
                    Binary::GeluBackward => a.gelu_backward(b),
                    Binary::GeluTanhBackward => a.gelu_tanh_backward(b),
                    Binary::Maximum => a.maximum(b),
                    Binary::Minimum => a.minimum(b),
                    Binary::Eq => a.eq(b),
                    Binary::Ne => a.ne(b),
                    Binary::Lt => a.lt(b),
                    Binary::Le => a.le(b),
                    Binary::Gt => a.gt(b),
                    Binary::Ge => a.ge(b),
                };
                let result = run(&a, &b);
                if let Ok(t) = &result {
                    assert_eq!(t.numel(), out, "{kind:?} of {:?} and {:?} gave {:?}", a.dims(), b.dims(), t.dims());
                }
                agrees_with_contiguous(&kind, &[&a, &b], &result, |c| run(&c[0], &c[1]));
                self.keep(result);
            }
            Op::BinaryInPlace(kind, a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                if !(small(&a) && small(&b)) && !a.layout().has_internal_overlap() {
                    return;
                }
                let result = match kind {
                    BinaryInPlace::Add => a.add_(&b),
                    BinaryInPlace::Sub => a.sub_(&b),
                    BinaryInPlace::Mul => a.mul_(&b),
                    BinaryInPlace::Div => a.div_(&b),
                    BinaryInPlace::Maximum => a.maximum_(&b),
                    BinaryInPlace::Minimum => a.minimum_(&b),
                    BinaryInPlace::Copy => a.copy_(&b),
                };
                self.in_place(&format!("{kind:?}_"), &a, result);
            }
            Op::WithScalar(kind, i, value) => {
                let Some(t) = self.get(i) else { return };
                if !cheap_or_hopeless(t.numel()) {
                    return;
                }
                let v = value.0;
                let run = |t: &Tensor| match kind {
                    WithScalar::EqScalar => t.eq_scalar(v),
                    WithScalar::NeScalar => t.ne_scalar(v),
                    WithScalar::LtScalar => t.lt_scalar(v),
                    WithScalar::LeScalar => t.le_scalar(v),
                    WithScalar::GtScalar => t.gt_scalar(v),
                    WithScalar::GeScalar => t.ge_scalar(v),
                    WithScalar::Powf => t.powf(v),
                    WithScalar::AddScalar => t.add_scalar(v),
                    WithScalar::SubScalar => t.sub_scalar(v),
                    WithScalar::MulScalar => t.mul_scalar(v),
                    WithScalar::DivScalar => t.div_scalar(v),
                    WithScalar::FullLike => t.full_like(v),
                };
                let result = run(&t);
                agrees_with_contiguous(&(kind, v), &[&t], &result, |c| run(&c[0]));
                self.keep(result);
            }
            Op::ScalarInPlace(kind, i, value) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) && !t.layout().has_internal_overlap() {
                    return;
                }
                match kind {
                    // Filling an expanded view is allowed (one value for all).
                    ScalarInPlace::Fill => drop(t.fill_(value.0)),
                    ScalarInPlace::Zero => drop(t.zero_()),
                    ScalarInPlace::AddScalar => self.in_place("add_scalar_", &t, t.add_scalar_(value.0)),
                    ScalarInPlace::MulScalar => self.in_place("mul_scalar_", &t, t.mul_scalar_(value.0)),
                }
            }
            Op::Affine(i, mul, add, in_place) => {
                let Some(t) = self.get(i) else { return };
                if in_place {
                    if small(&t) || t.layout().has_internal_overlap() {
                        self.in_place("affine_", &t, t.affine_(mul.0, add.0));
                    }
                } else if cheap_or_hopeless(t.numel()) {
                    let result = t.affine(mul.0, add.0);
                    agrees_with_contiguous(&("affine", mul.0, add.0), &[&t], &result, |c| c[0].affine(mul.0, add.0));
                    self.keep(result);
                }
            }
            Op::Clamp(i, min, max, in_place) => {
                let Some(t) = self.get(i) else { return };
                let (min, max) = (min.map(|n| n.0), max.map(|n| n.0));
                if in_place {
                    if small(&t) || t.layout().has_internal_overlap() {
                        self.in_place("clamp_", &t, t.clamp_(min, max));
                    }
                } else if cheap_or_hopeless(t.numel()) {
                    let result = t.clamp(min, max);
                    agrees_with_contiguous(&("clamp", min, max), &[&t], &result, |c| c[0].clamp(min, max));
                    self.keep(result);
                }
            }
            Op::Where(c, a, b) => {
                let (Some(c), Some(a), Some(b)) = (self.get(c), self.get(a), self.get(b)) else { return };
                let out = broadcast_numel(&[&c, &a, &b]);
                if small(&c) && small(&a) && small(&b) && cheap_or_hopeless(out) || out >= HOPELESS {
                    let result = c.where_cond(&a, &b);
                    agrees_with_contiguous(&"where_cond", &[&c, &a, &b], &result, |t| t[0].where_cond(&t[1], &t[2]));
                    self.keep(result);
                }
            }
            Op::AddScaled(a, alpha, x) => {
                let (Some(a), Some(x)) = (self.get(a), self.get(x)) else { return };
                if small(&a) && small(&x) || a.layout().has_internal_overlap() {
                    self.in_place("add_scaled_", &a, a.add_scaled_(alpha.0, &x));
                }
            }
            Op::Addcmul(a, value, x, y, div) => {
                let (Some(a), Some(x), Some(y)) = (self.get(a), self.get(x), self.get(y)) else { return };
                if small(&a) && small(&x) && small(&y) || a.layout().has_internal_overlap() {
                    if div {
                        self.in_place("addcdiv_", &a, a.addcdiv_(value.0, &x, &y));
                    } else {
                        self.in_place("addcmul_", &a, a.addcmul_(value.0, &x, &y));
                    }
                }
            }
            Op::Lerp(a, end, weight) => {
                let (Some(a), Some(end)) = (self.get(a), self.get(end)) else { return };
                if small(&a) && small(&end) || a.layout().has_internal_overlap() {
                    self.in_place("lerp_", &a, a.lerp_(&end, weight.0));
                }
            }
            Op::Reduce(kind, i, dims, keepdim) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let dims: Vec<isize> = dims.iter().take(8).map(|&d| d as isize).collect();
                let result = match kind {
                    Reduce::Sum => t.sum(&dims, keepdim),
                    Reduce::Mean => t.mean(&dims, keepdim),
                    Reduce::Var => t.var(&dims, keepdim),
                    Reduce::Std => t.std(&dims, keepdim),
                    Reduce::Max => t.max(&dims, keepdim),
                    Reduce::Min => t.min(&dims, keepdim),
                    Reduce::Argmax => t.argmax(&dims, keepdim),
                    Reduce::Argmin => t.argmin(&dims, keepdim),
                };
                self.keep(result);
            }
            Op::VarCorrection(i, dims, correction, keepdim, std) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let dims: Vec<isize> = dims.iter().take(8).map(|&d| d as isize).collect();
                self.keep(if std {
                    t.std_with_correction(&dims, correction.0, keepdim)
                } else {
                    t.var_with_correction(&dims, correction.0, keepdim)
                });
            }
            Op::ReduceAll(i, mean) => {
                let Some(t) = self.get(i) else { return };
                if small(&t) {
                    let result = if mean { t.mean_all() } else { t.sum_all() };
                    if let Ok(out) = &result {
                        assert_eq!(out.numel(), 1);
                    }
                    self.keep(result);
                }
            }
            Op::Softmax(i, dim, log) => {
                let Some(t) = self.get(i) else { return };
                if small(&t) {
                    self.keep(if log { t.log_softmax(dim as isize) } else { t.softmax(dim as isize) });
                }
            }
            Op::Matmul(a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                if !(small(&a) && small(&b)) {
                    return;
                }
                let last = |t: &Tensor| t.dims().last().copied().unwrap_or(1);
                let rows = |t: &Tensor| if t.rank() >= 2 { t.dims()[t.rank() - 2] } else { 1 };
                let flops = a.numel().saturating_mul(last(&b)).max(b.numel().saturating_mul(rows(&a)));
                if flops <= FLOPS {
                    self.keep(a.matmul(&b));
                }
            }
            Op::Cat(list, dim, stack) => {
                let tensors: Vec<Tensor> = list.iter().take(6).filter_map(|&i| self.get(i)).collect();
                let total = tensors.iter().fold(0usize, |n, t| n.saturating_add(t.numel()));
                if tensors.iter().all(small) || total >= HOPELESS {
                    let refs: Vec<&Tensor> = tensors.iter().collect();
                    self.keep(if stack { Tensor::stack(&refs, dim as isize) } else { Tensor::cat(&refs, dim as isize) });
                }
            }
            Op::IndexSelect(t, dim, index) => {
                let (Some(t), Some(index)) = (self.get(t), self.get(index)) else { return };
                let out = t.numel().checked_div(t.dim(dim as isize).unwrap_or(1).max(1)).unwrap_or(0);
                if small(&t) && small(&index) && out.saturating_mul(index.numel()) <= WORK {
                    self.keep(t.index_select(dim as isize, &index));
                }
            }
            Op::Embedding(weight, ids) => {
                let (Some(weight), Some(ids)) = (self.get(weight), self.get(ids)) else { return };
                let row = weight.dims().last().copied().unwrap_or(1);
                if small(&weight) && small(&ids) && ids.numel().saturating_mul(row) <= WORK {
                    self.keep(Tensor::embedding(&weight, &ids));
                }
            }
            Op::Gather(t, dim, index) => {
                let (Some(t), Some(index)) = (self.get(t), self.get(index)) else { return };
                if small(&t) && small(&index) {
                    self.keep(t.gather(dim as isize, &index));
                }
            }
            Op::ScatterAdd(t, dim, index, src, in_place) => {
                let (Some(t), Some(index), Some(src)) = (self.get(t), self.get(index), self.get(src)) else { return };
                if in_place && (small(&t) && small(&index) && small(&src) || t.layout().has_internal_overlap()) {
                    self.in_place("scatter_add_", &t, t.scatter_add_(dim as isize, &index, &src));
                } else if !in_place && small(&t) && small(&index) && small(&src) {
                    self.keep(t.scatter_add(dim as isize, &index, &src));
                }
            }
            Op::OneHot(t, classes) => {
                let Some(t) = self.get(t) else { return };
                if small(&t) && cheap_or_hopeless(t.numel().saturating_mul(classes.0)) {
                    self.keep(t.one_hot(classes.0));
                }
            }
            Op::Conv2d(x, w, bias, stride, padding, dilation, groups) => {
                let (Some(x), Some(w)) = (self.get(x), self.get(w)) else { return };
                let bias = bias.and_then(|b| self.get(b));
                let params = conv_params(stride, padding, dilation, groups);
                if small(&x) && small(&w) && conv_flops(x.dims(), w.dims(), params) <= FLOPS {
                    self.keep(x.conv2d(&w, bias.as_ref(), params));
                }
            }
            Op::Conv2dBackwardInput(grad, w, input_shape, stride, padding, dilation, groups) => {
                let (Some(grad), Some(w)) = (self.get(grad), self.get(w)) else { return };
                let params = conv_params(stride, padding, dilation, groups);
                let flops = conv_flops(&input_shape.0, w.dims(), params);
                if small(&grad) && small(&w) && flops <= FLOPS && dims_numel(&input_shape.0) <= WORK {
                    self.keep(grad.conv2d_backward_input(&w, input_shape.0, params));
                }
            }
            Op::Conv2dBackwardWeight(x, grad, weight_shape, stride, padding, dilation, groups) => {
                let (Some(x), Some(grad)) = (self.get(x), self.get(grad)) else { return };
                let params = conv_params(stride, padding, dilation, groups);
                let flops = conv_flops(x.dims(), &weight_shape.0, params);
                if small(&x) && small(&grad) && flops <= FLOPS && dims_numel(&weight_shape.0) <= WORK {
                    self.keep(x.conv2d_backward_weight(&grad, weight_shape.0, params));
                }
            }
            Op::Conv2dBackwardBias(grad) => {
                let Some(grad) = self.get(grad) else { return };
                if small(&grad) {
                    self.keep(grad.conv2d_backward_bias());
                }
            }
            Op::MaxPool2d(x, kernel, stride, padding) => {
                let Some(x) = self.get(x) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                if small(&x) && pool_flops(x.dims(), kernel, stride, padding) <= FLOPS {
                    if let Ok((values, indices)) = x.max_pool2d(kernel, stride, padding) {
                        assert_eq!(values.dims(), indices.dims());
                        self.keep(Ok(values));
                        self.keep(Ok(indices));
                    }
                }
            }
            Op::MaxPool2dBackward(grad, indices, input_shape) => {
                let (Some(grad), Some(indices)) = (self.get(grad), self.get(indices)) else { return };
                if small(&grad) && small(&indices) && dims_numel(&input_shape.0) <= WORK {
                    self.keep(grad.max_pool2d_backward(&indices, input_shape.0));
                }
            }
            Op::AvgPool2d(x, kernel, stride, padding, count_include_pad) => {
                let Some(x) = self.get(x) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                if small(&x) && pool_flops(x.dims(), kernel, stride, padding) <= FLOPS {
                    self.keep(x.avg_pool2d(kernel, stride, padding, count_include_pad));
                }
            }
            Op::AvgPool2dBackward(grad, input_shape, kernel, stride, padding, count_include_pad) => {
                let Some(grad) = self.get(grad) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                let flops = pool_flops(&input_shape.0, kernel, stride, padding);
                if small(&grad) && dims_numel(&input_shape.0) <= WORK && flops <= FLOPS {
                    self.keep(grad.avg_pool2d_backward(input_shape.0, kernel, stride, padding, count_include_pad));
                }
            }
            Op::ToVec(i) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let n = match t.dtype() {
                    DType::Bool => t.to_vec::<bool>().map(|v| v.len()),
                    DType::U8 => t.to_vec::<u8>().map(|v| v.len()),
                    DType::I64 => t.to_vec::<i64>().map(|v| v.len()),
                    DType::F16 => t.to_vec::<half::f16>().map(|v| v.len()),
                    DType::BF16 => t.to_vec::<half::bf16>().map(|v| v.len()),
                    DType::F32 => t.to_vec::<f32>().map(|v| v.len()),
                    DType::F64 => t.to_vec::<f64>().map(|v| v.len()),
                };
                if let Ok(n) = n {
                    assert_eq!(n, t.numel(), "to_vec of {:?}", t.dims());
                }
                // The wrong element type is an error, not a reinterpretation.
                let wrong = if t.dtype() == DType::F32 { t.to_vec::<f64>().is_ok() } else { t.to_vec::<f32>().is_ok() };
                assert!(!wrong, "to_vec with the wrong element type succeeded for {}", t.dtype());
            }
            Op::Item(i) => {
                let Some(t) = self.get(i) else { return };
                let result = t.item::<f64>();
                assert_eq!(result.is_ok(), t.numel() == 1, "item of {:?}", t.dims());
            }
            Op::RecordStream(i, device) => {
                let Some(t) = self.get(i) else { return };
                if let Ok(stream) = Stream::new(device.get()) {
                    let _ = t.record_stream(&stream);
                    let _ = stream.synchronize();
                }
            }
            Op::MemoryReport(device) => {
                let device = device.get();
                let _ = memory::stats(device);
                let _ = memory::summary(device);
                let _ = memory::snapshot(device).map(|s| s.to_json());
                let _ = memory::fragmentation(device);
            }
        }
    }

    fn reshape(&mut self, t: &Tensor, spec: &[isize], view: bool) {
        if view {
            self.keep(t.view(spec));
        } else if small(t) || t.is_contiguous() || t.numel() >= HOPELESS {
            self.keep(t.reshape(spec));
        }
    }
}

/// A tensor from a [`Source`], unless it would be large but not hopelessly so.
fn make(source: Source) -> brasa_tensor::Result<Tensor> {
    let numel_ok = |shape: &Sh| cheap_or_hopeless(dims_numel(&shape.0));
    let skip = || Err(brasa_tensor::TensorError::Device("skipped by the fuzzer: large but not hopeless".into()));
    match source {
        Source::Zeros(shape, dtype, device) if numel_ok(&shape) => Tensor::zeros_on(shape.0, dtype.get(), device.get()),
        Source::Ones(shape, dtype) if numel_ok(&shape) => Tensor::ones(shape.0, dtype.get()),
        Source::Full(shape, value, dtype, device) if numel_ok(&shape) => {
            Tensor::full_on(shape.0, value.0, dtype.get(), device.get())
        }
        Source::Arange(start, end, step, dtype) => {
            let count = ((end.0 - start.0) / step.0).abs();
            if count.is_finite() && count > WORK as f64 && count < HOPELESS as f64 {
                return skip();
            }
            let result = Tensor::arange(start.0, end.0, step.0, dtype.get());
            if let Ok(t) = &result {
                assert_eq!(t.rank(), 1);
            }
            result
        }
        Source::Linspace(start, end, steps, dtype) if cheap_or_hopeless(steps.0) => {
            let result = Tensor::linspace(start.0, end.0, steps.0, dtype.get());
            if let Ok(t) = &result {
                assert_eq!(t.dims(), [steps.0]);
            }
            result
        }
        Source::Eye(n, dtype) if cheap_or_hopeless(n.0.saturating_mul(n.0)) => Tensor::eye(n.0, dtype.get()),
        Source::Rand(shape, dtype) if numel_ok(&shape) => Tensor::rand(shape.0, dtype.get()),
        Source::Randn(shape, dtype) if numel_ok(&shape) => Tensor::randn(shape.0, dtype.get()),
        Source::Uniform(shape, low, high, dtype) if numel_ok(&shape) => {
            Tensor::uniform_on(shape.0, low.0, high.0, dtype.get(), Device::CPU)
        }
        Source::Bernoulli(shape, p, dtype) if numel_ok(&shape) => Tensor::bernoulli(shape.0, p.0, dtype.get()),
        Source::Data(dtype, shape, bytes) => from_bytes(dtype.get(), shape.0, &bytes),
        Source::Indices(shape, values) => {
            Tensor::from_vec(values.into_iter().map(i64::from).collect::<Vec<i64>>(), shape.0)
        }
        Source::Scalar(value, dtype) => Tensor::full([], value.0, dtype.get()),
        _ => skip(),
    }
}

/// A tensor of `dtype` whose elements are the bytes' values (as many as
/// there are whole elements; the shape may disagree, which is an error).
fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> brasa_tensor::Result<Tensor> {
    fn collect<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().expect("chunk of N"))).collect()
    }
    match dtype {
        DType::Bool => Tensor::from_vec(bytes.iter().map(|&b| b & 1 == 1).collect::<Vec<bool>>(), shape),
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape),
        DType::I64 => Tensor::from_vec(collect(bytes, i64::from_le_bytes), shape),
        DType::F16 => Tensor::from_vec(collect(bytes, |b| half::f16::from_bits(u16::from_le_bytes(b))), shape),
        DType::BF16 => Tensor::from_vec(collect(bytes, |b| half::bf16::from_bits(u16::from_le_bytes(b))), shape),
        DType::F32 => Tensor::from_vec(collect(bytes, f32::from_le_bytes), shape),
        DType::F64 => Tensor::from_vec(collect(bytes, f64::from_le_bytes), shape),
    }
}

/// `BRASA_FUZZ_TRACE=1` prints each op before it runs (to read a crash).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("BRASA_FUZZ_TRACE").is_some())
}

fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        // Before any host tensor exists: two logical devices, 64 MiB each.
        brasa_tensor::set_host_device_count(2).expect("host device count");
        for index in 0..2 {
            brasa_tensor::set_host_memory_limit(index, Some(DEVICE_LIMIT)).expect("host memory limit");
        }
    });
}

fuzz_target!(|data: &[u8]| {
    setup();
    let mut u = Unstructured::new(data);
    let Ok(seed) = u.arbitrary::<u64>() else { return };
    brasa_tensor::manual_seed(seed);
    let mut machine = Machine { pool: Vec::new() };
    for _ in 0..32 {
        match u.arbitrary::<Op>() {
            Ok(op) => {
                if trace() {
                    eprintln!("{op:?}");
                }
                machine.run(op)
            }
            Err(_) => break,
        }
    }
    drop(machine);
    // Every tensor is gone: the host devices hold no allocation.
    for device in [Device::CPU, Device::cpu(1)] {
        assert_eq!(memory::allocated(device).unwrap_or(0), 0, "{device} leaked memory");
    }
});
