// Layer normalisation of the rows of a contiguous [rows, width] matrix, in
// f32 or f64 (callers widen half types first). Host twins:
// brasa_kernels::norm::{layer_norm_row, layer_norm_backward_row}.
//
// layer_norm_fwd_<T>:      one block per row (blocks loop over rows): mean,
//                          biased variance (two passes over the row),
//                          rstd = 1/sqrt(var + eps), y = (x - mean)·rstd·w + b.
// layer_norm_bwd_dx_<T>:   one block per row: with x̂ = (x - mean)·rstd and
//                          ĝ = g·w, dx = rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)).
// layer_norm_bwd_param_<T>: one thread per column (grid-stride), summing over
//                          rows in order: dw = Σ g·x̂, db = Σ g.
// `w`, `b`, `dw` and `db` may be null (absent / not wanted).
#include "common.cuh"

__device__ __forceinline__ float m_rsqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double m_rsqrt(double x) { return 1.0 / sqrt(x); }

// The sum of `v` over the block (every thread gets it).
template <typename C>
__device__ __forceinline__ C block_sum(C v) {
    __shared__ C buf[BRASA_BLOCK];
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int width = BRASA_BLOCK / 2; width > 0; width /= 2) {
        if (t < width) buf[t] = add_rn(buf[t], buf[t + width]);
        __syncthreads();
    }
    C result = buf[0];
    __syncthreads();
    return result;
}

template <typename C>
__device__ __forceinline__ void layer_norm_fwd(long long rows, long long width, const C* x, const C* w, const C* b,
                                               C eps, C* out, C* mean_out, C* rstd_out) {
    const C count = (C)(width > 0 ? width : 1);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const C* row = x + r * width;
        C* dst = out + r * width;
        C total = (C)0;
        for (long long k = threadIdx.x; k < width; k += BRASA_BLOCK) total = add_rn(total, row[k]);
        const C mean = div_rn(block_sum(total), count);
        C squares = (C)0;
        for (long long k = threadIdx.x; k < width; k += BRASA_BLOCK) {
            const C d = sub_rn(row[k], mean);
            squares = add_rn(squares, mul_rn(d, d));
        }
        const C rstd = m_rsqrt(add_rn(div_rn(block_sum(squares), count), eps));
        for (long long k = threadIdx.x; k < width; k += BRASA_BLOCK) {
            C y = mul_rn(sub_rn(row[k], mean), rstd);
            if (w) y = mul_rn(y, w[k]);
            if (b) y = add_rn(y, b[k]);
            dst[k] = y;
        }
        if (threadIdx.x == 0) {
            mean_out[r] = mean;
            rstd_out[r] = rstd;
        }
    }
}

template <typename C>
__device__ __forceinline__ void layer_norm_bwd_dx(long long rows, long long width, const C* g, const C* x,
                                                  const C* mean, const C* rstd, const C* w, C* dx) {
    const C count = (C)(width > 0 ? width : 1);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const C* gr = g + r * width;
        const C* xr = x + r * width;
        const C m = mean[r], s = rstd[r];
        C sum_g = (C)0, sum_gx = (C)0;
        for (long long k = threadIdx.x; k < width; k += BRASA_BLOCK) {
            const C gh = w ? mul_rn(gr[k], w[k]) : gr[k];
            sum_g = add_rn(sum_g, gh);
            sum_gx = add_rn(sum_gx, mul_rn(gh, mul_rn(sub_rn(xr[k], m), s)));
        }
        const C mean_g = div_rn(block_sum(sum_g), count);
        const C mean_gx = div_rn(block_sum(sum_gx), count);
        for (long long k = threadIdx.x; k < width; k += BRASA_BLOCK) {
            const C gh = w ? mul_rn(gr[k], w[k]) : gr[k];
            const C x_hat = mul_rn(sub_rn(xr[k], m), s);
            dx[r * width + k] = mul_rn(s, sub_rn(sub_rn(gh, mean_g), mul_rn(x_hat, mean_gx)));
        }
    }
}

template <typename C>
__device__ __forceinline__ void layer_norm_bwd_param(long long rows, long long width, const C* g, const C* x,
                                                     const C* mean, const C* rstd, C* dw, C* db) {
    for (long long k = grid_start(); k < width; k += grid_step()) {
        C acc_w = (C)0, acc_b = (C)0;
        for (long long r = 0; r < rows; ++r) {
            const C gv = g[r * width + k];
            if (dw) acc_w = add_rn(acc_w, mul_rn(gv, mul_rn(sub_rn(x[r * width + k], mean[r]), rstd[r])));
            acc_b = add_rn(acc_b, gv);
        }
        if (dw) dw[k] = acc_w;
        if (db) db[k] = acc_b;
    }
}

#define INST_NORM(sfx, C)                                                                                   \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                              \
        layer_norm_fwd_##sfx(long long rows, long long width, const C* x, const C* w, const C* b, C eps,   \
                             C* out, C* mean, C* rstd) {                                                   \
        layer_norm_fwd<C>(rows, width, x, w, b, eps, out, mean, rstd);                                     \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                              \
        layer_norm_bwd_dx_##sfx(long long rows, long long width, const C* g, const C* x, const C* mean,    \
                                const C* rstd, const C* w, C* dx) {                                        \
        layer_norm_bwd_dx<C>(rows, width, g, x, mean, rstd, w, dx);                                        \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                              \
        layer_norm_bwd_param_##sfx(long long rows, long long width, const C* g, const C* x, const C* mean, \
                                   const C* rstd, C* dw, C* db) {                                          \
        layer_norm_bwd_param<C>(rows, width, g, x, mean, rstd, dw, db);                                    \
    }
INST_NORM(f32, float)
INST_NORM(f64, double)
