//! A property test over the op front door (issue 13): for random arguments,
//! every public op of [`Tensor`] returns `Ok` or `Err` — never a panic,
//! never a hang, never memory the allocator statistics do not account for.
//!
//! Each case builds a few tensors from random specs (shapes with 0, 1,
//! small and huge dims; every dtype; values that include NaN, infinities
//! and out-of-range indices; views with odd strides: transposed, permuted,
//! narrowed, selected, expanded) on two logical host devices limited to
//! 64 MiB each, then calls a family of ops on them:
//!
//! - element-wise unary, scalar and binary ops (broadcasting and mismatched
//!   shapes), comparisons, `where_cond`, `clamp`, casts to every dtype,
//!   `to(device)` between cpu:0, cpu:1 and a device that does not exist;
//! - in-place ops: into an expanded view (several elements on one memory
//!   location) they must fail; from a source that overlaps the destination
//!   they must read the old values (checked against contiguous copies);
//! - reductions with random dim lists and `keepdim` (out of range, repeated,
//!   empty, over 0-size dims), `softmax`/`log_softmax`;
//! - `matmul` (vectors, matrices, batches, mismatched), `cat`/`stack`/
//!   `split`/`chunk`, `index_select`/`gather`/`scatter_add(_)`/`embedding`/
//!   `one_hot` with out-of-range indices;
//! - `conv2d` and its three backward ops, `max_pool2d`/`avg_pool2d` and
//!   their backward ops, with odd kernel, stride, padding, dilation, groups.
//!
//! Every call runs inside `catch_unwind` (a panic fails the property, naming
//! the call and its operands) and is timed: over [`CALL_LIMIT`] fails the
//! property, and a watchdog thread ends the process, naming the call, if one
//! never returns. After each case, with all of its tensors dropped, the
//! statistics of both devices (and of the pinned pool) must be back where
//! they were: allocated, active and requested bytes, live allocations, and
//! (after `empty_cache`) reserved bytes.
//!
//! Work is bounded as in the fuzz target (`fuzz/fuzz_targets/tensor_ops.rs`):
//! an op is run when its inputs are small, or when its output alone cannot
//! fit under the limit (then it must fail, and fast); a legitimately long
//! computation (summing 2^40 elements of an expanded view) is not run.
//! `PROPTEST_CASES` sets the number of cases of every property;
//! `OP_FRONT_DOOR_COUNTS=1` prints how many calls returned `Ok` and `Err`
//! and any call slower than a second.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{
    memory, set_host_device_count, set_host_memory_limit, Conv2dParams, DType, Device, Tensor, TensorError,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

/// The byte limit of each logical host device.
const LIMIT: usize = 64 << 20;
/// The two devices tensors live on.
const DEVICES: [Device; 2] = [Device::Cpu(0), Device::Cpu(1)];
/// Elements an op may read or write when it is run for its result.
const WORK: usize = 1 << 12;
/// Multiply-adds a matrix product, convolution or pooling may do.
const FLOPS: usize = 1 << 18;
/// An output of at least this many elements cannot be allocated under the
/// limit: an op making it must fail.
const HOPELESS: usize = 2 * LIMIT;
/// The longest one call may take (generous: this is about hangs).
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// A call running this long is a hang: the watchdog ends the process.
const HANG: Duration = Duration::from_secs(60);
/// Cases per property (or `PROPTEST_CASES`).
const CASES: u32 = 256;
/// Cases of the property over large tensors (or `PROPTEST_CASES`).
const LARGE_CASES: u32 = 24;

mod harness;
mod regressions;
mod tensors;

use harness::*;
use tensors::*;

