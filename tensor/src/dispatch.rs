//! `dispatch_dtype!`, `dispatch_float!` and `dispatch_int!`: run a generic body
//! with `$T` bound to the Rust type of a runtime [`DType`](crate::DType) — the
//! one place where runtime dtypes meet monomorphized kernels.

/// `dispatch_dtype!(dtype, T => body)` evaluates `body` with the type alias `T`
/// set to the Rust element type of `dtype`.
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        // Evaluated once; bool is the only dtype neither float nor integer.
        match $dtype {
            dtype => $crate::dispatch::dispatch_float!(dtype, $T => $body,
                $crate::dispatch::dispatch_int!(dtype, $T => $body, {
                    type $T = bool;
                    $body
                })),
        }
    };
}

pub(crate) use dispatch_dtype;

/// `dispatch_float!(dtype, T => body, otherwise)`: `body` with `T` the float
/// element type of `dtype`, or `otherwise` for non-float dtypes.
macro_rules! dispatch_float {
    ($dtype:expr, $T:ident => $body:expr, $otherwise:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            _ => $otherwise,
        }
    };
}

pub(crate) use dispatch_float;

/// Runs `$body` with `$T` bound to the integer type of `$dtype` (i64 or u8),
/// else evaluates `$otherwise`.
macro_rules! dispatch_int {
    ($dtype:expr, $T:ident => $body:expr, $otherwise:expr) => {
        match $dtype {
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            _ => $otherwise,
        }
    };
}

pub(crate) use dispatch_int;
