//! What the fuzzer's bytes decode into: shapes, numbers, dtypes, devices,
//! where a tensor comes from, and the ops of a program.

use arbitrary::{Arbitrary, Unstructured};
use brasa_tensor::{DType, Device};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Dim(pub(crate) usize);

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
pub(crate) struct Sh(pub(crate) Vec<usize>);

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
pub(crate) struct Num(pub(crate) f64);

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
pub(crate) type Ax = i8;

/// Which tensor of the pool.
pub(crate) type Ix = u8;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(crate) enum Dt {
    Bool,
    U8,
    I64,
    F16,
    Bf16,
    F32,
    F64,
}

impl Dt {
    pub(crate) fn get(self) -> DType {
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
pub(crate) enum Dev {
    Cpu0,
    Cpu1,
    Cpu7,
    Cuda0,
}

impl Dev {
    pub(crate) fn get(self) -> Device {
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
pub(crate) enum Source {
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
pub(crate) enum Unary {
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
pub(crate) enum UnaryInPlace {
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
pub(crate) enum Binary {
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
pub(crate) enum BinaryInPlace {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Copy,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(crate) enum WithScalar {
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
pub(crate) enum ScalarInPlace {
    Fill,
    Zero,
    AddScalar,
    MulScalar,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(crate) enum Reduce {
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
pub(crate) enum Op {
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
