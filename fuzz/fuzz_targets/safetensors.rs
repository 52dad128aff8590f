//! The safetensors loader: `StateDict::from_bytes` on arbitrary bytes, then
//! loading what it decoded into a small model (strictly and not) and running
//! the model.
//!
//! Never a panic. And never a silent wrong answer: a decoded state dict must
//! encode again, and decoding that encoding must give the same names, dtypes,
//! shapes and bytes (so the loader cannot have read something the writer
//! would not write); a strict load that succeeds must leave the model's
//! state dict equal to what was loaded, and a failed strict load must leave
//! the model untouched.

#![no_main]

use brasa_autograd::Var;
use brasa_nn::{BatchNorm2d, Conv2d, Flatten, LayerNorm, Linear, Module, ModuleExt, Relu, Sequential, StateDict};
use brasa_tensor::{DType, Device, Tensor};
use libfuzzer_sys::fuzz_target;

/// Conv2d(1→2, 2×2) · BatchNorm2d(2) · ReLU · Flatten · Linear(8→3) · LayerNorm(3):
/// parameters and buffers of every kind (f32 weights, an i64 counter).
fn model() -> Sequential {
    let dev = Device::CPU;
    Sequential::new()
        .push(Conv2d::new(1, 2, 2, dev).expect("conv"))
        .push(BatchNorm2d::new(2, dev).expect("batch norm"))
        .push(Relu)
        .push(Flatten::new())
        .push(Linear::new(8, 3, dev).expect("linear"))
        .push(LayerNorm::new([3], dev).expect("layer norm"))
}

/// Every tensor of a state dict as (name, dtype, dims, little-endian bytes).
fn contents(dict: &StateDict) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    dict.iter()
        .map(|(name, tensor)| {
            let bytes = tensor.host_bytes().expect("host tensor bytes").to_vec();
            (name.to_string(), tensor.dtype(), tensor.dims().to_vec(), bytes)
        })
        .collect()
}

fn sorted(mut entries: Vec<(String, DType, Vec<usize>, Vec<u8>)>) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

fuzz_target!(|data: &[u8]| {
    let Ok(dict) = StateDict::from_bytes(data) else {
        return;
    };
    // Round trip: what was decoded encodes, and decodes to the same thing.
    let encoded = dict.to_bytes().expect("a decoded state dict must encode");
    let again = StateDict::from_bytes(&encoded).expect("brasa's own encoding must decode");
    assert_eq!(sorted(contents(&dict)), sorted(contents(&again)), "round trip changed the state dict");

    let model = model();
    let before = contents(&model.state_dict());
    match model.load_state_dict(&dict, true) {
        Ok(report) => {
            assert!(report.is_clean(), "a strict load reported {report}");
            let loaded = sorted(contents(&model.state_dict()));
            let mut expected = sorted(contents(&dict));
            // A strict load took every name; compare values name by name.
            expected.retain(|(name, ..)| loaded.iter().any(|(n, ..)| n == name));
            assert_eq!(loaded, expected, "a strict load did not copy what it was given");
        }
        Err(_) => assert_eq!(contents(&model.state_dict()), before, "a failed strict load changed the model"),
    }
    let _ = model.load_state_dict(&dict, false);
    // The loaded weights (NaN, inf, anything) must give a result or an error.
    let x = Tensor::from_vec((0..18).map(|i| i as f32 / 7.0).collect::<Vec<f32>>(), [2, 1, 3, 3]).expect("input");
    let _ = model.forward(&Var::new(x));
});
