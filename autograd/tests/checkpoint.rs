//! Checkpointing: the same gradients as without (dropout included, thanks
//! to the restored generator), lower peak memory, and errors when the
//! recomputation differs.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{checkpoint, checkpoint_sequential, AutogradError, Layer, Result, Var};
use brasa_tensor::{manual_seed, memory, set_host_device_count, DType, Device, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Eight logical host devices, asked for by every test before its first
/// tensor (tests run in parallel and the count is fixed at first use).
fn cpu(index: usize) -> Device {
    set_host_device_count(8).expect("every test asks for the same count");
    Device::cpu(index)
}

fn filled(shape: &[usize], dev: Device, salt: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|i| (i as f64 * 0.61 + salt).sin() * 0.2).collect();
    Tensor::from_vec_on(values, shape, dev).and_then(|t| t.to_dtype(dtype)).expect("tensor")
}

fn layers(params: &[Var], dropout: f64) -> Vec<Layer> {
    params
        .chunks(2)
        .map(|wb| {
            let (w, b) = (wb[0].clone(), wb[1].clone());
            Arc::new(move |x: &Var| x.linear(&w, Some(&b))?.dropout(dropout, true)?.tanh()) as Layer
        })
        .collect()
}

fn params(n: usize, width: usize, dev: Device, dtype: DType) -> Vec<Var> {
    (0..n)
        .flat_map(|i| {
            [
                Var::param(filled(&[width, width], dev, i as f64, dtype)).unwrap(),
                Var::param(filled(&[width], dev, 100.0 + i as f64, dtype)).unwrap(),
            ]
        })
        .collect()
}

fn grads(vars: &[Var]) -> Vec<Vec<f64>> {
    vars.iter().map(|v| v.grad().and_then(|g| g.to_vec::<f64>().ok()).unwrap_or_default()).collect()
}

/// The only test here that draws from the global generator.
#[test]
fn same_gradients_as_without_checkpoint_dropout_included() -> Result<()> {
    let dev = cpu(0);
    let ps = params(6, 8, dev, DType::F64);
    let x = Var::param(filled(&[5, 8], dev, 0.5, DType::F64))?;
    let ls = layers(&ps, 0.3);
    let run = |segments: Option<usize>| -> Result<(Vec<Vec<f64>>, f64)> {
        for p in ps.iter().chain([&x]) {
            p.zero_grad(true)?;
        }
        manual_seed(42);
        let y = match segments {
            Some(s) => checkpoint_sequential(&ls, s, &x)?,
            None => ls.iter().try_fold(x.clone(), |h, l| l(&h))?,
        };
        let loss = y.mul(&y)?.sum_all()?;
        let value = loss.item()?;
        loss.backward()?;
        let mut all = grads(&ps);
        all.extend(grads(std::slice::from_ref(&x)));
        Ok((all, value))
    };
    let (plain, v0) = run(None)?;
    for segments in [1, 2, 3, 4] {
        let (ckpt, v1) = run(Some(segments))?;
        assert_eq!(v0, v1);
        for (a, b) in plain.iter().zip(&ckpt) {
            assert_eq!(a.len(), b.len());
            assert!(!a.is_empty());
            for (p, q) in a.iter().zip(b) {
                assert!((p - q).abs() <= 1e-12, "{segments} segments: {p} vs {q}");
            }
        }
    }
    // With a different seed the masks differ, so gradients must too (the
    // comparison above is not vacuous).
    manual_seed(7);
    for p in &ps {
        p.zero_grad(true)?;
    }
    let y = ls.iter().try_fold(x.clone(), |h, l| l(&h))?;
    y.mul(&y)?.sum_all()?.backward()?;
    assert_ne!(grads(&ps)[0], plain[0]);
    Ok(())
}

#[test]
fn checkpoint_lowers_peak_memory() -> Result<()> {
    let dev = cpu(6);
    let ps = params(16, 64, dev, DType::F32);
    let x = Var::new(filled(&[256, 64], dev, 0.1, DType::F32));
    let ls = layers(&ps, 0.0);
    let mut peaks = Vec::new();
    let mut grads_seen = Vec::new();
    for segments in [None, Some(4)] {
        for p in &ps {
            p.zero_grad(true)?;
        }
        let base = memory::allocated(dev)?;
        memory::reset_peak(dev)?;
        let y = match segments {
            Some(s) => checkpoint_sequential(&ls, s, &x)?,
            None => ls.iter().try_fold(x.clone(), |h, l| l(&h))?,
        };
        let saved = y.graph_stats().saved_bytes;
        y.mean_all()?.backward()?;
        drop(y);
        peaks.push((memory::max_allocated(dev)? - base, saved));
        grads_seen.push(grads(&ps[..1])[0].clone());
    }
    assert!(peaks[1].0 < peaks[0].0, "peak with checkpoint {} vs without {}", peaks[1].0, peaks[0].0);
    assert!(peaks[1].1 * 2 < peaks[0].1, "saved with checkpoint {} vs without {}", peaks[1].1, peaks[0].1);
    assert_eq!(grads_seen[0], grads_seen[1]);
    Ok(())
}

