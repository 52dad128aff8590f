//! Every collective, every float dtype, sizes 0, 1, odd and large, 1–4
//! in-process ranks, against a naive reference computed in f64.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_parallel::{run_in_process, CommOptions, LaunchOptions, ParallelError, ReduceOp, Result};
use brasa_tensor::{DType, Tensor};
use proptest::prelude::*;
use std::time::Duration;

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const SIZES: [usize; 5] = [0, 1, 17, 1000, 70_001];

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(20)), threads_per_rank: Some(1) }
}

fn setup() {
    brasa_parallel::ensure_host_devices(4).unwrap();
}

/// Rank `rank`'s input value at element `i`: small integers and halves, so
/// every dtype represents inputs and sums exactly.
fn value(rank: usize, i: usize) -> f64 {
    ((i * 7 + rank * 13) % 23) as f64 * 0.5 - 5.0
}

fn input(rank: usize, n: usize, dtype: DType, comm: &brasa_parallel::Communicator) -> Result<Tensor> {
    let data: Vec<f64> = (0..n).map(|i| value(rank, i)).collect();
    Ok(Tensor::from_vec_on(data, [n], comm.device())?.to_dtype(dtype)?)
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.to_vec::<f64>()?)
}

fn reference(op: ReduceOp, world: usize, i: usize) -> f64 {
    let values = (0..world).map(|r| value(r, i));
    match op {
        ReduceOp::Sum => values.sum(),
        ReduceOp::Avg => values.sum::<f64>() / world as f64,
        ReduceOp::Max => values.fold(f64::MIN, f64::max),
        ReduceOp::Min => values.fold(f64::MAX, f64::min),
    }
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        _ => 1e-6,
    }
}

fn check_all_reduce(world: usize, n: usize, dtype: DType, op: ReduceOp) -> Result<()> {
    run_in_process(world, &options(), |comm| {
        let x = input(comm.rank(), n, dtype, &comm)?;
        comm.all_reduce(&x, op)?;
        let got = values(&x)?;
        for (i, g) in got.iter().enumerate() {
            let want = reference(op, world, i);
            assert!((g - want).abs() <= tolerance(dtype) * want.abs().max(1.0), "{op:?} {dtype} i={i}: {g} vs {want}");
        }
        Ok(())
    })?;
    Ok(())
}

