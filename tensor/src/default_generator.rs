//! The process-wide generator (PyTorch's `torch.default_generator`): seeded
//! by [`manual_seed`], its state saved and restored for checkpointing, and
//! every random fill's draws reserved from its stream ([`reserve_draws`]),
//! so the same seed gives the same numbers on every device.

use crate::rng::{Generator, GeneratorState};
use std::sync::Mutex;

static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);

/// Runs `f` on the generator (seeded with 0 at first use), locked.
pub(crate) fn with_generator<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    let mut slot = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    f(slot.get_or_insert_with(|| Generator::new(0)))
}

/// Seeds the process-wide generator (`torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    with_generator(|g| *g = Generator::new(seed));
}

/// The generator's state, to repeat draws later (checkpointing uses it).
pub fn rng_state() -> GeneratorState {
    with_generator(|g| g.state())
}

/// Restores a state from [`rng_state`].
pub fn set_rng_state(state: GeneratorState) {
    with_generator(|g| g.set_state(state));
}

/// Reserves `count` elements of the process-wide generator's stream for one
/// fill: a snapshot of the generator positioned at the first of them (element
/// `i` of the fill is stream element `offset + i` on every device).
pub(crate) fn reserve_draws(count: usize) -> Generator {
    with_generator(|g| {
        let snapshot = Generator::from_state(g.state());
        g.reserve(count as u64);
        snapshot
    })
}
