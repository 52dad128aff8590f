//! Launching this test binary's own tests on several MPI ranks (the pattern
//! of shared/reference/mpi.md): shared by the MPI test files.

use std::process::{Command, Stdio};

/// Set in a rank's environment: the test runs its rank half.
pub const CHILD: &str = "BRASA_MPI_TEST_CHILD";
/// Which case a rank runs (a test may launch several).
pub const CASE: &str = "BRASA_MPI_TEST_CASE";

/// `mpirun` (or the launcher `program`) around this test binary, set to
/// run `test` alone with `case`, environment cleaned as mpi.md says: a
/// process that ever initialised MPI has OMPI_/PMIX_ variables that make a
/// nested mpirun exit 1 silently.
pub fn launcher(program: &str, launcher_args: &[&str], test: &str, case: &str) -> Command {
    let mut command = Command::new("timeout");
    command.args(["-k", "10", "120", program]).args(launcher_args);
    command.args(["-x", CHILD, "-x", CASE]).arg(std::env::current_exe().expect("the test binary's path")).args([
        test,
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("OMPI_") || key.starts_with("PMIX_")) && !key.starts_with("OMPI_ALLOW_") {
            command.env_remove(key);
        }
    }
    command
        .env(CHILD, "1")
        .env(CASE, case)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Keeps a failing rank's panic message short in the job's output.
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    command
}
