//! Walking a model's fields: [`Parameters`] (what can be walked, usually
//! written by `#[derive(Parameters)]`), and [`Walk`] and [`WalkMut`], which
//! carry the dotted path (`encoder.0.weight`) down through submodules and
//! hand every parameter, buffer and training flag to a [`Visitor`] /
//! [`VisitorMut`]. Everything that needs the list of parameters —
//! `parameters()`, state dicts, moving a model to a device,
//! `train()`/`eval()` — is a visitor, so a layer only says once which fields
//! it has (usually through `#[derive(Parameters)]`).
//!
//! ```
//! use brasa_nn::{Linear, ModuleExt, Visitor, Walk, Parameters};
//! use brasa_autograd::Var;
//! use brasa_tensor::Device;
//!
//! struct Names(Vec<String>);
//! impl Visitor for Names {
//!     fn param(&mut self, path: &str, _param: &Var) {
//!         self.0.push(path.to_string());
//!     }
//! }
//! let layer = Linear::new(3, 2, Device::CPU)?;
//! let mut names = Names(Vec::new());
//! layer.visit(&mut Walk::new(&mut names));
//! assert_eq!(names.0, ["weight", "bias"]);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::Result;
use crate::flags::{KeepFloat32, Training};
use brasa_autograd::Var;
use brasa_tensor::Tensor;

/// A layer's (or model's) parameters, buffers, submodules and train/eval
/// flag, found by walking its fields. `#[derive(Parameters)]` writes both
/// methods: every field is visited under its name (`Var` fields are
/// parameters, `Tensor` fields buffers, [`Training`] the flag, other modules
/// recursively); mark a field `#[module(skip)]` to leave it out.
pub trait Parameters {
    /// Reports every parameter, buffer and flag to `walk`.
    fn visit(&self, walk: &mut Walk<'_>);
    /// Reports every parameter, buffer and flag to `walk`, which may replace them.
    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()>;
}

/// Receives what a read-only [`Walk`] finds, with its dotted path.
pub trait Visitor {
    /// A parameter (a `Var` field).
    fn param(&mut self, path: &str, param: &Var) {
        let _ = (path, param);
    }
    /// A buffer (a `Tensor` field: saved in the state dict, not trained).
    fn buffer(&mut self, path: &str, buffer: &Tensor) {
        let _ = (path, buffer);
    }
    /// A train/eval flag.
    fn training(&mut self, path: &str, training: &Training) {
        let _ = (path, training);
    }
    /// A [`KeepFloat32`] marker: the layer at `module_path` (the marker's
    /// parent, `""` for the root) keeps its parameters and arithmetic in f32
    /// under mixed precision.
    fn keep_float32(&mut self, module_path: &str) {
        let _ = module_path;
    }
}

/// Receives what a [`WalkMut`] finds and may replace it.
pub trait VisitorMut {
    /// A parameter, which may be replaced (for example by a copy on another device).
    fn param(&mut self, path: &str, param: &mut Var) -> Result<()> {
        let _ = (path, param);
        Ok(())
    }
    /// A buffer, which may be replaced.
    fn buffer(&mut self, path: &str, buffer: &mut Tensor) -> Result<()> {
        let _ = (path, buffer);
        Ok(())
    }
    /// A train/eval flag, which may be changed.
    fn training(&mut self, path: &str, training: &mut Training) -> Result<()> {
        let _ = (path, training);
        Ok(())
    }
    /// A [`KeepFloat32`] marker of the layer at `module_path` (see
    /// [`Visitor::keep_float32`]).
    fn keep_float32(&mut self, module_path: &str) -> Result<()> {
        let _ = module_path;
        Ok(())
    }
}

/// A read-only walk over a model's fields; see the module docs.
pub struct Walk<'a> {
    path: String,
    visitor: &'a mut dyn Visitor,
}

impl<'a> Walk<'a> {
    /// A walk that reports to `visitor`, starting at the empty path.
    pub fn new(visitor: &'a mut dyn Visitor) -> Walk<'a> {
        Walk { path: String::new(), visitor }
    }

    /// The dotted path of the field being visited.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Visits `value` as the field `name` of the current path.
    pub fn field<T: Parameters + ?Sized>(&mut self, name: &str, value: &T) {
        let len = push_segment(&mut self.path, name);
        value.visit(self);
        self.path.truncate(len);
    }

    /// Reports a parameter at the current path.
    pub fn param(&mut self, param: &Var) {
        self.visitor.param(&self.path, param);
    }

    /// Reports a buffer at the current path.
    pub fn buffer(&mut self, buffer: &Tensor) {
        self.visitor.buffer(&self.path, buffer);
    }

    /// Reports a train/eval flag at the current path.
    pub fn training(&mut self, training: &Training) {
        self.visitor.training(&self.path, training);
    }

    /// Reports a [`KeepFloat32`] marker found at the current path, with the
    /// path of the layer that holds it.
    pub fn keep_float32(&mut self, _marker: &KeepFloat32) {
        self.visitor.keep_float32(parent_path(&self.path));
    }
}

/// A walk that may replace what it finds; see the module docs.
pub struct WalkMut<'a> {
    path: String,
    visitor: &'a mut dyn VisitorMut,
}

