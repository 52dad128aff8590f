//! The harness: set-up, the watchdog, one call, the memory check.

use super::*;

/// Calls that returned Ok, Err (`OP_FRONT_DOOR_COUNTS=1` prints them).
pub(super) static COUNTS: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

/// The call running now and when it started, for the watchdog.
pub(super) static RUNNING: Mutex<Option<(String, Instant)>> = Mutex::new(None);

/// Two host devices limited to [`LIMIT`] and the watchdog, once; then a
/// guard that runs the properties one at a time (the memory check compares
/// process-wide statistics).
pub(super) fn setup() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        set_host_device_count(2).unwrap();
        for index in 0..2 {
            set_host_memory_limit(index, Some(LIMIT)).unwrap();
        }
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_millis(200));
            let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((what, start)) = running.as_ref() {
                if start.elapsed() > HANG {
                    // Straight to stderr: the test harness captures `eprintln!`
                    // of this thread, and would lose it at the exit.
                    let message =
                        format!("op_front_door: `{what}` has not returned after {:?}: a hang\n", start.elapsed());
                    let _ = std::io::Write::write_all(&mut std::io::stderr(), message.as_bytes());
                    std::process::exit(101);
                }
            }
        });
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A short description of a tensor: dtype, shape, strides, device.
pub(super) fn desc(t: &Tensor) -> String {
    format!("{}{:?}/{:?}@{}", t.dtype(), t.dims(), t.strides(), t.device())
}

/// The operands of the calls of a case, to name them in a failure.
pub(super) struct Ctx(pub(super) String);

impl Ctx {
    pub(super) fn new(tensors: &[&Tensor]) -> Ctx {
        Ctx(tensors.iter().map(|t| desc(t)).collect::<Vec<_>>().join(", "))
    }

    /// Runs one call: `Ok(Some)` for its value, `Ok(None)` for its error; a
    /// panic or a call slower than [`CALL_LIMIT`] fails the case.
    pub(super) fn call<T>(
        &self,
        name: &str,
        f: impl FnOnce() -> Result<T, TensorError>,
    ) -> Result<Option<T>, TestCaseError> {
        let what = || format!("{name} on [{}]", self.0);
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some((what(), Instant::now()));
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(f));
        let elapsed = start.elapsed();
        if elapsed > Duration::from_secs(1) && std::env::var_os("OP_FRONT_DOOR_COUNTS").is_some() {
            let message = format!("slow: {} took {elapsed:?}\n", what());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), message.as_bytes());
        }
        if let Ok(r) = &result {
            COUNTS[usize::from(r.is_err())].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = None;
        match result {
            Ok(result) if elapsed <= CALL_LIMIT => Ok(result.ok()),
            Ok(_) => Err(TestCaseError::fail(format!("{} took {elapsed:?}", what()))),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(TestCaseError::fail(format!("{} panicked: {message}", what())))
            }
        }
    }

    /// A call that returns a tensor: an `Ok` one must have as many elements
    /// as its shape says.
    pub(super) fn tensor(
        &self,
        name: &str,
        f: impl FnOnce() -> Result<Tensor, TensorError>,
    ) -> Result<Option<Tensor>, TestCaseError> {
        let out = self.call(name, f)?;
        if let Some(t) = &out {
            prop_assert_eq!(t.numel(), dims_numel(t.dims()), "{} on [{}] gave {}", name, self.0, desc(t));
            prop_assert_eq!(t.strides().len(), t.rank());
        }
        Ok(out)
    }

    /// An in-place call: into a view whose elements share memory (an
    /// expanded one) it must fail.
    pub(super) fn in_place(
        &self,
        name: &str,
        target: &Tensor,
        f: impl FnOnce() -> Result<(), TensorError>,
    ) -> Result<bool, TestCaseError> {
        let done = self.call(name, f)?.is_some();
        if done && target.layout().has_internal_overlap() {
            return Err(TestCaseError::fail(format!(
                "{name} on [{}] wrote into an expanded view {}",
                self.0,
                desc(target)
            )));
        }
        Ok(done)
    }
}

/// What the allocators hold: per device (allocated, active and requested
/// bytes, live allocations, reserved bytes once the cache is emptied), and
/// the pinned pool's allocated bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Held(pub(super) Vec<[i64; 5]>, pub(super) i64);

pub(super) fn held() -> Held {
    let per_device = DEVICES
        .iter()
        .map(|&device| {
            memory::empty_cache(device).unwrap();
            let s = memory::stats(device).unwrap();
            [
                s.allocated_bytes.all.current,
                s.active_bytes.all.current,
                s.requested_bytes.all.current,
                s.allocation.all.current,
                s.reserved_bytes.all.current,
            ]
        })
        .collect();
    Held(per_device, memory::pinned_stats().unwrap().allocated_bytes.all.current)
}

/// Runs one case (which owns, and drops, all of its tensors), then checks
/// that the allocators hold what they held before it.
pub(super) fn case(body: impl FnOnce() -> Result<(), TestCaseError>) -> Result<(), TestCaseError> {
    let before = held();
    body()?;
    let after = held();
    prop_assert_eq!(
        &before,
        &after,
        "the allocators' [allocated, active, requested, allocations, reserved] per device, pinned: changed \
         though every tensor of the case was dropped"
    );
    Ok(())
}

pub(super) fn dims_numel(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

pub(super) fn small(t: &Tensor) -> bool {
    t.numel() <= WORK
}

pub(super) fn cheap_or_hopeless(numel: usize) -> bool {
    numel <= WORK || numel >= HOPELESS
}

/// The element count of the broadcast of these shapes (saturating), or 0
/// when they do not broadcast (the op then fails on shapes, cheaply).
pub(super) fn broadcast_numel(tensors: &[&Tensor]) -> usize {
    let mut out = brasa_tensor::Shape::new(Vec::<usize>::new());
    for t in tensors {
        match brasa_tensor::broadcast_shapes(&out, t.shape()) {
            Ok(shape) => out = shape,
            Err(_) => return 0,
        }
    }
    dims_numel(out.dims())
}

/// The elements of a tensor as bits, every NaN the same, to compare results.
pub(super) fn elements(t: &Tensor) -> Option<Vec<u64>> {
    let nan_or = |bits: u64, nan: bool| if nan { u64::MAX } else { bits };
    Some(match t.dtype() {
        DType::Bool => t.to_vec::<bool>().ok()?.into_iter().map(u64::from).collect(),
        DType::U8 => t.to_vec::<u8>().ok()?.into_iter().map(u64::from).collect(),
        DType::I64 => t.to_vec::<i64>().ok()?.into_iter().map(|v| v as u64).collect(),
        DType::F16 => {
            t.to_vec::<half::f16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect()
        }
        DType::BF16 => {
            t.to_vec::<half::bf16>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect()
        }
        DType::F32 => t.to_vec::<f32>().ok()?.into_iter().map(|v| nan_or(v.to_bits().into(), v.is_nan())).collect(),
        DType::F64 => t.to_vec::<f64>().ok()?.into_iter().map(|v| nan_or(v.to_bits(), v.is_nan())).collect(),
    })
}
