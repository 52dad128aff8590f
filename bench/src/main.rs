//! `brasa-bench`: the end-to-end figures that `cargo xtask bench` collects.
//!
//! Each figure prints as one JSON line on stdout:
//! `{"name": "alloc.cached_pair_ns", "value": 41.2, "unit": "ns", "better": "lower"}`.
//! Progress goes to stderr. Options: `--filter PREFIX[,PREFIX…]` runs the
//! figures whose names start with one of the prefixes; `--quick` shortens
//! every measurement.
//! `--workload-profile NAME:f32|bf16` prints the op table of three training
//! steps of one `workloads.*` model (`encoder:f32`, `transformer:f32`, …),
//! split by input shapes with `BRASA_PROFILE_SHAPES=1`;
//! with the `cuda` feature, `--cuda-profile` prints that of the GPU steps.

mod alloc_figures;
mod amp_figures;
mod attention_figures;
mod autograd_figures;
#[cfg(feature = "cuda")]
mod cuda_attention_figures;
#[cfg(feature = "cuda")]
mod cuda_figures;
mod ddp_figures;
mod fsdp_figures;
mod gpt_figures;
mod measure;
mod memory_figures;
#[cfg(feature = "cuda")]
mod nccl_figures;
mod nn_figures;
mod parallel_figures;
mod pipeline_figures;
mod profile_figures;
#[cfg(feature = "cuda")]
mod resnet_figures;
mod tensor_elementwise_figures;
mod tensor_matmul_figures;
mod workload_figures;

use measure::{BenchResult, Figure, Options};
use std::process::ExitCode;

/// A group of figures sharing a setup; `prefixes` covers every name it produces.
/// A group either reports its figures' failures itself (on stderr, leaving the
/// figure out) or returns the first one, which ends the run.
struct Group {
    prefixes: &'static [&'static str],
    run: fn(&Options) -> BenchResult<Vec<Figure>>,
}

const GROUPS: &[Group] = &[
    Group { prefixes: &["alloc."], run: alloc_figures::run },
    Group { prefixes: &["autograd."], run: |options| Ok(autograd_figures::run(options)) },
    Group { prefixes: &["kernels.fma_peak", "tensor.matmul", "tensor.conv2d"], run: tensor_matmul_figures::run },
    Group { prefixes: &["tensor.add_", "tensor.small_op", "tensor.gelu"], run: tensor_elementwise_figures::run },
    Group { prefixes: &["nn."], run: |options| Ok(nn_figures::run(options)) },
    Group { prefixes: &["nn.sdpa"], run: |options| Ok(attention_figures::run(options)) },
    Group { prefixes: &["amp."], run: |options| Ok(amp_figures::run(options)) },
    Group { prefixes: &["profile."], run: |options| Ok(profile_figures::run(options)) },
    Group { prefixes: &["parallel."], run: |options| Ok(parallel_figures::run(options)) },
    #[cfg(feature = "cuda")]
    Group { prefixes: &["cuda."], run: |options| Ok(cuda_figures::run(options)) },
    #[cfg(feature = "cuda")]
    Group { prefixes: &["cuda.sdpa"], run: |options| Ok(cuda_attention_figures::run(options)) },
    Group { prefixes: &["workloads.", "nn.transformer"], run: |options| Ok(workload_figures::run(options)) },
    Group { prefixes: &["nn.gpt"], run: |options| Ok(gpt_figures::run(options)) },
    Group { prefixes: &["memory."], run: memory_figures::run },
    #[cfg(feature = "cuda")]
    Group { prefixes: &["cuda.gpt"], run: |options| Ok(gpt_figures::run_cuda(options)) },
    #[cfg(feature = "cuda")]
    Group { prefixes: &["cuda.resnet", "cuda.conv"], run: |options| Ok(resnet_figures::run(options)) },
    #[cfg(feature = "cuda")]
    Group { prefixes: &["nccl."], run: |options| Ok(nccl_figures::run(options)) },
];

fn main() -> ExitCode {
    let mut options = Options { quick: false, filters: Vec::new() };
    let mut args = std::env::args().skip(1);
    let mut nn_worker = None;
    let mut parallel_worker = None;
    let mut workload_worker = None;
    let mut workload_profile = false;
    let mut gpt_worker = None;
    let mut memory_worker = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            // Internal: one nn workload in its own process (see nn_figures).
            "--nn-worker" => nn_worker = args.next(),
            // Internal: one parallel figure in its own process (see parallel_figures).
            "--parallel-worker" => parallel_worker = args.next(),
            // Internal: one training workload in its own process (see workload_figures).
            "--workload-worker" => workload_worker = args.next(),
            // Internal: the GPT training steps in their own process (see gpt_figures).
            "--gpt-worker" => gpt_worker = args.next(),
            // Internal: one memory-plan figure in its own process (see memory_figures).
            "--memory-worker" => memory_worker = args.next(),
            // The op table of one workload's steps (see workload_figures).
            "--workload-profile" => {
                workload_worker = args.next();
                workload_profile = true;
            }
            // The op table of GPU training steps (see cuda_figures).
            #[cfg(feature = "cuda")]
            "--cuda-profile" => {
                if let Err(e) = cuda_figures::profile_steps() {
                    eprintln!("brasa-bench --cuda-profile: {e}");
                    return ExitCode::FAILURE;
                }
                return ExitCode::SUCCESS;
            }
            "--filter" => options.filters = Options::parse_filters(&args.next().unwrap_or_default()),
            other => {
                eprintln!("brasa-bench: unknown option `{other}` (expected --filter PREFIX[,PREFIX…], --quick)");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(name) = nn_worker {
        if let Err(e) = nn_figures::worker(&name, options.quick) {
            eprintln!("brasa-bench --nn-worker {name}: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Some(name) = memory_worker {
        if let Err(e) = memory_figures::worker(&name) {
            eprintln!("brasa-bench --memory-worker {name}: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Some(config) = gpt_worker {
        if let Err(e) = gpt_figures::worker(options.quick, config == "gpu") {
            eprintln!("brasa-bench --gpt-worker: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Some(spec) = workload_worker {
        if let Err(e) = workload_figures::worker(&spec, options.quick, workload_profile) {
            eprintln!("brasa-bench --workload-worker {spec}: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Some(name) = parallel_worker {
        if let Err(e) = parallel_figures::worker(&name, options.quick) {
            eprintln!("brasa-bench --parallel-worker {name}: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    for group in GROUPS {
        if !group.prefixes.iter().any(|prefix| options.wants(prefix)) {
            continue;
        }
        let figures = match (group.run)(&options) {
            Ok(figures) => figures,
            Err(e) => {
                eprintln!("brasa-bench: {}: {e}", group.prefixes.join(", "));
                return ExitCode::FAILURE;
            }
        };
        for figure in figures {
            if options.prints(figure.name) {
                println!("{}", figure.to_json());
            }
        }
    }
    ExitCode::SUCCESS
}
