// Dtype conversions between every pair of f32, f64, f16, bf16, i64, u8 and
// bool, on strided operands (cast_<src>_<dst>; src == dst is a strided copy).
// Host twin: brasa-tensor's WithDType::cast (dtype.rs): floats travel
// through f64 and integers through i64; float -> integer truncates toward
// zero and saturates (NaN -> 0); integer -> narrower integer wraps;
// anything -> bool is "not zero" (NaN -> true); f64/i64 -> f16/bf16 round
// once (through an f32 rounded to odd). See ABI.md.
#include "common.cuh"

// Widening of each source to f64 (floats) or i64 (integers and bool).
__device__ __forceinline__ double wide_f32(float v) { return (double)v; }
__device__ __forceinline__ double wide_f64(double v) { return v; }
__device__ __forceinline__ double wide_f16(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double wide_bf16(__nv_bfloat16 v) { return (double)bf16_to_f32(v); }
__device__ __forceinline__ long long wide_i64(long long v) { return v; }
__device__ __forceinline__ long long wide_u8(u8 v) { return (long long)v; }
__device__ __forceinline__ long long wide_bool(u8 v) { return v != 0 ? 1 : 0; }

// WithDType::from_f64 and ::from_i64 of each destination.
__device__ __forceinline__ float narrow_f32(double v) { return __double2float_rn(v); }
__device__ __forceinline__ float narrow_f32(long long v) { return __ll2float_rn(v); }
__device__ __forceinline__ double narrow_f64(double v) { return v; }
__device__ __forceinline__ double narrow_f64(long long v) { return __ll2double_rn(v); }
__device__ __forceinline__ __half narrow_f16(double v) { return __float2half_rn(f64_to_f32_round_to_odd(v)); }
// i64 -> f32 is exact up to 2^24 and everything past 65504 is infinite in f16.
__device__ __forceinline__ __half narrow_f16(long long v) { return __float2half_rn(__ll2float_rn(v)); }
__device__ __forceinline__ __nv_bfloat16 narrow_bf16(double v) { return f32_to_bf16(f64_to_f32_round_to_odd(v)); }
__device__ __forceinline__ __nv_bfloat16 narrow_bf16(long long v) { return f32_to_bf16(i64_to_f32_round_to_odd(v)); }
__device__ __forceinline__ long long narrow_i64(double v) { return f64_to_i64_sat(v); }
__device__ __forceinline__ long long narrow_i64(long long v) { return v; }
__device__ __forceinline__ u8 narrow_u8(double v) { return f64_to_u8_sat(v); }
__device__ __forceinline__ u8 narrow_u8(long long v) { return (u8)(u64)v; }
__device__ __forceinline__ u8 narrow_bool(double v) { return v != 0.0 ? 1 : 0; }
__device__ __forceinline__ u8 narrow_bool(long long v) { return v != 0 ? 1 : 0; }

template <typename S, typename D, typename F>
__device__ __forceinline__ void cast_loop(const Strided& s, const S* x, D* out, F f) {
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

#define CAST(ssfx, S, dsfx, D)                                                                     \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        cast_##ssfx##_##dsfx(Strided s, const S* x, D* out) {                                      \
        cast_loop(s, x, out, [](S v) -> D { return narrow_##dsfx(wide_##ssfx(v)); });              \
    }
// A strided copy: the bits as they are.
#define COPY(sfx, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        cast_##sfx##_##sfx(Strided s, const T* x, T* out) {                                        \
        cast_loop(s, x, out, [](T v) -> T { return v; });                                          \
    }

// Written out: cast_<src>_<dst> for src != dst.
CAST(f32, float, f64, double) CAST(f32, float, f16, __half) CAST(f32, float, bf16, __nv_bfloat16)
CAST(f32, float, i64, long long) CAST(f32, float, u8, u8) CAST(f32, float, bool, u8)
CAST(f64, double, f32, float) CAST(f64, double, f16, __half) CAST(f64, double, bf16, __nv_bfloat16)
CAST(f64, double, i64, long long) CAST(f64, double, u8, u8) CAST(f64, double, bool, u8)
CAST(f16, __half, f32, float) CAST(f16, __half, f64, double) CAST(f16, __half, bf16, __nv_bfloat16)
CAST(f16, __half, i64, long long) CAST(f16, __half, u8, u8) CAST(f16, __half, bool, u8)
CAST(bf16, __nv_bfloat16, f32, float) CAST(bf16, __nv_bfloat16, f64, double) CAST(bf16, __nv_bfloat16, f16, __half)
CAST(bf16, __nv_bfloat16, i64, long long) CAST(bf16, __nv_bfloat16, u8, u8) CAST(bf16, __nv_bfloat16, bool, u8)
CAST(i64, long long, f32, float) CAST(i64, long long, f64, double) CAST(i64, long long, f16, __half)
CAST(i64, long long, bf16, __nv_bfloat16) CAST(i64, long long, u8, u8) CAST(i64, long long, bool, u8)
CAST(u8, u8, f32, float) CAST(u8, u8, f64, double) CAST(u8, u8, f16, __half)
CAST(u8, u8, bf16, __nv_bfloat16) CAST(u8, u8, i64, long long) CAST(u8, u8, bool, u8)
CAST(bool, u8, f32, float) CAST(bool, u8, f64, double) CAST(bool, u8, f16, __half)
CAST(bool, u8, bf16, __nv_bfloat16) CAST(bool, u8, i64, long long) CAST(bool, u8, u8, u8)

COPY(f32, float) COPY(f64, double) COPY(f16, __half) COPY(bf16, __nv_bfloat16)
COPY(i64, long long) COPY(u8, u8) COPY(bool, u8)
