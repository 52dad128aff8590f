//! `amp` errors keep the error below them: a scaler state dict whose value
//! the scaler's checks refuse has the refusal as its `source()`, and an
//! `AmpError` met inside an `nn` API is the `NnError`'s source, whole.

use brasa_amp::{AmpError, GradScaler};
use brasa_nn::NnError;
use brasa_tensor::{Device, Tensor};
use std::error::Error;

fn refused_state_dict() -> Option<AmpError> {
    let mut scaler = GradScaler::new();
    let mut dict = scaler.state_dict().ok()?;
    dict.insert("growth_factor", Tensor::from_vec_on(vec![0.5f64], [], Device::CPU).ok()?);
    scaler.load_state_dict(&dict).err()
}

#[test]
fn a_refused_state_dict_value_keeps_the_refusal_as_its_source() {
    let error = refused_state_dict().unwrap();
    assert!(matches!(error, AmpError::StateDictValue { .. }), "{error:?}");
    let refusal = error.source().and_then(|e| e.downcast_ref::<AmpError>()).unwrap();
    assert!(matches!(refusal, AmpError::Invalid { what: "GradScaler", .. }), "{refusal:?}");
    assert!(error.to_string().contains("growth_factor must be finite and > 1"), "{error}");
}

#[test]
fn an_amp_error_inside_nn_is_the_source_whole() {
    let error = NnError::from(refused_state_dict().unwrap());
    assert!(matches!(error, NnError::External(_)), "{error:?}");
    let amp = error.source().and_then(|e| e.downcast_ref::<AmpError>()).unwrap();
    assert!(matches!(amp, AmpError::StateDictValue { .. }), "{amp:?}");
    assert!(error.to_string().starts_with("GradScaler state dict: "), "{error}");
}
