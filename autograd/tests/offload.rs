//! Saved-tensor hooks and activation offload, on logical host devices (one
//! per test: tests run in parallel): gradients bit for bit those without
//! offload, a lower device peak, pinned buffers returned, hooks nesting,
//! errors as values, nothing packed without a graph.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{
    checkpoint, no_grad, save_on_host, save_on_host_with, saved_tensors_hooks, AutogradError, OffloadOptions, Packed,
    Result, SavedTensorHookStage, Var,
};
use brasa_tensor::{memory, set_host_device_count, Conv2dParams, DType, Device, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

fn device(index: usize) -> Device {
    set_host_device_count(12).expect("host devices");
    Device::cpu(index)
}

/// The pinned pool is the process's: tests that read its statistics take turns.
static PINNED: Mutex<()> = Mutex::new(());

fn pinned_turn() -> MutexGuard<'static, ()> {
    device(0); // the count, before any tensor
    PINNED.lock().unwrap_or_else(|e| e.into_inner())
}

fn pinned_bytes() -> i64 {
    memory::pinned_stats().expect("pinned stats").allocated_bytes.all.current
}

/// Whether this machine lets the process pin memory at all (locked memory
/// may be capped to nothing): the tests of pinned buffers say so and skip.
fn pinning_works() -> bool {
    match Tensor::zeros([256], DType::F32).and_then(|t| t.pin_memory()) {
        Ok(_) => true,
        Err(error) => {
            eprintln!("skipped: pinned memory is not available here ({error})");
            false
        }
    }
}

/// Deterministic values (no global generator: tests run in parallel).
fn filled(shape: &[usize], dev: Device, salt: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.37 + salt).sin() * 0.3) as f32).collect();
    Tensor::from_vec_on(values, shape, dev).expect("tensor")
}

fn param(shape: &[usize], dev: Device, salt: f64) -> Var {
    Var::param(filled(shape, dev, salt)).expect("param")
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().expect("values").into_iter().map(f32::to_bits).collect()
}

/// A small network of the ops an MLP and a CNN are made of: a convolution,
/// matrix products (one of them on a transposed activation), bias adds,
/// relu and softmax.
struct Net {
    params: Vec<Var>,
    x: Var,
    target: Var,
}

impl Net {
    fn new(dev: Device) -> Net {
        let shapes: [&[usize]; 7] = [&[4, 2, 3, 3], &[4], &[256, 64], &[64], &[64, 64], &[64], &[64, 10]];
        let params = shapes.iter().enumerate().map(|(i, s)| param(s, dev, i as f64)).collect();
        Net { params, x: Var::new(filled(&[16, 2, 8, 8], dev, 7.0)), target: Var::new(filled(&[16, 10], dev, 8.0)) }
    }

    fn forward(&self) -> Result<Var> {
        let p = &self.params;
        let conv = Conv2dParams { padding: (1, 1), ..Conv2dParams::default() };
        let h = self.x.conv2d(&p[0], Some(&p[1]), conv)?.relu()?.reshape(&[16, 256])?;
        let h = h.matmul(&p[2])?.add(&p[3])?.relu()?;
        // `[out, in] · hᵀ`: matmul saves a transposed activation.
        let h = p[4].matmul(&h.transpose(0, 1)?)?.transpose(0, 1)?.add(&p[5])?.relu()?;
        h.matmul(&p[6])?.softmax(-1)?.mul(&self.target)?.mean_all()
    }

    fn grads(&self) -> Vec<Vec<u32>> {
        self.params.iter().map(|p| bits(&p.grad().expect("a gradient"))).collect()
    }
}

#[test]
fn gradients_are_bit_for_bit_those_without_offload() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    let dev = device(1);
    let net = Net::new(dev);
    let plain = net.forward()?;
    let plain_saved = plain.graph_stats().saved_bytes;
    plain.backward()?;
    let expected = net.grads();
    for p in &net.params {
        p.zero_grad(true)?;
    }

    let before = pinned_bytes();
    let offloaded = {
        let _offload = save_on_host();
        net.forward()?
    };
    // It did offload: the graph holds less, the pinned pool holds the rest.
    assert!(pinned_bytes() >= before + (32 << 10), "{} pinned bytes", pinned_bytes() - before);
    assert!(offloaded.graph_stats().saved_bytes + (32 << 10) <= plain_saved);
    offloaded.backward()?;
    assert_eq!(net.grads(), expected);

    // A retained graph unpacks again: two backwards give twice the gradients, as without offload.
    let run_twice = |offload: bool| -> Result<Vec<Vec<u32>>> {
        for p in &net.params {
            p.zero_grad(true)?;
        }
        let loss = {
            let _offload = offload.then(save_on_host);
            net.forward()?
        };
        loss.backward_opts(None, true)?;
        loss.backward()?;
        Ok(net.grads())
    };
    assert_eq!(run_twice(true)?, run_twice(false)?);
    Ok(())
}

