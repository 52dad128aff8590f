// 2-d max and average pooling over the planes of [N, C, H, W] and their
// backward passes. Host twins: brasa_kernels::pool::{max_pool2d_plane,
// max_pool2d_backward_plane, avg_pool2d_plane, avg_pool2d_backward_plane}
// with Pool2dGeometry's windows. The backward kernels gather (one thread
// per input element, contributions in the host's order of outputs), so
// they need no zero fill and no atomics and round as the host does.
#include "common.cuh"

// Mirrored by brasa_kernels::cuda_ptx::Pool2d (10 i64, 80 bytes).
struct Pool2d {
    long long in_h, in_w, k_h, k_w, stride_h, stride_w, pad_h, pad_w, out_h, out_w;
};
static_assert(sizeof(Pool2d) == 80, "Pool2d must match the Rust mirror");

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)

struct Window {
    long long lo, hi, size;
};
// Pool2dGeometry::window: input rows [lo, hi) of output o, and the padded size.
__device__ __forceinline__ Window window(long long o, long long input, long long kernel, long long stride,
                                        long long padding) {
    const long long start = o * stride;
    const long long end = start + kernel < input + 2 * padding ? start + kernel : input + 2 * padding;
    Window w;
    w.lo = start > padding ? start - padding : 0;
    w.hi = end - padding < input ? end - padding : input;
    w.size = end - start;
    return w;
}
// The outputs whose windows may hold input position h: [first, last].
__device__ __forceinline__ void covering(long long h, long long kernel, long long stride, long long padding,
                                         long long outputs, long long& first, long long& last) {
    const long long t = h + padding - kernel + 1;
    first = t <= 0 ? 0 : (t + stride - 1) / stride;
    last = (h + padding) / stride;
    if (last > outputs - 1) last = outputs - 1;
}

// values and flat (h·W + w) indices, [planes, out_h, out_w] contiguous; plane
// p = (n, c) starts at n·sn + c·sc. The first maximum wins; a NaN always
// takes over (so the last NaN of a window is picked), as the host's.
template <typename T>
__device__ __forceinline__ void max_pool2d(const Pool2d& g, long long planes, long long channels, const T* x,
                                           long long sn, long long sc, long long sh, long long sw, T* out,
                                           long long* indices) {
    typedef Elem<T> E;
    const long long olen = g.out_h * g.out_w, n = planes * olen;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long ow = e % g.out_w, oh = (e / g.out_w) % g.out_h, p = e / olen;
        const T* plane = x + (p / channels) * sn + (p % channels) * sc;
        const Window rows = window(oh, g.in_h, g.k_h, g.stride_h, g.pad_h);
        const Window cols = window(ow, g.in_w, g.k_w, g.stride_w, g.pad_w);
        T best = plane[rows.lo * sh + cols.lo * sw];
        long long best_hw = rows.lo * g.in_w + cols.lo;
        for (long long h = rows.lo; h < rows.hi; ++h) {
            for (long long w = cols.lo; w < cols.hi; ++w) {
                const T v = plane[h * sh + w * sw];
                const auto a = E::load(v), b = E::load(best);
                if (a > b || a != a) {
                    best = v;
                    best_hw = h * g.in_w + w;
                }
            }
        }
        out[e] = best;
        indices[e] = best_hw;
    }
}

// grad_in [planes, in_h, in_w] = Σ grad_out over the outputs whose index
// names the element, added in output order in the element type (as the
// host's `+=`; f16/bf16 round per addition), starting from zero.
template <typename T>
__device__ __forceinline__ void max_pool2d_backward(const Pool2d& g, long long planes, const T* grad_out,
                                                    const long long* indices, T* grad_in) {
    typedef Elem<T> E;
    const long long ilen = g.in_h * g.in_w, olen = g.out_h * g.out_w, n = planes * ilen;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long w = e % g.in_w, h = (e / g.in_w) % g.in_h, p = e / ilen, hw = h * g.in_w + w;
        long long oh0, oh1, ow0, ow1;
        covering(h, g.k_h, g.stride_h, g.pad_h, g.out_h, oh0, oh1);
        covering(w, g.k_w, g.stride_w, g.pad_w, g.out_w, ow0, ow1);
        T acc = E::from_f64(0.0);
        for (long long oh = oh0; oh <= oh1; ++oh) {
            for (long long ow = ow0; ow <= ow1; ++ow) {
                const long long o = p * olen + oh * g.out_w + ow;
                if (indices[o] == hw) acc = E::store(add_rn(E::load(acc), E::load(grad_out[o])));
            }
        }
        grad_in[e] = acc;
    }
}