/// Element-wise unary, scalar and binary ops, comparisons, `where_cond`,
/// casts, device moves, `*_like`, data out.
fn elementwise(a: &Tensor, b: &Tensor, s: f64, t: f64, target: Device) -> Result<(), TestCaseError> {
    let ctx = Ctx::new(&[a, b]);
    if cheap_or_hopeless(a.numel()) {
        type Unary = fn(&Tensor) -> Result<Tensor, TensorError>;
        let unary: [(&str, Unary); 20] = [
            ("neg", Tensor::neg),
            ("abs", Tensor::abs),
            ("exp", Tensor::exp),
            ("log", Tensor::log),
            ("sqrt", Tensor::sqrt),
            ("rsqrt", Tensor::rsqrt),
            ("sin", Tensor::sin),
            ("cos", Tensor::cos),
            ("tanh", Tensor::tanh),
            ("sigmoid", Tensor::sigmoid),
            ("relu", Tensor::relu),
            ("gelu", Tensor::gelu),
            ("gelu_tanh", Tensor::gelu_tanh),
            ("silu", Tensor::silu),
            ("contiguous", Tensor::contiguous),
            ("zeros_like", Tensor::zeros_like),
            ("ones_like", Tensor::ones_like),
            ("rand_like", Tensor::rand_like),
            ("randn_like", Tensor::randn_like),
            ("pin_memory", |x| if x.numel() <= WORK { x.pin_memory() } else { Ok(x.clone()) }),
        ];
        for (name, op) in unary {
            if let Some(out) = ctx.tensor(name, || op(a))? {
                prop_assert_eq!(out.dims(), a.dims(), "{} of {}", name, desc(a));
            }
        }
        type WithScalar = fn(&Tensor, f64) -> Result<Tensor, TensorError>;
        let with_scalar: [(&str, WithScalar); 12] = [
            ("eq_scalar", Tensor::eq_scalar),
            ("ne_scalar", Tensor::ne_scalar),
            ("lt_scalar", Tensor::lt_scalar),
            ("le_scalar", Tensor::le_scalar),
            ("gt_scalar", Tensor::gt_scalar),
            ("ge_scalar", Tensor::ge_scalar),
            ("powf", Tensor::powf),
            ("add_scalar", Tensor::add_scalar),
            ("sub_scalar", Tensor::sub_scalar),
            ("mul_scalar", Tensor::mul_scalar),
            ("div_scalar", Tensor::div_scalar),
            ("full_like", Tensor::full_like),
        ];
        for (name, op) in with_scalar {
            ctx.tensor(name, || op(a, s))?;
        }
        ctx.tensor("affine", || a.affine(s, t))?;
        ctx.tensor("clamp", || a.clamp(Some(s), Some(t)))?;
        ctx.tensor("clamp min", || a.clamp(Some(s), None))?;
        ctx.tensor("clamp max", || a.clamp(None, Some(t)))?;
        ctx.tensor("clamp none", || a.clamp(None, None))?;
        for dtype in DType::ALL {
            if let Some(out) = ctx.tensor(&format!("to_dtype({dtype})"), || a.to_dtype(dtype))? {
                prop_assert_eq!(out.dtype(), dtype);
                prop_assert_eq!(out.dims(), a.dims());
            }
        }
        for device in [target, Device::Cpu(7)] {
            if let Some(out) = ctx.tensor(&format!("to({device})"), || a.to(device))? {
                prop_assert_eq!(out.device(), device);
            }
            ctx.tensor(&format!("to_non_blocking({device})"), || a.to_non_blocking(device))?;
        }
    }
    if small(a) {
        ctx.call("item", || a.item::<f64>())?;
        ctx.call("to_vec", || a.to_vec::<f32>())?;
        ctx.call("display", || Ok(format!("{a}")))?;
    }
    type Binary = fn(&Tensor, &Tensor) -> Result<Tensor, TensorError>;
    let binary: [(&str, Binary); 16] = [
        ("add", Tensor::add),
        ("sub", Tensor::sub),
        ("mul", Tensor::mul),
        ("div", Tensor::div),
        ("pow", Tensor::pow),
        ("relu_backward", Tensor::relu_backward),
        ("gelu_backward", Tensor::gelu_backward),
        ("gelu_tanh_backward", Tensor::gelu_tanh_backward),
        ("maximum", Tensor::maximum),
        ("minimum", Tensor::minimum),
        ("eq", Tensor::eq),
        ("ne", Tensor::ne),
        ("lt", Tensor::lt),
        ("le", Tensor::le),
        ("gt", Tensor::gt),
        ("ge", Tensor::ge),
    ];
    let at = a.t().unwrap_or_else(|_| a.clone());
    for (x, y) in [(a, b), (b, a), (a, a), (a, &at)] {
        let out = broadcast_numel(&[x, y]);
        if !(small(x) && small(y) && cheap_or_hopeless(out) || out >= HOPELESS) {
            continue;
        }
        let ctx = Ctx::new(&[x, y]);
        for (name, op) in binary {
            if let Some(r) = ctx.tensor(name, || op(x, y))? {
                prop_assert_eq!(r.numel(), out, "{} on [{}] gave {}", name, ctx.0, desc(&r));
            }
        }
    }
    let cond = ctx.tensor("gt_scalar", || if small(a) { a.gt_scalar(s) } else { a.eq_scalar(s) })?;
    for c in cond.iter().chain([a, b]) {
        let out = broadcast_numel(&[c, a, b]);
        if small(c) && small(a) && small(b) && cheap_or_hopeless(out) || out >= HOPELESS {
            Ctx::new(&[c, a, b]).tensor("where_cond", || c.where_cond(a, b))?;
        }
    }
    Ok(())
}

