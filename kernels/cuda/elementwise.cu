// Elementwise kernels on strided operands: unary, binary (and the fused
// in-place updates), ternary, comparisons and where. Host twins:
// brasa_kernels::elementwise::{unary, binary, axpy, addcmul, addcdiv} and
// the integer/bool closures of brasa-tensor's ops/{unary, binary,
// inplace_unary, inplace_arith, compare}.rs. See ABI.md.
#include "common.cuh"

// ----- math overloads on the compute type -------------------------------------
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return cos(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_pow(float x, float p) { return powf(x, p); }
__device__ __forceinline__ double m_pow(double x, double p) { return pow(x, p); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

// ----- loops --------------------------------------------------------------------
template <typename T, typename U, typename F>
__device__ __forceinline__ void map1(const Strided& s, const T* x, U* out, F f) {
    const long long n = s.numel, start = grid_start(), step = grid_step();
    if (s.rank <= 1) {
        const long long so = s.rank == 1 ? s.strides[0][0] : 0, sx = s.rank == 1 ? s.strides[1][0] : 0;
#pragma unroll 1
        for (long long i = start; i < n; i += step) out[i * so] = f(x[i * sx]);
        return;
    }
#pragma unroll 1
    for (long long i = start; i < n; i += step) {
        long long off[2];
        strided_offsets<2>(s, i, off);
        out[off[0]] = f(x[off[1]]);
    }
}

template <typename A, typename B, typename U, typename F>
__device__ __forceinline__ void map2(const Strided& s, const A* a, const B* b, U* out, F f) {
    const long long n = s.numel, start = grid_start(), step = grid_step();
    if (s.rank <= 1) {
        const bool r1 = s.rank == 1;
        const long long so = r1 ? s.strides[0][0] : 0, sa = r1 ? s.strides[1][0] : 0, sb = r1 ? s.strides[2][0] : 0;
#pragma unroll 1
        for (long long i = start; i < n; i += step) out[i * so] = f(a[i * sa], b[i * sb]);
        return;
    }
#pragma unroll 1
    for (long long i = start; i < n; i += step) {
        long long off[3];
        strided_offsets<3>(s, i, off);
        out[off[0]] = f(a[off[1]], b[off[2]]);
    }
}

template <typename A, typename B, typename C, typename U, typename F>
__device__ __forceinline__ void map3(const Strided& s, const A* a, const B* b, const C* c, U* out, F f) {
    const long long n = s.numel, start = grid_start(), step = grid_step();
    if (s.rank <= 1) {
        const bool r1 = s.rank == 1;
        const long long so = r1 ? s.strides[0][0] : 0, sa = r1 ? s.strides[1][0] : 0;
        const long long sb = r1 ? s.strides[2][0] : 0, sc = r1 ? s.strides[3][0] : 0;
#pragma unroll 1
        for (long long i = start; i < n; i += step) out[i * so] = f(a[i * sa], b[i * sb], c[i * sc]);
        return;
    }
#pragma unroll 1
    for (long long i = start; i < n; i += step) {
        long long off[4];
        strided_offsets<4>(s, i, off);
        out[off[0]] = f(a[off[1]], b[off[2]], c[off[3]]);
    }
}

// A float op on the compute type, with one rounding on store.
template <typename T, typename F>
__device__ __forceinline__ void float_unary(const Strided& s, const T* x, T* out, F f) {
    typedef Elem<T> E;
    map1(s, x, out, [=](T v) { return E::store(f(E::load(v))); });
}
// A function computed in f64, as brasa-tensor's float_in_place_f64:
// store(Compute::from_f64(f(load(v) as f64))).
template <typename T, typename F>
__device__ __forceinline__ void f64_unary(const Strided& s, const T* x, T* out, F f) {
    typedef Elem<T> E;
    map1(s, x, out, [=](T v) { return E::store(E::compute_from_f64(f((double)E::load(v)))); });
}

// ----- unary: floats --------------------------------------------------------------
#define FLOAT_UNARY(op, expr)                                                                          \
    template <typename T>                                                                              \
    __device__ __forceinline__ void unary_##op(const Strided& s, const T* x, T* out, double p0, double p1) { \
        typedef typename Elem<T>::C C;                                                                 \
        (void)p0;                                                                                      \
        (void)p1;                                                                                      \
        float_unary(s, x, out, [=](C v) -> C { return (expr); });                                      \
    }

FLOAT_UNARY(neg, -v)
FLOAT_UNARY(abs, m_abs(v))
FLOAT_UNARY(exp, m_exp(v))
FLOAT_UNARY(log, m_log(v))
FLOAT_UNARY(sqrt, m_sqrt(v))
FLOAT_UNARY(rsqrt, div_rn((C)1, m_sqrt(v)))
FLOAT_UNARY(sin, m_sin(v))
FLOAT_UNARY(cos, m_cos(v))
FLOAT_UNARY(tanh, m_tanh(v))
FLOAT_UNARY(sigmoid, div_rn((C)1, add_rn((C)1, m_exp(-v))))
// `v < 0` is false for NaN, which passes through.
FLOAT_UNARY(relu, v < (C)0 ? (C)0 : v)
// 0.5·x·erfc(−x/√2) computed in f64 (the host's Float::gelu for f32 and f64).
FLOAT_UNARY(gelu, (C)mul_rn(mul_rn(0.5, (double)v), erfc(mul_rn(-(double)v, 0.70710678118654752440))))
FLOAT_UNARY(gelu_tanh,
            mul_rn(mul_rn((C)0.5, v),
                   add_rn((C)1, m_tanh(mul_rn((C)0.7978845608028654,
                                              add_rn(v, mul_rn(mul_rn(mul_rn((C)0.044715, v), v), v)))))))
FLOAT_UNARY(silu, div_rn(v, add_rn((C)1, m_exp(-v))))

// x^p0 with the host's exact shortcuts (UnaryOp::Powf).
template <typename T>
__device__ __forceinline__ void unary_powf(const Strided& s, const T* x, T* out, double p, double) {
    typedef typename Elem<T>::C C;
    if (p == 2.0) {
        float_unary(s, x, out, [=](C v) -> C { return mul_rn(v, v); });
    } else if (p == 3.0) {
        float_unary(s, x, out, [=](C v) -> C { return mul_rn(mul_rn(v, v), v); });
    } else if (p == 0.5) {
        float_unary(s, x, out, [=](C v) -> C { return m_sqrt(v); });
    } else if (p == -0.5) {
        float_unary(s, x, out, [=](C v) -> C { return div_rn((C)1, m_sqrt(v)); });
    } else if (p == 1.0) {
        float_unary(s, x, out, [=](C v) -> C { return v; });
    } else if (p == -1.0) {
        float_unary(s, x, out, [=](C v) -> C { return div_rn((C)1, v); });
    } else if (p == -2.0) {
        float_unary(s, x, out, [=](C v) -> C { return div_rn((C)1, mul_rn(v, v)); });
    } else {
        const C e = Elem<T>::compute_from_f64(p);
        float_unary(s, x, out, [=](C v) -> C { return m_pow(v, e); });
    }
}

// min(max(x, p0), p1) as the host's Clamp: NaN stays NaN; min > max gives max.
template <typename T>
__device__ __forceinline__ void unary_clamp(const Strided& s, const T* x, T* out, double p0, double p1) {
    typedef typename Elem<T>::C C;
    const C lo = Elem<T>::compute_from_f64(p0), hi = Elem<T>::compute_from_f64(p1);
    float_unary(s, x, out, [=](C v) -> C {
        C y = v < lo ? lo : v;
        return y > hi ? hi : y;
    });
}

// x·p0 + p1, skipping the add when p1 == 0 and the multiply when p0 == 1.
template <typename T>
__device__ __forceinline__ void unary_affine(const Strided& s, const T* x, T* out, double mul, double add) {
    typedef typename Elem<T>::C C;
    const C m = Elem<T>::compute_from_f64(mul), a = Elem<T>::compute_from_f64(add);
    if (add == 0.0) {
        float_unary(s, x, out, [=](C v) -> C { return mul_rn(v, m); });
    } else if (mul == 1.0) {
        float_unary(s, x, out, [=](C v) -> C { return add_rn(v, a); });
    } else {
        float_unary(s, x, out, [=](C v) -> C { return add_rn(mul_rn(v, m), a); });
    }
}

template <typename T>
__device__ __forceinline__ void unary_log1p(const Strided& s, const T* x, T* out, double, double) {
    f64_unary(s, x, out, [](double v) { return log1p(v); });
}
template <typename T>
__device__ __forceinline__ void unary_log_sigmoid(const Strided& s, const T* x, T* out, double, double) {
    f64_unary(s, x, out, [](double v) {
        if (v != v) return v;
        return sub_rn(fmin(v, 0.0), log1p(exp(-fabs(v))));
    });
}

#define INST_FLOAT_UNARY(op, sfx, T)                                                               \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        unary_##op##_##sfx(Strided s, const T* x, T* out, double p0, double p1) {                  \
        unary_##op<T>(s, x, out, p0, p1);                                                          \
    }
