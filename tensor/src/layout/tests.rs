//! Unit and property tests of `Layout`.

use super::*;
use proptest::prelude::*;

fn offsets(layout: &Layout) -> Vec<usize> {
    layout.offsets().collect()
}

#[test]
fn contiguous_layout_basics() {
    let layout = Layout::contiguous([2, 3, 4]).unwrap();
    assert_eq!(layout.strides(), &[12, 4, 1]);
    assert!(layout.is_contiguous());
    assert_eq!(layout.required_storage_len(), 24);
    assert_eq!(offsets(&layout), (0..24).collect::<Vec<_>>());
    assert_eq!(layout.offset_of(&[1, 2, 3]).unwrap(), 23);
    assert_eq!(layout.inner_contiguous_run(), 24);
    assert_eq!(
        layout.offset_of(&[1, 3, 0]).unwrap_err().to_string(),
        "offset_of: index 3 is out of range for dim 1 of size 3"
    );
    assert!(layout.offset_of(&[1, 2]).is_err());

    let scalar = Layout::contiguous_with_offset((), 7).unwrap();
    assert_eq!(offsets(&scalar), vec![7]);
    assert_eq!(scalar.required_storage_len(), 8);
    assert!(scalar.is_contiguous());
}

#[test]
fn error_messages_name_the_problem() {
    let layout = Layout::contiguous([2, 4]).unwrap();
    assert_eq!(
        layout.narrow(1, 3, 2).unwrap_err().to_string(),
        "narrow: dim 1 has size 4 but start 3 + length 2 = 5 exceeds it"
    );
    assert_eq!(
        Layout::contiguous([2, 3, 4]).unwrap().permute(&[0, 0, 2]).unwrap_err().to_string(),
        "permute: expected a permutation of 0..3, got [0, 0, 2]"
    );
    assert_eq!(
        Layout::contiguous([2, 3]).unwrap().broadcast_as([4, 2]).unwrap_err().to_string(),
        "cannot broadcast shape [2, 3] to [4, 2]"
    );
    assert_eq!(
        layout.transpose(0, 2).unwrap_err().to_string(),
        "transpose: dim 2 is out of range for a tensor of rank 2 (expected -2..=1)"
    );
    assert_eq!(layout.squeeze(1).unwrap_err().to_string(), "squeeze: dim 1 has size 4, not 1");
    assert_eq!(layout.select(0, 2).unwrap_err().to_string(), "select: index 2 is out of range for dim 0 of size 2");
    assert_eq!(
        layout.reshape([3, 3]).unwrap_err().to_string(),
        "reshape: cannot reshape [2, 4] (8 elements) to [3, 3] (9 elements)"
    );
    assert!(layout.narrow(0, usize::MAX, 2).is_err(), "no overflow");
    assert!(layout.permute(&[1]).is_err());
    assert!(layout.permute(&[0, 2]).is_err());
}

