//! Fused attention on CUDA: `attention.cu`'s FlashAttention-2 kernels for
//! f16 and bf16 operands with `E, Ev ≤ 128`, compiled for head dims 64 and
//! 128 (the smallest that holds both widths runs; the rest is zero-padded
//! in shared memory). The backward's `delta = rowsum(dO ∘ O)` is its own
//! small kernel, and `dq` is summed in an f32 buffer converted at the end.

use super::elementwise::finish;
use super::{address, output_address, suffix, CudaOps};
use crate::backend::AttentionOperands;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::{
    attention_backward_shared_bytes, AttentionBackward, AttentionForward, ATTENTION_HEAD_DIMS, ATTENTION_THREADS,
    ATTENTION_TILE, BLOCK,
};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

/// [`AttentionForward`] as a kernel argument (by value, 232 bytes).
#[repr(transparent)]
struct ForwardArg(AttentionForward);
/// [`AttentionBackward`] as a kernel argument (by value, 264 bytes).
#[repr(transparent)]
struct BackwardArg(AttentionBackward);

// SAFETY: `#[repr(C)]` plain data matching the ABI's C struct (its size and
// offsets are tested in brasa-kernels).
unsafe impl DeviceRepr for ForwardArg {}
// SAFETY: as for `ForwardArg`.
unsafe impl DeviceRepr for BackwardArg {}

/// See [`crate::backend::DeviceOps::supports_fused_attention`].
pub(super) fn supports(dtype: DType, e: usize, ev: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && head_dim(e, ev).is_some() && e > 0 && ev > 0
}

/// The compiled head dim that holds widths `e` and `ev`.
fn head_dim(e: usize, ev: usize) -> Option<usize> {
    ATTENTION_HEAD_DIMS.into_iter().find(|&d| e.max(ev) <= d)
}

/// The strides of a 4-d view over (n, h, row) in elements.
fn strides3(t: &Tensor) -> [i64; 3] {
    let s = t.strides();
    [s[0] as i64, s[1] as i64, s[2] as i64]
}

/// What the kernels share between forward and backward: addresses of the
/// operands and the sizes.
struct Common {
    q: u64,
    k: u64,
    v: u64,
    mask: u64,
    mask_strides: [i64; 4],
    n: usize,
    heads: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    d: usize,
    vectorized: bool,
    keep_prob: f32,
    seed: u64,
    offset: u64,
}

fn common(op: &'static str, a: &AttentionOperands<'_>) -> Result<Common> {
    let (qd, kd, vd) = (a.q.dims(), a.k.dims(), a.v.dims());
    let (e, ev) = (qd[3], vd[3]);
    let d =
        head_dim(e, ev).ok_or_else(|| crate::error::TensorError::internal(op, "no attention kernel for this width"))?;
    let (q, k, v) = (address(op, a.q)?, address(op, a.k)?, address(op, a.v)?);
    let (mask, mask_strides) = match a.mask {
        Some(m) => {
            let s = m.strides();
            (address(op, m)?, [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64])
        }
        None => (0, [0; 4]),
    };
    // cp.async moves 16 bytes (8 elements) at a time: every row must start
    // on a 16-byte boundary and end on a chunk.
    let aligned =
        |t: &Tensor, addr: u64| addr.is_multiple_of(16) && t.strides()[..3].iter().all(|&s| s.rem_euclid(8) == 0);
    let vectorized =
        e.is_multiple_of(8) && ev.is_multiple_of(8) && aligned(a.q, q) && aligned(a.k, k) && aligned(a.v, v);
    let (keep_prob, seed, offset) = match a.dropout {
        Some(drop) => (drop.keep_prob as f32, drop.seed, drop.offset),
        None => (1.0, 0, 0),
    };
    Ok(Common {
        q,
        k,
        v,
        mask,
        mask_strides,
        n: qd[0],
        heads: qd[1],
        l: qd[2],
        s: kd[2],
        e,
        ev,
        d,
        vectorized,
        keep_prob,
        seed,
        offset,
    })
}

/// `attention_<pass>[_dropout]_<T>_d<D>`: the dropout kernels are compiled
/// apart, so the others carry no Philox code.
fn kernel_name(pass: &str, dropout: bool, dtype: DType, d: usize) -> String {
    format!("attention_{pass}{}_{}_d{d}", if dropout { "_dropout" } else { "" }, suffix(dtype))
}