#[test]
fn checkpointed_segments_under_offload_give_the_same_gradients() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    let dev = device(2);
    let w = param(&[64, 64], dev, 1.0);
    let x = Var::new(filled(&[32, 64], dev, 2.0));
    let run = |offload: bool| -> Result<Vec<u32>> {
        w.zero_grad(true)?;
        let loss = {
            let _offload = offload.then(save_on_host);
            let w = w.clone();
            let h = checkpoint(move |xs: &[Var]| xs[0].matmul(&w)?.relu()?.matmul(&w), &[&x])?;
            h.relu()?.mean_all()?
        };
        loss.backward()?;
        Ok(bits(&w.grad().expect("a gradient")))
    };
    assert_eq!(run(true)?, run(false)?);
    Ok(())
}

/// `layers` linear layers of `width` on a batch: forward, backward, and the
/// device's peak above what it held before (parameters and the batch).
fn mlp_peak(dev: Device, offload: bool, layers: usize, width: usize, batch: usize) -> Result<(usize, Vec<Vec<u32>>)> {
    let params: Vec<Var> = (0..layers).map(|i| param(&[width, width], dev, i as f64)).collect();
    let x = Var::new(filled(&[batch, width], dev, 0.5));
    memory::reset_peak(dev)?;
    let base = memory::allocated(dev)?;
    let loss = {
        let _offload = offload.then(save_on_host);
        let mut h = x.clone();
        for w in &params {
            h = h.matmul(w)?.relu()?;
        }
        h.mean_all()?
    };
    loss.backward()?;
    let peak = memory::max_allocated(dev)? - base;
    Ok((peak, params.iter().map(|p| bits(&p.grad().expect("a gradient"))).collect()))
}

#[test]
fn device_peak_is_lower_with_save_on_host() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    // Activations (16 × 64 KiB saved) well above parameters (16 × 4 KiB).
    let (plain, plain_grads) = mlp_peak(device(3), false, 16, 32, 512)?;
    let (offloaded, grads) = mlp_peak(device(4), true, 16, 32, 512)?;
    assert_eq!(grads, plain_grads);
    assert!(plain >= 16 * (64 << 10), "{plain}");
    assert!(offloaded * 2 < plain, "peak {offloaded} bytes offloaded, {plain} without");
    Ok(())
}

#[test]
fn pinned_buffers_are_returned() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    let dev = device(5);
    let net = Net::new(dev);
    // Parameters, inputs and gradients: what a device holds between steps.
    net.forward()?.backward()?;
    let held = memory::allocated(dev)?;
    let base = pinned_bytes();
    let forward = || -> Result<Var> {
        let _offload = save_on_host();
        net.forward()
    };

    let loss = forward()?;
    assert!(pinned_bytes() > base);
    loss.backward()?;
    // Each node's host copies went with its saved tensors, during backward.
    assert_eq!(pinned_bytes(), base);
    drop(loss);

    // A graph dropped without backward returns them too.
    let loss = forward()?;
    assert!(pinned_bytes() > base);
    drop(loss);
    assert_eq!(pinned_bytes(), base);

    // A retained graph keeps them until its last backward.
    let loss = forward()?;
    loss.backward_opts(None, true)?;
    assert!(pinned_bytes() > base);
    loss.backward()?;
    assert_eq!(pinned_bytes(), base);
    drop(loss);
    // Gradients accumulated in place; no copy brought back for backward stayed.
    assert_eq!(memory::allocated(dev)?, held);
    Ok(())
}

