//! Finding (or installing) the CUDA 13.0 compiler that `cargo xtask kernels`
//! builds PTX with.
//!
//! Lookup order: `$NVCC`, then `nvcc` on `PATH`, then the pinned PyPI wheels,
//! installed on first use into `$BRASA_CUDA_TOOLCHAIN_DIR` (default
//! `~/.cache/brasa/cuda-13.0.2`) and reused after that. Whatever is found must
//! report release 13.0: the GPU machines' driver (580, CUDA 13.0) JITs PTX ISA
//! up to 9.0, and a newer nvcc writes newer PTX that it would refuse at load
//! time. `ptxas` always comes from the same folder as `nvcc`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The release every nvcc must report (`release 13.0` in `nvcc --version`).
pub const REQUIRED_RELEASE: (u32, u32) = (13, 0);

/// The exact nvcc build of the pinned wheels; committed PTX comes from it.
pub const PINNED_NVCC_VERSION: &str = "13.0.88";

/// The wheel set of `cuda-toolkit[nvcc,nvvm,crt,cudart,cccl]==13.0.2`, pinned
/// one by one and installed with `--no-deps`: unpinned, `nvidia-cuda-nvcc`
/// pulls nvvm/crt/runtime 13.5, whose cicc writes PTX 9.5 that ptxas 13.0
/// (and the driver) reject.
const PINNED_WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// Where the wheels put the toolkit, relative to the install folder.
const WHEEL_TOOLKIT: &str = "nvidia/cu13";

/// A CUDA compiler that passed the version check.
#[derive(Debug)]
pub struct CudaToolchain {
    pub nvcc: PathBuf,
    pub ptxas: PathBuf,
    /// The full version from `nvcc --version`, e.g. `13.0.88`.
    pub version: String,
    /// Where it came from, for the log line: `$NVCC`, `PATH`, or the cache.
    pub origin: String,
}

/// Finds nvcc and ptxas (installing the pinned wheels when neither `$NVCC`
/// nor `PATH` has an nvcc) and checks that both are release 13.0.
pub fn locate() -> Result<CudaToolchain, String> {
    let (nvcc, origin) = match std::env::var_os("NVCC").filter(|value| !value.is_empty()) {
        Some(value) => {
            let named = PathBuf::from(&value);
            let nvcc = if named.components().count() > 1 { Some(named) } else { find_on_path(&named) };
            let nvcc = nvcc.filter(|path| is_executable(path)).ok_or_else(|| {
                format!(
                    "NVCC={} is not an executable file (unset NVCC to use the pinned CUDA 13.0 wheels)",
                    value.to_string_lossy()
                )
            })?;
            (nvcc, "$NVCC".to_string())
        }
        None => match find_on_path(Path::new("nvcc")) {
            Some(nvcc) => (nvcc, "PATH".to_string()),
            None => {
                let dir = toolchain_dir()?;
                let toolkit = dir.join(WHEEL_TOOLKIT);
                if !is_executable(&toolkit.join("bin/nvcc")) {
                    install_wheels(&dir)?;
                }
                (toolkit.join("bin/nvcc"), format!("pinned wheels in {}", dir.display()))
            }
        },
    };
    let version = checked_version(&nvcc, &origin)?;
    // A symlinked nvcc (/usr/bin/nvcc -> /usr/local/cuda/bin/nvcc) keeps its
    // ptxas next to the real file.
    let real_nvcc = std::fs::canonicalize(&nvcc).unwrap_or_else(|_| nvcc.clone());
    let ptxas = [&real_nvcc, &nvcc]
        .iter()
        .filter_map(|path| path.parent().map(|dir| dir.join("ptxas")))
        .find(|path| is_executable(path))
        .ok_or_else(|| {
            format!("no ptxas next to {} (from {origin}): ptxas must come from nvcc's toolkit", nvcc.display())
        })?;
    let ptxas_version = checked_version(&ptxas, &origin)?;
    if ptxas_version != version {
        return Err(format!(
            "{} is {ptxas_version} but {} is {version}: nvcc and ptxas must come from one toolkit",
            ptxas.display(),
            nvcc.display()
        ));
    }
    Ok(CudaToolchain { nvcc, ptxas, version, origin })
}

/// Runs `tool --version` and returns its version if it is release 13.0;
/// otherwise an error that says why another release is refused.
fn checked_version(tool: &Path, origin: &str) -> Result<String, String> {
    let output = Command::new(tool)
        .arg("--version")
        .output()
        .map_err(|e| format!("running `{} --version` (from {origin}): {e}", tool.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "`{} --version` (from {origin}) failed with {}:\n{}{}",
            tool.display(),
            output.status,
            text,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let Some(version) = parse_version(&text) else {
        return Err(format!(
            "`{} --version` (from {origin}) printed no `release X.Y, VX.Y.Z`:\n{text}",
            tool.display()
        ));
    };
    if parse_release(&version) != Some(REQUIRED_RELEASE) {
        let (major, minor) = REQUIRED_RELEASE;
        return Err(format!(
            "{} (from {origin}) is CUDA {version}, not {major}.{minor}: the GPU machines' driver (580, CUDA 13.0) \
             JITs PTX ISA up to 9.0 only, and other releases write another PTX ISA (13.1+: newer than the driver \
             can load). Set NVCC to a CUDA {major}.{minor} nvcc, or unset NVCC and take this one off PATH so that \
             the xtask installs the pinned {PINNED_NVCC_VERSION} wheels",
            tool.display()
        ));
    }
    Ok(version)
}

/// The version in `nvcc --version` / `ptxas --version` output:
/// `Cuda compilation tools, release 13.0, V13.0.88` gives `13.0.88`.
pub fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("release "))?;
    let after_v = line.rsplit_once(", V").map(|(_, v)| v.trim());
    match after_v {
        Some(version) if parse_release(version).is_some() => Some(version.to_string()),
        // Some builds print only `release 13.0`.
        _ => {
            let release = line.split("release ").nth(1)?.split(',').next()?.trim();
            parse_release(release).map(|_| release.to_string())
        }
    }
}

