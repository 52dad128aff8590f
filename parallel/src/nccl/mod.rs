//! The NCCL engine (feature `cuda`): collectives between CUDA devices
//! that read and write device memory directly, on a communication stream
//! ordered against each rank's compute stream by events. The engine
//! PyTorch's `backend="nccl"` uses; DDP, ZeRO, FSDP and pipelines run on
//! it unchanged.
//!
//! Three ways to start ranks on it:
//!
//! - one process, several devices ([`nccl_group`], `ncclCommInitAll`):
//!   what [`run_on_devices`](crate::run_on_devices) and
//!   [`DataParallel`](crate::DataParallel) use when their
//!   [`CommOptions`] say [`CommBackend::Nccl`];
//! - one process per rank with a [`NcclUniqueId`] the user moves
//!   ([`nccl_communicator`]);
//! - one process per rank bootstrapped over another communicator, such as
//!   MPI's world under `mpirun` ([`nccl_from`]): rank 0 makes the id and
//!   broadcasts it; no shared files.
//!
//! ```no_run
//! use brasa_parallel::{run_on_devices, CommBackend, CommOptions, LaunchOptions, ReduceOp};
//! use brasa_tensor::{Device, Tensor};
//!
//! let devices = [Device::cuda(0), Device::cuda(1)];
//! let options = LaunchOptions { comm: CommOptions::default().backend(CommBackend::Nccl), ..Default::default() };
//! let sums = run_on_devices(&devices, &options, |comm| {
//!     let x = Tensor::from_vec_on(vec![comm.rank() as f32 + 1.0; 4], [4], comm.device())?;
//!     comm.all_reduce(&x, ReduceOp::Sum)?;      // on the GPUs, no host copies
//!     Ok(x.to_vec::<f32>()?)
//! })?;
//! assert_eq!(sums[1], [3.0; 4]);
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```
//!
//! The library is loaded at run time (no CUDA toolkit or NCCL is needed to
//! build): `$BRASA_NCCL_PATH` first, then `libnccl.so.2` and `libnccl.so`
//! through the system's loader, then the `nvidia/nccl/lib` folder of
//! Python's NCCL wheel, then the CUDA toolkit; a missing library is an
//! error naming every place searched.
//!
//! Before each collective of a group of two or more, the ranks all-gather
//! its signature (five integers) and a rank that called something else, or
//! with another size or dtype, gets [`ParallelError::Mismatch`] naming both
//! sides, where NCCL itself would hang or reduce garbage. Point-to-point
//! sizes are not compared. A collective that does not finish within the
//! communicator's timeout aborts the communicator (`ncclCommAbort`) and
//! returns [`ParallelError::Timeout`]; NCCL's asynchronous errors
//! (`ncclCommGetAsyncError`) are returned as [`ParallelError::Nccl`].
//!
//! Differences from the other engines: half-precision sums are NCCL's
//! (summed in the element type along its ring, not in f32 in rank order),
//! and `Max`/`Min` with a NaN follow NCCL's arithmetic.
//!
//! Two ranks on one GPU: NCCL before 2.30 refuses them ("Duplicate GPU
//! detected"); 2.30 and later allow two with `NCCL_MULTI_RANK_GPU_ENABLE=1`.
//! [`nccl_group`] refuses them with an error saying so before NCCL does.

mod engine;
mod library;

pub use library::NCCL_PATH_ENV;

#[cfg(doc)]
use crate::communicator::CommBackend;
use crate::communicator::{CollectiveEngine, CommOptions, Communicator, RankInfo};
use crate::error::{ParallelError, Result};
use brasa_tensor::{cuda_interop, DType, Device, Tensor};
use engine::{CommHandle, NcclEngine};
use library::{nccl, RawComm, RawUniqueId};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::Duration;

/// The loaded NCCL's version as (major, minor, patch), e.g. (2, 28, 9).
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    Ok(nccl()?.version_triple())
}

/// Where the NCCL library brasa loaded lies.
pub fn nccl_library_path() -> Result<PathBuf> {
    Ok(nccl()?.path.clone())
}

/// The id that every rank of one NCCL communicator is started with: made
/// once (by rank 0) and handed to the others (128 bytes).
#[derive(Clone, Copy)]
pub struct NcclUniqueId(RawUniqueId);

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclUniqueId(..)")
    }
}

impl NcclUniqueId {
    /// Bytes in an id.
    pub const BYTES: usize = 128;

    /// A new id (`ncclGetUniqueId`: it also starts NCCL's bootstrap
    /// listener in this process, so make it on the rank that will be 0).
    pub fn new() -> Result<NcclUniqueId> {
        let nccl = nccl()?;
        let mut id = RawUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer to 128 bytes.
        let code = unsafe { (nccl.get_unique_id)(&mut id) };
        nccl.check(0, "ncclGetUniqueId", code, None)?;
        Ok(NcclUniqueId(id))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id from the bytes rank 0 sent; an error unless there are 128.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclUniqueId> {
        let bytes: &[u8; 128] = bytes.try_into().map_err(|_| {
            ParallelError::invalid(
                "NcclUniqueId::from_bytes",
                format!("an NCCL id has {} bytes, not {}", Self::BYTES, bytes.len()),
            )
        })?;
        Ok(NcclUniqueId(RawUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) }))
    }
}

/// Live communicators, for [`nccl_memory`].
static LIVE: Mutex<Vec<(Device, Weak<CommHandle>)>> = Mutex::new(Vec::new());

/// The device memory NCCL holds on `device` for brasa's live communicators
/// (`ncclCommMemStats`, NCCL 2.29 and later); `None` when the loaded NCCL
/// cannot say, or none is live there. NCCL allocates it itself, outside
/// brasa's caching allocator, so `memory::allocated` does not count it;
/// `memory::summary` lists it and `MemoryTarget::like` takes it off the
/// device's capacity (registered with `memory::register_external`).
pub fn nccl_memory(device: Device) -> Option<u64> {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|(_, handle)| handle.strong_count() > 0);
    let handles: Vec<Arc<CommHandle>> =
        live.iter().filter(|(d, _)| *d == device).filter_map(|(_, handle)| handle.upgrade()).collect();
    drop(live);
    if handles.is_empty() {
        return None;
    }
    handles.iter().map(|handle| handle.memory()).sum()
}

/// The CUDA device index of `device`, or an error naming the rank.
fn cuda_index(op: &'static str, rank: usize, device: Device) -> Result<usize> {
    match device {
        Device::Cuda(index) => Ok(index),
        other => Err(ParallelError::invalid(op, format!("rank {rank} is on {other}; NCCL works between CUDA devices"))),
    }
}

/// Wraps a live NCCL communicator of `rank` into a [`Communicator`].
fn start(raw: RawComm, rank: usize, world: usize, device: Device, options: &CommOptions) -> Result<Communicator> {
    let nccl = nccl()?;
    let comm = Arc::new(CommHandle::new(nccl, rank, raw));
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((device, Arc::downgrade(&comm)));
    // memory::summary and memory plans (MemoryTarget::like) count what
    // NCCL holds, where the library can say.
    static REPORTER: std::sync::Once = std::sync::Once::new();
    REPORTER.call_once(|| brasa_tensor::memory::register_external("NCCL", nccl_memory));
    let info = RankInfo { rank, world_size: world, device, backend: "nccl" };
    let engine =
        NcclEngine { nccl, comm: Arc::clone(&comm), rank, world, device, timeout: options.timeout, stream: None };
    Communicator::start(info, options, Some(comm), move || Ok(Box::new(engine) as Box<dyn CollectiveEngine>))
}

/// Communicators for one process driving every device in `devices`
/// (`ncclCommInitAll`): rank i works on `devices[i]`; hand each to its own
/// thread, as [`run_on_devices`](crate::run_on_devices) does.
pub fn nccl_group(devices: &[Device], options: &CommOptions) -> Result<Vec<Communicator>> {
    const OP: &str = "nccl_group";
    options.check()?;
    if devices.is_empty() {
        return Err(ParallelError::invalid(OP, "a group needs at least one device"));
    }
    let ordinals = devices
        .iter()
        .enumerate()
        .map(|(rank, d)| cuda_index(OP, rank, *d).map(|i| i as i32))
        .collect::<Result<Vec<i32>>>()?;
    let nccl = nccl()?;
    for (rank, device) in devices.iter().enumerate() {
        if let Some(other) = devices[..rank].iter().position(|d| d == device) {
            let (major, minor, patch) = nccl.version_triple();
            let allowed =
                (major, minor) >= (2, 30) && std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
            if !allowed {
                return Err(ParallelError::invalid(
                    OP,
                    format!(
                        "ranks {other} and {rank} are both on {device}; NCCL {major}.{minor}.{patch} ({}) {}; or use \
                         CommBackend::InProcess, which lets ranks share a GPU",
                        nccl.path.display(),
                        if (major, minor) >= (2, 30) {
                            "allows two ranks on one GPU only with NCCL_MULTI_RANK_GPU_ENABLE=1 (and NCCL_MAX_CTAS=1, \
                             NCCL_NVLS_ENABLE=0)"
                        } else {
                            "refuses two ranks on one GPU (allowed from NCCL 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1)"
                        }
                    ),
                ));
            }
        }
    }
    cuda_interop::bind_context(devices[0])?;
    let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: `raw` has room for one handle per device; `ordinals` lists
    // existing CUDA devices (their allocators were reached above).
    let code = unsafe { (nccl.comm_init_all)(raw.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr()) };
    nccl.check(0, "ncclCommInitAll", code, None)?;
    raw.into_iter().enumerate().map(|(rank, raw)| start(raw, rank, devices.len(), devices[rank], options)).collect()
}

/// This process's rank of a `world`-rank NCCL communicator on `device`
/// (`ncclCommInitRank`), every rank given the same `id`. Waits for the
/// other ranks at most the options' timeout.
pub fn nccl_communicator(
    rank: usize,
    world: usize,
    device: Device,
    id: &NcclUniqueId,
    options: &CommOptions,
) -> Result<Communicator> {
    const OP: &str = "nccl_communicator";
    options.check()?;
    if rank >= world {
        return Err(ParallelError::invalid(OP, format!("rank {rank} is not a rank of a world of {world}")));
    }
    cuda_index(OP, rank, device)?;
    cuda_interop::bind_context(device)?;
    let nccl = nccl()?;
    // ncclCommInitRank blocks until every rank has joined: it runs on a
    // thread of its own so that a rank that never comes is a timeout here,
    // not a hang (the thread is left behind in that case).
    struct SendRaw(RawComm);
    // SAFETY: a communicator handle may move between threads (see engine.rs).
    unsafe impl Send for SendRaw {}
    let (sender, receiver) = mpsc::channel::<(i32, SendRaw)>();
    let raw_id = id.0;
    std::thread::Builder::new()
        .name(format!("brasa-nccl-init-rank{rank}"))
        .spawn(move || {
            let bound = cuda_interop::bind_context(device);
            let mut raw: RawComm = std::ptr::null_mut();
            let code = match bound {
                // SAFETY: `raw` is a valid out-pointer; the id is 128 bytes
                // made by ncclGetUniqueId; the device's context is current.
                Ok(()) => unsafe { (nccl.comm_init_rank)(&mut raw, world as i32, raw_id, rank as i32) },
                Err(_) => -1,
            };
            let _ = sender.send((code, SendRaw(raw)));
        })
        .map_err(|e| ParallelError::Spawn {
            op: OP,
            what: "NCCL's initialization thread".into(),
            source: brasa_tensor::SharedError::new(e),
        })?;
    let wait = if options.timeout == Duration::MAX { Duration::from_secs(u64::MAX / 4) } else { options.timeout };
    match receiver.recv_timeout(wait) {
        Ok((-1, _)) => Err(ParallelError::invalid(OP, format!("could not make {device}'s CUDA context current"))),
        Ok((code, SendRaw(raw))) => {
            nccl.check(rank, "ncclCommInitRank", code, None)?;
            start(raw, rank, world, device, options)
        }
        Err(_) => Err(ParallelError::Timeout { op: OP, rank, timeout: options.timeout, waiting_for: vec![] }),
    }
}

/// An NCCL communicator for the ranks of `bootstrap` (an MPI world under
/// `mpirun`, or any communicator), each on its own `device`: rank 0 makes
/// the [`NcclUniqueId`] and broadcasts it over `bootstrap`.
pub fn nccl_from(bootstrap: &Communicator, device: Device, options: &CommOptions) -> Result<Communicator> {
    const OP: &str = "nccl_from";
    let id_bytes = Tensor::zeros_on([NcclUniqueId::BYTES], DType::U8, bootstrap.device())?;
    // Rank 0 broadcasts zeros when it cannot make an id, so that the
    // others fail at once rather than at their timeout.
    let made = if bootstrap.rank() == 0 { Some(NcclUniqueId::new()) } else { None };
    if let Some(Ok(id)) = &made {
        let bytes = Tensor::from_vec_on(id.to_bytes().to_vec(), [NcclUniqueId::BYTES], bootstrap.device())?;
        id_bytes.copy_(&bytes)?;
    }
    bootstrap.broadcast(&id_bytes, 0)?;
    if let Some(Err(error)) = made {
        return Err(error);
    }
    let bytes = id_bytes.to_vec::<u8>()?;
    if bytes.iter().all(|b| *b == 0) {
        return Err(ParallelError::invalid(
            OP,
            format!("rank {}: rank 0 could not make an NCCL id (its error says why)", bootstrap.rank()),
        ));
    }
    let id = NcclUniqueId::from_bytes(&bytes)?;
    nccl_communicator(bootstrap.rank(), bootstrap.world_size(), device, &id, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_bytes_and_refuse_other_lengths() {
        let bytes: Vec<u8> = (0..128).map(|i| (i * 7 % 256) as u8).collect();
        let id = NcclUniqueId::from_bytes(&bytes).expect("128 bytes");
        assert_eq!(id.to_bytes().to_vec(), bytes);
        let error = NcclUniqueId::from_bytes(&bytes[..100]).expect_err("100 bytes");
        assert!(matches!(error, ParallelError::Invalid { op: "NcclUniqueId::from_bytes", .. }), "{error}");
    }

    #[test]
    fn host_devices_are_not_ncclable() {
        let error = cuda_index("nccl_group", 1, Device::CPU).expect_err("a host device");
        assert!(matches!(error, ParallelError::Invalid { op: "nccl_group", .. }), "{error}");
        assert_eq!(cuda_index("nccl_group", 0, Device::cuda(3)).expect("cuda:3"), 3);
    }
}
