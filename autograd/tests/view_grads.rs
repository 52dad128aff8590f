//! Gradients of views that cover part of their input (`narrow`, `slice`,
//! `select`, and through them `split`, `chunk` and `unbind`): the engine
//! places each view's gradient in one gradient of the input it owns, so
//! these tests check the values in every order in which pieces and whole
//! gradients can meet, that gradients others hold are never written, and
//! that a split's backward allocates one gradient of the input, not one
//! per piece.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, Result, Var};
use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};

/// Two host devices, set before any test makes a tensor (tests run in
/// parallel): the memory test measures on its own, `cpu:1`.
fn host_devices() {
    set_host_device_count(2).expect("host devices");
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn grad_of(v: &Var) -> Vec<f64> {
    values(&v.grad().expect("a gradient"))
}

fn arange(n: usize, dims: &[usize]) -> Var {
    Var::param(
        Tensor::arange(0.0, n as f64, 1.0, DType::F64)
            .unwrap()
            .reshape(&dims.iter().map(|&d| d as isize).collect::<Vec<_>>())
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn split_pieces_weighted_unused_and_overlapping() -> Result<()> {
    host_devices();
    // x = [0..6]; pieces of 2: weights 1, (unused), 3; an overlapping narrow
    // adds 10 on elements 1..4.
    let x = arange(6, &[6]);
    let pieces = x.split(2, 0)?;
    let overlap = x.narrow(0, 1, 3)?;
    let loss =
        pieces[0].sum_all()?.add(&pieces[2].mul_scalar(3.0)?.sum_all()?)?.add(&overlap.mul_scalar(10.0)?.sum_all()?)?;
    loss.backward()?;
    assert_eq!(grad_of(&x), [1.0, 11.0, 10.0, 10.0, 3.0, 3.0]);
    Ok(())
}

#[test]
fn pieces_meet_whole_gradients_in_either_order() -> Result<()> {
    host_devices();
    // The input is also used whole: its gradient arrives as a whole tensor
    // before the pieces (the whole use is recorded last, so it runs first)
    // and after them (recorded first).
    for whole_first in [false, true] {
        let x = arange(8, &[2, 4]);
        let whole = |x: &Var| x.mul_scalar(2.0)?.sum_all();
        let parts = |x: &Var| -> Result<Var> {
            let [a, b] = <[Var; 2]>::try_from(x.chunk(2, 1)?).unwrap();
            a.mul_scalar(5.0)?.sum_all()?.add(&b.sum_all()?)
        };
        let loss = if whole_first { parts(&x)?.add(&whole(&x)?)? } else { whole(&x)?.add(&parts(&x)?)? };
        loss.backward()?;
        assert_eq!(grad_of(&x), [7.0, 7.0, 3.0, 3.0, 7.0, 7.0, 3.0, 3.0], "whole first: {whole_first}");
    }
    Ok(())
}

#[test]
fn a_gradient_held_elsewhere_is_not_written() -> Result<()> {
    host_devices();
    // h's gradient comes whole from a reshape (a view of its consumer's
    // gradient, which `retain_grad` on `u` also keeps) and in part from a
    // narrow: the narrow's part must go into a copy.
    let x = arange(6, &[6]);
    let h = x.mul_scalar(1.0)?;
    let u = h.reshape(&[2, 3])?;
    u.retain_grad()?;
    let w = Var::new(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?);
    let loss = u.mul(&w)?.sum_all()?.add(&h.narrow(0, 0, 2)?.mul_scalar(100.0)?.sum_all()?)?;
    loss.backward()?;
    assert_eq!(grad_of(&x), [101.0, 102.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(grad_of(&u), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "u's retained gradient was written into");
    Ok(())
}

#[test]
fn select_slice_and_unbind_place_their_gradients() -> Result<()> {
    host_devices();
    let x = arange(12, &[3, 4]);
    let rows = x.select(0, 0)?.mul_scalar(2.0)?.sum_all()?.add(&x.select(0, 2)?.sum_all()?)?;
    let every_other = x.slice(1, 1, 4, 2)?.mul_scalar(10.0)?.sum_all()?;
    rows.add(&every_other)?.backward()?;
    assert_eq!(grad_of(&x), [2.0, 12.0, 2.0, 12.0, 0.0, 10.0, 0.0, 10.0, 1.0, 11.0, 1.0, 11.0]);
    Ok(())
}

#[test]
fn a_narrow_of_a_half_input_gets_a_gradient_in_its_dtype() -> Result<()> {
    host_devices();
    let x = Var::param(Tensor::ones([4], DType::BF16)?)?;
    let a = x.narrow(0, 0, 2)?.to_dtype(DType::F32)?;
    let b = x.narrow(0, 1, 3)?.to_dtype(DType::F32)?.mul_scalar(0.5)?;
    a.sum_all()?.add(&b.sum_all()?)?.backward()?;
    let g = x.grad().expect("a gradient");
    assert_eq!(g.dtype(), DType::BF16);
    assert_eq!(values(&g), [1.0, 1.5, 0.5, 0.5]);
    Ok(())
}

#[test]
fn gradcheck_of_pieces_recombined() -> Result<()> {
    host_devices();
    let x = Tensor::from_vec((0..24).map(|i| (i as f64 * 0.37).sin()).collect::<Vec<_>>(), [2, 3, 4])?;
    // A qkv-like split on the last dim, products of the pieces, a select
    // and a strided slice of the same input, and the input used whole.
    gradcheck(
        |v| {
            let p = v[0].chunk(2, -1)?;
            let mixed = p[0].mul(&p[1])?.add(&v[0].select(1, 1)?.narrow(-1, 1, 2)?.unsqueeze(1)?)?;
            mixed.sum(&[-1], false)?.add(&v[0].slice(2, 0, 4, 3)?.sum(&[-1], false)?)?.mul(&v[0].sum(&[-1], false)?)
        },
        &[x],
        1e-6,
        1e-5,
        1e-5,
    )?;
    Ok(())
}

#[test]
fn a_split_backward_allocates_one_gradient_of_the_input() -> Result<()> {
    host_devices();
    let dev = Device::cpu(1);
    // 3 pieces of [64, 256] f32: 64 KiB each, the input 192 KiB.
    let full_bytes = 64 * 768 * 4;
    let x = Var::param(Tensor::ones_on([64, 768], DType::F32, dev)?)?;
    let pieces = x.chunk(3, -1)?;
    let loss = pieces[0]
        .mul_scalar(1.0)?
        .sum_all()?
        .add(&pieces[1].mul_scalar(2.0)?.sum_all()?)?
        .add(&pieces[2].sum_all()?)?;
    let before = memory::allocated(dev).expect("allocated");
    memory::reset_peak(dev).expect("reset");
    loss.backward()?;
    let peak = memory::max_allocated(dev).expect("peak") - before;
    // One input-sized gradient plus the pieces' own gradients (a third
    // each, at most two alive) and small scalars; a gradient per piece,
    // summed, would hold three input-sized tensors at once.
    assert!(peak < 2 * full_bytes, "backward peaked {peak} bytes above its start; the input is {full_bytes}");
    assert_eq!(values(&x.grad().expect("grad")).iter().sum::<f64>(), 64.0 * 256.0 * 4.0);
    Ok(())
}