#[test]
fn a_recomputation_that_differs_is_an_error() -> Result<()> {
    let w = Var::param(filled(&[4], cpu(0), 0.0, DType::F64))?;
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let w2 = w.clone();
    let y = checkpoint(
        move |xs: &[Var]| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let h = xs[0].mul(&w2)?;
            if n == 0 {
                Ok(h)
            } else {
                h.narrow(0, 0, 2)
            }
        },
        &[&Var::param(filled(&[4], cpu(0), 1.0, DType::F64))?],
    )?;
    let err = y.sum_all()?.backward().unwrap_err();
    assert!(matches!(err, AutogradError::CheckpointMismatch(_)), "{err:?}");
    // The variant says no more: the message names both shapes.
    assert!(err.to_string().contains("[4]") && err.to_string().contains("[2]"), "{err}");
    Ok(())
}

#[test]
fn parameters_get_gradients_when_the_input_does_not_require_grad() -> Result<()> {
    let w = Var::param(filled(&[3], cpu(0), 0.0, DType::F64))?;
    let x = Var::new(filled(&[3], cpu(0), 2.0, DType::F64));
    let w2 = w.clone();
    let y = checkpoint(move |xs: &[Var]| xs[0].mul(&w2)?.exp(), &[&x])?;
    assert!(y.requires_grad());
    y.sum_all()?.backward()?;
    let expected = x.tensor().mul(w.tensor())?.exp()?.mul(x.tensor())?.to_vec::<f64>()?;
    assert_eq!(w.grad().map(|g| g.to_vec::<f64>()).transpose()?, Some(expected));
    Ok(())
}

#[test]
fn segment_rule_and_bad_segment_counts() -> Result<()> {
    let ps = params(5, 3, cpu(0), DType::F64);
    let x = Var::param(filled(&[2, 3], cpu(0), 0.3, DType::F64))?;
    let ls = layers(&ps, 0.0);
    assert!(checkpoint_sequential(&ls, 0, &x).is_err());
    assert!(checkpoint_sequential(&ls, 6, &x).is_err());
    // 5 layers in 2 segments: size 2; one checkpoint of 2 layers, then 3 plain layers.
    let y = checkpoint_sequential(&ls, 2, &x)?;
    let mut node_names = 0;
    let mut h = y.clone();
    while let Some(name) = h.grad_fn_name() {
        node_names += 1;
        if name == "checkpoint" {
            break;
        }
        h = h.detach();
    }
    assert_eq!(node_names, 1);
    assert_eq!(y.grad_fn_name(), Some("tanh"));
    // 3 plain layers of linear + dropout(p = 0: identity) + tanh = 2 nodes each, plus the checkpoint node.
    assert_eq!(y.graph_stats().nodes, 3 * 2 + 1);
    Ok(())
}

/// `leaves_reached` (what data-parallel training asks after forward) sees
/// through a checkpoint: the parameters its function uses get gradients in
/// backward (from the recomputation), so they are reached; one it does not
/// use is not.
#[test]
fn leaves_reached_sees_the_parameters_a_checkpoint_uses() -> Result<()> {
    use brasa_autograd::leaves_reached;
    let w = Var::param(Tensor::from_vec(vec![2.0f64, 3.0], [2])?)?;
    let inner = Var::param(Tensor::from_vec(vec![5.0f64], [1])?)?;
    let unused = Var::param(Tensor::from_vec(vec![7.0f64], [1])?)?;
    let x = Var::new(Tensor::from_vec(vec![1.0f64, 1.0], [2])?);
    let (w2, inner2) = (w.clone(), inner.clone());
    // Nested: a checkpoint inside the checkpointed function.
    let y = checkpoint(
        move |xs| {
            let inner3 = inner2.clone();
            let h = checkpoint(move |ys| ys[0].mul(&inner3), &[&xs[0]])?;
            h.mul(&w2)
        },
        &[&x],
    )?;
    let loss = y.sum_all()?;
    let leaves = [w.clone(), inner.clone(), unused.clone()];
    assert_eq!(leaves_reached(&[&loss], &leaves), [true, true, false]);
    loss.backward()?;
    let got: Vec<bool> = leaves.iter().map(|l| l.grad().is_some()).collect();
    assert_eq!(got, [true, true, false], "reached means it gets a gradient");
    Ok(())
}
