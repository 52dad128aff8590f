//! Property: for any properly nested sequence of ranges, on one thread or several,
//! the self times add up to the total time of the root ranges.

mod common;

use std::sync::Arc;

use brasa_profile::{record_function, ManualClock, Profiler, RangeGuard};
use common::exclusive;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Open(u8),
    Close,
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..6).prop_map(Op::Open),
        3 => Just(Op::Close),
        4 => (0u16..1_000).prop_map(Op::Advance),
    ]
}

const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn run(ops: &[Op], clock: &ManualClock) {
    let mut open: Vec<RangeGuard> = Vec::new();
    for op in ops {
        match op {
            Op::Open(n) => open.push(record_function(NAMES[*n as usize])),
            Op::Close => drop(open.pop()),
            Op::Advance(ns) => {
                clock.advance(u64::from(*ns));
            }
        }
    }
    while let Some(guard) = open.pop() {
        clock.advance(1);
        drop(guard);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn self_times_sum_to_root_totals(
        first in proptest::collection::vec(op(), 0..80),
        second in proptest::collection::vec(op(), 0..80),
    ) {
        let _lock = exclusive();
        let clock = ManualClock::new(0);
        let profiler = Profiler::builder()
            .clock(Arc::new(clock.clone()))
            .record_steps(false)
            .start()
            .unwrap();
        let other_clock = clock.clone();
        let second_ops = second.clone();
        let worker = std::thread::spawn(move || run(&second_ops, &other_clock));
        run(&first, &clock);
        worker.join().unwrap();
        let result = profiler.stop();

        let opens = first.iter().chain(&second).filter(|o| matches!(o, Op::Open(_))).count();
        prop_assert_eq!(result.ranges.len(), opens);
        let stats = result.range_stats();
        let self_sum: u64 = stats.iter().map(|s| s.self_ns).sum();
        let root_sum: u64 = result
            .ranges
            .iter()
            .zip(&stats)
            .filter(|(r, _)| r.parent.is_none())
            .map(|(_, s)| s.total_ns)
            .sum();
        prop_assert_eq!(self_sum, root_sum);
        prop_assert_eq!(result.key_averages().self_cpu_time_total_ns(), root_sum);
        for (i, r) in result.ranges.iter().enumerate() {
            prop_assert!(!r.truncated);
            prop_assert!(stats[i].self_ns <= stats[i].total_ns);
            if let Some(p) = r.parent {
                let parent = &result.ranges[p];
                prop_assert_eq!(parent.tid, r.tid);
                prop_assert!(parent.start_ns <= r.start_ns && r.end_ns <= parent.end_ns);
            }
        }
    }
}

#[test]
fn range_count_matches_opens() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let profiler = Profiler::builder().clock(Arc::new(clock.clone())).record_steps(false).start().unwrap();
    let ops = [Op::Open(0), Op::Open(1), Op::Advance(5), Op::Close, Op::Close, Op::Close, Op::Open(2)];
    run(&ops, &clock);
    let result = profiler.stop();
    assert_eq!(result.ranges.len(), 3);
    let stats = result.range_stats();
    assert_eq!(stats[0].total_ns, 5);
    assert_eq!(stats[0].self_ns, 0);
    assert_eq!(stats[2].total_ns, 1);
}
