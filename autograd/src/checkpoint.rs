//! Gradient checkpointing (`torch.utils.checkpoint`, reentrant flavour):
//! [`checkpoint`] runs a function without recording its graph, keeps only its
//! inputs, and recomputes it during backward with the random generator
//! restored, so dropout repeats its mask. [`checkpoint_sequential`] applies
//! it to segments of a list of layers with PyTorch's segment rule.
//!
//! Parameters the function uses receive their gradients in `.grad` during
//! the recomputation's backward, so use checkpoints with [`Var::backward`]
//! rather than [`crate::grad`].

use crate::backward::{run_backward, RunOptions};
use crate::error::{AutogradError, Result};
use crate::grad_mode::{enable_grad, is_grad_enabled, no_grad};
use crate::var::{record_always_owned, Var};
use brasa_tensor::{rng_state, set_rng_state};
use std::sync::Arc;

/// One layer of [`checkpoint_sequential`].
pub type Layer = Arc<dyn Fn(&Var) -> Result<Var> + Send + Sync>;

/// Puts this thread's precision hook back when dropped (even on error).
struct RestoreHook(Option<Arc<dyn crate::PrecisionHook>>);

impl Drop for RestoreHook {
    fn drop(&mut self) {
        crate::set_precision_hook(self.0.take());
    }
}

/// Puts the generator back to `state` when dropped (even on error).
struct RestoreRng(brasa_tensor::GeneratorState);

impl Drop for RestoreRng {
    fn drop(&mut self) {
        set_rng_state(self.0);
    }
}

/// Runs `f(inputs)` keeping only `inputs` for backward; backward recomputes
/// `f` (with the random generator as it was at forward time) and
/// backpropagates through the recomputation. The precision hook (autocast)
/// active at forward time is active during the recomputation too, so it
/// computes in the same dtypes. A recomputation whose output shape or dtype
/// differs is an error.
///
/// With grad mode on, the output is recorded even when no input requires
/// grad, so parameters used inside `f` still get their gradients (unlike
/// PyTorch's reentrant checkpoint, which silently gives them none).
pub fn checkpoint<F>(f: F, inputs: &[&Var]) -> Result<Var>
where
    F: Fn(&[Var]) -> Result<Var> + Send + Sync + 'static,
{
    if !is_grad_enabled() {
        let owned: Vec<Var> = inputs.iter().map(|v| (*v).clone()).collect();
        return f(&owned);
    }
    let rng = rng_state();
    let hook = crate::precision_hook();
    // What the function reads besides its inputs (parameters) is noted,
    // so that `leaves_reached` knows backward will reach it.
    let (out, reads) = {
        let _g = no_grad();
        let detached: Vec<Var> = inputs.iter().map(|v| v.detach()).collect();
        crate::var::watch_unrecorded(|| f(&detached))
    };
    let out = out?;
    let (out_dims, out_dtype) = (out.dims().to_vec(), out.dtype());
    let saved = || inputs.iter().map(|v| v.tensor().clone()).collect();
    // The gradient comes by value: the nested backward frees it once its
    // first node has used it, instead of it living until the segment ends.
    let out = record_always_owned("checkpoint", inputs, out.tensor().clone(), saved, move |grad, saved, needs| {
        let recomputed = {
            let _restore = RestoreRng(rng_state());
            set_rng_state(rng);
            let _restore_hook = RestoreHook(crate::set_precision_hook(hook.clone()));
            let _g = enable_grad();
            let xs: Vec<Var> = saved
                .iter()
                .zip(needs)
                .map(|(t, &need)| Var::from_tensor(t.clone(), need && t.dtype().is_float()))
                .collect::<Result<_>>()?;
            let out = f(&xs)?;
            (xs, out)
        };
        let (xs, out) = recomputed;
        if out.dims() != out_dims.as_slice() || out.dtype() != out_dtype {
            return Err(AutogradError::CheckpointMismatch(format!(
                "the forward pass gave shape {:?} ({}), the recomputation shape {:?} ({}); the function must be \
                 deterministic given its inputs and the random generator",
                out_dims,
                out_dtype,
                out.dims(),
                out.dtype()
            )));
        }
        let Some(root) = out.grad_node() else { return Ok(vec![None; xs.len()]) };
        // The graph holds what backward needs; our handle on the output would
        // only keep its memory alive until the whole segment is done.
        drop(out);
        let capture: Vec<_> = xs.iter().filter_map(Var::grad_node).collect();
        let captured = run_backward(
            vec![(root, grad)],
            RunOptions { retain_graph: false, accumulate_leaves: true, capture: &capture },
        )?;
        let mut captured = captured.into_iter();
        Ok(xs.iter().map(|x| if x.requires_grad() { captured.next().flatten() } else { None }).collect())
    });
    if let Some(node) = &out.0.grad_fn {
        let _ = node.recomputed_reads.set(reads);
    }
    Ok(out)
}

/// Runs `layers` in `segments` pieces: `segment_size = len / segments`; the
/// first `segments − 1` pieces are checkpointed and the last one (with any
/// remainder) runs normally, as PyTorch's `checkpoint_sequential` does.
pub fn checkpoint_sequential(layers: &[Layer], segments: usize, input: &Var) -> Result<Var> {
    if segments == 0 || segments > layers.len() {
        return Err(AutogradError::invalid(
            "checkpoint_sequential",
            format!("segments must be in 1..={} (the number of layers), got {segments}", layers.len()),
        ));
    }
    let size = layers.len() / segments;
    let mut x = input.clone();
    for s in 0..segments - 1 {
        let chunk: Vec<Layer> = layers[s * size..(s + 1) * size].to_vec();
        x = checkpoint(
            move |xs: &[Var]| {
                let mut y = xs[0].clone();
                for layer in &chunk {
                    y = layer(&y)?;
                }
                Ok(y)
            },
            &[&x],
        )?;
    }
    for layer in &layers[(segments - 1) * size..] {
        x = layer(&x)?;
    }
    Ok(x)
}
