//! Bounds on the work an op may do, and the checks every result passes.

use crate::{HOPELESS, WORK};
use brasa_tensor::{Conv2dParams, DType, Shape, Tensor};

pub(crate) fn dims_numel(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// Small enough to compute with.
pub(crate) fn small(t: &Tensor) -> bool {
    t.numel() <= WORK
}

/// An output of `numel` elements is either cheap or sure to fail allocation.
pub(crate) fn cheap_or_hopeless(numel: usize) -> bool {
    numel <= WORK || numel >= HOPELESS
}

pub(crate) fn pair((a, b): (u8, u8)) -> (usize, usize) {
    (usize::from(a % 6), usize::from(b % 6))
}

pub(crate) fn conv_params(stride: (u8, u8), padding: (u8, u8), dilation: (u8, u8), groups: u8) -> Conv2dParams {
    Conv2dParams::new()
        .with_stride(pair(stride))
        .with_padding(pair(padding))
        .with_dilation(pair(dilation))
        .with_groups(usize::from(groups % 5))
}

/// Multiply-adds of a convolution of `input` by `weight`, when they fit.
pub(crate) fn conv_flops(input: &[usize], weight: &[usize], params: Conv2dParams) -> usize {
    match params.output_shape(input, weight) {
        Ok(out) => out.numel().saturating_mul(dims_numel(&weight[1..])),
        Err(_) => 0,
    }
}

/// Multiply-adds of a pooling of `input` with this window, roughly.
pub(crate) fn pool_flops(
    input: &[usize],
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> usize {
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
pub(crate) fn broadcast_numel(shapes: &[&Tensor]) -> usize {
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
pub(crate) fn check(t: &Tensor) {
    assert_eq!(t.numel(), dims_numel(t.dims()), "numel of {:?}", t.dims());
    assert_eq!(t.strides().len(), t.rank());
}

/// The elements of a tensor, for comparing two results: floats as bits
/// with every NaN the same, everything else exactly.
pub(crate) fn elements(t: &Tensor) -> Option<Vec<u64>> {
    let nan_or = |bits: u64, nan: bool| if nan { u64::MAX } else { bits };
    Some(match t.dtype() {
        DType::Bool => t.to_vec::<bool>().ok()?.into_iter().map(u64::from).collect(),
        DType::U8 => t.to_vec::<u8>().ok()?.into_iter().map(u64::from).collect(),
        DType::I64 => t.to_vec::<i64>().ok()?.into_iter().map(|v| v as u64).collect(),
        DType::F16 => {
            t.to_vec::<half::f16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect()
        }
        DType::BF16 => {
            t.to_vec::<half::bf16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect()
        }
        DType::F32 => t.to_vec::<f32>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect(),
        DType::F64 => t.to_vec::<f64>().ok()?.into_iter().map(|v| nan_or(v.to_bits(), v.is_nan())).collect(),
    })
}

/// The differential check of an element-wise op: on strided inputs (views
/// with transposed, narrowed, expanded or permuted strides) it must give
/// what it gives on contiguous copies of them, element for element (the
/// same function of the same values), and succeed or fail alike.
pub(crate) fn agrees_with_contiguous(
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