#[test]
fn elementwise_ops_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(CASES), |(
        a in any_spec(),
        b in any_spec(),
        (s, t) in (any_scalar(), any_scalar()),
        target in proptest::sample::select(DEVICES.to_vec()),
    )| {
        case(|| {
            let (Some(a), Some(b)) = (build(&a)?, build(&b)?) else { return Ok(()) };
            elementwise(&a, &b, s, t, target)
        })?;
    });
    report("elementwise_ops_return_ok_or_err");
}

/// In-place ops on `dst` with operands `x` and `y` (the caller has checked
/// they are small, or `dst` is expanded and every op must fail).
fn in_place(dst: &Tensor, x: &Tensor, y: &Tensor, s: f64, t: f64) -> Result<(), TestCaseError> {
    let ctx = Ctx::new(&[dst, x, y]);
    type Unary = fn(&Tensor) -> Result<(), TensorError>;
    let unary: [(&str, Unary); 11] = [
        ("neg_", Tensor::neg_),
        ("abs_", Tensor::abs_),
        ("relu_", Tensor::relu_),
        ("sqrt_", Tensor::sqrt_),
        ("rsqrt_", Tensor::rsqrt_),
        ("exp_", Tensor::exp_),
        ("log_", Tensor::log_),
        ("log1p_", Tensor::log1p_),
        ("sigmoid_", Tensor::sigmoid_),
        ("tanh_", Tensor::tanh_),
        ("log_sigmoid_", Tensor::log_sigmoid_),
    ];
    for (name, op) in unary {
        ctx.in_place(name, dst, || op(dst))?;
    }
    type Binary = fn(&Tensor, &Tensor) -> Result<(), TensorError>;
    let binary: [(&str, Binary); 7] = [
        ("add_", Tensor::add_),
        ("sub_", Tensor::sub_),
        ("mul_", Tensor::mul_),
        ("div_", Tensor::div_),
        ("maximum_", Tensor::maximum_),
        ("minimum_", Tensor::minimum_),
        ("copy_", Tensor::copy_),
    ];
    for (name, op) in binary {
        for src in [x, dst] {
            ctx.in_place(name, dst, || op(dst, src))?;
        }
    }
    ctx.in_place("add_scalar_", dst, || dst.add_scalar_(s))?;
    ctx.in_place("mul_scalar_", dst, || dst.mul_scalar_(t))?;
    ctx.in_place("affine_", dst, || dst.affine_(s, t))?;
    ctx.in_place("clamp_", dst, || dst.clamp_(Some(s), Some(t)))?;
    ctx.in_place("clamp_ max", dst, || dst.clamp_(None, Some(t)))?;
    ctx.in_place("add_scaled_", dst, || dst.add_scaled_(s, x))?;
    ctx.in_place("addcmul_", dst, || dst.addcmul_(s, x, y))?;
    ctx.in_place("addcdiv_", dst, || dst.addcdiv_(t, x, y))?;
    ctx.in_place("lerp_", dst, || dst.lerp_(x, s))?;
    // Filling an expanded view is allowed (one value for all, as in PyTorch).
    ctx.call("fill_", || dst.fill_(s))?;
    ctx.call("zero_", || dst.zero_())?;
    Ok(())
}

