/* caffe8 host kernels for the fp8 (E5M2) and half gradient exchange (SPEC 3.1, 3.5).
 *
 * fp8 here is Oyama et al.'s format: the upper byte of an IEEE half (1 sign, 5 exponent bits with
 * bias 15, 2 mantissa bits; largest finite 57344, smallest subnormal 2^-16). Every operation
 * rounds to nearest, ties to even, and saturates: a finite result never becomes Inf or NaN
 * (Oyama et al.'s Algorithm 2 shows training breaks otherwise). NaN inputs stay NaN.
 *
 * Three implementations of each loop, chosen at run time by the caller (comm/kernels.py) from
 * c8_cpu_paths(): AVX-512 (F+BW+VL, vcvtph2ps/vcvtps2ph on 512-bit vectors), AVX2+F16C (the
 * Oyama et al.'s instructions, 256-bit), and portable C99. SIMD bodies use function-level target
 * attributes, so one file builds with plain `cc -O3` everywhere and never needs -march=native.
 * Build flags: -O3 -fno-trapping-math (lets gcc if-convert and vectorise the branch-free portable
 * loops; nothing here reads FP exception flags) -ffp-contract=off (no FMA contraction: the fused
 * ratio kernels must give the bits of NumPy's separate float32 division, addition and
 * multiplications). Never -ffast-math: the rounding tricks below need IEEE nearest-even additions
 * and no reassociation.
 *
 * The ratio kernels (SPEC 4: the fp8 conversion, the ratio and the scaling are one pass each way)
 * compute, each operation rounded to float32 in this order,
 *     encode: fp8((g / (|w| + eps)) * scale)        decode: (fp8 value * inv_scale) * (|w| + eps)
 * which is what comm/codecs.py's Fp8Codec did with NumPy temporaries before.
 *
 * Why sums go through float32 and then half: a + b of two fp8 (3 significant bits) or two halves
 * (11 bits) rounded to float32 (24 bits) and then to the narrower format equals a single
 * correctly rounded result, because 24 >= 2*11 + 2 and 11 >= 2*3 + 2 (double rounding is
 * innocuous for one addition when the intermediate precision is at least 2p + 2).
 * tests/comm/test_kernels.py checks this on all 65,536 fp8 pairs for every path.
 *
 * The c8_fp8_sum_oyama_* functions are the fp8 sum exactly as Oyama, Nomura, Sato and Matsuoka
 * ("reducing communication in data-parallel deep learning with floating-point numbers smaller
 * than single precision") wrote it in their Algorithm 2: both bytes as halves to float32, add in
 * float32, float32 -> half with round to nearest even, KEEP THE UPPER BYTE (truncation, not
 * rounding), and an all-ones exponent (the infinity a large sum gives) -> the largest finite
 * value of that sign. They differ from the nearest-even sum on 15,112 of the 61,504 pairs of
 * finite codes, always towards zero. Where Algorithm 2 subtracts one from every all-ones
 * exponent, NaN codes here stay NaN (its subtraction would turn the NaN 0x7D into infinity).
 */
#define _GNU_SOURCE               /* syscall, clock_gettime, nanosleep, sched_yield under -std=c99 */
#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "c8_kernels.h"           /* C8_X86, C8_ABI: engine/csrc/c8_kernels.h */
#if C8_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

#define C8_ABI_VERSION 8     /* 2: encode_ratio / decode_ratio; 3: the Algorithm 2 sum; 4: shm barrier;
                                5: half conversions; 6: fp8_map; 7: the Algorithm 2 sum renamed
                                c8_fp8_sum_oyama_*; 8: blocking waits (c8_shm_wait's futex,
                                c8_mpi_wait) instead of c8_shm_poll */

enum { C8_PATH_PORTABLE = 1, C8_PATH_AVX2 = 2, C8_PATH_AVX512 = 4 };

C8_ABI(c8_abi_version, C8_ABI_VERSION)

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions (portable path and SIMD loop tails).
 * ------------------------------------------------------------------------------------------- */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Exact half -> float, branch-free (selects only) so that the portable loops vectorise. */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t nrm = ((e + 112u) << 23) | (m << 13);
    /* subnormal: m * 2^-24 is exact in float; no reliance on float denormals (DAZ-safe) */
    uint32_t sub = f32_bits((float)(int32_t)m * 5.9604644775390625e-8f);
    nrm = e == 0x1Fu ? (0x7F800000u | (m << 13)) : nrm;                    /* inf / NaN */
    return bits_f32(sign | (e == 0 ? sub : nrm));
}

