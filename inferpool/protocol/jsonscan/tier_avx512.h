/* AVX-512 tier: wide runs' windows with VBMI2 (wide512_run), up to eight tokens a window and
 * no loop over them. Owns its index tables (wide512_init, at import), lane_digits and
 * wide512_window. Every function here is compiled with the AVX-512 F/BW/VL/DQ/VBMI/VBMI2
 * and BMI targets and only called from quick_run (tier_ssse3.h) where have_wide512 and
 * wide512_enabled (dispatch.h). Windows of long decimals go to tier_avx2.h's long_window.
 * Its tokens count as wide runs' too (wide_tokens, tier_avx2.h). Included by
 * ../_jsonscan.c after tier_avx2.h.
 */
#ifndef INFERPOOL_JSONSCAN_TIER_AVX512_H
#define INFERPOOL_JSONSCAN_TIER_AVX512_H

/* Wide runs with AVX-512 (VBMI2's byte compress, VBMI's byte permute) where the CPU has
 * them (have_wide512): up to eight tokens a 64-byte window, with no loop over its tokens.
 * The window's digits are compressed together (points, signs dropped; commas kept between
 * tokens), each token's digits permuted right-aligned into a 16-byte lane from the
 * commas' places there, folded into integers four tokens a register, divided by their
 * powers of ten (the number of digits after their points, from the points' and commas'
 * places) and stored with one masked store: the values of wide_window's path, the same
 * division of exact integers under 10^15. */
#include <immintrin.h>
#define WIDE512_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vbmi2,bmi,bmi2")))
#define WIDE512_TOKENS 8

static unsigned long long wide512_tokens;

/* Byte i of a 64-byte register: i; the token of a group of four whose lane holds it
 * (i / 16); and its place in that lane less 16 (i % 16 - 16). */
static uint8_t BYTE_INDEX[64] __attribute__((aligned(64)));
static uint8_t LANE_TOKEN[64] __attribute__((aligned(64)));
static int8_t LANE_OFFSET[64] __attribute__((aligned(64)));

static void wide512_init(void) {
    for (int i = 0; i < 64; i++) {
        BYTE_INDEX[i] = (uint8_t)i;
        LANE_TOKEN[i] = (uint8_t)(i / 16);
        LANE_OFFSET[i] = (int8_t)(i % 16 - 16);
    }
}

/* The 16-byte lanes of tokens first to first + 3: each token's digits right-aligned, zero
 * bytes before them. `packed`: the window's digits and commas, packed; `ends`: each
 * token's comma place there; `before`: the place of the comma before it (-1: none). */
static inline WIDE512_TARGET __m512i lane_digits(__m512i packed, __m512i ends, __m512i before,
                                                 int first) {
    const __m512i token = _mm512_add_epi8(_mm512_load_si512((const void *)LANE_TOKEN),
                                          _mm512_set1_epi8((char)first));
    /* Byte j of a token's lane: the packed byte at its comma's place - 16 + j, when that
     * is after the comma before it. */
    const __m512i index = _mm512_add_epi8(_mm512_permutexvar_epi8(token, ends),
                                          _mm512_load_si512((const void *)LANE_OFFSET));
    const __mmask64 inside =
        _mm512_cmpgt_epi8_mask(index, _mm512_permutexvar_epi8(token, before));
    return _mm512_maskz_permutexvar_epi8(inside, index, packed);
}

/* Up to eight tokens at w (a token starts there) that end at a comma within 64 bytes, as
 * FP32 (size 4) or FP64 into out, none past `room` values: how many, with *taken the bytes
 * they and their commas span; 0 (nothing stored) when any of them is not of the quick form
 * (quick_window_tokens) or has more than 15 digits, when there is no comma, or when they
 * are more than `room`. Reads 64 bytes. */
