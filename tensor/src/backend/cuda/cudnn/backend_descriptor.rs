//! cuDNN's graph-API descriptors (`cudnnBackendDescriptor_t`) as owned
//! values, destroyed when dropped, with typed setters and getters for the
//! attributes brasa uses.
//!
//! The graph API names everything with C enums: what a descriptor is
//! ([`kind`]), which attribute ([`Attr`], with its name for error
//! messages) and how its values are typed (the `TYPE_*` constants). They are
//! kept here as the numbers of `cudnn_graph.h` (cuDNN 9, unchanged since
//! cuDNN 8.0 for these), rather than cudarc's enums, which change shape
//! with the cuDNN version the bindings were generated for.

use super::api::{Api, BackendDescriptor, GraphFns};
use super::descriptors::check;
use super::Failure;
use cudarc::cudnn::sys::{cudnnDataType_t, cudnnHandle_t};
use std::ffi::c_void;

/// `cudnnBackendDescriptorType_t`: what a descriptor describes.
pub(super) mod kind {
    pub const CONVOLUTION: u32 = 1;
    pub const ENGINE: u32 = 2;
    pub const ENGINECFG: u32 = 3;
    pub const ENGINEHEUR: u32 = 4;
    pub const EXECUTION_PLAN: u32 = 5;
    pub const OPERATION_CONVOLUTION_FORWARD: u32 = 10;
    pub const OPERATION_CONVOLUTION_BACKWARD_FILTER: u32 = 11;
    pub const OPERATION_CONVOLUTION_BACKWARD_DATA: u32 = 12;
    pub const OPERATIONGRAPH: u32 = 15;
    pub const VARIANT_PACK: u32 = 16;
    pub const TENSOR: u32 = 17;
}

/// `cudnnBackendAttributeType_t`: how an attribute's values are typed.
const TYPE_HANDLE: u32 = 0;
const TYPE_DATA_TYPE: u32 = 1;
const TYPE_INT64: u32 = 3;
const TYPE_FLOAT: u32 = 4;
const TYPE_DOUBLE: u32 = 5;
const TYPE_VOID_PTR: u32 = 6;
const TYPE_CONVOLUTION_MODE: u32 = 7;
const TYPE_HEUR_MODE: u32 = 8;
const TYPE_NUMERICAL_NOTE: u32 = 11;
const TYPE_BACKEND_DESCRIPTOR: u32 = 15;
const TYPE_BEHAVIOR_NOTE: u32 = 19;

