// Random fills keyed by (seed, offset), element i drawing stream element
// offset + i (wrapping): uniform, normal and bernoulli, exactly as
// brasa-tensor's Generator::{fill_uniform_f32_at, fill_uniform_f64_at,
// fill_normal_f32_at, fill_normal_f64_at, fill_bernoulli_at} followed by the
// host's conversion to the tensor's dtype (construct.rs draws f16/bf16 in f32
// and converts). See ABI.md for what is bit-identical.
#include "philox.cuh"

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)

// f32 draws (for f32, f16, bf16): the bounds as the host's `as f32`.
template <typename T>
__device__ __forceinline__ void uniform_f32(long long n, u64 seed, u64 offset, double low, double high, T* out) {
    const float lowf = __double2float_rn(low), highf = __double2float_rn(high);
    const double low64 = (double)lowf, high64 = (double)highf;
    const float below = f32_below(highf), largest = below > lowf ? below : lowf;
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        const float scaled = __double2float_rn(rng_lerp(low64, high64, unit_from_u32(w.w0)));
        out[i] = Elem<T>::store(scaled < highf ? scaled : largest);
    }
}
K random_uniform_f64(long long n, u64 seed, u64 offset, double low, double high, double* out) {
    const double below = f64_below(high), largest = below > low ? below : low;
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        const double scaled = rng_lerp(low, high, unit_from_u64(w.w0, w.w1));
        out[i] = scaled < high ? scaled : largest;
    }
}

template <typename T>
__device__ __forceinline__ void normal_f32(long long n, u64 seed, u64 offset, double mean, double std, T* out) {
    const double m = (double)__double2float_rn(mean), s = (double)__double2float_rn(std);
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        const double z = box_muller(sub_rn(1.0, unit_from_u32(w.w0)), unit_from_u32(w.w1));
        out[i] = Elem<T>::store(__double2float_rn(add_rn(m, mul_rn(s, z))));
    }
}
K random_normal_f64(long long n, u64 seed, u64 offset, double mean, double std, double* out) {
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        const double z = box_muller(sub_rn(1.0, unit_from_u64(w.w0, w.w1)), unit_from_u64(w.w2, w.w3));
        out[i] = add_rn(mean, mul_rn(std, z));
    }
}

#define INST_F32_DRAWS(sfx, T)                                                                     \
    K random_uniform_##sfx(long long n, u64 seed, u64 offset, double low, double high, T* out) {   \
        uniform_f32<T>(n, seed, offset, low, high, out);                                           \
    }                                                                                              \
    K random_normal_##sfx(long long n, u64 seed, u64 offset, double mean, double std, T* out) {    \
        normal_f32<T>(n, seed, offset, mean, std, out);                                            \
    }
INST_F32_DRAWS(f32, float)
INST_F32_DRAWS(f16, __half)
INST_F32_DRAWS(bf16, __nv_bfloat16)

// 1 with probability p (values 1/0 in any dtype).
template <typename T>
__device__ __forceinline__ void bernoulli(long long n, u64 seed, u64 offset, double p, T one, T zero, T* out) {
    const u64 threshold = bernoulli_threshold(p);
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        out[i] = random_53_bits(w.w0, w.w1) < threshold ? one : zero;
    }
}
#define INST_BERNOULLI(sfx, T)                                                                     \
    K random_bernoulli_##sfx(long long n, u64 seed, u64 offset, double p, T* out) {                \
        bernoulli<T>(n, seed, offset, p, Elem<T>::from_f64(1.0), Elem<T>::from_f64(0.0), out);     \
    }
BRASA_FLOAT_TYPES(INST_BERNOULLI)
BRASA_INT_TYPES(INST_BERNOULLI)
K random_bernoulli_bool(long long n, u64 seed, u64 offset, double p, u8* out) {
    bernoulli<u8>(n, seed, offset, p, 1, 0, out);
}
