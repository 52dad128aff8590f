//! `Display` for tensors, like PyTorch's: values (abbreviated with `...` past
//! 1000 elements), then shape-defining nesting, dtype and device.

use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::tensor::Tensor;
use std::fmt;

/// Elements past which printing abbreviates.
const THRESHOLD: usize = 1000;
/// Elements shown at each end of an abbreviated dimension.
const EDGE_ITEMS: usize = 3;
const PREFIX: &str = "tensor(";

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values: Vec<String> = match dispatch_dtype!(self.dtype(), T => self.to_vec::<T>().map(|v| format_values(&v, self.dtype())))
        {
            Ok(values) => values,
            Err(error) => return write!(f, "tensor(<unreadable: {error}>)"),
        };
        let width = values.iter().map(String::len).max().unwrap_or(0);
        let mut text = String::from(PREFIX);
        write_nested(&mut text, &values, self.dims(), 0, width, self.numel() > THRESHOLD);
        write!(f, "{text}, shape={:?}, dtype={}, device={})", self.dims(), self.dtype(), self.device())
    }
}

fn format_values<T: WithDType>(values: &[T], dtype: DType) -> Vec<String> {
    if dtype == DType::Bool {
        return values.iter().map(|v| if v.to_f64() != 0.0 { "true".into() } else { "false".into() }).collect();
    }
    if !dtype.is_float() {
        return values.iter().map(|v| v.to_i64().to_string()).collect();
    }
    let floats: Vec<f64> = values.iter().map(|v| v.to_f64()).collect();
    let max = floats.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs()));
    let scientific = max >= 1e8 || (max > 0.0 && max < 1e-4);
    floats
        .iter()
        .map(|v| {
            if !v.is_finite() {
                format!("{v}")
            } else if scientific {
                format!("{v:.4e}")
            } else {
                format!("{v:.4}")
            }
        })
        .collect()
}

/// Writes `values` (row-major) with shape `dims`, nested `depth` levels deep.
fn write_nested(out: &mut String, values: &[String], dims: &[usize], depth: usize, width: usize, summarize: bool) {
    let Some((&size, inner_dims)) = dims.split_first() else {
        out.push_str(values.first().map(String::as_str).unwrap_or(""));
        return;
    };
    let inner: usize = inner_dims.iter().product();
    let shown: Vec<Option<usize>> = if summarize && size > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS).map(Some).chain([None]).chain((size - EDGE_ITEMS..size).map(Some)).collect()
    } else {
        (0..size).map(Some).collect()
    };
    // Rows of a matrix go on new lines, aligned under the opening bracket.
    let separator = if inner_dims.is_empty() {
        ", ".to_string()
    } else {
        format!(",{}{}", "\n".repeat(inner_dims.len()), " ".repeat(PREFIX.len() + depth + 1))
    };
    out.push('[');
    for (k, index) in shown.iter().enumerate() {
        if k > 0 {
            out.push_str(&separator);
        }
        match index {
            None => out.push_str("..."),
            Some(i) if inner_dims.is_empty() => out.push_str(&format!("{:>width$}", values[*i])),
            Some(i) => write_nested(out, &values[i * inner..(i + 1) * inner], inner_dims, depth + 1, width, summarize),
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn matrices_print_like_pytorch() {
        let t = Tensor::from_vec_on(vec![1f32, 2.0, 3.0, 4.5], [2, 2], Device::CPU).unwrap();
        assert_eq!(
            t.to_string(),
            "tensor([[1.0000, 2.0000],\n        [3.0000, 4.5000]], shape=[2, 2], dtype=f32, device=cpu:0)"
        );
    }

    #[test]
    fn large_tensors_are_abbreviated() {
        let t = Tensor::arange_on(0.0, 2000.0, 1.0, DType::I64, Device::CPU).unwrap();
        let text = t.to_string();
        assert!(text.starts_with("tensor([   0,    1,    2, ..., 1997, 1998, 1999]"), "{text}");
    }

    #[test]
    fn scalars_and_bools_print() {
        assert_eq!(
            Tensor::scalar_on(true, Device::CPU).unwrap().to_string(),
            "tensor(true, shape=[], dtype=bool, device=cpu:0)"
        );
    }
}
