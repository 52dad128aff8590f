//! Channels-last models (`ModuleExt::to_channels_last`, PyTorch's
//! `model.to(memory_format=torch.channels_last)`): the 4-d weights change
//! layout and nothing else; gradients and optimizer state follow the
//! weights' layout, so the fused optimizers keep taking them; training
//! gives the row-major model's numbers; state dicts cross between the two.
//!
//! Every model draws its weights from its own seeded generator.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{ResNet, ResNetConfig};
use brasa_nn::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use brasa_nn::{Module, ModuleExt};
use brasa_tensor::{Device, Generator, Tensor};

const DEV: Device = Device::CPU;

fn small_resnet() -> ResNet {
    ResNet::new(ResNetConfig::small(3, 10).width(4).blocks([1, 1, 1, 1]).init_seed(7), DEV).unwrap()
}

/// Standard normal `[n, 3, 16, 16]` images and labels in `0..10`.
fn batch(seed: u64, n: usize) -> (Tensor, Tensor) {
    let mut generator = Generator::new(seed);
    let mut pixels = vec![0f32; n * 3 * 16 * 16];
    generator.fill_normal_f32(&mut pixels, 0.0, 1.0).unwrap();
    let labels: Vec<i64> = (0..n as i64).map(|i| (i * 7 + seed as i64) % 10).collect();
    (Tensor::from_vec_on(pixels, [n, 3, 16, 16], DEV).unwrap(), Tensor::from_vec_on(labels, [n], DEV).unwrap())
}

fn values(model: &ResNet) -> Vec<(String, Vec<f32>)> {
    model.named_parameters().into_iter().map(|(name, p)| (name, p.tensor().to_vec::<f32>().unwrap())).collect()
}

#[test]
fn only_four_dim_tensors_change_layout_and_no_value_changes() {
    let row_major = small_resnet();
    let mut channels_last = small_resnet();
    channels_last.to_channels_last().unwrap();
    let mut converted = 0;
    for ((name, a), (_, b)) in row_major.named_parameters().iter().zip(channels_last.named_parameters()) {
        assert_eq!(a.dims(), b.dims(), "{name}");
        assert_eq!(a.tensor().to_vec::<f32>().unwrap(), b.tensor().to_vec::<f32>().unwrap(), "{name}");
        if a.tensor().rank() == 4 {
            assert!(b.tensor().is_channels_last(), "{name} is channels-last");
            converted += usize::from(!b.tensor().is_contiguous());
        } else {
            assert_eq!(a.tensor().strides(), b.tensor().strides(), "{name}: not 4-d, untouched");
        }
        assert!(b.requires_grad(), "{name} is still a parameter");
    }
    assert!(converted >= 5, "the convolution weights changed layout ({converted})");
    // A second call changes nothing.
    let before: Vec<Vec<isize>> = channels_last.parameters().iter().map(|p| p.tensor().strides().to_vec()).collect();
    channels_last.to_channels_last().unwrap();
    let after: Vec<Vec<isize>> = channels_last.parameters().iter().map(|p| p.tensor().strides().to_vec()).collect();
    assert_eq!(before, after);
}

/// Three training steps of each model with `make_optimizer`; the
/// channels-last one sees channels-last batches. Returns both models and
/// the channels-last optimizer.
fn train_both<O: Optimizer>(make_optimizer: impl Fn(Vec<Var>) -> O) -> (ResNet, ResNet, O) {
    let row_major = small_resnet();
    let mut channels_last = small_resnet();
    channels_last.to_channels_last().unwrap();
    let mut opt_row = make_optimizer(row_major.parameters());
    let mut opt_last = make_optimizer(channels_last.parameters());
    for step in 0..3 {
        let (x, y) = batch(step, 4);
        let loss_row = cross_entropy(&row_major.forward(&Var::new(x.clone())).unwrap(), &y).unwrap();
        let loss_last =
            cross_entropy(&channels_last.forward(&Var::new(x.to_channels_last().unwrap())).unwrap(), &y).unwrap();
        let (a, b) = (loss_row.tensor().to_vec::<f32>().unwrap()[0], loss_last.tensor().to_vec::<f32>().unwrap()[0]);
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "step {step}: loss {a} against {b}");
        loss_row.backward().unwrap();
        loss_last.backward().unwrap();
        for (name, p) in channels_last.named_parameters() {
            if p.tensor().rank() == 4 {
                let g = p.grad().unwrap();
                assert_eq!(g.strides(), p.tensor().strides(), "step {step}: {name}'s gradient follows its layout");
            }
        }
        opt_row.step().unwrap();
        opt_last.step().unwrap();
        opt_row.zero_grad().unwrap();
        opt_last.zero_grad().unwrap();
    }
    (row_major, channels_last, opt_last)
}

