//! Custom differentiable operations: implement [`Function`] (a forward on
//! tensors that saves what its backward needs, and the backward) and call
//! [`apply`]. This is how users extend brasa with their own layers.

use crate::error::{AutogradError, Result};
use crate::grad_mode::no_grad;
use crate::var::{record, Var};
use brasa_tensor::{DType, Tensor};

/// What a [`Function`]'s forward may keep for its backward.
#[derive(Default)]
pub struct FunctionCtx {
    saved: Vec<Tensor>,
}

impl FunctionCtx {
    /// Keeps `tensor` for backward (it is released after backward ran and
    /// checked for in-place changes before).
    pub fn save_for_backward(&mut self, tensor: &Tensor) {
        self.saved.push(tensor.clone());
    }
}

/// A differentiable operation of several tensors with one output.
///
/// ```
/// use brasa_autograd::{apply, Function, FunctionCtx, Result, Var};
/// use brasa_tensor::{DType, Tensor};
///
/// /// `x³`, by hand.
/// struct Cube;
/// impl Function for Cube {
///     fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> Result<Tensor> {
///         ctx.save_for_backward(&inputs[0]);
///         Ok(inputs[0].powf(3.0)?)
///     }
///     fn backward(&mut self, saved: &[Tensor], grad: &Tensor, _needs: &[bool]) -> Result<Vec<Option<Tensor>>> {
///         Ok(vec![Some(grad.mul(&saved[0].powf(2.0)?.mul_scalar(3.0)?)?)])
///     }
/// }
///
/// let x = Var::param(Tensor::from_vec(vec![2.0f64], [1])?)?;
/// apply(Cube, &[&x])?.sum_all()?.backward()?;
/// assert_eq!(x.grad().unwrap().to_vec::<f64>()?, [12.0]);
/// # Ok::<(), brasa_autograd::AutogradError>(())
/// ```
pub trait Function: Send + 'static {
    /// The name errors and introspection use.
    fn name(&self) -> &'static str {
        "custom_function"
    }

    /// The output, from the input tensors (run without recording a graph).
    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> Result<Tensor>;

    /// One gradient per input (`None` where `needs[i]` is false or there is
    /// none), given the saved tensors and the output's gradient.
    fn backward(&mut self, saved: &[Tensor], grad_output: &Tensor, needs: &[bool]) -> Result<Vec<Option<Tensor>>>;
}

/// Runs `function` on `inputs` and records it so backward calls its backward.
pub fn apply<F: Function>(mut function: F, inputs: &[&Var]) -> Result<Var> {
    let tensors: Vec<Tensor> = inputs.iter().map(|v| v.tensor().clone()).collect();
    let mut ctx = FunctionCtx::default();
    let out = {
        let _g = no_grad();
        function.forward(&mut ctx, &tensors)?
    };
    let name = function.name();
    let meta: Vec<(Vec<usize>, DType)> = inputs.iter().map(|v| (v.dims().to_vec(), v.dtype())).collect();
    Ok(record(
        name,
        inputs,
        out,
        || ctx.saved,
        move |c| {
            let grads = function.backward(c.saved, c.grad, c.needs)?;
            if grads.len() != meta.len() {
                return Err(AutogradError::invalid(
                    name,
                    format!("backward returned {} gradients for {} inputs", grads.len(), meta.len()),
                ));
            }
            grads
                .into_iter()
                .zip(&meta)
                .enumerate()
                .map(|(i, (g, (dims, dtype)))| match g {
                    Some(g) if g.dims() != dims.as_slice() => Err(AutogradError::invalid(
                        name,
                        format!("backward gave input {i} a gradient of shape {:?}, expected {:?}", g.dims(), dims),
                    )),
                    Some(g) if g.dtype() != *dtype => Ok(Some(g.to_dtype(*dtype)?)),
                    other => Ok(other),
                })
                .collect()
        },
    ))
}
