// Dropout forward in one pass, as brasa-autograd's Var::dropout composes it
// on the host: keep = bernoulli(keep_prob) from the stream at (seed,
// offset) (rng.rs' fill_bernoulli_at), mask = keep · scale in the tensor's
// dtype (skipped when keep_prob == 0, i.e. p == 1), out = x · mask; each
// product computed in the compute type and rounded once. See ABI.md.
#include "philox.cuh"

template <typename T>
__device__ __forceinline__ void dropout(long long n, u64 seed, u64 offset, double keep_prob, double scale, const T* x,
                                        T* mask, T* out) {
    typedef Elem<T> E;
    typedef typename E::C C;
    const u64 threshold = bernoulli_threshold(keep_prob);
    const bool scaled = keep_prob > 0.0;
    const C k = E::compute_from_f64(scale);
    const T one = E::from_f64(1.0), zero = E::from_f64(0.0);
    for (long long i = grid_start(); i < n; i += grid_step()) {
        const Words w = philox4x32_10(offset + (u64)i, seed);
        T m = random_53_bits(w.w0, w.w1) < threshold ? one : zero;
        if (scaled) m = E::store(mul_rn(E::load(m), k));
        if (mask != nullptr) mask[i] = m;
        out[i] = E::store(mul_rn(E::load(x[i]), E::load(m)));
    }
}

#define INST_DROPOUT(sfx, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        dropout_##sfx(long long n, u64 seed, u64 offset, double keep_prob, double scale, const T* x, T* mask, T* out) { \
        dropout<T>(n, seed, offset, keep_prob, scale, x, mask, out);                               \
    }
BRASA_FLOAT_TYPES(INST_DROPOUT)