fn assert_same_training(row_major: &ResNet, channels_last: &ResNet) {
    for ((name, a), (_, b)) in values(row_major).iter().zip(values(channels_last)) {
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs() / x.abs().max(1e-2)).fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{name}: relative difference {worst}");
    }
    for (name, p) in channels_last.named_parameters() {
        if p.tensor().rank() == 4 {
            assert!(p.tensor().is_channels_last(), "{name} stays channels-last through the updates");
        }
    }
}

#[test]
fn sgd_trains_a_channels_last_resnet_as_its_row_major_twin() {
    let config = SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 5e-4, ..SgdConfig::default() };
    let (row_major, channels_last, opt) = train_both(|params| Sgd::new(params, config).unwrap());
    assert_same_training(&row_major, &channels_last);
    for (index, p) in channels_last.parameters().iter().enumerate() {
        let buffer = opt.momentum_buffer(index).unwrap();
        assert_eq!(buffer.strides(), p.tensor().strides(), "parameter {index}'s momentum follows its layout");
    }
}

#[test]
fn adamw_trains_a_channels_last_resnet_as_its_row_major_twin() {
    let config = AdamConfig { lr: 1e-3, amsgrad: true, ..AdamConfig::adamw() };
    let (row_major, channels_last, opt) = train_both(|params| AdamW::new(params, config).unwrap());
    assert_same_training(&row_major, &channels_last);
    for (index, p) in channels_last.parameters().iter().enumerate() {
        let (step, exp_avg, exp_avg_sq) = opt.moments(index).unwrap();
        assert_eq!(step, 3);
        assert_eq!(exp_avg.strides(), p.tensor().strides(), "parameter {index}'s first moment");
        assert_eq!(exp_avg_sq.strides(), p.tensor().strides(), "parameter {index}'s second moment");
    }
    // Its state dict loads into a fresh optimizer of the channels-last
    // model with the state laid out as the weights again.
    let mut again = AdamW::new(channels_last.parameters(), config).unwrap();
    again.load_state_dict(&opt.state_dict().unwrap()).unwrap();
    for (index, p) in channels_last.parameters().iter().enumerate() {
        let (_, exp_avg, _) = again.moments(index).unwrap();
        assert_eq!(exp_avg.strides(), p.tensor().strides(), "loaded moment {index}");
        assert_eq!(exp_avg.to_vec::<f32>().unwrap(), opt.moments(index).unwrap().1.to_vec::<f32>().unwrap());
    }
}

#[test]
fn state_dicts_cross_between_layouts() {
    let mut channels_last = small_resnet();
    channels_last.to_channels_last().unwrap();
    // Different values in every parameter, then through a file.
    for p in channels_last.parameters() {
        p.tensor().add_scalar_(0.25).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("brasa-channels-last-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    channels_last.save(&path).unwrap();
    let row_major = small_resnet();
    row_major.load(&path).unwrap();
    assert_eq!(values(&row_major), values(&channels_last), "saved in logical order, whatever the layout");
    // And back into a channels-last model, which keeps its layout.
    let mut target = small_resnet();
    target.to_channels_last().unwrap();
    target.load_state_dict(&row_major.state_dict(), true).unwrap();
    assert_eq!(values(&target), values(&row_major));
    assert!(target.parameters().iter().filter(|p| p.tensor().rank() == 4).all(|p| p.tensor().is_channels_last()));
    std::fs::remove_dir_all(&dir).unwrap();
}
