//! The UCI handwritten digits (8x8), bundled with the crate: 1,797 images of
//! the digits 0-9 at 8x8 pixels, small enough to train a classifier in
//! seconds on a CPU and real enough to mean something (scikit-learn's
//! `load_digits`).
//!
//! The data is embedded in the library (`include_bytes!`, 57 KB gzipped), so
//! [`Digits::load`] works from any working directory and in the published
//! crate, with no download. Source: UCI Machine Learning Repository, "Optical
//! Recognition of Handwritten Digits", E. Alpaydin and C. Kaynak (1998),
//! <https://archive.ics.uci.edu/dataset/80>; licensed CC BY 4.0 (see
//! `data/digits/README.md` in the crate).

use super::dataset::TensorDataset;
use crate::error::{NnError, Result};
use brasa_tensor::Tensor;
use std::io::Read;

/// The gzipped CSV: 64 pixel values 0..=16 and the label 0..=9 per row.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits/digits.csv.gz");

/// How errors name the embedded file.
const SOURCE: &str = "digits.csv.gz (embedded in brasa-nn)";

/// The UCI digits: features `[1797, 64]` (`f32`, pixel value / 16, so in
/// [0, 1]) and labels `[1797]` (`i64`, 0..=9).
///
/// ```
/// use brasa_nn::data::{DataLoader, Dataset, Digits};
///
/// let digits = Digits::load()?;
/// assert_eq!(digits.features().dims(), &[1797, 64]);
/// let (train, test) = digits.train_test()?;        // 1437 / 360, fixed seed
/// assert_eq!((train.len(), test.len()), (1437, 360));
/// let loader = DataLoader::builder(train).batch_size(64).shuffle(true).build()?;
/// assert_eq!(loader.len(), 23);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Digits {
    features: Tensor,
    labels: Tensor,
}

impl Digits {
    /// The number of images.
    pub const LEN: usize = 1797;
    /// Pixels per image (8x8).
    pub const FEATURES: usize = 64;
    /// The number of classes (the digits 0-9).
    pub const CLASSES: usize = 10;
    /// The seed of [`Digits::train_test`]'s split.
    pub const SPLIT_SEED: u64 = 42;
    /// The share of the samples [`Digits::train_test`] puts in training.
    pub const TRAIN_FRACTION: f64 = 0.8;

    /// Decodes the embedded data into host tensors. Takes a few milliseconds;
    /// nothing is cached, so the tensors are the caller's alone.
    pub fn load() -> Result<Digits> {
        let mut text = String::new();
        flate2::read::GzDecoder::new(DIGITS_CSV_GZ)
            .read_to_string(&mut text)
            .map_err(|e| NnError::file_error(SOURCE, "cannot decompress", e))?;
        let (pixels, labels) = parse_csv(&text)?;
        Ok(Digits {
            features: Tensor::from_vec(pixels, [Self::LEN, Self::FEATURES])?,
            labels: Tensor::from_vec(labels, [Self::LEN])?,
        })
    }

    /// The number of images (1,797).
    pub fn len(&self) -> usize {
        Self::LEN
    }

    /// Always false: the set is not empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The features, `[1797, 64]` `f32` in [0, 1]; each row is an 8x8 image
    /// in row-major order.
    pub fn features(&self) -> &Tensor {
        &self.features
    }

    /// The labels, `[1797]` `i64` in 0..=9.
    pub fn labels(&self) -> &Tensor {
        &self.labels
    }

    /// The features as images for a CNN: `[1797, 1, 8, 8]` (a view, no copy).
    pub fn images(&self) -> Result<Tensor> {
        Ok(self.features.reshape(&[Self::LEN as isize, 1, 8, 8])?)
    }

    /// All samples as one dataset of flat features `[N, 64]`.
    pub fn dataset(&self) -> Result<TensorDataset> {
        TensorDataset::new(self.features.clone(), self.labels.clone())
    }

    /// All samples as one dataset of images `[N, 1, 8, 8]`.
    pub fn image_dataset(&self) -> Result<TensorDataset> {
        TensorDataset::new(self.images()?, self.labels.clone())
    }

