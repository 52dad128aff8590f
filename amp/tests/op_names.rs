//! Autocast's operation names: the policy tables and brasa's operations
//! share the constants of `brasa_autograd::op_names`, and every other name
//! in the tables is one of PyTorch's, so a misspelt entry (which would
//! silently mean "follow") fails here. A recording hook checks that the
//! operations ask under exactly those names.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use brasa_amp::{
    Category, Policy, BRASA_FLOAT32, CPU_FLOAT32, CPU_LOWER, CPU_PROMOTE, CUDA_FLOAT32, CUDA_LOWER, CUDA_PROMOTE,
};
use brasa_autograd::{op_names, set_precision_hook, PrecisionHook, SdpaOptions, Var};
use brasa_nn::functional::{
    batch_norm, binary_cross_entropy_with_logits, cross_entropy, group_norm, l1_loss, layer_norm, mse_loss, nll_loss,
    Reduction,
};
use brasa_tensor::{Conv1dParams, Conv2dParams, ConvTranspose1dParams, ConvTranspose2dParams, DType, Device, Tensor};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// PyTorch's names in the tables that no brasa operation asks under (for
/// custom operations), each checked against PyTorch 2.15: an operator
/// registered for `AutocastCUDA` or `AutocastCPU`, or a `torch`,
/// `torch.Tensor`, `torch.nn.functional` or `torch.linalg` function named
/// in the `torch.amp` op reference.
const PYTORCH_NAMES: &[&str] = &[
    "__matmul__",
    "__pow__",
    "__rdiv__",
    "__rpow__",
    "__rtruediv__",
    "acos",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "addbmm",
    "addcdiv",
    "addcmul",
    "addmv",
    "addr",
    "asin",
    "atan2",
    "avg_pool3d",
    "bilinear",
    "bmm",
    "cdist",
    "chain_matmul",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "conv3d",
    "conv_tbc",
    "conv_transpose3d",
    "cosh",
    "cosine_embedding_loss",
    "cosine_similarity",
    "cross",
    "ctc_loss",
    "cumprod",
    "cumsum",
    "dist",
    "dot",
    "erfinv",
    "expm1",
    "fft_fft",
    "fft_fft2",
    "fft_fftn",
    "fft_hfft",
    "fft_ifft",
    "fft_ifft2",
    "fft_ifftn",
    "fft_ihfft",
    "fft_irfft",
    "fft_irfft2",
    "fft_irfftn",
    "fft_rfft",
    "fft_rfft2",
    "fft_rfftn",
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "geqrf",
    "grid_sample",
    "grid_sampler",
    "gru_cell",
    "hinge_embedding_loss",
    "huber_loss",
    "index_copy",
    "index_put",
    "inverse",
    "kl_div",
    "linalg_cholesky",
    "linalg_cond",
    "linalg_eig",
    "linalg_eigh",
    "linalg_eigvals",
    "linalg_eigvalsh",
    "linalg_householder_product",
    "linalg_inv",
    "linalg_lstsq",
    "linalg_matrix_rank",
    "linalg_qr",
    "linalg_solve",
    "linalg_svd",
    "linalg_svdvals",
    "linalg_tensorinv",
    "linalg_tensorsolve",
    "linalg_vecdot",
    "log10",
    "log1p",
    "log2",
    "lstm_cell",
    "lu_solve",
    "margin_ranking_loss",
    "max_pool3d",
    "max_unpool2d",
    "max_unpool3d",
    "mm",
    "multi_dot",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "mv",
    "nanquantile",
    "nll_loss2d",
    "norm",
    "normalize",
    "orgqr",
    "ormqr",
    "pdist",
    "pinverse",
    "poisson_nll_loss",
    "polar",
    "prelu",
    "prod",
    "qr",
    "quantile",
    "reciprocal",
    "reflection_pad1d",
    "reflection_pad2d",
    "renorm",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "rnn_relu_cell",
    "rnn_tanh_cell",
    "scatter_add",
    "sinh",
    "smooth_l1_loss",
    "soft_margin_loss",
    "softmin",
    "stft",
    "svd",
    "tan",
    "tensordot",
    "trace",
    "triangular_solve",
    "triplet_margin_loss",
];

