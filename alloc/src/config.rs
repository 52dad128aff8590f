//! Allocator configuration: a builder, and `BRASA_ALLOC_CONF` in the same
//! `key:value,key:value` format as `PYTORCH_ALLOC_CONF`.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `max_split_size_mb` | unlimited | blocks of at least this size are never split (≥ 20) |
//! | `max_non_split_rounding_mb` | 20 | an oversize block serves an oversize request only if it wastes less than this |
//! | `roundup_power2_divisions` | 0 (off) | `4`, or per size interval: `[256:1,512:2,1024:4,>:8]` (sizes in MB, powers of two) |
//! | `garbage_collection_threshold` | 0 (off) | in (0, 1): with a memory fraction set, free old cached blocks once reserved passes this share of the allowed memory |
//! | `per_process_memory_fraction` | 1 (off) | in (0, 1]: the share of the device's capacity this allocator may reserve |
//! | `expandable_segments` | False | `True`: one growing segment per stream and pool, backed page by page (needs a backend with address-range mapping; others keep fixed segments) |

use crate::sizes::LARGE_BUFFER;

const MIB: usize = 1 << 20;

/// Number of size intervals for `roundup_power2_divisions`: one per power of
/// two from 1 MiB to 64 GiB (the first also covers smaller sizes, the last
/// larger ones).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// The keys `BRASA_ALLOC_CONF` accepts.
pub const VALID_KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "expandable_segments",
];

/// The environment variable read by [`AllocatorConfig::from_env`].
pub const ENV_VAR: &str = "BRASA_ALLOC_CONF";

/// A configuration that could not be accepted, with the reason and what is valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allocator configuration: {0}")]
pub struct ConfigError(String);

/// How the caching allocator rounds, splits and collects.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of at least this many bytes are never split (`usize::MAX`: off).
    pub max_split_size: usize,
    /// An oversize block serves an oversize request only when it wastes less
    /// than this many bytes.
    pub max_non_split_rounding: usize,
    /// Divisions between powers of two, per size interval (0 or 1: off).
    pub roundup_power2_divisions: [usize; ROUNDUP_POWER2_INTERVALS],
    /// Garbage-collection threshold in (0, 1); 0 is off.
    pub garbage_collection_threshold: f64,
    /// Share of the device's capacity the allocator may reserve, in (0, 1].
    pub memory_fraction: f64,
    /// One growing segment per stream and pool, mapped page by page, instead
    /// of fixed segments (used when the backend can map address ranges).
    pub expandable_segments: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: usize::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            memory_fraction: 1.0,
            expandable_segments: false,
        }
    }
}

impl AllocatorConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> AllocatorConfigBuilder {
        AllocatorConfigBuilder { config: AllocatorConfig::default(), error: None }
    }

    /// The defaults, overridden by `BRASA_ALLOC_CONF` when it is set.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(ENV_VAR) {
            Ok(text) => Self::from_conf_str(&text).map_err(|e| ConfigError(format!("{ENV_VAR}: {}", e.0))),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError(format!("{ENV_VAR} is not valid UTF-8"))),
        }
    }

    /// Parses `key:value,key:value` (the `PYTORCH_ALLOC_CONF` format).
    pub fn from_conf_str(text: &str) -> Result<Self, ConfigError> {
        let mut builder = Self::builder();
        for (key, value) in split_options(text)? {
            builder = match key {
                "max_split_size_mb" => builder.max_split_size_mb(parse_number(key, value)?),
                "max_non_split_rounding_mb" => builder.max_non_split_rounding_mb(parse_number(key, value)?),
                "roundup_power2_divisions" => {
                    let table = parse_divisions(value)?;
                    builder.roundup_power2_divisions_per_interval(table)
                }
                "garbage_collection_threshold" => builder.garbage_collection_threshold(parse_float(key, value)?),
                "per_process_memory_fraction" => builder.memory_fraction(parse_float(key, value)?),
                "expandable_segments" => builder.expandable_segments(parse_bool(key, value)?),
                "backend" | "release_lock_on_cudamalloc" | "pinned_use_cuda_host_register" => {
                    return Err(ConfigError(format!(
                        "`{key}` is a PyTorch option that brasa-alloc does not implement; valid keys: {}",
                        VALID_KEYS.join(", ")
                    )))
                }
                _ => return Err(ConfigError(format!("unknown key `{key}`; valid keys: {}", VALID_KEYS.join(", ")))),
            };
        }
        builder.build()
    }

    /// The number of power-of-two divisions that apply to a request of `size` bytes.
    #[inline]
    pub fn roundup_power2_divisions_for(&self, size: usize) -> usize {
        let log_size = (usize::BITS - 1 - size.max(1).leading_zeros()) as usize;
        let index = log_size.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// Bytes the allocator may reserve on a device of `capacity` bytes.
    pub fn allowed_bytes(&self, capacity: usize) -> usize {
        if self.memory_fraction >= 1.0 {
            capacity
        } else {
            (capacity as f64 * self.memory_fraction) as usize
        }
    }
}

