//! Cache blocking: how large the packed panels are.
//!
//! BLIS's scheme: a `kc x nr` sliver of packed B stays in L1 while the
//! micro-kernel streams `mr x kc` slivers of the packed `mc x kc` block of A
//! from L2; the `kc x nc` panel of B lives in L3. The defaults were measured
//! on a Zen 5 core (48 KiB L1d, 1 MiB L2, 32 MiB shared L3); see the
//! `gemm_tune` example.

use crate::error::{KernelError, Result};

/// Block sizes of the three outer loops, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Rows of A packed at once (rounded up to the micro-kernel's MR).
    pub mc: usize,
    /// Depth of a packed block (the shared dimension).
    pub kc: usize,
    /// Columns of B packed at once (rounded up to the micro-kernel's NR).
    pub nc: usize,
}

impl Blocking {
    /// Checks that no block size is zero.
    pub fn validate(&self) -> Result<()> {
        if self.mc == 0 || self.kc == 0 || self.nc == 0 {
            return Err(KernelError::InvalidBlocking { detail: format!("block sizes must be positive, got {self:?}") });
        }
        Ok(())
    }

    /// The blocking for a product of depth `k`: `mc` and `nc` rounded up to
    /// whole micro-tiles, and `kc` evened out so that no depth block is a
    /// sliver (784 = 3 x 262 rather than 3 x 256 + 16: a short block pays
    /// the loads and stores of C for little work), then rounded up to a
    /// multiple of `k_unit`, the depth elements a packed element holds (so
    /// that only the last block has a padded pair).
    pub(crate) fn for_depth(self, k: usize, mr: usize, nr: usize, k_unit: usize) -> Blocking {
        let blocks = ((k + self.kc / 2) / self.kc).max(1);
        let kc = k.div_ceil(blocks).next_multiple_of(k_unit).max(1);
        Blocking { mc: self.mc.div_ceil(mr) * mr, kc, nc: self.nc.div_ceil(nr) * nr }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_validation() {
        let b = Blocking { mc: 100, kc: 7, nc: 13 }.for_depth(14, 32, 12, 1);
        assert_eq!(b, Blocking { mc: 128, kc: 7, nc: 24 });
        // Depth in pairs: 14 = 2 x 7 becomes 8 + 6.
        assert_eq!(Blocking { mc: 100, kc: 7, nc: 13 }.for_depth(14, 32, 12, 2).kc, 8);
        assert_eq!(Blocking { mc: 256, kc: 512, nc: 4080 }.for_depth(1, 32, 12, 2).kc, 2);
        assert_eq!(Blocking { mc: 256, kc: 512, nc: 4080 }.for_depth(785, 32, 12, 2).kc, 394);
        let even = |k| Blocking { mc: 256, kc: 256, nc: 4080 }.for_depth(k, 32, 12, 1).kc;
        assert_eq!(even(1024), 256);
        assert_eq!(even(784), 262);
        assert_eq!(even(128), 128);
        assert_eq!(even(300), 300);
        assert_eq!(even(400), 200);
        assert_eq!(even(0), 1);
        assert!(Blocking { mc: 0, kc: 1, nc: 1 }.validate().is_err());
        assert!(b.validate().is_ok());
    }
}