/// `dst.op_(src)` where `src` shares `dst`'s storage must give what the op
/// gives on contiguous copies: the old values are read, never a value the
/// op itself just wrote.
fn overlapping_in_place(dst: &Tensor, src: &Tensor) -> Result<(), TestCaseError> {
    if !(small(dst) && small(src)) || dst.layout().has_internal_overlap() {
        return Ok(());
    }
    let ctx = Ctx::new(&[dst, src]);
    type Op = fn(&Tensor, &Tensor) -> Result<(), TensorError>;
    let ops: [(&str, Op, Op); 3] = [
        ("copy_", Tensor::copy_, Tensor::copy_),
        ("add_", Tensor::add_, Tensor::add_),
        ("maximum_", Tensor::maximum_, Tensor::maximum_),
    ];
    for (name, op, reference) in ops {
        let (Some(expected), Some(old)) =
            (ctx.tensor("contiguous", || dst.contiguous())?, ctx.tensor("contiguous", || src.contiguous())?)
        else {
            continue;
        };
        let reference_ok = ctx.call(name, || reference(&expected, &old))?.is_some();
        let done = ctx.call(name, || op(dst, src))?.is_some();
        prop_assert_eq!(done, reference_ok, "{} on overlapping [{}] and on contiguous copies disagree", name, ctx.0);
        if done {
            prop_assert_eq!(
                elements(dst),
                elements(&expected),
                "{} on overlapping [{}] read values it wrote",
                name,
                ctx.0
            );
        }
    }
    Ok(())
}

#[test]
fn in_place_ops_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(CASES), |(
        a in any_spec(),
        b in any_spec(),
        c in any_spec(),
        (s, t) in (any_scalar(), any_scalar()),
        expand in 2usize..4,
    )| {
        case(|| {
            let (Some(a), Some(b), Some(c)) = (build(&a)?, build(&b)?, build(&c)?) else { return Ok(()) };
            if small(&a) && small(&b) && small(&c) || a.layout().has_internal_overlap() {
                in_place(&a, &b, &c, s, t)?;
            }
            // An explicitly expanded view of a: every write but fill_ must fail.
            let ctx = Ctx::new(&[&a]);
            let mut shape = a.dims().to_vec();
            shape.insert(0, expand);
            if let Some(wide) = ctx.tensor("expand", || a.unsqueeze(0)?.expand(shape))? {
                if small(&wide) && small(&b) && small(&c) {
                    in_place(&wide, &b, &c, s, t)?;
                }
            }
            // Overlapping source and destination: a shifted by one along dim 0, and its transpose.
            if a.rank() >= 1 && a.dims()[0] >= 2 {
                let n = a.dims()[0] - 1;
                if let (Some(dst), Some(src)) = (ctx.tensor("narrow", || a.narrow(0, 0, n))?, ctx.tensor("narrow", || a.narrow(0, 1, n))?) {
                    overlapping_in_place(&dst, &src)?;
                    overlapping_in_place(&src, &dst)?;
                }
            }
            if let Some(at) = ctx.tensor("t", || a.t())? {
                overlapping_in_place(&a, &at)?;
            }
            Ok(())
        })?;
    });
    report("in_place_ops_return_ok_or_err");
}