#define INST_FLOAT_UNARY_ALL(sfx, T)                                                               \
    INST_FLOAT_UNARY(neg, sfx, T) INST_FLOAT_UNARY(abs, sfx, T) INST_FLOAT_UNARY(exp, sfx, T)      \
    INST_FLOAT_UNARY(log, sfx, T) INST_FLOAT_UNARY(sqrt, sfx, T) INST_FLOAT_UNARY(rsqrt, sfx, T)   \
    INST_FLOAT_UNARY(sin, sfx, T) INST_FLOAT_UNARY(cos, sfx, T) INST_FLOAT_UNARY(tanh, sfx, T)     \
    INST_FLOAT_UNARY(sigmoid, sfx, T) INST_FLOAT_UNARY(relu, sfx, T) INST_FLOAT_UNARY(gelu, sfx, T) \
    INST_FLOAT_UNARY(gelu_tanh, sfx, T) INST_FLOAT_UNARY(silu, sfx, T)                             \
    INST_FLOAT_UNARY(powf, sfx, T) INST_FLOAT_UNARY(clamp, sfx, T)                                 \
    INST_FLOAT_UNARY(affine, sfx, T) INST_FLOAT_UNARY(log1p, sfx, T)                               \
    INST_FLOAT_UNARY(log_sigmoid, sfx, T)
