//! [`ResNet`]: the residual network of He et al. (2015) in the form used
//! for 32×32 images (CIFAR-10): a 3×3 stem convolution at stride 1 and no
//! max pooling (the ImageNet stem, a 7×7 convolution at stride 2 and a
//! pooling, would leave an 8×8 map after the stem), four stages of
//! [`BasicBlock`]s, a global average pool and a linear head.
//!
//! ```text
//! x = relu(bn1(conv1(x)))                       3×3, stride 1, `width` channels
//! x = layer1(x)  layer2(x)  layer3(x)  layer4(x)  widths w, 2w, 4w, 8w; strides 1, 2, 2, 2
//! logits = fc(mean over H, W of x)
//! block(x) = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//! shortcut = x, or bn(conv1×1(x)) where the stride or the width changes
//! ```
//!
//! [`ResNetConfig::resnet18`] is ResNet-18 (two blocks per stage, base
//! width 64: 11,173,962 parameters for 3 input channels and 10 classes).
//! The layers are torchvision's and so are the names of the parameters and
//! buffers (`conv1.weight`, `bn1.running_mean`, `layer1.0.conv1.weight`,
//! `layer2.0.downsample.0.weight`, `layer2.0.downsample.1.bias`,
//! `fc.weight`): a state dict reads like the one of torchvision's
//! `resnet18` with its stem swapped for a 3×3 convolution and its max pool
//! removed, the usual CIFAR change. The convolutions have no bias (a batch
//! norm follows each). The initialisation is torchvision's: convolutions
//! from Kaiming's normal in `fan_out` mode for ReLU (`N(0, 2 / (C_out ·
//! kH · kW))`), batch norms at weight 1 and bias 0, the head as PyTorch's
//! `Linear` (`U(±1/√fan_in)` for weight and bias); the draws come from a
//! local generator seeded with [`ResNetConfig::init_seed`], so a model is
//! the same for a seed whatever else draws from the process-wide one
//! (building one still advances that generator: each `Conv2d` draws its
//! default weights first, which these then replace).
//!
//! In training mode the batch norms normalise with the batch's statistics
//! and update their running ones; in evaluation mode
//! ([`crate::ModuleExt::eval`]) they use the running statistics.
//!
//! ```
//! use brasa_nn::functional::cross_entropy;
//! use brasa_nn::models::{ResNet, ResNetConfig};
//! use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use brasa_nn::{Module, ModuleExt};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let model = ResNet::new(ResNetConfig::small(3, 10), Device::CPU)?; // width 8, one block per stage
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
//! let x = Var::new(Tensor::randn([4, 3, 32, 32], DType::F32)?);
//! let logits = model.forward(&x)?;
//! assert_eq!(logits.dims(), &[4, 10]);
//! cross_entropy(&logits, &Tensor::from_vec(vec![0i64, 1, 2, 3], [4])?)?.backward()?;
//! opt.step()?;
//! assert_eq!(ResNetConfig::resnet18(3, 10).num_parameters(), 11_173_962);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use crate::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Linear};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Generator, Tensor, TensorError};

/// The shape of a [`ResNet`]: input channels, classes, the base width (the
/// stem's channels; the stages have 1, 2, 4 and 8 times as many) and the
/// number of [`BasicBlock`]s of each of the four stages, with the seed of
/// the initial weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Channels of the input images (3 for RGB, 1 for grey).
    pub in_channels: usize,
    /// The number of classes (the logits' width).
    pub num_classes: usize,
    /// The base width: 64 in ResNet-18.
    pub width: usize,
    /// Basic blocks per stage: `[2, 2, 2, 2]` in ResNet-18.
    pub blocks: [usize; 4],
    /// The seed of the initial weights (0 unless set).
    pub init_seed: u64,
}

impl ResNetConfig {
    /// ResNet-18 for 32×32 images: base width 64, two blocks per stage.
    pub fn resnet18(in_channels: usize, num_classes: usize) -> ResNetConfig {
        ResNetConfig { in_channels, num_classes, width: 64, blocks: [2, 2, 2, 2], init_seed: 0 }
    }