/// Major and minor of a version such as `13.0.88` or `13.0`.
pub fn parse_release(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// `$BRASA_CUDA_TOOLCHAIN_DIR`, else `~/.cache/brasa/cuda-13.0.2`.
fn toolchain_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("BRASA_CUDA_TOOLCHAIN_DIR").filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .filter(|value| !value.is_empty())
        .ok_or("neither BRASA_CUDA_TOOLCHAIN_DIR nor HOME is set: nowhere to install the CUDA 13.0 wheels")?;
    Ok(PathBuf::from(home).join(".cache/brasa/cuda-13.0.2"))
}

/// Installs the pinned wheels into `dir` in one pip command (`--target
/// --upgrade` one by one would replace the whole `nvidia/` folder each time).
/// pip writes into a sibling folder that is renamed into place at the end, so
/// an interrupted install never looks complete.
fn install_wheels(dir: &Path) -> Result<(), String> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let mut partial = dir.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    remove_earlier_install(dir)?;
    remove_dir_if_present(&partial)?;
    eprintln!("xtask: installing the CUDA 13.0 compiler (pinned PyPI wheels, ~100 MB download) into {}", dir.display());
    let output = Command::new("python3")
        .args(["-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir", "--target"])
        .arg(&partial)
        .args(PINNED_WHEELS)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .map_err(|e| {
            format!("running `python3 -m pip` to install the CUDA 13.0 wheels: {e} (is python3 with pip installed?)")
        })?;
    if !output.status.success() {
        // Best effort: the partial folder is useless; the error below is what matters.
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!(
            "`python3 -m pip install --no-deps --target {} {}` failed with {}:\n{}{}",
            partial.display(),
            PINNED_WHEELS.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    if !is_executable(&partial.join(WHEEL_TOOLKIT).join("bin/nvcc")) {
        return Err(format!(
            "pip installed the wheels into {} but {WHEEL_TOOLKIT}/bin/nvcc is not there",
            partial.display()
        ));
    }
    match std::fs::rename(&partial, dir) {
        Ok(()) => Ok(()),
        // Another `cargo xtask kernels` finished the same install first.
        Err(_) if is_executable(&dir.join(WHEEL_TOOLKIT).join("bin/nvcc")) => remove_dir_if_present(&partial),
        Err(e) => Err(format!("renaming {} to {}: {e}", partial.display(), dir.display())),
    }
}

/// Removes an incomplete install (one without nvcc), but never a folder that
/// holds something else: `BRASA_CUDA_TOOLCHAIN_DIR` may name any folder.
fn remove_earlier_install(dir: &Path) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", dir.display())),
    };
    let names: Vec<_> = entries.filter_map(|entry| entry.ok().map(|entry| entry.file_name())).collect();
    if !names.is_empty() && !names.iter().any(|name| name == "nvidia") {
        return Err(format!(
            "{} exists and is not a CUDA wheel install: remove it, or set BRASA_CUDA_TOOLCHAIN_DIR to another folder",
            dir.display()
        ));
    }
    remove_dir_if_present(dir)
}

fn remove_dir_if_present(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("removing {}: {e}", dir.display())),
        _ => Ok(()),
    }
}

fn find_on_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_of_nvcc_13_0() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n\
                    Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n\
                    Build cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_version(text).as_deref(), Some("13.0.88"));
        assert_eq!(parse_release("13.0.88"), Some((13, 0)));
    }

    #[test]
    fn version_of_other_releases_and_garbage() {
        let text = "ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 12.9, V12.9.86\n";
        assert_eq!(parse_version(text).as_deref(), Some("12.9.86"));
        assert_eq!(parse_release("12.9.86"), Some((12, 9)));
        assert_eq!(parse_version("Cuda compilation tools, release 13.1\n").as_deref(), Some("13.1"));
        assert_eq!(parse_version("gcc (Debian 12.2.0-14) 12.2.0\n"), None);
        assert_eq!(parse_release("13"), None);
        assert_eq!(parse_release("x.0"), None);
    }

    #[test]
    fn another_release_is_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("brasa-xtask-fake-nvcc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("nvcc");
        std::fs::write(&fake, "#!/bin/sh\necho 'Cuda compilation tools, release 13.1, V13.1.80'\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let error = checked_version(&fake, "$NVCC").unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(error.contains("is CUDA 13.1.80, not 13.0"), "{error}");
        assert!(error.contains("PTX ISA up to 9.0"), "{error}");
    }
}
