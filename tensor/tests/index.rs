//! Indexing and joining ops against naive references: index_select, gather,
//! scatter_add, embedding, one_hot, cat, stack, split and chunk, on
//! contiguous and strided inputs of several dtypes, and their errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{set_host_device_count, DType, Device, IndexError, Tensor, TensorError};
use proptest::prelude::*;

const CPU: Device = Device::CPU;

/// Two logical host devices for the device-mismatch errors: every test asks
/// for them before its first tensor, whichever test runs first.
fn init() {
    set_host_device_count(2).expect("every test asks for the same count");
}

fn ids(values: &[i64], shape: &[usize]) -> Tensor {
    init();
    Tensor::from_slice_on(values, shape, CPU).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn strides_of(dims: &[usize]) -> Vec<usize> {
    (0..dims.len()).map(|d| dims[d + 1..].iter().product()).collect()
}

fn coords(dims: &[usize], mut flat: usize) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for (slot, &size) in c.iter_mut().zip(dims).rev() {
        *slot = flat % size;
        flat /= size;
    }
    c
}

fn flat(dims: &[usize], c: &[usize]) -> usize {
    strides_of(dims).iter().zip(c).map(|(s, i)| s * i).sum()
}

/// A tensor of `dims` in `dtype`, maybe seen through a transposed copy so
/// that it is not contiguous.
fn source(dims: &[usize], dtype: DType, strided: bool) -> Tensor {
    init();
    let numel: usize = dims.iter().product();
    let data: Vec<f64> = (0..numel).map(|i| ((i * 7) % 23) as f64).collect();
    let t = Tensor::from_vec_on(data, dims.to_vec(), CPU).unwrap().to_dtype(dtype).unwrap();
    if strided && dims.len() >= 2 {
        // Same logical values, transposed storage.
        let last = dims.len() - 1;
        let stored = t.transpose(0, last).unwrap().contiguous().unwrap();
        stored.transpose(0, last).unwrap()
    } else {
        t
    }
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn index_select_matches_naive(
        dims in prop::collection::vec(0usize..5, 1..4),
        dim_pick in 0usize..3,
        raw in prop::collection::vec(0i64..6, 0..6),
        dtype in dtype(),
        strided: bool,
    ) {
        let x = source(&dims, dtype, strided);
        let d = dim_pick % dims.len();
        let index = ids(&raw, &[raw.len()]);
        let result = x.index_select(d as isize - dims.len() as isize, &index);
        if let Some(bad) = raw.iter().position(|&i| i as usize >= dims[d]) {
            let error = result.unwrap_err();
            let named = matches!(
                &error,
                TensorError::Index { op: "index_select", source: IndexError::OutOfRange { position, index, size }, .. }
                    if *position == bad && *index == raw[bad] && *size == dims[d]
            );
            prop_assert!(named, "{:?}", error);
            return Ok(());
        }
        let out = result.unwrap();
        let mut out_dims = dims.clone();
        out_dims[d] = raw.len();
        prop_assert_eq!(out.dims(), &out_dims[..]);
        let data = values(&x);
        let got = values(&out);
        for (p, g) in got.iter().enumerate() {
            let mut c = coords(&out_dims, p);
            c[d] = raw[c[d]] as usize;
            prop_assert_eq!(*g, data[flat(&dims, &c)]);
        }
    }

    #[test]
    fn gather_and_scatter_add_match_naive(
        dims in prop::collection::vec(1usize..5, 1..4),
        shrink in prop::collection::vec(0usize..2, 3),
        dim_pick in 0usize..3,
        seed in any::<u64>(),
        dtype in dtype(),
        strided: bool,
        out_of_range: bool,
    ) {
        let d = dim_pick % dims.len();
        let x = source(&dims, dtype, strided);
        // The index may be smaller than the input in every dim, and of any size along `d`.
        let index_dims: Vec<usize> = dims.iter().zip(&shrink).enumerate()
            .map(|(a, (&s, &k))| if a == d { 1 + (seed as usize % 5) } else { s - k.min(s - 1) })
            .collect();
        let count: usize = index_dims.iter().product();
        let mut state = seed;
        let mut raw: Vec<i64> = (0..count).map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % dims[d] as u64) as i64
        }).collect();
        if out_of_range {
            raw[count / 2] = dims[d] as i64 + 1;
        }
        let index = ids(&raw, &index_dims);
        let data = values(&x);

        let gathered = x.gather(d, &index);
        let src = source(&index_dims, dtype, !strided);
        let scattered = x.scatter_add(d, &index, &src);
        if out_of_range {
            for (error, name) in [(gathered.unwrap_err(), "gather"), (scattered.unwrap_err(), "scatter_add_")] {
                let named = matches!(
                    &error,
                    TensorError::Index { op, source: IndexError::OutOfRange { index, size, .. }, .. }
                        if *op == name && *index == dims[d] as i64 + 1 && *size == dims[d]
                );
                prop_assert!(named, "{:?}", error);
            }
            return Ok(());
        }
        let gathered = gathered.unwrap();
        prop_assert_eq!(gathered.dims(), &index_dims[..]);
        let got = values(&gathered);
        for (p, g) in got.iter().enumerate() {
            let mut c = coords(&index_dims, p);
            c[d] = raw[p] as usize;
            prop_assert_eq!(*g, data[flat(&dims, &c)]);
        }

        let scattered = scattered.unwrap();
        prop_assert_eq!(scattered.dims(), &dims[..]);
        let src_values = values(&src);
        let mut expect = data.clone();
        for (p, v) in src_values.iter().enumerate() {
            let mut c = coords(&index_dims, p);
            c[d] = raw[p] as usize;
            expect[flat(&dims, &c)] += v;
        }
        let got = values(&scattered);
        for (g, e) in got.iter().zip(&expect) {
            let e = match dtype {
                DType::U8 => (*e as i64 % 256) as f64,
                DType::F16 | DType::BF16 => values(&Tensor::from_vec_on(vec![*e], [1], CPU).unwrap().to_dtype(dtype).unwrap())[0],
                _ => *e,
            };
            // Half types round after every add: allow a few ulps at these magnitudes.
            let tolerance = if dtype == DType::BF16 { 1.0 } else { 0.0 };
            prop_assert!((g - e).abs() <= tolerance, "{} vs {}", g, e);
        }
        // The source tensor is untouched by scatter_add (not the in-place form).
        prop_assert_eq!(values(&x), data);
    }

    #[test]
    fn cat_and_stack_match_naive(
        dims in prop::collection::vec(0usize..4, 1..4),
        sizes in prop::collection::vec(0usize..4, 1..4),
        dim_pick in 0usize..3,
        dtype in dtype(),
        strided: bool,
    ) {
        let d = dim_pick % dims.len();
        let parts: Vec<Tensor> = sizes.iter().enumerate().map(|(i, &s)| {
            let mut shape = dims.clone();
            shape[d] = s;
            source(&shape, dtype, strided && i % 2 == 0)
        }).collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let joined = Tensor::cat(&refs, d).unwrap();
        let mut out_dims = dims.clone();
        out_dims[d] = sizes.iter().sum();
        prop_assert_eq!(joined.dims(), &out_dims[..]);
        let got = values(&joined);
        let parts_values: Vec<Vec<f64>> = parts.iter().map(values).collect();
        for (p, g) in got.iter().enumerate() {
            let mut c = coords(&out_dims, p);
            let mut which = 0;
            while c[d] >= sizes[which] {
                c[d] -= sizes[which];
                which += 1;
            }
            prop_assert_eq!(*g, parts_values[which][flat(parts[which].dims(), &c)]);
        }
        // Split undoes cat (as views of the joined tensor).
        if let Some(&s) = sizes.first().filter(|&&s| s > 0 && sizes.iter().all(|&t| t == s)) {
            let pieces = joined.split(s, d).unwrap();
            prop_assert_eq!(pieces.len(), sizes.len());
            for (piece, part) in pieces.iter().zip(&parts_values) {
                prop_assert!(piece.shares_storage_with(&joined));
                prop_assert_eq!(&values(piece), part);
            }
        }
        // Stack equal shapes along a new dim (also the new last one).
        let same: Vec<Tensor> = (0..sizes.len()).map(|i| source(&dims, dtype, strided && i == 1)).collect();
        let same_refs: Vec<&Tensor> = same.iter().collect();
        for at in [0, d, dims.len()] {
            let stacked = Tensor::stack(&same_refs, at).unwrap();
            let mut expect_dims = dims.clone();
            expect_dims.insert(at, same.len());
            prop_assert_eq!(stacked.dims(), &expect_dims[..]);
            for (i, t) in same.iter().enumerate() {
                prop_assert_eq!(values(&stacked.select(at, i).unwrap()), values(t));
            }
        }
    }

    #[test]
    fn split_and_chunk_sizes_follow_pytorch(size in 0usize..20, piece in 1usize..7, chunks in 1usize..7) {
        init();
        let x = Tensor::arange_on(0.0, size as f64, 1.0, DType::F32, CPU).unwrap().unsqueeze(0).unwrap();
        let pieces = x.split(piece, 1).unwrap();
        let lengths: Vec<usize> = pieces.iter().map(|p| p.dims()[1]).collect();
        let expect: Vec<usize> = if size == 0 { vec![0] } else { (0..size).step_by(piece).map(|s| piece.min(size - s)).collect() };
        prop_assert_eq!(&lengths, &expect);
        let chunked = x.chunk(chunks, -1).unwrap();
        let lengths: Vec<usize> = chunked.iter().map(|p| p.dims()[1]).collect();
        let step = size.div_ceil(chunks);
        let expect: Vec<usize> = if size == 0 { vec![0] } else { (0..size).step_by(step).map(|s| step.min(size - s)).collect() };
        prop_assert_eq!(&lengths, &expect);
        let rejoined = Tensor::cat(&chunked.iter().collect::<Vec<_>>(), 1).unwrap();
        prop_assert_eq!(values(&rejoined), values(&x));
    }

    #[test]
    fn embedding_and_one_hot_match_naive(
        vocabulary in 1usize..6,
        width in 0usize..4,
        id_dims in prop::collection::vec(0usize..4, 0..3),
        seed in any::<u64>(),
    ) {
        let weight = source(&[vocabulary, width], DType::F32, seed % 2 == 0);
        let count: usize = id_dims.iter().product();
        let raw: Vec<i64> = (0..count).map(|i| ((seed as usize >> (i % 32)) % vocabulary) as i64).collect();
        let index = ids(&raw, &id_dims);
        let rows = Tensor::embedding(&weight, &index).unwrap();
        let mut expect_dims = id_dims.clone();
        expect_dims.push(width);
        prop_assert_eq!(rows.dims(), &expect_dims[..]);
        let table = values(&weight);
        let expect: Vec<f64> = raw.iter().flat_map(|&i| table[i as usize * width..(i as usize + 1) * width].to_vec()).collect();
        prop_assert_eq!(values(&rows), expect);

        let hot = index.one_hot(vocabulary).unwrap();
        expect_dims.pop();
        expect_dims.push(vocabulary);
        prop_assert_eq!(hot.dims(), &expect_dims[..]);
        prop_assert_eq!(hot.dtype(), DType::I64);
        let expect: Vec<i64> = raw.iter().flat_map(|&i| (0..vocabulary as i64).map(move |c| (c == i) as i64)).collect();
        prop_assert_eq!(hot.to_vec::<i64>().unwrap(), expect);
    }
}

