//! Whole models built from the layers, each in its own file: [`Gpt`], a
//! decoder-only transformer language model (nanoGPT's), and [`ResNet`], the
//! residual image classifier for 32×32 inputs (ResNet-18 and smaller).

mod gpt;
mod resnet;

pub use gpt::{Gpt, GptBlock, GptConfig, GptEmbedding, GptHead, SampleOptions};
pub use resnet::{BasicBlock, ResNet, ResNetConfig};