/* float -> half bits, round to nearest even; overflow gives inf (callers saturate).
 * Branch-free (selects only), so that compilers vectorise the portable loops. */
static uint16_t float_to_half_rne(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    /* below 2^-14 (half subnormal or zero): adding 0.5 puts the half quantum 2^-24 at float's
     * last place, and the FPU rounds to nearest even */
    uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - 0x3F000000u;
    uint32_t nrm = ((a + 0xFFFu + ((a >> 13) & 1u)) >> 13) - (112u << 10);   /* even at bit 13 */
    uint32_t h = a < 0x38800000u ? sub : nrm;
    h = a >= 0x477FF000u ? 0x7C00u : h;                  /* >= 65520 rounds to inf */
    h = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : h;               /* NaN */
    return (uint16_t)(sign | h);
}

/* float -> fp8, round to nearest even at fp8 precision (one rounding), saturating. */
static uint8_t float_to_fp8_rne(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;
    /* below 2^-14: adding 128 puts fp8's subnormal quantum 2^-16 at float's last place */
    uint32_t sub = f32_bits(bits_f32(a) + 128.0f) - 0x43000000u;
    uint32_t nrm = ((a + 0xFFFFFu + ((a >> 21) & 1u)) >> 21) - (112u << 2);  /* even at bit 21 */
    /* |f| >= 61440 (the 57344/65536 midpoint, a tie that goes to the even 65536) overflows:
     * saturate, inf included. Tests on the input (not a min on the code) keep gcc vectorising. */
    nrm = a >= 0x47700000u ? 0x7Bu : nrm;
    nrm = a > 0x7F800000u ? 0x7Eu : nrm;                 /* NaN */
    return (uint8_t)(sign | (a < 0x38800000u ? sub : nrm));
}

/* Half bits -> fp8, round to nearest even (the low byte decides), inf saturates. */
static uint8_t half_to_fp8_rne(uint16_t h)
{
    /* A carry out of the magnitude would need a NaN payload of 0x3FF, which the float->half
     * conversions here never produce from fp8 inputs. */
    uint8_t c = (uint8_t)((uint32_t)(h + 0x7Fu + ((h >> 8) & 1u)) >> 8);
    if ((c & 0x7Fu) == 0x7Cu) c = (uint8_t)(c - 1u);                 /* +-inf -> +-57344 */
    return c;
}

/* float -> fp8 Oyama et al.'s way: half (nearest even), keep the upper byte; inf saturates. */
static uint8_t float_to_fp8_trunc(float f)
{
    uint8_t c = (uint8_t)(float_to_half_rne(f) >> 8);
    if ((c & 0x7Fu) == 0x7Cu) c = (uint8_t)(c - 1u);
    return c;
}

static float fp8_to_float(uint8_t b) { return half_to_float((uint16_t)(b << 8)); }

/* |x| as NumPy's abs does it: clear the sign bit (NaN included), no libm. */
static float abs_f32(float x) { return bits_f32(f32_bits(x) & 0x7FFFFFFFu); }

static uint16_t half_add_sat(uint16_t a, uint16_t b)
{
    uint16_t s = float_to_half_rne(half_to_float(a) + half_to_float(b));
    return (uint16_t)((s & 0x7FFFu) == 0x7C00u ? s - 1u : s);          /* +-inf -> +-65504 */
}

static uint8_t fp8_add_sat(uint8_t a, uint8_t b)
{
    return half_to_fp8_rne(float_to_half_rne(fp8_to_float(a) + fp8_to_float(b)));
}

/* Algorithm 2 of Oyama et al.: float32 sum, half (nearest even), upper byte, inf saturated. */
static uint8_t fp8_add_oyama(uint8_t a, uint8_t b)
{
    return float_to_fp8_trunc(fp8_to_float(a) + fp8_to_float(b));
}

/* ---------------------------------------------------------------------------------------------
 * Portable path. The fp8 sum is a 64 KiB table of all pairs (fits L2; one load per element).
 * ------------------------------------------------------------------------------------------- */

static uint8_t sum_table[65536];
static uint8_t oyama_sum_table[65536];
static float fp8_table[256];

