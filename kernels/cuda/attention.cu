// Fused scaled dot-product attention, forward and backward: the
// FlashAttention-2 algorithm on the tensor cores (mma.sync m16n8k16, f16 or
// bf16 operands, f32 sums). See ABI.md, "attention".
//
// Forward (one block of 4 warps per 64 query rows of one (batch, head)):
// the queries stay in registers as mma A fragments; tiles of 64 keys and
// values stream through shared memory (cp.async: the value tile loads while
// the scores are computed, the next key tile while the softmax runs); each
// warp keeps its 16 rows' running maximum, partial sums and output
// accumulators in registers (the online softmax), and writes only the output
// and each row's log-sum-exp. The [L, S] scores never reach memory.
//
// Backward (one block per 64 keys): the key and value tiles stay in shared
// memory; tiles of 64 queries (with their output gradients, log-sum-exps and
// `delta = rowsum(dO ∘ O)`) stream through. Each warp recomputes its 16
// keys' probabilities from the saved log-sum-exp, accumulates dV and dK in
// registers, and the block adds its share of dQ = dS·K into an f32 buffer
// with atomics (FlashAttention-2's split).
//
// Masks: an optional additive f32 mask read through four strides (0 where a
// dim broadcasts), the top-left causal mask (query i sees keys j ≤ i) and
// the bounds L, S. A row that sees no key gets output 0, log-sum-exp +inf and
// zero gradients (what brasa's composed attention returns).
//
// Dropout: the keep decision of (batch-head bh, query i, key j) is bit
// (j % 4) of the Philox block at counter offset + (bh·L + i)·⌈S/4⌉ + j/4
// (key seed): word (j % 4) below keep_prob·2^32. Forward and backward draw
// the same decisions from the same (seed, offset); the caller reserves
// n·h·L·⌈S/4⌉ counters.
#include "common.cuh"
#include "philox.cuh"

// The forward's operands, mirrored by brasa_kernels::cuda_ptx::AttentionForward.
struct AttentionForward {
    const void* q;        // [n, h, L, E] through q_strides (last dim contiguous)
    const void* k;        // [n, h, S, E]
    const void* v;        // [n, h, S, Ev]
    const float* mask;    // additive, through mask_strides; null: none
    void* out;            // contiguous [n, h, L, Ev]
    float* lse;           // contiguous [n, h, L] (natural log)
    long long q_strides[3];  // n, h, row (elements)
    long long k_strides[3];
    long long v_strides[3];
    long long mask_strides[4];  // n, h, row, col
    long long heads, l, s, e, ev;
    float scale;          // applied to q·kᵀ
    float keep_prob;      // 1: no dropout
    long long causal;     // 0 or 1
    long long vectorized; // 1: every row start is 16-byte aligned and E, Ev are multiples of 8
    u64 seed, offset;     // dropout's Philox stream
};

// The backward's operands, mirrored by brasa_kernels::cuda_ptx::AttentionBackward.
struct AttentionBackward {
    const void* q;
    const void* k;
    const void* v;
    const float* mask;
    const void* grad;     // dO, contiguous [n, h, L, Ev]
    const float* lse;     // contiguous [n, h, L]
    const float* delta;   // rowsum(dO ∘ O), contiguous [n, h, L]
    float* dq;            // f32 accumulator, contiguous [n, h, L, E], zeroed by the caller
    void* dk;             // contiguous [n, h, S, E]
    void* dv;             // contiguous [n, h, S, Ev]
    long long q_strides[3];
    long long k_strides[3];
    long long v_strides[3];
    long long mask_strides[4];
    long long heads, l, s, e, ev;
    float scale;
    float keep_prob;
    long long causal;
    long long vectorized;
    u64 seed, offset;
};

static_assert(sizeof(AttentionForward) == 232, "AttentionForward must match its Rust mirror");
static_assert(sizeof(AttentionBackward) == 264, "AttentionBackward must match its Rust mirror");

namespace attn {

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int BR = 64;  // query rows per tile (16 per warp in the forward)
constexpr int BC = 64;  // key rows per tile (16 per warp in the backward)
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// Packs two f32 into the operand type's pair.
template <typename T> __device__ __forceinline__ unsigned int pack2(float a, float b);
template <> __device__ __forceinline__ unsigned int pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned int*>(&h);
}
template <> __device__ __forceinline__ unsigned int pack2<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned int*>(&h);
}

