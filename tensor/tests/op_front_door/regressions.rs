//! Minimized cases the properties found, as plain tests.

use super::*;

/// Runs `f` on a thread of its own and fails if it panics or has not
/// returned within [`CALL_LIMIT`] (a hang fails here, not at the watchdog).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(catch_unwind(AssertUnwindSafe(f)));
    });
    match receive.recv_timeout(CALL_LIMIT) {
        Ok(Ok(value)) => value,
        Ok(Err(_)) => panic!("{what} panicked"),
        Err(_) => panic!("{what} has not returned within {CALL_LIMIT:?}"),
    }
}

/// The bias gradient of an empty grad_output (H = 0) whose batch dim is
/// expanded to 2^40 looped over the whole batch for nothing: a hang.
#[test]
fn conv2d_backward_bias_of_an_empty_grad_with_a_huge_batch() {
    let _serial = setup();
    let before = held();
    let grad = Tensor::zeros_on([1, 2, 0, 4], DType::F64, Device::Cpu(1)).unwrap().expand([1 << 40, 2, 0, 4]).unwrap();
    let bias = within("conv2d_backward_bias", move || grad.conv2d_backward_bias().map(|b| b.to_vec::<f64>()));
    assert_eq!(bias.unwrap().unwrap(), [0.0, 0.0]);
    assert_eq!(held(), before);
}

/// Padding of 2^40 rows makes the output plane 2^41 + 1 high; with no
/// images (N = 0) the weight gradient is zero, but its column buffer was
/// sized for one image anyway: 2^43 bytes of host memory the allocator
/// never saw, and the process aborted.
#[test]
fn conv2d_backward_weight_with_no_images_and_a_huge_output_plane() {
    let _serial = setup();
    let before = held();
    let params = Conv2dParams::new().with_padding((1 << 40, 0)).with_stride((1, 1));
    let x = Tensor::zeros_on([0, 1, 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let grad = Tensor::zeros_on([0, 1, (1 << 41) + 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let weight = within("conv2d_backward_weight", move || {
        x.conv2d_backward_weight(&grad, [1, 1, 1, 1], params).map(|w| w.to_vec::<f32>())
    });
    assert_eq!(weight.unwrap().unwrap(), [0.0]);
    assert_eq!(held(), before);
}

/// The same plane with no output channels (C_out = 0): the input gradient
/// is zero, and was computed through a column buffer of 2^43 bytes.
#[test]
fn conv2d_backward_input_with_no_output_channels_and_a_huge_output_plane() {
    let _serial = setup();
    let before = held();
    let params = Conv2dParams::new().with_padding((1 << 40, 0));
    let weight = Tensor::zeros_on([0, 1, 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let grad = Tensor::zeros_on([1, 0, (1 << 41) + 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let input = within("conv2d_backward_input", move || {
        grad.conv2d_backward_input(&weight, [1, 1, 1, 1], params).map(|x| x.to_vec::<f32>())
    });
    assert_eq!(input.unwrap().unwrap(), [0.0]);
    assert_eq!(held(), before);
}

/// With no output channels the weight gradient is empty, but the images
/// were still turned into columns (2^43 bytes each).
#[test]
fn conv2d_backward_weight_with_no_output_channels_and_a_huge_output_plane() {
    let _serial = setup();
    let before = held();
    let params = Conv2dParams::new().with_padding((1 << 40, 0));
    let x = Tensor::zeros_on([1, 1, 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let grad = Tensor::zeros_on([1, 0, (1 << 41) + 1, 1], DType::F32, Device::Cpu(1)).unwrap();
    let weight = within("conv2d_backward_weight", move || {
        x.conv2d_backward_weight(&grad, [0, 1, 1, 1], params).map(|w| w.to_vec::<f32>())
    });
    assert_eq!(weight.unwrap().unwrap(), Vec::<f32>::new());
    assert_eq!(held(), before);
}
