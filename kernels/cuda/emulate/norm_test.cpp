// norm.cu's batch-norm kernels on the host emulator (cuda_on_host.h),
// against references computed here: the per-channel reductions of
// [rows, c] in pieces (`batch_norm_stats_rows_*` + `_merge`,
// `batch_norm_bwd_reduce_rows_*` + `_merge`) and the block-per-channel
// ones they stand beside, in long double within a tolerance; the
// element-wise passes bit for bit against the same arithmetic written
// serially; `channel_of`'s 32- and 64-bit paths against plain division.
// Every output buffer starts poisoned and carries a guard tail: each element
// must be written and nothing past the end. Exits 1 with the failures on
// stderr. Built and run by kernels/tests/cuda_on_host.rs.
#include "cuda_on_host.h"

#include "../norm.cu"

#include <cinttypes>
#include <random>

static int failures = 0;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            if (++failures <= 30) {                                        \
                std::fprintf(stderr, "FAIL (norm_test.cpp:%d) ", __LINE__); \
                std::fprintf(stderr, __VA_ARGS__);                         \
                std::fprintf(stderr, "\n");                                \
            }                                                              \
        }                                                                  \
    } while (0)

// ----- buffers with a poisoned body and a guard tail --------------------------
constexpr size_t GUARD = 64;
constexpr unsigned char POISON = 0xA5;

template <typename X>
struct Buffer {
    std::vector<X> data;
    size_t len;
    explicit Buffer(size_t n) : data(n + GUARD), len(n) { std::memset(data.data(), POISON, data.size() * sizeof(X)); }
    X* ptr() { return data.data(); }
    X& operator[](size_t i) { return data[i]; }
    // Every element of the body written (for 4- and 8-byte elements, whose
    // poison no result takes by chance; a 2-byte result may well be 0xA5A5),
    // the guard tail untouched.
    bool written(const char* what) {
        static_assert(sizeof(X) >= 4, "a 2-byte element may equal the poison: compare its values instead");
        bool ok = true;
        const unsigned char* bytes = reinterpret_cast<const unsigned char*>(data.data());
        for (size_t i = 0; i < len && ok; ++i) {
            bool poisoned = true;
            for (size_t b = 0; b < sizeof(X); ++b) poisoned &= bytes[i * sizeof(X) + b] == POISON;
            CHECK(!poisoned, "%s: element %zu of %zu never written", what, i, len);
            ok &= !poisoned;
        }
        return ok && guard_intact(what);
    }
    bool guard_intact(const char* what) {
        bool ok = true;
        const unsigned char* bytes = reinterpret_cast<const unsigned char*>(data.data());
        for (size_t b = len * sizeof(X); b < data.size() * sizeof(X) && ok; ++b) {
            CHECK(bytes[b] == POISON, "%s: written past its end (byte %zu after %zu elements)", what,
                  b - len * sizeof(X), len);
            ok &= bytes[b] == POISON;
        }
        return ok;
    }
};