static inline WIDE512_TARGET int wide512_window(const char *w, int size, char *out,
                                                Py_ssize_t room, int *taken) {
    const __m512i bytes = _mm512_loadu_si512((const void *)w);
    WindowMaps m;
    m.commas = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8(','));
    if (m.commas == 0) return 0;
    /* At most eight tokens: the commas from the ninth on are dropped. */
    const uint64_t ninth = _pdep_u64(UINT64_C(1) << WIDE512_TOKENS, m.commas);
    if (ninth) m.commas &= ninth - 1;
    const __m512i values = _mm512_sub_epi8(bytes, _mm512_set1_epi8('0'));
    m.points = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('.'));
    m.minus = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('-'));
    m.digits = _mm512_cmple_epu8_mask(values, _mm512_set1_epi8(9));
    m.zeros = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('0'));
    const int last = quick_window_tokens(&m);
    if (last < 0) return 0;
    const uint64_t commas = m.commas, digits = m.digits;
    const int count = __builtin_popcountll(commas);
    if (count > room) return 0;
    /* The digits after a point (the carry of the bit after a point runs through them), and
     * where each token's integer part ends: at its point, else at its comma. */
    const uint64_t fraction = digits & ~((m.points << 1) + digits);
    const uint64_t int_ends = m.points | (commas & ~(fraction << 1));
    const __m512i index = _mm512_load_si512((const void *)BYTE_INDEX);
    const __m512i comma_at = _mm512_maskz_compress_epi8(commas, index);
    const __m512i int_end_at = _mm512_maskz_compress_epi8(int_ends, index);
    /* Digits after the point: comma - point - 1, none when the comma ends the integer. */
    const __m512i scale_of = _mm512_subs_epu8(_mm512_sub_epi8(comma_at, int_end_at),
                                              _mm512_set1_epi8(1));
    /* The digits and commas alone, packed; each comma's place there. */
    const uint64_t kept = digits | commas;
    const __m512i packed = _mm512_maskz_compress_epi8(kept, values);
    const __m512i ends = _mm512_maskz_compress_epi8(_pext_u64(commas, kept), index);
    const __m512i before = _mm512_mask_permutexvar_epi8(
        _mm512_set1_epi8(-1), ~UINT64_C(1),
        _mm512_sub_epi8(index, _mm512_set1_epi8(1)), ends);
    /* At most 15 digits a token: its integer is exact, under 10^15. */
    const __mmask64 tokens = (__mmask64)((UINT64_C(1) << count) - 1);
    const __m512i lengths = _mm512_sub_epi8(ends, before);  /* digits + 1 */
    if (_mm512_mask_cmpgt_epi8_mask(tokens, lengths, _mm512_set1_epi8(16))) return 0;
    /* Four tokens a register: pairs of digits, fours, then eights (as wide_convert). */
    __m512i a = lane_digits(packed, ends, before, 0);
    __m512i b = lane_digits(packed, ends, before, 4);
    a = _mm512_madd_epi16(_mm512_maddubs_epi16(a, _mm512_set1_epi16(FOLD_PAIRS)),
                          _mm512_set1_epi32(FOLD_FOURS));
    b = _mm512_madd_epi16(_mm512_maddubs_epi16(b, _mm512_set1_epi16(FOLD_PAIRS)),
                          _mm512_set1_epi32(FOLD_FOURS));
    /* Per 128-bit lane i: the high and low eight digits of tokens i and 4 + i. */
    const __m512i eights =
        _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi32(FOLD_EIGHTS));
    __m512i whole = _mm512_add_epi64(_mm512_mul_epu32(eights, _mm512_set1_epi64(100000000)),
                                     _mm512_srli_epi64(eights, 32));
    whole = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), whole);
    __m512d d = _mm512_cvtepu64_pd(whole);
    const __m512i scale_index = _mm512_cvtepu8_epi64(_mm512_castsi512_si128(scale_of));
    d = _mm512_div_pd(d, _mm512_permutex2var_pd(_mm512_loadu_pd(POW10), scale_index,
                                                _mm512_loadu_pd(POW10 + 8)));
    /* The signs: one bit a token, from the minus signs at the tokens' starts. */
    const uint64_t starts = (commas << 1) | 1;
    const __mmask8 negative = (__mmask8)_pext_u64(m.minus, starts);
    d = _mm512_mask_xor_pd(d, negative, d, _mm512_set1_pd(-0.0));
    const __mmask8 stored = (__mmask8)tokens;
    if (size == 4)
        _mm256_mask_storeu_ps((float *)out, stored, _mm512_cvtpd_ps(d));
    else
        _mm512_mask_storeu_pd((double *)out, stored, d);
    *taken = last + 1;
    return count;
}

/* wide_run with AVX-512 windows (and AVX2's long_window for windows of long decimals). */
static WIDE512_TARGET __attribute__((noinline)) Py_ssize_t
wide512_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
            Py_ssize_t expected, Py_ssize_t *end) {
    Py_ssize_t read = 0;
    while (n - p >= QUICK_WINDOW + QUICK_READ) {
        int taken;
        int got = wide512_window(s + p, size, out + (count + read) * size,
                                 expected - count - read, &taken);
        if (got == 0) {
            /* Long decimals (over 15 digits), or no window of quick tokens: AVX2's. */
            WindowMaps m;
            const int last = p >= 33 ? wide_maps(s + p, &m) : -1;
            if (last >= 0)
                got = long_window(s + p, &m, size, out + (count + read) * size,
                                  expected - count - read);
            if (got == 0) break;
            taken = last + 1;
        }
        read += got;
        p += taken;
    }
    *end = p;
    wide512_tokens += (unsigned long long)read;
    wide_tokens += (unsigned long long)read;
    return read;
}

#endif /* INFERPOOL_JSONSCAN_TIER_AVX512_H */
