//! The op front door: bytes → a program of public tensor ops on a small pool
//! of tensors, with random shapes (0, 1, small and huge dims), dtypes,
//! devices, views with odd strides (transpose, permute, narrow, select,
//! expand, reshape) and arguments (negative and out-of-range dims, NaN and
//! infinite scalars, zero strides and kernels).
//!
//! Every call must return `Ok` or `Err`: a panic, an abort or a hang is a
//! crash. Beyond that, answers are checked where being wrong would be
//! silent: an element-wise op on strided views (transposed, narrowed,
//! expanded, permuted) gives element for element what it gives on
//! contiguous copies of them; a result's element count matches its shape;
//! an in-place write into an expanded view (several elements on one memory
//! location) is an error; and once every tensor is dropped the host
//! allocator holds nothing.
//!
//! Host devices are limited to 64 MiB each, so a huge shape meets an
//! out-of-memory error instead of the fuzzer's RSS limit. Work is bounded so
//! that a legitimately long computation (summing 2^40 elements of an
//! expanded view) is not run: an op runs when its inputs are small, or when
//! its output alone cannot fit in the limit (then it must fail, and fast).
//!
//! To read a crash: `BRASA_FUZZ_TRACE=1 cargo +nightly fuzz run tensor_ops
//! <crash file>` prints each op of the program before it runs.

#![no_main]

use arbitrary::Unstructured;
use brasa_tensor::{memory, Device};
use libfuzzer_sys::fuzz_target;
use std::sync::{Once, OnceLock};

// The program's parts, one file each (below `tensor_ops/`): what the bytes
// decode into, the checks and bounds on results, and the machine that runs
// a program on its pool of tensors.
#[path = "tensor_ops/checks.rs"]
mod checks;
#[path = "tensor_ops/machine.rs"]
mod machine;
#[path = "tensor_ops/program.rs"]
mod program;

use machine::Machine;
use program::Op;

/// The byte limit of each logical host device.
pub(crate) const DEVICE_LIMIT: usize = 64 << 20;
/// Elements an op may read or write when it is run for its result.
pub(crate) const WORK: usize = 1 << 16;
/// Multiply-adds a matrix product, convolution or pooling may do.
pub(crate) const FLOPS: usize = 1 << 21;
/// An output of at least this many elements (of at least one byte) cannot
/// be allocated under the limit: an op making it must fail.
pub(crate) const HOPELESS: usize = 2 * DEVICE_LIMIT;
/// Tensors kept at once.
pub(crate) const POOL: usize = 12;

/// A dim size: mostly 0..=4 and small, sometimes huge.
/// `BRASA_FUZZ_TRACE=1` prints each op before it runs (to read a crash).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("BRASA_FUZZ_TRACE").is_some())
}

fn setup() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        // Before any host tensor exists: two logical devices, 64 MiB each.
        brasa_tensor::set_host_device_count(2).expect("host device count");
        for index in 0..2 {
            brasa_tensor::set_host_memory_limit(index, Some(DEVICE_LIMIT)).expect("host memory limit");
        }
    });
}

fuzz_target!(|data: &[u8]| {
    setup();
    let mut u = Unstructured::new(data);
    let Ok(seed) = u.arbitrary::<u64>() else { return };
    brasa_tensor::manual_seed(seed);
    let mut machine = Machine { pool: Vec::new() };
    for _ in 0..32 {
        match u.arbitrary::<Op>() {
            Ok(op) => {
                if trace() {
                    eprintln!("{op:?}");
                }
                machine.run(op)
            }
            Err(_) => break,
        }
    }
    drop(machine);
    // Every tensor is gone: the host devices hold no allocation.
    for device in [Device::CPU, Device::cpu(1)] {
        assert_eq!(memory::allocated(device).unwrap_or(0), 0, "{device} leaked memory");
    }
});
