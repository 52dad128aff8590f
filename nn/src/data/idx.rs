//! IDX files, the format of MNIST and its kin (Fashion-MNIST, KMNIST, EMNIST):
//! [`read_idx`], [`read_idx_images`], [`read_idx_labels`], and [`Mnist`],
//! which loads the four files of such a data set from a folder.
//!
//! An IDX file is a header — two zero bytes, a type code (`0x08` u8, `0x09`
//! i8, `0x0B` i16, `0x0C` i32, `0x0D` f32, `0x0E` f64), the number of dims,
//! then each dim as a big-endian `u32` — followed by exactly the values the
//! dims call for, big-endian, row-major. Files may be gzipped (recognised by
//! their content, whatever their name). Every part of the header is checked
//! against the file: a truncated, padded or corrupt file is an
//! [`NnError::File`] naming the file and what is wrong, never a panic.

use super::dataset::TensorDataset;
use crate::error::{NnError, Result};
use brasa_tensor::Tensor;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The element type an IDX header names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdxType {
    U8,
    I8,
    I16,
    I32,
    F32,
    F64,
}

impl IdxType {
    fn from_code(code: u8) -> Option<IdxType> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    fn code(self) -> u8 {
        match self {
            IdxType::U8 => 0x08,
            IdxType::I8 => 0x09,
            IdxType::I16 => 0x0B,
            IdxType::I32 => 0x0C,
            IdxType::F32 => 0x0D,
            IdxType::F64 => 0x0E,
        }
    }

    fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            IdxType::U8 => "u8",
            IdxType::I8 => "i8",
            IdxType::I16 => "i16",
            IdxType::I32 => "i32",
            IdxType::F32 => "f32",
            IdxType::F64 => "f64",
        }
    }
}

/// A parsed IDX file: the header and the bytes of its values.
struct Idx {
    kind: IdxType,
    dims: Vec<usize>,
    data: Vec<u8>,
}

impl Idx {
    /// `0x0000TTNN` as the header writes it.
    fn magic(&self) -> u32 {
        (u32::from(self.kind.code()) << 8) | self.dims.len() as u32
    }

    fn describe(&self) -> String {
        format!("{} values of shape {:?}", self.kind.name(), self.dims)
    }
}

/// The file's bytes, decompressed if they are gzipped.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).map_err(|e| NnError::file_error(path, "cannot read", e))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| NnError::file_error(path, "cannot decompress (truncated or corrupt gzip?)", e))?;
        return Ok(out);
    }
    Ok(raw)
}

