// Attention's f16 matrix products on AMX bf16 tiles, for llama.cpp's sapphirerapids CPU module.
//
// Without flash attention, llama.cpp computes attention as two f16 x f16 matrix products per
// head: the scores K·Q and the weighted values V·softmax. The CPU module hands both to
// llamafile_sgemm, whose AVX-512 kernel converts every f16 value to f32 and multiplies with
// FMA. Over a long prompt (thousands of cached positions) these two products are most of the
// time spent reading it. AMX multiplies 16x32 bf16 by 32x16 bf16 tiles into f32 in one
// instruction; this file does both products that way.
//
// It is linked into the sapphirerapids module only, with `-Wl,--wrap=llamafile_sgemm`
// (scripts/cmake/llama-cpp.cmake): ggml-cpu.c's calls reach __wrap_llamafile_sgemm below,
// which takes f16 x f16 products of at least MIN_COLUMNS columns and passes every other call
// to llama.cpp's own function (__real_llamafile_sgemm). Nothing of llama.cpp is edited.
//
// Numbers: each f16 value is split exactly into a high bf16 (its first 8 significant bits) and
// a low one (the other 3), and a product is high x high + high x low + low x high, each exact in
// f32 and summed in f32. What is left out, low x low, is under 2^-18 of the product: the result
// is that of the f16 values themselves, as llama.cpp's own kernel computes it (f16 widened to
// f32), up to the order of the sums. Rounding to bf16 alone (one product) was tried: it is
// three times less work on the tiles, but 8 significant bits changed the model's answers
// (see the README's Measured).
//
// The layout of llamafile_sgemm: C (f32) has m x n entries, C[j*ldc + i] = sum over l < k of
// A[i*lda + l] * B[j*ldb + l]: rows of A and of B are the two operands' vectors of length k.
//
// TDPBF16PS computes T[r][c] += sum over pairs p of X[r][2p..2p+1] . Y'[p][2c..2c+1] for a tile
// X of 16 rows x 32 bf16 and a tile Y' of 16 pair rows x 16 columns ("VNNI": column c of Y' is
// row c of the right operand, two values of k at a time). X's rows are only converted to bf16;
// Y' needs a transpose of 32-bit pairs, which costs more per value. For a prompt (many columns)
// X takes rows of B and Y' rows of A, so a result tile is 16 consecutive columns j by 16
// consecutive i: a 16x16 block of C stored row by row, straight in. For the scores of a
// generated token and its drafted ones (at most 16 columns, rows of A no longer than A has
// rows) X takes rows of A and Y' the few rows of B, so only those few rows are transposed, and
// results are written column by column.
//
// Threads: every thread of ggml's pool calls with its index (ith of nth); the m rows are cut
// into nth contiguous ranges of whole 32-row blocks, each thread packs its own range of A and
// all of B. No thread waits on another.

#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t TILE = 16;   // rows of a tile; also result columns
constexpr int64_t KSTEP = 32;  // bf16 values of k per tile row
constexpr int64_t BLOCK = 32;  // rows of A (or B) per block: two tiles
constexpr int PARTS = 2;       // each f16 value as a high and a low bf16

// Products with fewer columns stay on llama.cpp's side, where a tile of 16 columns would be
// mostly empty; a single column (a token generated with nothing drafted) is declined there too
// and computed as dot products.
constexpr int64_t MIN_COLUMNS = 4;
// Fewer rows than two blocks are left to llama.cpp as well: too small to be worth the packing.
constexpr int64_t MIN_ROWS = 64;

struct alignas(64) TileConfig {
    uint8_t palette = 0;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

bool cpu_has_amx_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __asm__ __volatile__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0), "c"(0));
    if (eax < 7) {
        return false;
    }
    __asm__ __volatile__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
    const bool amx_bf16 = (edx >> 22) & 1;
    const bool amx_tile = (edx >> 24) & 1;
    if (!amx_bf16 || !amx_tile) {
        return false;
    }
    __asm__ __volatile__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
    return (eax >> 5) & 1;  // AVX512_BF16, for the conversions
}

// CALLSTREAM_AMX_ATTENTION=off (or 0, false, no) leaves every product to llama.cpp's own kernel.
bool turned_off() {
    const char * value = std::getenv("CALLSTREAM_AMX_ATTENTION");
    if (value == nullptr) {
        return false;
    }
    for (const char * off : {"0", "off", "false", "no"}) {
        if (std::strcmp(value, off) == 0) {
            return true;
        }
    }
    return false;
}

