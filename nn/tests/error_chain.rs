//! `nn` errors keep the error below them as their `source()`: a state dict
//! file that cannot be read reaches the `std::io::Error`, a corrupt one the
//! safetensors error, each found with `downcast_ref`.

use brasa_nn::{NnError, StateDict};
use brasa_tensor::{DType, Tensor};
use std::error::Error;

/// Every error in `error`'s source chain, `error` first.
fn chain<'a>(error: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source()).collect()
}

fn scratch_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("brasa-nn-error-chain-{}-{name}", std::process::id()))
}

#[test]
fn a_missing_file_reaches_the_io_error() {
    let path = scratch_file("missing.safetensors");
    let error = StateDict::load(&path).unwrap_err();
    let NnError::File { path: named, .. } = &error else { panic!("not a file error: {error:?}") };
    assert_eq!(named, &path.display().to_string());
    let io = error.source().and_then(|e| e.downcast_ref::<std::io::Error>()).unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert!(error.to_string().starts_with(&format!("{}: ", path.display())), "{error}");
}

#[test]
fn a_corrupt_file_reaches_the_safetensors_error() {
    let path = scratch_file("corrupt.safetensors");
    std::fs::write(&path, b"\x08\x00\x00\x00\x00\x00\x00\x00not json").unwrap();
    let error = StateDict::load(&path).unwrap_err();
    let _ = std::fs::remove_file(&path);
    assert!(matches!(error, NnError::File { .. }), "{error:?}");
    let links = chain(&error);
    // The file error, the decoding error, the safetensors error.
    let decoding = links[1].downcast_ref::<NnError>().unwrap();
    assert!(matches!(decoding, NnError::Safetensors { .. }), "{decoding:?}");
    assert!(links.iter().any(|e| e.downcast_ref::<safetensors::SafeTensorError>().is_some()), "{links:?}");
    assert!(error.to_string().contains("state dict: not valid safetensors: "), "{error}");
}

#[test]
fn a_good_file_round_trips() {
    let path = scratch_file("good.safetensors");
    let mut dict = StateDict::new();
    dict.insert("w", Tensor::ones([2, 3], DType::F32).unwrap());
    dict.save(&path).unwrap();
    let back = StateDict::load(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(back.get("w").unwrap().dims(), &[2, 3]);
}