__attribute__((constructor)) static void c8_init_tables(void)
{
    unsigned a, b;
    for (a = 0; a < 256; a++) fp8_table[a] = fp8_to_float((uint8_t)a);
    for (a = 0; a < 256; a++)
        for (b = 0; b < 256; b++) sum_table[(a << 8) | b] = fp8_add_sat((uint8_t)a, (uint8_t)b);
    for (a = 0; a < 256; a++)
        for (b = 0; b < 256; b++)
            oyama_sum_table[(a << 8) | b] = fp8_add_oyama((uint8_t)a, (uint8_t)b);
}

void c8_fp8_sum_portable(const uint8_t *src, uint8_t *dst, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) dst[i] = sum_table[((unsigned)src[i] << 8) | dst[i]];
}

void c8_fp8_sum_oyama_portable(const uint8_t *src, uint8_t *dst, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) dst[i] = oyama_sum_table[((unsigned)src[i] << 8) | dst[i]];
}

void c8_half_sum_portable(const uint16_t *src, uint16_t *dst, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) dst[i] = half_add_sat(src[i], dst[i]);
}

void c8_encode_portable(const float *x, uint8_t *out, size_t n, float scale, int truncate)
{
    size_t i;
    if (truncate)
        for (i = 0; i < n; i++) out[i] = float_to_fp8_trunc(x[i] * scale);
    else
        for (i = 0; i < n; i++) out[i] = float_to_fp8_rne(x[i] * scale);
}

void c8_decode_portable(const uint8_t *b, float *out, size_t n, float scale)
{
    size_t i;
    for (i = 0; i < n; i++) out[i] = fp8_table[b[i]] * scale;
}

/* out = fp8((g / (|w| + eps)) * scale), each step rounded to float32. */
void c8_encode_ratio_portable(const float *g, const float *w, float eps, float scale,
                              uint8_t *out, size_t n, int truncate)
{
    size_t i;
    if (truncate)
        for (i = 0; i < n; i++) out[i] = float_to_fp8_trunc((g[i] / (abs_f32(w[i]) + eps)) * scale);
    else
        for (i = 0; i < n; i++) out[i] = float_to_fp8_rne((g[i] / (abs_f32(w[i]) + eps)) * scale);
}

/* out = (fp8 value of b * inv_scale) * (|w| + eps), left to right in float32. */
void c8_decode_ratio_portable(const uint8_t *b, const float *w, float eps, float inv_scale,
                              float *out, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) out[i] = (fp8_table[b[i]] * inv_scale) * (abs_f32(w[i]) + eps);
}

/* The fp16 codec's conversions (one path: the branch-free scalar code vectorises as it is).
 * out = half(float32(x / divisor)), nearest even, overflow to inf as NumPy's astype(float16). */
void c8_encode_half(const float *x, uint16_t *out, size_t n, float divisor)
{
    size_t i;
    for (i = 0; i < n; i++) out[i] = float_to_half_rne(x[i] / divisor);
}

void c8_decode_half(const uint16_t *b, float *out, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) out[i] = half_to_float(b[i]);
}

/* x[i] = table[x[i]] in place: any function of one fp8 code, e.g. the hierarchical sum's
 * rescaling between its stages, tabulated once from the conversions above. */
void c8_fp8_map(const uint8_t *table, uint8_t *x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = table[x[i]];
}

/* ---------------------------------------------------------------------------------------------
 * AVX2 + F16C path (Oyama et al.'s Algorithm 2, with nearest-even instead of truncation).
 * ------------------------------------------------------------------------------------------- */
#if C8_X86
#define C8_AVX2 __attribute__((target("avx2,f16c")))

/* Round 16 halves to fp8 at the low byte of each 16-bit lane (nearest even). */
C8_AVX2 static __m256i avx2_half_round_lo(__m256i h)
{
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi16(h, 8), _mm256_set1_epi16(1));
    __m256i r = _mm256_add_epi16(h, _mm256_add_epi16(_mm256_set1_epi16(0x7F), lsb));
    return _mm256_srli_epi16(r, 8);
}

/* Sum 16 halves given as two groups of 8 floats each side; returns 16 halves. */
C8_AVX2 static __m256i avx2_add_halves(__m256i a, __m256i b)
{
    __m256 a0 = _mm256_cvtph_ps(_mm256_castsi256_si128(a));
    __m256 a1 = _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1));
    __m256 b0 = _mm256_cvtph_ps(_mm256_castsi256_si128(b));
    __m256 b1 = _mm256_cvtph_ps(_mm256_extracti128_si256(b, 1));
    __m128i s0 = _mm256_cvtps_ph(_mm256_add_ps(a0, b0), _MM_FROUND_TO_NEAREST_INT);
    __m128i s1 = _mm256_cvtps_ph(_mm256_add_ps(a1, b1), _MM_FROUND_TO_NEAREST_INT);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1);
}

