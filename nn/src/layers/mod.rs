//! The layers: each in its own file, all re-exported at the crate root.

mod linear;

pub use linear::Linear;
