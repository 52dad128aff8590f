//! The AMX micro-kernel: one 32 x 32 tile of C, over the whole depth, held
//! in four tile registers.
//!
//! AMX (Sapphire Rapids and later Xeons) has eight tile registers of up to
//! 16 rows x 64 bytes and `TDPBF16PS`, which adds the product of a 16 x 32
//! bf16 tile of A and a 32 x 16 bf16 tile of B (stored as 16 rows of 16
//! pairs, "VNNI" layout) into a 16 x 16 f32 tile of C: 16,384 flops per
//! instruction, about 14 times the f32 FMA rate. The kernel keeps a 2 x 2
//! block of C tiles (tmm0-3) for the whole depth and streams A (tmm4-5) and
//! B (tmm6-7) through, 32 depth elements a step; C is stored once, at the
//! end, into a 32 x 32 f32 scratch.
//!
//! The instructions have no stable intrinsics yet, so the kernel is
//! `asm!`. The tile registers have no register class: no compiled code
//! touches them, which is what lets the tile configuration (loaded once per
//! thread and product, [`TileConfig::load`]) outlive one `asm!` block.
//!
//! [`emulated_tile`] is the same computation in plain Rust, on the same
//! packed layout: it lets the driver and the packing be tested on CPUs
//! without AMX, and it is the reference the hardware kernel is tested
//! against where AMX exists.

use super::element::Bf16Pair;

/// Rows (and columns) of C one kernel call computes.
pub(crate) const TILE_MN: usize = 32;
/// Rows of one tile register: a half of the 32 x 32 block.
pub(crate) const TILE_ROWS: usize = 16;
/// Depth elements (bf16) per step: one 64-byte tile row of A.
pub(crate) const TILE_K: usize = 32;
/// Pairs in one tile register (16 rows of 16 pairs: 1 KiB).
pub(crate) const PAIRS_PER_TILE: usize = TILE_ROWS * TILE_K / 2;
/// Pairs of one packed 32-wide panel per depth step (two tiles).
pub(crate) const PAIRS_PER_STEP: usize = 2 * PAIRS_PER_TILE;

/// `c[32 x 32, row-major] = A_panel * B_panel` over `steps` depth steps.
///
/// A panel: per step, two tiles (rows 0-15, then 16-31) of 16 rows x 16
/// depth pairs. B panel: per step, two tiles (columns 0-15, then 16-31) of
/// 16 depth pairs (rows) x 16 columns. See `amx_pack`.
///
/// # Safety
/// `a` and `b` hold `steps * PAIRS_PER_STEP` pairs, `c` 1024 writable f32;
/// for the hardware kernel, the CPU has AMX-BF16, the process has its
/// permission and this thread loaded the [`TileConfig`].
pub(crate) type TileKernelFn = unsafe fn(steps: usize, a: *const Bf16Pair, b: *const Bf16Pair, c: *mut f32);

/// A tile kernel and whether it needs the tile configuration loaded.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    pub func: TileKernelFn,
    pub hardware: bool,
}

impl TileKernel {
    /// The AMX kernel (callers check `cpu_features().amx_bf16`).
    #[cfg(target_arch = "x86_64")]
    pub fn amx() -> TileKernel {
        TileKernel { func: amx_tile, hardware: true }
    }

    /// The plain-Rust kernel with the same inputs and outputs.
    #[cfg(test)]
    pub fn emulated() -> TileKernel {
        TileKernel { func: emulated_tile, hardware: false }
    }

    /// Loads this thread's tile configuration if the kernel needs it; it is
    /// released when the guard drops.
    pub fn configure(&self) -> Option<TileConfig> {
        #[cfg(target_arch = "x86_64")]
        if self.hardware {
            // SAFETY: a hardware kernel is only built where the CPU has AMX
            // and the process holds the permission (`TileKernel::amx`'s
            // callers check `cpu_features().amx_bf16`).
            return Some(unsafe { TileConfig::load() });
        }
        None
    }
}

/// The `LDTILECFG` block: palette 1, eight tiles of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct ConfigBlock {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// This thread's tiles, configured; `TILERELEASE` on drop. Not `Send`: the
/// configuration belongs to the thread that loaded it.
pub(crate) struct TileConfig(std::marker::PhantomData<*const ()>);