/// Builds an [`AllocatorConfig`], checking every value.
#[derive(Debug, Clone)]
pub struct AllocatorConfigBuilder {
    config: AllocatorConfig,
    error: Option<ConfigError>,
}

impl AllocatorConfigBuilder {
    fn fail(mut self, message: String) -> Self {
        self.error.get_or_insert(ConfigError(message));
        self
    }

    /// Never split blocks of at least `mb` MiB (must be ≥ 20).
    pub fn max_split_size_mb(mut self, mb: usize) -> Self {
        if mb < LARGE_BUFFER / MIB {
            return self.fail(format!("max_split_size_mb must be at least {}, got {mb}", LARGE_BUFFER / MIB));
        }
        self.config.max_split_size = mb.saturating_mul(MIB);
        self
    }

    /// An oversize block serves an oversize request only if it wastes less than `mb` MiB.
    pub fn max_non_split_rounding_mb(mut self, mb: usize) -> Self {
        self.config.max_non_split_rounding = mb.saturating_mul(MIB);
        self
    }

    /// The same number of divisions for every size interval (a power of two, or 0 for off).
    pub fn roundup_power2_divisions(self, divisions: usize) -> Self {
        self.roundup_power2_divisions_per_interval([divisions; ROUNDUP_POWER2_INTERVALS])
    }

    /// Divisions per size interval (interval `i` holds sizes in [2^i MiB, 2^(i+1) MiB)).
    pub fn roundup_power2_divisions_per_interval(mut self, table: [usize; ROUNDUP_POWER2_INTERVALS]) -> Self {
        if let Some(bad) = table.iter().find(|d| **d != 0 && !d.is_power_of_two()) {
            return self.fail(format!("roundup_power2_divisions must be powers of two (or 0 for off), got {bad}"));
        }
        self.config.roundup_power2_divisions = table;
        self
    }

    /// Garbage-collection threshold in (0, 1); only active with a memory fraction below 1.
    pub fn garbage_collection_threshold(mut self, threshold: f64) -> Self {
        if !(threshold > 0.0 && threshold < 1.0) {
            return self.fail(format!("garbage_collection_threshold must lie in (0.0, 1.0), got {threshold}"));
        }
        self.config.garbage_collection_threshold = threshold;
        self
    }

    /// Share of the device capacity the allocator may reserve, in (0, 1].
    pub fn memory_fraction(mut self, fraction: f64) -> Self {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return self.fail(format!("per_process_memory_fraction must lie in (0.0, 1.0], got {fraction}"));
        }
        self.config.memory_fraction = fraction;
        self
    }

    /// Grow one segment per stream and pool page by page instead of
    /// reserving fixed segments (PyTorch's `expandable_segments`).
    pub fn expandable_segments(mut self, on: bool) -> Self {
        self.config.expandable_segments = on;
        self
    }

    /// The configuration, or the first invalid value given.
    pub fn build(self) -> Result<AllocatorConfig, ConfigError> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(self.config),
        }
    }
}

/// Splits `a:1,b:[x:1,y:2]` into pairs, keeping bracketed lists whole.
fn split_options(text: &str) -> Result<Vec<(&str, &str)>, ConfigError> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(|| ConfigError(format!("unbalanced `]` in `{text}`")))?,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(ConfigError(format!("unbalanced `[` in `{text}`")));
    }
    items.push(&text[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (key, value) =
                item.split_once(':').ok_or_else(|| ConfigError(format!("expected `key:value`, got `{item}`")))?;
            Ok((key.trim(), value.trim()))
        })
        .collect()
}

fn parse_number(key: &str, value: &str) -> Result<usize, ConfigError> {
    value.parse().map_err(|_| ConfigError(format!("`{key}` expects a whole number, got `{value}`")))
}

/// `True`/`False` as PyTorch writes them (any case, or 1/0).
fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ConfigError(format!("`{key}` expects True or False, got `{value}`"))),
    }
}

fn parse_float(key: &str, value: &str) -> Result<f64, ConfigError> {
    value.parse().map_err(|_| ConfigError(format!("`{key}` expects a number, got `{value}`")))
}

