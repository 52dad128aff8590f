//! The host's worker threads: how many there are, and whether the thread
//! that drives training is one of them.
//!
//! Host ops split their work over rayon's global pool. By default the pool's
//! threads are separate from the thread that calls the ops (usually `main`):
//! every parallel op hands all its shares to the pool and the caller sleeps
//! until they are done, so each op pays for waking the pool's threads and
//! then the caller. [`init_threads`] makes the calling thread one of the
//! pool's, as the master thread of PyTorch's OpenMP regions is: an op it
//! starts works on the first share itself while the other threads take the
//! rest. On 2 cores (a Zen 3 EPYC, 2026-11-28) the character-level GPT's
//! training step ran 5–8 % faster so, and a deep MLP's steps of many small
//! products 1.2–2 times as fast (`brasa-bench --gpt-worker cpu` and
//! `--workload-worker deep_mlp:f32`, with and without).
//!
//! Call it once, first thing in `main`, before any op: the pool is built
//! once per process, by the first op if nothing built it before.
//!
//! ```
//! // In `main`, before any tensor is made:
//! let threads = brasa_tensor::threads::init_threads(None).unwrap_or(1);
//! assert!(threads >= 1);
//! // A second call is an error that says the pool already exists.
//! assert!(brasa_tensor::threads::init_threads(None).is_err());
//! ```
//!
//! The thread that called [`init_threads`] must live as long as the
//! process's ops do (make the call from `main`): the pool counts on it.
//! It works only on the ops it starts itself, so work that other threads
//! send to the pool (the threads of logical host devices, of in-process
//! ranks, of data loaders) is done by the pool's other threads: a program
//! whose `main` mostly waits for such threads should not call it
//! (`train_gpt` calls it except under `--fsdp`).

use crate::error::{Result, TensorError};

/// Builds the host's thread pool with `count` threads (`None`: as many as
/// the machine has cores, or `RAYON_NUM_THREADS`), the calling thread being
/// one of them, and returns the pool's size. An error when a pool already
/// exists (an op ran first, or a second call) or the threads cannot be
/// started; ops keep working on the existing pool either way.
pub fn init_threads(count: Option<usize>) -> Result<usize> {
    if count == Some(0) {
        return Err(TensorError::invalid("init_threads", "a thread count of 0 (give None for the default)"));
    }
    let builder = rayon::ThreadPoolBuilder::new().num_threads(count.unwrap_or(0)).use_current_thread();
    builder.build_global().map_err(|e| {
        TensorError::invalid(
            "init_threads",
            format!("{e}: call it first thing in main, before any op builds the default pool"),
        )
    })?;
    Ok(rayon::current_num_threads())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_is_refused() {
        let err = init_threads(Some(0)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("thread count of 0"), "{err}");
    }
}
