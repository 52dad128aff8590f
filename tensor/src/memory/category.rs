//! Memory categories: what each allocation is for (parameter, gradient,
//! optimizer state, activation saved for backward, temporary, input,
//! other), tagged when it is made and counted by the device's allocator.
//!
//! Allocations take the category of the innermost [`category_scope`] open
//! on the thread (`Other` outside any). Layers open `Parameter` scopes when
//! they make their weights, optimizers `OptimizerState` when they make their
//! state, autograd `Gradient` when it accumulates into a leaf; a tensor
//! autograd saves for backward is re-tagged `Activation`
//! ([`crate::Storage::set_category`]).
//!
//! ```
//! use brasa_tensor::memory::{self, category_scope, MemoryCategory};
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let dev = Device::CPU;
//! let before = memory::stats(dev)?.by_category.get(MemoryCategory::Input).current;
//! let batch = {
//!     let _input = category_scope(MemoryCategory::Input);
//!     Tensor::zeros_on([64, 784], DType::F32, dev)?
//! };
//! assert_eq!(batch.storage().category(), MemoryCategory::Input);
//! let now = memory::stats(dev)?.by_category.get(MemoryCategory::Input).current;
//! assert_eq!(now - before, 64 * 784 * 4);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use brasa_alloc::MemoryCategory;
use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<MemoryCategory> = const { Cell::new(MemoryCategory::Other) };
}

/// The category new allocations on this thread are counted under.
#[inline]
pub fn current_category() -> MemoryCategory {
    CURRENT.with(Cell::get)
}

/// Counts this thread's allocations under `category` until the guard
/// drops (then the outer scope's category applies again).
pub fn category_scope(category: MemoryCategory) -> CategoryScope {
    CategoryScope { outer: CURRENT.with(|c| c.replace(category)), _not_send: std::marker::PhantomData }
}

/// Restores the outer category when dropped (see [`category_scope`]).
#[must_use = "the category applies until this guard drops; bind it with `let _scope = ...`"]
pub struct CategoryScope {
    outer: MemoryCategory,
    // The scope belongs to the thread that opened it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CategoryScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.outer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(current_category(), MemoryCategory::Other);
        {
            let _outer = category_scope(MemoryCategory::Parameter);
            {
                let _inner = category_scope(MemoryCategory::Gradient);
                assert_eq!(current_category(), MemoryCategory::Gradient);
            }
            assert_eq!(current_category(), MemoryCategory::Parameter);
        }
        assert_eq!(current_category(), MemoryCategory::Other);
    }
}