/// `4` (every interval) or `[256:1,512:2,>:8]`: entry `K:v` applies to sizes
/// from the previous entry's K (or 0) up to K MB; `>:v` to everything above the
/// last K. This is the meaning PyTorch's documentation gives.
fn parse_divisions(value: &str) -> Result<[usize; ROUNDUP_POWER2_INTERVALS], ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let Some(list) = value.strip_prefix('[') else {
        let divisions = parse_number(KEY, value)?;
        return Ok([divisions; ROUNDUP_POWER2_INTERVALS]);
    };
    let list =
        list.strip_suffix(']').ok_or_else(|| ConfigError(format!("`{KEY}` list must end with `]`, got `{value}`")))?;
    let mut table = [0; ROUNDUP_POWER2_INTERVALS];
    let mut next_interval = 0;
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (bound, divisions) = entry
            .split_once(':')
            .ok_or_else(|| ConfigError(format!("`{KEY}` entries are `size_mb:divisions`, got `{entry}`")))?;
        let divisions = parse_number(KEY, divisions.trim())?;
        let end = if bound.trim() == ">" {
            ROUNDUP_POWER2_INTERVALS
        } else {
            let mb = parse_number(KEY, bound.trim())?;
            if !mb.is_power_of_two() {
                return Err(ConfigError(format!("`{KEY}` sizes must be powers of two (in MB), got {mb}")));
            }
            let end = mb.trailing_zeros() as usize;
            if end >= ROUNDUP_POWER2_INTERVALS {
                return Err(ConfigError(format!("`{KEY}` sizes must be below 64 GB, got {mb} MB")));
            }
            end
        };
        if end < next_interval {
            return Err(ConfigError(format!("`{KEY}` sizes must increase, got `{value}`")));
        }
        table[next_interval..end].fill(divisions);
        next_interval = end;
    }
    AllocatorConfig::builder().roundup_power2_divisions_per_interval(table).build()?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_format() {
        let config = AllocatorConfig::from_conf_str(
            "max_split_size_mb:128, garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        )
        .unwrap();
        assert_eq!(config.max_split_size, 128 * MIB);
        assert_eq!(config.garbage_collection_threshold, 0.6);
        assert_eq!(config.memory_fraction, 0.5);
    }

    #[test]
    fn empty_string_is_the_default() {
        assert_eq!(AllocatorConfig::from_conf_str("").unwrap(), AllocatorConfig::default());
    }

    #[test]
    fn unknown_key_lists_the_valid_ones() {
        let error = AllocatorConfig::from_conf_str("max_split_size:128").unwrap_err().to_string();
        assert!(error.contains("unknown key `max_split_size`"), "{error}");
        for key in VALID_KEYS {
            assert!(error.contains(key), "{error}");
        }
    }

    #[test]
    fn unsupported_pytorch_key_says_so() {
        let error = AllocatorConfig::from_conf_str("backend:cudaMallocAsync").unwrap_err().to_string();
        assert!(error.contains("does not implement"), "{error}");
    }

    #[test]
    fn expandable_segments_take_pytorch_booleans() {
        assert!(AllocatorConfig::from_conf_str("expandable_segments:True").unwrap().expandable_segments);
        assert!(!AllocatorConfig::from_conf_str("expandable_segments:false").unwrap().expandable_segments);
        let error = AllocatorConfig::from_conf_str("expandable_segments:yes").unwrap_err().to_string();
        assert!(error.contains("expects True or False"), "{error}");
    }

    #[test]
    fn bad_values_are_errors() {
        for text in [
            "max_split_size_mb:10",
            "max_split_size_mb:big",
            "garbage_collection_threshold:1.0",
            "per_process_memory_fraction:0",
            "roundup_power2_divisions:3",
            "roundup_power2_divisions:[3:4]",
            "roundup_power2_divisions:[4:2,2:1]",
            "roundup_power2_divisions:[4:2",
            "max_split_size_mb",
        ] {
            assert!(AllocatorConfig::from_conf_str(text).is_err(), "{text} was accepted");
        }
    }

    #[test]
    fn divisions_list_follows_documented_intervals() {
        let config = AllocatorConfig::from_conf_str("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(config.roundup_power2_divisions_for(100 * MIB), 1);
        assert_eq!(config.roundup_power2_divisions_for(300 * MIB), 2);
        assert_eq!(config.roundup_power2_divisions_for(600 * MIB), 4);
        assert_eq!(config.roundup_power2_divisions_for(4096 * MIB), 8);
        assert_eq!(config.roundup_power2_divisions_for(1000), 1);
    }
}
