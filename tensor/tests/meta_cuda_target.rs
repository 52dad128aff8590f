//! A meta device imitating a CUDA device allocates what the CUDA backend
//! (`src/backend/cuda/`) allocates, scratch included. There is no GPU to
//! compare with here, so each test states the sequence the CUDA backend's
//! code makes (sizes, order, when each buffer is freed) and compares it
//! with the allocator's recorded events on the meta device; where the host
//! backend allocates differently, the same ops on a meta device imitating
//! the host show that the two paths really differ.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::TraceAction;
use brasa_tensor::memory;
use brasa_tensor::{Conv2dParams, DType, Device, MemoryTarget, MetaDevice, Result, Tensor};
use std::collections::HashMap;

/// An allocation of `n` requested bytes, or the free of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Alloc(usize),
    Free(usize),
}
use Event::{Alloc, Free};

fn cuda() -> MetaDevice {
    MetaDevice::new(MemoryTarget::cuda(8 << 30)).unwrap()
}

fn host() -> MetaDevice {
    MetaDevice::new(MemoryTarget::host(None)).unwrap()
}

/// The allocations and frees (requested bytes) that `ops` makes on
/// `device`, in order; what `ops` returns is dropped after the recording.
fn events<T>(device: Device, ops: impl FnOnce() -> Result<T>) -> Vec<Event> {
    memory::record_history(device, 100_000).unwrap();
    let kept = ops().unwrap();
    let trace = memory::snapshot(device).unwrap().device_traces;
    memory::record_history(device, 0).unwrap();
    drop(kept);
    let mut requested = HashMap::new();
    let mut out = Vec::new();
    for entry in trace {
        match entry.action {
            TraceAction::Alloc => {
                requested.insert(entry.addr, entry.requested_size);
                out.push(Alloc(entry.requested_size));
            }
            TraceAction::FreeRequested => {
                out.push(Free(requested.remove(&entry.addr).expect("a free of a block allocated while recording")))
            }
            _ => {}
        }
    }
    out
}

const F32: usize = 4;

#[test]
fn a_sum_over_few_long_columns_allocates_the_partial_sums_then_frees_them() {
    let meta = cuda();
    let d = meta.device();
    // [16384, 384] over dim 0: [1, 16384, 384] in place; 384 outputs over
    // columns of 16,384 are folded in 64 pieces first (`column_chunks`).
    let x = Tensor::zeros_on([16_384, 384], DType::F32, d).unwrap();
    let seen = events(d, || x.sum(&[0], false));
    assert_eq!(seen, [Alloc(384 * F32), Alloc(64 * 384 * F32), Free(64 * 384 * F32)]);
    // A mean with keepdim: the output is `[1, 384]` at once, no expanding copy.
    let seen = events(d, || x.mean(&[0], true));
    assert_eq!(seen, [Alloc(384 * F32), Alloc(64 * 384 * F32), Free(64 * 384 * F32)]);
    // Max never splits.
    assert_eq!(events(d, || x.max(&[0], false)), [Alloc(384 * F32)]);
    // The host walks the same reduction without scratch.
    let host = host();
    let y = Tensor::zeros_on([16_384, 384], DType::F32, host.device()).unwrap();
    assert_eq!(events(host.device(), || y.sum(&[0], false)), [Alloc(384 * F32)]);
}

#[test]
fn a_sum_over_short_columns_or_rows_takes_one_pass() {
    let meta = cuda();
    let d = meta.device();
    // Columns of 64: too short to split.
    let x = Tensor::zeros_on([64, 384], DType::F32, d).unwrap();
    assert_eq!(events(d, || x.sum(&[0], false)), [Alloc(384 * F32)]);
    // Rows (inner = 1): a block per run, no split.
    let x = Tensor::zeros_on([384, 16_384], DType::F32, d).unwrap();
    assert_eq!(events(d, || x.sum(&[1], false)), [Alloc(384 * F32)]);
}

