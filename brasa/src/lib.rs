//! # brasa
//!
//! A deep-learning training runtime in Rust that gets memory, precision and
//! timing right by design. This umbrella crate re-exports the workspace's
//! crates under one name and adds a [`prelude`]; it has no logic of its own.
//!
//! | module | crate | what it is |
//! |---|---|---|
//! | [`alloc`] | `brasa-alloc` | caching device-memory allocator: PyTorch's policy, stats, snapshots, OOM reports |
//! | [`kernels`] | `brasa-kernels` | CPU kernels: our own GEMM, elementwise, reductions, convolution |
//! | [`tensor`] | `brasa-tensor` | devices, dtypes, strided tensors, the `memory` API of every device |
//! | [`autograd`] | `brasa-autograd` | `Var`, backward that frees as it goes, hooks, custom ops, checkpointing |
//! | [`nn`] | `brasa-nn` | modules, layers, losses, optimizers, schedulers, data loading, state dicts |
//! | [`amp`] | `brasa-amp` | autocast, the dynamic loss scaler, half-precision models with f32 norms |
//! | [`profile`] | `brasa-profile` | op tables, Chrome traces, memory timelines |
//! | [`parallel`] | `brasa-parallel` | communicators (in-process, Open MPI, NCCL), DataParallel, DDP, ZeRO, FSDP |
//!
//! ```
//! use brasa::prelude::*;
//!
//! manual_seed(0);
//! let dev = Device::CPU;
//! let model = Sequential::new().push(Linear::new(4, 16, dev)?).push(Relu).push(Linear::new(16, 3, dev)?);
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
//! let x = Var::new(Tensor::randn_on([8, 4], DType::F32, dev)?);
//! let y = Tensor::from_vec_on(vec![0i64, 1, 2, 0, 1, 2, 0, 1], [8], dev)?;
//! let mut running_loss = 0.0;
//! for _ in 0..5 {
//!     let loss = cross_entropy(&model.forward(&x)?, &y)?;
//!     loss.backward()?;                 // saved tensors are freed as backward runs
//!     opt.step()?;
//!     opt.zero_grad()?;
//!     running_loss += loss.item()?;     // a number, not a graph
//! }
//! println!("{}", memory::summary(dev)?); // allocated / reserved / peak, like torch.cuda.memory_summary
//! # assert!(running_loss.is_finite());
//! # Ok::<(), brasa::nn::NnError>(())
//! ```
//!
//! ## Cargo features
//!
//! - `cuda`: CUDA devices through `cudarc` (loaded at run time: building
//!   needs no CUDA toolkit; without a driver, CUDA calls return an error).
//! - `mpi`: `brasa-parallel`'s Open MPI backend (needs an MPI with `mpicc`
//!   and libclang at build time), so `init_from_env` joins `mpirun`'s world.

pub use brasa_alloc as alloc;
pub use brasa_amp as amp;
pub use brasa_autograd as autograd;
pub use brasa_kernels as kernels;
pub use brasa_nn as nn;
pub use brasa_parallel as parallel;
pub use brasa_profile as profile;
pub use brasa_tensor as tensor;

/// The Rust samples of the README, the guide (`docs/guide/`, "brasa for
/// PyTorch users") and the crates' READMEs, compiled and run as doc tests
/// (`cargo test -p brasa --doc`), so that none can drift from the API. These
/// items exist only while doc tests are collected.
#[cfg(doctest)]
pub mod guide_samples {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../README.md")]
    pub struct UmbrellaReadme;
    #[doc = include_str!("../../docs/configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../../docs/guide/src/introduction.md")]
    pub struct Introduction;
    #[doc = include_str!("../../docs/guide/src/to-device.md")]
    pub struct ToDevice;
    #[doc = include_str!("../../docs/guide/src/memory.md")]
    pub struct Memory;
    #[doc = include_str!("../../docs/guide/src/freeing-graphs.md")]
    pub struct FreeingGraphs;
    #[doc = include_str!("../../docs/guide/src/no-grad.md")]
    pub struct NoGrad;
    #[doc = include_str!("../../docs/guide/src/out-of-memory.md")]
    pub struct OutOfMemory;
    #[doc = include_str!("../../docs/guide/src/memory-plans.md")]
    pub struct MemoryPlans;
    #[doc = include_str!("../../docs/guide/src/half-models.md")]
    pub struct HalfModels;
    #[doc = include_str!("../../docs/guide/src/autocast.md")]
    pub struct Autocast;
    #[doc = include_str!("../../docs/guide/src/channels-last.md")]
    pub struct ChannelsLast;
    #[doc = include_str!("../../docs/guide/src/grad-accumulation.md")]
    pub struct GradAccumulation;
    #[doc = include_str!("../../docs/guide/src/checkpointing.md")]
    pub struct Checkpointing;
    #[doc = include_str!("../../docs/guide/src/data-parallel.md")]
    pub struct DataParallel;
    #[doc = include_str!("../../docs/guide/src/fsdp.md")]
    pub struct Fsdp;
    #[doc = include_str!("../../docs/guide/src/model-parallel.md")]
    pub struct ModelParallel;
    #[doc = include_str!("../../docs/guide/src/cuda-events.md")]
    pub struct CudaEvents;
    #[doc = include_str!("../../docs/guide/src/pinned-memory.md")]
    pub struct PinnedMemory;
    #[doc = include_str!("../../docs/guide/src/data-loader.md")]
    pub struct DataLoader;
    #[doc = include_str!("../../docs/guide/src/profiler.md")]
    pub struct Profiler;

