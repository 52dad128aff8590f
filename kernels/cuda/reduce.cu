// Reductions over the middle dim of a contiguous [outer, len, inner] view:
// sum, mean, var, std, max, min, argmax, argmin; and partial (first-pass)
// sums, maxima and minima for reducing one long run in two passes. Host
// twins: brasa_kernels::reduce (sum, max, min, argmax, argmin, sum_sq_dev
// and their column forms) as brasa-tensor's ops/reduce.rs uses them.
// Accumulators as the host's: f16/bf16/f32 in f32, f64 in f64, integers
// and bool in i64 (wrapping). NaN propagates through sums, max and min;
// argmax/argmin give the first position of the extreme, or of the first NaN.
// See ABI.md for the launch rules.
#include "common.cuh"

template <typename T> struct Acc { typedef float A; };
template <> struct Acc<double> { typedef double A; };
template <> struct Acc<long long> { typedef long long A; };
template <> struct Acc<u8> { typedef long long A; };

__device__ __forceinline__ float acc_add(float a, float b) { return add_rn(a, b); }
__device__ __forceinline__ double acc_add(double a, double b) { return add_rn(a, b); }
__device__ __forceinline__ long long acc_add(long long a, long long b) { return wadd(a, b); }

template <typename T> __device__ __forceinline__ typename Acc<T>::A widen(T v) {
    return (typename Acc<T>::A)Elem<T>::load(v);
}
template <> __device__ __forceinline__ float widen<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) { return bf16_to_f32(v); }

// ----- ops: init, fold one element (with its position), combine two partials ------
template <typename T> struct SumOp {
    typedef typename Acc<T>::A A;
    __device__ __forceinline__ static A init() { return (A)0; }
    __device__ __forceinline__ static A fold(A acc, T v, long long) { return acc_add(acc, widen(v)); }
    __device__ __forceinline__ static A combine(A a, A b) { return acc_add(a, b); }
};
// Σ (v − mean)², each square rounded before it is added (no FMA), as sum_sq_dev.
template <typename T> struct SqDevOp {
    typedef typename Acc<T>::A A;
    A mean;
    __device__ __forceinline__ A init() const { return (A)0; }
    __device__ __forceinline__ A fold(A acc, T v, long long) const {
        A d = sub_rn(widen(v), mean);
        return add_rn(acc, mul_rn(d, d));
    }
    __device__ __forceinline__ static A combine(A a, A b) { return add_rn(a, b); }
};

// max/min keep the element type; the comparison is in the compute type.
template <typename T, bool MAX> struct ExtremeOp {
    struct A {
        T v;
        bool any;
    };
    __device__ __forceinline__ static A init() {
        A a;
        a.v = T();
        a.any = false;
        return a;
    }
    // b replaces a when it is larger (smaller), or NaN: a NaN, once in, stays.
    __device__ __forceinline__ static bool replaces(T b, T a) {
        const auto x = Elem<T>::load(b), y = Elem<T>::load(a);
        return (MAX ? x > y : x < y) || x != x;
    }
    __device__ __forceinline__ static A fold(A acc, T v, long long) {
        if (!acc.any || replaces(v, acc.v)) {
            acc.v = v;
            acc.any = true;
        }
        return acc;
    }
    __device__ __forceinline__ static A combine(A a, A b) {
        if (!b.any) return a;
        if (!a.any) return b;
        return replaces(b.v, a.v) && !(Elem<T>::load(a.v) != Elem<T>::load(a.v)) ? b : a;
    }
};

// argmax/argmin: (value, position) pairs under a total order in which the
// first NaN wins, then the extreme value, then the smaller position; so
// any combination order gives the host's answer.
template <typename T, bool MAX> struct ArgOp {
    typedef typename Elem<T>::C C;
    struct A {
        C v;
        long long at;  // -1: empty
    };
    __device__ __forceinline__ static A init() {
        A a;
        a.v = C();
        a.at = -1;
        return a;
    }
    __device__ __forceinline__ static bool better(A b, A a) {  // does b win over a?
        if (a.at < 0) return b.at >= 0;
        if (b.at < 0) return false;
        const bool bn = b.v != b.v, an = a.v != a.v;
        if (bn || an) return bn && (!an || b.at < a.at);
        if (b.v == a.v) return b.at < a.at;
        return MAX ? b.v > a.v : b.v < a.v;
    }
    __device__ __forceinline__ static A fold(A acc, T v, long long at) {
        A b;
        b.v = Elem<T>::load(v);
        b.at = at;
        return better(b, acc) ? b : acc;
    }
    __device__ __forceinline__ static A combine(A a, A b) { return better(b, a) ? b : a; }
};

