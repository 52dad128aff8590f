//! `cargo xtask kernels [--check]`: compiles every `kernels/cuda/*.cu` to
//! `kernels/ptx/<name>.ptx` with the pinned CUDA 13.0 nvcc, and checks each PTX
//! with ptxas for sm_80 and sm_90.
//!
//! The PTX is committed, so users of `brasa-kernels` never need a CUDA
//! compiler. Headers (`*.cuh`) in `kernels/cuda/` are includes, not compiled on
//! their own. Every file is rebuilt each time (about a second each), so a
//! changed header can never leave a stale PTX behind.
//!
//! - Without `--check`: writes the PTX files that changed and removes those
//!   whose `.cu` is gone.
//! - With `--check` (CI): builds into a temporary folder and fails, naming each
//!   file, when a committed PTX is stale, missing or has no `.cu`.
//!
//! The output is byte-identical across runs and checkout paths: nvcc runs in
//! the workspace root on relative paths, without `-lineinfo` (which writes
//! absolute `.file` paths), and with `NVCC_PREPEND_FLAGS`/`NVCC_APPEND_FLAGS`
//! removed from its environment.

use crate::cuda_toolchain::{self, CudaToolchain};
use crate::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Sources, relative to the workspace root (nvcc sees relative paths only).
const SOURCE_DIR: &str = "kernels/cuda";
/// Committed PTX, relative to the workspace root.
const PTX_DIR: &str = "kernels/ptx";

/// The virtual architecture PTX is written for: sm_80 (A100) and newer JIT it.
const NVCC_ARCH: &str = "compute_80";
/// The real architectures ptxas assembles each PTX for, as an offline check.
const PTXAS_ARCHS: [&str; 2] = ["sm_80", "sm_90"];
/// The PTX ISA that CUDA 13.0 writes and the GPU machines' driver (580) JITs.
const PTX_ISA: &str = "9.0";

pub fn run(args: &[String]) -> Result<(), String> {
    let mut check = false;
    for arg in args {
        match arg.as_str() {
            "--check" => check = true,
            other => return Err(format!("unknown kernels option `{other}` (expected --check)")),
        }
    }
    let root = workspace_root();
    let sources = list_stems(&root.join(SOURCE_DIR), "cu")?;
    let scratch = ScratchDir::new()?;
    let mut nvcc_version = None;
    if sources.is_empty() {
        println!("no {SOURCE_DIR}/*.cu: nothing to compile");
    } else {
        let toolchain = cuda_toolchain::locate()?;
        println!(
            "compiling {} file(s) with nvcc {} ({}, {})",
            sources.len(),
            toolchain.version,
            toolchain.nvcc.display(),
            toolchain.origin
        );
        if !check && toolchain.version != cuda_toolchain::PINNED_NVCC_VERSION {
            eprintln!(
                "xtask: note: nvcc {} is not the pinned {}; CI's `--check` builds with the pinned wheels and may \
                 see other bytes",
                toolchain.version,
                cuda_toolchain::PINNED_NVCC_VERSION
            );
        }
        compile_all(&toolchain, &root, &sources, scratch.path())?;
        nvcc_version = Some(toolchain.version);
    }

    let committed = root.join(PTX_DIR);
    let differences = compare_ptx_dirs(scratch.path(), &committed)?;
    if check {
        if differences.is_empty() {
            println!("{PTX_DIR}: {} file(s) up to date", sources.len());
            return Ok(());
        }
        let mut lines: Vec<String> = differences.iter().map(|d| format!("  {}", d.describe())).collect();
        if let Some(version) = nvcc_version.filter(|version| version != cuda_toolchain::PINNED_NVCC_VERSION) {
            lines.push(format!(
                "note: this build used nvcc {version}; the committed PTX comes from the pinned {} wheels (unset \
                 NVCC and take other nvcc off PATH to use them), and another 13.0 build may write other bytes",
                cuda_toolchain::PINNED_NVCC_VERSION
            ));
        }
        return Err(format!(
            "{PTX_DIR} does not match {SOURCE_DIR} (run `cargo xtask kernels` and commit {PTX_DIR}/):\n{}",
            lines.join("\n")
        ));
    }
    apply(&differences, scratch.path(), &committed)?;
    let removed = differences.iter().filter(|d| matches!(d, Difference::Orphan(_))).count();
    println!(
        "{PTX_DIR}: {} file(s) up to date ({} written, {removed} removed)",
        sources.len(),
        differences.len() - removed
    );
    Ok(())
}

/// Compiles and verifies every source into `out_dir`, a few at a time;
/// reports every failing file, not only the first.
fn compile_all(toolchain: &CudaToolchain, root: &Path, stems: &[String], out_dir: &Path) -> Result<(), String> {
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(stems.len());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(stem) = stems.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(error) = compile_one(toolchain, root, stem, out_dir) {
                        errors.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push((stem.clone(), error));
                    }
                }
            });
        }
    });
    let mut errors = errors.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort();
    let count = errors.len();
    let messages: Vec<String> = errors.into_iter().map(|(_, error)| error).collect();
    Err(format!("{}\n{count} of {} kernel file(s) failed", messages.join("\n\n"), stems.len()))
}

