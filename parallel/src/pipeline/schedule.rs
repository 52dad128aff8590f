//! Schedules: the order in which one stage runs the forwards and backwards
//! of the micro-batches, as an explicit list of [`Action`]s that tests (and
//! curious users) can inspect.
//!
//! - **GPipe**: every forward, then every backward (micro-batch order both
//!   times). A stage holds the activations of all `m` micro-batches at the
//!   turn.
//! - **1F1B** (PipeDream-flush, Megatron's default): stage `s` of `p` runs
//!   `min(p − s − 1, m)` warm-up forwards, then alternates one forward and
//!   one backward, then drains the remaining backwards. It holds at most
//!   `min(p − s, m)` micro-batches of activations; the bubble is GPipe's,
//!   `(p − 1) / (m + p − 1)`.
//!
//! Sends and receives are implied: a forward on a stage other than the
//! first receives its input from the previous stage, a forward on a stage
//! other than the last sends its output on, and backwards do the same with
//! gradients the other way. Both schedules run forwards and backwards in
//! increasing micro-batch order on every stage, so the links between
//! stages are first-in first-out queues.
//!
//! ```
//! use brasa_parallel::pipeline::{Action, Schedule};
//!
//! let stage0 = Schedule::OneFOneB.actions(0, 2, 3);
//! assert_eq!(
//!     stage0,
//!     [Action::Forward(0), Action::Forward(1), Action::Backward(0), Action::Forward(2), Action::Backward(1),
//!      Action::Backward(2)]
//! );
//! assert_eq!(Schedule::OneFOneB.max_in_flight(0, 2, 8), 2);
//! assert_eq!(Schedule::GPipe.max_in_flight(0, 2, 8), 8);
//! ```

/// Which order the stages run micro-batches in; see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Schedule {
    /// All forwards, then all backwards (torch's `ScheduleGPipe`).
    GPipe,
    /// One forward, one backward in the steady state (torch's `Schedule1F1B`).
    #[default]
    OneFOneB,
}

/// One unit of a stage's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// The forward of micro-batch `.0` (receiving its input first, sending
    /// its output after, where there is a neighbour).
    Forward(usize),
    /// The backward of micro-batch `.0` (receiving the gradient of the
    /// output first, sending the gradient of the input after).
    Backward(usize),
}

impl Action {
    /// The micro-batch this action works on.
    pub fn micro_batch(self) -> usize {
        match self {
            Action::Forward(j) | Action::Backward(j) => j,
        }
    }

    /// `"forward"` or `"backward"`.
    pub fn kind(self) -> &'static str {
        match self {
            Action::Forward(_) => "forward",
            Action::Backward(_) => "backward",
        }
    }
}

impl Schedule {
    /// The schedule's name (`"GPipe"`, `"1F1B"`).
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "GPipe",
            Schedule::OneFOneB => "1F1B",
        }
    }

    /// What stage `stage` of `stages` does, in order, for `micro_batches`
    /// micro-batches: each micro-batch's forward once and its backward once.
    pub fn actions(self, stage: usize, stages: usize, micro_batches: usize) -> Vec<Action> {
        let m = micro_batches;
        match self {
            Schedule::GPipe => (0..m).map(Action::Forward).chain((0..m).map(Action::Backward)).collect(),
            Schedule::OneFOneB => {
                let warmup = stages.saturating_sub(stage + 1).min(m);
                let mut actions: Vec<Action> = (0..warmup).map(Action::Forward).collect();
                for i in 0..m - warmup {
                    actions.push(Action::Forward(warmup + i));
                    actions.push(Action::Backward(i));
                }
                actions.extend((m - warmup..m).map(Action::Backward));
                actions
            }
        }
    }

    /// The most micro-batches whose activations stage `stage` holds at once
    /// (forwards done, backwards not yet): `m` for GPipe, `min(p − s, m)`
    /// for 1F1B. Computed from [`Schedule::actions`].
    pub fn max_in_flight(self, stage: usize, stages: usize, micro_batches: usize) -> usize {
        let mut live = 0usize;
        let mut most = 0usize;
        for action in self.actions(stage, stages, micro_batches) {
            match action {
                Action::Forward(_) => live += 1,
                Action::Backward(_) => live = live.saturating_sub(1),
            }
            most = most.max(live);
        }
        most
    }

    /// The idle share of an ideal pipeline (equal stages, free transfers):
    /// `(p − 1) / (m + p − 1)`, the same for both schedules.
    pub fn ideal_bubble(stages: usize, micro_batches: usize) -> f64 {
        let (p, m) = (stages as f64, micro_batches as f64);
        if stages == 0 || micro_batches == 0 {
            return 0.0;
        }
        (p - 1.0) / (m + p - 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_micro_batch_runs_forward_then_backward_once_in_order() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for p in 1..6 {
                for m in 1..10 {
                    for s in 0..p {
                        let actions = schedule.actions(s, p, m);
                        assert_eq!(actions.len(), 2 * m);
                        let forwards: Vec<usize> = actions
                            .iter()
                            .filter(|a| matches!(a, Action::Forward(_)))
                            .map(|a| a.micro_batch())
                            .collect();
                        let backwards: Vec<usize> = actions
                            .iter()
                            .filter(|a| matches!(a, Action::Backward(_)))
                            .map(|a| a.micro_batch())
                            .collect();
                        assert_eq!(forwards, (0..m).collect::<Vec<_>>(), "{schedule:?} p={p} m={m} s={s}");
                        assert_eq!(backwards, (0..m).collect::<Vec<_>>(), "{schedule:?} p={p} m={m} s={s}");
                        for j in 0..m {
                            let f = actions.iter().position(|a| *a == Action::Forward(j));
                            let b = actions.iter().position(|a| *a == Action::Backward(j));
                            assert!(f < b, "{schedule:?} p={p} m={m} s={s} mb={j}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_p_minus_s_micro_batches() {
        for p in 1..6 {
            for m in 1..10 {
                for s in 0..p {
                    assert_eq!(Schedule::OneFOneB.max_in_flight(s, p, m), (p - s).min(m), "p={p} m={m} s={s}");
                    assert_eq!(Schedule::GPipe.max_in_flight(s, p, m), m);
                }
            }
        }
    }

    #[test]
    fn last_stage_of_one_f_one_b_alternates_from_the_start() {
        let actions = Schedule::OneFOneB.actions(3, 4, 3);
        use Action::{Backward as B, Forward as F};
        assert_eq!(actions, [F(0), B(0), F(1), B(1), F(2), B(2)]);
    }

    #[test]
    fn ideal_bubble_matches_the_formula() {
        assert!((Schedule::ideal_bubble(2, 8) - 1.0 / 9.0).abs() < 1e-12);
        assert_eq!(Schedule::ideal_bubble(1, 8), 0.0);
    }
}