    /// The crates' READMEs.
    pub mod crate_readmes {
        #[doc = include_str!("../../alloc/README.md")]
        pub struct Alloc;
        #[doc = include_str!("../../kernels/README.md")]
        pub struct Kernels;
        #[doc = include_str!("../../tensor/README.md")]
        pub struct Tensor;
        #[doc = include_str!("../../autograd/README.md")]
        pub struct Autograd;
        #[doc = include_str!("../../nn/README.md")]
        pub struct Nn;
        #[doc = include_str!("../../amp/README.md")]
        pub struct Amp;
        #[doc = include_str!("../../parallel/README.md")]
        pub struct Parallel;
        #[doc = include_str!("../../profile/README.md")]
        pub struct Profile;
    }
}

/// The names a training program uses most, in one import.
///
/// Training on several devices is in it too (`brasa-parallel`): the
/// [`Communicator`](brasa_parallel::Communicator) and its launchers,
/// `DataParallel`, `DistributedDataParallel` (with ZeRO) and `Pipeline`.
/// Its engine trait, `brasa::parallel::CollectiveEngine`, is left out: it
/// is for those who write an engine, not a training program.
///
/// ```
/// use brasa::prelude::*;
///
/// // One rank per thread and logical host device, as under `torchrun`.
/// let sums = run_in_process(2, &LaunchOptions::default(), |comm: Communicator| {
///     let x = Tensor::full_on([2], (comm.rank() + 1) as f64, DType::F32, comm.device())?;
///     comm.all_reduce(&x, ReduceOp::Sum)?;
///     Ok(x.to_vec::<f32>()?)
/// })?;
/// assert_eq!(sums, [vec![3.0f32; 2], vec![3.0; 2]]);
///
/// // One process, two devices: PyTorch's `nn.DataParallel`, balanced.
/// ensure_host_devices(2)?;
/// let mut dp = DataParallel::with_config(
///     &[Device::cpu(0), Device::cpu(1)],
///     |device| Ok(Sequential::new().push(Linear::new(4, 3, device)?)),
///     |params| Sgd::new(params, SgdConfig { lr: 0.1, ..Default::default() }),
///     DataParallelConfig::default(),
/// )?;
/// let x = Tensor::randn([5, 4], DType::F32)?;
/// let y = Tensor::from_vec(vec![0i64, 1, 2, 0, 1], [5])?;
/// dp.step(&x, &y, cross_entropy)?;
/// assert_eq!(dp.forward(&x)?.dims(), [5, 3]); // gathered on device 0
///
/// // Across processes: DDP (optionally ZeRO), pipelines.
/// let _ddp = DdpConfig { zero: Some(ZeroStage::One), ..Default::default() };
/// let _pipe = PipelineConfig::new(Partition::Boundaries(vec![1]), 4).schedule(Schedule::GPipe);
/// let _comm: fn(&CommOptions) -> Result<Communicator, ParallelError> = init_from_env;
/// fn _wrappers(_: &DistributedDataParallel<Sequential>, _: &ZeroOptimizer<Sgd>, _: &Pipeline) {}
/// # Ok::<(), ParallelError>(())
/// ```
pub mod prelude {
    pub use brasa_amp::{autocast, autocast_disabled, to_bf16, to_half, GradScaler};
    pub use brasa_autograd::{
        checkpoint, checkpoint_sequential, enable_grad, gradcheck, no_grad, Function, FunctionCtx, Var,
    };
    pub use brasa_nn::data::{DataLoader, Dataset, TensorDataset};
    pub use brasa_nn::functional::cross_entropy_probs;
    pub use brasa_nn::functional::{
        binary_cross_entropy_with_logits, cross_entropy, cross_entropy_with, l1_loss, mse_loss, nll_loss,
        CrossEntropyOptions, Reduction,
    };
    pub use brasa_nn::optim::{
        clip_grad_norm_, Adam, AdamConfig, AdamW, AutoMicroBatch, GradAccumulator, LrScheduler, Optimizer, Sgd,
        SgdConfig,
    };
    pub use brasa_nn::{AdaptiveAvgPool2d, AdaptiveMaxPool2d};
    pub use brasa_nn::{
        AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Embedding, Flatten, Gelu, Identity,
        LayerNorm, Linear, MaxPool2d, Module, ModuleExt, NnError, Parameters, Relu, Sequential, Sigmoid, Silu,
        StateDict, Tanh,
    };
    pub use brasa_nn::{
        Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig, ConvTranspose2d, ConvTranspose2dConfig,
    };
    pub use brasa_parallel::{
        ensure_host_devices, init_from_env, run_in_process, CommOptions, Communicator, DataParallel,
        DataParallelConfig, DdpConfig, DistributedDataParallel, LaunchOptions, ParallelError, Partition, Pipeline,
        PipelineConfig, ReduceOp, Schedule, ZeroOptimizer, ZeroStage,
    };
    pub use brasa_tensor::ScatterReduce;
    pub use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};
}
