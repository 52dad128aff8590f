//! # brasa-tensor
//!
//! Strided tensors for brasa, the Rust deep-learning training runtime. This
//! crate will hold devices, tensors and their ops on top of brasa's caching
//! allocator; what is here today are the pieces that know nothing about
//! devices or memory, on which the rest is built:
//!
//! - [`DType`] and [`WithDType`]: element types, casts between any two of
//!   them (Rust `as` semantics), and PyTorch's type promotion
//!   ([`DType::promote`]).
//! - [`Shape`] and [`Layout`]: shape, strides and offset; the views that only
//!   change them (transpose, permute, narrow, select, squeeze/unsqueeze,
//!   broadcasting, reshape-as-view); NumPy broadcasting of shapes; and
//!   iterators that walk storage offsets in row-major order, merged into
//!   contiguous runs for kernels.
//! - [`Generator`]: a Philox4x32-10 counter-based generator whose draws depend
//!   only on `(seed, element index)`, so they are identical however the work
//!   is split, and whose state can be saved and restored.
//!
//! Every fallible function returns a `Result` whose error says what was asked
//! and why it is impossible; nothing here panics on bad input.
//!
//! ```
//! use brasa_tensor::{broadcast_shapes, DType, Generator, Layout, Shape};
//!
//! // Views only change the layout; reshape says when a copy is needed.
//! let x = Layout::contiguous([2, 3, 4]);
//! let xt = x.transpose(1, -1)?;                  // [2, 4, 3], strides [12, 1, 4]
//! assert!(xt.reshape([2, 12])?.is_none());       // not expressible as a view
//! assert_eq!(x.narrow(2, 1, 2)?.offsets().take(3).collect::<Vec<_>>(), [1, 2, 5]);
//! let bias = Layout::contiguous([4]).broadcast_as([2, 3, 4])?;
//! assert_eq!(bias.strides(), &[0, 0, 1]);
//! assert_eq!(broadcast_shapes(&Shape::from([3, 1]), &Shape::from([4]))?, Shape::from([3, 4]));
//!
//! // Mixed-dtype ops compute in the promoted dtype.
//! assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
//!
//! // Restoring a generator's state repeats its draws (e.g. a dropout mask).
//! let mut rng = Generator::new(42);
//! let saved = rng.state();
//! let mut mask = [false; 8];
//! rng.fill_bernoulli(&mut mask, 0.9)?;
//! rng.set_state(saved);
//! let mut again = [false; 8];
//! rng.fill_bernoulli(&mut again, 0.9)?;
//! assert_eq!(mask, again);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Cargo features
//!
//! None yet; CUDA support will arrive as the optional `cuda` feature.

mod construct;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod dispatch;
mod display;
pub mod dtype;
mod error;
mod host_devices;
mod inplace;
pub mod layout;
pub mod memory;
mod ops;
pub mod rng;
pub mod shape;
mod storage;
mod tensor;

pub use construct::{manual_seed, rng_state, set_rng_state};
pub use device::{default_device, set_default_device, Device};
pub use dtype::{convert_slice, DType, DTypeError, WithDType};
pub use error::{Result, TensorError};
pub use host_devices::{
    host_device_count, parse_byte_size, set_host_device_count, set_host_memory_limit, HOST_DEVICES_ENV,
    HOST_MEMORY_LIMIT_ENV,
};
pub use layout::{ContiguousRuns, Layout, LayoutError, StridedOffsets};
pub use ops::Conv2dParams;
pub use rng::{philox4x32_10, Generator, GeneratorState, RngError};
pub use shape::{broadcast_shapes, resolve_dim, DimIndex, Shape};
pub use storage::Storage;
pub use tensor::Tensor;
