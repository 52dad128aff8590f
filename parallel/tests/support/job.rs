//! The parent and rank halves of an MPI test job, shared by the MPI test
//! files: the 2-rank shared-memory launch, a job's exit and output (kept
//! in a file, never a pipe), and a rank's communicator.
// Each test file uses the part it needs.
#![allow(dead_code)]

use super::launch::{launcher, CASE, CHILD};
use brasa_parallel::{abort_job_on_panic, init_from_env, launched_by_mpi, CommOptions, Communicator};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

pub fn case() -> String {
    std::env::var(CASE).unwrap_or_default()
}

/// How a job ended.
pub struct Job {
    pub status: ExitStatus,
    pub output: String,
    pub elapsed: Duration,
}

impl Job {
    pub fn describe(&self) -> String {
        format!("exit {:?} after {:.1?}; output:\n{}", self.status.code(), self.elapsed, self.output)
    }

    pub fn assert_success(&self) {
        assert!(self.status.success(), "the MPI job failed: {}", self.describe());
    }

    /// The job failed by itself: a non-zero exit of mpirun, not the outer
    /// `timeout` killing a hung job (124, or 137 after -k).
    pub fn assert_failed_without_hanging(&self, within: Duration) {
        let code = self.status.code();
        assert!(!self.status.success(), "the job should have failed: {}", self.describe());
        assert!(
            !matches!(code, Some(124) | Some(137) | None),
            "the job hung until the outer timeout killed it: {}",
            self.describe()
        );
        assert!(
            !self.output.contains("time limit for job execution has been reached"),
            "the job hung until mpirun --timeout ended it: {}",
            self.describe()
        );
        assert!(self.elapsed < within, "the job took {:.1?}, expected < {within:?}: {}", self.elapsed, self.describe());
    }

    pub fn assert_marker(&self, marker: &str) {
        assert!(self.output.contains(marker), "no `{marker}` line from the ranks: {}", self.describe());
    }
}

/// The shared-memory launch of mpi.md: 2 ranks on this machine.
pub fn local_mpirun(test: &str, case: &str) -> Command {
    launcher(
        "mpirun",
        &[
            "-np",
            "2",
            "--oversubscribe",
            "--bind-to",
            "none",
            "--timeout",
            "60",
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "self,vader",
            "--mca",
            "oob_tcp_if_include",
            "lo",
        ],
        test,
        case,
    )
}

/// Where a job's output goes: a file rather than a pipe, so that a process
/// the job leaves behind (a daemon cut off from mpirun) holding the output
/// open can never make the test wait for end-of-file.
pub struct Log(PathBuf);

impl Log {
    pub fn new() -> Log {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        Log(std::env::temp_dir().join(format!("brasa-mpi-test-{}-{n}.log", std::process::id())))
    }

    pub fn attach(&self, command: &mut Command) {
        let file = std::fs::File::create(&self.0).expect("creating the job's log file");
        let err = file.try_clone().expect("cloning the log file handle");
        command.stdout(Stdio::from(file)).stderr(Stdio::from(err));
    }

    pub fn read(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.0).unwrap_or_default()).into_owned()
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run(mut command: Command) -> Job {
    let log = Log::new();
    log.attach(&mut command);
    let start = Instant::now();
    let status = command.status().expect("cannot start timeout/mpirun: is Open MPI installed (see .ci/run)?");
    let job = Job { status, output: log.read(), elapsed: start.elapsed() };
    let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let case =
        command.get_envs().find(|(k, _)| *k == CASE).and_then(|(_, v)| v).map(|v| v.to_string_lossy().into_owned());
    println!(
        "job {} (case {:?}): exit {:?} after {:.1?}",
        args.iter().rev().nth(3).map_or("?", |s| s.as_str()),
        case.unwrap_or_default(),
        job.status.code(),
        job.elapsed
    );
    job
}

/// This rank's communicator, after the panic hook that makes a failed
/// assertion end the whole job.
pub fn join(timeout: Duration) -> Communicator {
    abort_job_on_panic();
    assert!(launched_by_mpi(), "the child runs under mpirun");
    let comm = init_from_env(&CommOptions::default().timeout(timeout)).expect("init_from_env under mpirun");
    assert_eq!(comm.backend(), "mpi");
    comm
}
