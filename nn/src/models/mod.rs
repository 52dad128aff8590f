//! Whole models built from the layers, each in its own file: [`Gpt`], a
//! decoder-only transformer language model (nanoGPT's).

mod gpt;

pub use gpt::{Gpt, GptBlock, GptConfig, GptEmbedding, GptHead, SampleOptions};