/// Reductions over `dims` (kept or not), whole-tensor reductions, softmax.
fn reductions(a: &Tensor, dims: &[isize], keepdim: bool, correction: usize, d: isize) -> Result<(), TestCaseError> {
    let ctx = Ctx::new(&[a]);
    if !small(a) {
        // Large (an expanded view): only what must fail, fast, is run: a
        // reduction over one dim whose output cannot fit, a softmax.
        if let Ok(dim) = brasa_tensor::resolve_dim(d, a.rank(), "test") {
            let mut rest = a.dims().to_vec();
            rest.remove(dim);
            if dims_numel(&rest) >= HOPELESS {
                ctx.tensor("sum hopeless", || a.sum(&[d], keepdim))?;
                ctx.tensor("argmax hopeless", || a.argmax(&[d], keepdim))?;
                ctx.tensor("var hopeless", || a.var(&[d], keepdim))?;
            }
        }
        if a.numel() >= HOPELESS {
            ctx.tensor("softmax hopeless", || a.softmax(d))?;
            ctx.tensor("log_softmax hopeless", || a.log_softmax(d))?;
        }
        return Ok(());
    }
    type Reduce = fn(&Tensor, &[isize], bool) -> Result<Tensor, TensorError>;
    let reduce: [(&str, Reduce); 8] = [
        ("sum", Tensor::sum),
        ("mean", Tensor::mean),
        ("var", Tensor::var),
        ("std", Tensor::std),
        ("max", Tensor::max),
        ("min", Tensor::min),
        ("argmax", Tensor::argmax),
        ("argmin", Tensor::argmin),
    ];
    for (name, op) in reduce {
        for dims in [dims, &[], &[d]] {
            if let Some(out) = ctx.tensor(&format!("{name}({dims:?}, {keepdim})"), || op(a, dims, keepdim))? {
                if keepdim {
                    prop_assert_eq!(out.rank(), a.rank(), "{}({:?}, keepdim) of {}", name, dims, desc(a));
                }
            }
        }
    }
    ctx.tensor("var_with_correction", || a.var_with_correction(dims, correction, keepdim))?;
    ctx.tensor("std_with_correction", || a.std_with_correction(dims, correction, keepdim))?;
    for (name, op) in [("sum_all", Tensor::sum_all as fn(&Tensor) -> _), ("mean_all", Tensor::mean_all)] {
        if let Some(out) = ctx.tensor(name, || op(a))? {
            prop_assert_eq!(out.numel(), 1);
        }
    }
    if let Some(out) = ctx.tensor("softmax", || a.softmax(d))? {
        prop_assert_eq!(out.dims(), a.dims());
    }
    if let Some(out) = ctx.tensor("log_softmax", || a.log_softmax(d))? {
        prop_assert_eq!(out.dims(), a.dims());
    }
    Ok(())
}

#[test]
fn reductions_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(CASES), |(
        a in any_spec(),
        dims in proptest::collection::vec(any_dim(), 0..4),
        keepdim in any::<bool>(),
        correction in prop_oneof![0usize..3, Just(usize::MAX)],
        d in any_dim(),
    )| {
        case(|| {
            let Some(a) = build(&a)? else { return Ok(()) };
            reductions(&a, &dims, keepdim, correction, d)
        })?;
    });
    report("reductions_return_ok_or_err");
}

/// Matrix products, joins and splits, indexing.
fn products_and_indexing(a: &Tensor, b: &Tensor, index: &Tensor, d: isize, count: usize) -> Result<(), TestCaseError> {
    let ctx = Ctx::new(&[a, b, index]);
    let at = a.t().unwrap_or_else(|_| a.clone());
    for (x, y) in [(a, b), (b, a), (a, &at), (&at, a)] {
        let last = |t: &Tensor| t.dims().last().copied().unwrap_or(1);
        let rows = |t: &Tensor| if t.rank() >= 2 { t.dims()[t.rank() - 2] } else { 1 };
        let flops = x.numel().saturating_mul(last(y)).max(y.numel().saturating_mul(rows(x)));
        if small(x) && small(y) && flops <= FLOPS {
            Ctx::new(&[x, y]).tensor("matmul", || x.matmul(y))?;
        }
    }
    let total = a.numel().saturating_add(b.numel());
    if small(a) && small(b) || total >= HOPELESS {
        ctx.tensor("cat", || Tensor::cat(&[a, b], d))?;
        ctx.tensor("cat aa", || Tensor::cat(&[a, a], d))?;
        ctx.tensor("stack", || Tensor::stack(&[a, b], d))?;
        ctx.tensor("stack aa", || Tensor::stack(&[a, a], d))?;
    }
    ctx.tensor("cat none", || Tensor::cat(&[], d))?;
    ctx.tensor("stack none", || Tensor::stack(&[], d))?;
    let along = a.dim(d).unwrap_or(0);
    if count == 0 || along / count <= 64 {
        ctx.call("split", || a.split(count, d))?;
    }
    if count <= 64 {
        ctx.call("chunk", || a.chunk(count, d))?;
    }
    if let Ok(along) = a.dim(d) {
        let rows = a.numel().checked_div(along).unwrap_or(0);
        if small(index) && rows.saturating_mul(index.numel()) >= HOPELESS {
            ctx.tensor("index_select hopeless", || a.index_select(d, index))?;
        }
    }
    if !(small(a) && small(b) && small(index)) {
        return Ok(());
    }
    ctx.tensor("index_select", || a.index_select(d, index))?;
    ctx.tensor("gather", || a.gather(d, index))?;
    ctx.tensor("scatter_add", || a.scatter_add(d, index, b))?;
    ctx.in_place("scatter_add_", a, || a.scatter_add_(d, index, b))?;
    ctx.in_place("scatter_add_ self", a, || a.scatter_add_(d, index, a))?;
    let row = a.dims().last().copied().unwrap_or(1);
    if index.numel().saturating_mul(row) <= WORK {
        ctx.tensor("embedding", || Tensor::embedding(a, index))?;
    }
    if cheap_or_hopeless(index.numel().saturating_mul(count)) {
        ctx.tensor("one_hot", || index.one_hot(count))?;
    }
    // Same-rank gathers and scatters: the index's shape often fits.
    if let Some(same) =
        ctx.tensor("index like a", || index.expand(a.shape().clone()).or_else(|_| index.reshape(&[-1])))?
    {
        ctx.tensor("gather like", || a.gather(d, &same))?;
        ctx.tensor("scatter_add like", || a.scatter_add(d, &same, a))?;
    }
    Ok(())
}