/// A `cudnnBackendAttributeName_t` with its name (for error messages).
#[derive(Clone, Copy, Debug)]
pub(super) struct Attr(pub u32, pub &'static str);

macro_rules! attributes {
    ($($name:ident = $value:literal),* $(,)?) => {
        $(pub(super) const $name: Attr = Attr($value, concat!("CUDNN_ATTR_", stringify!($name)));)*
    };
}

attributes! {
    CONVOLUTION_COMP_TYPE = 100,
    CONVOLUTION_CONV_MODE = 101,
    CONVOLUTION_DILATIONS = 102,
    CONVOLUTION_FILTER_STRIDES = 103,
    CONVOLUTION_POST_PADDINGS = 104,
    CONVOLUTION_PRE_PADDINGS = 105,
    CONVOLUTION_SPATIAL_DIMS = 106,
    ENGINEHEUR_MODE = 200,
    ENGINEHEUR_OPERATION_GRAPH = 201,
    ENGINEHEUR_RESULTS = 202,
    ENGINECFG_ENGINE = 300,
    EXECUTION_PLAN_HANDLE = 400,
    EXECUTION_PLAN_ENGINE_CONFIG = 401,
    EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    OPERATION_CONVOLUTION_FORWARD_ALPHA = 700,
    OPERATION_CONVOLUTION_FORWARD_BETA = 701,
    OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702,
    OPERATION_CONVOLUTION_FORWARD_W = 703,
    OPERATION_CONVOLUTION_FORWARD_X = 704,
    OPERATION_CONVOLUTION_FORWARD_Y = 705,
    OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706,
    OPERATION_CONVOLUTION_BWD_DATA_BETA = 707,
    OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708,
    OPERATION_CONVOLUTION_BWD_DATA_W = 709,
    OPERATION_CONVOLUTION_BWD_DATA_DX = 710,
    OPERATION_CONVOLUTION_BWD_DATA_DY = 711,
    OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712,
    OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713,
    OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714,
    OPERATION_CONVOLUTION_BWD_FILTER_DW = 715,
    OPERATION_CONVOLUTION_BWD_FILTER_X = 716,
    OPERATION_CONVOLUTION_BWD_FILTER_DY = 717,
    OPERATIONGRAPH_HANDLE = 800,
    OPERATIONGRAPH_OPS = 801,
    TENSOR_BYTE_ALIGNMENT = 900,
    TENSOR_DATA_TYPE = 901,
    TENSOR_DIMENSIONS = 902,
    TENSOR_STRIDES = 903,
    TENSOR_UNIQUE_ID = 906,
    VARIANT_PACK_UNIQUE_IDS = 1000,
    VARIANT_PACK_DATA_POINTERS = 1001,
    VARIANT_PACK_WORKSPACE = 1003,
    ENGINE_NUMERICAL_NOTE = 1303,
    ENGINE_BEHAVIOR_NOTE = 1305,
}

/// `cudnnConvolutionMode_t`'s `CUDNN_CROSS_CORRELATION` (what deep learning
/// calls convolution: the filter is not flipped).
pub(super) const CROSS_CORRELATION: u32 = 1;
/// `cudnnBackendHeurMode_t`: the general heuristics, and the list of
/// engines that support every graph they take, slower but sure.
pub(super) const HEUR_MODE_A: u32 = 3;
pub(super) const HEUR_MODE_FALLBACK: u32 = 2;
/// `cudnnBackendNumericalNote_t` values the choice of engine looks at.
pub(super) const NOTE_TENSOR_CORE: u32 = 0;
pub(super) const NOTE_DOWN_CONVERT_INPUTS: u32 = 1;
pub(super) const NOTE_NONDETERMINISTIC: u32 = 4;
/// `cudnnBackendBehaviorNote_t`'s `CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION`:
/// the engine's kernel is compiled (NVRTC) when its plan is finalized.
pub(super) const NOTE_RUNTIME_COMPILATION: u32 = 0;
/// How many numerical notes cuDNN 9 defines (`CUDNN_NUMERICAL_NOTE_TYPE_COUNT`
/// is 10): room for every note an engine can carry, and some.
const MAX_NOTES: usize = 16;

/// One graph-API descriptor, destroyed when dropped.
pub(super) struct Descriptor {
    api: &'static Api,
    fns: &'static GraphFns,
    pub raw: BackendDescriptor,
}

// SAFETY: a finalized descriptor is only read by cuDNN (executing a plan,
// building a variant pack), which it allows from any thread; brasa sets
// attributes only on descriptors it has not shared yet.
unsafe impl Send for Descriptor {}
// SAFETY: as for `Send`: shared descriptors are only read.
unsafe impl Sync for Descriptor {}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: a live descriptor made by `new`, dropped once. A failure
        // here leaks it, which is all that could be done anyway.
        let _ = unsafe { (self.fns.destroy_descriptor)(self.raw) };
    }
}

