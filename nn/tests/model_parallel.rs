//! Model parallelism by hand, as a PyTorch user writes it: the first half
//! of a model on one device, the second half on another, and
//! `Var::to(device)` between them. Backward carries the gradient back
//! across the move, so both halves get the gradients one device gives.

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa_tensor::{set_host_device_count, Device, Tensor};

fn halves(dev0: Device, dev1: Device) -> brasa_nn::Result<(Sequential, Sequential)> {
    let first = Sequential::new().push(Linear::new(5, 8, dev0)?).push(Relu);
    let second = Sequential::new().push(Linear::new(8, 3, dev1)?);
    for (k, p) in first.parameters().iter().chain(second.parameters().iter()).enumerate() {
        let v: Vec<f32> = (0..p.numel()).map(|i| (((i * 13 + k * 7) % 19) as f32 - 9.0) / 10.0).collect();
        p.tensor().copy_(&Tensor::from_vec_on(v, p.dims().to_vec(), p.device())?)?;
    }
    Ok((first, second))
}

fn grads(model: &Sequential) -> Vec<Vec<f32>> {
    model
        .parameters()
        .iter()
        .map(|p| p.grad().and_then(|g| g.to(Device::cpu(0)).ok()?.to_vec::<f32>().ok()).unwrap_or_default())
        .collect()
}

#[test]
fn two_devices_by_hand_match_one_device() -> brasa_nn::Result<()> {
    set_host_device_count(2)?;
    let (dev0, dev1) = (Device::cpu(0), Device::cpu(1));
    let x: Vec<f32> = (0..20).map(|i| (i as f32 - 10.0) / 7.0).collect();
    let y = vec![0i64, 2, 1, 2];

    // One device.
    let (a, b) = halves(dev0, dev0)?;
    let loss_one = cross_entropy(
        &b.forward(&a.forward(&Var::new(Tensor::from_slice_on(&x, [4, 5], dev0)?))?)?,
        &Tensor::from_slice_on(&y, [4], dev0)?,
    )?;
    loss_one.backward()?;

    // Two devices: the activation moves to dev1, the loss lives there.
    let (first, second) = halves(dev0, dev1)?;
    let hidden = first.forward(&Var::new(Tensor::from_slice_on(&x, [4, 5], dev0)?))?;
    let moved = hidden.to(dev1)?;
    assert_eq!(moved.device(), dev1);
    let loss_two = cross_entropy(&second.forward(&moved)?, &Tensor::from_slice_on(&y, [4], dev1)?)?;
    loss_two.backward()?;

    assert!((loss_one.item()? - loss_two.item()?).abs() < 1e-6);
    // The first half got gradients, on its own device, equal to one device's.
    for p in first.parameters() {
        assert_eq!(p.grad().map(|g| g.device()), Some(dev0));
    }
    for (got, want) in grads(&first).iter().chain(grads(&second).iter()).zip(grads(&a).iter().chain(grads(&b).iter())) {
        assert!(!got.is_empty());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
    // Moving to the device a Var is on is the same Var.
    assert!(hidden.to(dev0)?.same_var(&hidden));
    Ok(())
}