bool amx_ready() {
    static const bool ready = [] {
        if (turned_off() || !cpu_has_amx_bf16()) {
            return false;
        }
#if defined(__linux__)
        // Linux hands out the 8 KiB of tile registers only to a process that asks.
        constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
        constexpr long XFEATURE_XTILEDATA = 18;
        return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
        return false;
#endif
    }();
    return ready;
}

// 16 f16 values (fewer at the end of a row, the rest zero) as f32.
inline __m512 load_f16(const uint16_t * src, int64_t count) {
    if (count >= 16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(src)));
    }
    if (count <= 0) {
        return _mm512_setzero_ps();
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src));
}

// 32 values of k of one f16 row from `l`, zero past k, as two bf16 vectors whose sum is exactly
// the f16 values: `hi` rounded to bf16, `lo` what rounding left (f16 has 11 significant bits,
// bf16 8, so the rest fits in `lo` exactly).
inline void row_chunk_bf16(const uint16_t * row, int64_t l, int64_t k, __m512i * hi,
                           __m512i * lo) {
    const __m512 first = load_f16(row + l, k - l);
    const __m512 second = load_f16(row + l + 16, k - l - 16);
    const __m512i high = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(second, first));
    // bf16 back to f32: the 16 bits are the top half of the f32.
    const __m512 first_hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(high)), 16));
    const __m512 second_hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(high, 1)), 16));
    *hi = high;
    *lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(second, second_hi),
                                                        _mm512_sub_ps(first, first_hi)));
}

// Offset of the tile of 16 rows `t`, step of k `s` and part `part` (0 high, 1 low) in a packing.
inline size_t slot(int64_t t, int64_t s, int part, int64_t ksteps) {
    return static_cast<size_t>((t * ksteps + s) * PARTS + part) * TILE * KSTEP;
}

// Up to 32 rows of an f16 matrix as two X tiles per step of k and part: 16 rows of 32 bf16
// (64 bytes) each; rows past `rows` and values past k are zero.
void pack_rows(const uint16_t * src, int64_t ld, int64_t rows, int64_t k, int64_t ksteps,
               uint16_t * out) {
    for (int64_t t = 0; t < BLOCK / TILE; ++t) {
        for (int64_t s = 0; s < ksteps; ++s) {
            uint16_t * high = out + slot(t, s, 0, ksteps);
            uint16_t * low = out + slot(t, s, 1, ksteps);
            for (int64_t r = 0; r < TILE; ++r) {
                const int64_t row = t * TILE + r;
                __m512i hi = _mm512_setzero_si512();
                __m512i lo = _mm512_setzero_si512();
                if (row < rows) {
                    row_chunk_bf16(src + row * ld, s * KSTEP, k, &hi, &lo);
                }
                _mm512_store_si512(reinterpret_cast<__m512i *>(high + r * KSTEP), hi);
                _mm512_store_si512(reinterpret_cast<__m512i *>(low + r * KSTEP), lo);
            }
        }
    }
}

// Rows of an f16 matrix as Y' tiles (VNNI), per step of k and part: tile (t, s) holds, at pair
// row p and column c, values 2p and 2p+1 of k step s of row t*16 + c. Rows past `rows` are zero.
void pack_columns(const uint16_t * src, int64_t ld, int64_t rows, int64_t k, int64_t ksteps,
                  uint16_t * out) {
    const int64_t tiles = (rows + TILE - 1) / TILE;
    alignas(64) uint32_t chunk[PARTS][TILE][TILE];  // [part][c][p]: a row's 32 bf16 as pairs
    for (int64_t t = 0; t < tiles; ++t) {
        for (int64_t s = 0; s < ksteps; ++s) {
            for (int64_t c = 0; c < TILE; ++c) {
                const int64_t row = t * TILE + c;
                __m512i hi = _mm512_setzero_si512();
                __m512i lo = _mm512_setzero_si512();
                if (row < rows) {
                    row_chunk_bf16(src + row * ld, s * KSTEP, k, &hi, &lo);
                }
                _mm512_store_si512(reinterpret_cast<__m512i *>(chunk[0][c]), hi);
                _mm512_store_si512(reinterpret_cast<__m512i *>(chunk[1][c]), lo);
            }
            // A 16x16 transpose of 32-bit pairs; small next to the products it feeds.
            for (int part = 0; part < PARTS; ++part) {
                uint32_t * tile = reinterpret_cast<uint32_t *>(out + slot(t, s, part, ksteps));
                for (int64_t p = 0; p < TILE; ++p) {
                    for (int64_t c = 0; c < TILE; ++c) {
                        tile[p * TILE + c] = chunk[part][c][p];
                    }
                }
            }
        }
    }
}

