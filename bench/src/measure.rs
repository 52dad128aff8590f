//! Figures and the small timing helpers every group uses.

use std::time::Instant;

/// How the figures are run.
pub struct Options {
    /// Shorter measurements for a smoke run.
    pub quick: bool,
    /// Only figures whose names start with one of these (`--filter
    /// cuda.,nccl.`); none: every figure.
    pub filters: Vec<String>,
}

impl Options {
    /// `full` repetitions normally, `quick` with `--quick`.
    pub fn reps(&self, full: usize, quick: usize) -> usize {
        if self.quick {
            quick
        } else {
            full
        }
    }

    /// The filters of `--filter`'s comma-separated prefixes.
    pub fn parse_filters(arg: &str) -> Vec<String> {
        arg.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect()
    }

    /// Whether a figure with this name, or a group of figures whose names
    /// start with this prefix, will be printed.
    pub fn wants(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.starts_with(f.as_str()) || f.starts_with(name))
    }

    /// Whether this figure passes the filters.
    pub fn prints(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.starts_with(f.as_str()))
    }
}

/// Whether a larger or a smaller value is better.
#[derive(Clone, Copy)]
pub enum Better {
    Higher,
    Lower,
}

/// One published figure.
pub struct Figure {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
    pub better: Better,
}

impl Figure {
    pub fn new(name: &'static str, value: f64, unit: &'static str, better: Better) -> Self {
        eprintln!("  {name} = {value:.3} {unit}");
        Figure { name, value, unit, better }
    }

    pub fn to_json(&self) -> String {
        serde_json::json!({
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "better": match self.better { Better::Higher => "higher", Better::Lower => "lower" },
        })
        .to_string()
    }
}

/// Seconds taken by `f`.
pub fn time(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

/// What a figure's measurement can fail with: any error, reported by `main`.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Seconds taken by `f`, or the first error it returns.
pub fn try_time<E>(f: impl FnOnce() -> Result<(), E>) -> Result<f64, E> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_secs_f64())
}

/// The median of some samples (they are sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// brasa's median as `value_name` (in `unit`) and, when PyTorch ran, the
/// ratio of the two medians as `ratio_name`; `better` says which way both
/// point (rates: higher; times: lower). Nothing when brasa has no sample.
pub fn value_and_ratio(
    value_name: &'static str,
    unit: &'static str,
    ratio_name: &'static str,
    better: Better,
    ours: &mut [f64],
    theirs: &mut [f64],
) -> Vec<Figure> {
    if ours.is_empty() {
        return Vec::new();
    }
    let value = median(ours);
    let mut figures = vec![Figure::new(value_name, value, unit, better)];
    if !theirs.is_empty() {
        figures.push(Figure::new(ratio_name, value / median(theirs), "x", better));
    }
    figures
}

/// A small deterministic generator (xorshift64*) for benchmark inputs.
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The interpreter that runs the PyTorch peer scripts: `$BRASA_TORCH_PYTHON`,
/// else `python3`.
pub fn torch_python() -> String {
    std::env::var("BRASA_TORCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The path of a PyTorch peer script of `bench/peers/`: under
/// `$BRASA_PEERS_DIR` when set (a binary run away from its checkout), else
/// in this crate's folder.
pub fn peer_script(name: &str) -> String {
    let dir = std::env::var("BRASA_PEERS_DIR").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/peers").into());
    format!("{dir}/{name}")
}

/// Runs `step(0..steps)` in five timed chunks and returns each chunk's rate
/// (`items_per_step` per call, per second): a noisy moment moves one sample,
/// not the median. Stops at the first error.
pub fn chunk_rates<E>(
    steps: usize,
    items_per_step: usize,
    mut step: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    let chunk = (steps / 5).max(1);
    let (mut rates, mut done) = (Vec::new(), 0);
    while done < steps {
        let n = chunk.min(steps - done);
        let mut outcome = Ok(());
        let seconds = time(|| {
            for i in 0..n {
                outcome = step(done + i);
                if outcome.is_err() {
                    break;
                }
            }
        });
        outcome?;
        rates.push((n * items_per_step) as f64 / seconds);
        done += n;
    }
    Ok(rates)
}

/// For a worker process that times brasa's training steps against
/// PyTorch's: its main thread joins the host's thread pool
/// (`brasa_tensor::threads::init_threads`), as PyTorch's main thread does
/// in its OpenMP regions. `BRASA_POOL_APART=1` leaves the pool's threads
/// apart, for comparison.
pub fn join_host_pool() -> brasa_tensor::Result<()> {
    if std::env::var_os("BRASA_POOL_APART").is_none() {
        brasa_tensor::threads::init_threads(None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Options;

    #[test]
    fn comma_separated_filters_select_groups_and_figures() {
        let options = Options { quick: true, filters: Options::parse_filters("cuda.,nccl.allreduce") };
        assert!(options.wants("cuda.") && options.wants("nccl.") && options.wants("cuda.sdpa_vs_torch"));
        assert!(!options.wants("alloc.") && !options.wants("nccl.ddp_step_ms"));
        assert!(options.prints("nccl.allreduce_us") && options.prints("cuda.mlp_train_vs_torch"));
        assert!(!options.prints("nccl.ddp_step_ms"));
        let all = Options { quick: false, filters: Options::parse_filters("") };
        assert!(all.wants("alloc.") && all.prints("anything"));
    }
}
