//! The machine that runs a program: a pool of tensors, each op applied to
//! some of them, its result checked and kept.

use crate::checks::*;
use crate::program::*;
use crate::{FLOPS, HOPELESS, POOL, WORK};
use brasa_tensor::{memory, DType, Device, Stream, Tensor};

pub(crate) struct Machine {
    pub(crate) pool: Vec<Tensor>,
}

impl Machine {
    pub(crate) fn get(&self, i: Ix) -> Option<Tensor> {
        if self.pool.is_empty() {
            None
        } else {
            Some(self.pool[usize::from(i) % self.pool.len()].clone())
        }
    }

    pub(crate) fn keep(&mut self, result: brasa_tensor::Result<Tensor>) {
        if let Ok(t) = result {
            check(&t);
            if self.pool.len() >= POOL {
                self.pool.remove(0);
            }
            self.pool.push(t);
        }
    }

    pub(crate) fn keep_all(&mut self, result: brasa_tensor::Result<Vec<Tensor>>) {
        if let Ok(pieces) = result {
            for piece in pieces.into_iter().take(4) {
                self.keep(Ok(piece));
            }
        }
    }

    /// An in-place write: into an expanded view it must fail (silently
    /// writing several values to one memory location is a wrong answer).
    pub(crate) fn in_place(&self, op: &str, target: &Tensor, result: brasa_tensor::Result<()>) {
        if target.layout().has_internal_overlap() {
            assert!(
                result.is_err(),
                "{op} into an expanded view {:?} / {:?} succeeded",
                target.dims(),
                target.strides()
            );
        }
    }

