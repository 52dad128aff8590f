//! `brasa_nn::data`: the bundled digits, seeded splits, the `DataLoader`
//! (every sample once per epoch, `drop_last`, the same order for any number
//! of workers, pinned and placed batches, failing and panicking datasets,
//! early drops, back-pressure) and IDX files, including damaged ones.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_nn::data::{
    random_split, read_idx, read_idx_images, read_idx_labels, DataLoader, Dataset, Digits, Mnist, TensorDataset,
};
use brasa_nn::{NnError, Result};
use brasa_tensor::{DType, Device, Tensor};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ----- digits -----------------------------------------------------------------------

#[test]
fn digits_load_with_the_right_shapes_and_ranges() {
    let digits = Digits::load().unwrap();
    assert_eq!(digits.len(), 1797);
    assert_eq!(digits.features().dims(), &[1797, 64]);
    assert_eq!(digits.features().dtype(), DType::F32);
    assert_eq!(digits.labels().dims(), &[1797]);
    assert_eq!(digits.labels().dtype(), DType::I64);

    let pixels = digits.features().to_vec::<f32>().unwrap();
    assert!(pixels.iter().all(|p| (0.0..=1.0).contains(p)));
    assert_eq!(pixels.iter().cloned().fold(0.0f32, f32::max), 1.0);
    // The first image is a zero; its top-left pixels are 0, 0, 5/16, 13/16.
    assert_eq!(&pixels[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);

    let mut counts = [0usize; 10];
    for label in digits.labels().to_vec::<i64>().unwrap() {
        counts[usize::try_from(label).unwrap()] += 1;
    }
    assert_eq!(counts.iter().sum::<usize>(), 1797);
    assert!(counts.iter().all(|&c| (170..=190).contains(&c)), "{counts:?}");

    let images = digits.images().unwrap();
    assert_eq!(images.dims(), &[1797, 1, 8, 8]);
    assert_eq!(digits.image_dataset().unwrap().features().dims(), &[1797, 1, 8, 8]);
}

#[test]
fn digits_split_is_fixed_and_a_partition() {
    let digits = Digits::load().unwrap();
    let (train, test) = digits.train_test().unwrap();
    assert_eq!((train.len(), test.len()), (1437, 360));
    assert_eq!(train.features().dims(), &[1437, 64]);

    let (again, _) = Digits::load().unwrap().train_test().unwrap();
    assert_eq!(train.features().to_vec::<f32>().unwrap(), again.features().to_vec::<f32>().unwrap());
    assert_eq!(train.labels().to_vec::<i64>().unwrap(), again.labels().to_vec::<i64>().unwrap());
    let (other, _) = digits.split(0.8, Digits::SPLIT_SEED + 1).unwrap();
    assert_ne!(train.labels().to_vec::<i64>().unwrap(), other.labels().to_vec::<i64>().unwrap());

    // Labels of both parts together are the labels of the whole set.
    let mut counts = [0isize; 10];
    for label in digits.labels().to_vec::<i64>().unwrap() {
        counts[label as usize] += 1;
    }
    for part in [&train, &test] {
        for label in part.labels().to_vec::<i64>().unwrap() {
            counts[label as usize] -= 1;
        }
    }
    assert_eq!(counts, [0; 10]);

    let (train_images, test_images) = digits.train_test_images().unwrap();
    assert_eq!(train_images.features().dims(), &[1437, 1, 8, 8]);
    assert_eq!(test_images.features().dims(), &[360, 1, 8, 8]);
    assert_eq!(train_images.labels().to_vec::<i64>().unwrap(), train.labels().to_vec::<i64>().unwrap());
}

// ----- the loader ---------------------------------------------------------------------

/// `n` samples whose label is their index and whose features are `[i, -i]`.
fn numbered(n: usize) -> TensorDataset {
    let features: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
    let labels: Vec<i64> = (0..n as i64).collect();
    TensorDataset::new(Tensor::from_vec(features, [n, 2]).unwrap(), Tensor::from_vec(labels, [n]).unwrap()).unwrap()
}

/// The labels of each batch of an epoch.
fn epoch_labels<D: Dataset<Batch = (Tensor, Tensor)> + 'static>(loader: &DataLoader<D>, epoch: u64) -> Vec<Vec<i64>> {
    loader.epoch(epoch).map(|batch| batch.unwrap().1.to_vec::<i64>().unwrap()).collect()
}