/* +-inf (magnitude 0x7C) -> +-57344 (0x7B), bytewise, like the last line of their Algorithm 2. */
C8_AVX2 static __m256i avx2_fp8_saturate(__m256i c)
{
    __m256i is_inf = _mm256_cmpeq_epi8(_mm256_and_si256(c, _mm256_set1_epi8(0x7F)),
                                       _mm256_set1_epi8(0x7C));
    return _mm256_sub_epi8(c, _mm256_and_si256(is_inf, _mm256_set1_epi8(1)));
}

C8_AVX2 void c8_fp8_sum_avx2(const uint8_t *src, uint8_t *dst, size_t n)
{
    const __m256i hi = _mm256_set1_epi16((short)0xFF00);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(dst + i));
        /* even bytes shifted into the high byte, odd bytes masked in place: 2x16 halves */
        __m256i se = avx2_add_halves(_mm256_slli_epi16(a, 8), _mm256_slli_epi16(b, 8));
        __m256i so = avx2_add_halves(_mm256_and_si256(a, hi), _mm256_and_si256(b, hi));
        __m256i ce = avx2_half_round_lo(se);                          /* in the low byte */
        __m256i co = _mm256_slli_epi16(avx2_half_round_lo(so), 8);    /* back to the high byte */
        __m256i c = avx2_fp8_saturate(_mm256_or_si256(ce, co));
        _mm256_storeu_si256((__m256i *)(dst + i), c);
    }
    c8_fp8_sum_portable(src + i, dst + i, n - i);
}

/* Algorithm 2 as written: the same two half sums, then a plain shift keeps each upper byte. */
C8_AVX2 void c8_fp8_sum_oyama_avx2(const uint8_t *src, uint8_t *dst, size_t n)
{
    const __m256i hi = _mm256_set1_epi16((short)0xFF00);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(dst + i));
        __m256i se = avx2_add_halves(_mm256_slli_epi16(a, 8), _mm256_slli_epi16(b, 8));
        __m256i so = avx2_add_halves(_mm256_and_si256(a, hi), _mm256_and_si256(b, hi));
        __m256i c = _mm256_or_si256(_mm256_srli_epi16(se, 8), _mm256_and_si256(so, hi));
        _mm256_storeu_si256((__m256i *)(dst + i), avx2_fp8_saturate(c));
    }
    c8_fp8_sum_oyama_portable(src + i, dst + i, n - i);
}

C8_AVX2 void c8_half_sum_avx2(const uint16_t *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(dst + i));
        __m256i s = avx2_add_halves(a, b);
        __m256i is_inf = _mm256_cmpeq_epi16(_mm256_and_si256(s, _mm256_set1_epi16(0x7FFF)),
                                            _mm256_set1_epi16(0x7C00));
        s = _mm256_add_epi16(s, is_inf);                 /* -1 where inf: 0x7C00 -> 0x7BFF */
        _mm256_storeu_si256((__m256i *)(dst + i), s);
    }
    c8_half_sum_portable(src + i, dst + i, n - i);
}

/* 8 floats -> 8 fp8 codes in the low byte of 32-bit lanes, nearest even, saturating. */
C8_AVX2 static __m256i avx2_encode8_rne(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 21), _mm256_set1_epi32(1));
    __m256i rn = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0xFFFFF), lsb));
    __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(rn, 21), _mm256_set1_epi32(112 << 2));
    __m256 t = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(128.0f));
    __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x43000000));
    __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x38800000), a);
    __m256i c = _mm256_blendv_epi8(cn, cs, small);
    c = _mm256_min_epi32(c, _mm256_set1_epi32(0x7B));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32(0x7E), nan);
    return _mm256_or_si256(c, sign);
}

/* 8 floats -> 8 fp8 codes: half (nearest even), upper byte, inf saturated. */
C8_AVX2 static __m256i avx2_encode8_trunc(__m256 x)
{
    __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m256i c = _mm256_srli_epi32(h, 8);
    __m256i is_inf = _mm256_cmpeq_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7F)),
                                        _mm256_set1_epi32(0x7C));
    return _mm256_add_epi32(c, is_inf);
}