    pub(crate) fn run(&mut self, op: Op) {
        match op {
            Op::New(source) => {
                let t = make(source);
                self.keep(t);
            }
            Op::Drop(i) => {
                if !self.pool.is_empty() {
                    let i = usize::from(i) % self.pool.len();
                    self.pool.remove(i);
                }
            }
            Op::Transpose(i, a, b) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.transpose(a as isize, b as isize));
            }
            Op::T(i) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.t());
            }
            Op::Permute(i, order) => {
                let Some(t) = self.get(i) else { return };
                let order: Vec<usize> = order.iter().take(8).map(|&d| usize::from(d % 8)).collect();
                self.keep(t.permute(&order));
            }
            Op::Narrow(i, dim, start, len) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.narrow(dim as isize, start.0, len.0));
            }
            Op::Select(i, dim, index) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.select(dim as isize, index.0));
            }
            Op::Squeeze(i, dim) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.squeeze(dim as isize));
            }
            Op::Unsqueeze(i, dim) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.unsqueeze(dim as isize));
            }
            Op::Expand(i, shape) => {
                let Some(t) = self.get(i) else { return };
                self.keep(t.expand(shape.0));
            }
            Op::Reshape(i, spec, view) => {
                let Some(t) = self.get(i) else { return };
                let spec: Vec<isize> = spec.iter().take(7).map(|&d| (d % 7) as isize).collect();
                self.reshape(&t, &spec, view);
            }
            Op::ReshapeTo(i, shape, view) => {
                let Some(t) = self.get(i) else { return };
                let spec: Vec<isize> = shape.0.iter().map(|&d| d as isize).collect();
                self.reshape(&t, &spec, view);
            }
            Op::Flatten(i, a, b) => {
                let Some(t) = self.get(i) else { return };
                // Flattening may copy (a non-viewable layout).
                if small(&t) || t.is_contiguous() || t.numel() >= HOPELESS {
                    self.keep(t.flatten(a as isize, b as isize));
                }
            }
            Op::Split(i, size, dim) => {
                let Some(t) = self.get(i) else { return };
                let along = t.dim(dim as isize).unwrap_or(0);
                if size.0 == 0 || along / size.0 <= 64 {
                    self.keep_all(t.split(size.0, dim as isize));
                }
            }
            Op::Chunk(i, chunks, dim) => {
                let Some(t) = self.get(i) else { return };
                if chunks.0 <= 64 {
                    self.keep_all(t.chunk(chunks.0, dim as isize));
                }
            }
            Op::Contiguous(i) => {
                let Some(t) = self.get(i) else { return };
                if t.is_contiguous() || cheap_or_hopeless(t.numel()) {
                    self.keep(t.contiguous());
                }
            }
            Op::ToDtype(i, dtype) => {
                let Some(t) = self.get(i) else { return };
                if cheap_or_hopeless(t.numel()) {
                    let result = t.to_dtype(dtype.get());
                    if let Ok(out) = &result {
                        assert_eq!(out.dtype(), dtype.get());
                        assert_eq!(out.dims(), t.dims());
                    }
                    agrees_with_contiguous(&dtype, &[&t], &result, |c| c[0].to_dtype(dtype.get()));
                    self.keep(result);
                }
            }
            Op::To(i, device) => {
                let Some(t) = self.get(i) else { return };
                if cheap_or_hopeless(t.numel()) {
                    let result = t.to(device.get());
                    if let Ok(out) = &result {
                        assert_eq!(out.device(), device.get());
                    }
                    self.keep(result);
                }
            }
            Op::PinMemory(i) => {
                let Some(t) = self.get(i) else { return };
                // Pinned memory has no limit of ours (only RLIMIT_MEMLOCK).
                if t.numel() <= WORK {
                    self.keep(t.pin_memory());
                }
            }
            Op::Like(i, kind, shape, value) => {
                let Some(t) = self.get(i) else { return };
                let result = match kind % 8 {
                    0 if cheap_or_hopeless(t.numel()) => t.zeros_like(),
                    1 if cheap_or_hopeless(t.numel()) => t.ones_like(),
                    2 if cheap_or_hopeless(t.numel()) => t.rand_like(),
                    3 if cheap_or_hopeless(t.numel()) => t.randn_like(),
                    4 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_zeros(shape.0),
                    5 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_ones(shape.0),
                    6 if cheap_or_hopeless(dims_numel(&shape.0)) => t.new_full(shape.0, value.0),
                    7 => t.new_tensor(&[value.0 as f32, 1.0, 2.0], shape.0),
                    _ => return,
                };
                self.keep(result);
            }
            Op::Unary(kind, i) => {
                let Some(t) = self.get(i) else { return };
                if !cheap_or_hopeless(t.numel()) {
                    return;
                }
                let run = |t: &Tensor| match kind {
                    Unary::Neg => t.neg(),
                    Unary::Abs => t.abs(),
                    Unary::Exp => t.exp(),
                    Unary::Log => t.log(),
                    Unary::Sqrt => t.sqrt(),
                    Unary::Rsqrt => t.rsqrt(),
                    Unary::Sin => t.sin(),
                    Unary::Cos => t.cos(),
                    Unary::Tanh => t.tanh(),
                    Unary::Sigmoid => t.sigmoid(),
                    Unary::Relu => t.relu(),
                    Unary::Gelu => t.gelu(),
                    Unary::GeluTanh => t.gelu_tanh(),
                    Unary::Silu => t.silu(),
                };
                let result = run(&t);
                if let Ok(out) = &result {
                    assert_eq!(out.dims(), t.dims(), "{kind:?}");
                }
                agrees_with_contiguous(&kind, &[&t], &result, |c| run(&c[0]));
                self.keep(result);
            }
            Op::UnaryInPlace(kind, i) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) && !t.layout().has_internal_overlap() {
                    return;
                }
                let result = match kind {
                    UnaryInPlace::Neg => t.neg_(),
                    UnaryInPlace::Abs => t.abs_(),
                    UnaryInPlace::Relu => t.relu_(),
                    UnaryInPlace::Sqrt => t.sqrt_(),
                    UnaryInPlace::Rsqrt => t.rsqrt_(),
                    UnaryInPlace::Exp => t.exp_(),
                    UnaryInPlace::Log => t.log_(),
                    UnaryInPlace::Log1p => t.log1p_(),
                    UnaryInPlace::Sigmoid => t.sigmoid_(),
                    UnaryInPlace::Tanh => t.tanh_(),
                    UnaryInPlace::LogSigmoid => t.log_sigmoid_(),
                };
                self.in_place(&format!("{kind:?}_"), &t, result);
            }
            Op::Binary(kind, a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                let out = broadcast_numel(&[&a, &b]);
                if !(cheap_or_hopeless(out) && small(&a) && small(&b) || out >= HOPELESS) {
                    return;
                }
                let run = |a: &Tensor, b: &Tensor| match kind {
                    Binary::Add => a.add(b),
                    Binary::Sub => a.sub(b),
                    Binary::Mul => a.mul(b),
                    Binary::Div => a.div(b),
                    Binary::Pow => a.pow(b),
                    Binary::ReluBackward => a.relu_backward(b),
                    Binary::GeluBackward => a.gelu_backward(b),
                    Binary::GeluTanhBackward => a.gelu_tanh_backward(b),
                    Binary::Maximum => a.maximum(b),
                    Binary::Minimum => a.minimum(b),
                    Binary::Eq => a.eq(b),
                    Binary::Ne => a.ne(b),
                    Binary::Lt => a.lt(b),
                    Binary::Le => a.le(b),
                    Binary::Gt => a.gt(b),
                    Binary::Ge => a.ge(b),
                };
                let result = run(&a, &b);
                if let Ok(t) = &result {
                    assert_eq!(t.numel(), out, "{kind:?} of {:?} and {:?} gave {:?}", a.dims(), b.dims(), t.dims());
                }
                agrees_with_contiguous(&kind, &[&a, &b], &result, |c| run(&c[0], &c[1]));
                self.keep(result);
            }
            Op::BinaryInPlace(kind, a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                if !(small(&a) && small(&b)) && !a.layout().has_internal_overlap() {
                    return;
                }
                let result = match kind {
                    BinaryInPlace::Add => a.add_(&b),
                    BinaryInPlace::Sub => a.sub_(&b),
                    BinaryInPlace::Mul => a.mul_(&b),
                    BinaryInPlace::Div => a.div_(&b),
                    BinaryInPlace::Maximum => a.maximum_(&b),
                    BinaryInPlace::Minimum => a.minimum_(&b),
                    BinaryInPlace::Copy => a.copy_(&b),
                };
                self.in_place(&format!("{kind:?}_"), &a, result);
            }
            Op::WithScalar(kind, i, value) => {
                let Some(t) = self.get(i) else { return };
                if !cheap_or_hopeless(t.numel()) {
                    return;
                }
                let v = value.0;
                let run = |t: &Tensor| match kind {
                    WithScalar::EqScalar => t.eq_scalar(v),
                    WithScalar::NeScalar => t.ne_scalar(v),
                    WithScalar::LtScalar => t.lt_scalar(v),
                    WithScalar::LeScalar => t.le_scalar(v),
                    WithScalar::GtScalar => t.gt_scalar(v),
                    WithScalar::GeScalar => t.ge_scalar(v),
                    WithScalar::Powf => t.powf(v),
                    WithScalar::AddScalar => t.add_scalar(v),
                    WithScalar::SubScalar => t.sub_scalar(v),
                    WithScalar::MulScalar => t.mul_scalar(v),
                    WithScalar::DivScalar => t.div_scalar(v),
                    WithScalar::FullLike => t.full_like(v),
                };
                let result = run(&t);
                agrees_with_contiguous(&(kind, v), &[&t], &result, |c| run(&c[0]));
                self.keep(result);
            }
            Op::ScalarInPlace(kind, i, value) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) && !t.layout().has_internal_overlap() {
                    return;
                }
                match kind {
                    // Filling an expanded view is allowed (one value for all).
                    ScalarInPlace::Fill => drop(t.fill_(value.0)),
                    ScalarInPlace::Zero => drop(t.zero_()),
                    ScalarInPlace::AddScalar => self.in_place("add_scalar_", &t, t.add_scalar_(value.0)),
                    ScalarInPlace::MulScalar => self.in_place("mul_scalar_", &t, t.mul_scalar_(value.0)),
                }
            }
            Op::Affine(i, mul, add, in_place) => {
                let Some(t) = self.get(i) else { return };
                if in_place {
                    if small(&t) || t.layout().has_internal_overlap() {
                        self.in_place("affine_", &t, t.affine_(mul.0, add.0));
                    }
                } else if cheap_or_hopeless(t.numel()) {
                    let result = t.affine(mul.0, add.0);
                    agrees_with_contiguous(&("affine", mul.0, add.0), &[&t], &result, |c| c[0].affine(mul.0, add.0));
                    self.keep(result);
                }
            }
            Op::Clamp(i, min, max, in_place) => {
                let Some(t) = self.get(i) else { return };
                let (min, max) = (min.map(|n| n.0), max.map(|n| n.0));
                if in_place {
                    if small(&t) || t.layout().has_internal_overlap() {
                        self.in_place("clamp_", &t, t.clamp_(min, max));
                    }
                } else if cheap_or_hopeless(t.numel()) {
                    let result = t.clamp(min, max);
                    agrees_with_contiguous(&("clamp", min, max), &[&t], &result, |c| c[0].clamp(min, max));
                    self.keep(result);
                }
            }
            Op::Where(c, a, b) => {
                let (Some(c), Some(a), Some(b)) = (self.get(c), self.get(a), self.get(b)) else { return };
                let out = broadcast_numel(&[&c, &a, &b]);
                if small(&c) && small(&a) && small(&b) && cheap_or_hopeless(out) || out >= HOPELESS {
                    let result = c.where_cond(&a, &b);
                    agrees_with_contiguous(&"where_cond", &[&c, &a, &b], &result, |t| t[0].where_cond(&t[1], &t[2]));
                    self.keep(result);
                }
            }
            Op::AddScaled(a, alpha, x) => {
                let (Some(a), Some(x)) = (self.get(a), self.get(x)) else { return };
                if small(&a) && small(&x) || a.layout().has_internal_overlap() {
                    self.in_place("add_scaled_", &a, a.add_scaled_(alpha.0, &x));
                }
            }
            Op::Addcmul(a, value, x, y, div) => {
                let (Some(a), Some(x), Some(y)) = (self.get(a), self.get(x), self.get(y)) else { return };
                if small(&a) && small(&x) && small(&y) || a.layout().has_internal_overlap() {
                    if div {
                        self.in_place("addcdiv_", &a, a.addcdiv_(value.0, &x, &y));
                    } else {
                        self.in_place("addcmul_", &a, a.addcmul_(value.0, &x, &y));
                    }
                }
            }
            Op::Lerp(a, end, weight) => {
                let (Some(a), Some(end)) = (self.get(a), self.get(end)) else { return };
                if small(&a) && small(&end) || a.layout().has_internal_overlap() {
                    self.in_place("lerp_", &a, a.lerp_(&end, weight.0));
                }
            }
            Op::Reduce(kind, i, dims, keepdim) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let dims: Vec<isize> = dims.iter().take(8).map(|&d| d as isize).collect();
                let result = match kind {
                    Reduce::Sum => t.sum(&dims, keepdim),
                    Reduce::Mean => t.mean(&dims, keepdim),
                    Reduce::Var => t.var(&dims, keepdim),
                    Reduce::Std => t.std(&dims, keepdim),
                    Reduce::Max => t.max(&dims, keepdim),
                    Reduce::Min => t.min(&dims, keepdim),
                    Reduce::Argmax => t.argmax(&dims, keepdim),
                    Reduce::Argmin => t.argmin(&dims, keepdim),
                };
                self.keep(result);
            }
            Op::VarCorrection(i, dims, correction, keepdim, std) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let dims: Vec<isize> = dims.iter().take(8).map(|&d| d as isize).collect();
                self.keep(if std {
                    t.std_with_correction(&dims, correction.0, keepdim)
                } else {
                    t.var_with_correction(&dims, correction.0, keepdim)
                });
            }
            Op::ReduceAll(i, mean) => {
                let Some(t) = self.get(i) else { return };
                if small(&t) {
                    let result = if mean { t.mean_all() } else { t.sum_all() };
                    if let Ok(out) = &result {
                        assert_eq!(out.numel(), 1);
                    }
                    self.keep(result);
                }
            }
            Op::Softmax(i, dim, log) => {
                let Some(t) = self.get(i) else { return };
                if small(&t) {
                    self.keep(if log { t.log_softmax(dim as isize) } else { t.softmax(dim as isize) });
                }
            }
            Op::Matmul(a, b) => {
                let (Some(a), Some(b)) = (self.get(a), self.get(b)) else { return };
                if !(small(&a) && small(&b)) {
                    return;
                }
                let last = |t: &Tensor| t.dims().last().copied().unwrap_or(1);
                let rows = |t: &Tensor| if t.rank() >= 2 { t.dims()[t.rank() - 2] } else { 1 };
                let flops = a.numel().saturating_mul(last(&b)).max(b.numel().saturating_mul(rows(&a)));
                if flops <= FLOPS {
                    self.keep(a.matmul(&b));
                }
            }
            Op::Cat(list, dim, stack) => {
                let tensors: Vec<Tensor> = list.iter().take(6).filter_map(|&i| self.get(i)).collect();
                let total = tensors.iter().fold(0usize, |n, t| n.saturating_add(t.numel()));
                if tensors.iter().all(small) || total >= HOPELESS {
                    let refs: Vec<&Tensor> = tensors.iter().collect();
                    self.keep(if stack {
                        Tensor::stack(&refs, dim as isize)
                    } else {
                        Tensor::cat(&refs, dim as isize)
                    });
                }
            }
            Op::IndexSelect(t, dim, index) => {
                let (Some(t), Some(index)) = (self.get(t), self.get(index)) else { return };
                let out = t.numel().checked_div(t.dim(dim as isize).unwrap_or(1).max(1)).unwrap_or(0);
                if small(&t) && small(&index) && out.saturating_mul(index.numel()) <= WORK {
                    self.keep(t.index_select(dim as isize, &index));
                }
            }
            Op::Embedding(weight, ids) => {
                let (Some(weight), Some(ids)) = (self.get(weight), self.get(ids)) else { return };
                let row = weight.dims().last().copied().unwrap_or(1);
                if small(&weight) && small(&ids) && ids.numel().saturating_mul(row) <= WORK {
                    self.keep(Tensor::embedding(&weight, &ids));
                }
            }
            Op::Gather(t, dim, index) => {
                let (Some(t), Some(index)) = (self.get(t), self.get(index)) else { return };
                if small(&t) && small(&index) {
                    self.keep(t.gather(dim as isize, &index));
                }
            }
            Op::ScatterAdd(t, dim, index, src, in_place) => {
                let (Some(t), Some(index), Some(src)) = (self.get(t), self.get(index), self.get(src)) else { return };
                if in_place && (small(&t) && small(&index) && small(&src) || t.layout().has_internal_overlap()) {
                    self.in_place("scatter_add_", &t, t.scatter_add_(dim as isize, &index, &src));
                } else if !in_place && small(&t) && small(&index) && small(&src) {
                    self.keep(t.scatter_add(dim as isize, &index, &src));
                }
            }
            Op::OneHot(t, classes) => {
                let Some(t) = self.get(t) else { return };
                if small(&t) && cheap_or_hopeless(t.numel().saturating_mul(classes.0)) {
                    self.keep(t.one_hot(classes.0));
                }
            }
            Op::Conv2d(x, w, bias, stride, padding, dilation, groups) => {
                let (Some(x), Some(w)) = (self.get(x), self.get(w)) else { return };
                let bias = bias.and_then(|b| self.get(b));
                let params = conv_params(stride, padding, dilation, groups);
                if small(&x) && small(&w) && conv_flops(x.dims(), w.dims(), params) <= FLOPS {
                    self.keep(x.conv2d(&w, bias.as_ref(), params));
                }
            }
            Op::Conv2dBackwardInput(grad, w, input_shape, stride, padding, dilation, groups) => {
                let (Some(grad), Some(w)) = (self.get(grad), self.get(w)) else { return };
                let params = conv_params(stride, padding, dilation, groups);
                let flops = conv_flops(&input_shape.0, w.dims(), params);
                if small(&grad) && small(&w) && flops <= FLOPS && dims_numel(&input_shape.0) <= WORK {
                    self.keep(grad.conv2d_backward_input(&w, input_shape.0, params));
                }
            }
            Op::Conv2dBackwardWeight(x, grad, weight_shape, stride, padding, dilation, groups) => {
                let (Some(x), Some(grad)) = (self.get(x), self.get(grad)) else { return };
                let params = conv_params(stride, padding, dilation, groups);
                let flops = conv_flops(x.dims(), &weight_shape.0, params);
                if small(&x) && small(&grad) && flops <= FLOPS && dims_numel(&weight_shape.0) <= WORK {
                    self.keep(x.conv2d_backward_weight(&grad, weight_shape.0, params));
                }
            }
            Op::Conv2dBackwardBias(grad) => {
                let Some(grad) = self.get(grad) else { return };
                if small(&grad) {
                    self.keep(grad.conv2d_backward_bias());
                }
            }
            Op::MaxPool2d(x, kernel, stride, padding) => {
                let Some(x) = self.get(x) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                if small(&x) && pool_flops(x.dims(), kernel, stride, padding) <= FLOPS {
                    if let Ok((values, indices)) = x.max_pool2d(kernel, stride, padding) {
                        assert_eq!(values.dims(), indices.dims());
                        self.keep(Ok(values));
                        self.keep(Ok(indices));
                    }
                }
            }
            Op::MaxPool2dBackward(grad, indices, input_shape) => {
                let (Some(grad), Some(indices)) = (self.get(grad), self.get(indices)) else { return };
                if small(&grad) && small(&indices) && dims_numel(&input_shape.0) <= WORK {
                    self.keep(grad.max_pool2d_backward(&indices, input_shape.0));
                }
            }
            Op::AvgPool2d(x, kernel, stride, padding, count_include_pad) => {
                let Some(x) = self.get(x) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                if small(&x) && pool_flops(x.dims(), kernel, stride, padding) <= FLOPS {
                    self.keep(x.avg_pool2d(kernel, stride, padding, count_include_pad));
                }
            }
            Op::AvgPool2dBackward(grad, input_shape, kernel, stride, padding, count_include_pad) => {
                let Some(grad) = self.get(grad) else { return };
                let (kernel, stride, padding) = (pair(kernel), pair(stride), pair(padding));
                let flops = pool_flops(&input_shape.0, kernel, stride, padding);
                if small(&grad) && dims_numel(&input_shape.0) <= WORK && flops <= FLOPS {
                    self.keep(grad.avg_pool2d_backward(input_shape.0, kernel, stride, padding, count_include_pad));
                }
            }
            Op::ToVec(i) => {
                let Some(t) = self.get(i) else { return };
                if !small(&t) {
                    return;
                }
                let n = match t.dtype() {
                    DType::Bool => t.to_vec::<bool>().map(|v| v.len()),
                    DType::U8 => t.to_vec::<u8>().map(|v| v.len()),
                    DType::I64 => t.to_vec::<i64>().map(|v| v.len()),
                    DType::F16 => t.to_vec::<half::f16>().map(|v| v.len()),
                    DType::BF16 => t.to_vec::<half::bf16>().map(|v| v.len()),
                    DType::F32 => t.to_vec::<f32>().map(|v| v.len()),
                    DType::F64 => t.to_vec::<f64>().map(|v| v.len()),
                };
                if let Ok(n) = n {
                    assert_eq!(n, t.numel(), "to_vec of {:?}", t.dims());
                }
                // The wrong element type is an error, not a reinterpretation.
                let wrong = if t.dtype() == DType::F32 { t.to_vec::<f64>().is_ok() } else { t.to_vec::<f32>().is_ok() };
                assert!(!wrong, "to_vec with the wrong element type succeeded for {}", t.dtype());
            }
            Op::Item(i) => {
                let Some(t) = self.get(i) else { return };
                let result = t.item::<f64>();
                assert_eq!(result.is_ok(), t.numel() == 1, "item of {:?}", t.dims());
            }
            Op::RecordStream(i, device) => {
                let Some(t) = self.get(i) else { return };
                if let Ok(stream) = Stream::new(device.get()) {
                    let _ = t.record_stream(&stream);
                    let _ = stream.synchronize();
                }
            }
            Op::MemoryReport(device) => {
                let device = device.get();
                let _ = memory::stats(device);
                let _ = memory::summary(device);
                let _ = memory::snapshot(device).map(|s| s.to_json());
                let _ = memory::fragmentation(device);
            }
        }
    }

    pub(crate) fn reshape(&mut self, t: &Tensor, spec: &[isize], view: bool) {
        if view {
            self.keep(t.view(spec));
        } else if small(t) || t.is_contiguous() || t.numel() >= HOPELESS {
            self.keep(t.reshape(spec));
        }
    }
}

