//! [`OptimizerStage`]: where each optimizer is in a
//! [`GradScaler`](crate::GradScaler)'s cycle (`READY → UNSCALED → STEPPED`,
//! back to `READY` at `update()`). The scaler keeps one per optimizer, and
//! an [`AmpError::ScalerOrder`](crate::AmpError::ScalerOrder) names the
//! stage a call came at, so it sits below both.

/// Where an optimizer is between two
/// [`GradScaler::update`](crate::GradScaler::update)s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimizerStage {
    /// Nothing done since the last update.
    Ready,
    /// Its gradients were unscaled (and checked for inf/NaN).
    Unscaled,
    /// `step` ran (or was skipped).
    Stepped,
}

impl std::fmt::Display for OptimizerStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OptimizerStage::Ready => "READY",
            OptimizerStage::Unscaled => "UNSCALED",
            OptimizerStage::Stepped => "STEPPED",
        })
    }
}