// ----- the kernels of one element type ---------------------------------------
template <typename T> struct Kernels;
#define KERNELS(sfx, T, C)                                                                                    \
    template <> struct Kernels<T> {                                                                           \
        static constexpr const char* name = #sfx;                                                              \
        static constexpr double tolerance = sizeof(C) == 8 ? 1e-12 : 2e-5;                                     \
        static T from_double(double v);                                                                       \
        static void stats(long long n, long long c, long long s, const T* x, C* mean, C* var) {               \
            batch_norm_stats_##sfx(n, c, s, x, mean, var);                                                    \
        }                                                                                                     \
        static void stats_rows(long long r, long long c, long long rpp, long long p, const T* x, C* partial) { \
            batch_norm_stats_rows_##sfx(r, c, rpp, p, x, partial);                                             \
        }                                                                                                     \
        static void bwd_reduce(long long n, long long c, long long s, const T* dy, const T* x, const C* mean,  \
                               C* sum_dy, C* sum_dy_xmu) {                                                    \
            batch_norm_bwd_reduce_##sfx(n, c, s, dy, x, mean, sum_dy, sum_dy_xmu);                            \
        }                                                                                                     \
        static void bwd_reduce_rows(long long r, long long c, long long rpp, long long p, const T* dy,         \
                                    const T* x, const C* mean, C* partial) {                                  \
            batch_norm_bwd_reduce_rows_##sfx(r, c, rpp, p, dy, x, mean, partial);                              \
        }                                                                                                     \
        static void elemt(long long n, long long c, long long s, const T* x, const C* mean, const C* scale,    \
                          const C* shift, T* out) {                                                           \
            batch_norm_elemt_##sfx(n, c, s, x, mean, scale, shift, out);                                      \
        }                                                                                                     \
        static void bwd_elemt(long long n, long long c, long long s, const T* dy, const T* x, const C* mean,   \
                              const C* scale, const C* mean_dy, const C* k, T* dx) {                          \
            batch_norm_bwd_elemt_##sfx(n, c, s, dy, x, mean, scale, mean_dy, k, dx);                          \
        }                                                                                                     \
    };
KERNELS(f32, float, float)
KERNELS(f64, double, double)
KERNELS(f16, __half, float)
KERNELS(bf16, __nv_bfloat16, float)
float Kernels<float>::from_double(double v) { return (float)v; }
double Kernels<double>::from_double(double v) { return v; }
__half Kernels<__half>::from_double(double v) { return __float2half_rn((float)v); }
__nv_bfloat16 Kernels<__nv_bfloat16>::from_double(double v) { return f32_to_bf16((float)v); }

// The merge kernels of one compute type.
template <typename C> struct Merges;
#define MERGES(sfx, C)                                                                                       \
    template <> struct Merges<C> {                                                                           \
        static void stats(long long r, long long c, long long rpp, long long p, const C* partial, C* mean,    \
                          C* var) {                                                                          \
            batch_norm_stats_merge_##sfx(r, c, rpp, p, partial, mean, var);                                  \
        }                                                                                                    \
        static void sums(long long r, long long c, long long rpp, long long p, const C* partial, C* sum_dy,   \
                         C* sum_dy_xmu) {                                                                    \
            batch_norm_bwd_reduce_merge_##sfx(r, c, rpp, p, partial, sum_dy, sum_dy_xmu);                     \
        }                                                                                                    \
    };
MERGES(f32, float)
MERGES(f64, double)

const dim3 BLOCK = {BRASA_BLOCK, 1, 1};

// Values of `count` elements around a per-channel offset (so that a
// one-pass variance would cancel), in T; returned widened as the kernels
// load them.
template <typename T>
std::vector<T> values(size_t rows, size_t c, double offset_scale, std::mt19937_64& rng, std::vector<double>& wide) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<T> out(rows * c);
    wide.resize(rows * c);
    for (size_t r = 0; r < rows; ++r)
        for (size_t ch = 0; ch < c; ++ch) {
            const double v = offset_scale * (1.0 + 0.37 * (double)(ch % 11)) + u(rng);
            out[r * c + ch] = Kernels<T>::from_double(v);
            wide[r * c + ch] = (double)Elem<T>::load(out[r * c + ch]);
        }
    return out;
}

bool close(double got, double want, double scale, double tolerance) {
    return std::fabs(got - want) <= tolerance * scale || (got != got && want != want);
}

// ----- statistics and backward sums of [rows, c] in pieces -----------------------
struct RowCase {
    long long rows, c, rows_per_piece;
    unsigned int grid_x, grid_y;  // the rows kernels' grid; merges run ⌈c/32⌉ or grid_x blocks
};

