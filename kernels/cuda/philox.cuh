// Philox4x32-10 and the element draws of brasa-tensor's rng.rs, so that
// CUDA fills are the host's: element `index` of a stream is one Philox
// block with counter [index_lo, index_hi, 0, 0] and key [seed_lo, seed_hi].
#pragma once
#include "common.cuh"

struct Words {
    unsigned int w0, w1, w2, w3;
};

__device__ __forceinline__ Words philox4x32_10(u64 index, u64 seed) {
    unsigned int c0 = (unsigned int)index, c1 = (unsigned int)(index >> 32), c2 = 0, c3 = 0;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Words w;
    w.w0 = c0;
    w.w1 = c1;
    w.w2 = c2;
    w.w3 = c3;
    return w;
}

// unit_from_u32: [0, 1) from 32 bits, exact in f64.
__device__ __forceinline__ double unit_from_u32(unsigned int w) { return (double)w * (1.0 / 4294967296.0); }
// random_53_bits: the top 53 of (high << 32 | low).
__device__ __forceinline__ u64 random_53_bits(unsigned int high, unsigned int low) {
    return (((u64)high << 32) | (u64)low) >> 11;
}
__device__ __forceinline__ double unit_from_u64(unsigned int high, unsigned int low) {
    return (double)(long long)random_53_bits(high, low) * (1.0 / 9007199254740992.0);
}
// lerp(low, high, t) = low·(1 − t) + high·t, each operation rounded.
__device__ __forceinline__ double rng_lerp(double low, double high, double t) {
    return add_rn(mul_rn(low, sub_rn(1.0, t)), mul_rn(high, t));
}
// box_muller(u1, u2) = sqrt(−2 ln u1) · cos(2π u2).
__device__ __forceinline__ double box_muller(double u1, double u2) {
    return mul_rn(sqrt(mul_rn(-2.0, log(u1))), cos(mul_rn(6.283185307179586, u2)));
}
// fill_bernoulli_at's threshold: one when the 53 bits are below ceil(p·2^53).
__device__ __forceinline__ u64 bernoulli_threshold(double p) {
    return (u64)ceil(mul_rn(p, 9007199254740992.0));
}
__device__ __forceinline__ float f32_below(float x) {
    if (x == 0.0f) return -__uint_as_float(1u);
    return __uint_as_float(x > 0.0f ? __float_as_uint(x) - 1u : __float_as_uint(x) + 1u);
}
__device__ __forceinline__ double f64_below(double x) {
    if (x == 0.0) return -__longlong_as_double(1);
    return __longlong_as_double(x > 0.0 ? __double_as_longlong(x) - 1 : __double_as_longlong(x) + 1);
}
