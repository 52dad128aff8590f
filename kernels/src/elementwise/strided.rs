//! Operands of elementwise loops and the loops themselves.
//!
//! An operand is a slice seen through a start and a stride ([`Strided`],
//! [`StridedMut`]); a loop checks once that every element it will touch lies
//! in the slice, then picks the fastest form it can: plain slices zipped
//! together (which the compiler vectorises), a broadcast scalar (stride 0),
//! or an indexed walk for any other stride.

use crate::error::{KernelError, Result};
use crate::scalar::{Accumulator, FloatElement, BLOCK};

/// A read-only operand: elements `start, start + stride, start + 2 stride, ...`
/// of `data`, as many as the loop's output has. A stride of 0 repeats one
/// element (a broadcast scalar); a negative stride walks backwards.
#[derive(Debug)]
pub struct Strided<'a, T> {
    data: &'a [T],
    start: usize,
    stride: isize,
}

impl<T> Clone for Strided<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Strided<'_, T> {}

impl<'a, T: Copy> Strided<'a, T> {
    /// Elements `start + i * stride` of `data`.
    pub fn new(data: &'a [T], start: usize, stride: isize) -> Self {
        Strided { data, start, stride }
    }

    /// The elements of `data` in order.
    pub fn contiguous(data: &'a [T]) -> Self {
        Strided { data, start: 0, stride: 1 }
    }

    /// Element `at` of `data`, repeated.
    pub fn broadcast(data: &'a [T], at: usize) -> Self {
        Strided { data, start: at, stride: 0 }
    }

    /// The operand's elements for a loop of `len`, after checking that they
    /// all lie in the slice.
    fn access(self, len: usize, operand: &'static str) -> Result<Access<'a, T>> {
        if len == 0 {
            return Ok(Access::Slice(&[]));
        }
        check_bounds(self.data.len(), self.start, self.stride, len, operand)?;
        Ok(match self.stride {
            1 => Access::Slice(&self.data[self.start..self.start + len]),
            0 => Access::Scalar(self.data[self.start]),
            stride => Access::Strided { data: self.data, start: self.start, stride },
        })
    }
}

impl<'a, T: Copy> From<&'a [T]> for Strided<'a, T> {
    fn from(data: &'a [T]) -> Self {
        Strided::contiguous(data)
    }
}

/// A writable operand: `len` elements `start, start + stride, ...` of `data`.
/// The stride must not be 0 when `len > 1` (two writes to one element).
#[derive(Debug)]
pub struct StridedMut<'a, T> {
    data: &'a mut [T],
    start: usize,
    stride: isize,
    len: usize,
}

impl<'a, T: Copy> StridedMut<'a, T> {
    /// `len` elements `start + i * stride` of `data`.
    pub fn new(data: &'a mut [T], start: usize, stride: isize, len: usize) -> Self {
        StridedMut { data, start, stride, len }
    }

    /// All of `data`, in order.
    pub fn contiguous(data: &'a mut [T]) -> Self {
        let len = data.len();
        StridedMut { data, start: 0, stride: 1, len }
    }

    /// How many elements the operand has.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the operand has no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn access(self, operand: &'static str) -> Result<AccessMut<'a, T>> {
        let len = self.len;
        if len == 0 {
            return Ok(AccessMut::Slice(&mut []));
        }
        check_bounds(self.data.len(), self.start, self.stride, len, operand)?;
        if self.stride == 0 && len > 1 {
            return Err(KernelError::OverlappingOutput { operand, detail: format!("{len} elements with stride 0") });
        }
        Ok(match self.stride {
            1 | 0 => AccessMut::Slice(&mut self.data[self.start..self.start + len]),
            stride => AccessMut::Strided { data: self.data, start: self.start, stride, len },
        })
    }
}

impl<'a, T: Copy> From<&'a mut [T]> for StridedMut<'a, T> {
    fn from(data: &'a mut [T]) -> Self {
        StridedMut::contiguous(data)
    }
}

/// Errors unless elements `start + i * stride` for `i < len` (`len > 0`) all
/// lie in `0..data_len`.
fn check_bounds(data_len: usize, start: usize, stride: isize, len: usize, operand: &'static str) -> Result<()> {
    // i128 cannot overflow: |stride| * len < 2^127.
    let last = start as i128 + (len as i128 - 1) * stride as i128;
    let (lowest, highest) = if last < start as i128 { (last, start as i128) } else { (start as i128, last) };
    if lowest < 0 {
        return Err(KernelError::Overflow { operand });
    }
    if highest >= data_len as i128 {
        let required = usize::try_from(highest + 1).map_err(|_| KernelError::Overflow { operand })?;
        return Err(KernelError::OutOfBounds { operand, required, len: data_len });
    }
    Ok(())
}