// c += a·b for one 16x8x16 tile (A row-major 16x16, B column-major 16x8).
template <typename T> __device__ __forceinline__ void mma(float (&c)[4], const unsigned int* a, const unsigned int* b);
template <> __device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma<__half>(float (&c)[4], const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned int smem_address(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// Four 8x8 b16 matrices from shared memory; lane t gives the address of row
// (t % 8) of matrix (t / 8). Without TRANS lane t receives row t/4, columns
// 2(t%4) and 2(t%4)+1 of each matrix; with TRANS the same of its transpose.
template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(unsigned int (&r)[4], const void* row) {
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_address(row)));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_address(row)));
    }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Loads rows [row0, row0 + ROWS) x columns [0, D) of a matrix whose row r
// starts at base + r·stride into shared memory tile[ROWS][D + 8], with zeros
// past `rows` and `cols`. Vectorized: 16-byte cp.async (asynchronous: the
// caller commits and waits); otherwise element by element (synchronous).
template <typename T, int ROWS, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* base, long long stride, long long row0, long long rows,
                                          long long cols, bool vectorized) {
    constexpr int PAD = D + 8;
    if (vectorized) {
        constexpr int CHUNKS = ROWS * D / 8;
        for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
            const int r = c / (D / 8), col = (c % (D / 8)) * 8;
            const bool valid = row0 + r < rows && col < cols;
            const T* src = valid ? base + (row0 + r) * stride + col : base;
            cp_async16(tile + r * PAD + col, src, valid);
        }
    } else {
        const T zero = Elem<T>::store(0.0f);
        for (int i = threadIdx.x; i < ROWS * D; i += THREADS) {
            const int r = i / D, col = i % D;
            tile[r * PAD + col] = (row0 + r < rows && col < cols) ? base[(row0 + r) * stride + col] : zero;
        }
    }
}

// Whether dropout keeps (bh, query i, key j). Only the *_dropout kernels
// draw (ten Philox rounds per pair of scores).
__device__ __forceinline__ bool keeps(u64 seed, u64 offset, long long bh, long long l, long long s, long long i,
                                      long long j, unsigned int threshold) {
    const long long quads = (s + 3) / 4;
    const Words w = philox4x32_10(offset + (u64)((bh * l + i) * quads + j / 4), seed);
    const unsigned int word = (j & 3) == 0 ? w.w0 : (j & 3) == 1 ? w.w1 : (j & 3) == 2 ? w.w2 : w.w3;
    return word < threshold;
}

// keep_prob · 2^32, saturated (keep_prob = 1 keeps everything).
__device__ __forceinline__ unsigned int keep_threshold(float keep_prob) {
    const double t = (double)keep_prob * 4294967296.0;
    return t >= 4294967295.0 ? 0xffffffffu : (unsigned int)t;
}