/// nvcc → PTX ISA check → ptxas for each architecture, for one source.
fn compile_one(toolchain: &CudaToolchain, root: &Path, stem: &str, out_dir: &Path) -> Result<(), String> {
    let source = format!("{SOURCE_DIR}/{stem}.cu");
    let ptx = out_dir.join(format!("{stem}.ptx"));
    let output = Command::new(&toolchain.nvcc)
        .current_dir(root)
        .env_remove("NVCC_PREPEND_FLAGS")
        .env_remove("NVCC_APPEND_FLAGS")
        .args(["-ptx", &format!("-arch={NVCC_ARCH}"), "--std=c++17", "-Werror", "all-warnings"])
        .args(["-I", SOURCE_DIR, "-o"])
        .arg(&ptx)
        .arg(&source)
        .output()
        .map_err(|e| format!("{source}: running {}: {e}", toolchain.nvcc.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // nvcc runs the host compiler even for -ptx; its own message
        // ("Failed to preprocess host compiler properties") does not say so.
        let hint = if stderr.contains("host compiler") || stderr.contains("gcc") {
            "; nvcc runs the host C++ compiler even for -ptx: gcc 12 works, NVCC_CCBIN picks another"
        } else {
            ""
        };
        return Err(format!(
            "{source}: nvcc failed ({}{hint}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            stderr.trim_end()
        ));
    }
    let text =
        std::fs::read_to_string(&ptx).map_err(|e| format!("{source}: reading nvcc's output {}: {e}", ptx.display()))?;
    match ptx_isa_version(&text) {
        Some(PTX_ISA) => {}
        found => {
            return Err(format!(
                "{source}: the PTX says `.version {}`, expected {PTX_ISA} (the GPU machines' driver 580 / CUDA 13.0 \
                 JITs PTX ISA up to {PTX_ISA})",
                found.unwrap_or("<none>")
            ))
        }
    }
    for arch in PTXAS_ARCHS {
        let output = Command::new(&toolchain.ptxas)
            .arg(format!("-arch={arch}"))
            .args(["-o", "/dev/null"])
            .arg(&ptx)
            .output()
            .map_err(|e| format!("{source}: running {}: {e}", toolchain.ptxas.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{source}: ptxas -arch={arch} rejected its PTX ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr).trim_end()
            ));
        }
    }
    Ok(())
}

/// The PTX ISA in a `.version X.Y` line (the first directive of every PTX).
fn ptx_isa_version(ptx: &str) -> Option<&str> {
    ptx.lines().find_map(|line| line.trim().strip_prefix(".version").map(str::trim))
}

/// How the committed PTX differs from what the sources compile to.
#[derive(Debug, PartialEq, Eq)]
enum Difference {
    /// The committed file differs from the build.
    Stale(String),
    /// A source compiled to a file that is not committed.
    Missing(String),
    /// A committed file whose source is gone.
    Orphan(String),
}

impl Difference {
    fn describe(&self) -> String {
        match self {
            Self::Stale(stem) => format!("{PTX_DIR}/{stem}.ptx: stale (not what {SOURCE_DIR}/{stem}.cu compiles to)"),
            Self::Missing(stem) => format!("{PTX_DIR}/{stem}.ptx: missing (for {SOURCE_DIR}/{stem}.cu)"),
            Self::Orphan(stem) => format!("{PTX_DIR}/{stem}.ptx: has no {SOURCE_DIR}/{stem}.cu"),
        }
    }
}

/// Compares the `*.ptx` files of a fresh build with the committed ones, by
/// content; sorted by file name.
fn compare_ptx_dirs(built: &Path, committed: &Path) -> Result<Vec<Difference>, String> {
    let built_stems = list_stems(built, "ptx")?;
    let committed_stems = list_stems(committed, "ptx")?;
    let mut differences = Vec::new();
    for stem in &built_stems {
        let name = format!("{stem}.ptx");
        if !committed_stems.contains(stem) {
            differences.push(Difference::Missing(stem.clone()));
        } else if read(&built.join(&name))? != read(&committed.join(&name))? {
            differences.push(Difference::Stale(stem.clone()));
        }
    }
    differences
        .extend(committed_stems.iter().filter(|stem| !built_stems.contains(stem)).cloned().map(Difference::Orphan));
    differences.sort_by(|a, b| stem_of(a).cmp(stem_of(b)));
    Ok(differences)
}

fn stem_of(difference: &Difference) -> &str {
    match difference {
        Difference::Stale(stem) | Difference::Missing(stem) | Difference::Orphan(stem) => stem,
    }
}