template <typename T>
void reductions_of_rows(const RowCase& k, std::mt19937_64& rng) {
    typedef typename Elem<T>::C C;
    const long long pieces = (k.rows + k.rows_per_piece - 1) / k.rows_per_piece;
    const double tol = Kernels<T>::tolerance;
    char what[160];
    std::snprintf(what, sizeof what, "%s rows %lld c %lld rows_per_piece %lld (pieces %lld) grid %ux%u",
                  Kernels<T>::name, k.rows, k.c, k.rows_per_piece, pieces, k.grid_x, k.grid_y);
    std::vector<double> xw, gw;
    std::vector<T> x = values<T>(k.rows, k.c, 4.0, rng, xw);
    std::vector<T> dy = values<T>(k.rows, k.c, 0.25, rng, gw);

    // References in long double: the two-pass mean and biased variance, and
    // the backward's sums around the kernels' own mean.
    std::vector<long double> mean_ref(k.c), var_ref(k.c);
    std::vector<double> max_abs(k.c, 0.0);
    for (long long ch = 0; ch < k.c; ++ch) {
        long double s = 0;
        for (long long r = 0; r < k.rows; ++r) s += xw[r * k.c + ch], max_abs[ch] = std::fmax(max_abs[ch], std::fabs(xw[r * k.c + ch]));
        mean_ref[ch] = s / k.rows;
        long double q = 0;
        for (long long r = 0; r < k.rows; ++r) q += (xw[r * k.c + ch] - mean_ref[ch]) * (xw[r * k.c + ch] - mean_ref[ch]);
        var_ref[ch] = q / k.rows;
    }

    Buffer<C> partial(2 * pieces * k.c);
    emulate::launch({k.grid_x, k.grid_y, 1}, BLOCK,
                    [&] { Kernels<T>::stats_rows(k.rows, k.c, k.rows_per_piece, pieces, x.data(), partial.ptr()); });
    if (!partial.written(what)) return;
    Buffer<C> mean(k.c), var(k.c);
    emulate::launch({k.grid_x, 1, 1}, BLOCK,
                    [&] { Merges<C>::stats(k.rows, k.c, k.rows_per_piece, pieces, partial.ptr(), mean.ptr(), var.ptr()); });
    if (!mean.written(what) || !var.written(what)) return;
    // The block-per-channel kernel on the same input seen as [rows, c, 1].
    Buffer<C> mean_b(k.c), var_b(k.c);
    emulate::launch({(unsigned int)std::min<long long>(k.c, 7), 1, 1}, BLOCK,
                    [&] { Kernels<T>::stats(k.rows, k.c, 1, x.data(), mean_b.ptr(), var_b.ptr()); });
    if (!mean_b.written(what) || !var_b.written(what)) return;
    for (long long ch = 0; ch < k.c; ++ch) {
        const double m = (double)mean_ref[ch], v = (double)var_ref[ch], spread = max_abs[ch];
        CHECK(close(mean[ch], m, spread, tol), "%s: mean of channel %lld is %.9g, want %.9g", what, ch, (double)mean[ch], m);
        CHECK(close(var[ch], v, v + 1e-3 * spread * spread, 10 * tol), "%s: variance of channel %lld is %.9g, want %.9g",
              what, ch, (double)var[ch], v);
        CHECK(close(mean_b[ch], m, spread, tol), "%s: block-per-channel mean of channel %lld is %.9g, want %.9g", what,
              ch, (double)mean_b[ch], m);
        CHECK(close(var_b[ch], v, v + 1e-3 * spread * spread, 10 * tol),
              "%s: block-per-channel variance of channel %lld is %.9g, want %.9g", what, ch, (double)var_b[ch], v);
    }

    // The backward's two sums around the mean the forward computed.
    std::vector<long double> sum_ref(k.c, 0), sum_xmu_ref(k.c, 0), abs_sum(k.c, 0), abs_xmu(k.c, 0);
    for (long long ch = 0; ch < k.c; ++ch)
        for (long long r = 0; r < k.rows; ++r) {
            const long double g = gw[r * k.c + ch], d = (long double)xw[r * k.c + ch] - (long double)mean[ch];
            sum_ref[ch] += g, abs_sum[ch] += std::fabs((double)g);
            sum_xmu_ref[ch] += g * d, abs_xmu[ch] += std::fabs((double)(g * d));
        }
    Buffer<C> partial_b(2 * pieces * k.c);
    emulate::launch({k.grid_x, k.grid_y, 1}, BLOCK, [&] {
        Kernels<T>::bwd_reduce_rows(k.rows, k.c, k.rows_per_piece, pieces, dy.data(), x.data(), mean.ptr(),
                                    partial_b.ptr());
    });
    if (!partial_b.written(what)) return;
    Buffer<C> sum_dy(k.c), sum_dy_xmu(k.c);
    emulate::launch({k.grid_x, 1, 1}, BLOCK, [&] {
        Merges<C>::sums(k.rows, k.c, k.rows_per_piece, pieces, partial_b.ptr(), sum_dy.ptr(), sum_dy_xmu.ptr());
    });
    if (!sum_dy.written(what) || !sum_dy_xmu.written(what)) return;
    Buffer<C> sum_dy_b(k.c), sum_dy_xmu_b(k.c);
    emulate::launch({(unsigned int)std::min<long long>(k.c, 5), 1, 1}, BLOCK, [&] {
        Kernels<T>::bwd_reduce(k.rows, k.c, 1, dy.data(), x.data(), mean.ptr(), sum_dy_b.ptr(), sum_dy_xmu_b.ptr());
    });
    if (!sum_dy_b.written(what) || !sum_dy_xmu_b.written(what)) return;
    for (long long ch = 0; ch < k.c; ++ch) {
        const double s = (double)sum_ref[ch], sx = (double)sum_xmu_ref[ch];
        CHECK(close(sum_dy[ch], s, (double)abs_sum[ch], tol), "%s: Σ dy of channel %lld is %.9g, want %.9g", what, ch,
              (double)sum_dy[ch], s);
        CHECK(close(sum_dy_xmu[ch], sx, (double)abs_xmu[ch], tol), "%s: Σ dy·(x − mean) of channel %lld is %.9g, want %.9g",
              what, ch, (double)sum_dy_xmu[ch], sx);
        CHECK(close(sum_dy_b[ch], s, (double)abs_sum[ch], tol), "%s: block-per-channel Σ dy of channel %lld is %.9g, want %.9g",
              what, ch, (double)sum_dy_b[ch], s);
        CHECK(close(sum_dy_xmu_b[ch], sx, (double)abs_xmu[ch], tol),
              "%s: block-per-channel Σ dy·(x − mean) of channel %lld is %.9g, want %.9g", what, ch,
              (double)sum_dy_xmu_b[ch], sx);
    }
}