// Four warps of 16 query rows each (BR rows a block). DROPOUT compiles
// the dropout draws in (they cost registers even when skipped).
template <typename T, int D, bool DROPOUT>
__device__ __forceinline__ void forward(const AttentionForward& p) {
    constexpr int PAD = D + 8;
    static_assert(BR <= 2 * BC, "the query tile is staged through the key and value tiles");
    __shared__ __align__(16) T tiles[2 * BC * PAD];
    T* ks = tiles;
    T* vs = tiles + BC * PAD;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
    const int lm = lane / 8, lr = lane % 8;  // ldmatrix: matrix and row this lane addresses
    const long long bh = blockIdx.x;
    const long long n = bh / p.heads, h = bh % p.heads;
    // Causal blocks near the end see the most keys: run them first.
    const long long qblock = p.causal ? (long long)gridDim.y - 1 - blockIdx.y : blockIdx.y;
    const long long q0 = qblock * BR;
    const T* q = (const T*)p.q + n * p.q_strides[0] + h * p.q_strides[1];
    const T* k = (const T*)p.k + n * p.k_strides[0] + h * p.k_strides[1];
    const T* v = (const T*)p.v + n * p.v_strides[0] + h * p.v_strides[1];
    const float* mask = p.mask ? p.mask + n * p.mask_strides[0] + h * p.mask_strides[1] : nullptr;
    const bool vec = p.vectorized != 0;
    const unsigned int threshold = keep_threshold(p.keep_prob);
    const float keep_scale = p.keep_prob > 0.0f ? 1.0f / p.keep_prob : 0.0f;
    const float scale_log2 = p.scale * LOG2E;

    // The queries, through the tiles' memory, into A fragments.
    load_tile<T, BR, D>(tiles, q, p.q_strides[2], q0, p.l, p.e, vec);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned int qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4<false>(qf[kk], tiles + (warp * 16 + lr + (lm & 1) * 8) * PAD + kk * 16 + (lm >> 1) * 8);
    __syncthreads();

    long long kblocks = (p.s + BC - 1) / BC;
    if (p.causal) {
        const long long last_row = min(q0 + BR, p.l) - 1;
        kblocks = min(kblocks, last_row / BC + 1);
    }
    const long long row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // m in log2 units

    if (kblocks > 0) load_tile<T, BC, D>(ks, k, p.k_strides[2], 0, p.s, p.e, vec);
    cp_async_commit();
    for (long long j = 0; j < kblocks; ++j) {
        const long long k0 = j * BC;
        cp_async_wait<0>();
        __syncthreads();
        load_tile<T, BC, D>(vs, v, p.v_strides[2], k0, p.s, p.ev, vec);
        cp_async_commit();
        float s[BC / 8][4];
#pragma unroll
        for (int i = 0; i < BC / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < BC / 16; ++nt) {
                unsigned int b[4];
                ldmatrix_x4<false>(b, ks + (nt * 16 + lr + (lm >> 1) * 8) * PAD + kk * 16 + (lm & 1) * 8);
                mma<T>(s[2 * nt], qf[kk], b);
                mma<T>(s[2 * nt + 1], qf[kk], b + 2);
            }
        }
        __syncthreads();  // every warp is done with this key tile
        if (j + 1 < kblocks) load_tile<T, BC, D>(ks, k, p.k_strides[2], k0 + BC, p.s, p.e, vec);
        cp_async_commit();

        // Scores in log2 units, masked. Most tiles need no masking (no mask
        // tensor, every key < S, none past this warp's diagonal): one
        // multiply per score; the others take the general path. The
        // kernels are bound by instruction issue, not by the tensor cores,
        // so the per-score work decides their speed.
        float mx[2] = {-INFINITY, -INFINITY};
        const bool edge = mask != nullptr || k0 + BC > p.s || (p.causal && k0 + BC - 1 > q0 + warp * 16);
        if (!edge) {
#pragma unroll
            for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[nt][e] *= scale_log2;
                    mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
                }
            }
        } else {
            // Keys of this tile row r sees: below S, and with the causal mask up to its diagonal.
            int visible[2];
            const float* mask_row[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                long long v = min((long long)BC, p.s - k0);
                if (p.causal) v = min(v, max(row[r] - k0 + 1, 0LL));
                visible[r] = (int)v;
                mask_row[r] = mask != nullptr && row[r] < p.l ? mask + row[r] * p.mask_strides[2] : nullptr;
            }
#pragma unroll
            for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = nt * 8 + tig * 2 + (e & 1), r = e / 2;
                    float x = -INFINITY;
                    if (c < visible[r]) {
                        x = s[nt][e] * p.scale;
                        if (mask_row[r] != nullptr) x += mask_row[r][(k0 + c) * p.mask_strides[3]];
                        x *= LOG2E;
                    }
                    s[nt][e] = x;
                    mx[r] = fmaxf(mx[r], x);
                }
            }
        }
        float alpha[2], m_use[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r]);
            m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
            alpha[r] = exp2f(m_run[r] - m_use[r]);
            m_run[r] = m_new;
            l_run[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
        unsigned int pa[BC / 16][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            float pe[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pe[e] = exp2f(s[nt][e] - m_use[e / 2]);
                l_run[e / 2] += pe[e];
                if (DROPOUT) {
                    const long long i = row[e / 2], col = k0 + nt * 8 + tig * 2 + (e & 1);
                    const bool keep = i < p.l && col < p.s && keeps(p.seed, p.offset, bh, p.l, p.s, i, col, threshold);
                    pe[e] = keep ? pe[e] * keep_scale : 0.0f;
                }
            }
            pa[nt / 2][(nt & 1) * 2] = pack2<T>(pe[0], pe[1]);
            pa[nt / 2][(nt & 1) * 2 + 1] = pack2<T>(pe[2], pe[3]);
        }
        if (j + 1 < kblocks) {
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // the value tile is in
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
            for (int dt = 0; dt < D / 16; ++dt) {
                unsigned int b[4];
                ldmatrix_x4<true>(b, vs + (kk * 16 + lr + (lm & 1) * 8) * PAD + dt * 16 + (lm >> 1) * 8);
                mma<T>(o[2 * dt], pa[kk], b);
                mma<T>(o[2 * dt + 1], pa[kk], b + 2);
            }
        }
        __syncthreads();  // every warp is done with this value tile
    }
    cp_async_wait<0>();

    T* out = (T*)p.out + bh * p.l * p.ev;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const long long i = row[r];
        if (i >= p.l) continue;
        const bool empty = l_run[r] == 0.0f;
        const float inv = empty ? 0.0f : 1.0f / l_run[r];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            const long long d = dt * 8 + tig * 2;
            if (d < p.ev) out[i * p.ev + d] = Elem<T>::store(o[dt][r * 2] * inv);
            if (d + 1 < p.ev) out[i * p.ev + d + 1] = Elem<T>::store(o[dt][r * 2 + 1] * inv);
        }
        if (tig == 0) p.lse[bh * p.l + i] = empty ? INFINITY : m_run[r] * LN2 + logf(l_run[r]);
    }
}

