//! [`IntoPair`]: a size given either once for both spatial dims (`3`) or as
//! `(height, width)` (`(3, 5)`), as PyTorch's convolution and pooling layers
//! accept an `int` or a tuple.

/// A `(height, width)` pair from one `usize` (used for both) or a tuple.
pub trait IntoPair {
    /// The pair `(height, width)`.
    fn into_pair(self) -> (usize, usize);
}

impl IntoPair for usize {
    fn into_pair(self) -> (usize, usize) {
        (self, self)
    }
}

impl IntoPair for (usize, usize) {
    fn into_pair(self) -> (usize, usize) {
        self
    }
}

impl IntoPair for [usize; 2] {
    fn into_pair(self) -> (usize, usize) {
        (self[0], self[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_size_or_two() {
        assert_eq!(3.into_pair(), (3, 3));
        assert_eq!((2, 5).into_pair(), (2, 5));
        assert_eq!([4, 1].into_pair(), (4, 1));
    }
}
