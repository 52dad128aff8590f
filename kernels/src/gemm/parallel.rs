//! Several threads on one product, sharing the packed panels of B.
//!
//! The product is cut into steps, one per `(jc, pc)` block of B. In each
//! step the threads first pack the `kc x nc` panel of B together (claiming
//! slivers from a counter), then multiply it with blocks of rows of A, again
//! claimed from a counter, each thread packing its own A block. Nothing is
//! packed twice, and a thread slowed by a busy neighbour simply claims fewer
//! blocks.
//!
//! Waits are only ever on work that another thread has already claimed and
//! is running, never on work not yet started: a thread that is late (or
//! never starts, because the pool is busy) leaves its share to the others,
//! so the scheme cannot deadlock whatever rayon does with the tasks.
//!
//! Ordering: a step packs into one of two B buffers (alternating), so packing
//! step `s` waits until every block of step `s - 2` is done; a block of rows
//! at depth step `pc > 0` waits for the same block at the previous depth step,
//! because both add into the same tile of C.

use super::buffer::{with_buffer, Slot};
use super::element::{Compute, Packed};
use super::pack::PackInto;
use super::product::{macro_kernel, packed_depth, ranges, Plan, Product};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One `(jc, pc)` block of B.
struct Step {
    jc: usize,
    ncb: usize,
    pc: usize,
    kcb: usize,
}

/// The shared B buffers: written in disjoint slivers, read after the
/// writers have published them.
struct SharedBuf<T>(*mut T);

// SAFETY: access is coordinated by the step counters (disjoint writes,
// reads only after an Acquire of the writers' Release); see the module doc.
unsafe impl<T: Send> Sync for SharedBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedBuf<T> {}

struct Shared<'p, 'a, T, P, S> {
    plan: &'p Plan<T, P>,
    p: Product<'a, T, S>,
    steps: Vec<Step>,
    blocks: Vec<(usize, usize)>,
    a_len: usize,
    b_bufs: SharedBuf<P>,
    b_half: usize,
    slivers_per_claim: usize,
    b_claimed: Vec<AtomicUsize>,
    b_packed: Vec<AtomicUsize>,
    block_claimed: Vec<AtomicUsize>,
    blocks_done: Vec<AtomicUsize>,
    block_done: Vec<AtomicBool>,
}

/// Spins briefly, then yields, until `ready()`.
fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        if spins < 128 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// Runs the product on up to `threads` rayon tasks sharing the packed B.
/// C must have at least `threads` row tiles (checked by the caller).
pub(crate) fn gemm_shared_b<T: Compute, P: Packed, S: PackInto<P>>(
    plan: &Plan<T, P>,
    threads: usize,
    p: Product<'_, T, S>,
) {
    let (m, n, k) = (p.c.rows, p.c.cols, p.a.cols());
    let (mr, nr) = (plan.kernel.mr, plan.kernel.nr);
    let blocking = plan.blocking_for(k);
    let mut steps = Vec::new();
    for jc in (0..n).step_by(blocking.nc) {
        for pc in (0..k).step_by(blocking.kc) {
            steps.push(Step { jc, ncb: blocking.nc.min(n - jc), pc, kcb: blocking.kc.min(k - pc) });
        }
    }
    // Blocks of rows: at most mc each, a multiple of `threads` of them so
    // that the threads finish a step together.
    let m_tiles = m.div_ceil(mr);
    let mc_tiles = blocking.mc / mr;
    let per_thread = m_tiles.div_ceil(threads * mc_tiles);
    let blocks = ranges(m, mr, (threads * per_thread).min(m_tiles));
    let kc_max = packed_depth::<P>(blocking.kc.min(k));
    let a_len = blocks.iter().map(|(lo, hi)| (hi - lo).div_ceil(mr) * mr).max().unwrap_or(0) * kc_max;
    let b_half = blocking.nc.min(n.div_ceil(nr) * nr) * kc_max;
    let slivers = blocking.nc.min(n).div_ceil(nr);
    let per_claim = (slivers / (4 * threads)).max(1);
    let counters = |len: usize| (0..len).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>();
    let nsteps = steps.len();
    let nblocks = blocks.len();

    with_buffer::<P, _>(Slot::B, 2 * b_half, |b_bufs| {
        let shared = Shared {
            plan,
            p,
            steps,
            blocks,
            a_len,
            b_bufs: SharedBuf(b_bufs.as_mut_ptr()),
            b_half,
            slivers_per_claim: per_claim,
            b_claimed: counters(nsteps),
            b_packed: counters(nsteps),
            block_claimed: counters(nsteps),
            blocks_done: counters(nsteps),
            block_done: (0..nsteps * nblocks).map(|_| AtomicBool::new(false)).collect(),
        };
        let shared = &shared;
        // The parts run on pool threads, as every other parallel op's do: a
        // caller outside the pool waits rather than works. Working on the
        // caller (`in_place_scope`) made `threads + 1` busy threads on
        // `threads` cores whenever the pool's other workers were still
        // spinning after the previous op: they took turns on one core, and
        // products in a training step ran at one core's speed about every
        // third call (the encoder workload's f32 step: 165 -> 230
        // samples/s on a 2-core AMD EPYC).
        rayon::scope(|s| {
            for _ in 1..threads {
                s.spawn(move |_| shared.work());
            }
            shared.work();
        });
    });
}