// ----- block and thread drivers ----------------------------------------------------
// Reduces `v` over the block (256 threads); every thread gets the result.
template <typename A, typename Combine>
__device__ __forceinline__ A block_reduce(A v, Combine combine) {
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

// One run `x[0], x[stride], ..., x[(len-1)·stride]` folded by the whole
// block (stride 1) — each thread takes every 256th element, then a tree.
template <typename T, typename Op>
__device__ __forceinline__ typename Op::A fold_run_block(const Op& op, const T* x, long long len) {
    auto acc = op.init();
    for (long long k = threadIdx.x; k < len; k += BRASA_BLOCK) acc = op.fold(acc, x[k], k);
    return block_reduce(acc, [](typename Op::A a, typename Op::A b) { return Op::combine(a, b); });
}
// The same run folded by one thread, in order.
template <typename T, typename Op>
__device__ __forceinline__ typename Op::A fold_run_thread(const Op& op, const T* x, long long len, long long stride) {
    auto acc = op.init();
    for (long long k = 0; k < len; ++k) acc = op.fold(acc, x[k * stride], k);
    return acc;
}

// Calls finish(run start, output index, A) for every output of [outer, len,
// inner]: a block per output when inner == 1, a thread per output otherwise.
template <typename T, typename Op, typename Finish>
__device__ __forceinline__ void reduce_driver(const Op& op, long long outer, long long len, long long inner, const T* x,
                                              Finish finish) {
    if (inner == 1) {
        for (long long r = blockIdx.x; r < outer; r += gridDim.x) {
            auto a = fold_run_block(op, x + r * len, len);
            if (threadIdx.x == 0) finish(r, a);
        }
    } else {
        const long long n = outer * inner;
        for (long long o = grid_start(); o < n; o += grid_step()) {
            const long long r = o / inner, i = o % inner;
            finish(o, fold_run_thread(op, x + r * len * inner + i, len, inner));
        }
    }
}

// ----- sum, mean, var, std ----------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void reduce_sum(long long outer, long long len, long long inner, const T* x,
                                           typename Acc<T>::A* out) {
    reduce_driver(SumOp<T>(), outer, len, inner, x, [=](long long o, typename Acc<T>::A a) { out[o] = a; });
}
// sum / len in the accumulator type (0/0 = NaN for an empty run).
template <typename T>
__device__ __forceinline__ void reduce_mean(long long outer, long long len, long long inner, const T* x,
                                            typename Acc<T>::A* out) {
    typedef typename Acc<T>::A A;
    const A count = (A)len;
    reduce_driver(SumOp<T>(), outer, len, inner, x, [=](long long o, A a) { out[o] = div_rn(a, count); });
}
// Σ(v − mean)² / max(len − correction, 0), then the square root for std.
template <typename T>
__device__ __forceinline__ void reduce_variance(long long outer, long long len, long long inner, long long correction,
                                                bool take_sqrt, const T* x, typename Acc<T>::A* out) {
    typedef typename Acc<T>::A A;
    const A count = (A)len;
    const A divisor = (A)(len > correction ? len - correction : 0);
    auto finish = [=](A squares) -> A {
        if (len == 0) return (A)NAN;
        A var = div_rn(squares, divisor);
        return take_sqrt ? sqrt(var) : var;
    };
    if (inner == 1) {
        for (long long r = blockIdx.x; r < outer; r += gridDim.x) {
            const T* row = x + r * len;
            SqDevOp<T> sq;
            sq.mean = div_rn(fold_run_block(SumOp<T>(), row, len), count);
            A squares = fold_run_block(sq, row, len);
            if (threadIdx.x == 0) out[r] = finish(squares);
        }
    } else {
        const long long n = outer * inner;
        for (long long o = grid_start(); o < n; o += grid_step()) {
            const T* col = x + (o / inner) * len * inner + o % inner;
            SqDevOp<T> sq;
            sq.mean = div_rn(fold_run_thread(SumOp<T>(), col, len, inner), count);
            out[o] = finish(fold_run_thread(sq, col, len, inner));
        }
    }
}

template <typename T, bool MAX>
__device__ __forceinline__ void reduce_extreme(long long outer, long long len, long long inner, const T* x, T* out) {
    typedef ExtremeOp<T, MAX> Op;
    reduce_driver(Op(), outer, len, inner, x, [=](long long o, typename Op::A a) { out[o] = a.v; });
}
template <typename T, bool MAX>
__device__ __forceinline__ void reduce_arg(long long outer, long long len, long long inner, const T* x, long long* out) {
    typedef ArgOp<T, MAX> Op;
    reduce_driver(Op(), outer, len, inner, x, [=](long long o, typename Op::A a) { out[o] = a.at < 0 ? 0 : a.at; });
}

