//! Calls into code the user registered (the `on_trace_ready` callback, a
//! [`crate::Clock`], a [`crate::DeviceTimer`]) from places a panic must not
//! escape: a `Drop` (a second panic during unwinding aborts the process) or
//! the profiler's own bookkeeping (a panic half-way would leave recording on).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic becomes `Err` with its message.
pub(crate) fn call_user<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = panic_message(&*payload);
        // A payload whose own drop panics must not take the thread down.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        message
    })
}

/// Drops `value`, catching a panic of its `Drop`.
pub(crate) fn drop_user<T>(value: T) {
    let _ = call_user(move || drop(value));
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop panics too");
        }
    }

    #[test]
    fn panics_become_messages_even_with_bombs() {
        assert_eq!(call_user(|| 3), Ok(3));
        assert_eq!(call_user(|| -> u8 { panic!("boom {}", 1) }), Err("boom 1".to_string()));
        assert_eq!(call_user(|| -> u8 { std::panic::panic_any(Bomb) }), Err("(no message)".to_string()));
        drop_user(Bomb);
    }
}