BRASA_FLOAT_TYPES(INST_FLOAT_UNARY_ALL)

// ----- unary: integers (i64, u8), wrapping like the host ---------------------------
template <typename T> __device__ __forceinline__ T int_abs(T v) { return v; }
template <> __device__ __forceinline__ long long int_abs(long long v) { return v < 0 ? wneg(v) : v; }

#define INT_UNARY(op, ...)                                                                        \
    template <typename T>                                                                          \
    __device__ __forceinline__ void int_unary_##op(const Strided& s, const T* x, T* out, double p0, double p1) { \
        (void)p0;                                                                                  \
        (void)p1;                                                                                  \
        __VA_ARGS__                                                                                \
    }
INT_UNARY(neg, map1(s, x, out, [](T v) { return wneg(v); });)
INT_UNARY(abs, map1(s, x, out, [](T v) { return int_abs(v); });)
INT_UNARY(relu, map1(s, x, out, [](T v) { return v > (T)0 ? v : (T)0; });)
// Bounds converted as WithDType::from_f64 (saturating; +-inf to the extremes).
INT_UNARY(clamp, {
    const T lo = Elem<T>::from_f64(p0), hi = Elem<T>::from_f64(p1);
    map1(s, x, out, [=](T v) {
        T y = v > lo ? v : lo;
        return y < hi ? y : hi;
    });
})
// v·mul + add, wrapping; mul and add are integral (checked by the caller),
// wrapped into the type like T::from_i64.
INT_UNARY(affine, {
    const T m = Elem<T>::from_i64(f64_to_i64_sat(p0)), a = Elem<T>::from_i64(f64_to_i64_sat(p1));
    map1(s, x, out, [=](T v) { return wadd(wmul(v, m), a); });
})
// v^p0 for an integral p0 >= 0, in i64 (wrapping), narrowed to the type.
INT_UNARY(powf, {
    const long long e = f64_to_i64_sat(p0);
    map1(s, x, out, [=](T v) { return Elem<T>::from_i64(int_pow((long long)v, e)); });
})

#define INST_INT_UNARY(op, sfx, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        unary_##op##_##sfx(Strided s, const T* x, T* out, double p0, double p1) {                  \
        int_unary_##op<T>(s, x, out, p0, p1);                                                      \
    }
