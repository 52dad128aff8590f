//! Peak memory of `Var::scaled_dot_product_attention`, forward and
//! backward, measured with the allocator's peak statistics: it grows about
//! linearly with the sequence length, where the naive composition
//! `softmax(q·kᵀ·scale)·v` grows with its square. One test in its own binary,
//! so no other test allocates on the device while it measures.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{Result, SdpaOptions, Var};
use brasa_tensor::{memory, Device, Tensor};

const DEV: Device = Device::CPU;

fn filled(shape: &[usize], salt: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.37 + salt).sin() * 0.5) as f32).collect();
    Tensor::from_vec_on(values, shape, DEV).unwrap()
}

/// Bytes allocated at the peak of one forward + backward of `f` at
/// sequence length `l` (batch 1, 2 heads, head dim 16), above what the
/// inputs already held.
fn peak(l: usize, f: impl Fn(&Var, &Var, &Var) -> Result<Var>) -> usize {
    let vars: Vec<Var> = (0..3).map(|i| Var::param(filled(&[1, 2, l, 16], i as f64)).unwrap()).collect();
    let base = memory::allocated(DEV).unwrap();
    memory::reset_peak(DEV).unwrap();
    let out = f(&vars[0], &vars[1], &vars[2]).unwrap();
    out.sum_all().unwrap().backward().unwrap();
    drop(out);
    memory::max_allocated(DEV).unwrap() - base
}

#[test]
fn peak_grows_linearly_with_sequence() {
    let sdpa = |q: &Var, k: &Var, v: &Var| q.scaled_dot_product_attention(k, v, &SdpaOptions::new().chunk_rows(64));
    let naive = |q: &Var, k: &Var, v: &Var| q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(0.25)?.softmax(-1)?.matmul(v);
    // Warm the allocator's cache so both sizes start from the same state.
    peak(256, sdpa);
    let (sdpa_512, sdpa_1024) = (peak(512, sdpa), peak(1024, sdpa));
    let (naive_512, naive_1024) = (peak(512, naive), peak(1024, naive));
    let sdpa_ratio = sdpa_1024 as f64 / sdpa_512 as f64;
    let naive_ratio = naive_1024 as f64 / naive_512 as f64;
    eprintln!("peak: sdpa {sdpa_512} → {sdpa_1024} B ({sdpa_ratio:.2}×), naive {naive_512} → {naive_1024} B ({naive_ratio:.2}×)");
    assert!(sdpa_ratio < 2.5, "sdpa's peak grew {sdpa_ratio:.2}× for twice the sequence");
    assert!(naive_ratio > 3.5, "the naive peak grew only {naive_ratio:.2}×: the measure is not telling");
    // One [2, 1024, 1024] f32 score matrix is 8 MiB; sdpa holds far less.
    assert!(sdpa_1024 * 8 < naive_1024, "sdpa {sdpa_1024} B vs naive {naive_1024} B at L = 1024");
}
