//! `ResNet`: ResNet-18's size, shapes and torchvision's names (checked on
//! a meta device, where building the 11 M-parameter model draws nothing),
//! gradients reaching every parameter, a small model learning a fixed
//! batch, and the batch norms' two modes.
//!
//! Every model here draws its weights from its own seeded generator, and
//! the data comes from local generators, so the numbers are the same on
//! every run whatever order the tests run in.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{no_grad, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{ResNet, ResNetConfig};
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Module, ModuleExt, NnError};
use brasa_tensor::{DType, Device, Generator, MemoryTarget, MetaDevice, Tensor};

const DEV: Device = Device::CPU;

/// `[n, c, h, w]` standard normal images and labels in `0..classes`, from `seed`.
fn batch(seed: u64, dims: [usize; 4], classes: usize) -> (Tensor, Tensor) {
    let mut generator = Generator::new(seed);
    let mut pixels = vec![0f32; dims.iter().product()];
    generator.fill_normal_f32(&mut pixels, 0.0, 1.0).unwrap();
    let mut draws = vec![0f64; dims[0]];
    generator.fill_uniform_f64(&mut draws, 0.0, classes as f64).unwrap();
    let labels: Vec<i64> = draws.iter().map(|&u| (u as i64).min(classes as i64 - 1)).collect();
    (Tensor::from_vec_on(pixels, dims, DEV).unwrap(), Tensor::from_vec_on(labels, [dims[0]], DEV).unwrap())
}

/// ResNet-18 on a meta device imitating an 80 GiB GPU: sizes, no values.
fn resnet18_on_meta(in_channels: usize, classes: usize) -> (ResNet, MetaDevice) {
    let meta = MetaDevice::new(MemoryTarget::cuda(80 << 30)).unwrap();
    (ResNet::new(ResNetConfig::resnet18(in_channels, classes), meta.device()).unwrap(), meta)
}

#[test]
fn resnet18_has_the_cifar_variants_parameter_count() {
    // By hand: stem 3·64·9 + 128 = 1,856; layer1 2·(2·36,864 + 256) =
    // 147,968; layer2 525,568; layer3 2,099,712; layer4 8,393,728 (each
    // with its 1×1 projection and its norm); head 512·10 + 10 = 5,130.
    let (model, _meta) = resnet18_on_meta(3, 10);
    assert_eq!(model.num_parameters(), 11_173_962);
    assert_eq!(ResNetConfig::resnet18(3, 10).num_parameters(), 11_173_962);
    // Grey images and 100 classes change the stem and the head only.
    let (grey, _meta) = resnet18_on_meta(1, 100);
    assert_eq!(grey.num_parameters(), 11_173_962 - 2 * 64 * 9 + 90 * 513);
}

#[test]
fn resnet18_maps_32x32_images_to_logits() {
    let (model, meta) = resnet18_on_meta(3, 10);
    let x = Var::new(Tensor::zeros_on([128, 3, 32, 32], DType::F32, meta.device()).unwrap());
    assert_eq!(model.features(&x).unwrap().dims(), &[128, 512]);
    assert_eq!(model.forward(&x).unwrap().dims(), &[128, 10]);
    // The small model on real values: the same shapes at its width.
    let small = ResNet::new(ResNetConfig::small(3, 10), DEV).unwrap();
    let (x, _) = batch(1, [2, 3, 32, 32], 10);
    assert_eq!(small.features(&Var::new(x.clone())).unwrap().dims(), &[2, 64]);
    assert_eq!(small.forward(&Var::new(x)).unwrap().dims(), &[2, 10]);
    // The wrong channel count is an error that says what was expected.
    let (grey, _) = batch(1, [2, 1, 32, 32], 10);
    let error = small.forward(&Var::new(grey)).err().unwrap();
    assert!(matches!(error, NnError::Invalid { what: "ResNet", .. }), "{error:?}");
    // The variant says no more: the message says what was expected.
    assert!(error.to_string().contains("[N, 3, H, W]"), "{error}");
}

