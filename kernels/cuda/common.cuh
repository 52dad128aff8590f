// Shared definitions of brasa's CUDA kernels: element types and how they
// load into / store from their compute type, the `Strided` operand
// description and its offset computation, arithmetic that is never fused
// into an FMA (so results round as the host's do), and host-identical
// conversions. See ABI.md for the contract with the Rust side.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define BRASA_MAX_DIMS 8
#define BRASA_BLOCK 256

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned char u8;

// The strided iteration space of an elementwise kernel, passed by value and
// mirrored by `brasa_kernels::cuda_ptx::Strided` (336 bytes).
struct Strided {
    long long numel;
    int rank;
    long long dims[BRASA_MAX_DIMS];
    long long strides[4][BRASA_MAX_DIMS];
};
static_assert(sizeof(Strided) == 336, "Strided must match the Rust #[repr(C)] mirror");
static_assert(__builtin_offsetof(Strided, rank) == 8, "Strided::rank");
static_assert(__builtin_offsetof(Strided, dims) == 16, "Strided::dims");
static_assert(__builtin_offsetof(Strided, strides) == 80, "Strided::strides");

// Element offsets of the element with flat (row-major) index `i` in the
// first `N` operands.
template <int N>
__device__ __forceinline__ void strided_offsets(const Strided& s, long long i, long long (&off)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (s.rank == 1) {
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] = i * s.strides[k][0];
        return;
    }
    // 64-bit division is many instructions on the GPU; index spaces below
    // 2^32 elements (nearly all) take 32-bit quotients and remainders.
    if (s.numel <= 0xffffffffLL) {
        unsigned int rest = (unsigned int)i;
        for (int d = s.rank - 1; d >= 0; --d) {
            const unsigned int size = (unsigned int)s.dims[d];
            const unsigned int q = rest / size;
            const long long c = (long long)(rest - q * size);
            rest = q;
#pragma unroll
            for (int k = 0; k < N; ++k) off[k] += c * s.strides[k][d];
        }
        return;
    }
    long long rest = i;
    for (int d = s.rank - 1; d >= 0; --d) {
        long long size = s.dims[d];
        long long c = rest % size;
        rest /= size;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += c * s.strides[k][d];
    }
}

__device__ __forceinline__ long long grid_start() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_step() {
    return (long long)gridDim.x * blockDim.x;
}

// ----- arithmetic that is never contracted into an FMA ----------------------
// The host (Rust) rounds every operation; nvcc fuses `a * b + c` into one
// FMA by default. These intrinsics are exempt from that contraction.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }

// ----- host-identical conversions -------------------------------------------

// brasa_kernels::convert::f32_to_bf16: round to nearest even; NaN keeps its
// sign and top payload bits, made quiet.
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16(float value) {
    unsigned int x = __float_as_uint(value);
    unsigned int rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
    return __ushort_as_bfloat16((unsigned short)(is_nan ? ((x >> 16) | 0x0040u) : rounded));
}
__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 value) {
    return __uint_as_float(((unsigned int)__bfloat16_as_ushort(value)) << 16);
}

// brasa-tensor's f64_to_f32_round_to_odd: truncate toward zero, set the last
// bit when inexact; a later rounding to f16/bf16 is then the single rounding
// of the f64.
__device__ __forceinline__ float f64_to_f32_round_to_odd(double v) {
    float nearest = __double2float_rn(v);
    if ((double)nearest == v || v != v) return nearest;
    unsigned int bits = __float_as_uint(nearest);
    if (fabs((double)nearest) > fabs(v)) bits -= 1;
    return __uint_as_float(bits | 1u);
}
// brasa-tensor's i64_to_f32_round_to_odd.
__device__ __forceinline__ float i64_to_f32_round_to_odd(long long v) {
    float truncated = __ll2float_rz(v);
    // |truncated| <= |v| < 2^63 (or exactly -2^63), so the conversion back is exact.
    if ((long long)truncated == v) return truncated;
    return __uint_as_float(__float_as_uint(truncated) | 1u);
}

// Rust's saturating `as` from a float to an integer: truncate toward zero,
// clamp to the range, NaN -> 0.
__device__ __forceinline__ long long f64_to_i64_sat(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return (long long)0x7fffffffffffffffULL;
    if (v <= -9223372036854775808.0) return (long long)0x8000000000000000ULL;
    return (long long)v;
}
__device__ __forceinline__ unsigned char f64_to_u8_sat(double v) {
    if (v != v || v <= 0.0) return 0;
    if (v >= 255.0) return 255;
    return (unsigned char)v;
}

// Wrapping integer arithmetic (Rust's wrapping_*): through unsigned types.
__device__ __forceinline__ long long wadd(long long a, long long b) { return (long long)((u64)a + (u64)b); }
__device__ __forceinline__ long long wsub(long long a, long long b) { return (long long)((u64)a - (u64)b); }
__device__ __forceinline__ long long wmul(long long a, long long b) { return (long long)((u64)a * (u64)b); }
__device__ __forceinline__ long long wneg(long long a) { return (long long)(0ULL - (u64)a); }
__device__ __forceinline__ unsigned char wadd(unsigned char a, unsigned char b) { return (unsigned char)(a + b); }
__device__ __forceinline__ unsigned char wsub(unsigned char a, unsigned char b) { return (unsigned char)(a - b); }
__device__ __forceinline__ unsigned char wmul(unsigned char a, unsigned char b) {
    return (unsigned char)((unsigned int)a * (unsigned int)b);
}
__device__ __forceinline__ unsigned char wneg(unsigned char a) { return (unsigned char)(0u - a); }