#[test]
fn scatter_add_in_place_accumulates_repeats_and_bumps_the_version() {
    init();
    let x = Tensor::zeros_on([2, 3], DType::F32, CPU).unwrap();
    let src = Tensor::ones_on([2, 4], DType::F32, CPU).unwrap();
    let before = x.version();
    x.scatter_add_(1, &ids(&[0, 0, 2, 0, 1, 1, 1, 1], &[2, 4]), &src).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [3.0, 0.0, 1.0, 0.0, 4.0, 0.0]);
    assert_eq!(x.version(), before + 1);
    // Through a transposed view, with src aliasing the destination.
    let m = Tensor::arange_on(0.0, 4.0, 1.0, DType::F64, CPU).unwrap().reshape(&[2, 2]).unwrap();
    m.t().unwrap().scatter_add_(0, &ids(&[1, 1], &[1, 2]), &m).unwrap();
    assert_eq!(m.to_vec::<f64>().unwrap(), [0.0, 1.0, 2.0, 4.0]);
    // A bad index leaves the destination as it was.
    assert!(x.scatter_add_(1, &ids(&[0, 3], &[1, 2]), &src).is_err());
    assert_eq!(x.to_vec::<f32>().unwrap(), [3.0, 0.0, 1.0, 0.0, 4.0, 0.0]);
    let expanded = Tensor::zeros_on([3], DType::F32, CPU).unwrap().unsqueeze(0).unwrap().expand([2, 3]).unwrap();
    let error = expanded.scatter_add_(1, &ids(&[0], &[1, 1]), &src).unwrap_err();
    assert!(matches!(&error, TensorError::Invalid { op: "scatter_add_", .. }), "{error:?}");
    // The message says why and what to do instead.
    assert!(error.to_string().contains("expanded"), "{error}");
}