/// A tensor from a [`Source`], unless it would be large but not hopelessly so.
pub(crate) fn make(source: Source) -> brasa_tensor::Result<Tensor> {
    let numel_ok = |shape: &Sh| cheap_or_hopeless(dims_numel(&shape.0));
    let skip = || Err(brasa_tensor::TensorError::Device("skipped by the fuzzer: large but not hopeless".into()));
    match source {
        Source::Zeros(shape, dtype, device) if numel_ok(&shape) => Tensor::zeros_on(shape.0, dtype.get(), device.get()),
        Source::Ones(shape, dtype) if numel_ok(&shape) => Tensor::ones(shape.0, dtype.get()),
        Source::Full(shape, value, dtype, device) if numel_ok(&shape) => {
            Tensor::full_on(shape.0, value.0, dtype.get(), device.get())
        }
        Source::Arange(start, end, step, dtype) => {
            let count = ((end.0 - start.0) / step.0).abs();
            if count.is_finite() && count > WORK as f64 && count < HOPELESS as f64 {
                return skip();
            }
            let result = Tensor::arange(start.0, end.0, step.0, dtype.get());
            if let Ok(t) = &result {
                assert_eq!(t.rank(), 1);
            }
            result
        }
        Source::Linspace(start, end, steps, dtype) if cheap_or_hopeless(steps.0) => {
            let result = Tensor::linspace(start.0, end.0, steps.0, dtype.get());
            if let Ok(t) = &result {
                assert_eq!(t.dims(), [steps.0]);
            }
            result
        }
        Source::Eye(n, dtype) if cheap_or_hopeless(n.0.saturating_mul(n.0)) => Tensor::eye(n.0, dtype.get()),
        Source::Rand(shape, dtype) if numel_ok(&shape) => Tensor::rand(shape.0, dtype.get()),
        Source::Randn(shape, dtype) if numel_ok(&shape) => Tensor::randn(shape.0, dtype.get()),
        Source::Uniform(shape, low, high, dtype) if numel_ok(&shape) => {
            Tensor::uniform_on(shape.0, low.0, high.0, dtype.get(), Device::CPU)
        }
        Source::Bernoulli(shape, p, dtype) if numel_ok(&shape) => Tensor::bernoulli(shape.0, p.0, dtype.get()),
        Source::Data(dtype, shape, bytes) => from_bytes(dtype.get(), shape.0, &bytes),
        Source::Indices(shape, values) => {
            Tensor::from_vec(values.into_iter().map(i64::from).collect::<Vec<i64>>(), shape.0)
        }
        Source::Scalar(value, dtype) => Tensor::full([], value.0, dtype.get()),
        _ => skip(),
    }
}

/// A tensor of `dtype` whose elements are the bytes' values (as many as
/// there are whole elements; the shape may disagree, which is an error).
pub(crate) fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> brasa_tensor::Result<Tensor> {
    pub(crate) fn collect<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().expect("chunk of N"))).collect()
    }
    match dtype {
        DType::Bool => Tensor::from_vec(bytes.iter().map(|&b| b & 1 == 1).collect::<Vec<bool>>(), shape),
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape),
        DType::I64 => Tensor::from_vec(collect(bytes, i64::from_le_bytes), shape),
        DType::F16 => Tensor::from_vec(collect(bytes, |b| half::f16::from_bits(u16::from_le_bytes(b))), shape),
        DType::BF16 => Tensor::from_vec(collect(bytes, |b| half::bf16::from_bits(u16::from_le_bytes(b))), shape),
        DType::F32 => Tensor::from_vec(collect(bytes, f32::from_le_bytes), shape),
        DType::F64 => Tensor::from_vec(collect(bytes, f64::from_le_bytes), shape),
    }
}