#[test]
fn parameters_host_tensors_and_tiny_tensors_stay_where_they_are() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    let base = pinned_bytes();
    let _offload = save_on_host();
    // A parameter, on a logical device: kept.
    let w = param(&[32, 32], device(6), 1.0);
    let y = w.mul(&w)?;
    assert_eq!(y.graph_stats().saved_bytes, 32 * 32 * 4);
    // On cpu:0, the pinned pool's device: kept.
    let x = Var::new(filled(&[32, 32], Device::CPU, 2.0));
    let v = param(&[32, 32], Device::CPU, 3.0);
    let z = x.mul(&v)?;
    assert_eq!(z.graph_stats().saved_bytes, 2 * 32 * 32 * 4);
    // Tiny: kept, under min_bytes.
    let t = Var::new(filled(&[8], device(6), 4.0));
    let s = t.mul(&param(&[8], device(6), 5.0))?;
    assert_eq!(s.graph_stats().saved_bytes, 2 * 8 * 4);
    assert_eq!(pinned_bytes(), base);
    // The same tiny tensor with a lower threshold goes.
    let _all = save_on_host_with(OffloadOptions { min_bytes: 0, ..OffloadOptions::default() });
    let s = t.mul(&param(&[8], device(6), 5.0))?;
    assert_eq!(s.graph_stats().saved_bytes, 8 * 4);
    assert!(pinned_bytes() > base);
    Ok(())
}

#[test]
fn a_tensor_saved_by_several_operations_is_copied_once() -> Result<()> {
    let _turn = pinned_turn();
    if !pinning_works() {
        return Ok(());
    }
    let dev = device(11);
    let w = param(&[64, 64], dev, 1.0);
    let base = pinned_bytes();
    let _offload = save_on_host();
    // relu saves its output; matmul saves it twice more.
    let h = w.relu()?;
    let y = h.matmul(&h)?;
    assert_eq!(pinned_bytes() - base, 64 * 64 * 4);
    // Changed in place since: a new copy (backward would refuse the old one).
    h.tensor().add_scalar_(0.0)?;
    let z = h.mul(&w)?.sum_all()?;
    assert_eq!(pinned_bytes() - base, 2 * 64 * 64 * 4);
    // The first copy goes with the last node holding it (relu's, behind `h`).
    drop((y, z));
    assert_eq!(pinned_bytes() - base, 64 * 64 * 4);
    drop(h);
    assert_eq!(pinned_bytes(), base);
    Ok(())
}

#[test]
fn pageable_offload_and_in_place_changes_are_still_refused() -> Result<()> {
    let dev = device(7);
    let x = param(&[64, 64], dev, 1.0);
    let c = Var::new(filled(&[64, 64], dev, 2.0));
    let pageable = OffloadOptions { pin_memory: false, ..OffloadOptions::default() };
    let grad = |offload: bool| -> Result<Vec<u32>> {
        x.zero_grad(true)?;
        let y = {
            let _offload = offload.then(|| save_on_host_with(pageable));
            x.mul(&c)?.relu()?.sum_all()?
        };
        y.backward()?;
        Ok(bits(&x.grad().expect("a gradient")))
    };
    assert_eq!(grad(true)?, grad(false)?);

    let y = {
        let _offload = save_on_host_with(pageable);
        x.mul(&c)?.sum_all()?
    };
    // Only the parameter stays in the graph; `c`'s copy is in cpu:0's pageable memory.
    assert_eq!(y.graph_stats().saved_bytes, 64 * 64 * 4);
    c.tensor().add_scalar_(1.0)?;
    let err = y.backward().unwrap_err();
    assert!(matches!(err, AutogradError::ModifiedInPlace { op: "mul", version: 1, expected: 0 }), "{err}");
    Ok(())
}

/// Hooks that count their calls and keep each tensor in a box of their own.
struct Counted {
    packs: Arc<AtomicUsize>,
    unpacks: Arc<AtomicUsize>,
}

impl Counted {
    fn new() -> Counted {
        Counted { packs: Arc::new(AtomicUsize::new(0)), unpacks: Arc::new(AtomicUsize::new(0)) }
    }

    fn install(&self) -> brasa_autograd::SavedTensorsHooksGuard {
        let (packs, unpacks) = (Arc::clone(&self.packs), Arc::clone(&self.unpacks));
        saved_tensors_hooks(
            move |t| {
                packs.fetch_add(1, Ordering::Relaxed);
                Ok(Packed::value(t.contiguous()?))
            },
            move |p| {
                unpacks.fetch_add(1, Ordering::Relaxed);
                Ok(Packed::downcast_ref::<Tensor>(p, "counted unpack")?.clone())
            },
        )
    }

