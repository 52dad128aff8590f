//! CUDA kernels without a GPU: `cuda/emulate/` compiles a `cuda/*.cu` with
//! the host's C++ compiler against a small emulation of CUDA's built-ins
//! (`cuda_on_host.h`: blocks of OS threads, `__syncthreads` as a barrier,
//! `__shared__` arrays, the round-to-nearest intrinsics, f16/bf16) and runs
//! its kernels against references. This checks what a kernel computes (its
//! indexing, its loops over the grid, its barriers) on every CI run; the GPU
//! tests, which need a machine with one, check the same kernels on the
//! device, and those with warp-level intrinsics (attention) only there.
//!
//! The compiler is `$CXX`, else `c++`, and needs C++20 (`<barrier>`,
//! `std::bit_cast`) and `_Float16`: GCC 12 or clang 15 and later. Without
//! one the test says so in one line and passes, unless
//! `BRASA_REQUIRE_CXX` is set (CI sets it).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C++ compiler to use, or `None` (after one line on stderr) where
/// there is none and none is required.
fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    match Command::new(&cxx).arg("--version").output() {
        Ok(out) if out.status.success() => Some(cxx),
        result => {
            let why = match result {
                Ok(out) => format!("`{cxx} --version` failed: {}", String::from_utf8_lossy(&out.stderr)),
                Err(e) => format!("`{cxx}` could not be run: {e}"),
            };
            if std::env::var_os("BRASA_REQUIRE_CXX").is_some() {
                panic!("BRASA_REQUIRE_CXX is set but there is no C++ compiler: {why}");
            }
            eprintln!("skipped: no C++ compiler for the CUDA kernels' host emulation ({why}; set CXX)");
            None
        }
    }
}

/// Compiles `kernels/cuda/emulate/<test>.cpp` and runs it; panics with the
/// compiler's or the test's output when either fails.
fn build_and_run(test: &str) {
    let Some(cxx) = compiler() else { return };
    let emulate = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda").join("emulate");
    let exe: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda_on_host_{test}"));
    let build = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-pthread"])
        .arg("-I")
        .arg(emulate.join("include"))
        .arg("-o")
        .arg(&exe)
        .arg(emulate.join(format!("{test}.cpp")))
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{cxx} could not build cuda/emulate/{test}.cpp:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "cuda/emulate/{test}.cpp failed ({}):\n{stderr}{stdout}", run.status);
    print!("{stdout}");
}

/// `norm.cu`'s batch-norm kernels: the reductions of `[rows, C]` in pieces
/// and their merges, the block-per-channel reductions, the element-wise
/// passes and their channel index.
#[test]
fn batch_norm_kernels_compute_what_the_references_do() {
    build_and_run("norm_test");
}