// ----- the element-wise passes, bit for bit ---------------------------------------
template <typename X>
bool same_bits(const X& a, const X& b) {
    return std::memcmp(&a, &b, sizeof(X)) == 0;
}

template <typename T>
void elementwise(long long n, long long c, long long s, unsigned int grid, std::mt19937_64& rng) {
    typedef typename Elem<T>::C C;
    const long long total = n * c * s;
    char what[128];
    std::snprintf(what, sizeof what, "%s elementwise [%lld, %lld, %lld] grid %u", Kernels<T>::name, n, c, s, grid);
    std::vector<double> xw, gw, pw;
    std::vector<T> x = values<T>(n * s, c, 2.0, rng, xw);  // any values; the layout is [n, c, s]
    std::vector<T> dy = values<T>(n * s, c, 0.5, rng, gw);
    std::vector<T> params_t = values<T>(4, c, 1.0, rng, pw);
    std::vector<C> mean(c), scale(c), shift(c), k(c);
    for (long long ch = 0; ch < c; ++ch) {
        mean[ch] = (C)(pw[ch] * 0.9), scale[ch] = (C)pw[c + ch], shift[ch] = (C)(pw[2 * c + ch] - 1.0);
        k[ch] = (C)(pw[3 * c + ch] * 0.1);
    }
    Buffer<T> out(total), dx(total);
    emulate::launch({grid, 1, 1}, BLOCK, [&] {
        Kernels<T>::elemt(n, c, s, x.data(), mean.data(), scale.data(), shift.data(), out.ptr());
    });
    // shift doubles as mean_dy
    emulate::launch({grid, 1, 1}, BLOCK, [&] {
        Kernels<T>::bwd_elemt(n, c, s, dy.data(), x.data(), mean.data(), scale.data(), shift.data(), k.data(), dx.ptr());
    });
    // Every element is compared below, so an unwritten one shows there.
    if (!out.guard_intact(what) || !dx.guard_intact(what)) return;
    for (long long i = 0; i < n; ++i)
        for (long long ch = 0; ch < c; ++ch)
            for (long long j = 0; j < s; ++j) {
                const long long at = (i * c + ch) * s + j;
                const C xv = Elem<T>::load(x[at]);
                const T y = Elem<T>::store((xv - mean[ch]) * scale[ch] + shift[ch]);
                CHECK(same_bits(out[at], y), "%s: forward element %lld (channel %lld) differs", what, at, ch);
                const C g = (Elem<T>::load(dy[at]) - shift[ch]) - (xv - mean[ch]) * k[ch];
                const T want = Elem<T>::store(scale[ch] * g);
                CHECK(same_bits(dx[at], want), "%s: backward element %lld (channel %lld) differs", what, at, ch);
            }
}