    /// A small model of the same structure for tests and the host: base
    /// width 8, one block per stage (every kind of block is there: the
    /// stages after the first open with a strided block and a projection
    /// shortcut).
    pub fn small(in_channels: usize, num_classes: usize) -> ResNetConfig {
        ResNetConfig { in_channels, num_classes, width: 8, blocks: [1, 1, 1, 1], init_seed: 0 }
    }

    /// With this base width.
    pub fn width(self, width: usize) -> ResNetConfig {
        ResNetConfig { width, ..self }
    }

    /// With these blocks per stage.
    pub fn blocks(self, blocks: [usize; 4]) -> ResNetConfig {
        ResNetConfig { blocks, ..self }
    }

    /// With initial weights drawn from this seed.
    pub fn init_seed(self, init_seed: u64) -> ResNetConfig {
        ResNetConfig { init_seed, ..self }
    }

    /// The channels of each stage: `width`, `2·width`, `4·width`, `8·width`.
    pub fn stage_widths(&self) -> [usize; 4] {
        [self.width, 2 * self.width, 4 * self.width, 8 * self.width]
    }

    /// The number of parameter elements of a model of this shape, counted
    /// without building it (batch-norm buffers are not parameters).
    pub fn num_parameters(&self) -> usize {
        let conv = |c_in: usize, c_out: usize, k: usize| c_in * c_out * k * k;
        let bn = |c: usize| 2 * c;
        let mut total = conv(self.in_channels, self.width, 3) + bn(self.width);
        let mut c_in = self.width;
        for (stage, &c_out) in self.stage_widths().iter().enumerate() {
            for block in 0..self.blocks[stage] {
                let stride = if stage > 0 && block == 0 { 2 } else { 1 };
                total += conv(c_in, c_out, 3) + bn(c_out) + conv(c_out, c_out, 3) + bn(c_out);
                if stride != 1 || c_in != c_out {
                    total += conv(c_in, c_out, 1) + bn(c_out);
                }
                c_in = c_out;
            }
        }
        total + c_in * self.num_classes + self.num_classes
    }

