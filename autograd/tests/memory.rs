//! Memory behaviour, asserted with the allocator's statistics on a logical
//! host device per test (tests run in parallel): saved tensors released
//! during backward, nothing left but parameters and gradients, graphs
//! dropped without backward freed, and the running-loss pattern.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{Result, Var};
use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};
use std::sync::{Arc, Mutex};

fn device(index: usize) -> Device {
    set_host_device_count(8).expect("host devices");
    Device::cpu(index)
}

fn allocated(dev: Device) -> usize {
    memory::allocated(dev).expect("allocated")
}

/// Deterministic values (no global generator: tests run in parallel).
fn filled(shape: &[usize], dev: Device, salt: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.37 + salt).sin() * 0.1) as f32).collect();
    Tensor::from_vec_on(values, shape, dev).expect("tensor")
}

/// A 3-layer MLP; all sizes are multiples of 512 bytes, so the allocator's
/// rounding does not blur the sums.
struct Mlp {
    params: Vec<Var>,
}

impl Mlp {
    fn new(dev: Device) -> Mlp {
        let shapes: [&[usize]; 6] = [&[128, 64], &[128], &[128, 128], &[128], &[128, 128], &[128]];
        Mlp { params: shapes.iter().enumerate().map(|(i, s)| Var::param(filled(s, dev, i as f64)).unwrap()).collect() }
    }

    fn forward(&self, x: &Var) -> Result<Var> {
        let mut h = x.clone();
        for layer in self.params.chunks(2) {
            h = h.linear(&layer[0], Some(&layer[1]))?.relu()?;
        }
        h.mean_all()
    }

    fn param_bytes(&self) -> usize {
        self.params.iter().map(|p| p.tensor().storage().size_in_bytes()).sum()
    }
}

#[test]
fn after_backward_only_parameters_and_gradients_remain() -> Result<()> {
    let dev = device(1);
    let base = allocated(dev);
    let mlp = Mlp::new(dev);
    let x = Var::new(filled(&[32, 64], dev, 9.0));
    let before = allocated(dev);
    assert_eq!(before - base, mlp.param_bytes() + 32 * 64 * 4);
    let loss = mlp.forward(&x)?;
    assert!(allocated(dev) > before);
    assert!(loss.graph_stats().saved_bytes > 0);
    loss.backward()?;
    let stats = loss.graph_stats();
    assert_eq!(stats.saved_bytes, 0);
    assert_eq!(stats.released, stats.nodes);
    drop(loss);
    // Parameters + input + one gradient per parameter, nothing else.
    assert_eq!(allocated(dev) - before, mlp.param_bytes());
    let grad_ptrs: Vec<usize> =
        mlp.params.iter().map(|p| Arc::as_ptr(p.grad().expect("grad").storage()) as usize).collect();
    // A second step accumulates in place: no new memory, same storages.
    mlp.forward(&x)?.backward()?;
    assert_eq!(allocated(dev) - before, mlp.param_bytes());
    let again: Vec<usize> =
        mlp.params.iter().map(|p| Arc::as_ptr(p.grad().expect("grad").storage()) as usize).collect();
    assert_eq!(grad_ptrs, again);
    for p in &mlp.params {
        p.zero_grad(true)?;
    }
    assert_eq!(allocated(dev), before);
    Ok(())
}

#[test]
fn saved_tensors_are_released_while_backward_runs() -> Result<()> {
    let dev = device(2);
    let mlp = Mlp::new(dev);
    let x = Var::new(filled(&[64, 64], dev, 1.0));
    let first = x.linear(&mlp.params[0], Some(&mlp.params[1]))?;
    let mut h = first.relu()?;
    for layer in mlp.params[2..].chunks(2) {
        h = h.linear(&layer[0], Some(&layer[1]))?.tanh()?;
    }
    let loss = h.mean_all()?;
    let end_of_forward = allocated(dev);
    let seen = Arc::new(Mutex::new(None));
    let record = Arc::clone(&seen);
    first.register_hook(move |_| {
        *record.lock().unwrap_or_else(|e| e.into_inner()) = Some(allocated(dev));
        Ok(None)
    })?;
    drop((first, h));
    loss.backward()?;
    let during = seen.lock().unwrap_or_else(|e| e.into_inner()).expect("hook ran");
    // By the time the first layer's gradient is computed, the later layers'
    // saved activations are gone (gradients of the later weights exist).
    let later_grads: usize = mlp.params[2..].iter().map(|p| p.tensor().storage().size_in_bytes()).sum();
    assert!(during < end_of_forward + later_grads, "{during} vs {end_of_forward} + {later_grads}");
    Ok(())
}

#[test]
fn a_graph_dropped_without_backward_frees_everything() -> Result<()> {
    let dev = device(3);
    let mlp = Mlp::new(dev);
    let x = Var::new(filled(&[32, 64], dev, 2.0));
    let before = allocated(dev);
    {
        let loss = mlp.forward(&x)?;
        assert!(loss.graph_stats().nodes >= 5);
        assert!(allocated(dev) > before);
    }
    assert_eq!(allocated(dev), before);
    Ok(())
}

#[test]
fn running_loss_as_var_keeps_graphs_alive_but_item_and_detach_do_not() -> Result<()> {
    let dev = device(4);
    let mlp = Mlp::new(dev);
    let x = Var::new(filled(&[32, 64], dev, 3.0));
    let before = allocated(dev);

    // The bug: summing the loss as a Var keeps every iteration's graph.
    let mut running = Var::new(Tensor::zeros_on([], DType::F32, dev)?);
    let mut sizes = Vec::new();
    for _ in 0..3 {
        running = running.add(&mlp.forward(&x)?)?;
        sizes.push((allocated(dev), running.graph_stats()));
    }
    assert!(sizes[2].0 > sizes[1].0 && sizes[1].0 > sizes[0].0);
    assert!(sizes[2].1.saved_bytes > sizes[1].1.saved_bytes && sizes[1].1.saved_bytes > sizes[0].1.saved_bytes);
    assert!(sizes[2].1.nodes > sizes[0].1.nodes * 2);
    drop(running);
    assert_eq!(allocated(dev), before);

    // item(): a number.
    let mut total = 0.0;
    let mut after = Vec::new();
    for _ in 0..3 {
        let loss = mlp.forward(&x)?;
        total += loss.item()?;
        drop(loss);
        after.push(allocated(dev));
    }
    assert!(total.is_finite());
    assert!(after.iter().all(|&a| a == before));

    // detach(): a Var outside the graph.
    let mut running = Var::new(Tensor::zeros_on([], DType::F32, dev)?);
    let mut after = Vec::new();
    for _ in 0..3 {
        running = running.add(&mlp.forward(&x)?.detach())?;
        after.push(allocated(dev));
        assert_eq!(running.graph_stats().nodes, 0);
    }
    assert_eq!(after[0], after[2]);
    Ok(())
}

#[test]
fn retain_graph_keeps_saved_tensors_until_the_last_backward() -> Result<()> {
    let dev = device(5);
    let mlp = Mlp::new(dev);
    let x = Var::new(filled(&[32, 64], dev, 4.0));
    let loss = mlp.forward(&x)?;
    let saved = loss.graph_stats().saved_bytes;
    loss.backward_opts(None, true)?;
    assert_eq!(loss.graph_stats().saved_bytes, saved);
    loss.backward()?;
    assert_eq!(loss.graph_stats().saved_bytes, 0);
    assert!(loss.backward().is_err());
    Ok(())
}