/// Checks the header of `bytes` against their length and splits off the data.
fn parse(path: &Path, mut bytes: Vec<u8>) -> Result<Idx> {
    let bad = |message: String| NnError::file(path, message);
    if bytes.len() < 4 {
        return Err(bad(format!("too short for an IDX header: {} bytes, need at least 4", bytes.len())));
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "bad magic number 0x{magic:08X}: not an IDX file (its first two bytes must be zero, as in 0x00000803 \
             for images and 0x00000801 for labels)"
        )));
    }
    let kind = IdxType::from_code(bytes[2]).ok_or_else(|| {
        bad(format!(
            "bad magic number 0x{magic:08X}: unknown type code 0x{:02X} (expected 0x08 u8, 0x09 i8, 0x0B i16, 0x0C \
             i32, 0x0D f32 or 0x0E f64)",
            bytes[2]
        ))
    })?;
    let rank = usize::from(bytes[3]);
    if rank == 0 {
        return Err(bad(format!("bad magic number 0x{magic:08X}: the number of dims is 0")));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(bad(format!(
            "truncated header: {rank} dims need {header} header bytes, the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> =
        bytes[4..header].chunks_exact(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
    // A dim of 0 means no data, however large the others are.
    let count = |dims: &[usize]| dims.iter().try_fold(kind.size(), |total, &d| total.checked_mul(d));
    let expected = if dims.contains(&0) { Some(0) } else { count(&dims) }
        .ok_or_else(|| bad(format!("the dims {dims:?} of {} values overflow the address space", kind.name())))?;
    let found = bytes.len() - header;
    if found < expected {
        return Err(bad(format!(
            "truncated: the header promises {} values of shape {dims:?} ({expected} bytes of data), the file has \
             {found}",
            kind.name()
        )));
    }
    if found > expected {
        return Err(bad(format!(
            "{} bytes after the {expected} bytes of data that the header (shape {dims:?}, {}) describes",
            found - expected,
            kind.name()
        )));
    }
    bytes.drain(..header);
    Ok(Idx { kind, dims, data: bytes })
}

/// The values of big-endian `N`-byte elements, converted by `convert`.
fn decode<const N: usize, T>(data: &[u8], convert: impl Fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|chunk| {
            let mut bytes = [0u8; N];
            bytes.copy_from_slice(chunk);
            convert(bytes)
        })
        .collect()
}

/// Reads any IDX file into a host tensor of its shape: `u8` data as `U8`,
/// signed integers as `I64`, `f32` as `F32` and `f64` as `F64`.
pub fn read_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let idx = parse(path, read_bytes(path)?)?;
    let dims = idx.dims.clone();
    let tensor = match idx.kind {
        IdxType::U8 => Tensor::from_vec(idx.data, dims),
        IdxType::I8 => Tensor::from_vec(idx.data.iter().map(|&b| i64::from(b as i8)).collect::<Vec<_>>(), dims),
        IdxType::I16 => Tensor::from_vec(decode(&idx.data, |b| i64::from(i16::from_be_bytes(b))), dims),
        IdxType::I32 => Tensor::from_vec(decode(&idx.data, |b| i64::from(i32::from_be_bytes(b))), dims),
        IdxType::F32 => Tensor::from_vec(decode(&idx.data, f32::from_be_bytes), dims),
        IdxType::F64 => Tensor::from_vec(decode(&idx.data, f64::from_be_bytes), dims),
    };
    Ok(tensor?)
}

/// Reads an IDX file and checks it holds what `expected_rank` and a `u8`
/// type say (magic `0x000008NN`).
fn read_u8_idx(path: &Path, expected_rank: usize, what: &str) -> Result<Idx> {
    let idx = parse(path, read_bytes(path)?)?;
    if idx.kind != IdxType::U8 || idx.dims.len() != expected_rank {
        return Err(NnError::file(
            path,
            format!(
                "expected an IDX {what} file (magic 0x{:08X}: u8 values in {expected_rank} dims), found magic \
                 0x{:08X} ({})",
                (0x08u32 << 8) | expected_rank as u32,
                idx.magic(),
                idx.describe()
            ),
        ));
    }
    Ok(idx)
}

/// Reads an IDX image file (`...-images-idx3-ubyte`, magic `0x00000803`) as
/// its raw pixels: `U8` of shape `[N, rows, cols]`.
pub fn read_idx_images(path: impl AsRef<Path>) -> Result<Tensor> {
    let idx = read_u8_idx(path.as_ref(), 3, "image")?;
    Ok(Tensor::from_vec(idx.data, idx.dims)?)
}

/// Reads an IDX label file (`...-labels-idx1-ubyte`, magic `0x00000801`)
/// as class indices: `I64` of shape `[N]`, ready for `cross_entropy`.
pub fn read_idx_labels(path: impl AsRef<Path>) -> Result<Tensor> {
    let idx = read_u8_idx(path.as_ref(), 1, "label")?;
    let labels: Vec<i64> = idx.data.iter().map(|&b| i64::from(b)).collect();
    Ok(Tensor::from_vec(labels, idx.dims)?)
}

/// The path of `stem` in `dir` under the names it is distributed with:
/// `train-images-idx3-ubyte`, `train-images.idx3-ubyte`, each maybe `.gz`.
fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    let dotted = stem.replacen("-idx", ".idx", 1);
    let names = [stem.to_string(), format!("{stem}.gz"), dotted.clone(), format!("{dotted}.gz")];
    names.iter().map(|name| dir.join(name)).find(|path| path.is_file()).ok_or_else(|| {
        NnError::file(dir.join(stem), format!("not found (looked for {} in {})", names.join(", "), dir.display()))
    })
}

/// An MNIST-format data set read from a folder: the training and test
/// images with their labels. Features are `F32` images `[N, 1, rows, cols]`
/// scaled to [0, 1] (pixel / 255); labels are `I64` `[N]`.
///
/// ```no_run
/// use brasa_nn::data::{DataLoader, Mnist};
///
/// let mnist = Mnist::load("data/mnist")?;      // the four files, gzipped or not
/// let loader = DataLoader::builder(mnist.train).batch_size(128).shuffle(true).build()?;
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Mnist {
    /// `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` (60,000 for MNIST).
    pub train: TensorDataset,
    /// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte` (10,000 for MNIST).
    pub test: TensorDataset,
}

impl Mnist {
    /// Reads `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
    /// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte` from `dir`
    /// (each may also be named `*.idx3-ubyte` and end in `.gz`). A missing,
    /// truncated or corrupt file, or images and labels of different counts,
    /// is an error naming the file.
    pub fn load(dir: impl AsRef<Path>) -> Result<Mnist> {
        let dir = dir.as_ref();
        Ok(Mnist {
            train: Self::load_part(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
            test: Self::load_part(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
        })
    }

    /// One images file and one labels file from `dir` as a dataset.
    fn load_part(dir: &Path, images: &str, labels: &str) -> Result<TensorDataset> {
        let (images_path, labels_path) = (find(dir, images)?, find(dir, labels)?);
        let images = read_u8_idx(&images_path, 3, "image")?;
        let labels = read_idx_labels(&labels_path)?;
        let (n, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
        if labels.dims()[0] != n {
            return Err(NnError::file(
                &labels_path,
                format!("has {} labels but {} has {n} images", labels.dims()[0], images_path.display()),
            ));
        }
        let pixels: Vec<f32> = images.data.iter().map(|&p| f32::from(p) / 255.0).collect();
        TensorDataset::new(Tensor::from_vec(pixels, [n, 1, rows, cols])?, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(code: u8, dims: &[u32]) -> Vec<u8> {
        let mut bytes = vec![0, 0, code, dims.len() as u8];
        for d in dims {
            bytes.extend(d.to_be_bytes());
        }
        bytes
    }

    fn parse_bytes(bytes: Vec<u8>) -> Result<Idx> {
        parse(Path::new("test.idx"), bytes)
    }

    #[test]
    fn headers_are_checked_against_the_data() {
        let mut good = header(0x08, &[2, 3]);
        good.extend([1, 2, 3, 4, 5, 6]);
        let idx = parse_bytes(good.clone()).unwrap();
        assert_eq!(
            (idx.kind, idx.dims.as_slice(), idx.data.as_slice()),
            (IdxType::U8, &[2, 3][..], &[1, 2, 3, 4, 5, 6][..])
        );

        // Each refusal is an NnError::File naming the file, with no lower
        // error; its message says what is wrong, which is what is checked.
        let error = |bytes: Vec<u8>| match parse_bytes(bytes) {
            Err(NnError::File { path, message, source: None }) if path == "test.idx" => message,
            Err(other) => panic!("expected a File error about test.idx, got {other:?}"),
            Ok(_) => panic!("expected an error"),
        };
        assert!(error(vec![0, 0]).contains("too short"));
        assert!(error(vec![1, 2, 3, 4]).contains("bad magic number 0x01020304"));
        assert!(error(vec![0, 0, 0x07, 1]).contains("unknown type code 0x07"));
        assert!(error(vec![0, 0, 0x08, 0]).contains("number of dims is 0"));
        assert!(error(vec![0, 0, 0x08, 2, 0, 0, 0, 2]).contains("truncated header"));
        assert!(error(good[..good.len() - 1].to_vec())
            .contains("truncated: the header promises u8 values of shape [2, 3] (6 bytes of data), the file has 5"));
        let mut padded = good.clone();
        padded.push(0);
        assert!(error(padded).contains("1 bytes after"));
        let huge = header(0x0E, &[u32::MAX, u32::MAX, u32::MAX]);
        assert!(error(huge).contains("overflow"));
        // No data, however large the other dims (found by the `idx` fuzz target).
        let empty = parse_bytes(header(0x0D, &[2048, 1 << 20, u32::MAX, 0])).unwrap();
        assert_eq!((empty.dims.as_slice(), empty.data.len()), (&[2048, 1 << 20, u32::MAX as usize, 0][..], 0));
    }

    #[test]
    fn wide_types_decode_big_endian() {
        assert_eq!(decode(&[0x01, 0x02, 0xFF, 0xFE], i16::from_be_bytes), [0x0102, -2]);
        assert_eq!(decode(&1.5f32.to_be_bytes(), f32::from_be_bytes), [1.5]);
    }
}