#[test]
fn every_sample_comes_once_per_epoch() {
    for workers in [0, 1, 3] {
        let loader = DataLoader::builder(numbered(103))
            .batch_size(10)
            .shuffle(true)
            .seed(5)
            .num_workers(workers)
            .build()
            .unwrap();
        assert_eq!(loader.len(), 11);
        for epoch in 0..3 {
            let batches = epoch_labels(&loader, epoch);
            assert_eq!(batches.len(), 11);
            assert!(batches[..10].iter().all(|b| b.len() == 10));
            assert_eq!(batches[10].len(), 3);
            let mut seen: Vec<i64> = batches.concat();
            assert_eq!(seen, loader.sample_order(epoch).iter().map(|i| i as i64).collect::<Vec<_>>());
            seen.sort();
            assert_eq!(seen, (0..103).collect::<Vec<i64>>(), "workers {workers}, epoch {epoch}");
        }
    }
}

#[test]
fn features_follow_their_labels() {
    let loader = DataLoader::builder(numbered(20)).batch_size(6).shuffle(true).num_workers(2).build().unwrap();
    for batch in &loader {
        let (x, y) = batch.unwrap();
        assert_eq!(x.dims()[1], 2);
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap());
        for (row, label) in x.chunks(2).zip(y) {
            assert_eq!(row, [label as f32, -(label as f32)]);
        }
    }
}

#[test]
fn drop_last_leaves_out_the_short_batch() {
    let keep = DataLoader::builder(numbered(10)).batch_size(3).build().unwrap();
    assert_eq!(keep.len(), 4);
    let sizes: Vec<usize> = epoch_labels(&keep, 0).iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert_eq!(epoch_labels(&keep, 0).concat(), (0..10).collect::<Vec<i64>>(), "no shuffle: in order");

    let drop = DataLoader::builder(numbered(10)).batch_size(3).drop_last(true).num_workers(2).build().unwrap();
    assert_eq!(drop.len(), 3);
    let sizes: Vec<usize> = epoch_labels(&drop, 0).iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 3]);

    let exact = DataLoader::builder(numbered(9)).batch_size(3).drop_last(true).build().unwrap();
    assert_eq!(exact.len(), 3);
    let tiny = DataLoader::builder(numbered(2)).batch_size(3).drop_last(true).num_workers(2).build().unwrap();
    assert!(tiny.is_empty());
    assert_eq!(tiny.iter().count(), 0);
}

#[test]
fn the_order_depends_on_seed_and_epoch_not_on_workers() {
    let build = |workers: usize, seed: u64| {
        DataLoader::builder(numbered(64))
            .batch_size(8)
            .shuffle(true)
            .seed(seed)
            .num_workers(workers)
            .prefetch_factor(1 + workers)
            .build()
            .unwrap()
    };
    let (serial, parallel, other_seed) = (build(0, 11), build(2, 11), build(2, 12));
    for epoch in 0..3 {
        assert_eq!(epoch_labels(&serial, epoch), epoch_labels(&parallel, epoch), "epoch {epoch}");
        assert_ne!(epoch_labels(&serial, epoch), epoch_labels(&other_seed, epoch));
    }
    assert_ne!(epoch_labels(&serial, 0), epoch_labels(&serial, 1));

    // `iter` runs epochs 0, 1, 2, ... in turn; `set_epoch` moves it.
    let first: Vec<_> = parallel.iter().map(|b| b.unwrap().1.to_vec::<i64>().unwrap()).collect();
    let second: Vec<_> = parallel.iter().map(|b| b.unwrap().1.to_vec::<i64>().unwrap()).collect();
    assert_eq!((first, second), (epoch_labels(&serial, 0), epoch_labels(&serial, 1)));
    assert_eq!(parallel.next_epoch(), 2);
    parallel.set_epoch(0);
    assert_eq!(parallel.iter().epoch(), 0);
}