// Tile registers are immediate operands, so the products are spelled out once here: sums in
// tiles 0-3, X in 4-5, Y' in 6-7 (or 6 or 7 alone for a single tile of columns).
inline void load_x(const uint16_t * x0, const uint16_t * x1, size_t offset) {
    _tile_loadd(4, x0 + offset, 64);
    _tile_loadd(5, x1 + offset, 64);
}

inline void load_y(const uint16_t * y0, const uint16_t * y1, size_t offset) {
    _tile_loadd(6, y0 + offset, 64);
    _tile_loadd(7, y1 + offset, 64);
}

// Two X tiles by two Y' tiles into sums 0-3.
inline void products_2x2() {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

// Two X tiles by the Y' tile in register 6, or in register 7, into sums 0-1 (the intrinsic
// spells its registers out, so a template parameter cannot name them).
inline void products_2x1_by6() {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
}

inline void products_2x1_by7() {
    _tile_dpbf16ps(0, 4, 7);
    _tile_dpbf16ps(1, 5, 7);
}

// 64-byte aligned storage that grows and is kept per thread.
struct Aligned {
    uint16_t * data = nullptr;
    size_t size = 0;
    uint16_t * get(size_t count) {
        if (count > size) {
            free(data);
            data = static_cast<uint16_t *>(aligned_alloc(64, ((count * 2 + 63) / 64) * 64));
            size = data ? count : 0;
        }
        return data;
    }
    ~Aligned() { free(data); }
};

// What the kept packing of A was made from.
struct PackedKey {
    const uint16_t * a = nullptr;
    int64_t lda = 0, i_begin = 0, i_end = 0, k = 0;
    bool few_columns = false;
    bool operator==(const PackedKey & o) const {
        return a == o.a && lda == o.lda && i_begin == o.i_begin && i_end == o.i_end &&
               k == o.k && few_columns == o.few_columns;
    }
};

struct Packed {
    Aligned a;  // A's rows of this thread, packed; kept for the next call with the same A
    Aligned b;  // B, packed for this call
    PackedKey key;
};

Packed & thread_packed() {
    static thread_local Packed packed;
    return packed;
}

}  // namespace

// Forgets this thread's kept packing of A. Called for every matrix product this file does not
// compute, so a packing is only ever reused by the very next product on the thread: between
// two evaluations of the model, the cache A points into changes, and other products run first.
extern "C" void callstream_amx_forget() {
    thread_packed().key = PackedKey{};
}

