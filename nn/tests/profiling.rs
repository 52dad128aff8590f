//! With a profiler recording, every layer a `Sequential` runs opens a range
//! named by its dotted path and type, nested as the modules are; the ops of
//! the layer land inside it.

use brasa_autograd::Var;
use brasa_nn::{Linear, Module, Relu, Result, Sequential};
use brasa_profile::Profiler;
use brasa_tensor::{DType, Device, Tensor};

#[test]
fn sequential_layers_record_dotted_module_ranges() -> Result<()> {
    let dev = Device::CPU;
    let inner = Sequential::new().push(Linear::new(4, 4, dev)?).push(Relu);
    let model = Sequential::new().push(Linear::new(3, 4, dev)?).push(inner);
    let x = Var::new(Tensor::ones([2, 3], DType::F32)?);
    let profiler = Profiler::builder().start().expect("no other profiler in this test binary");
    model.forward(&x)?;
    let result = profiler.stop();
    let names: Vec<&str> = result.ranges.iter().map(|r| r.name.as_ref()).collect();
    for expected in
        ["nn.Module: 0 (Linear)", "nn.Module: 1 (Sequential)", "nn.Module: 1.0 (Linear)", "nn.Module: 1.1 (Relu)"]
    {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    let index = |name: &str| result.ranges.iter().position(|r| r.name == name).unwrap();
    assert_eq!(result.ranges[index("nn.Module: 1.0 (Linear)")].parent, Some(index("nn.Module: 1 (Sequential)")));
    let matmuls: Vec<_> = result.ranges.iter().filter(|r| r.name == "matmul").collect();
    assert_eq!(matmuls.len(), 2);
    assert!(matmuls.iter().all(|m| m.parent.is_some_and(|p| result.ranges[p].name.contains("(Linear)"))));
    Ok(())
}
