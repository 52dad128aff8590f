//! `brasa-bench`: the end-to-end figures that `cargo xtask bench` collects.
//!
//! Each figure prints as one JSON line on stdout:
//! `{"name": "alloc.cached_pair_ns", "value": 41.2, "unit": "ns", "better": "lower"}`.
//! Progress goes to stderr. Options: `--filter PREFIX` runs the figures whose
//! names start with PREFIX; `--quick` shortens every measurement.

mod alloc_figures;
mod amp_figures;
mod autograd_figures;
mod ddp_figures;
mod measure;
mod nn_figures;
mod parallel_figures;
mod profile_figures;
mod tensor_elementwise_figures;
mod tensor_matmul_figures;

use measure::{Figure, Options};

/// A group of figures sharing a setup; `prefixes` covers every name it produces.
struct Group {
    prefixes: &'static [&'static str],
    run: fn(&Options) -> Vec<Figure>,
}

const GROUPS: &[Group] = &[
    Group { prefixes: &["alloc."], run: alloc_figures::run },
    Group { prefixes: &["autograd."], run: autograd_figures::run },
    Group { prefixes: &["kernels.fma_peak", "tensor.matmul", "tensor.conv2d"], run: tensor_matmul_figures::run },
    Group { prefixes: &["tensor.add_", "tensor.small_op"], run: tensor_elementwise_figures::run },
    Group { prefixes: &["nn."], run: nn_figures::run },
    Group { prefixes: &["amp."], run: amp_figures::run },
    Group { prefixes: &["profile."], run: profile_figures::run },
    Group { prefixes: &["parallel."], run: parallel_figures::run },
];

fn main() {
    let mut options = Options { quick: false, filter: String::new() };
    let mut args = std::env::args().skip(1);
    let mut nn_worker = None;
    let mut parallel_worker = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            // Internal: one nn workload in its own process (see nn_figures).
            "--nn-worker" => nn_worker = args.next(),
            // Internal: one parallel figure in its own process (see parallel_figures).
            "--parallel-worker" => parallel_worker = args.next(),
            "--filter" => options.filter = args.next().unwrap_or_default(),
            other => {
                eprintln!("brasa-bench: unknown option `{other}` (expected --filter PREFIX, --quick)");
                std::process::exit(2);
            }
        }
    }
    if let Some(name) = nn_worker {
        if let Err(e) = nn_figures::worker(&name, options.quick) {
            eprintln!("brasa-bench --nn-worker {name}: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(name) = parallel_worker {
        if let Err(e) = parallel_figures::worker(&name, options.quick) {
            eprintln!("brasa-bench --parallel-worker {name}: {e}");
            std::process::exit(1);
        }
        return;
    }
    for group in GROUPS {
        let wanted = group
            .prefixes
            .iter()
            .any(|prefix| prefix.starts_with(&options.filter) || options.filter.starts_with(prefix));
        if !wanted {
            continue;
        }
        for figure in (group.run)(&options) {
            if figure.name.starts_with(&options.filter) {
                println!("{}", figure.to_json());
            }
        }
    }
}