// brasa-tensor's IntElement::int_pow on i64: wrapping square-and-multiply; a
// negative exponent gives 1 / base^|e| truncated (0 unless base is +-1).
__device__ __forceinline__ long long int_pow(long long base, long long e) {
    if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e & 1) == 0 ? 1 : -1;
        return 0;
    }
    u64 b = (u64)base, acc = 1, n = (u64)e;
    while (n > 0) {
        if (n & 1) acc *= b;
        b *= b;
        n >>= 1;
    }
    return (long long)acc;
}

// ----- element types ----------------------------------------------------------
// Elem<T>::C is the type a value is computed in (f16/bf16 in f32, one
// rounding on store, as brasa_kernels::scalar::FloatElement); `from_f64`
// is brasa-tensor's WithDType::from_f64 (the conversion of scalars and of
// sequence values), `to_f64` its exact widening.
template <typename T> struct Elem;

template <> struct Elem<float> {
    typedef float C;
    static constexpr bool is_float = true;
    __device__ __forceinline__ static float load(float v) { return v; }
    __device__ __forceinline__ static float store(float v) { return v; }
    __device__ __forceinline__ static float from_f64(double v) { return __double2float_rn(v); }
    __device__ __forceinline__ static double to_f64(float v) { return (double)v; }
    __device__ __forceinline__ static float compute_from_f64(double v) { return __double2float_rn(v); }
};
template <> struct Elem<double> {
    typedef double C;
    static constexpr bool is_float = true;
    __device__ __forceinline__ static double load(double v) { return v; }
    __device__ __forceinline__ static double store(double v) { return v; }
    __device__ __forceinline__ static double from_f64(double v) { return v; }
    __device__ __forceinline__ static double to_f64(double v) { return v; }
    __device__ __forceinline__ static double compute_from_f64(double v) { return v; }
};
template <> struct Elem<__half> {
    typedef float C;
    static constexpr bool is_float = true;
    __device__ __forceinline__ static float load(__half v) { return __half2float(v); }
    __device__ __forceinline__ static __half store(float v) { return __float2half_rn(v); }
    __device__ __forceinline__ static __half from_f64(double v) { return __float2half_rn(f64_to_f32_round_to_odd(v)); }
    __device__ __forceinline__ static double to_f64(__half v) { return (double)__half2float(v); }
    __device__ __forceinline__ static float compute_from_f64(double v) { return __double2float_rn(v); }
};
template <> struct Elem<__nv_bfloat16> {
    typedef float C;
    static constexpr bool is_float = true;
    __device__ __forceinline__ static float load(__nv_bfloat16 v) { return bf16_to_f32(v); }
    __device__ __forceinline__ static __nv_bfloat16 store(float v) { return f32_to_bf16(v); }
    __device__ __forceinline__ static __nv_bfloat16 from_f64(double v) { return f32_to_bf16(f64_to_f32_round_to_odd(v)); }
    __device__ __forceinline__ static double to_f64(__nv_bfloat16 v) { return (double)bf16_to_f32(v); }
    __device__ __forceinline__ static float compute_from_f64(double v) { return __double2float_rn(v); }
};
template <> struct Elem<long long> {
    typedef long long C;
    static constexpr bool is_float = false;
    __device__ __forceinline__ static long long load(long long v) { return v; }
    __device__ __forceinline__ static long long store(long long v) { return v; }
    __device__ __forceinline__ static long long from_f64(double v) { return f64_to_i64_sat(v); }
    __device__ __forceinline__ static double to_f64(long long v) { return (double)v; }
    // An integral scalar (checked by the Rust side) wrapped into the type.
    __device__ __forceinline__ static long long from_i64(long long v) { return v; }
};
template <> struct Elem<unsigned char> {
    typedef unsigned char C;
    static constexpr bool is_float = false;
    __device__ __forceinline__ static unsigned char load(unsigned char v) { return v; }
    __device__ __forceinline__ static unsigned char store(unsigned char v) { return v; }
    __device__ __forceinline__ static unsigned char from_f64(double v) { return f64_to_u8_sat(v); }
    __device__ __forceinline__ static double to_f64(unsigned char v) { return (double)v; }
    __device__ __forceinline__ static unsigned char from_i64(long long v) { return (unsigned char)(u64)v; }
};

// The bool dtype is stored as unsigned char 0/1; kernels for it are written
// apart (a distinct tag type picks them).
struct Bool {};

// Float maximum/minimum with NaN propagation (brasa_kernels::elementwise::maximum).
template <typename C> __device__ __forceinline__ C nan_maximum(C a, C b) { return (a > b || a != a) ? a : b; }
template <typename C> __device__ __forceinline__ C nan_minimum(C a, C b) { return (a < b || a != a) ? a : b; }

// Records an out-of-range index: the first to arrive wins (atomicCAS from
// the sentinel LLONG_MIN). An offending LLONG_MIN is recorded as
// LLONG_MIN + 1 so that it differs from the sentinel.
#define BRASA_NO_BAD_INDEX ((long long)0x8000000000000000ULL)
__device__ __forceinline__ void record_bad_index(long long* bad_index, long long value) {
    if (value == BRASA_NO_BAD_INDEX) value = BRASA_NO_BAD_INDEX + 1;
    atomicCAS((unsigned long long*)bad_index, (unsigned long long)BRASA_NO_BAD_INDEX, (unsigned long long)value);
}

// Instantiation helpers: BRASA_FLOAT_TYPES(M) calls M(suffix, type) for the
// four float types; BRASA_INT_TYPES for i64 and u8.
#define BRASA_FLOAT_TYPES(M) M(f32, float) M(f64, double) M(f16, __half) M(bf16, __nv_bfloat16)
#define BRASA_INT_TYPES(M) M(i64, long long) M(u8, unsigned char)
