//! What autograd must refuse rather than accept: gradients of another shape
//! or device (from hooks, `set_grad`, `backward_with`), integer tensors that
//! require grad or carry gradients through a cast, and `retain_grad` on a
//! `Var` no gradient reaches.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{AutogradError, Result, Var};
use brasa_tensor::{set_host_device_count, DType, Device, Tensor};

/// Two logical host devices, asked for by every test before its first tensor.
fn cpu(index: usize) -> Device {
    set_host_device_count(2).expect("every test asks for the same count");
    Device::cpu(index)
}

fn f32s(values: &[f32], dev: Device) -> Tensor {
    Tensor::from_vec_on(values.to_vec(), [values.len()], dev).expect("tensor")
}

#[test]
fn a_hook_returning_another_shape_is_an_error_naming_both() -> Result<()> {
    let dev = cpu(0);
    let x = Var::param(f32s(&[1.0, 2.0], dev))?;
    let c = Var::new(f32s(&[3.0, 4.0], dev));
    let y = x.mul(&c)?;
    // A [1] gradient would broadcast over mul's backward into x.grad.
    y.register_hook(move |_| Ok(Some(Tensor::ones_on([1], DType::F32, dev)?)))?;
    let err = y.sum_all()?.backward().unwrap_err();
    match &err {
        AutogradError::GradShape { got, expected, .. } => {
            assert_eq!((got.as_slice(), expected.as_slice()), (&[1][..], &[2][..]));
        }
        other => panic!("expected GradShape, got {other:?}"),
    }
    assert!(matches!(err, AutogradError::GradShape { context: "the hook returned", .. }), "{err:?}");
    assert!(x.grad().is_none(), "nothing reached the leaf");
    Ok(())
}

#[test]
fn a_hook_changing_the_dtype_is_an_error() -> Result<()> {
    let x = Var::param(f32s(&[1.0, 2.0], cpu(0)))?;
    let y = x.mul_scalar(2.0)?;
    y.register_hook(|g| Ok(Some(g.to_dtype(DType::F64)?)))?;
    let err = y.sum_all()?.backward().unwrap_err();
    assert!(matches!(err, AutogradError::GradDtype { got: DType::F64, expected: DType::F32, .. }), "{err}");
    Ok(())
}

#[test]
fn a_gradient_on_another_device_never_becomes_the_leafs_grad() -> Result<()> {
    let (home, away) = (cpu(0), cpu(1));
    let x = Var::param(f32s(&[1.0, 2.0], home))?;
    x.register_hook(move |g| Ok(Some(g.to(away)?)))?;
    let err = x.mul_scalar(2.0)?.sum_all()?.backward().unwrap_err();
    assert!(
        matches!(err, AutogradError::GradDevice { got, expected, .. } if got == away && expected == home),
        "{err:?}"
    );
    assert!(x.grad().is_none());

    // Nor through set_grad or an output gradient.
    let w = Var::param(f32s(&[1.0, 2.0], home))?;
    assert!(matches!(w.set_grad(Some(f32s(&[1.0, 1.0], away))), Err(AutogradError::GradDevice { .. })));
    assert!(w.grad().is_none());
    let y = w.mul_scalar(3.0)?;
    let err = y.backward_with(&f32s(&[1.0, 1.0], away)).unwrap_err();
    assert!(matches!(err, AutogradError::GradDevice { .. }), "{err}");
    Ok(())
}

#[test]
fn set_grad_refuses_another_shape_or_dtype() -> Result<()> {
    let w = Var::param(f32s(&[1.0, 2.0], cpu(0)))?;
    let err = w.set_grad(Some(Tensor::ones([1], DType::F32)?)).unwrap_err();
    assert!(matches!(&err, AutogradError::GradShape { got, expected, .. } if got == &[1] && expected == &[2]), "{err}");
    let err = w.set_grad(Some(Tensor::ones([2], DType::F64)?)).unwrap_err();
    assert!(matches!(err, AutogradError::GradDtype { .. }), "{err}");
    assert!(w.grad().is_none(), "a refused gradient is not set");
    w.set_grad(Some(Tensor::ones([2], DType::F32)?))?;
    w.set_grad(None)?;
    assert!(w.grad().is_none());
    Ok(())
}

#[test]
fn integer_tensors_cannot_require_grad() -> Result<()> {
    let _ = cpu(0);
    for t in [Tensor::zeros([2], DType::I64)?, Tensor::zeros([2], DType::U8)?, Tensor::zeros([2], DType::Bool)?] {
        let dtype = t.dtype();
        let err = Var::param(t.clone()).unwrap_err();
        assert!(matches!(err, AutogradError::RequiresGradDtype { dtype: d, .. } if d == dtype), "{err:?}");
        // PyTorch's rule, in words.
        assert!(err.to_string().contains("floating-point"), "{err}");
        assert!(Var::from_tensor(t.clone(), true).is_err());
        assert!(!Var::from_tensor(t.clone(), false)?.requires_grad());
        assert!(Var::new(t).requires_grad_(true).is_err());
    }
    Ok(())
}

#[test]
fn a_cast_to_an_integer_dtype_cuts_the_graph() -> Result<()> {
    let x = Var::param(f32s(&[1.5, 2.5], cpu(0)))?;
    let ints = x.to_dtype(DType::I64)?;
    assert!(!ints.requires_grad() && ints.is_leaf(), "{ints:?}");
    let back = ints.to_dtype(DType::F32)?;
    assert!(!back.requires_grad());
    assert!(matches!(back.sum_all()?.backward(), Err(AutogradError::NoGraph(_))));
    assert!(x.grad().is_none());
    // A float-to-float cast still carries the gradient.
    x.to_dtype(DType::F64)?.sum_all()?.backward()?;
    assert_eq!(x.grad().map(|g| g.to_vec::<f32>()).transpose()?, Some(vec![1.0, 1.0]));
    Ok(())
}

#[test]
fn retain_grad_on_a_var_without_grad_is_an_error() -> Result<()> {
    let c = Var::new(f32s(&[1.0], cpu(0)));
    let err = c.retain_grad().unwrap_err();
    assert!(matches!(err, AutogradError::Invalid { op: "retain_grad", .. }), "{err:?}");
    // The variant says no more: PyTorch's reason.
    assert!(err.to_string().contains("requires_grad=false"), "{err}");
    let d = c.exp()?;
    assert!(d.retain_grad().is_err(), "a result of inputs that need no grad");
    // Leaves that require grad and non-leaves still accept it.
    let w = Var::param(f32s(&[1.0], cpu(0)))?;
    w.retain_grad()?;
    let y = w.exp()?;
    y.retain_grad()?;
    y.sum_all()?.backward()?;
    assert!(y.grad().is_some() && w.grad().is_some());
    Ok(())
}
