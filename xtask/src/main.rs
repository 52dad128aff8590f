//! brasa's build automation, in plain Rust (run as `cargo xtask <command>`).
//!
//! - `bench [--filter PREFIX] [--quick]`: runs the benchmark programs, writes
//!   `target/bench/results.json` and prints the figures as a table.
//! - `alloc-trace`: regenerates `bench/data/gpt2_block_step.trace`.
//! - `kernels [--check]`: compiles `kernels/cuda/*.cu` to the committed
//!   `kernels/ptx/*.ptx` with the pinned CUDA 13.0 nvcc and checks them with
//!   ptxas; `--check` fails when the committed PTX is stale.

mod alloc_trace;
mod bench;
mod cuda_toolchain;
mod kernels;

use std::path::PathBuf;
use std::process::ExitCode;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

const USAGE: &str = "usage: cargo xtask <command>

commands:
  bench [--filter PREFIX] [--quick]   run the benchmark programs; write target/bench/results.json
  alloc-trace                         regenerate bench/data/gpt2_block_step.trace
  kernels [--check]                   compile kernels/cuda/*.cu to kernels/ptx/*.ptx (CUDA 13.0 nvcc; ptxas sm_80,
                                      sm_90); --check: fail when the committed PTX is stale, missing or orphaned";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        Some("kernels") => kernels::run(&args[1..]),
        Some("alloc-trace") => {
            let path = workspace_root().join(alloc_trace::TRACE_PATH);
            alloc_trace::generate().and_then(|text| {
                std::fs::write(&path, text)
                    .map(|_| println!("wrote {}", path.display()))
                    .map_err(|e| format!("writing {}: {e}", path.display()))
            })
        }
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
