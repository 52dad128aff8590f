//! A per-rank memory breakdown of data-parallel training, in the four parts
//! ZeRO's formulas count — parameters, gradients, optimizer state,
//! communication buffers — printable like the allocator's summary.
//!
//! Bytes are counted per distinct storage, so views (DDP's gradient views
//! of its buckets, ZeRO's shards of flat buffers) are counted once.

use brasa_autograd::Var;
use brasa_nn::optim::Optimizer;
use brasa_tensor::Tensor;
use std::collections::HashSet;

/// Bytes one rank holds for training state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    /// The model's parameters.
    pub parameters: usize,
    /// Gradients kept between backward and the optimizer step.
    pub gradients: usize,
    /// The optimizer's state (momenta, moments).
    pub optimizer_state: usize,
    /// Buffers that exist only for communication.
    pub communication_buffers: usize,
}

impl MemoryBreakdown {
    /// Parameters + gradients + optimizer state (what ZeRO's formulas count).
    pub fn model_states(&self) -> usize {
        self.parameters + self.gradients + self.optimizer_state
    }

    /// Everything.
    pub fn total(&self) -> usize {
        self.model_states() + self.communication_buffers
    }

    /// Counts `params` and their gradients, `extra_gradients` (gradient
    /// buffers held outside `.grad`, e.g. ZeRO-2's shards), the state of
    /// `optimizer`, and `communication_buffers` bytes.
    pub fn measure(
        params: &[Var],
        extra_gradients: &[Tensor],
        optimizer: &dyn Optimizer,
        communication_buffers: usize,
    ) -> MemoryBreakdown {
        let mut seen = HashSet::new();
        let mut bytes_of = |t: &Tensor| {
            if seen.insert(std::sync::Arc::as_ptr(t.storage()) as usize) {
                t.storage().size_in_bytes()
            } else {
                0
            }
        };
        let parameters = params.iter().map(|p| bytes_of(p.tensor())).sum();
        let gradients = params.iter().filter_map(|p| p.grad()).map(|g| bytes_of(&g)).sum::<usize>()
            + extra_gradients.iter().map(&mut bytes_of).sum::<usize>();
        let optimizer_state = optimizer
            .state_dict()
            .map(|state| state.iter().filter(|(name, _)| name.starts_with("state.")).map(|(_, t)| bytes_of(t)).sum())
            .unwrap_or(0);
        MemoryBreakdown { parameters, gradients, optimizer_state, communication_buffers }
    }
}

impl std::fmt::Display for MemoryBreakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        writeln!(f, "{:<24}{:>12}", "parameters", format!("{:.2} MiB", mib(self.parameters)))?;
        writeln!(f, "{:<24}{:>12}", "gradients", format!("{:.2} MiB", mib(self.gradients)))?;
        writeln!(f, "{:<24}{:>12}", "optimizer state", format!("{:.2} MiB", mib(self.optimizer_state)))?;
        writeln!(f, "{:<24}{:>12}", "communication buffers", format!("{:.2} MiB", mib(self.communication_buffers)))?;
        write!(f, "{:<24}{:>12}", "total", format!("{:.2} MiB", mib(self.total())))
    }
}
