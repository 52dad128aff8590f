//! Constructors, views, copies and conversions of tensors on the host.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{manual_seed, rng_state, set_rng_state, DType, Device, Tensor, TensorError};
use proptest::prelude::*;

const CPU: Device = Device::CPU;

/// The generator is process-wide and tests run in parallel: those that seed it take turns.
static RNG_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn matrix() -> Tensor {
    Tensor::arange_on(0.0, 12.0, 1.0, DType::F32, CPU).unwrap().reshape(&[3, 4]).unwrap()
}

#[test]
fn views_share_storage_and_read_through_strides() {
    let m = matrix();
    let t = m.t().unwrap();
    assert!(t.shares_storage_with(&m));
    assert_eq!(t.dims(), [4, 3]);
    assert_eq!(t.to_vec::<f32>().unwrap(), [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
    let column = m.select(1, 2).unwrap();
    assert_eq!(column.to_vec::<f32>().unwrap(), [2., 6., 10.]);
    let row = m.narrow(0, 1, 1).unwrap().squeeze(0).unwrap();
    assert_eq!(row.to_vec::<f32>().unwrap(), [4., 5., 6., 7.]);
    let expanded = row.unsqueeze(0).unwrap().expand([2, 4]).unwrap();
    assert_eq!(expanded.strides(), [0, 1]);
    assert_eq!(expanded.to_vec::<f32>().unwrap(), [4., 5., 6., 7., 4., 5., 6., 7.]);
    let permuted = m.reshape(&[3, 2, 2]).unwrap().permute(&[2, 0, 1]).unwrap();
    assert_eq!(permuted.dims(), [2, 3, 2]);
}

#[test]
fn reshape_is_a_view_when_possible_and_a_copy_otherwise() {
    let m = matrix();
    let flat = m.reshape(&[-1]).unwrap();
    assert!(flat.shares_storage_with(&m));
    let t = m.t().unwrap();
    let copied = t.reshape(&[12]).unwrap();
    assert!(!copied.shares_storage_with(&m));
    assert_eq!(copied.to_vec::<f32>().unwrap()[..4], [0., 4., 8., 1.]);
    let error = t.view(&[12]).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "view", .. }), "{error:?}");
    // The message says what to do instead.
    assert!(error.to_string().contains("use reshape"), "{error}");
    assert!(m.reshape(&[5, -1]).is_err());
    assert_eq!(m.flatten(0, -1).unwrap().dims(), [12]);
    assert!(t.contiguous().unwrap().is_contiguous());
}

#[test]
fn constructors_fill_as_asked() {
    assert_eq!(Tensor::full_on([2, 2], 2.5, DType::F64, CPU).unwrap().to_vec::<f64>().unwrap(), [2.5; 4]);
    assert_eq!(Tensor::ones_on([3], DType::I64, CPU).unwrap().to_vec::<i64>().unwrap(), [1, 1, 1]);
    assert_eq!(
        Tensor::arange_on(1.0, 2.0, 0.25, DType::F32, CPU).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 1.25, 1.5, 1.75]
    );
    assert_eq!(
        Tensor::linspace_on(0.0, 1.0, 5, DType::F64, CPU).unwrap().to_vec::<f64>().unwrap(),
        [0.0, 0.25, 0.5, 0.75, 1.0]
    );
    assert_eq!(Tensor::eye_on(2, DType::U8, CPU).unwrap().to_vec::<u8>().unwrap(), [1, 0, 0, 1]);
    assert!(Tensor::arange_on(0.0, 1.0, 0.0, DType::F32, CPU).is_err());
    let like = matrix().zeros_like().unwrap();
    assert_eq!((like.dims(), like.dtype(), like.device()), ([3usize, 4].as_slice(), DType::F32, CPU));
    let new = like.new_full([2], 7.0).unwrap();
    assert_eq!(new.to_vec::<f32>().unwrap(), [7.0, 7.0]);
    assert_eq!(like.new_tensor(&[1i64, 2], [2]).unwrap().dtype(), DType::F32);
    let error = Tensor::from_vec_on(vec![1f32, 2.0, 3.0], [2, 2], CPU).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "from_slice", .. }), "{error:?}");
}

