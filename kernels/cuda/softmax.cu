// softmax and log_softmax over the middle dim of a contiguous
// [outer, len, inner] view, computed stably (the max is subtracted before
// exponentiating), f16/bf16 in f32 with one rounding on store. Host twins:
// brasa_kernels::reduce::{softmax_row, log_softmax_row, softmax_columns,
// log_softmax_columns} as brasa-tensor's ops/softmax.rs uses them:
// softmax = e·(1/Σe), log_softmax = (x − max) − ln Σe, with e = exp(x − max).
// The host has no fused backward (autograd composes it from ops).
#include "common.cuh"

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }

template <typename C> __device__ __forceinline__ C nan_max(C a, C b) { return (b > a || b != b) && !(a != a) ? b : a; }

template <typename A, typename Combine>
__device__ __forceinline__ A block_all(A v, Combine combine) {
    __shared__ A buf[BRASA_BLOCK];
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int width = BRASA_BLOCK / 2; width > 0; width /= 2) {
        if (t < width) buf[t] = combine(buf[t], buf[t + width]);
        __syncthreads();
    }
    A result = buf[0];
    __syncthreads();
    return result;
}

template <typename T, bool LOG>
__device__ __forceinline__ void softmax_kernel(long long outer, long long len, long long inner, const T* x, T* out) {
    typedef Elem<T> E;
    typedef typename E::C C;
    if (len == 0) return;
    if (inner == 1) {
        for (long long r = blockIdx.x; r < outer; r += gridDim.x) {
            const T* row = x + r * len;
            T* dst = out + r * len;
            C m = E::load(row[0]);
            for (long long k = threadIdx.x; k < len; k += BRASA_BLOCK) m = nan_max(m, E::load(row[k]));
            m = block_all(m, [](C a, C b) { return nan_max(a, b); });
            C total = (C)0;
            for (long long k = threadIdx.x; k < len; k += BRASA_BLOCK)
                total = add_rn(total, m_exp(sub_rn(E::load(row[k]), m)));
            total = block_all(total, [](C a, C b) { return add_rn(a, b); });
            if (LOG) {
                const C log_sum = m_log(total);
                for (long long k = threadIdx.x; k < len; k += BRASA_BLOCK)
                    dst[k] = E::store(sub_rn(sub_rn(E::load(row[k]), m), log_sum));
            } else {
                const C scale = div_rn((C)1, total);
                for (long long k = threadIdx.x; k < len; k += BRASA_BLOCK)
                    dst[k] = E::store(mul_rn(m_exp(sub_rn(E::load(row[k]), m)), scale));
            }
        }
        return;
    }
    const long long n = outer * inner;
    for (long long o = grid_start(); o < n; o += grid_step()) {
        const long long base = (o / inner) * len * inner + o % inner;
        const T* col = x + base;
        T* dst = out + base;
        C m = E::load(col[0]);
        for (long long k = 1; k < len; ++k) m = nan_max(m, E::load(col[k * inner]));
        C total = (C)0;
        for (long long k = 0; k < len; ++k) total = add_rn(total, m_exp(sub_rn(E::load(col[k * inner]), m)));
        if (LOG) {
            const C log_sum = m_log(total);
            for (long long k = 0; k < len; ++k) dst[k * inner] = E::store(sub_rn(sub_rn(E::load(col[k * inner]), m), log_sum));
        } else {
            const C scale = div_rn((C)1, total);
            for (long long k = 0; k < len; ++k)
                dst[k * inner] = E::store(mul_rn(m_exp(sub_rn(E::load(col[k * inner]), m)), scale));
        }
    }
}

#define INST_SOFTMAX(sfx, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        softmax_##sfx(long long outer, long long len, long long inner, const T* x, T* out) {       \
        softmax_kernel<T, false>(outer, len, inner, x, out);                                       \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        log_softmax_##sfx(long long outer, long long len, long long inner, const T* x, T* out) {   \
        softmax_kernel<T, true>(outer, len, inner, x, out);                                        \
    }
BRASA_FLOAT_TYPES(INST_SOFTMAX)
