//! Deterministic operands for the products' unit tests.

/// `n` values in [-1, 1] in steps of 1/1000 (xorshift from `seed`): exact
/// enough in bf16 to test against f64 sums with simple tolerances.
pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}