C8_AVX2 void c8_encode_avx2(const float *x, uint8_t *out, size_t n, float scale, int truncate)
{
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i c[4];
        int k;
        for (k = 0; k < 4; k++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), s);
            c[k] = truncate ? avx2_encode8_trunc(v) : avx2_encode8_rne(v);
        }
        /* packs work per 128-bit lane; the permute restores element order */
        __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]),
                                        _mm256_packus_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_permutevar8x32_epi32(p, order));
    }
    c8_encode_portable(x + i, out + i, n - i, scale, truncate);
}

C8_AVX2 void c8_decode_avx2(const uint8_t *b, float *out, size_t n, float scale)
{
    const __m256 s = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_slli_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + i))), 8);
        __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(f0, s));
        _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(f1, s));
    }
    c8_decode_portable(b + i, out + i, n - i, scale);
}

/* 8 ratios (g / (|w| + eps)) * scale, in that order, in float32. */
C8_AVX2 static __m256 avx2_ratio8(const float *g, const float *w, __m256 eps, __m256 s)
{
    __m256 aw = _mm256_and_ps(_mm256_loadu_ps(w), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
    return _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(g), _mm256_add_ps(aw, eps)), s);
}

C8_AVX2 void c8_encode_ratio_avx2(const float *g, const float *w, float eps, float scale,
                                  uint8_t *out, size_t n, int truncate)
{
    const __m256 s = _mm256_set1_ps(scale), e = _mm256_set1_ps(eps);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i c[4];
        int k;
        for (k = 0; k < 4; k++) {
            __m256 v = avx2_ratio8(g + i + 8 * k, w + i + 8 * k, e, s);
            c[k] = truncate ? avx2_encode8_trunc(v) : avx2_encode8_rne(v);
        }
        __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]),
                                        _mm256_packus_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_permutevar8x32_epi32(p, order));
    }
    c8_encode_ratio_portable(g + i, w + i, eps, scale, out + i, n - i, truncate);
}

C8_AVX2 void c8_decode_ratio_avx2(const uint8_t *b, const float *w, float eps, float inv_scale,
                                  float *out, size_t n)
{
    const __m256 s = _mm256_set1_ps(inv_scale), e = _mm256_set1_ps(eps);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_slli_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + i))), 8);
        __m256 f0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
        __m256 f1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
        __m256 m0 = _mm256_add_ps(_mm256_and_ps(_mm256_loadu_ps(w + i), abs_mask), e);
        __m256 m1 = _mm256_add_ps(_mm256_and_ps(_mm256_loadu_ps(w + i + 8), abs_mask), e);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(f0, m0));
        _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(f1, m1));
    }
    c8_decode_ratio_portable(b + i, w + i, eps, inv_scale, out + i, n - i);
}

/* ---------------------------------------------------------------------------------------------
 * AVX-512 path (F for vcvtph2ps/vcvtps2ph on zmm, BW for byte/word ops and masked tails).
 * ------------------------------------------------------------------------------------------- */
#define C8_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

C8_AVX512 static __m512i avx512_add_halves(__m512i a, __m512i b)
{
    __m512 a0 = _mm512_cvtph_ps(_mm512_castsi512_si256(a));
    __m512 a1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(a, 1));
    __m512 b0 = _mm512_cvtph_ps(_mm512_castsi512_si256(b));
    __m512 b1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(b, 1));
    __m256i s0 = _mm512_cvtps_ph(_mm512_add_ps(a0, b0), _MM_FROUND_TO_NEAREST_INT);
    __m256i s1 = _mm512_cvtps_ph(_mm512_add_ps(a1, b1), _MM_FROUND_TO_NEAREST_INT);
    return _mm512_inserti64x4(_mm512_castsi256_si512(s0), s1, 1);
}

C8_AVX512 static __m512i avx512_half_round_lo(__m512i h)
{
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(h, 8), _mm512_set1_epi16(1));
    __m512i r = _mm512_add_epi16(h, _mm512_add_epi16(_mm512_set1_epi16(0x7F), lsb));
    return _mm512_srli_epi16(r, 8);
}