#define INST_INT_UNARY_ALL(sfx, T)                                                                 \
    INST_INT_UNARY(neg, sfx, T) INST_INT_UNARY(abs, sfx, T) INST_INT_UNARY(relu, sfx, T)           \
    INST_INT_UNARY(clamp, sfx, T) INST_INT_UNARY(affine, sfx, T) INST_INT_UNARY(powf, sfx, T)
BRASA_INT_TYPES(INST_INT_UNARY_ALL)

// ----- binary ---------------------------------------------------------------------------
#define FLOAT_BINARY(op, expr)                                                                     \
    template <typename T>                                                                          \
    __device__ __forceinline__ void binary_##op(const Strided& s, const T* a, const T* b, T* out) { \
        typedef Elem<T> E;                                                                         \
        typedef typename E::C C;                                                                   \
        map2(s, a, b, out, [](T va, T vb) {                                                        \
            const C x = E::load(va), y = E::load(vb);                                              \
            return E::store(expr);                                                                 \
        });                                                                                        \
    }
FLOAT_BINARY(add, add_rn(x, y))
FLOAT_BINARY(sub, sub_rn(x, y))
FLOAT_BINARY(mul, mul_rn(x, y))
FLOAT_BINARY(div, div_rn(x, y))
FLOAT_BINARY(pow, m_pow(x, y))
FLOAT_BINARY(maximum, nan_maximum(x, y))
FLOAT_BINARY(minimum, nan_minimum(x, y))
FLOAT_BINARY(relu_backward, y > (C)0 ? x : (C)0)

// GELU's derivative Φ(v) + v·φ(v) in f64, as the host's Float::gelu_backward
// for f64 (its vectorised f32 form is within a few ulp of this). NaN at ±inf.
__device__ __forceinline__ double gelu_derivative(double v) {
    const double cdf = mul_rn(0.5, erfc(mul_rn(-v, 0.70710678118654752440)));
    const double pdf = mul_rn(exp(mul_rn(mul_rn(-0.5, v), v)), 0.39894228040143267794);
    return add_rn(cdf, mul_rn(v, pdf));
}
// The tanh approximation's derivative (host elementwise::gelu_tanh_backward):
// u = k·(v + c·v³), σ(2u) + 2v·σ(2|u|)·σ(−2|u|)·u', all from e = exp(−2|u|).
template <typename C>
__device__ __forceinline__ C gelu_tanh_derivative(C v) {
    const C k = (C)0.7978845608028654, kc = (C)(0.7978845608028654 * 0.044715);
    const C kc3 = (C)(3.0 * 0.7978845608028654 * 0.044715);
    const C v2 = mul_rn(v, v);
    const C u = mul_rn(v, add_rn(k, mul_rn(kc, v2)));
    const C du = add_rn(k, mul_rn(kc3, v2));
    const C au = m_abs(u);
    const C e = m_exp(-add_rn(au, au));
    const C big = div_rn((C)1, add_rn((C)1, e));
    const C small = mul_rn(e, big);
    const C sigma = u < (C)0 ? small : big;
    return add_rn(sigma, mul_rn(mul_rn(v, mul_rn(big, small)), add_rn(du, du)));
}
// grad · gelu'(x) from the gradient a and the forward's input b.
FLOAT_BINARY(gelu_backward, (C)mul_rn((double)x, gelu_derivative((double)y)))
FLOAT_BINARY(gelu_tanh_backward, mul_rn(x, gelu_tanh_derivative(y)))

#define INST_FLOAT_BINARY(op, sfx, T)                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_##op##_##sfx(Strided s, const T* a, const T* b, T* out) {                           \
        binary_##op<T>(s, a, b, out);                                                              \
    }
#define INST_FLOAT_BINARY_ALL(sfx, T)                                                              \
    INST_FLOAT_BINARY(add, sfx, T) INST_FLOAT_BINARY(sub, sfx, T) INST_FLOAT_BINARY(mul, sfx, T)   \
    INST_FLOAT_BINARY(div, sfx, T) INST_FLOAT_BINARY(pow, sfx, T)                                  \
    INST_FLOAT_BINARY(maximum, sfx, T) INST_FLOAT_BINARY(minimum, sfx, T)                          \
    INST_FLOAT_BINARY(relu_backward, sfx, T) INST_FLOAT_BINARY(gelu_backward, sfx, T)              \
    INST_FLOAT_BINARY(gelu_tanh_backward, sfx, T)
