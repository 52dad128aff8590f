//! The `Module` machinery: names found by `#[derive(Parameters)]`, nested
//! and skipped fields, train/eval flags, moving and converting in place,
//! and state dicts through safetensors — round trips, strict and non-strict
//! loading, and damaged files as errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::{Linear, LoadReport, Module, ModuleExt, NnError, Parameters, Result, StateDict, Training};
use brasa_tensor::{DType, Device, Tensor};

#[derive(Parameters)]
struct Block {
    fc: Linear,
    scale: Var,
    running: Tensor,
    mode: Training,
    #[module(skip)]
    #[allow(dead_code)]
    cache: Vec<Var>,
    width: usize,
}

impl Module for Block {
    fn forward(&self, x: &Var) -> Result<Var> {
        Ok(self.fc.forward(x)?.mul(&self.scale)?)
    }
}

#[derive(Parameters)]
struct Net {
    blocks: Vec<Block>,
    head: Option<Linear>,
    tail: Option<Linear>,
}

impl Module for Net {
    fn forward(&self, x: &Var) -> Result<Var> {
        let mut h = x.clone();
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        match &self.head {
            Some(head) => head.forward(&h),
            None => Ok(h),
        }
    }
}

/// A tuple struct: fields are named by position.
#[derive(Parameters)]
struct Pair(Linear, Linear);

fn values(shape: &[usize], salt: f64) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| ((i as f64 + salt) * 0.37).sin() as f32).collect::<Vec<_>>(), shape).unwrap()
}

fn block(width: usize) -> Block {
    Block {
        fc: Linear::new(width, width, Device::CPU).unwrap(),
        scale: Var::param(values(&[width], 1.0)).unwrap(),
        running: Tensor::zeros([width], DType::F32).unwrap(),
        mode: Training::default(),
        cache: vec![Var::param(values(&[2], 0.0)).unwrap()],
        width,
    }
}

fn net() -> Net {
    Net { blocks: vec![block(4), block(4)], head: Some(Linear::new(4, 3, Device::CPU).unwrap()), tail: None }
}

fn names(model: &impl ModuleExt) -> Vec<String> {
    model.named_parameters().into_iter().map(|(name, _)| name).collect()
}

#[test]
fn derive_names_parameters_buffers_and_skips() {
    let model = net();
    assert_eq!(
        names(&model),
        [
            "blocks.0.fc.weight",
            "blocks.0.fc.bias",
            "blocks.0.scale",
            "blocks.1.fc.weight",
            "blocks.1.fc.bias",
            "blocks.1.scale",
            "head.weight",
            "head.bias"
        ]
    );
    let buffers: Vec<String> = model.named_buffers().into_iter().map(|(name, _)| name).collect();
    assert_eq!(buffers, ["blocks.0.running", "blocks.1.running"]);
    assert_eq!(model.num_parameters(), 2 * (16 + 4 + 4) + 12 + 3);
    assert_eq!(model.state_dict().len(), 10);
    assert_eq!(
        names(&Pair(Linear::new(2, 2, Device::CPU).unwrap(), Linear::new(2, 1, Device::CPU).unwrap())),
        ["0.weight", "0.bias", "1.weight", "1.bias"]
    );
    // Through a trait object too.
    let boxed: Box<dyn Module> = Box::new(net());
    assert_eq!(boxed.parameters().len(), 8);
}

#[test]
fn shared_parameters_are_listed_once() {
    let shared = Linear::new(3, 3, Device::CPU).unwrap();
    let twin = Linear { weight: shared.weight.clone(), bias: None };
    let pair = Pair(shared, twin);
    assert_eq!(names(&pair), ["0.weight", "0.bias"]);
}

#[test]
fn train_and_eval_reach_every_flag() {
    let mut model = net();
    assert!(model.is_training());
    model.eval();
    assert!(!model.is_training());
    assert!(model.blocks.iter().all(|b| !b.mode.get()));
    model.train();
    assert!(model.blocks.iter().all(|b| b.mode.get()));
}

#[test]
fn to_dtype_converts_floats_and_keeps_requires_grad() -> Result<()> {
    let mut model = net();
    model.to_dtype(DType::F64)?;
    assert!(model.parameters().iter().all(|p| p.dtype() == DType::F64 && p.requires_grad()));
    assert!(model.named_buffers().iter().all(|(_, b)| b.dtype() == DType::F64));
    let y = model.forward(&Var::new(values(&[2, 4], 3.0).to_dtype(DType::F64)?))?;
    assert_eq!((y.dims(), y.dtype()), (&[2, 3][..], DType::F64));
    model.to_device(Device::CPU)?;
    Ok(())
}

#[test]
fn to_dtype_refuses_integer_and_bool_dtypes_and_changes_nothing() -> Result<()> {
    let mut model = net();
    let before: Vec<Var> = model.parameters();
    for dtype in [DType::I64, DType::U8, DType::Bool] {
        let err = model.to_dtype(dtype).unwrap_err();
        assert!(matches!(err, NnError::Invalid { what: "to_dtype", .. }), "{err:?}");
        // The variant says no more: the message names the rule and the dtype.
        assert!(err.to_string().contains("floating-point") && err.to_string().contains(&dtype.to_string()), "{err}");
    }
    // Nothing was converted: the same parameters, still f32 and trainable.
    let after = model.parameters();
    assert!(before.iter().zip(&after).all(|(a, b)| a.same_var(b)));
    assert!(after.iter().all(|p| p.dtype() == DType::F32 && p.requires_grad()));
    Ok(())
}