#[test]
fn products_joins_and_indexing_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(CASES), |(
        a in any_spec(),
        b in any_spec(),
        index in index_spec(),
        d in any_dim(),
        count in any_count(),
    )| {
        case(|| {
            let (Some(a), Some(b), Some(index)) = (build(&a)?, build(&b)?, build(&index)?) else { return Ok(()) };
            products_and_indexing(&a, &b, &index, d, count)
        })?;
    });
    report("products_joins_and_indexing_return_ok_or_err");
}

/// A pooling or convolution parameter: mostly small, sometimes huge.
fn any_param() -> impl Strategy<Value = usize> {
    prop_oneof![16 => 0usize..4, 1 => Just(1 << 40), 1 => Just(usize::MAX)]
}

fn any_pair() -> impl Strategy<Value = (usize, usize)> {
    (any_param(), any_param())
}

/// Multiply-adds of a convolution of `input` by `weight`, when they fit.
fn conv_flops(input: &[usize], weight: &[usize], params: Conv2dParams) -> usize {
    match params.output_shape(input, weight) {
        Ok(out) => out.numel().saturating_mul(dims_numel(weight.get(1..).unwrap_or(&[]))),
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
        size.saturating_add(p.saturating_mul(2)).checked_sub(k).map_or(0, |span| (span / s).saturating_add(1))
    };
    dims_numel(&input[..input.len() - 2])
        .saturating_mul(out(h, kernel.0, stride.0, padding.0))
        .saturating_mul(out(w, kernel.1, stride.1, padding.1))
        .saturating_mul(kernel.0.max(1).saturating_mul(kernel.1.max(1)))
}

