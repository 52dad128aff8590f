//! A whole training step on CUDA (feature `cuda`, a GPU present): an MLP
//! with SGD momentum and another with AdamW, and a small CNN (convolution,
//! max pooling, linear head), trained for a few steps on
//! `cuda:0` and on the host from the same weights and data; losses and
//! parameters agree step for step within f32 tolerances (CUDA's
//! transcendentals and summation order differ from the host's in the last
//! bits). Skips with one line where there is no GPU.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa::autograd::Var;
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use brasa::nn::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential};
use brasa::tensor::{cuda_device_count, Device, Tensor};

/// The MLP (12 → 32 → 5), or the CNN on `[N, 1, 4, 3]` images (a 3x3
/// convolution with padding to 4 channels, 2x1 max pooling, a linear head).
fn model(device: Device, cnn: bool) -> Sequential {
    let m = if cnn {
        let conv = Conv2d::with_config(1, 4, 3, Conv2dConfig::new().padding(1), device).unwrap();
        Sequential::new()
            .push(conv)
            .push(Relu)
            .push(MaxPool2d::new((2, 1)).unwrap())
            .push(Flatten::new())
            .push(Linear::new(4 * 2 * 3, 5, device).unwrap())
    } else {
        Sequential::new()
            .push(Linear::new(12, 32, device).unwrap())
            .push(Relu)
            .push(Linear::new(32, 5, device).unwrap())
    };
    for (k, p) in m.parameters().iter().enumerate() {
        let v: Vec<f32> = (0..p.numel()).map(|i| (((i * 17 + k * 5) % 23) as f32 - 11.0) / 40.0).collect();
        p.tensor().copy_(&Tensor::from_vec_on(v, p.dims().to_vec(), Device::CPU).unwrap()).unwrap();
    }
    m
}

/// Losses of `steps` steps of `optimizer` on a fixed batch, and the final
/// parameters, on `device`.
fn train(device: Device, adam: bool, cnn: bool, steps: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let net = model(device, cnn);
    let x: Vec<f32> = (0..8 * 12).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
    let y: Vec<i64> = (0..8).map(|i| (i * 3 % 5) as i64).collect();
    let shape: &[usize] = if cnn { &[8, 1, 4, 3] } else { &[8, 12] };
    let x = Var::new(Tensor::from_vec_on(x, shape, Device::CPU).unwrap().to(device).unwrap());
    let y = Tensor::from_vec_on(y, [8], Device::CPU).unwrap().to(device).unwrap();
    let mut optimizer: Box<dyn Optimizer> = if adam {
        Box::new(AdamW::new(net.parameters(), AdamConfig { lr: 1e-2, ..AdamConfig::adamw() }).unwrap())
    } else {
        Box::new(Sgd::new(net.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..SgdConfig::default() }).unwrap())
    };
    let mut losses = Vec::new();
    for _ in 0..steps {
        optimizer.zero_grad().unwrap();
        let loss = cross_entropy(&net.forward(&x).unwrap(), &y).unwrap();
        loss.backward().unwrap();
        optimizer.step().unwrap();
        losses.push(loss.item().unwrap() as f32);
    }
    let params =
        net.parameters().iter().map(|p| p.tensor().to(Device::CPU).unwrap().to_vec::<f32>().unwrap()).collect();
    (losses, params)
}

#[test]
fn an_mlp_and_a_cnn_train_on_cuda_as_on_the_host() {
    let gpu = cuda_device_count() > 0;
    if !gpu {
        eprintln!(
            "skipped on CUDA: no CUDA device{} (the host half still runs)",
            if cfg!(feature = "cuda") { "" } else { " (built without `cuda`)" }
        );
    }
    for (adam, cnn) in [(false, false), (true, false), (false, true)] {
        let (host_losses, host_params) = train(Device::CPU, adam, cnn, 5);
        assert!(host_losses[4] < host_losses[0], "the host run learns: {host_losses:?}");
        if !gpu {
            continue;
        }
        let (gpu_losses, gpu_params) = train(Device::cuda(0), adam, cnn, 5);
        for (h, g) in host_losses.iter().zip(&gpu_losses) {
            assert!(
                (h - g).abs() <= 1e-4 * h.abs().max(1.0),
                "adam={adam} cnn={cnn}: losses {host_losses:?} vs {gpu_losses:?}"
            );
        }
        for (h, g) in host_params.iter().flatten().zip(gpu_params.iter().flatten()) {
            assert!((h - g).abs() <= 1e-4, "adam={adam} cnn={cnn}: parameter {h} vs {g}");
        }
    }
}