#[test]
fn batches_are_pinned_and_placed_when_asked() {
    for workers in [0, 2] {
        let loader = DataLoader::builder(numbered(12))
            .batch_size(4)
            .num_workers(workers)
            .pin_memory(true)
            .device(Device::CPU)
            .build()
            .unwrap();
        assert!(loader.is_pinning());
        assert_eq!(loader.device(), Some(Device::CPU));
        for batch in &loader {
            let (x, y) = batch.unwrap();
            assert!(x.is_pinned() && y.is_pinned(), "workers {workers}");
            assert_eq!((x.device(), y.device()), (Device::CPU, Device::CPU));
        }
    }
    let plain = DataLoader::builder(numbered(4)).batch_size(4).build().unwrap();
    let (x, _) = plain.iter().next().unwrap().unwrap();
    assert!(!x.is_pinned());
}

#[test]
fn transforms_run_on_every_batch() {
    let loader = DataLoader::builder(numbered(8))
        .batch_size(4)
        .num_workers(2)
        .transform(|(x, y): (Tensor, Tensor)| Ok((x.mul_scalar(2.0)?, y)))
        .build()
        .unwrap();
    let (x, _) = loader.iter().next().unwrap().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [0.0, 0.0, 2.0, -2.0, 4.0, -4.0, 6.0, -6.0]);
}

#[test]
fn bad_settings_are_errors() {
    let error = DataLoader::builder(numbered(4)).batch_size(0).build().unwrap_err();
    assert!(
        matches!(&error, NnError::Invalid { what: "DataLoader", message } if message.starts_with("batch_size")),
        "{error:?}"
    );
    let error = DataLoader::builder(numbered(4)).prefetch_factor(0).build().unwrap_err();
    assert!(
        matches!(&error, NnError::Invalid { what: "DataLoader", message } if message.starts_with("prefetch_factor")),
        "{error:?}"
    );
}

#[test]
fn subsets_load_like_any_dataset() {
    let parts = random_split(numbered(30), &[20, 10], 1).unwrap();
    let test = parts[1].clone();
    let loader = DataLoader::builder(test).batch_size(4).num_workers(2).build().unwrap();
    let labels: Vec<i64> = loader.iter().flat_map(|b| b.unwrap().1.to_vec::<i64>().unwrap()).collect();
    assert_eq!(labels, parts[1].indices().iter().map(|&i| i as i64).collect::<Vec<_>>());
}

/// Batches of sample indices; reading the batch that starts at `bad` fails
/// (with an `Err`, or a panic), and each read can take a while.
struct Flaky {
    len: usize,
    bad: usize,
    panics: bool,
    delay: Duration,
    reads: AtomicUsize,
}

impl Flaky {
    fn new(len: usize, bad: usize, panics: bool) -> Flaky {
        Flaky { len, bad, panics, delay: Duration::ZERO, reads: AtomicUsize::new(0) }
    }
}

impl Dataset for Flaky {
    type Batch = Vec<usize>;

    fn len(&self) -> usize {
        self.len
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Vec<usize>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        if indices.first() == Some(&self.bad) {
            if self.panics {
                panic!("sample {} is cursed", self.bad);
            }
            return Err(NnError::file("cursed.bin", format!("sample {} cannot be read", self.bad)));
        }
        Ok(indices.to_vec())
    }
}

/// Runs a whole epoch on another thread, failing the test if it takes more
/// than a few seconds (a hang).
fn run_epoch(dataset: Flaky, workers: usize) -> Vec<Result<Vec<usize>>> {
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let loader = DataLoader::builder(dataset).batch_size(2).num_workers(workers).build().unwrap();
        let _ = done.send(loader.iter().collect::<Vec<_>>());
    });
    outcome.recv_timeout(Duration::from_secs(20)).expect("the epoch hung")
}

#[test]
fn a_failing_batch_is_an_err_in_its_place() {
    for workers in [0, 1, 3] {
        let items = run_epoch(Flaky::new(10, 6, false), workers);
        assert_eq!(items.len(), 5, "workers {workers}: every batch answers once");
        for (b, item) in items.iter().enumerate() {
            match item {
                Ok(indices) => assert_eq!(indices, &[2 * b, 2 * b + 1]),
                Err(error) => {
                    assert_eq!(b, 3);
                    assert!(matches!(error, NnError::File { .. }), "{error:?}");
                    // The dataset's own words, passed on.
                    assert!(error.to_string().contains("sample 6 cannot be read"), "{error}");
                }
            }
        }
        assert!(items[3].is_err());
    }
}