#[test]
fn a_strided_reduction_copies_its_source_after_the_output() {
    let meta = cuda();
    let d = meta.device();
    let x = Tensor::zeros_on([384, 1_024], DType::F32, d).unwrap();
    // xᵀ over dim 1: not contiguous, so copied with the reduced dim last
    // ([1024, 384] → the copy of its permutation), after the output.
    let t = x.t().unwrap();
    let copy = 384 * 1_024 * F32;
    assert_eq!(events(d, || t.sum(&[1], false)), [Alloc(1_024 * F32), Alloc(copy), Free(copy)]);
    // [N, C, H, W] over 0, 2, 3 (dims that are not neighbours): copied.
    let x = Tensor::zeros_on([8, 16, 12, 12], DType::F32, d).unwrap();
    let copy = 8 * 16 * 12 * 12 * F32;
    assert_eq!(events(d, || x.sum(&[0, 2, 3], false)), [Alloc(16 * F32), Alloc(copy), Free(copy)]);
    // The host copies first and allocates the result after.
    let host = host();
    let x = Tensor::zeros_on([8, 16, 12, 12], DType::F32, host.device()).unwrap();
    let seen = events(host.device(), || x.sum(&[0, 2, 3], false));
    assert_eq!(seen.first(), Some(&Alloc(copy)), "{seen:?}");
}

#[test]
fn layer_norm_allocates_outputs_statistics_and_zeroed_parameter_gradients() {
    let meta = cuda();
    let d = meta.device();
    let (rows, width) = (512, 768);
    let x = Tensor::zeros_on([rows, width], DType::F32, d).unwrap();
    let w = Tensor::zeros_on([width], DType::F32, d).unwrap();
    let b = Tensor::zeros_on([width], DType::F32, d).unwrap();
    let forward = events(d, || x.native_layer_norm(&[width], Some(&w), Some(&b), 1e-5));
    assert_eq!(forward, [Alloc(rows * width * F32), Alloc(rows * F32), Alloc(rows * F32)]);
    let (y, mean, rstd) = x.native_layer_norm(&[width], Some(&w), Some(&b), 1e-5).unwrap();
    // `norm.rs`: dx, then the zeroed `[width]` dw and db the parameter
    // kernel adds each block's partial sums into (no partial buffers).
    let backward = events(d, || y.native_layer_norm_backward(&x, &[width], &mean, &rstd, Some(&w), [true; 3]));
    assert_eq!(backward, [Alloc(rows * width * F32), Alloc(width * F32), Alloc(width * F32)]);
    // Only the parameter gradients: no dx.
    let params = events(d, || y.native_layer_norm_backward(&x, &[width], &mean, &rstd, Some(&w), [false, true, true]));
    assert_eq!(params, [Alloc(width * F32), Alloc(width * F32)]);
}