/// Convolution, pooling and their backward ops.
#[allow(clippy::too_many_arguments)]
fn conv_and_pool(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    grad: &Tensor,
    index: &Tensor,
    params: Conv2dParams,
    (kernel, stride, padding): ((usize, usize), (usize, usize), (usize, usize)),
    count_include_pad: bool,
) -> Result<(), TestCaseError> {
    let ctx = Ctx::new(&[x, w, grad, index]);
    if !(small(x) && small(w) && small(grad) && small(index)) {
        return Ok(());
    }
    if conv_flops(x.dims(), w.dims(), params) <= FLOPS {
        if let Some(out) = ctx.tensor("conv2d", || x.conv2d(w, bias, params))? {
            let grad_out = ctx.tensor("ones_like", || out.ones_like())?;
            for g in grad_out.iter().chain([grad]) {
                if small(g) {
                    ctx.tensor("conv2d_backward_input", || g.conv2d_backward_input(w, x.shape().clone(), params))?;
                    ctx.tensor("conv2d_backward_weight", || x.conv2d_backward_weight(g, w.shape().clone(), params))?;
                    ctx.tensor("conv2d_backward_bias", || g.conv2d_backward_bias())?;
                }
            }
        }
        // Gradients of the wrong shape.
        ctx.tensor("conv2d_backward_input", || grad.conv2d_backward_input(w, x.shape().clone(), params))?;
        ctx.tensor("conv2d_backward_weight", || x.conv2d_backward_weight(grad, w.shape().clone(), params))?;
        ctx.tensor("conv2d_backward_bias", || grad.conv2d_backward_bias())?;
    }
    if pool_flops(x.dims(), kernel, stride, padding) <= FLOPS {
        if let Some((values, indices)) = ctx.call("max_pool2d", || x.max_pool2d(kernel, stride, padding))? {
            prop_assert_eq!(values.dims(), indices.dims());
            ctx.tensor("max_pool2d_backward", || values.max_pool2d_backward(&indices, x.shape().clone()))?;
            ctx.tensor("max_pool2d_backward index", || values.max_pool2d_backward(index, x.shape().clone()))?;
            // Indices of another (smaller) input: out of range for it.
            if let Some(smaller) =
                ctx.tensor("narrow", || x.narrow(-1, 0, x.dims().last().copied().unwrap_or(1) / 2))?
            {
                ctx.tensor("max_pool2d_backward smaller", || {
                    values.max_pool2d_backward(&indices, smaller.shape().clone())
                })?;
            }
        }
        if let Some(out) = ctx.tensor("avg_pool2d", || x.avg_pool2d(kernel, stride, padding, count_include_pad))? {
            ctx.tensor("avg_pool2d_backward", || {
                out.avg_pool2d_backward(x.shape().clone(), kernel, stride, padding, count_include_pad)
            })?;
        }
        ctx.tensor("avg_pool2d_backward grad", || {
            grad.avg_pool2d_backward(x.shape().clone(), kernel, stride, padding, count_include_pad)
        })?;
        ctx.tensor("max_pool2d_backward grad", || grad.max_pool2d_backward(index, x.shape().clone()))?;
    }
    Ok(())
}

/// Conv-shaped specs: `[N, C, H, W]` inputs and `[C_out, C_in / groups, kH,
/// kW]` weights that mostly fit each other, plus a grad and indices.
fn conv_specs() -> impl Strategy<Value = (Spec, Spec, Option<Spec>, Spec, Spec)> {
    let dim = || prop_oneof![1 => Just(0usize), 3 => 1usize..4, 1 => 4usize..7];
    (
        (0usize..3, 1usize..4, dim(), dim(), 1usize..4, 0usize..4, 0usize..4, 1usize..3, any::<bool>()),
        float_dtype(),
        any_dtype(),
    )
        .prop_flat_map(|((n, c, h, w, o, kh, kw, g, batched), dtype, other)| {
            let input = if batched { vec![n, c * g, h, w] } else { vec![c * g, h, w] };
            let dims = |d: Vec<usize>| Just(d);
            let out_dims = if batched { vec![n, o * g, h, w] } else { vec![o * g, h, w] };
            (
                spec_with(
                    prop_oneof![4 => dims(input.clone()), 1 => proptest::collection::vec(0usize..4, 0..5)],
                    Just(dtype),
                ),
                spec_with(
                    prop_oneof![4 => dims(vec![o * g, c, kh, kw]), 1 => proptest::collection::vec(0usize..4, 0..5)],
                    prop_oneof![4 => Just(dtype), 1 => Just(other)],
                ),
                proptest::option::of(spec_with(prop_oneof![dims(vec![o * g]), dims(vec![o])], Just(dtype))),
                spec_with(prop_oneof![dims(out_dims), dims(input)], Just(dtype)),
                index_spec(),
            )
        })
}

#[test]
fn conv_and_pool_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(CASES), |(
        (x, w, bias, grad, index) in conv_specs(),
        (stride, padding, dilation) in (any_pair(), any_pair(), any_pair()),
        groups in prop_oneof![4 => 1usize..3, 1 => any_param()],
        window in (any_pair(), any_pair(), any_pair()),
        count_include_pad in any::<bool>(),
    )| {
        case(|| {
            let (Some(x), Some(w), Some(grad), Some(index)) = (build(&x)?, build(&w)?, build(&grad)?, build(&index)?) else {
                return Ok(());
            };
            let bias = match &bias { Some(spec) => build(spec)?, None => None };
            let params = Conv2dParams { stride, padding, dilation, groups };
            conv_and_pool(&x, &w, bias.as_ref(), &grad, &index, params, window, count_include_pad)
        })?;
    });
    report("conv_and_pool_return_ok_or_err");
}