impl TileConfig {
    /// # Safety
    /// The CPU has AMX and the process holds the permission to use it.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load() -> TileConfig {
        let mut block = ConfigBlock { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            block.colsb[t] = 64;
            block.rows[t] = TILE_ROWS as u8;
        }
        // SAFETY: the block is a valid palette-1 configuration, 64-byte
        // aligned; AMX is usable (caller's contract).
        unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) &block, options(nostack, readonly)) };
        TileConfig(std::marker::PhantomData)
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the configuration was loaded on this thread (the guard is
        // not Send); releasing it touches tile state only.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// The hardware kernel.
///
/// # Safety
/// See [`TileKernelFn`]; `steps >= 1`.
#[cfg(target_arch = "x86_64")]
unsafe fn amx_tile(steps: usize, a: *const Bf16Pair, b: *const Bf16Pair, c: *mut f32) {
    debug_assert!(steps >= 1);
    // Both panels advance 2 KiB (two 1 KiB tiles) per step; tile rows are
    // 64 bytes apart; C rows 128 bytes (32 f32).
    // SAFETY: the caller's contract: the panels hold `steps` steps, C 32
    // rows of 32 f32, and this thread loaded the tile configuration.
    unsafe {
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {s64}]",
            "tileloadd tmm6, [{b} + {s64}]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b} + {s64} + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a} + {s64} + 1024]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {b}, 2048",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c} + {s128}], tmm0",
            "tilestored [{c} + {s128} + 64], tmm1",
            "tilestored [{c} + {s128} + 2048], tmm2",
            "tilestored [{c} + {s128} + 2112], tmm3",
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            n = inout(reg) steps => _,
            c = in(reg) c,
            s64 = in(reg) 64usize,
            s128 = in(reg) 128usize,
            options(nostack),
        );
    }
}

/// [`amx_tile`] in plain Rust: each pair product is exact in f32 (bf16 has
/// 8 significant bits), summed in a different order than the hardware's.
///
/// # Safety
/// See [`TileKernelFn`].
#[cfg(test)]
unsafe fn emulated_tile(steps: usize, a: *const Bf16Pair, b: *const Bf16Pair, c: *mut f32) {
    // SAFETY: the caller's contract on the lengths.
    let (a, b, c) = unsafe {
        (
            std::slice::from_raw_parts(a, steps * PAIRS_PER_STEP),
            std::slice::from_raw_parts(b, steps * PAIRS_PER_STEP),
            std::slice::from_raw_parts_mut(c, TILE_MN * TILE_MN),
        )
    };
    let half = |p: Bf16Pair, hi: bool| f32::from_bits(if hi { p.0 & 0xFFFF_0000 } else { p.0 << 16 });
    c.fill(0.0);
    for step in 0..steps {
        let a_step = &a[step * PAIRS_PER_STEP..][..PAIRS_PER_STEP];
        let b_step = &b[step * PAIRS_PER_STEP..][..PAIRS_PER_STEP];
        for i in 0..TILE_MN {
            // A tile i / 16, row i % 16: 16 pairs of depth.
            let a_row = &a_step[(i / TILE_ROWS) * PAIRS_PER_TILE + (i % TILE_ROWS) * 16..][..16];
            for j in 0..TILE_MN {
                let b_tile = &b_step[(j / TILE_ROWS) * PAIRS_PER_TILE..][..PAIRS_PER_TILE];
                let mut sum = 0.0f32;
                for (q, &ap) in a_row.iter().enumerate() {
                    let bp = b_tile[q * 16 + j % TILE_ROWS];
                    sum += half(ap, false) * half(bp, false) + half(ap, true) * half(bp, true);
                }
                c[i * TILE_MN + j] += sum;
            }
        }
    }
}

/// The in-register peak of `TDPBF16PS` on this thread, in GFLOP/s, over
/// about `duration`: four independent accumulator tiles, no memory.
///
/// # Safety
/// The CPU has AMX-BF16 and the process holds its permission.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn amx_peak_thread(duration: std::time::Duration) -> f64 {
    const ROUNDS: usize = 4096;
    // SAFETY: caller's contract.
    let _config = unsafe { TileConfig::load() };
    let start = std::time::Instant::now();
    let mut flops = 0.0;
    while start.elapsed() < duration {
        // SAFETY: tiles configured above; tile registers only.
        unsafe {
            std::arch::asm!(
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                "2:",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) ROUNDS => _,
                options(nostack, nomem),
            )
        };
        // 4 products of 16 x 16 x 32, two flops each.
        flops += (ROUNDS * 4 * 16 * 16 * 32 * 2) as f64;
    }
    flops / start.elapsed().as_secs_f64() / 1e9
}