#[test]
fn new_checks_strides_and_bounds() {
    assert_eq!(
        Layout::new([2, 3], vec![1], 0).unwrap_err().to_string(),
        "layout: 1 strides given for shape [2, 3] of rank 2"
    );
    // Reversed order: starts at the last element and walks backwards.
    let flipped = Layout::new([4], vec![-1], 3).unwrap();
    assert_eq!(offsets(&flipped), vec![3, 2, 1, 0]);
    assert!(!flipped.is_contiguous());
    assert_eq!(flipped.required_storage_len(), 4);
    assert_eq!(
        Layout::new([4], vec![-1], 2).unwrap_err().to_string(),
        "layout: shape [4] with strides [-1] and offset 2 addresses storage element -1, before the start of storage"
    );
    assert!(Layout::new([2, 2], vec![isize::MAX, 1], 1).is_err());
    // A size-0 dim addresses nothing, so its strides cannot be wrong.
    assert!(Layout::new([0, 5], vec![-100, 1], 0).is_ok());
    // Absurd sizes are refused, not overflowed.
    let huge = [usize::MAX, usize::MAX, 2];
    assert!(Layout::new(huge, vec![isize::MAX, isize::MAX, 1], 0).is_err());
    assert!(Layout::new(huge, vec![isize::MIN, isize::MIN, 1], 0).is_err());
    // 2 * stride overflows isize; a size-1 dim's stride just saturates.
    let wide = Layout::new([2, 3], vec![isize::MAX / 2 + 1, 1], 0).unwrap();
    assert_eq!(wide.unsqueeze(0).unwrap().strides()[0], isize::MAX);
    assert_eq!(wide.coalesced(), wide);
    assert!(!wide.is_contiguous());
    assert_eq!(
        Layout::new(huge, vec![0, 0, 1], 0).unwrap_err(),
        LayoutError::TooLarge { shape: Shape::from(huge) },
        "even when the strides address little storage"
    );
    assert!(Layout::contiguous([1]).unwrap().broadcast_as(huge).is_err());
    let big = [1 << 31, 1 << 31, 1];
    let broadcast = Layout::contiguous([1]).unwrap().broadcast_as(big).unwrap();
    assert_eq!(broadcast.numel(), 1 << 62);
    assert!(broadcast.reshape([usize::MAX, 2, usize::MAX]).is_err());
    assert!(broadcast.broadcast_as([2, 1 << 31, 1 << 31, 1]).is_err());
    assert_eq!(broadcast.offsets().take(2).collect::<Vec<_>>(), vec![0, 0]);
    assert_eq!(broadcast.without_broadcast_dims().dims(), [1, 1, 1]);
    assert!(broadcast.has_internal_overlap());
}

#[test]
fn constructors_refuse_shapes_too_large_for_a_tensor() {
    for dims in [&[usize::MAX][..], &[1 << 32, 1 << 32], &[0, usize::MAX], &[0, 1 << 62, 4]] {
        let error = Layout::contiguous(dims).unwrap_err();
        assert_eq!(error, LayoutError::TooLarge { shape: Shape::from(dims) });
        assert!(Layout::new(dims, vec![0; dims.len()], 0).is_err());
    }
    let most = isize::MAX as usize;
    assert_eq!(Layout::contiguous([most]).unwrap().numel(), most);
    assert!(Layout::contiguous_with_offset([most], 1).is_ok(), "its last element is isize::MAX");
    assert!(Layout::contiguous_with_offset([most], 2).is_err(), "its last element would be past isize::MAX");
    assert!(Layout::contiguous_with_offset([0], usize::MAX).is_ok(), "no element, no bound");
    assert!(Layout::contiguous_with_offset((), most).is_ok());
    let empty = Layout::contiguous([0]).unwrap();
    assert_eq!(
        empty.reshape([0, 1 << 62, 4]).unwrap_err(),
        LayoutError::TooLarge { shape: Shape::from([0, 1 << 62, 4]) }
    );
    assert!(empty.reshape([0, most]).unwrap().is_some());
}

#[test]
fn zero_dim_layouts_transpose_and_squeeze_to_themselves() {
    let scalar = Layout::contiguous_with_offset((), 3).unwrap();
    assert_eq!(scalar.transpose(0, -1).unwrap(), scalar);
    assert_eq!(scalar.squeeze(-1).unwrap(), scalar);
    assert!(scalar.transpose(0, 1).is_err());
    assert!(scalar.squeeze(1).is_err());
    assert_eq!(scalar.unsqueeze(0).unwrap().dims(), [1]);
    assert!(!scalar.has_internal_overlap());
}

