//! The composed SGD update that `fused_sgd_` must equal bit for bit, for
//! the test files that check it (`fused_sgd`, `per_device`).

use brasa_tensor::{SgdOptions, Tensor};

/// The composed update, op for op as `brasa-nn`'s `Sgd::update` runs it;
/// `buffer` is created on the first step with momentum.
pub fn composed(p: &Tensor, g: &Tensor, buffer: &mut Option<Tensor>, o: SgdOptions) {
    let SgdOptions { lr, momentum, dampening, weight_decay, nesterov, maximize } = o;
    let sign = if maximize { -1.0 } else { 1.0 };
    if momentum == 0.0 {
        if weight_decay != 0.0 {
            p.mul_scalar_(1.0 - lr * weight_decay).unwrap();
        }
        p.add_scaled_(-lr * sign, g).unwrap();
        return;
    }
    let buf = match buffer {
        Some(buf) => {
            buf.mul_scalar_(momentum).unwrap();
            buf.add_scaled_(sign * (1.0 - dampening), g).unwrap();
            if weight_decay != 0.0 {
                buf.add_scaled_((1.0 - dampening) * weight_decay, p).unwrap();
            }
            buf
        }
        None => {
            let buf = g.affine(sign, 0.0).unwrap();
            if weight_decay != 0.0 {
                buf.add_scaled_(weight_decay, p).unwrap();
            }
            buffer.insert(buf)
        }
    };
    if nesterov {
        if weight_decay != 0.0 {
            p.mul_scalar_(1.0 - lr * weight_decay).unwrap();
        }
        p.add_scaled_(-lr * sign, g).unwrap();
        p.add_scaled_(-lr * momentum, buf).unwrap();
    } else {
        p.add_scaled_(-lr, buf).unwrap();
    }
}

/// Every option of `SgdConfig`, alone and together.
pub fn configs() -> Vec<SgdOptions> {
    let o = |lr, momentum, dampening, weight_decay, nesterov, maximize| SgdOptions {
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
        maximize,
    };
    vec![
        o(0.1, 0.0, 0.0, 0.0, false, false),
        o(0.1, 0.0, 0.0, 0.01, false, true),
        o(0.05, 0.9, 0.0, 0.0, false, false),
        o(0.05, 0.9, 0.3, 0.02, false, false),
        o(0.05, 0.8, 0.0, 0.0, true, false),
        o(0.05, 0.8, 0.0, 0.1, true, true),
        o(0.03, 0.7, 0.1, 0.1, false, true),
    ]
}
