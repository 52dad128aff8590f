//! Module ranges for the profiler: while a profiler records, each layer a
//! container runs opens a range named by its dotted path and type
//! (`nn.Module: encoder.0 (Linear)`), nested as the modules are, so the op
//! table and the trace show which layer spent the time and allocated the
//! memory. While none records, a scope costs one relaxed atomic load.
//!
//! [`crate::Sequential`] opens scopes for its children; a custom container
//! does the same for its fields:
//!
//! ```
//! use brasa_nn::{module_scope, Linear, Module, Parameters, Result};
//! use brasa_autograd::Var;
//!
//! #[derive(Parameters)]
//! struct TwoLayers { first: Linear, second: Linear }
//!
//! impl Module for TwoLayers {
//!     fn forward(&self, x: &Var) -> Result<Var> {
//!         let h = { let _s = module_scope("first", self.first.type_name()); self.first.forward(x)? };
//!         let _s = module_scope("second", self.second.type_name());
//!         self.second.forward(&h.relu()?)
//!     }
//! }
//! ```

use brasa_profile::{record_function, RangeGuard};
use std::cell::RefCell;
use std::fmt::Display;

thread_local! {
    /// The dotted path of the module running on this thread (only kept while profiling).
    static PATH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// An open module range; closes (and pops the path) when dropped.
#[must_use = "the module range closes as soon as the scope is dropped"]
pub struct ModuleScope {
    restore_len: Option<usize>,
    _range: Option<RangeGuard>,
}

/// Opens the range of the submodule `name` (a field name or an index) of
/// type `type_name` under the current path. Nothing is formatted unless a
/// profiler is recording.
pub fn module_scope(name: impl Display, type_name: &str) -> ModuleScope {
    if !brasa_profile::enabled() {
        return ModuleScope { restore_len: None, _range: None };
    }
    let (restore_len, label) = PATH.with(|path| {
        let mut path = path.borrow_mut();
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        use std::fmt::Write;
        let _ = write!(path, "{name}");
        (len, format!("nn.Module: {path} ({type_name})"))
    });
    ModuleScope { restore_len: Some(restore_len), _range: Some(record_function(label)) }
}

impl Drop for ModuleScope {
    fn drop(&mut self) {
        if let Some(len) = self.restore_len {
            PATH.with(|path| path.borrow_mut().truncate(len));
        }
    }
}

/// `brasa_nn::layers::linear::Linear<T>` → `Linear`.
pub(crate) fn short_type_name(full: &'static str) -> &'static str {
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        assert_eq!(short_type_name("brasa_nn::layers::linear::Linear"), "Linear");
        assert_eq!(short_type_name("my::Wrapper<brasa_nn::Linear>"), "Wrapper");
        assert_eq!(short_type_name("Plain"), "Plain");
    }
}