/// See [`crate::backend::DeviceOps::attention_forward`].
pub(super) fn forward(backend: &CudaOps, a: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
    const OP: &str = "fused_attention";
    let c = common(OP, a)?;
    let dtype = a.q.dtype();
    let out = UninitTensor::new(Shape::from(vec![c.n, c.heads, c.l, c.ev]), dtype, backend.device)?;
    let lse = UninitTensor::new(Shape::from(vec![c.n, c.heads, c.l]), DType::F32, backend.device)?;
    let bh = c.n * c.heads;
    if bh == 0 || c.l == 0 {
        return Ok((finish(out), finish(lse)));
    }
    let arg = ForwardArg(AttentionForward {
        q: c.q,
        k: c.k,
        v: c.v,
        mask: c.mask,
        out: output_address(OP, &out)?,
        lse: output_address(OP, &lse)?,
        q_strides: strides3(a.q),
        k_strides: strides3(a.k),
        v_strides: strides3(a.v),
        mask_strides: c.mask_strides,
        heads: c.heads as i64,
        l: c.l as i64,
        s: c.s as i64,
        e: c.e as i64,
        ev: c.ev as i64,
        scale: a.scale as f32,
        keep_prob: c.keep_prob,
        causal: i64::from(a.causal),
        vectorized: i64::from(c.vectorized),
        seed: c.seed,
        offset: c.offset,
    });
    let kernel = kernel_name("forward", a.dropout.is_some(), dtype, c.d);
    let f = backend.function(OP, "attention", &kernel)?;
    let stream = backend.current_stream()?;
    let config = LaunchConfig {
        grid_dim: (bh as u32, c.l.div_ceil(ATTENTION_TILE) as u32, 1),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    check_grid(OP, bh, c.l)?;
    let span = backend.launch_span(&kernel);
    // SAFETY: the addresses are live device memory of the shapes and
    // strides the argument describes (q, k, v, the mask views; out and lse
    // new contiguous tensors); the parameter is the ABI's struct by value.
    unsafe { stream.launch_builder(&f).arg(&arg).launch(config) }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
    drop(span);
    Ok((finish(out), finish(lse)))
}

/// The grid's second dim holds at most 65,535 blocks of 64 rows.
fn check_grid(op: &'static str, bh: usize, rows: usize) -> Result<()> {
    if bh > i32::MAX as usize || rows.div_ceil(ATTENTION_TILE) > 65_535 {
        return Err(crate::error::TensorError::invalid(
            op,
            format!("fused attention takes at most 2^31 − 1 batch-heads and 4,194,240 rows, got {bh} and {rows}"),
        ));
    }
    Ok(())
}

/// See [`crate::backend::DeviceOps::attention_backward`].
pub(super) fn backward(
    backend: &CudaOps,
    a: &AttentionOperands<'_>,
    out: &Tensor,
    lse: &Tensor,
    grad: &Tensor,
) -> Result<[Tensor; 3]> {
    const OP: &str = "fused_attention_backward";
    let c = common(OP, a)?;
    let dtype = a.q.dtype();
    let bh = c.n * c.heads;
    let dq = Tensor::zeros_on(vec![c.n, c.heads, c.l, c.e], DType::F32, backend.device)?;
    let dk = UninitTensor::new(Shape::from(vec![c.n, c.heads, c.s, c.e]), dtype, backend.device)?;
    let dv = UninitTensor::new(Shape::from(vec![c.n, c.heads, c.s, c.ev]), dtype, backend.device)?;
    if bh == 0 || c.s == 0 {
        return Ok([dq.to_dtype(dtype)?, finish(dk), finish(dv)]);
    }
    check_grid(OP, bh, c.s)?;
    let stream = backend.current_stream()?;
    // delta = rowsum(dO ∘ O), one warp per row.
    let rows = bh * c.l;
    let delta = UninitTensor::new(Shape::from(vec![rows]), DType::F32, backend.device)?;
    if rows > 0 {
        let kernel = format!("attention_delta_{}", suffix(dtype));
        let f = backend.function(OP, "attention", &kernel)?;
        let (rows_, width) = (rows as i64, c.ev as i64);
        let (g, o, dst) = (address(OP, grad)?, address(OP, out)?, output_address(OP, &delta)?);
        let warps_per_block = (BLOCK / 32) as usize;
        let config = LaunchConfig {
            grid_dim: (rows.div_ceil(warps_per_block).clamp(1, 65_535) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let span = backend.launch_span(&kernel);
        // SAFETY: grad and out are contiguous `[rows, width]` of `dtype`,
        // delta holds `rows` f32; the parameters are the ABI's.
        unsafe { stream.launch_builder(&f).arg(&rows_).arg(&width).arg(&g).arg(&o).arg(&dst).launch(config) }
            .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    let delta = finish(delta);
    // The output's gradient is read by cp.async too.
    let grad_address = address(OP, grad)?;
    let vectorized = c.vectorized && grad_address.is_multiple_of(16);
    let arg = BackwardArg(AttentionBackward {
        q: c.q,
        k: c.k,
        v: c.v,
        mask: c.mask,
        grad: grad_address,
        lse: address(OP, lse)?,
        delta: address(OP, &delta)?,
        dq: address(OP, &dq)?,
        dk: output_address(OP, &dk)?,
        dv: output_address(OP, &dv)?,
        q_strides: strides3(a.q),
        k_strides: strides3(a.k),
        v_strides: strides3(a.v),
        mask_strides: c.mask_strides,
        heads: c.heads as i64,
        l: c.l as i64,
        s: c.s as i64,
        e: c.e as i64,
        ev: c.ev as i64,
        scale: a.scale as f32,
        keep_prob: c.keep_prob,
        causal: i64::from(a.causal),
        vectorized: i64::from(vectorized),
        seed: c.seed,
        offset: c.offset,
    });
    let kernel = kernel_name("backward", a.dropout.is_some(), dtype, c.d);
    let f = backend.function(OP, "attention", &kernel)?;
    let shared = attention_backward_shared_bytes(c.d);
    // Past 48 KiB of dynamic shared memory a kernel must opt in (idempotent).
    f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32)
        .map_err(|e| backend.call_error(OP, format!("allowing {kernel} {shared} bytes of shared memory"), e))?;
    let config = LaunchConfig {
        grid_dim: (bh as u32, c.s.div_ceil(ATTENTION_TILE) as u32, 1),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: shared,
    };
    let span = backend.launch_span(&kernel);
    // SAFETY: as in `forward`; grad, out, lse and delta are contiguous of
    // the sizes the argument gives, dq a zeroed f32 `[n, h, L, E]`, dk and
    // dv new contiguous tensors; the shared memory is the kernel's size.
    unsafe { stream.launch_builder(&f).arg(&arg).launch(config) }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
    drop(span);
    // The inputs are read by kernels queued on this stream; the caching
    // allocator's stream order keeps them alive until those kernels ran.
    drop(delta);
    Ok([dq.to_dtype(dtype)?, finish(dk), finish(dv)])
}