#[test]
fn state_dict_round_trips_through_safetensors_bytes_and_files() -> Result<()> {
    let a = net();
    let b = net();
    assert_ne!(a.blocks[0].fc.weight.tensor().to_vec::<f32>()?, b.blocks[0].fc.weight.tensor().to_vec::<f32>()?);
    a.blocks[1].running.fill_(7.0)?;
    let path = std::env::temp_dir().join(format!("brasa-nn-module-{}.safetensors", std::process::id()));
    a.save(&path)?;
    let report = b.load(&path)?;
    std::fs::remove_file(&path).ok();
    assert!(report.is_clean());
    for ((name, x), (_, y)) in a.state_dict().iter().zip(b.state_dict().iter()) {
        assert_eq!(x.to_vec::<f32>()?, y.to_vec::<f32>()?, "{name}");
    }
    // Every dtype survives the encoding.
    let mut dict = StateDict::new();
    dict.insert("f64", Tensor::from_vec(vec![1.5f64, -2.0], [2])?);
    dict.insert("bf16", Tensor::from_vec(vec![1.5f32, -2.0], [2])?.to_dtype(DType::BF16)?);
    dict.insert("f16", Tensor::from_vec(vec![0.25f32], [1, 1])?.to_dtype(DType::F16)?);
    dict.insert("i64", Tensor::from_vec(vec![3i64], [])?);
    dict.insert("u8", Tensor::from_vec(vec![9u8, 0], [2])?);
    dict.insert("bool", Tensor::from_vec(vec![true, false], [2])?);
    let back = StateDict::from_bytes(&dict.to_bytes()?)?;
    let mut expected: Vec<&str> = dict.names().collect();
    expected.sort();
    assert_eq!(back.names().collect::<Vec<_>>(), expected, "loaded in name order");
    for (name, tensor) in dict.iter() {
        let other = back.get(name).unwrap();
        assert_eq!((other.dtype(), other.dims()), (tensor.dtype(), tensor.dims()), "{name}");
        assert_eq!(other.to_dtype(DType::F64)?.to_vec::<f64>()?, tensor.to_dtype(DType::F64)?.to_vec::<f64>()?);
    }
    Ok(())
}

#[test]
fn safetensors_header_is_what_pytorch_writes() -> Result<()> {
    let bytes = Linear::new(3, 2, Device::CPU)?.state_dict().to_bytes()?;
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(header["__metadata__"]["format"], "pt");
    assert_eq!(header["weight"]["dtype"], "F32");
    assert_eq!(header["weight"]["shape"], serde_json::json!([2, 3]));
    assert_eq!(header["bias"]["shape"], serde_json::json!([2]));
    Ok(())
}

#[test]
fn strict_loading_names_what_does_not_fit() -> Result<()> {
    let model = net();
    let mut dict = model.state_dict();
    dict.remove("head.bias");
    dict.insert("head.extra", Tensor::zeros([1], DType::F32)?);
    dict.insert("blocks.0.scale", Tensor::zeros([5], DType::F32)?);
    let before = model.blocks[1].scale.tensor().to_vec::<f32>()?;
    let err = model.load_state_dict(&dict, true).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, NnError::StateDict(_)), "{text}");
    for needle in ["head.bias", "head.extra", "blocks.0.scale", "[5]", "[4]"] {
        assert!(text.contains(needle), "{needle} missing from: {text}");
    }
    // Strict failure copies nothing, even what fits.
    dict.insert("blocks.1.scale", Tensor::full([4], 9.0, DType::F32)?);
    assert!(model.load_state_dict(&dict, true).is_err());
    assert_eq!(model.blocks[1].scale.tensor().to_vec::<f32>()?, before);
    // Non-strict copies what fits and reports the rest.
    let report = model.load_state_dict(&dict, false)?;
    assert_eq!(report.missing, ["head.bias"]);
    assert_eq!(report.unexpected, ["head.extra"]);
    assert_eq!(report.mismatched.len(), 1);
    assert_eq!(model.blocks[1].scale.tensor().to_vec::<f32>()?, vec![9.0; 4]);
    assert_ne!(report, LoadReport::default());
    // A wrong dtype is a mismatch too.
    let mut wrong = model.state_dict();
    wrong.insert("head.weight", Tensor::zeros([3, 4], DType::F64)?);
    let err = model.load_state_dict(&wrong, true).unwrap_err();
    assert!(matches!(&err, NnError::StateDict(report) if report.contains("head.weight")), "{err:?}");
    Ok(())
}

#[test]
fn damaged_files_are_errors_not_panics() -> Result<()> {
    let bytes = net().state_dict().to_bytes()?;
    for cut in [0, 4, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        assert!(StateDict::from_bytes(&bytes[..cut]).is_err(), "truncated at {cut}");
    }
    let mut corrupt = bytes.clone();
    corrupt[10] = b'!';
    assert!(StateDict::from_bytes(&corrupt).is_err());
    let mut huge_header = bytes;
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(StateDict::from_bytes(&huge_header).is_err());
    let missing = StateDict::load("/nonexistent/brasa/weights.safetensors").unwrap_err();
    assert!(
        matches!(&missing, NnError::File { path, source: Some(_), .. }
            if path == "/nonexistent/brasa/weights.safetensors"),
        "{missing:?}"
    );
    let io = std::error::Error::source(&missing).and_then(|e| e.downcast_ref::<std::io::Error>());
    assert_eq!(io.map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound), "{missing:?}");
    Ok(())
}