    /// Errors naming the first invalid value.
    pub fn validate(&self) -> Result<()> {
        let sizes = [("in_channels", self.in_channels), ("num_classes", self.num_classes), ("width", self.width)];
        if let Some((name, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return Err(NnError::invalid("ResNetConfig", format!("{name} must be positive, got 0")));
        }
        if let Some(stage) = self.blocks.iter().position(|&n| n == 0) {
            return Err(NnError::invalid(
                "ResNetConfig",
                format!("every stage needs at least one block, got {:?} (stage {} has none)", self.blocks, stage + 1),
            ));
        }
        Ok(())
    }
}

/// The residual block of ResNet-18 and -34 (torchvision's `BasicBlock`):
/// two 3×3 convolutions, each followed by a batch norm, the first strided
/// and followed by a ReLU, added to the shortcut before the last ReLU.
#[derive(crate::Parameters, Debug)]
pub struct BasicBlock {
    /// 3×3, `in → out`, at the block's stride, no bias.
    pub conv1: Conv2d,
    /// The norm after `conv1`.
    pub bn1: BatchNorm2d,
    /// 3×3, `out → out`, stride 1, no bias.
    pub conv2: Conv2d,
    /// The norm after `conv2`.
    pub bn2: BatchNorm2d,
    /// The projection shortcut where the shape changes: a 1×1 convolution
    /// at the block's stride and a batch norm (named `downsample.0` and
    /// `downsample.1`, as torchvision's `Sequential`); `None` for the
    /// identity.
    pub downsample: Option<(Conv2d, BatchNorm2d)>,
}

impl BasicBlock {
    /// A block from `in_channels` to `out_channels` at `stride`, initialised
    /// as the module docs say from `generator`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        stride: usize,
        generator: &mut Generator,
        device: Device,
    ) -> Result<BasicBlock> {
        let downsample = if stride != 1 || in_channels != out_channels {
            Some((
                conv(generator, in_channels, out_channels, 1, stride, device)?,
                BatchNorm2d::new(out_channels, device)?,
            ))
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: conv(generator, in_channels, out_channels, 3, stride, device)?,
            bn1: BatchNorm2d::new(out_channels, device)?,
            conv2: conv(generator, out_channels, out_channels, 3, 1, device)?,
            bn2: BatchNorm2d::new(out_channels, device)?,
            downsample,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Var) -> Result<Var> {
        let out = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let out = self.bn2.forward(&self.conv2.forward(&out)?)?;
        let shortcut = match &self.downsample {
            Some((conv, bn)) => bn.forward(&conv.forward(x)?)?,
            None => x.clone(),
        };
        Ok(out.add(&shortcut)?.relu()?)
    }
}

/// A residual network for 32×32 images (see the module docs); parameter
/// names are torchvision's.
#[derive(crate::Parameters)]
pub struct ResNet {
    /// The stem: 3×3, `in_channels → width`, stride 1, no bias.
    pub conv1: Conv2d,
    /// The norm after the stem.
    pub bn1: BatchNorm2d,
    /// Stage 1: `width` channels at the input's resolution.
    pub layer1: Vec<BasicBlock>,
    /// Stage 2: `2·width` channels at half the resolution.
    pub layer2: Vec<BasicBlock>,
    /// Stage 3: `4·width` channels at a quarter.
    pub layer3: Vec<BasicBlock>,
    /// Stage 4: `8·width` channels at an eighth.
    pub layer4: Vec<BasicBlock>,
    /// The head: `8·width → num_classes`, with a bias.
    pub fc: Linear,
    #[module(skip)]
    config: ResNetConfig,
}

impl ResNet {
    /// A model built and initialised as `config` says, on `device`, in f32.
    pub fn new(config: ResNetConfig, device: Device) -> Result<ResNet> {
        config.validate()?;
        let mut generator = Generator::new(config.init_seed);
        let conv1 = conv(&mut generator, config.in_channels, config.width, 3, 1, device)?;
        let bn1 = BatchNorm2d::new(config.width, device)?;
        let mut c_in = config.width;
        let mut stages = Vec::with_capacity(4);
        for (stage, &c_out) in config.stage_widths().iter().enumerate() {
            let mut blocks = Vec::with_capacity(config.blocks[stage]);
            for block in 0..config.blocks[stage] {
                // Each stage after the first halves the resolution in its first block.
                let stride = if stage > 0 && block == 0 { 2 } else { 1 };
                blocks.push(BasicBlock::new(c_in, c_out, stride, &mut generator, device)?);
                c_in = c_out;
            }
            stages.push(blocks);
        }
        let fc = linear(&mut generator, c_in, config.num_classes, device)?;
        let mut stages = stages.into_iter();
        let mut next = || stages.next().unwrap_or_default();
        Ok(ResNet { conv1, bn1, layer1: next(), layer2: next(), layer3: next(), layer4: next(), fc, config })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ResNetConfig {
        &self.config
    }

    /// The features before the head: `[N, 8·width]`, the last stage's
    /// output averaged over its height and width.
    pub fn features(&self, x: &Var) -> Result<Var> {
        if x.rank() != 4 || x.dims()[1] != self.config.in_channels {
            return Err(NnError::invalid(
                "ResNet",
                format!(
                    "expected images [N, {}, H, W], got a {} tensor of shape {:?}",
                    self.config.in_channels,
                    x.dtype(),
                    x.dims()
                ),
            ));
        }
        let mut x = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        for block in self.layer1.iter().chain(&self.layer2).chain(&self.layer3).chain(&self.layer4) {
            x = block.forward(&x)?;
        }
        // torchvision's AdaptiveAvgPool2d((1, 1)) and flatten: one mean.
        Ok(x.mean(&[2, 3], false)?)
    }
}

impl Module for ResNet {
    /// The logits `[N, num_classes]` of images `[N, in_channels, H, W]`
    /// (32×32 for the design; any size of at least 1×1 after the three
    /// halvings works).
    fn forward(&self, x: &Var) -> Result<Var> {
        self.fc.forward(&self.features(x)?)
    }
}

/// A bias-free `k×k` convolution `c_in → c_out` at `stride` (padding 1 for
/// 3×3, 0 for 1×1), its weight from Kaiming's normal in `fan_out` mode for
/// ReLU, as torchvision initialises its ResNets.
fn conv(
    generator: &mut Generator,
    c_in: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    device: Device,
) -> Result<Conv2d> {
    let config = Conv2dConfig::new().stride(stride).padding(k / 2).bias(false);
    let mut layer = Conv2d::with_config(c_in, c_out, k, config, device)?;
    let std = (2.0 / (c_out * k * k) as f64).sqrt();
    layer.weight = Var::param(normal(generator, &[c_out, c_in, k, k], std, device)?)?;
    Ok(layer)
}

/// A linear layer `in → out` initialised as PyTorch's `Linear`: weight and
/// bias from `U(±1/√in)`.
fn linear(generator: &mut Generator, in_features: usize, out_features: usize, device: Device) -> Result<Linear> {
    let bound = 1.0 / (in_features as f64).sqrt();
    Ok(Linear {
        weight: Var::param(uniform(generator, &[out_features, in_features], bound, device)?)?,
        bias: Some(Var::param(uniform(generator, &[out_features], bound, device)?)?),
    })
}

/// An f32 tensor of `N(0, std)` values from `generator`.
fn normal(generator: &mut Generator, dims: &[usize], std: f64, device: Device) -> Result<Tensor> {
    draws(dims, device, |values| generator.fill_normal_f32(values, 0.0, std as f32))
}

/// An f32 tensor of `U(−bound, bound)` values from `generator`.
fn uniform(generator: &mut Generator, dims: &[usize], bound: f64, device: Device) -> Result<Tensor> {
    draws(dims, device, |values| generator.fill_uniform_f32(values, -bound as f32, bound as f32))
}

/// An f32 tensor of `dims` filled by `fill` on the host, then moved to
/// `device`; on the meta device, zeros (a memory plan needs the
/// allocations, not the draws).
fn draws(
    dims: &[usize],
    device: Device,
    fill: impl FnOnce(&mut [f32]) -> std::result::Result<(), brasa_tensor::RngError>,
) -> Result<Tensor> {
    if device.is_meta() {
        return Ok(Tensor::zeros_on(dims.to_vec(), DType::F32, device)?);
    }
    let mut values = vec![0f32; dims.iter().product()];
    fill(&mut values).map_err(TensorError::from)?;
    Ok(Tensor::from_vec_on(values, dims, device)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::ModuleExt;

    #[test]
    fn counted_parameters_match_the_built_model() {
        for config in [ResNetConfig::small(3, 10), ResNetConfig::small(1, 7).blocks([2, 1, 3, 1]).width(4)] {
            let model = ResNet::new(config, Device::CPU).unwrap();
            assert_eq!(model.num_parameters(), config.num_parameters(), "{config:?}");
        }
    }

    #[test]
    fn invalid_configs_are_errors() {
        assert!(ResNet::new(ResNetConfig::small(0, 10), Device::CPU).is_err());
        assert!(ResNet::new(ResNetConfig::small(3, 10).width(0), Device::CPU).is_err());
        let err = ResNetConfig::small(3, 10).blocks([1, 0, 1, 1]).validate().unwrap_err();
        assert!(matches!(err, NnError::Invalid { what: "ResNetConfig", .. }), "{err:?}");
        // The variant says no more: the message names the stage (counted from 1).
        assert!(err.to_string().contains("stage 2 has none"), "{err}");
    }

    #[test]
    fn conv_weights_follow_kaiming_fan_out() {
        let model = ResNet::new(ResNetConfig::resnet18(3, 10).blocks([1, 1, 1, 1]), Device::CPU).unwrap();
        // layer4's first conv: [512, 256, 3, 3], fan_out 512·9.
        let w = model.layer4[0].conv1.weight.tensor().to_vec::<f32>().unwrap();
        let var = w.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / w.len() as f64;
        let expected = 2.0 / (512.0 * 9.0);
        assert!((var / expected - 1.0).abs() < 0.02, "variance {var}, expected {expected}");
        assert!(model.layer4[0].conv1.bias.is_none());
    }

    #[test]
    fn the_same_seed_gives_the_same_weights() {
        let config = ResNetConfig::small(1, 10);
        let a = ResNet::new(config, Device::CPU).unwrap().layer2[0].conv1.weight.tensor().to_vec::<f32>().unwrap();
        let b = ResNet::new(config, Device::CPU).unwrap().layer2[0].conv1.weight.tensor().to_vec::<f32>().unwrap();
        let c = ResNet::new(config.init_seed(1), Device::CPU).unwrap().layer2[0]
            .conv1
            .weight
            .tensor()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