// ----- channel_of: the 32-bit path and the 64-bit one --------------------------------
void channel_indices() {
    struct Case {
        long long c, s, total;
    };
    const Case cases[] = {{3, 7, 21 * 5},         {64, 1, 1LL << 20},          {5, 1024, 0xffffffffLL},
                          {7, 1, 0xffffffffLL},   {3, 5, 0x100000000LL * 15}, {1000, 1, 0x180000000LL},
                          {13, 1 << 20, 0x7fffffffffffLL}};
    for (const Case& k : cases) {
        const long long probes[] = {0, 1, k.s - 1, k.s, k.c * k.s - 1, k.total / 2, k.total - 2, k.total - 1};
        for (long long at : probes) {
            if (at < 0 || at >= k.total) continue;
            const long long want = (at / k.s) % k.c;
            const long long got = channel_of(at, k.c, k.s, k.total);
            CHECK(got == want, "channel_of(%lld, c %lld, s %lld, total %lld) = %lld, want %lld", at, k.c, k.s, k.total, got,
                  want);
        }
    }
}

template <typename T>
void all_of_one_type(std::mt19937_64& rng) {
    // The CUDA backend's rule (brasa-tensor's batch_norm_row_pieces) gives,
    // for these shapes: [10, 3] one piece of 10 rows; [450, 2] pieces of
    // 57 rows, 8 of them; [1000, 70] pieces of 63 rows, 16 of them. The other
    // cases have grids smaller than the tiles and pieces (the kernels loop),
    // pieces with fewer rows than lanes, a partial last tile, one channel.
    const RowCase cases[] = {{10, 3, 10, 1, 1},  {450, 2, 57, 1, 8},  {1000, 70, 63, 3, 16}, {1000, 70, 63, 2, 5},
                             {7, 33, 2, 2, 4},  {513, 32, 64, 1, 9}, {300, 1, 300, 1, 1},   {129, 100, 5, 1, 3}};
    for (const RowCase& k : cases) reductions_of_rows<T>(k, rng);
    elementwise<T>(3, 5, 7, 1, rng);
    elementwise<T>(4, 70, 1, 2, rng);
    elementwise<T>(2, 3, 1000, 24, rng);
    elementwise<T>(33, 9, 1, 100, rng);
}

int main() {
    std::mt19937_64 rng(20261129);
    channel_indices();
    all_of_one_type<float>(rng);
    all_of_one_type<double>(rng);
    all_of_one_type<__half>(rng);
    all_of_one_type<__nv_bfloat16>(rng);
    if (failures > 0) {
        std::fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    std::printf("norm.cu batch-norm kernels: every check passed on the host emulator\n");
    return 0;
}
