// Convolution's unfold and fold for a batch of images: im2col writes the
// column matrix of each image, col2im folds columns back onto images,
// summing where receptive fields overlap. Host twins:
// brasa_kernels::conv::{im2col, col2im} with the sizes of Conv2dGeometry,
// one image per batch entry. See ABI.md.
#include "common.cuh"

// Mirrored by brasa_kernels::cuda_ptx::Conv2d (13 i64, 104 bytes).
struct Conv2d {
    long long channels, in_h, in_w, k_h, k_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, out_h, out_w;
};
static_assert(sizeof(Conv2d) == 104, "Conv2d must match the Rust mirror");

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)

// col [batch, channels·k_h·k_w, out_h·out_w] (contiguous) from images with
// element strides (sn, sc, sh, sw); padding reads as zero.
template <typename T>
__device__ __forceinline__ void im2col(const Conv2d& g, long long batch, const T* image, long long sn, long long sc,
                                       long long sh, long long sw, T* col) {
    const long long cols = g.out_h * g.out_w, rows = g.channels * g.k_h * g.k_w;
    const long long n = batch * rows * cols;
    const T zero = Elem<T>::from_f64(0.0);
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long ow = e % g.out_w, oh = (e / g.out_w) % g.out_h, row = (e / cols) % rows, b = e / (cols * rows);
        const long long j = row % g.k_w, i = (row / g.k_w) % g.k_h, c = row / (g.k_w * g.k_h);
        const long long ih = oh * g.stride_h + i * g.dil_h - g.pad_h, iw = ow * g.stride_w + j * g.dil_w - g.pad_w;
        const bool inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
        col[e] = inside ? image[b * sn + c * sc + ih * sh + iw * sw] : zero;
    }
}

// image [batch, channels, in_h, in_w] (contiguous) = the fold of col: each
// element is 0 plus its contributions in the host's order (kernel row i,
// then column j, ascending), so f32/f64 results equal the host's. Written,
// not accumulated. f16/bf16 sum in f32 and round once.
template <typename T>
__device__ __forceinline__ void col2im(const Conv2d& g, long long batch, const T* col, T* image) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const long long cols = g.out_h * g.out_w, rows = g.channels * g.k_h * g.k_w;
    const long long n = batch * g.channels * g.in_h * g.in_w;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long iw = e % g.in_w, ih = (e / g.in_w) % g.in_h, c = (e / (g.in_w * g.in_h)) % g.channels;
        const long long b = e / (g.in_w * g.in_h * g.channels);
        const T* base = col + b * rows * cols;
        C acc = (C)0;
        for (long long i = 0; i < g.k_h; ++i) {
            const long long th = ih + g.pad_h - i * g.dil_h;
            if (th < 0 || th % g.stride_h != 0) continue;
            const long long oh = th / g.stride_h;
            if (oh >= g.out_h) continue;
            for (long long j = 0; j < g.k_w; ++j) {
                const long long tw = iw + g.pad_w - j * g.dil_w;
                if (tw < 0 || tw % g.stride_w != 0) continue;
                const long long ow = tw / g.stride_w;
                if (ow >= g.out_w) continue;
                acc = add_rn(acc, E::load(base[((c * g.k_h + i) * g.k_w + j) * cols + oh * g.out_w + ow]));
            }
        }
        image[e] = E::store(acc);
    }
}

#define INST_CONV(sfx, T)                                                                          \
    K im2col_##sfx(Conv2d g, long long batch, const T* image, long long sn, long long sc, long long sh, long long sw, \
                   T* col) {                                                                       \
        im2col<T>(g, batch, image, sn, sc, sh, sw, col);                                           \
    }                                                                                              \
    K col2im_##sfx(Conv2d g, long long batch, const T* col, T* image) { col2im<T>(g, batch, col, image); }
BRASA_FLOAT_TYPES(INST_CONV)