#[test]
fn a_panicking_batch_is_an_err_in_its_place() {
    for workers in [0, 2] {
        let items = run_epoch(Flaky::new(10, 2, true), workers);
        assert_eq!(items.len(), 5);
        let error = items[1].as_ref().unwrap_err();
        // The variant says no more: the message names the batch and the panic's payload.
        let NnError::Data(text) = error else { panic!("expected a Data error, got {error:?}") };
        assert!(text.starts_with("reading batch 1 panicked in ") && text.ends_with("sample 2 is cursed"), "{text}");
        assert!(items.iter().enumerate().all(|(b, item)| (b == 1) != item.is_ok()));
    }
}

#[test]
fn dropping_an_epoch_early_stops_its_workers_promptly() {
    let mut slow = Flaky::new(400, usize::MAX, false);
    slow.delay = Duration::from_millis(20);
    let dataset = Arc::new(slow);
    let loader = DataLoader::builder(Arc::clone(&dataset)).batch_size(2).num_workers(4).build().unwrap();
    let mut epoch = loader.iter();
    assert_eq!(epoch.next().unwrap().unwrap(), [0, 1]);
    assert_eq!(epoch.next().unwrap().unwrap(), [2, 3]);
    let start = Instant::now();
    drop(epoch);
    assert!(start.elapsed() < Duration::from_secs(2), "drop took {:?}", start.elapsed());
    // The workers are joined: only this test and the loader still hold the dataset.
    assert_eq!(Arc::strong_count(&dataset), 2);
    let reads = dataset.reads.load(Ordering::SeqCst);
    assert!(reads <= 2 + 4 * 2, "{reads} batches read for 2 used");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(dataset.reads.load(Ordering::SeqCst), reads, "nothing is read after the drop");
}

#[test]
fn workers_read_at_most_prefetch_factor_batches_ahead() {
    let dataset = Arc::new(Flaky::new(100, usize::MAX, false));
    let loader =
        DataLoader::builder(Arc::clone(&dataset)).batch_size(1).num_workers(2).prefetch_factor(3).build().unwrap();
    let mut epoch = loader.iter();
    epoch.next().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let reads = dataset.reads.load(Ordering::SeqCst);
    assert!(reads <= 1 + 2 * 3, "{reads} batches read ahead");
    assert_eq!(epoch.remaining(), 99);
    assert_eq!(epoch.count(), 99);
}

// ----- IDX files ----------------------------------------------------------------------