#[test]
fn all_reduce_every_op_dtype_size_and_world() -> Result<()> {
    setup();
    for world in 1..=4 {
        for dtype in DTYPES {
            for n in SIZES {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                    check_all_reduce(world, n, dtype, op)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn broadcast_all_gather_reduce_scatter() -> Result<()> {
    setup();
    for world in 1..=4 {
        for dtype in DTYPES {
            for n in SIZES {
                run_in_process(world, &options(), |comm| {
                    let rank = comm.rank();
                    // broadcast from the last rank
                    let root = world - 1;
                    let x = input(rank, n, dtype, &comm)?;
                    comm.broadcast(&x, root)?;
                    assert_eq!(values(&x)?, values(&input(root, n, dtype, &comm)?)?);
                    // all_gather, out of place
                    let mine = input(rank, n, dtype, &comm)?;
                    let all = Tensor::zeros_on([world * n], dtype, comm.device())?;
                    comm.all_gather(&all, &mine)?;
                    let got = values(&all)?;
                    for r in 0..world {
                        assert_eq!(got[r * n..(r + 1) * n], values(&input(r, n, dtype, &comm)?)?[..]);
                    }
                    // all_gather in place: the input is this rank's slot
                    let flat = Tensor::zeros_on([world * n], dtype, comm.device())?;
                    let slot = flat.narrow(0, rank * n, n)?;
                    slot.copy_(&mine)?;
                    comm.all_gather(&flat, &slot)?;
                    assert_eq!(values(&flat)?, got);
                    // reduce_scatter: slice r of every input, summed, to rank r
                    let big = input(rank, world * n, dtype, &comm)?;
                    let out = Tensor::zeros_on([n], dtype, comm.device())?;
                    comm.reduce_scatter(&out, &big, ReduceOp::Sum)?;
                    for (i, g) in values(&out)?.iter().enumerate() {
                        let want = reference(ReduceOp::Sum, world, rank * n + i);
                        assert!((g - want).abs() <= tolerance(dtype) * want.abs().max(1.0));
                    }
                    comm.barrier()?;
                    Ok(())
                })?;
            }
        }
    }
    Ok(())
}

#[test]
fn send_recv_in_a_ring_and_async_overlap() -> Result<()> {
    setup();
    for world in 2..=4 {
        run_in_process(world, &options(), |comm| {
            let (rank, n) = (comm.rank(), 1001);
            let next = (rank + 1) % world;
            let prev = (rank + world - 1) % world;
            let out = input(rank, n, DType::F32, &comm)?;
            let into = Tensor::zeros_on([n], DType::F32, comm.device())?;
            // Even ranks send first, odd ranks receive first: no deadlock
            // even though each operation waits for its partner.
            if rank % 2 == 0 {
                comm.send(&out, next)?;
                comm.recv(&into, prev)?;
            } else {
                comm.recv(&into, prev)?;
                comm.send(&out, next)?;
            }
            assert_eq!(into.to_vec::<f32>()?, input(prev, n, DType::F32, &comm)?.to_vec::<f32>()?);
            // Several non-blocking all-reduces in flight, waited in order.
            let xs: Vec<Tensor> = (0..4).map(|_| input(rank, 5000, DType::F32, &comm)).collect::<Result<_>>()?;
            let works: Vec<_> = xs.iter().map(|x| comm.all_reduce_async(x, ReduceOp::Sum)).collect();
            for work in works {
                work.wait()?;
            }
            for x in &xs {
                assert_eq!(values(x)?[3], reference(ReduceOp::Sum, world, 3));
            }
            Ok(())
        })?;
    }
    Ok(())
}

#[test]
fn mismatched_sizes_and_dtypes_name_both_ranks() -> Result<()> {
    setup();
    let errors = run_in_process(2, &options(), |comm| {
        let n = if comm.rank() == 0 { 10 } else { 12 };
        let x = Tensor::zeros_on([n], DType::F32, comm.device())?;
        Ok(comm.all_reduce(&x, ReduceOp::Sum).err())
    })?;
    let e0 = errors[0].as_ref().expect("rank 0 refuses");
    assert!(
        matches!(e0, ParallelError::Mismatch { op: "all_reduce", rank: 0, ours, peer: 1, theirs }
            if ours.contains("10 f32") && theirs.contains("12 f32")),
        "{e0:?}"
    );
    let errors = run_in_process(2, &options(), |comm| {
        let dtype = if comm.rank() == 0 { DType::F32 } else { DType::BF16 };
        let x = Tensor::zeros_on([4], dtype, comm.device())?;
        Ok(comm.all_reduce(&x, ReduceOp::Sum).err())
    })?;
    let e1 = errors[1].as_ref().expect("rank 1 refuses");
    assert!(
        matches!(e1, ParallelError::Mismatch { op: "all_reduce", rank: 1, ours, peer: 0, theirs }
            if ours.contains("4 bf16") && theirs.contains("4 f32")),
        "{e1:?}"
    );
    Ok(())
}

#[test]
fn bad_arguments_are_errors_at_submission() -> Result<()> {
    setup();
    run_in_process(2, &options(), |comm| {
        let x = Tensor::zeros_on([4], DType::I64, comm.device())?;
        // Each refusal is an `Invalid` of the call, its message naming what was wrong.
        let e = comm.all_reduce(&x, ReduceOp::Sum).unwrap_err();
        assert!(matches!(&e, ParallelError::Invalid { op: "all_reduce", message } if message.contains("i64")), "{e:?}");
        let y = Tensor::zeros_on([4], DType::F32, comm.device())?;
        let e = comm.broadcast(&y, 5).unwrap_err();
        assert!(
            matches!(&e, ParallelError::Invalid { op: "broadcast", message } if message.contains("root 5")),
            "{e:?}"
        );
        let wrong = Tensor::zeros_on([7], DType::F32, comm.device())?;
        let e = comm.all_gather(&wrong, &y).unwrap_err();
        assert!(
            matches!(&e, ParallelError::Invalid { op: "all_gather", message } if message.contains("world size 2")),
            "{e:?}"
        );
        let other = Tensor::zeros_on([4], DType::F32, brasa_tensor::Device::cpu(1 - comm.rank()))?;
        let e = comm.all_reduce(&other, ReduceOp::Sum).unwrap_err();
        assert!(
            matches!(&e, ParallelError::Invalid { op: "all_reduce", message } if message.contains("works on cpu")),
            "{e:?}"
        );
        let t = Tensor::zeros_on([2, 3], DType::F32, comm.device())?.t()?;
        let e = comm.all_reduce(&t, ReduceOp::Sum).unwrap_err();
        assert!(
            matches!(&e, ParallelError::Invalid { op: "all_reduce", message } if message.contains("not contiguous")),
            "{e:?}"
        );
        let e = comm.send(&y, comm.rank()).unwrap_err();
        assert!(matches!(&e, ParallelError::Invalid { op: "send", message } if message.contains("itself")), "{e:?}");
        // The communicator still works after refused submissions.
        comm.all_reduce(&y, ReduceOp::Sum)?;
        Ok(())
    })?;
    Ok(())
}

#[test]
fn a_rank_that_returns_early_fails_its_peers_fast() -> Result<()> {
    setup();
    let start = std::time::Instant::now();
    let long =
        LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(60)), threads_per_rank: Some(1) };
    let result = run_in_process(3, &long, |comm| {
        if comm.rank() == 2 {
            return Ok(None); // returns without taking part: its communicator drops
        }
        let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
        Ok(comm.all_reduce(&x, ReduceOp::Sum).err())
    })?;
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    for error in result.into_iter().take(2) {
        match error {
            Some(ParallelError::PeerFailed { peer: 2, .. }) => {}
            other => panic!("expected PeerFailed from rank 2, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn a_rank_that_errors_or_panics_fails_the_others() -> Result<()> {
    setup();
    let result = run_in_process(2, &options(), |comm| {
        if comm.rank() == 1 {
            return Err(ParallelError::invalid("test", "rank 1 gives up"));
        }
        let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
        comm.all_reduce(&x, ReduceOp::Sum)?;
        Ok(())
    });
    // Rank 0 fails too (rank 1 left its all-reduce), but rank 1's own
    // error is the one that explains the failure.
    assert!(
        matches!(&result, Err(ParallelError::Invalid { op: "test", message }) if message == "rank 1 gives up"),
        "{result:?}"
    );
    // The same through autograd: rank 0's collective fails inside a
    // backward (as a DDP hook's does), rank 1 panics before it.
    let result = run_in_process(2, &options(), |comm| {
        if comm.rank() == 1 {
            panic!("rank 1 exploded");
        }
        let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
        let error = comm.all_reduce(&x, ReduceOp::Sum).unwrap_err();
        Err::<(), _>(ParallelError::Autograd(brasa_autograd::AutogradError::external(error)))
    });
    assert!(matches!(&result, Err(ParallelError::RankPanicked { rank: 1, message }) if message.contains("exploded")));
    let result = run_in_process(2, &options(), |comm| {
        if comm.rank() == 0 {
            panic!("rank 0 exploded");
        }
        let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
        comm.all_reduce(&x, ReduceOp::Sum)
    });
    match result {
        Err(ParallelError::RankPanicked { rank: 0, message }) => assert!(message.contains("exploded")),
        other => panic!("expected RankPanicked, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_stalled_rank_times_out_and_breaks_the_communicator() -> Result<()> {
    setup();
    let short =
        LaunchOptions { comm: CommOptions::default().timeout(Duration::from_millis(300)), threads_per_rank: Some(1) };
    let start = std::time::Instant::now();
    let outcomes = run_in_process(2, &short, |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500)); // stalls past the timeout
            let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
            return Ok(comm.all_reduce(&x, ReduceOp::Sum).err());
        }
        let x = Tensor::zeros_on([8], DType::F32, comm.device())?;
        let first = comm.all_reduce(&x, ReduceOp::Sum).err();
        assert!(matches!(first, Some(ParallelError::Timeout { rank: 0, .. })), "{first:?}");
        assert!(comm.is_broken());
        let again = comm.all_reduce(&x, ReduceOp::Sum).err();
        assert!(matches!(again, Some(ParallelError::Broken { .. })), "{again:?}");
        Ok(None)
    })?;
    // Rank 1 arrives late and finds rank 0 gone.
    assert!(matches!(outcomes[1], Some(ParallelError::PeerFailed { rank: 1, peer: 0, .. })), "{:?}", outcomes[1]);
    assert!(start.elapsed() < Duration::from_secs(10));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn all_reduce_sum_matches_reference_for_any_size(world in 1usize..=4, n in 0usize..5000) {
        setup();
        check_all_reduce(world, n, DType::F32, ReduceOp::Sum).unwrap();
    }
}