template <typename T, int D, bool DROPOUT>
__device__ __forceinline__ void backward(const AttentionBackward& p) {
    constexpr int PAD = D + 8, SPAD = BR + 8;
    extern __shared__ __align__(16) unsigned char shared[];
    T* ks = (T*)shared;
    T* vs = ks + BC * PAD;
    T* qs = vs + BC * PAD;
    T* dos = qs + BR * PAD;
    T* dss = dos + BR * PAD;                       // dS, stored [key][query]
    float* lse_s = (float*)(dss + BC * SPAD);     // per query row of the tile, log2 units
    float* delta_s = lse_s + BR;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
    const int lm = lane / 8, lr = lane % 8;
    const long long bh = blockIdx.x;
    const long long n = bh / p.heads, h = bh % p.heads;
    const long long k0 = (long long)blockIdx.y * BC;
    const T* q = (const T*)p.q + n * p.q_strides[0] + h * p.q_strides[1];
    const T* k = (const T*)p.k + n * p.k_strides[0] + h * p.k_strides[1];
    const T* v = (const T*)p.v + n * p.v_strides[0] + h * p.v_strides[1];
    const T* dout = (const T*)p.grad + bh * p.l * p.ev;
    const float* mask = p.mask ? p.mask + n * p.mask_strides[0] + h * p.mask_strides[1] : nullptr;
    const bool vec = p.vectorized != 0;
    const unsigned int threshold = keep_threshold(p.keep_prob);
    const float keep_scale = p.keep_prob > 0.0f ? 1.0f / p.keep_prob : 0.0f;
    const float scale_log2 = p.scale * LOG2E;

    load_tile<T, BC, D>(ks, k, p.k_strides[2], k0, p.s, p.e, vec);
    load_tile<T, BC, D>(vs, v, p.v_strides[2], k0, p.s, p.ev, vec);
    cp_async_commit();

    const long long qblocks = (p.l + BR - 1) / BR;
    // With the causal mask queries before k0 see none of these keys.
    const long long first = p.causal ? min(k0 / BR, qblocks) : 0;
    const long long key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    for (long long qb = first; qb < qblocks; ++qb) {
        const long long q0 = qb * BR;
        load_tile<T, BR, D>(qs, q, p.q_strides[2], q0, p.l, p.e, vec);
        load_tile<T, BR, D>(dos, dout, p.ev, q0, p.l, p.ev, vec);
        cp_async_commit();
        for (int i = tid; i < BR; i += THREADS) {
            const long long row = q0 + i;
            const float lse = row < p.l ? p.lse[bh * p.l + row] : INFINITY;
            lse_s[i] = lse * LOG2E;
            delta_s[i] = row < p.l ? p.delta[bh * p.l + row] : 0.0f;
        }
        cp_async_wait<0>();
        __syncthreads();

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's 16 keys.
        float st[BR / 8][4], dpt[BR / 8][4];
#pragma unroll
        for (int i = 0; i < BR / 8; ++i) {
            st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
            dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned int ka[4], va[4];
            ldmatrix_x4<false>(ka, ks + (warp * 16 + lr + (lm & 1) * 8) * PAD + kk * 16 + (lm >> 1) * 8);
            ldmatrix_x4<false>(va, vs + (warp * 16 + lr + (lm & 1) * 8) * PAD + kk * 16 + (lm >> 1) * 8);
#pragma unroll
            for (int nt = 0; nt < BR / 16; ++nt) {
                unsigned int b[4];
                ldmatrix_x4<false>(b, qs + (nt * 16 + lr + (lm >> 1) * 8) * PAD + kk * 16 + (lm & 1) * 8);
                mma<T>(st[2 * nt], ka, b);
                mma<T>(st[2 * nt + 1], ka, b + 2);
                ldmatrix_x4<false>(b, dos + (nt * 16 + lr + (lm >> 1) * 8) * PAD + kk * 16 + (lm & 1) * 8);
                mma<T>(dpt[2 * nt], va, b);
                mma<T>(dpt[2 * nt + 1], va, b + 2);
            }
        }
        // Pᵀ, the dropped Pᵀ (for dV) and dSᵀ = Pᵀ ∘ (dPᵀ − delta). Query
        // rows past L have lse = +inf (p = 0); keys past S, past the
        // diagonal or under a mask take the general path.
        const bool edge = mask != nullptr || k0 + warp * 16 + 16 > p.s || (p.causal && k0 + warp * 16 + 15 > q0);
        unsigned int pa[BR / 16][4], dsa[BR / 16][4];
#pragma unroll
        for (int nt = 0; nt < BR / 8; ++nt) {
            float pd[4], ds[4];
            const int q_pair = nt * 8 + tig * 2;
            const float lse2[2] = {lse_s[q_pair], lse_s[q_pair + 1]};
            const float dl[2] = {delta_s[q_pair], delta_s[q_pair + 1]};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qi = q_pair + (e & 1);
                float prob;
                if (!edge) {
                    prob = exp2f(st[nt][e] * scale_log2 - lse2[e & 1]);
                } else {
                    const long long j = key[e / 2], i = q0 + qi;
                    float x = st[nt][e] * p.scale;
                    if (mask != nullptr && i < p.l && j < p.s) x += mask[i * p.mask_strides[2] + j * p.mask_strides[3]];
                    const bool hidden = j >= p.s || (p.causal && j > i) || lse2[e & 1] == INFINITY;
                    prob = hidden ? 0.0f : exp2f(x * LOG2E - lse2[e & 1]);
                }
                float dp = dpt[nt][e];
                float dropped = prob;
                if (DROPOUT) {
                    const long long j = key[e / 2], i = q0 + qi;
                    const bool keep = i < p.l && j < p.s && keeps(p.seed, p.offset, bh, p.l, p.s, i, j, threshold);
                    const float m = keep ? keep_scale : 0.0f;
                    dropped = prob * m;
                    dp *= m;
                }
                pd[e] = dropped;
                ds[e] = prob * (dp - dl[e & 1]);
            }
            pa[nt / 2][(nt & 1) * 2] = pack2<T>(pd[0], pd[1]);
            pa[nt / 2][(nt & 1) * 2 + 1] = pack2<T>(pd[2], pd[3]);
            dsa[nt / 2][(nt & 1) * 2] = pack2<T>(ds[0], ds[1]);
            dsa[nt / 2][(nt & 1) * 2 + 1] = pack2<T>(ds[2], ds[3]);
            // dSᵀ into shared memory for dQ: row (key) g and g + 8 of this warp.
            const int c = nt * 8 + tig * 2;
            *reinterpret_cast<unsigned int*>(dss + (warp * 16 + g) * SPAD + c) = dsa[nt / 2][(nt & 1) * 2];
            *reinterpret_cast<unsigned int*>(dss + (warp * 16 + g + 8) * SPAD + c) = dsa[nt / 2][(nt & 1) * 2 + 1];
        }
        // dV += P̃ᵀ·dO and dK += dSᵀ·Q (scaled at the end).
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
#pragma unroll
            for (int dt = 0; dt < D / 16; ++dt) {
                unsigned int b[4];
                ldmatrix_x4<true>(b, dos + (kk * 16 + lr + (lm & 1) * 8) * PAD + dt * 16 + (lm >> 1) * 8);
                mma<T>(dv[2 * dt], pa[kk], b);
                mma<T>(dv[2 * dt + 1], pa[kk], b + 2);
                ldmatrix_x4<true>(b, qs + (kk * 16 + lr + (lm & 1) * 8) * PAD + dt * 16 + (lm >> 1) * 8);
                mma<T>(dk[2 * dt], dsa[kk], b);
                mma<T>(dk[2 * dt + 1], dsa[kk], b + 2);
            }
        }
        __syncthreads();  // dS is complete
        // dQ[q0 + warp·16 ..] += scale · dS·K over this block's keys, 32 columns at a time.
        float* dq = p.dq + bh * p.l * p.e;
        unsigned int sa[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
            ldmatrix_x4<true>(sa[kk], dss + (kk * 16 + lr + (lm >> 1) * 8) * SPAD + warp * 16 + (lm & 1) * 8);
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 32) {
            if (d0 >= p.e) break;
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
                for (int dt = 0; dt < 2; ++dt) {
                    unsigned int b[4];
                    ldmatrix_x4<true>(b, ks + (kk * 16 + lr + (lm & 1) * 8) * PAD + d0 + dt * 16 + (lm >> 1) * 8);
                    mma<T>(acc[2 * dt], sa[kk], b);
                    mma<T>(acc[2 * dt + 1], sa[kk], b + 2);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const long long i = q0 + warp * 16 + g + (e / 2) * 8;
                    const long long d = d0 + nt * 8 + tig * 2 + (e & 1);
                    if (i < p.l && d < p.e) atomicAdd(dq + i * p.e + d, acc[nt][e] * p.scale);
                }
            }
        }
        __syncthreads();  // before the next tile overwrites Q, dO and dS
    }
    cp_async_wait<0>();
    T* dkp = (T*)p.dk + bh * p.s * p.e;
    T* dvp = (T*)p.dv + bh * p.s * p.ev;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const long long j = key[r];
        if (j >= p.s) continue;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const long long d = dt * 8 + tig * 2 + c;
                if (d < p.e) dkp[j * p.e + d] = Elem<T>::store(dk[dt][r * 2 + c] * p.scale);
                if (d < p.ev) dvp[j * p.ev + d] = Elem<T>::store(dv[dt][r * 2 + c]);
            }
        }
    }
}

