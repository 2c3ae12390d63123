// Checks amx-attention.cpp against a plain reference, on shapes of llama.cpp's attention and
// on ragged ones, with two threads as ggml runs them; then times the two attention products of
// a long prompt. Built and run by scripts/test.sh on a CPU with AMX bf16 (the only place the
// kernel runs); exits non-zero on a wrong entry.
//
//   g++ -O2 -std=c++17 -march=sapphirerapids -DCALLSTREAM_AMX_STANDALONE
//       scripts/cmake/amx-attention-check.cpp -lpthread   (add an argument to time it)

#include "amx-attention.cpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Case {
    int64_t m, n, k, lda_pad, ldb_pad, ldc_pad;
};

bool check(const std::vector<uint16_t> & A, const std::vector<uint16_t> & B,
           const std::vector<float> & C, int64_t m, int64_t n, int64_t k, int64_t lda,
           int64_t ldb, int64_t ldc, double * worst) {
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < ldc; ++i) {
            const float got = C[j * ldc + i];
            if (i >= m) {
                if (got != 12345.0f) {
                    std::printf("  %ldx%ldx%ld: wrote outside at j=%ld i=%ld\n", (long)m,
                                (long)n, (long)k, (long)j, (long)i);
                    return false;
                }
                continue;
            }
            double want = 0.0, scale = 0.0;
            for (int64_t l = 0; l < k; ++l) {
                // The f16 values themselves: the kernel must keep all 11 of their bits.
                const double a = _cvtsh_ss(A[i * lda + l]);
                const double b = _cvtsh_ss(B[j * ldb + l]);
                want += a * b;
                scale += std::fabs(a * b);
            }
            const double err = std::fabs(got - want) / (scale + 1e-30);
            if (!(err < 1e-5)) {
                std::printf("  %ldx%ldx%ld: C[%ld][%ld] = %g, want %g\n", (long)m, (long)n,
                            (long)k, (long)j, (long)i, got, want);
                return false;
            }
            *worst = err > *worst ? err : *worst;
        }
    }
    return true;
}

// A barrier for the threads of one run.
struct Barrier {
    explicit Barrier(int count) : count(count) {}
    void wait() {
        const int gen = generation.load();
        if (arrived.fetch_add(1) + 1 == count) {
            arrived.store(0);
            generation.fetch_add(1);
        } else {
            while (generation.load() == gen) std::this_thread::yield();
        }
    }
    const int count;
    std::atomic<int> arrived{0};
    std::atomic<int> generation{0};
};

// As ggml runs attention: nth threads, each calling for `heads` query heads in turn with the
// same A (their shared key or value head) and their own B and C. Then, on the same threads,
// A's contents change in place (as the cache does between two evaluations of the model), a
// product this file does not take runs (as the model's other products do), and the heads again.
bool run(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int nth,
         int heads, std::mt19937 & rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> rounds[2];
    for (auto & r : rounds) {
        r.resize(m * lda);
        for (auto & v : r) v = _cvtss_sh(dist(rng), 0);
    }
    std::vector<uint16_t> A = rounds[0];
    std::vector<std::vector<uint16_t>> B(heads, std::vector<uint16_t>(n * ldb));
    for (auto & b : B) for (auto & v : b) v = _cvtss_sh(dist(rng), 0);
    // Entries of C outside the product must be left as they were.
    std::vector<std::vector<float>> C(2 * heads, std::vector<float>(n * ldc, 12345.0f));
    std::vector<char> taken(2 * nth * heads);
    Barrier barrier(nth);
    std::vector<std::thread> threads;
    for (int t = 0; t < nth; ++t) {
        threads.emplace_back([&, t] {
            for (int round = 0; round < 2; ++round) {
                if (round == 1) {
                    barrier.wait();
                    if (t == 0) A = rounds[1];
                    barrier.wait();
                    // One column: left to llama.cpp, and the kept packing forgotten.
                    float one[64];
                    callstream_amx_gemm_f16(t, nth, 64, 1, 1, A.data(), 1, B[0].data(), 1, one,
                                            64);
                }
                for (int h = 0; h < heads; ++h) {
                    taken[(round * nth + t) * heads + h] =
                        callstream_amx_gemm_f16(t, nth, m, n, k, A.data(), lda, B[h].data(), ldb,
                                                C[round * heads + h].data(), ldc);
                }
            }
        });
    }
    for (auto & th : threads) th.join();
    for (char r : taken) {
        if (!r) {
            std::printf("  %ldx%ldx%ld: not taken\n", (long)m, (long)n, (long)k);
            return false;
        }
    }
    double worst = 0.0;
    for (int round = 0; round < 2; ++round) {
        for (int h = 0; h < heads; ++h) {
            if (!check(rounds[round], B[h], C[round * heads + h], m, n, k, lda, ldb, ldc,
                       &worst)) {
                std::printf("  (head %d of %d, round %d, %d threads)\n", h, heads, round, nth);
                return false;
            }
        }
    }
    std::printf("  %ldx%ldx%ld (lda %ld, ldb %ld, ldc %ld), %d threads, %d heads: ok, worst "
                "relative error %.2e\n",
                (long)m, (long)n, (long)k, (long)lda, (long)ldb, (long)ldc, nth, heads, worst);
    return true;
}

}  // namespace