/// Makes `committed` equal to `built`: writes only the files that changed (an
/// unchanged file keeps its mtime, so `include_str!` users do not rebuild).
fn apply(differences: &[Difference], built: &Path, committed: &Path) -> Result<(), String> {
    if differences.iter().any(|d| !matches!(d, Difference::Orphan(_))) {
        std::fs::create_dir_all(committed).map_err(|e| format!("creating {}: {e}", committed.display()))?;
    }
    for difference in differences {
        match difference {
            Difference::Stale(stem) | Difference::Missing(stem) => {
                let name = format!("{stem}.ptx");
                let target = committed.join(&name);
                std::fs::copy(built.join(&name), &target).map_err(|e| format!("writing {}: {e}", target.display()))?;
                println!("wrote {PTX_DIR}/{name}");
            }
            Difference::Orphan(stem) => {
                let target = committed.join(format!("{stem}.ptx"));
                std::fs::remove_file(&target).map_err(|e| format!("removing {}: {e}", target.display()))?;
                println!("removed {PTX_DIR}/{stem}.ptx (its {SOURCE_DIR}/{stem}.cu is gone)");
            }
        }
    }
    Ok(())
}

/// The stems of the files `*.{extension}` directly in `dir`, sorted; none
/// when `dir` does not exist.
fn list_stems(dir: &Path, extension: &str) -> Result<Vec<String>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("listing {}: {e}", dir.display())),
    };
    let mut stems = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("listing {}: {e}", dir.display()))?.path();
        if path.is_file() && path.extension().is_some_and(|ext| ext == extension) {
            if let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) {
                stems.push(stem.to_string());
            }
        }
    }
    stems.sort();
    Ok(stems)
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// A folder under the system's temporary folder, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Result<Self, String> {
        let path = std::env::temp_dir().join(format!("brasa-xtask-kernels-{}", std::process::id()));
        // A leftover of an earlier process with the same id.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover temporary folder is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[(&str, &str)]) -> ScratchDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "brasa-xtask-kernels-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        for (name, text) in files {
            std::fs::write(path.join(name), text).unwrap();
        }
        ScratchDir(path)
    }

    #[test]
    fn ptx_isa_is_read_from_the_version_directive() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 9.0\n.target sm_80\n.address_size 64\n";
        assert_eq!(ptx_isa_version(ptx), Some("9.0"));
        assert_eq!(ptx_isa_version(".version 9.5\n"), Some("9.5"));
        assert_eq!(ptx_isa_version(".target sm_80\n"), None);
    }

    #[test]
    fn equal_folders_have_no_difference() {
        let built = folder(&[("a.ptx", "A"), ("b.ptx", "B")]);
        let committed = folder(&[("a.ptx", "A"), ("b.ptx", "B"), ("README.md", "not a kernel")]);
        assert_eq!(compare_ptx_dirs(built.path(), committed.path()).unwrap(), vec![]);
    }

    #[test]
    fn stale_missing_and_orphan_files_are_named() {
        let built = folder(&[("cast.ptx", "new"), ("elementwise.ptx", "same"), ("fill.ptx", "F")]);
        let committed = folder(&[("cast.ptx", "old"), ("elementwise.ptx", "same"), ("gone.ptx", "G")]);
        let differences = compare_ptx_dirs(built.path(), committed.path()).unwrap();
        assert_eq!(
            differences,
            vec![
                Difference::Stale("cast".into()),
                Difference::Missing("fill".into()),
                Difference::Orphan("gone".into())
            ]
        );
        assert_eq!(
            differences[0].describe(),
            "kernels/ptx/cast.ptx: stale (not what kernels/cuda/cast.cu compiles to)"
        );
    }

    #[test]
    fn a_missing_committed_folder_means_every_file_is_missing() {
        let built = folder(&[("a.ptx", "A")]);
        let absent = built.path().join("no-such-folder");
        assert_eq!(compare_ptx_dirs(built.path(), &absent).unwrap(), vec![Difference::Missing("a".into())]);
    }

    #[test]
    fn apply_makes_the_committed_folder_equal_to_the_build() {
        let built = folder(&[("cast.ptx", "new"), ("fill.ptx", "F"), ("same.ptx", "S")]);
        let committed = folder(&[("cast.ptx", "old"), ("gone.ptx", "G"), ("same.ptx", "S")]);
        let differences = compare_ptx_dirs(built.path(), committed.path()).unwrap();
        apply(&differences, built.path(), committed.path()).unwrap();
        assert_eq!(compare_ptx_dirs(built.path(), committed.path()).unwrap(), vec![]);
        assert_eq!(list_stems(committed.path(), "ptx").unwrap(), ["cast", "fill", "same"]);
    }

    #[test]
    fn headers_are_not_sources() {
        let dir = folder(&[("common.cuh", ""), ("elementwise.cu", ""), ("cast.cu", ""), ("notes.txt", "")]);
        assert_eq!(list_stems(dir.path(), "cu").unwrap(), ["cast", "elementwise"]);
    }
}