#[test]
fn views_move_strides_and_offset() {
    let layout = Layout::contiguous([2, 3, 4]).unwrap();
    let t = layout.transpose(0, -1).unwrap();
    assert_eq!(t.dims(), &[4, 3, 2]);
    assert_eq!(t.strides(), &[1, 4, 12]);
    assert!(!t.is_contiguous());

    let n = layout.narrow(1, 1, 2).unwrap();
    assert_eq!((n.dims(), n.offset()), (&[2, 2, 4][..], 4));
    assert_eq!(n.inner_contiguous_run(), 8);
    assert_eq!(n.contiguous_runs().collect::<Vec<_>>(), vec![4..12, 16..24]);

    let s = layout.select(-1, 2).unwrap();
    assert_eq!((s.dims(), s.strides(), s.offset()), (&[2, 3][..], &[12, 4][..], 2));
    assert_eq!(s.inner_contiguous_run(), 1);

    let u = layout.unsqueeze(1).unwrap();
    assert_eq!((u.dims(), u.strides()), (&[2, 1, 3, 4][..], &[12, 12, 4, 1][..]));
    assert!(u.is_contiguous());
    assert_eq!(layout.unsqueeze(-1).unwrap().dims(), &[2, 3, 4, 1]);
    assert_eq!(u.squeeze(1).unwrap(), layout);
    assert_eq!(u.squeeze_all(), layout);

    let b = Layout::contiguous([3, 1]).unwrap().broadcast_as([2, 3, 4]).unwrap();
    assert_eq!(b.strides(), &[0, 1, 0]);
    assert_eq!(offsets(&b).len(), 24);
    assert_eq!(&offsets(&b)[..8], &[0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(b.required_storage_len(), 3);
}

#[test]
fn empty_layouts_yield_nothing() {
    for layout in [
        Layout::contiguous([0]).unwrap(),
        Layout::contiguous([3, 0, 2]).unwrap(),
        Layout::contiguous([2, 3]).unwrap().narrow(1, 3, 0).unwrap(),
    ] {
        assert_eq!(layout.offsets().count(), 0);
        assert_eq!(layout.contiguous_runs().count(), 0);
        assert_eq!(layout.inner_contiguous_run(), 0);
        assert_eq!(layout.required_storage_len(), 0);
        assert!(layout.is_contiguous());
    }
}

#[test]
fn reshape_views_and_refusals() {
    let layout = Layout::contiguous([2, 3, 4]).unwrap();
    let v = layout.reshape([6, 4]).unwrap().unwrap();
    assert_eq!(v.strides(), &[4, 1]);
    // Transposed inner dims cannot be flattened without a copy...
    let t = layout.transpose(1, 2).unwrap();
    assert_eq!(t.reshape([2, 12]).unwrap(), None);
    // ...but the untouched outer dim can still be split or merged with 1s.
    let split = t.reshape([1, 2, 1, 4, 3]).unwrap().unwrap();
    assert_eq!(offsets(&split), offsets(&t));
    // Splitting a strided dim keeps its stride.
    let every_other = Layout::new([4], vec![2], 1).unwrap();
    let split = every_other.reshape([2, 2]).unwrap().unwrap();
    assert_eq!((split.strides(), split.offset()), (&[4, 2][..], 1));
    // Broadcast dims can be split but not merged with real ones.
    let b = Layout::contiguous([3]).unwrap().broadcast_as([4, 3]).unwrap();
    assert_eq!(b.reshape([12]).unwrap(), None);
    assert_eq!(b.reshape([2, 2, 3]).unwrap().unwrap().strides(), &[0, 0, 1]);
    // Scalars and empties.
    assert_eq!(Layout::contiguous(()).unwrap().reshape([1, 1]).unwrap().unwrap().strides(), &[1, 1]);
    assert!(Layout::contiguous([0, 3]).unwrap().reshape([3, 0]).unwrap().is_some());
}

#[test]
fn coalescing_merges_what_it_can() {
    let layout = Layout::contiguous([2, 1, 3, 4]).unwrap();
    let c = layout.coalesced();
    assert_eq!((c.dims(), c.strides()), (&[24][..], &[1][..]));
    let t = Layout::contiguous([2, 3, 4]).unwrap().transpose(0, 1).unwrap();
    let c = t.coalesced();
    assert_eq!((c.dims(), c.strides()), (&[3, 2, 4][..], &[4, 12, 1][..]));
    let b = Layout::contiguous([4]).unwrap().broadcast_as([5, 3, 4]).unwrap();
    let c = b.coalesced();
    assert_eq!((c.dims(), c.strides()), (&[15, 4][..], &[0, 1][..]));
    assert_eq!(b.contiguous_runs().run_len(), 4);
}

// --- Property tests against a naive model -------------------------------

/// The obvious model of a view: an explicit array holding, for every
/// logical element in row-major order, the storage element it refers to.
#[derive(Clone, Debug)]
struct Dense {
    dims: Vec<usize>,
    values: Vec<usize>,
}

impl Dense {
    fn contiguous(dims: &[usize], offset: usize) -> Self {
        let n: usize = dims.iter().product();
        Dense { dims: dims.to_vec(), values: (offset..offset + n).collect() }
    }

    fn get(&self, index: &[usize]) -> usize {
        let mut flat = 0;
        for (&i, &d) in index.iter().zip(&self.dims) {
            flat = flat * d + i;
        }
        self.values[flat]
    }

    /// A new array of shape `dims` whose element `index` is this array's
    /// element `source(index)`.
    fn gather(&self, dims: Vec<usize>, source: impl Fn(&[usize]) -> Vec<usize>) -> Self {
        let n = dims.iter().product();
        let mut values = Vec::with_capacity(n);
        let mut index = vec![0; dims.len()];
        for _ in 0..n {
            values.push(self.get(&source(&index)));
            for d in (0..dims.len()).rev() {
                index[d] += 1;
                if index[d] < dims[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Dense { dims, values }
    }
}

/// One view operation, with arguments already valid for the shape it is
/// applied to.
#[derive(Clone, Debug)]
enum ViewOp {
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Narrow(usize, usize, usize),
    Select(usize, usize),
    Unsqueeze(usize),
    Squeeze(usize),
    Expand(usize, usize),
    Prepend(usize),
}

/// Picks a valid op for `dims` from raw random numbers.
fn choose_op(dims: &[usize], kind: u8, r: &[usize; 4]) -> Option<ViewOp> {
    let rank = dims.len();
    match kind % 8 {
        0 if rank > 0 => Some(ViewOp::Transpose(r[0] % rank, r[1] % rank)),
        1 if rank > 0 => {
            let mut order: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                order.swap(i, r[i % 4].wrapping_mul(i + 7) % (i + 1));
            }
            Some(ViewOp::Permute(order))
        }
        2 if rank > 0 => {
            let d = r[0] % rank;
            let start = r[1] % (dims[d] + 1);
            let len = r[2] % (dims[d] - start + 1);
            Some(ViewOp::Narrow(d, start, len))
        }
        3 if rank > 0 => {
            let d = r[0] % rank;
            (dims[d] > 0).then(|| ViewOp::Select(d, r[1] % dims[d]))
        }
        4 if rank < 6 => Some(ViewOp::Unsqueeze(r[0] % (rank + 1))),
        5 => {
            let ones: Vec<usize> = (0..rank).filter(|&d| dims[d] == 1).collect();
            (!ones.is_empty()).then(|| ViewOp::Squeeze(ones[r[0] % ones.len()]))
        }
        6 => {
            let ones: Vec<usize> = (0..rank).filter(|&d| dims[d] == 1).collect();
            (!ones.is_empty()).then(|| ViewOp::Expand(ones[r[0] % ones.len()], r[1] % 4))
        }
        7 if rank < 6 => Some(ViewOp::Prepend(r[0] % 3)),
        _ => None,
    }
}

fn apply(layout: &Layout, dense: &Dense, op: &ViewOp) -> (Layout, Dense) {
    let dims = dense.dims.clone();
    match op {
        ViewOp::Transpose(a, b) => {
            let (a, b) = (*a, *b);
            let mut new_dims = dims.clone();
            new_dims.swap(a, b);
            let d = dense.gather(new_dims, |i| {
                let mut src = i.to_vec();
                src.swap(a, b);
                src
            });
            (layout.transpose(a, b).unwrap(), d)
        }
        ViewOp::Permute(order) => {
            let new_dims = order.iter().map(|&o| dims[o]).collect();
            let d = dense.gather(new_dims, |i| {
                let mut src = vec![0; i.len()];
                for (k, &o) in order.iter().enumerate() {
                    src[o] = i[k];
                }
                src
            });
            (layout.permute(order).unwrap(), d)
        }
        &ViewOp::Narrow(dim, start, len) => {
            let mut new_dims = dims.clone();
            new_dims[dim] = len;
            let d = dense.gather(new_dims, |i| {
                let mut src = i.to_vec();
                src[dim] += start;
                src
            });
            (layout.narrow(dim, start, len).unwrap(), d)
        }
        &ViewOp::Select(dim, index) => {
            let mut new_dims = dims.clone();
            new_dims.remove(dim);
            let d = dense.gather(new_dims, |i| {
                let mut src = i.to_vec();
                src.insert(dim, index);
                src
            });
            (layout.select(dim, index).unwrap(), d)
        }
        &ViewOp::Unsqueeze(dim) => {
            let mut new_dims = dims.clone();
            new_dims.insert(dim, 1);
            let d = dense.gather(new_dims, |i| {
                let mut src = i.to_vec();
                src.remove(dim);
                src
            });
            (layout.unsqueeze(dim).unwrap(), d)
        }
        &ViewOp::Squeeze(dim) => {
            let mut new_dims = dims.clone();
            new_dims.remove(dim);
            let d = dense.gather(new_dims, |i| {
                let mut src = i.to_vec();
                src.insert(dim, 0);
                src
            });
            (layout.squeeze(dim).unwrap(), d)
        }
        &ViewOp::Expand(dim, size) => {
            let mut new_dims = dims.clone();
            new_dims[dim] = size;
            let d = dense.gather(new_dims.clone(), |i| {
                let mut src = i.to_vec();
                src[dim] = 0;
                src
            });
            (layout.broadcast_as(new_dims).unwrap(), d)
        }
        &ViewOp::Prepend(size) => {
            let mut new_dims = vec![size];
            new_dims.extend_from_slice(&dims);
            let d = dense.gather(new_dims.clone(), |i| i[1..].to_vec());
            (layout.broadcast_as(new_dims).unwrap(), d)
        }
    }
}

/// A random view of a random contiguous tensor, with its naive model.
fn random_view() -> impl Strategy<Value = (Layout, Dense)> {
    (
        proptest::collection::vec(0usize..5, 0..5),
        0usize..10,
        proptest::collection::vec((any::<u8>(), any::<[usize; 4]>()), 0..8),
    )
        .prop_map(|(dims, offset, raw_ops)| {
            let mut layout = Layout::contiguous_with_offset(dims.clone(), offset).unwrap();
            let mut dense = Dense::contiguous(&dims, offset);
            for (kind, r) in raw_ops {
                if let Some(op) = choose_op(&dense.dims, kind, &r) {
                    (layout, dense) = apply(&layout, &dense, &op);
                }
            }
            (layout, dense)
        })
}

/// A random shape with `numel` elements (any shape when `numel` is 0).
fn factorize(numel: usize, picks: &[usize]) -> Vec<usize> {
    let mut dims = Vec::new();
    let mut left = numel;
    for &p in picks {
        if left == 0 {
            dims.push(p % 3);
            continue;
        }
        let divisors: Vec<usize> = (1..=left).filter(|d| left.is_multiple_of(*d)).collect();
        let d = divisors[p % divisors.len()];
        dims.push(d);
        left /= d;
    }
    if left != 1 || dims.is_empty() {
        dims.push(left);
    }
    dims
}

fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (i, &o) in order.iter().enumerate() {
        inv[o] = i;
    }
    inv
}

proptest! {
    #[test]
    fn views_address_what_the_naive_model_says((layout, dense) in random_view()) {
        prop_assert_eq!(layout.dims(), &dense.dims[..]);
        let walked: Vec<usize> = layout.offsets().collect();
        prop_assert_eq!(walked.len(), layout.numel());
        prop_assert_eq!(layout.offsets().len(), layout.numel());
        prop_assert_eq!(&walked, &dense.values);
        // The same walk, element by element through offset_of.
        let mut index = vec![0; layout.rank()];
        for &expected in &dense.values {
            prop_assert_eq!(layout.offset_of(&index).unwrap(), expected);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < layout.dims()[d] { break; }
                index[d] = 0;
            }
        }
        // Coalescing and run-splitting preserve the walk.
        prop_assert_eq!(layout.coalesced().offsets().collect::<Vec<_>>(), walked.clone());
        let runs: Vec<usize> = layout.contiguous_runs().flatten().collect();
        prop_assert_eq!(&runs, &walked);
        prop_assert_eq!(
            layout.required_storage_len(),
            walked.iter().max().map_or(0, |m| m + 1)
        );
        if layout.is_contiguous() && !walked.is_empty() {
            let first = walked[0];
            prop_assert_eq!(walked, (first..first + layout.numel()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn reshape_views_keep_the_element_order(
        (layout, _dense) in random_view(),
        picks in proptest::collection::vec(any::<usize>(), 0..5),
    ) {
        let target = factorize(layout.numel(), &picks);
        let result = layout.reshape(target.clone()).unwrap();
        if layout.is_contiguous() {
            prop_assert!(result.is_some(), "contiguous layouts always have a view");
        }
        if let Some(view) = result {
            prop_assert_eq!(view.dims(), &target[..]);
            prop_assert_eq!(
                view.offsets().collect::<Vec<_>>(),
                layout.offsets().collect::<Vec<_>>()
            );
        }
        // Reshaping to its own shape or to its coalesced shape never copies.
        prop_assert!(layout.reshape(layout.shape().clone()).unwrap().is_some());
        if layout.numel() > 0 {
            let coalesced = layout.coalesced();
            let view = layout.reshape(coalesced.shape().clone()).unwrap();
            prop_assert_eq!(view, Some(coalesced));
        }
    }

    #[test]
    fn permute_then_inverse_is_identity(
        (layout, _dense) in random_view(),
        keys in proptest::collection::vec(any::<u32>(), 6),
    ) {
        let mut order: Vec<usize> = (0..layout.rank()).collect();
        order.sort_by_key(|&i| keys[i]);
        let permuted = layout.permute(&order).unwrap();
        prop_assert_eq!(permuted.permute(&inverse(&order)).unwrap(), layout);
    }

    #[test]
    fn transpose_twice_is_identity((layout, _dense) in random_view(), a: usize, b: usize) {
        prop_assume!(layout.rank() > 0);
        let (a, b) = (a % layout.rank(), b % layout.rank());
        let back = layout.transpose(a, b).unwrap().transpose(b, a).unwrap();
        prop_assert_eq!(back, layout);
    }

    #[test]
    fn narrow_rejects_exactly_the_out_of_range_requests(
        dims in proptest::collection::vec(0usize..6, 1..4),
        dim: usize, start in 0usize..8, len in 0usize..8,
    ) {
        let layout = Layout::contiguous(dims.clone()).unwrap();
        let dim = dim % dims.len();
        let result = layout.narrow(dim, start, len);
        prop_assert_eq!(result.is_ok(), start + len <= dims[dim]);
    }
}