impl Descriptor {
    /// A new, empty descriptor of `kind`.
    pub(super) fn new(api: &'static Api, fns: &'static GraphFns, kind: u32) -> Result<Descriptor, Failure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the new descriptor.
        check(api, unsafe { (fns.create_descriptor)(kind, &mut raw) }, "cudnnBackendCreateDescriptor")?;
        Ok(Descriptor { api, fns, raw })
    }

    fn set(&self, attr: Attr, ty: u32, count: usize, values: *const c_void) -> Result<(), Failure> {
        // SAFETY: `values` points at `count` elements of the C type `ty`
        // names (each caller passes a slice of that type); cuDNN copies them.
        let status = unsafe { (self.fns.set_attribute)(self.raw, attr.0, ty, count as i64, values) };
        check(self.api, status, &format!("cudnnBackendSetAttribute({})", attr.1))
    }

    /// `int64_t` values.
    pub(super) fn set_i64s(&self, attr: Attr, values: &[i64]) -> Result<(), Failure> {
        self.set(attr, TYPE_INT64, values.len(), values.as_ptr().cast())
    }

    /// A `cudnnDataType_t`.
    pub(super) fn set_data_type(&self, attr: Attr, value: cudnnDataType_t) -> Result<(), Failure> {
        self.set(attr, TYPE_DATA_TYPE, 1, (&value as *const cudnnDataType_t).cast())
    }

    /// A `cudnnConvolutionMode_t`.
    pub(super) fn set_conv_mode(&self, attr: Attr, value: u32) -> Result<(), Failure> {
        self.set(attr, TYPE_CONVOLUTION_MODE, 1, (&value as *const u32).cast())
    }

    /// A `cudnnBackendHeurMode_t`.
    pub(super) fn set_heur_mode(&self, attr: Attr, value: u32) -> Result<(), Failure> {
        self.set(attr, TYPE_HEUR_MODE, 1, (&value as *const u32).cast())
    }

    /// A scale factor: `float`, or `double` for f64 data.
    pub(super) fn set_scale(&self, attr: Attr, value: f64, double: bool) -> Result<(), Failure> {
        if double {
            self.set(attr, TYPE_DOUBLE, 1, (&value as *const f64).cast())
        } else {
            let value = value as f32;
            self.set(attr, TYPE_FLOAT, 1, (&value as *const f32).cast())
        }
    }

    /// Other descriptors (cuDNN keeps its own references to them).
    pub(super) fn set_descriptors(&self, attr: Attr, values: &[&Descriptor]) -> Result<(), Failure> {
        let raw: Vec<BackendDescriptor> = values.iter().map(|d| d.raw).collect();
        self.set(attr, TYPE_BACKEND_DESCRIPTOR, raw.len(), raw.as_ptr().cast())
    }

    /// A cuDNN handle.
    pub(super) fn set_handle(&self, attr: Attr, handle: cudnnHandle_t) -> Result<(), Failure> {
        self.set(attr, TYPE_HANDLE, 1, (&handle as *const cudnnHandle_t).cast())
    }

    /// Device addresses.
    pub(super) fn set_pointers(&self, attr: Attr, values: &[*mut c_void]) -> Result<(), Failure> {
        self.set(attr, TYPE_VOID_PTR, values.len(), values.as_ptr().cast())
    }

    /// Checks the attributes and freezes the descriptor.
    pub(super) fn finalize(&self, what: &str) -> Result<(), Failure> {
        // SAFETY: a live descriptor.
        check(self.api, unsafe { (self.fns.finalize)(self.raw) }, &format!("cudnnBackendFinalize({what})"))
    }

    fn get(&self, attr: Attr, ty: u32, capacity: usize, values: *mut c_void) -> Result<usize, Failure> {
        let mut count = 0i64;
        // SAFETY: `values` has room for `capacity` elements of the C type
        // `ty` names (or is null with a capacity of 0, which asks for the
        // count only); `count` is a valid place.
        let status = unsafe { (self.fns.get_attribute)(self.raw, attr.0, ty, capacity as i64, &mut count, values) };
        check(self.api, status, &format!("cudnnBackendGetAttribute({})", attr.1))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// One `int64_t`.
    pub(super) fn get_i64(&self, attr: Attr) -> Result<i64, Failure> {
        let mut value = 0i64;
        self.get(attr, TYPE_INT64, 1, (&mut value as *mut i64).cast())?;
        Ok(value)
    }

    /// How many descriptors the attribute holds.
    pub(super) fn descriptor_count(&self, attr: Attr) -> Result<usize, Failure> {
        self.get(attr, TYPE_BACKEND_DESCRIPTOR, 0, std::ptr::null_mut())
    }

    /// Fills `targets` (descriptors of the attribute's kind, made by the
    /// caller) with the attribute's descriptors; how many it filled.
    pub(super) fn get_descriptors(&self, attr: Attr, targets: &[Descriptor]) -> Result<usize, Failure> {
        let mut raw: Vec<BackendDescriptor> = targets.iter().map(|d| d.raw).collect();
        let filled = self.get(attr, TYPE_BACKEND_DESCRIPTOR, raw.len(), raw.as_mut_ptr().cast())?;
        Ok(filled.min(targets.len()))
    }

    /// The numerical notes of an engine (`cudnnBackendNumericalNote_t`s).
    pub(super) fn numerical_notes(&self) -> Result<Vec<u32>, Failure> {
        let mut notes = [0u32; MAX_NOTES];
        let count = self.get(ENGINE_NUMERICAL_NOTE, TYPE_NUMERICAL_NOTE, MAX_NOTES, notes.as_mut_ptr().cast())?;
        Ok(notes[..count.min(MAX_NOTES)].to_vec())
    }

    /// The behavior notes of an engine (`cudnnBackendBehaviorNote_t`s).
    pub(super) fn behavior_notes(&self) -> Result<Vec<u32>, Failure> {
        let mut notes = [0u32; MAX_NOTES];
        let count = self.get(ENGINE_BEHAVIOR_NOTE, TYPE_BEHAVIOR_NOTE, MAX_NOTES, notes.as_mut_ptr().cast())?;
        Ok(notes[..count.min(MAX_NOTES)].to_vec())
    }
}