// C[j*ldc + i] = sum_l A[i*lda + l] * B[j*ldb + l] for i < m, j < n, with A and B f16 and C
// f32, computed by thread ith of nth. Returns false (computing nothing) where it does not
// apply: no AMX bf16 on this CPU or in this process, or a product too small to gain.
extern "C" bool callstream_amx_gemm_f16(int ith, int nth, int64_t m, int64_t n, int64_t k,
                                        const uint16_t * A, int64_t lda, const uint16_t * B,
                                        int64_t ldb, float * C, int64_t ldc) {
    if (n < MIN_COLUMNS || m < MIN_ROWS || k <= 0 || nth <= 0 || !amx_ready()) {
        callstream_amx_forget();
        return false;
    }
    const int64_t ksteps = (k + KSTEP - 1) / KSTEP;
    const int64_t mblocks = (m + BLOCK - 1) / BLOCK;
    const int64_t first = mblocks * ith / nth;
    const int64_t last = mblocks * (ith + 1) / nth;
    if (first >= last) {
        callstream_amx_forget();
        return true;  // another thread has every block
    }
    const int64_t i_begin = first * BLOCK;
    const int64_t i_end = last * BLOCK < m ? last * BLOCK : m;
    const int64_t my_rows = i_end - i_begin;
    const int64_t my_tiles = (my_rows + TILE - 1) / TILE;
    const int64_t my_tiles_even = (my_tiles + 1) & ~int64_t(1);

    // A few columns (a generated token and its drafted ones) against short rows (the scores:
    // k is the head size): A's rows are only converted and B, a single tile of columns, is the
    // one rearranged. Otherwise B's rows are converted and A's rearranged (once for the heads
    // that share it), so that result tiles are rows of C.
    const bool few_columns = n <= TILE && k <= m;
    const int64_t my_blocks = last - first;
    // Values of one tile of 16 rows over every step of k, both parts.
    const size_t tile_set = static_cast<size_t>(PARTS * ksteps * TILE * KSTEP);
    const size_t a_values = few_columns ? my_blocks * 2 * tile_set : my_tiles_even * tile_set;
    const size_t b_values = few_columns ? tile_set : 2 * tile_set;
    Packed & packed = thread_packed();
    uint16_t * a_packed = packed.a.get(a_values);
    uint16_t * b_packed = packed.b.get(b_values);
    if (!a_packed || !b_packed) {
        // Every thread must take the same path (llama.cpp's kernel waits on all of them).
        std::fprintf(stderr, "callstream: out of memory for the AMX attention buffers\n");
        std::abort();
    }
    // ggml multiplies the query heads that share one key and value head one after the other,
    // with the same A: its packing is kept from the call before when that call had the same A.
    const PackedKey key{A, lda, i_begin, i_end, k, few_columns};
    if (!(packed.key == key)) {
        packed.key = PackedKey{};
        if (few_columns) {
            for (int64_t blk = 0; blk < my_blocks; ++blk) {
                const int64_t i0 = i_begin + blk * BLOCK;
                const int64_t irows = i_end - i0 < BLOCK ? i_end - i0 : BLOCK;
                pack_rows(A + i0 * lda, lda, irows, k, ksteps,
                          a_packed + blk * 2 * tile_set);
            }
        } else {
            pack_columns(A + i_begin * lda, lda, my_rows, k, ksteps, a_packed);
            if (my_tiles_even != my_tiles) {
                std::memset(a_packed + my_tiles * tile_set, 0, tile_set * sizeof(uint16_t));
            }
        }
        packed.key = key;
    }
    if (few_columns) {
        pack_columns(B, ldb, n, k, ksteps, b_packed);
    }
    uint16_t * y = few_columns ? b_packed : a_packed;
    uint16_t * x = few_columns ? nullptr : b_packed;

    // The thread may hold the tile configuration of llama.cpp's own AMX kernels (quantized
    // weights), which set it once per thread and assume it stays: keep it and put it back.
    TileConfig saved;
    _tile_storeconfig(&saved);
    TileConfig mine;
    mine.palette = 1;
    for (int t = 0; t < 8; ++t) {
        mine.rows[t] = TILE;
        mine.colsb[t] = 64;
    }
    // ldtilecfg reads all 64 bytes; keep the compiler from treating the stores as dead.
    __asm__ __volatile__("" : : "r"(&mine) : "memory");
    _tile_loadconfig(&mine);

    alignas(64) float out[TILE][TILE];
    if (few_columns) {
        // Result tile b: rows i0 + 16b.. of A (tile rows) by the n columns (tile columns).
        for (int64_t i0 = i_begin; i0 < i_end; i0 += BLOCK) {
            const uint16_t * x0 = a_packed + (i0 - i_begin) / BLOCK * 2 * tile_set;
            const uint16_t * x1 = x0 + tile_set;
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t s = 0; s < ksteps; ++s) {
                // A high x B high, A high x B low, A low x B high (low x low is below
                // f16's last bit). Here A is X, B is Y'.
                load_x(x0, x1, slot(0, s, 0, ksteps));
                _tile_loadd(6, y + slot(0, s, 0, ksteps), 64);
                _tile_loadd(7, y + slot(0, s, 1, ksteps), 64);
                products_2x1_by6();
                products_2x1_by7();
                load_x(x0, x1, slot(0, s, 1, ksteps));
                products_2x1_by6();
            }
            for (int b = 0; b < 2; ++b) {
                const int64_t ii = i0 + b * TILE;
                if (ii >= i_end) {
                    break;
                }
                if (b == 0) {
                    _tile_stored(0, out, 64);
                } else {
                    _tile_stored(1, out, 64);
                }
                const int64_t rows_i = i_end - ii < TILE ? i_end - ii : TILE;
                for (int64_t j = 0; j < n; ++j) {
                    float * dst = C + j * ldc + ii;
                    for (int64_t r = 0; r < rows_i; ++r) {
                        dst[r] = out[r][j];
                    }
                }
            }
        }
    } else {
        for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
            const int64_t jrows = n - j0 < BLOCK ? n - j0 : BLOCK;
            pack_rows(B + j0 * ldb, ldb, jrows, k, ksteps, x);
            const uint16_t * x0 = x;
            const uint16_t * x1 = x + tile_set;
            for (int64_t t = 0; t < my_tiles; t += 2) {
                const uint16_t * y0 = y + t * tile_set;
                const uint16_t * y1 = y0 + tile_set;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t s = 0; s < ksteps; ++s) {
                    // A high x B high, A high x B low, A low x B high, in that order
                    // whichever way round (low x low is below f16's last bit), with eight
                    // tile registers: four sums and four operands. Here A is Y', B is X.
                    load_x(x0, x1, slot(0, s, 0, ksteps));
                    load_y(y0, y1, slot(0, s, 0, ksteps));
                    products_2x2();
                    load_x(x0, x1, slot(0, s, 1, ksteps));
                    products_2x2();
                    load_x(x0, x1, slot(0, s, 0, ksteps));
                    load_y(y0, y1, slot(0, s, 1, ksteps));
                    products_2x2();
                }
                // Result tile (a, b): columns j0 + 16a.., rows i_begin + 16(t + b)..
                for (int a = 0; a < 2; ++a) {
                    const int64_t jj = j0 + a * TILE;
                    if (jj >= n) {
                        break;
                    }
                    for (int b = 0; b < 2; ++b) {
                        const int64_t ii = i_begin + (t + b) * TILE;
                        if (ii >= i_end) {
                            break;
                        }
                        const int tile_index = a * 2 + b;
                        float * dst = C + jj * ldc + ii;
                        const bool whole = jj + TILE <= n && ii + TILE <= i_end;
                        if (whole) {
                            switch (tile_index) {
                                case 0: _tile_stored(0, dst, ldc * 4); break;
                                case 1: _tile_stored(1, dst, ldc * 4); break;
                                case 2: _tile_stored(2, dst, ldc * 4); break;
                                default: _tile_stored(3, dst, ldc * 4); break;
                            }
                            continue;
                        }
                        switch (tile_index) {
                            case 0: _tile_stored(0, out, 64); break;
                            case 1: _tile_stored(1, out, 64); break;
                            case 2: _tile_stored(2, out, 64); break;
                            default: _tile_stored(3, out, 64); break;
                        }
                        const int64_t rows_j = n - jj < TILE ? n - jj : TILE;
                        const int64_t cols_i = i_end - ii < TILE ? i_end - ii : TILE;
                        for (int64_t r = 0; r < rows_j; ++r) {
                            std::memcpy(C + (jj + r) * ldc + ii, out[r], cols_i * sizeof(float));
                        }
                    }
                }
            }
        }
    }

    if (saved.palette != 0) {
        _tile_loadconfig(&saved);
    } else {
        _tile_release();
    }
    return true;
}