fn tables() -> [(&'static str, &'static [&'static str]); 7] {
    [
        ("CUDA_LOWER", CUDA_LOWER),
        ("CUDA_FLOAT32", CUDA_FLOAT32),
        ("CUDA_PROMOTE", CUDA_PROMOTE),
        ("CPU_LOWER", CPU_LOWER),
        ("CPU_FLOAT32", CPU_FLOAT32),
        ("CPU_PROMOTE", CPU_PROMOTE),
        ("BRASA_FLOAT32", BRASA_FLOAT32),
    ]
}

#[test]
fn every_name_in_the_policy_tables_is_a_known_op_name() {
    for (table, names) in tables() {
        for (i, name) in names.iter().enumerate() {
            assert!(
                op_names::ALL.contains(name) || PYTORCH_NAMES.contains(name),
                "{table} lists {name:?}: neither a name brasa's operations ask under (brasa_autograd::op_names) \
                 nor one of PyTorch's"
            );
            assert!(!names[..i].contains(name), "{table} lists {name:?} twice");
        }
    }
    // The fixture holds PyTorch's other names only, each used by a table.
    for name in PYTORCH_NAMES {
        assert!(!op_names::ALL.contains(name), "{name:?} is one of brasa's: use op_names");
        assert!(tables().iter().any(|(_, names)| names.contains(name)), "{name:?} is in no table");
    }
}

#[test]
fn every_name_brasa_asks_under_is_in_a_default_policy() {
    let (cuda, cpu) = (Policy::cuda(), Policy::cpu());
    for &name in op_names::ALL {
        assert!(
            cuda.category(name) != Category::Follow || cpu.category(name) != Category::Follow,
            "{name:?} is asked by a brasa operation but no default policy lists it"
        );
    }
}

/// Records every name it is asked about and leaves the inputs alone.
#[derive(Default)]
struct Recorder(Mutex<BTreeSet<String>>);

impl PrecisionHook for Recorder {
    fn target(&self, op: &str, _inputs: &[DType], _device: Device) -> Option<DType> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(op.to_string());
        None
    }
}

fn randn(dims: &[usize]) -> Var {
    Var::new(Tensor::randn(dims, DType::F32).unwrap())
}

/// Runs every brasa operation that asks the precision hook.
fn ask_every_operation() -> brasa_nn::Result<()> {
    let (x, w, b) = (randn(&[4, 6]), randn(&[3, 6]), randn(&[3]));
    x.matmul(&w.t()?)?;
    x.linear(&w, Some(&b))?;
    randn(&[4, 3]).addmm(&x, &w.t()?, 1.0, 1.0)?;
    randn(&[4, 3]).baddbmm(&randn(&[2, 4, 6]), &randn(&[2, 6, 3]), 1.0, 1.0)?;
    let (signal, image) = (randn(&[1, 2, 8]), randn(&[1, 2, 5, 5]));
    signal.conv1d(&randn(&[3, 2, 3]), None, Conv1dParams::default())?;
    signal.conv_transpose1d(&randn(&[2, 3, 3]), None, ConvTranspose1dParams::default())?;
    image.conv2d(&randn(&[3, 2, 3, 3]), None, Conv2dParams::default())?;
    image.conv_transpose2d(&randn(&[2, 3, 3, 3]), None, ConvTranspose2dParams::default())?;
    let q = randn(&[1, 2, 4, 8]);
    q.scaled_dot_product_attention(&q, &q, &SdpaOptions::default())?;
    x.softmax(-1)?;
    x.log_softmax(-1)?;
    x.softplus(1.0, 20.0)?;
    let positive = x.exp()?;
    positive.log()?;
    positive.rsqrt()?;
    positive.pow(&x)?;
    positive.powf(2.0)?;
    x.sum(&[0], false)?;
    x.sum_all()?;
    x.mean(&[0], false)?;
    x.mean_all()?;
    x.var(&[0], 1, false)?;
    x.std(&[0], 1, false)?;
    Var::cat(&[&x, &x], 0)?;
    Var::stack(&[&x, &x], 0)?;
    let classes = Tensor::from_vec(vec![0i64, 1, 2, 0], [4])?;
    cross_entropy(&x, &classes)?;
    cross_entropy(&x, &x.softmax(-1)?.tensor().clone())?;
    nll_loss(&x.log_softmax(-1)?, &classes)?;
    mse_loss(&x, &x, Reduction::Mean)?;
    l1_loss(&x, &x, Reduction::Mean)?;
    binary_cross_entropy_with_logits(&x, &x.softmax(-1)?, Reduction::Mean, None)?;
    layer_norm(&x, &[6], None, None, 1e-5)?;
    batch_norm(&x, None, None, None, None, true, 0.1, 1e-5)?;
    group_norm(&image, 2, None, None, 1e-5)?;
    Ok(())
}

#[test]
fn operations_ask_under_exactly_the_op_names() {
    let recorder = Arc::new(Recorder::default());
    let previous = set_precision_hook(Some(recorder.clone()));
    let outcome = ask_every_operation();
    set_precision_hook(previous);
    outcome.unwrap();
    let asked = recorder.0.lock().unwrap().clone();
    let known: BTreeSet<String> = op_names::ALL.iter().map(|name| name.to_string()).collect();
    assert_eq!(asked, known, "names asked vs brasa_autograd::op_names::ALL");
}
