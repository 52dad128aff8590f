//! Data loading (PyTorch's `torch.utils.data`): datasets that hand out whole
//! batches, a [`DataLoader`] with seeded shuffling, worker threads, prefetch,
//! pinned memory and delivery on a device, real data sets — the bundled
//! UCI [`Digits`] and [`TinyShakespeare`], and MNIST-format [`idx`] files —
//! and character-level text for language models ([`CharVocab`],
//! [`TokenWindows`]).
//!
//! ```
//! use brasa_nn::data::{DataLoader, Digits};
//! use brasa_tensor::Device;
//!
//! let (train, _test) = Digits::load()?.train_test()?;   // 1437 / 360 samples
//! let loader = DataLoader::builder(train)
//!     .batch_size(64)
//!     .shuffle(true)
//!     .seed(7)            // epoch e uses the permutation of (7, e)
//!     .drop_last(true)
//!     .num_workers(2)     // batches read ahead on two threads, delivered in order
//!     .pin_memory(true)
//!     .device(Device::CPU)
//!     .build()?;
//! for epoch in 0..2 {
//!     for batch in loader.epoch(epoch) {
//!         let (x, y) = batch?;                          // an Err, never a hang
//!         assert_eq!((x.dims(), y.dims()), (&[64, 64][..], &[64][..]));
//!     }
//! }
//! # Ok::<(), brasa_nn::NnError>(())
//! ```
//!
//! - [`Dataset`]: `len` and `get_batch(indices)`; an in-memory
//!   [`TensorDataset`] gathers a batch with one `index_select` per tensor,
//!   no per-sample tensors. [`Subset`], [`random_split`] and
//!   [`TensorDataset::split`] make fixed, seeded splits; [`collate`] stacks
//!   per-sample tensors for datasets that read one sample at a time.
//! - [`DataLoader`]: the same batches in the same order for any number of
//!   workers; a failing or panicking batch is an `Err` in its place; dropping
//!   the epoch's iterator stops its threads.
//! - [`Digits`]: 1,797 8x8 digit images embedded in the crate (CC BY 4.0).
//! - [`TinyShakespeare`]: 1.1 M characters of Shakespeare embedded in the
//!   crate (char-rnn's corpus, MIT), with nanoGPT's 90/10 split into
//!   [`TokenWindows`] that hand out random next-token windows.
//! - [`Mnist`], [`read_idx_images`], [`read_idx_labels`], [`read_idx`]: IDX
//!   files from disk, gzipped or not, with every header field checked.

mod batch;
mod dataset;
mod digits;
mod epoch;
pub mod idx;
mod loader;
mod sample_order;
mod shakespeare;
mod stragglers;
mod text;
mod worker;

pub use batch::TensorBatch;
pub use dataset::{collate, random_split, Dataset, Subset, TensorDataset};
pub use digits::Digits;
pub use epoch::Epoch;
pub use idx::{read_idx, read_idx_images, read_idx_labels, Mnist};
pub use loader::{DataLoader, DataLoaderBuilder, MAX_READ_AHEAD};
pub use sample_order::{permutation, SampleOrder};
pub use shakespeare::TinyShakespeare;
pub use stragglers::SHUTDOWN_GRACE;
pub use text::{CharVocab, TokenWindows};