#[test]
fn batch_norm_reductions_of_channels_last_rows_allocate_partial_results_after_their_outputs() {
    let meta = cuda();
    let d = meta.device();
    // [128, 64, 32, 32] channels last: seen as [131072, 64, 1], folded in
    // 256 pieces of 512 rows (`batch_norm_row_pieces`): the two [64]
    // results, then [2, 256, 64] partial results, freed after the merge.
    let (n, c, h, w) = (128, 64, 32, 32);
    let x = Tensor::zeros_on([n, c, h, w], DType::BF16, d).unwrap().to_channels_last().unwrap();
    let dy = Tensor::zeros_on([n, c, h, w], DType::BF16, d).unwrap().to_channels_last().unwrap();
    let partial = 2 * 256 * c * F32;
    let pieces = [Alloc(c * F32), Alloc(c * F32), Alloc(partial), Free(partial)];
    assert_eq!(events(d, || x.batch_norm_stats()), pieces);
    let mean = Tensor::zeros_on([c], DType::F32, d).unwrap();
    assert_eq!(events(d, || dy.batch_norm_backward_reduce(&x, &mean)), pieces);
    // A 2-d [N, C] (BatchNorm1d) is [N, C, 1] too: two pieces of 50 rows.
    let x2 = Tensor::zeros_on([100, 48], DType::F32, d).unwrap();
    let two_pieces = 2 * 2 * 48 * F32;
    assert_eq!(
        events(d, || x2.batch_norm_stats()),
        [Alloc(48 * F32), Alloc(48 * F32), Alloc(two_pieces), Free(two_pieces)]
    );
    // Row-major [N, C, H, W]: a block per channel, no temporary.
    let row_major = Tensor::zeros_on([n, c, h, w], DType::BF16, d).unwrap();
    assert_eq!(events(d, || row_major.batch_norm_stats()), [Alloc(c * F32), Alloc(c * F32)]);
    // The host reduces channels-last rows without a temporary.
    let host = host();
    let xh = Tensor::zeros_on([n, c, h, w], DType::BF16, host.device()).unwrap().to_channels_last().unwrap();
    assert_eq!(events(host.device(), || xh.batch_norm_stats()), [Alloc(c * F32), Alloc(c * F32)]);
}

#[test]
fn a_grouped_convolution_allocates_im2col_columns_per_group() {
    let meta = cuda();
    let d = meta.device();
    // N 4, C_in 4, 10×10, C_out 6, 3×3, padding 1, 2 groups: K = 2·9 = 18,
    // P = 100, 3 output channels per group.
    let (n, k, p, cog) = (4, 18, 100, 3);
    let x = Tensor::zeros_on([n, 4, 10, 10], DType::F32, d).unwrap();
    let w = Tensor::zeros_on([6, 2, 3, 3], DType::F32, d).unwrap();
    let bias = Tensor::zeros_on([6], DType::F32, d).unwrap();
    let params = Conv2dParams { padding: (1, 1), groups: 2, ..Conv2dParams::new() };
    let col = n * k * p * F32;
    let part = n * cog * p * F32;
    let joined = n * 6 * p * F32;
    // `conv.rs`: per group the columns, their product, the columns freed;
    // then the joined output and the parts freed (the bias is added in place).
    let seen = events(d, || x.conv2d(&w, Some(&bias), params));
    assert_eq!(
        seen,
        [Alloc(col), Alloc(part), Free(col), Alloc(col), Alloc(part), Free(col), Alloc(joined), Free(part), Free(part)]
    );
    // The host keeps its im2col panels off the device: only the output.
    let host = host();
    let hd = host.device();
    let (hx, hw) = (
        Tensor::zeros_on([n, 4, 10, 10], DType::F32, hd).unwrap(),
        Tensor::zeros_on([6, 2, 3, 3], DType::F32, hd).unwrap(),
    );
    assert_eq!(events(hd, || hx.conv2d(&hw, None, params)), [Alloc(joined)]);
}

#[test]
fn a_convolution_input_gradient_folds_columns_with_col2im() {
    let meta = cuda();
    let d = meta.device();
    let (n, k, p) = (2, 27, 64);
    let w = Tensor::zeros_on([8, 3, 3, 3], DType::F32, d).unwrap();
    let grad = Tensor::zeros_on([n, 8, 8, 8], DType::F32, d).unwrap();
    let params = Conv2dParams { padding: (1, 1), ..Conv2dParams::new() };
    // One group: the columns Wᵀ · dY `[N, K, P]`, the image col2im folds
    // them into (while they are alive), then the columns freed.
    let seen = events(d, || grad.conv2d_backward_input(&w, [n, 3, 8, 8], params));
    let (col, image) = (n * k * p * F32, n * 3 * 64 * F32);
    assert_eq!(seen, [Alloc(col), Alloc(image), Free(col)]);
}

