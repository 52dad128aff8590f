//! The IDX (MNIST format) reader: `read_idx`, `read_idx_images`,
//! `read_idx_labels` and `Mnist::load` on arbitrary file contents (raw or
//! gzipped; the public entry points take paths, so the input is written to a
//! file first).
//!
//! Never a panic, and never a silent wrong answer: the result is checked
//! against a reference decoder written here from the format's description
//! (header, big-endian values, exact length): `read_idx` succeeds exactly
//! when the reference does (or fails only because the shape is too large
//! for a tensor) and then gives the reference's dims and values.

#![no_main]

use brasa_nn::data::{read_idx, read_idx_images, read_idx_labels, Dataset, Mnist};
use brasa_tensor::{DType, Shape, Tensor};
use libfuzzer_sys::fuzz_target;
use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A folder of this process's own (in memory when `/dev/shm` exists).
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir = base.join(format!("brasa-fuzz-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir
    })
}

/// What the reference decoder reads: type code, dims, values as f64 (exact
/// for every IDX type: u8, i8, i16, i32 and f32 widen exactly).
#[derive(Debug, PartialEq)]
struct Reference {
    code: u8,
    dims: Vec<usize>,
    values: Vec<f64>,
}

fn reference(bytes: &[u8]) -> Option<Reference> {
    let (&[z0, z1, code, rank], rest) = bytes.split_first_chunk::<4>()?;
    if z0 != 0 || z1 != 0 || rank == 0 {
        return None;
    }
    let size = match code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        _ => return None,
    };
    let header_dims = rest.get(..4 * usize::from(rank))?;
    let data = &rest[4 * usize::from(rank)..];
    let dims: Vec<usize> =
        header_dims.chunks_exact(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
    let count = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    if count.checked_mul(size)? != data.len() {
        return None;
    }
    let values = data
        .chunks_exact(size)
        .map(|b| match code {
            0x08 => f64::from(b[0]),
            0x09 => f64::from(b[0] as i8),
            0x0B => f64::from(i16::from_be_bytes([b[0], b[1]])),
            0x0C => f64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            0x0D => f64::from(f32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            _ => f64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        })
        .collect();
    Some(Reference { code, dims, values })
}

fn values(tensor: &Tensor) -> Vec<f64> {
    match tensor.dtype() {
        DType::U8 => tensor.to_vec::<u8>().expect("u8").into_iter().map(f64::from).collect(),
        DType::I64 => tensor.to_vec::<i64>().expect("i64").into_iter().map(|v| v as f64).collect(),
        DType::F32 => tensor.to_vec::<f32>().expect("f32").into_iter().map(f64::from).collect(),
        DType::F64 => tensor.to_vec::<f64>().expect("f64"),
        other => panic!("read_idx returned {other}"),
    }
}

fn same_values(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// An IDX file of u8 values.
fn idx_u8(dims: &[usize], values: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        bytes.extend((d as u32).to_be_bytes());
    }
    bytes.extend_from_slice(values);
    bytes
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let path = dir.join("input-idx");
    std::fs::write(&path, data).expect("write the input");

    let decompressed;
    let plain: &[u8] = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        match flate2::read::GzDecoder::new(data).read_to_end(&mut out) {
            Ok(_) => {
                decompressed = out;
                &decompressed
            }
            Err(_) => {
                assert!(read_idx(&path).is_err(), "a corrupt gzip file was read");
                return;
            }
        }
    } else {
        data
    };
    let expected = reference(plain);

    match (read_idx(&path), &expected) {
        (Ok(tensor), Some(expected)) => {
            assert_eq!(tensor.dims(), expected.dims.as_slice(), "dims");
            assert!(same_values(&values(&tensor), &expected.values), "values differ from the reference decoder");
        }
        (Ok(tensor), None) => panic!("read_idx accepted a file the reference rejects: {:?}", tensor.dims()),
        (Err(error), Some(expected)) => assert!(
            Shape::new(expected.dims.clone()).try_numel().is_err(),
            "read_idx rejected a valid file of shape {:?}: {error}",
            expected.dims
        ),
        (Err(_), None) => {}
    }

    let is_u8_of_rank = |rank: usize| expected.as_ref().is_some_and(|e| e.code == 0x08 && e.dims.len() == rank);
    let images = read_idx_images(&path);
    if !is_u8_of_rank(3) {
        assert!(images.is_err(), "read_idx_images accepted a file that is not u8 in 3 dims");
    }
    let labels = read_idx_labels(&path);
    if !is_u8_of_rank(1) {
        assert!(labels.is_err(), "read_idx_labels accepted a file that is not u8 in 1 dim");
    }
    if let Ok(labels) = &labels {
        assert_eq!(labels.dtype(), DType::I64);
    }

    // A whole MNIST folder: the input as both image files with labels that
    // match, or the input as both label files with images that match.
    let Some(expected) = expected.filter(|e| e.code == 0x08 && (e.dims.len() == 3 || e.dims.len() == 1)) else {
        return;
    };
    let n = expected.dims[0];
    if n > 1 << 16 {
        return;
    }
    let mnist_dir = dir.join("mnist");
    std::fs::create_dir_all(&mnist_dir).expect("mnist folder");
    let (images_file, labels_file) = if expected.dims.len() == 3 {
        (data.to_vec(), idx_u8(&[n], &vec![7; n]))
    } else {
        (idx_u8(&[n, 1, 1], &vec![255; n]), data.to_vec())
    };
    for split in ["train", "t10k"] {
        std::fs::write(mnist_dir.join(format!("{split}-images-idx3-ubyte")), &images_file).expect("write");
        std::fs::write(mnist_dir.join(format!("{split}-labels-idx1-ubyte")), &labels_file).expect("write");
    }
    match Mnist::load(&mnist_dir) {
        Ok(mnist) => {
            assert_eq!(mnist.train.len(), n);
            assert_eq!(mnist.test.len(), n);
        }
        Err(error) => {
            let (rows, cols) = if expected.dims.len() == 3 { (expected.dims[1], expected.dims[2]) } else { (1, 1) };
            assert!(
                Shape::new(vec![n, 1, rows, cols]).try_numel().is_err(),
                "Mnist::load rejected a valid folder ({n} images of {rows}x{cols}): {error}"
            );
        }
    }
});
