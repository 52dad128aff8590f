// Layer normalisation of the rows of a contiguous [rows, width] matrix, in
// f32 or f64 (callers widen half types first). Host twins:
// brasa_kernels::norm::{layer_norm_row, layer_norm_backward_row}.
//
// layer_norm_fwd_<T>:      one block per row (blocks loop over rows): mean,
//                          biased variance (two passes over the row),
//                          rstd = 1/sqrt(var + eps), y = (x - mean)·rstd·w + b.
// layer_norm_bwd_dx_<T>:   one block per row: with x̂ = (x - mean)·rstd and
//                          ĝ = g·w, dx = rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)).
// layer_norm_bwd_param_<T>: adds dw = Σ g·x̂ and db = Σ g into zeroed outputs;
//                          2-d grid (⌈width/32⌉, row chunks) of 256 threads.
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

// Blocks of 32 columns x 8 row lanes; blockIdx.y takes one chunk of the
// rows (⌈rows / gridDim.y⌉), each lane sums every 8th row of it, the lanes
// are folded in shared memory and the block's sums are added to dw/db with
// atomics (the caller zeroes them). One thread per column over every row
// (the old form) left most of the GPU idle: 16,384 rows of a 384-wide layer
// took 4.4 ms where this takes tens of microseconds.
template <typename C>
__device__ __forceinline__ void layer_norm_bwd_param(long long rows, long long width, const C* g, const C* x,
                                                     const C* mean, const C* rstd, C* dw, C* db) {
    __shared__ C part_w[8][33];
    __shared__ C part_b[8][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const long long k = (long long)blockIdx.x * 32 + tx;
    const long long chunk = (rows + gridDim.y - 1) / gridDim.y;
    const long long start = (long long)blockIdx.y * chunk;
    const long long end = start + chunk < rows ? start + chunk : rows;
    C acc_w = (C)0, acc_b = (C)0;
    if (k < width) {
        for (long long r = start + ty; r < end; r += 8) {
            const C gv = g[r * width + k];
            if (dw) acc_w = add_rn(acc_w, mul_rn(gv, mul_rn(sub_rn(x[r * width + k], mean[r]), rstd[r])));
            acc_b = add_rn(acc_b, gv);
        }
    }
    part_w[ty][tx] = acc_w;
    part_b[ty][tx] = acc_b;
    __syncthreads();
    if (ty == 0 && k < width && start < end) {
        for (int i = 1; i < 8; ++i) {
            acc_w = add_rn(acc_w, part_w[i][tx]);
            acc_b = add_rn(acc_b, part_b[i][tx]);
        }
        if (dw) atomicAdd(dw + k, acc_w);
        if (db) atomicAdd(db + k, acc_b);
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

// ----- batch normalisation ----------------------------------------------------
// Per-channel passes over a contiguous [n, c, s] tensor of any float type T,
// computed in Elem<T>::C (f32 for f16/bf16). Host twins:
// brasa_kernels::batch_norm::{channel_stats, elemt_run,
// channel_backward_reduce, backward_elemt_run}.
//
// batch_norm_stats_<T>:       one block per channel (blocks loop over
//                             channels): mean, then the biased variance
//                             (two passes), into [c] of C.
// batch_norm_elemt_<T>:       grid-stride over elements:
//                             out = (x - mean)·scale + shift, rounded once to T.
// batch_norm_bwd_reduce_<T>:  one block per channel: Σ dy and Σ dy·(x - mean).
// batch_norm_bwd_elemt_<T>:   grid-stride: dx = scale·(dy - mean_dy - (x - mean)·k).

template <typename T>
__device__ __forceinline__ void batch_norm_stats(long long n, long long c, long long s, const T* x,
                                                 typename Elem<T>::C* mean_out, typename Elem<T>::C* var_out) {
    typedef typename Elem<T>::C C;
    const long long per = n * s;
    const C count = (C)(per > 0 ? per : 1);
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        C total = (C)0;
        for (long long k = threadIdx.x; k < per; k += BRASA_BLOCK) {
            const long long i = k / s, j = k - i * s;
            total = add_rn(total, Elem<T>::load(x[(i * c + ch) * s + j]));
        }
        const C mean = per > 0 ? div_rn(block_sum(total), count) : (C)0;
        C squares = (C)0;
        for (long long k = threadIdx.x; k < per; k += BRASA_BLOCK) {
            const long long i = k / s, j = k - i * s;
            const C d = sub_rn(Elem<T>::load(x[(i * c + ch) * s + j]), mean);
            squares = add_rn(squares, mul_rn(d, d));
        }
        const C var = per > 0 ? div_rn(block_sum(squares), count) : (C)0;
        if (threadIdx.x == 0) {
            mean_out[ch] = mean;
            var_out[ch] = var;
        }
    }
}

// The channel of element k of a contiguous [n, c, s] of `total` elements.
// 64-bit division is many instructions on the GPU, and the element-wise
// passes are otherwise a load, a few flops and a store: index spaces below
// 2^32 elements take 32-bit quotients.
__device__ __forceinline__ long long channel_of(long long k, long long c, long long s, long long total) {
    if (total <= 0xffffffffLL) {
        const unsigned int i = (unsigned int)k;
        const unsigned int row = s == 1 ? i : i / (unsigned int)s;
        return (long long)(row % (unsigned int)c);
    }
    return (k / s) % c;
}

template <typename T>
__device__ __forceinline__ void batch_norm_elemt(long long n, long long c, long long s, const T* x,
                                                 const typename Elem<T>::C* mean, const typename Elem<T>::C* scale,
                                                 const typename Elem<T>::C* shift, T* out) {
    typedef typename Elem<T>::C C;
    const long long total = n * c * s;
    for (long long k = grid_start(); k < total; k += grid_step()) {
        const long long ch = channel_of(k, c, s, total);
        const C y = add_rn(mul_rn(sub_rn(Elem<T>::load(x[k]), mean[ch]), scale[ch]), shift[ch]);
        out[k] = Elem<T>::store(y);
    }
}

template <typename T>
__device__ __forceinline__ void batch_norm_bwd_reduce(long long n, long long c, long long s, const T* dy, const T* x,
                                                      const typename Elem<T>::C* mean, typename Elem<T>::C* sum_dy,
                                                      typename Elem<T>::C* sum_dy_xmu) {
    typedef typename Elem<T>::C C;
    const long long per = n * s;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const C m = mean[ch];
        C sg = (C)0, sgx = (C)0;
        for (long long k = threadIdx.x; k < per; k += BRASA_BLOCK) {
            const long long i = k / s, j = k - i * s;
            const long long at = (i * c + ch) * s + j;
            const C g = Elem<T>::load(dy[at]);
            sg = add_rn(sg, g);
            sgx = add_rn(sgx, mul_rn(g, sub_rn(Elem<T>::load(x[at]), m)));
        }
        sg = block_sum(sg);
        sgx = block_sum(sgx);
        if (threadIdx.x == 0) {
            sum_dy[ch] = sg;
            sum_dy_xmu[ch] = sgx;
        }
    }
}

template <typename T>
__device__ __forceinline__ void batch_norm_bwd_elemt(long long n, long long c, long long s, const T* dy, const T* x,
                                                     const typename Elem<T>::C* mean,
                                                     const typename Elem<T>::C* scale,
                                                     const typename Elem<T>::C* mean_dy,
                                                     const typename Elem<T>::C* k_coef, T* dx) {
    typedef typename Elem<T>::C C;
    const long long total = n * c * s;
    for (long long k = grid_start(); k < total; k += grid_step()) {
        const long long ch = channel_of(k, c, s, total);
        const C centred = mul_rn(sub_rn(Elem<T>::load(x[k]), mean[ch]), k_coef[ch]);
        const C g = sub_rn(sub_rn(Elem<T>::load(dy[k]), mean_dy[ch]), centred);
        dx[k] = Elem<T>::store(mul_rn(scale[ch], g));
    }
}

// ----- batch normalisation's reductions of [rows, c] (channels last) --------------
// A channels-last [N, C, H, W] is seen as [N·H·W, C, 1] (and a 2-d [N, C]
// as [N, C, 1]): a block per channel would read every element c apart.
// These kernels read across the channels instead: a block covers 32
// neighbouring channels (threadIdx.x % 32, so a warp reads 32 neighbouring
// elements of a row) and 8 row lanes (threadIdx.x / 32) of one piece of
// `rows_per_piece` rows (blocks loop over tiles in x and pieces in y). Each
// block writes its piece's partial result per channel into `partial`
// ([2, pieces, c] of C), and a second kernel folds the pieces in order: no
// atomics, so the result is the same on every run.
//
// batch_norm_stats_rows_<T>:        per piece and channel, the mean and the
//                                   sum of squared deviations (Welford per
//                                   lane, Chan's merge across the lanes).
// batch_norm_stats_merge_<C>:       Chan's merge of the pieces: mean and
//                                   biased variance into [c].
// batch_norm_bwd_reduce_rows_<T>:   per piece and channel Σ dy and
//                                   Σ dy·(x − mean).
// batch_norm_bwd_reduce_merge_<C>:  the pieces' sums into [c] and [c].
//
// Host twin of the fold: brasa-tensor's backend/args/norm.rs (tests).

#define BN_LANES 8

// A count, a mean and a sum of squared deviations from it.
template <typename C>
struct Moments {
    long long count;
    C mean;
    C m2;
};

// Chan et al.'s pairwise update: the moments of two disjoint parts' union.
template <typename C>
__device__ __forceinline__ Moments<C> merge_moments(Moments<C> a, Moments<C> b) {
    if (b.count == 0) return a;
    if (a.count == 0) return b;
    Moments<C> r;
    r.count = a.count + b.count;
    const C delta = sub_rn(b.mean, a.mean);
    const C share_b = div_rn((C)b.count, (C)r.count);
    r.mean = add_rn(a.mean, mul_rn(delta, share_b));
    r.m2 = add_rn(add_rn(a.m2, b.m2), mul_rn(mul_rn(delta, delta), mul_rn((C)a.count, share_b)));
    return r;
}

// Rows [start, end) of piece `p`.
__device__ __forceinline__ void piece_rows(long long p, long long rows, long long rows_per_piece, long long* start,
                                           long long* end) {
    *start = p * rows_per_piece;
    *end = *start + rows_per_piece < rows ? *start + rows_per_piece : rows;
}

template <typename T>
__device__ __forceinline__ void batch_norm_stats_rows(long long rows, long long c, long long rows_per_piece,
                                                      long long pieces, const T* x, typename Elem<T>::C* partial) {
    typedef typename Elem<T>::C C;
    __shared__ Moments<C> lanes[BN_LANES][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (long long tile = blockIdx.x; tile * 32 < c; tile += gridDim.x) {
        const long long ch = tile * 32 + tx;
        for (long long p = blockIdx.y; p < pieces; p += gridDim.y) {
            long long start, end;
            piece_rows(p, rows, rows_per_piece, &start, &end);
            Moments<C> m = {0, (C)0, (C)0};
            if (ch < c) {
#pragma unroll 4
                for (long long r = start + ty; r < end; r += BN_LANES) {
                    const C v = Elem<T>::load(x[r * c + ch]);
                    m.count += 1;
                    const C delta = sub_rn(v, m.mean);
                    m.mean = add_rn(m.mean, div_rn(delta, (C)m.count));
                    m.m2 = add_rn(m.m2, mul_rn(delta, sub_rn(v, m.mean)));
                }
            }
            lanes[ty][tx] = m;
            __syncthreads();
            if (ty == 0 && ch < c) {
                for (int i = 1; i < BN_LANES; ++i) m = merge_moments(m, lanes[i][tx]);
                partial[p * c + ch] = m.mean;
                partial[(pieces + p) * c + ch] = m.m2;
            }
            __syncthreads();
        }
    }
}

template <typename C>
__device__ __forceinline__ void batch_norm_stats_merge(long long rows, long long c, long long rows_per_piece,
                                                       long long pieces, const C* partial, C* mean_out, C* var_out) {
    __shared__ Moments<C> lanes[BN_LANES][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (long long tile = blockIdx.x; tile * 32 < c; tile += gridDim.x) {
        const long long ch = tile * 32 + tx;
        Moments<C> m = {0, (C)0, (C)0};
        if (ch < c) {
            for (long long p = ty; p < pieces; p += BN_LANES) {
                long long start, end;
                piece_rows(p, rows, rows_per_piece, &start, &end);
                const Moments<C> piece = {end - start, partial[p * c + ch], partial[(pieces + p) * c + ch]};
                m = merge_moments(m, piece);
            }
        }
        lanes[ty][tx] = m;
        __syncthreads();
        if (ty == 0 && ch < c) {
            for (int i = 1; i < BN_LANES; ++i) m = merge_moments(m, lanes[i][tx]);
            mean_out[ch] = m.mean;
            var_out[ch] = m.count > 0 ? div_rn(m.m2, (C)m.count) : (C)0;
        }
        __syncthreads();
    }
}

template <typename T>
__device__ __forceinline__ void batch_norm_bwd_reduce_rows(long long rows, long long c, long long rows_per_piece,
                                                           long long pieces, const T* dy, const T* x,
                                                           const typename Elem<T>::C* mean,
                                                           typename Elem<T>::C* partial) {
    typedef typename Elem<T>::C C;
    __shared__ C lane_dy[BN_LANES][32];
    __shared__ C lane_dy_xmu[BN_LANES][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (long long tile = blockIdx.x; tile * 32 < c; tile += gridDim.x) {
        const long long ch = tile * 32 + tx;
        const C mu = ch < c ? mean[ch] : (C)0;
        for (long long p = blockIdx.y; p < pieces; p += gridDim.y) {
            long long start, end;
            piece_rows(p, rows, rows_per_piece, &start, &end);
            C sg = (C)0, sgx = (C)0;
            if (ch < c) {
#pragma unroll 4
                for (long long r = start + ty; r < end; r += BN_LANES) {
                    const long long at = r * c + ch;
                    const C g = Elem<T>::load(dy[at]);
                    sg = add_rn(sg, g);
                    sgx = add_rn(sgx, mul_rn(g, sub_rn(Elem<T>::load(x[at]), mu)));
                }
            }
            lane_dy[ty][tx] = sg;
            lane_dy_xmu[ty][tx] = sgx;
            __syncthreads();
            if (ty == 0 && ch < c) {
                for (int i = 1; i < BN_LANES; ++i) {
                    sg = add_rn(sg, lane_dy[i][tx]);
                    sgx = add_rn(sgx, lane_dy_xmu[i][tx]);
                }
                partial[p * c + ch] = sg;
                partial[(pieces + p) * c + ch] = sgx;
            }
            __syncthreads();
        }
    }
}

template <typename C>
__device__ __forceinline__ void batch_norm_bwd_reduce_merge(long long c, long long pieces, const C* partial,
                                                            C* sum_dy, C* sum_dy_xmu) {
    __shared__ C lane_dy[BN_LANES][32];
    __shared__ C lane_dy_xmu[BN_LANES][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (long long tile = blockIdx.x; tile * 32 < c; tile += gridDim.x) {
        const long long ch = tile * 32 + tx;
        C sg = (C)0, sgx = (C)0;
        if (ch < c) {
            for (long long p = ty; p < pieces; p += BN_LANES) {
                sg = add_rn(sg, partial[p * c + ch]);
                sgx = add_rn(sgx, partial[(pieces + p) * c + ch]);
            }
        }
        lane_dy[ty][tx] = sg;
        lane_dy_xmu[ty][tx] = sgx;
        __syncthreads();
        if (ty == 0 && ch < c) {
            for (int i = 1; i < BN_LANES; ++i) {
                sg = add_rn(sg, lane_dy[i][tx]);
                sgx = add_rn(sgx, lane_dy_xmu[i][tx]);
            }
            sum_dy[ch] = sg;
            sum_dy_xmu[ch] = sgx;
        }
        __syncthreads();
    }
}

#define INST_BATCH_NORM_MERGE(sfx, C)                                                                        \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_stats_merge_##sfx(long long rows, long long c, long long rows_per_piece, long long pieces, \
                                     const C* partial, C* mean, C* var) {                                   \
        batch_norm_stats_merge<C>(rows, c, rows_per_piece, pieces, partial, mean, var);                     \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_bwd_reduce_merge_##sfx(long long rows, long long c, long long rows_per_piece,            \
                                          long long pieces, const C* partial, C* sum_dy, C* sum_dy_xmu) {   \
        batch_norm_bwd_reduce_merge<C>(c, pieces, partial, sum_dy, sum_dy_xmu);                             \
    }
INST_BATCH_NORM_MERGE(f32, float)
INST_BATCH_NORM_MERGE(f64, double)

#define INST_BATCH_NORM(sfx, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_stats_##sfx(long long n, long long c, long long s, const T* x, Elem<T>::C* mean,          \
                               Elem<T>::C* var) {                                                           \
        batch_norm_stats<T>(n, c, s, x, mean, var);                                                         \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_elemt_##sfx(long long n, long long c, long long s, const T* x, const Elem<T>::C* mean,    \
                               const Elem<T>::C* scale, const Elem<T>::C* shift, T* out) {                  \
        batch_norm_elemt<T>(n, c, s, x, mean, scale, shift, out);                                           \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_bwd_reduce_##sfx(long long n, long long c, long long s, const T* dy, const T* x,          \
                                    const Elem<T>::C* mean, Elem<T>::C* sum_dy, Elem<T>::C* sum_dy_xmu) {   \
        batch_norm_bwd_reduce<T>(n, c, s, dy, x, mean, sum_dy, sum_dy_xmu);                                 \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_bwd_elemt_##sfx(long long n, long long c, long long s, const T* dy, const T* x,           \
                                   const Elem<T>::C* mean, const Elem<T>::C* scale,                         \
                                   const Elem<T>::C* mean_dy, const Elem<T>::C* k, T* dx) {                 \
        batch_norm_bwd_elemt<T>(n, c, s, dy, x, mean, scale, mean_dy, k, dx);                               \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_stats_rows_##sfx(long long rows, long long c, long long rows_per_piece, long long pieces,  \
                                    const T* x, Elem<T>::C* partial) {                                      \
        batch_norm_stats_rows<T>(rows, c, rows_per_piece, pieces, x, partial);                              \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                               \
        batch_norm_bwd_reduce_rows_##sfx(long long rows, long long c, long long rows_per_piece,             \
                                         long long pieces, const T* dy, const T* x, const Elem<T>::C* mean, \
                                         Elem<T>::C* partial) {                                             \
        batch_norm_bwd_reduce_rows<T>(rows, c, rows_per_piece, pieces, dy, x, mean, partial);               \
    }
INST_BATCH_NORM(f32, float)
INST_BATCH_NORM(f64, double)
INST_BATCH_NORM(f16, __half)
INST_BATCH_NORM(bf16, __nv_bfloat16)
