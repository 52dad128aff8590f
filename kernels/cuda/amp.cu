// The GradScaler's unscale: every element multiplied by inv_scale in place
// (mul_scalar_: x·m in the compute type, one rounding), and *found_inf set
// to 1.0 when any element (before scaling) is infinite or NaN. Host twin:
// amp/src/scaler.rs unscale_grads (all_finite + mul_scalar_). f16
// gradients are refused by the host, so there is no f16 kernel.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void amp_unscale(long long n, T* grad, float inv_scale, float* found_inf) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const C m = (C)inv_scale;
    bool bad = false;
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const C v = E::load(grad[i]);
        bad |= !isfinite(v);
        grad[i] = E::store(mul_rn(v, m));
    }
    if (bad) *found_inf = 1.0f;
}

#define INST_AMP(sfx, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        amp_unscale_##sfx(long long n, T* grad, float inv_scale, float* found_inf) {               \
        amp_unscale<T>(n, grad, inv_scale, found_inf);                                             \
    }
INST_AMP(f32, float)
INST_AMP(f64, double)
INST_AMP(bf16, __nv_bfloat16)