BRASA_FLOAT_TYPES(INST_FLOAT_BINARY_ALL)

#define INT_BINARY(op, expr)                                                                       \
    template <typename T>                                                                          \
    __device__ __forceinline__ void int_binary_##op(const Strided& s, const T* a, const T* b, T* out) { \
        map2(s, a, b, out, [](T x, T y) -> T { return (expr); });                                  \
    }
INT_BINARY(add, wadd(x, y))
INT_BINARY(sub, wsub(x, y))
INT_BINARY(mul, wmul(x, y))
// u8 never has a negative exponent; the i64 result narrowed is the u8 power.
INT_BINARY(pow, Elem<T>::from_i64(int_pow((long long)x, (long long)y)))
INT_BINARY(maximum, x > y ? x : y)
INT_BINARY(minimum, x < y ? x : y)
INT_BINARY(relu_backward, y > (T)0 ? x : (T)0)

#define INST_INT_BINARY(op, sfx, T)                                                                \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_##op##_##sfx(Strided s, const T* a, const T* b, T* out) {                           \
        int_binary_##op<T>(s, a, b, out);                                                          \
    }
#define INST_INT_BINARY_ALL(sfx, T)                                                                \
    INST_INT_BINARY(add, sfx, T) INST_INT_BINARY(sub, sfx, T) INST_INT_BINARY(mul, sfx, T)         \
    INST_INT_BINARY(pow, sfx, T) INST_INT_BINARY(maximum, sfx, T) INST_INT_BINARY(minimum, sfx, T) \
    INST_INT_BINARY(relu_backward, sfx, T)
BRASA_INT_TYPES(INST_INT_BINARY_ALL)

// bool: add and maximum are "or", mul and minimum are "and".
#define BOOL_BINARY(op, expr)                                                                      \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_##op##_bool(Strided s, const u8* a, const u8* b, u8* out) {                         \
        map2(s, a, b, out, [](u8 x, u8 y) -> u8 { return (expr) ? 1 : 0; });                       \
    }
BOOL_BINARY(add, x != 0 || y != 0)
BOOL_BINARY(maximum, x != 0 || y != 0)
BOOL_BINARY(mul, x != 0 && y != 0)
BOOL_BINARY(minimum, x != 0 && y != 0)

// ----- fused in-place updates (out usually aliases a) --------------------------------
// out = a + alpha·b (brasa_kernels::elementwise::axpy; integers wrap).
template <typename T>
__device__ __forceinline__ void binary_add_scaled(const Strided& s, const T* a, const T* b, T* out, double alpha) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const C k = E::compute_from_f64(alpha);
    map2(s, a, b, out, [=](T x, T y) { return E::store(add_rn(E::load(x), mul_rn(k, E::load(y)))); });
}
template <typename T>
__device__ __forceinline__ void int_binary_add_scaled(const Strided& s, const T* a, const T* b, T* out, double alpha) {
    const T k = Elem<T>::from_i64(f64_to_i64_sat(alpha));
    map2(s, a, b, out, [=](T x, T y) { return wadd(x, wmul(y, k)); });
}
// out = a + w·(b − a) (Tensor::lerp_).
template <typename T>
__device__ __forceinline__ void binary_lerp(const Strided& s, const T* a, const T* b, T* out, double weight) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const C w = E::compute_from_f64(weight);
    map2(s, a, b, out, [=](T x, T y) {
        const C v = E::load(x), e = E::load(y);
        return E::store(add_rn(v, mul_rn(w, sub_rn(e, v))));
    });
}
// out = a + value·b·c (addcmul) and a + value·(b / c) (addcdiv).
template <typename T>
__device__ __forceinline__ void ternary_addcmul(const Strided& s, const T* a, const T* b, const T* c, T* out, double value) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const C k = E::compute_from_f64(value);
    map3(s, a, b, c, out, [=](T x, T y, T z) {
        return E::store(add_rn(E::load(x), mul_rn(mul_rn(k, E::load(y)), E::load(z))));
    });
}
template <typename T>
__device__ __forceinline__ void ternary_addcdiv(const Strided& s, const T* a, const T* b, const T* c, T* out, double value) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const C k = E::compute_from_f64(value);
    map3(s, a, b, c, out, [=](T x, T y, T z) {
        return E::store(add_rn(E::load(x), mul_rn(k, div_rn(E::load(y), E::load(z)))));
    });
}

