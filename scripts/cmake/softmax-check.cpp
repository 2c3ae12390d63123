// Checks softmax.cpp's rows against llama.cpp's steps as ops.cpp takes them (copy, scale, add
// the mask, the maximum one value after another, exponentiate and sum, normalise), bit for bit,
// on rows of attention's shapes: causal masks of -infinity, ragged lengths, ties, signed zeros.
// The exponentials and their sum are one function for both, as llama.cpp's own is for both in
// the module. Built and run by scripts/test.sh; exits non-zero on a differing row. With an
// argument it also times the maximum both ways.
//
//   g++ -O2 -std=c++17 -march=native -ffp-contract=off -DCALLSTREAM_SOFTMAX_STANDALONE
//       scripts/cmake/softmax-check.cpp
#include "softmax.cpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

double exp_sum(int n, float * y, const float * x, float max) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        y[i] = std::exp(x[i] - max);
        sum += y[i];
    }
    return sum;
}

// ops.cpp's ggml_compute_forward_soft_max_f32 for one row, slope 1, no sinks.
void reference(int64_t n, const float * sp, float * dp, float scale, const float * mask) {
    std::vector<float> wp(sp, sp + n);
    for (auto & w : wp) w *= scale;
    if (mask) {
        for (int64_t i = 0; i < n; ++i) wp[i] += 1.0f * mask[i];
    }
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = max > wp[i] ? max : wp[i];
    const double sum = exp_sum(static_cast<int>(n), dp, wp.data(), max);
    const float inverse = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) dp[i] *= inverse;
}

}  // namespace

int main(int argc, char **) {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    bool ok = true;
    int rows = 0;
    for (int64_t n : {1, 7, 15, 16, 17, 31, 64, 100, 513, 4352, 5312}) {
        for (int variant = 0; variant < 6; ++variant) {
            std::vector<float> s(n), mask(n, 0.0f), want(n), got(n);
            for (auto & v : s) v = dist(rng);
            if (variant == 1) {
                // Causal: the last positions hidden.
                for (int64_t i = n - n / 3; i < n; ++i) mask[i] = -INFINITY;
            } else if (variant == 2) {
                // The largest value repeated, and signed zeros.
                for (int64_t i = 0; i < n; i += 5) s[i] = 9.5f;
                for (int64_t i = 1; i < n; i += 7) s[i] = (i % 2) ? -0.0f : 0.0f;
            } else if (variant == 3) {
                // Every score the same, the maximum at the very end.
                for (auto & v : s) v = -3.25f;
                s[n - 1] = 1.0f;
            } else if (variant == 4) {
                for (int64_t i = 0; i < n; ++i) mask[i] = (i % 3 == 0) ? -INFINITY : dist(rng);
                mask[n / 2] = 0.0f;
            }
            const float * m = variant == 5 ? nullptr : mask.data();
            const float scale = 0.0883883f;  // 1/sqrt(128)
            reference(n, s.data(), want.data(), scale, m);
            callstream_softmax::row(n, s.data(), got.data(), scale, m, exp_sum);
            // In place too, as llama.cpp may run the op.
            std::vector<float> in_place = s;
            callstream_softmax::row(n, in_place.data(), in_place.data(), scale, m, exp_sum);
            for (int64_t i = 0; i < n; ++i) {
                if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 ||
                    std::memcmp(&want[i], &in_place[i], sizeof(float)) != 0) {
                    std::printf("  n=%ld variant %d: entry %ld is %a (in place %a), want %a\n",
                                (long)n, variant, (long)i, got[i], in_place[i], want[i]);
                    ok = false;
                    break;
                }
            }
            ++rows;
        }
    }
    std::printf("  %d rows compared\n", rows);
    if (argc > 1) {
        // The maximum of a row of 5,312 scores, 100,000 times, both ways.
        std::vector<float> x(5312);
        for (auto & v : x) v = dist(rng);
        for (int way = 0; way < 2; ++way) {
            volatile float sink = 0.0f;
            const auto start = std::chrono::steady_clock::now();
            for (int r = 0; r < 100000; ++r) {
                x[r % x.size()] += 1e-3f;
                float max = -INFINITY;
                if (way == 0) {
                    for (float v : x) max = max > v ? max : v;
                } else {
                    max = callstream_softmax::row_max(static_cast<int64_t>(x.size()), x.data());
                }
                sink = sink + max;
            }
            const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             start).count() * 1e6 / 100000;
            std::printf("  maximum of 5312 scores, %s: %.2f us\n",
                        way == 0 ? "one after another" : "lane-wise", us);
        }
    }
    std::printf(ok ? "all rows the same\n" : "ROWS DIFFER\n");
    return ok ? 0 : 1;
}
