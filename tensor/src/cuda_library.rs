//! Finding and loading a vendor shared library at run time (feature `cuda`):
//! cuDNN and its kind are not needed to build brasa, and a machine may hold
//! them where no loader looks (a Python wheel's `nvidia/cudnn/lib`, a CUDA
//! toolkit directory). [`load_shared_library`] tries the places a person
//! would, in order, and when nothing loads it says every place it tried and
//! the environment variable that points brasa at the library.
//!
//! ```no_run
//! # fn main() -> brasa_tensor::Result<()> {
//! use brasa_tensor::cuda_library::load_shared_library;
//! let cudnn = load_shared_library("cuDNN", "BRASA_CUDNN_PATH", &["libcudnn.so.9", "libcudnn.so"], &["nvidia/cudnn/lib"])?;
//! println!("cuDNN from {}", cudnn.path.display());
//! # Ok(())
//! # }
//! ```

use crate::error::{Result, TensorError};
use std::path::{Path, PathBuf};

/// A shared library found and loaded, and where it was found.
#[derive(Debug)]
pub struct SharedLibrary {
    /// The loaded library (unloaded when dropped).
    pub library: libloading::Library,
    /// Where it was found: a full path, or the bare file name when the
    /// system loader found it (`LD_LIBRARY_PATH`, ldconfig's cache).
    pub path: PathBuf,
}

/// Loads the first of `file_names` (e.g. `["libcudnn.so.9", "libcudnn.so"]`)
/// found, looking in this order:
///
/// 1. `env_var`, when set: a library file, or a directory holding one of the
///    names. When set, it is the only place tried: a wrong setting is an
///    error rather than a silently different library.
/// 2. The directories `python_packages` (e.g. `["nvidia/cudnn/lib"]`) under
///    every Python `site-packages`/`dist-packages` directory found:
///    `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `/opt/*/.venv`, `/opt/*/venv`,
///    `/usr/lib/python3*`, `/usr/local/lib/python3*`, `~/.local/lib/python3*`.
///    A wheel's copy is the one PyTorch loads, so brasa and PyTorch run the
///    same library where a machine also has an older system copy (on an
///    H200 with a system cuDNN 9.14 and PyTorch's 9.19, the same
///    convolutions ran at 0.36× and 0.54× PyTorch's speed, 2026-11-28). It
///    is loaded by its full path, so a library that opens its own parts by
///    name (cuDNN 9's sub-libraries) finds that directory's through the
///    wheel's `$ORIGIN` run path.
/// 3. By name through the system loader (`LD_LIBRARY_PATH`, ldconfig's cache).
/// 4. `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64`.
///
/// On failure the error ([`TensorError::LibraryNotFound`]) names `what`,
/// every place searched with the loader's reason, and `env_var`.
pub fn load_shared_library(
    what: &str,
    env_var: &str,
    file_names: &[&str],
    python_packages: &[&str],
) -> Result<SharedLibrary> {
    let mut searched = Vec::new();
    let not_found = |searched: Vec<String>| TensorError::LibraryNotFound {
        library: what.to_string(),
        searched,
        env_var: env_var.to_string(),
    };
    if let Some(setting) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let setting = PathBuf::from(setting);
        let candidates: Vec<PathBuf> = if setting.is_dir() {
            file_names.iter().map(|name| setting.join(name)).collect()
        } else {
            vec![setting.clone()]
        };
        for path in candidates {
            if let Some(library) = try_load(&path, &mut searched, &format!("${env_var}")) {
                return Ok(SharedLibrary { library, path });
            }
        }
        return Err(not_found(searched));
    }
    let packages: Vec<PathBuf> = python_site_directories()
        .into_iter()
        .flat_map(|site| python_packages.iter().map(move |package| site.join(package)))
        .collect();
    if let Some(found) = first_in(&packages, file_names, &mut searched) {
        return Ok(found);
    }
    for name in file_names {
        // A bare name: the system loader's own search.
        if let Some(library) = try_load(Path::new(name), &mut searched, "system loader") {
            return Ok(SharedLibrary { library, path: PathBuf::from(name) });
        }
    }
    let mut cuda_directories: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            cuda_directories.push(PathBuf::from(home).join("lib64"));
        }
    }
    cuda_directories.push(PathBuf::from("/usr/local/cuda/lib64"));
    first_in(&cuda_directories, file_names, &mut searched).ok_or_else(|| not_found(searched))
}

/// The first of `file_names` that loads from the first of `directories`
/// holding one, recording each failure in `searched`.
fn first_in(directories: &[PathBuf], file_names: &[&str], searched: &mut Vec<String>) -> Option<SharedLibrary> {
    for directory in directories {
        if !directory.is_dir() {
            searched.push(format!("{} (no such directory)", directory.display()));
            continue;
        }
        let mut any = false;
        for name in file_names {
            let path = directory.join(name);
            if !path.exists() {
                continue;
            }
            any = true;
            if let Some(library) = try_load(&path, searched, "file") {
                return Some(SharedLibrary { library, path });
            }
        }
        if !any {
            searched.push(format!("{} (none of {})", directory.display(), file_names.join(", ")));
        }
    }
    None
}

/// Loads `path`, or records why not in `searched` (with `how` it was tried).
fn try_load(path: &Path, searched: &mut Vec<String>, how: &str) -> Option<libloading::Library> {
    // SAFETY: loading runs the library's initialisers; the callers name
    // vendor libraries (cuDNN, ...) whose initialisers only set up their own
    // state, and the handle keeps the library mapped while it is used.
    match unsafe { libloading::Library::new(path) } {
        Ok(library) => Some(library),
        Err(e) => {
            searched.push(format!("{} ({how}: {e})", path.display()));
            None
        }
    }
}

