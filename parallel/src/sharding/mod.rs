//! Sharding: every rank keeps 1/N of the training state, laid out the one
//! way of [`layout::FlatLayout`] — parameters end to end in flat buffers
//! padded to a multiple of the world size, rank r owning the r-th equal
//! slice — and updates its slice with any optimizer built over the
//! slices (a [`brasa_nn::optim::Optimizer`] over 1/N-sized parameters:
//! sharding needs no optimizer of its own).
//!
//! | stage | what is sharded | per rank (f32 Adam: K = 2) | where |
//! |---|---|---|---|
//! | ZeRO-1 | optimizer state | P + G + K·P/N | [`zero`] over DDP's buckets |
//! | ZeRO-2 | + gradients | P + (G + K·P)/N | [`zero`], DDP reduce-scatters |
//! | ZeRO-3 (FSDP) | + parameters | (P + G + K·P)/N + 2 units gathered | [`fsdp`] |
//!
//! [`DataParallel`](crate::DataParallel) shards its replicas' optimizer
//! state with the same layout (one layout per device group).

pub(crate) mod clip;
pub(crate) mod flat_params;
pub(crate) mod fsdp;
pub(crate) mod layout;
mod zero;

pub use zero::ZeroOptimizer;
