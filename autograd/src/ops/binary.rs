//! Elementwise functions of two `Var`s with broadcasting: each gradient is
//! summed back to its input's shape and converted to its input's dtype.

use super::{mask_as, sum_to};
use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::Tensor;

/// Shapes and dtypes of two operands, for the backward.
fn meta(a: &Var, b: &Var) -> (Vec<usize>, brasa_tensor::DType, Vec<usize>, brasa_tensor::DType) {
    (a.dims().to_vec(), a.dtype(), b.dims().to_vec(), b.dtype())
}

impl Var {
    /// `self + rhs` (broadcasting).
    pub fn add(&self, rhs: &Var) -> Result<Var> {
        let out = self.tensor().add(rhs.tensor())?;
        let (ad, at, bd, bt) = meta(self, rhs);
        Ok(record("add", &[self, rhs], out, Vec::new, move |c| {
            Ok(vec![
                c.needs(0).then(|| sum_to(c.grad, &ad, at)).transpose()?,
                c.needs(1).then(|| sum_to(c.grad, &bd, bt)).transpose()?,
            ])
        }))
    }

    /// `self - rhs` (broadcasting).
    pub fn sub(&self, rhs: &Var) -> Result<Var> {
        let out = self.tensor().sub(rhs.tensor())?;
        let (ad, at, bd, bt) = meta(self, rhs);
        Ok(record("sub", &[self, rhs], out, Vec::new, move |c| {
            Ok(vec![
                c.needs(0).then(|| sum_to(c.grad, &ad, at)).transpose()?,
                c.needs(1).then(|| sum_to(&c.grad.neg()?, &bd, bt)).transpose()?,
            ])
        }))
    }

    /// `self * rhs` (broadcasting).
    pub fn mul(&self, rhs: &Var) -> Result<Var> {
        let out = self.tensor().mul(rhs.tensor())?;
        let (ad, at, bd, bt) = meta(self, rhs);
        let saved = || vec![self.tensor().clone(), rhs.tensor().clone()];
        Ok(record("mul", &[self, rhs], out, saved, move |c| {
            let (a, b) = (&c.saved[0], &c.saved[1]);
            Ok(vec![
                c.needs(0).then(|| sum_to(&c.grad.mul(b)?, &ad, at)).transpose()?,
                c.needs(1).then(|| sum_to(&c.grad.mul(a)?, &bd, bt)).transpose()?,
            ])
        }))
    }

    /// `self / rhs` (broadcasting).
    pub fn div(&self, rhs: &Var) -> Result<Var> {
        let out = self.tensor().div(rhs.tensor())?;
        let (ad, at, bd, bt) = meta(self, rhs);
        let saved = || vec![self.tensor().clone(), rhs.tensor().clone()];
        Ok(record("div", &[self, rhs], out, saved, move |c| {
            let (a, b) = (&c.saved[0], &c.saved[1]);
            let ga = c.needs(0).then(|| sum_to(&c.grad.div(b)?, &ad, at)).transpose()?;
            let gb = c.needs(1).then(|| sum_to(&c.grad.mul(a)?.div(&b.mul(b)?)?.neg()?, &bd, bt)).transpose()?;
            Ok(vec![ga, gb])
        }))
    }

    /// `self ^ rhs` elementwise (broadcasting); the exponent's gradient uses
    /// `ln(self)`, so it needs a positive base.
    pub fn pow(&self, rhs: &Var) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::POW, &[self, rhs])? {
            return c[0].pow(&c[1]);
        }
        let out = self.tensor().pow(rhs.tensor())?;
        let (ad, at, bd, bt) = meta(self, rhs);
        let keep = out.clone();
        let saved = || vec![self.tensor().clone(), rhs.tensor().clone(), keep];
        Ok(record("pow", &[self, rhs], out, saved, move |c| {
            let (a, b, y) = (&c.saved[0], &c.saved[1], &c.saved[2]);
            let ga =
                c.needs(0).then(|| sum_to(&c.grad.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)?, &ad, at)).transpose()?;
            let gb = c.needs(1).then(|| sum_to(&c.grad.mul(&y.mul(&a.log()?)?)?, &bd, bt)).transpose()?;
            Ok(vec![ga, gb])
        }))
    }

    /// The larger of each pair; on ties each side gets half the gradient.
    pub fn maximum(&self, rhs: &Var) -> Result<Var> {
        self.extreme(rhs, true)
    }

    /// The smaller of each pair; on ties each side gets half the gradient.
    pub fn minimum(&self, rhs: &Var) -> Result<Var> {
        self.extreme(rhs, false)
    }

    fn extreme(&self, rhs: &Var, max: bool) -> Result<Var> {
        let out = if max { self.tensor().maximum(rhs.tensor())? } else { self.tensor().minimum(rhs.tensor())? };
        let (ad, at, bd, bt) = meta(self, rhs);
        let saved = || vec![self.tensor().clone(), rhs.tensor().clone()];
        let name = if max { "maximum" } else { "minimum" };
        Ok(record(name, &[self, rhs], out, saved, move |c| {
            let (a, b) = (&c.saved[0], &c.saved[1]);
            let dtype = c.grad.dtype();
            let (wins, loses) = if max { (a.gt(b)?, a.lt(b)?) } else { (a.lt(b)?, a.gt(b)?) };
            let tie = mask_as(&a.eq(b)?, dtype)?.mul_scalar(0.5)?;
            let wa = mask_as(&wins, dtype)?.add(&tie)?;
            let wb = mask_as(&loses, dtype)?.add(&tie)?;
            Ok(vec![
                c.needs(0).then(|| sum_to(&c.grad.mul(&wa)?, &ad, at)).transpose()?,
                c.needs(1).then(|| sum_to(&c.grad.mul(&wb)?, &bd, bt)).transpose()?,
            ])
        }))
    }

    /// `on_true` where the bool tensor `cond` is true, else `on_false`
    /// (`torch.where`; all three broadcast together).
    pub fn where_cond(cond: &Tensor, on_true: &Var, on_false: &Var) -> Result<Var> {
        let out = cond.where_cond(on_true.tensor(), on_false.tensor())?;
        let (ad, at, bd, bt) = meta(on_true, on_false);
        let cond = cond.clone();
        Ok(record(
            "where_cond",
            &[on_true, on_false],
            out,
            || vec![cond],
            move |c| {
                let cond = &c.saved[0];
                let zero = c.grad.new_zeros([])?;
                Ok(vec![
                    c.needs(0).then(|| sum_to(&cond.where_cond(c.grad, &zero)?, &ad, at)).transpose()?,
                    c.needs(1).then(|| sum_to(&cond.where_cond(&zero, c.grad)?, &bd, bt)).transpose()?,
                ])
            },
        ))
    }
}