    fn counts(&self) -> (usize, usize) {
        (self.packs.load(Ordering::Relaxed), self.unpacks.load(Ordering::Relaxed))
    }
}

#[test]
fn hooks_nest_the_innermost_wins_and_the_packer_unpacks() -> Result<()> {
    let dev = device(8);
    let w = param(&[8, 8], dev, 1.0);
    let (outer, inner) = (Counted::new(), Counted::new());
    let (a, b, c) = {
        let _outer = outer.install();
        let a = w.relu()?; // outer
        let b = {
            let _inner = inner.install();
            a.exp()? // inner
        };
        let c = b.sin()?; // outer again
        (a, b, c)
    };
    assert_eq!(outer.counts(), (2, 0));
    assert_eq!(inner.counts(), (1, 0));
    // Backward, with no hooks alive: each tensor goes back through its packer.
    c.sum_all()?.backward()?;
    assert_eq!(outer.counts(), (2, 2));
    assert_eq!(inner.counts(), (1, 1));
    drop((a, b));
    Ok(())
}

#[test]
fn hooks_are_not_applied_without_a_graph() -> Result<()> {
    let dev = device(9);
    let w = param(&[8, 8], dev, 1.0);
    let x = Var::new(filled(&[8, 8], dev, 2.0));
    let hooks = Counted::new();
    let _g = hooks.install();
    {
        let _no_grad = no_grad();
        w.matmul(&w)?.relu()?;
    }
    x.matmul(&x)?.relu()?; // nothing requires grad
    assert_eq!(hooks.counts(), (0, 0));
    w.matmul(&x)?.relu()?;
    assert_eq!(hooks.counts(), (3, 0));
    Ok(())
}

#[test]
fn hook_errors_are_errors_naming_the_operation() -> Result<()> {
    let dev = device(10);
    let w = param(&[8, 8], dev, 1.0);
    let x = Var::new(filled(&[8, 8], dev, 2.0));

    // Pack: the node keeps nothing, and backward through it is the error.
    let y = {
        let _g = saved_tensors_hooks(
            |_| Err(AutogradError::invalid("my_pack", "no room")),
            |_| Err(AutogradError::invalid("my_unpack", "never called")),
        );
        x.matmul(&w)?
    };
    assert_eq!(y.graph_stats().saved_bytes, 0);
    let err = y.sum_all()?.backward().unwrap_err();
    assert!(
        matches!(&err, AutogradError::SavedTensorHook { op: "matmul", stage: SavedTensorHookStage::Pack, .. }),
        "{err}"
    );
    assert_eq!(err.to_string(), "matmul: the saved-tensor pack hook failed: my_pack: no room");

    // Unpack: backward's error; the graph is kept, as for any failed backward.
    let y = {
        let _g = saved_tensors_hooks(
            |t| Ok(Packed::value(t.clone())),
            |_| Err(AutogradError::invalid("my_unpack", "lost it")),
        );
        x.matmul(&w)?.relu()?
    };
    let err = y.sum_all()?.backward().unwrap_err();
    // The hook's own error is the source, whole.
    assert!(
        matches!(
            &err,
            AutogradError::SavedTensorHook { op: "relu", stage: SavedTensorHookStage::Unpack, source }
                if matches!(&**source, AutogradError::Invalid { op: "my_unpack", message } if message == "lost it")
        ),
        "{err:?}"
    );

    // An unpack that gives back another tensor than was saved.
    let y = {
        let _g = saved_tensors_hooks(|_| Ok(Packed::value(())), |_| Ok(Tensor::zeros([3], DType::F32)?));
        w.relu()?
    };
    let err = y.sum_all()?.backward().unwrap_err();
    assert!(
        matches!(&err, AutogradError::SavedTensorHook { op: "relu", stage: SavedTensorHookStage::Unpack, .. }),
        "{err:?}"
    );
    // The message is the point: both tensors, each with its dtype and device.
    assert!(err.to_string().contains("shape [3] (f32, cpu:0) for one saved as shape [8, 8] (f32, cpu:10)"), "{err}");
    Ok(())
}