#[test]
fn dtype_conversion_and_items() {
    let t = Tensor::from_vec_on(vec![1.7f32, -2.5, 0.0], [3], CPU).unwrap();
    assert_eq!(t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(), [1, -2, 0]);
    assert_eq!(t.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(), [true, true, false]);
    assert_eq!(
        t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        [1.703125, -2.5, 0.0]
    );
    assert_eq!(t.narrow(0, 1, 1).unwrap().item::<f64>().unwrap(), -2.5);
    let error = t.item::<f32>().unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "item", .. }), "{error:?}");
    let error = t.to_vec::<f64>().unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "to_vec", expected: DType::F32, got: DType::F64 }),
        "{error:?}"
    );
}

/// Casts large enough to run on several threads (contiguous, transposed,
/// narrowed and broadcast sources) give each element's own conversion, in
/// the right place: f32 -> bf16 -> f32 and f32 -> i64 against the scalar
/// definitions.
/// The source element a view shows at (row, column).
type SourceAt<'a> = Box<dyn Fn(usize, usize) -> f32 + 'a>;

#[test]
fn large_casts_of_every_layout_convert_each_element_in_place() {
    let (rows, cols) = (700, 900);
    let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 10007) as f32 * 0.37 - 1800.0).collect();
    let base = Tensor::from_vec_on(data.clone(), [rows, cols], CPU).unwrap();
    let row = Tensor::from_vec_on(data[..cols].to_vec(), [1, cols], CPU).unwrap();
    let views: Vec<(&str, Tensor, SourceAt)> = vec![
        ("contiguous", base.clone(), Box::new(|i, j| data[i * cols + j])),
        ("transposed", base.t().unwrap(), Box::new(|i, j| data[j * cols + i])),
        ("narrowed", base.narrow(1, 100, 700).unwrap(), Box::new(|i, j| data[i * cols + 100 + j])),
        ("broadcast", row.expand([rows, cols]).unwrap(), Box::new(|_, j| data[j])),
    ];
    for (name, view, at) in &views {
        let (r, c) = (view.dims()[0], view.dims()[1]);
        let halves = view.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let ints = view.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap();
        let same = view.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for i in 0..r {
            for j in 0..c {
                let want = at(i, j);
                assert_eq!(halves[i * c + j], half::bf16::from_f32(want).to_f32(), "{name} ({i}, {j})");
                assert_eq!(ints[i * c + j], want as i64, "{name} ({i}, {j})");
                assert_eq!(same[i * c + j], want, "{name} ({i}, {j})");
            }
        }
    }
}

#[test]
fn random_tensors_repeat_with_the_seed_and_state() {
    let _turn = RNG_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(7);
    let a = Tensor::rand_on([1000], DType::F32, CPU).unwrap().to_vec::<f32>().unwrap();
    let state = rng_state();
    let b = Tensor::randn_on([300_000], DType::F64, CPU).unwrap();
    set_rng_state(state);
    let b_again = Tensor::randn_on([300_000], DType::F64, CPU).unwrap();
    assert_eq!(b.to_vec::<f64>().unwrap(), b_again.to_vec::<f64>().unwrap());
    manual_seed(7);
    assert_eq!(Tensor::rand_on([1000], DType::F32, CPU).unwrap().to_vec::<f32>().unwrap(), a);
    assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
    let mean = b.to_vec::<f64>().unwrap().iter().sum::<f64>() / 300_000.0;
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!(Tensor::rand_on([2], DType::I64, CPU).is_err());
    let mask = Tensor::bernoulli_on([10_000], 0.3, DType::F32, CPU).unwrap().to_vec::<f32>().unwrap();
    let share = mask.iter().sum::<f32>() / 10_000.0;
    assert!((share - 0.3).abs() < 0.03, "{share}");
}

#[test]
fn random_numbers_do_not_depend_on_the_thread_count() {
    let _turn = RNG_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let draw = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            brasa_tensor::set_rng_state(brasa_tensor::Generator::new(99).state());
            Tensor::randn_on([200_000], DType::F32, CPU).unwrap().to_vec::<f32>().unwrap()
        })
    };
    assert_eq!(draw(1), draw(3));
}

proptest! {
    #[test]
    fn transpose_round_trips_through_contiguous(rows in 1usize..6, cols in 1usize..6) {
        let values: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let m = Tensor::from_vec_on(values.clone(), [rows, cols], CPU).unwrap();
        let back = m.t().unwrap().contiguous().unwrap().t().unwrap().contiguous().unwrap();
        prop_assert_eq!(back.to_vec::<f32>().unwrap(), values);
    }
}