/// A fresh folder for one test under the system's temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("brasa-nn-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An IDX file's bytes: header for `code` and `dims`, then `data`.
fn idx_bytes(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, code, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    bytes
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// `n` images of 4x3 pixels (pixel value = image * 12 + position) and labels `i % 10`.
fn write_mnist(dir: &Path, prefix: &str, n: u32, gzipped: bool) {
    let pixels: Vec<u8> = (0..n * 12).map(|v| (v % 256) as u8).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let files = [
        (format!("{prefix}-images-idx3-ubyte"), idx_bytes(0x08, &[n, 4, 3], &pixels)),
        (format!("{prefix}-labels-idx1-ubyte"), idx_bytes(0x08, &[n], &labels)),
    ];
    for (name, bytes) in files {
        if gzipped {
            std::fs::write(dir.join(format!("{name}.gz")), gzip(&bytes)).unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

#[test]
fn mnist_folders_load_plain_and_gzipped() {
    let dir = temp_dir("mnist");
    write_mnist(&dir, "train", 7, false);
    write_mnist(&dir, "t10k", 3, true);
    let mnist = Mnist::load(&dir).unwrap();
    assert_eq!(mnist.train.features().dims(), &[7, 1, 4, 3]);
    assert_eq!(mnist.train.labels().dims(), &[7]);
    assert_eq!(mnist.test.features().dims(), &[3, 1, 4, 3]);
    let pixels = mnist.train.features().to_vec::<f32>().unwrap();
    assert_eq!(pixels[13], 13.0 / 255.0);
    assert!(pixels.iter().all(|p| (0.0..=1.0).contains(p)));
    assert_eq!(mnist.test.labels().to_vec::<i64>().unwrap(), [0, 1, 2]);
    let loader = DataLoader::builder(mnist.train).batch_size(4).num_workers(2).build().unwrap();
    assert_eq!(loader.iter().map(|b| b.unwrap().0.dims()[0]).collect::<Vec<_>>(), [4, 3]);

    let raw = read_idx_images(dir.join("train-images-idx3-ubyte")).unwrap();
    assert_eq!((raw.dims(), raw.dtype()), (&[7usize, 4, 3][..], DType::U8));
    assert_eq!(raw.to_vec::<u8>().unwrap()[..3], [0, 1, 2]);
    let labels = read_idx_labels(dir.join("t10k-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!((labels.dtype(), labels.to_vec::<i64>().unwrap()), (DType::I64, vec![0, 1, 2]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_idx_files_are_errors_naming_the_file() {
    let dir = temp_dir("damaged");
    let good = idx_bytes(0x08, &[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let expect = |result: Result<Tensor>, path: &Path, needle: &str| {
        let error = result.unwrap_err();
        // A File error naming the file; its message says what is wrong.
        assert!(
            matches!(&error, NnError::File { path: p, message, .. }
                if *p == path.display().to_string() && message.contains(needle)),
            "{error:?}"
        );
    };

    let truncated = write("truncated-idx3-ubyte", &good[..good.len() - 3]);
    expect(read_idx_images(&truncated), &truncated, "truncated: the header promises u8 values of shape [2, 2, 2]");
    let header_only = write("header-idx3-ubyte", &good[..9]);
    expect(read_idx_images(&header_only), &header_only, "truncated header");
    let empty = write("empty-idx3-ubyte", &[]);
    expect(read_idx_images(&empty), &empty, "too short");
    let mut magic = good.clone();
    magic[..4].copy_from_slice(&[0x50, 0x4B, 0x03, 0x04]);
    let magic = write("zip-idx3-ubyte", &magic);
    expect(read_idx_images(&magic), &magic, "bad magic number 0x504B0304");
    let mut code = good.clone();
    code[2] = 0x07;
    let code = write("code-idx3-ubyte", &code);
    expect(read_idx(&code), &code, "unknown type code 0x07");
    let mut padded = good.clone();
    padded.extend([0, 0]);
    let padded = write("padded-idx3-ubyte", &padded);
    expect(read_idx_images(&padded), &padded, "2 bytes after");
    let labels = write("labels-idx1-ubyte", &idx_bytes(0x08, &[3], &[1, 2, 3]));
    expect(read_idx_images(&labels), &labels, "expected an IDX image file (magic 0x00000803");
    let images = write("images-idx3-ubyte", &good);
    expect(read_idx_labels(&images), &images, "found magic 0x00000803");
    let gz = gzip(&good);
    let broken_gz = write("broken-idx3-ubyte.gz", &gz[..gz.len() / 2]);
    expect(read_idx_images(&broken_gz), &broken_gz, "cannot decompress");
    let missing = dir.join("missing-idx3-ubyte");
    expect(read_idx_images(&missing), &missing, "cannot read");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mnist_folders_with_problems_are_errors() {
    let dir = temp_dir("mnist-problems");
    // Each problem is an NnError::File naming the file; the message says what is wrong.
    let file_error = |error: NnError| match error {
        NnError::File { path, message, .. } => (path, message),
        other => panic!("expected a File error, got {other:?}"),
    };
    let (path, message) = file_error(Mnist::load(&dir).unwrap_err());
    assert!(path.ends_with("train-images-idx3-ubyte") && message.starts_with("not found"), "{path}: {message}");

    write_mnist(&dir, "train", 5, false);
    write_mnist(&dir, "t10k", 2, false);
    std::fs::write(dir.join("t10k-labels-idx1-ubyte"), idx_bytes(0x08, &[3], &[1, 2, 3])).unwrap();
    let (path, message) = file_error(Mnist::load(&dir).unwrap_err());
    assert!(path.ends_with("t10k-labels-idx1-ubyte"), "{path}: {message}");
    assert!(message.contains("3 labels") && message.contains("2 images"), "{path}: {message}");

    let images = std::fs::read(dir.join("train-images-idx3-ubyte")).unwrap();
    std::fs::write(dir.join("train-images-idx3-ubyte"), &images[..images.len() - 1]).unwrap();
    let (path, message) = file_error(Mnist::load(&dir).unwrap_err());
    assert!(path.ends_with("train-images-idx3-ubyte") && message.contains("truncated"), "{path}: {message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn idx_files_of_other_types_read_as_tensors() {
    let dir = temp_dir("types");
    let ints: Vec<u8> = [-2i32, 70_000].iter().flat_map(|v| v.to_be_bytes()).collect();
    let path = dir.join("ints.idx");
    std::fs::write(&path, idx_bytes(0x0C, &[2], &ints)).unwrap();
    let tensor = read_idx(&path).unwrap();
    assert_eq!((tensor.dtype(), tensor.to_vec::<i64>().unwrap()), (DType::I64, vec![-2, 70_000]));

    let floats: Vec<u8> = [0.5f32, -1.25, 3.0, 4.0].iter().flat_map(|v| v.to_be_bytes()).collect();
    std::fs::write(&path, idx_bytes(0x0D, &[2, 2], &floats)).unwrap();
    let tensor = read_idx(&path).unwrap();
    assert_eq!(tensor.dims(), &[2, 2]);
    assert_eq!(tensor.to_vec::<f32>().unwrap(), [0.5, -1.25, 3.0, 4.0]);

    let bytes = [0xFFu8, 0x01];
    std::fs::write(&path, idx_bytes(0x09, &[2], &bytes)).unwrap();
    assert_eq!(read_idx(&path).unwrap().to_vec::<i64>().unwrap(), [-1, 1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stalled_worker_is_an_err_after_the_timeout() {
    let mut stalled = Flaky::new(20, usize::MAX, false);
    stalled.delay = Duration::from_millis(1500);
    let loader =
        DataLoader::builder(stalled).batch_size(2).num_workers(2).timeout(Duration::from_millis(100)).build().unwrap();
    let start = Instant::now();
    let items: Vec<_> = loader.iter().collect();
    let elapsed = start.elapsed();
    assert_eq!(items.len(), 1, "the epoch ends at the stalled batch");
    let error = items[0].as_ref().unwrap_err();
    // The variant says no more: the message names the batch and the timeout.
    let NnError::Data(text) = error else { panic!("expected a Data error, got {error:?}") };
    assert!(text.starts_with("batch 0 of epoch ") && text.contains("not ready after 100ms"), "{text}");
    // Neither the wait nor the drop waited for the 1.5 s read.
    assert!(elapsed < Duration::from_millis(1000), "{elapsed:?}");
}

/// A panic payload that panics again when dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the payload's drop panics too");
    }
}

/// Panics with a [`Bomb`] on batch 1.
struct Booby;

impl Dataset for Booby {
    type Batch = usize;

    fn len(&self) -> usize {
        6
    }

    fn get_batch(&self, indices: &[usize]) -> Result<usize> {
        if indices == [1] {
            std::panic::panic_any(Bomb);
        }
        Ok(indices[0])
    }
}

#[test]
fn even_a_panic_whose_payload_panics_is_contained() {
    for workers in [0, 2] {
        let loader = DataLoader::builder(Booby).num_workers(workers).build().unwrap();
        let items: Vec<_> = loader.iter().collect();
        assert_eq!(items.len(), 6);
        let error = items[1].as_ref().unwrap_err();
        assert!(matches!(error, NnError::Data(text) if text.ends_with("(no message)")), "{error:?}");
        assert_eq!(items.iter().filter_map(|i| i.as_ref().ok().copied()).collect::<Vec<_>>(), [0, 2, 3, 4, 5]);
    }
}

// ----- hardening: timeouts, lengths and read-ahead --------------------------------

#[test]
fn a_timed_out_read_is_joined_when_the_loader_drops() {
    let mut stalled = Flaky::new(4, usize::MAX, false);
    stalled.delay = Duration::from_millis(400);
    let dataset = Arc::new(stalled);
    let loader = DataLoader::builder(Arc::clone(&dataset))
        .batch_size(2)
        .num_workers(1)
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let items: Vec<_> = loader.iter().collect();
    assert_eq!(items.len(), 1);
    let error = items[0].as_ref().unwrap_err();
    assert!(matches!(error, NnError::Data(text) if text.contains("not ready after 50ms")), "{error:?}");
    let start = Instant::now();
    drop(loader);
    assert!(start.elapsed() < brasa_nn::data::SHUTDOWN_GRACE, "{:?}", start.elapsed());
    // No worker thread outlives the loader: none holds the dataset any more.
    assert_eq!(Arc::strong_count(&dataset), 1, "a worker thread is still running");
    let reads = dataset.reads.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(dataset.reads.load(Ordering::SeqCst), reads, "nothing is read after the drop");
}

#[test]
fn a_zero_timeout_means_no_timeout() {
    let mut slow = Flaky::new(8, usize::MAX, false);
    slow.delay = Duration::from_millis(20);
    let loader = DataLoader::builder(slow).batch_size(2).num_workers(2).timeout(Duration::ZERO).build().unwrap();
    let items: Vec<_> = loader.iter().collect();
    assert_eq!(items.len(), 4);
    assert!(items.iter().all(Result::is_ok), "{items:?}");
}

/// A dataset far larger than memory could index: each sample is its index.
struct Endless;

impl Dataset for Endless {
    type Batch = Vec<usize>;

    fn len(&self) -> usize {
        usize::MAX / 2
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Vec<usize>> {
        Ok(indices.to_vec())
    }
}

#[test]
fn a_huge_dataset_is_sampled_lazily() {
    for (shuffle, workers) in [(false, 0), (false, 2), (true, 0), (true, 2)] {
        let loader = DataLoader::builder(Endless).batch_size(4).shuffle(shuffle).num_workers(workers).build().unwrap();
        assert_eq!(loader.len(), (usize::MAX / 2).div_ceil(4));
        let order = loader.sample_order(0);
        assert_eq!(order.len(), usize::MAX / 2);
        let batches: Vec<Vec<usize>> = loader.epoch(0).take(3).map(Result::unwrap).collect();
        assert_eq!(batches.len(), 3);
        let seen: Vec<usize> = batches.concat();
        assert_eq!(seen, order.iter().take(12).collect::<Vec<_>>());
        assert!(seen.iter().all(|&i| i < usize::MAX / 2));
        let mut distinct = seen.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 12, "shuffle {shuffle}: {seen:?}");
        if !shuffle {
            assert_eq!(seen, (0..12).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_large_prefetch_factor_reserves_nothing_up_front() {
    // Bounded by the epoch: a small dataset with any prefetch factor works.
    let loader =
        DataLoader::builder(numbered(10)).batch_size(3).num_workers(3).prefetch_factor(usize::MAX).build().unwrap();
    assert_eq!(epoch_labels(&loader, 0).concat(), (0..10).collect::<Vec<i64>>());
    // A window the dataset could fill is refused, naming the setting.
    let error = DataLoader::builder(Endless).num_workers(2).prefetch_factor(usize::MAX).build().unwrap_err();
    assert!(matches!(error, NnError::Invalid { what: "DataLoader", .. }), "{error:?}");
    assert!(error.to_string().contains("lower prefetch_factor"), "{error}");
    let error = DataLoader::builder(Endless).num_workers(usize::MAX).prefetch_factor(2).build().unwrap_err();
    assert!(matches!(error, NnError::Invalid { what: "DataLoader", .. }), "{error:?}");
    assert!(error.to_string().contains(&format!("num_workers ({})", usize::MAX)), "{error}");
}

#[test]
fn every_timeout_from_zero_to_max_reads_and_drops_without_panicking() {
    let timeouts = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_secs(30),
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ];
    for timeout in timeouts {
        let outcome = std::panic::catch_unwind(|| {
            let mut slow = Flaky::new(12, usize::MAX, false);
            slow.delay = Duration::from_millis(20);
            let loader = DataLoader::builder(slow).batch_size(2).num_workers(3).timeout(timeout).build().unwrap();
            // Stop after the first batch: the epoch's drop waits for workers
            // still reading (up to the timeout, which must not overflow).
            let first = loader.iter().next().map(|b| b.is_ok());
            let all: Vec<_> = loader.iter().collect();
            (first, all.iter().filter(|b| b.is_ok()).count(), all.len())
        });
        let (first, ok, len) = outcome.unwrap_or_else(|_| panic!("a loader with a timeout of {timeout:?} panicked"));
        if timeout.is_zero() || timeout >= Duration::from_secs(30) {
            assert_eq!((first, ok, len), (Some(true), 6, 6), "{timeout:?}");
        }
    }
}
