//! With a profiler running, every backward node records a range named after
//! its operation (`backward: linear`), nested inside the caller's range.

use brasa_autograd::{Result, Var};
use brasa_profile::{record_function, Profiler};
use brasa_tensor::{DType, Tensor};

#[test]
fn backward_nodes_show_up_as_ranges() -> Result<()> {
    let w = Var::param(Tensor::ones([3, 4], DType::F32)?)?;
    let x = Var::new(Tensor::ones([2, 4], DType::F32)?);
    let profiler = Profiler::builder().record_shapes(true).start().expect("no other profiler runs in this test");
    {
        let _step = record_function("backward");
        x.linear(&w, None)?.relu()?.sum_all()?.backward()?;
    }
    let result = profiler.stop();
    let table = result.key_averages();
    for name in ["backward: sum", "backward: relu", "backward: linear"] {
        let names: Vec<&str> = table.rows().iter().map(|row| row.name.as_ref()).collect();
        assert_eq!(table.get(name).map(|row| row.count), Some(1), "{name} in {names:?}");
    }
    let outer = result.ranges.iter().position(|r| r.name == "backward").expect("outer range");
    let inner = result.ranges.iter().find(|r| r.name == "backward: linear").expect("backward: linear");
    assert_eq!(inner.parent, Some(outer), "nested in the caller's range");
    Ok(())
}
