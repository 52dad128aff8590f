//! What a pipeline step looked like: per stage, when each forward and
//! backward ran ([`Span`]s on one clock), the busy time, the idle share (the
//! bubble) and the allocator's peak on the stage's device.
//!
//! The bubble of a stage is `1 − busy / wall`, with `wall` the time from
//! the first stage's first action to the last action of any stage; the
//! pipeline's bubble is the mean over stages. For equal stages and free
//! transfers it is `(p − 1) / (m + p − 1)` ([`Schedule::ideal_bubble`]).

use super::schedule::{Action, Schedule};
use brasa_tensor::Device;
use std::ops::Range;
use std::time::Duration;

/// One action's compute, measured from the step's start (waits for
/// neighbours excluded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// What ran.
    pub action: Action,
    /// When it started.
    pub start: Duration,
    /// When it ended.
    pub end: Duration,
}

/// One stage's part of a step.
#[derive(Clone, Debug)]
pub struct StageReport {
    /// The stage.
    pub stage: usize,
    /// Its device.
    pub device: Device,
    /// Its layers of the `Sequential`.
    pub layers: Range<usize>,
    /// Its actions, in the order they ran (those it finished).
    pub spans: Vec<Span>,
    /// Time spent computing (sum of the spans).
    pub busy: Duration,
    /// Peak allocated bytes on the device during the step.
    pub peak_bytes: usize,
    /// That peak minus what was allocated when the step began: the
    /// activations (and gradients created) the schedule made it hold.
    pub activation_peak_bytes: usize,
    /// The stage's error, if it failed in this step (a stage whose
    /// neighbour failed fails too, naming it).
    pub error: Option<String>,
}

/// The last step of a [`Pipeline`](super::Pipeline).
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// The schedule.
    pub schedule: Schedule,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Stages of the whole pipeline (this process may run some of them).
    pub total_stages: usize,
    /// The stages this process ran.
    pub stages: Vec<StageReport>,
    /// From the earliest start to the latest end over the stages.
    pub wall: Duration,
}

impl StageReport {
    /// The share of the step's wall time this stage was idle.
    pub fn idle_fraction(&self, wall: Duration) -> f64 {
        if wall.is_zero() {
            return 0.0;
        }
        (1.0 - self.busy.as_secs_f64() / wall.as_secs_f64()).max(0.0)
    }
}

impl PipelineReport {
    /// The mean idle share over the stages (see the module docs).
    pub fn bubble(&self) -> f64 {
        if self.stages.is_empty() {
            return 0.0;
        }
        self.stages.iter().map(|s| s.idle_fraction(self.wall)).sum::<f64>() / self.stages.len() as f64
    }

    /// `(p − 1) / (m + p − 1)` for this pipeline.
    pub fn ideal_bubble(&self) -> f64 {
        Schedule::ideal_bubble(self.total_stages, self.micro_batches)
    }

    pub(crate) fn wall_of(stages: &[StageReport]) -> Duration {
        let start = stages.iter().filter_map(|s| s.spans.first()).map(|s| s.start).min().unwrap_or_default();
        let end = stages.iter().flat_map(|s| s.spans.iter()).map(|s| s.end).max().unwrap_or_default();
        end.saturating_sub(start)
    }
}

impl std::fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        writeln!(
            f,
            "{} pipeline, {} stages, {} micro-batches: step {:.2} ms, bubble {:.1} % (ideal {:.1} %)",
            self.schedule.name(),
            self.total_stages,
            self.micro_batches,
            self.wall.as_secs_f64() * 1e3,
            100.0 * self.bubble(),
            100.0 * self.ideal_bubble()
        )?;
        writeln!(
            f,
            "{:<6}{:<8}{:<10}{:>11}{:>8}{:>13}{:>16}",
            "stage", "device", "layers", "busy ms", "idle", "peak MiB", "activ. peak MiB"
        )?;
        for s in &self.stages {
            write!(
                f,
                "{:<6}{:<8}{:<10}{:>11.2}{:>7.1}%{:>13.2}{:>16.2}",
                s.stage,
                s.device.to_string(),
                format!("{}..{}", s.layers.start, s.layers.end),
                s.busy.as_secs_f64() * 1e3,
                100.0 * s.idle_fraction(self.wall),
                mib(s.peak_bytes),
                mib(s.activation_peak_bytes)
            )?;
            match &s.error {
                Some(error) => writeln!(f, "  failed: {error}")?,
                None => writeln!(f)?,
            }
        }
        Ok(())
    }
}
