// Optimizer steps in place, one kernel per step, replaying per element the
// exact sequence of in-place tensor ops of brasa-nn's optimizers (each
// intermediate rounded to the tensor's dtype where the host stores it, no
// FMA), so the results are the host's. Host twins: nn/src/optim/sgd.rs
// (Sgd::update) and nn/src/optim/adam.rs (Adam/AdamW::update). See ABI.md.
#include "common.cuh"

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)

// mul_scalar_(m): Affine { mul: m, add: 0 } -> x·m.
// add_scaled_(a, y): x + a·y.
template <typename T>
__device__ __forceinline__ T scale_t(T x, typename Elem<T>::C m) {
    return Elem<T>::store(mul_rn(Elem<T>::load(x), m));
}
template <typename T>
__device__ __forceinline__ T axpy_t(T x, typename Elem<T>::C a, T y) {
    return Elem<T>::store(add_rn(Elem<T>::load(x), mul_rn(a, Elem<T>::load(y))));
}

// SGD. flags: 1 nesterov, 2 maximize, 4 first step (the momentum buffer is
// created from the gradient: buf = ±g (+ wd·p)). With momentum == 0 the
// buffer is not touched (may be null).
template <typename T>
__device__ __forceinline__ void sgd_step(long long n, T* param, const T* grad, T* buf, double lr, double momentum,
                                         double dampening, double weight_decay, int flags) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const bool nesterov = flags & 1, first = flags & 4;
    const double sign = (flags & 2) ? -1.0 : 1.0;
    const C decay = E::compute_from_f64(sub_rn(1.0, mul_rn(lr, weight_decay)));
    const C neg_lr_sign = E::compute_from_f64(mul_rn(-lr, sign));
    const C mom = E::compute_from_f64(momentum);
    const C grad_share = E::compute_from_f64(mul_rn(sign, sub_rn(1.0, dampening)));
    const C wd_share = E::compute_from_f64(mul_rn(sub_rn(1.0, dampening), weight_decay));
    const C wd = E::compute_from_f64(weight_decay);
    const C sign_c = E::compute_from_f64(sign);
    const C neg_lr_mom = E::compute_from_f64(mul_rn(-lr, momentum));
    const C neg_lr = E::compute_from_f64(-lr);
    for (long long i = grid_start(); i < n; i += grid_step()) {
        T p = param[i];
        const T g = grad[i];
        if (momentum == 0.0) {
            if (weight_decay != 0.0) p = scale_t(p, decay);
            param[i] = axpy_t(p, neg_lr_sign, g);
            continue;
        }
        T b;
        if (first) {
            b = scale_t(g, sign_c);  // grad.affine(sign, 0)
            if (weight_decay != 0.0) b = axpy_t(b, wd, p);
        } else {
            b = scale_t(buf[i], mom);
            b = axpy_t(b, grad_share, g);
            if (weight_decay != 0.0) b = axpy_t(b, wd_share, p);
        }
        buf[i] = b;
        if (nesterov) {
            if (weight_decay != 0.0) p = scale_t(p, decay);
            p = axpy_t(p, neg_lr_sign, g);
            p = axpy_t(p, neg_lr_mom, b);
        } else {
            p = axpy_t(p, neg_lr, b);
        }
        param[i] = p;
    }
}

// Adam and AdamW. flags: 1 decoupled weight decay (AdamW), 2 amsgrad,
// 4 maximize. step_size = lr / (1 − β1^t) and inv_bias_correction2_sqrt =
// 1 / sqrt(1 − β2^t) are computed by the caller in f64 as the host does
// (Rust's powf); max_exp_avg_sq may be null without amsgrad.
template <typename T>
__device__ __forceinline__ void adam_step(long long n, T* param, const T* grad, T* exp_avg, T* exp_avg_sq,
                                          T* max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                                          double weight_decay, double step_size, double inv_bias_correction2_sqrt,
                                          int flags) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const bool decoupled = flags & 1, amsgrad = flags & 2, maximize = flags & 4;
    const bool l2 = !decoupled && weight_decay != 0.0;
    const C decay = E::compute_from_f64(sub_rn(1.0, mul_rn(lr, weight_decay)));
    const C wd = E::compute_from_f64(weight_decay);
    const C w1 = E::compute_from_f64(sub_rn(1.0, beta1));
    const C b2 = E::compute_from_f64(beta2);
    const C w2 = E::compute_from_f64(sub_rn(1.0, beta2));
    const C denom_mul = E::compute_from_f64(inv_bias_correction2_sqrt), denom_add = E::compute_from_f64(eps);
    const C neg_step = E::compute_from_f64(-step_size);
    for (long long i = grid_start(); i < n; i += grid_step()) {
        T p = param[i];
        if (decoupled && weight_decay != 0.0) p = scale_t(p, decay);
        T g = grad[i];
        if (maximize) g = E::store(-E::load(g));
        if (l2) g = axpy_t(g, wd, p);
        // exp_avg.lerp_(g, 1 − β1)
        const C m_old = E::load(exp_avg[i]);
        const T m = E::store(add_rn(m_old, mul_rn(w1, sub_rn(E::load(g), m_old))));
        exp_avg[i] = m;
        // exp_avg_sq.mul_scalar_(β2); .addcmul_(1 − β2, g, g)
        T v = scale_t(exp_avg_sq[i], b2);
        v = E::store(add_rn(E::load(v), mul_rn(mul_rn(w2, E::load(g)), E::load(g))));
        exp_avg_sq[i] = v;
        T second = v;
        if (amsgrad) {
            second = E::store(nan_maximum(E::load(max_exp_avg_sq[i]), E::load(v)));
            max_exp_avg_sq[i] = second;
        }
        // denom = sqrt(second) (stored), then affine_(1/sqrt(bc2), eps)
        const T root = E::store(sqrt(E::load(second)));
        C d;
        if (eps == 0.0) {
            d = mul_rn(E::load(root), denom_mul);
        } else if (inv_bias_correction2_sqrt == 1.0) {
            d = add_rn(E::load(root), denom_add);
        } else {
            d = add_rn(mul_rn(E::load(root), denom_mul), denom_add);
        }
        const T denom = E::store(d);
        // param.addcdiv_(−step_size, exp_avg, denom)
        param[i] = E::store(add_rn(E::load(p), mul_rn(neg_step, div_rn(E::load(m), E::load(denom)))));
    }
}

#define INST_OPTIM(sfx, T)                                                                         \
    K sgd_step_##sfx(long long n, T* param, const T* grad, T* buf, double lr, double momentum, double dampening, \
                     double weight_decay, int flags) {                                             \
        sgd_step<T>(n, param, grad, buf, lr, momentum, dampening, weight_decay, flags);            \
    }                                                                                              \
    K adam_step_##sfx(long long n, T* param, const T* grad, T* exp_avg, T* exp_avg_sq, T* max_exp_avg_sq, double lr, \
                      double beta1, double beta2, double eps, double weight_decay, double step_size, \
                      double inv_bias_correction2_sqrt, int flags) {                               \
        adam_step<T>(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps, weight_decay, \
                     step_size, inv_bias_correction2_sqrt, flags);                                 \
    }
BRASA_FLOAT_TYPES(INST_OPTIM)
