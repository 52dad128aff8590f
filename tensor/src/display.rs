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
/// The most values ever formatted. Abbreviation keeps dims of up to
/// `2 * EDGE_ITEMS` whole, so a tensor with many short dims (an expanded
/// `[2; 60]`) would still show 2^60 values: past this count only the shape
/// is printed, instead of a print that never ends.
const MAX_SHOWN: usize = 100_000;
const PREFIX: &str = "tensor(";

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let summarize = self.numel() > THRESHOLD;
        let shown = match dispatch_dtype!(self.dtype(), T => self.shown_values::<T>(summarize)) {
            Ok(shown) => shown,
            Err(error) => return write!(f, "tensor(<unreadable: {error}>)"),
        };
        let mut text = String::from(PREFIX);
        match shown {
            // Nothing to show (PyTorch prints `tensor([], size=...)`).
            Shown::Empty => text.push_str("[]"),
            Shown::TooMany => text.push_str("[...]"),
            Shown::Values(values, dims) => {
                let width = values.iter().map(String::len).max().unwrap_or(0);
                let layout = Nesting { dims: &dims, full: self.dims(), width, summarize };
                write_nested(&mut text, &values, &layout, 0);
            }
        }
        write!(f, "{text}, shape={:?}, dtype={}, device={})", self.dims(), self.dtype(), self.device())
    }
}

/// What printing a tensor shows.
enum Shown {
    /// No elements.
    Empty,
    /// Even abbreviated, more than [`MAX_SHOWN`] values.
    TooMany,
    /// The formatted values, row-major, and the dims of the grid they make.
    Values(Vec<String>, Vec<usize>),
}

/// The element indices shown along a dim of `size`: all of them, or the
/// first and last [`EDGE_ITEMS`] when summarizing.
fn shown_indices(size: usize, summarize: bool) -> Vec<usize> {
    if summarize && size > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS).chain(size - EDGE_ITEMS..size).collect()
    } else {
        (0..size).collect()
    }
}

impl Tensor {
    /// The formatted values of the elements printed. Only those elements
    /// are read (at most 6 per dim when summarizing, at most [`MAX_SHOWN`]
    /// in all), so printing a huge or expanded tensor costs what printing a
    /// small one does.
    fn shown_values<T: WithDType>(&self, summarize: bool) -> crate::Result<Shown> {
        if self.numel() == 0 {
            return Ok(Shown::Empty);
        }
        if !crate::backend::runtime_for(self.device())?.values_on_host() {
            return self.to(crate::Device::CPU)?.shown_values::<T>(summarize);
        }
        let kept: Vec<Vec<usize>> = self.dims().iter().map(|&size| shown_indices(size, summarize)).collect();
        let dims: Vec<usize> = kept.iter().map(Vec::len).collect();
        if dims.iter().try_fold(1usize, |count, &d| count.checked_mul(d)).is_none_or(|count| count > MAX_SHOWN) {
            return Ok(Shown::TooMany);
        }
        let data = self.storage().read::<T>("display")?;
        let mut values = Vec::with_capacity(dims.iter().product());
        let mut index = vec![0usize; dims.len()];
        loop {
            // In range, so within the layout's bounds: no overflow.
            let offset = index
                .iter()
                .zip(&kept)
                .zip(self.strides())
                .fold(self.layout().offset() as isize, |at, ((&k, shown), &stride)| at + shown[k] as isize * stride);
            values.push(data[offset as usize]);
            // Odometer over the shown indices, last dim fastest.
            let Some(d) = (0..dims.len()).rev().find(|&d| index[d] + 1 < dims[d]) else { break };
            index[d] += 1;
            index[d + 1..].fill(0);
        }
        Ok(Shown::Values(format_values(&values, self.dtype()), dims))
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

/// How the shown values nest: the grid they make (`dims`), the tensor's
/// dims (`full`, where a summarized dim gets its `...`), the column width.
struct Nesting<'a> {
    dims: &'a [usize],
    full: &'a [usize],
    width: usize,
    summarize: bool,
}

/// Writes `values` (row-major over `layout.dims[depth..]`), nested from
/// `depth` on.
fn write_nested(out: &mut String, values: &[String], layout: &Nesting<'_>, depth: usize) {
    let Some(&size) = layout.dims.get(depth) else {
        out.push_str(values.first().map(String::as_str).unwrap_or(""));
        return;
    };
    let inner_rank = layout.dims.len() - depth - 1;
    let inner: usize = layout.dims[depth + 1..].iter().product();
    let elided = layout.summarize && layout.full[depth] > 2 * EDGE_ITEMS;
    // Rows of a matrix go on new lines, aligned under the opening bracket.
    let separator = if inner_rank == 0 {
        ", ".to_string()
    } else {
        format!(",{}{}", "\n".repeat(inner_rank), " ".repeat(PREFIX.len() + depth + 1))
    };
    out.push('[');
    for i in 0..size {
        if i > 0 {
            out.push_str(&separator);
        }
        if elided && i == EDGE_ITEMS {
            out.push_str("...");
            out.push_str(&separator);
        }
        if inner_rank == 0 {
            out.push_str(&format!("{:>width$}", values[i], width = layout.width));
        } else {
            write_nested(out, &values[i * inner..(i + 1) * inner], layout, depth + 1);
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
    fn huge_expanded_and_empty_tensors_print_without_reading_everything() {
        let one = Tensor::scalar_on(7i64, Device::CPU).unwrap();
        let text = one.expand([1 << 40, 1 << 20]).unwrap().to_string();
        assert!(text.starts_with("tensor([[7, 7, 7, ..., 7, 7, 7],\n        [7, 7, 7"), "{text}");
        assert!(text.ends_with("shape=[1099511627776, 1048576], dtype=i64, device=cpu:0)"), "{text}");
        let empty = Tensor::zeros_on([1 << 44, 0], DType::F32, Device::CPU).unwrap();
        assert_eq!(empty.to_string(), "tensor([], shape=[17592186044416, 0], dtype=f32, device=cpu:0)");
        let rows = Tensor::arange_on(0.0, 2002.0, 1.0, DType::I64, Device::CPU).unwrap().reshape(&[1001, 2]).unwrap();
        let text = rows.t().unwrap().to_string();
        assert!(text.starts_with("tensor([[   0,    2,    4, ..., 1996, 1998, 2000],\n        [   1,"), "{text}");
        // Many short dims: abbreviation keeps each whole, so 2^60 values
        // would be shown; past MAX_SHOWN only the shape is printed (before,
        // this ran out of memory or never ended).
        let many = one.reshape(&[1; 60]).unwrap().expand(vec![2usize; 60]).unwrap();
        let text = many.to_string();
        assert!(text.starts_with("tensor([...], shape=[2, 2, 2"), "{text}");
        assert!(text.ends_with("dtype=i64, device=cpu:0)"), "{text}");
    }

    #[test]
    fn scalars_and_bools_print() {
        assert_eq!(
            Tensor::scalar_on(true, Device::CPU).unwrap().to_string(),
            "tensor(true, shape=[], dtype=bool, device=cpu:0)"
        );
    }
}
