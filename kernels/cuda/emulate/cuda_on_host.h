// The CUDA built-ins that brasa's shared-memory kernels use, on the host:
// enough to compile a kernels/cuda/*.cu with a C++20 compiler and run its
// kernels, block after block, on a team of OS threads (one per thread of the
// block), so that the kernels' indexing, loops over the grid and
// __syncthreads() choreography are tested without a GPU.
// kernels/tests/cuda_on_host.rs compiles and runs the tests beside this file.
//
// What it emulates: threadIdx/blockIdx/blockDim/gridDim; __shared__ arrays
// (one block runs at a time, so a function-local static is the block's
// shared memory); __syncthreads() (a barrier of the block's threads, which a
// thread that has returned no longer holds back, as an exited thread on the
// GPU does not); the round-to-nearest arithmetic intrinsics (compiled with
// -ffp-contract=off, so nothing fuses into an FMA either); f16/bf16 storage
// types and their conversions; atomicCAS and atomicAdd.
//
// What it does not: warp-level intrinsics (__shfl_*, votes, mma.sync) and
// inline PTX. Kernels that use them (attention.cu) are not built here; the
// GPU tests cover them. Timing, occupancy and memory coalescing are not
// modelled either: this checks what a kernel computes, not how fast. The
// threads really run concurrently, so a missing barrier shows as a race
// often but not always.
#pragma once

#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block at a time: a static local is shared by the block's threads.
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

namespace emulate {
inline void sync_block();
}
inline void __syncthreads() { emulate::sync_block(); }

// ----- arithmetic intrinsics: IEEE round to nearest, no contraction --------
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double v) { return (float)v; }
inline unsigned int __float_as_uint(float v) { return std::bit_cast<unsigned int>(v); }
inline float __uint_as_float(unsigned int v) { return std::bit_cast<float>(v); }
// Round toward zero: the nearest float, stepped toward zero when it is
// further from zero than v (long double holds every i64 exactly on x86-64).
inline float __ll2float_rz(long long v) {
    float nearest = (float)v;
    if (std::fabs((long double)nearest) > std::fabs((long double)v)) nearest = std::nextafter(nearest, 0.0f);
    return nearest;
}

// ----- half types: storage only, converted as the CUDA headers do ----------
struct __half {
    unsigned short bits;
};
struct __nv_bfloat16 {
    unsigned short bits;
};
// _Float16 (GCC 12+ and clang on x86-64) converts with IEEE round to nearest
// even, as __float2half_rn does.
inline float __half2float(__half h) { return (float)std::bit_cast<_Float16>(h.bits); }
inline __half __float2half_rn(float f) { return __half{std::bit_cast<unsigned short>((_Float16)f)}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { return __nv_bfloat16{v}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }

inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare,
                                    unsigned long long value) {
    std::atomic_ref<unsigned long long> cell(*address);
    cell.compare_exchange_strong(compare, value);
    return compare;
}

template <typename F>
inline F atomicAdd(F* address, F value) {
    std::atomic_ref<F> cell(*address);
    return cell.fetch_add(value);
}

namespace emulate {

// The threads of one block, kept for the whole process (creating 256 OS
// threads per block would dominate the run). Every launch runs all of its
// blocks, one after another, on the same team.
class Team {
public:
    explicit Team(unsigned int threads)
        : threads_(threads), sync_((std::ptrdiff_t)threads, Completion{this}), start_((std::ptrdiff_t)threads + 1),
          done_((std::ptrdiff_t)threads + 1) {
        for (unsigned int t = 0; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
    }
    ~Team() {
        quit_ = true;
        start_.arrive_and_wait();
        for (auto& worker : workers_) worker.join();
    }
    unsigned int threads() const { return threads_; }

    void run(dim3 grid, dim3 block, std::function<void()> kernel) {
        grid_ = grid;
        block_ = block;
        kernel_ = std::move(kernel);
        start_.arrive_and_wait();
        done_.arrive_and_wait();
    }

    // __syncthreads(): every thread of the block arrives. A thread that has
    // returned from the kernel keeps arriving (see work) until all have.
    void sync() { sync_.arrive_and_wait(); }

private:
    // Runs once per phase, after the last arrival and before any release:
    // a phase in which every thread has returned ends the block.
    struct Completion {
        Team* team;
        void operator()() noexcept {
            team->block_over_ = team->returned_.load() == team->threads_;
            if (team->block_over_) team->returned_ = 0;
        }
    };

    void work(unsigned int t) {
        for (;;) {
            start_.arrive_and_wait();
            if (quit_) return;
            for (unsigned int bz = 0; bz < grid_.z; ++bz)
                for (unsigned int by = 0; by < grid_.y; ++by)
                    for (unsigned int bx = 0; bx < grid_.x; ++bx) {
                        blockIdx = dim3{bx, by, bz};
                        threadIdx = dim3{t % block_.x, (t / block_.x) % block_.y, t / (block_.x * block_.y)};
                        kernel_();
                        returned_.fetch_add(1);
                        do sync_.arrive_and_wait();
                        while (!block_over_);
                    }
            done_.arrive_and_wait();
        }
    }

    unsigned int threads_;
    std::atomic<unsigned int> returned_{0};
    bool block_over_ = false;
    bool quit_ = false;
    dim3 grid_, block_;
    std::function<void()> kernel_;
    std::barrier<Completion> sync_;
    std::barrier<> start_, done_;
    std::vector<std::thread> workers_;
};

inline std::unique_ptr<Team> team;

inline void sync_block() { team->sync(); }

// Runs `kernel` (a callable taking no arguments: a lambda calling the
// kernel) on a `grid` of blocks of `block` threads, one block after
// another, in the order of the grid's linear index.
template <typename Kernel>
void launch(dim3 grid, dim3 block, Kernel kernel) {
    const unsigned int threads = block.x * block.y * block.z;
    if (!team || team->threads() != threads) team = std::make_unique<Team>(threads);
    gridDim = grid;
    blockDim = block;
    team->run(grid, block, kernel);
}

}  // namespace emulate