/// A checked operand, in the form the loops specialise on.
enum Access<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
    Strided { data: &'a [T], start: usize, stride: isize },
}

impl<T: Copy> Access<'_, T> {
    /// Element `i` (in bounds: checked when the access was made).
    #[inline(always)]
    fn at(&self, i: usize) -> T {
        match self {
            Access::Slice(s) => s[i],
            Access::Scalar(v) => *v,
            Access::Strided { data, start, stride } => data[(*start as isize + i as isize * stride) as usize],
        }
    }
}

enum AccessMut<'a, T> {
    Slice(&'a mut [T]),
    Strided { data: &'a mut [T], start: usize, stride: isize, len: usize },
}

fn length_mismatch(what: &str, expected: usize, got: usize) -> KernelError {
    KernelError::ShapeMismatch { detail: format!("{what}: expected {expected} elements, got {got}") }
}

/// `dst[i] = f(a[i])` for every element of `dst`.
#[inline(always)]
pub fn map1<A: Copy, D>(a: Strided<'_, A>, dst: &mut [D], f: impl Fn(A) -> D) -> Result<()> {
    match a.access(dst.len(), "a")? {
        Access::Slice(a) => {
            for (o, &x) in dst.iter_mut().zip(a) {
                *o = f(x);
            }
        }
        Access::Scalar(x) => {
            for o in dst.iter_mut() {
                *o = f(x);
            }
        }
        access => {
            for (i, o) in dst.iter_mut().enumerate() {
                *o = f(access.at(i));
            }
        }
    }
    Ok(())
}

/// `dst[i] = f(a[i], b[i])` for every element of `dst`.
#[inline(always)]
pub fn map2<A: Copy, B: Copy, D>(
    a: Strided<'_, A>,
    b: Strided<'_, B>,
    dst: &mut [D],
    f: impl Fn(A, B) -> D,
) -> Result<()> {
    let len = dst.len();
    match (a.access(len, "a")?, b.access(len, "b")?) {
        (Access::Slice(a), Access::Slice(b)) => {
            for ((o, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Access::Slice(a), Access::Scalar(y)) => {
            for (o, &x) in dst.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Access::Scalar(x), Access::Slice(b)) => {
            for (o, &y) in dst.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (a, b) => {
            for (i, o) in dst.iter_mut().enumerate() {
                *o = f(a.at(i), b.at(i));
            }
        }
    }
    Ok(())
}

/// `dst[i] = f(a[i], b[i], c[i])` for every element of `dst`.
#[inline]
pub fn map3<A: Copy, B: Copy, C: Copy, D>(
    a: Strided<'_, A>,
    b: Strided<'_, B>,
    c: Strided<'_, C>,
    dst: &mut [D],
    f: impl Fn(A, B, C) -> D,
) -> Result<()> {
    let len = dst.len();
    match (a.access(len, "a")?, b.access(len, "b")?, c.access(len, "c")?) {
        (Access::Slice(a), Access::Slice(b), Access::Slice(c)) => {
            for (((o, &x), &y), &z) in dst.iter_mut().zip(a).zip(b).zip(c) {
                *o = f(x, y, z);
            }
        }
        (a, b, c) => {
            for (i, o) in dst.iter_mut().enumerate() {
                *o = f(a.at(i), b.at(i), c.at(i));
            }
        }
    }
    Ok(())
}

/// Fills `buf` with the compute-type values of elements `start..start +
/// buf.len()` of a checked operand.
#[inline(always)]
fn load_block<T: FloatElement>(access: &Access<'_, T>, start: usize, buf: &mut [T::Compute]) {
    match access {
        Access::Slice(s) => T::load_slice(&s[start..], buf),
        Access::Scalar(v) => buf.fill(v.load()),
        strided => {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = strided.at(start + i).load();
            }
        }
    }
}

/// `dst[i] = store(f(load(a[i])))` for a kernel `f` that maps a whole slice
/// of compute-type values at once (the vectorised GELU): the operand is
/// loaded [`BLOCK`] elements at a time into a stack buffer (widened, or
/// gathered when strided or broadcast), `f` runs on the block, and the
/// results are stored with one rounding.
pub fn map1_blocks<T: FloatElement>(
    a: Strided<'_, T>,
    dst: &mut [T],
    f: impl Fn(&[T::Compute], &mut [T::Compute]),
) -> Result<()> {
    let a = a.access(dst.len(), "a")?;
    let mut x = [<T::Compute as Accumulator>::ZERO; BLOCK];
    let mut y = [<T::Compute as Accumulator>::ZERO; BLOCK];
    for (block, out) in dst.chunks_mut(BLOCK).enumerate() {
        let (x, y) = (&mut x[..out.len()], &mut y[..out.len()]);
        load_block(&a, block * BLOCK, x);
        f(x, y);
        T::store_slice(y, out);
    }
    Ok(())
}

/// `dst[i] = store(f(load(a[i]), load(b[i])))` for a slice kernel `f`, a
/// block at a time (see [`map1_blocks`]).
pub fn map2_blocks<T: FloatElement>(
    a: Strided<'_, T>,
    b: Strided<'_, T>,
    dst: &mut [T],
    f: impl Fn(&[T::Compute], &[T::Compute], &mut [T::Compute]),
) -> Result<()> {
    let len = dst.len();
    let (a, b) = (a.access(len, "a")?, b.access(len, "b")?);
    let mut x = [<T::Compute as Accumulator>::ZERO; BLOCK];
    let mut y = [<T::Compute as Accumulator>::ZERO; BLOCK];
    let mut z = [<T::Compute as Accumulator>::ZERO; BLOCK];
    for (block, out) in dst.chunks_mut(BLOCK).enumerate() {
        let n = out.len();
        let (x, y, z) = (&mut x[..n], &mut y[..n], &mut z[..n]);
        load_block(&a, block * BLOCK, x);
        load_block(&b, block * BLOCK, y);
        f(x, y, z);
        T::store_slice(z, out);
    }
    Ok(())
}

/// `dst[i] = store(f(load(dst[i]), load(a[i])))` in place, a block at a
/// time as [`map2_blocks`] (a strided `dst` goes element by element).
pub fn update1_blocks<T: FloatElement>(
    dst: StridedMut<'_, T>,
    a: Strided<'_, T>,
    f: impl Fn(&[T::Compute], &[T::Compute], &mut [T::Compute]),
) -> Result<()> {
    let len = dst.len();
    let a = a.access(len, "a")?;
    let d = match dst.access("dst")? {
        AccessMut::Slice(d) => d,
        AccessMut::Strided { data, start, stride, len } => {
            let (mut x, mut y, mut z) = (
                [<T::Compute as Accumulator>::ZERO; 1],
                [<T::Compute as Accumulator>::ZERO; 1],
                [<T::Compute as Accumulator>::ZERO; 1],
            );
            for i in 0..len {
                let at = (start as isize + i as isize * stride) as usize;
                x[0] = data[at].load();
                y[0] = a.at(i).load();
                f(&x, &y, &mut z);
                data[at] = T::store(z[0]);
            }
            return Ok(());
        }
    };
    let mut x = [<T::Compute as Accumulator>::ZERO; BLOCK];
    let mut y = [<T::Compute as Accumulator>::ZERO; BLOCK];
    let mut z = [<T::Compute as Accumulator>::ZERO; BLOCK];
    for (block, out) in d.chunks_mut(BLOCK).enumerate() {
        let n = out.len();
        let (x, y, z) = (&mut x[..n], &mut y[..n], &mut z[..n]);
        T::load_slice(out, x);
        load_block(&a, block * BLOCK, y);
        f(x, y, z);
        T::store_slice(z, out);
    }
    Ok(())
}

/// `dst[i] = f(dst[i])`, in place.
#[inline]
pub fn update0<D: Copy>(dst: StridedMut<'_, D>, f: impl Fn(D) -> D) -> Result<()> {
    match dst.access("dst")? {
        AccessMut::Slice(d) => {
            for o in d.iter_mut() {
                *o = f(*o);
            }
        }
        AccessMut::Strided { data, start, stride, len } => {
            for i in 0..len {
                let at = (start as isize + i as isize * stride) as usize;
                data[at] = f(data[at]);
            }
        }
    }
    Ok(())
}

/// `dst[i] = f(dst[i], a[i])`, in place.
#[inline]
pub fn update1<D: Copy, A: Copy>(dst: StridedMut<'_, D>, a: Strided<'_, A>, f: impl Fn(D, A) -> D) -> Result<()> {
    let len = dst.len();
    match (dst.access("dst")?, a.access(len, "a")?) {
        (AccessMut::Slice(d), Access::Slice(a)) => {
            for (o, &x) in d.iter_mut().zip(a) {
                *o = f(*o, x);
            }
        }
        (AccessMut::Slice(d), Access::Scalar(x)) => {
            for o in d.iter_mut() {
                *o = f(*o, x);
            }
        }
        (AccessMut::Slice(d), a) => {
            for (i, o) in d.iter_mut().enumerate() {
                *o = f(*o, a.at(i));
            }
        }
        (AccessMut::Strided { data, start, stride, len }, a) => {
            for i in 0..len {
                let at = (start as isize + i as isize * stride) as usize;
                data[at] = f(data[at], a.at(i));
            }
        }
    }
    Ok(())
}

/// `dst[i] = f(dst[i], a[i], b[i])`, in place.
#[inline]
pub fn update2<D: Copy, A: Copy, B: Copy>(
    dst: StridedMut<'_, D>,
    a: Strided<'_, A>,
    b: Strided<'_, B>,
    f: impl Fn(D, A, B) -> D,
) -> Result<()> {
    let len = dst.len();
    match (dst.access("dst")?, a.access(len, "a")?, b.access(len, "b")?) {
        (AccessMut::Slice(d), Access::Slice(a), Access::Slice(b)) => {
            for ((o, &x), &y) in d.iter_mut().zip(a).zip(b) {
                *o = f(*o, x, y);
            }
        }
        (AccessMut::Slice(d), a, b) => {
            for (i, o) in d.iter_mut().enumerate() {
                *o = f(*o, a.at(i), b.at(i));
            }
        }
        (AccessMut::Strided { data, start, stride, len }, a, b) => {
            for i in 0..len {
                let at = (start as isize + i as isize * stride) as usize;
                data[at] = f(data[at], a.at(i), b.at(i));
            }
        }
    }
    Ok(())
}

/// Errors unless `a` and `b` have the same length (for callers that pair two
/// plain slices before handing them to a loop).
pub fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(length_mismatch(what, a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operand_form_reads_the_right_elements() {
        let data = [0, 1, 2, 3, 4, 5, 6, 7];
        let mut out = [0; 4];
        map1(Strided::new(&data, 1, 1), &mut out, |x| x * 10).unwrap();
        assert_eq!(out, [10, 20, 30, 40]);
        map1(Strided::broadcast(&data, 5), &mut out, |x| x).unwrap();
        assert_eq!(out, [5; 4]);
        map1(Strided::new(&data, 7, -2), &mut out, |x| x).unwrap();
        assert_eq!(out, [7, 5, 3, 1]);
        map2(Strided::new(&data, 0, 2), Strided::broadcast(&data, 1), &mut out, |x, y| x + y).unwrap();
        assert_eq!(out, [1, 3, 5, 7]);
        map2(Strided::broadcast(&data, 1), Strided::contiguous(&data[4..]), &mut out, |x, y| x - y).unwrap();
        assert_eq!(out, [-3, -4, -5, -6]);
        map3(
            Strided::contiguous(&data[..4]),
            Strided::new(&data, 3, -1),
            Strided::broadcast(&data, 2),
            &mut out,
            |x, y, z| x * 100 + y * 10 + z,
        )
        .unwrap();
        assert_eq!(out, [32, 122, 212, 302]);
    }

    #[test]
    fn out_of_bounds_operands_are_errors_not_panics() {
        let data = [1.0f32; 4];
        let mut out = [0.0f32; 4];
        let err = map1(Strided::new(&data, 1, 1), &mut out, |x| x).unwrap_err();
        assert_eq!(err, KernelError::OutOfBounds { operand: "a", required: 5, len: 4 });
        let err = map2(Strided::contiguous(&data), Strided::new(&data, 2, -1), &mut out, |x, y| x + y).unwrap_err();
        assert_eq!(err, KernelError::Overflow { operand: "b" });
        let mut dst = [0.0f32; 4];
        let err = update0(StridedMut::new(&mut dst, 0, 0, 2), |x| x).unwrap_err();
        assert!(matches!(err, KernelError::OverlappingOutput { operand: "dst", .. }));
        // An empty loop touches nothing, whatever the operand says.
        map1(Strided::new(&data, 99, 7), &mut [], |x: f32| x).unwrap();
    }

    #[test]
    fn in_place_updates_walk_strided_destinations() {
        let mut dst = [1, 2, 3, 4, 5, 6];
        let src = [10, 20, 30];
        update1(StridedMut::new(&mut dst, 5, -2, 3), Strided::contiguous(&src), |d, s| d + s).unwrap();
        assert_eq!(dst, [1, 32, 3, 24, 5, 16]);
        update2(
            StridedMut::contiguous(&mut dst[..3]),
            Strided::broadcast(&src, 0),
            Strided::contiguous(&src),
            |d, a, b| d * a + b,
        )
        .unwrap();
        assert_eq!(dst, [20, 340, 60, 24, 5, 16]);
        update0(StridedMut::new(&mut dst, 0, 3, 2), |d| -d).unwrap();
        assert_eq!(dst, [-20, 340, 60, -24, 5, 16]);
        assert_eq!(same_len("x", 2, 3).unwrap_err().to_string(), "shape mismatch: x: expected 2 elements, got 3");
    }
}
