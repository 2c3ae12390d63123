// llama.cpp's softmax (ggml-cpu/ops.cpp) with its row maximum found many lanes at a time.
//
// Without flash attention, every row of attention scores (one per query token and head, as long
// as the cached positions) goes through ggml_compute_forward_soft_max: scale, add the mask,
// find the maximum, exponentiate and sum, normalise. The maximum is a loop of one vmaxss after
// another, each waiting for the last: GCC does not vectorise `max = MAX(max, x[i])` without
// fast-math. Over a long prompt that loop was three quarters of the softmax, and a tenth of the
// whole evaluation (perf, on the analyses of the 10.6-minute call).
//
// Here the maximum is taken into 16 independent lanes, an elementwise max the compiler
// vectorises for whatever x86 level the module is built for, and the lanes are reduced at the
// end. A maximum does not depend on the order it is taken in, so the rows come out bit for bit
// as llama.cpp's: the scaling, the mask and the normalisation are the same elementwise IEEE
// operations in the same order (this file is built with -ffp-contract=off, so no multiply and
// add is fused where llama.cpp's are not), and the exponentials and their sum are llama.cpp's
// own ggml_vec_soft_max_f32.
//
// Linked into every x86 CPU module with -Wl,--wrap=ggml_compute_forward_soft_max
// (scripts/cmake/llama-cpp.cmake): ggml-cpu.c's call reaches __wrap_ggml_compute_forward_soft_max
// below, which takes the case attention uses without flash attention (f32 scores, an f32 mask
// or none, no ALiBi, no sinks) and passes every other one to llama.cpp's function. Nothing of
// llama.cpp is edited. CALLSTREAM_SOFTMAX_LANES=off (or 0, false, no) in the environment leaves
// every softmax to llama.cpp, for comparison.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace callstream_softmax {

// A vector of the module's widest floats: GCC keeps it in one register (AVX-512, AVX or SSE).
// Left to itself, GCC turns a loop over plain lanes into scalar maxima with the modules'
// generic x86-64 tuning.
#if defined(__AVX512F__)
constexpr int WIDTH = 16;
#elif defined(__AVX__)
constexpr int WIDTH = 8;
#else
constexpr int WIDTH = 4;
#endif
typedef float Vec __attribute__((vector_size(WIDTH * sizeof(float))));
// Independent maxima, so that one does not wait for the last.
constexpr int CHAINS = 4;
constexpr int LANES = WIDTH * CHAINS;

// The largest of x[0..n), as llama.cpp's `max = MAX(max, x[i])` from -INFINITY finds it.
inline float row_max(int64_t n, const float * x) {
    Vec chains[CHAINS];
    for (Vec & c : chains) {
        for (int j = 0; j < WIDTH; ++j) {
            c[j] = -__builtin_inff();
        }
    }
    const int64_t whole = n - n % LANES;
    for (int64_t i = 0; i < whole; i += LANES) {
        for (int c = 0; c < CHAINS; ++c) {
            Vec v;
            std::memcpy(&v, x + i + c * WIDTH, sizeof v);
            chains[c] = v > chains[c] ? v : chains[c];
        }
    }
    float max = -__builtin_inff();
    for (const Vec & c : chains) {
        for (int j = 0; j < WIDTH; ++j) {
            max = c[j] > max ? c[j] : max;
        }
    }
    for (int64_t i = whole; i < n; ++i) {
        max = x[i] > max ? x[i] : max;
    }
    return max;
}

// One row: dp = softmax(sp * scale + mask), the exponentials and their sum by `soft_max`
// (llama.cpp's ggml_vec_soft_max_f32: y = exp(x - max), returns the sum). `mask` may be null;
// dp may be sp.
template <typename SoftMax>
inline void row(int64_t n, const float * sp, float * dp, float scale, const float * mask,
                SoftMax soft_max) {
    for (int64_t i = 0; i < n; ++i) {
        dp[i] = sp[i] * scale;
    }
    if (mask) {
        for (int64_t i = 0; i < n; ++i) {
            dp[i] += mask[i];
        }
    }
    const float max = row_max(n, dp);
    const double sum = soft_max(static_cast<int>(n), dp, dp, max);
    const float inverse = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) {
        dp[i] *= inverse;
    }
}

}  // namespace callstream_softmax

#ifndef CALLSTREAM_SOFTMAX_STANDALONE

#include "ggml-cpu-impl.h"
#include "ggml.h"

extern "C" {
void __real_ggml_compute_forward_soft_max(const struct ggml_compute_params * params,
                                          struct ggml_tensor * dst);
// ggml-cpu/vec.cpp.
double ggml_vec_soft_max_f32(const int n, float * y, const float * x, float max);
}

namespace {

bool turned_off() {
    static const bool off = [] {
        const char * value = std::getenv("CALLSTREAM_SOFTMAX_LANES");
        if (value == nullptr) {
            return false;
        }
        for (const char * word : {"0", "off", "false", "no"}) {
            if (std::strcmp(value, word) == 0) {
                return true;
            }
        }
        return false;
    }();
    return off;
}

}  // namespace

extern "C" void __wrap_ggml_compute_forward_soft_max(const struct ggml_compute_params * params,
                                                     struct ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    float scale = 1.0f;
    float max_bias = 0.0f;
    std::memcpy(&scale, reinterpret_cast<const float *>(dst->op_params) + 0, sizeof(float));
    std::memcpy(&max_bias, reinterpret_cast<const float *>(dst->op_params) + 1, sizeof(float));
    const bool mask_ok = src1 == nullptr || src1->type == GGML_TYPE_F32;
    if (turned_off() || params->use_ref || src0->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 ||
        dst->src[2] != nullptr || max_bias != 0.0f || !mask_ok || !ggml_is_contiguous(dst) ||
        src0->nb[0] != sizeof(float)) {
        __real_ggml_compute_forward_soft_max(params, dst);
        return;
    }
    const int ith = params->ith;
    const int nth = params->nth;
    const int64_t ne00 = src0->ne[0];
    const int64_t ne01 = src0->ne[1];
    const int64_t ne02 = src0->ne[2];
    const int64_t ne03 = src0->ne[3];
    const int64_t nb11 = src1 ? src1->nb[1] : 1;
    const int64_t nb12 = src1 ? src1->nb[2] : 1;
    const int64_t nb13 = src1 ? src1->nb[3] : 1;
    const int64_t ne12 = src1 ? src1->ne[2] : 1;
    const int64_t ne13 = src1 ? src1->ne[3] : 1;
    // The rows each thread takes are llama.cpp's: every nth row from ith, head by head.
    for (int64_t i03 = 0; i03 < ne03; i03++) {
        for (int64_t i02 = 0; i02 < ne02; i02++) {
            for (int64_t i01 = ith; i01 < ne01; i01 += nth) {
                const char * sp = static_cast<const char *>(src0->data) + i01 * src0->nb[1] +
                                  i02 * src0->nb[2] + i03 * src0->nb[3];
                char * dp = static_cast<char *>(dst->data) + i01 * dst->nb[1] +
                            i02 * dst->nb[2] + i03 * dst->nb[3];
                const char * mp = src1 ? static_cast<const char *>(src1->data) + i01 * nb11 +
                                             (i02 % ne12) * nb12 + (i03 % ne13) * nb13
                                       : nullptr;
                callstream_softmax::row(ne00, reinterpret_cast<const float *>(sp),
                                        reinterpret_cast<float *>(dp), scale,
                                        reinterpret_cast<const float *>(mp),
                                        ggml_vec_soft_max_f32);
            }
        }
    }
}

#endif
