//! Parameters moved into flat per-bucket buffers (the sharding module's
//! [`FlatLayout`], one per bucket), for ZeRO-1/2: a rank's shard
//! of a bucket is then one contiguous view its optimizer updates in place,
//! and the all-gather after the step writes every rank's shard straight
//! into the parameters the module uses.

use super::layout::FlatLayout;
use crate::error::{ParallelError, Result};
use brasa_autograd::{no_grad, Var};
use brasa_nn::{Module, VisitorMut, WalkMut};
use brasa_tensor::{DType, Tensor};

/// One flat buffer per bucket (same layout as the gradient buckets, padded
/// to a multiple of `world`), holding the parameters' values, and new
/// parameter `Var`s that are views of them.
pub(crate) fn flatten(params: &[Var], assignment: &[Vec<usize>], world: usize) -> Result<(Vec<Var>, Vec<Tensor>)> {
    let _no_grad = no_grad();
    let mut views: Vec<Option<Var>> = vec![None; params.len()];
    let mut flats = Vec::with_capacity(assignment.len());
    for members in assignment {
        let described: Vec<(String, DType, Vec<usize>)> =
            members.iter().map(|&p| (p.to_string(), params[p].dtype(), params[p].dims().to_vec())).collect();
        let layout = FlatLayout::new(&described, world);
        if layout.groups.len() != 1 {
            return Err(ParallelError::invalid("ZeRO", "a bucket holds parameters of more than one dtype"));
        }
        let first = &params[members[0]];
        let flat = Tensor::zeros_on([layout.padded_len(0)], first.dtype(), first.device())?;
        for (&p, slot) in members.iter().zip(&layout.slots) {
            let param = &params[p];
            let dims: Vec<isize> = slot.dims.iter().map(|d| *d as isize).collect();
            let view = flat.narrow(0, slot.offset, slot.numel())?.reshape(&dims)?;
            view.copy_(param.tensor())?;
            views[p] = Some(Var::param(view)?);
        }
        flats.push(flat);
    }
    let views = views
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or_else(|| ParallelError::invalid("ZeRO", format!("parameter {i} is in no bucket"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((views, flats))
}

/// Replaces each of `old` in `module` by the `new` at the same index.
pub(crate) fn replace_parameters<M: Module>(module: &mut M, old: &[Var], new: &[Var]) -> Result<()> {
    struct Replace<'a> {
        old: &'a [Var],
        new: &'a [Var],
        replaced: usize,
    }
    impl VisitorMut for Replace<'_> {
        fn param(&mut self, _path: &str, param: &mut Var) -> brasa_nn::Result<()> {
            if let Some(i) = self.old.iter().position(|o| o.same_var(param)) {
                *param = self.new[i].clone();
                self.replaced += 1;
            }
            Ok(())
        }
    }
    let mut visitor = Replace { old, new, replaced: 0 };
    module.visit_mut(&mut WalkMut::new(&mut visitor))?;
    if visitor.replaced != old.len() {
        return Err(ParallelError::invalid(
            "ZeRO",
            format!(
                "replaced {} of {} parameters in the module (a parameter reachable twice, or not through visit_mut)",
                visitor.replaced,
                old.len()
            ),
        ));
    }
    Ok(())
}