/// Large tensors (2^17 to 2^19 elements) take the ops' parallel paths
/// (rows split across threads, chunked reductions and softmax): the same
/// rules hold there, on fewer cases.
fn large(a: &Tensor, index: &Tensor, dims: &[isize], keepdim: bool, d: isize) -> Result<(), TestCaseError> {
    if a.numel() > LARGE {
        return Ok(());
    }
    let ctx = Ctx::new(&[a, index]);
    type Reduce = fn(&Tensor, &[isize], bool) -> Result<Tensor, TensorError>;
    let reduce: [(&str, Reduce); 5] = [
        ("sum", Tensor::sum),
        ("mean", Tensor::mean),
        ("var", Tensor::var),
        ("max", Tensor::max),
        ("argmin", Tensor::argmin),
    ];
    for (name, op) in reduce {
        for dims in [dims, &[d]] {
            ctx.tensor(name, || op(a, dims, keepdim))?;
        }
    }
    ctx.tensor("sum_all", || a.sum_all())?;
    ctx.tensor("softmax", || a.softmax(d))?;
    ctx.tensor("log_softmax", || a.log_softmax(d))?;
    ctx.tensor("to_dtype", || a.to_dtype(DType::F64))?;
    ctx.tensor("exp", || a.exp())?;
    ctx.tensor("add row", || a.add(&a.select(0, 0)?))?;
    ctx.tensor("index_select", || a.index_select(d, index))?;
    ctx.tensor("gather", || a.gather(d, &index.expand(a.shape().clone()).or_else(|_| index.reshape(&[-1]))?))?;
    ctx.in_place("add_", a, || a.add_(&a.t()?))?;
    ctx.in_place("mul_scalar_", a, || a.mul_scalar_(0.5))?;
    let image = ctx.tensor("as image", || a.reshape(&[1, -1, 64, 64]).or_else(|_| a.unsqueeze(0)))?;
    if let Some(image) = image {
        ctx.call("max_pool2d", || image.max_pool2d((3, 2), (2, 2), (1, 1)))?;
        ctx.tensor("avg_pool2d", || image.avg_pool2d((2, 3), (1, 2), (1, 0), false))?;
    }
    Ok(())
}

/// Elements a large case's tensor may have.
const LARGE: usize = 1 << 19;

fn large_spec() -> impl Strategy<Value = Spec> {
    let dims = prop_oneof![
        Just(vec![(1 << 17) + 3]),
        Just(vec![1 << 18]),
        Just(vec![2, (1 << 17) + 1]),
        Just(vec![(1 << 17) + 1, 2]),
        Just(vec![512, 513]),
        Just(vec![4, 64, 64, 9]),
        Just(vec![300, 1, 600]),
    ];
    let views = proptest::collection::vec(
        prop_oneof![
            (any_dim(), any_dim()).prop_map(|(a, b)| View::Transpose(a, b)),
            Just(View::Reverse),
            (any_dim(), 0usize..3, prop_oneof![Just(1usize << 16), Just(1 << 17), 0usize..600])
                .prop_map(|(d, s, l)| View::Narrow(d, s, l)),
            (0usize..4, 2usize..3).prop_map(|(w, s)| View::Expand(w, s)),
        ],
        0..3,
    );
    (
        dims,
        proptest::sample::select(vec![DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64]),
        any_values(),
        views,
    )
        .prop_map(|(dims, dtype, values, views)| Spec { dims, dtype, device: 1, values, views })
}

#[test]
fn large_tensors_return_ok_or_err() {
    let _serial = setup();
    proptest!(config(LARGE_CASES), |(
        a in large_spec(),
        index in index_spec(),
        dims in proptest::collection::vec(any_dim(), 0..3),
        keepdim in any::<bool>(),
        d in any_dim(),
    )| {
        case(|| {
            let (Some(a), Some(index)) = (build(&a)?, build(&index)?) else { return Ok(()) };
            large(&a, &index, &dims, keepdim, d)
        })?;
    });
    report("large_tensors_return_ok_or_err");
}