impl<'a> WalkMut<'a> {
    /// A walk that reports to `visitor`, starting at the empty path.
    pub fn new(visitor: &'a mut dyn VisitorMut) -> WalkMut<'a> {
        WalkMut { path: String::new(), visitor }
    }

    /// The dotted path of the field being visited.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Visits `value` as the field `name` of the current path.
    pub fn field<T: Parameters + ?Sized>(&mut self, name: &str, value: &mut T) -> Result<()> {
        let len = push_segment(&mut self.path, name);
        let result = value.visit_mut(self);
        self.path.truncate(len);
        result
    }

    /// Reports a parameter at the current path.
    pub fn param(&mut self, param: &mut Var) -> Result<()> {
        self.visitor.param(&self.path, param)
    }

    /// Reports a buffer at the current path.
    pub fn buffer(&mut self, buffer: &mut Tensor) -> Result<()> {
        self.visitor.buffer(&self.path, buffer)
    }

    /// Reports a train/eval flag at the current path.
    pub fn training(&mut self, training: &mut Training) -> Result<()> {
        self.visitor.training(&self.path, training)
    }

    /// Reports a [`KeepFloat32`] marker found at the current path, with the
    /// path of the layer that holds it.
    pub fn keep_float32(&mut self, _marker: &KeepFloat32) -> Result<()> {
        self.visitor.keep_float32(parent_path(&self.path))
    }
}

/// Appends `.name` (or `name` at the root) and returns the length to restore.
fn push_segment(path: &mut String, name: &str) -> usize {
    let len = path.len();
    if !path.is_empty() && !name.is_empty() {
        path.push('.');
    }
    path.push_str(name);
    len
}

/// The path without its last segment (`"encoder.0"` for `"encoder.0.keep"`,
/// `""` for `"keep"`).
fn parent_path(path: &str) -> &str {
    path.rfind('.').map_or("", |dot| &path[..dot])
}

// ----- what fields can be -----------------------------------------------------------

/// Leaf fields, each reported to the visitor by the `Walk`/`WalkMut` method
/// of the same name.
macro_rules! leaf {
    ($($ty:ty => $report:ident),* $(,)?) => {$(
        impl Parameters for $ty {
            fn visit(&self, walk: &mut Walk<'_>) {
                walk.$report(self);
            }
            fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
                walk.$report(self)
            }
        }
    )*};
}

leaf!(Var => param, Tensor => buffer, Training => training, KeepFloat32 => keep_float32);

impl<T: Parameters> Parameters for Option<T> {
    fn visit(&self, walk: &mut Walk<'_>) {
        if let Some(value) = self {
            value.visit(walk);
        }
    }
    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
        match self {
            Some(value) => value.visit_mut(walk),
            None => Ok(()),
        }
    }
}

/// Sequences whose elements are named by their index, as in PyTorch's
/// `ModuleList`; each entry is `[generic parameters] type`.
macro_rules! indexed {
    ($([$($generics:tt)*] $ty:ty),* $(,)?) => {$(
        impl<$($generics)*> Parameters for $ty {
            fn visit(&self, walk: &mut Walk<'_>) {
                for (index, value) in self.iter().enumerate() {
                    walk.field(&index.to_string(), value);
                }
            }
            fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
                for (index, value) in self.iter_mut().enumerate() {
                    walk.field(&index.to_string(), value)?;
                }
                Ok(())
            }
        }
    )*};
}

indexed!([T: Parameters] Vec<T>, [T: Parameters, const N: usize] [T; N]);

impl<T: Parameters + ?Sized> Parameters for Box<T> {
    fn visit(&self, walk: &mut Walk<'_>) {
        (**self).visit(walk);
    }
    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
        (**self).visit_mut(walk)
    }
}

/// Fields of these types hold no parameters (sizes, rates, flags, names).
macro_rules! no_parameters {
    ($($ty:ty),* $(,)?) => {$(
        impl Parameters for $ty {
            fn visit(&self, _walk: &mut Walk<'_>) {}
            fn visit_mut(&mut self, _walk: &mut WalkMut<'_>) -> Result<()> {
                Ok(())
            }
        }
    )*};
}

no_parameters!(
    (),
    bool,
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64,
    String,
    &'static str,
    brasa_tensor::DType,
    brasa_tensor::Device,
    brasa_tensor::Conv2dParams,
    brasa_tensor::Conv1dParams,
    brasa_tensor::ConvTranspose1dParams,
    brasa_tensor::ConvTranspose2dParams,
);

impl<A: Parameters, B: Parameters> Parameters for (A, B) {
    fn visit(&self, walk: &mut Walk<'_>) {
        walk.field("0", &self.0);
        walk.field("1", &self.1);
    }
    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
        walk.field("0", &mut self.0)?;
        walk.field("1", &mut self.1)
    }
}