#ifndef CALLSTREAM_AMX_STANDALONE

struct ggml_compute_params;
// ggml's own values (ggml.h): GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1.
constexpr int GGML_F32 = 0;
constexpr int GGML_F16 = 1;

// The layout of the head of ggml-cpu-impl.h's struct, read here without its headers.
struct callstream_compute_params_head {
    int ith;
    int nth;
};

extern "C" bool __real_llamafile_sgemm(const ggml_compute_params * params, int64_t m, int64_t n,
                                       int64_t k, const void * A, int64_t lda, const void * B,
                                       int64_t ldb, void * C, int64_t ldc, int Atype, int Btype,
                                       int Ctype);

extern "C" bool __wrap_llamafile_sgemm(const ggml_compute_params * params, int64_t m, int64_t n,
                                       int64_t k, const void * A, int64_t lda, const void * B,
                                       int64_t ldb, void * C, int64_t ldc, int Atype, int Btype,
                                       int Ctype) {
    if (Atype == GGML_F16 && Btype == GGML_F16 && Ctype == GGML_F32) {
        const auto * head = reinterpret_cast<const callstream_compute_params_head *>(params);
        if (callstream_amx_gemm_f16(head->ith, head->nth, m, n, k,
                                    static_cast<const uint16_t *>(A), lda,
                                    static_cast<const uint16_t *>(B), ldb,
                                    static_cast<float *>(C), ldc)) {
            return true;
        }
    } else {
        callstream_amx_forget();
    }
    return __real_llamafile_sgemm(params, m, n, k, A, lda, B, ldb, C, ldc, Atype, Btype, Ctype);
}

#endif
