//! libnccl, loaded at run time: where it is looked for, the entry points
//! brasa calls, and NCCL's codes.
//!
//! cudarc has NCCL bindings, but its loader panics when the library is
//! missing and never tries `libnccl.so.2`, the only name NCCL's wheels and
//! most installs ship; so the library is found by
//! `brasa_tensor::cuda_library` (the places searched are named in the
//! error) and its functions are resolved here, with `ncclCommMemStats`
//! optional (NCCL 2.29 and later). A Python wheel's copy (PyTorch's) is
//! tried before the system loader's, as for cuDNN, so brasa and PyTorch
//! run the same NCCL on a machine that has both (on the H200 machines of
//! 2026-11-28 the system's was 2.28.3 and PyTorch's 2.28.9). The codes below are NCCL's stable ABI
//! (`nccl.h`: `ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t`).

use crate::collective::ReduceOp;
use crate::error::{ParallelError, Result};
use brasa_tensor::DType;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable naming libnccl (a file or its directory).
pub const NCCL_PATH_ENV: &str = "BRASA_NCCL_PATH";

/// An NCCL communicator handle (`ncclComm_t`).
pub(crate) type RawComm = *mut c_void;
/// A CUDA stream handle (`cudaStream_t`, the driver's `CUstream`).
type RawStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes made by one rank and given to all.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawUniqueId {
    pub(crate) internal: [c_char; 128],
}

/// `ncclSuccess`.
pub(crate) const SUCCESS: c_int = 0;
/// `ncclInProgress`: a non-blocking operation has not finished yet.
pub(crate) const IN_PROGRESS: c_int = 7;

/// `ncclCommMemStat_t::ncclStatGpuMemTotal` (NCCL 2.29).
const STAT_GPU_MEM_TOTAL: c_int = 3;

/// NCCL's element type for `dtype`; reductions of bool are refused before
/// they reach NCCL (`Collective::validate`), copies move it as bytes.
pub(crate) fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::Bool | DType::U8 => 1, // ncclUint8
        DType::I64 => 4,              // ncclInt64
        DType::F16 => 6,              // ncclFloat16
        DType::F32 => 7,              // ncclFloat32
        DType::F64 => 8,              // ncclFloat64
        DType::BF16 => 9,             // ncclBfloat16 (NCCL 2.10)
    }
}

/// NCCL's reduction for `op`.
pub(crate) fn reduction(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0, // ncclSum
        ReduceOp::Max => 2, // ncclMax
        ReduceOp::Min => 3, // ncclMin
        ReduceOp::Avg => 4, // ncclAvg (NCCL 2.10)
    }
}

type InitRank = unsafe extern "C" fn(*mut RawComm, c_int, RawUniqueId, c_int) -> c_int;
type InitAll = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int;
type CommCall = unsafe extern "C" fn(RawComm) -> c_int;
type AsyncError = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type LastError = unsafe extern "C" fn(RawComm) -> *const c_char;
type Reducing = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type Rooted = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type Gathering = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int;
type PointToPoint = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int;
type MemStats = unsafe extern "C" fn(RawComm, c_int, *mut u64) -> c_int;

/// The loaded library and the entry points brasa calls.
pub(crate) struct Nccl {
    /// Where the library was found.
    pub(crate) path: PathBuf,
    /// `ncclGetVersion`: major·10000 + minor·100 + patch.
    pub(crate) version: c_int,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> c_int,
    pub(crate) comm_init_rank: InitRank,
    pub(crate) comm_init_all: InitAll,
    pub(crate) comm_destroy: CommCall,
    pub(crate) comm_abort: CommCall,
    pub(crate) comm_get_async_error: AsyncError,
    get_error_string: ErrorString,
    get_last_error: Option<LastError>,
    pub(crate) all_reduce: Reducing,
    pub(crate) reduce_scatter: Reducing,
    pub(crate) broadcast: Rooted,
    pub(crate) all_gather: Gathering,
    pub(crate) send: PointToPoint,
    pub(crate) recv: PointToPoint,
    comm_mem_stats: Option<MemStats>,
    /// Keeps the functions above valid: the library is never unloaded.
    _library: brasa_tensor::cuda_library::SharedLibrary,
}

// SAFETY: the struct holds function pointers into a library that stays
// loaded for the process's life; NCCL's functions may be called from any
// thread (each communicator is used by one worker thread at a time).
unsafe impl Send for Nccl {}
// SAFETY: as above; nothing here is mutated after loading.
unsafe impl Sync for Nccl {}

static NCCL: OnceLock<std::result::Result<Nccl, ParallelError>> = OnceLock::new();