#[test]
fn names_are_torchvisions() {
    let (model, _meta) = resnet18_on_meta(3, 10);
    let dict = model.state_dict();
    let names: Vec<&str> = dict.iter().map(|(name, _)| name).collect();
    // torchvision's resnet18().state_dict() without the ImageNet stem's
    // differences (the same names; conv1.weight is [64, 3, 3, 3] here).
    let expected_start = [
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
        "layer1.0.bn1.weight",
        "layer1.0.bn1.bias",
        "layer1.0.bn1.running_mean",
        "layer1.0.bn1.running_var",
        "layer1.0.bn1.num_batches_tracked",
        "layer1.0.conv2.weight",
    ];
    assert_eq!(&names[..expected_start.len()], expected_start);
    for name in [
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.weight",
        "layer2.0.downsample.1.bias",
        "layer2.0.downsample.1.running_mean",
        "layer3.1.bn2.running_var",
        "layer4.0.downsample.0.weight",
        "layer4.1.conv2.weight",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert_eq!(names[names.len() - 2..], ["fc.weight", "fc.bias"]);
    // No projection where the shape stays: layer1 and every second block.
    assert!(!names.iter().any(|n| n.starts_with("layer1.0.downsample") || n.contains(".1.downsample")));
    // torchvision's resnet18 has 122 entries (62 parameters, 60 buffers: 20 norms).
    assert_eq!(names.len(), 122);
    assert_eq!(model.parameters().len(), 62);
    assert_eq!(dict.get("conv1.weight").unwrap().dims(), &[64, 3, 3, 3]);
    assert_eq!(dict.get("layer2.0.downsample.0.weight").unwrap().dims(), &[128, 64, 1, 1]);
    assert_eq!(dict.get("fc.weight").unwrap().dims(), &[10, 512]);
    // No bias in the convolutions (a norm follows each).
    assert!(!names.iter().any(|n| n.contains("conv") && n.ends_with(".bias")));
}

#[test]
fn gradients_reach_every_parameter() {
    // Two blocks in the first stage: an identity shortcut as well as projections.
    let config = ResNetConfig::small(3, 5).width(4).blocks([2, 1, 1, 1]);
    let model = ResNet::new(config, DEV).unwrap();
    let (x, y) = batch(2, [4, 3, 16, 16], 5);
    cross_entropy(&model.forward(&Var::new(x)).unwrap(), &y).unwrap().backward().unwrap();
    for (name, param) in model.named_parameters() {
        let grad = param.grad().unwrap_or_else(|| panic!("{name} got no gradient"));
        assert_eq!(grad.dims(), param.dims(), "{name}");
        let values = grad.to_vec::<f32>().unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "{name}: a non-finite gradient");
        assert!(values.iter().any(|v| *v != 0.0), "{name}: an all-zero gradient");
    }
}

#[test]
fn a_small_model_learns_a_fixed_batch() {
    let model = ResNet::new(ResNetConfig::small(3, 4), DEV).unwrap();
    let mut opt =
        Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 5e-4, ..Default::default() })
            .unwrap();
    let (x, y) = batch(3, [16, 3, 16, 16], 4);
    let x = Var::new(x);
    let mut losses = Vec::new();
    for _ in 0..8 {
        let loss = cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
        losses.push(loss.item().unwrap());
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad().unwrap();
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(last < 0.5 * first, "the loss went from {first:.4} to {last:.4} in 8 steps: {losses:?}");
}

#[test]
fn eval_mode_normalises_with_the_running_statistics() {
    let mut model = ResNet::new(ResNetConfig::small(3, 10), DEV).unwrap();
    let (x, _) = batch(4, [8, 3, 16, 16], 10);
    // Training-mode forwards move the running statistics off their start.
    for _ in 0..3 {
        model.forward(&Var::new(x.clone())).unwrap();
    }
    let running_mean = |model: &ResNet| model.bn1.running_mean.as_ref().unwrap().to_vec::<f32>().unwrap();
    let trained_mean = running_mean(&model);
    assert!(trained_mean.iter().any(|v| *v != 0.0), "training forwards left running_mean at zero");
    assert_eq!(model.bn1.num_batches_tracked.as_ref().unwrap().item::<i64>().unwrap(), 3);

    model.eval();
    assert!(!model.is_training());
    let _no_grad = no_grad();
    let whole = model.forward(&Var::new(x.clone())).unwrap().tensor().to_vec::<f32>().unwrap();
    // With running statistics a sample's logits do not depend on the rest
    // of its batch (with batch statistics they would).
    let first = model.forward(&Var::new(x.narrow(0, 0, 1).unwrap())).unwrap().tensor().to_vec::<f32>().unwrap();
    for (a, b) in first.iter().zip(&whole[..10]) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "eval logits of sample 0: alone {a}, in the batch {b}");
    }
    // Evaluation leaves the statistics as they were.
    assert_eq!(running_mean(&model), trained_mean);
    assert_eq!(model.bn1.num_batches_tracked.as_ref().unwrap().item::<i64>().unwrap(), 3);

    // Back in training mode, the same sample alone normalises with its own
    // statistics: different logits.
    model.train();
    let (pair, _) = batch(5, [2, 3, 16, 16], 10);
    let trained = model.forward(&Var::new(pair.clone())).unwrap().tensor().to_vec::<f32>().unwrap();
    model.eval();
    let evaluated = model.forward(&Var::new(pair)).unwrap().tensor().to_vec::<f32>().unwrap();
    let gap = trained.iter().zip(&evaluated).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(gap > 1e-3, "training and evaluation modes gave the same logits (largest gap {gap})");
}

#[test]
fn state_dicts_round_trip_between_models() {
    let source = ResNet::new(ResNetConfig::small(1, 10), DEV).unwrap();
    let target = ResNet::new(ResNetConfig::small(1, 10).init_seed(7), DEV).unwrap();
    let (x, _) = batch(6, [2, 1, 32, 32], 10);
    let x = Var::new(x);
    let mut source = source;
    let mut target = target;
    source.eval();
    target.eval();
    let _no_grad = no_grad();
    let before = target.forward(&x).unwrap().tensor().to_vec::<f32>().unwrap();
    let expected = source.forward(&x).unwrap().tensor().to_vec::<f32>().unwrap();
    assert_ne!(before, expected);
    target.load_state_dict(&source.state_dict(), true).unwrap();
    assert_eq!(target.forward(&x).unwrap().tensor().to_vec::<f32>().unwrap(), expected);
}
