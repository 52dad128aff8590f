//! `brasa-bench`: the end-to-end figures that `cargo xtask bench` collects.
//!
//! Each figure prints as one JSON line on stdout:
//! `{"name": "alloc.cached_pair_ns", "value": 41.2, "unit": "ns", "better": "lower"}`.
//! Progress goes to stderr. Options: `--filter PREFIX` runs the figures whose
//! names start with PREFIX; `--quick` shortens every measurement.

mod alloc_figures;
mod measure;

use measure::{Figure, Options};

/// A group of figures sharing a name prefix and a setup.
struct Group {
    prefix: &'static str,
    run: fn(&Options) -> Vec<Figure>,
}

const GROUPS: &[Group] = &[Group { prefix: "alloc.", run: alloc_figures::run }];

fn main() {
    let mut options = Options { quick: false, filter: String::new() };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--filter" => options.filter = args.next().unwrap_or_default(),
            other => {
                eprintln!("brasa-bench: unknown option `{other}` (expected --filter PREFIX, --quick)");
                std::process::exit(2);
            }
        }
    }
    for group in GROUPS {
        let wanted = group.prefix.starts_with(&options.filter) || options.filter.starts_with(group.prefix);
        if !wanted {
            continue;
        }
        for figure in (group.run)(&options) {
            if figure.name.starts_with(&options.filter) {
                println!("{}", figure.to_json());
            }
        }
    }
}
