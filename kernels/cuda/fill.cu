// Constructors on contiguous outputs: fill, arange, linspace, eye. Host
// twins: brasa-tensor's construct.rs (`full`, `sequence` with the values of
// `arange_on` / `linspace_on`, `eye_on`): element i is computed in f64 and
// converted by WithDType::from_f64 (floats round once, integers truncate
// and saturate, bool is "not zero"). See ABI.md.
#include "common.cuh"

__device__ __forceinline__ u8 bool_from_f64(double v) { return v != 0.0 ? 1 : 0; }

template <typename T>
__device__ __forceinline__ void fill_loop(long long n, T value, T* out) {
    for (long long i = grid_start(); i < n; i += grid_step()) out[i] = value;
}

// start + i·step, one rounding per operation (no FMA).
__device__ __forceinline__ double arange_value(long long i, double start, double step) {
    return add_rn(start, mul_rn((double)i, step));
}

// The host's linspace: the first half counts from start, the second back
// from end, so both ends are exact.
__device__ __forceinline__ double linspace_value(long long i, long long n, double start, double end) {
    if (n == 1) return start;
    const double step = div_rn(sub_rn(end, start), (double)(n - 1));
    if (i < n / 2) return add_rn(start, mul_rn(step, (double)i));
    return sub_rn(end, mul_rn(step, (double)(n - 1 - i)));
}

// Tensor::fill_ on a view: every element of the strided operand 0 set to value.
template <typename T>
__device__ __forceinline__ void fill_strided(const Strided& s, T value, T* out) {
    if (s.rank <= 1) {
        const long long so = s.rank == 1 ? s.strides[0][0] : 0;
        for (long long i = grid_start(); i < s.numel; i += grid_step()) out[i * so] = value;
        return;
    }
    for (long long i = grid_start(); i < s.numel; i += grid_step()) {
        long long off[1];
        strided_offsets<1>(s, i, off);
        out[off[0]] = value;
    }
}

#define FILL_KERNELS(sfx, T, FROM_F64)                                                             \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK) fill_##sfx(long long n, T value, T* out) { \
        fill_loop(n, value, out);                                                                  \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK) fill_strided_##sfx(Strided s, T value, T* out) { \
        fill_strided(s, value, out);                                                               \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        arange_##sfx(long long n, double start, double step, T* out) {                             \
        for (long long i = grid_start(); i < n; i += grid_step()) out[i] = FROM_F64(arange_value(i, start, step)); \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        linspace_##sfx(long long n, double start, double end, T* out) {                            \
        for (long long i = grid_start(); i < n; i += grid_step())                                  \
            out[i] = FROM_F64(linspace_value(i, n, start, end));                                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK) eye_##sfx(long long rows, long long cols, T* out) { \
        const T one = FROM_F64(1.0), zero = FROM_F64(0.0);                                         \
        const long long n = rows * cols;                                                           \
        for (long long i = grid_start(); i < n; i += grid_step()) out[i] = (i / cols == i % cols) ? one : zero; \
    }

FILL_KERNELS(f32, float, Elem<float>::from_f64)
FILL_KERNELS(f64, double, Elem<double>::from_f64)
FILL_KERNELS(f16, __half, Elem<__half>::from_f64)
FILL_KERNELS(bf16, __nv_bfloat16, Elem<__nv_bfloat16>::from_f64)
FILL_KERNELS(i64, long long, Elem<long long>::from_f64)
FILL_KERNELS(u8, u8, Elem<u8>::from_f64)
FILL_KERNELS(bool, u8, bool_from_f64)