// delta[row] = Σ_d dO[row, d]·O[row, d] in f32: one warp per row.
template <typename T>
__device__ __forceinline__ void delta(long long rows, long long width, const T* grad, const T* out, float* dst) {
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    for (long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        float sum = 0.0f;
        for (long long d = threadIdx.x % 32; d < width; d += 32)
            sum += Elem<T>::load(grad[r * width + d]) * Elem<T>::load(out[r * width + d]);
#pragma unroll
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (threadIdx.x % 32 == 0) dst[r] = sum;
    }
}

}  // namespace attn

// The backward's dynamic shared memory for head dim D, in bytes:
// (4·64·(D + 8) + 64·72)·2 + 2·64·4 (brasa_kernels::cuda_ptx::
// attention_backward_shared_bytes; 79,360 for D = 128, past the 48 KiB a
// kernel gets without opting in).

#define INST_ATTENTION(sfx, T, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(attn::THREADS)                                    \
        attention_forward_##sfx##_d##D(const AttentionForward p) {                                 \
        attn::forward<T, D, false>(p);                                                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::THREADS)                                    \
        attention_forward_dropout_##sfx##_d##D(const AttentionForward p) {                         \
        attn::forward<T, D, true>(p);                                                           \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::THREADS)                                    \
        attention_backward_##sfx##_d##D(const AttentionBackward p) {                               \
        attn::backward<T, D, false>(p);                                                            \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::THREADS)                                    \
        attention_backward_dropout_##sfx##_d##D(const AttentionBackward p) {                       \
        attn::backward<T, D, true>(p);                                                             \
    }

#define INST_DELTA(sfx, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)                                      \
        attention_delta_##sfx(long long rows, long long width, const T* grad, const T* out, float* dst) { \
        attn::delta<T>(rows, width, grad, out, dst);                                               \
    }

INST_ATTENTION(f16, __half, 64)
INST_ATTENTION(f16, __half, 128)
INST_ATTENTION(bf16, __nv_bfloat16, 64)
INST_ATTENTION(bf16, __nv_bfloat16, 128)
INST_DELTA(f16, __half)
INST_DELTA(bf16, __nv_bfloat16)