    /// A seeded random split of the flat dataset: `floor(1797 * fraction)`
    /// training samples and the rest for testing (not stratified). Use
    /// [`TensorDataset::reshape_features`] with `[1, 8, 8]` for images.
    pub fn split(&self, fraction: f64, seed: u64) -> Result<(TensorDataset, TensorDataset)> {
        self.dataset()?.split(fraction, seed)
    }

    /// The fixed split used by the examples and tests: 80 % (1,437 samples)
    /// for training and 20 % (360) for testing, with seed
    /// [`Digits::SPLIT_SEED`] (42); flat features `[N, 64]`.
    pub fn train_test(&self) -> Result<(TensorDataset, TensorDataset)> {
        self.split(Self::TRAIN_FRACTION, Self::SPLIT_SEED)
    }

    /// [`Digits::train_test`] with the features as images `[N, 1, 8, 8]`.
    pub fn train_test_images(&self) -> Result<(TensorDataset, TensorDataset)> {
        let (train, test) = self.train_test()?;
        Ok((train.reshape_features(&[1, 8, 8])?, test.reshape_features(&[1, 8, 8])?))
    }
}

/// Pixels scaled to [0, 1] and labels of the CSV, checked row by row.
fn parse_csv(text: &str) -> Result<(Vec<f32>, Vec<i64>)> {
    let mut pixels = Vec::with_capacity(Digits::LEN * Digits::FEATURES);
    let mut labels = Vec::with_capacity(Digits::LEN);
    for (row, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let bad = |message: String| NnError::file(SOURCE, format!("line {}: {message}", row + 1));
        let mut fields = 0;
        for (column, field) in line.split(',').enumerate() {
            fields += 1;
            let value: u8 = field
                .trim()
                .parse()
                .map_err(|_| bad(format!("field {} is `{field}`, not a small integer", column + 1)))?;
            match column {
                c if c < Digits::FEATURES => {
                    if value > 16 {
                        return Err(bad(format!("pixel {} is {value}, outside 0..=16", c + 1)));
                    }
                    pixels.push(f32::from(value) / 16.0);
                }
                c if c == Digits::FEATURES => {
                    if usize::from(value) >= Digits::CLASSES {
                        return Err(bad(format!("label {value} is outside 0..=9")));
                    }
                    labels.push(i64::from(value));
                }
                _ => {}
            }
        }
        if fields != Digits::FEATURES + 1 {
            return Err(bad(format!("expected {} fields, found {fields}", Digits::FEATURES + 1)));
        }
    }
    if labels.len() != Digits::LEN {
        return Err(NnError::file(SOURCE, format!("expected {} rows, found {}", Digits::LEN, labels.len())));
    }
    Ok((pixels, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of an [`NnError::File`] about the embedded file, with no
    /// lower error: what is wrong with the contents, which the test reads.
    fn contents_error(result: Result<(Vec<f32>, Vec<i64>)>) -> String {
        match result {
            Err(NnError::File { path, message, source: None }) if path == SOURCE => message,
            other => panic!("expected a File error about {SOURCE}, got {other:?}"),
        }
    }

    #[test]
    fn rows_are_checked() {
        let row = |pixel: &str, label: &str| format!("{pixel}{},{label}\n", ",0".repeat(63));
        let error = contents_error(parse_csv(&row("17", "3")));
        assert!(error.starts_with("line 1: ") && error.contains("pixel 1 is 17"), "{error}");
        let error = contents_error(parse_csv(&row("0", "10")));
        assert!(error.contains("label 10"), "{error}");
        let error = contents_error(parse_csv(&row("x", "1")));
        assert!(error.contains("`x`"), "{error}");
        let error = contents_error(parse_csv("1,2,3\n"));
        assert!(error.contains("expected 65 fields, found 3"), "{error}");
        let error = contents_error(parse_csv(&row("16", "9")));
        assert_eq!(error, "expected 1797 rows, found 1");
    }

    #[test]
    fn the_embedded_file_parses() {
        let digits = Digits::load().unwrap();
        assert_eq!(digits.features().dims(), &[Digits::LEN, Digits::FEATURES]);
        assert_eq!(digits.images().unwrap().dims(), &[Digits::LEN, 1, 8, 8]);
    }
}