#define INST_FUSED_FLOAT(sfx, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_add_scaled_##sfx(Strided s, const T* a, const T* b, T* out, double alpha) {         \
        binary_add_scaled<T>(s, a, b, out, alpha);                                                 \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_lerp_##sfx(Strided s, const T* a, const T* b, T* out, double weight) {              \
        binary_lerp<T>(s, a, b, out, weight);                                                      \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        ternary_addcmul_##sfx(Strided s, const T* a, const T* b, const T* c, T* out, double value) { \
        ternary_addcmul<T>(s, a, b, c, out, value);                                                \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        ternary_addcdiv_##sfx(Strided s, const T* a, const T* b, const T* c, T* out, double value) { \
        ternary_addcdiv<T>(s, a, b, c, out, value);                                                \
    }
BRASA_FLOAT_TYPES(INST_FUSED_FLOAT)
#define INST_FUSED_INT(sfx, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        binary_add_scaled_##sfx(Strided s, const T* a, const T* b, T* out, double alpha) {         \
        int_binary_add_scaled<T>(s, a, b, out, alpha);                                             \
    }
BRASA_INT_TYPES(INST_FUSED_INT)

// ----- comparisons ---------------------------------------------------------------------
// Values compare in their compute type (f16/bf16 exactly as f32); IEEE rules.
#define CMP_eq(x, y) ((x) == (y))
#define CMP_ne(x, y) ((x) != (y))
#define CMP_lt(x, y) ((x) < (y))
#define CMP_le(x, y) ((x) <= (y))
#define CMP_gt(x, y) ((x) > (y))
#define CMP_ge(x, y) ((x) >= (y))

#define INST_COMPARE(op, sfx, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        compare_##op##_##sfx(Strided s, const T* a, const T* b, u8* out) {                         \
        map2(s, a, b, out, [](T x, T y) -> u8 { return CMP_##op(Elem<T>::load(x), Elem<T>::load(y)) ? 1 : 0; }); \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        compare_scalar_##op##_##sfx(Strided s, const T* a, double value, u8* out) {                \
        compare_scalar<T>(s, a, value, out, [](auto x, auto y) -> bool { return CMP_##op(x, y); }); \
    }

// Tensor::*_scalar: a float tensor compares with the scalar converted to its
// dtype; an integer (or bool) tensor compares in i64 when the scalar is
// integral and below 9.2e18 in magnitude, in f64 otherwise.
template <typename T, typename F>
__device__ __forceinline__ void compare_scalar(const Strided& s, const T* a, double value, u8* out, F f) {
    typedef Elem<T> E;
    if (E::is_float) {
        const typename E::C c = E::load(E::from_f64(value));
        map1(s, a, out, [=](T x) -> u8 { return f(E::load(x), c) ? 1 : 0; });
    } else if (isfinite(value) && trunc(value) == value && fabs(value) < 9.2e18) {
        const long long c = (long long)value;
        map1(s, a, out, [=](T x) -> u8 { return f((long long)E::load(x), c) ? 1 : 0; });
    } else {
        map1(s, a, out, [=](T x) -> u8 { return f(E::to_f64(x), value) ? 1 : 0; });
    }
}

#define INST_COMPARE_ALL(sfx, T)                                                                   \
    INST_COMPARE(eq, sfx, T) INST_COMPARE(ne, sfx, T) INST_COMPARE(lt, sfx, T)                     \
    INST_COMPARE(le, sfx, T) INST_COMPARE(gt, sfx, T) INST_COMPARE(ge, sfx, T)
BRASA_FLOAT_TYPES(INST_COMPARE_ALL)
BRASA_INT_TYPES(INST_COMPARE_ALL)
// bool compares as 0/1 (the same code as u8).
INST_COMPARE_ALL(bool, u8)

// ----- where -----------------------------------------------------------------------------
#define INST_WHERE(sfx, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        where_##sfx(Strided s, const u8* cond, const T* a, const T* b, T* out) {                   \
        map3(s, cond, a, b, out, [](u8 c, T x, T y) { return c != 0 ? x : y; });                   \
    }
BRASA_FLOAT_TYPES(INST_WHERE)
BRASA_INT_TYPES(INST_WHERE)
INST_WHERE(bool, u8)