__device__ __forceinline__ long long avg_divisor(bool count_include_pad, const Window& r, const Window& c) {
    return count_include_pad ? r.size * c.size : (r.hi - r.lo) * (c.hi - c.lo);
}

// The window's sum (rows, then columns, from zero) / its divisor, in the
// compute type (f16/bf16 in f32, rounded once: the host widens to f32).
template <typename T>
__device__ __forceinline__ void avg_pool2d(const Pool2d& g, long long planes, long long channels, const T* x,
                                           long long sn, long long sc, long long sh, long long sw, T* out,
                                           int count_include_pad) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const long long olen = g.out_h * g.out_w, n = planes * olen;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long ow = e % g.out_w, oh = (e / g.out_w) % g.out_h, p = e / olen;
        const T* plane = x + (p / channels) * sn + (p % channels) * sc;
        const Window rows = window(oh, g.in_h, g.k_h, g.stride_h, g.pad_h);
        const Window cols = window(ow, g.in_w, g.k_w, g.stride_w, g.pad_w);
        C sum = (C)0;
        for (long long h = rows.lo; h < rows.hi; ++h)
            for (long long w = cols.lo; w < cols.hi; ++w) sum = add_rn(sum, E::load(plane[h * sh + w * sw]));
        out[e] = E::store(div_rn(sum, (C)avg_divisor(count_include_pad != 0, rows, cols)));
    }
}

// grad_in = Σ grad_out / divisor over the windows holding the element, in
// output order, from zero (contiguous [planes, out_h, out_w] gradients).
template <typename T>
__device__ __forceinline__ void avg_pool2d_backward(const Pool2d& g, long long planes, const T* grad_out, T* grad_in,
                                                    int count_include_pad) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const long long ilen = g.in_h * g.in_w, olen = g.out_h * g.out_w, n = planes * ilen;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long w = e % g.in_w, h = (e / g.in_w) % g.in_h, p = e / ilen;
        long long oh0, oh1, ow0, ow1;
        covering(h, g.k_h, g.stride_h, g.pad_h, g.out_h, oh0, oh1);
        covering(w, g.k_w, g.stride_w, g.pad_w, g.out_w, ow0, ow1);
        C acc = (C)0;
        for (long long oh = oh0; oh <= oh1; ++oh) {
            const Window rows = window(oh, g.in_h, g.k_h, g.stride_h, g.pad_h);
            if (h < rows.lo || h >= rows.hi) continue;
            for (long long ow = ow0; ow <= ow1; ++ow) {
                const Window cols = window(ow, g.in_w, g.k_w, g.stride_w, g.pad_w);
                if (w < cols.lo || w >= cols.hi) continue;
                const C d = (C)avg_divisor(count_include_pad != 0, rows, cols);
                acc = add_rn(acc, div_rn(E::load(grad_out[p * olen + oh * g.out_w + ow]), d));
            }
        }
        grad_in[e] = E::store(acc);
    }
}

#define INST_MAX_POOL(sfx, T)                                                                      \
    K max_pool2d_##sfx(Pool2d g, long long planes, long long channels, const T* x, long long sn, long long sc, \
                       long long sh, long long sw, T* out, long long* indices) {                   \
        max_pool2d<T>(g, planes, channels, x, sn, sc, sh, sw, out, indices);                       \
    }
#define INST_FLOAT_POOL(sfx, T)                                                                    \
    K max_pool2d_backward_##sfx(Pool2d g, long long planes, const T* grad_out, const long long* indices, T* grad_in) { \
        max_pool2d_backward<T>(g, planes, grad_out, indices, grad_in);                             \
    }                                                                                              \
    K avg_pool2d_##sfx(Pool2d g, long long planes, long long channels, const T* x, long long sn, long long sc, \
                       long long sh, long long sw, T* out, int count_include_pad) {                \
        avg_pool2d<T>(g, planes, channels, x, sn, sc, sh, sw, out, count_include_pad);             \
    }                                                                                              \
    K avg_pool2d_backward_##sfx(Pool2d g, long long planes, const T* grad_out, T* grad_in, int count_include_pad) { \
        avg_pool2d_backward<T>(g, planes, grad_out, grad_in, count_include_pad);                   \
    }
BRASA_FLOAT_TYPES(INST_MAX_POOL)
BRASA_INT_TYPES(INST_MAX_POOL)
BRASA_FLOAT_TYPES(INST_FLOAT_POOL)
