//! Inputs and readings shared by the GPT test binaries (`gpt.rs`,
//! `gpt_units.rs`; each includes this file with `#[path]`).
#![allow(dead_code)]

use brasa_tensor::{DType, Generator, Tensor};

/// `[n, t]` ids from a local generator.
pub fn random_ids(n: usize, t: usize, vocab: usize, seed: u64) -> Tensor {
    let mut draws = vec![0f64; n * t];
    Generator::new(seed).fill_uniform_f64(&mut draws, 0.0, vocab as f64).unwrap();
    let ids: Vec<i64> = draws.iter().map(|&u| (u as i64).min(vocab as i64 - 1)).collect();
    Tensor::from_vec(ids, [n, t]).unwrap()
}

/// A tensor's values as f32.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}