/// The NCCL library, loaded at the first call; the error (the places
/// searched, or a missing entry point) is kept and returned every time.
pub(crate) fn nccl() -> Result<&'static Nccl> {
    NCCL.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Nccl> {
    let shared = brasa_tensor::cuda_library::load_shared_library(
        "NCCL",
        NCCL_PATH_ENV,
        &["libnccl.so.2", "libnccl.so"],
        &["nvidia/nccl/lib"],
    )?;
    let path = shared.path.clone();
    let missing = |symbol: &str, e: &dyn std::fmt::Display| ParallelError::Nccl {
        rank: 0,
        call: "loading libnccl",
        message: format!("{} has no {symbol} ({e}); brasa needs NCCL 2.18 or later", path.display()),
        code: 0,
    };
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the type annotation at each use is the function's
            // signature in nccl.h; the library outlives the pointer (kept in
            // the struct, never unloaded).
            unsafe { *shared.library.get(concat!($name, "\0").as_bytes()).map_err(|e| missing($name, &e))? }
        };
    }
    macro_rules! optional {
        ($name:literal) => {
            // SAFETY: as in `symbol!`.
            unsafe { shared.library.get(concat!($name, "\0").as_bytes()).ok().map(|s| *s) }
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int = symbol!("ncclGetVersion");
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer.
    let code = unsafe { get_version(&mut version) };
    if code != SUCCESS {
        return Err(ParallelError::Nccl {
            rank: 0,
            call: "ncclGetVersion",
            message: format!("code {code} from {}", path.display()),
            code,
        });
    }
    let nccl = Nccl {
        version,
        get_unique_id: symbol!("ncclGetUniqueId"),
        comm_init_rank: symbol!("ncclCommInitRank"),
        comm_init_all: symbol!("ncclCommInitAll"),
        comm_destroy: symbol!("ncclCommDestroy"),
        comm_abort: symbol!("ncclCommAbort"),
        comm_get_async_error: symbol!("ncclCommGetAsyncError"),
        get_error_string: symbol!("ncclGetErrorString"),
        get_last_error: optional!("ncclGetLastError"),
        all_reduce: symbol!("ncclAllReduce"),
        reduce_scatter: symbol!("ncclReduceScatter"),
        broadcast: symbol!("ncclBroadcast"),
        all_gather: symbol!("ncclAllGather"),
        send: symbol!("ncclSend"),
        recv: symbol!("ncclRecv"),
        comm_mem_stats: optional!("ncclCommMemStats"),
        path,
        _library: shared,
    };
    Ok(nccl)
}

impl Nccl {
    /// The version as (major, minor, patch).
    pub(crate) fn version_triple(&self) -> (u32, u32, u32) {
        split_version(self.version)
    }

    /// `code` as an error of `call` on `rank`, with NCCL's words for it and
    /// the communicator's last error message when there is one.
    pub(crate) fn error(&self, rank: usize, call: &'static str, code: c_int, comm: Option<RawComm>) -> ParallelError {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let mut message = unsafe { text((self.get_error_string)(code)) };
        if let (Some(last_error), Some(comm)) = (self.get_last_error, comm) {
            // SAFETY: `comm` is a live communicator; the string is NCCL's own.
            let last = unsafe { text(last_error(comm)) };
            if !last.is_empty() {
                message = format!("{message}: {last}");
            }
        }
        ParallelError::Nccl { rank, call, message, code }
    }

    /// `Ok` for `ncclSuccess`, else the error of `call`.
    pub(crate) fn check(&self, rank: usize, call: &'static str, code: c_int, comm: Option<RawComm>) -> Result<()> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(self.error(rank, call, code, comm))
        }
    }

    /// The device memory NCCL holds for `comm` (`ncclCommMemStats`, NCCL
    /// 2.29 and later; `None` before, or when the query fails).
    pub(crate) fn memory_of(&self, comm: RawComm) -> Option<u64> {
        let stats = self.comm_mem_stats?;
        let mut bytes = 0u64;
        // SAFETY: `comm` is live; `bytes` is a valid out-pointer.
        (unsafe { stats(comm, STAT_GPU_MEM_TOTAL, &mut bytes) } == SUCCESS).then_some(bytes)
    }
}

/// `ncclGetVersion`'s number as (major, minor, patch): NCCL 2.9 and later
/// encode it as major·10000 + minor·100 + patch.
fn split_version(version: c_int) -> (u32, u32, u32) {
    let v = version.max(0) as u32;
    (v / 10000, (v % 10000) / 100, v % 100)
}

/// A C string NCCL returned, or "" for null.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that lives while this runs.
unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        // SAFETY: per the function's contract.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_split_as_nccl_encodes_them() {
        assert_eq!(split_version(22809), (2, 28, 9));
        assert_eq!(split_version(23007), (2, 30, 7));
        assert_eq!(split_version(-1), (0, 0, 0));
    }

    #[test]
    fn every_dtype_and_reduction_has_nccls_code() {
        // nccl.h: ncclUint8 1, ncclInt64 4, ncclFloat16 6, ncclFloat32 7,
        // ncclFloat64 8, ncclBfloat16 9; ncclSum 0, ncclMax 2, ncclMin 3, ncclAvg 4.
        let codes: Vec<c_int> = DType::ALL.iter().map(|d| data_type(*d)).collect();
        assert_eq!(codes, [1, 1, 4, 6, 9, 7, 8]);
        let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg].map(reduction);
        assert_eq!(ops, [0, 2, 3, 4]);
    }

    #[test]
    fn c_strings_from_nccl_are_read_whole_or_empty() {
        // SAFETY: null, and a NUL-terminated literal that outlives the call.
        let (none, some) = unsafe { (text(std::ptr::null()), text(c"unhandled cuda error".as_ptr())) };
        assert_eq!((none.as_str(), some.as_str()), ("", "unhandled cuda error"));
    }
}