// First pass of a two-pass reduction of one contiguous run of n elements:
// block b folds x[b·chunk .. min(n, (b+1)·chunk)) into partial[b]. The
// second pass is reduce_sum_<acc>/reduce_max_<T>/reduce_min_<T> over the
// partials as [1, blocks, 1].
template <typename T, typename Op, typename Finish>
__device__ __forceinline__ void partial_driver(const Op& op, long long n, long long chunk, const T* x, Finish finish) {
    const long long blocks = (n + chunk - 1) / chunk;
    for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
        const long long begin = b * chunk, end = begin + chunk < n ? begin + chunk : n;
        auto a = fold_run_block(op, x + begin, end - begin);
        if (threadIdx.x == 0) finish(b, a);
    }
}

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)
#define INST_SUM(sfx, T)                                                                            \
    K reduce_sum_##sfx(long long outer, long long len, long long inner, const T* x, Acc<T>::A* out) { \
        reduce_sum<T>(outer, len, inner, x, out);                                                   \
    }                                                                                               \
    K reduce_partial_sum_##sfx(long long n, long long chunk, const T* x, Acc<T>::A* partial) {      \
        partial_driver(SumOp<T>(), n, chunk, x, [=](long long b, Acc<T>::A a) { partial[b] = a; }); \
    }
#define INST_MEAN_VAR(sfx, T)                                                                       \
    K reduce_mean_##sfx(long long outer, long long len, long long inner, const T* x, Acc<T>::A* out) { \
        reduce_mean<T>(outer, len, inner, x, out);                                                  \
    }                                                                                               \
    K reduce_var_##sfx(long long outer, long long len, long long inner, long long correction, const T* x, \
                       Acc<T>::A* out) {                                                            \
        reduce_variance<T>(outer, len, inner, correction, false, x, out);                           \
    }                                                                                               \
    K reduce_std_##sfx(long long outer, long long len, long long inner, long long correction, const T* x, \
                       Acc<T>::A* out) {                                                            \
        reduce_variance<T>(outer, len, inner, correction, true, x, out);                            \
    }
#define INST_EXTREMES(sfx, T)                                                                       \
    K reduce_max_##sfx(long long outer, long long len, long long inner, const T* x, T* out) {       \
        reduce_extreme<T, true>(outer, len, inner, x, out);                                         \
    }                                                                                               \
    K reduce_min_##sfx(long long outer, long long len, long long inner, const T* x, T* out) {       \
        reduce_extreme<T, false>(outer, len, inner, x, out);                                        \
    }                                                                                               \
    K reduce_argmax_##sfx(long long outer, long long len, long long inner, const T* x, long long* out) { \
        reduce_arg<T, true>(outer, len, inner, x, out);                                             \
    }                                                                                               \
    K reduce_argmin_##sfx(long long outer, long long len, long long inner, const T* x, long long* out) { \
        reduce_arg<T, false>(outer, len, inner, x, out);                                            \
    }                                                                                               \
    K reduce_partial_max_##sfx(long long n, long long chunk, const T* x, T* partial) {              \
        partial_driver(ExtremeOp<T, true>(), n, chunk, x,                                           \
                       [=](long long b, ExtremeOp<T, true>::A a) { partial[b] = a.v; });            \
    }                                                                                               \
    K reduce_partial_min_##sfx(long long n, long long chunk, const T* x, T* partial) {              \
        partial_driver(ExtremeOp<T, false>(), n, chunk, x,                                          \
                       [=](long long b, ExtremeOp<T, false>::A a) { partial[b] = a.v; });           \
    }

BRASA_FLOAT_TYPES(INST_SUM)
BRASA_INT_TYPES(INST_SUM)
BRASA_FLOAT_TYPES(INST_MEAN_VAR)
BRASA_FLOAT_TYPES(INST_EXTREMES)
BRASA_INT_TYPES(INST_EXTREMES)

// bool: the sum counts the true elements (i64); max is "any", min is "all";
// argmax/argmin compare 0/1. Stored as u8 0/1, so the u8 code serves.
K reduce_sum_bool(long long outer, long long len, long long inner, const u8* x, long long* out) {
    reduce_sum<u8>(outer, len, inner, x, out);
}
K reduce_partial_sum_bool(long long n, long long chunk, const u8* x, long long* partial) {
    partial_driver(SumOp<u8>(), n, chunk, x, [=](long long b, long long a) { partial[b] = a; });
}
INST_EXTREMES(bool, u8)