C8_AVX512 static __m512i avx512_fp8_sum64(__m512i a, __m512i b)
{
    const __m512i hi = _mm512_set1_epi16((short)0xFF00);
    __m512i se = avx512_add_halves(_mm512_slli_epi16(a, 8), _mm512_slli_epi16(b, 8));
    __m512i so = avx512_add_halves(_mm512_and_si512(a, hi), _mm512_and_si512(b, hi));
    __m512i c = _mm512_or_si512(avx512_half_round_lo(se),
                                _mm512_slli_epi16(avx512_half_round_lo(so), 8));
    __mmask64 inf = _mm512_cmpeq_epi8_mask(_mm512_and_si512(c, _mm512_set1_epi8(0x7F)),
                                           _mm512_set1_epi8(0x7C));
    return _mm512_mask_sub_epi8(c, inf, c, _mm512_set1_epi8(1));
}

/* dst = OP(src, dst) on n fp8 codes, 64 a step, the tail masked (no scalar loop): the loop of
 * both fp8 sums, which differ only in OP. */
#define C8_AVX512_FP8_SUM(NAME, OP)                                                            \
    C8_AVX512 void NAME(const uint8_t *src, uint8_t *dst, size_t n)                            \
    {                                                                                          \
        size_t i = 0;                                                                          \
        for (; i + 64 <= n; i += 64) {                                                         \
            __m512i a = _mm512_loadu_si512((const void *)(src + i));                           \
            __m512i b = _mm512_loadu_si512((const void *)(dst + i));                           \
            _mm512_storeu_si512((void *)(dst + i), OP(a, b));                                  \
        }                                                                                      \
        if (i < n) {                                                                           \
            __mmask64 m = (__mmask64)(~0ULL >> (64 - (n - i)));                                \
            __m512i a = _mm512_maskz_loadu_epi8(m, src + i);                                   \
            __m512i b = _mm512_maskz_loadu_epi8(m, dst + i);                                   \
            _mm512_mask_storeu_epi8(dst + i, m, OP(a, b));                                     \
        }                                                                                      \
    }

C8_AVX512_FP8_SUM(c8_fp8_sum_avx512, avx512_fp8_sum64)

C8_AVX512 static __m512i avx512_fp8_sum64_oyama(__m512i a, __m512i b)
{
    const __m512i hi = _mm512_set1_epi16((short)0xFF00);
    __m512i se = avx512_add_halves(_mm512_slli_epi16(a, 8), _mm512_slli_epi16(b, 8));
    __m512i so = avx512_add_halves(_mm512_and_si512(a, hi), _mm512_and_si512(b, hi));
    __m512i c = _mm512_or_si512(_mm512_srli_epi16(se, 8), _mm512_and_si512(so, hi));
    __mmask64 inf = _mm512_cmpeq_epi8_mask(_mm512_and_si512(c, _mm512_set1_epi8(0x7F)),
                                           _mm512_set1_epi8(0x7C));
    return _mm512_mask_sub_epi8(c, inf, c, _mm512_set1_epi8(1));
}

C8_AVX512_FP8_SUM(c8_fp8_sum_oyama_avx512, avx512_fp8_sum64_oyama)

C8_AVX512 static __m512i avx512_half_sum32(__m512i a, __m512i b)
{
    __m512i s = avx512_add_halves(a, b);
    __mmask32 inf = _mm512_cmpeq_epi16_mask(_mm512_and_si512(s, _mm512_set1_epi16(0x7FFF)),
                                            _mm512_set1_epi16(0x7C00));
    return _mm512_mask_sub_epi16(s, inf, s, _mm512_set1_epi16(1));
}

C8_AVX512 void c8_half_sum_avx512(const uint16_t *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i a = _mm512_loadu_si512((const void *)(src + i));
        __m512i b = _mm512_loadu_si512((const void *)(dst + i));
        _mm512_storeu_si512((void *)(dst + i), avx512_half_sum32(a, b));
    }
    if (i < n) {
        __mmask32 m = (__mmask32)(0xFFFFFFFFu >> (32 - (n - i)));
        __m512i a = _mm512_maskz_loadu_epi16(m, src + i);
        __m512i b = _mm512_maskz_loadu_epi16(m, dst + i);
        _mm512_mask_storeu_epi16(dst + i, m, avx512_half_sum32(a, b));
    }
}