#[test]
fn a_weight_gradient_over_a_large_batch_takes_the_split_sum() {
    let meta = cuda();
    let d = meta.device();
    // N 128, C_in 2, 6×6, C_out 4, 3×3: K = 18, P = 16. The per-image
    // products `[128, 4, 18]` are summed over 128 images into 72 outputs:
    // columns of 128 split in 4 pieces (`column_chunks`).
    let (n, k, p, c_out) = (128, 18, 16, 4);
    let x = Tensor::zeros_on([n, 2, 6, 6], DType::F32, d).unwrap();
    let grad = Tensor::zeros_on([n, c_out, 4, 4], DType::F32, d).unwrap();
    let seen = events(d, || x.conv2d_backward_weight(&grad, [c_out, 2, 3, 3], Conv2dParams::new()));
    let (col, per_image, dw, partial) = (n * k * p * F32, n * c_out * k * F32, c_out * k * F32, 4 * c_out * k * F32);
    assert_eq!(
        seen,
        [Alloc(col), Alloc(per_image), Alloc(dw), Alloc(partial), Free(partial), Free(per_image), Free(col)]
    );
}

#[test]
fn gathers_take_a_bad_index_flag_and_half_pooling_is_not_staged() {
    let meta = cuda();
    let d = meta.device();
    let x = Tensor::zeros_on([64, 32], DType::F32, d).unwrap();
    let ids = Tensor::zeros_on([64, 8], DType::I64, d).unwrap();
    let seen = events(d, || x.gather(1, &ids));
    // The bounds check (min, max, their stack; freed), the output, then
    // the kernel's 0-d i64 flag (freed on return).
    let out = 64 * 8 * F32;
    assert_eq!(&seen[seen.len() - 3..], [Alloc(out), Alloc(8), Free(8)], "{seen:?}");
    // Average pooling of f16: straight into f16 on CUDA (the host stages f32).
    let h = Tensor::zeros_on([2, 3, 8, 8], DType::F16, d).unwrap();
    assert_eq!(events(d, || h.avg_pool2d((2, 2), (2, 2), (0, 0), true)), [Alloc(2 * 3 * 16 * 2)]);
    // Normal draws of bf16: straight into bf16.
    assert_eq!(events(d, || Tensor::randn_on([1_000], DType::BF16, d)), [Alloc(2_000)]);
}

#[test]
fn a_product_copies_only_the_operands_cublas_cannot_read_as_they_lie() {
    let meta = cuda();
    let d = meta.device();
    let x = Tensor::zeros_on([64, 32], DType::F32, d).unwrap();
    let w = Tensor::zeros_on([48, 32], DType::F32, d).unwrap();
    let out = 64 * 48 * F32;
    // A transposed weight is a cuBLAS flag; a narrowed one a leading dim.
    assert_eq!(events(d, || x.matmul(&w.t()?)), [Alloc(out)]);
    assert_eq!(events(d, || x.narrow(1, 0, 16)?.matmul(&w.narrow(1, 0, 16)?.t()?)), [Alloc(out)]);
    // Every other column of x: neither rows nor columns contiguous, so the
    // `[64, 16]` operand is copied after the output and freed after the product.
    let strided = x.slice(1, 0, 32, 2).unwrap();
    let copy = 64 * 16 * F32;
    assert_eq!(events(d, || strided.matmul(&w.narrow(1, 0, 16)?.t()?)), [Alloc(out), Alloc(copy), Free(copy)]);
    // Both operands copied: the second one's copy is freed first.
    let w_strided = w.t().unwrap().slice(0, 0, 32, 2).unwrap();
    let w_copy = 16 * 48 * F32;
    assert_eq!(
        events(d, || strided.matmul(&w_strided)),
        [Alloc(out), Alloc(copy), Alloc(w_copy), Free(w_copy), Free(copy)]
    );
    // A batch whose entries do not step evenly (heads and sequence
    // swapped) is copied whole; one that broadcasts (stride 0) is not.
    let q = Tensor::zeros_on([2, 8, 4, 16], DType::F32, d).unwrap().transpose(1, 2).unwrap();
    let k = Tensor::zeros_on([2, 4, 16, 8], DType::F32, d).unwrap();
    let scores = 2 * 4 * 8 * 8 * F32;
    assert_eq!(events(d, || q.matmul(&k)), [Alloc(scores), Alloc(2 * 4 * 8 * 16 * F32), Free(2 * 4 * 8 * 16 * F32)]);
    let shared = Tensor::zeros_on([16, 8], DType::F32, d).unwrap();
    let batched = Tensor::zeros_on([2, 4, 8, 16], DType::F32, d).unwrap();
    assert_eq!(events(d, || batched.matmul(&shared)), [Alloc(scores)]);
    // The host multiplies any strides in place.
    let host = host();
    let hx = Tensor::zeros_on([64, 32], DType::F32, host.device()).unwrap();
    let hw = Tensor::zeros_on([48, 32], DType::F32, host.device()).unwrap();
    let host_strided = hx.slice(1, 0, 32, 2).unwrap();
    assert_eq!(events(host.device(), || host_strided.matmul(&hw.narrow(1, 0, 16)?.t()?)), [Alloc(out)]);
}