/// Every Python `site-packages` and `dist-packages` directory that exists
/// in the usual places, each once, in the order listed on
/// [`load_shared_library`].
fn python_site_directories() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            prefixes.push(PathBuf::from(prefix));
        }
    }
    for opt in sorted_entries(Path::new("/opt")) {
        prefixes.push(opt.join(".venv"));
        prefixes.push(opt.join("venv"));
    }
    prefixes.push(PathBuf::from("/usr"));
    prefixes.push(PathBuf::from("/usr/local"));
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    let mut sites = Vec::new();
    for prefix in prefixes {
        for python in sorted_entries(&prefix.join("lib")) {
            let is_python3 = python.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3"));
            if !is_python3 {
                continue;
            }
            for packages in ["site-packages", "dist-packages"] {
                let site = python.join(packages);
                if site.is_dir() && !sites.contains(&site) {
                    sites.push(site);
                }
            }
        }
    }
    sites
}

/// The entries of `directory`, sorted (none when it cannot be read).
fn sorted_entries(directory: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = match std::fs::read_dir(directory) {
        Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    entries.sort();
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    // The tests set process-wide environment variables.
    static ENV: Mutex<()> = Mutex::new(());

    #[test]
    fn a_missing_library_is_an_error_naming_the_places_and_the_variable() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let err = load_shared_library(
            "nolib",
            "BRASA_TEST_NOLIB_PATH",
            &["libbrasa-no-such-library.so.1"],
            &["nvidia/nolib/lib"],
        )
        .err();
        let Some(TensorError::LibraryNotFound { library, searched, env_var }) = &err else {
            unreachable!("expected LibraryNotFound, got {err:?}");
        };
        assert_eq!(library, "nolib");
        assert_eq!(env_var, "BRASA_TEST_NOLIB_PATH");
        assert!(searched.iter().any(|s| s.contains("libbrasa-no-such-library.so.1") && s.contains("system loader")));
        assert!(searched.iter().any(|s| s.contains("/usr/local/cuda/lib64")), "{searched:?}");
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("nolib could not be loaded"), "{message}");
        assert!(message.contains("set BRASA_TEST_NOLIB_PATH"), "{message}");
    }

    #[test]
    fn an_environment_variable_naming_a_file_that_is_no_library_is_an_error() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("brasa-cuda-library-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let file = dir.join("libdummy.so.1");
        std::fs::write(&file, b"not a shared library").unwrap_or_default();
        // The tests that read or write this variable hold `ENV`.
        std::env::set_var("BRASA_TEST_DUMMY_PATH", &file);
        let file_result = load_shared_library("dummy", "BRASA_TEST_DUMMY_PATH", &["libc.so.6"], &[]);
        // A directory holding none of the names: also an error, even though
        // the system loader would find libc.so.6 (the setting is final).
        std::env::set_var("BRASA_TEST_DUMMY_PATH", &dir);
        let dir_result = load_shared_library("dummy", "BRASA_TEST_DUMMY_PATH", &["libc.so.6"], &[]);
        std::env::remove_var("BRASA_TEST_DUMMY_PATH");
        std::fs::remove_dir_all(&dir).unwrap_or_default();
        match file_result {
            Err(TensorError::LibraryNotFound { searched, .. }) => {
                assert_eq!(searched.len(), 1, "{searched:?}");
                assert!(searched[0].contains("libdummy.so.1") && searched[0].contains("$BRASA_TEST_DUMMY_PATH"));
            }
            other => unreachable!("expected LibraryNotFound, got {other:?}"),
        }
        assert!(matches!(dir_result, Err(TensorError::LibraryNotFound { .. })), "{dir_result:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_the_system_loader_knows_loads() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = load_shared_library("libc", "BRASA_TEST_LIBC_PATH", &["libbrasa-absent.so", "libc.so.6"], &[]);
        match loaded {
            Ok(found) => assert_eq!(found.path, PathBuf::from("libc.so.6")),
            Err(e) => unreachable!("libc.so.6 did not load: {e}"),
        }
    }

    /// A copy of libm in a Python package directory made for the test
    /// (under a virtual environment named by `VIRTUAL_ENV`) comes before the
    /// system loader's; without it the system loader's loads. libm, not
    /// libc: a second libc in one process is unsafe.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_package_copy_comes_before_the_system_loaders() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let Some(libm) = ["/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6", "/lib64/libm.so.6"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        else {
            eprintln!("skipped: no libm.so.6 at a known path");
            return;
        };
        let venv = std::env::temp_dir().join(format!("brasa-venv-{}", std::process::id()));
        let package = venv.join("lib/python3.99/site-packages/brasa_test/lib");
        std::fs::create_dir_all(&package).unwrap_or_default();
        std::fs::copy(&libm, package.join("libm.so.6")).unwrap_or_default();
        let previous = std::env::var_os("VIRTUAL_ENV");
        std::env::set_var("VIRTUAL_ENV", &venv);
        let load = || {
            load_shared_library("libm", "BRASA_TEST_LIBM_PATH", &["libm.so.6"], &["brasa_test/lib"])
                .map(|found| found.path)
        };
        let with_package = load();
        std::fs::remove_dir_all(&venv).unwrap_or_default();
        let without = load();
        match previous {
            Some(v) => std::env::set_var("VIRTUAL_ENV", v),
            None => std::env::remove_var("VIRTUAL_ENV"),
        }
        assert_eq!(with_package.ok(), Some(package.join("libm.so.6")));
        assert_eq!(without.ok(), Some(PathBuf::from("libm.so.6")));
    }
}
