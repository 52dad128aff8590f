//! Deterministic pseudo-random data for the unit tests.

/// An endless xorshift64 stream (shifts 13, 7, 17) from `seed`.
pub(crate) fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}
