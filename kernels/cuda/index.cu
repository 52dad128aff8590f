// Indexing: index_select (and embedding, which is index_select with
// outer = 1), gather and scatter_add along one dim, one_hot, and a bare
// index check. Host twins: brasa_kernels::index::{index_select, gather,
// scatter_add, one_hot, check_indices} as brasa-tensor's ops/index.rs uses
// them. Indices are i64; an index outside 0..size (negative ones included,
// the host's rule) touches no memory: it is recorded in *bad_index (see
// common.cuh, record_bad_index) and its element is skipped. See ABI.md.
#include "common.cuh"

#define K extern "C" __global__ void __launch_bounds__(BRASA_BLOCK)

__device__ __forceinline__ bool in_range(long long index, long long size) { return index >= 0 && index < size; }

K index_check(long long n, const long long* index, long long size, long long* bad_index) {
    for (long long j = grid_start(); j < n; j += grid_step())
        if (!in_range(index[j], size)) record_bad_index(bad_index, index[j]);
}

// out[o, j, i] = src[o, index[j], i]; src [outer, size, inner] and out
// [outer, count, inner] contiguous.
template <typename T>
__device__ __forceinline__ void index_select(long long outer, long long size, long long inner, long long count,
                                             const T* src, const long long* index, T* out, long long* bad_index) {
    for (long long j = grid_start(); j < count; j += grid_step())
        if (!in_range(index[j], size)) record_bad_index(bad_index, index[j]);
    const long long n = outer * count * inner;
    for (long long e = grid_start(); e < n; e += grid_step()) {
        const long long i = e % inner, j = (e / inner) % count, o = e / (inner * count);
        const long long at = index[j];
        if (in_range(at, size)) out[e] = src[(o * size + at) * inner + i];
    }
}

// out[p] = src[base(p) + index[p]·stride] over the index's shape: operand 0
// of `s` is out, 1 the src base (src's strides with the gathered dim's set
// to 0), 2 the index.
template <typename T>
__device__ __forceinline__ void gather(const Strided& s, const T* src, const long long* index, T* out, long long size,
                                       long long stride, long long* bad_index) {
    for (long long e = grid_start(); e < s.numel; e += grid_step()) {
        long long off[3];
        strided_offsets<3>(s, e, off);
        const long long at = index[off[2]];
        if (in_range(at, size)) {
            out[off[0]] = src[off[1] + at * stride];
        } else {
            record_bad_index(bad_index, at);
        }
    }
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__half* p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16* p, __nv_bfloat16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
// A byte added (wrapping) through a CAS on its aligned 4-byte word.
__device__ __forceinline__ void atomic_add(u8* p, u8 v) {
    unsigned int* word = (unsigned int*)((size_t)p & ~(size_t)3);
    const unsigned int shift = (unsigned int)((size_t)p & 3) * 8;
    unsigned int old = *word, assumed;
    do {
        assumed = old;
        const unsigned int byte = ((assumed >> shift) + v) & 0xffu;
        old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
    } while (old != assumed);
}

// dst[base(p) + index[p]·stride] += src[p] over the index's shape: operand 0
// of `s` is the dst base (dim stride 0), 1 the index, 2 src. Atomic; the
// order of additions to one element is unspecified.
template <typename T>
__device__ __forceinline__ void scatter_add(const Strided& s, T* dst, const long long* index, const T* src,
                                            long long size, long long stride, long long* bad_index) {
    for (long long e = grid_start(); e < s.numel; e += grid_step()) {
        long long off[3];
        strided_offsets<3>(s, e, off);
        const long long at = index[off[1]];
        if (in_range(at, size)) {
            atomic_add(dst + off[0] + at * stride, src[off[2]]);
        } else {
            record_bad_index(bad_index, at);
        }
    }
}

// bool: slot = slot || value (the host's i64 sum, != 0). Only ones are
// written, so plain stores suffice.
K scatter_add_bool(Strided s, u8* dst, const long long* index, const u8* src, long long size, long long stride,
                   long long* bad_index) {
    for (long long e = grid_start(); e < s.numel; e += grid_step()) {
        long long off[3];
        strided_offsets<3>(s, e, off);
        const long long at = index[off[1]];
        if (in_range(at, size)) {
            if (src[off[2]] != 0) dst[off[0] + at * stride] = 1;
        } else {
            record_bad_index(bad_index, at);
        }
    }
}

// out [n, classes] i64: 1 where the column is the id, else 0.
K one_hot(long long n, long long classes, const long long* ids, long long* out, long long* bad_index) {
    for (long long j = grid_start(); j < n; j += grid_step())
        if (!in_range(ids[j], classes)) record_bad_index(bad_index, ids[j]);
    const long long total = n * classes;
    for (long long e = grid_start(); e < total; e += grid_step()) out[e] = ids[e / classes] == e % classes ? 1 : 0;
}

#define INST_INDEX(sfx, T)                                                                         \
    K index_select_##sfx(long long outer, long long size, long long inner, long long count, const T* src, \
                         const long long* index, T* out, long long* bad_index) {                   \
        index_select<T>(outer, size, inner, count, src, index, out, bad_index);                    \
    }                                                                                              \
    K gather_##sfx(Strided s, const T* src, const long long* index, T* out, long long size, long long stride, \
                   long long* bad_index) {                                                         \
        gather<T>(s, src, index, out, size, stride, bad_index);                                    \
    }
#define INST_SCATTER(sfx, T)                                                                       \
    K scatter_add_##sfx(Strided s, T* dst, const long long* index, const T* src, long long size, long long stride, \
                        long long* bad_index) {                                                    \
        scatter_add<T>(s, dst, index, src, size, stride, bad_index);                               \
    }
BRASA_FLOAT_TYPES(INST_INDEX)
BRASA_INT_TYPES(INST_INDEX)
INST_INDEX(bool, u8)
BRASA_FLOAT_TYPES(INST_SCATTER)
BRASA_INT_TYPES(INST_SCATTER)
