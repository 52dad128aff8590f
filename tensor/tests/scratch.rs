//! Work buffers that an op sizes from its operands' shapes and arguments
//! (conv2d's im2col column matrix, above all) are allocated fallibly: a size
//! the host cannot hold is a `TensorError::ScratchTooLarge` naming the op and
//! the bytes, while the operands and the output are small enough to exist.
//!
//! Before, these buffers came from `vec![0.0; n]`: a byte size past
//! `isize::MAX` panicked with "capacity overflow", and one the allocator
//! refused (2^50 bytes and more, past any machine's address space) aborted
//! the whole process with "memory allocation of N bytes failed" — an abort
//! cannot be caught, not even by running the op on another thread, so these
//! tests simply must pass.
//!
//! The cases are built from expanded (stride-0) views, which cost nothing:
//! an input expanded to 2^28 channels makes the column matrix
//! `C_in·kH·kW × H_out·W_out` huge while a wide padding keeps the output to
//! a few megabytes; an output gradient expanded over a 2^25 x 2^25 plane
//! makes the backward passes' column matrices huge while their outputs (the
//! input and weight gradients) are one element.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{Conv2dParams, DType, ScratchError, Tensor, TensorError};
use std::error::Error as _;

/// An f32 tensor of `shape`, all zeros, as a stride-0 view of one element.
fn expanded(shape: [usize; 4]) -> Tensor {
    Tensor::zeros([1, 1, 1, 1], DType::F32).unwrap().expand(shape).unwrap()
}

/// Checks that `result` is a scratch error of `op` for `elements` f32s.
fn expect_scratch(result: Result<Tensor, TensorError>, op: &str, elements: u128) {
    let err = result.expect_err("expected a scratch error");
    let TensorError::ScratchTooLarge { op: got_op, ref source } = err else {
        panic!("expected ScratchTooLarge, got {err:?}");
    };
    assert_eq!(got_op, op);
    let bytes = source.bytes();
    assert_eq!(bytes, elements * 4, "{err}");
    assert_eq!(source.element_bytes(), 4);
    // The source is the ScratchError, reachable by a `source()` walk.
    assert!(err.source().and_then(|s| s.downcast_ref::<ScratchError>()).is_some());
    let text = err.to_string();
    assert!(text.starts_with(op) && text.contains(&bytes.to_string()), "{text}");
    // Not the caching allocator's out-of-memory report.
    assert!(err.as_out_of_memory().is_none());
}

#[test]
fn conv2d_forward_im2col_buffer_too_large_for_the_host() {
    // Input [1, 2^28, 1, 1] and weight [1, 2^28, 1, 1] (views of one
    // element); padding 511 makes a 1023 x 1023 output (4 MiB). The column
    // matrix is 2^28 x 1023^2 f32s: 2^50 bytes and more. Before: abort.
    let channels = 1usize << 28;
    let x = expanded([1, channels, 1, 1]);
    let w = expanded([1, channels, 1, 1]);
    let params = Conv2dParams::new().with_padding((511, 511));
    assert_eq!(params.output_shape(x.dims(), w.dims()).unwrap().dims(), [1, 1, 1023, 1023]);
    expect_scratch(x.conv2d(&w, None, params), "conv2d", channels as u128 * 1023 * 1023);
    // The same with a bias.
    let b = Tensor::zeros([1], DType::F32).unwrap();
    expect_scratch(x.conv2d(&w, Some(&b), params), "conv2d", channels as u128 * 1023 * 1023);
}

#[test]
fn conv2d_forward_im2col_byte_size_overflows() {
    // 2^42 channels x 1023^2 output pixels: the column matrix's element
    // count fits a usize (so the geometry is accepted), its byte count does
    // not fit an isize. Before: a "capacity overflow" panic.
    let channels = 1usize << 42;
    let x = expanded([1, channels, 1, 1]);
    let w = expanded([1, channels, 1, 1]);
    let params = Conv2dParams::new().with_padding((511, 511));
    let elements = channels as u128 * 1023 * 1023;
    assert!(elements * 4 > isize::MAX as u128);
    let err = x.conv2d(&w, None, params).unwrap_err();
    let TensorError::ScratchTooLarge { ref source, .. } = err else { panic!("{err:?}") };
    assert!(source.is_overflow(), "{err}");
    expect_scratch(Err(err), "conv2d", elements);
}

#[test]
fn conv2d_backward_input_column_buffer_too_large() {
    // grad_output [N, 1, 2^25 + 1, 2^25 + 1] (a view of one element) of a
    // 1x1 input padded by 2^24: the input gradient is N elements, the column
    // matrix of each image 2^50 + ... f32s. Before: abort. N = 64 also goes
    // through the threads-by-image path (on a machine with up to 64 threads).
    // The scratch holds the columns and the one-pixel image they fold into.
    let pad = 1usize << 24;
    let side = 2 * pad + 1;
    let params = Conv2dParams::new().with_padding((pad, pad));
    let w = Tensor::ones([1, 1, 1, 1], DType::F32).unwrap();
    for n in [1, 64] {
        let grad = expanded([n, 1, side, side]);
        let result = grad.conv2d_backward_input(&w, [n, 1, 1, 1], params);
        expect_scratch(result, "conv2d_backward_input", side as u128 * side as u128 + 1);
    }
}

#[test]
fn conv2d_backward_weight_column_buffer_too_large() {
    // As above for the weight gradient: one element out, a 2^52-byte column
    // matrix per image. Before: abort.
    let pad = 1usize << 24;
    let side = 2 * pad + 1;
    let params = Conv2dParams::new().with_padding((pad, pad));
    for n in [1, 64] {
        let x = Tensor::ones([n, 1, 1, 1], DType::F32).unwrap();
        let grad = expanded([n, 1, side, side]);
        let result = x.conv2d_backward_weight(&grad, [1, 1, 1, 1], params);
        expect_scratch(result, "conv2d_backward_weight", side as u128 * side as u128);
    }
}

#[test]
fn empty_outputs_still_need_no_column_buffer() {
    // No output channels: the output is empty and no column matrix is made,
    // however huge the planes (unchanged behaviour, checked alongside).
    let pad = 1usize << 40;
    let params = Conv2dParams::new().with_padding((pad, 0));
    let x = Tensor::zeros([1, 1, 1, 1], DType::F32).unwrap();
    let w = Tensor::zeros([0, 1, 1, 1], DType::F32).unwrap();
    let y = x.conv2d(&w, None, params).unwrap();
    assert_eq!(y.dims(), [1, 0, 2 * pad + 1, 1]);
}