int main(int argc, char **) {
    if (!amx_ready()) {
        std::printf("no AMX bf16 here: nothing to check\n");
        return 0;
    }
    std::mt19937 rng(7);
    const Case cases[] = {
        {4352, 512, 128, 0, 0, 0},  // scores: cached positions x batch x head size
        {128, 512, 4352, 0, 0, 0},  // values: head size x batch x cached positions
        {77, 5, 33, 3, 1, 9},       // ragged everything, strided rows
        {1000, 9, 128, 0, 0, 24},   // a generated token with drafted ones
        {64, 4, 1, 0, 7, 0},        // the smallest taken
        {513, 31, 95, 5, 0, 1},
        {256, 17, 300, 0, 0, 0},
        {5312, 16, 128, 0, 0, 0},   // the most columns taken the other way round
        {128, 9, 5312, 0, 0, 0},
    };
    bool ok = true;
    for (const Case & c : cases) {
        for (int nth : {1, 2, 3}) {
            ok = run(c.m, c.n, c.k, c.k + c.lda_pad, c.k + c.ldb_pad, c.m + c.ldc_pad, nth,
                     nth == 2 ? 3 : 1, rng) && ok;
        }
    }
    // Too small: left to llama.cpp.
    std::vector<uint16_t> a(63 * 8), b(8 * 8);
    std::vector<float> cc(63 * 8);
    if (callstream_amx_gemm_f16(0, 1, 63, 8, 8, a.data(), 8, b.data(), 8, cc.data(), 63) ||
        callstream_amx_gemm_f16(0, 1, 64, 3, 8, a.data(), 8, b.data(), 8, cc.data(), 64)) {
        std::printf("  a product below the limits was taken\n");
        ok = false;
    }
    if (argc > 1) {
        // Per call, two threads, the same operands called 50 times in a row (as ggml calls the
        // six query heads that share a key head): a 512-token batch at 4,352 positions, and a
        // token with 8 drafted ones at 5,312.
        const int64_t shapes[4][3] = {{4352, 512, 128}, {128, 512, 4352}, {5312, 9, 128},
                                      {128, 9, 5312}};
        for (const auto & sh : shapes) {
            const int64_t m = sh[0], n = sh[1], k = sh[2];
            std::vector<uint16_t> A(m * k, _cvtss_sh(0.5f, 0)), B(n * k, _cvtss_sh(0.25f, 0));
            std::vector<float> C(m * n);
            const int reps = 50;
            auto start = std::chrono::steady_clock::now();
            std::vector<std::thread> threads;
            for (int t = 0; t < 2; ++t) {
                threads.emplace_back([&, t] {
                    for (int r = 0; r < reps; ++r) {
                        callstream_amx_gemm_f16(t, 2, m, n, k, A.data(), k, B.data(), k,
                                                C.data(), m);
                    }
                });
            }
            for (auto & th : threads) th.join();
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                reps;
            std::printf("  %ldx%ldx%ld: %.3f ms per call, %.0f GFLOP/s\n", (long)m, (long)n,
                        (long)k, s * 1e3, 2.0 * m * n * k / s / 1e9);
        }
    }
    std::printf(ok ? "all products right\n" : "WRONG PRODUCTS\n");
    return ok ? 0 : 1;
}