impl<T: Compute, P: Packed, S: PackInto<P>> Shared<'_, '_, T, P, S> {
    /// One thread's part: every step in order, helping where work is left.
    fn work(&self) {
        let kernel = &self.plan.kernel;
        let nblocks = self.blocks.len();
        with_buffer::<P, _>(Slot::A, self.a_len, |a_pack| {
            for (s, step) in self.steps.iter().enumerate() {
                self.pack_b(s, step);
                // SAFETY: B of step s is fully packed (pack_b waited for it)
                // and is not written again until every block of step s is
                // done, which includes the ones this thread runs.
                let b_pack = unsafe {
                    std::slice::from_raw_parts(
                        self.b_bufs.0.add((s % 2) * self.b_half),
                        step.ncb.div_ceil(kernel.nr) * kernel.nr * packed_depth::<P>(step.kcb),
                    )
                };
                let beta = if step.pc == 0 { self.p.beta } else { T::ONE };
                loop {
                    let x = self.block_claimed[s].fetch_add(1, Ordering::Relaxed);
                    if x >= nblocks {
                        break;
                    }
                    if step.pc > 0 {
                        // The same rows at the previous depth add into the same C.
                        wait_until(|| self.block_done[(s - 1) * nblocks + x].load(Ordering::Acquire));
                    }
                    let (i0, i1) = self.blocks[x];
                    S::pack(a_pack, self.p.a.sub(i0, step.pc, i1 - i0, step.kcb), kernel.mr, kernel.simd_pack);
                    // SAFETY: the block of C is inside C, and no other thread
                    // writes it now (blocks are disjoint; same-block steps
                    // are ordered by the wait above).
                    let c_block = unsafe { self.p.c.sub(i0, step.jc, i1 - i0, step.ncb) };
                    macro_kernel(kernel, packed_depth::<P>(step.kcb), a_pack, b_pack, self.p.alpha, beta, c_block);
                    self.block_done[s * nblocks + x].store(true, Ordering::Release);
                    self.blocks_done[s].fetch_add(1, Ordering::Release);
                }
            }
        });
    }

    /// Packs B of step `s` together with the other threads; returns once it
    /// is complete.
    fn pack_b(&self, s: usize, step: &Step) {
        let nr = self.plan.kernel.nr;
        let nblocks = self.blocks.len();
        let slivers = step.ncb.div_ceil(nr);
        let claims = slivers.div_ceil(self.slivers_per_claim);
        if s >= 2 && self.b_claimed[s].load(Ordering::Relaxed) < claims {
            // This buffer last held step s - 2: wait until nobody reads it.
            wait_until(|| self.blocks_done[s - 2].load(Ordering::Acquire) == nblocks);
        }
        loop {
            let q = self.b_claimed[s].fetch_add(1, Ordering::Relaxed);
            if q >= claims {
                break;
            }
            let j0 = q * self.slivers_per_claim * nr;
            let j1 = ((q + 1) * self.slivers_per_claim * nr).min(step.ncb);
            let kp = packed_depth::<P>(step.kcb);
            let offset = (s % 2) * self.b_half + j0 * kp;
            let len = (j1 - j0).div_ceil(nr) * nr * kp;
            debug_assert!(offset + len <= 2 * self.b_half);
            // SAFETY: claim q owns slivers j0..j1 of this step's buffer:
            // no other thread writes them, and nobody reads them before
            // b_packed reaches `claims` (published with Release below).
            let dst = unsafe { std::slice::from_raw_parts_mut(self.b_bufs.0.add(offset), len) };
            let b_part = self.p.b.sub(step.pc, step.jc + j0, step.kcb, j1 - j0);
            S::pack(dst, b_part.t(), nr, self.plan.kernel.simd_pack);
            self.b_packed[s].fetch_add(1, Ordering::Release);
        }
        wait_until(|| self.b_packed[s].load(Ordering::Acquire) == claims);
    }
}