/// A CUDA-target plan says where it planned a convolution on im2col while
/// cuDNN is switched on (the run would use cuDNN's workspaces instead), one
/// entry per op with its calls; with cuDNN switched off, or on a host
/// target, it assumes nothing. (The only test here that changes cuDNN's
/// process-wide switch, and the others do not read the assumptions.)
#[test]
fn a_cuda_plan_lists_convolutions_planned_on_im2col_while_cudnn_is_on() {
    let step = |device: Device| {
        let x = Tensor::zeros_on([2, 3, 8, 8], DType::F32, device)?;
        let w = Tensor::zeros_on([4, 3, 3, 3], DType::F32, device)?;
        Ok::<_, brasa_tensor::TensorError>(move || {
            let params = Conv2dParams::new().with_padding((1, 1));
            let y = x.conv2d(&w, None, params)?;
            let _dx = y.conv2d_backward_input(&w, [2, 3, 8, 8], params)?;
            let _dw = x.conv2d_backward_weight(&y, [4, 3, 3, 3], params)?;
            Ok(())
        })
    };
    let enabled = brasa_tensor::cudnn::enabled();
    brasa_tensor::cudnn::set_enabled(true);
    let on = memory::plan(&MemoryTarget::cuda(8 << 30), step).unwrap();
    brasa_tensor::cudnn::set_enabled(false);
    let off = memory::plan(&MemoryTarget::cuda(8 << 30), step).unwrap();
    brasa_tensor::cudnn::set_enabled(true);
    let on_host = memory::plan(&MemoryTarget::host(None), step).unwrap();
    brasa_tensor::cudnn::set_enabled(enabled);

    let calls: Vec<(&str, usize)> = on.assumptions.iter().map(|a| (a.op.as_str(), a.calls)).collect();
    // Two planned steps, one call of each direction per step.
    assert_eq!(calls, [("conv2d", 2), ("conv2d_backward_input", 2), ("conv2d_backward_weight", 2)]);
    assert!(on.assumptions.iter().all(|a| a.assumption.contains("cudnn::set_enabled(false)")));
    assert!(on.to_string().contains("assumes: conv2d (2 call(s))"), "{on}");
    assert!(on.to_json().contains("\"assumptions\""));
    assert!(off.assumptions.is_empty(), "{:?}", off.assumptions);
    assert!(on_host.assumptions.is_empty(), "{:?}", on_host.assumptions);
    // The switch changes what the plan says, not what it counts.
    assert_eq!((on.peak_allocated, on.peak_reserved), (off.peak_allocated, off.peak_reserved));
}