#[test]
fn errors_name_what_differs() {
    init();
    let other = Device::cpu(1);
    let x = Tensor::zeros_on([2, 3], DType::F32, CPU).unwrap();
    let elsewhere = Tensor::zeros_on([2, 3], DType::F32, other).unwrap();
    let index_elsewhere = Tensor::from_slice_on(&[0i64], [1], other).unwrap();
    let error = x.index_select(0, &index_elsewhere).unwrap_err();
    assert!(
        matches!(error, TensorError::DeviceMismatch { op: "index_select", lhs: CPU, rhs: Device::Cpu(1) }),
        "{error:?}"
    );
    let error = x.gather(0, &Tensor::from_slice_on(&[0i64, 0], [1, 2], other).unwrap()).unwrap_err();
    assert!(matches!(error, TensorError::DeviceMismatch { op: "gather", lhs: CPU, rhs: Device::Cpu(1) }), "{error:?}");
    let error = Tensor::embedding(&x, &index_elsewhere).unwrap_err();
    assert!(
        matches!(error, TensorError::DeviceMismatch { op: "embedding", lhs: CPU, rhs: Device::Cpu(1) }),
        "{error:?}"
    );
    // cat and stack name which tensor of the list is elsewhere.
    let error = Tensor::cat(&[&x, &x, &elsewhere], 0).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "cat", .. }), "{error:?}");
    assert!(error.to_string().contains("tensor 2 is on cpu:1 but tensor 0 is on cpu:0"), "{error}");
    let error = Tensor::stack(&[&x, &elsewhere], 0).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "stack", .. }), "{error:?}");
    assert!(error.to_string().contains("tensor 1 is on cpu:1"), "{error}");

    let doubles = Tensor::zeros_on([2, 3], DType::F64, CPU).unwrap();
    // Mixed dtypes are no error: they promote as in torch.cat.
    let promoted = Tensor::cat(&[&x, &doubles], 1).unwrap();
    assert_eq!((promoted.dtype(), promoted.dims()), (DType::F64, &[2usize, 6][..]));
    // Shape problems name the tensor of the list and its shape.
    let error = Tensor::stack(&[&x, &x.t().unwrap()], 0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "stack", .. }), "{error:?}");
    assert!(error.to_string().contains("tensor 1 has shape [3, 2]"), "{error}");
    let error = Tensor::cat(&[&x, &Tensor::zeros_on([6], DType::F32, CPU).unwrap()], 0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "cat", .. }), "{error:?}");
    assert!(error.to_string().contains("tensor 1 has shape [6] (1 dims)"), "{error}");
    let error = x.scatter_add(1, &ids(&[0], &[1, 1]), &doubles).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "scatter_add_", expected: DType::F32, got: DType::F64 }),
        "{error:?}"
    );

    let float_ids = Tensor::zeros_on([2], DType::F32, CPU).unwrap();
    let error = x.index_select(0, &float_ids).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "index_select", expected: DType::I64, got: DType::F32 }),
        "{error:?}"
    );
    let error = x.index_select(0, &ids(&[0, 0], &[1, 2])).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "index_select", .. }), "{error:?}");
    // A bad index: its value, its position and the dim it indexes.
    let error = x.index_select(0, &ids(&[-1], &[1])).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::Index {
                op: "index_select",
                source: IndexError::OutOfRange { position: 0, index: -1, size: 2 },
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("index -1 at position 0 is out of range for dim 0 of size 2"), "{error}");
    let error = x.gather(1, &ids(&[0; 6], &[3, 2])).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "gather", .. }), "{error:?}");
    assert!(error.to_string().contains("index has size 3 in dim 0 but input has size 2"), "{error}");
    let error = x.gather(1, &ids(&[0; 2], &[2])).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "gather", .. }), "{error:?}");
    let error = Tensor::embedding(&Tensor::zeros_on([4], DType::F32, CPU).unwrap(), &ids(&[0], &[1])).unwrap_err();
    assert!(
        matches!(&error, TensorError::RankMismatch { op: "embedding", expected: 2, got } if got == &[4]),
        "{error:?}"
    );
    let error = ids(&[0, 1, 7], &[3]).one_hot(4).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::Index { op: "one_hot", source: IndexError::OutOfRange { position: 2, index: 7, size: 4 }, .. }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("class 7 at position 2 is out of range for 4 classes"), "{error}");
    let error = float_ids.one_hot(4).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "one_hot", expected: DType::I64, got: DType::F32 }),
        "{error:?}"
    );
    let error = x.split(0, 1).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "split", .. }), "{error:?}");
    let error = x.chunk(0, 1).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "chunk", .. }), "{error:?}");
    let error = Tensor::cat(&[&Tensor::scalar_on(1f32, CPU).unwrap()], 0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "cat", .. }), "{error:?}");
}