/* 16 floats -> 16 fp8 codes (int32 lanes), nearest even, saturating. */
C8_AVX512 static __m512i avx512_encode16_rne(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 21), _mm512_set1_epi32(1));
    __m512i rn = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0xFFFFF), lsb));
    __m512i cn = _mm512_sub_epi32(_mm512_srli_epi32(rn, 21), _mm512_set1_epi32(112 << 2));
    __m512 t = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(128.0f));
    __m512i cs = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x43000000));
    __mmask16 small = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x38800000));
    __m512i c = _mm512_mask_blend_epi32(small, cn, cs);
    c = _mm512_min_epi32(c, _mm512_set1_epi32(0x7B));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000));
    c = _mm512_mask_blend_epi32(nan, c, _mm512_set1_epi32(0x7E));
    return _mm512_or_si512(c, sign);
}

C8_AVX512 static __m512i avx512_encode16_trunc(__m512 x)
{
    __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m512i c = _mm512_srli_epi32(h, 8);
    __mmask16 inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(c, _mm512_set1_epi32(0x7F)),
                                            _mm512_set1_epi32(0x7C));
    return _mm512_mask_sub_epi32(c, inf, c, _mm512_set1_epi32(1));
}

C8_AVX512 void c8_encode_avx512(const float *x, uint8_t *out, size_t n, float scale, int truncate)
{
    const __m512 s = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i < n; i += 16) {
        size_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
        __m512i c = truncate ? avx512_encode16_trunc(v) : avx512_encode16_rne(v);
        _mm_mask_storeu_epi8(out + i, m, _mm512_cvtepi32_epi8(c));     /* vpmovdb */
    }
}

C8_AVX512 void c8_decode_avx512(const uint8_t *b, float *out, size_t n, float scale)
{
    const __m512 s = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i < n; i += 16) {
        size_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, b + i)), 8);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_cvtph_ps(h), s));
    }
}

C8_AVX512 void c8_encode_ratio_avx512(const float *g, const float *w, float eps, float scale,
                                      uint8_t *out, size_t n, int truncate)
{
    const __m512 s = _mm512_set1_ps(scale), e = _mm512_set1_ps(eps);
    size_t i = 0;
    for (; i < n; i += 16) {
        size_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 aw = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, w + i));          /* and-not sign */
        /* masked division: lanes past the end stay 0 and never raise anything */
        __m512 d = _mm512_maskz_div_ps(m, _mm512_maskz_loadu_ps(m, g + i), _mm512_add_ps(aw, e));
        __m512 v = _mm512_mul_ps(d, s);
        __m512i c = truncate ? avx512_encode16_trunc(v) : avx512_encode16_rne(v);
        _mm_mask_storeu_epi8(out + i, m, _mm512_cvtepi32_epi8(c));
    }
}

C8_AVX512 void c8_decode_ratio_avx512(const uint8_t *b, const float *w, float eps,
                                      float inv_scale, float *out, size_t n)
{
    const __m512 s = _mm512_set1_ps(inv_scale), e = _mm512_set1_ps(eps);
    size_t i = 0;
    for (; i < n; i += 16) {
        size_t left = n - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, b + i)), 8);
        __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), s);
        __m512 aw = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(f, _mm512_add_ps(aw, e)));
    }
}
#endif /* C8_X86 */

/* ---------------------------------------------------------------------------------------------
 * CPU feature detection: instruction sets and the OS saving their registers (XGETBV).
 * ------------------------------------------------------------------------------------------- */
#if C8_X86
static uint64_t c8_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

int c8_cpu_paths(void)
{
    int paths = C8_PATH_PORTABLE;
#if C8_X86
    unsigned eax, ebx, ecx, edx;
    uint64_t xcr0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return paths;
    if (!(ecx & (1u << 27))) return paths;                    /* OSXSAVE */
    {
        int f16c = (ecx & (1u << 29)) != 0;
        xcr0 = c8_xgetbv0();
        if ((xcr0 & 0x6u) != 0x6u) return paths;               /* XMM + YMM state */
        if (__get_cpuid_max(0, 0) < 7) return paths;
        __cpuid_count(7, 0, eax, ebx, ecx, edx);
        if (f16c && (ebx & (1u << 5))) paths |= C8_PATH_AVX2;
        if ((paths & C8_PATH_AVX2) && (xcr0 & 0xE6u) == 0xE6u   /* opmask + ZMM state */
            && (ebx & (1u << 16)) && (ebx & (1u << 30)) && (ebx & (1u << 31)))
            paths |= C8_PATH_AVX512;                            /* F, BW, VL */
    }
#endif
    return paths;
}

/* ---------------------------------------------------------------------------------------------
 * Waiting without the GIL (comm/shm.py's barrier, comm/watchdog.py's collectives). ctypes
 * releases the GIL for the length of each call, so a thread waiting here leaves the compute
 * thread alone; every wait returns after at most timeout_ns, so the Python side keeps its
 * deadline, its census and its warnings (the collective watchdog) between two calls.
 * ------------------------------------------------------------------------------------------- */
static int64_t c8_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void c8_sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* The node-shared barrier of comm/shm.py. Each process of a node owns one uint64 counter at the
 * start of its segment of the shared mapping; a barrier is "publish my epoch, then wait until
 * every counter has reached it". The release store orders every earlier write of this process
 * (its reduced block, its encoded payload) before the counter; the acquire loads order the
 * counter before the reads that follow, so the blocks are complete when the peers read them,
 * on weakly ordered CPUs too. A waiter sleeps on the node's futex word (a uint32 in the first
 * segment's control line, which every arrival bumps and wakes): the processes map one file, so
 * the futex is shared (no FUTEX_PRIVATE_FLAG). */
void c8_shm_arrive(uint64_t *own, uint64_t epoch, uint32_t *futex)
{
    __atomic_store_n(own, epoch, __ATOMIC_RELEASE);
    __atomic_fetch_add(futex, 1u, __ATOMIC_SEQ_CST);
#ifdef __linux__
    syscall(SYS_futex, futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

static int c8_shm_all_arrived(const unsigned char *base, size_t stride, int n, uint64_t epoch)
{
    int j = 0;
    while (j < n && __atomic_load_n((const uint64_t *)(base + (size_t)j * stride),
                                    __ATOMIC_ACQUIRE) >= epoch)
        j++;
    return j == n;
}

/* 1 once the counters of all n processes (at base + j * stride) are >= epoch; 0 if they are not
 * within timeout_ns. A short spin first (a peer usually arrives within microseconds), then
 * the futex: the word is read before the counters are checked, and an arrival stores its
 * counter before it bumps the word, so a wake-up between the two is never lost. */
int c8_shm_wait(const unsigned char *base, size_t stride, int n, uint64_t epoch, uint32_t *futex,
                int64_t timeout_ns)
{
    int64_t start = c8_now_ns();
    for (int s = 0; s < 256; s++) {
        if (c8_shm_all_arrived(base, stride, n, epoch)) return 1;
#if C8_X86
        _mm_pause();
#endif
    }
    for (;;) {
        uint32_t seen = __atomic_load_n(futex, __ATOMIC_SEQ_CST);
        if (c8_shm_all_arrived(base, stride, n, epoch)) return 1;
        int64_t left = timeout_ns - (c8_now_ns() - start);
        if (left <= 0) return 0;
#ifdef __linux__
        struct timespec ts = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        syscall(SYS_futex, futex, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
        (void)seen;
        c8_sleep_ns(left < 50000 ? left : 50000);
#endif
    }
}

/* Completion of MPI requests through the MPI library's own MPI_Test (``test``, a pointer the
 * caller takes from the library mpi4py loaded: this library does not link MPI): requests[i]
 * points at request i's handle, which MPI_Test sets to MPI_REQUEST_NULL when it completes, so
 * the caller's request objects see the completion. MPICH advances a transfer only inside a
 * call, so the loop keeps calling: yielding the core for the first hot_ns, then sleeping
 * sleep_ns between rounds (a slow peer: leave it the core). 1 when every request completed, 0
 * at timeout_ns, -code when MPI_Test failed with that error code. */
typedef int (*c8_mpi_test_fn)(void *request, int *flag, void *status);

int c8_mpi_wait(void *test, void **requests, int n, void *status, int64_t timeout_ns,
                int64_t hot_ns, int64_t sleep_ns)
{
    c8_mpi_test_fn fn = (c8_mpi_test_fn)test;
    int64_t start = c8_now_ns();
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (requests[i] == NULL) continue;
            int flag = 0, err = fn(requests[i], &flag, status);
            if (err) return -err;
            if (flag) requests[i] = NULL;
            else left++;
        }
        if (!left) return 1;
        int64_t waited = c8_now_ns() - start;
        if (waited >= timeout_ns) return 0;
        if (waited < hot_ns) sched_yield();
        else c8_sleep_ns(sleep_ns);
    }
}
